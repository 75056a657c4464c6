// The model's parameter layout, this rank's part of it under tensor parallelism, and the moves
// between the two (checkpoints, HF export and initialisation see the whole model).
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "model/decoder.h"

namespace ctx {

void Model::build_layout_for(const TensorShard& s, ArenaLayout& out,
                             std::vector<ShardSpec>* specs, std::vector<size_t>* pe_index) const {
    const int64_t C = s.C, V = s.V, F = s.F, A = s.A, Q = s.Q, F2 = s.F2, D = s.D;
    // The whole tensor's parts along the split dim (ShardSpec): per the tp = 1 shapes.
    const int64_t tp = s.size;
    const std::vector<int64_t> qkv_parts = {s.H * D * tp, s.Hkv * D * tp, s.Hkv * D * tp};
    const std::vector<int64_t> fc_parts = config_.gated_mlp()
                                              ? std::vector<int64_t>{F * tp, F * tp}
                                              : std::vector<int64_t>{F * tp};
    const bool ab = config_.attention_bias, ob = config_.attention_out_bias;
    const bool mb = config_.mlp_bias, nb = config_.norm_bias;
    out = ArenaLayout();
    if (specs) specs->clear();
    auto add = [&](const std::string& name, std::vector<int64_t> shape, bool decay,
                   ShardSpec spec = {}) {
        out.add(name, std::move(shape), decay);
        if (specs) specs->push_back(std::move(spec));
    };
    const int64_t Vall = config_.vocab_size;
    add("wte", {V, C}, true, {0, {Vall}});  // vocabulary-parallel
    if (config_.embedding_layernorm) {
        add("emb_ln.weight", {C}, false);
        if (nb) add("emb_ln.bias", {C}, false);
    }
    for (int l = 0; l < config_.n_layer; ++l) {
        const std::string p = fmt::format("layers.{}.", l);
        add(p + "ln1.weight", {C}, false);
        if (nb) add(p + "ln1.bias", {C}, false);
        add(p + "attn.qkv.weight", {Q, C}, true, {0, qkv_parts});   // column-parallel
        if (ab) add(p + "attn.qkv.bias", {Q}, false, {0, qkv_parts});
        add(p + "attn.proj.weight", {C, A}, true, {1, {A * tp}});  // row-parallel
        if (ob) add(p + "attn.proj.bias", {C}, false);
        add(p + "ln2.weight", {C}, false);
        if (nb) add(p + "ln2.bias", {C}, false);
        add(p + "mlp.fc.weight", {F2, C}, true, {0, fc_parts});     // column-parallel
        if (mb) add(p + "mlp.fc.bias", {F2}, false, {0, fc_parts});
        add(p + "mlp.proj.weight", {C, F}, true, {1, {F * tp}});   // row-parallel
        if (mb) add(p + "mlp.proj.bias", {C}, false);
    }
    add("lnf.weight", {C}, false);
    if (nb) add("lnf.bias", {C}, false);
    if (!config_.tied_embeddings) add("lm_head.weight", {V, C}, true, {0, {Vall}});
    if (pe_index) pe_index->clear();
    if (pe_) {  // replicated: small, and per-head ones are indexed by global head
        for (const PeParamDecl& p : pe_->params()) {
            if (pe_index) pe_index->push_back(out.views().size());
            add("pe." + p.name, p.shape, p.weight_decay);
        }
    }
}

void Model::build_layout() {
    build_layout_for(shard_, layout_, &shard_specs_, &pe_view_index_);
    build_layout_for(tensor_shard(config_, 0, 1), full_layout_, nullptr, nullptr);
    rank_layouts_.assign(tp_.active() ? shard_.size : 0, ArenaLayout());
    for (size_t r = 0; r < rank_layouts_.size(); ++r)
        build_layout_for(tensor_shard(config_, static_cast<int>(r), shard_.size),
                         rank_layouts_[r], nullptr, nullptr);
    layer_offsets_.clear();
    for (int l = 0; l < config_.n_layer; ++l)
        layer_offsets_.push_back(layout_.view(fmt::format("layers.{}.ln1.weight", l)).offset);
    layer_offsets_.push_back(layout_.view("lnf.weight").offset);
    norm_ranges_.clear();
    for (size_t i = 0; i < layout_.views().size(); ++i) {
        const ParamView& v = layout_.views()[i];
        if (shard_specs_[i].replicated() && shard_.rank != 0) continue;
        if (!norm_ranges_.empty() && norm_ranges_.back().second + 16 > v.offset)
            norm_ranges_.back().second = v.offset + v.numel;  // adjacent (padding is zero)
        else
            norm_ranges_.emplace_back(v.offset, v.offset + v.numel);
    }
}

size_t Model::num_params() const {
    size_t n = 0;
    for (const auto& v : full_layout_.views()) n += v.numel;
    return n;
}

std::vector<float> Model::gather_full_host(const float* local) const {
    const size_t P = layout_.total();
    if (!tp_.active()) return std::vector<float>(local, local + P);
    // every rank's arena, padded to the largest (ranks' vocabulary rows may differ)
    const int W = tp_.size();
    size_t Pmax = 0;
    for (const ArenaLayout& l : rank_layouts_) Pmax = std::max(Pmax, l.total());
    std::vector<float> mine(Pmax, 0.0f), parts(Pmax * W);
    std::copy(local, local + P, mine.begin());
    tp_.comm()->allgather(mine.data(), Pmax * sizeof(float), parts.data());
    std::vector<float> whole(full_layout_.total(), 0.0f);
    const auto& fv = full_layout_.views();
    for (size_t i = 0; i < fv.size(); ++i)
        for (int r = 0; r < W; ++r)
            copy_shard(whole.data() + fv[i].offset,
                       parts.data() + r * Pmax + rank_layouts_[r].views()[i].offset, fv[i].shape,
                       shard_specs_[i], r, W, false);
    return whole;
}

std::vector<float> Model::gather_full(const Arena& local) const {
    std::vector<float> host(local.size());
    backend_->copy_to_host(host.data(), local.data(), host.size());
    if (!tp_.active()) return host;
    return gather_full_host(host.data());
}

void Model::scatter_full_host(const float* whole, float* local) const {
    if (!tp_.active()) {
        std::memcpy(local, whole, layout_.total() * sizeof(float));
        return;
    }
    std::memset(local, 0, layout_.total() * sizeof(float));
    const auto& lv = layout_.views();
    const auto& fv = full_layout_.views();
    for (size_t i = 0; i < lv.size(); ++i)
        copy_shard(const_cast<float*>(whole) + fv[i].offset, local + lv[i].offset, fv[i].shape,
                   shard_specs_[i], shard_.rank, shard_.size, true);
}

void Model::scatter_full(const float* whole, Arena& local) const {
    if (!tp_.active()) {
        backend_->copy_to_device(local.data(), whole, layout_.total());
        return;
    }
    std::vector<float> host(layout_.total());
    scatter_full_host(whole, host.data());
    backend_->copy_to_device(local.data(), host.data(), host.size());
}

}  // namespace ctx
