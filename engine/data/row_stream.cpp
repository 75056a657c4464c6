#include "data/row_stream.h"

#include <algorithm>

#include "core/error.h"
#include "core/rng.h"

namespace ctx {
namespace {

uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Distinct tags keep the permutation stream and the row streams from ever sharing a seed.
constexpr uint64_t kTagPermutation = 0x7065726d75746531ull;  // "permute1"
constexpr uint64_t kTagRow = 0x726f777374726d31ull;          // "rowstrm1"

}  // namespace

uint64_t epoch_permutation_seed(uint64_t seed, int64_t epoch) {
    return mix64(mix64(seed ^ kTagPermutation) ^ static_cast<uint64_t>(epoch));
}

uint64_t row_rng_seed(uint64_t seed, int64_t epoch, int64_t row) {
    return mix64(mix64(mix64(seed ^ kTagRow) ^ static_cast<uint64_t>(epoch)) ^
                 static_cast<uint64_t>(row));
}

std::vector<int64_t> epoch_order(int64_t n_windows, uint64_t seed, int64_t epoch) {
    std::vector<int64_t> order(static_cast<size_t>(n_windows));
    for (int64_t i = 0; i < n_windows; ++i) order[static_cast<size_t>(i)] = i;
    Rng rng(epoch_permutation_seed(seed, epoch));
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
    return order;
}

RowStream::RowStream(const DocStore& docs, std::vector<Window> windows, RowSampler& sampler,
                     const RowStreamConfig& config)
    : docs_(docs), windows_(std::move(windows)), sampler_(sampler), cfg_(config) {
    CTX_CHECK(cfg_.window_len > 0 && cfg_.row_len > 0, "row stream: window_len ({}) and row_len "
              "({}) must be positive", cfg_.window_len, cfg_.row_len);
    CTX_CHECK(cfg_.batch_size > 0 && cfg_.world > 0 && cfg_.rank >= 0 && cfg_.rank < cfg_.world,
              "row stream: need batch_size > 0 and 0 <= rank < world, got batch_size {}, rank {}, "
              "world {}", cfg_.batch_size, cfg_.rank, cfg_.world);
    global_ = static_cast<int64_t>(cfg_.batch_size) * cfg_.world;
    CTX_CHECK(num_windows() >= global_,
              "row stream: {} windows of length {} cannot fill one global batch of {} rows "
              "({} ranks x {}): use more or longer documents, or a smaller batch",
              num_windows(), cfg_.window_len, global_, cfg_.world, cfg_.batch_size);
    for (const Window& w : windows_)
        CTX_CHECK(w.doc >= 0 && w.doc < docs_.n_docs() && w.start >= 0 &&
                      w.start + cfg_.window_len + 1 <= docs_.doc_len(w.doc),
                  "row stream: window (doc {}, start {}) does not fit {} + 1 tokens in the "
                  "document", w.doc, w.start, cfg_.window_len);
    window_buf_.resize(static_cast<size_t>(cfg_.window_len + 1));
    if (cfg_.pack != PackPositions::None) {
        packed_ = dynamic_cast<const PackedDocs*>(&docs_);
        CTX_CHECK(packed_ != nullptr, "row stream: packed rows need packed documents");
        source_buf_.resize(static_cast<size_t>(cfg_.row_len));
        doc_buf_.resize(static_cast<size_t>(cfg_.row_len));
    }
}

void RowStream::set_cursor(const StreamCursor& c) {
    CTX_CHECK(c.epoch >= 0 && c.index >= 0 && c.index <= num_windows(),
              "row stream: cursor (epoch {}, index {}) is invalid for {} windows", c.epoch,
              c.index, num_windows());
    cursor_ = c;
    normalize();
}

void RowStream::normalize() {
    if (cursor_.index + global_ > num_windows()) {
        ++cursor_.epoch;
        cursor_.index = 0;
    }
}

const std::vector<int64_t>& RowStream::order() {
    if (order_epoch_ != cursor_.epoch) {
        order_ = epoch_order(num_windows(), cfg_.seed, cursor_.epoch);
        order_epoch_ = cursor_.epoch;
    }
    return order_;
}

void RowStream::next(BatchBuffers& out) {
    normalize();
    const int B = cfg_.batch_size;
    const int T = static_cast<int>(cfg_.row_len);
    if (out.B != B || out.T != T) out.resize(B, T);
    const std::vector<int64_t>& ord = order();
    for (int b = 0; b < B; ++b) {
        // Global row index within the epoch: what the row's randomness depends on.
        const int64_t row = cursor_.index + static_cast<int64_t>(cfg_.rank) * B + b;
        const Window& w = windows_[static_cast<size_t>(ord[static_cast<size_t>(row)])];
        docs_.read(w.doc, w.start, cfg_.window_len + 1, window_buf_.data());
        auto st = Rng(row_rng_seed(cfg_.seed, cursor_.epoch, row)).state().words;
        const size_t off = static_cast<size_t>(b) * T;
        ctx_sample_row r{out.tokens.data() + off, out.positions.data() + off,
                         out.targets.data() + off, out.mask.data() + off, cfg_.row_len,
                         packed_ ? source_buf_.data() : nullptr};
        if (packed_) std::fill(source_buf_.begin(), source_buf_.end(), int64_t{-1});
        sampler_.sample(window_buf_.data(), cfg_.window_len, st.data(), r);
        if (packed_) apply_packing(out, b, w);
    }
    if (!packed_) out.doc_start.clear();  // a buffer a packed stream filled before
    cursor_.index += global_;
    normalize();
}

void RowStream::apply_packing(BatchBuffers& out, int b, const Window& w) {
    const int T = static_cast<int>(cfg_.row_len);
    if (out.doc_start.size() != out.tokens.size()) out.doc_start.assign(out.tokens.size(), 0);
    const size_t off = static_cast<size_t>(b) * T;
    int32_t* ds = out.doc_start.data() + off;
    float* pos = out.positions.data() + off;
    float* mask = out.mask.data() + off;
    std::vector<PackedDocs::Span>& doc = doc_buf_;  // (T), reused: no allocation per row
    for (int t = 0; t < T; ++t) {
        const int64_t s = source_buf_[static_cast<size_t>(t)];
        CTX_CHECK(s >= 0 && s < cfg_.window_len, "packed rows: the sampler gave no window index "
                  "for token {} (ctx_sample_row.source, plugin ABI 1.4; Lua samplers and older "
                  "plugins do not report it)", t);
        doc[static_cast<size_t>(t)] = packed_->document_at(w.start + s);
        const PackedDocs::Span& d = doc[static_cast<size_t>(t)];
        const bool first = t == 0 || d.begin != doc[static_cast<size_t>(t) - 1].begin;
        CTX_CHECK(first || source_buf_[static_cast<size_t>(t) - 1] < s, "packed rows: the sampler "
                  "reorders tokens (window index {} after {}); documents must stay contiguous",
                  s, source_buf_[static_cast<size_t>(t) - 1]);
        CTX_CHECK(!first || t == 0 || d.begin > doc[static_cast<size_t>(t) - 1].begin,
                  "packed rows: the sampler returns to an earlier document at token {}", t);
        ds[t] = first ? t : ds[t - 1];
    }
    // restart: shift each document's sampler positions so that its first row token sits at its
    // offset from the document's first token in the window (the sampler's spacing, e.g.
    // randomized or PoSE gaps, is kept; samplers at window positions give that offset exactly)
    if (cfg_.pack == PackPositions::Restart) {
        float shift = 0.0f;
        for (int t = 0; t < T; ++t) {
            const PackedDocs::Span& d = doc[static_cast<size_t>(t)];
            if (ds[t] == t) {
                const int64_t offset = w.start + source_buf_[static_cast<size_t>(t)] -
                                       std::max(d.begin, w.start);
                shift = pos[t] - static_cast<float>(offset);
            }
            pos[t] -= shift;
        }
    }
    // No loss where the target may come from another document: the last token of a document,
    // and a token followed in the row by another document (a sampler's segment boundary).
    for (int t = 0; t < T; ++t) {
        const PackedDocs::Span& d = doc[static_cast<size_t>(t)];
        const bool doc_ends = w.start + source_buf_[static_cast<size_t>(t)] + 1 >= d.end;
        const bool next_differs = t + 1 < T && ds[t + 1] == t + 1;
        if (doc_ends || next_differs) mask[t] = 0.0f;
    }
}

EvalIterator::EvalIterator(const DocStore& docs, std::vector<Window> windows, int64_t window_len,
                           int batch_size)
    : docs_(docs), windows_(std::move(windows)), window_len_(window_len), batch_size_(batch_size) {
    CTX_CHECK(window_len_ > 0 && batch_size_ > 0, "eval iterator: window_len ({}) and batch_size "
              "({}) must be positive", window_len_, batch_size_);
    for (const Window& w : windows_)
        CTX_CHECK(w.doc >= 0 && w.doc < docs_.n_docs() && w.start >= 0 &&
                      w.start + window_len_ + 1 <= docs_.doc_len(w.doc),
                  "eval iterator: window (doc {}, start {}) does not fit {} + 1 tokens in the "
                  "document", w.doc, w.start, window_len_);
    buf_.resize(static_cast<size_t>(window_len_ + 1));
}

int EvalIterator::next(BatchBuffers& out) {
    const int T = static_cast<int>(window_len_);
    out.resize(batch_size_, T);  // zero tokens, mask 0: the padding of a partial last batch
    int rows = 0;
    for (; rows < batch_size_ && next_ < num_windows(); ++rows, ++next_) {
        const Window& w = windows_[static_cast<size_t>(next_)];
        docs_.read(w.doc, w.start, window_len_ + 1, buf_.data());
        const size_t off = static_cast<size_t>(rows) * T;
        for (int t = 0; t < T; ++t) {
            out.tokens[off + t] = buf_[t];
            out.targets[off + t] = buf_[t + 1];
            out.positions[off + t] = static_cast<float>(t);
            out.mask[off + t] = 1.0f;
        }
    }
    return rows;
}

}  // namespace ctx
