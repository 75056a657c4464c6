// RingSpans (engine/backend/cuda/upload_ring.h), the bookkeeping of the CUDA backend's
// page-locked upload ring: a span is handed out again only after the reader of every span it
// overlaps has finished, and the caller is told to wait only for a reader whose span it
// overlaps. Plain C++: runs in every build, GPU or not.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "backend/cuda/upload_ring.h"
#include "core/error.h"

namespace ctx::cuda {
namespace {

TEST(UploadRing, WrapsAndWaitsForTheYoungestOverlappingReader) {
    RingSpans r(1024);
    uint64_t wait = 99;
    EXPECT_EQ(r.reserve(200, 1, &wait), 0u);  // rounded up to 256
    EXPECT_EQ(wait, 0u);
    EXPECT_EQ(r.reserve(256, 2, &wait), 256u);
    EXPECT_EQ(r.reserve(1, 3, &wait), 512u);
    EXPECT_EQ(r.reserve(256, 4, &wait), 768u);
    EXPECT_EQ(wait, 0u);
    EXPECT_EQ(r.live(), 4u);
    // Full: the next span starts the ring again, over ticket 1's.
    EXPECT_EQ(r.reserve(10, 5, &wait), 0u);
    EXPECT_EQ(wait, 1u);
    EXPECT_EQ(r.live(), 4u);  // 2, 3, 4, 5
    // 512 bytes from 256 cover tickets 2 and 3: waiting for 3 covers 2 as well.
    EXPECT_EQ(r.reserve(512, 6, &wait), 256u);
    EXPECT_EQ(wait, 3u);
    EXPECT_EQ(r.live(), 3u);  // 4, 5, 6
    // 300 bytes (512 rounded) do not fit before the end: the tail is skipped, the ring restarts
    // at 0, over 5 and 6 (4, older and not overlapping, is finished once 6 is).
    EXPECT_EQ(r.reserve(300, 7, &wait), 0u);
    EXPECT_EQ(wait, 6u);
    EXPECT_EQ(r.live(), 1u);
    EXPECT_EQ(r.oldest(), 7u);
    r.retire(7);
    EXPECT_EQ(r.live(), 0u);
    EXPECT_EQ(r.reserve(256, 8, &wait), 512u);
    EXPECT_EQ(wait, 0u);
}

TEST(UploadRing, RefusesSpansLargerThanTheRingAndOldTickets) {
    RingSpans r(1000);  // rounded down to 768
    EXPECT_EQ(r.capacity(), 768u);
    uint64_t wait = 0;
    EXPECT_THROW(r.reserve(769, 1, &wait), Error);
    EXPECT_THROW(r.reserve(0, 1, &wait), Error);
    EXPECT_EQ(r.reserve(768, 5, &wait), 0u);
    EXPECT_THROW(r.reserve(1, 5, &wait), Error);  // tickets increase
    RingSpans none;
    EXPECT_THROW(none.reserve(1, 1, &wait), Error);
}

// A simulated device finishes readers in ticket order, at random, behind the host: no live
// (unfinished) span ever overlaps a new one once the host has waited as told, every wait is for
// a reader whose span overlaps the new one, and spans lie aligned inside the ring.
TEST(UploadRing, RandomTrafficNeverOverwritesASpanBeingRead) {
    std::mt19937_64 rng(7);
    for (size_t cap : {size_t(4096), size_t(1) << 16}) {
        RingSpans r(cap);
        struct Span {
            size_t lo, hi;
            uint64_t ticket;
        };
        std::vector<Span> issued;
        uint64_t finished = 0;  // the device has finished every ticket <= finished
        size_t waits = 0;
        for (uint64_t t = 1; t <= 5000; ++t) {
            const size_t bytes = 1 + rng() % (rng() % 4 == 0 ? cap : cap / 8);
            uint64_t wait = 0;
            const size_t lo = r.reserve(bytes, t, &wait);
            const size_t hi =
                lo + (bytes + RingSpans::kAlign - 1) / RingSpans::kAlign * RingSpans::kAlign;
            ASSERT_EQ(lo % RingSpans::kAlign, 0u);
            ASSERT_LE(hi, r.capacity());
            if (wait != 0) {
                ASSERT_LT(wait, t);
                const Span& w = issued[wait - 1];
                ASSERT_TRUE(w.lo < hi && lo < w.hi)
                    << "waited for ticket " << wait << " whose span does not overlap";
                if (wait > finished) ++waits;
                finished = std::max(finished, wait);  // the host waits
            }
            for (uint64_t k = finished + 1; k < t; ++k) {
                const Span& s = issued[k - 1];
                ASSERT_FALSE(s.lo < hi && lo < s.hi)
                    << "ticket " << t << " [" << lo << ", " << hi << ") overwrites live ticket "
                    << k << " [" << s.lo << ", " << s.hi << ")";
            }
            issued.push_back({lo, hi, t});
            // The device catches up by a random amount, on average less than a ticket a step
            // (so it falls a ring behind and the host must wait); sometimes the host learns of it.
            finished = std::min<uint64_t>(t, finished + (rng() % 4 == 0 ? rng() % 8 : 0));
            if (rng() % 2 == 0) r.retire(finished);
            ASSERT_LE(r.live(), r.capacity() / RingSpans::kAlign);
        }
        EXPECT_GT(waits, 100u) << "the traffic seldom filled the ring: the test checked little";
    }
}

}  // namespace
}  // namespace ctx::cuda
