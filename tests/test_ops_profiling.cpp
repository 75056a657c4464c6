// ProfilingBackend (backend/profiling_backend.h): results identical to the wrapped backend's, and
// the calls, shapes and FLOPs it records.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/profiling_backend.h"

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

}  // namespace
