// Flash attention on the CUDA backend: attention_forward / attention_backward with
// AttentionOptions::mode = Flash (the fused tiled kernels of backend/cuda/cuda_flash.cu) against
// the CPU backend's materialised attention and the CUDA backend's own materialised mode, on the
// same random inputs: every bias kind with learned and fixed parameters (host ALiBi slopes),
// windows shorter than, equal to and longer than a tile, T = 1 and odd T (not multiples of the
// 32-row tile), contiguous / gapped / wide / unsorted fractional and gapped integer positions
// (KERPLE-log's tables against its computed terms), head dims 6 to 128,
// T5 with the lookup table, the direct bucket formula and 512 buckets, the Table bias with
// dtable; the saved log-sum-exp against a double-precision reference; the accumulate semantics;
// bit-identical repeated runs (no atomics); the bf16 backend's tensor-core kernels on every case
// against the CPU on bf16-rounded operands, and their one-kernel backward (atomic dq) against
// the two-kernel one and the CPU; the wgmma kernels (sm_90) against the CPU, the mma.sync
// kernels and each other. The mode contract and the kernel switches: test_ops_gpu_flash_checks.cpp.
//
// Only the Backend interface is used, so this compiles in every build; every test skips
// (GTEST_SKIP) when no CUDA device is visible, including builds without CUDA. Label "gpu".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "flash_gpu_support.h"
#include "gpu_test_support.h"
#include "op_reference.h"

