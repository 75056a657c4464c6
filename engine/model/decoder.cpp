#include "model/decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "model/host_span.h"

namespace ctx {

// ---------------------------------------------------------------- activations
// One backend buffer holds everything the backward pass needs; offsets are computed for the
// reserved (B, T). Per-layer buffers are stacked by layer.
struct Model::Acts {
    Arena buffer;
    float* encoded;      // (B, T, C)     embedding (+ input PE), before the embedding layernorm
    float* emb_ln;       // (B, T, C)     after the embedding layernorm (BLOOM), else unused
    float *emb_ln_mean, *emb_ln_rstd;  // (B, T)
    // per layer, stacked as (L, ...)
    float* ln1;          // (L, B, T, C)
    float *ln1_mean, *ln1_rstd;  // (L, B, T)
    float* qkv;          // (L, B, T, 3C)  q, k after rotary
    float* atty;         // (L, B, T, C)
    float* att;          // (L, B, H, T, T) probabilities, or (L, B, H, T) lse in flash mode
    float* res2;         // (L, B, T, C)   x + attn (sequential residual only)
    float* ln2;          // (L, B, T, C)
    float *ln2_mean, *ln2_rstd;  // (L, B, T)
    float* fch;          // (L, B, T, F)
    float* fch_act;      // (L, B, T, F)
    float* resid;        // (L+1, B, T, C) residual stream entering each block (and the final)
    float* lnf;          // (B, T, C)
    float *lnf_mean, *lnf_rstd;  // (B, T)
    float* logits;       // (B, T, V)      becomes dlogits in the backward pass
    float* losses;       // (B, T)
    float* tmp;          // (B, T, C)      attention / mlp branch output before the residual add
    // gradients of activations (reused by every layer)
    float* dx;           // (B, T, C)  gradient of the residual stream
    float* dln;          // (B, T, C)
    float* dln2;         // (B, T, C)  parallel residual: the MLP branch's layernorm gradient
    float* datty;        // (B, T, C)
    float* dqkv;         // (B, T, 3C)
    float* dfch;         // (B, T, F)
    float* dfch_act;     // (B, T, F)
    float* demb;         // (B, T, C)
    float* attn_scratch;
    // generic bias (CTX_BIAS_GENERIC) only, else empty: shared by every layer
    float* bias_table;   // (B, H, T, T)  f_h(p_i - p_j, p_i) for j <= i
    float* dbias_table;  // (B, H, T, T)  d(loss)/d(bias), summed over layers
    // the batch on the device
    float* positions;    // (B, T)
    float* loss_mask;    // (B, T)
    std::vector<int32_t> tokens, targets;  // (B, T) host staging (CPU backend reads them)
};

Model::Model(const ModelConfig& config, Backend& backend, std::unique_ptr<PePlugin> pe,
             uint64_t seed)
    : config_(config), backend_(&backend), pe_(std::move(pe)) {
    config_.validate();
    build_layout();
    params_ = Arena(*backend_, layout_.total());
    grads_ = Arena(*backend_, layout_.total());
    init_params(seed);
    if (pe_ && pe_->has(CTX_PE_HOOK_INPUT)) input_spec_ = pe_->input_spec();
    bias_generic_ = pe_bias_is_generic();
    set_attention_choice(AttentionChoice::Auto);
}

bool Model::pe_bias_is_generic() {
    return pe_ && pe_->has(CTX_PE_HOOK_BIAS) &&
           pe_->bias_spec(config_.context_length).kind == CTX_BIAS_GENERIC;
}

Model::~Model() = default;

void Model::build_layout() {
    const int64_t C = config_.d_model, V = config_.vocab_size, F = config_.ffn();
    const bool ab = config_.attention_bias, mb = config_.mlp_bias, nb = config_.norm_bias;
    layout_ = ArenaLayout();
    layout_.add("wte", {V, C}, true);
    if (config_.embedding_layernorm) {
        layout_.add("emb_ln.weight", {C}, false);
        if (nb) layout_.add("emb_ln.bias", {C}, false);
    }
    for (int l = 0; l < config_.n_layer; ++l) {
        const std::string p = fmt::format("layers.{}.", l);
        layout_.add(p + "ln1.weight", {C}, false);
        if (nb) layout_.add(p + "ln1.bias", {C}, false);
        layout_.add(p + "attn.qkv.weight", {3 * C, C}, true);
        if (ab) layout_.add(p + "attn.qkv.bias", {3 * C}, false);
        layout_.add(p + "attn.proj.weight", {C, C}, true);
        if (ab) layout_.add(p + "attn.proj.bias", {C}, false);
        layout_.add(p + "ln2.weight", {C}, false);
        if (nb) layout_.add(p + "ln2.bias", {C}, false);
        layout_.add(p + "mlp.fc.weight", {F, C}, true);
        if (mb) layout_.add(p + "mlp.fc.bias", {F}, false);
        layout_.add(p + "mlp.proj.weight", {C, F}, true);
        if (mb) layout_.add(p + "mlp.proj.bias", {C}, false);
    }
    layer_offsets_.clear();
    for (int l = 0; l < config_.n_layer; ++l)
        layer_offsets_.push_back(layout_.view(fmt::format("layers.{}.ln1.weight", l)).offset);
    layout_.add("lnf.weight", {C}, false);
    layer_offsets_.push_back(layout_.view("lnf.weight").offset);
    if (nb) layout_.add("lnf.bias", {C}, false);
    if (!config_.tied_embeddings) layout_.add("lm_head.weight", {V, C}, true);
    pe_view_index_.clear();
    if (pe_) {
        for (const PeParamDecl& p : pe_->params()) {
            pe_view_index_.push_back(layout_.views().size());
            layout_.add("pe." + p.name, p.shape, p.weight_decay);
        }
    }
}

size_t Model::num_params() const {
    size_t n = 0;
    for (const auto& v : layout_.views()) n += v.numel;
    return n;
}

static float* view_or_null(const ArenaLayout& layout, const Arena& a, const std::string& name) {
    const ParamView* v = layout.find(name);
    return v ? a.at(*v) : nullptr;
}

Model::Layer Model::layer(int l, const Arena& a) const {
    const std::string p = fmt::format("layers.{}.", l);
    auto get = [&](const char* n) { return view_or_null(layout_, a, p + n); };
    return Layer{get("ln1.weight"),      get("ln1.bias"),       get("attn.qkv.weight"),
                 get("attn.qkv.bias"),   get("attn.proj.weight"), get("attn.proj.bias"),
                 get("ln2.weight"),      get("ln2.bias"),       get("mlp.fc.weight"),
                 get("mlp.fc.bias"),     get("mlp.proj.weight"), get("mlp.proj.bias")};
}

size_t Model::pe_begin() const {
    return pe_view_index_.empty() ? layout_.total() : layout_.views()[pe_view_index_[0]].offset;
}

HostSpan Model::pe_span(const Arena& a) const {
    return HostSpan(*backend_, a.data() + pe_begin(), layout_.total() - pe_begin(), true);
}

std::vector<ctx_tensor> Model::pe_tensors(float* base) const {
    std::vector<ctx_tensor> out;
    const size_t begin = pe_begin();
    for (size_t idx : pe_view_index_) {
        const ParamView& v = layout_.views()[idx];
        ctx_tensor t{};
        t.data = base + (v.offset - begin);
        t.dtype = CTX_F32;
        t.ndim = static_cast<int32_t>(v.shape.size());
        for (int i = 0; i < 4; ++i) t.shape[i] = i < t.ndim ? v.shape[i] : 1;
        out.push_back(t);
    }
    return out;
}

void Model::init_params(uint64_t seed) {
    // GPT-2 initialisation on the host, then one copy to the device.
    Rng rng(seed);
    std::vector<float> host(layout_.total(), 0.0f);
    const double std_ = config_.init_std;
    const double resid_std = std_ / std::sqrt(2.0 * config_.n_layer);
    for (const ParamView& v : layout_.views()) {
        if (v.name.rfind("pe.", 0) == 0) continue;  // the plugin's declarations decide
        float* x = host.data() + v.offset;
        const bool is_norm_weight = v.name.find("ln") != std::string::npos &&
                                    v.name.ends_with(".weight");
        if (is_norm_weight) {
            std::fill(x, x + v.numel, 1.0f);
        } else if (v.shape.size() == 2) {
            const bool residual_proj = v.name.ends_with("attn.proj.weight") ||
                                       v.name.ends_with("mlp.proj.weight");
            const double s = residual_proj ? resid_std : std_;
            for (size_t i = 0; i < v.numel; ++i) x[i] = static_cast<float>(rng.normal() * s);
        }  // biases stay zero
    }
    if (pe_) {
        std::vector<ctx_tensor> t;
        for (size_t idx : pe_view_index_) {
            const ParamView& v = layout_.views()[idx];
            ctx_tensor x{};
            x.data = host.data() + v.offset;
            x.ndim = static_cast<int32_t>(v.shape.size());
            for (int i = 0; i < 4; ++i) x.shape[i] = i < x.ndim ? v.shape[i] : 1;
            t.push_back(x);
        }
        Rng pe_rng(seed ^ 0x5045'5045'5045'5045ull);  // "PEPE": its own stream
        pe_->init_params(t, pe_rng);
    }
    backend_->copy_to_device(params_.data(), host.data(), host.size());
}

void Model::reserve(int B, int T) {
    if (acts_ && B <= reserved_B_ && T <= reserved_T_) return;
    B = std::max(B, reserved_B_);
    T = std::max(T, reserved_T_);
    const size_t C = config_.d_model, V = config_.vocab_size, F = config_.ffn();
    const size_t L = config_.n_layer, H = config_.n_head;
    const size_t N = static_cast<size_t>(B) * T;
    const size_t scratch =
        backend_->attention_scratch_floats(B, T, config_.d_model, config_.n_head, attention_mode_);
    const size_t saved = attention_saved_floats(attention_mode_, B, T, config_.n_head);
    // The generic bias costs 2 (B, H, T, T) tables (value and gradient; the saved attention
    // probabilities are L of them) plus 3 packed pair arrays on the host.
    const size_t table = bias_generic_ ? static_cast<size_t>(B) * H * T * T : 0;
    auto acts = std::make_unique<Acts>();
    // Sizes in the order of the struct; each rounded to 16 floats.
    const std::vector<size_t> sizes = {
        N * C, N * C, N, N,                                   // encoded, emb_ln, mean, rstd
        L * N * C, L * N, L * N, L * N * 3 * C, L * N * C,    // ln1, mean, rstd, qkv, atty
        L * saved, L * N * C,                                 // att (or lse), res2
        L * N * C, L * N, L * N, L * N * F, L * N * F,        // ln2, mean, rstd, fch, fch_act
        (L + 1) * N * C, N * C, N, N, N * V, N, N * C,        // resid, lnf, m, r, logits, losses, tmp
        N * C, N * C, N * C, N * C, N * 3 * C, N * F, N * F, N * C, scratch,  // grads, scratch
        table, table,                                         // bias_table, dbias_table
        N, N};                                                // positions, loss_mask
    size_t total = 0;
    for (size_t s : sizes) total += (s + 15) / 16 * 16;
    acts->buffer = Arena(*backend_, total);
    float** slots[] = {&acts->encoded, &acts->emb_ln, &acts->emb_ln_mean, &acts->emb_ln_rstd,
                       &acts->ln1, &acts->ln1_mean, &acts->ln1_rstd, &acts->qkv, &acts->atty,
                       &acts->att, &acts->res2, &acts->ln2, &acts->ln2_mean, &acts->ln2_rstd,
                       &acts->fch, &acts->fch_act, &acts->resid, &acts->lnf, &acts->lnf_mean,
                       &acts->lnf_rstd, &acts->logits, &acts->losses, &acts->tmp, &acts->dx,
                       &acts->dln, &acts->dln2, &acts->datty, &acts->dqkv, &acts->dfch,
                       &acts->dfch_act, &acts->demb, &acts->attn_scratch, &acts->bias_table,
                       &acts->dbias_table, &acts->positions, &acts->loss_mask};
    static_assert(sizeof(slots) / sizeof(slots[0]) == 36);
    CTX_CHECK(sizes.size() == 36, "internal: activation slot count mismatch");
    size_t off = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
        *slots[i] = acts->buffer.data() + off;
        off += (sizes[i] + 15) / 16 * 16;
    }
    if (!bias_generic_) acts->bias_table = acts->dbias_table = nullptr;
    const size_t pairs = bias_generic_ ? N * (static_cast<size_t>(T) + 1) / 2 : 0;
    pair_dist_.assign(pairs, 0.0f);
    pair_qpos_.assign(pairs, 0.0f);
    pair_val_.assign(pairs, 0.0f);
    bias_stage_.assign(bias_generic_ && backend_->kind() != DeviceKind::CPU ? table : 0, 0.0f);
    acts->tokens.resize(N);
    acts->targets.resize(N);
    losses_host_.assign(N, 0.0f);
    acts_ = std::move(acts);
    reserved_B_ = B;
    reserved_T_ = T;
}

void Model::check_batch(const Batch& b) const {
    CTX_CHECK(b.B > 0 && b.T > 0, "batch must have positive size, got B={} T={}", b.B, b.T);
    const size_t N = static_cast<size_t>(b.B) * b.T;
    const int V = config_.vocab_size;
    int64_t table_rows = -1;
    if (pe_ && pe_->has(CTX_PE_HOOK_INPUT) && input_spec_.kind == CTX_INPUT_TABLE)
        table_rows = pe_->params()[input_spec_.table_param].shape[0];
    for (size_t i = 0; i < N; ++i) {
        CTX_CHECK(b.tokens[i] >= 0 && b.tokens[i] < V, "token {} at row {} col {} is outside the "
                  "vocabulary [0, {})", b.tokens[i], i / b.T, i % b.T, V);
        CTX_CHECK(b.targets[i] >= 0 && b.targets[i] < V, "target {} at row {} col {} is outside "
                  "the vocabulary [0, {})", b.targets[i], i / b.T, i % b.T, V);
        const float p = b.positions[i];
        CTX_CHECK(std::isfinite(p) && p >= 0.0f, "position {} at row {} col {} must be finite "
                  "and >= 0", p, i / b.T, i % b.T);
        CTX_CHECK(table_rows < 0 || p <= static_cast<float>(table_rows - 1),
                  "position {} exceeds the learned position table of {} rows ({}); extend the "
                  "model (model:extend(L)) before using longer positions", p, table_rows,
                  pe_->name());
    }
}

void Model::upload_batch(const Batch& b) {
    const size_t N = static_cast<size_t>(b.B) * b.T;
    std::copy(b.tokens, b.tokens + N, acts_->tokens.begin());
    std::copy(b.targets, b.targets + N, acts_->targets.begin());
    backend_->copy_to_device(acts_->positions, b.positions, N);
    backend_->copy_to_device(acts_->loss_mask, b.loss_mask, N);
}

BiasSpec Model::bias_spec(int T) {
    BiasSpec s;
    if (!pe_ || !pe_->has(CTX_PE_HOOK_BIAS)) return s;
    const ctx_bias_spec c = pe_->bias_spec(T);
    if (c.kind == CTX_BIAS_GENERIC) {
        CTX_CHECK(bias_generic_ && acts_ && acts_->bias_table != nullptr,
                  "{}: the bias kind changed to generic after the model was built", pe_->name());
        s.kind = BiasKind::Table;
        s.table = acts_->bias_table;
        s.dtable = acts_->dbias_table;
        return s;
    }
    CTX_CHECK(!bias_generic_, "{}: the bias kind changed from generic to {}", pe_->name(), c.kind);
    s.kind = static_cast<BiasKind>(c.kind);
    s.num_buckets = c.num_buckets;
    s.max_distance = c.max_distance;
    auto param = [&](int32_t i, const Arena& a) -> float* {
        return i >= 0 ? a.at(layout_.views()[pe_view_index_[i]]) : nullptr;
    };
    s.a = c.param_a >= 0 ? param(c.param_a, params_) : c.slopes;
    s.da = param(c.param_a, grads_);
    s.b = param(c.param_b, params_);
    s.db = param(c.param_b, grads_);
    return s;
}

// Packs every causal pair (b, i, j <= i) of the batch (row-major, the order the tables are
// scattered in below), asks the plugin for each head's bias and scatters it into the (B, H, T, T)
// table the attention op reads. Entries with j > i are never read.
void Model::generic_bias_forward(const Batch& b) {
    const int B = b.B, T = b.T, H = config_.n_head;
    const size_t n = static_cast<size_t>(B) * T * (T + 1) / 2;
    CTX_CHECK(n <= pair_dist_.size(), "internal: generic bias pair buffers are too small");
    size_t k = 0;
    for (int r = 0; r < B; ++r) {
        const float* pos = b.positions + static_cast<size_t>(r) * T;  // (T)
        for (int i = 0; i < T; ++i)
            for (int j = 0; j <= i; ++j, ++k) {
                pair_dist_[k] = static_cast<float>(static_cast<double>(pos[i]) - pos[j]);
                pair_qpos_[k] = pos[i];
            }
    }
    const bool direct = backend_->kind() == DeviceKind::CPU;  // host memory: write in place
    float* table = direct ? acts_->bias_table : bias_stage_.data();  // (B, H, T, T)
    HostSpan param_span = pe_span(params_);
    const std::vector<ctx_tensor> params = pe_tensors(param_span.data());
    for (int h = 0; h < H; ++h) {
        pe_->bias_forward(params, h, pair_dist_.data(), pair_qpos_.data(),
                          static_cast<int64_t>(n), pair_val_.data());
        k = 0;
        for (int r = 0; r < B; ++r)
            for (int i = 0; i < T; ++i) {
                float* row = table + ((static_cast<size_t>(r) * H + h) * T + i) * T;  // (T)
                for (int j = 0; j <= i; ++j) row[j] = pair_val_[k++];
            }
    }
    if (!direct)
        backend_->copy_to_device(acts_->bias_table, table, static_cast<size_t>(B) * H * T * T);
}

// Gathers d(loss)/d(bias) of every causal pair from dbias_table (the sum over layers) and hands
// it to the plugin, head by head, with the pairs of the forward pass.
void Model::generic_bias_backward(const Batch& b) {
    const int B = b.B, T = b.T, H = config_.n_head;
    const size_t n = static_cast<size_t>(B) * T * (T + 1) / 2;
    const float* dtable = acts_->dbias_table;  // (B, H, T, T)
    if (backend_->kind() != DeviceKind::CPU) {
        backend_->copy_to_host(bias_stage_.data(), dtable, static_cast<size_t>(B) * H * T * T);
        dtable = bias_stage_.data();
    }
    HostSpan param_span = pe_span(params_);
    HostSpan grad_span = pe_span(grads_);
    const std::vector<ctx_tensor> params = pe_tensors(param_span.data());
    std::vector<ctx_tensor> grads = pe_tensors(grad_span.data());
    for (int h = 0; h < H; ++h) {
        size_t k = 0;
        for (int r = 0; r < B; ++r)
            for (int i = 0; i < T; ++i) {
                const float* row = dtable + ((static_cast<size_t>(r) * H + h) * T + i) * T;
                for (int j = 0; j <= i; ++j) pair_val_[k++] = row[j];
            }
        pe_->bias_backward(params, grads, h, pair_dist_.data(), pair_qpos_.data(),
                           static_cast<int64_t>(n), pair_val_.data());
    }
    grad_span.commit();
}

void Model::forward_impl(const Batch& b) {
    Backend& be = *backend_;
    Acts& a = *acts_;
    const int B = b.B, T = b.T, C = config_.d_model, V = config_.vocab_size, F = config_.ffn();
    const int H = config_.n_head, P = config_.n_layer;
    const int N = B * T;
    const size_t NC = static_cast<size_t>(N) * C;
    (void)P;

    // ---- embedding + input PE
    const float* wpe = nullptr;
    int table_rows = 0;
    if (pe_ && pe_->has(CTX_PE_HOOK_INPUT) && input_spec_.kind == CTX_INPUT_TABLE) {
        const ParamView& v = layout_.views()[pe_view_index_[input_spec_.table_param]];
        wpe = params_.at(v);
        table_rows = static_cast<int>(v.shape[0]);
    }
    const float* wte = params_.at(layout_.view("wte"));
    be.embedding_forward(a.encoded, a.tokens.data(), a.positions, wte, wpe, N, C, V, table_rows);
    if (pe_ && pe_->has(CTX_PE_HOOK_INPUT) && input_spec_.kind == CTX_INPUT_GENERIC) {
        HostSpan params = pe_span(params_);
        HostSpan encoded(be, a.encoded, NC, true);  // (B, T, C)
        pe_->input_forward(pe_tensors(params.data()), b.positions, N, encoded.data());
        encoded.commit();
    }
    float* x = a.resid;  // (B, T, C) stream entering layer 0
    if (config_.embedding_layernorm) {
        be.layernorm_forward(x, a.emb_ln_mean, a.emb_ln_rstd, a.encoded,
                             view_or_null(layout_, params_, "emb_ln.weight"),
                             view_or_null(layout_, params_, "emb_ln.bias"), N, C,
                             config_.norm_eps);
    } else {
        be.copy(x, a.encoded, NC);
    }

    RotarySpec rot;
    if (pe_ && pe_->has(CTX_PE_HOOK_ROTARY)) rot = pe_->rotary_spec(T);
    AttentionOptions attn;
    attn.bias = bias_spec(T);
    attn.window = attention_window_;
    attn.mode = attention_mode_;
    if (bias_generic_) generic_bias_forward(b);  // one table for every layer

    for (int l = 0; l < config_.n_layer; ++l) {
        const Layer w = layer(l, params_);
        float* xin = a.resid + l * NC;         // (B, T, C)
        float* xout = a.resid + (l + 1) * NC;  // (B, T, C)
        float* ln1 = a.ln1 + l * NC;
        float* ln1_mean = a.ln1_mean + static_cast<size_t>(l) * N;
        float* ln1_rstd = a.ln1_rstd + static_cast<size_t>(l) * N;
        float* qkv = a.qkv + l * NC * 3;
        float* atty = a.atty + l * NC;
        float* att = a.att + static_cast<size_t>(l) * attention_saved_floats(attention_mode_, B, T, H);
        float* res2 = a.res2 + l * NC;
        float* ln2 = a.ln2 + l * NC;
        float* ln2_mean = a.ln2_mean + static_cast<size_t>(l) * N;
        float* ln2_rstd = a.ln2_rstd + static_cast<size_t>(l) * N;
        float* fch = a.fch + l * static_cast<size_t>(N) * F;
        float* fch_act = a.fch_act + l * static_cast<size_t>(N) * F;

        // attention branch: ln1 -> qkv -> rotary -> attention -> out projection
        be.layernorm_forward(ln1, ln1_mean, ln1_rstd, xin, w.ln1_w, w.ln1_b, N, C,
                             config_.norm_eps);
        be.matmul_forward(qkv, ln1, w.qkv_w, w.qkv_b, N, C, 3 * C);
        if (rot.rotary_dims > 0) be.rotary_forward(qkv, a.positions, B, T, C, H, rot);
        be.attention_forward(atty, att, qkv, a.positions, B, T, C, H, attn);
        be.matmul_forward(a.tmp, atty, w.attn_proj_w, w.attn_proj_b, N, C, C);
        be.add(res2, xin, a.tmp, NC);  // sequential: x + attn; parallel: also x + attn

        // MLP branch: ln2 of (x + attn) sequentially, of x in parallel
        const float* mlp_in = config_.parallel_residual ? xin : res2;
        be.layernorm_forward(ln2, ln2_mean, ln2_rstd, mlp_in, w.ln2_w, w.ln2_b, N, C,
                             config_.norm_eps);
        be.matmul_forward(fch, ln2, w.fc_w, w.fc_b, N, C, F);
        be.activation_forward(fch_act, fch, static_cast<size_t>(N) * F, config_.activation);
        be.matmul_forward(a.tmp, fch_act, w.fc_proj_w, w.fc_proj_b, N, F, C);
        be.add(xout, res2, a.tmp, NC);
    }

    const float* xL = a.resid + config_.n_layer * NC;
    be.layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, xL,
                         view_or_null(layout_, params_, "lnf.weight"),
                         view_or_null(layout_, params_, "lnf.bias"), N, C, config_.norm_eps);
    const float* head = config_.tied_embeddings ? wte : view_or_null(layout_, params_, "lm_head.weight");
    be.matmul_forward(a.logits, a.lnf, head, nullptr, N, C, V);
}

