// Attention across blocks of a row (Backend::attention_block_*, context parallelism) on the CUDA
// backend against the CPU backend (cpu_attention_block.cpp, itself checked against the whole-row
// attention in test_ops_cpu_attention_block.cpp). A row is split in the zigzag way over cp
// simulated ranks (2 chunks each), and every pair (query block, key block) runs on both backends:
// the key block lies before, after or on the query block's chunks, so fully masked, partially
// masked and fully visible tiles occur, and queries with no visible key (lse -inf). Compared:
// forward (out_b, lse_b), the merge, backward (dq, dkv, da, db, dtable) for every bias family,
// windows, packed documents, fractional and unsorted positions, head dims below, across and above
// the kernels' chunk sizes, and blocks that are not a multiple of the 32-token tile. One test
// chains forward + merge and the blocks' backward over a whole row on the GPU and compares with
// the whole-row attention (flash mode) on both backends.
//
// Every test skips (GTEST_SKIP) when no CUDA device is visible. Labelled "gpu" in ctest.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "gpu_test_support.h"

namespace {

using ctx::AttentionMode;
using ctx::AttentionOptions;
using ctx::AttnBlockRows;
using ctx::BiasKind;

#define REQUIRE_GPU()                                                                         \
    do {                                                                                      \
        if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible: the CUDA backend tests need one"; \
    } while (0)

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// got against want: infinite entries (lse -inf) must agree exactly, the others within
// atol + rtol * max |want| (fp32 rounding of the largest entry).
void expect_close(const FVec& got, const FVec& want, const std::string& what, double rtol = 1e-5,
                  double atol = 1e-6) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double mag = 0.0;
    for (float w : want)
        if (std::isfinite(w)) mag = std::max(mag, double(std::fabs(w)));
    const double tol = atol + rtol * mag;
    size_t bad = 0, worst = 0;
    double worst_err = -1.0;
    for (size_t i = 0; i < got.size(); i++) {
        double err;
        if (!std::isfinite(want[i]) || !std::isfinite(got[i]))
            err = (got[i] == want[i]) ? 0.0 : INFINITY;  // NaN never equals
        else
            err = std::fabs(double(got[i]) - double(want[i]));
        if (err > tol) bad++;
        if (err > worst_err) {
            worst_err = err;
            worst = i;
        }
    }
    if (got.empty()) return;
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " entries off; worst ["
                       << worst << "] got " << got[worst] << " want " << want[worst]
                       << " (tol " << tol << ")";
}

// The zigzag split: rank r holds chunks r and 2 cp - 1 - r of the row's 2 cp chunks.
std::vector<int> zigzag(int T, int cp, int r) {
    const int chunk = T / (2 * cp);
    std::vector<int> out;
    for (int c : {r, 2 * cp - 1 - r})
        for (int t = 0; t < chunk; ++t) out.push_back(c * chunk + t);
    std::sort(out.begin(), out.end());
    return out;
}

struct BlockCase {
    std::string name;
    BiasKind kind;
    int window;
    bool packed;
    int cp, chunk;  // T = 2 cp chunk tokens per row, cp blocks of 2 chunk
    int B, H, D;
    PosStyle pos;
    int max_distance = 20;  // T5 (> kT5LutSize: the direct bucket formula)
    bool host_slopes = false;  // a, b as host memory (fixed slopes a plugin computes)
};
void PrintTo(const BlockCase& c, std::ostream* os) { *os << c.name; }

// A batch of whole rows and its split into blocks, with host and device copies of each block's
// tokens and data.
struct Row {
    int B, T, C, H, cp, Tl;
    FVec qkv, dout, pos;           // (B, T, 3C), (B, T, C), (B, T)
    std::vector<int32_t> doc;      // (B, T) or empty
    struct Block {
        std::vector<int> tok;
        std::vector<int32_t> index, doc;  // (B, Tl)
        FVec pos, q, kv, dout;            // (B, Tl), (B, Tl, 3C), (B, Tl, 2C), (B, Tl, C)
        std::unique_ptr<DevInts> g_index, g_doc;
        std::unique_ptr<Dev> g_pos, g_q, g_kv, g_dout;
        AttnBlockRows cpu_rows() const {
            return AttnBlockRows{int(tok.size()), index.data(), pos.data(),
                                 doc.empty() ? nullptr : doc.data()};
        }
        AttnBlockRows gpu_rows() const {
            return AttnBlockRows{int(tok.size()), g_index->get(), g_pos->get(),
                                 g_doc ? g_doc->get() : nullptr};
        }
    };
    std::vector<Block> blk;

