// Flash attention (backend/cuda/cuda_flash.h, backend-internal for now): the fused tiled forward
// and backward against the CPU backend and the CUDA backend's materialised attention on the same
// random inputs: every bias kind with learned and fixed parameters (host ALiBi slopes), windows
// shorter and longer than a tile, T = 1 and odd T (not multiples of the 32-row tile), contiguous /
// gapped / wide / unsorted fractional positions, head dims 16, 64, 80 and 128, T5 with the lookup
// table and the direct bucket formula, the Table bias with dtable; the saved log-sum-exp; the
// accumulate semantics; bit-identical repeated runs (no atomics); refusals.
//
// Skips (GTEST_SKIP) when no CUDA device is visible, and in builds without CUDA (the flash entry
// points exist only there: tests/gpu_tests.cmake defines CTX_TEST_HAVE_CUDA). Label "gpu".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "gpu_test_support.h"
#include "op_reference.h"

#ifdef CTX_TEST_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_flash.h"
#endif

namespace {

#ifdef CTX_TEST_HAVE_CUDA

#define REQUIRE_GPU()                                                                        \
    do {                                                                                     \
        if (!have_gpu())                                                                     \
            GTEST_SKIP() << "no CUDA device visible (cuda_device_count() == 0): the flash "  \
                            "attention tests need a GPU";                                    \
    } while (0)


// The flash kernels run on the legacy default stream here; the backend's stream is non-blocking,
// so the test orders the two by synchronising the device around every flash call.
ctx::cuda::FlashAttention& flash() {
    static ctx::cuda::FlashAttention fa(nullptr);
    return fa;
}
void device_sync() { ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess); }



struct FlashCase {
    std::string name;
    int B, T, C, H;
    ctx::BiasKind kind;
    int window;
    PosStyle pos;
    int num_buckets = 32, max_distance = 128;
    bool learn = true;
    bool host_a = false;
};
void PrintTo(const FlashCase& c, std::ostream* os) { *os << c.name; }


// Device buffers of one case's inputs and gradients (gradients pre-filled from BiasData).
struct DevCase {
    Dev pos, qkv, a, b, da, db, table, dtable;
    DevCase(const FVec& positions, const FVec& q, const BiasData& bd)
        : pos(positions), qkv(q), a(bd.a), b(bd.b), da(bd.da), db(bd.db), table(bd.table),
          dtable(bd.dtable) {}
};

ctx::AttentionOptions options(const FlashCase& fc, BiasData& bd, DevCase* dc) {
    ctx::AttentionOptions o;
    o.window = fc.window;
    o.bias.kind = fc.kind;
    o.bias.num_buckets = fc.num_buckets;
    o.bias.max_distance = fc.max_distance;
    if (fc.kind == ctx::BiasKind::Table) {
        o.bias.table = dc ? dc->table.get() : bd.table.data();
        if (fc.learn) o.bias.dtable = dc ? dc->dtable.get() : bd.dtable.data();
    } else if (fc.kind != ctx::BiasKind::None) {
        o.bias.a = dc && !fc.host_a ? dc->a.get() : bd.a.data();
        o.bias.b = bd.b.empty() ? nullptr : (dc ? dc->b.get() : bd.b.data());
        if (fc.learn) {
            o.bias.da = dc ? dc->da.get() : bd.da.data();
            if (!bd.b.empty()) o.bias.db = dc ? dc->db.get() : bd.db.data();
        }
    }
    return o;
}

