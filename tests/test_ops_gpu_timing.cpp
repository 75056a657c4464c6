// Device timing marks on the CUDA backend (Backend::timing_mark / timing_ms /
// release_timing_marks, CUDA events on the backend's stream) and ProfilingBackend's device clock
// over it: marks are ordered in time, indices restart after a release, bad indices are refused,
// and a profile's per-op times are non-negative and add up to no more than the wall time the
// host saw around the same ops.
//
// Skipped without a CUDA device; under engine/backend/cuda/emu/run_emulated_tests.py the events
// hold the host clock (its streams are synchronous).
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "backend/profiling_backend.h"
#include "gpu_test_support.h"

namespace {

#define REQUIRE_GPU()                                                                  \
    do {                                                                               \
        if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible: timing needs a GPU"; \
    } while (0)

TEST(OpsGpuTiming, MarksAreOrderedAndReleased) {
    REQUIRE_GPU();
    ctx::Backend& be = gpu();
    ASSERT_TRUE(be.device_timing());
    const int N = 256, C = 256;
    ref::Rng rng(3);
    Dev x(randn(rng, size_t(N) * C)), w(randn(rng, size_t(C) * C)), y(size_t(N) * C);
    be.release_timing_marks();
    const int m0 = be.timing_mark();
    EXPECT_EQ(m0, 0);
    be.matmul_forward(y.get(), x.get(), w.get(), nullptr, N, C, C);
    const int m1 = be.timing_mark();
    for (int i = 0; i < 4; i++) be.matmul_forward(y.get(), x.get(), w.get(), nullptr, N, C, C);
    const int m2 = be.timing_mark();
    EXPECT_EQ(m1, 1);
    EXPECT_EQ(m2, 2);
    const double t01 = be.timing_ms(m0, m1), t02 = be.timing_ms(m0, m2);
    EXPECT_GE(t01, 0.0);
    EXPECT_GE(t02, t01) << "a later mark is no earlier";
    EXPECT_LT(t02, 60e3) << "milliseconds, not microseconds";
    expect_error([&] { (void)be.timing_ms(m0, 3); }, {"timing_ms", "3"});
    be.release_timing_marks();
    expect_error([&] { (void)be.timing_ms(0, 1); }, {"timing_ms"});
    EXPECT_EQ(be.timing_mark(), 0) << "indices start again after a release";
    be.release_timing_marks();
}

TEST(OpsGpuTiming, ProfileOnTheDeviceClock) {
    REQUIRE_GPU();
    unsetenv("CTX_PROFILE_SYNC");  // the device clock is the default
    ctx::ProfilingBackend prof(gpu());
    ASSERT_EQ(prof.clock(), ctx::ProfileClock::Device);
    const int N = 512, C = 384;
    ref::Rng rng(4);
    Dev x(randn(rng, size_t(N) * C)), w(randn(rng, size_t(C) * C)), y(size_t(N) * C);
    FVec host(1);
    gpu().copy_to_host(host.data(), y.get(), 1);  // nothing queued before the clock starts
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 5; i++) {
        prof.matmul_forward(y.get(), x.get(), w.get(), nullptr, N, C, C);
        prof.add(y.get(), y.get(), x.get(), size_t(N) * C);
    }
    const std::vector<ctx::OpProfileRow> rows = prof.rows();  // waits for the queue
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(rows.size(), 2u);
    for (const ctx::OpProfileRow& r : rows) {
        EXPECT_EQ(r.calls, 5) << r.op;
        EXPECT_GE(r.seconds, 0.0) << r.op;
    }
    EXPECT_LE(prof.total_seconds(), wall * 1.001 + 1e-4)
        << "the ops' device time fits in the wall time around them";
    // the same results as without the profiler
    const FVec profiled = y.host();
    Dev y2(size_t(N) * C);
    for (int i = 0; i < 5; i++) {
        gpu().matmul_forward(y2.get(), x.get(), w.get(), nullptr, N, C, C);
        gpu().add(y2.get(), y2.get(), x.get(), size_t(N) * C);
    }
    EXPECT_EQ(profiled, y2.host());
}

}  // namespace
