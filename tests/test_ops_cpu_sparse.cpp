// The contextual-sparsity ops of the CPU backend (backend.h: matmul_rows_forward,
// matmul_rows_project, select_topk, and attention over a KV cache with a head subset) against
// naive double-precision loops written from the contract, and against the dense ops they stand
// for: with a subset chosen, the selected entries equal the dense product's, the others are
// untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "op_reference.h"

namespace {

using FVec = std::vector<float>;
using IVec = std::vector<int32_t>;

ctx::Backend& be() {
    static std::unique_ptr<ctx::Backend> b = ctx::make_cpu_backend(2);
    return *b;
}

FVec randn(ref::Rng& rng, size_t n) { return ref::to_float(rng.normals(n, 1.0)); }

// Per row, K distinct groups of [0, M/G) in random order, some replaced by -1.
IVec random_selection(ref::Rng& rng, int N, int groups, int K, bool holes) {
    IVec idx(size_t(N) * K);
    for (int n = 0; n < N; n++) {
        IVec all(static_cast<size_t>(groups));
        std::iota(all.begin(), all.end(), 0);
        for (int i = groups - 1; i > 0; i--)
            std::swap(all[size_t(i)], all[size_t(rng.integer(0, i))]);
        for (int k = 0; k < K; k++)
            idx[size_t(n) * K + k] = holes && rng.integer(0, 3) == 0 ? -1 : all[size_t(k)];
    }
    return idx;
}

TEST(OpsCpuSparse, MatmulRowsForwardWritesTheSelectedDotProductsOnly) {
    for (auto [N, IC, M, K, G, ldo_pad, bias, holes] :
         {std::tuple{3, 17, 40, 9, 1, 0, true, false}, std::tuple{2, 64, 48, 3, 8, 5, false, true},
          std::tuple{1, 256, 1024, 200, 1, 0, true, true}, std::tuple{4, 33, 12, 12, 1, 3, true, false}}) {
        ref::Rng rng(N * 1000 + IC + M + K);
        const int ldo = M + ldo_pad;
        const FVec inp = randn(rng, size_t(N) * IC), W = randn(rng, size_t(M) * IC);
        const FVec b = bias ? randn(rng, size_t(M)) : FVec{};
        const IVec idx = random_selection(rng, N, M / G, K, holes);
        FVec out(size_t(N) * ldo, 7.5f);  // a sentinel the op must leave where not selected
        be().matmul_rows_forward(out.data(), ldo, inp.data(), W.data(), bias ? b.data() : nullptr,
                                 idx.data(), N, IC, K, G);
        FVec want(out.size(), 7.5f);
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++) {
                const int j = idx[size_t(n) * K + k];
                if (j < 0) continue;
                for (int g = 0; g < G; g++) {
                    const size_t row = size_t(j) * G + g;
                    double d = bias ? b[row] : 0.0;
                    for (int i = 0; i < IC; i++)
                        d += double(W[row * IC + i]) * inp[size_t(n) * IC + i];
                    want[size_t(n) * ldo + row] = float(d);
                }
            }
        for (size_t e = 0; e < out.size(); e++)
            EXPECT_NEAR(out[e], want[e], 1e-5 * (1.0 + std::fabs(want[e]))) << "entry " << e;
    }
}

TEST(OpsCpuSparse, MatmulRowsProjectSumsTheSelectedRowsOfTheTransposedWeight) {
    for (auto [N, OC, M, K, G, ldh_pad, bias, holes] :
         {std::tuple{3, 17, 40, 9, 1, 0, true, false}, std::tuple{2, 300, 48, 3, 8, 4, false, true},
          std::tuple{1, 256, 1024, 200, 1, 0, true, true}}) {
        ref::Rng rng(N * 77 + OC + M + K);
        const int ldh = M + ldh_pad;
        const FVec h = randn(rng, size_t(N) * ldh), Wt = randn(rng, size_t(M) * OC);
        const FVec b = bias ? randn(rng, size_t(OC)) : FVec{};
        const IVec idx = random_selection(rng, N, M / G, K, holes);
        FVec out(size_t(N) * OC, 7.5f);
        be().matmul_rows_project(out.data(), h.data(), ldh, Wt.data(), bias ? b.data() : nullptr,
                                 idx.data(), N, OC, K, G);
        for (int n = 0; n < N; n++)
            for (int c = 0; c < OC; c++) {
                double d = bias ? b[size_t(c)] : 0.0;
                for (int k = 0; k < K; k++) {
                    const int j = idx[size_t(n) * K + k];
                    if (j < 0) continue;
                    for (int g = 0; g < G; g++) {
                        const size_t row = size_t(j) * G + g;
                        d += double(h[size_t(n) * ldh + row]) * Wt[row * OC + c];
                    }
                }
                EXPECT_NEAR(out[size_t(n) * OC + c], d, 1e-5 * (1.0 + std::fabs(d)));
            }
    }
}

