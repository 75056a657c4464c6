// Rotary position embedding inside the bf16 tensor-core flash kernels (AttentionOptions::rotary,
// Backend::attention_fuses_rotary): the forward rotates q and k as it packs them, the backward's
// dq and dk epilogues rotate back before they store.
//
// Reference: the same backend's separate path on the same data, rotary_forward on qkv, the
// attention ops, rotary_backward on dqkv (itself checked against the CPU backend in
// test_ops_gpu_consistency and test_ops_gpu_flash). Both paths share the rounding-explicit
// rotation (cuda_rotary.cuh: the same fp32 products, the same order) and the same attention
// kernels, so out, lse, dqkv and the bias-parameter gradients must be equal bit for bit: any
// wrong sign, pair, frequency, scale or layout in the fused code shows as a differing entry. With
// Accumulate only the new terms are rotated: dqkv0 + (the Overwrite result), bit for bit. The
// fused forward leaves qkv as it was (the separate path rotates it in place). And the switch:
// fused where the kernels can (bf16, flash, split backward, pairs a thread holds whole), refused
// with a message elsewhere, CTX_FLASH_ROTARY=separate turning it off.
//
// Skipped without a CUDA device; under engine/backend/cuda/emu/run_emulated_tests.py the kernels
// run on the CPU emulation of CUDA.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "gpu_test_support.h"

