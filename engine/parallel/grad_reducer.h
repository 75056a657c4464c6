// Data-parallel gradient sum (DESIGN.md decision 7; docs/PARALLEL.md): the backward pass hands
// finished ranges of the gradient arena to a GradReducer as it goes, so their all-reduce can
// overlap the rest of the backward pass (PyTorch DDP's buckets); finish() waits for all of them.
//
//   reducer.begin();                       // a new step
//   model.forward_backward(batch, scale);  // calls reducer.ready(range) per finished block
//   reducer.finish();                      // every range holds the sum over all ranks
//
// Implementations: the identity (world of one), MPI on host memory (CPU backend), NCCL on device
// memory (CUDA backend; the communicator is built from an id rank 0 broadcasts over MPI).
//
// Every rank must make the same calls with the same ranges in the same order (the buckets, and
// so the collectives, are then identical on every rank; data-parallel replicas of one model do).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace ctx {

class Backend;
class Comm;

// Number format of the all-reduce on the wire; the gradients stay fp32 in memory.
enum class ReducePrecision { Fp32 = 0, Bf16 = 1 };
ReducePrecision reduce_precision_from_name(const std::string& name);  // "fp32" | "bf16"
// "fp32" | "bf16" (inline, like BucketPlan below: ctx_backend's NCCL reducer uses it)
inline const char* reduce_precision_name(ReducePrecision p) {
    return p == ReducePrecision::Bf16 ? "bf16" : "fp32";
}

struct GradReduceOptions {
    size_t bucket_bytes = size_t(25) << 20;  // ranges are coalesced up to this size per bucket
    bool overlap = true;                     // start a bucket as soon as it is full
    ReducePrecision precision = ReducePrecision::Fp32;  // Bf16: CUDA backend (NCCL) only
    // Fixed summation order (rank 0 + rank 1 + ... for every element) independent of the
    // library's algorithm choice, for bit-exact resume on the same number of ranks; costs an
    // all-gather (world x bucket) instead of an all-reduce.
    bool deterministic = false;
    // Ranges at most this many floats apart are merged into one bucket together with the memory
    // between them, which is summed too: it must belong to the same buffer and be zero on every
    // rank. The arena's alignment padding is (views start at multiples of 16 floats,
    // model/arena.h, and the whole arena is zeroed before the backward pass). 0: only ranges
    // that touch are merged (the right setting for ranges from separate allocations).
    size_t gap_floats = 15;
};

// ZeRO-1's shards of the gradient arena (docs/PARALLEL.md): rank r of the reducer's
// communicator owns [base + r S, base + (r + 1) S), S = floats (a multiple of 16). floats 0: no
// sharding, every bucket is all-reduced.
struct GradShards {
    float* base = nullptr;
    size_t floats = 0;
};

// Where bucket [data, data + n) meets each rank's shard: count[r] floats starting at
// data + offset[r] (offsets ascending, the pieces tile the bucket). False when sharding is off
// or the bucket does not lie inside [base, base + world S) (it is then all-reduced).
inline bool shard_pieces(const GradShards& s, int world, const float* data, size_t n,
                         std::vector<size_t>& offset, std::vector<size_t>& count) {
    if (s.floats == 0 || s.base == nullptr || data < s.base) return false;
    const size_t lo = static_cast<size_t>(data - s.base), hi = lo + n;
    if (hi > size_t(world) * s.floats) return false;
    offset.assign(size_t(world), 0);
    count.assign(size_t(world), 0);
    for (int r = 0; r < world; r++) {
        const size_t a = std::max(lo, size_t(r) * s.floats);
        const size_t b = std::min(hi, size_t(r + 1) * s.floats);
        offset[r] = a > lo ? std::min(a, hi) - lo : 0;
        count[r] = b > a ? b - a : 0;
    }
    return true;
}