LossSums Model::forward(const Batch& b) {
    reserve(b.B, b.T);
    check_batch(b);
    upload_batch(b);
    forward_impl(b);
    const int N = b.B * b.T;
    backend_->crossentropy_forward(acts_->losses, acts_->logits, acts_->targets.data(),
                                   acts_->loss_mask, N, config_.vocab_size);
    backend_->copy_to_host(losses_host_.data(), acts_->losses, N);
    LossSums s;
    for (int i = 0; i < N; ++i) {
        s.loss_sum += losses_host_[i];
        s.mask_sum += b.loss_mask[i];
    }
    return s;
}

void Model::set_attention_window(int window) {
    CTX_CHECK(window >= 0, "attention window must be >= 0 (0: full causal), got {}", window);
    attention_window_ = window;
}

std::vector<float> Model::logits(const Batch& b) const {
    CTX_CHECK(acts_ && b.B <= reserved_B_ && b.T <= reserved_T_,
              "logits: no forward pass of a {} x {} batch to read", b.B, b.T);
    std::vector<float> out(static_cast<size_t>(b.B) * b.T * config_.vocab_size);
    backend_->copy_to_host(out.data(), acts_->logits, out.size());
    return out;
}

LossSums Model::forward_backward(const Batch& b, float grad_scale) {
    reserve(b.B, b.T);
    check_batch(b);
    upload_batch(b);
    forward_impl(b);
    const int N = b.B * b.T;
    backend_->crossentropy_forward_backward(acts_->logits, acts_->losses, acts_->targets.data(),
                                            acts_->loss_mask, N, config_.vocab_size, grad_scale);
    backend_->copy_to_host(losses_host_.data(), acts_->losses, N);
    LossSums s;
    for (int i = 0; i < N; ++i) {
        s.loss_sum += losses_host_[i];
        s.mask_sum += b.loss_mask[i];
    }
    backward_impl(b);
    return s;
}