    Row(const BlockCase& bc, ref::Rng& rng)
        : B(bc.B), T(2 * bc.cp * bc.chunk), C(bc.H * bc.D), H(bc.H), cp(bc.cp), Tl(T / cp) {
        qkv = randn(rng, size_t(B) * T * 3 * C);
        dout = randn(rng, size_t(B) * T * C);
        pos = make_positions(rng, B, T, bc.pos);
        if (bc.packed)  // three documents per row, boundaries differing by row
            for (int b = 0; b < B; ++b)
                for (int t = 0; t < T; ++t) {
                    const int d1 = T / 3 + b, d2 = (2 * T) / 3 - b;
                    doc.push_back(t < d1 ? 0 : t < d2 ? d1 : d2);
                }
        blk.resize(cp);
        for (int r = 0; r < cp; ++r) {
            Block& k = blk[r];
            k.tok = zigzag(T, cp, r);
            for (int b = 0; b < B; ++b)
                for (int t : k.tok) {
                    const size_t g = size_t(b) * T + t;
                    k.q.insert(k.q.end(), qkv.begin() + g * 3 * C, qkv.begin() + (g + 1) * 3 * C);
                    k.kv.insert(k.kv.end(), qkv.begin() + g * 3 * C + C,
                                qkv.begin() + (g + 1) * 3 * C);
                    k.dout.insert(k.dout.end(), dout.begin() + g * C, dout.begin() + (g + 1) * C);
                    k.pos.push_back(pos[g]);
                    k.index.push_back(t);
                    if (!doc.empty()) k.doc.push_back(doc[g]);
                }
            k.g_index = std::make_unique<DevInts>(k.index);
            if (!k.doc.empty()) k.g_doc = std::make_unique<DevInts>(k.doc);
            k.g_pos = std::make_unique<Dev>(k.pos);
            k.g_q = std::make_unique<Dev>(k.q);
            k.g_kv = std::make_unique<Dev>(k.kv);
            k.g_dout = std::make_unique<Dev>(k.dout);
        }
    }

