#include "model/generate.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/host_span.h"

namespace ctx {

namespace {

// Everything a RotarySpec's rotation depends on, to tell whether a row's cached keys were
// rotated by the spec in force now (dynamic NTK changes it with the length).
std::vector<float> rotary_signature(const RotarySpec& s) {
    std::vector<float> sig = {static_cast<float>(s.rotary_dims), static_cast<float>(s.layout),
                              s.position_scale, s.attention_factor, s.amp_scale_base,
                              s.amp_base ? 1.0f : 0.0f};
    for (int k = 0; k < s.rotary_dims / 2; ++k) {
        sig.push_back(s.inv_freq[k]);
        if (s.amp_base) sig.push_back(s.amp_base[k]);
    }
    return sig;
}

}  // namespace

struct KvGenerator::Buffers {
    // per layer, (rows, S, C) each: rotated keys and values
    std::vector<Arena> kc, vc;
    Arena kpos;                          // (rows, S) positions of the cached tokens
    std::vector<float> kpos_host;        // (rows, S) the same on the host
    // step activations for up to N = max(S, rows) new tokens
    Arena acts;
    float *encoded, *x, *x_next, *ln, *mean, *rstd, *qkv, *atty, *tmp, *res2, *fch, *fch_act;
    float *positions, *last, *lnf, *logits, *attn_scratch;
    std::vector<int32_t> tokens;         // (N) host
    std::vector<float> logits_host;      // (rows, V)
    std::vector<std::vector<float>> rot_sig;  // per row: the rotation its newest keys carry
    std::vector<std::vector<int32_t>> history;  // per row: every token (to recompute a row)
    // generic bias: (rows, H, Tq, S) table, host staging, packed pairs
    Arena table;
    std::vector<float> table_host, pair_dist, pair_qpos, pair_val;
    bool dynamic_rotary = false;  // the rotation depends on the row length (dynamic NTK)
};

KvGenerator::KvGenerator(Model& model, int rows, int max_len, int window, DynamicRope dynamic)
    : m_(model), rows_(rows), max_len_(max_len), window_(window), dynamic_(dynamic) {
    CTX_CHECK(rows >= 1 && max_len >= 1 && window >= 0, "generation: need rows >= 1, max_len >= 1 "
              "and window >= 0, got {}, {}, {}", rows, max_len, window);
    const ModelConfig& c = m_.config_;
    Backend& be = m_.backend();
    const size_t C = c.d_model, F = c.ffn(), V = c.vocab_size, S = max_len, R = rows;
    const size_t N = std::max(S, R);
    buf_ = std::make_unique<Buffers>();
    Buffers& b = *buf_;
    PePlugin* pe = m_.pe();
    if (pe && pe->has(CTX_PE_HOOK_ROTARY)) {  // does the rotation depend on the length?
        // One call at a time: a plugin may reuse its arrays on the next call.
        const std::vector<float> at_context = rotary_signature(pe->rotary_spec(c.context_length));
        const std::vector<float> longer =
            rotary_signature(pe->rotary_spec(std::max(max_len, 4 * c.context_length + 1)));
        b.dynamic_rotary = at_context != longer;
    }
    for (int l = 0; l < c.n_layer; ++l) {
        b.kc.emplace_back(be, R * S * C);
        b.vc.emplace_back(be, R * S * C);
    }
    b.kpos = Arena(be, R * S);
    b.kpos_host.assign(R * S, 0.0f);
    const std::vector<size_t> sizes = {N * C, N * C, N * C, N * C, N, N, N * 3 * C, N * C,
                                       N * C, N * C, N * F, N * F, N, R * C, R * C, R * V,
                                       be.attention_cached_scratch_floats(max_len)};
    size_t total = 0;
    for (size_t s : sizes) total += (s + 15) / 16 * 16;
    b.acts = Arena(be, total);
    float** slots[] = {&b.encoded, &b.x, &b.x_next, &b.ln, &b.mean, &b.rstd, &b.qkv, &b.atty,
                       &b.tmp, &b.res2, &b.fch, &b.fch_act, &b.positions, &b.last, &b.lnf,
                       &b.logits, &b.attn_scratch};
    static_assert(sizeof(slots) / sizeof(slots[0]) == 17);
    size_t off = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
        *slots[i] = b.acts.data() + off;
        off += (sizes[i] + 15) / 16 * 16;
    }
    b.tokens.assign(N, 0);
    b.logits_host.assign(R * V, 0.0f);
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
    const ModelConfig& cfg = m.config_;
    Backend& be = m.backend();
    Buffers& b = *buf_;
    const int C = cfg.d_model, V = cfg.vocab_size, F = cfg.ffn(), H = cfg.n_head, S = max_len_;
    const int N = nb * Tq;
    const size_t NC = static_cast<size_t>(N) * C;
    PePlugin* pe = m.pe();

