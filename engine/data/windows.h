// METHODS.md 3.1: documents -> non-overlapping windows of Le tokens, and train/validation/test
// splits by document.
//
// A document of n tokens yields floor((n - 1) / Le) windows; window k covers tokens
// [k*Le, k*Le + Le] INCLUSIVE: Le trained tokens plus one more that is only the last target.
// Consecutive windows share that boundary token (the target of window k is the first input of
// window k+1) but never a trained token. The remainder is discarded; a document with n <= Le
// yields nothing (dropped for this Le).
#pragma once

#include <cstdint>
#include <vector>

#include "data/shard.h"

namespace ctx {

struct Window {
    int64_t doc = 0;    // document index in its DocStore
    int64_t start = 0;  // first token; the window reads tokens [start, start + Le]
    bool operator==(const Window&) const = default;
};

inline int64_t windows_in_doc(int64_t n_tokens, int64_t window_len) {
    return n_tokens >= 1 ? (n_tokens - 1) / window_len : 0;
}

// Windows of the listed documents (ids into doc_lengths, any order; windows follow it), then k.
// window_len must be positive.
std::vector<Window> make_windows(const std::vector<int64_t>& doc_lengths, int64_t window_len,
                                 const std::vector<int64_t>& doc_ids);
std::vector<Window> make_windows(const DocStore& docs, int64_t window_len);

// A split of document ids 0..n_docs-1. Each list is sorted ascending; the three are disjoint
// and cover every document.
struct DocSplit {
    std::vector<int64_t> train, val, test;
};

// Deterministic from (n_docs, fractions, seed): a seeded shuffle of the ids, the first
// round(n * val_fraction) go to val, the next round(n * test_fraction) to test, the rest to
// train. Fractions must be in [0, 1] with val + test <= 1.
DocSplit split_documents(int64_t n_docs, double val_fraction, double test_fraction,
                         uint64_t seed);

}  // namespace ctx
