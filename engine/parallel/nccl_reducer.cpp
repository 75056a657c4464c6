// The NCCL gradient reducer for the CUDA backend (parallel/grad_reducer.h; docs/PARALLEL.md),
// and the NCCL collectives of the tensor and context groups (parallel/device_collectives.h).
//
// Setup (collective): every rank reports its host and GPU (PCI bus id) over the MPI comm, so two
// ranks on one GPU (which NCCL >= 2.5 refuses: "Duplicate GPU detected") or a rank whose CUDA
// setup failed stop every rank with the same clear error instead of a hang; rank 0 makes the
// ncclUniqueId and broadcasts it; ncclCommInitRank on the backend's device.
//
// Streams: the all-reduces run on a stream of their own (highest priority, so they are not
// starved by the backward kernels). Per bucket an event recorded on the backend's stream orders
// the comm stream after the ops that wrote the bucket; finish() makes the backend's stream wait
// for an event recorded on the comm stream after the last bucket. One event of each kind is
// enough: cudaStreamWaitEvent waits for the record made before it, so re-recording is safe.
//
// Per bucket, on the comm stream:
//   fp32                 ncclAllReduce in place (ncclFloat)
//   bf16                 cast to a bf16 staging buffer, ncclAllReduce (ncclBfloat16), cast back
//   deterministic fp32   ncclAllGather into (world, n) staging, sum ranks 0..W-1 in order
//   deterministic bf16   cast, ncclAllGather (ncclBfloat16), sum the widened values in order
// Staging buffers grow to the largest bucket (<= bucket_bytes) in the first step, then stay.
//
// Built without NCCL (CMake found no nccl.h / libnccl, or no CUDA; CTX_HAVE_NCCL is a compile
// definition of this file only), the factory says so.
#include "backend/backend.h"
#include "parallel/device_collectives.h"
#include "parallel/grad_reducer.h"

#ifdef CTX_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "backend/cuda/cuda_backend.h"
#include "parallel/nccl_kernels.h"
#include "parallel/comm.h"

static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0),
              "the NCCL gradient reducer needs NCCL >= 2.13 (CMake checks the version)");
#endif

