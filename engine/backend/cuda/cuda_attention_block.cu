// CUDA backend kernels: attention across blocks of a row (Backend::attention_block_*, context
// parallelism / ring attention; backend.h). A block holds any set of a row's tokens (the zigzag
// split gives a rank two chunks), so visibility works on the tokens' global indices:
//   key j is visible to query i  <=>  lo_i <= index_j <= index_i,
//   lo_i = max(index_i - window + 1 (window > 0), doc_start_i (packed rows))
// and the logit is q_i . k_j / sqrt(D) + bias_h(pos_i - pos_j) with the bias of cuda_bias.cuh
// (the same bias_value / t5_bucket as the materialised and flash paths; a Table bias is
// (B, H, Tq, Tk) for the pair of blocks).
//
// Blocks: kThreads = 128 threads, tiles of kTile = 32 queries x 32 keys. Thread t owns row
// r = t / 4 of a tile and, for logits, the 8 columns c = t % 4 + 4 k; for the output (and dq, dk,
// dv) the dims d = t % 4 + 4 k of its row (the flash kernels' layout, cuda_flash.cu). The four
// threads of a row are adjacent lanes, so row max / row sum are two xor-shuffles.
//
// Any head dim: the products q.k and dout.v run over D in chunks of kDC dims through shared
// memory, and the accumulators (out, dq, dk, dv) cover kDO dims per pass in registers; a head
// dim above kDO takes ceil(D / kDO) passes over the key (query) tiles, recomputing the logits.
// Shared memory stays under the 48 KiB static limit for every D.
//
//   block_fwd_kernel    grid (Tq/32, H, B): online softmax over the key tiles that can hold a
//                       visible key (by the tiles' index bounds); out_b = acc / l, and
//                       lse_b = m + log(l), or 0 and -inf for a query that saw no key.
//   block_merge_kernel  one warp per (b, h, i): the log-sum-exp merge.
//   block_dq_kernel     grid (Tq/32, H, B): P = exp(S - lse), dS = P (dout.v - Drow) per key
//                       tile; dq += dS k / sqrt(D); dtable += dS; bias-parameter sums per thread
//                       (double), one partial per (b, h, query tile).
//   block_dkv_kernel    grid (Tk/32, H, B): per key tile, the query tiles that can see it;
//                       dv += P^T dout, dk += dS^T q / sqrt(D).
//   block_bias_reduce   one thread per (head, slot): the partials in a fixed order into da, db.
//
// No atomics: every output element belongs to one thread of one block (dq and dk/dv come from
// two kernels), every reduction has a fixed order, so results repeat bit for bit on a GPU.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>

#include "backend/cuda/cuda_bias.cuh"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace ctx::cuda {

