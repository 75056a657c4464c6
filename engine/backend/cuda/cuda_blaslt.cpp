// CUDA backend: dense products with fused epilogues through cuBLASLt (cuda_blaslt.h).
//
// Row-major out (N, OC) = inp (N, IC) @ W^T read column-major: D (m = OC, n = N) = op(A) B with
// A = W as stored, a column-major (IC, OC) matrix taken transposed, B = inp, a column-major
// (IC, N) matrix, D and the GELU aux column-major (OC, N) with leading dimension OC. The bias
// (OC) runs along D's rows, which is how the BIAS epilogue broadcasts it.
#include "backend/cuda/cuda_blaslt.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"

namespace ctx::cuda {

namespace {

// 32 MiB: what NVIDIA recommends for Hopper's cuBLASLt kernels (split-K and stream-K use it).
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

void check_lt(cublasStatus_t st, const char* op, const char* call) {
    if (st == CUBLAS_STATUS_SUCCESS) return;
    fail("cuda backend: {}: {}: cuBLAS error {} ({})", op, call, cublasGetStatusString(st),
         int(st));
}

// The largest power of two (up to 256) that divides the address: cuBLASLt picks kernels by it.
int alignment(const void* p) {
    if (p == nullptr) return 0;
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    int al = 1;
    while (al < 256 && (a % uintptr_t(al * 2)) == 0) al *= 2;
    return al;
}

template <class T>
void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v,
              const char* op) {
    check_lt(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(T)), op,
             "cublasLtMatmulDescSetAttribute");
}

}  // namespace

BlasLt::BlasLt() {
    const char* e = std::getenv("CTX_CUBLASLT");
    if (e == nullptr || *e == '\0') return;
    CTX_CHECK(std::strcmp(e, "0") == 0 || std::strcmp(e, "1") == 0,
              "CTX_CUBLASLT: expected 0 (the unfused cuBLAS path) or 1 (cuBLASLt epilogues, the "
              "default), got '{}'", e);
    enabled_ = std::strcmp(e, "1") == 0;
}

BlasLt::~BlasLt() { release(); }

void BlasLt::release() {
    for (auto& [key, p] : plans_) {
        if (p.a) cublasLtMatrixLayoutDestroy(p.a);
        if (p.b) cublasLtMatrixLayoutDestroy(p.b);
        if (p.d) cublasLtMatrixLayoutDestroy(p.d);
        if (p.desc) cublasLtMatmulDescDestroy(p.desc);
    }
    plans_.clear();
    if (workspace_ != nullptr) tracked_free(workspace_);
    workspace_ = nullptr;
    workspace_bytes_ = 0;
    if (handle_ != nullptr) cublasLtDestroy(handle_);
    handle_ = nullptr;
}

