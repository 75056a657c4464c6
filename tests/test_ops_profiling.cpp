// ProfilingBackend (backend/profiling_backend.h): results identical to the wrapped backend's, and
// the calls, shapes and FLOPs it records; on a backend with a device clock, each op's time from
// its two marks (a fake clock that only the ops advance, by known amounts), read when the rows
// are asked for, the marks reused after that, and CTX_PROFILE_SYNC=1 back on the host clock.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/profiling_backend.h"
#include "core/error.h"
#include "remote_backend.h"

namespace {

TEST(ProfilingBackend, ForwardsOpsUnchangedAndCountsThemByShape) {
    std::unique_ptr<ctx::Backend> cpu = ctx::make_cpu_backend(1);
    ctx::ProfilingBackend prof(*cpu);
    const int N = 5, IC = 7, OC = 3;
    std::vector<float> inp(N * IC), W(OC * IC), bias(OC), a(N * OC), b(N * OC);
    for (int i = 0; i < N * IC; i++) inp[i] = 0.1f * float(i % 9) - 0.3f;
    for (int i = 0; i < OC * IC; i++) W[i] = 0.05f * float(i % 5) - 0.1f;
    for (int i = 0; i < OC; i++) bias[i] = float(i);
    cpu->matmul_forward(a.data(), inp.data(), W.data(), bias.data(), N, IC, OC);
    prof.matmul_forward(b.data(), inp.data(), W.data(), bias.data(), N, IC, OC);
    prof.matmul_forward(b.data(), inp.data(), W.data(), bias.data(), N, IC, OC);
    EXPECT_EQ(a, b);
    prof.scale(b.data(), 2.0f, b.size());
    for (size_t i = 0; i < b.size(); i++) EXPECT_EQ(b[i], 2.0f * a[i]);

    const std::vector<ctx::OpProfileRow> rows = prof.rows();
    ASSERT_EQ(rows.size(), 2u);
    const ctx::OpProfileRow* mm = rows[0].op == "matmul_forward" ? &rows[0] : &rows[1];
    const ctx::OpProfileRow* sc = rows[0].op == "scale" ? &rows[0] : &rows[1];
    EXPECT_EQ(mm->shape, "N=5 IC=7 OC=3");
    EXPECT_EQ(mm->calls, 2);
    EXPECT_DOUBLE_EQ(mm->flops, 2 * 2.0 * N * IC * OC);
    EXPECT_EQ(sc->op, "scale");
    EXPECT_EQ(sc->calls, 1);
    EXPECT_EQ(sc->flops, 0.0);
    EXPECT_GE(rows[0].seconds, rows[1].seconds);  // by decreasing time
    EXPECT_DOUBLE_EQ(prof.total_seconds(), rows[0].seconds + rows[1].seconds);
    prof.reset();
    EXPECT_TRUE(prof.rows().empty());
}

// A device-like backend whose clock moves only inside its ops: matmul_forward takes 5 ms, add
// 2 ms, everything else none. A mark holds the clock when it is made.
class FakeClockBackend : public ctx::test::RemoteBackend {
public:
    bool device_timing() const override { return true; }
    int timing_mark() override {
        marks_.push_back(now_);
        most_marks_ = std::max(most_marks_, marks_.size());
        return int(marks_.size()) - 1;
    }
    double timing_ms(int from, int to) override {
        EXPECT_TRUE(from >= 0 && to > from && size_t(to) < marks_.size()) << from << " " << to;
        return marks_[size_t(to)] - marks_[size_t(from)];
    }
    void release_timing_marks() override { marks_.clear(); }
    void matmul_forward(float* out, const float* inp, const float* W, const float* bias, int N,
                        int IC, int OC) override {
        RemoteBackend::matmul_forward(out, inp, W, bias, N, IC, OC);
        now_ += 5.0;
    }
    void add(float* out, const float* a, const float* b, size_t n) override {
        RemoteBackend::add(out, a, b, n);
        now_ += 2.0;
    }
    size_t live_marks() const { return marks_.size(); }
    size_t most_marks() const { return most_marks_; }

private:
    double now_ = 0.0;
    std::vector<double> marks_;
    size_t most_marks_ = 0;
};

TEST(ProfilingBackend, DeviceClockTimesEachOpByItsMarks) {
    unsetenv("CTX_PROFILE_SYNC");  // the device clock is the default
    FakeClockBackend dev;
    ctx::ProfilingBackend prof(dev);
    ASSERT_EQ(prof.clock(), ctx::ProfileClock::Device);
    const int N = 3, IC = 4, OC = 2;
    float* inp = dev.alloc_floats(N * IC);
    float* W = dev.alloc_floats(OC * IC);
    float* out = dev.alloc_floats(N * OC);
    for (int i = 0; i < 3; i++) prof.matmul_forward(out, inp, W, nullptr, N, IC, OC);
    for (int i = 0; i < 10000; i++) prof.add(out, out, out, N * OC);  // past the pending limit
    prof.scale(out, 1.0f, N * OC);
    EXPECT_LE(dev.most_marks(), size_t(2 * 8192)) << "marks are read and reused as they pile up";
    std::vector<ctx::OpProfileRow> rows = prof.rows();
    EXPECT_EQ(dev.live_marks(), 0u) << "reading the rows releases the marks";
    ASSERT_EQ(rows.size(), 3u);
    EXPECT_EQ(rows[0].op, "add");  // 20 s, by decreasing time
    EXPECT_EQ(rows[0].calls, 10000);
    EXPECT_NEAR(rows[0].seconds, 20.0, 1e-8);  // 10000 sums of 2 ms
    EXPECT_EQ(rows[1].op, "matmul_forward");
    EXPECT_DOUBLE_EQ(rows[1].seconds, 0.015);
    EXPECT_DOUBLE_EQ(rows[1].flops, 3 * 2.0 * N * IC * OC);
    EXPECT_EQ(rows[2].op, "scale");
    EXPECT_EQ(rows[2].seconds, 0.0);
    EXPECT_NEAR(prof.total_seconds(), 20.015, 1e-8);
    // more ops after a read add to the same rows; reset forgets rows and pending marks
    prof.matmul_forward(out, inp, W, nullptr, N, IC, OC);
    rows = prof.rows();
    EXPECT_DOUBLE_EQ(rows[1].seconds, 0.020);
    EXPECT_EQ(rows[1].calls, 4);
    prof.add(out, out, out, N * OC);
    prof.reset();
    EXPECT_EQ(dev.live_marks(), 0u);
    EXPECT_TRUE(prof.rows().empty());
    dev.free_floats(inp);
    dev.free_floats(W);
    dev.free_floats(out);
}

TEST(ProfilingBackend, SyncPerOpIsTheHostClock) {
    FakeClockBackend dev;
    setenv("CTX_PROFILE_SYNC", "1", 1);
    {
        ctx::ProfilingBackend prof(dev);
        EXPECT_EQ(prof.clock(), ctx::ProfileClock::Host);
        float* x = dev.alloc_floats(4);
        prof.add(x, x, x, 4);
        EXPECT_EQ(dev.most_marks(), 0u) << "no device marks on the host clock";
        EXPECT_EQ(prof.rows().at(0).calls, 1);
        dev.free_floats(x);
    }
    setenv("CTX_PROFILE_SYNC", "yes", 1);
    try {
        ctx::ProfilingBackend bad(dev);
        ADD_FAILURE() << "CTX_PROFILE_SYNC=yes accepted";
    } catch (const ctx::Error& e) {
        EXPECT_NE(std::string(e.what()).find("CTX_PROFILE_SYNC=yes"), std::string::npos)
            << e.what();
    }
    unsetenv("CTX_PROFILE_SYNC");
    std::unique_ptr<ctx::Backend> cpu = ctx::make_cpu_backend(1);
    EXPECT_EQ(ctx::ProfilingBackend(*cpu).clock(), ctx::ProfileClock::Host);
    EXPECT_FALSE(cpu->device_timing());
    try {
        (void)cpu->timing_mark();
        ADD_FAILURE() << "the CPU backend made a device mark";
    } catch (const ctx::Error& e) {
        EXPECT_NE(std::string(e.what()).find("no device clock"), std::string::npos) << e.what();
    }
}

}  // namespace
