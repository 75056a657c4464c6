// A test backend whose memory the host cannot touch: it runs the CPU backend's ops, but the
// pointers it hands out are the real addresses with bit 62 flipped (non-canonical on x86-64 and
// AArch64 user space), so any host code that dereferences "device" memory directly faults at once
// instead of silently working as it would on the CPU backend. Its kind() is CUDA, so the model
// takes its device-backend paths (host staging of PE parameters, activations and bias tables).
// Results must equal the CPU backend's bit for bit: the arithmetic is the same.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "core/error.h"

namespace ctx::test {

class RemoteBackend : public Backend {
public:
    explicit RemoteBackend(int threads = 1) : cpu_(make_cpu_backend(threads)) {}
    ~RemoteBackend() override { free_floats(batch_); }

    DeviceKind kind() const override { return DeviceKind::CUDA; }
    std::string name() const override { return "remote(cpu)"; }
    int copies_to_host() const { return copies_to_host_; }

    // ---- memory
    float* alloc_floats(size_t n) override {
        float* real = cpu_->alloc_floats(n);
        float* fake = flip(real);
        allocs_[reinterpret_cast<uintptr_t>(fake)] = n;
        return fake;
    }
    void free_floats(float* p) override {
        if (!p) return;
        allocs_.erase(reinterpret_cast<uintptr_t>(p));
        cpu_->free_floats(flip(p));
    }
    void copy_to_device(float* dst, const float* src, size_t n) override {
        CTX_CHECK(!is_device(src), "remote backend: copy_to_device from device memory");
        cpu_->copy_to_device(dev(dst, n), src, n);
    }
    void copy_to_host(float* dst, const float* src, size_t n) override {
        CTX_CHECK(!is_device(dst), "remote backend: copy_to_host into device memory");
        ++copies_to_host_;
        cpu_->copy_to_host(dst, dev(src, n), n);
    }
    // token ids and targets stay host memory (this backend's op contract); positions and the
    // mask go to device memory, one upload each per pass
    BatchInputs stage_batch(const BatchInputs& h) override {
        ++stages_;
        BatchInputs d = h;
        const size_t n = static_cast<size_t>(std::max(h.N, 0));
        if (batch_floats_ < 2 * n || batch_ == nullptr) {
            free_floats(batch_);
            batch_ = alloc_floats(2 * n + 1);
            batch_floats_ = 2 * n;
        }
        if (h.positions) copy_to_device(batch_, h.positions, n), d.positions = batch_;
        if (h.mask) copy_to_device(batch_ + n, h.mask, n), d.mask = batch_ + n;
        return d;
    }
    int stages() const { return stages_; }
    void zero(float* p, size_t n) override { cpu_->zero(dev(p, n), n); }
    void copy(float* dst, const float* src, size_t n) override {
        cpu_->copy(dev(dst, n), dev(src, n), n);
    }
    void copy_2d(float* dst, size_t ds, const float* src, size_t ss, size_t rows, size_t cols,
                 bool accumulate) override {
        if (rows == 0 || cols == 0) return;
        cpu_->copy_2d(dev(dst, (rows - 1) * ds + cols), ds, dev(src, (rows - 1) * ss + cols), ss,
                      rows, cols, accumulate);
    }

    // ---- elementwise
    void add(float* out, const float* a, const float* b, size_t n) override {
        cpu_->add(dev(out, n), dev(a, n), dev(b, n), n);
    }
    void accumulate(float* y, const float* x, size_t n) override {
        cpu_->accumulate(dev(y, n), dev(x, n), n);
    }
    void scale(float* x, float s, size_t n) override { cpu_->scale(dev(x, n), s, n); }
    double sum_squares(const float* x, size_t n) override { return cpu_->sum_squares(dev(x, n), n); }

