// The CPU attention op with an explicit bias table (BiasKind::Table, the generic PE path):
// forward and dqkv equal the in-kernel Linear family when the table holds the same ALiBi bias,
// entries the op must not read (above the diagonal, outside the window) are never read, and
// dtable equals central differences of a double-precision reference w.r.t. the table entries.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "op_reference.h"

namespace {

using ref::Vec;

ctx::Backend& cpu() {
    static std::unique_ptr<ctx::Backend> backend = ctx::make_cpu_backend(2);
    return *backend;
}

// Sorted positions with fractional offsets and gaps, per row.
std::vector<float> gap_positions(int B, int T) {
    std::vector<float> pos(size_t(B) * T);
    for (int b = 0; b < B; b++) {
        double p = 2.25 + 5 * b;
        for (int t = 0; t < T; t++) {
            pos[size_t(b) * T + t] = float(p);
            p += (t % 5 == 4) ? 3.5 : 1.0;
        }
    }
    return pos;
}

// Causal attention (window 0 = full) with logit(i, j) = q.k / sqrt(D) + table[b, h, i, j], in
// double, written from the op contract.
Vec table_attention(const Vec& qkv, const Vec& table, int B, int T, int C, int H, int window) {
    const int D = C / H;
    Vec out(size_t(B) * T * C, 0.0);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                const int lo = window > 0 ? std::max(0, i - window + 1) : 0;
                Vec logit(size_t(i) + 1);
                double mx = -INFINITY, sum = 0.0;
                for (int j = lo; j <= i; j++) {
                    double s = 0.0;
                    for (int d = 0; d < D; d++)
                        s += qkv[(size_t(b) * T + i) * 3 * C + size_t(h) * D + d] *
                             qkv[(size_t(b) * T + j) * 3 * C + C + size_t(h) * D + d];
                    logit[j] = s / std::sqrt(double(D)) +
                               table[((size_t(b) * H + h) * T + i) * T + j];
                    mx = std::max(mx, logit[j]);
                }
                for (int j = lo; j <= i; j++) sum += std::exp(logit[j] - mx);
                for (int j = lo; j <= i; j++) {
                    const double p = std::exp(logit[j] - mx) / sum;
                    for (int d = 0; d < D; d++)
                        out[(size_t(b) * T + i) * C + size_t(h) * D + d] +=
                            p * qkv[(size_t(b) * T + j) * 3 * C + 2 * C + size_t(h) * D + d];
                }
            }
    return out;
}

struct TableCase {
    int B, T, C, H, window;
};

class OpsCpuBiasTable : public ::testing::TestWithParam<TableCase> {};

