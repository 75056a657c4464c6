#include "backend/op_common.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace ctx {

int t5_bucket(double d, int nb, int md) {
    const double n = std::max(0.0, std::floor(d));
    const int me = nb / 2;
    if (n < me) return int(n);
    const double v =
        me + std::floor(std::log(n / me) / std::log(double(md) / me) * double(nb - me));
    return int(std::min(double(nb - 1), v));
}

void check_embedding_tokens(const int32_t* tokens, const float* positions, int N, int V, int P) {
    for (int n = 0; n < N; n++) {
        CTX_CHECK(tokens[n] >= 0 && tokens[n] < V,
                  "embedding: token {} at row {} is outside the vocabulary [0, {})", tokens[n], n,
                  V);
        if (positions != nullptr) {
            CTX_CHECK(positions[n] >= 0.0f && positions[n] <= float(P - 1),
                      "embedding: position {} at row {} is outside the table [0, {}]",
                      positions[n], n, P - 1);
        }
    }
}

void check_targets(const int32_t* targets, const float* mask, int N, int V) {
    for (int n = 0; n < N; n++) {
        const float m = mask != nullptr ? mask[n] : 1.0f;
        if (m == 0.0f) continue;
        CTX_CHECK(targets[n] >= 0 && targets[n] < V,
                  "crossentropy: target {} at row {} (mask {}) is outside the vocabulary [0, {})",
                  targets[n], n, m, V);
    }
}

void check_rotary(int C, int H, const RotarySpec& spec) {
    CTX_CHECK(H > 0 && C % H == 0, "rotary: d_model {} is not divisible by {} heads", C, H);
    const int D = C / H;
    CTX_CHECK(spec.rotary_dims >= 0 && spec.rotary_dims % 2 == 0 && spec.rotary_dims <= D,
              "rotary: rotary_dims {} must be even and in [0, head_dim {}]", spec.rotary_dims, D);
    CTX_CHECK(spec.rotary_dims / 2 <= kMaxRotaryPairs, "rotary: more than {} pairs",
              kMaxRotaryPairs);
    CTX_CHECK(spec.rotary_dims == 0 || spec.inv_freq != nullptr, "rotary: inv_freq is null");
}

void check_attention(int T, int C, int H, const AttentionOptions& opt, bool rotary_fused) {
    CTX_CHECK(T >= 1, "attention: T must be >= 1, got {}", T);
    CTX_CHECK(H > 0 && C % H == 0, "attention: d_model {} is not divisible by {} heads", C, H);
    CTX_CHECK(opt.rotary == nullptr || rotary_fused,
              "attention: this backend and mode do not rotate q and k inside the op "
              "(AttentionOptions::rotary); apply rotary_forward / rotary_backward around it "
              "(Backend::attention_fuses_rotary says where the op does)");
    if (opt.rotary != nullptr) check_rotary(C, H, *opt.rotary);
    CTX_CHECK(opt.window >= 0, "attention: window must be >= 0, got {}", opt.window);
    // The cached op checks its head subset itself and passes the rest here without it.
    CTX_CHECK(opt.heads == nullptr, "attention: a subset of heads (contextual sparsity) is "
              "supported over a KV cache only");
    const BiasSpec& bs = opt.bias;
    if (bs.kind == BiasKind::None) return;
    if (bs.kind == BiasKind::Table) {
        CTX_CHECK(bs.table != nullptr, "attention: bias kind Table needs a (B, H, T, T) table");
        return;
    }
    CTX_CHECK(int(bs.kind) >= 0 && int(bs.kind) <= int(BiasKind::Table),
              "attention: unknown bias kind {}", int(bs.kind));
    CTX_CHECK(bs.a != nullptr, "attention: bias kind {} needs parameter a", int(bs.kind));
    if (bs.kind == BiasKind::KerpleLog || bs.kind == BiasKind::KerplePower)
        CTX_CHECK(bs.b != nullptr, "attention: KERPLE bias needs parameter b");
    if (bs.kind == BiasKind::T5) {
        CTX_CHECK(bs.num_buckets >= 2 && bs.num_buckets <= kMaxT5Buckets,
                  "attention: T5 num_buckets {} must be in [2, {}]", bs.num_buckets,
                  kMaxT5Buckets);
        CTX_CHECK(bs.max_distance > bs.num_buckets / 2,
                  "attention: T5 max_distance {} must exceed num_buckets / 2 = {}",
                  bs.max_distance, bs.num_buckets / 2);
    }
}