    // The entries of a whole-row (B, H, T, T) table for queries of block r, keys of block s.
    FVec pair_table(const FVec& full, int r, int s) const {
        FVec t(size_t(B) * H * Tl * Tl);
        for (int bh = 0; bh < B * H; ++bh)
            for (int i = 0; i < Tl; ++i)
                for (int j = 0; j < Tl; ++j)
                    t[(size_t(bh) * Tl + i) * Tl + j] =
                        full[(size_t(bh) * T + blk[r].tok[i]) * T + blk[s].tok[j]];
        return t;
    }
};

// Bias parameters on both backends: host values for the CPU, device copies (or the host values
// themselves, host_slopes) for the GPU.
struct Bias {
    FVec a, b;
    std::unique_ptr<Dev> ga, gb;
    Bias(const BlockCase& bc, ref::Rng& rng) {
        const BiasData d = make_bias_data(rng, bc.kind, 1, bc.H, 1, 8);
        a = d.a;
        b = d.b;
        if (!a.empty()) ga = std::make_unique<Dev>(a);
        if (!b.empty()) gb = std::make_unique<Dev>(b);
    }
    AttentionOptions options(const BlockCase& bc, bool gpu_side) const {
        AttentionOptions o;
        o.window = bc.window;
        o.bias.kind = bc.kind;
        o.bias.num_buckets = 8;
        o.bias.max_distance = bc.max_distance;
        const bool host = !gpu_side || bc.host_slopes;
        if (!a.empty()) o.bias.a = host ? a.data() : ga->get();
        if (!b.empty()) o.bias.b = host ? b.data() : gb->get();
        return o;
    }
};

class OpsGpuAttentionBlock : public ::testing::TestWithParam<BlockCase> {};

TEST_P(OpsGpuAttentionBlock, EveryPairOfBlocksMatchesCpu) {
    REQUIRE_GPU();
    const BlockCase& bc = GetParam();
    ref::Rng rng(101 + bc.D + 7 * bc.cp + int(bc.kind));
    Row row(bc, rng);
    const Bias bias(bc, rng);
    const int B = row.B, C = row.C, H = row.H, cp = row.cp, Tl = row.Tl;
    const bool table = bc.kind == BiasKind::Table;
    // per pair (r, s): a random (B, H, Tl, Tl) table
    std::vector<FVec> tables(size_t(cp) * cp);
    for (FVec& t : tables) t = table ? randn(rng, size_t(B) * H * Tl * Tl) : FVec{};

    // ---- forward of every pair and the merge, rank by rank; the CPU's merged out and lse feed
    // the backward below
    std::vector<FVec> out(cp), lse(cp);
    for (int r = 0; r < cp; ++r) {
        out[r].assign(size_t(B) * Tl * C, 0.0f);
        lse[r].assign(size_t(B) * H * Tl, kNegInf);
        for (int s = 0; s < cp; ++s) {
            const std::string at = bc.name + " q" + std::to_string(r) + " k" + std::to_string(s);
            AttentionOptions oc = bias.options(bc, false), og = bias.options(bc, true);
            std::unique_ptr<Dev> gtable;
            if (table) {
                gtable = std::make_unique<Dev>(tables[r * cp + s]);
                oc.bias.table = tables[r * cp + s].data();
                og.bias.table = gtable->get();
            }
            FVec ob(size_t(B) * Tl * C, 7.0f), lb(size_t(B) * H * Tl, 3.0f);
            Dev gob(ob), glb(lb);  // stale contents: the op writes every entry
            cpu().attention_block_forward(ob.data(), lb.data(), row.blk[r].q.data(),
                                          row.blk[s].kv.data(), row.blk[r].cpu_rows(),
                                          row.blk[s].cpu_rows(), B, C, H, oc);
            gpu().attention_block_forward(gob.get(), glb.get(), row.blk[r].g_q->get(),
                                          row.blk[s].g_kv->get(), row.blk[r].gpu_rows(),
                                          row.blk[s].gpu_rows(), B, C, H, og);
            expect_close(gob.host(), ob, at + " out_b");
            expect_close(glb.host(), lb, at + " lse_b");
            // the merge, from the same state on both
            Dev gout(out[r]), glse(lse[r]), gob_c(ob), glb_c(lb);
            cpu().attention_block_merge(out[r].data(), lse[r].data(), ob.data(), lb.data(), B, Tl,
                                        C, H);
            gpu().attention_block_merge(gout.get(), glse.get(), gob_c.get(), glb_c.get(), B, Tl,
                                        C, H);
            expect_close(gout.host(), out[r], at + " merged out");
            expect_close(glse.host(), lse[r], at + " merged lse");
        }
    }
    // the zigzag pairs must have produced queries without a visible key in some block
    if (cp > 1 && bc.window == 0) {
        bool none_visible = false;
        FVec lb(size_t(B) * H * Tl), ob(size_t(B) * Tl * C);
        AttentionOptions oc = bias.options(bc, false);
        oc.bias.table = table ? tables[1].data() : nullptr;
        cpu().attention_block_forward(ob.data(), lb.data(), row.blk[0].q.data(),
                                      row.blk[1].kv.data(), row.blk[0].cpu_rows(),
                                      row.blk[1].cpu_rows(), B, C, H, oc);
        for (float x : lb) none_visible |= x == kNegInf;
        EXPECT_TRUE(none_visible) << "the case must hold queries with no visible key";
    }

    // ---- backward of every pair, gradients pre-filled with noise (the ops accumulate)
    for (int r = 0; r < cp; ++r)
        for (int s = 0; s < cp; ++s) {
            const std::string at = bc.name + " q" + std::to_string(r) + " k" + std::to_string(s);
            AttentionOptions oc = bias.options(bc, false), og = bias.options(bc, true);
            FVec dq = randn(rng, size_t(B) * Tl * 3 * C), dkv = randn(rng, size_t(B) * Tl * 2 * C);
            FVec da = randn(rng, bias.a.size(), 0.5), db = randn(rng, bias.b.size(), 0.5);
            FVec dtable = randn(rng, tables[r * cp + s].size());
            Dev gdq(dq), gdkv(dkv), gda(da), gdb(db), gdtable(dtable);
            Dev gtable(tables[r * cp + s]), gout(out[r]), glse(lse[r]);
            if (table) {
                oc.bias.table = tables[r * cp + s].data();
                oc.bias.dtable = dtable.data();
                og.bias.table = gtable.get();
                og.bias.dtable = gdtable.get();
            }
            if (!da.empty()) {
                oc.bias.da = da.data();
                og.bias.da = gda.get();
            }
            if (!db.empty()) {
                oc.bias.db = db.data();
                og.bias.db = gdb.get();
            }
            cpu().attention_block_backward(dq.data(), dkv.data(), row.blk[r].dout.data(),
                                           row.blk[r].q.data(), row.blk[s].kv.data(),
                                           out[r].data(), lse[r].data(), row.blk[r].cpu_rows(),
                                           row.blk[s].cpu_rows(), B, C, H, oc);
            gpu().attention_block_backward(gdq.get(), gdkv.get(), row.blk[r].g_dout->get(),
                                           row.blk[r].g_q->get(), row.blk[s].g_kv->get(),
                                           gout.get(), glse.get(), row.blk[r].gpu_rows(),
                                           row.blk[s].gpu_rows(), B, C, H, og);
            expect_close(gdq.host(), dq, at + " dq");
            expect_close(gdkv.host(), dkv, at + " dkv");
            expect_close(gda.host(), da, at + " da");
            expect_close(gdb.host(), db, at + " db");
            expect_close(gdtable.host(), dtable, at + " dtable");
        }
}

INSTANTIATE_TEST_SUITE_P(
    Families, OpsGpuAttentionBlock,
    ::testing::Values(
        BlockCase{"none_cp2", BiasKind::None, 0, false, 2, 19, 2, 2, 16, kContiguous},
        BlockCase{"none_cp3_packed_d8", BiasKind::None, 0, true, 3, 7, 2, 3, 8, kGaps},
        BlockCase{"alibi_cp2_host_slopes", BiasKind::Linear, 0, false, 2, 19, 2, 2, 8, kWide,
                  20, true},
        BlockCase{"alibi_cp2_window", BiasKind::Linear, 23, false, 2, 19, 2, 3, 8, kGaps},
        BlockCase{"kerple_log_cp2_packed", BiasKind::KerpleLog, 0, true, 2, 19, 2, 2, 16, kWide},
        BlockCase{"kerple_power_cp3_unsorted", BiasKind::KerplePower, 0, false, 3, 7, 2, 2, 8,
                  kUnsorted},
        BlockCase{"t5_cp2", BiasKind::T5, 0, false, 2, 19, 2, 2, 8, kGaps},
        BlockCase{"t5_cp3_window_direct_buckets", BiasKind::T5, 9, false, 3, 7, 2, 3, 8, kWide,
                  5000},
        BlockCase{"table_cp2", BiasKind::Table, 0, false, 2, 19, 2, 2, 8, kGaps},
        BlockCase{"table_cp3_packed_window", BiasKind::Table, 6, true, 3, 7, 2, 2, 16, kWide},
        // head dims across the 32-dim chunks of the products, and past the 128 dims of one
        // output pass (two passes)
        BlockCase{"alibi_cp2_d40_packed_window", BiasKind::Linear, 11, true, 2, 9, 2, 2, 40,
                  kGaps},
        BlockCase{"kerple_log_cp2_d136", BiasKind::KerpleLog, 0, false, 2, 5, 2, 1, 136, kWide},
        BlockCase{"t5_cp2_d136_window", BiasKind::T5, 4, false, 2, 5, 1, 2, 136, kGaps},
        // three query tiles per block, a window that leaves whole key tiles out
        BlockCase{"alibi_cp2_long_window", BiasKind::Linear, 7, false, 2, 40, 1, 1, 8, kGaps}),
    [](const auto& info) { return info.param.name; });

// ================================================================ the ring over a whole row

// Forward + merge over every block of a row, then every pair's backward, all on the GPU, put
// back in row order: the whole row's attention (flash mode: out and lse) on both backends.
TEST(OpsGpuAttentionBlockRing, BlocksOfARowEqualTheWholeRow) {
    REQUIRE_GPU();
    for (BiasKind kind : {BiasKind::Linear, BiasKind::T5, BiasKind::Table}) {
        const BlockCase bc{"ring", kind, kind == BiasKind::T5 ? 13 : 0, kind == BiasKind::Linear,
                           2, 18, 2, 2, 16, kGaps};
        SCOPED_TRACE(int(kind));
        ref::Rng rng(7 + int(kind));
        Row row(bc, rng);
        const Bias bias(bc, rng);
        const int B = row.B, T = row.T, C = row.C, H = row.H, cp = row.cp, Tl = row.Tl;
        const FVec full = kind == BiasKind::Table ? randn(rng, size_t(B) * H * T * T) : FVec{};
        const size_t na = bias.a.size(), nb = bias.b.size();

        // ---- the whole row on the CPU and on the GPU (flash: out, lse (B, H, T))
        AttentionOptions wc = bias.options(bc, false), wg = bias.options(bc, true);
        wc.mode = wg.mode = AttentionMode::Flash;
        std::unique_ptr<DevInts> gdoc;
        if (!row.doc.empty()) {
            gdoc = std::make_unique<DevInts>(row.doc);
            wc.doc_start = row.doc.data();
            wg.doc_start = gdoc->get();
        }
        FVec dtable_c(full.size(), 0.0f), da_c(na, 0.0f), db_c(nb, 0.0f);
        Dev gfull(full), gdtable_w(full.size()), gda_w(na), gdb_w(nb);
        if (kind == BiasKind::Table) {
            wc.bias.table = full.data();
            wc.bias.dtable = dtable_c.data();
            wg.bias.table = gfull.get();
            wg.bias.dtable = gdtable_w.get();
        }
        if (na) wc.bias.da = da_c.data(), wg.bias.da = gda_w.get();
        if (nb) wc.bias.db = db_c.data(), wg.bias.db = gdb_w.get();
        FVec out_c(size_t(B) * T * C), lse_c(size_t(B) * H * T), dqkv_c(row.qkv.size(), 0.0f);
        FVec scratch(cpu().attention_scratch_floats(B, T, C, H, AttentionMode::Flash));
        cpu().attention_forward(out_c.data(), lse_c.data(), row.qkv.data(), row.pos.data(), B, T,
                                C, H, wc);
        cpu().attention_backward(dqkv_c.data(), scratch.data(), row.dout.data(), row.qkv.data(),
                                 lse_c.data(), out_c.data(), row.pos.data(), B, T, C, H, wc);
        Dev gqkv(row.qkv), gpos(row.pos), gdout(row.dout), gout_w(out_c.size()),
            glse_w(lse_c.size()), gdqkv_w(dqkv_c.size());
        Dev gscratch(gpu().attention_scratch_floats(B, T, C, H, AttentionMode::Flash));
        gpu().attention_forward(gout_w.get(), glse_w.get(), gqkv.get(), gpos.get(), B, T, C, H,
                                wg);
        gpu().attention_backward(gdqkv_w.get(), gscratch.get(), gdout.get(), gqkv.get(),
                                 glse_w.get(), gout_w.get(), gpos.get(), B, T, C, H, wg);

        // ---- the ring on the GPU: rank r meets block (r - s) mod cp at step s
        FVec out(out_c.size()), lse(lse_c.size()), dqkv(dqkv_c.size()), dtable(full.size(), 0.0f);
        Dev gda(na), gdb(nb);
        std::vector<std::unique_ptr<Dev>> gdkv;
        for (int r = 0; r < cp; ++r) gdkv.push_back(std::make_unique<Dev>(size_t(B) * Tl * 2 * C));
        std::vector<std::unique_ptr<Dev>> gout, glse;
        for (int r = 0; r < cp; ++r) {
            gout.push_back(std::make_unique<Dev>(size_t(B) * Tl * C));
            glse.push_back(std::make_unique<Dev>(FVec(size_t(B) * H * Tl, kNegInf)));
            Dev gob(size_t(B) * Tl * C), glb(size_t(B) * H * Tl);
            for (int step = 0; step < cp; ++step) {
                const int s = (r - step + cp) % cp;
                AttentionOptions o = bias.options(bc, true);
                Dev gt(kind == BiasKind::Table ? row.pair_table(full, r, s) : FVec{});
                if (kind == BiasKind::Table) o.bias.table = gt.get();
                gpu().attention_block_forward(gob.get(), glb.get(), row.blk[r].g_q->get(),
                                              row.blk[s].g_kv->get(), row.blk[r].gpu_rows(),
                                              row.blk[s].gpu_rows(), B, C, H, o);
                gpu().attention_block_merge(gout[r]->get(), glse[r]->get(), gob.get(), glb.get(),
                                            B, Tl, C, H);
            }
        }
        for (int r = 0; r < cp; ++r) {
            Dev gdq(size_t(B) * Tl * 3 * C);
            for (int step = 0; step < cp; ++step) {
                const int s = (r - step + cp) % cp;
                AttentionOptions o = bias.options(bc, true);
                Dev gt(kind == BiasKind::Table ? row.pair_table(full, r, s) : FVec{});
                Dev gdt(size_t(B) * H * Tl * Tl);
                if (kind == BiasKind::Table) o.bias.table = gt.get(), o.bias.dtable = gdt.get();
                if (na) o.bias.da = gda.get();
                if (nb) o.bias.db = gdb.get();
                gpu().attention_block_backward(gdq.get(), gdkv[s]->get(), row.blk[r].g_dout->get(),
                                               row.blk[r].g_q->get(), row.blk[s].g_kv->get(),
                                               gout[r]->get(), glse[r]->get(),
                                               row.blk[r].gpu_rows(), row.blk[s].gpu_rows(), B, C,
                                               H, o);
                if (kind != BiasKind::Table) continue;
                const FVec dt = gdt.host();  // back into the whole row's (B, H, T, T)
                for (int bh = 0; bh < B * H; ++bh)
                    for (int i = 0; i < Tl; ++i)
                        for (int j = 0; j < Tl; ++j)
                            dtable[(size_t(bh) * T + row.blk[r].tok[i]) * T + row.blk[s].tok[j]] +=
                                dt[(size_t(bh) * Tl + i) * Tl + j];
            }
            const FVec o = gout[r]->host(), l = glse[r]->host(), g = gdq.host();
            for (int b = 0; b < B; ++b)
                for (int i = 0; i < Tl; ++i) {
                    const size_t w = size_t(b) * T + row.blk[r].tok[i], k = size_t(b) * Tl + i;
                    for (int c = 0; c < C; ++c) {
                        out[w * C + c] = o[k * C + c];
                        dqkv[w * 3 * C + c] = g[k * 3 * C + c];
                    }
                    for (int h = 0; h < H; ++h)
                        lse[(size_t(b) * H + h) * T + row.blk[r].tok[i]] =
                            l[(size_t(b) * H + h) * Tl + i];
                }
        }
        for (int s = 0; s < cp; ++s) {
            const FVec g = gdkv[s]->host();
            for (int b = 0; b < B; ++b)
                for (int j = 0; j < Tl; ++j) {
                    const size_t w = size_t(b) * T + row.blk[s].tok[j], k = size_t(b) * Tl + j;
                    for (int c = 0; c < 2 * C; ++c) dqkv[w * 3 * C + C + c] = g[k * 2 * C + c];
                }
        }
        // different algorithms (summation orders) for the same quantities: looser than the
        // op-for-op comparison above
        expect_close(out, out_c, "out vs CPU", 2e-5);
        expect_close(lse, lse_c, "lse vs CPU", 2e-5);
        expect_close(out, gout_w.host(), "out vs GPU flash", 2e-5);
        expect_close(lse, glse_w.host(), "lse vs GPU flash", 2e-5);
        expect_close(dqkv, dqkv_c, "dqkv vs CPU", 1e-4);
        expect_close(dqkv, gdqkv_w.host(), "dqkv vs GPU flash", 1e-4);
        expect_close(gda.host(), da_c, "da vs CPU", 1e-4);
        expect_close(gdb.host(), db_c, "db vs CPU", 1e-4);
        expect_close(dtable, dtable_c, "dtable vs CPU", 1e-4);
    }
}

// ================================================================ small cases and checks

TEST(OpsGpuAttentionBlockEdge, AQueryWithNoVisibleKeyGetsMinusInfinityAndMergesToNothing) {
    REQUIRE_GPU();
    const int B = 1, C = 4, H = 1;
    DevInts qi({1}), ki({5, 6});  // both keys after the query
    Dev qp(FVec{1.0f}), kp(FVec{5.0f, 6.0f});
    Dev q(FVec(3 * C, 1.0f)), kv(FVec(2 * 2 * C, 1.0f));
    Dev out(FVec(C, 7.0f)), lse(FVec{0.0f});
    const AttnBlockRows qr{1, qi.get(), qp.get(), nullptr}, kr{2, ki.get(), kp.get(), nullptr};
    gpu().attention_block_forward(out.get(), lse.get(), q.get(), kv.get(), qr, kr, B, C, H, {});
    EXPECT_EQ(lse.host()[0], kNegInf);
    EXPECT_EQ(out.host(), FVec(C, 0.0f));
    Dev acc(FVec(C, 0.5f)), acc_lse(FVec{0.25f});
    gpu().attention_block_merge(acc.get(), acc_lse.get(), out.get(), lse.get(), B, 1, C, H);
    EXPECT_EQ(acc.host(), FVec(C, 0.5f));
    EXPECT_EQ(acc_lse.host()[0], 0.25f);
    // backward through a block that saw nothing: no gradient anywhere
    Dev dq(FVec(3 * C, 1.0f)), dkv(FVec(2 * 2 * C, 2.0f)), dout(FVec(C, 1.0f));
    gpu().attention_block_backward(dq.get(), dkv.get(), dout.get(), q.get(), kv.get(), out.get(),
                                   lse.get(), qr, kr, B, C, H, {});
    EXPECT_EQ(dq.host(), FVec(3 * C, 1.0f));
    EXPECT_EQ(dkv.host(), FVec(2 * 2 * C, 2.0f));
}

TEST(OpsGpuAttentionBlockEdge, MergeMatchesCpuWithEmptyEntriesOnBothSides) {
    REQUIRE_GPU();
    const int B = 2, Tq = 37, C = 12, H = 3;
    ref::Rng rng(3);
    FVec out = randn(rng, size_t(B) * Tq * C), ob = randn(rng, out.size());
    FVec lse = randn(rng, size_t(B) * H * Tq, 2.0), lb = randn(rng, lse.size(), 2.0);
    for (size_t i = 0; i < lse.size(); i += 5) lse[i] = kNegInf;  // nothing merged yet
    for (size_t i = 0; i < lb.size(); i += 3) lb[i] = kNegInf;    // the block saw nothing
    Dev gout(out), glse(lse), gob(ob), glb(lb);
    cpu().attention_block_merge(out.data(), lse.data(), ob.data(), lb.data(), B, Tq, C, H);
    gpu().attention_block_merge(gout.get(), glse.get(), gob.get(), glb.get(), B, Tq, C, H);
    expect_close(gout.host(), out, "out");
    expect_close(glse.host(), lse, "lse");
}

TEST(OpsGpuAttentionBlockEdge, AnEmptyKeyBlockWritesNothingVisible) {
    REQUIRE_GPU();
    const int B = 2, C = 8, H = 2, Tq = 3;
    DevInts qi({0, 1, 2, 0, 1, 2}), ki({0});
    Dev qp(FVec{0, 1, 2, 0, 1, 2}), kp(FVec{0.0f});
    Dev q(FVec(size_t(B) * Tq * 3 * C, 1.0f)), kv(FVec(2 * C, 1.0f));
    Dev out(FVec(size_t(B) * Tq * C, 7.0f)), lse(FVec(size_t(B) * H * Tq, 1.0f));
    gpu().attention_block_forward(out.get(), lse.get(), q.get(), kv.get(),
                                  AttnBlockRows{Tq, qi.get(), qp.get(), nullptr},
                                  AttnBlockRows{0, ki.get(), kp.get(), nullptr}, B, C, H, {});
    EXPECT_EQ(out.host(), FVec(size_t(B) * Tq * C, 0.0f));
    EXPECT_EQ(lse.host(), FVec(size_t(B) * H * Tq, kNegInf));
}

TEST(OpsGpuAttentionBlockEdge, BadArgumentsAreRefused) {
    REQUIRE_GPU();
    const int B = 1, C = 8, H = 2;
    const std::vector<int32_t> host_index = {0, 1};
    const FVec host_pos = {0.0f, 1.0f};
    DevInts gi(host_index);
    Dev gp(host_pos), q(size_t(2) * 3 * C), kv(size_t(2) * 2 * C), out(size_t(2) * C),
        lse(size_t(2) * H);
    const AttnBlockRows dev_rows{2, gi.get(), gp.get(), nullptr};
    const AttnBlockRows host_rows{2, host_index.data(), host_pos.data(), nullptr};
    expect_error(
        [&] {
            gpu().attention_block_forward(out.get(), lse.get(), q.get(), kv.get(), host_rows,
                                          dev_rows, B, C, H, {});
        },
        {"attention_block_forward", "query block", "device memory"});
    expect_error(
        [&] {
            gpu().attention_block_backward(q.get(), kv.get(), out.get(), q.get(), kv.get(),
                                           out.get(), lse.get(), dev_rows, host_rows, B, C, H, {});
        },
        {"attention_block_backward", "key block", "device memory"});
    AttentionOptions table;
    table.bias.kind = BiasKind::Table;
    expect_error(
        [&] {
            gpu().attention_block_forward(out.get(), lse.get(), q.get(), kv.get(), dev_rows,
                                          dev_rows, B, C, H, table);
        },
        {"Table"});
    expect_error(
        [&] {
            gpu().attention_block_forward(out.get(), lse.get(), nullptr, kv.get(), dev_rows,
                                          dev_rows, B, C, H, {});
        },
        {"q, kv and both blocks' indices and positions are required"});
    expect_error([&] { gpu().attention_block_merge(out.get(), lse.get(), out.get(), lse.get(), B,
                                                   2, 9, H); },
                 {"not divisible"});
}

}  // namespace
