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
    CTX_CHECK(std::strcmp(e, "0") == 0 || std::strcmp(e, "1") == 0 || std::strcmp(e, "strict") == 0,
              "CTX_CUBLASLT: expected 0 (the unfused cuBLAS path), 1 (cuBLASLt epilogues, the "
              "default) or strict (the same, and a configuration cuBLASLt has no algorithm for "
              "is an error instead of running unfused), got '{}'",
              e);
    enabled_ = std::strcmp(e, "0") != 0;
    strict_ = std::strcmp(e, "strict") == 0;
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

BlasLt::Plan& BlasLt::plan(const Spec& s, const char* op) {
    const Key key{s.transa,
                  s.m,
                  s.n,
                  s.k,
                  s.lda,
                  s.ldb,
                  s.ldd,
                  s.ab_bf16,
                  s.d_bf16,
                  s.epilogue,
                  alignment(s.A),
                  alignment(s.B),
                  alignment(s.C),
                  alignment(s.D),
                  alignment(s.bias),
                  alignment(s.aux)};
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    Plan& pl = plans_[key];
    const cudaDataType ab = s.ab_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    check_lt(cublasLtMatmulDescCreate(&pl.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), op,
             "cublasLtMatmulDescCreate");
    set_attr(pl.desc, CUBLASLT_MATMUL_DESC_TRANSA, int32_t(s.transa ? CUBLAS_OP_T : CUBLAS_OP_N),
             op);
    set_attr(pl.desc, CUBLASLT_MATMUL_DESC_TRANSB, int32_t(CUBLAS_OP_N), op);
    set_attr(pl.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, int32_t(s.epilogue), op);
    // the pointers the heuristic judges alignment by (set again on every call)
    if (s.bias != nullptr) set_attr(pl.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, s.bias, op);
    if (s.aux != nullptr) {
        set_attr(pl.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, s.aux, op);
        set_attr(pl.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(s.m), op);
    }
    // D (and C, the same layout): fp32, or bf16 rounded by the epilogue. The GELU aux matrix
    // takes D's type by default, and so would the bias (or its gradient), which is fp32 here.
    if (s.d_bf16 && s.bias != nullptr)
        set_attr(pl.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(CUDA_R_32F), op);
    const int a_rows = s.transa ? s.k : s.m, a_cols = s.transa ? s.m : s.k;
    check_lt(cublasLtMatrixLayoutCreate(&pl.a, ab, uint64_t(a_rows), uint64_t(a_cols), s.lda), op,
             "cublasLtMatrixLayoutCreate");
    check_lt(cublasLtMatrixLayoutCreate(&pl.b, ab, uint64_t(s.k), uint64_t(s.n), s.ldb), op,
             "cublasLtMatrixLayoutCreate");
    check_lt(cublasLtMatrixLayoutCreate(&pl.d, s.d_bf16 ? CUDA_R_16BF : CUDA_R_32F, uint64_t(s.m),
                                        uint64_t(s.n), s.ldd),
             op, "cublasLtMatrixLayoutCreate");
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
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, s.A},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, s.B},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, s.C != nullptr ? s.C : s.D},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, s.D}};
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
    } else if (!strict_) {  // (strict: run() refuses it, every time)
        spdlog::warn(
            "cuda backend: {}: cuBLASLt has no algorithm for m={} n={} k={} {} -> {} with "
            "epilogue {} ({}); this shape runs the unfused path",
            op, s.m, s.n, s.k, s.ab_bf16 ? "bf16" : "fp32", s.d_bf16 ? "bf16" : "fp32", s.epilogue,
            cublasGetStatusString(st));
    }
    return pl;
}

bool BlasLt::run(const Spec& s, cudaStream_t stream, const char* op) {
    if (handle_ == nullptr) {
        check_lt(cublasLtCreate(&handle_), op, "cublasLtCreate");
        check_cuda(tracked_malloc(&workspace_, kWorkspaceBytes), op);
        workspace_bytes_ = kWorkspaceBytes;
    }
    Plan& pl = plan(s, op);
    CTX_CHECK(pl.ok || !strict_,
              "cuda backend: {}: cuBLASLt has no algorithm for m={} n={} k={} {} -> {} with "
              "epilogue {}, and CTX_CUBLASLT=strict refuses the unfused path",
              op, s.m, s.n, s.k, s.ab_bf16 ? "bf16" : "fp32", s.d_bf16 ? "bf16" : "fp32",
              s.epilogue);
    if (!pl.ok) return false;
    if (s.bias != nullptr) set_attr(pl.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, s.bias, op);
    if (s.aux != nullptr) set_attr(pl.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, s.aux, op);
    const float one = 1.0f, zero = 0.0f;
    const bool res = s.C != nullptr;  // C: the residual with beta 1 (same layout as D)
    check_lt(cublasLtMatmul(handle_, pl.desc, &one, s.A, pl.a, s.B, pl.b, res ? &one : &zero,
                            res ? s.C : s.D, pl.d, s.D, pl.d, &pl.algo, workspace_,
                            workspace_bytes_, stream),
             op, "cublasLtMatmul");
    return true;
}

// Row-major out (N, OC) = inp (N, IC) @ W^T: D (OC, N) = W^T (A = W, column-major (IC, OC),
// transposed) times B = inp, column-major (IC, N).
bool BlasLt::forward(const Product& p, cudaStream_t stream, const char* op) {
    if (!takes(p.OC, p.pre != nullptr, p.out_bf16) || p.N <= 0 || p.IC <= 0) return false;
    CTX_CHECK(!p.out_bf16 || (p.bf16 && p.residual == nullptr),
              "internal: {}: a bf16 product output needs bf16 operands and no residual", op);
    Spec s;
    s.transa = true;
    s.m = p.OC;
    s.n = p.N;
    s.k = p.IC;
    s.lda = p.IC;
    s.ldb = p.IC;
    s.ldd = p.OC;
    s.ab_bf16 = p.bf16;
    s.d_bf16 = p.out_bf16;
    s.epilogue =
        p.pre != nullptr
            ? (p.bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
            : (p.bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
    s.A = p.W;
    s.B = p.inp;
    s.C = p.residual;
    s.D = p.out;
    s.bias = p.bias;
    s.aux = p.pre;
    return run(s, stream, op);
}

// Row-major dpre (N, OC) = g (N, OP) @ W (OP, OC): D (OC, N) = A B with A = W as stored
// (column-major (OC, OP)) and B = g (column-major (OP, N), leading dimension ldg).
bool BlasLt::backward_dgelu(const DgeluProduct& p, cudaStream_t stream, const char* op) {
    if (!takes(p.OC, true, true) || p.N <= 0 || p.OP <= 0) return false;
    CTX_CHECK(p.ldg >= p.OP && p.ldd >= p.OC,
              "internal: {}: leading dimensions {} / {} for "
              "widths {} / {}",
              op, p.ldg, p.ldd, p.OP, p.OC);
    Spec s;
    s.transa = false;
    s.m = p.OC;
    s.n = p.N;
    s.k = p.OP;
    s.lda = p.OC;
    s.ldb = p.ldg;
    s.ldd = p.ldd;
    s.ab_bf16 = true;
    s.d_bf16 = true;
    s.epilogue = p.dbias != nullptr ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
    s.A = p.W;
    s.B = p.g;
    s.D = p.dpre;
    s.bias = p.dbias;
    s.aux = const_cast<void*>(p.pre);  // an input here (cuBLASLt's pointer is not const)
    return run(s, stream, op);
}

}  // namespace ctx::cuda