    // ---- dense ops (token ids and targets are host memory by contract)
    void embedding_forward(float* out, const int32_t* tokens, const float* positions,
                           const float* wte, const float* wpe, int N, int C, int V,
                           int P, VocabShard shard = {}) override {
        cpu_->embedding_forward(dev(out), host(tokens), dev(positions), dev(wte), dev(wpe), N, C,
                                V, P, shard);
    }
    void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                            const float* positions, int N, int C, int V, int P,
                            VocabShard shard = {}) override {
        cpu_->embedding_backward(dev(dwte), dev(dwpe), dev(dout), host(tokens), dev(positions), N,
                                 C, V, P, shard);
    }
    void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                           const float* b, int N, int C, float eps) override {
        cpu_->layernorm_forward(dev(out), dev(mean), dev(rstd), dev(inp), dev(w), dev(b), N, C,
                                eps);
    }
    void swiglu_forward(float* out, const float* inp, int N, int F) override {
        cpu_->swiglu_forward(dev(out), dev(inp), N, F);
    }
    void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F,
                         GradStore store = GradStore::Accumulate) override {
        cpu_->swiglu_backward(dev(dinp), dev(inp), dev(dout), N, F, store);
    }
    void kv_repeat_forward(float* qkv, const float* grouped, int N, int H, int Hkv,
                           int D) override {
        cpu_->kv_repeat_forward(dev(qkv), dev(grouped), N, H, Hkv, D);
    }
    void kv_repeat_backward(float* dgrouped, const float* dqkv, int N, int H, int Hkv,
                            int D) override {
        cpu_->kv_repeat_backward(dev(dgrouped), dev(dqkv), N, H, Hkv, D);
    }
    void matmul_rows_forward(float* out, int ldo, const float* inp, const float* W,
                             const float* bias, const int32_t* idx, int N, int IC, int K,
                             int G) override {
        cpu_->matmul_rows_forward(dev(out), ldo, dev(inp), dev(W), dev(bias), dev(idx), N, IC, K,
                                  G);
    }
    void matmul_rows_project(float* out, const float* h, int ldh, const float* Wt,
                             const float* bias, const int32_t* idx, int N, int OC, int K,
                             int G) override {
        cpu_->matmul_rows_project(dev(out), dev(h), ldh, dev(Wt), dev(bias), dev(idx), N, OC, K,
                                  G);
    }
    void select_topk(int32_t* idx, const float* scores, int N, int M, int K,
                     float threshold) override {
        cpu_->select_topk(dev(idx), dev(scores), N, M, K, threshold);
    }
    void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                         float eps) override {
        cpu_->rmsnorm_forward(dev(out), dev(rstd), dev(inp), dev(w), N, C, eps);
    }
    void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                          const float* w, const float* rstd, int N, int C) override {
        cpu_->rmsnorm_backward(dev(dinp), dev(dw), dev(dout), dev(inp), dev(w), dev(rstd), N, C);
    }
    void layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                            const float* inp, const float* w, const float* mean,
                            const float* rstd, int N, int C) override {
        cpu_->layernorm_backward(dev(dinp), dev(dw), dev(db), dev(dout), dev(inp), dev(w),
                                 dev(mean), dev(rstd), N, C);
    }
    void matmul_forward(float* out, const float* inp, const float* W, const float* bias, int N,
                        int IC, int OC) override {
        cpu_->matmul_forward(dev(out), dev(inp), dev(W), dev(bias), N, IC, OC);
    }
    void matmul_backward(float* dinp, float* dW, float* dbias, const float* dout,
                         const float* inp, const float* W, int N, int IC, int OC,
                         GradStore dinp_store = GradStore::Accumulate) override {
        cpu_->matmul_backward(dev(dinp), dev(dW), dev(dbias), dev(dout), dev(inp), dev(W), N, IC,
                              OC, dinp_store);
    }
    void activation_forward(float* out, const float* inp, size_t n, Activation act) override {
        cpu_->activation_forward(dev(out, n), dev(inp, n), n, act);
    }
    void activation_backward(float* dinp, const float* inp, const float* dout, size_t n,
                             Activation act, GradStore store = GradStore::Accumulate) override {
        cpu_->activation_backward(dev(dinp, n), dev(inp, n), dev(dout, n), n, act, store);
    }

    // ---- rotary (inv_freq, amp_base are host memory by contract), attention
    void rotary_forward(float* qkv, const float* positions, int B, int T, int C, int H,
                        const RotarySpec& spec) override {
        cpu_->rotary_forward(dev(qkv), dev(positions), B, T, C, H, host_spec(spec));
    }
    void rotary_backward(float* dqkv, const float* positions, int B, int T, int C, int H,
                         const RotarySpec& spec) override {
        cpu_->rotary_backward(dev(dqkv), dev(positions), B, T, C, H, host_spec(spec));
    }
    void attention_forward(float* out, float* saved, const float* qkv, const float* positions,
                           int B, int T, int C, int H, const AttentionOptions& opt) override {
        cpu_->attention_forward(dev(out), dev(saved), dev(qkv), dev(positions), B, T, C, H,
                                options(opt));
    }
    void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                            const float* saved, const float* out, const float* positions, int B,
                            int T, int C, int H, const AttentionOptions& opt) override {
        cpu_->attention_backward(dev(dqkv), dev(scratch), dev(dout), dev(qkv), dev(saved),
                                 dev(out), dev(positions), B, T, C, H, options(opt));
    }
    void attention_block_forward(float* out_b, float* lse_b, const float* q, const float* kv,
                                 const AttnBlockRows& qr, const AttnBlockRows& kr, int B, int C,
                                 int H, const AttentionOptions& opt) override {
        cpu_->attention_block_forward(dev(out_b), dev(lse_b), dev(q), dev(kv), rows(qr), rows(kr),
                                      B, C, H, options(opt));
    }
    void attention_block_merge(float* out, float* lse, const float* out_b, const float* lse_b,
                               int B, int Tq, int C, int H) override {
        cpu_->attention_block_merge(dev(out), dev(lse), dev(out_b), dev(lse_b), B, Tq, C, H);
    }
    void attention_block_backward(float* dq, float* dkv, const float* dout, const float* q,
                                  const float* kv, const float* out, const float* lse,
                                  const AttnBlockRows& qr, const AttnBlockRows& kr, int B, int C,
                                  int H, const AttentionOptions& opt) override {
        cpu_->attention_block_backward(dev(dq), dev(dkv), dev(dout), dev(q), dev(kv), dev(out),
                                       dev(lse), rows(qr), rows(kr), B, C, H, options(opt));
    }
    size_t attention_scratch_floats(int B, int T, int C, int H, AttentionMode m) const override {
        return cpu_->attention_scratch_floats(B, T, C, H, m);
    }
    size_t attention_saved_floats(AttentionMode m, int B, int T, int C, int H) const override {
        return cpu_->attention_saved_floats(m, B, T, C, H);
    }
    bool attention_backward_reads_qkv(AttentionMode m) const override {
        return cpu_->attention_backward_reads_qkv(m);
    }
    bool attention_fuses_rotary(AttentionMode m, int C, int H, const RotarySpec& s) const override {
        return cpu_->attention_fuses_rotary(m, C, H, s);
    }
    bool attention_mode_supported(AttentionMode m, int C, int H) const override {
        return cpu_->attention_mode_supported(m, C, H);
    }
    AttentionMode attention_mode_auto(int T, int C, int H) const override {
        return cpu_->attention_mode_auto(T, C, H);
    }
    void attention_cached_forward(float* out, float* scratch, const float* qkv, const float* kc,
                                  const float* vc, const float* kpos, const int32_t* lens, int B,
                                  int Tq, int S, int C, int H,
                                  const AttentionOptions& opt) override {
        cpu_->attention_cached_forward(dev(out), dev(scratch), dev(qkv), dev(kc), dev(vc),
                                       dev(kpos), host(lens), B, Tq, S, C, H, options(opt));
    }
    size_t attention_cached_scratch_floats(int S) const override {
        return cpu_->attention_cached_scratch_floats(S);
    }

    // ---- loss, optimizer
    void crossentropy_forward(float* losses, const float* logits, const int32_t* targets,
                              const float* mask, int N, int V) override {
        cpu_->crossentropy_forward(dev(losses), dev(logits), host(targets), dev(mask), N, V);
    }
    void crossentropy_forward_backward(float* logits, float* losses, const int32_t* targets,
                                       const float* mask, int N, int V,
                                       float grad_scale) override {
        cpu_->crossentropy_forward_backward(dev(logits), dev(losses), host(targets), dev(mask), N,
                                            V, grad_scale);
    }
    void crossentropy_shard_stats(float* stats, const float* logits, const int32_t* targets,
                                  int N, int V, VocabShard shard) override {
        cpu_->crossentropy_shard_stats(dev(stats), dev(logits), host(targets), N, V, shard);
    }
    void crossentropy_shard_finish(float* losses, float* logits, const float* all_stats, int S,
                                   const int32_t* targets, const float* mask, int N, int V,
                                   VocabShard shard, float grad_scale) override {
        cpu_->crossentropy_shard_finish(dev(losses), dev(logits), dev(all_stats), S, host(targets),
                                        dev(mask), N, V, shard, grad_scale);
    }
    void adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                      const AdamWParams& hp) override {
        cpu_->adamw_update(dev(params, n), dev(grads, n), dev(m, n), dev(v, n), n, hp);
    }

