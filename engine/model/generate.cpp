#include "model/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "model/sparsity.h"

namespace ctx {

struct KvGenerator::Buffers {
    KvCache cache;                       // per layer (rows, S, C) keys, values; (rows, S) positions
    std::vector<float> kpos_host;        // (rows, S) the cache positions on the host
    // step activations for up to N = max(S, rows) new tokens
    Arena acts;
    float *encoded, *x, *x_next, *ln, *ln1, *mean, *rstd, *qkv, *atty, *tmp, *res2, *fch,
        *fch_act;
    float* qkv_grouped;  // (N, Q) grouped-query only, else null
    float *last, *lnf, *logits, *attn_scratch;
    std::vector<int32_t> tokens;         // (N) host
    std::vector<float> logits_host;      // (rows, V)
    std::vector<std::vector<float>> rot_sig;  // per row: the rotation its newest keys carry
    std::vector<std::vector<int32_t>> history;  // per row: every token (to recompute a row)
    Arena table;                         // generic bias: (rows, H, Tq, S)
    GenericBiasPairs pairs;
    bool dynamic_rotary = false;  // the rotation depends on the row length (dynamic NTK)
    CachedAttention attention;

    // Tensor parallelism: the cache holds this rank's heads (sh.A wide).
    Buffers(Backend& be, const ModelConfig& c, const TensorShard& sh, int rows, int S)
        : cache(be, c.n_layer, rows, S, sh.A),
          attention(be, sh.A, sh.H, cache) {}
};

// Contextual sparsity state: the options, the keep counts, per layer the output projections
// transposed (a selected unit's or head's weights as contiguous rows), and decode-step buffers
// for up to `rows` tokens.
struct KvGenerator::Sparse {
    SparsityOptions opt;
    int units_k = 0, heads_k = 0;  // 0: that kind runs dense
    float units_threshold = 0.0f;
    std::vector<Arena> fc_proj_t, attn_proj_t;  // per layer (F, C), (A, C)
    Arena work;
    float *u = nullptr, *scores = nullptr, *kv = nullptr;
    int32_t *units = nullptr, *heads = nullptr;  // (rows, units_k), (rows, heads_k)
    int layer = -1;  // the layer the lists were predicted for
};

namespace {

// The transpose of a (rows, cols) device matrix, through the host (once, at setup).
Arena transposed(Backend& be, const float* w, size_t rows, size_t cols) {
    std::vector<float> h(rows * cols), t(rows * cols);
    be.copy_to_host(h.data(), w, h.size());
    for (size_t r = 0; r < rows; ++r)
        for (size_t c = 0; c < cols; ++c) t[c * rows + r] = h[r * cols + c];
    Arena out(be, t.size());
    be.copy_to_device(out.data(), t.data(), t.size());
    return out;
}

}  // namespace

void KvGenerator::set_sparsity(const SparsityOptions& o) {
    if (o.predictors == nullptr) {
        sparse_.reset();
        return;
    }
    const ModelConfig& c = m_.config();
    const ModelConfig& pc = o.predictors->config();
    CTX_CHECK(pc.n_layer == c.n_layer && pc.d_model == c.d_model && pc.n_head == c.n_head &&
                  pc.ffn() == c.ffn(),
              "sparsity: the predictors were made for another model ({} layers, d_model {}, {} "
              "heads, {} hidden units; this model has {}, {}, {}, {})", pc.n_layer, pc.d_model,
              pc.n_head, pc.ffn(), c.n_layer, c.d_model, c.n_head, c.ffn());
    CTX_CHECK(o.units >= 0.0f && o.units < 1.0f && o.heads >= 0.0f && o.heads < 1.0f,
              "sparsity: units and heads are the fractions skipped, in [0, 1); got {} and {}",
              o.units, o.heads);
    CTX_CHECK(!m_.tensor_parallel(), "sparsity: decoding with contextual sparsity under tensor "
              "parallelism is not supported (each rank would need its share of the selection)");
    CTX_CHECK(&o.predictors->backend() == &m_.backend(), "sparsity: the predictors live on "
              "another backend than the model");
    auto sp = std::make_unique<Sparse>();
    sp->opt = o;
    const int F = c.ffn(), H = c.n_head, C = c.d_model, A = C, R = rows_;
    const bool units = o.units > 0.0f || o.units_positive;
    sp->units_k = units ? keep_count(1.0f - o.units, F) : 0;
    sp->units_threshold = o.units_positive ? 0.0f : -std::numeric_limits<float>::infinity();
    sp->heads_k = o.heads > 0.0f ? keep_count(1.0f - o.heads, H) : 0;
    Backend& be = m_.backend();
    for (int l = 0; l < c.n_layer; ++l) {
        const BlockWeights w = m_.layer_weights(l);
        if (sp->units_k) sp->fc_proj_t.push_back(transposed(be, w.fc_proj_w, C, F));
        if (sp->heads_k) sp->attn_proj_t.push_back(transposed(be, w.attn_proj_w, C, A));
    }
    const PredictorShape& ps = o.predictors->shape();
    const size_t rmax = std::max(ps.unit_rank, ps.head_rank);
    const size_t KV = static_cast<size_t>(m_.shard().Q - A);
    const std::vector<size_t> sizes = {R * rmax, R * static_cast<size_t>(std::max(F, H)), R * KV,
                                       static_cast<size_t>(R) * sp->units_k,
                                       static_cast<size_t>(R) * sp->heads_k};
    size_t total = 0;
    for (size_t n : sizes) total += (n + 15) / 16 * 16;
    sp->work = Arena(be, total);
    float* p = sp->work.data();
    float** slots[] = {&sp->u, &sp->scores, &sp->kv};
    for (size_t i = 0; i < 3; ++i) {
        *slots[i] = p;
        p += (sizes[i] + 15) / 16 * 16;
    }
    // index lists live in the float arena (4-byte words, copied bit for bit)
    sp->units = reinterpret_cast<int32_t*>(p);
    p += (sizes[3] + 15) / 16 * 16;
    sp->heads = reinterpret_cast<int32_t*>(p);
    sparse_ = std::move(sp);
}

void KvGenerator::predict(int l, const float* z, int N) {
    Sparse& sp = *sparse_;
    Backend& be = m_.backend();
    const SparsityPredictors& p = *sp.opt.predictors;
    if (sp.units_k) {
        p.unit_scores(l, z, sp.scores, sp.u, N);
        be.select_topk(sp.units, sp.scores, N, m_.config().ffn(), sp.units_k, sp.units_threshold);
    }
    if (sp.heads_k) {
        p.head_scores(l, z, sp.scores, sp.u, N);
        be.select_topk(sp.heads, sp.scores, N, m_.config().n_head, sp.heads_k,
                       -std::numeric_limits<float>::infinity());
    }
    sp.layer = l;
}

BlockSparsity KvGenerator::block_sparsity(int l) const {
    const Sparse& sp = *sparse_;
    CTX_CHECK(sp.layer == l, "internal: layer {} runs with the selection of layer {}", l, sp.layer);
    BlockSparsity bs;
    if (sp.units_k) {
        bs.units = sp.units;
        bs.units_k = sp.units_k;
        bs.fc_proj_t = sp.fc_proj_t[static_cast<size_t>(l)].data();
    }
    if (sp.heads_k) {
        bs.heads = sp.heads;
        bs.heads_k = sp.heads_k;
        bs.attn_proj_t = sp.attn_proj_t[static_cast<size_t>(l)].data();
        bs.kv = sp.kv;
    }
    return bs;
}

KvGenerator::KvGenerator(Model& model, int rows, int max_len, int window, DynamicRope dynamic)
    : m_(model), rows_(rows), max_len_(max_len), window_(window), dynamic_(dynamic) {
    CTX_CHECK(rows >= 1 && max_len >= 1 && window >= 0, "generation: need rows >= 1, max_len >= 1 "
              "and window >= 0, got {}, {}, {}", rows, max_len, window);
    const ModelConfig& c = m_.config();
    const TensorShard& sh = m_.shard();  // this rank's widths (tensor parallelism)
    Backend& be = m_.backend();
    const size_t C = c.d_model, F = sh.F, V = sh.V, S = max_len, R = rows, A = sh.A;
    const size_t F2 = sh.F2, Q = c.grouped_kv() ? sh.Q : 0;
    const size_t N = std::max(S, R);
    buf_ = std::make_unique<Buffers>(be, c, sh, rows, max_len);
    Buffers& b = *buf_;
    PePlugin* pe = m_.pe();
    if (pe && pe->has(CTX_PE_HOOK_ROTARY)) {  // does the rotation depend on the length?
        // One call at a time: a plugin may reuse its arrays on the next call.
        const std::vector<float> at_context =
            OwnedRotarySpec(pe->rotary_spec(c.context_length)).signature();
        const std::vector<float> longer =
            OwnedRotarySpec(pe->rotary_spec(std::max(max_len, 4 * c.context_length + 1)))
                .signature();
        b.dynamic_rotary = at_context != longer;
    }
    b.kpos_host.assign(R * S, 0.0f);
    const std::vector<size_t> sizes = {N * C, N * C, N * C, N * C, N * C, N, N, N * 3 * A,
                                       N * A, N * C, N * C, N * F2, N * F, R * C, R * C, R * V,
                                       be.attention_cached_scratch_floats(max_len), N * Q};
    size_t total = 0;
    for (size_t s : sizes) total += (s + 15) / 16 * 16;
    b.acts = Arena(be, total);
    float** slots[] = {&b.encoded, &b.x, &b.x_next, &b.ln, &b.ln1, &b.mean, &b.rstd, &b.qkv,
                       &b.atty, &b.tmp, &b.res2, &b.fch, &b.fch_act, &b.last, &b.lnf, &b.logits,
                       &b.attn_scratch, &b.qkv_grouped};
    static_assert(sizeof(slots) / sizeof(slots[0]) == 18);
    size_t off = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
        *slots[i] = b.acts.data() + off;
        off += (sizes[i] + 15) / 16 * 16;
    }
    if (Q == 0) b.qkv_grouped = nullptr;
    b.tokens.assign(N, 0);
    b.logits_host.assign(R * static_cast<size_t>(c.vocab_size), 0.0f);
    b.rot_sig.assign(R, {});
    b.history.assign(R, {});
    lens_.assign(R, 0);
}

