// Training rows from windows through a sampler plugin, deterministic and restartable, and the
// in-order evaluation iterator (METHODS.md 3.1 - 3.3).
//
// Determinism. Epoch e visits the windows in a permutation drawn from (seed, e). With B rows per
// rank and W ranks, the global batch at cursor index i is rows i .. i + W*B - 1 of that order
// and rank r takes rows [i + r*B, i + (r+1)*B). The sampler's rng_state for a row is seeded from
// (seed, e, global row index in the epoch) only, never from the rank, so the global batch
// depends on W*B and not on how it is split: 1 rank with 2B rows == 2 ranks with B rows.
//
// Epoch wrap (ours): every global batch comes from one epoch. When fewer than W*B rows remain in
// an epoch, they are skipped and the stream starts the next epoch at index 0 (drop-last, as
// PyTorch's DistributedSampler with drop_last). Each epoch's permutation differs, so a window
// skipped in one epoch is seen in others; rows per epoch = floor(n_windows / (W*B)) * W*B.
#pragma once

#include <cstdint>
#include <vector>

#include "data/packed_docs.h"
#include "data/shard.h"
#include "data/token_source.h"
#include "data/windows.h"
#include "data/row_sampler.h"

namespace ctx {

struct StreamCursor {
    int64_t epoch = 0;
    int64_t index = 0;  // first row (in the epoch's order) of the next global batch
    bool operator==(const StreamCursor&) const = default;
};

struct RowStreamConfig {
    int64_t window_len = 0;  // Le: each window holds window_len + 1 tokens
    int64_t row_len = 0;     // Lt: tokens per row the sampler returns
    int batch_size = 0;      // rows per rank per batch (B)
    int rank = 0, world = 1;
    uint64_t seed = 0;
    // Packed rows: the documents must be a PackedDocs; each row gets doc_start, positions per
    // PackPositions, and no loss on a target that may come from the next document.
    PackPositions pack = PackPositions::None;
};

// The seeds behind the stream, exposed so tests and tools can reproduce a row.
uint64_t epoch_permutation_seed(uint64_t seed, int64_t epoch);
uint64_t row_rng_seed(uint64_t seed, int64_t epoch, int64_t row);
// The visiting order of epoch `epoch`: a permutation of 0 .. n_windows-1.
std::vector<int64_t> epoch_order(int64_t n_windows, uint64_t seed, int64_t epoch);

class RowStream {
public:
    // docs and sampler must outlive the stream. windows must be of config.window_len and there
    // must be at least world * batch_size of them.
    RowStream(const DocStore& docs, std::vector<Window> windows, RowSampler& sampler,
              const RowStreamConfig& config);

    // This rank's B rows of the next global batch into out (resized to B x row_len); then the
    // cursor advances by world * B (wrapping to the next epoch as described above).
    void next(BatchBuffers& out);

    StreamCursor cursor() const { return cursor_; }
    // Restores a cursor from a checkpoint; the continuation is identical to the original run.
    void set_cursor(const StreamCursor& c);

    int64_t num_windows() const { return static_cast<int64_t>(windows_.size()); }
    int64_t global_batch() const { return global_; }
    int64_t batches_per_epoch() const { return num_windows() / global_; }
    const RowStreamConfig& config() const { return cfg_; }

private:
    void normalize();                // wraps the cursor when a full batch no longer fits
    const std::vector<int64_t>& order();  // the cached permutation of cursor_.epoch
    // Packed rows: documents of row b's tokens from the sampler's sources (window w).
    void apply_packing(BatchBuffers& out, int b, const Window& w);

    const DocStore& docs_;
    std::vector<Window> windows_;
    RowSampler& sampler_;
    RowStreamConfig cfg_;
    int64_t global_ = 0;
    StreamCursor cursor_;
    int64_t order_epoch_ = -1;
    std::vector<int64_t> order_;
    std::vector<int32_t> window_buf_;
    const PackedDocs* packed_ = nullptr;  // docs_ when cfg_.pack != None
    std::vector<int64_t> source_buf_;     // (row_len) the sampler's token sources
    std::vector<PackedDocs::Span> doc_buf_;  // (row_len) each token's document
};

// All windows of a split in their given order, whole (positions 0 .. Le-1, every target the
// next token, mask 1), for perplexity: no sampler, no randomness. The last batch may be
// partial: its missing rows are zero tokens with mask 0.
class EvalIterator {
public:
    EvalIterator(const DocStore& docs, std::vector<Window> windows, int64_t window_len,
                 int batch_size);
    // Fills out (batch_size x window_len) with the next windows; returns how many rows are
    // real (0 when the split is exhausted).
    int next(BatchBuffers& out);
    void reset() { next_ = 0; }
    int64_t num_windows() const { return static_cast<int64_t>(windows_.size()); }
    int64_t position() const { return next_; }  // windows consumed so far
    const std::vector<Window>& windows() const { return windows_; }

private:
    const DocStore& docs_;
    std::vector<Window> windows_;
    int64_t window_len_;
    int batch_size_;
    int64_t next_ = 0;
    std::vector<int32_t> buf_;
};

}  // namespace ctx
