// CPU backend rotary and attention ops against the double-precision references of op_reference.h:
// forwards directly, gradients (dqkv and the bias parameters a, b) by central differences of the
// reference with loss L = sum(out * R). Positions are per token floats: contiguous, with gaps and
// fractional offsets, spread wide (T5 buckets past max_distance), and unsorted.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <memory>
#include <numeric>
#include <ostream>
#include <string>
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

Vec added(const std::vector<float>& got, const Vec& base) {
    Vec d(got.size());
    for (size_t i = 0; i < got.size(); i++) d[i] = double(got[i]) - base[i];
    return d;
}

constexpr double kFwdTol = 2e-5;
constexpr double kGradTol = 3e-4;

enum PosStyle { kContiguous = 0, kGaps = 1, kWide = 2, kUnsorted = 3 };

std::vector<float> make_positions(ref::Rng& rng, int B, int T, PosStyle style) {
    std::vector<float> pos(size_t(B) * T);
    for (int b = 0; b < B; b++) {
        double p = style == kGaps ? 3.25 + 7 * b : 0.0;
        for (int t = 0; t < T; t++) {
            float& x = pos[size_t(b) * T + t];
            switch (style) {
                case kContiguous: x = float(t); break;
                case kGaps:  // steps of 1 and occasional jumps, quarter offsets
                    x = float(p);
                    p += (t % 4 == 3) ? 5.5 : 1.0;
                    break;
                case kWide:  // sorted, fractional, spanning several hundred
                    p += rng.uniform(0.0, 60.0 / T * 10.0);
                    x = float(p);
                    break;
                case kUnsorted: x = float(rng.uniform(0.0, 40.0)); break;
            }
        }
    }
    return pos;
}

// ================================================================ rotary

struct RotaryCase {
    std::string name;
    int B, T, C, H, dr;
    ctx::RotaryLayout layout;
    float position_scale, attention_factor;
    bool xpos;
    PosStyle pos;
};

void PrintTo(const RotaryCase& c, std::ostream* os) { *os << c.name; }

class OpsCpuRotary : public ::testing::TestWithParam<RotaryCase> {};

