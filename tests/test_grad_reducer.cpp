// The gradient reducer (parallel/grad_reducer.h): BucketPlan's bucketing with exact expected
// buckets and a randomized coverage check, the identity reducer and the factory's refusals, the
// launcher environment, and (GradReducerMpi.*, under mpirun: ctest mpi.grad_reducer_np2/np3) the
// MPI reducer against references computed on every rank from every rank's values.
//
// Own main(): MPI is initialised only when the process was started by mpirun, so the
// single-process run (ctest's discovered tests) skips the MPI tests. CTX_TEST_EXPECT_WORLD=N
// (set by the mpirun ctests) turns a world of another size into a failure instead of skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "backend/backend.h"
#include "core/error.h"
#include "grad_reducer_cases.h"
#include "mpi_gtest.h"
#include "parallel/comm.h"
#include "parallel/grad_reducer.h"

namespace {

using ctx::BucketPlan;
using Buckets = std::vector<std::pair<long, size_t>>;  // (offset from base, n)

Buckets offsets(const std::vector<BucketPlan::Bucket>& bs, const float* base) {
    Buckets out;
    for (const auto& b : bs) out.push_back({long(b.data - base), b.n});
    return out;
}

// Adds ranges (offset, n) of base in order; returns every closed bucket, then the flush.
Buckets plan_all(BucketPlan& p, float* base, const std::vector<std::pair<long, size_t>>& ranges) {
    Buckets out;
    for (auto [off, n] : ranges)
        for (auto b : offsets(p.add(base + off, n), base)) out.push_back(b);
    for (auto b : offsets(p.flush(), base)) out.push_back(b);
    return out;
}

std::vector<float> g_buf(4096);
float* const B = g_buf.data();

// ---------------------------------------------------------------- BucketPlan

TEST(BucketPlan, CoalescesAdjacentRangesInEitherDirection) {
    BucketPlan up(100, 0);
    EXPECT_EQ(plan_all(up, B, {{0, 10}, {10, 20}, {30, 5}}), (Buckets{{0, 35}}));
    BucketPlan down(100, 0);  // the backward pass: last view first
    EXPECT_EQ(plan_all(down, B, {{50, 10}, {40, 10}, {30, 10}}), (Buckets{{30, 30}}));
    BucketPlan both(100, 0);  // either end of the open bucket
    EXPECT_EQ(plan_all(both, B, {{20, 10}, {30, 5}, {10, 10}, {35, 1}}), (Buckets{{10, 26}}));
}

TEST(BucketPlan, BridgesGapsUpToGapFloats) {
    BucketPlan p(100, 4);
    // gap 4 after: merged with the gap; gap 5: a new bucket
    EXPECT_TRUE(p.add(B, 10).empty());
    EXPECT_TRUE(p.add(B + 14, 6).empty());
    EXPECT_EQ(offsets(p.add(B + 25, 5), B), (Buckets{{0, 20}}));
    EXPECT_EQ(offsets(p.flush(), B), (Buckets{{25, 5}}));
    BucketPlan down(100, 4);  // gap 4 before the bucket, then gap 3
    EXPECT_EQ(plan_all(down, B, {{60, 10}, {52, 4}, {40, 9}}), (Buckets{{40, 30}}));
    // A gap that holds an already closed range is not bridged (it would be reduced twice).
    BucketPlan closed(100, 4);
    EXPECT_EQ(plan_all(closed, B, {{8, 2}, {40, 10}, {0, 8}, {12, 3}}),
              (Buckets{{8, 2}, {40, 10}, {0, 8}, {12, 3}}));
    BucketPlan none(100, 0);  // gap_floats 0: one float apart is not adjacent
    EXPECT_EQ(plan_all(none, B, {{0, 10}, {11, 10}}), (Buckets{{0, 10}, {11, 10}}));
}

TEST(BucketPlan, NonAdjacentRangesStartNewBuckets) {
    BucketPlan p(100, 2);
    EXPECT_TRUE(p.add(B, 10).empty());
    EXPECT_EQ(offsets(p.add(B + 100, 10), B), (Buckets{{0, 10}}));
    EXPECT_EQ(offsets(p.add(B + 50, 10), B), (Buckets{{100, 10}}));
    EXPECT_EQ(offsets(p.flush(), B), (Buckets{{50, 10}}));
    EXPECT_TRUE(p.flush().empty());
}

TEST(BucketPlan, ClosesFullBucketsAndNeverExceedsTheSize) {
    BucketPlan p(32, 0);
    EXPECT_TRUE(p.add(B, 20).empty());
    EXPECT_EQ(offsets(p.add(B + 20, 12), B), (Buckets{{0, 32}}));  // exactly full: closed now
    EXPECT_TRUE(p.add(B + 32, 20).empty());
    EXPECT_EQ(offsets(p.add(B + 52, 20), B), (Buckets{{32, 20}}));  // 40 > 32: not merged
    EXPECT_EQ(offsets(p.flush(), B), (Buckets{{52, 20}}));
    BucketPlan gap(32, 4);  // the bridged gap counts towards the size
    EXPECT_EQ(plan_all(gap, B, {{0, 14}, {16, 16}, {34, 2}}), (Buckets{{0, 32}, {34, 2}}));
    BucketPlan q(32, 4);
    EXPECT_EQ(plan_all(q, B, {{0, 14}, {18, 15}}), (Buckets{{0, 14}, {18, 15}}));  // 33 > 32
}

TEST(BucketPlan, SplitsOversizeRanges) {
    BucketPlan up(10, 0);
    EXPECT_EQ(offsets(up.add(B, 25), B), (Buckets{{0, 10}, {10, 10}}));
    EXPECT_EQ(offsets(up.add(B + 25, 5), B), (Buckets{{20, 10}}));  // remainder + next: full
    EXPECT_TRUE(up.flush().empty());
    BucketPlan exact(10, 0);
    EXPECT_EQ(plan_all(exact, B, {{0, 20}}), (Buckets{{0, 10}, {10, 10}}));
    // Descending (the previous range lay above): the remainder stays at the low end, where the
    // next range arrives.
    BucketPlan down(10, 0);
    EXPECT_TRUE(down.add(B + 100, 3).empty());
    EXPECT_EQ(offsets(down.add(B + 70, 25), B), (Buckets{{100, 3}, {85, 10}, {75, 10}}));
    EXPECT_EQ(offsets(down.add(B + 65, 5), B), (Buckets{{65, 10}}));
    EXPECT_TRUE(down.flush().empty());
    // The direction carries over to the next step's first range.
    EXPECT_EQ(offsets(down.add(B + 200, 15), B), (Buckets{{205, 10}}));
    EXPECT_EQ(offsets(down.flush(), B), (Buckets{{200, 5}}));
}

TEST(BucketPlan, RefusesOverlapsWithinAStep) {
    BucketPlan p(100, 4);
    p.add(B, 10);
    EXPECT_THROW(p.add(B + 5, 10), ctx::Error);  // the open bucket
    BucketPlan q(100, 0);
    q.add(B, 10);
    q.add(B + 50, 10);  // closes [0, 10)
    try {
        q.add(B + 9, 1);
        FAIL() << "no error";
    } catch (const ctx::Error& e) {
        EXPECT_NE(std::string(e.what()).find("overlaps a range"), std::string::npos) << e.what();
    }
    BucketPlan g(100, 4);
    g.add(B, 10);
    g.add(B + 12, 4);                             // bridges [10, 12)
    EXPECT_THROW(g.add(B + 10, 2), ctx::Error);   // inside the bridged gap
    g.flush();
    EXPECT_NO_THROW(g.add(B + 10, 2));            // a new step forgets the old ranges
}

TEST(BucketPlan, EdgeCases) {
    EXPECT_THROW(BucketPlan(0, 0), ctx::Error);
    BucketPlan p(8, 0);
    EXPECT_TRUE(p.add(B, 0).empty());
    EXPECT_TRUE(p.add(nullptr, 0).empty());
    EXPECT_THROW(p.add(nullptr, 3), ctx::Error);
    EXPECT_TRUE(p.flush().empty());
    BucketPlan one(1, 0);
    EXPECT_EQ(plan_all(one, B, {{0, 3}}), (Buckets{{0, 1}, {1, 1}, {2, 1}}));
}

// Random arena-like layouts, random orders: the buckets cover every range exactly once, each
// is within the size, and whatever else they cover is padding of at most gap_floats.
TEST(BucketPlan, RandomLayoutsCoverEveryRangeOnce) {
    std::mt19937 rng(7);
    for (int trial = 0; trial < 300; trial++) {
        // Gaps may only be bridged when the memory between ranges is padding: ranges given in
        // arbitrary order (trial % 3 == 1) could put a later range inside a bridged gap (the
        // plan refuses that), so those trials merge touching ranges only.
        const size_t bucket = 1 + rng() % 200, gap = trial % 3 == 1 ? 0 : rng() % 6;
        std::vector<int> owner(g_buf.size(), -1);  // range index per float, -1 padding
        std::vector<std::pair<long, size_t>> ranges;
        long off = long(rng() % 5);
        while (true) {
            // (two statements: the order of two rng() calls in one expression is unspecified,
            // and compilers differ)
            const bool long_range = rng() % 4 == 0;
            const size_t n = 1 + rng() % (long_range ? 400 : 40);
            if (off + long(n) + 20 > long(g_buf.size())) break;
            for (size_t i = 0; i < n; i++) owner[off + i] = int(ranges.size());
            ranges.push_back({off, n});
            const bool padded = rng() % 3 == 0;
            off += long(n) + long(padded ? rng() % 12 : 0);
        }
        if (trial % 3 == 0) std::reverse(ranges.begin(), ranges.end());
        if (trial % 3 == 1) std::shuffle(ranges.begin(), ranges.end(), rng);
        BucketPlan p(bucket, gap);
        const Buckets got = plan_all(p, B, ranges);
        std::vector<int> hits(g_buf.size(), 0);
        for (auto [boff, bn] : got) {
            ASSERT_GE(bn, 1u);
            ASSERT_LE(bn, bucket) << "trial " << trial;
            size_t run = 0;  // padding inside a bucket comes in runs of at most gap
            for (size_t i = boff; i < boff + bn; i++) {
                hits[i]++;
                run = owner[i] < 0 ? run + 1 : 0;
                ASSERT_LE(run, gap) << "trial " << trial << " float " << i;
            }
            ASSERT_GE(owner[boff], 0);  // buckets start and end on range data
            ASSERT_GE(owner[boff + bn - 1], 0);
        }
        for (size_t i = 0; i < g_buf.size(); i++) {
            if (owner[i] >= 0) {
                ASSERT_EQ(hits[i], 1) << "trial " << trial << " float " << i;
            } else {
                ASSERT_LE(hits[i], 1);
            }
        }
    }
}

// ---------------------------------------------------------------- identity, factory, env

ctx::Backend& cpu_backend() {
    static std::unique_ptr<ctx::Backend> be = ctx::make_cpu_backend(1);
    return *be;
}

TEST(GradReducer, IdentityLeavesGradientsAndChecksTheCallOrder) {
    auto comm = ctx::make_single_comm();
    ctx::GradReduceOptions o;
    o.bucket_bytes = 64 * sizeof(float);
    auto red = ctx::make_grad_reducer(cpu_backend(), *comm, o);
    EXPECT_NE(red->name().find("identity"), std::string::npos) << red->name();
    const grcase::Layout l = grcase::make_layout();
    for (int step = 0; step < 2; step++) {
        std::vector<float> g = grcase::fill(l, 0, step, grcase::rough_value);
        const std::vector<float> before = g;
        red->begin();
        for (auto [off, n] : l.ranges) red->ready(g.data() + off, n);
        red->finish();
        EXPECT_EQ(grcase::first_bit_difference(g, before), -1);
    }
    std::vector<float> g(64);
    EXPECT_THROW(red->ready(g.data(), 4), ctx::Error);  // outside a step
    EXPECT_THROW(red->finish(), ctx::Error);
    red->begin();
    EXPECT_THROW(red->begin(), ctx::Error);  // previous step not finished
    red->ready(g.data(), 8);
    EXPECT_THROW(red->ready(g.data() + 4, 8), ctx::Error);  // overlap
    red->finish();
}

TEST(GradReducer, FactoryRefusesBadOptions) {
    auto comm = ctx::make_single_comm();
    auto expect_error = [&](const ctx::GradReduceOptions& o, const std::string& words) {
        try {
            ctx::make_grad_reducer(cpu_backend(), *comm, o);
            ADD_FAILURE() << "no error, expected: " << words;
        } catch (const ctx::Error& e) {
            EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
        }
    };
    ctx::GradReduceOptions o;
    o.bucket_bytes = 3;
    expect_error(o, "at least 4 bytes");
    o.bucket_bytes = (size_t(INT_MAX) + 1) * sizeof(float);
    expect_error(o, "too large");
    o = {};
    o.precision = ctx::ReducePrecision::Bf16;
    expect_error(o, "bf16 needs the CUDA backend");
}

// Where a bucket meets the shards of the ranks: pieces tile it in rank order.
TEST(GradReducer, ShardPiecesTileTheBucket) {
    std::vector<float> arena(100);
    const ctx::GradShards s{arena.data(), 32};
    std::vector<size_t> off, cnt;
    ASSERT_TRUE(ctx::shard_pieces(s, 3, arena.data() + 20, 50, off, cnt));  // [20, 70)
    EXPECT_EQ(off, (std::vector<size_t>{0, 12, 44}));
    EXPECT_EQ(cnt, (std::vector<size_t>{12, 32, 6}));
    ASSERT_TRUE(ctx::shard_pieces(s, 3, arena.data() + 40, 8, off, cnt));  // inside shard 1
    EXPECT_EQ(cnt, (std::vector<size_t>{0, 8, 0}));
    EXPECT_EQ(off[1], 0u);
    ASSERT_TRUE(ctx::shard_pieces(s, 3, arena.data() + 64, 32, off, cnt));  // ends at 3 S
    EXPECT_EQ(cnt, (std::vector<size_t>{0, 0, 32}));
    EXPECT_FALSE(ctx::shard_pieces(s, 3, arena.data() + 90, 10, off, cnt));  // beyond 3 S
    EXPECT_FALSE(ctx::shard_pieces(s, 2, arena.data() + 60, 10, off, cnt));  // beyond 2 S
    EXPECT_FALSE(ctx::shard_pieces({}, 3, arena.data(), 10, off, cnt));      // no sharding
}

TEST(GradReducer, PrecisionNames) {
    EXPECT_EQ(ctx::reduce_precision_from_name("fp32"), ctx::ReducePrecision::Fp32);
    EXPECT_EQ(ctx::reduce_precision_from_name("bf16"), ctx::ReducePrecision::Bf16);
    EXPECT_STREQ(ctx::reduce_precision_name(ctx::ReducePrecision::Bf16), "bf16");
    EXPECT_STREQ(ctx::reduce_precision_name(ctx::ReducePrecision::Fp32), "fp32");
    try {
        ctx::reduce_precision_from_name("fp16");
        FAIL() << "no error";
    } catch (const ctx::Error& e) {
        EXPECT_NE(std::string(e.what()).find("'fp16' (expected fp32 or bf16)"), std::string::npos)
            << e.what();
    }
}

TEST(GradReducer, LocalRankFromEnvironment) {
    const char* vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID",
                          "LOCAL_RANK"};
    std::vector<std::pair<std::string, std::string>> saved;
    for (const char* v : vars) {
        if (const char* x = std::getenv(v)) saved.push_back({v, x});
        unsetenv(v);
    }
    EXPECT_EQ(ctx::local_rank_from_env(), 0);
    setenv("LOCAL_RANK", "5", 1);
    EXPECT_EQ(ctx::local_rank_from_env(), 5);
    setenv("SLURM_LOCALID", "3", 1);
    EXPECT_EQ(ctx::local_rank_from_env(), 3);  // earlier in the list wins
    setenv("MPI_LOCALRANKID", "2", 1);
    EXPECT_EQ(ctx::local_rank_from_env(), 2);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    EXPECT_EQ(ctx::local_rank_from_env(), 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "x1", 1);
    try {
        ctx::local_rank_from_env();
        ADD_FAILURE() << "no error";
    } catch (const ctx::Error& e) {
        EXPECT_NE(std::string(e.what()).find("OMPI_COMM_WORLD_LOCAL_RANK='x1'"),
                  std::string::npos)
            << e.what();
    }
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "-1", 1);
    EXPECT_THROW(ctx::local_rank_from_env(), ctx::Error);
    for (const char* v : vars) unsetenv(v);
    for (auto& [k, v] : saved) setenv(k.c_str(), v.c_str(), 1);
}