KvGenerator::~KvGenerator() = default;

const float* KvGenerator::logits(int r) const {
    CTX_CHECK(r >= 0 && r < rows_ && lens_[static_cast<size_t>(r)] > 0,
              "generation: row {} has no logits (not prefilled)", r);
    return buf_->logits_host.data() + static_cast<size_t>(r) * m_.config().vocab_size;
}

float KvGenerator::last_position(int r) const {
    CTX_CHECK(r >= 0 && r < rows_ && lens_[static_cast<size_t>(r)] > 0,
              "generation: row {} is empty", r);
    return buf_->kpos_host[static_cast<size_t>(r) * max_len_ + lens_[static_cast<size_t>(r)] - 1];
}

void KvGenerator::prefill(int r, const int32_t* tokens, const float* positions, int n) {
    CTX_CHECK(r >= 0 && r < rows_, "generation: row {} outside [0, {})", r, rows_);
    CTX_CHECK(n >= 1 && n <= max_len_, "generation: a prompt of {} tokens does not fit a cache "
              "of {} (and needs at least one token)", n, max_len_);
    float* kp = buf_->kpos_host.data() + static_cast<size_t>(r) * max_len_;
    for (int t = 0; t < n; ++t) kp[t] = positions ? positions[t] : static_cast<float>(t);
    lens_[static_cast<size_t>(r)] = n;
    buf_->history[static_cast<size_t>(r)].assign(tokens, tokens + n);
    step(r, 1, n, tokens);
}

