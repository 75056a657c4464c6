#include "core/stop_signal.h"

#include <csignal>
#include <cstring>

#include "core/error.h"

namespace ctx {
namespace {

volatile std::sig_atomic_t g_request = 0;
int g_exit_override = 0;

extern "C" void on_stop_signal(int sig) { g_request = sig; }

const std::pair<const char*, int> kSignals[] = {
    {"TERM", SIGTERM}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"INT", SIGINT}, {"HUP", SIGHUP}};

}  // namespace

void install_stop_signals(const std::vector<int>& signals) {
    for (const auto& [name, sig] : kSignals) {
        (void)name;
        bool wanted = false;
        for (int s : signals) wanted = wanted || s == sig;
        struct sigaction sa {};
        sa.sa_handler = wanted ? on_stop_signal : SIG_DFL;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;  // a blocking read or MPI call continues; the loop checks later
        if (wanted || sig != SIGINT) sigaction(sig, &sa, nullptr);
    }
}

std::vector<int> stop_signals_from_names(const std::string& names) {
    std::vector<int> out;
    if (names == "none") return out;
    size_t start = 0;
    while (start <= names.size()) {
        const size_t end = names.find(',', start);
        std::string n = names.substr(start, end == std::string::npos ? std::string::npos : end - start);
        if (n.rfind("SIG", 0) == 0) n = n.substr(3);
        int sig = 0;
        for (const auto& [name, s] : kSignals)
            if (n == name) sig = s;
        CTX_CHECK(sig != 0, "unknown stop signal '{}' (expected a list of TERM, USR1, USR2, INT, "
                  "HUP, or none)", n);
        out.push_back(sig);
        if (end == std::string::npos) break;
        start = end + 1;
    }
    return out;
}

int stop_request() { return g_request; }
void set_exit_status_override(int status) { g_exit_override = status; }
int exit_status_override() { return g_exit_override; }
void clear_stop_request() { g_request = 0; }

std::string signal_name(int sig) {
    for (const auto& [name, s] : kSignals)
        if (s == sig) return std::string("SIG") + name;
    return "signal " + std::to_string(sig);
}

}  // namespace ctx