// Every row selected: the two products are the dense MLP, fc then fc_proj.
TEST(OpsCpuSparse, AllRowsSelectedIsTheDenseProduct) {
    const int N = 3, C = 32, F = 96;
    ref::Rng rng(5);
    const FVec x = randn(rng, size_t(N) * C), W1 = randn(rng, size_t(F) * C), b1 = randn(rng, F);
    const FVec W2 = randn(rng, size_t(C) * F), b2 = randn(rng, C);
    FVec W2t(size_t(F) * C);
    for (int c = 0; c < C; c++)
        for (int f = 0; f < F; f++) W2t[size_t(f) * C + c] = W2[size_t(c) * F + f];
    IVec all(size_t(N) * F);
    for (int n = 0; n < N; n++) std::iota(all.begin() + n * F, all.begin() + (n + 1) * F, 0);
    FVec h(size_t(N) * F), hd(h.size()), out(size_t(N) * C), outd(out.size());
    be().matmul_rows_forward(h.data(), F, x.data(), W1.data(), b1.data(), all.data(), N, C, F, 1);
    be().matmul_forward(hd.data(), x.data(), W1.data(), b1.data(), N, C, F);
    for (size_t i = 0; i < h.size(); i++) EXPECT_NEAR(h[i], hd[i], 1e-5 * (1 + std::fabs(hd[i])));
    be().matmul_rows_project(out.data(), hd.data(), F, W2t.data(), b2.data(), all.data(), N, C, F,
                             1);
    be().matmul_forward(outd.data(), hd.data(), W2.data(), b2.data(), N, F, C);
    for (size_t i = 0; i < out.size(); i++)
        EXPECT_NEAR(out[i], outd[i], 1e-4 * (1 + std::fabs(outd[i])));
}

// The reference: sort by (score descending, index ascending), take K, sort by index, drop
// those not above the threshold to the end as -1.
IVec naive_topk(const FVec& s, int N, int M, int K, float threshold) {
    IVec out;
    for (int n = 0; n < N; n++) {
        IVec order(static_cast<size_t>(M));
        std::iota(order.begin(), order.end(), 0);
        const float* r = s.data() + size_t(n) * M;
        std::stable_sort(order.begin(), order.end(), [r](int a, int b) { return r[a] > r[b]; });
        order.resize(static_cast<size_t>(K));
        std::sort(order.begin(), order.end());
        IVec row;
        for (int j : order)
            if (r[j] > threshold) row.push_back(j);
        row.resize(static_cast<size_t>(K), -1);
        out.insert(out.end(), row.begin(), row.end());
    }
    return out;
}

TEST(OpsCpuSparse, SelectTopkTakesTheLargestInIndexOrder) {
    const float none = -std::numeric_limits<float>::infinity();
    for (auto [N, M, K, threshold, ties] :
         {std::tuple{3, 40, 9, none, false}, std::tuple{2, 1000, 100, 0.0f, false},
          std::tuple{4, 16, 16, none, false}, std::tuple{5, 50, 7, none, true},
          std::tuple{2, 64, 20, 0.5f, true}, std::tuple{1, 3, 1, none, false}}) {
        ref::Rng rng(N + M + K);
        FVec s = randn(rng, size_t(N) * M);
        if (ties)  // few distinct values: the lower index must win
            for (float& v : s) v = std::round(v * 2.0f) / 2.0f;
        IVec idx(size_t(N) * K, 99);
        be().select_topk(idx.data(), s.data(), N, M, K, threshold);
        EXPECT_EQ(idx, naive_topk(s, N, M, K, threshold)) << "N " << N << " M " << M << " K " << K;
    }
    // -0 and +0 compare equal: ties by index
    const FVec z = {0.0f, -0.0f, 0.0f, -1.0f};
    IVec idx(2);
    be().select_topk(idx.data(), z.data(), 1, 4, 2, -std::numeric_limits<float>::infinity());
    EXPECT_EQ(idx, (IVec{0, 1}));
}

