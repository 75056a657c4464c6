// CUDA backend: device discovery, construction, errors, memory and the elementwise ops. The other
// ops live in cuda_dense_ops.cpp (embedding, layernorm, matmul, activation, cross-entropy, AdamW)
// and cuda_attention_ops.cpp (rotary, attention); their kernels in cuda_dense.cu and
// cuda_attention.cu.
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>

#include "backend/cuda/cuda_bf16.h"
#include "core/error.h"

namespace ctx {
namespace cuda {

// ---------------------------------------------------------------- device memory accounting

namespace {
struct DeviceTotals {
    size_t current = 0, peak = 0;
};
struct Accounting {
    std::mutex mu;
    std::unordered_map<const void*, std::pair<int, size_t>> live;  // pointer -> (device, bytes)
    std::map<int, DeviceTotals> totals;                             // per device ordinal
};
// Never destroyed: backends held in statics free their buffers during exit.
Accounting& accounting() {
    static Accounting* a = new Accounting;
    return *a;
}

// An A/B switch of the backend: true when environment variable var is `other`; unset, empty or
// `dflt` is false, anything else an error naming the variable, both values and what each means.
bool env_switch(const char* var, const char* dflt, const char* dflt_means, const char* other,
                const char* other_means) {
    const char* v = std::getenv(var);
    CTX_CHECK(v == nullptr || *v == '\0' || std::strcmp(v, dflt) == 0 || std::strcmp(v, other) == 0,
              "{}: expected {} ({}, the default) or {} ({}), got '{}'", var, dflt, dflt_means,
              other, other_means, v);
    return v != nullptr && std::strcmp(v, other) == 0;
}
}  // namespace

cudaError_t tracked_malloc(void** p, size_t bytes) {
    const cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) return e;
    int device = 0;
    cudaGetDevice(&device);
    Accounting& a = accounting();
    std::lock_guard<std::mutex> lock(a.mu);
    a.live[*p] = {device, bytes};
    DeviceTotals& t = a.totals[device];
    t.current += bytes;
    t.peak = std::max(t.peak, t.current);
    return e;
}

cudaError_t tracked_free(void* p) {
    if (p == nullptr) return cudaSuccess;
    {
        Accounting& a = accounting();
        std::lock_guard<std::mutex> lock(a.mu);
        if (auto it = a.live.find(p); it != a.live.end()) {
            a.totals[it->second.first].current -= it->second.second;
            a.live.erase(it);
        }
    }
    return cudaFree(p);
}

Backend::DeviceMemory CudaBackend::device_memory() const {
    Accounting& a = accounting();
    std::lock_guard<std::mutex> lock(a.mu);
    const DeviceTotals t = a.totals.count(device_) ? a.totals.at(device_) : DeviceTotals{};
    return {true, t.current, t.peak};
}

// ---------------------------------------------------------------- timing marks

int CudaBackend::timing_mark() {
    static constexpr const char* op = "timing_mark";
    activate();
    if (timing_used_ == timing_events_.size()) {
        cudaEvent_t e = nullptr;
        check(cudaEventCreate(&e), op);
        timing_events_.push_back(e);
    }
    check(cudaEventRecord(timing_events_[timing_used_], stream_), op);
    return int(timing_used_++);
}

double CudaBackend::timing_ms(int from, int to) {
    static constexpr const char* op = "timing_ms";
    CTX_CHECK(from >= 0 && to >= 0 && size_t(from) < timing_used_ && size_t(to) < timing_used_,
              "{}: marks {} and {} (there are {})", op, from, to, timing_used_);
    activate();
    note_host_wait();
    check(cudaEventSynchronize(timing_events_[size_t(to)]), op);
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, timing_events_[size_t(from)], timing_events_[size_t(to)]),
          op);
    return double(ms);
}

void CudaBackend::release_timing_marks() { timing_used_ = 0; }

// ---------------------------------------------------------------- scratch

