// CPU emulation of cuBLAS and cuBLASLt (the subset the ctxengine CUDA backend uses), for
// engine/backend/cuda/emu/run_emulated_tests.py, beside emu_runtime.cpp (the CUDA runtime):
// sgemm, the bf16 GemmEx and the cuBLASLt matmul with its bias / GELU epilogues follow their
// column-major definitions, validate lda / ldb / ldc like the libraries and check that every
// operand lies inside one device allocation. Calls run on the emulated stream (emu::enqueue).
// Not part of any build target.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cublasLt.h"
#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuda_runtime.h"

using emu::check_range;
using emu::is_dev;

// ---------------------------------------------------------------- cuBLAS
namespace {
// A column-major (rows, cols) operand with leading dimension ld: cuBLAS reads it from device
// memory, so it must lie inside one device allocation (a host pointer faults on a GPU).
void check_matrix(const void* p, size_t elem, int rows, int cols, int ld, const char* what) {
    if (rows <= 0 || cols <= 0) return;
    if (!is_dev(p)) {
        fprintf(stderr, "emu cublas: %s is not device memory\n", what);
        abort();
    }
    check_range(p, (size_t(cols - 1) * size_t(ld) + size_t(rows)) * elem, what);
}
// Whether lda, ldb, ldc are too small for column-major op(A) (m x k), op(B) (k x n), C (m x n),
// as cuBLAS checks them; says which, naming the caller.
bool bad_leading_dims(const char* who, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                      int k, int lda, int ldb, int ldc) {
    auto bad = [&](const char* name, int ld, int rows) {
        if (ld >= std::max(1, rows)) return false;
        fprintf(stderr, "emu %s: bad %s %d\n", who, name, ld);
        return true;
    };
    return bad("lda", lda, ta == CUBLAS_OP_N ? m : k) ||
           bad("ldb", ldb, tb == CUBLAS_OP_N ? k : n) || bad("ldc", ldc, m);
}
}  // namespace

cublasStatus_t cublasCreate(cublasHandle_t* h) {
    *h = reinterpret_cast<cublasHandle_t>(0x2);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
const char* cublasGetStatusString(cublasStatus_t) { return "emulated cublas error"; }

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb,
                                         int m, int n, int k, const float* alpha, const float* A,
                                         int lda, long long sa, const float* B, int ldb,
                                         long long sb, const float* beta, float* C, int ldc,
                                         long long sc, int batch) {
    if (m < 0 || n < 0 || k < 0 || batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (bad_leading_dims("sgemm", ta, tb, m, n, k, lda, ldb, ldc))
        return CUBLAS_STATUS_INVALID_VALUE;
    for (int z = 0; z < batch; z++) {
        if (k > 0) {
            check_matrix(A + z * sa, sizeof(float), ta == CUBLAS_OP_N ? m : k,
                         ta == CUBLAS_OP_N ? k : m, lda, "sgemm A");
            check_matrix(B + z * sb, sizeof(float), tb == CUBLAS_OP_N ? k : n,
                         tb == CUBLAS_OP_N ? n : k, ldb, "sgemm B");
        }
        check_matrix(C + z * sc, sizeof(float), m, n, ldc, "sgemm C");
    }
    const float al = *alpha, be = *beta;  // host scalars: read at the call
    emu::enqueue([=] {
        for (int z = 0; z < batch; z++) {
            const float* a = A + z * sa;
            const float* b = B + z * sb;
            float* c = C + z * sc;
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++) {
                    double s = 0;
                    for (int l = 0; l < k; l++) {
                        const size_t ai = ta == CUBLAS_OP_N ? size_t(i) + size_t(l) * lda
                                                            : size_t(l) + size_t(i) * lda;
                        const size_t bi = tb == CUBLAS_OP_N ? size_t(l) + size_t(j) * ldb
                                                            : size_t(j) + size_t(l) * ldb;
                        s += double(a[ai]) * double(b[bi]);
                    }
                    float& cv = c[size_t(i) + size_t(j) * ldc];
                    cv = float(al * s + (be == 0.0f ? 0.0 : double(be) * cv));
                }
        }
    });
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float* alpha, const float* A, int lda,
                           const float* B, int ldb, const float* beta, float* C, int ldc) {
    return cublasSgemmStridedBatched(h, ta, tb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc,
                                     0, 1);
}

cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                            int lda, const void* B, cudaDataType Btype, int ldb, const void* beta,
                            void* C, cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t) {
    if (Atype != CUDA_R_16BF || Btype != CUDA_R_16BF || Ctype != CUDA_R_32F ||
        computeType != CUBLAS_COMPUTE_32F) {
        fprintf(stderr,
                "emu GemmEx: only bf16 x bf16 -> fp32 with CUBLAS_COMPUTE_32F is emulated\n");
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (bad_leading_dims("GemmEx", ta, tb, m, n, k, lda, ldb, ldc))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (k > 0) {
        check_matrix(A, 2, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda, "GemmEx A");
        check_matrix(B, 2, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb, "GemmEx B");
    }
    check_matrix(C, sizeof(float), m, n, ldc, "GemmEx C");
    const __nv_bfloat16* a = static_cast<const __nv_bfloat16*>(A);
    const __nv_bfloat16* b = static_cast<const __nv_bfloat16*>(B);
    float* c = static_cast<float*>(C);
    const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
    emu::enqueue([=] {
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double s = 0;
                for (int l = 0; l < k; l++) {
                    const size_t ai = ta == CUBLAS_OP_N ? size_t(i) + size_t(l) * lda
                                                        : size_t(l) + size_t(i) * lda;
                    const size_t bi = tb == CUBLAS_OP_N ? size_t(l) + size_t(j) * ldb
                                                        : size_t(j) + size_t(l) * ldb;
                    s += double(__bfloat162float(a[ai])) * double(__bfloat162float(b[bi]));
                }
                float& cv = c[size_t(i) + size_t(j) * ldc];
                cv = float(al * s + (be == 0.0f ? 0.0 : double(be) * cv));
            }
    });
    return CUBLAS_STATUS_SUCCESS;
}

// ---------------------------------------------------------------- cuBLASLt (cublasLt.h)
// The descriptors hold what was set; cublasLtMatmul evaluates the definition: D = alpha op(A)
// op(B) + beta C (sums in double, rounded once to fp32), then + bias[i] per row i of D, then GELU
// (tanh form, as cuBLASLt's) with its input kept in the aux matrix, or (DGELU) times GELU's
// derivative at the aux matrix's entry, with (BGRAD) the row sums of that D (before it is
// rounded) written to the bias pointer; each stored in its matrix's type (bf16: rounded to
// nearest even). The bias and aux types default to D's, as documented.
struct emu_lt_desc {
    cublasComputeType_t compute;
    cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    int32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void* bias = nullptr;
    void* aux = nullptr;
    int64_t aux_ld = 0;
    int32_t bias_type = -1, aux_type = -1;  // -1: D's type
};
struct emu_lt_layout {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
};
// min_align: the pointer alignments (A, B, C, D) the algorithm may assume; 256, the library's
// default, when not set.
struct emu_lt_pref {
    size_t workspace = 0;
    uint32_t min_align[4] = {256, 256, 256, 256};
};

namespace {
long g_lt_calls = 0, g_lt_calls_bf16_out = 0;

template <class T>
bool set_value(T& dst, const void* buf, size_t bytes) {
    if (buf == nullptr || bytes != sizeof(T)) return false;
    std::memcpy(&dst, buf, sizeof(T));
    return true;
}

double lt_load(const void* p, cudaDataType t, size_t i) {
    if (t == CUDA_R_16BF) return double(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]));
    return double(static_cast<const float*>(p)[i]);
}

void lt_store(void* p, cudaDataType t, size_t i, float x) {
    if (t == CUDA_R_16BF)
        static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
    else
        static_cast<float*>(p)[i] = x;
}

size_t lt_size(cudaDataType t) { return t == CUDA_R_16BF ? 2 : 4; }

