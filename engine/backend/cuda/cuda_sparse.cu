// Contextual sparsity (Deja Vu) on the GPU: products over a per-row subset of a weight's rows,
// and the top-k selection that picks them (op contracts in backend/backend.h). No atomics, and
// every sum in a fixed order, as in the rest of the backend.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace ctx::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// One warp per selected weight row (n, k, g): a dot product of IC, lanes strided, then a tree
// over the lanes. A warp's (n, k, g) is uniform across its lanes, so a skipped row (-1) or the
// grid's tail leaves whole warps and no shuffle is left half-reached.
__global__ void matmul_rows_forward_kernel(float* out, int ldo, const float* inp, const float* W,
                                           const float* bias, const int32_t* idx, int N, int IC,
                                           int K, int G) {
    const int lane = threadIdx.x & 31;
    const size_t rows = size_t(N) * K * G;
    for (size_t r = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < rows;
         r += size_t(gridDim.x) * kWarps) {
        const size_t nk = r / G;
        const int g = int(r % G), n = int(nk / K), j = idx[nk];
        if (j < 0) continue;
        const size_t row = size_t(j) * G + g;
        const float* w = W + row * IC;
        const float* x = inp + size_t(n) * IC;
        float dot = 0.0f;
        for (int i = lane; i < IC; i += 32) dot += w[i] * x[i];
        dot = warp_sum(dot);
        if (lane == 0) out[size_t(n) * ldo + row] = dot + (bias ? bias[row] : 0.0f);
    }
}

// One thread per output element (n, c), summing the selected rows in list order: consecutive
// threads read consecutive columns of each Wt row (coalesced).
__global__ void matmul_rows_project_kernel(float* out, const float* h, int ldh, const float* Wt,
                                           const float* bias, const int32_t* idx, int N, int OC,
                                           int K, int G) {
    const size_t total = size_t(N) * OC;
    for (size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
         e += size_t(gridDim.x) * blockDim.x) {
        const int n = int(e / OC), c = int(e % OC);
        const int32_t* sel = idx + size_t(n) * K;
        const float* hn = h + size_t(n) * ldh;
        float o = bias ? bias[c] : 0.0f;
        for (int k = 0; k < K; k++) {
            if (sel[k] < 0) continue;
            for (int g = 0; g < G; g++) {
                const size_t row = size_t(sel[k]) * G + g;
                o += hn[row] * Wt[row * OC + c];
            }
        }
        out[e] = o;
    }
}

// Floats to unsigned keys in the same order (-0 folded into +0, as a float comparison sees them).
__device__ __forceinline__ uint32_t order_key(float f) {
    const uint32_t u = __float_as_uint(f + 0.0f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Inclusive scan of one int per thread over the block (Hillis-Steele). sh: blockDim.x ints.
// Ends with a barrier.
__device__ int block_scan(int v, int* sh) {
    const int t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (int off = 1; off < int(blockDim.x); off <<= 1) {
        const int add = t >= off ? sh[t - off] : 0;
        __syncthreads();
        sh[t] += add;
        __syncthreads();
    }
    const int r = sh[t];
    __syncthreads();
    return r;
}

__device__ void select_topk_row(int32_t* out, const float* s, int M, int K, float threshold,
                                int* red, int* scan) {
    const int t = threadIdx.x;
    uint32_t kth = 0;
    for (int bit = 31; bit >= 0; bit--) {
        const uint32_t cand = kth | (1u << bit);
        int c = 0;
        for (int j = t; j < M; j += blockDim.x) c += order_key(s[j]) >= cand;
        if (block_sum(c, red) >= K) kth = cand;
    }
    int above = 0;  // keys > kth: fewer than K, all chosen
    for (int j = t; j < M; j += blockDim.x) above += order_key(s[j]) > kth;
    const int ties = K - block_sum(above, red);  // keys == kth to take, lowest indices first
    int eq_before = 0, kept_before = 0;
    for (int j0 = 0; j0 < M; j0 += blockDim.x) {  // uniform over the block
        const int j = j0 + t;
        const uint32_t key = j < M ? order_key(s[j]) : 0u;
        const int eq = j < M && key == kth;
        const int eq_incl = block_scan(eq, scan);
        const int eq_total = block_sum(eq, red);
        const bool chosen = j < M && (key > kth || (eq && eq_before + eq_incl <= ties));
        const int keep = chosen && s[j] > threshold;
        const int pos = block_scan(keep, scan);
        if (keep) out[kept_before + pos - 1] = j;
        eq_before += eq_total;
        kept_before += block_sum(keep, red);
    }
    for (int k = kept_before + t; k < K; k += blockDim.x) out[k] = -1;
}

// One block per row. The K-th largest key kth is found bit by bit from the top (the largest key
// with at least K keys >= it: 32 block-wide counts), so no histogram and no atomics. Chosen:
// keys > kth, then keys == kth by ascending index until K are taken, which is the order
// (score descending, lower index on ties) of the contract. The chosen above the threshold are
// written in ascending index order by a block scan per chunk of blockDim.x indices.
__global__ void select_topk_kernel(int32_t* idx, const float* scores, int N, int M, int K,
                                   float threshold) {
    __shared__ int red[32];
    __shared__ int scan[kThreads];
    for (int row = blockIdx.x; row < N; row += gridDim.x)  // uniform over the block
        select_topk_row(idx + size_t(row) * K, scores + size_t(row) * M, M, K, threshold, red,
                        scan);
}

}  // namespace

cudaError_t launch_matmul_rows_forward(float* out, int ldo, const float* inp, const float* W,
                                       const float* bias, const int32_t* idx, int N, int IC,
                                       int K, int G, cudaStream_t s) {
    const size_t rows = size_t(N) * K * G;
    if (rows == 0) return cudaSuccess;
    matmul_rows_forward_kernel<<<grid_for(rows, kWarps), kThreads, 0, s>>>(out, ldo, inp, W, bias,
                                                                           idx, N, IC, K, G);
    return cudaGetLastError();
}

cudaError_t launch_matmul_rows_project(float* out, const float* h, int ldh, const float* Wt,
                                       const float* bias, const int32_t* idx, int N, int OC,
                                       int K, int G, cudaStream_t s) {
    const size_t n = size_t(N) * OC;
    if (n == 0) return cudaSuccess;
    matmul_rows_project_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(out, h, ldh, Wt, bias,
                                                                          idx, N, OC, K, G);
    return cudaGetLastError();
}

cudaError_t launch_select_topk(int32_t* idx, const float* scores, int N, int M, int K,
                               float threshold, cudaStream_t s) {
    if (N == 0) return cudaSuccess;
    select_topk_kernel<<<grid_for(size_t(N), 1), kThreads, 0, s>>>(idx, scores, N, M, K,
                                                                   threshold);
    return cudaGetLastError();
}

}  // namespace ctx::cuda