BlasLt::Plan& BlasLt::plan(const Key& key, const Product& p, int epilogue, const char* op) {
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    Plan& pl = plans_[key];
    const cudaDataType ab = p.bf16 ? CUDA_R_16BF : CUDA_R_32F;
    check_lt(cublasLtMatmulDescCreate(&pl.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), op,
             "cublasLtMatmulDescCreate");
    set_attr(pl.desc, CUBLASLT_MATMUL_DESC_TRANSA, int32_t(CUBLAS_OP_T), op);
    set_attr(pl.desc, CUBLASLT_MATMUL_DESC_TRANSB, int32_t(CUBLAS_OP_N), op);
    set_attr(pl.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, int32_t(epilogue), op);
    // the pointers the heuristic judges alignment by (set again on every call)
    if (p.bias != nullptr) set_attr(pl.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias, op);
    if (p.pre != nullptr) {
        set_attr(pl.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(p.pre), op);
        set_attr(pl.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(p.OC), op);
    }
    check_lt(cublasLtMatrixLayoutCreate(&pl.a, ab, uint64_t(p.IC), uint64_t(p.OC), p.IC), op,
             "cublasLtMatrixLayoutCreate");
    check_lt(cublasLtMatrixLayoutCreate(&pl.b, ab, uint64_t(p.IC), uint64_t(p.N), p.IC), op,
             "cublasLtMatrixLayoutCreate");
    // D (and C, the same layout): fp32, or bf16 rounded by the epilogue; the GELU aux matrix
    // takes D's type by default, and so would the bias, which is the fp32 master copy
    const cudaDataType dtype = p.out_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    if (p.out_bf16 && p.bias != nullptr)
        set_attr(pl.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(CUDA_R_32F), op);
    check_lt(cublasLtMatrixLayoutCreate(&pl.d, dtype, uint64_t(p.OC), uint64_t(p.N), p.OC), op,
             "cublasLtMatrixLayoutCreate");
    cublasLtMatmulPreference_t pref = nullptr;
    check_lt(cublasLtMatmulPreferenceCreate(&pref), op, "cublasLtMatmulPreferenceCreate");
    const uint64_t ws = kWorkspaceBytes;
    check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws, sizeof ws),
             op, "cublasLtMatmulPreferenceSetAttribute");
    // The pointers' actual alignment (part of the plan's key): by default the heuristic may
    // pick an algorithm that assumes 256 bytes, and a view into an arena or a slot of the
    // activations is often aligned less.
    const std::pair<cublasLtMatmulPreferenceAttributes_t, const void*> aligned[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, p.W},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, p.inp},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, p.residual != nullptr ? p.residual : p.out},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, p.out}};
    for (const auto& [attr, ptr] : aligned) {
        const uint32_t bytes = uint32_t(alignment(ptr));
        check_lt(cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof bytes), op,
                 "cublasLtMatmulPreferenceSetAttribute");
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, pl.desc, pl.a, pl.b, pl.d,
                                                             pl.d, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    pl.ok = st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (pl.ok) {
        pl.algo = result.algo;
    } else {
        spdlog::warn(
            "cuda backend: {}: cuBLASLt has no algorithm for N={} IC={} OC={} {} -> {} "
            "with epilogue {} ({}); this shape runs the unfused path",
            op, p.N, p.IC, p.OC, p.bf16 ? "bf16" : "fp32", p.out_bf16 ? "bf16" : "fp32", epilogue,
            cublasGetStatusString(st));
    }
    return pl;
}

bool BlasLt::forward(const Product& p, cudaStream_t stream, const char* op) {
    if (!takes(p.OC, p.pre != nullptr, p.out_bf16) || p.N <= 0 || p.IC <= 0) return false;
    CTX_CHECK(!p.out_bf16 || (p.bf16 && p.residual == nullptr),
              "internal: {}: a bf16 product output needs bf16 operands and no residual", op);
    const int epilogue = p.pre != nullptr
                             ? (p.bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                  : CUBLASLT_EPILOGUE_GELU_AUX)
                             : (p.bias != nullptr ? CUBLASLT_EPILOGUE_BIAS
                                                  : CUBLASLT_EPILOGUE_DEFAULT);
    if (handle_ == nullptr) {
        check_lt(cublasLtCreate(&handle_), op, "cublasLtCreate");
        check_cuda(tracked_malloc(&workspace_, kWorkspaceBytes), op);
        workspace_bytes_ = kWorkspaceBytes;
    }
    const Key key{p.N,
                  p.IC,
                  p.OC,
                  p.bf16,
                  p.out_bf16,
                  epilogue,
                  alignment(p.inp),
                  alignment(p.W),
                  alignment(p.out),
                  alignment(p.bias),
                  alignment(p.pre),
                  alignment(p.residual)};
    Plan& pl = plan(key, p, epilogue, op);
    if (!pl.ok) return false;
    if (p.bias != nullptr) set_attr(pl.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias, op);
    if (p.pre != nullptr)
        set_attr(pl.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(p.pre), op);
    const float one = 1.0f, zero = 0.0f;
    const bool res = p.residual != nullptr;  // C: the residual with beta 1 (same layout as D)
    check_lt(cublasLtMatmul(handle_, pl.desc, &one, p.W, pl.a, p.inp, pl.b, res ? &one : &zero,
                            res ? static_cast<const void*>(p.residual) : p.out, pl.d, p.out, pl.d,
                            &pl.algo, workspace_, workspace_bytes_, stream),
             op, "cublasLtMatmul");
    return true;
}

}  // namespace ctx::cuda