// Log-sum-exp of every row in double, for the kinds whose logits the test can form directly
// (None, Table): logit = q.k / sqrt(D) (+ table).
FVec reference_lse(const FlashCase& fc, const FVec& qkv, const FVec& table) {
    const int B = fc.B, T = fc.T, C = fc.C, H = fc.H, D = C / H;
    FVec lse(size_t(B) * H * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                const int lo = fc.window > 0 ? std::max(0, i - fc.window + 1) : 0;
                std::vector<double> s;
                for (int j = lo; j <= i; j++) {
                    double dot = 0.0;
                    for (int d = 0; d < D; d++)
                        dot += double(qkv[(size_t(b) * T + i) * 3 * C + size_t(h) * D + d]) *
                               double(qkv[(size_t(b) * T + j) * 3 * C + C + size_t(h) * D + d]);
                    double x = dot / std::sqrt(double(D));
                    if (!table.empty()) x += table[((size_t(b) * H + h) * T + i) * T + j];
                    s.push_back(x);
                }
                const double mx = *std::max_element(s.begin(), s.end());
                double sum = 0.0;
                for (double x : s) sum += std::exp(x - mx);
                lse[(size_t(b) * H + h) * T + i] = float(mx + std::log(sum));
            }
    return lse;
}

class OpsGpuFlash : public ::testing::TestWithParam<FlashCase> {};

TEST_P(OpsGpuFlash, ForwardBackwardMatchCpuAndMaterialised) {
    REQUIRE_GPU();
    const FlashCase& fc = GetParam();
    const int B = fc.B, T = fc.T, C = fc.C, H = fc.H;
    ref::Rng rng(2000 + T * 13 + C + int(fc.kind));
    const FVec positions = make_positions(rng, B, T, fc.pos);
    const FVec qkv = randn(rng, size_t(B) * T * 3 * C);
    BiasData bd = make_bias_data(rng, fc.kind, fc.B, fc.H, fc.T, fc.num_buckets);
    const FVec dout = randn(rng, size_t(B) * T * C);
    const FVec dqkv0 = randn(rng, qkv.size());  // pre-filled: backward accumulates

    // CPU reference
    BiasData cb = bd;
    const ctx::AttentionOptions copt = options(fc, cb, nullptr);
    FVec out(size_t(B) * T * C), att(size_t(B) * H * T * T), dqkv = dqkv0;
    cpu().attention_forward(out.data(), att.data(), qkv.data(), positions.data(), B, T, C, H,
                            copt);
    FVec cscratch(cpu().attention_scratch_floats(B, T, C, H, ctx::AttentionMode::Materialised));
    cpu().attention_backward(dqkv.data(), cscratch.data(), dout.data(), qkv.data(), att.data(), nullptr,
                             positions.data(), B, T, C, H, copt);

    // CUDA materialised path
    DevCase mc(positions, qkv, bd);
    const ctx::AttentionOptions mopt = options(fc, bd, &mc);
    Dev mout(out.size()), matt(att.size()), mdout(dout), mdqkv(dqkv0);
    Dev mscratch(gpu().attention_scratch_floats(B, T, C, H, ctx::AttentionMode::Materialised));
    gpu().attention_forward(mout.get(), matt.get(), mc.qkv.get(), mc.pos.get(), B, T, C, H, mopt);
    gpu().attention_backward(mdqkv.get(), mscratch.get(), mdout.get(), mc.qkv.get(), matt.get(), nullptr,
                             mc.pos.get(), B, T, C, H, mopt);

    // flash
    DevCase fcd(positions, qkv, bd);
    const ctx::AttentionOptions fopt = options(fc, bd, &fcd);
    Dev fout(out.size()), flse(size_t(B) * H * T), fdout(dout), fdqkv(dqkv0);
    Dev fscratch(ctx::cuda::FlashAttention::backward_scratch_floats(B, T, C, H));
    device_sync();
    flash().forward(fout.get(), flse.get(), fcd.qkv.get(), fcd.pos.get(), B, T, C, H, fopt);
    device_sync();
    flash().backward(fdqkv.get(), fscratch.get(), fdout.get(), fcd.qkv.get(), fout.get(),
                     flse.get(), fcd.pos.get(), B, T, C, H, fopt);
    device_sync();

    const FVec f_out = fout.host(), f_dqkv = fdqkv.host(), f_da = fcd.da.host(),
               f_db = fcd.db.host(), f_dtable = fcd.dtable.host();
    EXPECT_CLOSE(f_out, out, kFwdTol);
    EXPECT_CLOSE(f_out, mout.host(), kFwdTol);
    EXPECT_CLOSE(f_dqkv, dqkv, kGradTol);
    EXPECT_CLOSE(f_dqkv, mdqkv.host(), kGradTol);
    EXPECT_CLOSE(f_da, cb.da, kGradTol);
    EXPECT_CLOSE(f_db, cb.db, kGradTol);
    EXPECT_CLOSE(f_dtable, cb.dtable, kGradTol);
    EXPECT_CLOSE(f_da, mc.da.host(), kGradTol);
    EXPECT_CLOSE(f_db, mc.db.host(), kGradTol);
    EXPECT_CLOSE(f_dtable, mc.dtable.host(), kGradTol);
    const FVec f_lse = flse.host();
    for (float x : f_lse) ASSERT_TRUE(std::isfinite(x));
    if (fc.kind == ctx::BiasKind::None || fc.kind == ctx::BiasKind::Table) {
        EXPECT_CLOSE(f_lse, reference_lse(fc, qkv, bd.table), kFwdTol);
    }
    if (!fc.learn) {  // fixed parameters: nothing written
        EXPECT_EQ(f_da, bd.da);
        EXPECT_EQ(f_db, bd.db);
        EXPECT_EQ(f_dtable, bd.dtable);
    }
}

