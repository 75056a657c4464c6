// Collectives on a backend's memory for the tensor and context groups of the grid
// (docs/PARALLEL.md): NCCL on the CUDA backend, ordered on the backend's stream, so a layer's
// all-reduce or the ring's step never leaves the device. make_device_collectives returns null
// where the host path is the right one (the CPU backend, a group of one rank, a build without
// NCCL): callers then stage through host memory over the group's Comm.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace ctx {

class Backend;
class Comm;

class DeviceCollectives {
public:
    virtual ~DeviceCollectives() = default;
    virtual std::string name() const = 0;
    // x (n) = its sum over the group, in place.
    virtual void allreduce_sum(float* x, size_t n) = 0;
    // out (size, n) = every rank's x (n) in rank order; x may be out + rank * n.
    virtual void allgather(const float* x, size_t n, float* out) = 0;
    // In place: data (size, n); afterwards data[0, n) = the sum over ranks of block rank().
    virtual void reduce_scatter_sum(float* data, size_t n) = 0;
    // send (n) to rank dest, recv (n) from rank src (one ring step); no overlap.
    virtual void sendrecv(const float* send, float* recv, size_t n, int dest, int src) = 0;
};

// Collective over comm (every rank calls it). Null: use the host path (see above). ctx::Error
// when NCCL setup fails on any rank (every rank gets the error).
std::unique_ptr<DeviceCollectives> make_device_collectives(Backend& backend, Comm& comm);

}  // namespace ctx