namespace {

constexpr int kTile = 32;                         // queries and keys per tile
constexpr int kThreads = 128;                     // four per tile row
constexpr int kCols = kTile * kTile / kThreads;   // logits per thread per tile pair (8)
constexpr int kDC = 32;                           // head dims per chunk of q.k and dout.v
constexpr int kDO = 128;                          // head dims per output pass
constexpr int kNO = kDO / 4;                      // accumulators per thread per pass (32)
constexpr int kLS = kTile + 1;                    // row stride of (32, 32) tiles in shared
constexpr int kLO = kDO + 1;                      // row stride of (32, kDO) tiles in shared
constexpr int kMergeWarps = 8;
// Shared floats of each kernel's operand buffer: the (kTile, kLS) chunks of its logit loop
// (q, k; backward also dout, v) or, after that loop, its (kTile, kLO) tiles of the output pass
// (forward v; dq k; dkv q and dout).
constexpr int cmax(int x, int y) { return x > y ? x : y; }
constexpr int kFwdFloats = cmax(2 * kTile * kLS, kTile * kLO);
constexpr int kDqFloats = cmax(4 * kTile * kLS, kTile * kLO);
constexpr int kDkvFloats = cmax(4 * kTile * kLS, 2 * kTile * kLO);
static_assert(kThreads == 4 * kTile, "four threads per tile row");
static_assert(kMaxT5Buckets <= 4 * kThreads, "each thread owns at most 4 T5 buckets");

struct BlockArgs {
    const float* q;      // (B, Tq, 3C), q part
    const float* kv;     // (B, Tk, 2C) = [k | v]
    AttnBlockRows qr;    // Tq tokens per row (device)
    AttnBlockRows kr;    // Tk tokens per row (device)
    int C, H, D, window;
    float scale;         // 1 / sqrt(D)
    BiasArgs bs;
};

// The tokens of the current query tile and key tile (shared memory). Padding rows (past the
// block's end) see no key: q_idx INT_MIN, q_lo INT_MAX; padding keys have k_idx INT_MAX.
struct TileMeta {
    int q_idx[kTile], q_lo[kTile];
    float q_pos[kTile];
    int k_idx[kTile];
    float k_pos[kTile];
    int q_bounds[2];  // min lo, max index over the tile's queries
    int k_bounds[2];  // min, max index over the tile's keys
};

__device__ __forceinline__ void warp_min_max(int& lo, int& hi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        lo = min(lo, __shfl_xor_sync(kFullMask, lo, o));
        hi = max(hi, __shfl_xor_sync(kFullMask, hi, o));
    }
}

// Warp 0 only: the query tile at q0 of row b into meta (one lane per query).
__device__ void load_queries(TileMeta& meta, const BlockArgs& a, int b, int q0) {
    const int lane = threadIdx.x & 31, i = q0 + lane, Tq = a.qr.T;
    int idx = INT_MIN, lo = INT_MAX;
    float pos = 0.0f;
    if (i < Tq) {
        const size_t n = size_t(b) * Tq + i;
        idx = a.qr.index[n];
        lo = a.window > 0 ? idx - a.window + 1 : INT_MIN;
        if (a.qr.doc_start != nullptr) lo = max(lo, int(a.qr.doc_start[n]));
        pos = a.qr.positions[n];
    }
    meta.q_idx[lane] = idx;
    meta.q_lo[lane] = lo;
    meta.q_pos[lane] = pos;
    int mn = lo, mx = idx;
    warp_min_max(mn, mx);
    if (lane == 0) {
        meta.q_bounds[0] = mn;
        meta.q_bounds[1] = mx;
    }
}

// Warp 0 only: the key tile at k0 of row b into meta.
__device__ void load_keys(TileMeta& meta, const BlockArgs& a, int b, int k0) {
    const int lane = threadIdx.x & 31, j = k0 + lane, Tk = a.kr.T;
    int idx = INT_MAX, mx = INT_MIN;
    float pos = 0.0f;
    if (j < Tk) {
        const size_t n = size_t(b) * Tk + j;
        idx = mx = a.kr.index[n];
        pos = a.kr.positions[n];
    }
    meta.k_idx[lane] = idx;
    meta.k_pos[lane] = pos;
    int mn = idx;
    warp_min_max(mn, mx);
    if (lane == 0) {
        meta.k_bounds[0] = mn;
        meta.k_bounds[1] = mx;
    }
}

// Whether some key of the tile may be visible to some query of the tile (block-uniform; read
// after the barrier that follows load_queries / load_keys).
__device__ __forceinline__ bool tiles_meet(const TileMeta& meta) {
    return meta.k_bounds[1] >= meta.q_bounds[0] && meta.k_bounds[0] <= meta.q_bounds[1] &&
           meta.k_bounds[0] != INT_MAX;
}

// Rows [r0, r0 + n) of a (rows, ld) matrix, dims [d0, d0 + w) (only those < D) into dst
// (kTile, LD); everything else 0.
__device__ __forceinline__ void load_rows(float* dst, int LD, int w, const float* src, size_t ld,
                                          int n, int d0, int D) {
    for (int x = threadIdx.x; x < kTile * w; x += kThreads) {
        const int rr = x / w, d = x % w;
        dst[rr * LD + d] = (rr < n && d0 + d < D) ? src[size_t(rr) * ld + d0 + d] : 0.0f;
    }
}