TEST_P(OpsCpuRotary, ForwardAndTranspose) {
    const RotaryCase& rc = GetParam();
    const int B = rc.B, T = rc.T, C = rc.C, H = rc.H;
    ref::Rng rng(100 + rc.dr + T);
    std::vector<float> positions = make_positions(rng, B, T, rc.pos);
    if (rc.name == "large_positions")
        for (auto& p : positions) p += 98765.5f;

    ref::Rotary r;
    r.dr = rc.dr;
    r.interleaved = rc.layout == ctx::RotaryLayout::Interleaved;
    for (int k = 0; k < rc.dr / 2; k++) {
        r.inv_freq.push_back(double(float(std::pow(10000.0, -2.0 * k / rc.dr))));
        if (rc.xpos) r.amp_base.push_back(double(float((2.0 * k / rc.dr + 0.4) / 1.4)));
    }
    r.position_scale = rc.position_scale;
    r.attention_factor = rc.attention_factor;
    r.amp_scale_base = 512.0;
    const auto inv_freq_f = ref::to_float(r.inv_freq), amp_f = ref::to_float(r.amp_base);
    ctx::RotarySpec spec;
    spec.rotary_dims = rc.dr;
    spec.layout = rc.layout;
    spec.inv_freq = inv_freq_f.data();
    spec.position_scale = rc.position_scale;
    spec.attention_factor = rc.attention_factor;
    spec.amp_base = rc.xpos ? amp_f.data() : nullptr;
    spec.amp_scale_base = 512.0f;

    const Vec qkv = rng.normals(size_t(B) * T * 3 * C);
    auto x = ref::to_float(qkv);
    cpu().rotary_forward(x.data(), positions.data(), B, T, C, H, spec);
    const Vec want = ref::rotary_forward(qkv, positions, B, T, C, H, r);
    // Angles of ~1e5 rad: float inputs are exact, the op works in double, so only the final
    // float rounding differs.
    EXPECT_LT(ref::max_rel_error(x, want), kFwdTol);
    for (size_t i = 0; i < qkv.size(); i++) {  // v and the pass-through dims are bit-exact
        const int c3 = int(i % (3 * C)), d = c3 % C % (C / H);
        if (c3 >= 2 * C || d >= rc.dr) {
            ASSERT_EQ(x[i], float(qkv[i])) << i;
        }
    }

    // Backward: the transpose of the forward map (the gradient of sum(rot(qkv) * R)).
    const Vec R = rng.normals(qkv.size());
    auto g = ref::to_float(R);
    cpu().rotary_backward(g.data(), positions.data(), B, T, C, H, spec);
    const Vec num = ref::numeric_grad(
        [&](const Vec& v) { return ref::dot(ref::rotary_forward(v, positions, B, T, C, H, r), R); },
        qkv, 1e-3);
    EXPECT_LT(ref::max_rel_error(g, num), kGradTol);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, OpsCpuRotary,
    ::testing::Values(
        RotaryCase{"half_full", 2, 5, 16, 2, 8, ctx::RotaryLayout::Half, 1.0f, 1.0f, false, kContiguous},
        RotaryCase{"interleaved_full", 2, 5, 16, 2, 8, ctx::RotaryLayout::Interleaved, 1.0f, 1.0f, false, kGaps},
        RotaryCase{"half_partial", 1, 7, 36, 3, 4, ctx::RotaryLayout::Half, 0.25f, 1.0f, false, kGaps},
        RotaryCase{"interleaved_partial", 3, 1, 30, 3, 6, ctx::RotaryLayout::Interleaved, 1.0f, 1.0f, false, kWide},
        RotaryCase{"half_yarn_factor", 2, 6, 24, 2, 12, ctx::RotaryLayout::Half, 0.5f, 1.1386f, false, kWide},
        RotaryCase{"half_xpos", 2, 6, 20, 2, 6, ctx::RotaryLayout::Half, 1.0f, 1.0f, true, kWide},
        RotaryCase{"interleaved_xpos_factor", 1, 9, 24, 3, 8, ctx::RotaryLayout::Interleaved, 1.0f, 1.2f, true, kUnsorted},
        RotaryCase{"large_positions", 1, 4, 16, 1, 16, ctx::RotaryLayout::Half, 1.0f, 1.0f, false, kContiguous},
        RotaryCase{"disabled", 1, 3, 8, 2, 0, ctx::RotaryLayout::Half, 1.0f, 1.0f, false, kContiguous}),
    [](const auto& info) { return info.param.name; });

// The backend keeps the rotation tables of the last positions and spec (RotaryCache). Changing
// either in place, behind the same pointers, must give what a fresh backend computes.
TEST(OpsCpuRotaryCache, PositionsAndSpecChangedInPlaceAreNoticed) {
    const int B = 2, T = 3, C = 8, H = 2, dr = 4;
    std::vector<float> positions = {0, 1, 2, 5, 6, 7}, inv_freq = {1.0f, 0.01f};
    ctx::RotarySpec spec;
    spec.rotary_dims = dr;
    spec.inv_freq = inv_freq.data();
    ref::Rng rng(7);
    const auto qkv = ref::to_float(rng.normals(size_t(B) * T * 3 * C));
    auto cached = ctx::make_cpu_backend(1);
    auto rotate = [&](ctx::Backend& be) {
        auto x = qkv;
        be.rotary_forward(x.data(), positions.data(), B, T, C, H, spec);
        return x;
    };
    auto fresh = [&] { return rotate(*ctx::make_cpu_backend(1)); };
    const auto first = rotate(*cached);
    EXPECT_EQ(rotate(*cached), first);  // from the tables
    positions[4] = 16.0f;               // one position, same pointer
    EXPECT_EQ(rotate(*cached), fresh());
    EXPECT_NE(rotate(*cached), first);
    inv_freq[1] = 0.5f;  // the spec's array, same pointer
    EXPECT_EQ(rotate(*cached), fresh());
    spec.position_scale = 0.25f;
    EXPECT_EQ(rotate(*cached), fresh());
    spec.attention_factor = 1.5f;
    EXPECT_EQ(rotate(*cached), fresh());
    // Backward after forward, on the same tables: the transpose undoes the (orthogonal) rotation.
    spec.attention_factor = 1.0f;
    auto x = rotate(*cached);
    cached->rotary_backward(x.data(), positions.data(), B, T, C, H, spec);
    for (size_t i = 0; i < x.size(); i++) EXPECT_NEAR(x[i], qkv[i], 1e-5f) << i;
}

