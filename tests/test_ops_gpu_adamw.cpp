// AdamW on the CUDA backend: adamw_update against the CPU backend over a range of steps, the
// gradient scale (clipping inside the update), and the one-launch adamw_update_segments (a block
// per chunk of a piece) against per-piece calls and the CPU, with its chunk table replaced on the
// device when the pieces change.
//
// Every test skips (GTEST_SKIP) when no CUDA device is visible, including builds without CUDA.
// Labelled "gpu" in ctest (tests/gpu_tests.cmake): ctest -L gpu.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "gpu_test_support.h"
#include "op_reference.h"

namespace {

#define REQUIRE_GPU()                                                                        \
    do {                                                                                     \
        if (!have_gpu())                                                                     \
            GTEST_SKIP() << "no CUDA device visible (cuda_device_count() == 0): the CUDA "   \
                            "AdamW tests need a GPU";                                        \
    } while (0)

TEST(OpsGpuAdamW, MatchesCpu) {
    REQUIRE_GPU();
    const size_t n = 100003;
    ref::Rng rng(9);
    FVec p = randn(rng, n), m = randn(rng, n, 0.1), v = randu(rng, n, 0.0, 0.1);
    const FVec g = randn(rng, n);
    Dev gp(p), gm(m), gv(v), gg(g);
    for (int64_t step : {int64_t(1), int64_t(7), int64_t(1000)}) {
        ctx::AdamWParams hp;
        hp.lr = 1e-3f;
        hp.weight_decay = 0.1f;
        hp.step = step;
        cpu().adamw_update(p.data(), g.data(), m.data(), v.data(), n, hp);
        gpu().adamw_update(gp.get(), gg.get(), gm.get(), gv.get(), n, hp);
        EXPECT_CLOSE(gp.host(), p, kFwdTol);
        EXPECT_CLOSE(gm.host(), m, kFwdTol);
        EXPECT_CLOSE(gv.host(), v, kFwdTol);
    }
    ctx::AdamWParams bad;
    bad.step = 0;
    EXPECT_THROW(gpu().adamw_update(gp.get(), gg.get(), gm.get(), gv.get(), n, bad), ctx::Error);
}

// AdamWParams::grad_scale (global-norm clipping inside the update): the same numbers as the
// gradients scaled first and updated with scale 1, bit for bit, on both GPU entry points; and
// as the CPU's update with the same scale.
TEST(OpsGpuAdamW, GradScaleIsTheScaledGradientsUpdate) {
    REQUIRE_GPU();
    const size_t n = 70001;
    ref::Rng rng(12);
    const FVec p = randn(rng, n), m = randn(rng, n, 0.1), v = randu(rng, n, 0.0, 0.1);
    const FVec g = randn(rng, n, 3.0);
    const float s = 0.37f;
    FVec gs(n);
    for (size_t i = 0; i < n; i++) gs[i] = g[i] * s;
    const std::vector<ctx::AdamWSegment> segs = {{0, 40000, true}, {40000, 30001, false}};
    ctx::AdamWParams hp;
    hp.lr = 1e-2f;
    hp.weight_decay = 0.1f;
    hp.step = 3;
    ctx::AdamWParams scaled = hp;
    scaled.grad_scale = s;
    for (bool segments : {false, true}) {
        Dev a_p(p), a_m(m), a_v(v), b_p(p), b_m(m), b_v(v), dg(g), dgs(gs);
        FVec c_p = p, c_m = m, c_v = v;
        if (segments) {
            gpu().adamw_update_segments(a_p.get(), dg.get(), a_m.get(), a_v.get(), segs, scaled);
            gpu().adamw_update_segments(b_p.get(), dgs.get(), b_m.get(), b_v.get(), segs, hp);
            cpu().adamw_update_segments(c_p.data(), g.data(), c_m.data(), c_v.data(), segs, scaled);
        } else {
            gpu().adamw_update(a_p.get(), dg.get(), a_m.get(), a_v.get(), n, scaled);
            gpu().adamw_update(b_p.get(), dgs.get(), b_m.get(), b_v.get(), n, hp);
            cpu().adamw_update(c_p.data(), g.data(), c_m.data(), c_v.data(), n, scaled);
        }
        EXPECT_EQ(a_p.host(), b_p.host()) << "segments " << segments;
        EXPECT_EQ(a_m.host(), b_m.host()) << "segments " << segments;
        EXPECT_EQ(a_v.host(), b_v.host()) << "segments " << segments;
        EXPECT_CLOSE(a_p.host(), c_p, kFwdTol);
        EXPECT_CLOSE(a_m.host(), c_m, kFwdTol);
        EXPECT_CLOSE(a_v.host(), c_v, kFwdTol);
        // and the scale took effect: the first moments differ from the unscaled gradients'
        FVec u_p = p, u_m = m, u_v = v;
        cpu().adamw_update(u_p.data(), g.data(), u_m.data(), u_v.data(), n, hp);
        EXPECT_GT(rel_err(a_m.host(), u_m), 1e-2) << "segments " << segments;
    }
}

// adamw_update_segments: one launch over pieces of the arrays (a block per chunk of at most
// 32768 floats), each with its own decay, against adamw_update per piece on the same backend
// (the same element code) and the CPU; the floats between pieces untouched; a second table
// (other pieces) replaces the first on the device.
TEST(OpsGpuAdamW, SegmentsMatchPerPieceCalls) {
    REQUIRE_GPU();
    const size_t n = 180000;
    ref::Rng rng(10);
    const FVec p = randn(rng, n), m = randn(rng, n, 0.1), v = randu(rng, n, 0.0, 0.1);
    const std::vector<std::vector<ctx::AdamWSegment>> tables = {
        {{0, 768, false}, {784, 70000, true}, {70784, 5, false}, {70800, 100000, true},
         {179999, 1, true}},
        {{16, 752, false}, {784, 150000, false}, {150784, 29216, true}}};
    FVec cp = p, cm = m, cv = v;
    Dev one_p(p), one_m(m), one_v(v), seg_p(p), seg_m(m), seg_v(v);
    int64_t step = 0;
    for (const auto& segs : tables) {
        for (int rep = 0; rep < 2; rep++) {
            const FVec g = randn(rng, n);
            Dev gg(g);
            ctx::AdamWParams hp;
            hp.lr = 1e-3f;
            hp.weight_decay = 0.2f;
            hp.step = ++step;
            cpu().adamw_update_segments(cp.data(), g.data(), cm.data(), cv.data(), segs, hp);
            gpu().adamw_update_segments(seg_p.get(), gg.get(), seg_m.get(), seg_v.get(), segs, hp);
            for (const auto& sg : segs) {
                ctx::AdamWParams h = hp;
                h.weight_decay = sg.decay ? hp.weight_decay : 0.0f;
                gpu().adamw_update(one_p.get() + sg.offset, gg.get() + sg.offset,
                                   one_m.get() + sg.offset, one_v.get() + sg.offset, sg.n, h);
            }
            EXPECT_LE(rel_err(seg_p.host(), one_p.host()), 1e-7) << "step " << step;
            EXPECT_LE(rel_err(seg_m.host(), one_m.host()), 1e-7) << "step " << step;
            EXPECT_LE(rel_err(seg_v.host(), one_v.host()), 1e-7) << "step " << step;
            EXPECT_CLOSE(seg_p.host(), cp, kFwdTol);
            EXPECT_CLOSE(seg_m.host(), cm, kFwdTol);
            EXPECT_CLOSE(seg_v.host(), cv, kFwdTol);
        }
    }
    // [768, 784) is in no piece of either table: its floats kept their values
    const FVec got_p = seg_p.host(), got_m = seg_m.host();
    for (size_t i = 768; i < 784; i++) {
        EXPECT_EQ(got_p[i], p[i]) << i;
        EXPECT_EQ(got_m[i], m[i]) << i;
    }
    ctx::AdamWParams bad;
    bad.step = 0;
    EXPECT_THROW(gpu().adamw_update_segments(seg_p.get(), seg_p.get(), seg_m.get(), seg_v.get(),
                                             tables[0], bad),
                 ctx::Error);
}

}  // namespace