namespace ctx {

#ifndef CTX_HAVE_NCCL

std::unique_ptr<GradReducer> make_nccl_grad_reducer(Backend& /*cuda_backend*/, Comm& /*comm*/,
                                                    const GradReduceOptions& /*options*/) {
    fail("data parallel on the CUDA backend needs NCCL, and this ctxengine was built without it "
         "(nccl.h / libnccl >= 2.13 were not found at configure time): install NCCL, point "
         "NCCL_ROOT at it and reconfigure, or train on one GPU");
}

bool nccl_available() { return false; }

// Without NCCL the groups stage through host memory.
std::unique_ptr<DeviceCollectives> make_device_collectives(Backend&, Comm&) { return nullptr; }

#else

namespace {

void check_cuda(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    fail("nccl gradient reducer: {}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

void check_nccl(ncclResult_t r, const char* what, ncclComm_t comm) {
    if (r == ncclSuccess) return;
    const char* last = ncclGetLastError(comm);
    fail("nccl gradient reducer: {} failed: {}{}{}", what, ncclGetErrorString(r),
         last != nullptr && last[0] != '\0' ? ": " : "", last != nullptr ? last : "");
}

// Copies a message into a fixed buffer that travels over the comm.
template <size_t N>
void put(char (&dst)[N], const std::string& s) {
    std::snprintf(dst, N, "%s", s.c_str());
}

// What each rank tells the others before NCCL is touched.
struct RankInfo {
    int ok = 0;
    char host[128] = {};
    char bus[32] = {};     // PCI bus id of the rank's GPU
    char error[384] = {};  // why this rank's setup failed (ok == 0)
};

struct IdMessage {
    int ok = 0;
    char error[384] = {};
    ncclUniqueId id;
};

// A device buffer that grows (never shrinks); grow() waits for `stream` (its only user) first.
struct Staging {
    void* p = nullptr;
    size_t bytes = 0;
    void* ensure(size_t need, cudaStream_t stream) {
        if (need <= bytes) return p;
        check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (staging)");
        if (p != nullptr) check_cuda(cudaFree(p), "cudaFree (staging)");
        p = nullptr;
        bytes = 0;
        check_cuda(cudaMalloc(&p, need), "cudaMalloc (staging)");
        bytes = need;
        return p;
    }
    void release() noexcept {
        if (p != nullptr) cudaFree(p);
        p = nullptr;
        bytes = 0;
    }
};

// "hostname/boot id": containers and pods often share a hostname across nodes, and GPUs sit
// at the same PCI address on every node of one model, so the hostname alone could call two
// nodes' GPUs the same device (NCCL identifies a node by its boot id too).
void node_identity(char* out, size_t size) {
    char name[64] = {};
    gethostname(name, sizeof name - 1);
    char boot[40] = {};
    if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
        if (!std::fgets(boot, sizeof boot, f)) boot[0] = '\0';
        std::fclose(f);
    }
    boot[std::strcspn(boot, "\n")] = '\0';
    std::snprintf(out, size, "%s/%s", name, boot);
}

// After each rank's local CUDA setup (its outcome in `mine`): every rank learns every rank's
// outcome and GPU (refusing two ranks on one GPU), rank 0 makes the id, and the communicator is
// built on the current device. Collective over comm; `who` names the caller in errors.
ncclComm_t init_nccl_over(Comm& comm, int device, const RankInfo& mine, const char* who) {
    const int world = comm.size(), rank = comm.rank();
    // 1. Every rank's setup outcome and GPU.
    std::vector<RankInfo> all(static_cast<size_t>(world));
    comm.allgather(&mine, sizeof mine, all.data());
    for (int r = 0; r < world; r++)
        CTX_CHECK(all[r].ok, "{}: rank {} (host {}) could not set up: {}", who, r, all[r].host,
                  all[r].error);
    for (int a = 0; a < world; a++)
        for (int b = a + 1; b < world; b++)
            CTX_CHECK(std::strcmp(all[a].host, all[b].host) != 0 ||
                          std::strcmp(all[a].bus, all[b].bus) != 0,
                      "{}: ranks {} and {} both use the GPU at PCI {} on host {}; NCCL needs one "
                      "GPU per rank (it refuses duplicate GPUs): start at most as many ranks per "
                      "node as there are GPUs, each on device local_rank % device_count",
                      who, a, b, all[a].bus, all[a].host);

    // 2. The unique id from rank 0 (with its error, so no rank waits for a failed one).
    IdMessage msg;
    if (rank == 0) {
        const ncclResult_t r = ncclGetUniqueId(&msg.id);
        msg.ok = r == ncclSuccess;
        if (!msg.ok) put(msg.error, fmt::format("ncclGetUniqueId: {}", ncclGetErrorString(r)));
    }
    comm.broadcast(&msg, sizeof msg, 0);
    CTX_CHECK(msg.ok, "{}: rank 0 could not make the NCCL id: {}", who, msg.error);

    // 3. The communicator (collective); every rank learns whether all succeeded.
    // A rank whose init failed throws at once (the executable then aborts every rank):
    // joining an MPI collective instead could wait forever for ranks still blocked inside
    // the collective NCCL init.
    ncclComm_t nccl = nullptr;
    const ncclResult_t r = ncclCommInitRank(&nccl, world, msg.id, rank);
    if (r != ncclSuccess) {
        const char* last = ncclGetLastError(nullptr);
        fail("{}: ncclCommInitRank ({} ranks, rank {}, cuda:{}) failed: {}{}{}", who, world, rank,
             device, ncclGetErrorString(r), last && last[0] ? ": " : "", last ? last : "");
    }
    double failed[1] = {0.0};
    comm.allreduce_sum(failed, 1);
    CTX_CHECK(failed[0] == 0.0, "{}: ncclCommInitRank failed on {} other rank(s)", who,
              static_cast<int>(failed[0]));
    return nccl;
}

class NcclReducer final : public GradReducer {
public:
    NcclReducer(cuda::CudaBackend& be, Comm& comm, const GradReduceOptions& o)
        : o_(o),
          plan_(o.bucket_bytes / sizeof(float), o.gap_floats),
          device_(be.device()),
          rank_(comm.rank()),
          world_(comm.size()),
          compute_(be.stream()) {
        try {
            setup(comm);
        } catch (...) {
            release(/*abort=*/true);
            throw;
        }
    }

    ~NcclReducer() override {
        // Mid-step or unwinding: collectives may wait for ranks that never come, so abort them
        // instead of waiting. Never throws.
        release(/*abort=*/open_ || std::uncaught_exceptions() > 0);
    }

    std::string name() const override {
        int v = 0;
        ncclGetVersion(&v);
        return fmt::format("nccl ({} ranks, cuda:{}, buckets of {:.3g} MiB, {} on the wire, {}{}, "
                           "NCCL {}.{}.{})",
                           world_, device_, double(o_.bucket_bytes) / double(1 << 20),
                           reduce_precision_name(o_.precision),
                           o_.overlap ? "overlapped" : "after backward",
                           o_.deterministic ? ", deterministic" : "", v / 10000, v / 100 % 100,
                           v % 100);
    }

    void begin() override {
        CTX_CHECK(!open_, "GradReducer::begin(): the previous step was not finished (finish())");
        open_ = true;
    }

    void ready(float* data, size_t n) override {
        CTX_CHECK(open_, "GradReducer::ready() outside a step (call begin() first)");
        if (n == 0) return;
        activate();
        CTX_CHECK(cuda::is_device_memory(data),
                  "nccl gradient reducer: the range at {} ({} floats) is not device memory",
                  static_cast<const void*>(data), n);
        for (const BucketPlan::Bucket& b : plan_.add(data, n)) {
            if (o_.overlap) {
                order_after_compute();
                enqueue(b);
            } else {
                later_.push_back(b);
            }
        }
    }

    void finish() override {
        CTX_CHECK(open_, "GradReducer::finish() without begin()");
        activate();
        for (const BucketPlan::Bucket& b : plan_.flush()) later_.push_back(b);
        if (!later_.empty()) {
            order_after_compute();
            for (const BucketPlan::Bucket& b : later_) enqueue(b);
            later_.clear();
        }
        check_cuda(cudaEventRecord(done_ev_, comm_stream_), "cudaEventRecord (done)");
        check_cuda(cudaStreamWaitEvent(compute_, done_ev_, 0), "cudaStreamWaitEvent (done)");
        if (sync_each_step_)
            check_cuda(cudaStreamSynchronize(comm_stream_), "all-reduce (CTX_CUDA_SYNC)");
        open_ = false;
    }

private:
    void activate() const {
        int cur = -1;
        if (cudaGetDevice(&cur) != cudaSuccess || cur != device_)
            check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    }

    void setup(Comm& comm) {
        const char* s = std::getenv("CTX_CUDA_SYNC");
        sync_each_step_ = s != nullptr && s[0] != '\0' && std::strcmp(s, "0") != 0;

        // 1. Local CUDA setup; its outcome and this rank's GPU go to every rank.
        RankInfo mine;
        node_identity(mine.host, sizeof mine.host);
        try {
            activate();
            check_cuda(cudaDeviceGetPCIBusId(mine.bus, sizeof mine.bus, device_),
                       "cudaDeviceGetPCIBusId");
            int least = 0, greatest = 0;
            check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest),
                       "cudaDeviceGetStreamPriorityRange");
            check_cuda(cudaStreamCreateWithPriority(&comm_stream_, cudaStreamNonBlocking,
                                                    greatest),
                       "cudaStreamCreateWithPriority");
            check_cuda(cudaEventCreateWithFlags(&ready_ev_, cudaEventDisableTiming),
                       "cudaEventCreate");
            check_cuda(cudaEventCreateWithFlags(&done_ev_, cudaEventDisableTiming),
                       "cudaEventCreate");
            mine.ok = 1;
        } catch (const Error& e) {
            put(mine.error, fmt::format("cuda:{}: {}", device_, e.what()));
        }
        nccl_ = init_nccl_over(comm, device_, mine, "nccl gradient reducer");
    }