void KvGenerator::decode(const int32_t* tokens, const float* positions) {
    for (int r = 0; r < rows_; ++r) {
        const auto len = lens_[static_cast<size_t>(r)];
        CTX_CHECK(len > 0, "generation: row {} was not prefilled", r);
        CTX_CHECK(len < max_len_, "generation: row {} is full ({} tokens)", r, max_len_);
        buf_->kpos_host[static_cast<size_t>(r) * max_len_ + len] = positions[r];
        lens_[static_cast<size_t>(r)] = len + 1;
        buf_->history[static_cast<size_t>(r)].push_back(tokens[r]);
    }
    const std::vector<std::vector<float>> before = buf_->rot_sig;
    step(0, rows_, 1, tokens);
    if (!buf_->dynamic_rotary || dynamic_ == DynamicRope::Keep) return;
    // A row whose rotation changed with its length: its cached keys, and every hidden state
    // computed from them, belong to the old rotation. Recompute the row from its tokens, as a
    // forward pass over the whole sequence would.
    for (int r = 0; r < rows_; ++r) {
        if (before[static_cast<size_t>(r)] == buf_->rot_sig[static_cast<size_t>(r)]) continue;
        const std::vector<int32_t> toks = buf_->history[static_cast<size_t>(r)];
        const std::vector<float> pos(buf_->kpos_host.begin() + static_cast<ptrdiff_t>(r) * max_len_,
                                     buf_->kpos_host.begin() + static_cast<ptrdiff_t>(r) * max_len_ +
                                         lens_[static_cast<size_t>(r)]);
        prefill(r, toks.data(), pos.data(), static_cast<int>(toks.size()));
        ++recomputed_;
    }
}

