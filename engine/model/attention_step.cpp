#include "model/attention_step.h"

namespace ctx {

OwnedRotarySpec::OwnedRotarySpec(const RotarySpec& s) : spec_(s) {
    const int pairs = s.rotary_dims / 2;
    if (s.inv_freq) {
        inv_freq_.assign(s.inv_freq, s.inv_freq + pairs);
        spec_.inv_freq = inv_freq_.data();
    }
    if (s.amp_base) {
        amp_base_.assign(s.amp_base, s.amp_base + pairs);
        spec_.amp_base = amp_base_.data();
    }
}

OwnedRotarySpec& OwnedRotarySpec::operator=(const OwnedRotarySpec& o) {
    if (this != &o) {  // copy o's arrays into ours, then point at them
        OwnedRotarySpec copy(o.spec_);
        spec_ = copy.spec_;
        inv_freq_ = std::move(copy.inv_freq_);
        amp_base_ = std::move(copy.amp_base_);
        if (spec_.inv_freq) spec_.inv_freq = inv_freq_.data();
        if (spec_.amp_base) spec_.amp_base = amp_base_.data();
    }
    return *this;
}

std::vector<float> OwnedRotarySpec::signature() const {
    const RotarySpec& s = spec_;
    std::vector<float> sig = {static_cast<float>(s.rotary_dims), static_cast<float>(s.layout),
                              s.position_scale, s.attention_factor, s.amp_scale_base,
                              s.amp_base ? 1.0f : 0.0f};
    for (int k = 0; k < s.rotary_dims / 2; ++k) {
        sig.push_back(s.inv_freq[k]);
        if (s.amp_base) sig.push_back(s.amp_base[k]);
    }
    return sig;
}

// ---------------------------------------------------------------- full or windowed

void CausalAttention::begin(int B, int T, const float* positions, const RotarySpec& rotary,
                            const AttentionOptions& opt, float* scratch) {
    B_ = B;
    T_ = T;
    positions_ = positions;
    rotary_ = OwnedRotarySpec(rotary);
    opt_ = opt;
    // inside the attention ops where the backend can (the bf16 flash kernels rotate q and k as
    // they pack them, and dq, dk as they write them): no passes of their own over q and k
    const bool fused =
        rotary_.enabled() && backend_.attention_fuses_rotary(opt.mode, C_, H_, rotary_.spec());
    opt_.rotary = fused ? &rotary_.spec() : nullptr;
    separate_rotary_ = rotary_.enabled() && !fused;
    scratch_ = scratch;
}

void CausalAttention::forward(int, float* qkv, Operand out, float* saved) {
    if (separate_rotary_) backend_.rotary_forward(qkv, positions_, B_, T_, C_, H_, rotary_.spec());
    attention_forward(backend_, out, saved, qkv, positions_, B_, T_, C_, H_, opt_);
}

void CausalAttention::backward(int, float* dqkv, const float* dout, const float* qkv,
                               const float* saved, Operand out, GradStore store) {
    AttentionOptions opt = opt_;
    opt.dqkv_store = store;
    attention_backward(backend_, dqkv, scratch_, dout, qkv, saved, out, positions_, B_, T_, C_, H_,
                       opt);
    if (separate_rotary_)
        backend_.rotary_backward(dqkv, positions_, B_, T_, C_, H_, rotary_.spec());
}

// ---------------------------------------------------------------- over a key/value cache

KvCache::KvCache(Backend& backend, int layers, int rows_, int S_, int C)
    : pos(backend, static_cast<size_t>(rows_) * S_), rows(rows_), S(S_) {
    const size_t n = static_cast<size_t>(rows_) * S_ * C;
    for (int l = 0; l < layers; ++l) {
        k.emplace_back(backend, n);
        v.emplace_back(backend, n);
    }
}

void CachedAttention::begin(int r0, int nb, int Tq, const int32_t* lens, const float* positions,
                            const std::vector<OwnedRotarySpec>* rotary,
                            const AttentionOptions& opt, float* scratch) {
    r0_ = r0;
    nb_ = nb;
    Tq_ = Tq;
    lens_ = lens;
    positions_ = positions;
    rotary_ = rotary && !rotary->empty() ? rotary : nullptr;
    opt_ = opt;
    scratch_ = scratch;
}

void CachedAttention::forward(int layer, float* qkv, Operand out_op, float*) {
    float* out = out_op.fp32("attention over a key/value cache");
    const int C = C_, S = cache_.S, Tq = Tq_;
    float* kc = cache_.k[static_cast<size_t>(layer)].data();  // (rows, S, C)
    float* vc = cache_.v[static_cast<size_t>(layer)].data();
    for (int i = 0; i < nb_; ++i) {
        const int r = r0_ + i;
        float* qkv_r = qkv + static_cast<size_t>(i) * Tq * 3 * C;          // (Tq, 3C)
        const size_t slot0 = static_cast<size_t>(r) * S + lens_[r] - Tq;  // first new slot
        if (rotary_)  // each row at its own length's rotation
            backend_.rotary_forward(qkv_r, positions_ + static_cast<size_t>(i) * Tq, 1, Tq, C, H_,
                                    (*rotary_)[static_cast<size_t>(i)].spec());
        for (int t = 0; t < Tq; ++t) {
            const float* src = qkv_r + static_cast<size_t>(t) * 3 * C;
            backend_.copy(kc + (slot0 + t) * C, src + C, C);
            backend_.copy(vc + (slot0 + t) * C, src + 2 * C, C);
        }
    }
    const size_t row0 = static_cast<size_t>(r0_) * S;
    backend_.attention_cached_forward(out, scratch_, qkv, kc + row0 * C, vc + row0 * C,
                                      cache_.pos.data() + row0, lens_ + r0_, nb_, Tq, S, C, H_,
                                      opt_);
}

}  // namespace ctx
