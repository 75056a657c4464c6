// CPU backend: token + position embedding, layer norm, dense layer (OpenBLAS sgemm), GELU.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/op_common.h"
#include "backend/cpu/cpu_math.h"
#include "core/error.h"

namespace ctx::cpu {

namespace {

// Splits [0, n) into one contiguous block per thread of the current team, block starts rounded to
// multiples of 16 floats (64 bytes) so threads never share a cache line of the output.
inline void thread_block(int n, int& begin, int& end) {
    const int nth = omp_get_num_threads(), tid = omp_get_thread_num();
    int chunk = (n + nth - 1) / nth;
    chunk = (chunk + 15) / 16 * 16;
    begin = std::min(n, tid * chunk);
    end = std::min(n, begin + chunk);
}

// A product's output (rows, cols) as a fixed grid of tiles, each one single-threaded sgemm, the
// tiles spread over the threads. A tile's result depends only on its inputs and shape, never on
// the thread count; the library's own threading does not promise that (its AVX2 "Haswell"
// kernels give different sums with 1 and 2 threads; OPENBLAS_CORETYPE=Haswell or an AVX2-only
// CPU selects them). OpenBLAS's OpenMP build runs single-threaded inside an active parallel
// region, and with one thread the region is inactive but the library's limit is one thread too
// (the backend's omp_set_num_threads), so the region has no `if`: a one-tile product still runs
// on one thread. Tiles of 256 x 256 keep the library's packing small next to each tile's k-loop.
constexpr int kGemmTile = 256;
// Weight gradients of fewer tiles than this also split their N rows, in chunks of kGemmChunk.
constexpr int kGemmFewTiles = 4, kGemmChunk = 1024;
constexpr int tiles_of(int n) { return (n + kGemmTile - 1) / kGemmTile; }
template <typename TileFn>
void fixed_grid(int rows, int cols, const TileFn& tile) {
    const int tr = tiles_of(rows), tc = tiles_of(cols);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < tr * tc; t++) {
        const int r0 = (t / tc) * kGemmTile, c0 = (t % tc) * kGemmTile;
        tile(r0, std::min(kGemmTile, rows - r0), c0, std::min(kGemmTile, cols - c0));
    }
}

// Interpolated position-table lookup (backend.h): rows j0 = floor(p), j1 = min(j0 + 1, P - 1),
// weights (1 - f), f.
struct Interp {
    int j0, j1;
    float f;
};
inline Interp interp_rows(float p, int P) {
    const int j0 = std::min(int(std::floor(p)), P - 1);
    return {j0, std::min(j0 + 1, P - 1), p - float(j0)};
}


constexpr float kGeluTanhScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;  // 1 / sqrt(2 pi)

}  // namespace

// ---------------------------------------------------------------- embedding

void CpuBackend::embedding_forward(float* out, const int32_t* tokens, const float* positions,
                                   const float* wte, const float* wpe, int N, int C, int V,
                                   int P, VocabShard shard) {
    check_embedding_tokens(tokens, wpe != nullptr ? positions : nullptr, N,
                           shard.total > 0 ? shard.total : V, P);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float* out_n = out + size_t(n) * C;  // (C)
        const int row = tokens[n] - shard.begin;
        if (row < 0 || row >= V) {
            for (int c = 0; c < C; c++) out_n[c] = 0.0f;
        }
        const float* wte_t = row >= 0 && row < V ? wte + size_t(row) * C : out_n;  // (C)
        if (wpe == nullptr) {
            for (int c = 0; c < C; c++) out_n[c] = wte_t[c];
            continue;
        }
        const Interp ip = interp_rows(positions[n], P);
        const float* e0 = wpe + size_t(ip.j0) * C;  // (C)
        const float* e1 = wpe + size_t(ip.j1) * C;  // (C)
        const float w0 = 1.0f - ip.f, w1 = ip.f;
        for (int c = 0; c < C; c++) out_n[c] = wte_t[c] + w0 * e0[c] + w1 * e1[c];
    }
}

void CpuBackend::embedding_backward(float* dwte, float* dwpe, const float* dout,
                                    const int32_t* tokens, const float* positions, int N, int C,
                                    int V, int P, VocabShard shard) {
    check_embedding_tokens(tokens, dwpe != nullptr ? positions : nullptr, N,
                           shard.total > 0 ? shard.total : V, P);
    // Race-free scatter: each thread owns a block of channels and walks all rows in order (so the
    // result is also independent of the thread count).
#pragma omp parallel
    {
        int c0, c1;
        thread_block(C, c0, c1);
        for (int n = 0; n < N && c0 < c1; n++) {
            const float* d = dout + size_t(n) * C;  // (C)
            const int row = tokens[n] - shard.begin;
            if (row >= 0 && row < V) {  // this shard's token
                float* g = dwte + size_t(row) * C;
                for (int c = c0; c < c1; c++) g[c] += d[c];
            }
            if (dwpe != nullptr) {
                const Interp ip = interp_rows(positions[n], P);
                float* g0 = dwpe + size_t(ip.j0) * C;
                float* g1 = dwpe + size_t(ip.j1) * C;
                const float w0 = 1.0f - ip.f, w1 = ip.f;
                for (int c = c0; c < c1; c++) g0[c] += w0 * d[c];
                for (int c = c0; c < c1; c++) g1[c] += w1 * d[c];
            }
        }
    }
}

