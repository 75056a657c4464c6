// A Comm and a GradReducer that forward to others and time each call: the collectives' share of a
// data-parallel step in `ctxengine bench --profile` under mpirun (the companions of
// backend/profiling_backend.h). The times are this rank's, waits for slower ranks included. The
// gradient all-reduce overlaps the backward pass (GradReducer): what it costs the step is the
// time in ready() (starting and testing buckets) and in finish() (waiting for the last ones).
#pragma once

#include <map>
#include <string>

#include "parallel/comm.h"
#include "parallel/grad_reducer.h"

namespace ctx {

struct CommProfileRow {
    long calls = 0;
    double seconds = 0;
};

class ProfilingComm final : public Comm {
public:
    explicit ProfilingComm(Comm& inner) : inner_(inner) {}

    void reset() { rows_.clear(); }
    // By "collective n=COUNT" (e.g. "allreduce_sum n=265600"), in key order.
    const std::map<std::string, CommProfileRow>& rows() const { return rows_; }

    int rank() const override { return inner_.rank(); }
    int size() const override { return inner_.size(); }
    void allreduce_sum(float* data, size_t n) override;
    void allreduce_sum(double* data, size_t n) override;
    void barrier() override;
    void allgather(const void* send, size_t bytes, void* recv) override;
    void broadcast(void* data, size_t bytes, int root) override;
    void reduce_scatter_sum(float* data, size_t n) override;
    void sendrecv(const void* send, void* recv, size_t bytes, int dest, int src) override {
        inner_.sendrecv(send, recv, bytes, dest, src);
    }
    std::unique_ptr<Exchange> start_sendrecv(const void* send, void* recv, size_t bytes, int dest,
                                             int src) override {
        return inner_.start_sendrecv(send, recv, bytes, dest, src);
    }
    // Sub-communicators are not profiled.
    std::unique_ptr<Comm> split(int color, int key) override { return inner_.split(color, key); }
    const void* mpi_native() const override { return inner_.mpi_native(); }

private:
    Comm& inner_;
    std::map<std::string, CommProfileRow> rows_;
};

class ProfilingGradReducer final : public GradReducer {
public:
    explicit ProfilingGradReducer(GradReducer& inner) : inner_(inner) {}

    void reset() { rows_.clear(); }
    const std::map<std::string, CommProfileRow>& rows() const { return rows_; }  // by call

    std::string name() const override { return inner_.name(); }
    void begin() override;
    void ready(float* data, size_t n) override;
    void finish() override;
    void set_shards(const GradShards& shards) override { inner_.set_shards(shards); }
    void allgather_shards(float* params, size_t n, size_t shard_floats) override;

private:
    GradReducer& inner_;
    std::map<std::string, CommProfileRow> rows_;
};

}  // namespace ctx
