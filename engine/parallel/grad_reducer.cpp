// The identity and MPI gradient reducers, and the factory (grad_reducer.h; docs/PARALLEL.md).
// The NCCL reducer is parallel/nccl_reducer.cpp. Builds without MPI (CTX_MPI=OFF defines
// CTX_NO_MPI) leave the MPI reducer out.
#include "parallel/grad_reducer.h"

#ifndef CTX_NO_MPI
#include <mpi.h>
#endif
#include <spdlog/spdlog.h>

#include <climits>
#include <cstring>
#include <cstdlib>
#include <deque>
#include <exception>

#include "backend/backend.h"
#include "parallel/comm.h"

namespace ctx {

ReducePrecision reduce_precision_from_name(const std::string& name) {
    if (name == "fp32") return ReducePrecision::Fp32;
    if (name == "bf16") return ReducePrecision::Bf16;
    fail("unknown all-reduce precision '{}' (expected fp32 or bf16)", name);
}

int local_rank_from_env() {
    for (const char* var :
         {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"}) {
        const char* v = std::getenv(var);
        if (v == nullptr) continue;
        char* end = nullptr;
        const long r = std::strtol(v, &end, 10);
        CTX_CHECK(end != v && *end == '\0' && r >= 0 && r <= INT_MAX,
                  "environment variable {}='{}' is not a local rank (an integer >= 0)", var, v);
        return static_cast<int>(r);
    }
    return 0;
}

namespace {

// begin / ready / finish order and the bucketing, shared by the host implementations.
class StepState {
public:
    explicit StepState(const GradReduceOptions& o)
        : plan_(o.bucket_bytes / sizeof(float), o.gap_floats) {}
    void begin() {
        CTX_CHECK(!open_, "GradReducer::begin(): the previous step was not finished (finish())");
        open_ = true;
    }
    std::vector<BucketPlan::Bucket> ready(float* data, size_t n) {
        CTX_CHECK(open_, "GradReducer::ready() outside a step (call begin() first)");
        return plan_.add(data, n);
    }
    std::vector<BucketPlan::Bucket> finish() {
        CTX_CHECK(open_, "GradReducer::finish() without begin()");
        open_ = false;
        return plan_.flush();
    }

private:
    BucketPlan plan_;
    bool open_ = false;
};

// A world of one: nothing to sum. It still checks the call order and the ranges, so a wrong
// integration shows up on one process too.
class IdentityReducer final : public GradReducer {
public:
    explicit IdentityReducer(const GradReduceOptions& o) : state_(o) {}
    std::string name() const override { return "identity (1 rank)"; }
    void begin() override { state_.begin(); }
    void ready(float* data, size_t n) override { state_.ready(data, n); }
    void finish() override { state_.finish(); }
    void allgather_shards(float*, size_t, size_t) override {}  // one rank holds everything

private:
    StepState state_;
};

#ifndef CTX_NO_MPI
void check_mpi(int rc, const char* call) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    fail("gradient reducer: {} failed: {}", call, std::string(msg, len));
}

// bucket (n) = g_0 + g_1 + ... + g_{W-1} in this order, from gathered (W, n): the same fp32
// operations on every rank, whatever algorithm the library picked.
void sum_in_rank_order(float* bucket, const float* gathered, int world, size_t n) {
#pragma omp parallel for schedule(static) if (n >= (size_t(1) << 16))
    for (size_t i = 0; i < n; i++) {
        float acc = gathered[i];
        for (int r = 1; r < world; r++) acc += gathered[size_t(r) * n + i];
        bucket[i] = acc;
    }
}

// Host memory over the communicator's MPI_Comm (the data-parallel group of a grid). With overlap, each closed bucket starts a non-blocking
// collective at once (MPI_Iallreduce in place, or MPI_Iallgather into a staging slot in
// deterministic mode); ready() calls MPI_Test on the ones in flight, because Open MPI progresses
// non-blocking collectives only inside MPI calls. Without overlap finish() does everything with
// blocking calls. Deterministic mode sums the gathered copies in rank order on the host.
class MpiReducer final : public GradReducer {
public:
    MpiReducer(const GradReduceOptions& o, MPI_Comm comm, int world)
        : o_(o), state_(o), comm_(comm), world_(world) {
        MPI_Comm_rank(comm_, &rank_);
    }

    ~MpiReducer() override {
        if (flight_.empty()) return;
        int fin = 0;
        MPI_Finalized(&fin);
        // Leaving requests in flight would let MPI write into gradients that may be freed next;
        // but waiting while an exception unwinds (another rank may never join) could hang, and
        // the CLI then ends every rank with MPI_Abort anyway.
        if (fin || std::uncaught_exceptions() > 0) {
            spdlog::warn("gradient reducer destroyed with {} reductions in flight",
                         flight_.size());
            return;
        }
        for (Flight& f : flight_) MPI_Wait(&f.req, MPI_STATUS_IGNORE);
    }

    std::string name() const override {
        return fmt::format("mpi ({} ranks, buckets of {:.3g} MiB, {}{})", world_,
                           double(o_.bucket_bytes) / double(1 << 20),
                           o_.overlap ? "overlapped" : "after backward",
                           o_.deterministic ? ", deterministic" : "");
    }

    void begin() override { state_.begin(); }

    void ready(float* data, size_t n) override {
        for (const BucketPlan::Bucket& b : state_.ready(data, n)) start(b);
        progress();
    }

    void finish() override {
        for (const BucketPlan::Bucket& b : state_.finish()) start(b);
        while (!flight_.empty()) complete_oldest();
        for (const BucketPlan::Bucket& b : later_) reduce_blocking(b);
        later_.clear();
    }

    // In place: rank r's part [r S, min((r + 1) S, n)) of params goes to every rank.
    void allgather_shards(float* params, size_t n, size_t shard_floats) override {
        CTX_CHECK(flight_.empty() && later_.empty(),
                  "internal: parameter all-gather while gradient sums are in flight");
        CTX_CHECK(size_t(world_) * shard_floats <= size_t(INT_MAX),
                  "ZeRO-1 over MPI: {} ranks x {} floats per shard exceeds MPI's int counts",
                  world_, shard_floats);
        std::vector<int> counts(world_), displs(world_);
        for (int r = 0; r < world_; r++) {
            const size_t a = std::min(n, size_t(r) * shard_floats);
            const size_t b = std::min(n, size_t(r + 1) * shard_floats);
            displs[r] = static_cast<int>(a);
            counts[r] = static_cast<int>(b - a);
        }
        check_mpi(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, params, counts.data(),
                                 displs.data(), MPI_FLOAT, comm_),
                  "MPI_Allgatherv (ZeRO-1 parameters)");
    }

private:
    // At most this many deterministic buckets gather at once (each holds world x bucket floats).
    static constexpr size_t kMaxGathers = 2;

    struct Flight {
        BucketPlan::Bucket bucket;
        MPI_Request req = MPI_REQUEST_NULL;
        int slot = -1;  // staging slot (deterministic mode)
        bool done = false;
        // ZeRO-1 reduce-scatter: the pieces' sizes (alive while in flight), and where this
        // rank's summed piece belongs (MPI leaves it at the bucket's start).
        std::vector<int> counts;
        size_t mine_at = 0, mine_n = 0;
    };

    // A reduce-scatter of bucket b when it lies in the shards (and not deterministic): fills
    // f's counts and this rank's piece. False: all-reduce (or gather) the whole bucket.
    bool scatter_plan(const BucketPlan::Bucket& b, Flight& f) {
        if (o_.deterministic || !shard_pieces(shards_, world_, b.data, b.n, offset_, count_))
            return false;
        f.counts.assign(count_.begin(), count_.end());
        f.mine_at = offset_[rank_];
        f.mine_n = count_[rank_];
        return true;
    }
    // MPI wrote this rank's summed piece at the bucket's start: move it to its place.
    static void place_piece(const Flight& f) {
        if (f.mine_n > 0 && f.mine_at > 0)
            std::memmove(f.bucket.data + f.mine_at, f.bucket.data, f.mine_n * sizeof(float));
    }

    void start(const BucketPlan::Bucket& b) {
        if (!o_.overlap) {
            later_.push_back(b);
            return;
        }
        Flight f;
        f.bucket = b;
        const int count = static_cast<int>(b.n);  // <= bucket size <= INT_MAX (factory)
        if (scatter_plan(b, f)) {
            // In place: the input is the whole bucket, rank r receives piece r at its start.
            check_mpi(MPI_Ireduce_scatter(MPI_IN_PLACE, b.data, f.counts.data(), MPI_FLOAT,
                                          MPI_SUM, comm_, &f.req),
                      "MPI_Ireduce_scatter");
        } else if (!o_.deterministic) {
            check_mpi(MPI_Iallreduce(MPI_IN_PLACE, b.data, count, MPI_FLOAT, MPI_SUM,
                                     comm_, &f.req),
                      "MPI_Iallreduce");
        } else {
            f.slot = free_slot();
            std::vector<float>& stage = slots_[f.slot];
            stage.resize(size_t(world_) * b.n);  // grows to the largest bucket, then stays
            check_mpi(MPI_Iallgather(b.data, count, MPI_FLOAT, stage.data(), count, MPI_FLOAT,
                                     comm_, &f.req),
                      "MPI_Iallgather");
            slot_busy_[f.slot] = true;
        }
        flight_.push_back(std::move(f));
    }

    int free_slot() {
        if (slots_.size() < kMaxGathers) {
            slots_.emplace_back();
            slot_busy_.push_back(false);
        }
        for (;;) {
            for (size_t i = 0; i < slots_.size(); i++)
                if (!slot_busy_[i]) return static_cast<int>(i);
            complete_oldest();  // every slot gathers: wait for the oldest
        }
    }

    // Lets MPI move the collectives in flight along; sums finished gathers in order.
    void progress() {
        for (Flight& f : flight_) {
            if (f.done) continue;
            int flag = 0;
            check_mpi(MPI_Test(&f.req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
            f.done = flag != 0;
        }
        while (!flight_.empty() && flight_.front().done) complete_oldest();
    }

    void complete_oldest() {
        Flight& f = flight_.front();
        if (!f.done) check_mpi(MPI_Wait(&f.req, MPI_STATUS_IGNORE), "MPI_Wait");
        if (f.slot >= 0) {
            sum_in_rank_order(f.bucket.data, slots_[f.slot].data(), world_, f.bucket.n);
            slot_busy_[f.slot] = false;
        }
        if (!f.counts.empty()) place_piece(f);
        flight_.pop_front();
    }

    void reduce_blocking(const BucketPlan::Bucket& b) {
        const int count = static_cast<int>(b.n);
        Flight f;
        f.bucket = b;
        if (scatter_plan(b, f)) {
            check_mpi(MPI_Reduce_scatter(MPI_IN_PLACE, b.data, f.counts.data(), MPI_FLOAT,
                                         MPI_SUM, comm_),
                      "MPI_Reduce_scatter");
            place_piece(f);
            return;
        }
        if (!o_.deterministic) {
            check_mpi(MPI_Allreduce(MPI_IN_PLACE, b.data, count, MPI_FLOAT, MPI_SUM,
                                    comm_),
                      "MPI_Allreduce");
            return;
        }
        if (slots_.empty()) {
            slots_.emplace_back();
            slot_busy_.push_back(false);
        }
        std::vector<float>& stage = slots_[0];
        stage.resize(size_t(world_) * b.n);
        check_mpi(MPI_Allgather(b.data, count, MPI_FLOAT, stage.data(), count, MPI_FLOAT,
                                comm_),
                  "MPI_Allgather");
        sum_in_rank_order(b.data, stage.data(), world_, b.n);
    }

    GradReduceOptions o_;
    StepState state_;
    MPI_Comm comm_;
    int world_, rank_ = 0;
    std::vector<size_t> offset_, count_;      // scratch of scatter_plan
    std::deque<Flight> flight_;               // started, oldest first
    std::vector<BucketPlan::Bucket> later_;   // without overlap: reduced in finish()
    std::vector<std::vector<float>> slots_;   // deterministic staging (world, bucket)
    std::vector<bool> slot_busy_;
};
#endif  // CTX_NO_MPI

}  // namespace

std::unique_ptr<GradReducer> make_grad_reducer(Backend& backend, Comm& comm,
                                               const GradReduceOptions& options) {
    CTX_CHECK(options.bucket_bytes >= sizeof(float),
              "gradient bucket size must be at least 4 bytes (one float), got {}",
              options.bucket_bytes);
    CTX_CHECK(options.bucket_bytes / sizeof(float) <= size_t(INT_MAX),
              "gradient bucket size of {} bytes is too large (at most 2^31 - 1 floats)",
              options.bucket_bytes);
    if (backend.kind() == DeviceKind::CPU)
        CTX_CHECK(options.precision == ReducePrecision::Fp32,
                  "all-reduce precision bf16 needs the CUDA backend (NCCL); the CPU backend "
                  "reduces in fp32 (use precision fp32)");
    if (comm.size() == 1) return std::make_unique<IdentityReducer>(options);
    if (backend.kind() == DeviceKind::CUDA) return make_nccl_grad_reducer(backend, comm, options);

#ifndef CTX_NO_MPI
    CTX_CHECK(mpi_initialized(), "the MPI gradient reducer needs MPI (mpi_init() first)");
    const auto* native = static_cast<const MPI_Comm*>(comm.mpi_native());
    CTX_CHECK(native != nullptr, "internal: the MPI gradient reducer needs an MPI communicator "
              "(this one of {} ranks has none)", comm.size());
    return std::make_unique<MpiReducer>(options, *native, comm.size());
#else
    fail("the MPI gradient reducer needs MPI, but this build has none (CMake CTX_MPI=OFF); the "
         "communicator given has {} ranks",
         comm.size());
#endif
}

}  // namespace ctx