// The bias's and the aux matrix's types: D's unless set.
cudaDataType bias_type(const emu_lt_desc* d, const emu_lt_layout* D) {
    return d->bias_type < 0 ? D->type : cudaDataType(d->bias_type);
}
cudaDataType aux_type(const emu_lt_desc* d, const emu_lt_layout* D) {
    return d->aux_type < 0 ? D->type : cudaDataType(d->aux_type);
}

// CTX_EMU_LT_REFUSE (emulation only, comma-separated): configurations the heuristic offers no
// algorithm for, as a real library may, so the callers' fallbacks can be tested: "bf16_out"
// (any bf16 D), "dgelu" (the DGELU epilogues).
bool refused(const emu_lt_desc* d, const emu_lt_layout* D) {
    const char* e = std::getenv("CTX_EMU_LT_REFUSE");
    if (e == nullptr) return false;
    const std::string list = std::string(",") + e + ",";
    auto has = [&](const char* w) {
        return list.find(std::string(",") + w + ",") != std::string::npos;
    };
    return (has("bf16_out") && D->type == CUDA_R_16BF) || (has("dgelu") && (d->epilogue & 64));
}

// The configuration cublasLtMatmul accepts (what the real library documents for it).
bool lt_valid(const emu_lt_desc* d, const emu_lt_layout* A, const emu_lt_layout* B,
              const emu_lt_layout* C, const emu_lt_layout* D) {
    if (d->compute != CUBLAS_COMPUTE_32F || A->type != B->type ||
        (A->type != CUDA_R_32F && A->type != CUDA_R_16BF) || C->type != D->type ||
        (D->type != CUDA_R_32F && D->type != CUDA_R_16BF) ||
        (D->type == CUDA_R_16BF && A->type != CUDA_R_16BF)) {
        fprintf(stderr,
                "emu cublasLt: only fp32 or bf16 A/B with fp32 C/D, or bf16 A/B with bf16 "
                "C/D, compute 32F\n");
        return false;
    }
    const cudaDataType bt = bias_type(d, D), xt = aux_type(d, D);
    if ((bt != CUDA_R_32F && bt != CUDA_R_16BF) || (D->type == CUDA_R_32F && bt != CUDA_R_32F) ||
        xt != D->type) {
        fprintf(stderr, "emu cublasLt: bias type %d / aux type %d with D of type %d\n", int(bt),
                int(xt), int(D->type));
        return false;
    }
    const uint64_t m = D->rows, n = D->cols, k = d->ta == CUBLAS_OP_N ? A->cols : A->rows;
    const bool shapes = (d->ta == CUBLAS_OP_N ? A->rows : A->cols) == m &&
                        (d->tb == CUBLAS_OP_N ? B->rows : B->cols) == k &&
                        (d->tb == CUBLAS_OP_N ? B->cols : B->rows) == n && C->rows == m &&
                        C->cols == n;
    const bool lds = A->ld >= int64_t(std::max<uint64_t>(1, A->rows)) &&
                     B->ld >= int64_t(std::max<uint64_t>(1, B->rows)) &&
                     C->ld >= int64_t(std::max<uint64_t>(1, m)) &&
                     D->ld >= int64_t(std::max<uint64_t>(1, m));
    if (!shapes || !lds) {
        fprintf(stderr, "emu cublasLt: inconsistent shapes or leading dimensions\n");
        return false;
    }
    const int32_t e = d->epilogue;
    if (e != CUBLASLT_EPILOGUE_DEFAULT && e != CUBLASLT_EPILOGUE_BIAS &&
        e != CUBLASLT_EPILOGUE_GELU_AUX && e != CUBLASLT_EPILOGUE_GELU_AUX_BIAS &&
        e != CUBLASLT_EPILOGUE_DGELU && e != CUBLASLT_EPILOGUE_DGELU_BGRAD) {
        fprintf(stderr, "emu cublasLt: epilogue %d is not emulated\n", int(e));
        return false;
    }
    if ((e & (CUBLASLT_EPILOGUE_BIAS | 16)) && d->bias == nullptr) {
        fprintf(stderr,
                "emu cublasLt: a bias (gradient) epilogue without "
                "CUBLASLT_MATMUL_DESC_BIAS_POINTER\n");
        return false;
    }
    if ((e & 128) && (d->aux == nullptr || d->aux_ld < int64_t(m) || d->aux_ld % 8 != 0)) {
        fprintf(stderr,
                "emu cublasLt: GELU aux needs a pointer and an ld >= rows, divisible by 8\n");
        return false;
    }
    return true;
}
}  // namespace