TEST(OpsCpuRotaryChecks, RejectsBadRotaryDims) {
    std::vector<float> qkv(3 * 8), pos(1, 0.0f), inv(8, 1.0f);
    ctx::RotarySpec spec;
    spec.inv_freq = inv.data();
    spec.rotary_dims = 3;  // odd
    EXPECT_THROW(cpu().rotary_forward(qkv.data(), pos.data(), 1, 1, 8, 2, spec), ctx::Error);
    spec.rotary_dims = 6;  // > head_dim 4
    EXPECT_THROW(cpu().rotary_forward(qkv.data(), pos.data(), 1, 1, 8, 2, spec), ctx::Error);
}

// ================================================================ attention

struct AttnCase {
    std::string name;
    int B, T, C, H;
    ctx::BiasKind kind;
    int window;
    PosStyle pos;
    int num_buckets = 32, max_distance = 128;
    bool learn_params = true;  // da/db non-null
    int fd_samples = 0;        // 0: check every qkv coordinate; else this many random ones
    int docs = 0;              // packed rows: documents per row (doc_start); 0: one
};

void PrintTo(const AttnCase& c, std::ostream* os) { *os << c.name; }

// The reference bias and the float copies the op reads; da/db are pre-filled.
struct BiasSetup {
    ref::Bias ref;
    std::vector<float> a, b, da, db;
    Vec da0, db0;
    ctx::AttentionOptions opt;
};

BiasSetup make_bias(ref::Rng& rng, const AttnCase& ac) {
    BiasSetup s;
    const int H = ac.H;
    s.ref.kind = int(ac.kind);
    s.ref.num_buckets = ac.num_buckets;
    s.ref.max_distance = ac.max_distance;
    switch (ac.kind) {
        case ctx::BiasKind::None: break;
        case ctx::BiasKind::Table: break;  // covered by test_ops_cpu_bias_table
        case ctx::BiasKind::Linear: s.ref.a = rng.uniforms(H, 0.02, 0.3); break;
        case ctx::BiasKind::KerpleLog:
            s.ref.a = rng.uniforms(H, 0.2, 2.0);
            s.ref.b = rng.uniforms(H, 0.05, 1.0);
            break;
        case ctx::BiasKind::KerplePower:
            s.ref.a = rng.uniforms(H, 0.1, 1.0);
            s.ref.b = rng.uniforms(H, 0.2, 1.5);
            break;
        case ctx::BiasKind::T5: s.ref.a = rng.normals(size_t(H) * ac.num_buckets); break;
    }
    s.a = ref::to_float(s.ref.a);
    s.b = ref::to_float(s.ref.b);
    s.da0 = rng.normals(s.a.size(), 0.5);
    s.db0 = rng.normals(s.b.size(), 0.5);
    s.da = ref::to_float(s.da0);
    s.db = ref::to_float(s.db0);
    s.opt.window = ac.window;
    s.opt.bias.kind = ac.kind;
    s.opt.bias.a = s.a.empty() ? nullptr : s.a.data();
    s.opt.bias.b = s.b.empty() ? nullptr : s.b.data();
    if (ac.learn_params) {
        s.opt.bias.da = s.da.empty() ? nullptr : s.da.data();
        s.opt.bias.db = s.db.empty() ? nullptr : s.db.data();
    }
    s.opt.bias.num_buckets = ac.num_buckets;
    s.opt.bias.max_distance = ac.max_distance;
    return s;
}