// ---------------------------------------------------------------- layer norm

void CpuBackend::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                   const float* w, const float* b, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* x = inp + size_t(n) * C;  // (C)
        float* y = out + size_t(n) * C;        // (C)
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int c = 0; c < C; c++) sum += x[c];
        const float m = sum / float(C);
        float var = 0.0f;
#pragma omp simd reduction(+ : var)
        for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
        const float s = 1.0f / std::sqrt(var / float(C) + eps);
        if (b != nullptr) {
#pragma omp simd
            for (int c = 0; c < C; c++) y[c] = (x[c] - m) * s * w[c] + b[c];
        } else {
#pragma omp simd
            for (int c = 0; c < C; c++) y[c] = (x[c] - m) * s * w[c];
        }
        mean[n] = m;
        rstd[n] = s;
    }
}

void CpuBackend::layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                                    const float* inp, const float* w, const float* mean,
                                    const float* rstd, int N, int C) {
#pragma omp parallel
    {
        // dinp: rows are independent.
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const float* x = inp + size_t(n) * C;   // (C)
            const float* dy = dout + size_t(n) * C; // (C)
            float* dx = dinp + size_t(n) * C;       // (C)
            const float m = mean[n], s = rstd[n];
            float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
            for (int c = 0; c < C; c++) {
                const float dnorm = w[c] * dy[c];
                dnorm_mean += dnorm;
                dnorm_norm_mean += dnorm * (x[c] - m) * s;
            }
            dnorm_mean /= float(C);
            dnorm_norm_mean /= float(C);
#pragma omp simd
            for (int c = 0; c < C; c++) {
                const float norm = (x[c] - m) * s;
                dx[c] += (w[c] * dy[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
            }
        }
        // dw, db: reductions over rows; each thread owns a block of channels.
        int c0, c1;
        thread_block(C, c0, c1);
        for (int n = 0; n < N && c0 < c1; n++) {
            const float* x = inp + size_t(n) * C;
            const float* dy = dout + size_t(n) * C;
            const float m = mean[n], s = rstd[n];
#pragma omp simd
            for (int c = c0; c < c1; c++) dw[c] += (x[c] - m) * s * dy[c];
            if (db != nullptr) {
#pragma omp simd
                for (int c = c0; c < c1; c++) db[c] += dy[c];
            }
        }
    }
}

// ---------------------------------------------------------------- RMS norm

void CpuBackend::rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N,
                                 int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* x = inp + size_t(n) * C;  // (C)
        float* y = out + size_t(n) * C;        // (C)
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; c++) ss += x[c] * x[c];
        const float s = 1.0f / std::sqrt(ss / float(C) + eps);
#pragma omp simd
        for (int c = 0; c < C; c++) y[c] = x[c] * s * w[c];
        rstd[n] = s;
    }
}

// y = x s w with s = (mean(x^2) + eps)^(-1/2): dx = s (w dy - x s mean(w dy x s)), dw += x s dy
void CpuBackend::rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                                  const float* w, const float* rstd, int N, int C) {
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const float* x = inp + size_t(n) * C;   // (C)
            const float* dy = dout + size_t(n) * C; // (C)
            float* dx = dinp + size_t(n) * C;       // (C)
            const float s = rstd[n];
            float dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_norm_mean)
            for (int c = 0; c < C; c++) dnorm_norm_mean += w[c] * dy[c] * x[c] * s;
            dnorm_norm_mean /= float(C);
#pragma omp simd
            for (int c = 0; c < C; c++) dx[c] += (w[c] * dy[c] - x[c] * s * dnorm_norm_mean) * s;
        }
        int c0, c1;  // dw: each thread owns a block of channels
        thread_block(C, c0, c1);
        for (int n = 0; n < N && c0 < c1; n++) {
            const float* x = inp + size_t(n) * C;
            const float* dy = dout + size_t(n) * C;
            const float s = rstd[n];
#pragma omp simd
            for (int c = c0; c < c1; c++) dw[c] += x[c] * s * dy[c];
        }
    }
}

// ---------------------------------------------------------------- dense layer