class GradReducer {
public:
    virtual ~GradReducer() = default;
    // ZeRO-1: from the next begin(), each bucket inside the shards is reduce-scattered instead
    // of all-reduced: after finish() only this rank's shard of the gradient holds the sums (the
    // rest of each such bucket is left unspecified), and the traffic per rank is about halved.
    // Deterministic mode keeps the all-gather (every element summed in rank order, the whole
    // gradient summed), so zero = 1 stays bit-identical to zero = 0 there.
    virtual void set_shards(const GradShards& shards) { shards_ = shards; }
    const GradShards& shards() const { return shards_; }
    // ZeRO-1's parameter all-gather, in place: params (n) holds this rank's updated shard
    // [rank S, min((rank + 1) S, n)); afterwards every rank's. Same memory and stream rules as
    // the gradient sums (the CUDA implementation is ordered on the backend's stream).
    virtual void allgather_shards(float* params, size_t n, size_t shard_floats) = 0;
    virtual std::string name() const = 0;
    // Starts a step: forgets the ranges of the previous one. ctx::Error if the previous step was
    // not finished.
    virtual void begin() = 0;
    // [data, data + n) of the gradient memory is final for this step (no op writes it again
    // before finish()). Ranges of one step do not overlap (ctx::Error when they do). May start
    // communicating at once. ctx::Error outside begin() .. finish().
    virtual void ready(float* data, size_t n) = 0;
    // Returns once every range given since begin() holds the sum over all ranks (the backend's
    // stream is ordered after the reduction, so later ops on it see the sums; the CUDA
    // implementation returns without waiting for the device).
    virtual void finish() = 0;

protected:
    GradShards shards_;
};

// Groups ready ranges into buckets (pure bookkeeping, shared by the implementations and tested
// on its own). A range is added whole to the open bucket when it is adjacent in memory to either
// end of the bucket (after `gap_floats` of padding at most, which joins the bucket, unless a
// closed bucket of the step lies in it) and the bucket stays within bucket_floats; otherwise the
// open bucket is closed and a new one begins.
// Either end, because the backward pass finishes the arena's views from the last to the first.
// A bucket that reaches bucket_floats is closed at once. A range larger than bucket_floats is
// split into bucket_floats pieces, closed at once, and a remainder that stays open; the
// remainder is the piece on the side the ranges are moving to (the low end when the previous
// range lay above this one), so it can merge with the next range.
//
// Defined inline: the NCCL reducer in ctx_backend uses it, and ctx_backend does not link the
// library that holds parallel/*.cpp.
class BucketPlan {
public:
    struct Bucket {
        float* data = nullptr;  // contiguous [data, data + n)
        size_t n = 0;
    };
    BucketPlan(size_t bucket_floats, size_t gap_floats);
    // Adds a range; returns the buckets it closed (to launch now), in order. ctx::Error when the
    // range overlaps one added since the last flush() (or a gap bridged since then).
    std::vector<Bucket> add(float* data, size_t n);
    // Closes the open bucket (end of step); returns it, or nothing when empty. Forgets the
    // step's ranges.
    std::vector<Bucket> flush();

private:
    void close(std::vector<Bucket>& out);
    size_t bucket_floats_, gap_floats_;
    Bucket open_;
    std::vector<Bucket> closed_;  // this step's closed buckets, for the overlap check
    uintptr_t last_ = 0;          // start of the step's previous range (0: none yet)
    bool descending_ = false;     // the last range lay below the one before it (picks the split)
};

// The reducer for `backend` over `comm`: identity when comm.size() == 1; MPI on host memory for
// the CPU backend (comm must be the MPI world); NCCL on device memory for the CUDA backend
// (ctx::Error when the build has no NCCL). Collective: every rank calls it. ctx::Error for
// options no implementation accepts (bucket_bytes below one float or above 2^31 floats, Bf16
// with the CPU backend).
std::unique_ptr<GradReducer> make_grad_reducer(Backend& backend, Comm& comm,
                                               const GradReduceOptions& options);

// Defined in backend/cuda (NCCL) or its stub (throws: built without CUDA or without NCCL).
// Builds the NCCL communicator even for comm.size() == 1 (make_grad_reducer returns the identity
// there); every rank must use its own GPU (NCCL refuses two ranks on one device).
std::unique_ptr<GradReducer> make_nccl_grad_reducer(Backend& cuda_backend, Comm& comm,
                                                    const GradReduceOptions& options);