// ---------------------------------------------------------------- MPI (under mpirun)

ctx::Comm* world() { return ctx::test::mpi_world(); }

#define REQUIRE_MPI_WORLD()                                                                   \
    if (world() == nullptr || world()->size() < 2)                                          \
    GTEST_SKIP() << "needs 2+ ranks: ctest -R mpi.grad_reducer (mpirun -np 2 "              \
                    "test_grad_reducer --gtest_filter=GradReducerMpi.*)"

// A failure inside a collective on one rank would leave the others waiting: end them all.
template <class F>
void on_every_rank(F body) {
    try {
        body();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", world()->rank(), e.what());
        ctx::mpi_abort(1);
    }
}

struct Mode {
    size_t bucket_floats;
    bool overlap, deterministic;
    size_t gap_floats;
    std::string str() const {
        return "bucket " + std::to_string(bucket_floats) + (overlap ? " overlap" : " no-overlap") +
               (deterministic ? " deterministic" : "") + " gap " + std::to_string(gap_floats);
    }
};

std::vector<Mode> all_modes() {
    std::vector<Mode> m;
    for (size_t bucket : {size_t(64), size_t(1000), size_t(25) << 18})
        for (bool overlap : {true, false})
            for (bool det : {false, true})
                for (size_t gap : {size_t(15), size_t(0)}) m.push_back({bucket, overlap, det, gap});
    return m;
}