extern "C" long emu_cublaslt_matmul_calls() { return g_lt_calls; }
extern "C" long emu_cublaslt_matmul_calls_bf16_out() { return g_lt_calls_bf16_out; }

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
    *h = reinterpret_cast<cublasLtHandle_t>(0x3);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
    if (scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    *d = new emu_lt_desc{compute};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t bytes) {
    bool ok = false;
    switch (attr) {
        case CUBLASLT_MATMUL_DESC_TRANSA: {
            int32_t v;
            ok = set_value(v, buf, bytes);
            d->ta = cublasOperation_t(v);
            break;
        }
        case CUBLASLT_MATMUL_DESC_TRANSB: {
            int32_t v;
            ok = set_value(v, buf, bytes);
            d->tb = cublasOperation_t(v);
            break;
        }
        case CUBLASLT_MATMUL_DESC_EPILOGUE:
            ok = set_value(d->epilogue, buf, bytes);
            break;
        case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
            ok = set_value(d->bias, buf, bytes);
            break;
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
            ok = set_value(d->aux, buf, bytes);
            break;
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
            ok = set_value(d->aux_ld, buf, bytes);
            break;
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
            ok = set_value(d->aux_type, buf, bytes);
            break;
        case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
            ok = set_value(d->bias_type, buf, bytes);
            break;
    }
    return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
    *l = new emu_lt_layout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
    *p = new emu_lt_pref{};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t bytes) {
    if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES &&
        attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) {
        uint32_t a;
        if (!set_value(a, buf, bytes)) return CUBLAS_STATUS_INVALID_VALUE;
        p->min_align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = a;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (attr != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) return CUBLAS_STATUS_INVALID_VALUE;
    uint64_t v;
    if (!set_value(v, buf, bytes)) return CUBLAS_STATUS_INVALID_VALUE;
    p->workspace = size_t(v);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                              cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
    *returned = 0;
    if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
    if (!lt_valid(d, A, B, C, D) || refused(d, D)) return CUBLAS_STATUS_NOT_SUPPORTED;
    results[0] = cublasLtMatmulHeuristicResult_t{};
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].algo.data[0] = 0xe11;  // marks an algorithm this emulation handed out
    // the alignments it was chosen for: cublasLtMatmul refuses pointers aligned less (as an
    // algorithm that relies on them would fail on a GPU)
    for (int i = 0; i < 4; i++) results[0].algo.data[1 + i] = pref->min_align[i];
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t Al, const void* B,
                              cublasLtMatrixLayout_t Bl, const void* beta, const void* C,
                              cublasLtMatrixLayout_t Cl, void* D, cublasLtMatrixLayout_t Dl,
                              const cublasLtMatmulAlgo_t* algo, void*, size_t, cudaStream_t) {
    if (!lt_valid(d, Al, Bl, Cl, Dl)) return CUBLAS_STATUS_INVALID_VALUE;
    if (algo == nullptr || algo->data[0] != 0xe11) {
        fprintf(stderr, "emu cublasLt: an algorithm not from cublasLtMatmulAlgoGetHeuristic\n");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const void* ptrs[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++) {
        if (i == 2 && *static_cast<const float*>(beta) == 0.0f) continue;  // C unread
        const uint64_t need = algo->data[1 + i];
        if (need > 1 && reinterpret_cast<uintptr_t>(ptrs[i]) % need != 0) {
            fprintf(stderr,
                    "emu cublasLt: matrix %c at %p is not aligned to the %llu bytes its "
                    "algorithm was chosen for\n",
                    "ABCD"[i], ptrs[i], (unsigned long long)need);
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
    }
    ++g_lt_calls;
    if (Dl->type == CUDA_R_16BF) ++g_lt_calls_bf16_out;
    const int m = int(Dl->rows), n = int(Dl->cols),
              k = int(d->ta == CUBLAS_OP_N ? Al->cols : Al->rows);
    const size_t ea = Al->type == CUDA_R_16BF ? 2 : 4;
    if (k > 0) {
        check_matrix(A, ea, int(Al->rows), int(Al->cols), int(Al->ld), "cublasLt A");
        check_matrix(B, ea, int(Bl->rows), int(Bl->cols), int(Bl->ld), "cublasLt B");
    }
    const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
    const cudaDataType bt = bias_type(d, Dl), xt = aux_type(d, Dl);
    if (be != 0.0f) check_matrix(C, lt_size(Cl->type), m, n, int(Cl->ld), "cublasLt C");
    check_matrix(D, lt_size(Dl->type), m, n, int(Dl->ld), "cublasLt D");
    if (d->epilogue & (CUBLASLT_EPILOGUE_BIAS | 16))
        check_matrix(d->bias, lt_size(bt), m, 1, m, "cublasLt bias");
    if (d->epilogue & 128) check_matrix(d->aux, lt_size(xt), m, n, int(d->aux_ld), "cublasLt aux");
    // the descriptors' values at the call (the caller may change or destroy them after)
    emu::enqueue([m, n, k, A, B, C, D, al, be, bt, xt, dv = *d, Av = *Al, Bv = *Bl, Cv = *Cl,
                  Dv = *Dl] {
        const emu_lt_desc* d = &dv;
        const emu_lt_layout *Al = &Av, *Bl = &Bv, *Cl = &Cv, *Dl = &Dv;
        std::vector<float> col(m);
        std::vector<double> bgrad(d->epilogue & 16 ? m : 0, 0.0);
        for (int j = 0; j < n; j++) {
            for (int i = 0; i < m; i++) {
                double s = 0;
                for (int l = 0; l < k; l++) {
                    const size_t ai = d->ta == CUBLAS_OP_N ? size_t(i) + size_t(l) * Al->ld
                                                           : size_t(l) + size_t(i) * Al->ld;
                    const size_t bi = d->tb == CUBLAS_OP_N ? size_t(l) + size_t(j) * Bl->ld
                                                           : size_t(j) + size_t(l) * Bl->ld;
                    s += lt_load(A, Al->type, ai) * lt_load(B, Bl->type, bi);
                }
                const double v =
                    al * s + (be == 0.0f ? 0.0
                                         : double(be) * lt_load(C, Cl->type,
                                                                size_t(i) + size_t(j) * Cl->ld));
                float x = float(v);
                if (d->epilogue & CUBLASLT_EPILOGUE_BIAS) x += float(lt_load(d->bias, bt, i));
                col[i] = x;
            }
            for (int i = 0; i < m; i++) {  // after the whole column: D may alias C
                float x = col[i];
                if (d->epilogue & 64) {  // DGELU: times gelu'(aux), the aux an input
                    const double t = lt_load(d->aux, xt, size_t(i) + size_t(j) * d->aux_ld);
                    const double c = 0.7978845608028654, u = c * (t + 0.044715 * t * t * t);
                    const double th = std::tanh(u);
                    const double dg = 0.5 * (1.0 + th) + 0.5 * t * (1.0 - th * th) * c *
                                                             (1.0 + 3.0 * 0.044715 * t * t);
                    x = float(double(x) * dg);
                    if (d->epilogue & 16) bgrad[i] += double(x);
                } else if (d->epilogue & 128) {
                    lt_store(d->aux, xt, size_t(i) + size_t(j) * d->aux_ld, x);
                    const double t = double(x);
                    x = float(0.5 * t *
                              (1.0 + std::tanh(0.7978845608028654 * (t + 0.044715 * t * t * t))));
                }
                lt_store(D, Dl->type, size_t(i) + size_t(j) * Dl->ld, x);
            }
        }
        for (size_t i = 0; i < bgrad.size(); i++)  // BGRAD: written, not added to
            lt_store(const_cast<void*>(d->bias), bt, i, float(bgrad[i]));
    });
    return CUBLAS_STATUS_SUCCESS;
}