namespace {

using ctx::AttentionMode;
using ctx::GradStore;
using ctx::RotaryLayout;

#define REQUIRE_GPU()                                                                          \
    do {                                                                                       \
        if (!have_gpu())                                                                       \
            GTEST_SKIP() << "no CUDA device visible: the fused rotary attention tests need a " \
                            "GPU";                                                             \
    } while (0)

struct RotCase {
    std::string name;
    int B, T, H, D, dr;
    RotaryLayout layout;
    float position_scale, attention_factor;
    bool xpos;
    ctx::BiasKind kind;
    int window;
    PosStyle pos;
};
void PrintTo(const RotCase& c, std::ostream* os) { *os << c.name; }

TestRotation rotation(const RotCase& rc) {
    return TestRotation(rc.dr, rc.layout, rc.position_scale, rc.attention_factor, rc.xpos);
}

struct Inputs {
    FVec qkv, positions, dout, dqkv0;
    BiasData bd;
};

Inputs make_inputs(const RotCase& rc, uint64_t seed) {
    ref::Rng rng(seed);
    const size_t BT = size_t(rc.B) * rc.T, C = size_t(rc.H) * rc.D;
    Inputs in;
    in.qkv = randn(rng, BT * 3 * C);
    in.positions = make_positions(rng, rc.B, rc.T, rc.pos);
    in.dout = randn(rng, BT * C);
    in.dqkv0 = randn(rng, BT * 3 * C);
    in.bd = make_bias_data(rng, rc.kind, rc.B, rc.H, rc.T, 32);
    return in;
}

enum class Rotary { None, Separate, Fused };

struct Result {
    FVec out, lse, dqkv, da, db, qkv_after;
};

// One forward + backward in flash mode on fresh device copies of `in`: Separate as the model
// calls the ops where the backend does not fuse (rotary_forward on qkv in place, the attention
// ops, rotary_backward on dqkv), Fused with AttentionOptions::rotary. bf16_out: the bf16-output
// ops (attention_forward_bf16 / attention_backward_bf16, the model's path), out read back as fp32.
Result run(const RotCase& rc, const Inputs& in, const ctx::RotarySpec& spec, Rotary rotary,
           bool bf16_out, GradStore store, ctx::Backend& be = gpu_bf16()) {
    const int B = rc.B, T = rc.T, H = rc.H, C = rc.H * rc.D;
    const AttentionMode mode = AttentionMode::Flash;
    Dev qkv(in.qkv, be), pos(in.positions, be), dout(in.dout, be), dqkv(in.dqkv0, be);
    Dev a(in.bd.a, be), b(in.bd.b, be), da(in.bd.da, be), db(in.bd.db, be);
    Dev saved(be.attention_saved_floats(mode, B, T, C, H), be),
        scratch(be.attention_scratch_floats(B, T, C, H, mode), be);
    ctx::AttentionOptions o;
    o.mode = mode;
    o.window = rc.window;
    o.dqkv_store = store;
    o.bias.kind = rc.kind;
    if (rc.kind != ctx::BiasKind::None) {
        o.bias.a = a.get();
        o.bias.da = da.get();
        if (!in.bd.b.empty()) {
            o.bias.b = b.get();
            o.bias.db = db.get();
        }
    }
    if (rotary == Rotary::Fused) o.rotary = &spec;
    if (rotary == Rotary::Separate) be.rotary_forward(qkv.get(), pos.get(), B, T, C, H, spec);
    Result r;
    if (bf16_out) {
        Dev16 out(size_t(B) * T * C, be);
        be.attention_forward_bf16(out.get(), saved.get(), qkv.get(), pos.get(), B, T, C, H, o);
        be.attention_backward_bf16(dqkv.get(), scratch.get(), dout.get(), qkv.get(), saved.get(),
                                   out.get(), pos.get(), B, T, C, H, o);
        r.out = out.host();
    } else {
        Dev out(size_t(B) * T * C, be);
        be.attention_forward(out.get(), saved.get(), qkv.get(), pos.get(), B, T, C, H, o);
        be.attention_backward(dqkv.get(), scratch.get(), dout.get(), qkv.get(), saved.get(),
                              out.get(), pos.get(), B, T, C, H, o);
        r.out = out.host();
    }
    if (rotary == Rotary::Separate) be.rotary_backward(dqkv.get(), pos.get(), B, T, C, H, spec);
    r.lse = saved.host(size_t(B) * H * T);
    r.dqkv = dqkv.host();
    r.da = da.host();
    r.db = db.host();
    r.qkv_after = qkv.host();
    return r;
}

void expect_same_results(const Result& got, const Result& want, const std::string& what) {
    expect_same_bits(got.out, want.out, (what + ": out").c_str());
    expect_same_bits(got.lse, want.lse, (what + ": lse").c_str());
    expect_same_bits(got.dqkv, want.dqkv, (what + ": dqkv").c_str());
    expect_same_bits(got.da, want.da, (what + ": da").c_str());
    expect_same_bits(got.db, want.db, (what + ": db").c_str());
}

class OpsGpuFlashRotary : public ::testing::TestWithParam<RotCase> {};

TEST_P(OpsGpuFlashRotary, FusedGivesTheSeparateOpsBitForBit) {
    REQUIRE_GPU();
    const RotCase& rc = GetParam();
    const TestRotation rot = rotation(rc);
    ASSERT_TRUE(
        gpu_bf16().attention_fuses_rotary(AttentionMode::Flash, rc.H * rc.D, rc.H, rot.spec));
    const Inputs in = make_inputs(rc, 900 + rc.T + rc.D + rc.dr);
    for (const bool bf16_out : {false, true}) {
        const std::string what = bf16_out ? "bf16 out" : "fp32 out";
        const Result sep = run(rc, in, rot.spec, Rotary::Separate, bf16_out, GradStore::Overwrite);
        const Result fused = run(rc, in, rot.spec, Rotary::Fused, bf16_out, GradStore::Overwrite);
        expect_same_results(fused, sep, what);
        expect_same_bits(fused.qkv_after, in.qkv, (what + ": qkv left as it was").c_str());
        // the rotation did something: without it the outputs are other values
        const Result plain = run(rc, in, rot.spec, Rotary::None, bf16_out, GradStore::Overwrite);
        EXPECT_GT(rel_err(plain.out, sep.out), 1e-3) << what;
        EXPECT_GT(rel_err(plain.dqkv, sep.dqkv), 1e-3) << what;
    }
}

TEST_P(OpsGpuFlashRotary, AccumulateAddsTheRotatedTermsOnly) {
    REQUIRE_GPU();
    const RotCase& rc = GetParam();
    const TestRotation rot = rotation(rc);
    const Inputs in = make_inputs(rc, 1700 + rc.T + rc.D + rc.dr);
    const Result over = run(rc, in, rot.spec, Rotary::Fused, true, GradStore::Overwrite);
    const Result acc = run(rc, in, rot.spec, Rotary::Fused, true, GradStore::Accumulate);
    FVec want(in.dqkv0.size());
    for (size_t i = 0; i < want.size(); i++) want[i] = in.dqkv0[i] + over.dqkv[i];
    expect_same_bits(acc.dqkv, want, "dqkv0 + the Overwrite result");
    expect_same_bits(acc.out, over.out, "out");
    expect_same_bits(acc.da, over.da, "da");
}

// The wgmma kernels (forward, dq, dk / dv: gpu_bf16_wgmma_all) rotate as the mma.sync ones: fused
// against the separate ops on that backend, bit for bit (the dq and dk epilogues rotate back;
// the forward's operands are rotated by the shared packing), with Accumulate adding the rotated
// new terms only, and the results within the bf16 band
// of the mma.sync kernels' (the same terms summed by another instruction; the bf16 outputs that
// dvec is taken from may differ by an ulp). Cases the wgmma
// kernels do not serve (head dim 80) run the mma.sync kernels.
TEST_P(OpsGpuFlashRotary, WgmmaKernelsFuseLikeTheSeparateOps) {
    REQUIRE_GPU();
    const RotCase& rc = GetParam();
    const TestRotation rot = rotation(rc);
    ctx::Backend& wg = gpu_bf16_wgmma_all();
    ASSERT_TRUE(wg.attention_fuses_rotary(AttentionMode::Flash, rc.H * rc.D, rc.H, rot.spec));
    const Inputs in = make_inputs(rc, 2300 + rc.T + rc.D + rc.dr);
    const Result sep = run(rc, in, rot.spec, Rotary::Separate, true, GradStore::Overwrite, wg);
    const Result fused = run(rc, in, rot.spec, Rotary::Fused, true, GradStore::Overwrite, wg);
    expect_same_results(fused, sep, "wgmma kernels");
    // Accumulate: only the new terms rotated, as AccumulateAddsTheRotatedTermsOnly
    const Result acc = run(rc, in, rot.spec, Rotary::Fused, true, GradStore::Accumulate, wg);
    FVec want(in.dqkv0.size());
    for (size_t i = 0; i < want.size(); i++) want[i] = in.dqkv0[i] + fused.dqkv[i];
    expect_same_bits(acc.dqkv, want, "wgmma kernels: dqkv0 + the Overwrite result");
    const Result mma = run(rc, in, rot.spec, Rotary::Fused, true, GradStore::Overwrite);
    EXPECT_LT(rel_err(fused.out, mma.out), 1e-2);  // bf16 outputs: an ulp apart at most
    EXPECT_LT(rel_err(fused.dqkv, mma.dqkv), 1e-2);
}

// Head dims 64 (GPT-2-size / Pythia: rotary on a quarter), 80 (Pythia-1.4B's head dim is 128,
// Phi's 80: the general-family kernels), 128 (Llama); both layouts; YaRN's attention factor and
// xPos amplitudes; the bias PEs the kernels fuse; windows; T past one 128-query block; positions
// with gaps (chunk sampling), wide fractional and unsorted.
INSTANTIATE_TEST_SUITE_P(
    Cases, OpsGpuFlashRotary,
    ::testing::Values(
        RotCase{"d64_half_full", 2, 150, 2, 64, 64, RotaryLayout::Half, 1.0f, 1.0f, false,
                ctx::BiasKind::None, 0, kGaps},
        RotCase{"d64_half_quarter_alibi_window", 1, 150, 2, 64, 16, RotaryLayout::Half, 1.0f, 1.0f,
                false, ctx::BiasKind::Linear, 40, kIntGaps},
        RotCase{"d64_interleaved_pairs4_xpos", 1, 70, 2, 64, 8, RotaryLayout::Interleaved, 1.0f,
                1.2f, true, ctx::BiasKind::None, 0, kUnsorted},
        RotCase{"d64_half_yarn_xpos", 2, 77, 2, 64, 32, RotaryLayout::Half, 0.5f, 1.1386f, true,
                ctx::BiasKind::None, 0, kWide},
        RotCase{"d80_interleaved_kerple", 1, 133, 2, 80, 32, RotaryLayout::Interleaved, 0.25f, 1.0f,
                false, ctx::BiasKind::KerpleLog, 0, kWide},
        RotCase{"d128_half_full_window", 1, 130, 2, 128, 128, RotaryLayout::Half, 1.0f, 1.0f, false,
                ctx::BiasKind::None, 64, kContiguous}),
    [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------- where it fuses, and refusals

TEST(OpsGpuFlashRotaryChecks, FusesOnTheBf16SplitKernelsOnly) {
    REQUIRE_GPU();
    const int H = 2;
    auto spec_of = [](int dr, RotaryLayout layout, FVec& inv) {
        inv.assign(std::max(dr / 2, 1), 0.5f);
        ctx::RotarySpec s;
        s.rotary_dims = dr;
        s.layout = layout;
        s.inv_freq = inv.data();
        return s;
    };
    FVec inv;
    const AttentionMode flash = AttentionMode::Flash;
    ctx::Backend& bf = gpu_bf16();
    EXPECT_TRUE(bf.attention_fuses_rotary(flash, 128, H, spec_of(64, RotaryLayout::Half, inv)));
    EXPECT_TRUE(bf.attention_fuses_rotary(flash, 128, H, spec_of(16, RotaryLayout::Half, inv)));
    EXPECT_TRUE(bf.attention_fuses_rotary(flash, 256, H, spec_of(128, RotaryLayout::Half, inv)));
    EXPECT_TRUE(
        bf.attention_fuses_rotary(flash, 128, H, spec_of(8, RotaryLayout::Interleaved, inv)));
    EXPECT_TRUE(
        bf.attention_fuses_rotary(flash, 160, H, spec_of(80, RotaryLayout::Interleaved, inv)));
    // Half with dr / 2 not a multiple of 8: a pair's halves are in different threads' columns
    EXPECT_FALSE(bf.attention_fuses_rotary(flash, 128, H, spec_of(8, RotaryLayout::Half, inv)));
    EXPECT_FALSE(bf.attention_fuses_rotary(flash, 128, H, spec_of(24, RotaryLayout::Half, inv)));
    EXPECT_FALSE(bf.attention_fuses_rotary(flash, 128, H, spec_of(0, RotaryLayout::Half, inv)));
    EXPECT_TRUE(bf.attention_fuses_rotary(flash, 160, H, spec_of(80, RotaryLayout::Half, inv)));
    EXPECT_FALSE(bf.attention_fuses_rotary(flash, 160, H, spec_of(40, RotaryLayout::Half, inv)));
    EXPECT_FALSE(bf.attention_fuses_rotary(flash, 128, H, spec_of(80, RotaryLayout::Half, inv)))
        << "rotary dims past the head dim";
    EXPECT_FALSE(bf.attention_fuses_rotary(flash, 2 * 256, H, spec_of(64, RotaryLayout::Half, inv)))
        << "head dim 256 is past the flash kernels";
    EXPECT_FALSE(bf.attention_fuses_rotary(AttentionMode::Materialised, 128, H,
                                           spec_of(64, RotaryLayout::Half, inv)));
    EXPECT_FALSE(gpu().attention_fuses_rotary(flash, 128, H, spec_of(64, RotaryLayout::Half, inv)))
        << "the fp32 flash kernels";
    EXPECT_FALSE(gpu_bf16_atomic_dq().attention_fuses_rotary(flash, 128, H,
                                                             spec_of(64, RotaryLayout::Half, inv)))
        << "the one-kernel backward";
    EXPECT_FALSE(cpu().attention_fuses_rotary(flash, 128, H, spec_of(64, RotaryLayout::Half, inv)));

    const std::unique_ptr<ctx::Backend> separate =
        make_bf16_backend_with("CTX_FLASH_ROTARY", "separate");
    EXPECT_FALSE(
        separate->attention_fuses_rotary(flash, 128, H, spec_of(64, RotaryLayout::Half, inv)));
    EXPECT_NE(separate->name().find("separate rotary"), std::string::npos) << separate->name();
    EXPECT_EQ(bf.name().find("rotary"), std::string::npos) << bf.name();
    expect_error([] { (void)make_bf16_backend_with("CTX_FLASH_ROTARY", "on"); },
                 {"CTX_FLASH_ROTARY", "on"});
}

TEST(OpsGpuFlashRotaryChecks, OpsThatDoNotFuseRefuseTheOption) {
    REQUIRE_GPU();
    const int B = 1, T = 8, H = 2, D = 64, C = H * D;
    FVec inv(D / 2, 0.5f);
    ctx::RotarySpec spec;
    spec.rotary_dims = 8;  // Half with 4 pairs: not fused
    spec.inv_freq = inv.data();
    ctx::AttentionOptions o;
    o.mode = AttentionMode::Flash;
    o.rotary = &spec;
    ctx::Backend& bf = gpu_bf16();
    Dev qkv(size_t(B) * T * 3 * C, bf), pos(FVec(T, 1.0f), bf), out(size_t(B) * T * C, bf);
    Dev saved(bf.attention_saved_floats(o.mode, B, T, C, H), bf);
    expect_error(
        [&] { bf.attention_forward(out.get(), saved.get(), qkv.get(), pos.get(), B, T, C, H, o); },
        {"attention_forward", "does not rotate q and k inside flash attention"});
    o.mode = AttentionMode::Materialised;
    spec.rotary_dims = 64;
    Dev att(bf.attention_saved_floats(o.mode, B, T, C, H), bf);
    expect_error(
        [&] { bf.attention_forward(out.get(), att.get(), qkv.get(), pos.get(), B, T, C, H, o); },
        {"AttentionOptions::rotary", "rotary_forward"});
    // the CPU backend: the same message before touching any data
    FVec hq(size_t(B) * T * 3 * C), hp(T), ho(size_t(B) * T * C),
        ha(ctx::attention_saved_floats(AttentionMode::Flash, B, T, H));
    o.mode = AttentionMode::Flash;
    expect_error(
        [&] { cpu().attention_forward(ho.data(), ha.data(), hq.data(), hp.data(), B, T, C, H, o); },
        {"AttentionOptions::rotary"});
    // a bad spec is named as the rotary ops name it
    spec.rotary_dims = 7;
    o.mode = AttentionMode::Flash;
    expect_error(
        [&] { bf.attention_forward(out.get(), saved.get(), qkv.get(), pos.get(), B, T, C, H, o); },
        {"rotary_dims 7"});
}

}  // namespace
