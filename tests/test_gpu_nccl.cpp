// The NCCL gradient reducer (backend/cuda/cuda_nccl.cpp) on device memory, label gpu.
//   NcclGpu.*  one process: a one-rank NCCL communicator, so the streams, events, bf16 casts,
//              all-gather + rank sum and staging run for real; the sum over one rank is the
//              identity (fp32) or the bf16 rounding (bf16), checked against a host reference.
//   NcclMpi.*  under mpirun (ctest mpi.grad_reducer_nccl_np2): sums over the ranks, one GPU
//              each (NCCL refuses two ranks on one GPU: with fewer GPUs than local ranks the
//              test checks the reducer's error and skips).
// Every test skips without a GPU, and in CUDA builds without NCCL.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "core/error.h"
#include "grad_reducer_cases.h"
#include "mpi_gtest.h"
#include "parallel/comm.h"
#include "parallel/grad_reducer.h"

namespace {

ctx::Comm* world() { return ctx::test::mpi_world(); }

#define REQUIRE_GPU_AND_NCCL()                                                         \
    if (ctx::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";             \
    if (!ctx::nccl_available()) GTEST_SKIP() << "this build has no NCCL (CMake: NCCL: OFF)"

// bf16 rounding of x, round to nearest with ties to even, by picking the nearer of the two bf16
// neighbours in double (independent of the kernel's integer trick). Infinities stay; a finite x
// past the largest bf16 by half an ulp or more becomes inf (its upper neighbour counts as 2^128).
float bf16_round(float x) {
    if (std::isinf(x) || std::isnan(x)) return x;
    uint32_t u;
    std::memcpy(&u, &x, 4);
    const uint32_t lo_bits = u & 0xffff0000u, hi_bits = lo_bits + 0x10000u;  // towards 0, away
    float lo, hi;
    std::memcpy(&lo, &lo_bits, 4);
    std::memcpy(&hi, &hi_bits, 4);
    const double hi_value = std::isinf(hi) ? std::copysign(std::ldexp(1.0, 128), x) : double(hi);
    const double dlo = std::fabs(double(x) - lo), dhi = std::fabs(hi_value - x);
    if (dlo != dhi) return dlo < dhi ? lo : hi;
    return (lo_bits & 0x10000u) == 0 ? lo : hi;  // tie: the even significand
}

float from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

struct Mode {
    size_t bucket_floats;
    bool overlap, deterministic, bf16;
    size_t gap_floats;
    std::string str() const {
        return "bucket " + std::to_string(bucket_floats) + (overlap ? " overlap" : " no-overlap") +
               (deterministic ? " deterministic" : "") + (bf16 ? " bf16" : " fp32") + " gap " +
               std::to_string(gap_floats);
    }
    ctx::GradReduceOptions options() const {
        ctx::GradReduceOptions o;
        o.bucket_bytes = bucket_floats * sizeof(float);
        o.overlap = overlap;
        o.deterministic = deterministic;
        o.precision = bf16 ? ctx::ReducePrecision::Bf16 : ctx::ReducePrecision::Fp32;
        o.gap_floats = gap_floats;
        return o;
    }
};

std::vector<Mode> all_modes() {
    std::vector<Mode> m;
    for (size_t bucket : {size_t(64), size_t(1000), size_t(25) << 18})
        for (bool overlap : {true, false})
            for (bool det : {false, true})
                for (bool bf16 : {false, true})
                    for (size_t gap : {size_t(15), size_t(0)})
                        m.push_back({bucket, overlap, det, bf16, gap});
    return m;
}

// Two steps of `red` on a device copy of the layout; before each ready() the backend scales the
// range by `pre` on its stream (the reducer must see the scaled values), after finish() the whole
// buffer by `post` (the backend must see the sums). Returns the buffers read back per step.
// shard > 0: ZeRO-1 shards of that many floats from the buffer's start.
template <class F>
std::vector<std::vector<float>> reduce_steps(ctx::Backend& be, ctx::GradReducer& red,
                                             const grcase::Layout& l, int rank, F value,
                                             float pre, float post, size_t shard = 0) {
    float* d = be.alloc_floats(l.total);
    std::vector<std::vector<float>> out;
    for (int step = 0; step < 2; step++) {
        const std::vector<float> h = grcase::fill(l, rank, step, value);
        be.copy_to_device(d, h.data(), h.size());
        red.set_shards(shard > 0 ? ctx::GradShards{d, shard} : ctx::GradShards{});
        red.begin();
        for (auto [off, n] : l.ranges) {
            if (pre != 1.0f) be.scale(d + off, pre, n);
            red.ready(d + off, n);
        }
        red.finish();
        if (post != 1.0f) be.scale(d, post, l.total);
        std::vector<float> g(l.total);
        be.copy_to_host(g.data(), d, l.total);
        out.push_back(std::move(g));
    }
    be.free_floats(d);
    return out;
}

// ---------------------------------------------------------------- one process

TEST(NcclGpu, OneRankIsTheIdentityOrTheBf16RoundingInEveryMode) {
    REQUIRE_GPU_AND_NCCL();
    auto be = ctx::make_cuda_backend(0);
    auto single = ctx::make_single_comm();
    const grcase::Layout l = grcase::make_layout();
    const float pre = 3.0f, post = 0.5f;  // 3x rounds differently from x in bf16; 0.5 is exact
    const size_t one_shard = (l.tail + 15) / 16 * 16;  // ZeRO-1 over one rank: its reduce
    for (const Mode& mode : all_modes())
      for (size_t shard : {size_t(0), one_shard}) {
        auto red = ctx::make_nccl_grad_reducer(*be, *single, mode.options());
        EXPECT_NE(red->name().find("nccl (1 ranks"), std::string::npos) << red->name();
        const auto got = reduce_steps(*be, *red, l, 0, grcase::rough_value, pre, post, shard);
        for (int step = 0; step < 2; step++) {
            std::vector<float> want = grcase::fill(l, 0, step, grcase::rough_value);
            for (size_t i = 0; i < l.total; i++) {
                float v = want[i];
                if (grcase::in_ranges(l, i)) {
                    v = v * pre;
                    if (mode.bf16) v = bf16_round(v);
                }
                want[i] = v * post;
            }
            EXPECT_EQ(grcase::first_bit_difference(got[step], want), -1)
                << mode.str() << " shard " << shard << " step " << step;
        }
    }
    // The parameter all-gather of one rank leaves its values.
    auto red = ctx::make_nccl_grad_reducer(*be, *single, {});
    std::vector<float> h = grcase::fill(l, 0, 0, grcase::rough_value);
    float* d = be->alloc_floats(h.size());
    be->copy_to_device(d, h.data(), h.size());
    red->allgather_shards(d, h.size(), one_shard);
    std::vector<float> back(h.size());
    be->copy_to_host(back.data(), d, h.size());
    be->free_floats(d);
    EXPECT_EQ(grcase::first_bit_difference(back, h), -1);
}

// The bf16 wire on values where rounding modes differ: ties both ways, just above a tie,
// overflow to inf, subnormals, signed zeros, infinities, NaN.
TEST(NcclGpu, Bf16WireRoundsToNearestEven) {
    REQUIRE_GPU_AND_NCCL();
    const uint32_t bits[] = {
        0x3f808000u, 0x3f818000u, 0xbf808000u, 0xbf818000u,  // ties: to even (down, up)
        0x3f808001u, 0x3f807fffu, 0xbf808001u,               // just above / below a tie
        0x7f7fffffu, 0xff7fffffu, 0x7f7f7fffu, 0x7f7f8000u,  // FLT_MAX -> inf; below; tie -> inf
        0x00000001u, 0x00008000u, 0x00018000u, 0x8000c000u,  // subnormals (ties, above)
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,  // zeros, infinities
        0x7fc00000u, 0xffa00001u};                           // NaN (quiet, signalling)
    const size_t n = sizeof bits / sizeof bits[0];
    std::vector<float> h(n);
    for (size_t i = 0; i < n; i++) h[i] = from_bits(bits[i]);
    auto be = ctx::make_cuda_backend(0);
    auto single = ctx::make_single_comm();
    float* d = be->alloc_floats(n);
    for (bool det : {false, true}) {
        ctx::GradReduceOptions o;
        o.precision = ctx::ReducePrecision::Bf16;
        o.deterministic = det;
        auto red = ctx::make_nccl_grad_reducer(*be, *single, o);
        be->copy_to_device(d, h.data(), n);
        red->begin();
        red->ready(d, n);
        red->finish();
        std::vector<float> got(n);
        be->copy_to_host(got.data(), d, n);
        for (size_t i = 0; i < n; i++) {
            if (std::isnan(h[i])) {
                EXPECT_TRUE(std::isnan(got[i])) << std::hex << bits[i];
                continue;
            }
            const float want = bf16_round(h[i]);
            EXPECT_EQ(std::memcmp(&got[i], &want, 4), 0)
                << std::hex << "input 0x" << bits[i] << " got " << got[i] << " want " << want
                << (det ? " (deterministic)" : "");
        }
    }
    be->free_floats(d);
}

TEST(NcclGpu, Refusals) {
    REQUIRE_GPU_AND_NCCL();
    auto be = ctx::make_cuda_backend(0);
    auto single = ctx::make_single_comm();
    auto red = ctx::make_nccl_grad_reducer(*be, *single, {});
    std::vector<float> host(32);
    red->begin();
    try {
        red->ready(host.data(), host.size());
        ADD_FAILURE() << "no error";
    } catch (const ctx::Error& e) {
        EXPECT_NE(std::string(e.what()).find("is not device memory"), std::string::npos)
            << e.what();
    }
    red->finish();
    EXPECT_THROW(red->finish(), ctx::Error);
    auto cpu = ctx::make_cpu_backend(1);
    try {
        ctx::make_nccl_grad_reducer(*cpu, *single, {});
        ADD_FAILURE() << "no error";
    } catch (const ctx::Error& e) {
        EXPECT_NE(std::string(e.what()).find("needs the CUDA backend"), std::string::npos)
            << e.what();
    }
    // make_grad_reducer gives the identity for one rank, on either backend
    EXPECT_NE(ctx::make_grad_reducer(*be, *single, {})->name().find("identity"),
              std::string::npos);
}

// ---------------------------------------------------------------- under mpirun

TEST(NcclMpi, SumsOverRanksInEveryMode) {
    REQUIRE_GPU_AND_NCCL();
    if (world() == nullptr || world()->size() < 2)
        GTEST_SKIP() << "needs 2+ ranks: ctest -R mpi.grad_reducer_nccl";
    const int W = world()->size(), rank = world()->rank();
    const int devices = ctx::cuda_device_count();
    const int device = ctx::local_rank_from_env() % devices;
    const char* ls = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const int local = ls ? std::atoi(ls) : W;
    auto be = ctx::make_cuda_backend(device);
    if (local > devices) {
        // Two ranks share a GPU: every rank gets the same clear error (no hang).
        try {
            ctx::make_nccl_grad_reducer(*be, *world(), {});
            ADD_FAILURE() << "no error with " << local << " ranks on " << devices << " GPU(s)";
        } catch (const ctx::Error& e) {
            EXPECT_NE(std::string(e.what()).find("NCCL needs one GPU per rank"), std::string::npos)
                << e.what();
        }
        GTEST_SKIP() << local << " ranks on this node but " << devices
                     << " GPU(s): NCCL needs one GPU per rank (refuses duplicate GPUs)";
    }
    const grcase::Layout l = grcase::make_layout();
    try {
        for (const Mode& mode : all_modes()) {
            auto red = ctx::make_grad_reducer(*be, *world(), mode.options());
            EXPECT_NE(red->name().find("nccl"), std::string::npos) << red->name();
            // exact values: every mode gives the exact sums (bf16 too with 2 ranks: |sum| < 16,
            // multiples of 1/4 fit in 8 significant bits)
            if (!mode.bf16 || W == 2) {
                const auto got = reduce_steps(*be, *red, l, rank, grcase::exact_value, 1, 1);
                for (int step = 0; step < 2; step++) {
                    std::vector<float> want = grcase::fill(l, rank, step, grcase::exact_value);
                    for (size_t i = 0; i < l.tail; i++) {
                        if (!grcase::in_ranges(l, i)) continue;
                        double s = 0;
                        for (int r = 0; r < W; r++) s += grcase::exact_value(r, step, i);
                        want[i] = float(s);
                    }
                    EXPECT_EQ(grcase::first_bit_difference(got[step], want), -1)
                        << mode.str() << " step " << step;
                }
            }
            // ZeRO-1: this rank's shard holds the exact sums (fp32 wire)
            const size_t S = ((l.tail + W - 1) / W + 15) / 16 * 16;
            const size_t lo = std::min(l.tail, size_t(rank) * S), hi = std::min(l.tail, lo + S);
            if (!mode.bf16) {
                const auto got =
                    reduce_steps(*be, *red, l, rank, grcase::exact_value, 1, 1, S);
                for (int step = 0; step < 2; step++)
                    for (size_t i = lo; i < hi; i++) {
                        if (!grcase::in_ranges(l, i)) continue;
                        double s = 0;
                        for (int r = 0; r < W; r++) s += grcase::exact_value(r, step, i);
                        ASSERT_EQ(got[step][i], float(s)) << mode.str() << " shard, float " << i;
                    }
                std::vector<float> p(l.tail, -1.0f);
                for (size_t i = lo; i < hi; i++) p[i] = float(rank * 100000 + int(i));
                float* d = be->alloc_floats(p.size());
                be->copy_to_device(d, p.data(), p.size());
                red->allgather_shards(d, p.size(), S);
                be->copy_to_host(p.data(), d, p.size());
                be->free_floats(d);
                for (size_t i = 0; i < p.size(); i++)
                    ASSERT_EQ(p[i], float(int(i / S) * 100000 + int(i))) << "gathered " << i;
            }
            if (!mode.deterministic) continue;
            // rounded values, deterministic: the rank-ordered fp32 sum of each rank's values
            // (bf16: of each rank's values rounded to bf16), bit for bit
            auto wire = [&](int r, int step, size_t i) {
                const float v = grcase::rough_value(r, step, i);
                return mode.bf16 ? bf16_round(v) : v;
            };
            const auto got = reduce_steps(*be, *red, l, rank, grcase::rough_value, 1, 1);
            for (int step = 0; step < 2; step++) {
                auto want = grcase::rank_ordered_sum(l, W, rank, step, wire);
                const auto own = grcase::fill(l, rank, step, grcase::rough_value);
                for (size_t i = l.tail; i < l.total; i++) want[i] = own[i];
                EXPECT_EQ(grcase::first_bit_difference(got[step], want), -1)
                    << mode.str() << " step " << step;
            }
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        ctx::mpi_abort(1);
    }
}

}  // namespace

int main(int argc, char** argv) { return ctx::test::mpi_gtest_main(argc, argv); }
