// CPU emulation of the cuBLAS subset (sgemm, strided-batched sgemm, bf16 x bf16 -> fp32 GemmEx;
// column-major, by definition) the ctxengine CUDA backend uses, for checking the
// backend's LOGIC on a machine without a GPU (engine/backend/cuda/emu/run_emulated_tests.py).
// Not part of any build target. Passing under emulation is not a GPU validation: see
// docs/CUDA.md.
#pragma once
#include "cuda_runtime_api.h"
typedef struct emu_blas* cublasHandle_t;
enum cublasStatus_t { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7,
                      CUBLAS_STATUS_NOT_SUPPORTED = 15 };
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasMath_t { CUBLAS_DEFAULT_MATH = 0 };
cublasStatus_t cublasCreate(cublasHandle_t* h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m);
const char* cublasGetStatusString(cublasStatus_t s);
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float* alpha, const float* A, int lda, const float* B, int ldb,
                           const float* beta, float* C, int ldc);
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                         int m, int n, int k, const float* alpha, const float* A, int lda,
                                         long long sa, const float* B, int ldb, long long sb,
                                         const float* beta, float* C, int ldc, long long sc, int batch);
// library_types.h / cublas_api.h values of the real headers (the subset GemmEx is called with)
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16BF = 14 };
typedef cudaDataType_t cudaDataType;
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };
// Supported here: Atype = Btype = CUDA_R_16BF, Ctype = CUDA_R_32F, CUBLAS_COMPUTE_32F (alpha, beta
// float); anything else returns CUBLAS_STATUS_NOT_SUPPORTED. Products of bf16 values are exact,
// the sum is taken in double and rounded once to fp32.
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype,
                            int ldc, cublasComputeType_t computeType, cublasGemmAlgo_t algo);
