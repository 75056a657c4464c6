#include "backend/op_common.h"

#include <algorithm>
#include <cmath>

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

void check_attention(int T, int C, int H, const AttentionOptions& opt) {
    CTX_CHECK(T >= 1, "attention: T must be >= 1, got {}", T);
    CTX_CHECK(H > 0 && C % H == 0, "attention: d_model {} is not divisible by {} heads", C, H);
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

const char* attention_mode_name(AttentionMode m) {
    return m == AttentionMode::Flash ? "flash" : "materialised";
}

const char* precision_name(Precision p) { return p == Precision::Bf16 ? "bf16" : "fp32"; }

}  // namespace ctx

namespace ctx {

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