// The logits this thread owns in the tile pair (queries q0.., keys k0.. of row b, head h):
// s[k] for row r, column c = q4 + 4 k. With kDP also dp[k] = dout_i . v_j (backward), in the
// same chunk loop. Returns bit k set when the pair is visible (s[k] meaningful only then).
// Starts and ends its chunks with barriers; `sm` holds 2 (kDP: 4) (kTile, kLS) chunks.
template <bool kDP>
__device__ unsigned tile_logits(float (&s)[kCols], float (&dp)[kCols], float* sm,
                                const TileMeta& meta, const BlockArgs& a, const float* dout,
                                int b, int h, int q0, int k0) {
    const int D = a.D, C = a.C, Tq = a.qr.T, Tk = a.kr.T;
    const int tid = threadIdx.x, r = tid >> 2, q4 = tid & 3;
    const int nq = min(kTile, Tq - q0), nk = min(kTile, Tk - k0);
    float* Qc = sm;
    float* Kc = Qc + kTile * kLS;
    float* dOc = kDP ? Kc + kTile * kLS : nullptr;
    float* Vc = kDP ? dOc + kTile * kLS : nullptr;
    const float* qb = a.q + (size_t(b) * Tq + q0) * 3 * C + size_t(h) * D;   // ld 3C
    const float* kb = a.kv + (size_t(b) * Tk + k0) * 2 * C + size_t(h) * D;  // ld 2C
#pragma unroll
    for (int k = 0; k < kCols; k++) s[k] = dp[k] = 0.0f;
    for (int d0 = 0; d0 < D; d0 += kDC) {
        __syncthreads();  // the previous chunk (or the caller's tiles) is no longer read
        load_rows(Qc, kLS, kDC, qb, size_t(3) * C, nq, d0, D);
        load_rows(Kc, kLS, kDC, kb, size_t(2) * C, nk, d0, D);
        if (kDP) {
            load_rows(dOc, kLS, kDC, dout + (size_t(b) * Tq + q0) * C + size_t(h) * D, size_t(C),
                      nq, d0, D);
            load_rows(Vc, kLS, kDC, kb + C, size_t(2) * C, nk, d0, D);
        }
        __syncthreads();
        const int dn = min(kDC, D - d0);
        const float* qr = Qc + r * kLS;
        const float* gr = kDP ? dOc + r * kLS : nullptr;
#pragma unroll
        for (int k = 0; k < kCols; k++) {
            const int c = q4 + 4 * k;
            const float* kr = Kc + c * kLS;
            float x = s[k];
            for (int d = 0; d < dn; d++) x += qr[d] * kr[d];
            s[k] = x;
            if (kDP) {
                const float* vr = Vc + c * kLS;
                float y = dp[k];
                for (int d = 0; d < dn; d++) y += gr[d] * vr[d];
                dp[k] = y;
            }
        }
    }
    __syncthreads();  // the chunks are free for the caller's operand tiles
    const int i = q0 + r, qi = meta.q_idx[r], lo = meta.q_lo[r];
    const float pi = meta.q_pos[r];
    const float* trow = a.bs.kind == kTable && i < Tq
                            ? a.bs.table + ((size_t(b) * a.H + h) * Tq + i) * Tk
                            : nullptr;
    unsigned valid = 0;
#pragma unroll
    for (int k = 0; k < kCols; k++) {
        const int c = q4 + 4 * k, j = k0 + c, kj = meta.k_idx[c];
        if (j >= Tk || kj > qi || kj < lo) continue;  // padding rows have qi INT_MIN
        s[k] = s[k] * a.scale + bias_value(a.bs, h, pi, meta.k_pos[c], trow, j);
        valid |= 1u << k;
    }
    return valid;
}

