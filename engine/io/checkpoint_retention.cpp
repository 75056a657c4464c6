// Checkpoint retention in run directories (io/checkpoint.h): which step files to keep.
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include <unistd.h>

#include "io/checkpoint.h"

namespace ctx {

namespace fs = std::filesystem;

namespace {

// step-NNNNNNNN.h5 -> NNNNNNNN; -1 for any other name.
int64_t step_of(const std::string& name) {
    constexpr size_t kDigits = 8;
    if (name.size() < 5 + kDigits + 3 || name.rfind("step-", 0) != 0 ||
        name.compare(name.size() - 3, 3, ".h5") != 0)
        return -1;
    const std::string digits = name.substr(5, name.size() - 8);
    if (digits.size() < kDigits) return -1;
    int64_t v = 0;
    for (char c : digits) {
        if (c < '0' || c > '9' || v > (INT64_MAX - 9) / 10) return -1;
        v = v * 10 + (c - '0');
    }
    return v;
}

}  // namespace

RetentionResult apply_checkpoint_retention(const std::string& dir,
                                           const CheckpointRetention& policy) {
    CTX_CHECK(policy.keep_last >= 0 && policy.keep_every >= 0, "checkpoint retention: keep_last "
              "({}) and keep_every ({}) must be >= 0", policy.keep_last, policy.keep_every);
    RetentionResult out;
    if (policy.keep_last == 0) return out;  // no limit
    std::map<int64_t, std::string> by_step;  // newest last
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
        if (!e.is_regular_file(ec)) continue;
        const std::string name = e.path().filename().string();
        const int64_t step = step_of(name);
        if (step >= 0) by_step[step] = name;
    }
    CTX_CHECK(!ec, "checkpoint retention: cannot list {} ({})", dir, ec.message());
    const std::string latest = latest_checkpoint(dir);
    const std::string latest_name = latest.empty() ? "" : fs::path(latest).filename().string();
    std::set<std::string> keep = {latest_name};
    int64_t newest = 0;
    for (auto it = by_step.rbegin(); it != by_step.rend() && newest < policy.keep_last; ++it, ++newest)
        keep.insert(it->second);
    for (const auto& [step, name] : by_step) {
        if (keep.count(name) || (policy.keep_every > 0 && step % policy.keep_every == 0)) continue;
        const fs::path p = fs::path(dir) / name;
        if (::unlink(p.c_str()) == 0)
            out.deleted.push_back(name);
        else
            out.failed.push_back(name + " (" + std::strerror(errno) + ")");
    }
    return out;
}

}  // namespace ctx