class OpsCpuAttention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(OpsCpuAttention, ForwardAndGradients) {
    const AttnCase& ac = GetParam();
    const int B = ac.B, T = ac.T, C = ac.C, H = ac.H;
    ref::Rng rng(200 + T * 5 + C + int(ac.kind) * 17 + ac.window);
    const std::vector<float> positions = make_positions(rng, B, T, ac.pos);
    BiasSetup bs = make_bias(rng, ac);
    const Vec qkv = rng.normals(size_t(B) * T * 3 * C);
    const auto qkv_f = ref::to_float(qkv);
    const std::vector<int32_t> docs = ref::doc_starts(rng, B, T, ac.docs);
    const std::vector<int32_t>* doc_start = ac.docs > 0 ? &docs : nullptr;
    if (doc_start) bs.opt.doc_start = docs.data();

    // ---- forward: out and the saved probabilities (zeros above the diagonal / outside the window)
    std::vector<float> out(size_t(B) * T * C), att(size_t(B) * H * T * T, 7.0f);
    cpu().attention_forward(out.data(), att.data(), qkv_f.data(), positions.data(), B, T, C, H,
                            bs.opt);
    Vec want_att;
    const Vec want = ref::attention_forward(qkv, positions, B, T, C, H, bs.ref, ac.window, &want_att,
                                            doc_start);
    EXPECT_LT(ref::max_rel_error(out, want), kFwdTol);
    EXPECT_LT(ref::max_rel_error(att, want_att), kFwdTol);
    for (size_t i = 0; i < att.size(); i++)
        if (want_att[i] == 0.0) {
            ASSERT_EQ(att[i], 0.0f) << "masked entry " << i;
        }

    // ---- backward into pre-filled buffers
    const Vec R = rng.normals(out.size());
    const auto R_f = ref::to_float(R);
    const Vec dqkv0 = rng.normals(qkv.size(), 0.5);
    auto dqkv = ref::to_float(dqkv0);
    std::vector<float> scratch(cpu().attention_scratch_floats(B, T, C, H, ctx::AttentionMode::Materialised), 1e30f);
    cpu().attention_backward(dqkv.data(), scratch.data(), R_f.data(), qkv_f.data(), att.data(), nullptr,
                             positions.data(), B, T, C, H, bs.opt);

    auto loss = [&](const Vec& x, const ref::Bias& bias) {
        return ref::dot(
            ref::attention_forward(x, positions, B, T, C, H, bias, ac.window, nullptr, doc_start),
            R);
    };
    std::vector<size_t> which;
    if (ac.fd_samples > 0)
        for (int s = 0; s < ac.fd_samples; s++) which.push_back(size_t(rng.integer(0, int(qkv.size()) - 1)));
    const Vec g_qkv = ref::numeric_grad([&](const Vec& x) { return loss(x, bs.ref); }, qkv, 1e-4, which);
    EXPECT_LT(ref::max_rel_error(added(dqkv, dqkv0), g_qkv, which), kGradTol);

    if (!bs.a.empty()) {
        if (ac.learn_params) {
            const Vec g_a = ref::numeric_grad(
                [&](const Vec& x) { ref::Bias b2 = bs.ref; b2.a = x; return loss(qkv, b2); },
                bs.ref.a, 1e-5);
            EXPECT_LT(ref::max_rel_error(added(bs.da, bs.da0), g_a), kGradTol) << "da";
        } else {
            EXPECT_EQ(bs.da, ref::to_float(bs.da0));
        }
    }
    if (!bs.b.empty()) {
        if (ac.learn_params) {
            const Vec g_b = ref::numeric_grad(
                [&](const Vec& x) { ref::Bias b2 = bs.ref; b2.b = x; return loss(qkv, b2); },
                bs.ref.b, 1e-5);
            EXPECT_LT(ref::max_rel_error(added(bs.db, bs.db0), g_b), kGradTol) << "db";
        } else {
            EXPECT_EQ(bs.db, ref::to_float(bs.db0));
        }
    }
}

