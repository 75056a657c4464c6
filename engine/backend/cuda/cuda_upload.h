// Host-to-device uploads that do not make the host wait, and the count of the times the CUDA
// backends do make it wait (Backend::host_waits; docs/CUDA.md "Streams and host waits").
//
// cudaMemcpyAsync from pageable host memory may first synchronise with the stream (CUDA's "API
// synchronization behavior"): each upload of a step's batch, ALiBi slopes, rotary table or
// embedding-gradient plan would let the queue run dry and the host then feed it launch by launch.
// From page-locked memory the copy queues like a kernel. PinnedUploads copies the source into a
// page-locked ring and enqueues the copy from there, so callers may reuse their buffer at once
// (as with a pageable copy); a span of the ring is written again only after the copy that read
// it has run (an event per upload; RingSpans keeps the books).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "backend/cuda/upload_ring.h"

namespace ctx::cuda {

// The times the host waited, or may have waited, for work queued on a CUDA device: stream and
// device synchronisations, device-to-host copies, uploads from pageable memory, upload-ring
// spans still being read. One count for the process (every CUDA backend and its scratch).
void note_host_wait();
uint64_t host_wait_count();

class PinnedUploads {
public:
    // The ring grows (doubling, at least 4x the upload) up to this; larger uploads (parameter
    // arenas, checkpoints) go from pageable memory, outside training steps.
    static constexpr size_t kMaxRingBytes = size_t(64) << 20;

    PinnedUploads() = default;
    PinnedUploads(const PinnedUploads&) = delete;
    PinnedUploads& operator=(const PinnedUploads&) = delete;
    ~PinnedUploads() { release(); }

    // dst (device) = bytes of host memory at src, in the order of `stream`; src may be reused
    // on return. `op` names the op in errors.
    void upload(void* dst, const void* src, size_t bytes, cudaStream_t stream, const char* op);
    // Waits for the copies in flight, frees the ring and its events (with the ring's device
    // current).
    void release();

private:
    void grow(size_t bytes, const char* op);
    void wait_for(uint64_t ticket, const char* op);
    void retire_finished(const char* op);
    bool has_run(cudaEvent_t e, const char* op);
    void pop_front();  // the oldest in-flight copy has run: its span and event are free

    char* ring_ = nullptr;  // page-locked, spans_.capacity() bytes
    RingSpans spans_;
    std::deque<std::pair<uint64_t, cudaEvent_t>> in_flight_;  // one per live span, ticket order
    std::vector<cudaEvent_t> spare_events_;
    uint64_t next_ticket_ = 1;
    cudaStream_t stream_ = nullptr;  // of the copies in flight
    bool pinned_refused_ = false;    // cudaHostAlloc failed: the ring grows no more
};

}  // namespace ctx::cuda
