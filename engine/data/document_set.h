// A read-only set of tokenized documents (a split of a shard, or an in-memory list): what
// evaluation tasks read.
#pragma once

#include <cstdint>
#include <vector>

namespace ctx {

class DocumentSet {
public:
    virtual ~DocumentSet() = default;
    virtual int64_t size() const = 0;
    virtual int64_t length(int64_t doc) const = 0;
    // Copies tokens [start, start + n) of doc into out (the caller checked the span).
    virtual void copy(int64_t doc, int64_t start, int64_t n, int32_t* out) const = 0;
};

// Documents held in memory.
class InMemoryDocuments final : public DocumentSet {
public:
    explicit InMemoryDocuments(std::vector<std::vector<int32_t>> docs) : docs_(std::move(docs)) {}
    int64_t size() const override { return static_cast<int64_t>(docs_.size()); }
    int64_t length(int64_t d) const override { return static_cast<int64_t>(docs_[d].size()); }
    void copy(int64_t d, int64_t start, int64_t n, int32_t* out) const override {
        for (int64_t i = 0; i < n; ++i) out[i] = docs_[d][start + i];
    }

private:
    std::vector<std::vector<int32_t>> docs_;
};

}  // namespace ctx