void Model::backward_impl(const Batch& b) {
    Backend& be = *backend_;
    Acts& a = *acts_;
    const int B = b.B, T = b.T, C = config_.d_model, V = config_.vocab_size, F = config_.ffn();
    const int H = config_.n_head;
    const int N = B * T;
    const size_t NC = static_cast<size_t>(N) * C, NF = static_cast<size_t>(N) * F;

    // ---- head: logits = lnf @ head^T (a.logits now holds dlogits)
    float* dwte = grads_.at(layout_.view("wte"));
    float* dhead = config_.tied_embeddings ? dwte : view_or_null(layout_, grads_, "lm_head.weight");
    const float* head = config_.tied_embeddings ? params_.at(layout_.view("wte"))
                                                : view_or_null(layout_, params_, "lm_head.weight");
    be.zero(a.dln, NC);
    be.matmul_backward(a.dln, dhead, nullptr, a.logits, a.lnf, head, N, C, V);
    be.zero(a.dx, NC);
    const float* xL = a.resid + config_.n_layer * NC;
    be.layernorm_backward(a.dx, view_or_null(layout_, grads_, "lnf.weight"),
                          view_or_null(layout_, grads_, "lnf.bias"), a.dln, xL,
                          view_or_null(layout_, params_, "lnf.weight"), a.lnf_mean, a.lnf_rstd,
                          N, C);

    RotarySpec rot;
    if (pe_ && pe_->has(CTX_PE_HOOK_ROTARY)) rot = pe_->rotary_spec(T);
    AttentionOptions attn;
    attn.bias = bias_spec(T);
    attn.window = attention_window_;
    attn.mode = attention_mode_;
    if (bias_generic_) be.zero(a.dbias_table, static_cast<size_t>(B) * H * T * T);

    for (int l = config_.n_layer - 1; l >= 0; --l) {
        const Layer w = layer(l, params_);
        const Layer g = layer(l, grads_);
        const float* xin = a.resid + l * NC;
        const float* ln1 = a.ln1 + l * NC;
        const float* ln1_mean = a.ln1_mean + static_cast<size_t>(l) * N;
        const float* ln1_rstd = a.ln1_rstd + static_cast<size_t>(l) * N;
        const float* qkv = a.qkv + l * NC * 3;
        const float* atty = a.atty + l * NC;
        const float* att =
            a.att + static_cast<size_t>(l) * attention_saved_floats(attention_mode_, B, T, H);
        const float* res2 = a.res2 + l * NC;
        const float* ln2 = a.ln2 + l * NC;
        const float* ln2_mean = a.ln2_mean + static_cast<size_t>(l) * N;
        const float* ln2_rstd = a.ln2_rstd + static_cast<size_t>(l) * N;
        const float* fch = a.fch + l * NF;
        const float* fch_act = a.fch_act + l * NF;
        const float* mlp_in = config_.parallel_residual ? xin : res2;

        // dx holds d(loss)/d(x_out). MLP branch first: x_out = res2 + mlp(ln2(mlp_in)).
        be.zero(a.dfch_act, NF);
        be.matmul_backward(a.dfch_act, g.fc_proj_w, g.fc_proj_b, a.dx, fch_act, w.fc_proj_w, N,
                           F, C);
        be.zero(a.dfch, NF);
        be.activation_backward(a.dfch, fch, a.dfch_act, NF, config_.activation);
        float* dln2 = config_.parallel_residual ? a.dln2 : a.dln;
        be.zero(dln2, NC);
        be.matmul_backward(dln2, g.fc_w, g.fc_b, a.dfch, ln2, w.fc_w, N, C, F);
        if (!config_.parallel_residual) {
            // dx becomes d/d(res2): the residual path plus the MLP layernorm's input gradient.
            be.layernorm_backward(a.dx, g.ln2_w, g.ln2_b, dln2, mlp_in, w.ln2_w, ln2_mean,
                                  ln2_rstd, N, C);
        }
        // attention branch: res2 = x_in + proj(attention(rotary(qkv(ln1(x_in)))))
        be.zero(a.datty, NC);
        be.matmul_backward(a.datty, g.attn_proj_w, g.attn_proj_b, a.dx, atty, w.attn_proj_w, N,
                           C, C);
        be.zero(a.dqkv, NC * 3);
        be.attention_backward(a.dqkv, a.attn_scratch, a.datty, qkv, att, atty, a.positions, B, T, C,
                              H, attn);
        if (rot.rotary_dims > 0) be.rotary_backward(a.dqkv, a.positions, B, T, C, H, rot);
        be.zero(a.dln, NC);
        be.matmul_backward(a.dln, g.qkv_w, g.qkv_b, a.dqkv, ln1, w.qkv_w, N, C, 3 * C);
        if (config_.parallel_residual) {
            // Both branches read x_in: their layernorm gradients join the residual in dx.
            be.layernorm_backward(a.dx, g.ln2_w, g.ln2_b, dln2, mlp_in, w.ln2_w, ln2_mean,
                                  ln2_rstd, N, C);
        }
        be.layernorm_backward(a.dx, g.ln1_w, g.ln1_b, a.dln, xin, w.ln1_w, ln1_mean, ln1_rstd, N,
                              C);
        announce_grads(layer_offsets_[l], layer_offsets_[l + 1]);  // layer l is done
    }
    if (bias_generic_) generic_bias_backward(b);  // every layer has added into dbias_table

    // ---- embedding: dx is now d/d(x_0)
    const float* demb = a.dx;
    if (config_.embedding_layernorm) {
        be.zero(a.demb, NC);
        be.layernorm_backward(a.demb, view_or_null(layout_, grads_, "emb_ln.weight"),
                              view_or_null(layout_, grads_, "emb_ln.bias"), a.dx, a.encoded,
                              view_or_null(layout_, params_, "emb_ln.weight"), a.emb_ln_mean,
                              a.emb_ln_rstd, N, C);
        demb = a.demb;
    }
    float* dwpe = nullptr;
    int table_rows = 0;
    if (pe_ && pe_->has(CTX_PE_HOOK_INPUT) && input_spec_.kind == CTX_INPUT_TABLE) {
        const ParamView& v = layout_.views()[pe_view_index_[input_spec_.table_param]];
        dwpe = grads_.at(v);
        table_rows = static_cast<int>(v.shape[0]);
    }
    be.embedding_backward(dwte, dwpe, demb, a.tokens.data(), a.positions, N, C, V, table_rows);
    if (pe_ && pe_->has(CTX_PE_HOOK_INPUT) && input_spec_.kind == CTX_INPUT_GENERIC) {
        HostSpan param_span = pe_span(params_);
        HostSpan grad_span = pe_span(grads_);
        HostSpan demb_span(be, const_cast<float*>(demb), NC, true);  // (B, T, C), read only
        auto pt = pe_tensors(param_span.data());
        auto gt = pe_tensors(grad_span.data());
        pe_->input_backward(pt, gt, b.positions, N, demb_span.data());
        grad_span.commit();
    }
    // The embeddings (also the tied head), the final norm, the head and the PE parameters are
    // final only now; the layers were announced as the loop finished them.
    announce_grads(0, layer_offsets_.front());
    announce_grads(layer_offsets_.back(), layout_.total());
}