    // ---- the new tokens: checks, host staging, positions on the device
    int64_t table_rows = -1;
    if (pe && pe->has(CTX_PE_HOOK_INPUT) && m.input_spec_.kind == CTX_INPUT_TABLE)
        table_rows = pe->params()[m.input_spec_.table_param].shape[0];
    std::vector<float> pos_new(static_cast<size_t>(N));
    for (int i = 0; i < nb; ++i) {
        const int r = r0 + i, len = lens_[static_cast<size_t>(r)];
        for (int t = 0; t < Tq; ++t) {
            const size_t n = static_cast<size_t>(i) * Tq + t;
            const int32_t tok = tokens[n];
            const float p = b.kpos_host[static_cast<size_t>(r) * S + len - Tq + t];
            CTX_CHECK(tok >= 0 && tok < V, "generation: token {} (row {}, index {}) is outside "
                      "the vocabulary [0, {})", tok, r, len - Tq + t, V);
            CTX_CHECK(std::isfinite(p) && p >= 0.0f, "generation: position {} (row {}, index {}) "
                      "must be finite and >= 0", p, r, len - Tq + t);
            CTX_CHECK(table_rows < 0 || p <= static_cast<float>(table_rows - 1),
                      "generation: position {} exceeds the learned position table of {} rows "
                      "({}); extend the model (model:extend(L)) first", p, table_rows, pe->name());
            b.tokens[n] = tok;
            pos_new[n] = p;
        }
        be.copy_to_device(b.kpos.data() + static_cast<size_t>(r) * S + len - Tq,
                          pos_new.data() + static_cast<size_t>(i) * Tq, Tq);
    }
    be.copy_to_device(b.positions, pos_new.data(), N);

    // ---- embedding + input PE (as Model::forward_impl)
    const float* wte = m.params_.at(m.layout_.view("wte"));
    const float* wpe = nullptr;
    if (table_rows > 0) wpe = m.params_.at(m.layout_.views()[m.pe_view_index_[m.input_spec_.table_param]]);
    be.embedding_forward(b.encoded, b.tokens.data(), b.positions, wte, wpe, N, C, V,
                         static_cast<int>(std::max<int64_t>(table_rows, 0)));
    if (pe && pe->has(CTX_PE_HOOK_INPUT) && m.input_spec_.kind == CTX_INPUT_GENERIC) {
        HostSpan params = m.pe_span(m.params_);
        HostSpan encoded(be, b.encoded, NC, true);  // (N, C)
        pe->input_forward(m.pe_tensors(params.data()), pos_new.data(), N, encoded.data());
        encoded.commit();
    }
    auto param = [&](const char* name) -> float* {
        const ParamView* v = m.layout_.find(name);
        return v ? m.params_.at(*v) : nullptr;
    };
    if (cfg.embedding_layernorm)
        be.layernorm_forward(b.x, b.mean, b.rstd, b.encoded, param("emb_ln.weight"),
                             param("emb_ln.bias"), N, C, cfg.norm_eps);
    else
        be.copy(b.x, b.encoded, NC);

    // ---- rotation per row (its own length decides a dynamic scaling) and the bias
    const bool rotary = pe && pe->has(CTX_PE_HOOK_ROTARY);
    std::vector<RotarySpec> specs(static_cast<size_t>(nb));
    std::vector<std::vector<float>> sigs(static_cast<size_t>(nb));
    std::vector<std::vector<float>> spec_copies(static_cast<size_t>(nb) * 2);  // keeps arrays alive
    int max_len_now = 0;
    for (int i = 0; i < nb; ++i) {
        const int r = r0 + i;
        max_len_now = std::max(max_len_now, lens_[static_cast<size_t>(r)]);
        if (!rotary) continue;
        RotarySpec s = pe->rotary_spec(lens_[static_cast<size_t>(r)]);
        // The plugin may reuse its arrays on the next call: keep copies for this step.
        spec_copies[2 * i].assign(s.inv_freq, s.inv_freq + s.rotary_dims / 2);
        s.inv_freq = spec_copies[2 * i].data();
        if (s.amp_base) {
            spec_copies[2 * i + 1].assign(s.amp_base, s.amp_base + s.rotary_dims / 2);
            s.amp_base = spec_copies[2 * i + 1].data();
        }
        specs[static_cast<size_t>(i)] = s;
        sigs[static_cast<size_t>(i)] = rotary_signature(s);
    }
    AttentionOptions attn;
    attn.window = window_;
    if (m.bias_generic_) {
        // f_h(kpos[c] - kpos[j], kpos[c]) for every new query c and cached key j <= c.
        const size_t tsize = static_cast<size_t>(nb) * H * Tq * S;
        if (b.table_host.size() < tsize) {
            b.table_host.assign(tsize, 0.0f);
            b.table = Arena(be, tsize);
        }
        HostSpan param_span = m.pe_span(m.params_);
        const std::vector<ctx_tensor> params = m.pe_tensors(param_span.data());
        for (int i = 0; i < nb; ++i) {
            const int r = r0 + i, len = lens_[static_cast<size_t>(r)];
            const float* kp = b.kpos_host.data() + static_cast<size_t>(r) * S;
            b.pair_dist.clear();
            b.pair_qpos.clear();
            for (int t = 0; t < Tq; ++t) {
                const int c = len - Tq + t;
                for (int j = 0; j <= c; ++j) {
                    b.pair_dist.push_back(static_cast<float>(static_cast<double>(kp[c]) - kp[j]));
                    b.pair_qpos.push_back(kp[c]);
                }
            }
            b.pair_val.resize(b.pair_dist.size());
            for (int h = 0; h < H; ++h) {
                pe->bias_forward(params, h, b.pair_dist.data(), b.pair_qpos.data(),
                                 static_cast<int64_t>(b.pair_dist.size()), b.pair_val.data());
                size_t k = 0;
                for (int t = 0; t < Tq; ++t) {
                    float* row = b.table_host.data() + ((static_cast<size_t>(i) * H + h) * Tq + t) * S;
                    for (int j = 0; j <= len - Tq + t; ++j) row[j] = b.pair_val[k++];
                }
            }
        }
        be.copy_to_device(b.table.data(), b.table_host.data(), tsize);
        attn.bias.kind = BiasKind::Table;
        attn.bias.table = b.table.data();
    } else {
        attn.bias = m.bias_spec(max_len_now);
        attn.bias.da = attn.bias.db = nullptr;
    }

