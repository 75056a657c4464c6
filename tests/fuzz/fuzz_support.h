// Helpers shared by the libFuzzer targets.
#pragma once

#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

namespace ctx::fuzz {

// An in-memory file (memfd) with a path (/proc/self/fd/N), for readers that only take a path:
// no disk traffic and nothing left behind, however the run ends.
class MemFile {
public:
    MemFile(const void* data, size_t size) {
        fd_ = ::memfd_create("ctx-fuzz", MFD_CLOEXEC);
        if (fd_ < 0) std::abort();  // the harness cannot run at all
        const auto* p = static_cast<const char*>(data);
        while (size > 0) {
            const ssize_t n = ::write(fd_, p, size);
            if (n <= 0) std::abort();
            p += n;
            size -= static_cast<size_t>(n);
        }
        path_ = "/proc/self/fd/" + std::to_string(fd_);
    }
    explicit MemFile(std::string_view s) : MemFile(s.data(), s.size()) {}
    ~MemFile() { ::close(fd_); }
    MemFile(const MemFile&) = delete;
    MemFile& operator=(const MemFile&) = delete;
    const std::string& path() const { return path_; }

private:
    int fd_ = -1;
    std::string path_;
};

// CTX_FUZZ_VERBOSE=1 prints the message of every expected error (ctx::Error), to check what a
// seed or a reproducer reaches: TARGET -runs=0 FILE.
inline void note(const std::exception& e) {
    static const bool verbose = std::getenv("CTX_FUZZ_VERBOSE") != nullptr;
    if (verbose) std::fprintf(stderr, "ctx::Error: %s\n", e.what());
}

// Warnings about odd but accepted input would flood the fuzzer's output.
inline void silence_logging() { spdlog::set_level(spdlog::level::off); }

// Splits `data` at the first occurrence of `sep`: the part before (all of it when absent) and
// the rest after the separator (empty when absent).
inline std::string_view take_until(std::string_view& data, std::string_view sep) {
    const size_t at = data.find(sep);
    const std::string_view head = data.substr(0, at);
    data = at == std::string_view::npos ? std::string_view() : data.substr(at + sep.size());
    return head;
}

}  // namespace ctx::fuzz