void CpuBackend::matmul_forward(float* out, const float* inp, const float* W, const float* bias,
                                int N, int IC, int OC) {
    float beta = 0.0f;
    if (bias != nullptr) {
        // out (N, OC) starts as the bias in every row, then sgemm adds inp @ W^T.
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            float* o = out + size_t(n) * OC;
            for (int c = 0; c < OC; c++) o[c] = bias[c];
        }
        beta = 1.0f;
    }
    // out (N, OC) = inp (N, IC) @ W^T, W (OC, IC): a fixed grid of (rows, output channels) tiles
    fixed_grid(N, OC, [&](int r0, int nr, int c0, int nc) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, nc, IC, 1.0f,
                    inp + size_t(r0) * IC, IC, W + size_t(c0) * IC, IC, beta,
                    out + size_t(r0) * OC + c0, OC);
    });
}

void CpuBackend::matmul_backward(float* dinp, float* dW, float* dbias, const float* dout,
                                 const float* inp, const float* W, int N, int IC, int OC,
                                 GradStore dinp_store) {
    // dinp (N, IC) (+)= dout (N, OC) @ W (OC, IC): tiles of (rows, input channels); beta 0
    // writes (BLAS reads no C then)
    if (dinp != nullptr) {
        const float beta = dinp_store == GradStore::Accumulate ? 1.0f : 0.0f;
        fixed_grid(N, IC, [&](int r0, int nr, int c0, int nc) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, nc, OC, 1.0f,
                        dout + size_t(r0) * OC, OC, W + c0, IC, beta, dinp + size_t(r0) * IC + c0,
                        IC);
        });
    }
    // dW (OC, IC) += dout^T (OC, N) @ inp (N, IC): tiles of (output, input channels), each
    // summing over all N rows
    const int to = tiles_of(OC), ti = tiles_of(IC);
    // at least one chunk: N = 0 takes the plain grid (k = 0 products add nothing)
    const int chunks = to * ti < kGemmFewTiles ? std::max(1, (N + kGemmChunk - 1) / kGemmChunk) : 1;
    if (chunks == 1) {
        fixed_grid(OC, IC, [&](int r0, int nr, int c0, int nc) {
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nr, nc, N, 1.0f, dout + r0, OC,
                        inp + c0, IC, 1.0f, dW + size_t(r0) * IC + c0, IC);
        });
    } else {
        // A small layer's few tiles would leave threads idle: N is cut into fixed chunks as well,
        // their partial products P (chunks, OC, IC) added to dW in chunk order. The sums still
        // depend on the shape alone.
        const size_t M = size_t(OC) * IC;
        static thread_local std::vector<float> partial;
        if (partial.size() < size_t(chunks) * M) partial.resize(size_t(chunks) * M);
        float* P = partial.data();
#pragma omp parallel for schedule(static)
        for (int t = 0; t < chunks * to * ti; t++) {
            const int k = t / (to * ti), o0 = (t % (to * ti)) / ti * kGemmTile,
                      c0 = t % ti * kGemmTile, n0 = k * kGemmChunk;
            const int nk = std::min(kGemmChunk, N - n0), no = std::min(kGemmTile, OC - o0),
                      nc = std::min(kGemmTile, IC - c0);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, no, nc, nk, 1.0f,
                        dout + size_t(n0) * OC + o0, OC, inp + size_t(n0) * IC + c0, IC, 0.0f,
                        P + size_t(k) * M + size_t(o0) * IC + c0, IC);
        }
#pragma omp parallel for schedule(static)
        for (size_t e = 0; e < M; e++) {
            float sum = P[e];
            for (int k = 1; k < chunks; k++) sum += P[size_t(k) * M + e];
            dW[e] += sum;
        }
    }
    // dbias (OC) += column sums of dout; each thread owns a block of output channels.
    if (dbias != nullptr) {
#pragma omp parallel
        {
            int c0, c1;
            thread_block(OC, c0, c1);
            for (int n = 0; n < N && c0 < c1; n++) {
                const float* d = dout + size_t(n) * OC;
#pragma omp simd
                for (int c = c0; c < c1; c++) dbias[c] += d[c];
            }
        }
    }
}

// ---------------------------------------------------------------- activation

void CpuBackend::activation_forward(float* out, const float* inp, size_t n, Activation act) {
    CTX_CHECK(act != Activation::SwiGLU, "internal: SwiGLU is gated; use swiglu_forward");
    if (act == Activation::GeluTanh) {
        // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) {
            const float x = inp[i];
            const float u = kGeluTanhScale * (x + kGeluCubic * x * x * x);
            out[i] = 0.5f * x * (1.0f + fast_tanh(u));
        }
    } else if (act == Activation::Relu) {
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
    } else {
        // 0.5 x (1 + erf(x / sqrt 2))
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) {
            const float x = inp[i];
            out[i] = 0.5f * x * (1.0f + std::erf(x * kInvSqrt2));
        }
    }
}

