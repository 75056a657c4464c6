#include "model/ring_attention.h"

#include <algorithm>
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

RingAttention::RingAttention(Backend& backend, int C, int H, Comm& cp)
    : be_(backend), C_(C), H_(H), cp_(cp) {
    if (backend.kind() != DeviceKind::CPU) device_ = make_device_collectives(backend, cp);
}

void RingAttention::ensure(Arena& a, size_t n) {
    if (a.size() < n) a = Arena(be_, n);
}

void RingAttention::begin(int B, int T, const float* positions, const int32_t* doc_start,
                          const float* local_positions, const RotarySpec& rotary,
                          const AttentionOptions& opt) {
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
    if (!host_memory()) upload_meta();
    local_positions_ = local_positions;
    rotary_ = OwnedRotarySpec(rotary);
    opt_ = opt;
    opt_.doc_start = nullptr;  // the blocks carry the documents (AttnBlockRows::doc_start)
    kv_floats_ = static_cast<size_t>(B) * Tl_ * 2 * C_;
    for (Arena* a : {&kv_, &kv_next_, &dkv_, &dkv_next_}) ensure(*a, kv_floats_);
    ensure(out_b_, static_cast<size_t>(B) * Tl_ * C_);
    ensure(lse_b_, static_cast<size_t>(B) * H_ * Tl_);
    if (!host_memory() && !device_) {
        send_stage_.resize(kv_floats_);
        recv_stage_.resize(kv_floats_);
    }
    // A generic bias: this rank's queries against every rank's keys, one table per key block.
    const bool table = opt_.bias.kind == BiasKind::Table;
    tables_.resize(table ? cp : 0);
    dtables_.resize(table ? cp : 0);
    tables_dev_.resize(table && !host_memory() ? cp : 0);
    dtables_dev_.resize(table && !host_memory() ? cp : 0);
    const size_t n = static_cast<size_t>(B) * H_ * Tl_ * Tl_;
    for (size_t src = 0; src < tables_.size(); ++src) {
        tables_[src].assign(n, 0.0f);
        dtables_[src].assign(n, 0.0f);
        block_bias_.fill(tables_[src].data(), meta_[cp_.rank()].rows(Tl_),
                         meta_[src].rows(Tl_), B);
        if (host_memory()) continue;
        ensure(tables_dev_[src], n);
        ensure(dtables_dev_[src], n);
        be_.copy_to_device(tables_dev_[src].data(), tables_[src].data(), n);
        be_.zero(dtables_dev_[src].data(), n);
    }
}

// Device copy of every rank's metadata: the int32 arrays travel as their bytes (4 per float).
void RingAttention::upload_meta() {
    static_assert(sizeof(int32_t) == sizeof(float));
    const int cp = cp_.size();
    const size_t n = static_cast<size_t>(B_) * Tl_;
    ensure(meta_dev_, static_cast<size_t>(cp) * 3 * n);
    for (int r = 0; r < cp; ++r) {
        float* at = meta_dev_.data() + static_cast<size_t>(r) * 3 * n;
        be_.copy_to_device(at, reinterpret_cast<const float*>(meta_[r].index.data()), n);
        be_.copy_to_device(at + n, meta_[r].positions.data(), n);
        if (!meta_[r].doc_start.empty())
            be_.copy_to_device(at + 2 * n,
                               reinterpret_cast<const float*>(meta_[r].doc_start.data()), n);
    }
}

AttnBlockRows RingAttention::block_rows(int r) const {
    if (host_memory()) return meta_[r].rows(Tl_);
    const size_t n = static_cast<size_t>(B_) * Tl_;
    const float* at = meta_dev_.data() + static_cast<size_t>(r) * 3 * n;
    return AttnBlockRows{Tl_, reinterpret_cast<const int32_t*>(at), at + n,
                         meta_[r].doc_start.empty() ? nullptr
                                                    : reinterpret_cast<const int32_t*>(at + 2 * n)};
}

AttentionOptions RingAttention::options_for(int src, bool with_grad) {
    AttentionOptions o = opt_;
    if (o.bias.kind == BiasKind::Table) {
        const bool host = host_memory();
        o.bias.table = host ? tables_[src].data() : tables_dev_[src].data();
        o.bias.dtable = !with_grad ? nullptr
                        : host     ? dtables_[src].data()
                                   : dtables_dev_[src].data();
    }
    return o;
}

void RingAttention::finish_backward() {
    for (size_t src = 0; src < dtables_.size(); ++src) {
        if (!host_memory())
            be_.copy_to_host(dtables_[src].data(), dtables_dev_[src].data(),
                             dtables_[src].size());
        block_bias_.grad(dtables_[src].data(), meta_[cp_.rank()].rows(Tl_), meta_[src].rows(Tl_),
                         B_);
    }
}