private:
    float* batch_ = nullptr;  // staged positions and mask (freed with the allocations map)
    size_t batch_floats_ = 0;
    int stages_ = 0;
    static constexpr uintptr_t kFlip = uintptr_t(1) << 62;
    template <class T>
    static T* flip(T* p) {
        return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) ^ kFlip);
    }
    // Whether p lies in one of our allocations (by its fake address).
    bool is_device(const void* p) const {
        if (!p) return false;
        const uintptr_t a = reinterpret_cast<uintptr_t>(p);
        auto it = allocs_.upper_bound(a);
        if (it == allocs_.begin()) return false;
        --it;
        return a < it->first + it->second * sizeof(float) ||
               (a == it->first && it->second == 0);
    }
    // A device argument: must be ours (or null); the real address for the CPU backend.
    template <class T>
    T* dev(T* p, size_t n = 0) const {
        if (!p) return nullptr;
        CTX_CHECK(is_device(p), "remote backend: an op got host memory {} where the contract "
                  "asks for device memory", static_cast<const void*>(p));
        if (n > 0) CTX_CHECK(is_device(p + n - 1), "remote backend: an op's range overruns its buffer");
        return flip(p);
    }
    // A host argument by contract (token ids, targets, lens).
    template <class T>
    const T* host(const T* p) const {
        CTX_CHECK(!is_device(p), "remote backend: an op got device memory where the contract "
                  "asks for host memory");
        return p;
    }
    // Bias parameters may be device memory (learned) or host memory (a plugin's fixed slopes).
    const float* either(const float* p) const { return is_device(p) ? flip(p) : p; }
    AttentionOptions options(const AttentionOptions& o) const {
        AttentionOptions r = o;
        r.bias.a = either(o.bias.a);
        r.bias.b = dev(o.bias.b);
        r.bias.da = dev(o.bias.da);
        r.bias.db = dev(o.bias.db);
        r.bias.table = dev(o.bias.table);
        r.bias.dtable = dev(o.bias.dtable);
        r.heads = dev(o.heads);
        return r;
    }
    // A block's metadata is device memory (the ring uploads it).
    AttnBlockRows rows(const AttnBlockRows& r) const {
        return AttnBlockRows{r.T, dev(r.index), dev(r.positions), dev(r.doc_start)};
    }
    RotarySpec host_spec(const RotarySpec& s) const {
        host(s.inv_freq);
        host(s.amp_base);
        return s;
    }

    std::unique_ptr<Backend> cpu_;
    std::map<uintptr_t, size_t> allocs_;  // fake base address -> floats
    int copies_to_host_ = 0;
};

}  // namespace ctx::test
