// The model's parallel passes: sequence and context parallelism switches, the context-parallel
// pass (this rank's zigzag share of the rows, whole rows' losses gathered), the generic bias
// across the ring, and the gather of vocabulary-parallel columns.
#include <cstring>

#include "core/error.h"
#include "model/decoder.h"
#include "model/decoder_acts.h"

namespace ctx {

// A generic-bias PE across the ring: the plugin's values for the visible pairs of a query block
// and a key block, this rank's heads (tensor parallelism: heads head0 ..), and back.
BlockBias Model::block_bias() {
    auto pairs = [this](const AttnBlockRows& q, const AttnBlockRows& k, int B,
                        std::vector<float>& dist, std::vector<float>& qpos,
                        std::vector<size_t>& at) {
        const int window = config_.window_with(attention_window_);
        dist.clear();
        qpos.clear();
        at.clear();
        for (int b = 0; b < B; ++b)
            for (int i = 0; i < q.T; ++i)
                for (int j = 0; j < k.T; ++j) {
                    const size_t qi = static_cast<size_t>(b) * q.T + i;
                    const size_t kj = static_cast<size_t>(b) * k.T + j;
                    if (!attn_block_visible(q, k, qi, kj, window)) continue;
                    dist.push_back(static_cast<float>(double(q.positions[qi]) - k.positions[kj]));
                    qpos.push_back(q.positions[qi]);
                    at.push_back((static_cast<size_t>(b) * shard_.H * q.T + i) * k.T + j);
                }
    };
    BlockBias bb;
    bb.fill = [this, pairs](float* table, const AttnBlockRows& q, const AttnBlockRows& k, int B) {
        std::vector<float> dist, qpos, val;
        std::vector<size_t> at;
        pairs(q, k, B, dist, qpos, at);
        val.resize(dist.size());
        HostSpan params = pe_span(params_);
        const size_t head = static_cast<size_t>(q.T) * k.T;
        for (int h = 0; h < shard_.H; ++h) {  // entry (b, h, i, j) = at + h Tq Tk
            pe_->bias_forward(pe_tensors(params.data()), shard_.head0 + h, dist.data(),
                              qpos.data(), static_cast<int64_t>(dist.size()), val.data());
            for (size_t p = 0; p < at.size(); ++p) table[at[p] + h * head] = val[p];
        }
    };
    bb.grad = [this, pairs](const float* dtable, const AttnBlockRows& q, const AttnBlockRows& k,
                            int B) {
        std::vector<float> dist, qpos, dval;
        std::vector<size_t> at;
        pairs(q, k, B, dist, qpos, at);
        dval.resize(dist.size());
        HostSpan params = pe_span(params_);
        HostSpan grads = pe_span(grads_);
        std::vector<ctx_tensor> g = pe_tensors(grads.data());
        const size_t head = static_cast<size_t>(q.T) * k.T;
        for (int h = 0; h < shard_.H; ++h) {
            for (size_t p = 0; p < at.size(); ++p) dval[p] = dtable[at[p] + h * head];
            pe_->bias_backward(pe_tensors(params.data()), g, shard_.head0 + h, dist.data(),
                               qpos.data(), static_cast<int64_t>(dist.size()), dval.data());
        }
        grads.commit();
    };
    return bb;
}

// Context parallelism: this rank's zigzag share of every row, the model over it, and the
// whole rows' losses gathered from the group.
LossSums Model::run_pass_cp(const Batch& b, bool train, float grad_scale) {
    const int cp = cp_->size(), B = b.B, T = b.T;
    cp_padded_T_ = 0;
    if (T % (2 * cp) != 0) return run_pass_cp_padded(b, train, grad_scale);
    check_batch(b);
    const int Tl = T / cp;
    CTX_CHECK(!tp_.sequence_parallel() || (B * Tl) % tp_.size() == 0,
              "sequence parallelism with context parallelism: this rank's {} x {} = {} tokens "
              "are not divisible by tp = {} (each rank keeps an equal share of the rows)", B, Tl,
              B * Tl, tp_.size());
    const std::vector<int32_t> mine = zigzag_indices(T, cp, cp_->rank());
    BatchBuffers& l = cp_local_;
    l.resize(B, Tl);
    for (int r = 0; r < B; ++r)
        for (int i = 0; i < Tl; ++i) {
            const size_t g = static_cast<size_t>(r) * T + mine[i], k = static_cast<size_t>(r) * Tl + i;
            l.tokens[k] = b.tokens[g];
            l.targets[k] = b.targets[g];
            l.positions[k] = b.positions[g];
            l.mask[k] = b.loss_mask[g];
        }
    const Batch lb = l.batch();  // documents: the ring reads the whole batch's doc_start
    reserve(B, T);  // whole rows: the rank keeps T / cp of each
    stage_batch(lb);
    cp_whole_ = &b;
    forward_impl(lb);
    const int N = B * Tl;
    cross_entropy(train, N, grad_scale);
    if (train) backward_impl(lb);  // before the losses' copy back, which waits (run_pass)
    // every rank's losses (N) into the whole rows' (B, T)
    std::vector<float>& part = cp_losses_, &all = cp_losses_all_;  // kept: no allocation per step
    part.resize(N);
    all.resize(static_cast<size_t>(N) * cp);
    backend_->copy_to_host(part.data(), acts_->losses, N);
    cp_->allgather(part.data(), part.size() * sizeof(float), all.data());
    losses_host_.assign(static_cast<size_t>(B) * T, 0.0f);
    for (int q = 0; q < cp; ++q) {
        const std::vector<int32_t> idx = zigzag_indices(T, cp, q);
        for (int r = 0; r < B; ++r)
            for (int i = 0; i < Tl; ++i)
                losses_host_[static_cast<size_t>(r) * T + idx[i]] =
                    all[static_cast<size_t>(q) * N + static_cast<size_t>(r) * Tl + i];
    }
    LossSums s;
    for (size_t i = 0; i < losses_host_.size(); ++i) {
        s.loss_sum += losses_host_[i];
        s.mask_sum += b.loss_mask[i];
    }
    cp_whole_ = nullptr;
    return s;
}

// Rows that do not split into 2 cp equal chunks (a scored prompt, an evaluation row of any
// length) are padded at their end to the next multiple: the padding is masked out of the loss
// and, coming after every real token, invisible to them under causal attention, so the real
// tokens' losses, logits and gradients are those of the unpadded rows. Pad tokens repeat the
// row's last position and document, which every PE accepts.
LossSums Model::run_pass_cp_padded(const Batch& b, bool train, float grad_scale) {
    const int cp = cp_->size(), B = b.B, T = b.T, Tp = (T + 2 * cp - 1) / (2 * cp) * (2 * cp);
    check_batch(b);
    BatchBuffers& p = cp_padded_;
    p.resize(B, Tp);
    if (b.doc_start) p.doc_start.assign(static_cast<size_t>(B) * Tp, 0);
    for (int r = 0; r < B; ++r)
        for (int t = 0; t < Tp; ++t) {
            const size_t d = static_cast<size_t>(r) * Tp + t;
            const size_t s = static_cast<size_t>(r) * T + std::min(t, T - 1);
            const bool pad = t >= T;
            p.tokens[d] = pad ? 0 : b.tokens[s];
            p.targets[d] = pad ? 0 : b.targets[s];
            p.positions[d] = b.positions[s];
            p.mask[d] = pad ? 0.0f : b.loss_mask[s];
            if (b.doc_start) p.doc_start[d] = b.doc_start[s];
        }
    const LossSums sums = run_pass_cp(p.batch(), train, grad_scale);
    // the whole rows' losses without the padding
    for (int r = 0; r < B; ++r)
        std::copy_n(losses_host_.begin() + static_cast<ptrdiff_t>(r) * Tp, T,
                    losses_host_.begin() + static_cast<ptrdiff_t>(r) * T);
    losses_host_.resize(static_cast<size_t>(B) * T);
    cp_padded_T_ = Tp;
    return sums;
}

void Model::set_sequence_parallel(bool on) {
    CTX_CHECK(!on || tp_.active(), "sequence parallelism needs tensor parallelism (tp > 1)");
    if (on == tp_.sequence_parallel()) return;
    tp_.set_sequence_parallel(on);
    acts_.reset();  // the residual stream's buffers change size
    reserved_B_ = reserved_T_ = 0;
}

void Model::set_context_parallel(Comm* cp) {
    if (cp && cp->size() <= 1) cp = nullptr;
    if (cp == cp_) return;
    cp_ = cp;
    ring_ = cp ? std::make_unique<RingAttention>(*backend_, shard_.A, shard_.H, *cp) : nullptr;
    if (ring_ && bias_generic_) ring_->set_block_bias(block_bias());
    set_attention_choice(attention_choice_);  // the ring keeps the lse: flash mode's buffers
    acts_.reset();
    reserved_B_ = reserved_T_ = 0;
}

void Model::gather_vocab_columns(const float* local, size_t rows, float* out) const {
    // every rank's (rows, V_r) block padded to the largest, then its columns into place
    const size_t V = config_.vocab_size, Vmax = shard_slice(V, 0, shard_.size).count;
    const size_t Vr = shard_.V;
    std::vector<float> host(rows * Vr), mine(rows * Vmax, 0.0f), all(rows * Vmax * shard_.size);
    backend_->copy_to_host(host.data(), local, host.size());
    for (size_t n = 0; n < rows; ++n)
        std::memcpy(mine.data() + n * Vmax, host.data() + n * Vr, Vr * sizeof(float));
    tp_.comm()->allgather(mine.data(), mine.size() * sizeof(float), all.data());
    for (int r = 0; r < shard_.size; ++r) {
        const Slice cols = shard_slice(V, r, shard_.size);
        for (size_t n = 0; n < rows; ++n)
            std::memcpy(out + n * V + cols.first, all.data() + (r * rows + n) * Vmax,
                        cols.count * sizeof(float));
    }
}

}  // namespace ctx
