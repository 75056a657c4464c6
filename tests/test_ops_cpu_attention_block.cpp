// Attention across blocks (Backend::attention_block_*, context parallelism) against the
// single-rank attention op: a row split in the zigzag way over cp simulated ranks, each rank's
// queries meeting every rank's key/value block in ring order with the log-sum-exp merge, must give
// the whole row's output and lse, and the blocks' backward passes must sum to its gradients
// (q, k, v, the bias parameters and a Table bias's dtable), for every bias family, windows,
// packed documents and fractional, unsorted positions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/rng.h"

namespace ctx {
namespace {

Backend& cpu() {
    static std::unique_ptr<Backend> be = make_cpu_backend(2);
    return *be;
}

struct BlockCase {
    std::string name;
    BiasKind kind;
    int window;
    bool packed;
    int cp;
};
void PrintTo(const BlockCase& c, std::ostream* os) { *os << c.name; }

// The zigzag split (load-balanced causal attention): 2 cp chunks, rank r takes chunks r and
// 2 cp - 1 - r, in index order.
std::vector<int> zigzag(int T, int cp, int r) {
    const int chunk = T / (2 * cp);
    std::vector<int> out;
    for (int c : {r, 2 * cp - 1 - r})
        for (int t = 0; t < chunk; ++t) out.push_back(c * chunk + t);
    std::sort(out.begin(), out.end());
    return out;
}

double max_abs(const std::vector<float>& x) {
    double m = 0;
    for (float v : x) m = std::max(m, double(std::fabs(v)));
    return m;
}

class OpsCpuAttentionBlock : public ::testing::TestWithParam<BlockCase> {};

TEST_P(OpsCpuAttentionBlock, RingOfBlocksEqualsTheWholeRow) {
    const BlockCase& bc = GetParam();
    const int B = 2, T = 12, C = 8, H = 2, cp = bc.cp, Tl = T / cp;
    Rng rng(17 + bc.cp);
    auto randn = [&](size_t n, double s) {
        std::vector<float> v(n);
        for (float& x : v) x = float(rng.normal() * s);
        return v;
    };
    const std::vector<float> qkv = randn(size_t(B) * T * 3 * C, 1.0);
    const std::vector<float> dout = randn(size_t(B) * T * C, 1.0);
    std::vector<float> pos(size_t(B) * T);
    for (int b = 0; b < B; ++b)  // fractional and not sorted
        for (int t = 0; t < T; ++t) pos[b * T + t] = float(t * 1.5 + ((t * 7 + b) % 3) * 0.7);
    std::vector<int32_t> doc(size_t(B) * T);
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t) doc[b * T + t] = !bc.packed ? 0 : t < 5 ? 0 : t < 9 ? 5 : 9;
    // bias parameters (two sets of gradients: the whole row's and the blocks')
    const int nb = 8;
    std::vector<float> a = {0.3f, 0.8f}, bpar = {0.6f, 1.3f}, t5 = randn(size_t(H) * nb, 0.5);
    std::vector<float> table = randn(size_t(B) * H * T * T, 0.5);
    AttentionOptions opt;
    opt.window = bc.window;
    opt.mode = AttentionMode::Flash;
    opt.bias.kind = bc.kind;
    opt.bias.num_buckets = nb;
    opt.bias.max_distance = 20;
    if (bc.kind == BiasKind::T5) opt.bias.a = t5.data();
    else if (bc.kind != BiasKind::None && bc.kind != BiasKind::Table) opt.bias.a = a.data();
    if (bc.kind == BiasKind::KerpleLog || bc.kind == BiasKind::KerplePower) opt.bias.b = bpar.data();
    const size_t slots = bc.kind == BiasKind::T5 ? size_t(H) * nb : H;
    std::vector<float> ga_ref(slots, 0.0f), gb_ref(H, 0.0f), ga(slots, 0.0f), gb(H, 0.0f);
    std::vector<float> dtable_ref(table.size(), 0.0f);