void check_attention_cached(int S, int C, int H, const AttentionOptions& opt) {
    AttentionOptions whole = opt;  // what every attention op checks, less the head subset
    whole.heads = nullptr;
    check_attention(S, C, H, whole);
    CTX_CHECK(opt.heads == nullptr || (opt.heads_k >= 1 && opt.heads_k <= H),
              "cached attention: a head subset of {} heads out of {}", opt.heads_k, H);
    CTX_CHECK(opt.doc_start == nullptr, "attention over a KV cache: packed rows (doc_start) "
              "are a training layout, not supported here");
}

void check_rows_op(const char* op, int N, int K, int G) {
    CTX_CHECK(N >= 0 && K >= 0 && G >= 1, "{}: need N >= 0, K >= 0, G >= 1, got {}, {}, {}", op,
              N, K, G);
}

void check_topk(int N, int M, int K) {
    CTX_CHECK(N >= 0 && K >= 1 && K <= M, "select_topk: need 1 <= K ({}) <= M ({})", K, M);
}

size_t lm_head_chunk_budget_floats(size_t default_mib) {
    size_t mib = default_mib;
    if (const char* env = std::getenv("CTX_LM_HEAD_CHUNK_MIB"); env != nullptr && *env != '\0') {
        char* end = nullptr;
        const long long v = std::strtoll(env, &end, 10);
        CTX_CHECK(end != nullptr && *end == '\0' && v >= 1 && v <= (1LL << 20),
                  "CTX_LM_HEAD_CHUNK_MIB: expected a positive integer number of MiB (at most "
                  "1048576) of fp32 logits per chunk of the language-model head, got '{}'", env);
        mib = static_cast<size_t>(v);
    }
    return mib * (size_t(1) << 20) / sizeof(float);
}

int lm_head_most_rows(size_t row_floats, size_t budget_floats) {
    const size_t most = budget_floats / std::max<size_t>(1, row_floats);
    return static_cast<int>(std::clamp<size_t>(most, 1, size_t(1) << 30));
}

int lm_head_rows_for(int N, int most) {
    if (N <= 1) return 1;
    const int chunks = (N + most - 1) / most;
    return (N + chunks - 1) / chunks;
}

void check_lm_head(int N, int C, int V, const float* dinp, const float* dW) {
    CTX_CHECK(N >= 0 && C >= 1 && V >= 1, "lm_head_loss: bad shape N {} C {} V {}", N, C, V);
    CTX_CHECK(dinp == nullptr || dW != nullptr,
              "lm_head_loss: training (dinp given) needs the head's gradient dW too");
}

void check_swiglu_width(const char* op, int OC, Activation act) {
    CTX_CHECK(act != Activation::SwiGLU || OC % 2 == 0,
              "{}: SwiGLU's pre is [gate | up], so OC = 2F must be even (got {})", op, OC);
}

void check_activation_matmul_backward(const char* op, float* dpre, const float* dact,
                                      const void* pre, int N, int IC, int OC, Activation act) {
    CTX_CHECK(N >= 0 && IC >= 1 && OC >= 1, "{}: bad shape N {} IC {} OC {}", op, N, IC, OC);
    check_swiglu_width(op, OC, act);
    if (N == 0) return;  // no rows: nothing is read or written
    CTX_CHECK(dpre != nullptr && dact != nullptr && pre != nullptr,
              "{}: dpre, dact and pre are all needed", op);
    CTX_CHECK(dpre != dact && dpre != pre, "{}: dpre must be a buffer of its own", op);
}

void activation_backward_rows(Backend& be, float* dpre, const float* dact, const float* pre,
                              int N, int OC, Activation act) {
    if (act == Activation::SwiGLU)
        be.swiglu_backward(dpre, pre, dact, N, OC / 2, GradStore::Overwrite);
    else
        be.activation_backward(dpre, pre, dact, static_cast<size_t>(N) * static_cast<size_t>(OC),
                               act, GradStore::Overwrite);
}

const char* attention_mode_name(AttentionMode m) {
    return m == AttentionMode::Flash ? "flash" : "materialised";
}

const char* precision_name(Precision p) { return p == Precision::Bf16 ? "bf16" : "fp32"; }

}  // namespace ctx

