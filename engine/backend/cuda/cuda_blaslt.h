// CUDA backend (private header): dense products through cuBLASLt with their epilogue fused
// (docs/CUDA.md "cuBLASLt epilogues"). Row-major out (N, OC) = inp (N, IC) @ W^T + bias, and for
// the MLP's first product out = gelu_tanh(pre), pre = inp @ W^T + bias kept for the backward
// pass: one pass over the output instead of a bias broadcast, a product reading it back (beta 1)
// and an activation kernel. A residual (the output projections of a block) comes in as the
// product's C with beta 1: out = residual + inp @ W^T + bias, no add kernel. With bf16 outputs
// (bf16 activation storage) the epilogue rounds out and pre as it writes them: the MLP's first
// product then writes its two bf16 activations and nothing else. In the MLP's backward the
// product that makes the activation's gradient takes GELU's derivative (and fc's bias
// gradient) in its epilogue (backward_dgelu).
//
// Plans (the descriptors and the heuristic's algorithm) are cached per shape, operand type,
// epilogue and pointer alignment; a configuration cuBLASLt has no algorithm for is remembered
// (and logged once), and forward() / backward_dgelu() return false for it so the caller runs
// its unfused path.
// CTX_CUBLASLT=0 turns the whole path off (A/B timings on a GPU); CTX_CUBLASLT=strict makes a
// refused configuration an error (the GPU tests: so a fallback cannot pass unseen).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>

namespace ctx::cuda {

class BlasLt {
public:
    // reads CTX_CUBLASLT (unset or 1: on, 0: off, strict: on and a refused configuration is a
    // ctx::Error, for tests on a GPU; else ctx::Error)
    BlasLt();
    ~BlasLt();
    BlasLt(const BlasLt&) = delete;
    BlasLt& operator=(const BlasLt&) = delete;

    struct Product {
        int N = 0, IC = 0, OC = 0;
        bool bf16 = false;             // inp and W: bf16 bit patterns, else fp32
        const void* inp = nullptr;     // (N, IC)
        const void* W = nullptr;       // (OC, IC)
        const float* bias = nullptr;   // (OC) or null
        void* out = nullptr;           // (N, OC), fp32 or (out_bf16) bf16
        void* pre = nullptr;           // GELU: (N, OC) the activation's input, out's type; or null
        const float* residual = nullptr;  // (N, OC) added to the product (beta 1), or null
        // out and pre as bf16 bit patterns, rounded to nearest from the fp32 epilogue (bf16
        // inputs, no residual); the bias stays fp32 (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE)
        bool out_bf16 = false;
    };
    // Runs the product on `stream` and returns true, or returns false having run nothing (the
    // path is off, or cuBLASLt has no algorithm for it). Throws ctx::Error naming `op` when a
    // cuBLASLt call fails.
    bool forward(const Product& p, cudaStream_t stream, const char* op);

    // The MLP's backward product with GELU's derivative (tanh form) in the epilogue, all bf16:
    // dpre (N, OC) = (g (N, OP) @ W (OP, OC)) * gelu'(pre), rounded as it is stored (row-major,
    // leading dimensions ldg and ldd); with dbias, its fp32 column sums of the unrounded dpre
    // are written there (DGELU_BGRAD with an fp32 bias-gradient type). Returns false having
    // run nothing where forward() would.
    struct DgeluProduct {
        int N = 0, OP = 0, OC = 0;
        const void* g = nullptr;  // (N, OP) bf16, leading dimension ldg
        int ldg = 0;
        const void* W = nullptr;    // (OP, OC) bf16
        const void* pre = nullptr;  // (N, OC) bf16
        void* dpre = nullptr;       // (N, OC) bf16, leading dimension ldd
        int ldd = 0;
        float* dbias = nullptr;  // (OC), written; or null
    };
    bool backward_dgelu(const DgeluProduct& p, cudaStream_t stream, const char* op);

    // Whether forward() may take a product of this width (the path is on; a GELU's aux matrix
    // needs a leading dimension that is a multiple of 8, and bf16 rows one of 16 bytes):
    // callers skip preparing operands for a product it would refuse anyway.
    bool takes(int OC, bool gelu, bool out_bf16 = false) const {
        return enabled_ && OC > 0 && (!(gelu || out_bf16) || OC % 8 == 0);
    }
    bool enabled() const { return enabled_; }
    void release();  // the handle, the plans and the workspace (the backend's destructor)

private:
    // One column-major product D (m, n) = op(A) B (+ C) with its epilogue, as cublasLtMatmul
    // takes it (forward: A = W taken transposed; backward: A = W as stored).
    struct Spec {
        bool transa = true;
        int m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldd = 0;
        bool ab_bf16 = false, d_bf16 = false;
        int epilogue = 0;
        const void* A = nullptr;
        const void* B = nullptr;
        const void* C = nullptr;  // the residual (beta 1), or null
        void* D = nullptr;
        const void* bias = nullptr;  // bias, or the bias gradient (written)
        void* aux = nullptr;         // the GELU aux matrix (leading dimension m)
    };
    struct Plan {
        bool ok = false;
        cublasLtMatmulDesc_t desc = nullptr;
        cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
        cublasLtMatmulAlgo_t algo{};
    };
    // shapes, types, epilogue, and the alignment of A, B, C, D, bias, aux (0: none)
    using Key = std::array<int64_t, 16>;
    Plan& plan(const Spec& s, const char* op);
    bool run(const Spec& s, cudaStream_t stream, const char* op);

    bool enabled_ = true;
    bool strict_ = false;
    cublasLtHandle_t handle_ = nullptr;
    void* workspace_ = nullptr;
    size_t workspace_bytes_ = 0;
    std::map<Key, Plan> plans_;
};

}  // namespace ctx::cuda