// The table holds -m_h (p_i - p_j) on the entries the op reads and NaN everywhere else: the
// result must equal the Linear family with the same slopes, and no NaN may leak in.
TEST_P(OpsCpuBiasTable, EqualsLinearFamilyWithAlibiSlopes) {
    const TableCase tc = GetParam();
    const int B = tc.B, T = tc.T, C = tc.C, H = tc.H;
    ref::Rng rng(700 + T + tc.window);
    const std::vector<float> pos = gap_positions(B, T);
    const Vec slopes = ref::alibi_slopes(H);
    const auto slopes_f = ref::to_float(slopes);
    const auto qkv = ref::to_float(rng.normals(size_t(B) * T * 3 * C));
    const auto dout = ref::to_float(rng.normals(size_t(B) * T * C));
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> table(size_t(B) * H * T * T, nan);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                const int lo = tc.window > 0 ? std::max(0, i - tc.window + 1) : 0;
                for (int j = lo; j <= i; j++)
                    table[((size_t(b) * H + h) * T + i) * T + j] = float(
                        -slopes[h] * (double(pos[size_t(b) * T + i]) - pos[size_t(b) * T + j]));
            }

    ctx::AttentionOptions lin, tab;
    lin.window = tab.window = tc.window;
    lin.bias.kind = ctx::BiasKind::Linear;
    lin.bias.a = slopes_f.data();
    tab.bias.kind = ctx::BiasKind::Table;
    tab.bias.table = table.data();
    std::vector<float> dtable(table.size(), 0.0f);
    tab.bias.dtable = dtable.data();

    std::vector<float> out_l(size_t(B) * T * C), out_t(out_l.size());
    std::vector<float> att_l(size_t(B) * H * T * T), att_t(att_l.size());
    cpu().attention_forward(out_l.data(), att_l.data(), qkv.data(), pos.data(), B, T, C, H, lin);
    cpu().attention_forward(out_t.data(), att_t.data(), qkv.data(), pos.data(), B, T, C, H, tab);
    const Vec out_l_d = ref::to_double(out_l), att_l_d = ref::to_double(att_l);
    EXPECT_LT(ref::max_rel_error(out_t, out_l_d), 1e-5);
    EXPECT_LT(ref::max_rel_error(att_t, att_l_d), 1e-5);
    for (size_t i = 0; i < att_t.size(); i++) ASSERT_FALSE(std::isnan(att_t[i])) << i;

    std::vector<float> scratch(cpu().attention_scratch_floats(B, T, C, H, ctx::AttentionMode::Materialised));
    std::vector<float> dqkv_l(qkv.size(), 0.0f), dqkv_t(qkv.size(), 0.0f);
    cpu().attention_backward(dqkv_l.data(), scratch.data(), dout.data(), qkv.data(), att_l.data(), nullptr,
                             pos.data(), B, T, C, H, lin);
    cpu().attention_backward(dqkv_t.data(), scratch.data(), dout.data(), qkv.data(), att_t.data(), nullptr,
                             pos.data(), B, T, C, H, tab);
    EXPECT_LT(ref::max_rel_error(dqkv_t, ref::to_double(dqkv_l)), 1e-5);

    // dtable sums to the slope gradient: d/dm_h = sum_{b,i,j} dtable * -(p_i - p_j). The Linear
    // op gives the same number through da.
    std::vector<float> da(H, 0.0f);
    lin.bias.da = da.data();
    std::vector<float> dq2(qkv.size(), 0.0f);
    cpu().attention_backward(dq2.data(), scratch.data(), dout.data(), qkv.data(), att_l.data(), nullptr,
                             pos.data(), B, T, C, H, lin);
    for (int h = 0; h < H; h++) {
        double g = 0.0;
        for (int b = 0; b < B; b++)
            for (int i = 0; i < T; i++)
                for (int j = 0; j <= i; j++)
                    g -= double(dtable[((size_t(b) * H + h) * T + i) * T + j]) *
                         (double(pos[size_t(b) * T + i]) - pos[size_t(b) * T + j]);
        EXPECT_NEAR(g, da[h], 1e-4 * (1.0 + std::fabs(da[h]))) << "head " << h;
    }
    // Entries the op does not read get no gradient.
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++)
                for (int j = 0; j < T; j++) {
                    const int lo = tc.window > 0 ? std::max(0, i - tc.window + 1) : 0;
                    if (j < lo || j > i) {
                        ASSERT_EQ(dtable[((size_t(b) * H + h) * T + i) * T + j], 0.0f)
                            << b << "," << h << "," << i << "," << j;
                    }
                }
}

INSTANTIATE_TEST_SUITE_P(Cases, OpsCpuBiasTable,
                         ::testing::Values(TableCase{2, 9, 12, 3, 0}, TableCase{2, 75, 8, 4, 0},
                                           TableCase{1, 70, 8, 2, 6}, TableCase{3, 1, 6, 3, 0}),
                         [](const auto& info) {
                             const TableCase& c = info.param;
                             return "B" + std::to_string(c.B) + "_T" + std::to_string(c.T) +
                                    "_H" + std::to_string(c.H) + "_window" +
                                    std::to_string(c.window);
                         });