namespace {

using ctx::AttentionMode;

class OpsGpuFlash : public ::testing::TestWithParam<FlashCase> {};

TEST_P(OpsGpuFlash, ForwardBackwardMatchCpuAndMaterialised) {
    REQUIRE_GPU();
    const FlashCase& fc = GetParam();
    const int B = fc.B, T = fc.T, C = fc.C, H = fc.H;
    ASSERT_TRUE(gpu().attention_mode_supported(AttentionMode::Flash, C, H));
    ref::Rng rng(2000 + T * 13 + C + int(fc.kind));
    const FVec positions = make_positions(rng, B, T, fc.pos);
    const FVec qkv = randn(rng, size_t(B) * T * 3 * C);
    const BiasData bd = make_bias_data(rng, fc.kind, fc.B, fc.H, fc.T, fc.num_buckets);
    const FVec dout = randn(rng, size_t(B) * T * C);
    const FVec dqkv0 = randn(rng, qkv.size());  // pre-filled: backward accumulates

    // CPU reference (materialised)
    BiasData cb = bd;
    const std::vector<int32_t> docs = case_docs(fc);
    const ctx::AttentionOptions copt =
        options(fc, cb, nullptr, AttentionMode::Materialised, &docs);
    FVec out(size_t(B) * T * C), att(size_t(B) * H * T * T), dqkv = dqkv0;
    cpu().attention_forward(out.data(), att.data(), qkv.data(), positions.data(), B, T, C, H,
                            copt);
    FVec cscratch(cpu().attention_scratch_floats(B, T, C, H, AttentionMode::Materialised));
    cpu().attention_backward(dqkv.data(), cscratch.data(), dout.data(), qkv.data(), att.data(),
                             nullptr, positions.data(), B, T, C, H, copt);

    const GpuRun m = run_gpu(fc, AttentionMode::Materialised, positions, qkv, bd, dout, dqkv0,
                             fc.learn);
    const GpuRun f = run_gpu(fc, AttentionMode::Flash, positions, qkv, bd, dout, dqkv0, fc.learn);

    EXPECT_CLOSE(f.out, out, kFwdTol);
    EXPECT_CLOSE(f.out, m.out, kFwdTol);
    EXPECT_CLOSE(m.out, out, kFwdTol);
    EXPECT_CLOSE(f.dqkv, dqkv, kGradTol);
    EXPECT_CLOSE(f.dqkv, m.dqkv, kGradTol);
    // empty vectors (no such parameter) compare equal trivially
    EXPECT_CLOSE(f.da, cb.da, kGradTol);
    EXPECT_CLOSE(f.db, cb.db, kGradTol);
    EXPECT_CLOSE(f.dtable, cb.dtable, kGradTol);
    EXPECT_CLOSE(f.da, m.da, kGradTol);
    EXPECT_CLOSE(f.db, m.db, kGradTol);
    EXPECT_CLOSE(f.dtable, m.dtable, kGradTol);
    // flash saves the log-sum-exp (B, H, T), the materialised mode the probabilities
    ASSERT_EQ(f.saved.size(), size_t(B) * H * T);
    for (float x : f.saved) ASSERT_TRUE(std::isfinite(x));
    EXPECT_CLOSE(f.saved, reference_lse(fc, qkv, positions, bd), kFwdTol);
    EXPECT_CLOSE(m.saved, att, kFwdTol);
    if (!fc.learn) {  // fixed parameters: nothing written
        EXPECT_EQ(f.da, bd.da);
        EXPECT_EQ(f.db, bd.db);
        EXPECT_EQ(f.dtable, bd.dtable);
    }
}

TEST_P(OpsGpuFlash, Bf16TensorCoresMatchCpuOnRoundedOperands) {
    REQUIRE_GPU();
    const FlashCase& fc = GetParam();
    const Bf16Case k = bf16_case(fc, 3000 + fc.T * 7 + fc.C + int(fc.kind));
    const GpuRun f = run_gpu(fc, AttentionMode::Flash, k.positions, k.qkv, k.bd, k.dout, k.dqkv0,
                             fc.learn, gpu_bf16());
    EXPECT_CLOSE(f.out, k.out, kBf16Tol);
    EXPECT_CLOSE(f.saved, reference_lse(fc, k.qkv, k.positions, k.bd), kFwdTol);  // fp32 stats
    expect_bf16_grads_match_cpu(f, k, fc.learn);
    if (fc.T > 1) {  // the probabilities were rounded: not the fp32 kernels' result
        const GpuRun f32 = run_gpu(fc, AttentionMode::Flash, k.positions, k.qkv, k.bd, k.dout,
                                   k.dqkv0, fc.learn);
        EXPECT_GT(rel_err(f.out, f32.out), 1e-6);
    }
}

// The forward on wgmma (CTX_FLASH_FORWARD=wgmma; cuda_flash_wg_sm90a.cu) in a whole forward and
// backward: every case against the CPU on the rounded operands, as the mma.sync forward is in
// Bf16TensorCoresMatchCpuOnRoundedOperands (the backward reads its lse and output), and its
// output within the bf16 band of that forward's (the products' sums run in another order).
// Cases it does not serve (head dims 32 and 80, T5, tables; a GPU other than sm_90) take the
// mma.sync forward and pass the same checks.
TEST_P(OpsGpuFlash, Bf16WgmmaForwardMatchesCpu) {
    REQUIRE_GPU();
    const FlashCase& fc = GetParam();
    const Bf16Case k = bf16_case(fc, 3000 + fc.T * 7 + fc.C + int(fc.kind));
    const GpuRun wg = run_gpu(fc, AttentionMode::Flash, k.positions, k.qkv, k.bd, k.dout, k.dqkv0,
                              fc.learn, gpu_bf16_wgmma_forward());
    EXPECT_CLOSE(wg.out, k.out, kBf16Tol);
    EXPECT_CLOSE(wg.saved, reference_lse(fc, k.qkv, k.positions, k.bd), kFwdTol);
    expect_bf16_grads_match_cpu(wg, k, fc.learn);
    const GpuRun mma = run_gpu(fc, AttentionMode::Flash, k.positions, k.qkv, k.bd, k.dout, k.dqkv0,
                               fc.learn, gpu_bf16());
    EXPECT_CLOSE(wg.out, mma.out, kBf16Tol);
}

// The wgmma kernels with a producer warpgroup (CTX_FLASH_WGMMA_PIPELINE=producer;
// cuda_flash_wg_producer_sm90a.cu), with two computing warpgroups and with one: the consumers
// run the lock-step kernels' arithmetic on the same tiles in the same order, so out, lse and
// dqkv are the lock-step kernels' bits (all three wgmma kernels in both backends); and out
// against the CPU. Cases the wgmma kernels do not serve take the mma.sync kernels in both
// backends and pass alike.
// The producer kernels, with two computing warpgroups and with one, their tiles by cp.async and
// by TMA, against the lock-step kernels' run of the same case: every output bit
// for bit.
void expect_producer_gives_lockstep_bits(const FlashCase& fc, const Bf16Case& k,
                                         const GpuRun& lockstep) {
    for (const int warpgroups : {2, 1})
        for (const bool tma : {false, true}) {
            SCOPED_TRACE(warpgroups == 2 ? "two computing warpgroups" : "one computing warpgroup");
            SCOPED_TRACE(tma ? "tiles by TMA" : "tiles by cp.async");
            const GpuRun wg = run_gpu(fc, AttentionMode::Flash, k.positions, k.qkv, k.bd, k.dout,
                                      k.dqkv0, fc.learn, gpu_bf16_wgmma_producer(warpgroups, tma));
            EXPECT_EQ(wg.out, lockstep.out);
            EXPECT_EQ(wg.saved, lockstep.saved);
            EXPECT_TRUE(wg.dqkv == lockstep.dqkv) << "dqkv differs";
            EXPECT_EQ(wg.da, lockstep.da);
            EXPECT_EQ(wg.db, lockstep.db);
        }
}

TEST_P(OpsGpuFlash, Bf16WgmmaProducerGivesLockstepBits) {
    REQUIRE_GPU();
    const FlashCase& fc = GetParam();
    const Bf16Case k = bf16_case(fc, 3000 + fc.T * 7 + fc.C + int(fc.kind));
    const GpuRun lockstep = run_gpu(fc, AttentionMode::Flash, k.positions, k.qkv, k.bd, k.dout,
                                    k.dqkv0, fc.learn, gpu_bf16_wgmma_all());
    EXPECT_CLOSE(lockstep.out, k.out, kBf16Tol);
    expect_producer_gives_lockstep_bits(fc, k, lockstep);
}

// The dq kernel on wgmma (CTX_FLASH_DQ=wgmma; cuda_flash_wg_sm90a.cu): every case against the
// CPU on the rounded operands, and against the mma.sync dq kernel: the forward, dk and dv are the
// same kernels (same bits), dq the same terms summed in another order (within 1e-5 of its
// largest entry), and the bias-parameter gradients (ALiBi, KERPLE-log learned) the same terms
// summed per warpgroup (within 1e-4: sums that cancel). Cases it does not serve (tables, T5,
// KERPLE-power, head dims 32 and 80, a GPU other than sm_90) take the mma.sync dq kernel and
// pass the same checks.
TEST_P(OpsGpuFlash, Bf16WgmmaDqMatchesCpu) {
    REQUIRE_GPU();
    const FlashCase& fc = GetParam();
    const int C = fc.C;
    const Bf16Case k = bf16_case(fc, 3000 + fc.T * 7 + fc.C + int(fc.kind));
    const GpuRun wg = run_gpu(fc, AttentionMode::Flash, k.positions, k.qkv, k.bd, k.dout, k.dqkv0,
                              fc.learn, gpu_bf16_wgmma_dq());
    EXPECT_CLOSE(wg.out, k.out, kBf16Tol);
    expect_bf16_grads_match_cpu(wg, k, fc.learn);
    const GpuRun mma = run_gpu(fc, AttentionMode::Flash, k.positions, k.qkv, k.bd, k.dout, k.dqkv0,
                               fc.learn, gpu_bf16());
    EXPECT_EQ(wg.out, mma.out);
    EXPECT_TRUE(dqkv_cols(wg.dqkv, C, C, 2 * C) == dqkv_cols(mma.dqkv, C, C, 2 * C))
        << "dk, dv differ";
    expect_dq_and_bias_grads_close(wg, mma, k, C);
}

// The dk / dv kernel on wgmma (CTX_FLASH_DKV=wgmma; cuda_flash_wg_sm90a.cu): every case against
// the CPU on the rounded operands, and against the mma.sync dk / dv kernel: the forward and dq are
// the same kernels (same bits), dk and dv the same terms (P and dS are computed alike) summed by
// another instruction (within 1e-5 of the largest entry). The bias-parameter gradients come from
// the dq kernel (same bits). Cases it does not serve (head dims 32 and 80, T5, tables,
// KERPLE-power; a GPU other than sm_90) take the mma.sync kernel and pass the same checks.
TEST_P(OpsGpuFlash, Bf16WgmmaDkvMatchesCpu) {
    REQUIRE_GPU();
    const FlashCase& fc = GetParam();
    const int C = fc.C;
    const Bf16Case k = bf16_case(fc, 3000 + fc.T * 7 + fc.C + int(fc.kind));
    const GpuRun wg = run_gpu(fc, AttentionMode::Flash, k.positions, k.qkv, k.bd, k.dout, k.dqkv0,
                              fc.learn, gpu_bf16_wgmma_dkv());
    EXPECT_CLOSE(wg.out, k.out, kBf16Tol);
    expect_bf16_grads_match_cpu(wg, k, fc.learn);
    const GpuRun mma = run_gpu(fc, AttentionMode::Flash, k.positions, k.qkv, k.bd, k.dout, k.dqkv0,
                               fc.learn, gpu_bf16());
    EXPECT_EQ(wg.out, mma.out);
    EXPECT_TRUE(dqkv_cols(wg.dqkv, C, 0, C) == dqkv_cols(mma.dqkv, C, 0, C)) << "dq differs";
    EXPECT_EQ(wg.da, mma.da);
    EXPECT_EQ(wg.db, mma.db);
    EXPECT_EQ(wg.dtable, mma.dtable);
    for (const int c0 : {C, 2 * C}) {  // dk, dv
        const FVec x0 = dqkv_cols(k.dqkv0, C, c0, C);
        EXPECT_CLOSE(minus(dqkv_cols(wg.dqkv, C, c0, C), x0),
                     minus(dqkv_cols(mma.dqkv, C, c0, C), x0), 1e-5)
            << (c0 == C ? "dk" : "dv");
    }
}

// The wgmma kernels in blocks of one warpgroup (CTX_FLASH_WGMMA_WARPGROUPS=1) against blocks of
// two (the default), all three kernels on wgmma: the same bits everywhere. A row (a key, for dk /
// dv) meets the same tiles in the same order either way: a tile the two-warpgroup block loads
// past a warpgroup's own range is one none of its rows (keys) meets, which it skips. And the
// two-warpgroup kernels against the CPU on the rounded operands.
TEST_P(OpsGpuFlash, Bf16WgmmaOneWarpgroupGivesTwoWarpgroupsBits) {
    REQUIRE_GPU();
    const FlashCase& fc = GetParam();
    const Bf16Case k = bf16_case(fc, 7000 + fc.T * 5 + fc.C + int(fc.kind));
    const GpuRun two = run_gpu(fc, AttentionMode::Flash, k.positions, k.qkv, k.bd, k.dout, k.dqkv0,
                               fc.learn, gpu_bf16_wgmma_all());
    const GpuRun one = run_gpu(fc, AttentionMode::Flash, k.positions, k.qkv, k.bd, k.dout, k.dqkv0,
                               fc.learn, gpu_bf16_wgmma_all_one_warpgroup());
    EXPECT_EQ(one.out, two.out);
    EXPECT_EQ(one.saved, two.saved);
    EXPECT_TRUE(one.dqkv == two.dqkv) << "dqkv differs";
    EXPECT_EQ(one.da, two.da);
    EXPECT_EQ(one.db, two.db);
    EXPECT_EQ(one.dtable, two.dtable);
    EXPECT_CLOSE(two.out, k.out, kBf16Tol);
    expect_bf16_grads_match_cpu(two, k, fc.learn);
}

// The one-kernel backward (CTX_FLASH_BACKWARD=atomic: dq added by fp32 atomics, the bias
// gradients per key block) against the two kernels of the same bf16 backend: the forward is
// the same kernel (same bits); dk and dv come from the same products of the same rounded
// probabilities and dlogits (same bits); dq and the bias-parameter gradients are the same terms
// summed in another order (fp32 atomics, per key block instead of per query tile), so within
// 1e-5 of their largest entry (the bias gradients 1e-4: sums that cancel); the table gradient's
// entries are each written once (same bits). And against the CPU on the rounded operands, as
// Bf16TensorCoresMatchCpuOnRoundedOperands. T5's parameter gradients keep the two kernels.
TEST_P(OpsGpuFlash, Bf16AtomicDqMatchesSplitKernels) {
    REQUIRE_GPU();
    const FlashCase& fc = GetParam();
    const int C = fc.C;
    const Bf16Case k = bf16_case(fc, 5000 + fc.T * 3 + fc.C + int(fc.kind));
    const GpuRun split = run_gpu(fc, AttentionMode::Flash, k.positions, k.qkv, k.bd, k.dout,
                                 k.dqkv0, fc.learn, gpu_bf16());
    const GpuRun atomic = run_gpu(fc, AttentionMode::Flash, k.positions, k.qkv, k.bd, k.dout,
                                  k.dqkv0, fc.learn, gpu_bf16_atomic_dq());
    EXPECT_EQ(atomic.out, split.out);
    EXPECT_EQ(atomic.saved, split.saved);
    EXPECT_TRUE(dqkv_cols(atomic.dqkv, C, C, 2 * C) == dqkv_cols(split.dqkv, C, C, 2 * C))
        << "dk, dv differ from the two-kernel backward's bits";
    expect_dq_and_bias_grads_close(atomic, split, k, C);
    EXPECT_EQ(atomic.dtable, split.dtable);
    expect_bf16_grads_match_cpu(atomic, k, fc.learn);
}

// The one-kernel backward on wgmma (CTX_FLASH_BACKWARD=atomic with CTX_FLASH_DKV=wgmma: the dk /
// dv kernel adds dq's terms by fp32 atomics, cuda_flash_wg_dkv.cuh), in blocks of two warpgroups
// and of one, lock-step and with a producer warpgroup, against the two kernels with the same
// wgmma dk / dv kernel: the forward is the same kernel (same bits); where it serves (kernel head
// dims 64 and 128, an inline family, no bias-parameter gradients) dk and dv are that kernel's
// products of the same P^T and dS^T (same bits), elsewhere the mma.sync one-kernel backward runs
// (within 1e-5); dq is the same terms summed in another order (within 1e-5 of its largest
// entry). And against the CPU on the rounded operands.
void expect_wgmma_atomic_dq_matches_split(const FlashCase& fc, const Bf16Case& k) {
    const int C = fc.C, D = fc.C / fc.H;
    const GpuRun split = run_gpu(fc, AttentionMode::Flash, k.positions, k.qkv, k.bd, k.dout,
                                 k.dqkv0, fc.learn, gpu_bf16_wgmma_dkv());
    const bool biased = fc.kind == ctx::BiasKind::Linear || fc.kind == ctx::BiasKind::KerpleLog;
    const bool serves = ((D > 32 && D <= 64) || (D > 80 && D <= 128)) &&
                        (fc.kind == ctx::BiasKind::None || biased) && !(biased && fc.learn);
    const FVec kv0 = dqkv_cols(k.dqkv0, C, C, 2 * C);
    for (const bool producer : {false, true})
        for (const int warpgroups : {2, 1}) {
            SCOPED_TRACE(testing::Message()
                         << (warpgroups == 2 ? "two warpgroups" : "one warpgroup")
                         << (producer ? ", producer" : ", lock-step"));
            const GpuRun atomic =
                run_gpu(fc, AttentionMode::Flash, k.positions, k.qkv, k.bd, k.dout, k.dqkv0,
                        fc.learn, gpu_bf16_wgmma_atomic_dq(warpgroups, producer));
            EXPECT_EQ(atomic.out, split.out);
            EXPECT_EQ(atomic.saved, split.saved);
            const FVec kv = dqkv_cols(atomic.dqkv, C, C, 2 * C);
            if (serves) {
                EXPECT_TRUE(kv == dqkv_cols(split.dqkv, C, C, 2 * C)) << "dk, dv differ";
            } else {
                EXPECT_CLOSE(minus(kv, kv0), minus(dqkv_cols(split.dqkv, C, C, 2 * C), kv0), 1e-5);
            }
            expect_dq_and_bias_grads_close(atomic, split, k, C);
            EXPECT_EQ(atomic.dtable, split.dtable);
            expect_bf16_grads_match_cpu(atomic, k, fc.learn);
        }
}

TEST_P(OpsGpuFlash, Bf16WgmmaAtomicDqMatchesSplit) {
    REQUIRE_GPU();
    const FlashCase& fc = GetParam();
    expect_wgmma_atomic_dq_matches_split(fc, bf16_case(fc, 5000 + fc.T * 3 + fc.C + int(fc.kind)));
}

// The same over many query tiles per key block (T 600: ten for the first), with windows, packed
// documents (with a window and without) and KERPLE-log with fixed parameters, from its tables
// (integer positions) and computed, at head dims 64 and 128: cases the one-kernel backward
// serves on wgmma that the cases above do not have (tiles one warpgroup of a block takes and
// the other not: the diagonal, a window's edge, a document's end). dq's atomics: head dim 50 an
// entry at a time (its rows are not 16-byte aligned), the others four columns an atomic, head
// dims 100 (wgmma) and 20 (the mma.sync one-kernel) with a last 8-column block of which only
// four columns exist; and the atomic an entry asked for (CTX_FLASH_DQ_ATOMICS=scalar) at head
// dim 64 gives the same dk, dv and dq within 1e-5.
TEST(OpsGpuFlashWgmmaAtomic, LongRowsMatchSplit) {
    REQUIRE_GPU();
    for (const FlashCase& fc :
         {FlashCase{"d64_none_long", 1, 600, 128, 2, ctx::BiasKind::None, 0, kWide},
          FlashCase{"d64_kerple_tables_window", 1, 520, 128, 2, ctx::BiasKind::KerpleLog, 150,
                    kIntGaps, 32, 128, false},
          FlashCase{"d64_kerple_computed", 1, 300, 128, 2, ctx::BiasKind::KerpleLog, 0, kGaps, 32,
                    128, false},
          FlashCase{"d64_alibi_window_packed", 1, 400, 128, 2, ctx::BiasKind::Linear, 100,
                    kContiguous, 32, 128, false, false, 3},
          FlashCase{"d64_packed_long", 1, 600, 128, 2, ctx::BiasKind::None, 0, kContiguous, 32, 128,
                    false, false, 3},
          FlashCase{"d128_none_long", 1, 600, 256, 2, ctx::BiasKind::None, 0, kWide},
          FlashCase{"d128_kerple_window_packed", 1, 450, 256, 2, ctx::BiasKind::KerpleLog, 130,
                    kContiguous, 32, 128, false, false, 3},
          FlashCase{"d50_none", 1, 200, 100, 2, ctx::BiasKind::None, 0, kWide},
          FlashCase{"d100_none", 1, 200, 200, 2, ctx::BiasKind::None, 0, kWide},
          FlashCase{"d20_alibi", 1, 150, 40, 2, ctx::BiasKind::Linear, 0, kGaps}}) {
        SCOPED_TRACE(fc.name);
        expect_wgmma_atomic_dq_matches_split(fc, bf16_case(fc, 9300 + fc.T + fc.C));
    }
    const FlashCase fc{"d64_alibi_packed",
                       1,
                       300,
                       128,
                       2,
                       ctx::BiasKind::Linear,
                       0,
                       kContiguous,
                       32,
                       128,
                       false,
                       false,
                       2};
    const Bf16Case k = bf16_case(fc, 9900);
    for (const bool wgmma : {false, true}) {
        SCOPED_TRACE(wgmma ? "wgmma" : "mma.sync");
        std::vector<std::pair<const char*, const char*>> vars = {{"CTX_FLASH_BACKWARD", "atomic"}};
        if (wgmma) vars.emplace_back("CTX_FLASH_DKV", "wgmma");
        const GpuRun quad = run_gpu(fc, AttentionMode::Flash, k.positions, k.qkv, k.bd, k.dout,
                                    k.dqkv0, fc.learn, *make_bf16_backend_with(vars));
        vars.emplace_back("CTX_FLASH_DQ_ATOMICS", "scalar");
        const auto scalar_be = make_bf16_backend_with(vars);
        const GpuRun scalar = run_gpu(fc, AttentionMode::Flash, k.positions, k.qkv, k.bd, k.dout,
                                      k.dqkv0, fc.learn, *scalar_be);
        EXPECT_EQ(quad.out, scalar.out);
        EXPECT_TRUE(dqkv_cols(quad.dqkv, fc.C, fc.C, 2 * fc.C) ==
                    dqkv_cols(scalar.dqkv, fc.C, fc.C, 2 * fc.C))
            << "dk, dv differ";
        expect_dq_and_bias_grads_close(quad, scalar, k, fc.C);
        expect_bf16_grads_match_cpu(scalar, k, fc.learn);
    }
}

// The tensor-core forward alone (evaluation and generation run no backward) against the CPU on
// bf16-rounded operands: out within kBf16Tol, lse within kFwdTol of the double reference, at
// head dims 64 and 128, T past one 128-query block, with a window; and with one m-tile per warp
// (CTX_FLASH_FORWARD_MTILES=1, the layout GPUs with 99 KiB of shared memory a block run at head
// dim 128) the same bits: each row meets the same key tiles, its products in the same order.
TEST(OpsGpuFlashChecks, Bf16ForwardAloneMatchesCpu) {
    REQUIRE_GPU();
    for (const FlashCase& fc :
         {FlashCase{"d64", 2, 150, 128, 2, ctx::BiasKind::Linear, 0, kGaps},
          FlashCase{"d128", 2, 200, 256, 2, ctx::BiasKind::KerpleLog, 50, kWide},
          FlashCase{"d128_t5", 1, 130, 256, 2, ctx::BiasKind::T5, 0, kIntGaps}}) {
        SCOPED_TRACE(fc.name);
        const int B = fc.B, T = fc.T, C = fc.C, H = fc.H;
        const Bf16Case k = bf16_case(fc, 9000 + fc.T + fc.C);
        auto forward = [&](ctx::Backend& be) {
            BiasData bd = k.bd;
            DevCase dc(k.positions, k.qkv, bd, fc, be);
            const ctx::AttentionOptions o = options(fc, bd, &dc, AttentionMode::Flash);
            Dev out(size_t(B) * T * C, be),
                saved(be.attention_saved_floats(AttentionMode::Flash, B, T, C, H), be);
            be.attention_forward(out.get(), saved.get(), dc.qkv.get(), dc.pos.get(), B, T, C, H,
                                 o);
            const size_t lse = ctx::attention_saved_floats(AttentionMode::Flash, B, T, H);
            return std::make_pair(out.host(), saved.host(lse));
        };
        const auto [out, lse] = forward(gpu_bf16());
        EXPECT_CLOSE(out, k.out, kBf16Tol);
        EXPECT_CLOSE(lse, reference_lse(fc, k.qkv, k.positions, k.bd), kFwdTol);
        const auto [out1, lse1] = forward(gpu_bf16_one_mtile());
        EXPECT_EQ(out1, out);
        EXPECT_EQ(lse1, lse);
    }
}

// A flash kernel whose shared memory passes the default 48 KiB raises its limit on each device it
// runs on (DynamicSharedLimit), and reads the properties of the device it runs on (this_gpu): the
// same call on the second device gives the first's bits, for the fp32 kernels, the mma.sync and
// the wgmma tensor-core kernels (head dim 128: all past 48 KiB). Needs two devices: a machine with
// two GPUs, or the emulation with CTX_EMU_DEVICES=2 (run_emulated_tests.py sets it), whose limits
// are per device as a GPU's: raised once per process, the second device's launch aborted there.
TEST(OpsGpuFlashChecks, KernelsRunOnEveryDevice) {
    REQUIRE_GPU();
    if (ctx::cuda_device_count() < 2)
        GTEST_SKIP() << "needs two CUDA devices (emulated: CTX_EMU_DEVICES=2)";
    const FlashCase fc{"d128", 1, 140, 256, 2, ctx::BiasKind::KerpleLog, 0, kIntGaps};
    const Bf16Case k = bf16_case(fc, 4321);
    const std::vector<std::pair<const char*, const char*>> wgmma = {
        {"CTX_FLASH_FORWARD", "wgmma"}, {"CTX_FLASH_DQ", "wgmma"}, {"CTX_FLASH_DKV", "wgmma"}};
    for (const char* kernels : {"fp32", "bf16 mma.sync", "bf16 wgmma"}) {
        SCOPED_TRACE(kernels);
        auto make = [&](int device) {
            if (kernels[0] == 'f') return ctx::make_cuda_backend(device);
            return make_bf16_backend_with(kernels[5] == 'w' ? wgmma : decltype(wgmma){}, device);
        };
        const auto on0 = make(0), on1 = make(1);
        const GpuRun run0 = run_gpu(fc, AttentionMode::Flash, k.positions, k.qkv, k.bd, k.dout,
                                    k.dqkv0, fc.learn, *on0);
        const GpuRun run1 = run_gpu(fc, AttentionMode::Flash, k.positions, k.qkv, k.bd, k.dout,
                                    k.dqkv0, fc.learn, *on1);
        EXPECT_EQ(run1.out, run0.out);
        EXPECT_EQ(run1.saved, run0.saved);
        EXPECT_TRUE(run1.dqkv == run0.dqkv) << "dqkv differs";
        if (kernels[0] == 'b') {
            EXPECT_CLOSE(run0.out, k.out, kBf16Tol);
        }
    }
}

// The producer kernels' pipeline over many tiles: stages refilled many times over (T 600: 10
// key tiles for the last query block, 10 query tiles for the first key block), windows that make
// the second computing warpgroup skip the block's first tiles (its rows' windows start later, the
// causal edge for dk / dv) and the first skip the last (the causal edge; the window's end for
// dk / dv), so the turns count only the tiles both take; packed documents, with a window and
// without (then a key block's queries end at its documents' end, many tiles before the block's
// last: the dk / dv kernels' products of the last tile taken must be done before its stage is
// refilled or released); KERPLE-log learned on integer positions (tables, the bias-parameter
// gradients). The lock-step kernels' bits, those against the CPU.
TEST(OpsGpuFlashProducer, LongRowsGiveLockstepBits) {
    REQUIRE_GPU();
    for (const FlashCase& fc :
         {FlashCase{"d128_long", 1, 600, 256, 2, ctx::BiasKind::None, 0, kWide},
          FlashCase{"d64_kerple_window", 1, 520, 128, 2, ctx::BiasKind::KerpleLog, 150, kGaps, 32,
                    128, false},
          FlashCase{"d128_alibi_window_packed", 1, 400, 256, 2, ctx::BiasKind::Linear, 100,
                    kContiguous, 32, 128, false, false, 3},
          FlashCase{"d128_kerple_learned_window", 1, 450, 256, 2, ctx::BiasKind::KerpleLog, 130,
                    kIntGaps},
          FlashCase{"d64_packed_long", 1, 600, 128, 2, ctx::BiasKind::None, 0, kContiguous, 32, 128,
                    false, false, 3},
          FlashCase{"d128_packed_long", 1, 600, 256, 2, ctx::BiasKind::None, 0, kContiguous, 32,
                    128, false, false, 3}}) {
        SCOPED_TRACE(fc.name);
        const Bf16Case k = bf16_case(fc, 9100 + fc.T + fc.C);
        const GpuRun lockstep = run_gpu(fc, AttentionMode::Flash, k.positions, k.qkv, k.bd, k.dout,
                                        k.dqkv0, fc.learn, gpu_bf16_wgmma_all());
        EXPECT_CLOSE(lockstep.out, k.out, kBf16Tol);
        expect_bf16_grads_match_cpu(lockstep, k, fc.learn);
        expect_producer_gives_lockstep_bits(fc, k, lockstep);
    }
}

// KERPLE-log's backward (and the wgmma forward) looks its terms up (log2(1 + b d) and d / (1 + b d)
// per integer distance) when a call's positions are integers spanning less than the tables, and
// computes them otherwise; the tables hold what the computation gives, so both agree bit for bit.
// The same rows twice: as they are (tables), and with the second row's positions moved 70000 on
// (the call's span exceeds the tables: computed; each row's distances, so its attention, are
// unchanged). Learned and fixed parameters, head dims 64 (both backward kernels from the
// tables) and 128 (the dk/dv kernel computes), the two-kernel and the one-kernel backward, and
// the wgmma kernels (lock-step and with a producer), whose forward looks the terms up too.
TEST(OpsGpuFlashKerple, TablesGiveTheComputedTermsBitForBit) {
    REQUIRE_GPU();
    for (const FlashCase& fc :
         {FlashCase{"d64", 2, 150, 128, 2, ctx::BiasKind::KerpleLog, 0, kIntGaps},
          FlashCase{"d128_window", 2, 140, 256, 2, ctx::BiasKind::KerpleLog, 40, kContiguous},
          FlashCase{"d64_fixed", 2, 70, 128, 2, ctx::BiasKind::KerpleLog, 0, kIntGaps, 32, 128,
                    false}}) {
        SCOPED_TRACE(fc.name);
        const Bf16Case k = bf16_case(fc, 7000 + fc.T + fc.C);
        FVec far = k.positions;
        for (int t = 0; t < fc.T; t++) far[size_t(fc.T) + t] += 70000.0f;
        // the wgmma kernels too: their forward looks the terms up (CTX_FLASH_FORWARD_KERPLE)
        for (ctx::Backend* be : {&gpu_bf16(), &gpu_bf16_atomic_dq(), &gpu_bf16_wgmma_all(),
                                 &gpu_bf16_wgmma_producer(2)}) {
            SCOPED_TRACE(be->name());
            const GpuRun tab = run_gpu(fc, AttentionMode::Flash, k.positions, k.qkv, k.bd,
                                       k.dout, k.dqkv0, fc.learn, *be);
            const GpuRun comp =
                run_gpu(fc, AttentionMode::Flash, far, k.qkv, k.bd, k.dout, k.dqkv0, fc.learn, *be);
            EXPECT_EQ(tab.out, comp.out);
            EXPECT_EQ(tab.saved, comp.saved);
            if (be != &gpu_bf16_atomic_dq()) {  // its dq's atomics add in any order on a GPU
                EXPECT_EQ(tab.dqkv, comp.dqkv);
            } else {
                EXPECT_CLOSE(minus(tab.dqkv, k.dqkv0), minus(comp.dqkv, k.dqkv0), 1e-5);
            }
            EXPECT_EQ(tab.da, comp.da);  // per-block partials in a fixed order, both backwards
            EXPECT_EQ(tab.db, comp.db);
            expect_bf16_grads_match_cpu(tab, k, fc.learn);
        }
    }
}

// Bit-identical outputs and gradients on a repeated call: no atomics, fixed reduction orders.
TEST_P(OpsGpuFlash, IsDeterministic) {
    REQUIRE_GPU();
    const FlashCase& fc = GetParam();
    const int B = fc.B, T = fc.T, C = fc.C;
    ref::Rng rng(91 + T);
    const FVec positions = make_positions(rng, B, T, fc.pos);
    const FVec qkv = randn(rng, size_t(B) * T * 3 * C), dout = randn(rng, size_t(B) * T * C);
    const BiasData bd = make_bias_data(rng, fc.kind, fc.B, fc.H, fc.T, fc.num_buckets);
    const FVec dqkv0(qkv.size(), 0.0f);
    for (ctx::Backend* be : {&gpu(), &gpu_bf16()}) {  // fp32 and tensor-core kernels
        SCOPED_TRACE(be->name());
        const GpuRun r0 =
            run_gpu(fc, AttentionMode::Flash, positions, qkv, bd, dout, dqkv0, true, *be);
        const GpuRun r1 =
            run_gpu(fc, AttentionMode::Flash, positions, qkv, bd, dout, dqkv0, true, *be);
        EXPECT_EQ(r0.out, r1.out);
        EXPECT_EQ(r0.saved, r1.saved);
        EXPECT_EQ(r0.dqkv, r1.dqkv);
        EXPECT_EQ(r0.da, r1.da);
        EXPECT_EQ(r0.db, r1.db);
        EXPECT_EQ(r0.dtable, r1.dtable);
    }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, OpsGpuFlash,
    ::testing::Values(
        FlashCase{"none_T1", 2, 1, 128, 2, ctx::BiasKind::None, 0, kContiguous},
        FlashCase{"none_d64_odd", 2, 37, 128, 2, ctx::BiasKind::None, 0, kContiguous},
        FlashCase{"none_d80_window", 1, 45, 160, 2, ctx::BiasKind::None, 7, kGaps},
        FlashCase{"none_d128_long", 1, 301, 256, 2, ctx::BiasKind::None, 0, kWide},
        FlashCase{"none_d64_window_tile", 1, 96, 128, 2, ctx::BiasKind::None, 32, kGaps},
        FlashCase{"none_d64_window_beyond_T", 1, 40, 128, 2, ctx::BiasKind::None, 64, kContiguous},
        FlashCase{"none_d16", 2, 33, 32, 2, ctx::BiasKind::None, 0, kWide},
        // an odd head dim: the backward's gradient rows are not 8-byte aligned pairs
        FlashCase{"linear_d21_odd", 2, 37, 42, 2, ctx::BiasKind::Linear, 0, kGaps},
        FlashCase{"linear_d64", 2, 33, 256, 4, ctx::BiasKind::Linear, 0, kGaps},
        FlashCase{"linear_host_slopes_fixed", 2, 29, 128, 2, ctx::BiasKind::Linear, 0, kGaps, 32,
                  128, false, true},
        FlashCase{"linear_window_unsorted", 2, 70, 128, 2, ctx::BiasKind::Linear, 5, kUnsorted},
        FlashCase{"kerple_log_d80", 2, 77, 160, 2, ctx::BiasKind::KerpleLog, 0, kWide},
        FlashCase{"kerple_log_window_long", 1, 70, 128, 2, ctx::BiasKind::KerpleLog, 40, kGaps},
        // integer positions: the backward's KERPLE-log terms from its tables
        FlashCase{"kerple_log_int_gaps", 2, 150, 128, 2, ctx::BiasKind::KerpleLog, 0, kIntGaps},
        FlashCase{"kerple_log_int_d128_window", 1, 140, 256, 2, ctx::BiasKind::KerpleLog, 40,
                  kContiguous},
        FlashCase{"kerple_log_int_fixed_d80", 2, 70, 160, 2, ctx::BiasKind::KerpleLog, 0, kIntGaps,
                  32, 128, false},
        FlashCase{"kerple_power_d128", 1, 65, 256, 2, ctx::BiasKind::KerplePower, 0, kGaps},
        FlashCase{"kerple_power_window", 2, 50, 128, 2, ctx::BiasKind::KerplePower, 9, kWide},
        FlashCase{"kerple_power_unsorted_d8", 2, 31, 24, 3, ctx::BiasKind::KerplePower, 0,
                  kUnsorted},
        // T >= 144: warps whose 16 queries see a whole 64-key tile, so the dq kernel's loops
        // specialised per family (full tiles, with and without the a, b gradients) run
        FlashCase{"linear_full_tiles", 1, 160, 128, 2, ctx::BiasKind::Linear, 0, kGaps},
        FlashCase{"linear_full_tiles_fixed", 1, 150, 128, 2, ctx::BiasKind::Linear, 0, kGaps, 32,
                  128, false},
        FlashCase{"kerple_log_full_tiles", 1, 192, 128, 2, ctx::BiasKind::KerpleLog, 0, kWide},
        FlashCase{"kerple_power_full_tiles", 1, 150, 128, 2, ctx::BiasKind::KerplePower, 0,
                  kGaps},
        FlashCase{"t5_fixed_full_tiles", 1, 150, 128, 2, ctx::BiasKind::T5, 0, kWide, 32, 128,
                  false},
        FlashCase{"table_fixed_full_tiles", 1, 150, 128, 2, ctx::BiasKind::Table, 0, kContiguous,
                  32, 128, false},
        FlashCase{"t5_default", 2, 100, 128, 2, ctx::BiasKind::T5, 0, kWide},
        FlashCase{"t5_window_unsorted_d80", 1, 70, 160, 2, ctx::BiasKind::T5, 11, kUnsorted, 16,
                  64},
        FlashCase{"t5_direct_buckets_d128", 1, 90, 128, 1, ctx::BiasKind::T5, 0, kWide, 64, 5000},
        FlashCase{"t5_512_buckets", 1, 40, 128, 2, ctx::BiasKind::T5, 0, kWide, 512, 1000},
        FlashCase{"t5_fixed", 1, 20, 128, 2, ctx::BiasKind::T5, 0, kGaps, 32, 128, false},
        FlashCase{"table_d64", 2, 45, 128, 2, ctx::BiasKind::Table, 0, kGaps},
        FlashCase{"table_window_d80", 2, 75, 160, 2, ctx::BiasKind::Table, 8, kContiguous},
        // packed rows: documents mask across tiles, with a window and with biases
        FlashCase{"none_packed_d64", 2, 90, 128, 2, ctx::BiasKind::None, 0, kContiguous, 32, 128,
                  true, false, 5},
        FlashCase{"linear_packed_window", 1, 70, 128, 2, ctx::BiasKind::Linear, 20, kGaps, 32, 128,
                  true, false, 4},
        FlashCase{"t5_packed_d128", 1, 67, 256, 2, ctx::BiasKind::T5, 0, kWide, 32, 128, true,
                  false, 3},
        FlashCase{"table_packed_d80", 1, 45, 160, 2, ctx::BiasKind::Table, 0, kGaps, 32, 128, true,
                  false, 3},
        FlashCase{"table_T1_d6", 3, 1, 18, 3, ctx::BiasKind::Table, 0, kContiguous},
        FlashCase{"table_fixed_d128", 1, 9, 256, 2, ctx::BiasKind::Table, 0, kContiguous, 32, 128,
                  false}),
    [](const auto& info) { return info.param.name; });

}  // namespace