using ctx::BiasKind;
INSTANTIATE_TEST_SUITE_P(
    Cases, OpsCpuAttention,
    ::testing::Values(
        AttnCase{"none_T1", 2, 1, 8, 2, BiasKind::None, 0, kContiguous},
        AttnCase{"none_odd", 2, 9, 12, 3, BiasKind::None, 0, kGaps},
        AttnCase{"linear_contiguous", 2, 9, 12, 3, BiasKind::Linear, 0, kContiguous},
        AttnCase{"linear_gaps_window", 2, 11, 10, 5, BiasKind::Linear, 3, kGaps},
        AttnCase{"linear_unsorted", 1, 8, 12, 3, BiasKind::Linear, 0, kUnsorted},
        AttnCase{"linear_fixed_slopes", 2, 7, 12, 3, BiasKind::Linear, 0, kGaps, 32, 128, false},
        AttnCase{"kerple_log_gaps", 2, 9, 12, 3, BiasKind::KerpleLog, 0, kGaps},
        AttnCase{"kerple_log_unsorted_window", 1, 10, 12, 2, BiasKind::KerpleLog, 4, kUnsorted},
        AttnCase{"kerple_power_contiguous", 2, 8, 12, 3, BiasKind::KerplePower, 0, kContiguous},
        AttnCase{"kerple_power_wide", 2, 9, 14, 7, BiasKind::KerplePower, 0, kWide},
        AttnCase{"t5_wide", 2, 12, 12, 3, BiasKind::T5, 0, kWide},
        AttnCase{"t5_small_table_window", 2, 10, 12, 3, BiasKind::T5, 5, kGaps, 10, 20},
        AttnCase{"t5_unsorted_odd_buckets", 1, 9, 10, 5, BiasKind::T5, 0, kUnsorted, 7, 11},
        // T beyond one query block (64 rows): sampled finite differences.
        AttnCase{"linear_T150", 1, 150, 8, 2, BiasKind::Linear, 0, kGaps, 32, 128, true, 80},
        AttnCase{"t5_T130_window40", 2, 130, 6, 3, BiasKind::T5, 40, kWide, 32, 128, true, 60},
        AttnCase{"kerple_log_T100_window70", 1, 100, 8, 2, BiasKind::KerpleLog, 70, kGaps, 32, 128, true, 60},
        // Packed rows: attention never crosses a document boundary (with windows, every bias
        // family, and across query blocks).
        AttnCase{"none_packed", 2, 11, 12, 3, BiasKind::None, 0, kContiguous, 32, 128, true, 0, 3},
        AttnCase{"linear_packed_window", 2, 12, 10, 5, BiasKind::Linear, 4, kGaps, 32, 128, true, 0, 4},
        AttnCase{"t5_packed", 1, 10, 12, 3, BiasKind::T5, 0, kWide, 10, 20, true, 0, 2},
        AttnCase{"kerple_power_packed", 2, 9, 12, 3, BiasKind::KerplePower, 0, kGaps, 32, 128, true, 0, 3},
        AttnCase{"kerple_log_T150_packed_window", 2, 150, 8, 2, BiasKind::KerpleLog, 50, kGaps, 32, 128, true, 60, 5}),
    [](const auto& info) { return info.param.name; });