    // ---- the whole row (flash mode: out and lse)
    std::vector<float> out(size_t(B) * T * C), lse(size_t(B) * H * T), dqkv(qkv.size(), 0.0f);
    AttentionOptions whole = opt;
    if (bc.packed) whole.doc_start = doc.data();
    if (bc.kind == BiasKind::Table) {
        whole.bias.table = table.data();
        whole.bias.dtable = dtable_ref.data();
    }
    whole.bias.da = opt.bias.a ? ga_ref.data() : nullptr;
    whole.bias.db = opt.bias.b ? gb_ref.data() : nullptr;
    cpu().attention_forward(out.data(), lse.data(), qkv.data(), pos.data(), B, T, C, H, whole);
    std::vector<float> scratch(cpu().attention_scratch_floats(B, T, C, H, AttentionMode::Flash));
    cpu().attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), lse.data(),
                             out.data(), pos.data(), B, T, C, H, whole);

    // ---- each simulated rank's block: its tokens' q rows, [k | v], indices, positions, docs
    struct Block {
        std::vector<int> tok;
        std::vector<float> q, kv, pos, dout, out, lse, dq, dkv;
        std::vector<int32_t> index, doc;
        AttnBlockRows rows() const {
            return AttnBlockRows{int(tok.size()), index.data(), pos.data(),
                                 doc.empty() ? nullptr : doc.data()};
        }
    };
    std::vector<Block> blk(cp);
    for (int r = 0; r < cp; ++r) {
        Block& k = blk[r];
        k.tok = zigzag(T, cp, r);
        for (int b = 0; b < B; ++b)
            for (int t : k.tok) {
                const size_t g = size_t(b) * T + t;
                k.q.insert(k.q.end(), qkv.begin() + g * 3 * C, qkv.begin() + (g + 1) * 3 * C);
                k.kv.insert(k.kv.end(), qkv.begin() + g * 3 * C + C, qkv.begin() + (g + 1) * 3 * C);
                k.pos.push_back(pos[g]);
                k.index.push_back(t);
                if (bc.packed) k.doc.push_back(doc[g]);
                k.dout.insert(k.dout.end(), dout.begin() + g * C, dout.begin() + (g + 1) * C);
            }
        k.out.assign(size_t(B) * Tl * C, 0.0f);
        k.lse.assign(size_t(B) * H * Tl, -std::numeric_limits<float>::infinity());
        k.dq.assign(k.q.size(), 0.0f);
        k.dkv.assign(k.kv.size(), 0.0f);
    }
    // the Table bias and its gradient for the pair (queries of r, keys of s): (B, H, Tl, Tl)
    auto pair_table = [&](const Block& qb, const Block& kb, const std::vector<float>& full) {
        std::vector<float> t(size_t(B) * H * Tl * Tl);
        for (int bh = 0; bh < B * H; ++bh)
            for (int i = 0; i < Tl; ++i)
                for (int j = 0; j < Tl; ++j)
                    t[(size_t(bh) * Tl + i) * Tl + j] =
                        full[(size_t(bh) * T + qb.tok[i]) * T + kb.tok[j]];
        return t;
    };
    // forward: the ring, rank r receiving rank r - s's block at step s
    for (int r = 0; r < cp; ++r) {
        for (int s = 0; s < cp; ++s) {
            const Block& kb = blk[(r - s + cp) % cp];
            std::vector<float> ob(size_t(B) * Tl * C), lb(size_t(B) * H * Tl);
            std::vector<float> tb = pair_table(blk[r], kb, table);
            AttentionOptions o = opt;
            if (bc.kind == BiasKind::Table) o.bias.table = tb.data();
            cpu().attention_block_forward(ob.data(), lb.data(), blk[r].q.data(), kb.kv.data(),
                                          blk[r].rows(), kb.rows(), B, C, H, o);
            cpu().attention_block_merge(blk[r].out.data(), blk[r].lse.data(), ob.data(),
                                        lb.data(), B, Tl, C, H);
        }
        const Block& k = blk[r];
        for (int b = 0; b < B; ++b)
            for (int i = 0; i < Tl; ++i) {
                const size_t g = size_t(b) * T + k.tok[i], l = size_t(b) * Tl + i;
                for (int c = 0; c < C; ++c)
                    EXPECT_NEAR(k.out[l * C + c], out[g * C + c], 2e-5) << "out " << b << " " << k.tok[i];
                for (int h = 0; h < H; ++h)
                    EXPECT_NEAR(k.lse[(size_t(b) * H + h) * Tl + i],
                                lse[(size_t(b) * H + h) * T + k.tok[i]], 2e-5);
            }
    }
    // backward: every pair of blocks, dk and dv into the key block's owner
    std::vector<float> dtable(table.size(), 0.0f);
    for (int r = 0; r < cp; ++r)
        for (int s = 0; s < cp; ++s) {
            Block& kb = blk[(r - s + cp) % cp];
            std::vector<float> tb = pair_table(blk[r], kb, table);
            std::vector<float> dtb(tb.size(), 0.0f);
            AttentionOptions o = opt;
            if (bc.kind == BiasKind::Table) {
                o.bias.table = tb.data();
                o.bias.dtable = dtb.data();
            }
            o.bias.da = opt.bias.a ? ga.data() : nullptr;
            o.bias.db = opt.bias.b ? gb.data() : nullptr;
            cpu().attention_block_backward(blk[r].dq.data(), kb.dkv.data(), blk[r].dout.data(),
                                           blk[r].q.data(), kb.kv.data(), blk[r].out.data(),
                                           blk[r].lse.data(), blk[r].rows(), kb.rows(), B, C, H,
                                           o);
            for (int bh = 0; bh < B * H; ++bh)
                for (int i = 0; i < Tl; ++i)
                    for (int j = 0; j < Tl; ++j)
                        dtable[(size_t(bh) * T + blk[r].tok[i]) * T + kb.tok[j]] +=
                            dtb[(size_t(bh) * Tl + i) * Tl + j];
        }
    // reassemble the blocks' dq, dk, dv into (B, T, 3C)
    std::vector<float> got(qkv.size(), 0.0f);
    for (const Block& k : blk)
        for (int b = 0; b < B; ++b)
            for (int i = 0; i < Tl; ++i) {
                const size_t g = size_t(b) * T + k.tok[i], l = size_t(b) * Tl + i;
                for (int c = 0; c < C; ++c) {
                    got[g * 3 * C + c] = k.dq[l * 3 * C + c];
                    got[g * 3 * C + C + c] = k.dkv[l * 2 * C + c];
                    got[g * 3 * C + 2 * C + c] = k.dkv[l * 2 * C + C + c];
                }
            }
    const double tol = 2e-5 * std::max(1.0, max_abs(dqkv));
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], dqkv[i], tol) << "dqkv " << i;
    for (size_t i = 0; i < slots; ++i)
        EXPECT_NEAR(ga[i], ga_ref[i], 2e-5 * std::max(1.0, max_abs(ga_ref))) << "da " << i;
    for (int h = 0; h < H; ++h)
        EXPECT_NEAR(gb[h], gb_ref[h], 2e-5 * std::max(1.0, max_abs(gb_ref))) << "db " << h;
    if (bc.kind == BiasKind::Table) {
        for (size_t i = 0; i < dtable.size(); ++i)
            ASSERT_NEAR(dtable[i], dtable_ref[i], 2e-5 * std::max(1.0, max_abs(dtable_ref)));
    }
    if (opt.bias.a && bc.kind != BiasKind::None) {
        EXPECT_GT(max_abs(ga_ref), 1e-4) << "the case must exercise the bias gradient";
    }
}

