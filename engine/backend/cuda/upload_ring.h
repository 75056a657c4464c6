// The bookkeeping of a ring buffer whose spans are read asynchronously (the CUDA backend's
// page-locked upload ring, cuda_upload.h): which span a new write may use, and which earlier
// reader must have finished before it is overwritten. Plain C++ (no CUDA), so it is tested on
// its own (tests/test_upload_ring.cpp).
//
// Readers are numbered by increasing tickets and finish in ticket order (one CUDA stream): once
// ticket t has finished, so has every ticket before it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

#include "core/error.h"

namespace ctx::cuda {

class RingSpans {
public:
    static constexpr size_t kAlign = 256;  // every span starts on a 256-byte boundary

    explicit RingSpans(size_t capacity = 0) : cap_(capacity / kAlign * kAlign) {}

    size_t capacity() const { return cap_; }
    size_t live() const { return spans_.size(); }  // spans whose reader may still run

    // The offset of a span of `bytes` (1 .. capacity) for the reader `ticket` (greater than every
    // earlier one). Before writing the span the caller must wait until ticket *wait_for has
    // finished (0: it need not wait); the spans of that ticket and older are forgotten.
    size_t reserve(size_t bytes, uint64_t ticket, uint64_t* wait_for) {
        const size_t n = (bytes + kAlign - 1) / kAlign * kAlign;
        CTX_CHECK(bytes >= 1 && n <= cap_, "upload ring: a span of {} bytes in a ring of {}", bytes,
                  cap_);
        CTX_CHECK(spans_.empty() || ticket > spans_.back().ticket,
                  "upload ring: ticket {} after {}", ticket, spans_.back().ticket);
        if (head_ + n > cap_) head_ = 0;  // the rest of the lap is left unused
        const size_t lo = head_, hi = head_ + n;
        // The youngest overlapping span: its reader finishing implies every older one has.
        size_t last = spans_.size();
        for (size_t i = 0; i < spans_.size(); ++i)
            if (spans_[i].lo < hi && lo < spans_[i].hi) last = i;
        *wait_for = 0;
        if (last < spans_.size()) {
            *wait_for = spans_[last].ticket;
            spans_.erase(spans_.begin(), spans_.begin() + std::ptrdiff_t(last) + 1);
        }
        spans_.push_back({lo, hi, ticket});
        head_ = hi;
        return lo;
    }

    // Tickets up to `done` have finished: their spans are free.
    void retire(uint64_t done) {
        while (!spans_.empty() && spans_.front().ticket <= done) spans_.pop_front();
    }

    // The oldest ticket whose span is live (0: none).
    uint64_t oldest() const { return spans_.empty() ? 0 : spans_.front().ticket; }

private:
    struct Span {
        size_t lo, hi;
        uint64_t ticket;
    };
    std::deque<Span> spans_;  // in ticket order
    size_t cap_ = 0, head_ = 0;
};

}  // namespace ctx::cuda