// ALiBi (METHODS.md 1.4) through the Linear family equals an explicit softmax of
// q.k/sqrt(D) - m_h (p_i - p_j), written out here without the reference attention.
TEST(OpsCpuAttentionAlibi, LinearBiasEqualsExplicitSoftmax) {
    for (int H : {8, 6}) {  // a power of two and not
        const int B = 2, T = 17, D = 4, C = H * D;
        ref::Rng rng(300 + H);
        const std::vector<float> positions = make_positions(rng, B, T, kGaps);
        const Vec slopes = ref::alibi_slopes(H);
        if (H == 8) {
            EXPECT_DOUBLE_EQ(slopes[0], 0.5);
            EXPECT_DOUBLE_EQ(slopes[7], 1.0 / 256);
        }
        ref::Bias bias;
        bias.kind = ref::kLinear;
        bias.a = slopes;
        const auto slopes_f = ref::to_float(slopes);
        const Vec qkv = rng.normals(size_t(B) * T * 3 * C);
        const auto qkv_f = ref::to_float(qkv);
        ctx::AttentionOptions opt;
        opt.bias.kind = ctx::BiasKind::Linear;
        opt.bias.a = slopes_f.data();
        std::vector<float> out(size_t(B) * T * C), att(size_t(B) * H * T * T);
        cpu().attention_forward(out.data(), att.data(), qkv_f.data(), positions.data(), B, T, C, H, opt);

        Vec want_out(out.size(), 0.0), want_att(att.size(), 0.0);
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int i = 0; i < T; i++) {
                    Vec logit(i + 1);
                    double mx = -1e300, sum = 0.0;
                    for (int j = 0; j <= i; j++) {
                        double s = 0.0;
                        for (int d = 0; d < D; d++)
                            s += qkv[(size_t(b) * T + i) * 3 * C + h * D + d] *
                                 qkv[(size_t(b) * T + j) * 3 * C + C + h * D + d];
                        const double dist = double(positions[b * T + i]) - double(positions[b * T + j]);
                        logit[j] = s / 2.0 + ref::bias_value(bias, h, dist);
                        EXPECT_DOUBLE_EQ(ref::bias_value(bias, h, dist), -slopes[h] * dist);
                        mx = std::max(mx, logit[j]);
                    }
                    for (int j = 0; j <= i; j++) sum += std::exp(logit[j] - mx);
                    for (int j = 0; j <= i; j++) {
                        const double p = std::exp(logit[j] - mx) / sum;
                        want_att[((size_t(b) * H + h) * T + i) * T + j] = p;
                        for (int d = 0; d < D; d++)
                            want_out[(size_t(b) * T + i) * C + h * D + d] +=
                                p * qkv[(size_t(b) * T + j) * 3 * C + 2 * C + h * D + d];
                    }
                }
        EXPECT_LT(ref::max_rel_error(att, want_att), kFwdTol) << "H " << H;
        EXPECT_LT(ref::max_rel_error(out, want_out), kFwdTol) << "H " << H;
    }
}

TEST(OpsCpuAttentionT5, BucketsFollowMethods) {
    // METHODS.md 1.6 with num_buckets 32, max_distance 128: exact below 16, log-spaced to 31.
    EXPECT_EQ(ref::t5_bucket(0.0, 32, 128), 0);
    EXPECT_EQ(ref::t5_bucket(-3.0, 32, 128), 0);
    EXPECT_EQ(ref::t5_bucket(0.99, 32, 128), 0);
    EXPECT_EQ(ref::t5_bucket(15.5, 32, 128), 15);
    EXPECT_EQ(ref::t5_bucket(16.0, 32, 128), 16);
    EXPECT_EQ(ref::t5_bucket(32.0, 32, 128), 21);  // 16 + floor(log(2)/log(8) * 16) = 16 + 5
    EXPECT_EQ(ref::t5_bucket(127.9, 32, 128), 31);
    EXPECT_EQ(ref::t5_bucket(1e6, 32, 128), 31);

    // The op agrees: one head, a table holding the bucket index, q = k = 0 so the logits are the
    // bias alone; the att row of the last query shows which buckets were used.
    const int T = 6, C = 2, H = 1;
    const std::vector<float> positions{0.0f, 0.5f, 100.0f, 120.25f, 160.0f, 161.75f};
    std::vector<float> table(32);
    std::iota(table.begin(), table.end(), 0.0f);
    for (auto& t : table) t *= -0.01f;
    std::vector<float> qkv(size_t(T) * 3 * C, 0.0f), out(size_t(T) * C), att(size_t(T) * T);
    ctx::AttentionOptions opt;
    opt.bias.kind = ctx::BiasKind::T5;
    opt.bias.a = table.data();
    cpu().attention_forward(out.data(), att.data(), qkv.data(), positions.data(), 1, T, C, H, opt);
    double sum = 0.0;
    Vec e(T);
    for (int j = 0; j < T; j++) {
        e[j] = std::exp(-0.01 * ref::t5_bucket(double(positions[T - 1]) - positions[j], 32, 128));
        sum += e[j];
    }
    for (int j = 0; j < T; j++) EXPECT_NEAR(att[size_t(T - 1) * T + j], e[j] / sum, 1e-6) << j;
}

