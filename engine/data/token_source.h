// A tiny in-memory data source for smoke training and tests: one token stream, rows are random
// contiguous windows with positions 0..T-1. (Long-document shards and samplers are separate.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"
#include "data/batch.h"

namespace ctx {

class TokenSource {
public:
    TokenSource(std::vector<int32_t> tokens, int vocab_size);
    // Bytes of text as tokens 0..255.
    static TokenSource from_text(const std::string& text);

    const std::vector<int32_t>& tokens() const { return tokens_; }
    int vocab_size() const { return vocab_size_; }
    // Fills B rows of T tokens: a random start s in [0, n - T - 1], tokens[s .. s+T),
    // targets[s+1 .. s+T], positions 0..T-1, mask 1.
    void sample(BatchBuffers& out, int B, int T, Rng& rng) const;
    // Row r of the deterministic evaluation split: windows at r*T (non-overlapping); returns
    // how many full windows the stream holds.
    int64_t num_windows(int T) const;
    void window(BatchBuffers& out, int64_t first, int B, int T) const;

private:
    std::vector<int32_t> tokens_;
    int vocab_size_;
};

}  // namespace ctx
