// Deterministic random numbers: xoshiro256** seeded through splitmix64. The 4-word state is plain
// data so checkpoints can save and restore it exactly (DESIGN.md decision 8).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

#include "ctx/plugin.h"

namespace ctx {

class Rng {
public:
    explicit Rng(uint64_t seed = 0) { reseed(seed); }

    void reseed(uint64_t seed) {
        uint64_t x = seed;
        for (auto& w : state_) {
            x += 0x9E3779B97F4A7C15ull;  // splitmix64
            uint64_t z = x;
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            w = z ^ (z >> 31);
        }
        has_spare_ = false;
    }

    uint64_t next_u64() { return ctx_rng_next_u64(state_.data()); }
    // Uniform in [0, 1) with 53 random bits.
    double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
    double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
    // Uniform integer in [0, n) without modulo bias.
    uint64_t below(uint64_t n) {
        const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
        uint64_t r;
        do r = next_u64(); while (r >= limit);
        return r % n;
    }
    // Standard normal (Box-Muller, both values used).
    double normal() {
        if (has_spare_) {
            has_spare_ = false;
            return spare_;
        }
        double u1;
        do u1 = uniform(); while (u1 <= 0.0);
        const double u2 = uniform();
        const double r = std::sqrt(-2.0 * std::log(u1));
        spare_ = r * std::sin(2.0 * M_PI * u2);
        has_spare_ = true;
        return r * std::cos(2.0 * M_PI * u2);
    }

    // Full state for checkpoints (the Box-Muller spare included, so resume is bit-exact).
    struct State {
        std::array<uint64_t, 4> words;
        bool has_spare;
        double spare;
    };
    State state() const { return {state_, has_spare_, spare_}; }
    void set_state(const State& s) {
        state_ = s.words;
        has_spare_ = s.has_spare;
        spare_ = s.spare;
    }

private:
    std::array<uint64_t, 4> state_{};
    bool has_spare_ = false;
    double spare_ = 0.0;
};

}  // namespace ctx
