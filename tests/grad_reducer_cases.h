// Shared by test_grad_reducer.cpp (MPI, host memory) and test_gpu_nccl.cpp (NCCL, device
// memory): a gradient buffer laid out like model/arena.h (ranges start at multiples of 16 floats,
// zero padding between them) plus a tail no range covers, per-rank values every rank can compute
// for every rank, and the references the reducers are checked against.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace grcase {

struct Layout {
    size_t total = 0;
    // (offset, n) in the order the test gives them to ready(): backward-like (last view first)
    // with a few swaps, so ranges arrive adjacent in both directions and out of order.
    std::vector<std::pair<size_t, size_t>> ranges;
    size_t tail = 0;  // [tail, total) is never given to ready(): it must keep this rank's values
};

inline Layout make_layout() {
    const size_t sizes[] = {37, 16, 300, 5, 1024, 64, 13, 700, 1, 48, 129};
    Layout l;
    size_t off = 0;
    std::vector<std::pair<size_t, size_t>> placed;
    for (size_t n : sizes) {
        placed.push_back({off, n});
        off = (off + n + 15) / 16 * 16;  // next view aligned to 16 floats; the gap is padding
    }
    const int order[] = {10, 9, 8, 6, 7, 5, 4, 2, 3, 0, 1};
    for (int k : order) l.ranges.push_back(placed[k]);
    l.tail = off + 32;  // 32 floats of zero padding: further than any gap the reducer bridges
    l.total = l.tail + 40;
    return l;
}

inline uint64_t mix(uint64_t x) {  // splitmix64
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Small multiples of 1/4: sums over a few ranks are exact in fp32 and in bf16 (|sum| < 64).
inline float exact_value(int rank, int step, size_t i) {
    return float(int((i * 7 + size_t(rank) * 13 + size_t(step) * 5) % 61) - 30) * 0.25f;
}

// Full 24-bit significands over 2^-12 .. 2^12, both signs: sums round, and the rounding depends
// on the order of the terms.
inline float rough_value(int rank, int step, size_t i) {
    const uint64_t h = mix((uint64_t(rank) << 48) ^ (uint64_t(step) << 40) ^ i);
    const float m = 1.0f + float(h & 0xffffff) / float(1 << 24);  // [1, 2)
    const int e = int((h >> 24) % 25) - 12;
    const float v = std::ldexp(m, e);
    return (h >> 60) & 1 ? -v : v;
}

// Rank `rank`'s buffer before the reduction: values in the ranges, zero padding, and a tail of
// values that differ per rank.
template <class F>
std::vector<float> fill(const Layout& l, int rank, int step, F value) {
    std::vector<float> g(l.total, 0.0f);
    for (auto [off, n] : l.ranges)
        for (size_t i = off; i < off + n; i++) g[i] = value(rank, step, i);
    for (size_t i = l.tail; i < l.total; i++) g[i] = -1000.0f * float(rank + 1) - float(i);
    return g;
}

inline bool in_ranges(const Layout& l, size_t i) {
    for (auto [off, n] : l.ranges)
        if (i >= off && i < off + n) return true;
    return false;
}

// The fp32 sum in rank order (the deterministic mode's definition) over the ranges; padding
// stays 0 and the tail keeps `rank`'s values.
template <class F>
std::vector<float> rank_ordered_sum(const Layout& l, int world, int rank, int step, F value) {
    std::vector<float> want = fill(l, rank, step, value);
    for (size_t i = 0; i < l.tail; i++) {
        if (!in_ranges(l, i)) continue;
        float acc = value(0, step, i);
        for (int r = 1; r < world; r++) acc += value(r, step, i);
        want[i] = acc;
    }
    return want;
}

// Elements whose rank-ordered fp32 sum differs from the reverse-ordered one: > 0 shows the data
// can tell the summation orders apart (needs 3 ranks or more).
template <class F>
size_t order_sensitive(const Layout& l, int world, int step, F value) {
    size_t k = 0;
    for (size_t i = 0; i < l.tail; i++) {
        if (!in_ranges(l, i)) continue;
        float fwd = value(0, step, i), bwd = value(world - 1, step, i);
        for (int r = 1; r < world; r++) fwd += value(r, step, i);
        for (int r = world - 2; r >= 0; r--) bwd += value(r, step, i);
        k += std::memcmp(&fwd, &bwd, sizeof fwd) != 0;
    }
    return k;
}

// Index of the first element whose bits differ, or -1.
inline long first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return 0;
    for (size_t i = 0; i < a.size(); i++)
        if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return long(i);
    return -1;
}

}  // namespace grcase