void Model::announce_grads(size_t begin, size_t end) {
    if (grad_ready_ && end > begin) grad_ready_(grads_.data() + begin, end - begin);
}

void Model::set_attention_choice(AttentionChoice choice) {
    const int C = config_.d_model, H = config_.n_head;
    AttentionMode mode = AttentionMode::Materialised;
    if (choice == AttentionChoice::Auto)
        mode = backend_->attention_mode_auto(config_.context_length, C, H);
    else if (choice == AttentionChoice::Flash)
        mode = AttentionMode::Flash;
    CTX_CHECK(backend_->attention_mode_supported(mode, C, H),
              "attention = \"{}\": the {} backend has no {} attention for head dim {}",
              attention_choice_name(choice), backend_->name(), attention_mode_name(mode), C / H);
    attention_choice_ = choice;
    if (mode != attention_mode_) {  // the saved buffer and the scratch change size
        attention_mode_ = mode;
        acts_.reset();
        reserved_B_ = reserved_T_ = 0;
    }
}

AttentionChoice attention_choice_from_name(const std::string& name) {
    if (name == "auto") return AttentionChoice::Auto;
    if (name == "materialised" || name == "materialized") return AttentionChoice::Materialised;
    if (name == "flash") return AttentionChoice::Flash;
    fail("unknown attention '{}' (expected auto, flash or materialised)", name);
}