template <class T>
T* DeviceScratch<T>::ensure(size_t n, const char* op) {
    if (n == 0) n = 1;
    if (n <= cap_) return p_;
    // No queued kernel or copy may still use the old buffer (rare: buffers only ever grow).
    if (p_ != nullptr) {
        note_host_wait();
        cudaDeviceSynchronize();
    }
    release();
    const size_t want = n + n / 2;
    void* p = nullptr;
    const cudaError_t e = tracked_malloc(&p, want * sizeof(T));
    if (e != cudaSuccess) {
        cudaGetLastError();
        fail("cuda backend: {}: cannot allocate {} bytes of scratch: {}", op, want * sizeof(T),
             cudaGetErrorString(e));
    }
    p_ = static_cast<T*>(p);
    cap_ = want;
    return p_;
}

template <class T>
void DeviceScratch<T>::release() {
    if (p_ != nullptr) tracked_free(p_);
    p_ = nullptr;
    cap_ = 0;
}

template class DeviceScratch<int32_t>;
template class DeviceScratch<float>;
template class DeviceScratch<double>;
template class DeviceScratch<uint16_t>;  // bf16 bit patterns
template class DeviceScratch<uint64_t>;

// ---------------------------------------------------------------- construction

CudaBackend::CudaBackend(int device, Precision precision)
    : precision_(precision), device_(device) {
    check(cudaSetDevice(device), "cudaSetDevice");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_blas(cublasCreate(&blas_), "cublasCreate");
    check_blas(cublasSetStream(blas_, stream_), "cublasSetStream");
    // Plain fp32: no TF32 tensor-core rounding (unless NVIDIA_TF32_OVERRIDE=1 forces it). The
    // bf16 products (cublasGemmEx with bf16 operands) use tensor cores in this mode too.
    check_blas(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    const char* s = std::getenv("CTX_CUDA_SYNC");
    sync_each_op_ = s != nullptr && s[0] != '\0' && std::strcmp(s, "0") != 0;
    // bf16 activation storage: on with bf16 products; CTX_BF16_ACTIVATIONS=0 keeps the
    // activations in fp32 (rounded per product), for A/B timings and comparisons
    bf16_activations_ =
        precision_ == Precision::Bf16 &&
        !env_switch("CTX_BF16_ACTIVATIONS", "1", "bf16 activations with --precision bf16", "0",
                    "fp32 activations");
    // the MLP's GELU with bf16 storage: cuBLASLt's epilogue writing bf16, or the fp32 product
    // and the activation kernel (the path before 2026-12-06), for A/B timings
    const bool gelu_kernel =
        env_switch("CTX_MLP_GELU", "epilogue", "the MLP's GELU in the product's epilogue, in bf16",
                   "kernel", "the fp32 product, then the activation kernel");
    mlp_gelu_epilogue_ = bf16_activations_ && !gelu_kernel;
    // the tensor-core attention kernels (FlashTcKernels), for A/B timings: the backward as two
    // kernels (deterministic, the default) or one with an atomic dq; the mma.sync forward's
    // m-tiles a warp (2, or 1: the layout before 2026-11-28); each of the forward, the dq kernel
    // and the dk / dv kernel on sm_90's wgmma where it applies, or mma.sync everywhere (the
    // defaults until a GPU has timed both)
    FlashTcKernels kernels;
    const bool atomic_dq =
        env_switch("CTX_FLASH_BACKWARD", "split", "a dq kernel and a dk/dv kernel", "atomic",
                   "one kernel, dq by atomic adds");
    kernels.backward = atomic_dq ? FlashBackward::AtomicDq : FlashBackward::Split;
    const bool one_mtile =
        env_switch("CTX_FLASH_FORWARD_MTILES", "2", "32 queries a warp", "1", "16 queries a warp");
    kernels.forward_mtiles = one_mtile ? 1 : 2;
    kernels.wgmma_forward = env_switch("CTX_FLASH_FORWARD", "mma", "mma.sync kernels", "wgmma",
                                       "wgmma where it applies (sm_90)");
    kernels.wgmma_dq = env_switch("CTX_FLASH_DQ", "mma", "mma.sync dq kernel", "wgmma",
                                  "the dq kernel on wgmma where it applies (sm_90)");
    kernels.wgmma_dkv = env_switch("CTX_FLASH_DKV", "mma", "mma.sync dk/dv kernel", "wgmma",
                                   "the dk/dv kernel on wgmma where it applies (sm_90)");
    const bool one_warpgroup =
        env_switch("CTX_FLASH_WGMMA_WARPGROUPS", "2", "two warpgroups a wgmma block", "1",
                   "one warpgroup a wgmma block");
    kernels.wgmma_warpgroups = one_warpgroup ? 1 : 2;
    kernels.wgmma_producer =
        env_switch("CTX_FLASH_WGMMA_PIPELINE", "lockstep", "every warpgroup stages, block barriers",
                   "producer", "a producer warpgroup stages, named barriers");
    kernels.wgmma_tma = env_switch("CTX_FLASH_WGMMA_LOADS", "cp.async",
                                   "the producer warpgroup stages tiles by cp.async", "tma",
                                   "the producer kernels' tiles by TMA (swizzled)");
    if (kernels.wgmma_tma && !kernels.wgmma_producer && precision_ == Precision::Bf16)
        spdlog::warn(
            "CTX_FLASH_WGMMA_LOADS=tma applies to the producer pipeline only "
            "(CTX_FLASH_WGMMA_PIPELINE=producer); the lock-step wgmma kernels stage by cp.async");
    // the one-kernel backward's producer form stages by cp.async only: said, not silently
    // dropped
    if (kernels.wgmma_tma && kernels.wgmma_producer && atomic_dq && kernels.wgmma_dkv &&
        precision_ == Precision::Bf16)
        spdlog::warn(
            "CTX_FLASH_WGMMA_LOADS=tma: the one-kernel attention backward "
            "(CTX_FLASH_BACKWARD=atomic) stages its tiles by cp.async (its dS tiles leave no room "
            "for TMA's in shared memory)");
    kernels.wgmma_forward_kerple_tables = !env_switch(
        "CTX_FLASH_FORWARD_KERPLE", "tables", "the wgmma forward looks KERPLE-log's terms up",
        "computed", "the wgmma forward computes them");
    kernels.dq_quad_atomics = !env_switch("CTX_FLASH_DQ_ATOMICS", "quad",
                                          "the one-kernel backward adds dq four columns an atomic",
                                          "scalar", "one dq entry an atomic");
    flash_.set_kernels(kernels);
    // rotary inside the tensor-core attention kernels (the default) or as passes of its own
    // over q, k and dq, dk (the layout before 2026-12-05), for A/B timings
    const bool separate_rotary = env_switch("CTX_FLASH_ROTARY", "fused", "inside the kernels",
                                            "separate", "rotary passes of its own");
    flash_.set_rotary_fusion(!separate_rotary);
    // precision: "fp32", or "bf16" (matrix products and flash attention on bf16 tensor cores,
    // fp32 accumulation; "bf16 activations" when the products' inputs are stored in bf16)
    name_ = fmt::format(
        "cuda:{} ({}, sm_{}{}, {:.0f} GiB, {}{}, cuBLAS{}{}{}{}{}{}{}{}{}{}{}{})", device,
        prop.name, prop.major, prop.minor, double(prop.totalGlobalMem) / double(size_t(1) << 30),
        precision_name(precision_), bf16_activations_ ? " activations" : "",
        lt_.enabled() ? "Lt" : "",
        atomic_dq && precision_ == Precision::Bf16
            ? (kernels.dq_quad_atomics ? ", atomic dq" : ", atomic dq (scalar atomics)")
            : "",
        one_mtile && precision_ == Precision::Bf16 ? ", 1 m-tile forward" : "",
        kernels.wgmma_forward && precision_ == Precision::Bf16 ? ", wgmma forward" : "",
        kernels.wgmma_dq && precision_ == Precision::Bf16 ? ", wgmma dq" : "",
        kernels.wgmma_dkv && precision_ == Precision::Bf16 ? ", wgmma dk/dv" : "",
        kernels.wgmma_forward && !kernels.wgmma_forward_kerple_tables &&
                precision_ == Precision::Bf16
            ? " (forward's KERPLE-log computed)"
            : "",
        kernels.wgmma_producer &&
                (kernels.wgmma_forward || kernels.wgmma_dq || kernels.wgmma_dkv) &&
                precision_ == Precision::Bf16
            ? " (with a producer warpgroup)"
            : "",
        kernels.wgmma_producer && kernels.wgmma_tma &&
                (kernels.wgmma_forward || kernels.wgmma_dq || kernels.wgmma_dkv) &&
                precision_ == Precision::Bf16
            ? " (tiles by TMA)"
            : "",
        one_warpgroup && precision_ == Precision::Bf16 ? ", 1-warpgroup wgmma blocks" : "",
        separate_rotary && precision_ == Precision::Bf16 ? ", separate rotary" : "",
        sync_each_op_ ? ", CTX_CUDA_SYNC" : "");
}

CudaBackend::~CudaBackend() {
    cudaSetDevice(device_);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    uploads_.release();
    d_tokens_.release();
    d_targets_.release();
    d_lens_.release();
    d_groups_.release();
    d_groups_pe_.release();
    bias_staging_.release();
    d_weights_pe_.release();
    d_rotary_.release();
    d_rotation_.release();
    d_partials_.release();
    d_sumsq_.release();
    d_block_partials_.release();
    bf16_act_.release();
    bf16_weight_.release();
    bf16_grad_.release();
    mlp_pre_.release();
    lt_bias_grad_.release();
    lt_.release();
    for (cudaEvent_t e : timing_events_) cudaEventDestroy(e);
    if (blas_ != nullptr) cublasDestroy(blas_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

// ---------------------------------------------------------------- errors

void CudaBackend::activate() const {
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != device_) cudaSetDevice(device_);
}

void check_cuda(cudaError_t e, const char* op) {
    if (e == cudaSuccess) return;
    cudaGetLastError();  // clear a non-sticky error so the next call starts clean
    fail("cuda backend: {}: {} ({})", op, cudaGetErrorString(e), cudaGetErrorName(e));
}

void CudaBackend::check(cudaError_t e, const char* op) const { check_cuda(e, op); }

void CudaBackend::check_blas(cublasStatus_t st, const char* op) const {
    if (st == CUBLAS_STATUS_SUCCESS) return;
    fail("cuda backend: {}: cuBLAS error {} ({})", op, cublasGetStatusString(st), int(st));
}

void CudaBackend::done(cudaError_t launch, const char* op) {
    check(launch, op);
    if (sync_each_op_) sync(op);
}

void CudaBackend::sync(const char* op) {
    note_host_wait();
    check(cudaStreamSynchronize(stream_), op);
}

// ---------------------------------------------------------------- host/device views

bool CudaBackend::on_device(const void* p) const { return is_device_memory(p); }

bool is_device_memory(const void* p) {
    if (p == nullptr) return false;
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        cudaGetLastError();  // older runtimes report plain host memory as an error
        return false;
    }
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

void CudaBackend::upload(void* dst, const void* src, size_t bytes, const char* op) {
    uploads_.upload(dst, src, bytes, stream_, op);
}

BatchInputs CudaBackend::stage_batch(const BatchInputs& host) {
    static constexpr const char* op = "stage_batch";
    activate();
    const size_t N = static_cast<size_t>(std::max(host.N, 0));
    BatchInputs d;
    d.N = host.N;
    auto put = [&](auto* src, auto& scratch) {
        using T = std::remove_const_t<std::remove_pointer_t<decltype(src)>>;
        if (src == nullptr || N == 0) return static_cast<const T*>(nullptr);
        CTX_CHECK(!on_device(src), "cuda backend: stage_batch takes host memory");
        T* dst = scratch.ensure(N, op);
        upload(dst, src, N * sizeof(T), op);
        return static_cast<const T*>(dst);
    };
    d.tokens = put(host.tokens, d_batch_tokens_);
    d.targets = put(host.targets, d_batch_targets_);
    d.positions = put(host.positions, d_batch_positions_);
    d.mask = put(host.mask, d_batch_mask_);
    d.doc_start = put(host.doc_start, d_batch_doc_start_);
    h_batch_tokens_.assign(host.tokens, host.tokens + (host.tokens ? N : 0));
    h_batch_positions_.assign(host.positions, host.positions + (host.positions ? N : 0));
    staged_ = d;
    if (sync_each_op_) sync(op);
    return d;
}

template <class T>
const T* CudaBackend::device_view(const T* p, size_t n, DeviceScratch<T>& stage, const char* op) {
    if (p == nullptr || on_device(p)) return p;
    T* d = stage.ensure(n, op);
    upload(d, p, n * sizeof(T), op);
    return d;
}

template <class T>
const T* CudaBackend::host_view(const T* p, size_t n, std::vector<T>& stage, const char* op) {
    if (p == nullptr || !on_device(p)) return p;
    if (stage.size() < n) stage.resize(n);
    ++input_readbacks_;
    check(cudaMemcpyAsync(stage.data(), p, n * sizeof(T), cudaMemcpyDefault, stream_), op);
    sync(op);
    return stage.data();
}

template const int32_t* CudaBackend::device_view(const int32_t*, size_t, DeviceScratch<int32_t>&,
                                                 const char*);
template const float* CudaBackend::device_view(const float*, size_t, DeviceScratch<float>&,
                                               const char*);
template const int32_t* CudaBackend::host_view(const int32_t*, size_t, std::vector<int32_t>&,
                                               const char*);
template const float* CudaBackend::host_view(const float*, size_t, std::vector<float>&,
                                             const char*);

// ---------------------------------------------------------------- cuBLAS (row-major)
// A row-major (M, N) matrix with leading dimension ld is the column-major (N, M) matrix with the
// same ld, so row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands
// and the dimensions, keep each operand's transpose flag.

void CudaBackend::gemm(const char* op, bool ta, bool tb, int M, int N, int K, float alpha,
                       const float* A, int lda, const float* B, int ldb, float beta, float* C,
                       int ldc) {
    if (M <= 0 || N <= 0) return;
    check_blas(cublasSgemm(blas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                           N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc),
               op);
}

void CudaBackend::gemm_batched(const char* op, bool ta, bool tb, int M, int N, int K, float alpha,
                               const float* A, int lda, long long sa, const float* B, int ldb,
                               long long sb, float beta, float* C, int ldc, long long sc,
                               int batch) {
    if (M <= 0 || N <= 0 || batch <= 0) return;
    check_blas(cublasSgemmStridedBatched(blas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                         ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb,
                                         sb, A, lda, sa, &beta, C, ldc, sc, batch),
               op);
}

// ---------------------------------------------------------------- bf16 products (Precision::Bf16)

const uint16_t* CudaBackend::round_to_bf16(const float* x, size_t n, DeviceScratch<uint16_t>& buf,
                                           const char* op) {
    uint16_t* d = buf.ensure(n, op);
    check(launch_round_to_bf16(d, x, n, stream_), op);
    return d;
}

const uint16_t* CudaBackend::round_rows_to_bf16(const float* x, int rows, int cols, int ld,
                                                DeviceScratch<uint16_t>& buf, const char* op) {
    if (ld == cols) return round_to_bf16(x, size_t(rows) * size_t(cols), buf, op);
    uint16_t* d = buf.ensure(size_t(rows) * size_t(ld), op);
    check(launch_round_rows_to_bf16(d, size_t(ld), x, size_t(rows), size_t(cols), stream_), op);
    return d;
}

// The same operand swap as gemm; bf16 A/B, fp32 C, fp32 accumulation (products of two bf16
// numbers are exact in fp32, so results differ from an fp32 product of the rounded operands only
// in summation order). CUBLAS_GEMM_DEFAULT lets cuBLAS pick a tensor-core kernel; on one stream
// its choice and result are repeatable (no atomics mode is enabled).
void CudaBackend::gemm_bf16(const char* op, bool ta, bool tb, int M, int N, int K, float alpha,
                            const uint16_t* A, int lda, const uint16_t* B, int ldb, float beta,
                            float* C, int ldc) {
    if (M <= 0 || N <= 0) return;
    check_blas(cublasGemmEx(blas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                            N, M, K, &alpha, B, CUDA_R_16BF, ldb, A, CUDA_R_16BF, lda, &beta, C,
                            CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               op);
}

// ---------------------------------------------------------------- memory

float* CudaBackend::alloc_floats(size_t n) {
    activate();
    size_t bytes = (n * sizeof(float) + 63) / 64 * 64;  // cudaMalloc aligns to 256 bytes
    if (bytes == 0) bytes = 64;
    void* p = nullptr;
    const cudaError_t e = tracked_malloc(&p, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        fail("cuda backend: alloc_floats: cannot allocate {} floats ({:.1f} MiB) on device {}: {}",
             n, double(bytes) / double(1 << 20), device_, cudaGetErrorString(e));
    }
    check(cudaMemsetAsync(p, 0, bytes, stream_), "alloc_floats");
    sync("alloc_floats");  // zeroed before any other stream or the host can see it
    return static_cast<float*>(p);
}

void CudaBackend::free_floats(float* p) {
    if (p == nullptr) return;
    activate();
    // Called from destructors (Arena): report, never throw.
    const cudaError_t e = tracked_free(p);
    if (e != cudaSuccess) {
        cudaGetLastError();
        spdlog::warn("cuda backend: free_floats: {}", cudaGetErrorString(e));
    }
}

void CudaBackend::copy_to_device(float* dst, const float* host_src, size_t n) {
    if (n == 0 || dst == host_src) return;
    activate();
    upload(dst, host_src, n * sizeof(float), "copy_to_device");
    if (sync_each_op_) sync("copy_to_device");
}

void CudaBackend::copy_to_host(float* host_dst, const float* src, size_t n) {
    if (n == 0 || host_dst == src) return;
    activate();
    check(cudaMemcpyAsync(host_dst, src, n * sizeof(float), cudaMemcpyDefault, stream_),
          "copy_to_host");
    sync("copy_to_host");
}

void CudaBackend::zero(float* p, size_t n) {
    if (n == 0) return;
    activate();
    done(cudaMemsetAsync(p, 0, n * sizeof(float), stream_), "zero");
}

void CudaBackend::copy(float* dst, const float* src, size_t n) {
    if (n == 0 || dst == src) return;
    activate();
    done(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDefault, stream_), "copy");
}

void CudaBackend::copy_2d(float* dst, size_t dst_stride, const float* src, size_t src_stride,
                          size_t rows, size_t cols, bool accumulate) {
    activate();
    done(launch_copy_2d(dst, dst_stride, src, src_stride, rows, cols, accumulate, stream_),
         "copy_2d");
}

// ---------------------------------------------------------------- elementwise

void CudaBackend::add(float* out, const float* a, const float* b, size_t n) {
    activate();
    done(launch_add(out, a, b, n, stream_), "add");
}

void CudaBackend::accumulate(float* y, const float* x, size_t n) {
    activate();
    done(launch_accumulate(y, x, n, stream_), "accumulate");
}

void CudaBackend::scale(float* x, float s, size_t n) {
    activate();
    done(launch_scale(x, s, n, stream_), "scale");
}

double CudaBackend::sum_squares(const float* x, size_t n) {
    if (n == 0) return 0.0;
    activate();
    const int parts = sum_squares_partials(n);
    double* d = d_sumsq_.ensure(size_t(parts), "sum_squares");
    check(launch_sum_squares(d, x, n, stream_), "sum_squares");
    h_sumsq_.resize(size_t(parts));
    check(cudaMemcpyAsync(h_sumsq_.data(), d, size_t(parts) * sizeof(double), cudaMemcpyDefault,
                          stream_),
          "sum_squares");
    sync("sum_squares");
    double total = 0.0;
    for (double v : h_sumsq_) total += v;  // fixed order: deterministic
    return total;
}

}  // namespace cuda

// ---------------------------------------------------------------- discovery and factory

int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no device" error
        return 0;
    }
    return n;
}

bool cuda_backend_available() { return cuda_device_count() > 0; }

std::unique_ptr<Backend> make_cuda_backend(int device, Precision precision) {
    CTX_CHECK(precision == Precision::Fp32 || precision == Precision::Bf16,
              "cuda backend: precision must be fp32 or bf16, got value {}", int(precision));
    const int n = cuda_device_count();
    if (n == 0)
        fail("no CUDA device is visible (cudaGetDeviceCount found none); use device = \"cpu\" "
             "or \"auto\"");
    if (device < 0 || device >= n) fail("CUDA device {} does not exist ({} visible)", device, n);
    return std::make_unique<cuda::CudaBackend>(device, precision);
}

}  // namespace ctx