// The two other lanes of this thread's tile row combined (four adjacent lanes per row).
__device__ __forceinline__ float row_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, 1));
    return fmaxf(v, __shfl_xor_sync(kFullMask, v, 2));
}
__device__ __forceinline__ float row_sum(float v) {
    v += __shfl_xor_sync(kFullMask, v, 1);
    return v + __shfl_xor_sync(kFullMask, v, 2);
}

// Drow_i = dout_i . out_i of this thread's row i (0 for a padding row); every thread calls it.
__device__ __forceinline__ float row_dvec(const float* dout, const float* out, int b, int i,
                                          int h, const BlockArgs& a) {
    float x = 0.0f;
    if (i < a.qr.T) {
        const size_t off = (size_t(b) * a.qr.T + i) * a.C + size_t(h) * a.D;
        for (int d = threadIdx.x & 3; d < a.D; d += 4) x += dout[off + d] * out[off + d];
    }
    return row_sum(x);
}

// ================================================================ forward

__global__ void __launch_bounds__(kThreads)
    block_fwd_kernel(float* out_b, float* lse_b, BlockArgs a) {
    __shared__ float sm[kFwdFloats];  // logit chunks, then the V tile (kTile, kLO)
    __shared__ float Ps[kTile * kLS];
    __shared__ TileMeta meta;
    const int q0 = blockIdx.x * kTile, h = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, r = tid >> 2, q4 = tid & 3, i = q0 + r;
    const int D = a.D, C = a.C, Tq = a.qr.T, Tk = a.kr.T;
    if (tid < 32) load_queries(meta, a, b, q0);
    float m = -INFINITY, l = 0.0f;
    for (int dc0 = 0; dc0 < D; dc0 += kDO) {  // output passes: one unless D > kDO
        const int dw = min(kDO, D - dc0);     // dims of this pass
        float acc[kNO];
#pragma unroll
        for (int k = 0; k < kNO; k++) acc[k] = 0.0f;
        m = -INFINITY;
        l = 0.0f;
        for (int k0 = 0; k0 < Tk; k0 += kTile) {  // uniform over the block
            __syncthreads();                      // the previous tile is no longer read
            if (tid < 32) load_keys(meta, a, b, k0);
            __syncthreads();
            if (!tiles_meet(meta)) continue;
            float s[kCols], unused[kCols];
            const unsigned valid = tile_logits<false>(s, unused, sm, meta, a, nullptr, b, h, q0, k0);
            float mx = -INFINITY;
#pragma unroll
            for (int k = 0; k < kCols; k++)
                if (valid & (1u << k)) mx = fmaxf(mx, s[k]);
            const float mn = fmaxf(m, row_max(mx));
            float sum = 0.0f;
#pragma unroll
            for (int k = 0; k < kCols; k++) {
                const float p = (valid & (1u << k)) ? expf(s[k] - mn) : 0.0f;
                Ps[r * kLS + q4 + 4 * k] = p;
                sum += p;
            }
            sum = row_sum(sum);
            const float corr = m == -INFINITY ? 0.0f : expf(m - mn);
            l = l * corr + sum;
            m = mn;
            // V (keys k0.., dims dc0..) for this pass; tile_logits ended with a barrier
            const int nk = min(kTile, Tk - k0);
            load_rows(sm, kLO, dw, a.kv + (size_t(b) * Tk + k0) * 2 * C + C + size_t(h) * D,
                      size_t(2) * C, nk, dc0, D);
            __syncthreads();  // Ps and the V tile complete
            const float* pr = Ps + r * kLS;
#pragma unroll
            for (int k = 0; k < kNO; k++) {
                const int d = q4 + 4 * k;
                if (d < dw) {
                    float x = acc[k] * corr;
                    for (int c = 0; c < kTile; c++) x += pr[c] * sm[c * kLO + d];
                    acc[k] = x;
                }
            }
        }
        if (i < Tq) {  // l == 0: no visible key in this block
            const float inv = l > 0.0f ? 1.0f / l : 0.0f;
            float* o = out_b + (size_t(b) * Tq + i) * C + size_t(h) * D + dc0;
#pragma unroll
            for (int k = 0; k < kNO; k++) {
                const int d = q4 + 4 * k;
                if (d < dw) o[d] = acc[k] * inv;
            }
        }
    }
    if (i < Tq && q4 == 0)
        lse_b[(size_t(b) * a.H + h) * Tq + i] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// ================================================================ merge

// One warp per (b, h, i): lse' = log(e^lse + e^lse_b), out' = e^(lse - lse') out +
// e^(lse_b - lse') out_b. A block that saw nothing for the query (lse_b -inf) changes nothing.
__global__ void block_merge_kernel(float* out, float* lse, const float* out_b,
                                   const float* lse_b, int B, int Tq, int C, int H) {
    const int lane = threadIdx.x & 31;
    const size_t row = size_t(blockIdx.x) * kMergeWarps + (threadIdx.x >> 5);
    if (row >= size_t(B) * H * Tq) return;  // whole warps leave together
    const float lb = lse_b[row];
    if (lb == -INFINITY) return;
    const float la = lse[row];
    const int i = int(row % Tq), h = int((row / Tq) % H), b = int(row / (size_t(Tq) * H));
    const int D = C / H;
    const float mx = fmaxf(la, lb);
    const float merged = mx + logf(expf(la - mx) + expf(lb - mx));
    const float wa = expf(la - merged), wb = expf(lb - merged);
    const size_t off = (size_t(b) * Tq + i) * C + size_t(h) * D;
    for (int d = lane; d < D; d += 32) out[off + d] = wa * out[off + d] + wb * out_b[off + d];
    __syncwarp();  // every lane has read lse[row]
    if (lane == 0) lse[row] = merged;
}

// ================================================================ backward

// Per query tile: dq, dtable, bias-parameter partials.
__global__ void __launch_bounds__(kThreads)
    block_dq_kernel(float* dq, double* partials, float* dtable, const float* dout,
                    const float* out, const float* lse, BlockArgs a) {
    __shared__ float sm[kDqFloats];  // logit chunks, then the K tile (kTile, kLO)
    __shared__ float Ss[kTile * kLS];
    __shared__ int Bk[kTile * kLS];       // T5 bucket of each dS entry, -1 where none
    __shared__ TileMeta meta;
    __shared__ double red[32];
    const int q0 = blockIdx.x * kTile, h = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, r = tid >> 2, q4 = tid & 3, i = q0 + r;
    const int D = a.D, C = a.C, Tq = a.qr.T, Tk = a.kr.T, H = a.H;
    const size_t row = (size_t(b) * H + h) * Tq + i;
    const float lse_i = i < Tq ? lse[row] : -INFINITY;
    const float d_i = row_dvec(dout, out, b, i, h, a);
    const int kind = a.bs.kind;
    const bool grads = partials != nullptr;
    const bool t5 = grads && kind == kT5;
    const float pa = grads && kind >= kLinear && kind <= kKerplePower ? a.bs.a[h] : 0.0f;
    const float pb = grads && (kind == kKerpleLog || kind == kKerplePower) ? a.bs.b[h] : 0.0f;
    double ga = 0.0, gb = 0.0;
    double gt[4] = {0.0, 0.0, 0.0, 0.0};  // T5: buckets tid + kThreads u
    if (tid < 32) load_queries(meta, a, b, q0);
    for (int dc0 = 0; dc0 < D; dc0 += kDO) {
        const bool first = dc0 == 0;  // dtable and the parameter sums: once
        const int dw = min(kDO, D - dc0);
        float acc[kNO];
#pragma unroll
        for (int k = 0; k < kNO; k++) acc[k] = 0.0f;
        for (int k0 = 0; k0 < Tk; k0 += kTile) {
            __syncthreads();
            if (tid < 32) load_keys(meta, a, b, k0);
            __syncthreads();
            if (!tiles_meet(meta)) continue;
            float s[kCols], dp[kCols];
            const unsigned valid = tile_logits<true>(s, dp, sm, meta, a, dout, b, h, q0, k0);
            const float pi = meta.q_pos[r];
#pragma unroll
            for (int k = 0; k < kCols; k++) {
                const int c = q4 + 4 * k, j = k0 + c;
                // P = exp(S - lse): 0 where masked, for a query with no visible key (lse -inf)
                // and where it underflows (no gradient there, as on the CPU)
                const float p = (valid & (1u << k)) && lse_i != -INFINITY ? expf(s[k] - lse_i)
                                                                          : 0.0f;
                const float v = p * (dp[k] - d_i);
                const bool in = p != 0.0f;
                Ss[r * kLS + c] = in ? v : 0.0f;
                if (!first) continue;
                if (t5) Bk[r * kLS + c] = in ? t5_bucket(a.bs, pi, meta.k_pos[c]) : -1;
                if (!in) continue;
                if (dtable != nullptr) dtable[row * Tk + j] += v;  // d logit / d table = 1
                if (!grads) continue;
                const float pj = meta.k_pos[c];
                switch (kind) {
                    case kLinear:  // d/da [-a d] = -d
                        ga -= double(v) * double(pi - pj);
                        break;
                    case kKerpleLog: {  // d/da = -log(1 + b|d|), d/db = -a |d| / (1 + b|d|)
                        const float dd = fabsf(pi - pj), u = 1.0f + pb * dd;
                        ga -= double(v) * double(logf(u));
                        gb -= double(v) * double(pa) * double(dd) / double(u);
                        break;
                    }
                    case kKerplePower: {  // d/da = -|d|^b, d/db = -a |d|^b log|d|, 0 at d = 0
                        const float dd = fabsf(pi - pj);
                        if (dd > 0.0f) {
                            const float pw = powf(dd, pb);
                            ga -= double(v) * double(pw);
                            gb -= double(v) * double(pa) * double(pw) * double(logf(dd));
                        }
                        break;
                    }
                    default:
                        break;
                }
            }
            // K (keys k0.., dims dc0..) for this pass; tile_logits ended with a barrier
            const int nk = min(kTile, Tk - k0);
            load_rows(sm, kLO, dw, a.kv + (size_t(b) * Tk + k0) * 2 * C + size_t(h) * D,
                      size_t(2) * C, nk, dc0, D);
            __syncthreads();  // Ss, Bk and the K tile complete
            if (t5 && first) t5_tile_grad(gt, Bk, Ss, kTile, kTile, kLS, tid, kThreads);
            const float* sr = Ss + r * kLS;
#pragma unroll
            for (int k = 0; k < kNO; k++) {
                const int d = q4 + 4 * k;
                if (d < dw) {
                    float x = acc[k];
                    for (int c = 0; c < kTile; c++) x += sr[c] * sm[c * kLO + d];
                    acc[k] = x;
                }
            }
        }
        if (i < Tq) {  // the old entries read before any is written (see add_old_entries)
            float* g = dq + (size_t(b) * Tq + i) * 3 * C + size_t(h) * D + dc0;
            add_old_entries<kNO>(acc, g, q4, dw, a.scale);
#pragma unroll
            for (int k = 0; k < kNO; k++)
                if (q4 + 4 * k < dw) g[q4 + 4 * k] = acc[k];
        }
    }
    if (!grads) return;  // uniform over the block
    const int nslots = t5 ? a.bs.nb : 2;
    double* slot = partials + ((size_t(b) * H + h) * gridDim.x + blockIdx.x) * nslots;
    if (t5) {
        for (int u = 0; u < 4; u++) {
            const int x = tid + kThreads * u;
            if (x < nslots) slot[x] = gt[u];
        }
    } else {
        ga = block_sum(ga, red);
        gb = block_sum(gb, red);
        if (tid == 0) {
            slot[0] = ga;
            slot[1] = gb;
        }
    }
}

// Per key tile: dk, dv over the query tiles that can see it.
__global__ void __launch_bounds__(kThreads)
    block_dkv_kernel(float* dkv, const float* dout, const float* out, const float* lse,
                     BlockArgs a) {
    __shared__ float sm[kDkvFloats];  // logit chunks, then the q and dout tiles (kTile, kLO)
    __shared__ float Ps[kTile * kLS];
    __shared__ float Ss[kTile * kLS];
    __shared__ TileMeta meta;
    const int k0 = blockIdx.x * kTile, h = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, r = tid >> 2, q4 = tid & 3;
    const int D = a.D, C = a.C, Tq = a.qr.T, Tk = a.kr.T, H = a.H;
    float* Qo = sm;
    float* dOo = sm + kTile * kLO;
    if (tid < 32) load_keys(meta, a, b, k0);
    for (int dc0 = 0; dc0 < D; dc0 += kDO) {
        float dk[kNO], dv[kNO];
#pragma unroll
        for (int k = 0; k < kNO; k++) dk[k] = dv[k] = 0.0f;
        const int dw = min(kDO, D - dc0);
        for (int q0 = 0; q0 < Tq; q0 += kTile) {
            __syncthreads();
            if (tid < 32) load_queries(meta, a, b, q0);
            __syncthreads();
            if (!tiles_meet(meta)) continue;
            const int i = q0 + r;
            const float lse_i = i < Tq ? lse[(size_t(b) * H + h) * Tq + i] : -INFINITY;
            const float d_i = row_dvec(dout, out, b, i, h, a);
            float s[kCols], dp[kCols];
            const unsigned valid = tile_logits<true>(s, dp, sm, meta, a, dout, b, h, q0, k0);
#pragma unroll
            for (int k = 0; k < kCols; k++) {
                const float p = (valid & (1u << k)) && lse_i != -INFINITY ? expf(s[k] - lse_i)
                                                                          : 0.0f;
                Ps[r * kLS + q4 + 4 * k] = p;
                Ss[r * kLS + q4 + 4 * k] = p != 0.0f ? p * (dp[k] - d_i) : 0.0f;
            }
            // q and dout (queries q0.., dims dc0..); tile_logits ended with a barrier
            const int nq = min(kTile, Tq - q0);
            load_rows(Qo, kLO, dw, a.q + (size_t(b) * Tq + q0) * 3 * C + size_t(h) * D,
                      size_t(3) * C, nq, dc0, D);
            load_rows(dOo, kLO, dw, dout + (size_t(b) * Tq + q0) * C + size_t(h) * D, size_t(C),
                      nq, dc0, D);
            __syncthreads();
            // thread (r, q4) now accumulates key row r of the tile
#pragma unroll
            for (int k = 0; k < kNO; k++) {
                const int d = q4 + 4 * k;
                if (d < dw) {
                    float xv = dv[k], xk = dk[k];
                    for (int rr = 0; rr < kTile; rr++) {
                        xv += Ps[rr * kLS + r] * dOo[rr * kLO + d];
                        xk += Ss[rr * kLS + r] * Qo[rr * kLO + d];
                    }
                    dv[k] = xv;
                    dk[k] = xk;
                }
            }
        }
        const int j = k0 + r;
        if (j < Tk) {
            float* g = dkv + (size_t(b) * Tk + j) * 2 * C + size_t(h) * D + dc0;
            // dk, then dv: both sets of old entries at once made ptxas spill
            add_old_entries<kNO>(dk, g, q4, dw, a.scale);
#pragma unroll
            for (int k = 0; k < kNO; k++)
                if (q4 + 4 * k < dw) g[q4 + 4 * k] = dk[k];
            add_old_entries<kNO>(dv, g + C, q4, dw, 1.0f);
#pragma unroll
            for (int k = 0; k < kNO; k++)
                if (q4 + 4 * k < dw) g[C + q4 + 4 * k] = dv[k];
        }
    }
}

// One thread per (head, slot): the partials of every (b, query tile) in a fixed order.
__global__ void block_bias_reduce_kernel(float* da, float* db, const double* partials, int B,
                                         int H, int tiles, int kind, int nslots) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= H * nslots) return;
    const int h = idx / nslots, x = idx % nslots;
    double s = 0.0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < tiles; t++) s += partials[((size_t(b) * H + h) * tiles + t) * nslots + x];
    if (kind == kT5) {
        if (da != nullptr) da[idx] += float(s);  // (H, nb): idx = h * nb + x
    } else if (x == 0) {
        if (da != nullptr) da[h] += float(s);
    } else if (kind != kLinear && db != nullptr) {
        db[h] += float(s);
    }
}

