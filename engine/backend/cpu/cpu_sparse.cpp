// Contextual sparsity (Deja Vu) on the CPU: products over a per-row subset of a weight's rows,
// and the top-k selection that picks them. Decoding runs few rows (N = the batch of
// generations), so the work is spread over (row, group) pairs, and over output columns for the
// projection, rather than over rows alone.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/op_common.h"
#include "core/error.h"

namespace ctx::cpu {

namespace {

// Below this many multiply-adds an op runs on one thread: a decode step of a small model is
// a few microseconds of work per op, less than waking the team costs.
constexpr size_t kParallelWork = size_t(1) << 16;

}  // namespace

// out[n, j G + g] = W[j G + g] . inp[n] + bias[j G + g]: one dot product of IC per selected
// weight row.
void CpuBackend::matmul_rows_forward(float* out, int ldo, const float* inp, const float* W,
                                     const float* bias, const int32_t* idx, int N, int IC, int K,
                                     int G) {
    check_rows_op("matmul_rows_forward", N, K, G);
    const bool parallel = size_t(N) * K * G * IC >= kParallelWork;
#pragma omp parallel for schedule(static) num_threads(threads_) if (parallel)
    for (int nk = 0; nk < N * K; nk++) {
        const int n = nk / K, j = idx[nk];
        if (j < 0) continue;
        const float* x = inp + size_t(n) * IC;  // (IC)
        float* o = out + size_t(n) * ldo + size_t(j) * G;
        for (int g = 0; g < G; g++) {
            const size_t row = size_t(j) * G + g;
            const float* w = W + row * IC;  // (IC)
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int i = 0; i < IC; i++) dot += w[i] * x[i];
            o[g] = dot + (bias ? bias[row] : 0.0f);
        }
    }
}

// out[n] = bias + sum over selected rows r of h[n, r] Wt[r]: each thread owns a block of output
// columns of one row and walks the selected rows, so every Wt row is read in contiguous
// pieces and nothing is summed across threads (the result does not depend on the thread count).
void CpuBackend::matmul_rows_project(float* out, const float* h, int ldh, const float* Wt,
                                     const float* bias, const int32_t* idx, int N, int OC, int K,
                                     int G) {
    check_rows_op("matmul_rows_project", N, K, G);
    constexpr int kBlock = 128;  // output columns per task: 512 bytes of each Wt row
    const int blocks = (OC + kBlock - 1) / kBlock;
    const bool parallel = size_t(N) * K * G * OC >= kParallelWork;
#pragma omp parallel for schedule(static) num_threads(threads_) if (parallel)
    for (int nb = 0; nb < N * blocks; nb++) {
        const int n = nb / blocks, c0 = (nb % blocks) * kBlock, c1 = std::min(OC, c0 + kBlock);
        float* o = out + size_t(n) * OC;
        for (int c = c0; c < c1; c++) o[c] = bias ? bias[c] : 0.0f;
        const int32_t* sel = idx + size_t(n) * K;
        const float* hn = h + size_t(n) * ldh;
        for (int k = 0; k < K; k++) {
            if (sel[k] < 0) continue;
            for (int g = 0; g < G; g++) {
                const size_t row = size_t(sel[k]) * G + g;
                const float a = hn[row];
                const float* w = Wt + row * OC;
#pragma omp simd
                for (int c = c0; c < c1; c++) o[c] += a * w[c];
            }
        }
    }
}

void CpuBackend::select_topk(int32_t* idx, const float* scores, int N, int M, int K,
                             float threshold) {
    check_topk(N, M, K);
    const bool parallel = size_t(N) * M >= kParallelWork / 8;
#pragma omp parallel for schedule(static) num_threads(threads_) if (parallel)
    for (int n = 0; n < N; n++) {
        const float* s = scores + size_t(n) * M;
        thread_local std::vector<int32_t> order;  // decode steps call this per layer: no allocation
        order.resize(static_cast<size_t>(M));
        std::iota(order.begin(), order.end(), 0);
        // higher score first, the lower index on ties: a strict weak order, so the K chosen do
        // not depend on the library's algorithm
        const auto better = [s](int32_t a, int32_t b) {
            return s[a] > s[b] || (s[a] == s[b] && a < b);
        };
        std::nth_element(order.begin(), order.begin() + (K - 1), order.end(), better);
        std::sort(order.begin(), order.begin() + K);
        int32_t* out = idx + size_t(n) * K;
        int kept = 0;
        for (int k = 0; k < K; k++)
            if (s[order[static_cast<size_t>(k)]] > threshold) out[kept++] = order[static_cast<size_t>(k)];
        for (int k = kept; k < K; k++) out[k] = -1;
    }
}

}  // namespace ctx::cpu