void CpuBackend::swiglu_forward(float* out, const float* inp, int N, int F) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* g = inp + size_t(n) * 2 * F;  // gate (F), then up (F)
        float* y = out + size_t(n) * F;
#pragma omp simd
        for (int f = 0; f < F; f++) y[f] = g[f] / (1.0f + std::exp(-g[f])) * g[F + f];
    }
}

// d/dg [g sigma(g)] = sigma(g) (1 + g (1 - sigma(g)))
void CpuBackend::swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F,
                                 GradStore store) {
    // Overwrite: the old contents count as 0 (and are not read, so they may be anything)
    const bool acc = store == GradStore::Accumulate;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* g = inp + size_t(n) * 2 * F;
        const float* dy = dout + size_t(n) * F;
        float* dg = dinp + size_t(n) * 2 * F;
#pragma omp simd
        for (int f = 0; f < F; f++) {
            const float sig = 1.0f / (1.0f + std::exp(-g[f])), silu = g[f] * sig;
            const float d_gate = dy[f] * g[F + f] * sig * (1.0f + g[f] * (1.0f - sig));
            dg[f] = acc ? dg[f] + d_gate : d_gate;
            dg[F + f] = acc ? dg[F + f] + dy[f] * silu : dy[f] * silu;
        }
    }
}

// ---------------------------------------------------------------- grouped-query key/value heads

void CpuBackend::kv_repeat_forward(float* qkv, const float* grouped, int N, int H, int Hkv,
                                   int D) {
    const int G = H / Hkv;
    const size_t HD = size_t(H) * D, KD = size_t(Hkv) * D;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* src = grouped + n * (HD + 2 * KD);  // [q (H D) | k (Hkv D) | v (Hkv D)]
        float* dst = qkv + n * 3 * HD;                   // [q (H D) | k (H D) | v (H D)]
        std::copy(src, src + HD, dst);
        for (int part = 1; part <= 2; part++)            // k, then v
            for (int h = 0; h < H; h++) {
                const float* from = src + HD + (part - 1) * KD + size_t(h / G) * D;
                std::copy(from, from + D, dst + part * HD + size_t(h) * D);
            }
    }
}

void CpuBackend::kv_repeat_backward(float* dgrouped, const float* dqkv, int N, int H, int Hkv,
                                    int D) {
    const int G = H / Hkv;
    const size_t HD = size_t(H) * D, KD = size_t(Hkv) * D;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float* dst = dgrouped + n * (HD + 2 * KD);
        const float* src = dqkv + n * 3 * HD;
        for (size_t i = 0; i < HD; i++) dst[i] += src[i];
        for (int part = 1; part <= 2; part++)
            for (int h = 0; h < H; h++) {
                float* to = dst + HD + (part - 1) * KD + size_t(h / G) * D;
                const float* from = src + part * HD + size_t(h) * D;
                for (int d = 0; d < D; d++) to[d] += from[d];
            }
    }
}

namespace {

// dinp (n) += act'(inp) * dout, or = when !Acc (GradStore::Overwrite: dinp is not read)
template <bool Acc>
void activation_grad(float* dinp, const float* inp, const float* dout, size_t n, Activation act) {
    auto put = [](float& d, float v) {
        if constexpr (Acc)
            d += v;
        else
            d = v;
    };
    if (act == Activation::GeluTanh) {
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) {
            const float x = inp[i];
            const float u = kGeluTanhScale * (x + kGeluCubic * x * x * x);
            const float t = fast_tanh(u);
            const float du = kGeluTanhScale * (1.0f + 3.0f * kGeluCubic * x * x);
            const float grad = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
            put(dinp[i], grad * dout[i]);
        }
    } else if (act == Activation::Relu) {
        // d relu / dx: 1 for x > 0, else 0 (0 at x = 0, as PyTorch)
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) put(dinp[i], inp[i] > 0.0f ? dout[i] : 0.0f);
    } else {
        // d/dx [x Phi(x)] = Phi(x) + x phi(x)
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) {
            const float x = inp[i];
            const float cdf = 0.5f * (1.0f + std::erf(x * kInvSqrt2));
            const float pdf = kInvSqrt2Pi * fast_exp(-0.5f * x * x);
            put(dinp[i], (cdf + x * pdf) * dout[i]);
        }
    }
}

}  // namespace

void CpuBackend::activation_backward(float* dinp, const float* inp, const float* dout, size_t n,
                                     Activation act, GradStore store) {
    CTX_CHECK(act != Activation::SwiGLU, "internal: SwiGLU is gated; use swiglu_backward");
    if (store == GradStore::Accumulate)
        activation_grad<true>(dinp, inp, dout, n, act);
    else
        activation_grad<false>(dinp, inp, dout, n, act);
}

}  // namespace ctx::cpu