TEST(OpsCpuAttentionChecks, RejectsBadArguments) {
    std::vector<float> qkv(3 * 6), out(6), att(1), pos(1, 0.0f), a(2 * 600);
    ctx::AttentionOptions opt;
    EXPECT_THROW(cpu().attention_forward(out.data(), att.data(), qkv.data(), pos.data(), 1, 1, 6, 4, opt),
                 ctx::Error);  // C % H
    opt.bias.kind = ctx::BiasKind::KerpleLog;
    opt.bias.a = a.data();  // b missing
    EXPECT_THROW(cpu().attention_forward(out.data(), att.data(), qkv.data(), pos.data(), 1, 1, 6, 2, opt),
                 ctx::Error);
    opt.bias.kind = ctx::BiasKind::T5;
    opt.bias.num_buckets = 600;  // too many buckets
    EXPECT_THROW(cpu().attention_forward(out.data(), att.data(), qkv.data(), pos.data(), 1, 1, 6, 2, opt),
                 ctx::Error);
}

// The bias-parameter gradients are reduced in a fixed order: the same with 1 and 3 threads.
TEST(OpsCpuAttentionThreads, BiasGradientsIndependentOfThreadCount) {
    const int B = 3, T = 70, C = 12, H = 3;
    ref::Rng rng(400);
    const std::vector<float> positions = make_positions(rng, B, T, kGaps);
    const auto qkv = ref::to_float(rng.normals(size_t(B) * T * 3 * C));
    const auto dout = ref::to_float(rng.normals(size_t(B) * T * C));
    const auto a = ref::to_float(rng.uniforms(H, 0.2, 1.0)), b = ref::to_float(rng.uniforms(H, 0.2, 1.0));
    std::vector<std::vector<float>> results;
    for (int threads : {1, 3}) {
        auto backend = ctx::make_cpu_backend(threads);
        ctx::AttentionOptions opt;
        opt.bias.kind = ctx::BiasKind::KerpleLog;
        opt.bias.a = a.data();
        opt.bias.b = b.data();
        std::vector<float> da(H, 0.0f), db(H, 0.0f);
        opt.bias.da = da.data();
        opt.bias.db = db.data();
        std::vector<float> out(size_t(B) * T * C), att(size_t(B) * H * T * T), dqkv(qkv.size(), 0.0f);
        std::vector<float> scratch(backend->attention_scratch_floats(B, T, C, H, ctx::AttentionMode::Materialised));
        backend->attention_forward(out.data(), att.data(), qkv.data(), positions.data(), B, T, C, H, opt);
        backend->attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), nullptr,
                                    positions.data(), B, T, C, H, opt);
        da.insert(da.end(), db.begin(), db.end());
        da.insert(da.end(), dqkv.begin(), dqkv.end());
        results.push_back(da);
    }
    ctx::make_cpu_backend(2);  // restore the thread count the other tests use
    EXPECT_EQ(results[0], results[1]);
}

}  // namespace