void KvGenerator::step(int r0, int nb, int Tq, const int32_t* tokens) {
    Model& m = m_;
    // steps of any length: every rank holds all of the step's rows
    TensorGroup::SequenceParallelOff whole_rows(m.tensor_group());
    const ModelConfig& cfg = m.config();
    Backend& be = m.backend();
    Buffers& b = *buf_;
    const int C = cfg.d_model, V = cfg.vocab_size, H = m.shard().H, S = max_len_;
    const int N = nb * Tq;
    PePlugin* pe = m.pe();

    // ---- the new tokens: checks, host staging, positions on the device
    std::vector<float> pos_new(static_cast<size_t>(N));
    for (int i = 0; i < nb; ++i) {
        const int r = r0 + i, len = lens_[static_cast<size_t>(r)];
        const size_t first = static_cast<size_t>(i) * Tq;
        const float* kp = b.kpos_host.data() + static_cast<size_t>(r) * S + len - Tq;
        m.check_row(tokens + first, nullptr, kp, Tq, r, len - Tq);
        std::copy(tokens + first, tokens + first + Tq, b.tokens.begin() + first);
        std::copy(kp, kp + Tq, pos_new.begin() + first);
        be.copy_to_device(b.cache.pos.data() + static_cast<size_t>(r) * S + len - Tq,
                          pos_new.data() + first, Tq);
    }
    // checked above: one upload of the step's tokens and positions
    const BatchInputs staged =
        be.stage_batch(BatchInputs{b.tokens.data(), nullptr, pos_new.data(), nullptr, nullptr, N});

    // ---- embedding + input PE, as every pass of the model
    m.embed(b.x, b.encoded, b.mean, b.rstd, staged.tokens, staged.positions, pos_new.data(), N);

    // ---- the attention step: rotation per row (its own length decides a dynamic scaling)
    // and the bias
    const bool rotary = pe && pe->has(CTX_PE_HOOK_ROTARY);
    std::vector<OwnedRotarySpec> specs;
    int max_len_now = 0;
    for (int i = 0; i < nb; ++i) {
        const int len = lens_[static_cast<size_t>(r0 + i)];
        max_len_now = std::max(max_len_now, len);
        if (rotary) specs.emplace_back(m.rotary_spec(len));
    }
    AttentionOptions attn;
    attn.window = cfg.window_with(window_);
    if (m.bias_is_generic()) {
        // f_h(kpos[c] - kpos[j], kpos[c]) for every new query c and cached key j <= c.
        const size_t tsize = static_cast<size_t>(nb) * H * Tq * S;
        if (b.table.size() < tsize) b.table = Arena(be, tsize);
        b.pairs.pack(nb, Tq, b.kpos_host.data() + static_cast<size_t>(r0) * S,
                     static_cast<size_t>(S), lens_.data() + r0);
        m.fill_bias_table(b.pairs, b.table.data(), nb, Tq, S);
        attn.bias.kind = BiasKind::Table;
        attn.bias.table = b.table.data();
    } else {
        attn.bias = m.bias_spec(max_len_now);
        attn.bias.da = attn.bias.db = nullptr;
    }
    b.attention.begin(r0, nb, Tq, lens_.data(), staged.positions, &specs, attn, b.attn_scratch);

    // ---- the blocks: the model's, over the cache (the norms share mean and rstd; ln1 is kept
    // apart for the sparsity predictors and observers)
    const BlockActs acts{b.ln1,  b.mean, b.rstd, b.qkv, b.atty,    nullptr,
                         b.res2, b.ln,   b.mean, b.rstd, b.fch,    b.fch_act, b.qkv_grouped};
    // Contextual sparsity in decode steps: layer 0 predicts from its own ln1 output, layer
    // l + 1 from layer l's (the lookahead), computed once block l has run.
    Sparse* sp = Tq == 1 ? sparse_.get() : nullptr;
    if (sp) {
        const BlockWeights w0 = m.layer_weights(0);
        norm_forward(be, cfg, b.ln1, b.mean, b.rstd, b.x, w0.ln1_w, w0.ln1_b, N);
        predict(0, b.ln1, N);
    }
    for (int l = 0; l < cfg.n_layer; ++l) {
        BlockSparsity bs;
        if (sp) bs = block_sparsity(l);
        b.attention.set_heads(bs.heads, bs.heads_k);
        m.block().forward(m.layer_weights(l), b.x, b.x_next, acts, b.tmp, N, l, b.attention,
                          sp ? &bs : nullptr);
        if (sp && l + 1 < cfg.n_layer) predict(l + 1, b.ln1, N);
        if (observer_) observer_(l, acts, N);
        std::swap(b.x, b.x_next);
    }
    for (int i = 0; i < nb; ++i)
        if (rotary) b.rot_sig[static_cast<size_t>(r0 + i)] = specs[static_cast<size_t>(i)].signature();

    // ---- logits of each row's newest token only
    for (int i = 0; i < nb; ++i)
        be.copy(b.last + static_cast<size_t>(i) * C,
                b.x + (static_cast<size_t>(i) * Tq + Tq - 1) * C, C);
    m.head(b.logits, b.lnf, b.mean, b.rstd, b.last, nb);
    float* out = b.logits_host.data() + static_cast<size_t>(r0) * V;
    if (!m.tensor_parallel()) {
        be.copy_to_host(out, b.logits, static_cast<size_t>(nb) * V);
        return;
    }
    m.gather_vocab_columns(b.logits, static_cast<size_t>(nb), out);  // vocabulary-parallel
}