BlockArgs make_args(const float* q, const float* kv, const AttnBlockRows& qr,
                    const AttnBlockRows& kr, int C, int H, int window, const BiasArgs& bias) {
    BlockArgs a;
    a.q = q;
    a.kv = kv;
    a.qr = qr;
    a.kr = kr;
    a.C = C;
    a.H = H;
    a.D = C / H;
    a.window = window;
    a.scale = 1.0f / sqrtf(float(a.D));
    a.bs = bias;
    return a;
}

inline int tiles_of(int T) { return (T + kTile - 1) / kTile; }

}  // namespace

// ================================================================ launchers

size_t attention_block_partials(int B, int Tq, int H, int kind, int nb) {
    return size_t(B) * H * tiles_of(Tq) * (kind == kT5 ? nb : 2);
}

cudaError_t launch_attention_block_forward(float* out_b, float* lse_b, const float* q,
                                           const float* kv, const AttnBlockRows& qrows,
                                           const AttnBlockRows& krows, int B, int C, int H,
                                           int window, const BiasArgs& bias, cudaStream_t s) {
    if (B <= 0 || qrows.T <= 0) return cudaSuccess;
    const BlockArgs a = make_args(q, kv, qrows, krows, C, H, window, bias);
    const dim3 grid(tiles_of(qrows.T), H, B);
    block_fwd_kernel<<<grid, kThreads, 0, s>>>(out_b, lse_b, a);
    return cudaGetLastError();
}