    // ---- the blocks
    for (int l = 0; l < cfg.n_layer; ++l) {
        const Model::Layer w = m.layer(l, m.params_);
        be.layernorm_forward(b.ln, b.mean, b.rstd, b.x, w.ln1_w, w.ln1_b, N, C, cfg.norm_eps);
        be.matmul_forward(b.qkv, b.ln, w.qkv_w, w.qkv_b, N, C, 3 * C);
        for (int i = 0; i < nb; ++i) {
            const int r = r0 + i, len = lens_[static_cast<size_t>(r)];
            float* qkv_r = b.qkv + static_cast<size_t>(i) * Tq * 3 * C;  // (Tq, 3C)
            const size_t slot0 = static_cast<size_t>(r) * S + len - Tq;   // first new slot
            if (rotary)  // each row at its own length's rotation
                be.rotary_forward(qkv_r, b.positions + static_cast<size_t>(i) * Tq, 1, Tq, C, H,
                                  specs[static_cast<size_t>(i)]);
            for (int t = 0; t < Tq; ++t) {
                const float* src = qkv_r + static_cast<size_t>(t) * 3 * C;
                be.copy(b.kc[l].data() + (slot0 + t) * C, src + C, C);
                be.copy(b.vc[l].data() + (slot0 + t) * C, src + 2 * C, C);
            }
        }
        be.attention_cached_forward(b.atty, b.attn_scratch, b.qkv,
                                    b.kc[l].data() + static_cast<size_t>(r0) * S * C,
                                    b.vc[l].data() + static_cast<size_t>(r0) * S * C,
                                    b.kpos.data() + static_cast<size_t>(r0) * S,
                                    lens_.data() + r0, nb, Tq, S, C, H, attn);
        be.matmul_forward(b.tmp, b.atty, w.attn_proj_w, w.attn_proj_b, N, C, C);
        be.add(b.res2, b.x, b.tmp, NC);
        const float* mlp_in = cfg.parallel_residual ? b.x : b.res2;
        be.layernorm_forward(b.ln, b.mean, b.rstd, mlp_in, w.ln2_w, w.ln2_b, N, C, cfg.norm_eps);
        be.matmul_forward(b.fch, b.ln, w.fc_w, w.fc_b, N, C, F);
        be.activation_forward(b.fch_act, b.fch, static_cast<size_t>(N) * F, cfg.activation);
        be.matmul_forward(b.tmp, b.fch_act, w.fc_proj_w, w.fc_proj_b, N, F, C);
        be.add(b.x_next, b.res2, b.tmp, NC);
        std::swap(b.x, b.x_next);
    }
    for (int i = 0; i < nb; ++i)
        if (rotary) b.rot_sig[static_cast<size_t>(r0 + i)] = sigs[static_cast<size_t>(i)];


    // ---- logits of each row's newest token only
    for (int i = 0; i < nb; ++i)
        be.copy(b.last + static_cast<size_t>(i) * C,
                b.x + (static_cast<size_t>(i) * Tq + Tq - 1) * C, C);
    be.layernorm_forward(b.lnf, b.mean, b.rstd, b.last, param("lnf.weight"), param("lnf.bias"),
                         nb, C, cfg.norm_eps);
    const float* head = cfg.tied_embeddings ? wte : param("lm_head.weight");
    be.matmul_forward(b.logits, b.lnf, head, nullptr, nb, C, V);
    be.copy_to_host(b.logits_host.data() + static_cast<size_t>(r0) * V, b.logits,
                    static_cast<size_t>(nb) * V);
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