// ---------------------------------------------------------------- teacher-forced decoding

double DecodeScore::perplexity() const {
    return tokens > 0 ? std::exp(nll_sum / static_cast<double>(tokens)) : 0.0;
}
double DecodeScore::decode_tokens_per_s() const {
    return decode_seconds > 0 ? static_cast<double>(decoded) / decode_seconds : 0.0;
}

DecodeScore decode_rows(Model& model, const DecodeRows& q, int prefix, int window,
                        const SparsityOptions& sparsity, float* logprobs, int32_t* argmax) {
    const int B = q.B, T = q.T;
    CTX_CHECK(B >= 1 && T >= 1 && q.tokens && q.targets, "decode_rows: need rows of tokens and "
              "targets, got {} x {}", B, T);
    CTX_CHECK(prefix >= 1 && prefix <= T, "decode_rows: prefix {} must be in [1, {}]", prefix, T);
    const int V = model.config().vocab_size;
    KvGenerator gen(model, B, T, window);
    gen.set_sparsity(sparsity);
    std::vector<float> pos(static_cast<size_t>(B) * T);
    for (size_t i = 0; i < pos.size(); ++i)
        pos[i] = q.positions ? q.positions[i] : static_cast<float>(i % static_cast<size_t>(T));
    for (int r = 0; r < B; ++r)
        gen.prefill(r, q.tokens + static_cast<size_t>(r) * T, pos.data() + static_cast<size_t>(r) * T,
                    prefix);
    if (logprobs) std::fill(logprobs, logprobs + static_cast<size_t>(B) * T, 0.0f);
    if (argmax) std::fill(argmax, argmax + static_cast<size_t>(B) * T, 0);
    DecodeScore out;
    std::vector<int32_t> next(static_cast<size_t>(B));
    std::vector<float> next_pos(static_cast<size_t>(B));
    for (int t = prefix - 1; t < T; ++t) {
        for (int r = 0; r < B; ++r) {  // the logits after token t predict targets[t]
            const size_t i = static_cast<size_t>(r) * T + t;
            const float* lg = gen.logits(r);
            const float* best = std::max_element(lg, lg + V);
            double z = 0;
            for (int v = 0; v < V; ++v) z += std::exp(static_cast<double>(lg[v]) - *best);
            const double lp = lg[q.targets[i]] - *best - std::log(z);
            out.nll_sum -= lp;
            if (logprobs) logprobs[i] = static_cast<float>(lp);
            if (argmax) argmax[i] = static_cast<int32_t>(best - lg);
        }
        out.tokens += B;
        if (t + 1 == T) break;
        for (int r = 0; r < B; ++r) {
            next[static_cast<size_t>(r)] = q.tokens[static_cast<size_t>(r) * T + t + 1];
            next_pos[static_cast<size_t>(r)] = pos[static_cast<size_t>(r) * T + t + 1];
        }
        const auto t0 = std::chrono::steady_clock::now();
        gen.decode(next.data(), next_pos.data());
        out.decode_seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        out.decoded += B;
    }
    return out;
}

