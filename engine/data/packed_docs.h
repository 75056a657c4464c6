// Document packing (issue "models and methods of 2024-26"): the documents of a list laid end to
// end as one token stream, so that windows (data/windows.h) and the rows sampled from them hold
// several documents. The row stream then gives each row token its document (Batch::doc_start)
// and attention never crosses a document (AttentionOptions::doc_start). Short documents, which
// windows of one document drop, are used whole.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "data/shard.h"

namespace ctx {

// How a packed row numbers its tokens' positions:
//   Restart:  each document counts from 0 at its first token in the window (a document the
//             window cuts into counts from the cut), as separate rows would
//   Continue: the window's own indices 0 .. Le-1 across documents (the sampler's positions)
enum class PackPositions { None = 0, Restart = 1, Continue = 2 };
const char* pack_positions_name(PackPositions p);  // "none" | "restart" | "continue"

// One virtual document: the listed documents of `docs`, in that order.
class PackedDocs final : public DocStore {
public:
    PackedDocs(std::shared_ptr<const DocStore> docs, const std::vector<int64_t>& doc_ids);

    int64_t n_docs() const override { return 1; }
    int64_t doc_len(int64_t doc) const override;
    int32_t vocab_size() const override { return docs_->vocab_size(); }
    void read(int64_t doc, int64_t start, int64_t n, int32_t* out) const override;

    // The document holding stream offset x: its tokens are [begin, end) of the stream.
    struct Span {
        int64_t begin, end;
    };
    Span document_at(int64_t x) const;
    int64_t num_documents() const { return static_cast<int64_t>(ids_.size()); }

private:
    std::shared_ptr<const DocStore> docs_;
    std::vector<int64_t> ids_;     // the packed documents, in stream order
    std::vector<int64_t> starts_;  // (n + 1) stream offset of each document's first token
};

}  // namespace ctx