INSTANTIATE_TEST_SUITE_P(
    Families, OpsCpuAttentionBlock,
    ::testing::Values(BlockCase{"none_cp2", BiasKind::None, 0, false, 2},
                      BlockCase{"none_cp3_packed", BiasKind::None, 0, true, 3},
                      BlockCase{"alibi_cp2", BiasKind::Linear, 0, false, 2},
                      BlockCase{"alibi_cp2_window", BiasKind::Linear, 5, false, 2},
                      BlockCase{"kerple_log_cp2_packed", BiasKind::KerpleLog, 0, true, 2},
                      BlockCase{"kerple_power_cp3", BiasKind::KerplePower, 0, false, 3},
                      BlockCase{"t5_cp2", BiasKind::T5, 0, false, 2},
                      BlockCase{"t5_cp3_window", BiasKind::T5, 4, false, 3},
                      BlockCase{"table_cp2", BiasKind::Table, 0, false, 2},
                      BlockCase{"table_cp3_packed_window", BiasKind::Table, 6, true, 3}),
    [](const auto& info) { return info.param.name; });

TEST(OpsCpuAttentionBlock, AQueryWithNoVisibleKeyGetsMinusInfinityAndMergesToNothing) {
    const int B = 1, C = 4, H = 1;
    const std::vector<float> q(3 * C, 1.0f), kv(2 * 2 * C, 1.0f);
    const std::vector<int32_t> qi = {1}, ki = {5, 6};  // keys after the query
    const std::vector<float> qp = {1.0f}, kp = {5.0f, 6.0f};
    std::vector<float> out(C, 7.0f), lse(1, 0.0f);
    AttentionOptions opt;
    cpu().attention_block_forward(out.data(), lse.data(), q.data(), kv.data(),
                                  AttnBlockRows{1, qi.data(), qp.data(), nullptr},
                                  AttnBlockRows{2, ki.data(), kp.data(), nullptr}, B, C, H, opt);
    EXPECT_EQ(lse[0], -std::numeric_limits<float>::infinity());
    EXPECT_EQ(out, std::vector<float>(C, 0.0f));
    std::vector<float> acc = {0.5f, 0.5f, 0.5f, 0.5f}, acc_lse = {0.25f};
    cpu().attention_block_merge(acc.data(), acc_lse.data(), out.data(), lse.data(), B, 1, C, H);
    EXPECT_EQ(acc, std::vector<float>(C, 0.5f));
    EXPECT_EQ(acc_lse[0], 0.25f);
}

}  // namespace
}  // namespace ctx
