#include "model/decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "core/error.h"
#include "model/decoder_acts.h"
#include "model/host_span.h"

namespace ctx {

namespace {
TensorShard validated_shard(const ModelConfig& c, Comm* tp) {
    c.validate();
    return tensor_shard(c, tp ? tp->rank() : 0, tp ? tp->size() : 1);
}
}  // namespace

Model::Model(const ModelConfig& config, Backend& backend, std::unique_ptr<PePlugin> pe,
             uint64_t seed, Comm* tp_comm)
    : config_(config),
      backend_(&backend),
      pe_(std::move(pe)),
      shard_(validated_shard(config, tp_comm)),
      tp_(tp_comm, backend),
      block_(config_, shard_, tp_, backend),
      attention_(backend, shard_.A, shard_.H) {
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

void Model::replace_pe(std::unique_ptr<PePlugin> pe) {
    auto has_params = [](const PePlugin* p) { return p && !p->params().empty(); };
    CTX_CHECK(!has_params(pe_.get()), "replace_pe: {} has trainable parameters; only a PE "
              "without parameters can be swapped", pe_->name());
    CTX_CHECK(!has_params(pe.get()), "replace_pe: {} has trainable parameters; a model can only "
              "take a PE without parameters after it is built", pe->name());
    pe_ = std::move(pe);
    input_spec_ = pe_ && pe_->has(CTX_PE_HOOK_INPUT) ? pe_->input_spec() : decltype(input_spec_){};
    bias_generic_ = pe_bias_is_generic();
    set_attention_choice(attention_choice_);
}

void Model::set_activation(Activation act) {
    CTX_CHECK(!config_.gated_mlp() && act != Activation::SwiGLU, "set_activation: {} -> {}: only "
              "the elementwise activations (gelu_tanh, gelu_erf, relu) can be swapped; SwiGLU "
              "has another MLP shape", activation_name(config_.activation), activation_name(act));
    config_.activation = act;  // the block reads the config by reference
}

static float* view_or_null(const ArenaLayout& layout, const Arena& a, const std::string& name) {
    const ParamView* v = layout.find(name);
    return v ? a.at(*v) : nullptr;
}

BlockWeights Model::layer(int l, const Arena& a) const {
    const std::string p = fmt::format("layers.{}.", l);
    auto get = [&](const char* n) { return view_or_null(layout_, a, p + n); };
    return BlockWeights{get("ln1.weight"),      get("ln1.bias"),       get("attn.qkv.weight"),
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
    // GPT-2 initialisation of the whole model on the host, then this rank's part to the device.
    Rng rng(seed);
    std::vector<float> host(full_layout_.total(), 0.0f);
    const double std_ = config_.init_std;
    const double resid_std = std_ / std::sqrt(2.0 * config_.n_layer);
    for (const ParamView& v : full_layout_.views()) {
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
            const ParamView& v = full_layout_.views()[idx];
            ctx_tensor x{};
            x.data = host.data() + v.offset;
            x.ndim = static_cast<int32_t>(v.shape.size());
            for (int i = 0; i < 4; ++i) x.shape[i] = i < x.ndim ? v.shape[i] : 1;
            t.push_back(x);
        }
        Rng pe_rng(seed ^ 0x5045'5045'5045'5045ull);  // "PEPE": its own stream
        pe_->init_params(t, pe_rng);
    }
    scatter_full(host.data(), params_);
}

void Model::reserve(int B, int T_whole) {
    if (acts_ && B <= reserved_B_ && T_whole <= reserved_T_) return;
    B = std::max(B, reserved_B_);
    T_whole = std::max(T_whole, reserved_T_);
    // context parallelism: this rank's share of each row
    const int cp = cp_ ? cp_->size() : 1, T = (T_whole + cp - 1) / cp;
    // this rank's widths (tensor parallelism: its heads, hidden units and vocabulary rows)
    const size_t C = config_.d_model, V = shard_.V, F = shard_.F, A = shard_.A;
    const size_t F2 = shard_.F2, Q = config_.grouped_kv() ? shard_.Q : 0;
    const size_t L = config_.n_layer, H = shard_.H, W = shard_.size;
    const size_t N = static_cast<size_t>(B) * T;
    const size_t scratch = backend_->attention_scratch_floats(B, T, shard_.A, shard_.H,
                                                              attention_mode_);
    // Ring attention (context parallelism) saves lse and reads qkv in its backward.
    const size_t saved =
        cp_ ? attention_saved_floats(attention_mode_, B, T, shard_.H)
            : backend_->attention_saved_floats(attention_mode_, B, T, shard_.A, shard_.H);
    const bool qkv_layers = cp_ || backend_->attention_backward_reads_qkv(attention_mode_);
    // The generic bias costs 2 (B, H, T, T) tables (value and gradient; the saved attention
    // probabilities are L of them) plus 3 packed pair arrays on the host.
    const size_t table = bias_generic_ ? static_cast<size_t>(B) * H * T * T : 0;
    const size_t xent = W > 1 ? N * 3 : 0;  // vocabulary-parallel loss statistics
    // The head's logits: a chunk of rows at a time (Backend::lm_head_loss), or this rank's
    // vocabulary columns of every row under tensor parallelism (the loss needs them all).
    const size_t logits = W > 1 ? N * V : backend_->lm_head_scratch_floats(static_cast<int>(N),
                                                                            static_cast<int>(V));
    // Sequence parallelism keeps the residual stream's rows of this rank only.
    const bool sp = tp_.sequence_parallel();
    const size_t Nr = sp ? (N + W - 1) / W : N;
    auto acts = std::make_unique<Acts>();
    acts->bf16 = backend_->bf16_activations() && !tp_.active();
    acts->saved_floats = saved;
    acts->qkv_layers = qkv_layers;
    acts->atty_bf16 = acts->bf16 && !cp_ && backend_->attention_out_bf16(attention_mode_);
    const size_t Lq = qkv_layers ? L : 1;  // layers of qkv kept
    // ln1, ln2, fch, fch_act, lnf
    auto op = [&](size_t n) { return operand_floats(n, acts->bf16); };
    // Sizes in the order of the struct; each rounded to 16 floats.
    const std::vector<size_t> sizes = {
        N * C, N * C, N, N,                                    // encoded, emb_ln, mean, rstd
        op(L * N * C), L * Nr, L * Nr, Lq * N * 3 * A, N * Q,  // ln1, m, r, qkv, grouped
        operand_floats(L * N * A, acts->atty_bf16), L * saved, L * Nr * C,  // atty, att, res2
        op(L * N * C), L * Nr, L * Nr, op(L * N * F2), op(L * N * F),       // ln2, m, r, fch, act
        (L + 1) * Nr * C, op(N * C), N, N, logits, N, N * C,  // resid, lnf, m, r, logits,
                                                              // losses, tmp
        N * C, N * C, N * C, N * A, N * 3 * A, N * F2, N * F, N * C, scratch,  // grads, scratch
        table, table, xent, xent * W,     // bias_table, dbias_table, xent_stats, xent_stats_all
        sp ? N * C : 0, sp ? 2 * C : 0};  // dx_full, norm_scratch (sequence parallel)
    size_t total = 0;
    for (size_t s : sizes) total += (s + 15) / 16 * 16;
    acts->buffer = Arena(*backend_, total);
    float** slots[] = {&acts->encoded, &acts->emb_ln, &acts->emb_ln_mean, &acts->emb_ln_rstd,
                       &acts->ln1, &acts->ln1_mean, &acts->ln1_rstd, &acts->qkv,
                       &acts->qkv_grouped, &acts->atty,
                       &acts->att, &acts->res2, &acts->ln2, &acts->ln2_mean, &acts->ln2_rstd,
                       &acts->fch, &acts->fch_act, &acts->resid, &acts->lnf, &acts->lnf_mean,
                       &acts->lnf_rstd, &acts->logits, &acts->losses, &acts->tmp, &acts->dx,
                       &acts->dln, &acts->dln2, &acts->datty, &acts->dqkv, &acts->dfch,
                       &acts->dfch_act, &acts->demb, &acts->attn_scratch, &acts->bias_table,
                       &acts->dbias_table, &acts->xent_stats, &acts->xent_stats_all,
                       &acts->dx_full, &acts->norm_scratch};
    static_assert(sizeof(slots) / sizeof(slots[0]) == 39);
    CTX_CHECK(sizes.size() == 39, "internal: activation slot count mismatch");
    size_t off = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
        *slots[i] = acts->buffer.data() + off;
        off += (sizes[i] + 15) / 16 * 16;
    }
    if (!bias_generic_) acts->bias_table = acts->dbias_table = nullptr;
    if (Q == 0) acts->qkv_grouped = nullptr;
    if (xent == 0) acts->xent_stats = acts->xent_stats_all = nullptr;
    if (!sp) acts->dx_full = acts->norm_scratch = nullptr;
    bias_pairs_.reserve(bias_generic_ ? N * (static_cast<size_t>(T) + 1) / 2 : 0);
    bias_stage_.resize(bias_generic_ && backend_->kind() != DeviceKind::CPU ? table : 0);
    bias_all_heads_.resize(bias_generic_ && tp_.active() ? table * W : 0);
    losses_host_.assign(N, 0.0f);
    acts_ = std::move(acts);
    reserved_B_ = B;
    reserved_T_ = T_whole;
}

int64_t Model::input_table_rows() const {
    if (pe_ && pe_->has(CTX_PE_HOOK_INPUT) && input_spec_.kind == CTX_INPUT_TABLE)
        return pe_->params()[input_spec_.table_param].shape[0];
    return -1;
}

void Model::check_row(const int32_t* tokens, const int32_t* targets, const float* positions,
                      int n, int row, int first_col) const {
    const int V = config_.vocab_size;
    const int64_t table_rows = input_table_rows();
    for (int t = 0; t < n; ++t) {
        const int col = first_col + t;
        CTX_CHECK(tokens[t] >= 0 && tokens[t] < V, "token {} at row {} col {} is outside the "
                  "vocabulary [0, {})", tokens[t], row, col, V);
        CTX_CHECK(!targets || (targets[t] >= 0 && targets[t] < V), "target {} at row {} col {} "
                  "is outside the vocabulary [0, {})", targets ? targets[t] : 0, row, col, V);
        const float p = positions[t];
        CTX_CHECK(std::isfinite(p) && p >= 0.0f, "position {} at row {} col {} must be finite "
                  "and >= 0", p, row, col);
        CTX_CHECK(table_rows < 0 || p <= static_cast<float>(table_rows - 1),
                  "position {} exceeds the learned position table of {} rows ({}); extend the "
                  "model (model:extend(L)) before using longer positions", p, table_rows,
                  pe_->name());
    }
}

void Model::check_batch(const Batch& b) const {
    CTX_CHECK(b.B > 0 && b.T > 0, "batch must have positive size, got B={} T={}", b.B, b.T);
    for (int r = 0; r < b.B; ++r) {
        const size_t off = static_cast<size_t>(r) * b.T;
        check_row(b.tokens + off, b.targets + off, b.positions + off, b.T, r, 0);
        if (!b.doc_start) continue;
        // packed rows: documents contiguous, each token's start at or before it
        const int32_t* ds = b.doc_start + off;
        for (int t = 0; t < b.T; ++t)
            CTX_CHECK(ds[t] >= 0 && ds[t] <= t && (t == 0 || ds[t] >= ds[t - 1]) &&
                          (ds[t] == t || ds[t] == ds[t - 1]),
                      "doc_start {} at row {} col {}: documents must be contiguous runs (the "
                      "first token of a document starts at itself, the others at their "
                      "document's first token)", ds[t], r, t);
    }
}

// After check_batch: one upload per pass, read where it lies by every op of the pass.
void Model::stage_batch(const Batch& b) {
    acts_->batch = backend_->stage_batch(
        BatchInputs{b.tokens, b.targets, b.positions, b.loss_mask, b.doc_start, b.B * b.T});
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
    // Tensor parallelism: the parameters of this rank's heads (per head: a row of T5's
    // (H, buckets) table, one value of the others); the other heads' gradients stay zero here
    // and the PE gradients are summed over the group after the backward pass.
    const size_t first = static_cast<size_t>(shard_.head0) *
                         (s.kind == BiasKind::T5 ? static_cast<size_t>(s.num_buckets) : 1);
    auto at = [first](auto* p) { return p ? p + first : p; };
    s.a = at(s.a);
    s.da = at(s.da);
    s.b = at(s.b);
    s.db = at(s.db);
    return s;
}

void Model::fill_bias_table(GenericBiasPairs& pairs, float* table, int rows, int Tq, int S) {
    const size_t n = static_cast<size_t>(rows) * shard_.H * Tq * S;  // this rank's heads
    const bool direct = backend_->kind() == DeviceKind::CPU;  // host memory: write in place
    if (!direct && bias_stage_.size() < n) bias_stage_.resize(n);
    float* host = direct ? table : bias_stage_.data();  // (rows, H, Tq, S)
    HostSpan param_span = pe_span(params_);
    if (!tp_.active()) {
        pairs.forward(*pe_, pe_tensors(param_span.data()), config_.n_head, S, host);
    } else {  // the plugin fills every head; keep this rank's
        const size_t head = static_cast<size_t>(Tq) * S;
        bias_all_heads_.resize(n * shard_.size);
        pairs.forward(*pe_, pe_tensors(param_span.data()), config_.n_head, S,
                      bias_all_heads_.data());
        for (int r = 0; r < rows; ++r)
            std::memcpy(host + static_cast<size_t>(r) * shard_.H * head,
                        bias_all_heads_.data() +
                            (static_cast<size_t>(r) * config_.n_head + shard_.head0) * head,
                        shard_.H * head * sizeof(float));
    }
    if (!direct) backend_->copy_to_device(table, host, n);
}

RotarySpec Model::rotary_spec(int T) {
    if (pe_ && pe_->has(CTX_PE_HOOK_ROTARY)) return pe_->rotary_spec(T);
    return RotarySpec{};
}

void Model::embed(float* x, float* encoded, float* mean, float* rstd, const int32_t* tokens,
                  const float* positions, const float* positions_host, int N) {
    Backend& be = *backend_;
    const int C = config_.d_model;
    // Tensor parallelism: each rank embeds its vocabulary rows (zeros for the others' tokens)
    // and rank 0 adds the input PE; the sum over the group is the embedding.
    const bool adds_pe = shard_.rank == 0;
    const float* wpe = nullptr;
    int table_rows = 0;
    if (adds_pe && pe_ && pe_->has(CTX_PE_HOOK_INPUT) && input_spec_.kind == CTX_INPUT_TABLE) {
        const ParamView& v = layout_.views()[pe_view_index_[input_spec_.table_param]];
        wpe = params_.at(v);
        table_rows = static_cast<int>(v.shape[0]);
    }
    const float* wte = params_.at(layout_.view("wte"));
    be.embedding_forward(encoded, tokens, positions, wte, wpe, N, C, shard_.V, table_rows,
                         shard_.vocab());
    if (adds_pe && pe_ && pe_->has(CTX_PE_HOOK_INPUT) && input_spec_.kind == CTX_INPUT_GENERIC) {
        HostSpan params = pe_span(params_);
        HostSpan enc(be, encoded, static_cast<size_t>(N) * C, true);  // (N, C)
        pe_->input_forward(pe_tensors(params.data()), positions_host, N, enc.data());
        enc.commit();
    }
    // summed over the group: all-reduce, or (sequence parallel) reduce-scatter so that
    // encoded[0, Nr C) holds this rank's rows
    const int Nr = tp_.rows_here(N);
    tp_.sum_rows(encoded, static_cast<size_t>(Nr) * C);
    if (config_.embedding_layernorm) {
        be.layernorm_forward(x, mean, rstd, encoded, view_or_null(layout_, params_, "emb_ln.weight"),
                             view_or_null(layout_, params_, "emb_ln.bias"), Nr, C,
                             config_.norm_eps);
    } else {
        be.copy(x, encoded, static_cast<size_t>(Nr) * C);
    }
}

void Model::head(float* logits, Operand ln, float* mean, float* rstd, const float* x, int N) {
    head_norm(ln, mean, rstd, x, N);
    // vocabulary-parallel: this rank's (N, V / tp) columns of the logits
    matmul_forward(*backend_, logits, ln, head_weight(), nullptr, N, config_.d_model, shard_.V);
}

void Model::head_norm(Operand ln, float* mean, float* rstd, const float* x, int N) {
    const int C = config_.d_model, Nr = tp_.rows_here(N);
    // x: this rank's rows under sequence parallelism; the head needs every row's norm
    norm_forward(*backend_, config_, ln.at(tp_.row_offset(N) * C), mean, rstd, x,
                 view_or_null(layout_, params_, "lnf.weight"),
                 view_or_null(layout_, params_, "lnf.bias"), Nr);
    if (tp_.sequence_parallel())
        tp_.gather_rows(ln.fp32("sequence parallelism"), static_cast<size_t>(Nr) * C);
}

const float* Model::head_weight() const {
    return config_.tied_embeddings ? params_.at(layout_.view("wte"))
                                   : view_or_null(layout_, params_, "lm_head.weight");
}

BlockActs Model::layer_acts(int l, int B, int T) const {
    const Acts& a = *acts_;
    const size_t N = static_cast<size_t>(B) * T, C = config_.d_model, F = shard_.F;
    const size_t NC = N * C, NA = N * shard_.A, NF = N * F, NF2 = N * shard_.F2;
    const size_t Nr = tp_.rows_here(static_cast<int>(N)), NrC = Nr * C;  // sequence parallel
    const size_t L = static_cast<size_t>(l);
    return BlockActs{a.operand(a.ln1, L * NC),
                     a.ln1_mean + L * Nr,
                     a.ln1_rstd + L * Nr,
                     a.qkv + (a.qkv_layers ? L * NA * 3 : 0),
                     a.atty_bf16 ? Operand::in_bf16(reinterpret_cast<Bf16*>(a.atty) + L * NA)
                                 : Operand(a.atty + L * NA),
                     a.att + L * a.saved_floats,
                     a.res2 + L * NrC,
                     a.operand(a.ln2, L * NC),
                     a.ln2_mean + L * Nr,
                     a.ln2_rstd + L * Nr,
                     a.operand(a.fch, L * NF2),
                     a.operand(a.fch_act, L * NF),
                     a.qkv_grouped};
}

void Model::forward_impl(const Batch& b) {
    Acts& a = *acts_;
    const int B = b.B, T = b.T, N = B * T;
    // the residual stream's rows on this rank (all N unless sequence parallel)
    const size_t NC = static_cast<size_t>(tp_.rows_here(N)) * config_.d_model;

    // ---- embedding + input PE -> the residual stream entering layer 0
    embed(a.resid, a.encoded, a.emb_ln_mean, a.emb_ln_rstd, a.batch.tokens, a.batch.positions,
          b.positions, N);

    // ---- the attention step of this pass (its specs serve the backward pass too); under
    // context parallelism the rotation and bias are those of the whole rows' length
    const int row_len = cp_ ? cp_whole_->T : T;
    const RotarySpec rot = rotary_spec(row_len);
    AttentionOptions attn;
    attn.bias = bias_spec(row_len);
    attn.window = config_.window_with(attention_window_);
    attn.doc_start = a.batch.doc_start;
    attn.mode = attention_mode_;
    if (cp_) {  // the ring reads the whole batch's positions and documents
        const Batch& w = *cp_whole_;
        ring_->begin(B, w.T, w.positions, w.doc_start, a.batch.positions, rot, attn);
    } else {
        attention_.begin(B, T, a.batch.positions, rot, attn, a.attn_scratch);
    }
    if (bias_generic_ && !cp_) {  // one table for every layer
        bias_pairs_.pack(B, T, b.positions, static_cast<size_t>(T), nullptr, b.doc_start);
        fill_bias_table(bias_pairs_, a.bias_table, B, T, T);
    }

    for (int l = 0; l < config_.n_layer; ++l)
        block_.forward(layer(l, params_), a.resid + l * NC, a.resid + (l + 1) * NC,
                       layer_acts(l, B, T), a.tmp, N, l, attention_step());

    const float* xL = a.resid + config_.n_layer * NC;
    if (tp_.active())  // the loss needs every row's logits (this rank's vocabulary columns)
        head(a.logits, a.operand(a.lnf), a.lnf_mean, a.lnf_rstd, xL, N);
    else  // the head's product is fused with the loss (cross_entropy)
        head_norm(a.operand(a.lnf), a.lnf_mean, a.lnf_rstd, xL, N);
}

// One pass over a batch: forward and the loss, then (train) the backward pass.
AttentionStep& Model::attention_step() {
    if (cp_) return *ring_;
    return attention_;
}

LossSums Model::run_pass(const Batch& b, bool train, float grad_scale) {
    if (cp_) return run_pass_cp(b, train, grad_scale);
    CTX_CHECK(!tp_.sequence_parallel() || (b.B * b.T) % tp_.size() == 0,
              "sequence parallelism: a batch of {} x {} = {} tokens is not divisible by tp = {} "
              "(each rank keeps an equal share of the rows)", b.B, b.T, b.B * b.T, tp_.size());
    reserve(b.B, b.T);
    check_batch(b);
    stage_batch(b);
    forward_impl(b);
    const int N = b.B * b.T;
    cross_entropy(train, N, grad_scale);
    // the losses come back after the backward pass: a device backend's copy waits for its
    // stream, and waiting here would stall the queue between the forward and backward kernels
    if (train) backward_impl(b);
    backend_->copy_to_host(losses_host_.data(), acts_->losses, N);
    LossSums s;
    for (int i = 0; i < N; ++i) {
        s.loss_sum += losses_host_[i];
        s.mask_sum += b.loss_mask[i];
    }
    return s;
}

// Losses of the last forward's logits and (train) their gradient in place. Vocabulary-parallel
// (Megatron): every rank's per-row max, normaliser and target logit are gathered, so no rank
// holds the whole (N, V) logits.
void Model::cross_entropy(bool train, int N, float grad_scale) {
    Acts& a = *acts_;
    if (!tp_.active()) {  // the head and its loss in chunks of rows; training: dln, dhead too
        const int C = config_.d_model;
        float* dhead = nullptr;
        if (train) {
            dhead = config_.tied_embeddings ? grads_.at(layout_.view("wte"))
                                            : view_or_null(layout_, grads_, "lm_head.weight");
            backend_->zero(a.dln, static_cast<size_t>(N) * C);
        }
        lm_head_loss(*backend_, a.losses, train ? a.dln : nullptr, dhead, a.logits,
                     a.operand(a.lnf), head_weight(), a.batch.targets, a.batch.mask, N, C,
                     config_.vocab_size, grad_scale);
        return;
    }
    backend_->crossentropy_shard_stats(a.xent_stats, a.logits, a.batch.targets, N, shard_.V,
                                       shard_.vocab());
    tp_.allgather(a.xent_stats, static_cast<size_t>(N) * 3, a.xent_stats_all);
    backend_->crossentropy_shard_finish(a.losses, train ? a.logits : nullptr, a.xent_stats_all,
                                        shard_.size, a.batch.targets, a.batch.mask, N, shard_.V,
                                        shard_.vocab(), grad_scale);
}

LossSums Model::forward(const Batch& b) { return run_pass(b, false, 0.0f); }

LossSums Model::forward_backward(const Batch& b, float grad_scale) {
    return run_pass(b, true, grad_scale);
}

void Model::set_attention_window(int window) {
    CTX_CHECK(window >= 0, "attention window must be >= 0 (0: full causal), got {}", window);
    attention_window_ = window;
}

std::vector<float> Model::logits(const Batch& b) const {
    const int cp = cp_ ? cp_->size() : 1;
    // context parallelism on rows padded to 2 cp chunks (run_pass_cp_padded): the padded rows
    const int Tw = cp > 1 && cp_padded_T_ > b.T ? cp_padded_T_ : b.T;
    const int T = Tw / cp;  // this rank's tokens of each row
    CTX_CHECK(acts_ && b.B <= reserved_B_ && T <= reserved_T_ && Tw % cp == 0,
              "logits: no forward pass of a {} x {} batch to read", b.B, b.T);
    const size_t N = static_cast<size_t>(b.B) * T, V = config_.vocab_size;
    std::vector<float> out(N * V);
    if (!tp_.active()) {
        logit_chunks(N, out.data());
    } else {  // this rank's vocabulary columns (a pass's backward leaves dlogits there)
        matmul_forward(*backend_, acts_->logits, acts_->operand(acts_->lnf), head_weight(),
                       nullptr, static_cast<int>(N), config_.d_model, shard_.V);
        gather_vocab_columns(acts_->logits, N, out.data());
    }
    if (cp == 1) return out;
    // context parallelism: every rank's tokens of each row into place
    std::vector<float> all(out.size() * cp), whole(static_cast<size_t>(b.B) * b.T * V);
    cp_->allgather(out.data(), out.size() * sizeof(float), all.data());
    for (int q = 0; q < cp; ++q) {
        const std::vector<int32_t> idx = zigzag_indices(Tw, cp, q);
        for (int r = 0; r < b.B; ++r)
            for (int i = 0; i < T; ++i)
                if (idx[i] < b.T)  // the padding is dropped
                    std::memcpy(whole.data() + (static_cast<size_t>(r) * b.T + idx[i]) * V,
                                all.data() + (q * N + static_cast<size_t>(r) * T + i) * V,
                                V * sizeof(float));
    }
    return whole;
}

// The last pass's logits of rows [r0, r0 + n) on the host, a chunk at a time: recomputed from
// the kept final norm into the head's scratch (not tensor-parallel), copied into dst (N, V) when
// given (then read from there), else into one chunk's host buffer.
void Model::logit_chunks(size_t N, float* dst,
                         const std::function<void(size_t, size_t, const float*)>& f) const {
    const size_t V = config_.vocab_size;
    const int R = backend_->lm_head_chunk_rows(static_cast<int>(N), static_cast<int>(V));
    std::vector<float> chunk;
    for (size_t r0 = 0; r0 < N; r0 += R) {
        const size_t n = std::min(N - r0, static_cast<size_t>(R));
        matmul_forward(*backend_, acts_->logits, acts_->operand(acts_->lnf, r0 * config_.d_model),
                       head_weight(), nullptr, static_cast<int>(n), config_.d_model,
                       static_cast<int>(V));
        if (dst == nullptr) chunk.resize(n * V);
        float* host = dst != nullptr ? dst + r0 * V : chunk.data();
        backend_->copy_to_host(host, acts_->logits, n * V);
        if (f) f(r0, n, host);
    }
}

std::vector<int32_t> Model::argmax(const Batch& b) const {
    const size_t N = static_cast<size_t>(b.B) * b.T, V = config_.vocab_size;
    std::vector<int32_t> best(N);
    auto pick = [&](size_t r0, size_t n, const float* lg) {
        for (size_t i = 0; i < n; ++i)
            best[r0 + i] = static_cast<int32_t>(std::max_element(lg + i * V, lg + (i + 1) * V) -
                                                (lg + i * V));  // the first maximum
    };
    if (tp_.active() || cp_) {  // every rank's columns or tokens first: the gathered logits
        const std::vector<float> all = logits(b);
        pick(0, N, all.data());
        return best;
    }
    CTX_CHECK(acts_ && b.B <= reserved_B_ && b.T <= reserved_T_,
              "argmax: no forward pass of a {} x {} batch to read", b.B, b.T);
    logit_chunks(N, nullptr, pick);
    return best;
}

void Model::backward_impl(const Batch& b) {
    Backend& be = *backend_;
    Acts& a = *acts_;
    const int B = b.B, T = b.T, C = config_.d_model, V = shard_.V;
    const int H = shard_.H;  // this rank's heads and vocabulary rows (tensor parallelism)
    const int N = B * T;
    const size_t NC = static_cast<size_t>(N) * C;

    // ---- head: logits = lnf @ head^T (a.logits now holds dlogits); vocabulary-parallel, so
    // each rank's dln is its vocabulary rows' share, summed over the group
    float* dwte = grads_.at(layout_.view("wte"));
    float* dhead = config_.tied_embeddings ? dwte : view_or_null(layout_, grads_, "lm_head.weight");
    const float* head = config_.tied_embeddings ? params_.at(layout_.view("wte"))
                                                : view_or_null(layout_, params_, "lm_head.weight");
    if (tp_.active()) {  // else lm_head_loss has written dln and added into dhead
        be.zero(a.dln, NC);
        matmul_backward(be, a.dln, dhead, nullptr, a.logits, a.operand(a.lnf), head, N, C, V);
    }
    // the residual stream: this rank's Nr rows under sequence parallelism, else all N
    const int Nr = tp_.rows_here(N);
    const size_t NrC = static_cast<size_t>(Nr) * C;
    tp_.sum_rows(a.dln, NrC);
    be.zero(a.dx, NrC);
    const float* xL = a.resid + config_.n_layer * NrC;
    norm_backward_rows(be, config_, tp_, a.norm_scratch, a.dx,
                       view_or_null(layout_, grads_, "lnf.weight"),
                       view_or_null(layout_, grads_, "lnf.bias"), a.dln, xL,
                       view_or_null(layout_, params_, "lnf.weight"), a.lnf_mean, a.lnf_rstd, Nr);

    const BlockGradBuffers d{a.dln,  a.dln2,        a.datty,   a.dqkv,        a.dfch,
                             a.dfch_act, a.qkv_grouped, a.dx_full, a.norm_scratch};
    if (bias_generic_ && !cp_) be.zero(a.dbias_table, static_cast<size_t>(B) * H * T * T);
    for (int l = config_.n_layer - 1; l >= 0; --l) {
        block_.backward(layer(l, params_), layer(l, grads_), a.resid + l * NrC, layer_acts(l, B, T),
                        a.dx, d, N, l, attention_step());  // the forward pass's step
        announce_grads(layer_offsets_[l], layer_offsets_[l + 1]);  // layer l is done
    }
    if (bias_generic_ && cp_) ring_->finish_backward();  // the blocks' tables, every layer's
    if (bias_generic_ && !cp_) {  // every layer has added into dbias_table
        const float* dtable = a.dbias_table;  // (B, H, T, T)
        if (be.kind() != DeviceKind::CPU) {
            be.copy_to_host(bias_stage_.data(), dtable, static_cast<size_t>(B) * H * T * T);
            dtable = bias_stage_.data();
        }
        if (tp_.active()) {  // this rank's heads into an every-head table, zero elsewhere
            const size_t head = static_cast<size_t>(T) * T, Hall = config_.n_head;
            std::fill(bias_all_heads_.begin(), bias_all_heads_.end(), 0.0f);
            for (int r = 0; r < B; ++r)
                std::memcpy(bias_all_heads_.data() + (r * Hall + shard_.head0) * head,
                            dtable + static_cast<size_t>(r) * H * head, H * head * sizeof(float));
            dtable = bias_all_heads_.data();
        }
        HostSpan param_span = pe_span(params_);
        HostSpan grad_span = pe_span(grads_);
        std::vector<ctx_tensor> grads = pe_tensors(grad_span.data());
        bias_pairs_.backward(*pe_, pe_tensors(param_span.data()), grads, config_.n_head, T,
                             dtable);
        grad_span.commit();
    }

    // ---- embedding: dx is now d/d(x_0)
    const float* demb = a.dx;
    if (config_.embedding_layernorm) {  // a layernorm in every style that has one (BLOOM)
        ModelConfig ln = config_;
        ln.norm = NormKind::LayerNorm;
        be.zero(a.demb, NrC);
        norm_backward_rows(be, ln, tp_, a.norm_scratch, a.demb,
                           view_or_null(layout_, grads_, "emb_ln.weight"),
                           view_or_null(layout_, grads_, "emb_ln.bias"), a.dx, a.encoded,
                           view_or_null(layout_, params_, "emb_ln.weight"), a.emb_ln_mean,
                           a.emb_ln_rstd, Nr);
        demb = a.demb;
    }
    demb = tp_.gather_rows_from(demb, a.dx_full, NrC);  // every row's, for the vocabulary rows
    // Tensor parallelism: rank 0 added the input PE, so it alone takes its gradient (summed
    // over the group below with the bias PEs' per-head shares).
    const bool adds_pe = shard_.rank == 0;
    float* dwpe = nullptr;
    int table_rows = 0;
    if (adds_pe && pe_ && pe_->has(CTX_PE_HOOK_INPUT) && input_spec_.kind == CTX_INPUT_TABLE) {
        const ParamView& v = layout_.views()[pe_view_index_[input_spec_.table_param]];
        dwpe = grads_.at(v);
        table_rows = static_cast<int>(v.shape[0]);
    }
    be.embedding_backward(dwte, dwpe, demb, a.batch.tokens, a.batch.positions, N, C, V,
                          table_rows, shard_.vocab());
    if (adds_pe && pe_ && pe_->has(CTX_PE_HOOK_INPUT) && input_spec_.kind == CTX_INPUT_GENERIC) {
        HostSpan param_span = pe_span(params_);
        HostSpan grad_span = pe_span(grads_);
        HostSpan demb_span(be, const_cast<float*>(demb), NC, true);  // (B, T, C), read only
        auto pt = pe_tensors(param_span.data());
        auto gt = pe_tensors(grad_span.data());
        pe_->input_backward(pt, gt, b.positions, N, demb_span.data());
        grad_span.commit();
    }
    if (tp_.active() && !pe_view_index_.empty())  // each rank's heads' (and rank 0's input) share
        tp_.allreduce_sum(grads_.data() + pe_begin(), layout_.total() - pe_begin());
    // The embeddings (also the tied head), the final norm, the head and the PE parameters are
    // final only now; the layers were announced as the loop finished them.
    announce_grads(0, layer_offsets_.front());
    announce_grads(layer_offsets_.back(), layout_.total());
}

void Model::announce_grads(size_t begin, size_t end) {
    if (grad_ready_ && end > begin) grad_ready_(grads_.data() + begin, end - begin);
}

void Model::set_attention_choice(AttentionChoice choice) {
    const int C = shard_.A, H = shard_.H;  // this rank's heads (same head dim)
    AttentionMode mode = AttentionMode::Materialised;
    if (choice == AttentionChoice::Auto)
        mode = backend_->attention_mode_auto(config_.context_length, C, H);
    else if (choice == AttentionChoice::Flash)
        mode = AttentionMode::Flash;
    if (cp_) mode = AttentionMode::Flash;  // the ring keeps the (B, H, T / cp) lse per layer
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
    // Without a hook there is nothing to do: no copy of the PE's parameters to the host and back
    // (on a GPU a wait and two transfers a step).
    if (!pe_ || pe_view_index_.empty() || !pe_->has_after_update()) return;
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
