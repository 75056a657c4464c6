// CPU backend (private header): the attention bias helpers both attention modes share
// (cpu_attention.cpp: materialised, cpu_attention_flash.cpp: flash), so the two evaluate the bias,
// its masks and its parameter gradients with the same code and agree to rounding.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_math.h"
#include "backend/op_common.h"

namespace ctx::cpu {

// T5 bucket lookup for one call: a table of bucket(n) for n = 0 .. max_distance, where the last
// entry (n >= max_distance) is the last bucket. Distances are formed in double (exact for float
// positions), so floor() at integer boundaries matches the reference bit for bit.
struct BiasEval {
    BiasKind kind = BiasKind::None;
    int nb = 0, md = 0;
    const int* lut = nullptr;  // (md + 1) when md <= kT5LutSize, else null (direct evaluation)

    // n = max(0, floor(d)) clamped to md, as a table index; int() is floor for d >= 0 (and a NaN
    // distance lands on 0 rather than outside the table).
    static int clamped_n(double d, double md) { return int(d >= 0.0 ? (d < md ? d : md) : 0.0); }

    int bucket(float pi, float pj) const {
        const double d = double(pi) - double(pj);
        return lut != nullptr ? lut[clamped_n(d, md)] : t5_bucket(d, nb, md);
    }
};

// Fills lut (kT5LutSize + 1) for T5 and returns the evaluator.
inline BiasEval make_bias_eval(const BiasSpec& bs, int* lut) {
    BiasEval be;
    be.kind = bs.kind;
    if (bs.kind == BiasKind::T5) {
        be.nb = bs.num_buckets;
        be.md = bs.max_distance;
        if (be.md <= kT5LutSize) {
            for (int n = 0; n <= be.md; n++) lut[n] = t5_bucket(n, be.nb, be.md);
            be.lut = lut;
        }
    }
    return be;
}

// Adds bias_h(pos[i] - pos[j]) to the logits of row i over keys j in [lo, i], held at
// row[j - j0] (j0 <= lo: the first key the caller's buffer holds). trow (T) is row i of the
// (b, h) slice of an explicit Table bias (null for the other kinds).
inline void add_bias_row(float* row, int j0, const float* trow, const float* pos, int i, int lo,
                         int h, const BiasSpec& bs, const BiasEval& be) {
    const float pi = pos[i];
    const int n = i - lo + 1;     // keys lo .. i
    float* r = row + (lo - j0);   // (n) their logits
    const float* pj = pos + lo;   // (n) their positions
    switch (bs.kind) {
        case BiasKind::None:
            break;
        case BiasKind::Table: {
            const float* tj = trow + lo;  // (n) their table entries
#pragma omp simd
            for (int k = 0; k < n; k++) r[k] += tj[k];
            break;
        }
        case BiasKind::Linear: {
            const float a = bs.a[h];
#pragma omp simd
            for (int k = 0; k < n; k++) r[k] -= a * (pi - pj[k]);
            break;
        }
        case BiasKind::KerpleLog: {
            const float a = bs.a[h], b = bs.b[h];
#pragma omp simd
            for (int k = 0; k < n; k++) r[k] -= a * fast_log(1.0f + b * std::fabs(pi - pj[k]));
            break;
        }
        case BiasKind::KerplePower: {
            const float a = bs.a[h], b = bs.b[h];
#pragma omp simd
            for (int k = 0; k < n; k++) {
                const float d = std::fabs(pi - pj[k]);
                const float pw = fast_exp(b * fast_log(d));
                r[k] -= d > 0.0f ? a * pw : 0.0f;  // |d|^b, 0 at d = 0
            }
            break;
        }
        case BiasKind::T5: {
            const float* table = bs.a + size_t(h) * be.nb;  // (num_buckets)
            if (be.lut != nullptr) {
                const int* lut = be.lut;
                const double md = be.md;
#pragma omp simd
                for (int k = 0; k < n; k++)
                    r[k] += table[lut[BiasEval::clamped_n(double(pi) - double(pj[k]), md)]];
            } else {
                for (int k = 0; k < n; k++) r[k] += table[be.bucket(pi, pj[k])];
            }
            break;
        }
    }
}

// Accumulates the bias parameter gradients of head h from the dlogits of row i over keys
// j in [lo, i], held at ds[j - j0]: g[0] += dL/da, g[1] += dL/db (Linear, KERPLE) or
// g[bucket] += dL/dtable (T5).
inline void bias_grad_row(double* g, const float* ds_row, int j0, const float* pos, int i,
                          int lo, int h, const BiasSpec& bs, const BiasEval& be) {
    const float pi = pos[i];
    const int n = i - lo + 1;              // keys lo .. i
    const float* ds = ds_row + (lo - j0);  // (n) their dlogits
    const float* pj = pos + lo;            // (n) their positions
    switch (bs.kind) {
        case BiasKind::None:
        case BiasKind::Table:  // handled by the caller (dtable)
            break;
        case BiasKind::Linear: {  // d/da [-a d] = -d
            float ga = 0.0f;
#pragma omp simd reduction(+ : ga)
            for (int k = 0; k < n; k++) ga -= ds[k] * (pi - pj[k]);
            g[0] += ga;
            break;
        }
        case BiasKind::KerpleLog: {  // -a log(1 + b|d|): d/da = -log(1 + b|d|), d/db = -a|d|/(1+b|d|)
            const float a = bs.a[h], b = bs.b[h];
            float ga = 0.0f, gb = 0.0f;
#pragma omp simd reduction(+ : ga, gb)
            for (int k = 0; k < n; k++) {
                const float d = std::fabs(pi - pj[k]);
                const float u = 1.0f + b * d;
                ga -= ds[k] * fast_log(u);
                gb -= ds[k] * a * d / u;
            }
            g[0] += ga;
            g[1] += gb;
            break;
        }
        case BiasKind::KerplePower: {  // -a |d|^b: d/da = -|d|^b, d/db = -a |d|^b log|d| (0 at d=0)
            const float a = bs.a[h], b = bs.b[h];
            float ga = 0.0f, gb = 0.0f;
#pragma omp simd reduction(+ : ga, gb)
            for (int k = 0; k < n; k++) {
                const float d = std::fabs(pi - pj[k]);
                const float ld = fast_log(d);  // garbage at d = 0, masked below
                const float pw = fast_exp(b * ld);
                const float w = d > 0.0f ? ds[k] : 0.0f;
                ga -= w * pw;
                gb -= w * a * pw * ld;
            }
            g[0] += ga;
            g[1] += gb;
            break;
        }
        case BiasKind::T5:
            for (int k = 0; k < n; k++) g[be.bucket(pi, pj[k])] += ds[k];
            break;
    }
}

// First key row i may attend to.
inline int key_start(int i, int window) { return window > 0 ? std::max(0, i - window + 1) : 0; }

// First key query i of row b attends: the window's start, or its document's first token when
// rows are packed (opt.doc_start). Non-decreasing in i, so a query block's first row has the
// block's lowest key.
inline int key_lo(const AttentionOptions& opt, int b, int T, int i) {
    const int lo = key_start(i, opt.window);
    return opt.doc_start ? std::max(lo, int(opt.doc_start[size_t(b) * T + i])) : lo;
}

// Per-thread dP/dS buffer: one query block against all keys it may need.
inline size_t attn_buffer_floats(int T) {
    return (size_t(std::min(T, kAttnBlock)) * size_t(T) + 15) / 16 * 16;
}

// Which bias gradients a backward call produces.
struct BiasGrads {
    bool params = false;  // da / db of an in-kernel family (per-(b, h) slots, reduced at the end)
    bool table = false;   // dtable of a Table bias (written in place, entry by entry)
    int n = 0;            // slots used per (b, h): num_buckets for T5, else 2 (a, b)
};

inline BiasGrads bias_grads_of(const BiasSpec& bs) {
    BiasGrads g;
    g.params = bs.kind != BiasKind::None && bs.kind != BiasKind::Table &&
               (bs.da != nullptr || bs.db != nullptr);
    g.table = bs.kind == BiasKind::Table && bs.dtable != nullptr;
    g.n = bs.kind == BiasKind::T5 ? bs.num_buckets : 2;
    return g;
}

// da, db += the per-(b, h) slots (B*H, kMaxT5Buckets), summed in a fixed order (h, then b) so the
// result does not depend on which thread ran which pair.
inline void reduce_bias_slots(const float* slots, int B, int H, const BiasSpec& bs) {
    for (int h = 0; h < H; h++) {
        for (int b = 0; b < B; b++) {
            const float* slot = slots + (size_t(b) * H + h) * kMaxT5Buckets;
            if (bs.kind == BiasKind::T5) {
                if (bs.da != nullptr)
                    for (int x = 0; x < bs.num_buckets; x++)
                        bs.da[size_t(h) * bs.num_buckets + x] += slot[x];
            } else {
                if (bs.da != nullptr) bs.da[h] += slot[0];
                if (bs.db != nullptr && bs.kind != BiasKind::Linear) bs.db[h] += slot[1];
            }
        }
    }
}

}  // namespace ctx::cpu
