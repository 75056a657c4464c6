#include "model/ring_attention.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace ctx {

std::vector<int32_t> zigzag_indices(int T, int cp, int r) {
    CTX_CHECK(cp >= 1 && T % (2 * cp) == 0, "context parallelism: a row of {} tokens does not "
              "split into 2 x cp = {} equal chunks", T, 2 * cp);
    const int chunk = T / (2 * cp);
    std::vector<int32_t> out;
    for (int c : {r, 2 * cp - 1 - r})
        for (int t = 0; t < chunk; ++t) out.push_back(c * chunk + t);
    std::sort(out.begin(), out.end());
    return out;
}

void RingAttention::begin(int B, int T, const float* positions, const int32_t* doc_start,
                          const float* local_positions, const RotarySpec& rotary,
                          const AttentionOptions& opt) {
    CTX_CHECK(be_.kind() == DeviceKind::CPU, "context parallelism runs on the CPU backend only so "
              "far (the {} backend has no attention across blocks yet)", be_.name());
    CTX_CHECK(opt.bias.kind != BiasKind::Table || block_bias_.fill, "internal: a Table bias "
              "across the ring needs set_block_bias");
    const int cp = cp_.size();
    B_ = B;
    Tl_ = T / cp;
    // Buffers keep their capacity from pass to pass: a training step allocates nothing here
    // after the first.
    meta_.resize(cp);
    for (int r = 0; r < cp; ++r) {  // every rank's tokens: the batch is the same on all of them
        const std::vector<int32_t> idx = zigzag_indices(T, cp, r);
        BlockMeta& m = meta_[r];
        m.index.clear();
        m.positions.clear();
        m.doc_start.clear();
        for (int b = 0; b < B; ++b)
            for (int32_t t : idx) {
                m.index.push_back(t);
                m.positions.push_back(positions[static_cast<size_t>(b) * T + t]);
                if (doc_start) m.doc_start.push_back(doc_start[static_cast<size_t>(b) * T + t]);
            }
    }
    local_positions_ = local_positions;
    rotary_ = OwnedRotarySpec(rotary);
    opt_ = opt;
    opt_.doc_start = nullptr;  // the blocks carry the documents (AttnBlockRows::doc_start)
    const size_t kv = static_cast<size_t>(B) * Tl_ * 2 * C_;
    kv_.resize(kv);
    kv_next_.resize(kv);
    dkv_.resize(kv);
    dkv_next_.resize(kv);
    out_b_.resize(static_cast<size_t>(B) * Tl_ * C_);
    lse_b_.resize(static_cast<size_t>(B) * H_ * Tl_);
    const bool table = opt.bias.kind == BiasKind::Table;  // one per key block, for every layer
    tables_.resize(table ? cp : 0);
    dtables_.resize(table ? cp : 0);
    const size_t n = static_cast<size_t>(B) * H_ * Tl_ * Tl_;
    for (size_t src = 0; src < tables_.size(); ++src) {
        tables_[src].assign(n, 0.0f);
        dtables_[src].assign(n, 0.0f);
        block_bias_.fill(tables_[src].data(), meta_[cp_.rank()].rows(Tl_),
                         meta_[src].rows(Tl_), B);
    }
}

AttentionOptions RingAttention::options_for(int src, bool with_grad) {
    AttentionOptions o = opt_;
    if (o.bias.kind == BiasKind::Table) {
        o.bias.table = tables_[src].data();
        o.bias.dtable = with_grad ? dtables_[src].data() : nullptr;
    }
    return o;
}

void RingAttention::finish_backward() {
    for (size_t src = 0; src < dtables_.size(); ++src)
        block_bias_.grad(dtables_[src].data(), meta_[cp_.rank()].rows(Tl_), meta_[src].rows(Tl_),
                         B_);
}

void RingAttention::take_kv(const float* qkv, float* kv) const {
    const size_t rows = static_cast<size_t>(B_) * Tl_, C = C_;
    for (size_t n = 0; n < rows; ++n)
        std::memcpy(kv + n * 2 * C, qkv + n * 3 * C + C, 2 * C * sizeof(float));
}

void RingAttention::pass(std::vector<float>& cur, std::vector<float>& next) {
    const int cp = cp_.size(), r = cp_.rank();
    cp_.sendrecv(cur.data(), next.data(), cur.size() * sizeof(float), (r + 1) % cp,
                 (r - 1 + cp) % cp);
    cur.swap(next);
}

void RingAttention::forward(int, float* qkv, float* out, float* saved) {
    const int cp = cp_.size(), r = cp_.rank();
    if (rotary_.enabled())
        be_.rotary_forward(qkv, local_positions_, B_, Tl_, C_, H_, rotary_.spec());
    float* lse = saved;  // (B, H, Tl)
    std::fill(out, out + static_cast<size_t>(B_) * Tl_ * C_, 0.0f);
    std::fill(lse, lse + static_cast<size_t>(B_) * H_ * Tl_,
              -std::numeric_limits<float>::infinity());
    take_kv(qkv, kv_.data());
    for (int s = 0; s < cp; ++s) {  // at step s this rank holds rank r - s's block
        const int src = (r - s + cp) % cp;
        be_.attention_block_forward(out_b_.data(), lse_b_.data(), qkv, kv_.data(),
                                    meta_[r].rows(Tl_), meta_[src].rows(Tl_), B_, C_, H_,
                                    options_for(src, false));
        be_.attention_block_merge(out, lse, out_b_.data(), lse_b_.data(), B_, Tl_, C_, H_);
        if (s + 1 < cp) pass(kv_, kv_next_);
    }
}

void RingAttention::backward(int, float* dqkv, const float* dout, const float* qkv,
                             const float* saved, const float* out) {
    const int cp = cp_.size(), r = cp_.rank();
    take_kv(qkv, kv_.data());  // q, k as forward left them (rotated)
    std::fill(dkv_.begin(), dkv_.end(), 0.0f);
    for (int s = 0; s < cp; ++s) {
        const int src = (r - s + cp) % cp;
        be_.attention_block_backward(dqkv, dkv_.data(), dout, qkv, kv_.data(), out, saved,
                                     meta_[r].rows(Tl_), meta_[src].rows(Tl_), B_, C_, H_,
                                     options_for(src, true));
        // the block and its gradient move on; after cp moves the gradient is home
        if (s + 1 < cp) pass(kv_, kv_next_);
        pass(dkv_, dkv_next_);
    }
    const size_t rows = static_cast<size_t>(B_) * Tl_, C = C_;
    for (size_t n = 0; n < rows; ++n)  // dk, dv into dqkv's k and v columns
        for (size_t c = 0; c < 2 * C; ++c) dqkv[n * 3 * C + C + c] += dkv_[n * 2 * C + c];
    if (rotary_.enabled())
        be_.rotary_backward(dqkv, local_positions_, B_, Tl_, C_, H_, rotary_.spec());
}

}  // namespace ctx