    // The comm stream waits for everything enqueued on the backend's stream so far.
    void order_after_compute() {
        check_cuda(cudaEventRecord(ready_ev_, compute_), "cudaEventRecord (ready)");
        check_cuda(cudaStreamWaitEvent(comm_stream_, ready_ev_, 0), "cudaStreamWaitEvent (ready)");
    }

    void enqueue(const BucketPlan::Bucket& b) {
        const size_t n = b.n;
        const cudaStream_t s = comm_stream_;
        const bool bf16 = o_.precision == ReducePrecision::Bf16;
        uint16_t* half = nullptr;  // (n) bf16 copy of the bucket
        if (bf16) {
            half = static_cast<uint16_t*>(half_.ensure(n * sizeof(uint16_t), s));
            check_cuda(cuda::launch_grad_to_bf16(half, b.data, n, s), "bf16 cast");
        }
        if (!o_.deterministic && shard_pieces(shards_, world_, b.data, n, offset_, count_)) {
            // ZeRO-1: piece r of the bucket summed onto rank r only (a reduce-scatter with
            // uneven pieces: NCCL's own needs equal ones), in place.
            check_nccl(ncclGroupStart(), "ncclGroupStart", nccl_);
            for (int r = 0; r < world_; r++) {
                if (count_[r] == 0) continue;
                if (bf16) {
                    check_nccl(ncclReduce(half + offset_[r], half + offset_[r], count_[r],
                                          ncclBfloat16, ncclSum, r, nccl_, s),
                               "ncclReduce (bf16)", nccl_);
                } else {
                    check_nccl(ncclReduce(b.data + offset_[r], b.data + offset_[r], count_[r],
                                          ncclFloat, ncclSum, r, nccl_, s),
                               "ncclReduce", nccl_);
                }
            }
            check_nccl(ncclGroupEnd(), "ncclGroupEnd", nccl_);
            if (bf16 && count_[rank_] > 0)
                check_cuda(cuda::launch_grad_from_bf16(b.data + offset_[rank_],
                                                       half + offset_[rank_], count_[rank_], s),
                           "bf16 widening");
            return;
        }
        if (!o_.deterministic) {
            if (bf16) {
                check_nccl(ncclAllReduce(half, half, n, ncclBfloat16, ncclSum, nccl_, s),
                           "ncclAllReduce (bf16)", nccl_);
                check_cuda(cuda::launch_grad_from_bf16(b.data, half, n, s), "bf16 widening");
            } else {
                check_nccl(ncclAllReduce(b.data, b.data, n, ncclFloat, ncclSum, nccl_, s),
                           "ncclAllReduce", nccl_);
            }
            return;
        }
        // (world, n) gathered copies, summed in rank order into the bucket.
        const size_t all = size_t(world_) * n;
        if (bf16) {
            auto* g = static_cast<uint16_t*>(gather_.ensure(all * sizeof(uint16_t), s));
            check_nccl(ncclAllGather(half, g, n, ncclBfloat16, nccl_, s), "ncclAllGather (bf16)",
                       nccl_);
            check_cuda(cuda::launch_grad_sum_ranks_bf16(b.data, g, world_, n, s), "rank sum");
        } else {
            auto* g = static_cast<float*>(gather_.ensure(all * sizeof(float), s));
            check_nccl(ncclAllGather(b.data, g, n, ncclFloat, nccl_, s), "ncclAllGather", nccl_);
            check_cuda(cuda::launch_grad_sum_ranks(b.data, g, world_, n, s), "rank sum");
        }
    }

public:
    // In place on the comm stream, after the update's kernels: rank r's shard broadcast from r
    // (an all-gather with an uneven last piece), then the backend's stream waits for it.
    void allgather_shards(float* params, size_t n, size_t shard_floats) override {
        CTX_CHECK(!open_, "internal: parameter all-gather inside a gradient step");
        activate();
        order_after_compute();
        check_nccl(ncclGroupStart(), "ncclGroupStart", nccl_);
        for (int r = 0; r < world_; r++) {
            const size_t a = std::min(n, size_t(r) * shard_floats);
            const size_t b = std::min(n, size_t(r + 1) * shard_floats);
            if (b > a)
                check_nccl(ncclBroadcast(params + a, params + a, b - a, ncclFloat, r, nccl_,
                                         comm_stream_),
                           "ncclBroadcast (ZeRO-1 parameters)", nccl_);
        }
        check_nccl(ncclGroupEnd(), "ncclGroupEnd", nccl_);
        check_cuda(cudaEventRecord(done_ev_, comm_stream_), "cudaEventRecord (gather)");
        check_cuda(cudaStreamWaitEvent(compute_, done_ev_, 0), "cudaStreamWaitEvent (gather)");
    }

private:
    void release(bool abort) noexcept {
        cudaSetDevice(device_);
        if (nccl_ != nullptr) {
            if (abort) {
                ncclCommAbort(nccl_);
            } else {
                if (comm_stream_ != nullptr) cudaStreamSynchronize(comm_stream_);
                const ncclResult_t r = ncclCommDestroy(nccl_);
                if (r != ncclSuccess)
                    spdlog::warn("nccl gradient reducer: ncclCommDestroy: {}",
                                 ncclGetErrorString(r));
            }
            nccl_ = nullptr;
        }
        if (comm_stream_ != nullptr) cudaStreamSynchronize(comm_stream_);
        half_.release();
        gather_.release();
        if (ready_ev_ != nullptr) cudaEventDestroy(ready_ev_);
        if (done_ev_ != nullptr) cudaEventDestroy(done_ev_);
        if (comm_stream_ != nullptr) cudaStreamDestroy(comm_stream_);
        ready_ev_ = done_ev_ = nullptr;
        comm_stream_ = nullptr;
    }