// dtable (accumulated onto pre-filled values) and dqkv against central differences of the double
// reference, with a random table, a window, and T past one query block (sampled entries).
TEST(OpsCpuBiasTableGradient, MatchesFiniteDifferences) {
    struct Case {
        int B, T, C, H, window, samples;
    };
    for (const Case cs : {Case{2, 7, 8, 2, 0, 0}, Case{1, 9, 6, 3, 4, 0}, Case{1, 68, 4, 2, 0, 40}}) {
        const int B = cs.B, T = cs.T, C = cs.C, H = cs.H;
        ref::Rng rng(900 + T);
        const std::vector<float> pos = gap_positions(B, T);
        const Vec qkv = rng.normals(size_t(B) * T * 3 * C);
        const Vec table = rng.normals(size_t(B) * H * T * T, 0.7);
        const Vec R = rng.normals(size_t(B) * T * C);
        const auto qkv_f = ref::to_float(qkv), table_f = ref::to_float(table), R_f = ref::to_float(R);
        const Vec dtable0 = rng.normals(table.size(), 0.3);
        auto dtable = ref::to_float(dtable0);

        ctx::AttentionOptions opt;
        opt.window = cs.window;
        opt.bias.kind = ctx::BiasKind::Table;
        opt.bias.table = table_f.data();
        opt.bias.dtable = dtable.data();
        std::vector<float> out(size_t(B) * T * C), att(size_t(B) * H * T * T);
        cpu().attention_forward(out.data(), att.data(), qkv_f.data(), pos.data(), B, T, C, H, opt);
        EXPECT_LT(ref::max_rel_error(out, table_attention(qkv, table, B, T, C, H, cs.window)), 2e-5);
        std::vector<float> dqkv(qkv.size(), 0.0f);
        std::vector<float> scratch(cpu().attention_scratch_floats(B, T, C, H, ctx::AttentionMode::Materialised));
        cpu().attention_backward(dqkv.data(), scratch.data(), R_f.data(), qkv_f.data(), att.data(), nullptr,
                                 pos.data(), B, T, C, H, opt);

        // The entries the op reads (sampled when there are many), and some it does not.
        std::vector<size_t> read, unread;
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int i = 0; i < T; i++)
                    for (int j = 0; j < T; j++) {
                        const int lo = cs.window > 0 ? std::max(0, i - cs.window + 1) : 0;
                        const size_t e = ((size_t(b) * H + h) * T + i) * T + j;
                        (j >= lo && j <= i ? read : unread).push_back(e);
                    }
        if (cs.samples > 0) {
            std::vector<size_t> pick;
            for (int s = 0; s < cs.samples; s++)
                pick.push_back(read[size_t(rng.integer(0, int(read.size()) - 1))]);
            read = pick;
        }
        auto loss_t = [&](const Vec& t) {
            return ref::dot(table_attention(qkv, t, B, T, C, H, cs.window), R);
        };
        const Vec g_table = ref::numeric_grad(loss_t, table, 1e-5, read);
        Vec got(table.size(), 0.0);
        for (size_t e = 0; e < table.size(); e++) got[e] = double(dtable[e]) - dtable0[e];
        EXPECT_LT(ref::max_rel_error(got, g_table, read), 3e-4) << "T " << T;
        for (size_t e : unread) ASSERT_EQ(dtable[e], float(dtable0[e])) << "unread entry " << e;

        std::vector<size_t> which;
        for (int s = 0; s < 30; s++) which.push_back(size_t(rng.integer(0, int(qkv.size()) - 1)));
        auto loss_q = [&](const Vec& x) {
            return ref::dot(table_attention(x, table, B, T, C, H, cs.window), R);
        };
        const Vec g_qkv = ref::numeric_grad(loss_q, qkv, 1e-5, which);
        EXPECT_LT(ref::max_rel_error(ref::to_double(dqkv), g_qkv, which), 3e-4) << "T " << T;
    }
}

TEST(OpsCpuBiasTableChecks, NullTableIsRefused) {
    std::vector<float> qkv(3 * 6), out(6), att(1), pos(1, 0.0f);
    ctx::AttentionOptions opt;
    opt.bias.kind = ctx::BiasKind::Table;
    try {
        cpu().attention_forward(out.data(), att.data(), qkv.data(), pos.data(), 1, 1, 6, 2, opt);
        FAIL() << "expected an error";
    } catch (const ctx::Error& e) {
        EXPECT_NE(std::string(e.what()).find("Table needs a (B, H, T, T) table"), std::string::npos)
            << e.what();
    }
    opt.bias.kind = static_cast<ctx::BiasKind>(9);
    std::vector<float> a(2);
    opt.bias.a = a.data();
    EXPECT_THROW(cpu().attention_forward(out.data(), att.data(), qkv.data(), pos.data(), 1, 1, 6, 2, opt),
                 ctx::Error);
}

}  // namespace