namespace ctx {

void Backend::matmul_residual_forward(float* out, const float* residual, const float* inp,
                                      const float* W, const float* bias, int N, int IC, int OC) {
    CTX_CHECK(out != inp && out != residual,
              "matmul_residual_forward: out must be a buffer of its own (not inp or residual)");
    matmul_forward(out, inp, W, bias, N, IC, OC);
    add(out, residual, out, static_cast<size_t>(N) * static_cast<size_t>(OC));
}

void Backend::matmul_activation_forward(float* pre, float* out, const float* inp, const float* W,
                                        const float* bias, int N, int IC, int OC,
                                        Activation act) {
    check_swiglu_width("matmul_activation_forward", OC, act);
    matmul_forward(pre, inp, W, bias, N, IC, OC);
    if (act == Activation::SwiGLU)
        swiglu_forward(out, pre, N, OC / 2);
    else
        activation_forward(out, pre, static_cast<size_t>(N) * static_cast<size_t>(OC), act);
}

int Backend::timing_mark() {
    fail("timing_mark: the {} backend has no device clock (device_timing() is false)", name());
}
double Backend::timing_ms(int, int) {
    fail("timing_ms: the {} backend has no device clock (device_timing() is false)", name());
}
void Backend::release_timing_marks() {
    fail("release_timing_marks: the {} backend has no device clock (device_timing() is false)",
         name());
}

void Backend::activation_matmul_backward(float* dinp, float* dW, float* dbias, float* dpre,
                                         const float* dact, const float* pre, const float* inp,
                                         const float* W, int N, int IC, int OC, Activation act,
                                         GradStore dinp_store) {
    check_activation_matmul_backward("activation_matmul_backward", dpre, dact, pre, N, IC, OC,
                                     act);
    activation_backward_rows(*this, dpre, dact, pre, N, OC, act);
    matmul_backward(dinp, dW, dbias, dpre, inp, W, N, IC, OC, dinp_store);
}

// The language-model head and its loss in chunks of rows through the backend's own ops. A host
// backend checks every target once first, so an error names the row in the whole batch.
void Backend::lm_head_loss(float* losses, float* dinp, float* dW, float* scratch,
                           const float* inp, const float* W, const int32_t* targets,
                           const float* mask, int N, int C, int V, float grad_scale) {
    check_lm_head(N, C, V, dinp, dW);
    if (N == 0) return;
    if (kind() == DeviceKind::CPU) check_targets(targets, mask, N, V);
    const int R = lm_head_chunk_rows(N, V);
    for (int r0 = 0; r0 < N; r0 += R) {
        const int n = std::min(R, N - r0);
        const size_t o = static_cast<size_t>(r0);
        const float* x = inp + o * C;
        const float* m = mask != nullptr ? mask + o : nullptr;
        matmul_forward(scratch, x, W, nullptr, n, C, V);  // logits (n, V)
        if (dinp == nullptr) {
            crossentropy_forward(losses + o, scratch, targets + o, m, n, V);
            continue;
        }
        crossentropy_forward_backward(scratch, losses + o, targets + o, m, n, V, grad_scale);
        matmul_backward(dinp + o * C, dW, nullptr, scratch, x, W, n, C, V);
    }
}

// 32 MiB of logits per chunk on a host: products of 160+ rows at GPT-2's vocabulary keep their
// speed, and the chunk stays a small part of the activations.
static int host_lm_head_most_rows(int V) {
    return lm_head_most_rows(static_cast<size_t>(V), lm_head_chunk_budget_floats(32));
}

int Backend::lm_head_chunk_rows(int N, int V) const {
    return lm_head_rows_for(N, host_lm_head_most_rows(V));
}

size_t Backend::lm_head_scratch_floats(int N, int V) const {
    return static_cast<size_t>(std::min(std::max(N, 1), host_lm_head_most_rows(V))) *
           static_cast<size_t>(V);
}

// One adamw_update per segment, with its decay.
void Backend::adamw_update_segments(float* params, const float* grads, float* m, float* v,
                                    const std::vector<AdamWSegment>& segments,
                                    const AdamWParams& hp) {
    AdamWParams h = hp;
    for (const AdamWSegment& s : segments) {
        h.weight_decay = s.decay ? hp.weight_decay : 0.0f;
        adamw_update(params + s.offset, grads + s.offset, m + s.offset, v + s.offset, s.n, h);
    }
}

// Attention across blocks is implemented by the CPU and CUDA backends; any other says so.
void Backend::attention_block_forward(float*, float*, const float*, const float*,
                                      const AttnBlockRows&, const AttnBlockRows&, int, int, int,
                                      const AttentionOptions&) {
    fail("attention across blocks (context parallelism) is not implemented on the {} backend "
         "yet", name());
}

void Backend::attention_block_merge(float*, float*, const float*, const float*, int, int, int,
                                    int) {
    fail("attention across blocks (context parallelism) is not implemented on the {} backend "
         "yet", name());
}

void Backend::attention_block_backward(float*, float*, const float*, const float*, const float*,
                                       const float*, const float*, const AttnBlockRows&,
                                       const AttnBlockRows&, int, int, int,
                                       const AttentionOptions&) {
    fail("attention across blocks (context parallelism) is not implemented on the {} backend "
         "yet", name());
}

}  // namespace ctx
