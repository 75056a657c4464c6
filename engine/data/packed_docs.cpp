#include "data/packed_docs.h"

#include <algorithm>

#include "core/error.h"

namespace ctx {

const char* pack_positions_name(PackPositions p) {
    switch (p) {
        case PackPositions::Restart: return "restart";
        case PackPositions::Continue: return "continue";
        default: return "none";
    }
}

PackedDocs::PackedDocs(std::shared_ptr<const DocStore> docs, const std::vector<int64_t>& doc_ids)
    : docs_(std::move(docs)) {
    starts_.push_back(0);
    for (int64_t id : doc_ids) {
        CTX_CHECK(id >= 0 && id < docs_->n_docs(), "packing: document {} is not in [0, {})", id,
                  docs_->n_docs());
        const int64_t n = docs_->doc_len(id);
        if (n == 0) continue;  // nothing to pack
        ids_.push_back(id);
        starts_.push_back(starts_.back() + n);
    }
}

int64_t PackedDocs::doc_len(int64_t doc) const {
    CTX_CHECK(doc == 0, "packed documents: one stream (doc 0), asked for {}", doc);
    return starts_.back();
}

void PackedDocs::read(int64_t doc, int64_t start, int64_t n, int32_t* out) const {
    CTX_CHECK(doc == 0 && start >= 0 && n >= 0 && start + n <= starts_.back(),
              "packed documents: tokens [{}, {}) of doc {} are outside the stream of {}", start,
              start + n, doc, starts_.back());
    // the document holding `start`, then whole documents until n tokens are copied
    size_t k = static_cast<size_t>(
        std::upper_bound(starts_.begin(), starts_.end(), start) - starts_.begin() - 1);
    while (n > 0) {
        const int64_t off = start - starts_[k];
        const int64_t take = std::min(n, starts_[k + 1] - start);
        docs_->read(ids_[k], off, take, out);
        out += take;
        start += take;
        n -= take;
        ++k;
    }
}

PackedDocs::Span PackedDocs::document_at(int64_t x) const {
    CTX_CHECK(x >= 0 && x < starts_.back(), "packed documents: offset {} outside [0, {})", x,
              starts_.back());
    const size_t k = static_cast<size_t>(
        std::upper_bound(starts_.begin(), starts_.end(), x) - starts_.begin() - 1);
    return Span{starts_[k], starts_[k + 1]};
}

}  // namespace ctx
