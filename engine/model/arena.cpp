#include "model/arena.h"

#include <utility>

#include "core/error.h"

namespace ctx {

size_t ArenaLayout::add(const std::string& name, std::vector<int64_t> shape, bool weight_decay) {
    CTX_CHECK(find(name) == nullptr, "parameter '{}' is declared twice", name);
    size_t numel = 1;
    for (int64_t d : shape) {
        CTX_CHECK(d > 0, "parameter '{}' has a non-positive dimension {}", name, d);
        numel *= static_cast<size_t>(d);
    }
    ParamView v{name, std::move(shape), total_, numel, weight_decay};
    total_ += (numel + 15) / 16 * 16;
    views_.push_back(std::move(v));
    return views_.size() - 1;
}

const ParamView* ArenaLayout::find(const std::string& name) const {
    for (const auto& v : views_)
        if (v.name == name) return &v;
    return nullptr;
}

const ParamView& ArenaLayout::view(const std::string& name) const {
    const ParamView* v = find(name);
    CTX_CHECK(v != nullptr, "no parameter named '{}'", name);
    return *v;
}

Arena::Arena(Backend& backend, size_t n) : backend_(&backend), size_(n) {
    data_ = n ? backend.alloc_floats(n) : nullptr;
}

Arena::~Arena() {
    if (data_) backend_->free_floats(data_);
}

Arena::Arena(Arena&& o) noexcept
    : backend_(std::exchange(o.backend_, nullptr)),
      data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)) {}

Arena& Arena::operator=(Arena&& o) noexcept {
    if (this != &o) {
        if (data_) backend_->free_floats(data_);
        backend_ = std::exchange(o.backend_, nullptr);
        data_ = std::exchange(o.data_, nullptr);
        size_ = std::exchange(o.size_, 0);
    }
    return *this;
}

}  // namespace ctx
