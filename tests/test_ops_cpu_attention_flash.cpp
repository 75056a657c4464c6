// The CPU backend's flash attention mode (AttentionMode::Flash: saves lse (B, H, T), backward
// recomputes the probabilities) against
//   - a naive double-precision attention written here from the backend.h contract (out and lse
//     for every case; gradients by central differences of it for the small cases), and
//   - the materialised mode on identical inputs (out and every gradient: dqkv, da, db, dtable),
// for every bias kind (learned and fixed parameters, Table with and without dtable, T5 through its
// lookup table and its direct formula), windows below, at and beyond T, T = 1 and odd T across
// query blocks, fractional and unsorted positions, head dims 16 / 64 / 80 / 128. Gradients are
// accumulated onto pre-filled buffers and compared as increments.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "op_reference.h"

namespace {

using ctx::AttentionMode;
using ctx::BiasKind;
using ref::Vec;

ctx::Backend& cpu() {
    static std::unique_ptr<ctx::Backend> backend = ctx::make_cpu_backend(2);
    return *backend;
}

constexpr double kFwdTol = 2e-5;   // float op vs double reference
constexpr double kModeTol = 1e-5;  // flash out vs materialised out
constexpr double kGradTol = 1e-4;  // gradients: flash vs materialised, vs central differences

enum PosStyle { kContiguous, kGaps, kWide, kUnsorted, kHuge };

std::vector<float> make_positions(ref::Rng& rng, int B, int T, PosStyle style) {
    std::vector<float> pos(size_t(B) * T);
    for (int b = 0; b < B; b++) {
        double p = style == kGaps ? 3.25 + 7 * b : 0.0;
        for (int t = 0; t < T; t++) {
            float& x = pos[size_t(b) * T + t];
            switch (style) {
                case kContiguous: x = float(t); break;
                case kGaps:  // unit steps with quarter-offset jumps
                    x = float(p);
                    p += (t % 4 == 3) ? 5.5 : 1.0;
                    break;
                case kWide:  // sorted, fractional, a few hundred wide
                    p += rng.uniform(0.0, 600.0 / T);
                    x = float(p);
                    break;
                case kUnsorted: x = float(rng.uniform(0.0, 40.0)); break;
                case kHuge:  // distances past T5's lookup table (max_distance > 4096)
                    p += rng.uniform(0.0, 400.0);
                    x = float(p);
                    break;
            }
        }
    }
    return pos;
}

struct FlashCase {
    std::string name;
    int B, T, C, H;
    BiasKind kind;
    int window;
    PosStyle pos;
    bool learn = true;  // da / db (dtable for Table) non-null
    int num_buckets = 32, max_distance = 128;
    bool fd = false;    // also check gradients against central differences of the double reference
    int docs = 0;       // packed rows: documents per row (doc_start); 0: one
};

void PrintTo(const FlashCase& c, std::ostream* os) { *os << c.name; }

// One case's inputs: the float data the ops read and its exact double copies.
struct Inputs {
    int B, T, C, H, window;
    BiasKind kind;
    ref::Bias fam;  // the in-kernel family for ref::bias_value (a, b in double)
    std::vector<float> pos, qkv, dout, a, b, table;
    Vec qkv_d, dout_d, table_d;
    std::vector<int32_t> doc_start;  // (B, T) packed rows, or empty
};

// First key query i of row b attends: the window's start, its document's first token.
inline int key_lo(const Inputs& in, int b, int i) {
    const int lo = in.window > 0 ? std::max(0, i - in.window + 1) : 0;
    return in.doc_start.empty() ? lo : std::max(lo, int(in.doc_start[size_t(b) * in.T + i]));
}

Inputs make_inputs(ref::Rng& rng, const FlashCase& fc) {
    Inputs in{fc.B, fc.T, fc.C, fc.H, fc.window, fc.kind, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
    const int B = fc.B, T = fc.T, H = fc.H;
    in.pos = make_positions(rng, B, T, fc.pos);
    if (fc.docs > 0) in.doc_start = ref::doc_starts(rng, B, T, fc.docs);
    in.fam.kind = fc.kind == BiasKind::Table ? ref::kNone : int(fc.kind);
    in.fam.num_buckets = fc.num_buckets;
    in.fam.max_distance = fc.max_distance;
    switch (fc.kind) {
        case BiasKind::Linear: in.fam.a = rng.uniforms(H, 0.02, 0.3); break;
        case BiasKind::KerpleLog:
            in.fam.a = rng.uniforms(H, 0.2, 2.0);
            in.fam.b = rng.uniforms(H, 0.05, 1.0);
            break;
        case BiasKind::KerplePower:
            in.fam.a = rng.uniforms(H, 0.1, 1.0);
            in.fam.b = rng.uniforms(H, 0.2, 1.5);
            break;
        case BiasKind::T5: in.fam.a = rng.normals(size_t(H) * fc.num_buckets); break;
        case BiasKind::Table: {
            // random on the entries the op reads, NaN on the others (they must never be read)
            in.table_d.assign(size_t(B) * H * T * T, std::numeric_limits<double>::quiet_NaN());
            for (int bh = 0; bh < B * H; bh++)
                for (int i = 0; i < T; i++)
                    for (int j = key_lo(in, bh / H, i); j <= i; j++)
                        in.table_d[(size_t(bh) * T + i) * T + j] = double(float(rng.normal(0.7)));
            in.table = ref::to_float(in.table_d);
            break;
        }
        case BiasKind::None: break;
    }
    in.a = ref::to_float(in.fam.a);
    in.b = ref::to_float(in.fam.b);
    in.qkv_d = rng.normals(size_t(B) * T * 3 * fc.C);
    in.dout_d = rng.normals(size_t(B) * T * fc.C);
    in.qkv = ref::to_float(in.qkv_d);
    in.dout = ref::to_float(in.dout_d);
    return in;
}

// Causal attention in double from the contract: logit(i, j) = q_i.k_j / sqrt(D) + bias, keys
// j in [max(0, i - window + 1), i]. Returns out (B, T, C); lse (B, H, T) when non-null.
Vec naive_attention(const Inputs& in, const Vec& qkv, const ref::Bias& fam, const Vec& table,
                    Vec* lse) {
    const int B = in.B, T = in.T, C = in.C, H = in.H, D = C / H;
    Vec out(size_t(B) * T * C, 0.0), logit(T);
    if (lse) lse->assign(size_t(B) * H * T, 0.0);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                const int lo = key_lo(in, b, i);
                double mx = -INFINITY;
                for (int j = lo; j <= i; j++) {
                    double s = 0.0;
                    for (int d = 0; d < D; d++)
                        s += qkv[(size_t(b) * T + i) * 3 * C + size_t(h) * D + d] *
                             qkv[(size_t(b) * T + j) * 3 * C + C + size_t(h) * D + d];
                    const double dist =
                        double(in.pos[size_t(b) * T + i]) - double(in.pos[size_t(b) * T + j]);
                    const double bias = in.kind == BiasKind::Table
                                            ? table[((size_t(b) * H + h) * T + i) * T + j]
                                            : ref::bias_value(fam, h, dist);
                    logit[j] = s / std::sqrt(double(D)) + bias;
                    mx = std::max(mx, logit[j]);
                }
                double sum = 0.0;
                for (int j = lo; j <= i; j++) sum += std::exp(logit[j] - mx);
                if (lse) (*lse)[(size_t(b) * H + h) * T + i] = mx + std::log(sum);
                for (int j = lo; j <= i; j++) {
                    const double p = std::exp(logit[j] - mx) / sum;
                    for (int d = 0; d < D; d++)
                        out[(size_t(b) * T + i) * C + size_t(h) * D + d] +=
                            p * qkv[(size_t(b) * T + j) * 3 * C + 2 * C + size_t(h) * D + d];
                }
            }
    return out;
}

// Pre-filled gradient buffers (every call starts from the same values).
struct Grads {
    std::vector<float> dqkv, da, db, dtable;
};

Grads make_prefill(ref::Rng& rng, const Inputs& in) {
    Grads g;
    g.dqkv = ref::to_float(rng.normals(in.qkv.size(), 0.5));
    g.da = ref::to_float(rng.normals(in.a.size(), 0.5));
    g.db = ref::to_float(rng.normals(in.b.size(), 0.5));
    g.dtable = ref::to_float(rng.normals(in.table.size(), 0.3));
    return g;
}

struct Result {
    std::vector<float> out, saved;
    Grads g;
};

// Forward + backward in `mode` on backend `be`, gradients accumulated onto a copy of `pre`.
Result run(ctx::Backend& be, const Inputs& in, const Grads& pre, AttentionMode mode, bool learn,
           int nb, int md) {
    const int B = in.B, T = in.T, C = in.C, H = in.H;
    Result r;
    r.g = pre;
    ctx::AttentionOptions opt;
    opt.mode = mode;
    opt.window = in.window;
    opt.doc_start = in.doc_start.empty() ? nullptr : in.doc_start.data();
    opt.bias.kind = in.kind;
    opt.bias.num_buckets = nb;
    opt.bias.max_distance = md;
    opt.bias.a = in.a.empty() ? nullptr : in.a.data();
    opt.bias.b = in.b.empty() ? nullptr : in.b.data();
    opt.bias.table = in.table.empty() ? nullptr : in.table.data();
    if (learn) {
        opt.bias.da = r.g.da.empty() ? nullptr : r.g.da.data();
        opt.bias.db = r.g.db.empty() ? nullptr : r.g.db.data();
        opt.bias.dtable = r.g.dtable.empty() ? nullptr : r.g.dtable.data();
    }
    r.out.assign(size_t(B) * T * C, 7.0f);
    r.saved.assign(ctx::attention_saved_floats(mode, B, T, H), 7.0f);
    be.attention_forward(r.out.data(), r.saved.data(), in.qkv.data(), in.pos.data(), B, T, C, H,
                         opt);
    std::vector<float> scratch(be.attention_scratch_floats(B, T, C, H, mode), 1e30f);
    // the materialised mode does not need out: pass null there, as the contract allows
    const float* out = mode == AttentionMode::Flash ? r.out.data() : nullptr;
    be.attention_backward(r.g.dqkv.data(), scratch.data(), in.dout.data(), in.qkv.data(),
                          r.saved.data(), out, in.pos.data(), B, T, C, H, opt);
    return r;
}

Vec increment(const std::vector<float>& got, const std::vector<float>& pre) {
    Vec d(got.size());
    for (size_t i = 0; i < got.size(); i++) d[i] = double(got[i]) - double(pre[i]);
    return d;
}

class OpsCpuAttentionFlash : public ::testing::TestWithParam<FlashCase> {};

TEST_P(OpsCpuAttentionFlash, MatchesReferenceAndMaterialised) {
    const FlashCase& fc = GetParam();
    ref::Rng rng(1000 + fc.T * 7 + fc.C + int(fc.kind) * 31 + fc.window);
    const Inputs in = make_inputs(rng, fc);
    const Grads pre = make_prefill(rng, in);
    const int nb = fc.num_buckets, md = fc.max_distance;
    const Result fl = run(cpu(), in, pre, AttentionMode::Flash, fc.learn, nb, md);
    const Result ma = run(cpu(), in, pre, AttentionMode::Materialised, fc.learn, nb, md);

    // ---- forward: out and lse against the double reference; out against materialised
    Vec want_lse;
    const Vec want = naive_attention(in, in.qkv_d, in.fam, in.table_d, &want_lse);
    EXPECT_LT(ref::max_rel_error(fl.out, want), kFwdTol);
    EXPECT_LT(ref::max_rel_error(fl.saved, want_lse), kFwdTol) << "lse";
    EXPECT_LT(ref::max_rel_error(fl.out, ref::to_double(ma.out)), kModeTol);

    // ---- gradient increments against the materialised mode
    EXPECT_LT(ref::max_rel_error(increment(fl.g.dqkv, pre.dqkv), increment(ma.g.dqkv, pre.dqkv)),
              kGradTol) << "dqkv";
    if (fc.learn) {
        if (!in.a.empty()) {
            EXPECT_LT(ref::max_rel_error(increment(fl.g.da, pre.da), increment(ma.g.da, pre.da)),
                      kGradTol) << "da";
        }
        if (fc.kind == BiasKind::KerpleLog || fc.kind == BiasKind::KerplePower) {
            EXPECT_LT(ref::max_rel_error(increment(fl.g.db, pre.db), increment(ma.g.db, pre.db)),
                      kGradTol) << "db";
        }
        if (fc.kind == BiasKind::Table) {
            EXPECT_LT(ref::max_rel_error(increment(fl.g.dtable, pre.dtable),
                                         increment(ma.g.dtable, pre.dtable)),
                      kGradTol) << "dtable";
        }
    }
    // Fixed parameters (null gradients) and unread table entries stay as they were.
    if (!fc.learn) {
        EXPECT_EQ(fl.g.da, pre.da);
        EXPECT_EQ(fl.g.db, pre.db);
        EXPECT_EQ(fl.g.dtable, pre.dtable);
    }
    if (fc.kind == BiasKind::Table) {
        for (size_t e = 0; e < in.table_d.size(); e++) {
            if (std::isnan(in.table_d[e])) {
                ASSERT_EQ(fl.g.dtable[e], pre.dtable[e]) << "unread entry " << e;
            }
        }
    }

    if (!fc.fd) return;
    // ---- gradient increments against central differences of the double reference, L = out . dout
    const std::vector<size_t> which = [&] {
        std::vector<size_t> w;
        for (int s = 0; s < 80; s++) w.push_back(size_t(rng.integer(0, int(in.qkv_d.size()) - 1)));
        return w;
    }();
    auto loss = [&](const Vec& qkv, const ref::Bias& fam, const Vec& table) {
        return ref::dot(naive_attention(in, qkv, fam, table, nullptr), in.dout_d);
    };
    const Vec g_qkv = ref::numeric_grad(
        [&](const Vec& x) { return loss(x, in.fam, in.table_d); }, in.qkv_d, 1e-5, which);
    EXPECT_LT(ref::max_rel_error(increment(fl.g.dqkv, pre.dqkv), g_qkv, which), kGradTol)
        << "dqkv vs central differences";
    if (fc.learn && !in.a.empty()) {
        const Vec g_a = ref::numeric_grad(
            [&](const Vec& x) {
                ref::Bias f = in.fam;
                f.a = x;
                return loss(in.qkv_d, f, in.table_d);
            },
            in.fam.a, 1e-6);
        EXPECT_LT(ref::max_rel_error(increment(fl.g.da, pre.da), g_a), kGradTol) << "da vs fd";
    }
    if (fc.learn && !in.b.empty()) {
        const Vec g_b = ref::numeric_grad(
            [&](const Vec& x) {
                ref::Bias f = in.fam;
                f.b = x;
                return loss(in.qkv_d, f, in.table_d);
            },
            in.fam.b, 1e-6);
        EXPECT_LT(ref::max_rel_error(increment(fl.g.db, pre.db), g_b), kGradTol) << "db vs fd";
    }
    if (fc.learn && fc.kind == BiasKind::Table) {
        std::vector<size_t> read;
        for (size_t e = 0; e < in.table_d.size(); e++)
            if (!std::isnan(in.table_d[e])) read.push_back(e);
        const Vec g_t = ref::numeric_grad(
            [&](const Vec& t) { return loss(in.qkv_d, in.fam, t); }, in.table_d, 1e-6, read);
        EXPECT_LT(ref::max_rel_error(increment(fl.g.dtable, pre.dtable), g_t, read), kGradTol)
            << "dtable vs fd";
    }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, OpsCpuAttentionFlash,
    ::testing::Values(
        // name, B, T, C, H, kind, window, positions, learn, num_buckets, max_distance, fd
        FlashCase{"none_T1", 2, 1, 8, 2, BiasKind::None, 0, kContiguous, true, 32, 128, true},
        FlashCase{"none_odd", 2, 9, 12, 3, BiasKind::None, 0, kGaps, true, 32, 128, true},
        FlashCase{"linear_gaps", 2, 9, 12, 3, BiasKind::Linear, 0, kGaps, true, 32, 128, true},
        FlashCase{"linear_fixed_unsorted", 1, 11, 12, 3, BiasKind::Linear, 0, kUnsorted, false},
        FlashCase{"kerple_log_gaps", 2, 10, 12, 2, BiasKind::KerpleLog, 0, kGaps, true, 32, 128, true},
        FlashCase{"kerple_log_fixed_window", 1, 12, 12, 3, BiasKind::KerpleLog, 4, kUnsorted, false},
        FlashCase{"kerple_power_wide", 2, 9, 14, 7, BiasKind::KerplePower, 0, kWide, true, 32, 128, true},
        FlashCase{"kerple_power_unsorted_window", 1, 13, 12, 3, BiasKind::KerplePower, 5, kUnsorted},
        FlashCase{"t5_wide", 2, 12, 12, 3, BiasKind::T5, 0, kWide, true, 32, 128, true},
        FlashCase{"t5_small_table_window", 2, 10, 12, 3, BiasKind::T5, 5, kGaps, true, 10, 20, true},
        FlashCase{"t5_direct_formula", 1, 40, 8, 2, BiasKind::T5, 0, kHuge, true, 64, 5000},
        FlashCase{"t5_fixed_unsorted", 1, 9, 10, 5, BiasKind::T5, 0, kUnsorted, false, 7, 11},
        FlashCase{"table", 2, 9, 12, 3, BiasKind::Table, 0, kGaps, true, 32, 128, true},
        FlashCase{"table_window", 1, 11, 8, 2, BiasKind::Table, 4, kGaps, true, 32, 128, true},
        // packed rows: documents mask like windows, with every family
        FlashCase{"none_packed", 2, 13, 12, 3, BiasKind::None, 0, kContiguous, true, 32, 128, true, 4},
        FlashCase{"linear_packed_window", 2, 12, 12, 3, BiasKind::Linear, 5, kGaps, true, 32, 128, true, 3},
        FlashCase{"t5_packed", 1, 11, 10, 5, BiasKind::T5, 0, kWide, true, 10, 20, true, 3},
        FlashCase{"table_packed", 2, 10, 8, 2, BiasKind::Table, 0, kGaps, true, 32, 128, true, 3},
        FlashCase{"kerple_log_T150_packed", 1, 150, 8, 2, BiasKind::KerpleLog, 0, kGaps, true, 32, 128, true, 6},
        FlashCase{"table_T70_window6", 1, 70, 8, 2, BiasKind::Table, 6, kGaps},
        FlashCase{"table_fixed_T67", 1, 67, 8, 2, BiasKind::Table, 0, kWide, false},
        // windows below, at and beyond T, past one query block (64 rows)
        FlashCase{"linear_T150_window40", 1, 150, 8, 2, BiasKind::Linear, 40, kGaps},
        FlashCase{"kerple_log_T70_window70", 2, 70, 12, 3, BiasKind::KerpleLog, 70, kWide},
        FlashCase{"t5_T70_window100", 2, 70, 12, 3, BiasKind::T5, 100, kWide},
        FlashCase{"kerple_power_T65_window1", 1, 65, 8, 2, BiasKind::KerplePower, 1, kGaps},
        // head dims 16, 64, 80, 128 with odd T across blocks
        FlashCase{"d16_linear_T131", 1, 131, 32, 2, BiasKind::Linear, 0, kGaps},
        FlashCase{"d64_kerple_log_T130", 1, 130, 128, 2, BiasKind::KerpleLog, 0, kWide},
        FlashCase{"d80_t5_T97", 1, 97, 160, 2, BiasKind::T5, 0, kWide},
        FlashCase{"d128_kerple_power_T129_unsorted", 1, 129, 256, 2, BiasKind::KerplePower, 0, kUnsorted},
        FlashCase{"d128_table_T66", 1, 66, 256, 2, BiasKind::Table, 0, kGaps},
        // longer context with a window (the use case: (B, H, T, T) would not be kept)
        FlashCase{"linear_T1000_window300", 1, 1000, 32, 2, BiasKind::Linear, 300, kGaps}),
    [](const auto& info) { return info.param.name; });

// Results do not depend on the thread count: every output of forward and backward is
// bit-identical with 1 and 2 threads.
TEST(OpsCpuAttentionFlashThreads, BitIdenticalAcrossThreadCounts) {
    for (BiasKind kind : {BiasKind::KerpleLog, BiasKind::T5, BiasKind::Table}) {
        const FlashCase fc{"threads", 3, 70, 12, 3, kind, 0, kGaps};
        ref::Rng rng(1500 + int(kind));
        const Inputs in = make_inputs(rng, fc);
        const Grads pre = make_prefill(rng, in);
        std::vector<Result> results;
        for (int threads : {1, 2}) {
            auto backend = ctx::make_cpu_backend(threads);
            results.push_back(run(*backend, in, pre, AttentionMode::Flash, true, 32, 128));
        }
        const Result &r1 = results[0], &r2 = results[1];
        EXPECT_EQ(r1.out, r2.out) << int(kind);
        EXPECT_EQ(r1.saved, r2.saved) << int(kind);
        EXPECT_EQ(r1.g.dqkv, r2.g.dqkv) << int(kind);
        EXPECT_EQ(r1.g.da, r2.g.da) << int(kind);
        EXPECT_EQ(r1.g.db, r2.g.db) << int(kind);
        EXPECT_EQ(r1.g.dtable, r2.g.dtable) << int(kind);
        EXPECT_NE(r1.g.dqkv, pre.dqkv);  // something was accumulated
    }
    ctx::make_cpu_backend(2);  // restore the thread count the other tests use
}

TEST(OpsCpuAttentionFlashModes, SupportedAutoAndScratchSize) {
    for (auto [C, H] : {std::pair{64, 4}, std::pair{640, 8}, std::pair{1024, 4}, std::pair{6, 3}}) {
        EXPECT_TRUE(cpu().attention_mode_supported(AttentionMode::Flash, C, H)) << C << "/" << H;
        EXPECT_TRUE(cpu().attention_mode_supported(AttentionMode::Materialised, C, H));
    }
    EXPECT_EQ(cpu().attention_mode_auto(2048, 512, 8), AttentionMode::Materialised);
    // Flash scratch grows as T (per-thread block buffers + bias slots), far below one (T, T).
    const int B = 2, C = 512, H = 8;
    const size_t s1 = cpu().attention_scratch_floats(B, 4096, C, H, AttentionMode::Flash);
    const size_t s2 = cpu().attention_scratch_floats(B, 8192, C, H, AttentionMode::Flash);
    EXPECT_LT(s2, size_t(8192) * 8192 / 16);
    const size_t fixed = size_t(B) * H * 512;  // the bias-gradient slots do not grow with T
    EXPECT_LE(s2 - fixed, 2 * (s1 - fixed) + 64);
    EXPECT_EQ(ctx::attention_saved_floats(AttentionMode::Flash, B, 8192, H), size_t(B) * H * 8192);
}

// Flash backward needs the forward's output and lse, forward its lse buffer: nulls are refused
// with a clear error, as is an unknown mode.
TEST(OpsCpuAttentionFlashChecks, RefusesNullOutAndLse) {
    const int B = 1, T = 5, C = 8, H = 2;
    ref::Rng rng(1600);
    const auto qkv = ref::to_float(rng.normals(size_t(B) * T * 3 * C));
    const auto dout = ref::to_float(rng.normals(size_t(B) * T * C));
    std::vector<float> pos(T), out(size_t(B) * T * C), lse(size_t(B) * H * T), dqkv(qkv.size());
    for (int t = 0; t < T; t++) pos[t] = float(t);
    ctx::AttentionOptions opt;
    opt.mode = AttentionMode::Flash;
    std::vector<float> scratch(cpu().attention_scratch_floats(B, T, C, H, AttentionMode::Flash));
    cpu().attention_forward(out.data(), lse.data(), qkv.data(), pos.data(), B, T, C, H, opt);
    try {
        cpu().attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), lse.data(),
                                 nullptr, pos.data(), B, T, C, H, opt);
        FAIL() << "expected an error";
    } catch (const ctx::Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("flash mode"), std::string::npos) << msg;
        EXPECT_NE(msg.find("output `out`"), std::string::npos) << msg;
    }
    EXPECT_THROW(cpu().attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(),
                                          nullptr, out.data(), pos.data(), B, T, C, H, opt),
                 ctx::Error);  // no saved lse
    EXPECT_EQ(dqkv, std::vector<float>(qkv.size(), 0.0f));  // refused before touching anything
    EXPECT_THROW(cpu().attention_forward(out.data(), nullptr, qkv.data(), pos.data(), B, T, C, H,
                                         opt),
                 ctx::Error);
    opt.mode = static_cast<AttentionMode>(5);
    EXPECT_THROW(cpu().attention_forward(out.data(), lse.data(), qkv.data(), pos.data(), B, T, C,
                                         H, opt),
                 ctx::Error);
}

}  // namespace