// Whether this build has NCCL (says nothing about GPUs being present).
bool nccl_available();

// This process's rank among the ranks on its node, from the launcher's environment: the first
// of OMPI_COMM_WORLD_LOCAL_RANK (Open MPI), MPI_LOCALRANKID (MPICH/Intel MPI), SLURM_LOCALID,
// LOCAL_RANK (torchrun) that is set; 0 when none is. The CUDA device of a rank is usually
// local_rank_from_env() % cuda_device_count(). ctx::Error when the variable is not an integer
// >= 0.
int local_rank_from_env();

// ---------------------------------------------------------------- BucketPlan (inline)

inline BucketPlan::BucketPlan(size_t bucket_floats, size_t gap_floats)
    : bucket_floats_(bucket_floats), gap_floats_(gap_floats) {
    CTX_CHECK(bucket_floats > 0, "gradient buckets must hold at least one float");
}

inline void BucketPlan::close(std::vector<Bucket>& out) {
    if (open_.n == 0) return;
    out.push_back(open_);
    closed_.push_back(open_);
    open_ = Bucket{};
}

inline std::vector<BucketPlan::Bucket> BucketPlan::add(float* data, size_t n) {
    std::vector<Bucket> out;
    if (n == 0) return out;
    CTX_CHECK(data != nullptr, "gradient range of {} floats at a null pointer", n);
    // Addresses as integers: ranges may come from different allocations (gap_floats = 0).
    const uintptr_t lo = reinterpret_cast<uintptr_t>(data);
    const uintptr_t hi = lo + n * sizeof(float);
    // Whether [a, b) meets a bucket of this step (closed ones, and the open one when asked).
    auto taken = [&](uintptr_t a, uintptr_t b, bool with_open) {
        auto meets = [&](const Bucket& k) {
            const uintptr_t klo = reinterpret_cast<uintptr_t>(k.data);
            return k.n > 0 && a < klo + k.n * sizeof(float) && klo < b;
        };
        bool any = with_open && meets(open_);
        for (const Bucket& k : closed_) any = any || meets(k);
        return any;
    };
    CTX_CHECK(!taken(lo, hi, true),
              "gradient range [{}, +{} floats) overlaps a range (or a bridged gap) already given "
              "in this step",
              static_cast<const void*>(data), n);
    if (last_ != 0) descending_ = lo < last_;
    last_ = lo;

    if (open_.n > 0) {
        const uintptr_t olo = reinterpret_cast<uintptr_t>(open_.data);
        const uintptr_t ohi = olo + open_.n * sizeof(float);
        const bool after = lo >= ohi;  // disjoint from the open bucket (checked above)
        const uintptr_t gap_bytes = after ? lo - ohi : olo - hi;
        const uintptr_t span = (std::max(hi, ohi) - std::min(lo, olo)) / sizeof(float);
        // The gap joins the bucket: it must not hold a range already reduced in this step.
        if (gap_bytes % sizeof(float) == 0 && gap_bytes / sizeof(float) <= gap_floats_ &&
            span <= bucket_floats_ &&
            (gap_bytes == 0 || !taken(after ? ohi : hi, after ? lo : olo, false))) {
            open_.data = lo < olo ? data : open_.data;
            open_.n = span;
            if (open_.n == bucket_floats_) close(out);
            return out;
        }
        close(out);
    }
    // Full pieces are closed now; the remainder stays open on the side the ranges move to.
    while (n > bucket_floats_) {
        if (descending_) {
            open_ = {data + (n - bucket_floats_), bucket_floats_};
        } else {
            open_ = {data, bucket_floats_};
            data += bucket_floats_;
        }
        n -= bucket_floats_;
        close(out);
    }
    open_ = {data, n};
    if (open_.n == bucket_floats_) close(out);
    return out;
}

inline std::vector<BucketPlan::Bucket> BucketPlan::flush() {
    std::vector<Bucket> out;
    close(out);
    closed_.clear();
    last_ = 0;  // descending_ stays: the next step's first range is split the same way
    return out;
}

}  // namespace ctx