// Bit-identical outputs and gradients on a repeated call: no atomics, fixed reduction orders.
TEST_P(OpsGpuFlash, IsDeterministic) {
    REQUIRE_GPU();
    const FlashCase& fc = GetParam();
    const int B = fc.B, T = fc.T, C = fc.C, H = fc.H;
    ref::Rng rng(91 + T);
    const FVec positions = make_positions(rng, B, T, fc.pos);
    const FVec qkv = randn(rng, size_t(B) * T * 3 * C), dout = randn(rng, size_t(B) * T * C);
    BiasData bd = make_bias_data(rng, fc.kind, fc.B, fc.H, fc.T, fc.num_buckets);
    std::vector<FVec> results[2];
    for (int run = 0; run < 2; run++) {
        DevCase dc(positions, qkv, bd);
        FlashCase learned = fc;
        learned.learn = true;
        const ctx::AttentionOptions o = options(learned, bd, &dc);
        Dev out(size_t(B) * T * C), lse(size_t(B) * H * T), gdout(dout), dqkv(qkv.size());
        Dev scratch(ctx::cuda::FlashAttention::backward_scratch_floats(B, T, C, H));
        device_sync();
        flash().forward(out.get(), lse.get(), dc.qkv.get(), dc.pos.get(), B, T, C, H, o);
        flash().backward(dqkv.get(), scratch.get(), gdout.get(), dc.qkv.get(), out.get(),
                         lse.get(), dc.pos.get(), B, T, C, H, o);
        device_sync();
        results[run] = {out.host(), lse.host(), dqkv.host(), dc.da.host(), dc.db.host(),
                        dc.dtable.host()};
    }
    for (size_t k = 0; k < results[0].size(); k++) EXPECT_EQ(results[0][k], results[1][k]) << k;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, OpsGpuFlash,
    ::testing::Values(
        FlashCase{"none_T1", 2, 1, 128, 2, ctx::BiasKind::None, 0, kContiguous},
        FlashCase{"none_d64_odd", 2, 37, 128, 2, ctx::BiasKind::None, 0, kContiguous},
        FlashCase{"none_d80_window", 1, 45, 160, 2, ctx::BiasKind::None, 7, kGaps},
        FlashCase{"none_d128_long", 1, 301, 256, 2, ctx::BiasKind::None, 0, kWide},
        FlashCase{"none_d64_window_tile", 1, 96, 128, 2, ctx::BiasKind::None, 32, kGaps},
        FlashCase{"none_d16", 2, 33, 32, 2, ctx::BiasKind::None, 0, kWide},
        FlashCase{"linear_d64", 2, 33, 256, 4, ctx::BiasKind::Linear, 0, kGaps},
        FlashCase{"linear_host_slopes_fixed", 2, 29, 128, 2, ctx::BiasKind::Linear, 0, kGaps, 32,
                  128, false, true},
        FlashCase{"linear_window_unsorted", 2, 70, 128, 2, ctx::BiasKind::Linear, 5, kUnsorted},
        FlashCase{"kerple_log_d80", 2, 77, 160, 2, ctx::BiasKind::KerpleLog, 0, kWide},
        FlashCase{"kerple_log_window_long", 1, 70, 128, 2, ctx::BiasKind::KerpleLog, 40, kGaps},
        FlashCase{"kerple_power_d128", 1, 65, 256, 2, ctx::BiasKind::KerplePower, 0, kGaps},
        FlashCase{"kerple_power_window", 2, 50, 128, 2, ctx::BiasKind::KerplePower, 9, kWide},
        FlashCase{"kerple_power_unsorted_d80", 1, 31, 160, 2, ctx::BiasKind::KerplePower, 0,
                  kUnsorted},
        FlashCase{"t5_default", 2, 100, 128, 2, ctx::BiasKind::T5, 0, kWide},
        FlashCase{"t5_window_unsorted_d80", 1, 70, 160, 2, ctx::BiasKind::T5, 11, kUnsorted, 16,
                  64},
        FlashCase{"t5_direct_buckets_d128", 1, 90, 128, 1, ctx::BiasKind::T5, 0, kWide, 64, 5000},
        FlashCase{"t5_512_buckets", 1, 40, 128, 2, ctx::BiasKind::T5, 0, kWide, 512, 1000},
        FlashCase{"t5_fixed", 1, 20, 128, 2, ctx::BiasKind::T5, 0, kGaps, 32, 128, false},
        FlashCase{"table_d64", 2, 45, 128, 2, ctx::BiasKind::Table, 0, kGaps},
        FlashCase{"table_window_d80", 2, 75, 160, 2, ctx::BiasKind::Table, 8, kContiguous},
        FlashCase{"table_fixed_d128", 1, 9, 256, 2, ctx::BiasKind::Table, 0, kContiguous, 32, 128,
                  false}),
    [](const auto& info) { return info.param.name; });

