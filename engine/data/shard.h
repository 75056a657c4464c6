// Token shards on disk, and the read interface the windowing and row stream use.
//
// Layout (little-endian; offsets in bytes):
//   [0, 64)          header: magic "CTXSHRD1", u32 version (1), u32 token_bytes (2: uint16
//                    tokens, used when vocab_size <= 65535; 4: uint32), u32 vocab_size,
//                    u32 reserved (0), u64 n_docs, u64 n_tokens, u64 tokens_offset (64),
//                    u64 index_offset, u64 checksum (FNV-1a 64 of bytes [0, 56))
//   [64, ...)        n_tokens tokens
//   [index_offset..) n_docs + 1 u64 offsets into the token array: doc i is
//                    tokens[offsets[i], offsets[i+1]); offsets[0] = 0, offsets[n_docs] = n_tokens.
//                    index_offset = 64 + n_tokens * token_bytes rounded up to 8, so the index is
//                    8-byte aligned in the mapping; the file ends right after it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ctx {

// Read access to tokenized documents (a shard, or vectors in memory for tests).
class DocStore {
public:
    virtual ~DocStore() = default;
    virtual int64_t n_docs() const = 0;
    virtual int64_t doc_len(int64_t doc) const = 0;
    virtual int32_t vocab_size() const = 0;
    // Copies tokens [start, start + n) of doc into out; ctx::Error when out of range.
    virtual void read(int64_t doc, int64_t start, int64_t n, int32_t* out) const = 0;
    std::vector<int64_t> doc_lengths() const;
};

class MemoryDocs : public DocStore {
public:
    MemoryDocs(std::vector<std::vector<int32_t>> docs, int32_t vocab_size);
    int64_t n_docs() const override { return static_cast<int64_t>(docs_.size()); }
    int64_t doc_len(int64_t doc) const override;
    int32_t vocab_size() const override { return vocab_; }
    void read(int64_t doc, int64_t start, int64_t n, int32_t* out) const override;

private:
    std::vector<std::vector<int32_t>> docs_;
    int32_t vocab_;
};

constexpr uint32_t kShardVersion = 1;
constexpr size_t kShardHeaderBytes = 64;

// Writes docs to path atomically (path.tmp.<pid>, fsync, rename): a reader never sees a half
// written shard. Every token must be in [0, vocab_size); ctx::Error names the path otherwise.
void write_shard(const std::string& path, const std::vector<std::vector<int32_t>>& docs,
                 int32_t vocab_size);

// One document in the mapping: `length` tokens of `token_bytes` each at `data`.
struct DocView {
    const void* data = nullptr;
    int64_t length = 0;
    int token_bytes = 2;
    int32_t operator[](int64_t j) const {
        return token_bytes == 2 ? static_cast<const uint16_t*>(data)[j]
                                : static_cast<int32_t>(static_cast<const uint32_t*>(data)[j]);
    }
};

// A read-only mmap of a shard. The constructor validates everything it can cheaply and some it
// cannot: header magic, version, checksum, dtype, sizes against the file size, the document
// index (monotone, ends at n_tokens) and, when verify_tokens, every token < vocab_size (one
// pass over the file: a corrupt token would otherwise index past the embedding table). Any
// failure is a ctx::Error naming the path and what is wrong.
class ShardReader : public DocStore {
public:
    explicit ShardReader(const std::string& path, bool verify_tokens = true);
    ~ShardReader() override;
    ShardReader(ShardReader&& o) noexcept;
    ShardReader& operator=(ShardReader&&) = delete;
    ShardReader(const ShardReader&) = delete;
    ShardReader& operator=(const ShardReader&) = delete;

    const std::string& path() const { return path_; }
    int64_t n_docs() const override { return n_docs_; }
    int64_t n_tokens() const { return n_tokens_; }
    int32_t vocab_size() const override { return vocab_; }
    int token_bytes() const { return token_bytes_; }
    int64_t doc_len(int64_t doc) const override;
    void read(int64_t doc, int64_t start, int64_t n, int32_t* out) const override;

    DocView doc(int64_t i) const;
    int32_t token(int64_t doc_index, int64_t j) const;

private:
    void check_doc(int64_t i) const;
    std::string path_;
    void* map_ = nullptr;
    size_t map_size_ = 0;
    const uint8_t* tokens_ = nullptr;
    const uint64_t* offsets_ = nullptr;
    int64_t n_docs_ = 0, n_tokens_ = 0;
    int32_t vocab_ = 0;
    int token_bytes_ = 2;
};

}  // namespace ctx