// Runs two steps of a reducer in `mode` on this rank's buffers; returns the buffers after each.
// shard: ZeRO-1 shards of that many floats from the buffer's start (0: none).
template <class F>
std::vector<std::vector<float>> reduce_steps(const Mode& mode, const grcase::Layout& l, F value,
                                             size_t shard = 0) {
    ctx::GradReduceOptions o;
    o.bucket_bytes = mode.bucket_floats * sizeof(float);
    o.overlap = mode.overlap;
    o.deterministic = mode.deterministic;
    o.gap_floats = mode.gap_floats;
    auto red = ctx::make_grad_reducer(cpu_backend(), *world(), o);
    EXPECT_NE(red->name().find("mpi"), std::string::npos) << red->name();
    std::vector<std::vector<float>> out;
    for (int step = 0; step < 2; step++) {
        std::vector<float> g = grcase::fill(l, world()->rank(), step, value);
        if (shard > 0) red->set_shards({g.data(), shard});
        red->begin();
        for (auto [off, n] : l.ranges) red->ready(g.data() + off, n);
        red->finish();
        out.push_back(std::move(g));
    }
    return out;
}

TEST(GradReducerMpi, ExactSumsInEveryMode) {
    REQUIRE_MPI_WORLD();
    on_every_rank([] {
        const int W = world()->size(), rank = world()->rank();
        const grcase::Layout l = grcase::make_layout();
        for (const Mode& mode : all_modes()) {
            const auto got = reduce_steps(mode, l, grcase::exact_value);
            for (int step = 0; step < 2; step++) {
                // independent reference: double sums (exact for these values); padding 0; the
                // tail keeps this rank's values
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
    });
}

TEST(GradReducerMpi, DeterministicIsTheRankOrderedSumBitForBit) {
    REQUIRE_MPI_WORLD();
    on_every_rank([] {
        const int W = world()->size(), rank = world()->rank();
        const grcase::Layout l = grcase::make_layout();
        if (W >= 3) {
            EXPECT_GT(grcase::order_sensitive(l, W, 0, grcase::rough_value), 100u);
        }
        for (const Mode& mode : all_modes()) {
            if (!mode.deterministic) continue;
            const auto got = reduce_steps(mode, l, grcase::rough_value);
            for (int step = 0; step < 2; step++) {
                const auto want = grcase::rank_ordered_sum(l, W, rank, step, grcase::rough_value);
                EXPECT_EQ(grcase::first_bit_difference(got[step], want), -1)
                    << mode.str() << " step " << step;
            }
        }
    });
}

// Rounded sums: close to the double sum; identical on every rank; the same with and without
// overlap (bit for bit with 2 ranks, where any order gives the same fp32 sum).
TEST(GradReducerMpi, RoundedSumsAgreeAcrossRanksAndOverlapModes) {
    REQUIRE_MPI_WORLD();
    on_every_rank([] {
        const int W = world()->size(), rank = world()->rank();
        const grcase::Layout l = grcase::make_layout();
        for (size_t bucket : {size_t(64), size_t(25) << 18}) {
            const auto on = reduce_steps({bucket, true, false, 15}, l, grcase::rough_value);
            const auto off = reduce_steps({bucket, false, false, 15}, l, grcase::rough_value);
            for (int step = 0; step < 2; step++) {
                const std::vector<float>& g = on[step];
                for (size_t i = 0; i < l.tail; i++) {
                    if (!grcase::in_ranges(l, i)) {
                        ASSERT_EQ(g[i], 0.0f) << "padding " << i;
                        continue;
                    }
                    double s = 0, mag = 0;
                    for (int r = 0; r < W; r++) {
                        s += grcase::rough_value(r, step, i);
                        mag += std::fabs(grcase::rough_value(r, step, i));
                    }
                    ASSERT_LE(std::fabs(g[i] - s), W * 1.2e-7 * mag) << "float " << i;
                }
                const auto own = grcase::fill(l, rank, step, grcase::rough_value);
                for (size_t i = l.tail; i < l.total; i++) ASSERT_EQ(g[i], own[i]);
                if (W == 2) {
                    EXPECT_EQ(grcase::first_bit_difference(on[step], off[step]), -1);
                }
                // every rank holds the same bits
                std::vector<float> all(size_t(W) * l.tail);
                world()->allgather(g.data(), l.tail * sizeof(float), all.data());
                for (int r = 1; r < W; r++)
                    EXPECT_EQ(std::memcmp(all.data(), all.data() + size_t(r) * l.tail,
                                          l.tail * sizeof(float)),
                              0)
                        << "rank " << r << " differs from rank 0, bucket " << bucket;
            }
        }
    });
}

// ZeRO-1: with shards set, this rank's shard holds the exact sums (every mode; deterministic
// mode sums everything), and allgather_shards hands every rank's shard to every rank.
TEST(GradReducerMpi, ReduceScatterSumsThisRanksShard) {
    REQUIRE_MPI_WORLD();
    on_every_rank([] {
        const int W = world()->size(), rank = world()->rank();
        const grcase::Layout l = grcase::make_layout();
        const size_t S = ((l.tail + W - 1) / W + 15) / 16 * 16;
        const size_t lo = std::min(l.tail, size_t(rank) * S), hi = std::min(l.tail, lo + S);
        size_t checked = 0;
        for (const Mode& mode : all_modes()) {
            const auto got = reduce_steps(mode, l, grcase::exact_value, S);
            for (int step = 0; step < 2; step++) {
                const auto own = grcase::fill(l, rank, step, grcase::exact_value);
                for (size_t i = 0; i < l.tail; i++) {
                    if (!grcase::in_ranges(l, i)) continue;
                    double sum = 0;
                    for (int r = 0; r < W; r++) sum += grcase::exact_value(r, step, i);
                    if ((i >= lo && i < hi) || mode.deterministic) {
                        ASSERT_EQ(got[step][i], float(sum)) << mode.str() << " float " << i;
                        checked++;
                    }
                }
                for (size_t i = l.tail; i < l.total; i++)
                    ASSERT_EQ(got[step][i], own[i]) << mode.str() << " tail " << i;
            }
        }
        EXPECT_GT(checked, 0u);
        // The parameter all-gather (in place, the last shard shorter).
        const size_t n = l.tail;
        std::vector<float> p(n, -1.0f);
        for (size_t i = lo; i < hi; i++) p[i] = float(rank * 100000 + int(i));
        auto red = ctx::make_grad_reducer(cpu_backend(), *world(), {});
        red->allgather_shards(p.data(), n, S);
        for (size_t i = 0; i < n; i++)
            ASSERT_EQ(p[i], float(int(i / S) * 100000 + int(i))) << "float " << i;
    });
}

TEST(GradReducerMpi, RefusesWhatTheHostPathCannotDo) {
    REQUIRE_MPI_WORLD();
    ctx::GradReduceOptions o;
    o.precision = ctx::ReducePrecision::Bf16;
    EXPECT_THROW(ctx::make_grad_reducer(cpu_backend(), *world(), o), ctx::Error);
    // A communicator that is not the MPI world (here: a world of one) gives the identity.
    auto single = ctx::make_single_comm();
    EXPECT_NE(ctx::make_grad_reducer(cpu_backend(), *single, {})->name().find("identity"),
              std::string::npos);
}

}  // namespace

int main(int argc, char** argv) { return ctx::test::mpi_gtest_main(argc, argv); }