DecodeScore score_by_decoding(Model& model, const std::vector<std::vector<int32_t>>& rows,
                              int prefix, const SparsityOptions& sparsity) {
    CTX_CHECK(!rows.empty(), "score_by_decoding: no rows");
    const int n = static_cast<int>(rows[0].size()), R = static_cast<int>(rows.size());
    CTX_CHECK(prefix >= 1 && prefix < n, "score_by_decoding: prefix {} must be in [1, {})",
              prefix, n);
    // inputs: tokens 0 .. n-2, targets: 1 .. n-1
    std::vector<int32_t> tokens, targets;
    for (const auto& r : rows) {
        CTX_CHECK(static_cast<int>(r.size()) == n, "score_by_decoding: rows of {} and {} tokens; "
                  "all must have the same length", n, r.size());
        tokens.insert(tokens.end(), r.begin(), r.end() - 1);
        targets.insert(targets.end(), r.begin() + 1, r.end());
    }
    return decode_rows(model, DecodeRows{R, n - 1, tokens.data(), nullptr, targets.data()}, prefix,
                       0, sparsity, nullptr, nullptr);
}

// ---------------------------------------------------------------- greedy generation

const char* finish_name(GenerateResult::Finish f) {
    switch (f) {
        case GenerateResult::Finish::Length: return "length";
        case GenerateResult::Finish::StopToken: return "stop_token";
        case GenerateResult::Finish::StopString: return "stop_string";
    }
    return "?";
}

