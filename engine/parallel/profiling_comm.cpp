// Timed collectives (profiling_comm.h).
#include "parallel/profiling_comm.h"

#include <chrono>

namespace ctx {

namespace {
// Runs `call` and adds its wall time to rows[key].
template <typename F>
void timed(std::map<std::string, CommProfileRow>& rows, const std::string& key, F&& call) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    CommProfileRow& r = rows[key];
    r.calls++;
    r.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void ProfilingComm::allreduce_sum(float* data, size_t n) {
    timed(rows_, "allreduce_sum n=" + std::to_string(n), [&] { inner_.allreduce_sum(data, n); });
}
void ProfilingComm::allreduce_sum(double* data, size_t n) {
    timed(rows_, "allreduce_sum(double) n=" + std::to_string(n),
          [&] { inner_.allreduce_sum(data, n); });
}
void ProfilingComm::barrier() {
    timed(rows_, "barrier", [&] { inner_.barrier(); });
}
void ProfilingComm::allgather(const void* send, size_t bytes, void* recv) {
    timed(rows_, "allgather bytes=" + std::to_string(bytes),
          [&] { inner_.allgather(send, bytes, recv); });
}
void ProfilingComm::broadcast(void* data, size_t bytes, int root) {
    timed(rows_, "broadcast bytes=" + std::to_string(bytes),
          [&] { inner_.broadcast(data, bytes, root); });
}

void ProfilingComm::reduce_scatter_sum(float* data, size_t n) {
    timed(rows_, "reduce_scatter_sum n=" + std::to_string(n),
          [&] { inner_.reduce_scatter_sum(data, n); });
}

void ProfilingGradReducer::begin() {
    timed(rows_, "gradients begin", [&] { inner_.begin(); });
}
void ProfilingGradReducer::ready(float* data, size_t n) {
    timed(rows_, "gradients ready", [&] { inner_.ready(data, n); });
}
void ProfilingGradReducer::finish() {
    timed(rows_, "gradients finish", [&] { inner_.finish(); });
}
void ProfilingGradReducer::allgather_shards(float* params, size_t n, size_t shard_floats) {
    timed(rows_, "parameters allgather", [&] { inner_.allgather_shards(params, n, shard_floats); });
}

}  // namespace ctx
