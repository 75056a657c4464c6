// One contiguous buffer with named views (llm.c): parameters, gradients and both AdamW moments
// are four arenas with the same layout, so all-reduce, clipping, the optimizer and checkpoints
// work on whole buffers and views only name the pieces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace ctx {

struct ParamView {
    std::string name;            // "layers.0.attn.qkv.weight"
    std::vector<int64_t> shape;  // row-major
    size_t offset = 0;           // in floats from the arena start
    size_t numel = 0;
    bool weight_decay = false;   // AdamW decays it
};

// The layout: an ordered list of views; offsets are aligned to 16 floats (64 bytes).
class ArenaLayout {
public:
    size_t add(const std::string& name, std::vector<int64_t> shape, bool weight_decay);
    const std::vector<ParamView>& views() const { return views_; }
    const ParamView& view(const std::string& name) const;  // throws if absent
    const ParamView* find(const std::string& name) const;
    size_t total() const { return total_; }

private:
    std::vector<ParamView> views_;
    size_t total_ = 0;
};

// A backend buffer of `layout.total()` floats; owns it.
class Arena {
public:
    Arena() = default;
    Arena(Backend& backend, size_t n);
    ~Arena();
    Arena(Arena&& o) noexcept;
    Arena& operator=(Arena&& o) noexcept;
    Arena(const Arena&) = delete;
    Arena& operator=(const Arena&) = delete;
    float* data() const { return data_; }
    size_t size() const { return size_; }
    float* at(const ParamView& v) const { return data_ + v.offset; }

private:
    Backend* backend_ = nullptr;
    float* data_ = nullptr;
    size_t size_ = 0;
};

}  // namespace ctx
