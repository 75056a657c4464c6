// Host access to backend memory for code that runs on the host: PE plugins read and write their
// parameters, gradients and (generic input PEs) activations through plain pointers. On the CPU
// backend the span IS the memory; on a device backend it is a host copy, written back by
// commit(). The spans involved are small (PE parameter tables, one (N, C) activation), so the
// copies cost little next to a training step.
#pragma once

#include <cstddef>
#include <vector>

#include "backend/backend.h"

namespace ctx {

class HostSpan {
public:
    // A host view of [p, p + n). `read`: the view starts with the memory's contents (else its
    // contents are unspecified until written).
    HostSpan(Backend& backend, float* p, size_t n, bool read)
        : backend_(backend), p_(p), n_(n), direct_(backend.kind() == DeviceKind::CPU) {
        if (direct_) return;
        host_.resize(n);
        if (read && n > 0) backend_.copy_to_host(host_.data(), p, n);
    }
    HostSpan(const HostSpan&) = delete;
    HostSpan& operator=(const HostSpan&) = delete;

    float* data() { return direct_ ? p_ : host_.data(); }
    size_t size() const { return n_; }
    // Writes the host view back to the backend memory (nothing to do on the CPU backend).
    void commit() {
        if (!direct_ && n_ > 0) backend_.copy_to_device(p_, host_.data(), n_);
    }

private:
    Backend& backend_;
    float* p_;
    size_t n_;
    bool direct_;
    std::vector<float> host_;
};

}  // namespace ctx