const char* attention_choice_name(AttentionChoice c) {
    switch (c) {
        case AttentionChoice::Materialised: return "materialised";
        case AttentionChoice::Flash: return "flash";
        default: return "auto";
    }
}

void Model::after_update() {
    if (!pe_ || pe_view_index_.empty()) return;
    HostSpan span = pe_span(params_);
    auto t = pe_tensors(span.data());
    pe_->after_update(t);
    span.commit();
}

void Model::extend(int new_len, Arena* adam_m, Arena* adam_v) {
    CTX_CHECK(new_len > 0, "extend: the new context length must be positive, got {}", new_len);
    const int old_len = config_.context_length;
    if (!pe_) {  // NoPE: nothing positional to change
        config_.context_length = new_len;
        return;
    }
    const ArenaLayout old_layout = layout_;
    HostSpan old_span = pe_span(params_);
    const std::vector<ctx_tensor> old_pe = pe_tensors(old_span.data());
    pe_->extend(old_len, new_len);
    config_.context_length = new_len;
    build_layout();

    // New arenas; copy every parameter (and moment) whose shape is unchanged.
    Arena new_params(*backend_, layout_.total());
    Arena new_m, new_v;
    if (adam_m) new_m = Arena(*backend_, layout_.total());
    if (adam_v) new_v = Arena(*backend_, layout_.total());
    for (const ParamView& nv : layout_.views()) {
        const ParamView* ov = old_layout.find(nv.name);
        if (!ov || ov->shape != nv.shape) continue;
        backend_->copy(new_params.at(nv), params_.at(*ov), nv.numel);
        if (adam_m) backend_->copy(new_m.at(nv), adam_m->at(*ov), nv.numel);
        if (adam_v) backend_->copy(new_v.at(nv), adam_v->at(*ov), nv.numel);
    }
    // pe_begin() and pe_tensors() now follow the new layout.
    HostSpan new_span = pe_span(new_params);
    std::vector<ctx_tensor> new_pe = pe_tensors(new_span.data());
    pe_->extend_params(old_pe, new_pe);
    new_span.commit();
    params_ = std::move(new_params);
    grads_ = Arena(*backend_, layout_.total());
    if (adam_m) *adam_m = std::move(new_m);
    if (adam_v) *adam_v = std::move(new_v);
    if (pe_->has(CTX_PE_HOOK_INPUT)) input_spec_ = pe_->input_spec();
    const bool generic = pe_bias_is_generic();
    if (generic != bias_generic_) {  // activation buffers are sized for the bias kind
        bias_generic_ = generic;
        acts_.reset();
        reserved_B_ = reserved_T_ = 0;
    }
}

double Model::flops_per_token(int T) const {
    // llm.c's convention: 6 flops per parameter per token (forward + backward) plus attention's
    // 6 * L * C * T (QK^T and AV, forward and backward, causal mask not discounted).
    return 6.0 * static_cast<double>(num_params()) +
           6.0 * config_.n_layer * config_.d_model * static_cast<double>(T);
}

}  // namespace ctx