TEST(OpsCpuSparse, BadShapesAreRefused) {
    FVec s(8), out(8);
    IVec idx(8);
    EXPECT_THROW(be().select_topk(idx.data(), s.data(), 1, 4, 5, 0.0f), ctx::Error);  // K > M
    EXPECT_THROW(be().select_topk(idx.data(), s.data(), 1, 4, 0, 0.0f), ctx::Error);  // K = 0
    EXPECT_THROW(be().matmul_rows_forward(out.data(), 4, s.data(), s.data(), nullptr, idx.data(),
                                          1, 2, 1, 0),
                 ctx::Error);  // G = 0
}

// Attention over a KV cache with a head subset: the listed heads' outputs equal the full op's
// bit for bit (the same loop runs them), the others are left as they were.
TEST(OpsCpuSparse, CachedAttentionRunsOnlyTheListedHeads) {
    const int B = 2, Tq = 3, S = 20, H = 4, D = 8, C = H * D, HS = 3;
    ref::Rng rng(11);
    const FVec qkv = randn(rng, size_t(B) * Tq * 3 * C);
    const FVec kc = randn(rng, size_t(B) * S * C), vc = randn(rng, size_t(B) * S * C);
    FVec kpos(size_t(B) * S);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < S; j++) kpos[size_t(b) * S + j] = float(j);
    const IVec lens = {12, 20};
    // per query (B * Tq rows): HS heads, ascending, -1 at the end
    const IVec heads = {0, 2, 3, 1, -1, -1, 3, -1, -1, 0, 1, 2, 2, 3, -1, 1, 2, 3};
    ctx::AttentionOptions opt;
    FVec full(size_t(B) * Tq * C), scratch(be().attention_cached_scratch_floats(S));
    be().attention_cached_forward(full.data(), scratch.data(), qkv.data(), kc.data(), vc.data(),
                                  kpos.data(), lens.data(), B, Tq, S, C, H, opt);
    opt.heads = heads.data();
    opt.heads_k = HS;
    FVec sub(full.size(), 7.5f);
    be().attention_cached_forward(sub.data(), scratch.data(), qkv.data(), kc.data(), vc.data(),
                                  kpos.data(), lens.data(), B, Tq, S, C, H, opt);
    for (int q = 0; q < B * Tq; q++)
        for (int h = 0; h < H; h++) {
            const int* first = heads.data() + q * HS;
            const bool listed = std::find(first, first + HS, h) != first + HS;
            for (int d = 0; d < D; d++) {
                const size_t e = size_t(q) * C + size_t(h) * D + d;
                if (listed)
                    EXPECT_EQ(sub[e], full[e]) << "query " << q << " head " << h;
                else
                    EXPECT_EQ(sub[e], 7.5f) << "query " << q << " head " << h;
            }
        }
    opt.heads_k = H + 1;  // more heads than the model has
    EXPECT_THROW(be().attention_cached_forward(sub.data(), scratch.data(), qkv.data(), kc.data(),
                                               vc.data(), kpos.data(), lens.data(), B, Tq, S, C,
                                               H, opt),
                 ctx::Error);
    // the other attention ops refuse a head subset rather than ignore it
    FVec out(size_t(Tq) * C), saved(size_t(H) * Tq * Tq);
    const FVec pos = {0.0f, 1.0f, 2.0f};
    opt.heads_k = 1;
    EXPECT_THROW(be().attention_forward(out.data(), saved.data(), qkv.data(), pos.data(), 1, Tq,
                                        C, H, opt),
                 ctx::Error);
}

}  // namespace