std::vector<GenerateResult> generate(Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                     const GenerateOptions& o,
                                     const std::vector<std::vector<float>>& positions) {
    CTX_CHECK(!prompts.empty(), "generate: no prompts");
    CTX_CHECK(o.max_new_tokens >= 0, "generate: max_new_tokens must be >= 0, got {}",
              o.max_new_tokens);
    CTX_CHECK(o.stop_strings.empty() || o.decode,
              "generate: stop strings need a decode function (a tokenizer)");
    CTX_CHECK(positions.empty() || positions.size() == prompts.size(),
              "generate: {} position lists for {} prompts", positions.size(), prompts.size());
    const int R = static_cast<int>(prompts.size());
    int longest = 0;
    for (size_t r = 0; r < prompts.size(); ++r) {
        CTX_CHECK(!prompts[r].empty(), "generate: prompt {} is empty", r);
        CTX_CHECK(positions.empty() || positions[r].size() == prompts[r].size(),
                  "generate: prompt {} has {} tokens but {} positions", r, prompts[r].size(),
                  positions[r].size());
        longest = std::max(longest, static_cast<int>(prompts[r].size()));
    }
    const int V = model.config().vocab_size;
    KvGenerator gen(model, R, longest + std::max(o.max_new_tokens, 1), o.window, o.dynamic_rope);
    gen.set_sparsity(o.sparsity);
    for (int r = 0; r < R; ++r)
        gen.prefill(r, prompts[static_cast<size_t>(r)].data(),
                    positions.empty() ? nullptr : positions[static_cast<size_t>(r)].data(),
                    static_cast<int>(prompts[static_cast<size_t>(r)].size()));
    std::vector<GenerateResult> out(static_cast<size_t>(R));
    std::vector<char> done(static_cast<size_t>(R), 0);
    std::vector<int32_t> next(static_cast<size_t>(R));
    std::vector<float> next_pos(static_cast<size_t>(R));
    for (int step = 0; step < o.max_new_tokens; ++step) {
        bool any = false;
        for (int r = 0; r < R; ++r) {
            const float* lg = gen.logits(r);
            next[static_cast<size_t>(r)] = static_cast<int32_t>(std::max_element(lg, lg + V) - lg);
            next_pos[static_cast<size_t>(r)] = gen.last_position(r) + 1.0f;
            if (done[static_cast<size_t>(r)]) continue;
            GenerateResult& res = out[static_cast<size_t>(r)];
            const int32_t t = next[static_cast<size_t>(r)];
            if (std::find(o.stop_tokens.begin(), o.stop_tokens.end(), t) != o.stop_tokens.end()) {
                res.finish = GenerateResult::Finish::StopToken;
                done[static_cast<size_t>(r)] = 1;
                continue;
            }
            res.tokens.push_back(t);
            if (!o.stop_strings.empty()) {
                const std::string text = o.decode(res.tokens);
                for (const std::string& s : o.stop_strings)
                    if (!s.empty() && text.find(s) != std::string::npos) {
                        res.finish = GenerateResult::Finish::StopString;
                        done[static_cast<size_t>(r)] = 1;
                    }
            }
            any = any || !done[static_cast<size_t>(r)];
        }
        // Every row steps together (finished rows too, their outputs ignored): one batched pass.
        if (!any || step + 1 == o.max_new_tokens) break;
        gen.decode(next.data(), next_pos.data());
    }
    for (GenerateResult& res : out) {
        if (!o.decode) continue;
        res.text = o.decode(res.tokens);
        if (res.finish == GenerateResult::Finish::StopString) {
            size_t cut = res.text.size();
            for (const std::string& s : o.stop_strings)
                if (!s.empty()) cut = std::min(cut, res.text.find(s));
            res.text.resize(cut);
        }
    }
    return out;
}

}  // namespace ctx
