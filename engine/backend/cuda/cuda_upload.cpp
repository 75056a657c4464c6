// Page-locked upload ring (cuda_upload.h) and the process's count of host waits.
#include "backend/cuda/cuda_upload.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "backend/cuda/cuda_backend.h"  // check_cuda

namespace ctx::cuda {

namespace {
std::atomic<uint64_t> g_host_waits{0};
constexpr size_t kMinRingBytes = size_t(1) << 20;
}  // namespace

void note_host_wait() { g_host_waits.fetch_add(1, std::memory_order_relaxed); }
uint64_t host_wait_count() { return g_host_waits.load(std::memory_order_relaxed); }

void PinnedUploads::upload(void* dst, const void* src, size_t bytes, cudaStream_t stream,
                           const char* op) {
    if (bytes == 0) return;
    const bool fits = bytes <= kMaxRingBytes / 4;  // larger: not in steps (arenas, checkpoints)
    if (fits) {
        // Tickets finish in order only on one stream: another stream's copy waits for ours.
        if (!in_flight_.empty() && stream != stream_) wait_for(in_flight_.back().first, op);
        stream_ = stream;
        if (bytes * 4 > spans_.capacity() && !pinned_refused_) grow(bytes, op);
    }
    if (!fits || ring_ == nullptr || bytes > spans_.capacity()) {  // pageable: may wait
        note_host_wait();
        check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream), op);
        return;
    }
    retire_finished(op);
    // The event first, so a span is never live without one (an event not yet recorded counts
    // as run: nothing was queued after an error before the copy)
    cudaEvent_t e = nullptr;
    if (spare_events_.empty()) {
        check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), op);
    } else {
        e = spare_events_.back();
        spare_events_.pop_back();
    }
    const uint64_t ticket = next_ticket_++;
    uint64_t wait = 0;
    const size_t at = spans_.reserve(bytes, ticket, &wait);
    if (wait != 0) wait_for(wait, op);
    in_flight_.emplace_back(ticket, e);
    std::memcpy(ring_ + at, src, bytes);
    check_cuda(cudaMemcpyAsync(dst, ring_ + at, bytes, cudaMemcpyHostToDevice, stream), op);
    check_cuda(cudaEventRecord(e, stream), op);
}

// Whether the copy behind e has run: a query, never a wait. Not ready is no error of the next
// call (cleared); any other error is reported here.
bool PinnedUploads::has_run(cudaEvent_t e, const char* op) {
    const cudaError_t q = cudaEventQuery(e);
    if (q == cudaErrorNotReady) {
        cudaGetLastError();
        return false;
    }
    check_cuda(q, op);
    return true;
}

// Spans whose copies have run are free again.
void PinnedUploads::retire_finished(const char* op) {
    while (!in_flight_.empty() && has_run(in_flight_.front().second, op)) pop_front();
}

void PinnedUploads::pop_front() {
    spans_.retire(in_flight_.front().first);
    spare_events_.push_back(in_flight_.front().second);
    in_flight_.pop_front();
}

// The copy of `ticket`, and so every older one (one stream), has run once this returns: one
// wait, for the newest in-flight copy at or before it.
void PinnedUploads::wait_for(uint64_t ticket, const char* op) {
    cudaEvent_t last = nullptr;
    for (const auto& [t, e] : in_flight_) {
        if (t > ticket) break;
        last = e;
    }
    if (last != nullptr && !has_run(last, op)) {
        note_host_wait();
        check_cuda(cudaEventSynchronize(last), op);
    }
    while (!in_flight_.empty() && in_flight_.front().first <= ticket) pop_front();
}

// A larger ring (the old one freed once its copies have run); where page-locked memory is
// refused, the ring there is keeps serving what fits and larger uploads go pageable.
void PinnedUploads::grow(size_t bytes, const char* op) {
    size_t want = std::max({kMinRingBytes, 2 * spans_.capacity(), 4 * bytes});
    // whole spans' alignment up: RingSpans rounds its capacity down, and a ring just short of
    // 4 * bytes would grow again (and wait for the stream) at the next upload of that size
    want = std::min((want + RingSpans::kAlign - 1) / RingSpans::kAlign * RingSpans::kAlign,
                    kMaxRingBytes);
    void* p = nullptr;
    if (cudaHostAlloc(&p, want, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        pinned_refused_ = true;
        spdlog::warn("cuda backend: {}: cannot allocate {} bytes of page-locked memory; host "
                     "uploads that do not fit the ring of {} bytes go from pageable memory (each "
                     "may wait for the stream)",
                     op, want, spans_.capacity());
        return;
    }
    if (!in_flight_.empty()) wait_for(in_flight_.back().first, op);  // the old ring is read
    char* old = ring_;
    ring_ = static_cast<char*>(p);
    spans_ = RingSpans(want);
    if (old != nullptr) check_cuda(cudaFreeHost(old), op);
}

void PinnedUploads::release() {
    for (auto& [ticket, e] : in_flight_) {
        cudaEventSynchronize(e);
        cudaEventDestroy(e);
    }
    in_flight_.clear();
    for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
    spare_events_.clear();
    if (ring_ != nullptr) cudaFreeHost(ring_);
    ring_ = nullptr;
    spans_ = RingSpans();
}

}  // namespace ctx::cuda