TEST(OpsGpuFlashChecks, BadShapesAreRefused) {
    REQUIRE_GPU();
    ctx::AttentionOptions o;
    Dev buf(16);
    // head dim 256 > kFlashMaxHeadDim
    EXPECT_FALSE(ctx::cuda::FlashAttention::supports(512, 2));
    EXPECT_TRUE(ctx::cuda::FlashAttention::supports(256, 2));
    EXPECT_THROW(flash().forward(buf.get(), buf.get(), buf.get(), buf.get(), 1, 1, 512, 2, o),
                 ctx::Error);
    // the attention checks of the op contract apply (C not a multiple of H)
    EXPECT_THROW(flash().forward(buf.get(), buf.get(), buf.get(), buf.get(), 1, 4, 10, 3, o),
                 ctx::Error);
    // the Table bias must be device memory
    FVec host_table(16);
    o.bias.kind = ctx::BiasKind::Table;
    o.bias.table = host_table.data();
    EXPECT_THROW(flash().forward(buf.get(), buf.get(), buf.get(), buf.get(), 1, 2, 4, 1, o),
                 ctx::Error);
}

#else  // builds without CUDA

TEST(OpsGpuFlash, NeedsACudaBuild) {
    GTEST_SKIP() << "built without CUDA: the flash attention kernels are not compiled";
}

#endif

}  // namespace