void RingAttention::take_kv(const float* qkv, float* kv) {
    const size_t rows = static_cast<size_t>(B_) * Tl_, C = C_;
    be_.copy_2d(kv, 2 * C, qkv + C, 3 * C, rows, 2 * C);
}

std::unique_ptr<Comm::Exchange> RingAttention::start_pass(const Arena& cur, Arena& next) {
    const int cp = cp_.size(), r = cp_.rank(), dest = (r + 1) % cp, src = (r - 1 + cp) % cp;
    const size_t bytes = kv_floats_ * sizeof(float);
    if (host_memory()) return cp_.start_sendrecv(cur.data(), next.data(), bytes, dest, src);
    if (device_) {  // NCCL on the backend's stream: ordered with the block kernels already
        device_->sendrecv(cur.data(), next.data(), kv_floats_, dest, src);
        return nullptr;
    }
    be_.copy_to_host(send_stage_.data(), cur.data(), kv_floats_);
    return cp_.start_sendrecv(send_stage_.data(), recv_stage_.data(), bytes, dest, src);
}

void RingAttention::finish_pass(std::unique_ptr<Comm::Exchange> x, Arena& cur, Arena& next) {
    if (x) x->wait();
    if (!host_memory() && !device_)
        be_.copy_to_device(next.data(), recv_stage_.data(), kv_floats_);
    std::swap(cur, next);
}

void RingAttention::forward(int, float* qkv, Operand out_op, float* saved) {
    const int cp = cp_.size(), r = cp_.rank();
    float* out = out_op.fp32("ring attention");
    if (rotary_.enabled())
        be_.rotary_forward(qkv, local_positions_, B_, Tl_, C_, H_, rotary_.spec());
    float* lse = saved;  // (B, H, Tl)
    take_kv(qkv, kv_.data());
    for (int s = 0; s < cp; ++s) {  // at step s this rank holds rank r - s's block
        const int src = (r - s + cp) % cp;
        // the next block travels while this one is used
        std::unique_ptr<Comm::Exchange> next = s + 1 < cp ? start_pass(kv_, kv_next_) : nullptr;
        // The first block writes out and lse (what merging it into 0 and -inf gives exactly);
        // the others merge.
        be_.attention_block_forward(s == 0 ? out : out_b_.data(), s == 0 ? lse : lse_b_.data(),
                                    qkv, kv_.data(), block_rows(r), block_rows(src), B_, C_, H_,
                                    options_for(src, false));
        if (s > 0)
            be_.attention_block_merge(out, lse, out_b_.data(), lse_b_.data(), B_, Tl_, C_, H_);
        if (s + 1 < cp) finish_pass(std::move(next), kv_, kv_next_);
    }
}

void RingAttention::backward(int, float* dqkv, const float* dout, const float* qkv,
                             const float* saved, Operand out_op, GradStore store) {
    const int cp = cp_.size(), r = cp_.rank();
    const float* out = out_op.fp32("ring attention");
    // every block adds into dqkv: Overwrite starts it from zeros
    if (store == GradStore::Overwrite)
        be_.zero(dqkv, static_cast<size_t>(B_) * Tl_ * 3 * static_cast<size_t>(C_));
    take_kv(qkv, kv_.data());  // q, k as forward left them (rotated)
    be_.zero(dkv_.data(), kv_floats_);
    for (int s = 0; s < cp; ++s) {
        const int src = (r - s + cp) % cp;
        // the next block travels while this one is used; its gradient waits for the block op
        std::unique_ptr<Comm::Exchange> next = s + 1 < cp ? start_pass(kv_, kv_next_) : nullptr;
        be_.attention_block_backward(dqkv, dkv_.data(), dout, qkv, kv_.data(), out, saved,
                                     block_rows(r), block_rows(src), B_, C_, H_,
                                     options_for(src, true));
        // the block and its gradient move on; after cp moves the gradient is home
        if (s + 1 < cp) finish_pass(std::move(next), kv_, kv_next_);
        pass(dkv_, dkv_next_);
    }
    const size_t rows = static_cast<size_t>(B_) * Tl_, C = C_;
    be_.copy_2d(dqkv + C, 3 * C, dkv_.data(), 2 * C, rows, 2 * C, /*accumulate=*/true);
    if (rotary_.enabled())
        be_.rotary_backward(dqkv, local_positions_, B_, Tl_, C_, H_, rotary_.spec());
}

}  // namespace ctx
