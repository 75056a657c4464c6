// Tensor parallelism (Megatron-LM's layout; docs/PARALLEL.md) for one Model: which part of each
// tensor this rank holds, and the collectives the layer code calls on backend memory.
//
// Over a group of tp ranks, rank r holds
//   query heads [r H/tp, (r+1) H/tp) and key/value heads [r Hkv/tp, (r+1) Hkv/tp): the rows of
//     qkv (column-parallel) and the columns of attn.proj (row-parallel);
//   MLP hidden units [r F/tp, (r+1) F/tp): rows of fc (of gate and up each when gated;
//     column-parallel) and columns of mlp.proj (row-parallel);
//   vocabulary ids [r ceil(V/tp), min(V, (r+1) ceil(V/tp))): rows of wte and lm_head
//     (vocabulary-parallel; the last rank holds fewer when tp does not divide V, e.g. GPT-2's
//     50257, so no padding rows change the softmax).
// Norm weights, the biases of row-parallel outputs and the PE parameters are replicated. The
// same seed initialises the same whole model at any tp: every rank draws the whole model and
// keeps its part.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "parallel/comm.h"
#include "parallel/device_collectives.h"

namespace ctx {

// This rank's part of a ModelConfig's tensors (tp = 1: the whole model).
struct TensorShard {
    int rank = 0, size = 1;
    int C = 0, D = 0;  // d_model, head dim (never split)
    int H = 0, Hkv = 0;  // this rank's query and key/value heads
    int head0 = 0;       // global index of this rank's first query head
    int A = 0;           // attention width on this rank: H * D (C when tp = 1)
    int Q = 0;           // qkv rows: (H + 2 Hkv) D
    int F = 0, F2 = 0;   // MLP hidden units, fc rows (2F when gated)
    int V = 0;           // vocabulary rows
    int vocab_begin = 0;
    int vocab_total = 0;
    bool split() const { return size > 1; }
    VocabShard vocab() const { return split() ? VocabShard{vocab_begin, vocab_total} : VocabShard{}; }
};

// Throws ctx::Error naming what tp does not divide (heads, key/value heads, MLP width) or a
// vocabulary too small to give every rank a row.
TensorShard tensor_shard(const ModelConfig& c, int rank, int size);

// How one view of a rank is cut from the whole tensor: along `dim` (-1: replicated, the whole
// tensor), the whole tensor's extent is `parts` consecutive pieces (qkv rows: [q | k | v]; gated
// fc rows: [gate | up]) and each piece is split in slices of ceil(piece / tp) (shard_slice),
// rank r taking the r-th slice of each.
struct ShardSpec {
    int dim = -1;
    std::vector<int64_t> parts;
    bool replicated() const { return dim < 0; }
};

// Rank r's slice [first, first + count) of an extent n split over `size` ranks: slices of
// ceil(n / size), the last ones shorter (or empty) when size does not divide n.
struct Slice {
    int64_t first = 0, count = 0;
};
Slice shard_slice(int64_t n, int rank, int size);

// Copies rank's part of a whole tensor (whole_shape, row-major, 1 or 2 dims) into `part`
// (to_part) or back into `whole` (!to_part). Host memory.
void copy_shard(float* whole, float* part, const std::vector<int64_t>& whole_shape,
                const ShardSpec& spec, int rank, int size, bool to_part);

// The tensor-parallel group of a model: a communicator (null or of one rank: no tensor
// parallelism) and the backend whose memory the collectives run on. On a device backend they
// run on the device (NCCL, parallel/device_collectives.h) where the build has it, else they are
// staged through host memory over the Comm. Constructing an active group is collective.
class TensorGroup {
public:
    TensorGroup() = default;
    TensorGroup(Comm* comm, Backend& backend);
    Comm* comm() const { return comm_; }
    int rank() const { return comm_ ? comm_->rank() : 0; }
    int size() const { return comm_ ? comm_->size() : 1; }
    bool active() const { return size() > 1; }
    // x (n) in backend memory = its sum over the group (in place).
    void allreduce_sum(float* x, size_t n);
    // out (size, n) in backend memory = every rank's x (n), in rank order.
    void allgather(const float* x, size_t n, float* out);

    // ---- sequence parallelism (Megatron-LM): between the tensor-parallel regions (norms,
    // residual adds, dropout-free here) each rank keeps the rows [rank N/tp, (rank+1) N/tp) of
    // the (N, C) activations; entering a region all-gathers them, leaving it reduce-scatters the
    // partial sums (instead of one all-reduce). Off: every rank holds all N rows.
    void set_sequence_parallel(bool on) { sequence_parallel_ = on && active(); }
    bool sequence_parallel() const { return sequence_parallel_; }
    // Rows of the residual stream this rank holds for a pass of N rows, and where they start.
    int rows_here(int N) const { return sequence_parallel_ ? N / size() : N; }
    size_t row_offset(int N) const {
        return sequence_parallel_ ? static_cast<size_t>(rank()) * (N / size()) : 0;
    }
    // full (N, C) backend memory, this rank's rows at row_offset(N) written: every rank's rows
    // (all-gather in place); nothing to do without sequence parallelism. n = rows_here * C.
    void gather_rows(float* full, size_t n);
    // The same from a separate local buffer: returns full, or local itself when not sequence
    // parallel.
    const float* gather_rows_from(const float* local, float* full, size_t n);
    // partial (N, C): each rank's share of a sum. Sequence parallel: reduce-scatter, this rank's
    // summed rows land in partial[0, n); else all-reduce of all of it. n = rows_here * C.
    void sum_rows(float* partial, size_t n);
    // Turns sequence parallelism off while it lives (generation steps of any length).
    class SequenceParallelOff {
    public:
        explicit SequenceParallelOff(TensorGroup& g) : g_(g), was_(g.sequence_parallel_) {
            g_.sequence_parallel_ = false;
        }
        ~SequenceParallelOff() { g_.sequence_parallel_ = was_; }
        SequenceParallelOff(const SequenceParallelOff&) = delete;
        SequenceParallelOff& operator=(const SequenceParallelOff&) = delete;

    private:
        TensorGroup& g_;
        bool was_;
    };

    // The collectives in use: "mpi (host)", "mpi (host staging)" or the device library's.
    std::string collectives_name() const;

private:
    Comm* comm_ = nullptr;
    Backend* backend_ = nullptr;
    std::shared_ptr<DeviceCollectives> device_;  // null: the host path
    bool sequence_parallel_ = false;
    std::vector<float> stage_, stage_out_;
};

}  // namespace ctx