cudaError_t launch_attention_block_merge(float* out, float* lse, const float* out_b,
                                         const float* lse_b, int B, int Tq, int C, int H,
                                         cudaStream_t s) {
    const size_t rows = size_t(B) * H * Tq;
    if (rows == 0) return cudaSuccess;
    const size_t blocks = (rows + kMergeWarps - 1) / kMergeWarps;
    block_merge_kernel<<<unsigned(blocks), 32 * kMergeWarps, 0, s>>>(out, lse, out_b, lse_b, B,
                                                                      Tq, C, H);
    return cudaGetLastError();
}

cudaError_t launch_attention_block_backward(float* dq, float* dkv, double* partials, float* da,
                                            float* db, float* dtable, const float* dout,
                                            const float* q, const float* kv, const float* out,
                                            const float* lse, const AttnBlockRows& qrows,
                                            const AttnBlockRows& krows, int B, int C, int H,
                                            int window, const BiasArgs& bias, cudaStream_t s) {
    if (B <= 0 || qrows.T <= 0 || krows.T <= 0) return cudaSuccess;
    const BlockArgs a = make_args(q, kv, qrows, krows, C, H, window, bias);
    const int qtiles = tiles_of(qrows.T);
    block_dq_kernel<<<dim3(qtiles, H, B), kThreads, 0, s>>>(dq, partials, dtable, dout, out, lse,
                                                            a);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    block_dkv_kernel<<<dim3(tiles_of(krows.T), H, B), kThreads, 0, s>>>(dkv, dout, out, lse, a);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    if (partials == nullptr) return cudaSuccess;
    const int nslots = bias.kind == kT5 ? bias.nb : 2, total = H * nslots;
    block_bias_reduce_kernel<<<(total + 127) / 128, 128, 0, s>>>(da, db, partials, B, H, qtiles,
                                                                 bias.kind, nslots);
    return cudaGetLastError();
}

}  // namespace ctx::cuda