    GradReduceOptions o_;
    BucketPlan plan_;
    int device_, rank_, world_;
    cudaStream_t compute_;                 // the backend's stream (not owned)
    cudaStream_t comm_stream_ = nullptr;   // owned, highest priority
    cudaEvent_t ready_ev_ = nullptr;       // on compute_: the bucket's writers are done
    cudaEvent_t done_ev_ = nullptr;        // on comm_stream_: the last bucket is summed
    ncclComm_t nccl_ = nullptr;
    Staging half_;    // (bucket) bf16
    Staging gather_;  // (world, bucket) fp32 or bf16, deterministic mode
    std::vector<BucketPlan::Bucket> later_;  // without overlap: enqueued in finish()
    std::vector<size_t> offset_, count_;     // ZeRO-1 pieces of the bucket being enqueued
    bool open_ = false;
    bool sync_each_step_ = false;
};

// CTX_GROUP_COLLECTIVES=host: the tensor and context groups stage through host memory over
// MPI even where NCCL could run them (several ranks sharing one GPU, which NCCL refuses).
bool group_collectives_on_host() {
    const char* v = std::getenv("CTX_GROUP_COLLECTIVES");
    if (v == nullptr || v[0] == '\0') return false;
    CTX_CHECK(std::strcmp(v, "host") == 0 || std::strcmp(v, "device") == 0,
              "CTX_GROUP_COLLECTIVES='{}' (expected host or device)", v);
    return std::strcmp(v, "host") == 0;
}

// The tensor and context groups' collectives (parallel/device_collectives.h) on the backend's
// own stream: the layers' ops wait for them and they for the layers', with no event between.
class NcclCollectives final : public DeviceCollectives {
public:
    NcclCollectives(cuda::CudaBackend& be, Comm& comm)
        : device_(be.device()), rank_(comm.rank()), world_(comm.size()), stream_(be.stream()) {
        RankInfo mine;
        node_identity(mine.host, sizeof mine.host);
        try {
            check_cuda(cudaSetDevice(device_), "cudaSetDevice");
            check_cuda(cudaDeviceGetPCIBusId(mine.bus, sizeof mine.bus, device_),
                       "cudaDeviceGetPCIBusId");
            mine.ok = 1;
        } catch (const Error& e) {
            put(mine.error, fmt::format("cuda:{}: {}", device_, e.what()));
        }
        nccl_ = init_nccl_over(comm, device_, mine, "nccl group collectives");
    }
    ~NcclCollectives() override {
        if (nccl_ == nullptr) return;
        cudaSetDevice(device_);
        if (std::uncaught_exceptions() > 0) {
            ncclCommAbort(nccl_);
        } else {
            cudaStreamSynchronize(stream_);
            ncclCommDestroy(nccl_);
        }
    }
    std::string name() const override {
        return fmt::format("nccl ({} ranks, cuda:{})", world_, device_);
    }
    void allreduce_sum(float* x, size_t n) override {
        if (n == 0) return;
        check_nccl(ncclAllReduce(x, x, n, ncclFloat, ncclSum, nccl_, stream_), "ncclAllReduce",
                   nccl_);
    }
    void allgather(const float* x, size_t n, float* out) override {
        if (n == 0) return;
        check_nccl(ncclAllGather(x, out, n, ncclFloat, nccl_, stream_), "ncclAllGather", nccl_);
    }
    void reduce_scatter_sum(float* data, size_t n) override {
        if (n == 0) return;
        // NCCL's in-place form leaves this rank's sum at block rank; it belongs at block 0.
        float* mine = data + size_t(rank_) * n;
        check_nccl(ncclReduceScatter(data, mine, n, ncclFloat, ncclSum, nccl_, stream_),
                   "ncclReduceScatter", nccl_);
        if (rank_ > 0)
            check_cuda(cudaMemcpyAsync(data, mine, n * sizeof(float), cudaMemcpyDeviceToDevice,
                                       stream_),
                       "cudaMemcpyAsync (reduce-scatter)");
    }
    void sendrecv(const float* send, float* recv, size_t n, int dest, int src) override {
        if (n == 0) return;
        check_nccl(ncclGroupStart(), "ncclGroupStart", nccl_);
        check_nccl(ncclSend(send, n, ncclFloat, dest, nccl_, stream_), "ncclSend", nccl_);
        check_nccl(ncclRecv(recv, n, ncclFloat, src, nccl_, stream_), "ncclRecv", nccl_);
        check_nccl(ncclGroupEnd(), "ncclGroupEnd", nccl_);
    }

private:
    int device_, rank_, world_;
    cudaStream_t stream_;  // the backend's (not owned)
    ncclComm_t nccl_ = nullptr;
};

}  // namespace

std::unique_ptr<GradReducer> make_nccl_grad_reducer(Backend& cuda_backend, Comm& comm,
                                                    const GradReduceOptions& options) {
    auto* be = dynamic_cast<cuda::CudaBackend*>(&cuda_backend);
    CTX_CHECK(be != nullptr, "the NCCL gradient reducer needs the CUDA backend, got {}",
              cuda_backend.name());
    CTX_CHECK(options.bucket_bytes >= sizeof(float),
              "gradient bucket size must be at least 4 bytes (one float), got {}",
              options.bucket_bytes);
    return std::make_unique<NcclReducer>(*be, comm, options);
}

bool nccl_available() { return true; }

std::unique_ptr<DeviceCollectives> make_device_collectives(Backend& backend, Comm& comm) {
    auto* be = dynamic_cast<cuda::CudaBackend*>(&backend);
    if (be == nullptr || comm.size() <= 1 || group_collectives_on_host()) return nullptr;
    return std::make_unique<NcclCollectives>(*be, comm);
}

#endif  // CTX_HAVE_NCCL

}  // namespace ctx
