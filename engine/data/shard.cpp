#include "data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace ctx {

static_assert(std::endian::native == std::endian::little,
              "the shard format is little-endian and read in place");

namespace {

constexpr char kMagic[8] = {'C', 'T', 'X', 'S', 'H', 'R', 'D', '1'};
constexpr size_t kChecksummed = 56;  // header bytes covered by the checksum

uint64_t fnv1a64(const uint8_t* p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

template <typename T>
void put(uint8_t* hdr, size_t off, T v) { std::memcpy(hdr + off, &v, sizeof v); }
template <typename T>
T get(const uint8_t* hdr, size_t off) {
    T v;
    std::memcpy(&v, hdr + off, sizeof v);
    return v;
}

uint64_t align8(uint64_t x) { return (x + 7) & ~uint64_t{7}; }

// Header field offsets (see shard.h).
enum : size_t {
    kOffVersion = 8, kOffTokenBytes = 12, kOffVocab = 16, kOffReserved = 20, kOffDocs = 24,
    kOffTokens = 32, kOffTokensOffset = 40, kOffIndexOffset = 48, kOffChecksum = 56
};

struct File {  // closes on scope exit
    FILE* f = nullptr;
    ~File() {
        if (f) std::fclose(f);
    }
};

}  // namespace

std::vector<int64_t> DocStore::doc_lengths() const {
    std::vector<int64_t> n(static_cast<size_t>(n_docs()));
    for (int64_t i = 0; i < n_docs(); ++i) n[static_cast<size_t>(i)] = doc_len(i);
    return n;
}

MemoryDocs::MemoryDocs(std::vector<std::vector<int32_t>> docs, int32_t vocab_size)
    : docs_(std::move(docs)), vocab_(vocab_size) {
    for (size_t d = 0; d < docs_.size(); ++d)
        for (size_t j = 0; j < docs_[d].size(); ++j)
            CTX_CHECK(docs_[d][j] >= 0 && docs_[d][j] < vocab_,
                      "document {} token {} is {}, outside the vocabulary [0, {})", d, j,
                      docs_[d][j], vocab_);
}

int64_t MemoryDocs::doc_len(int64_t doc) const {
    CTX_CHECK(doc >= 0 && doc < n_docs(), "document {} does not exist ({} documents)", doc,
              n_docs());
    return static_cast<int64_t>(docs_[static_cast<size_t>(doc)].size());
}

void MemoryDocs::read(int64_t doc, int64_t start, int64_t n, int32_t* out) const {
    const int64_t len = doc_len(doc);
    CTX_CHECK(start >= 0 && n >= 0 && start + n <= len,
              "tokens [{}, {}) of document {} are out of range (length {})", start, start + n,
              doc, len);
    std::memcpy(out, docs_[static_cast<size_t>(doc)].data() + start,
                static_cast<size_t>(n) * sizeof(int32_t));
}

void write_shard(const std::string& path, const std::vector<std::vector<int32_t>>& docs,
                 int32_t vocab_size) {
    CTX_CHECK(vocab_size > 0, "{}: vocab_size must be positive, got {}", path, vocab_size);
    const uint32_t width = vocab_size <= 65535 ? 2 : 4;
    uint64_t n_tokens = 0;
    for (size_t d = 0; d < docs.size(); ++d) {
        for (size_t j = 0; j < docs[d].size(); ++j)
            CTX_CHECK(docs[d][j] >= 0 && docs[d][j] < vocab_size,
                      "{}: document {} token {} is {}, outside the vocabulary [0, {})", path, d,
                      j, docs[d][j], vocab_size);
        n_tokens += docs[d].size();
    }
    const uint64_t index_offset = align8(kShardHeaderBytes + n_tokens * width);

    uint8_t hdr[kShardHeaderBytes] = {};
    std::memcpy(hdr, kMagic, 8);
    put<uint32_t>(hdr, kOffVersion, kShardVersion);
    put<uint32_t>(hdr, kOffTokenBytes, width);
    put<uint32_t>(hdr, kOffVocab, static_cast<uint32_t>(vocab_size));
    put<uint32_t>(hdr, kOffReserved, 0);
    put<uint64_t>(hdr, kOffDocs, docs.size());
    put<uint64_t>(hdr, kOffTokens, n_tokens);
    put<uint64_t>(hdr, kOffTokensOffset, kShardHeaderBytes);
    put<uint64_t>(hdr, kOffIndexOffset, index_offset);
    put<uint64_t>(hdr, kOffChecksum, fnv1a64(hdr, kChecksummed));

    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    {
        File f{std::fopen(tmp.c_str(), "wb")};
        CTX_CHECK(f.f, "{}: cannot create {}: {}", path, tmp, std::strerror(errno));
        bool ok = std::fwrite(hdr, 1, sizeof hdr, f.f) == sizeof hdr;
        // Tokens converted to the on-disk width one document at a time.
        std::vector<uint8_t> buf;
        for (const auto& doc : docs) {
            if (!ok) break;
            buf.resize(doc.size() * width);
            for (size_t j = 0; j < doc.size(); ++j) {
                if (width == 2)
                    put<uint16_t>(buf.data(), 2 * j, static_cast<uint16_t>(doc[j]));
                else
                    put<uint32_t>(buf.data(), 4 * j, static_cast<uint32_t>(doc[j]));
            }
            ok = std::fwrite(buf.data(), 1, buf.size(), f.f) == buf.size();
        }
        const uint8_t zeros[8] = {};
        const size_t pad = index_offset - (kShardHeaderBytes + n_tokens * width);
        ok = ok && std::fwrite(zeros, 1, pad, f.f) == pad;
        std::vector<uint64_t> offsets(docs.size() + 1, 0);
        for (size_t d = 0; d < docs.size(); ++d) offsets[d + 1] = offsets[d] + docs[d].size();
        ok = ok && std::fwrite(offsets.data(), 8, offsets.size(), f.f) == offsets.size();
        ok = ok && std::fflush(f.f) == 0 && ::fsync(::fileno(f.f)) == 0;
        const int saved = errno;
        if (std::fclose(f.f) != 0) ok = false;
        f.f = nullptr;
        if (!ok) {
            std::remove(tmp.c_str());
            fail("{}: writing {} failed: {}", path, tmp, std::strerror(saved));
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        const int saved = errno;
        std::remove(tmp.c_str());
        fail("{}: cannot rename {} into place: {}", path, tmp, std::strerror(saved));
    }
}

ShardReader::ShardReader(const std::string& path, bool verify_tokens) : path_(path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    CTX_CHECK(fd >= 0, "{}: cannot open shard: {}", path, std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int saved = errno;
        ::close(fd);
        fail("{}: cannot stat shard: {}", path, std::strerror(saved));
    }
    const uint64_t file_size = static_cast<uint64_t>(st.st_size);
    if (file_size < kShardHeaderBytes) {
        ::close(fd);
        fail("{}: not a ctxengine shard: {} bytes, shorter than the {}-byte header", path,
             file_size, kShardHeaderBytes);
    }
    void* m = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int saved = errno;
    ::close(fd);  // the mapping keeps the file alive
    CTX_CHECK(m != MAP_FAILED, "{}: cannot mmap shard: {}", path, std::strerror(saved));
    map_ = m;
    map_size_ = file_size;
    // From here on a failure must unmap: the destructor does not run for a throwing constructor.
    try {
        const auto* hdr = static_cast<const uint8_t*>(map_);
        CTX_CHECK(std::memcmp(hdr, kMagic, 8) == 0, "{}: not a ctxengine shard (bad magic)",
                  path);
        const uint32_t version = get<uint32_t>(hdr, kOffVersion);
        CTX_CHECK(version == kShardVersion, "{}: shard version {} is not supported (this build "
                  "reads version {})", path, version, kShardVersion);
        CTX_CHECK(get<uint64_t>(hdr, kOffChecksum) == fnv1a64(hdr, kChecksummed),
                  "{}: shard header checksum mismatch (the header is corrupt)", path);
        const uint32_t width = get<uint32_t>(hdr, kOffTokenBytes);
        CTX_CHECK(width == 2 || width == 4, "{}: token width {} bytes is not 2 or 4", path, width);
        const uint32_t vocab = get<uint32_t>(hdr, kOffVocab);
        CTX_CHECK(vocab > 0 && vocab <= INT32_MAX && (width == 4 || vocab <= 65535),
                  "{}: vocab_size {} does not fit {}-byte tokens", path, vocab, width);
        const uint64_t n_docs = get<uint64_t>(hdr, kOffDocs);
        const uint64_t n_tokens = get<uint64_t>(hdr, kOffTokens);
        const uint64_t tok_off = get<uint64_t>(hdr, kOffTokensOffset);
        const uint64_t idx_off = get<uint64_t>(hdr, kOffIndexOffset);
        // Bound the counts by the file size first so the arithmetic below cannot overflow.
        CTX_CHECK(n_tokens <= file_size && n_docs < file_size / 8,
                  "{}: header claims {} tokens and {} documents, impossible in {} bytes", path,
                  n_tokens, n_docs, file_size);
        CTX_CHECK(tok_off == kShardHeaderBytes &&
                      idx_off == align8(kShardHeaderBytes + n_tokens * width),
                  "{}: inconsistent section offsets (tokens at {}, index at {})", path, tok_off,
                  idx_off);
        const uint64_t expect = idx_off + (n_docs + 1) * 8;
        CTX_CHECK(file_size == expect,
                  "{}: file is {} bytes but the header describes {} bytes ({} tokens, {} "
                  "documents){}", path, file_size, expect, n_tokens, n_docs,
                  file_size < expect ? ": truncated" : "");
        tokens_ = hdr + tok_off;
        offsets_ = reinterpret_cast<const uint64_t*>(hdr + idx_off);
        CTX_CHECK(offsets_[0] == 0 && offsets_[n_docs] == n_tokens,
                  "{}: corrupt document index (starts at {}, ends at {}, expected 0 and {})",
                  path, offsets_[0], offsets_[n_docs], n_tokens);
        for (uint64_t d = 0; d < n_docs; ++d)
            CTX_CHECK(offsets_[d] <= offsets_[d + 1],
                      "{}: corrupt document index: offset {} of document {} exceeds the next, {}",
                      path, offsets_[d], d, offsets_[d + 1]);
        n_docs_ = static_cast<int64_t>(n_docs);
        n_tokens_ = static_cast<int64_t>(n_tokens);
        vocab_ = static_cast<int32_t>(vocab);
        token_bytes_ = static_cast<int>(width);
        if (verify_tokens) {
            for (int64_t i = 0; i < n_tokens_; ++i) {
                const uint32_t t = width == 2 ? get<uint16_t>(tokens_, 2 * i)
                                              : get<uint32_t>(tokens_, 4 * i);
                CTX_CHECK(t < vocab, "{}: token {} is {}, outside the vocabulary [0, {}) (corrupt "
                          "shard)", path, i, t, vocab);
            }
        }
    } catch (...) {
        ::munmap(map_, map_size_);
        map_ = nullptr;
        throw;
    }
}

ShardReader::~ShardReader() {
    if (map_) ::munmap(map_, map_size_);
}

ShardReader::ShardReader(ShardReader&& o) noexcept
    : path_(std::move(o.path_)), map_(o.map_), map_size_(o.map_size_), tokens_(o.tokens_),
      offsets_(o.offsets_), n_docs_(o.n_docs_), n_tokens_(o.n_tokens_), vocab_(o.vocab_),
      token_bytes_(o.token_bytes_) {
    o.map_ = nullptr;
    o.tokens_ = nullptr;
    o.offsets_ = nullptr;
    o.n_docs_ = o.n_tokens_ = 0;
}

void ShardReader::check_doc(int64_t i) const {
    CTX_CHECK(i >= 0 && i < n_docs_, "{}: document {} does not exist ({} documents)", path_, i,
              n_docs_);
}

int64_t ShardReader::doc_len(int64_t doc) const {
    check_doc(doc);
    return static_cast<int64_t>(offsets_[doc + 1] - offsets_[doc]);
}

DocView ShardReader::doc(int64_t i) const {
    check_doc(i);
    DocView v;
    v.data = tokens_ + offsets_[i] * static_cast<uint64_t>(token_bytes_);
    v.length = static_cast<int64_t>(offsets_[i + 1] - offsets_[i]);
    v.token_bytes = token_bytes_;
    return v;
}

int32_t ShardReader::token(int64_t doc_index, int64_t j) const {
    const DocView v = doc(doc_index);
    CTX_CHECK(j >= 0 && j < v.length, "{}: token {} of document {} is out of range (length {})",
              path_, j, doc_index, v.length);
    return v[j];
}

void ShardReader::read(int64_t doc_index, int64_t start, int64_t n, int32_t* out) const {
    const DocView v = doc(doc_index);
    CTX_CHECK(start >= 0 && n >= 0 && start + n <= v.length,
              "{}: tokens [{}, {}) of document {} are out of range (length {})", path_, start,
              start + n, doc_index, v.length);
    if (token_bytes_ == 2) {
        const auto* p = static_cast<const uint16_t*>(v.data) + start;
        for (int64_t j = 0; j < n; ++j) out[j] = p[j];
    } else {
        const auto* p = static_cast<const uint32_t*>(v.data) + start;
        for (int64_t j = 0; j < n; ++j) out[j] = static_cast<int32_t>(p[j]);
    }
}

}  // namespace ctx
