// The op set every backend implements (DESIGN.md decision 1). Model code calls these through a
// Backend& and never knows which device it runs on.
//
// Conventions (all ops):
//   - Row-major. N = B*T rows of tokens. C = d_model. H heads, D = C/H head dim. V vocab.
//   - Pointers are device pointers of the backend (host memory for the CPU backend), fp32,
//     except: token ids and targets (int32) are host memory, and so may be a bias's fixed
//     parameters (BiasSpec::a for ALiBi slopes a plugin computes); a GPU backend stages them.
//   - Backward ops ACCUMULATE (+=) into every gradient they produce, input and parameter alike;
//     the caller zeroes gradient buffers once per step. Exceptions are marked "writes", and the
//     ops that take a GradStore (attention_backward: AttentionOptions::dqkv_store) write their
//     input gradient over the buffer when told to.
//   - Nothing allocates inside an op; scratch buffers are passed in or sized at construction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace ctx {

enum class DeviceKind { CPU, CUDA };

// The MLP's nonlinearity. GeluTanh, GeluErf and Relu are elementwise (activation_forward); SwiGLU
// is gated: fc yields [gate | up] rows and swiglu_forward combines them (Llama-family blocks), so
// activation_forward refuses it. Relu (OPT; models fine-tuned into ReLU form) makes the MLP's
// neuron sparsity exact: a neuron at 0 contributes nothing (contextual sparsity, Deja Vu).
enum class Activation { GeluTanh, GeluErf, SwiGLU, Relu };

enum class RotaryLayout { Half = 0, Interleaved = 1 };

// How a backward op stores the gradient of its input (dinp): added to what the buffer holds
// (Accumulate, the convention above), or written over it (Overwrite: the old contents are not
// read, so a caller whose buffer only this op fills skips zeroing it first; the transformer
// block's activation gradients).
enum class GradStore { Accumulate = 0, Overwrite = 1 };

// Rotation applied to q and k (see ctx_rotary_spec in include/ctx/plugin.h for the formula).
// Only the first rotary_dims dims of each head are rotated and scaled; the rest pass through.
struct RotarySpec {
    int rotary_dims = 0;               // dr, even, <= D; 0 disables the op
    RotaryLayout layout = RotaryLayout::Half;
    const float* inv_freq = nullptr;   // (dr/2) host memory
    float position_scale = 1.0f;
    float attention_factor = 1.0f;
    const float* amp_base = nullptr;   // (dr/2) or nullptr
    float amp_scale_base = 512.0f;
};

enum class BiasKind { None = 0, Linear = 1, KerpleLog = 2, KerplePower = 3, T5 = 4, Table = 5 };

// Additive attention-logit bias b_h(p_i - p_j) for query i, key j <= i. With d = p_i - p_j:
//   Linear      : -a[h] * d
//   KerpleLog   : -a[h] * log(1 + b[h] * |d|)
//   KerplePower : -a[h] * |d|^b[h]
//   T5          : a[h * num_buckets + bucket(d)], bucket per METHODS.md 1.6 (n = max(0, floor(d)))
//   Table       : table[((b * H + h) * T + i) * T + j], an explicit bias the caller computed (the
//                 generic PE path, CTX_BIAS_GENERIC); entries with j > i or outside the window
//                 are never read.
// Gradients w.r.t. a and b are accumulated into da, db when those are non-null. For Table the
// backward op accumulates d(loss)/d(logit) into dtable (same layout) for every entry it reads,
// when dtable is non-null, and leaves the other entries untouched.
// This rank's rows of a vocabulary split over tensor-parallel ranks: ids [begin, begin + V) of
// `total` (V is the op's own argument). total 0: not split (the op's V is the vocabulary).
struct VocabShard {
    int begin = 0;
    int total = 0;
};

struct BiasSpec {
    BiasKind kind = BiasKind::None;
    const float* a = nullptr;  // (H) or (H, num_buckets) for T5; host or device per backend
    const float* b = nullptr;  // (H)
    float* da = nullptr;       // same shape as a, or nullptr (fixed)
    float* db = nullptr;       // same shape as b, or nullptr
    int num_buckets = 32;
    int max_distance = 128;
    const float* table = nullptr;  // Table: (B, H, T, T)
    float* dtable = nullptr;       // Table: (B, H, T, T) or nullptr
};

// What attention_forward saves for attention_backward (the `saved` buffer):
//   Materialised: att (B, H, T, T), the softmax probabilities (zeros above the diagonal and
//                 outside the window). Memory grows as T^2; the CPU reference.
//   Flash:        lse (B, H, T), lse[(b H + h) T + i] = log sum_j exp(logit(i, j)) over the
//                 unmasked keys j of query i. Backward recomputes the probabilities tile by
//                 tile from q, k, the bias and lse; memory grows as T.
enum class AttentionMode { Materialised = 0, Flash = 1 };
const char* attention_mode_name(AttentionMode m);  // "materialised" | "flash"

// Floats of the probabilities or lse an attention call in mode m saves: what the CPU backend
// saves, and the least any backend does. A backend may save more (Backend::
// attention_saved_floats: the bf16 flash kernels keep their packed q, k, v there).
inline size_t attention_saved_floats(AttentionMode m, int B, int T, int H) {
    const size_t rows = static_cast<size_t>(B) * H * T;
    return m == AttentionMode::Flash ? rows : rows * T;
}

// The tokens of one block of rows for attention across blocks (Backend::attention_block_*):
// per row b of B, T tokens with their global index in the whole row, their position and (packed
// rows) the global index of their document's first token. Backend memory.
struct AttnBlockRows {
    int T = 0;
    const int32_t* index = nullptr;      // (B, T) strictly increasing along a row
    const float* positions = nullptr;    // (B, T)
    const int32_t* doc_start = nullptr;  // (B, T) or null: one document per row
};

// Whether key kj of block k is visible to query qi of block q (Backend::attention_block_*).
inline bool attn_block_visible(const AttnBlockRows& q, const AttnBlockRows& k, size_t qi,
                               size_t kj, int window) {
    const int32_t iq = q.index[qi], ik = k.index[kj];
    if (ik > iq) return false;
    if (window > 0 && ik <= iq - window) return false;
    return q.doc_start == nullptr || ik >= q.doc_start[qi];
}

struct AttentionOptions {
    BiasSpec bias;
    // Keys further back than `window` tokens (by index, j < i - window + 1) are masked; 0 = full
    // causal attention. Used for the "windowed" evaluation control.
    int window = 0;
    // Packed rows (several documents in one row): doc_start (B, T) holds, for each query, the
    // index in its row of its document's first token; keys before it are masked as the window
    // masks (both apply). Documents are contiguous, so doc_start is non-decreasing along a row
    // with doc_start[i] <= i. Device memory of the backend (staged with the batch); null: one
    // document per row. Not used by attention over a KV cache.
    const int32_t* doc_start = nullptr;
    AttentionMode mode = AttentionMode::Materialised;
    // Contextual sparsity, attention over a KV cache only: heads (B * Tq, heads_k) int32 device
    // memory lists per query the heads to compute (-1: none; Backend::select_topk's layout);
    // the outputs of the other heads are left as they were. Null: every head.
    const int32_t* heads = nullptr;
    int heads_k = 0;
    // attention_backward only: dqkv is added to (Accumulate) or written over (Overwrite; every
    // entry of the B x T rows is written, and the old contents are not read).
    GradStore dqkv_store = GradStore::Accumulate;
    // The rotation of q and k, done inside attention_forward / attention_backward where
    // Backend::attention_fuses_rotary says so (every other op refuses it): qkv is then the
    // product's output before rotary_forward, left as it is, and dqkv is the gradient w.r.t. it
    // (rotary_backward included; with Accumulate, only the new terms are rotated). Null: qkv is
    // as the logits read it.
    const RotarySpec* rotary = nullptr;
};

// Arithmetic of the matrix products (everything else, and all stored parameters, gradients and
// optimizer state, stays fp32):
//   Fp32: fp32 inputs, fp32 accumulation (no TF32).
//   Bf16: inputs (activations and weights) rounded to bf16, fp32 accumulation and fp32 outputs;
//         the fp32 parameters are the master copy the optimizer updates. The activations
//         that only products read may also be stored in bf16 (Backend::bf16_activations).
enum class Precision { Fp32 = 0, Bf16 = 1 };
const char* precision_name(Precision p);  // "fp32" | "bf16"

// One bfloat16 in backend memory, as its 16-bit pattern (the upper half of the fp32 it rounds):
// activations stored in bf16 (Backend::bf16_activations). A type of its own so that a bf16
// buffer cannot be passed where an op reads floats.
struct Bf16 {
    uint16_t bits;
};

struct AdamWParams {
    float lr = 0.0f;
    float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
    float weight_decay = 0.0f;  // decoupled: p -= lr * wd * p
    int64_t step = 1;           // 1-based, for bias correction
    // Each gradient is multiplied by this first (global-norm clipping's factor): the update is
    // the one of gradients scaled in place, bit for bit, without a pass that writes them.
    float grad_scale = 1.0f;
};

// A piece of a multi-tensor AdamW update (Backend::adamw_update_segments): n floats at `offset`
// of the arrays, with the weight decay or without.
// The MLP's backward (Backend::mlp_backward_bf16), out = act(inp W_fc^T + b_fc) W_proj^T + b_proj
// with pre = inp W_fc^T + b_fc (N, OC), act_out = act(pre) (N, OA), OA = OC (OC / 2 for SwiGLU),
// out (N, OP); pre, act_out and inp stored in bf16.
struct MlpBackwardBf16 {
    float* dinp = nullptr;  // (N, IC): d(loss)/d(inp), or null
    GradStore dinp_store = GradStore::Accumulate;
    float* dW_fc = nullptr;       // (OC, IC) +=
    float* db_fc = nullptr;       // (OC) +=, or null
    float* dW_proj = nullptr;     // (OP, OA) +=
    float* db_proj = nullptr;     // (OP) +=, or null
    float* dact = nullptr;        // (N, OA) scratch: d(loss)/d(act_out), or what the op keeps
    float* dpre = nullptr;        // (N, OC) scratch: d(loss)/d(pre), or unwritten
    const float* dout = nullptr;  // (N, OP): d(loss)/d(out)
    const Bf16* pre = nullptr;
    const Bf16* act_out = nullptr;
    const Bf16* inp = nullptr;
    const float* W_fc = nullptr;    // (OC, IC)
    const float* W_proj = nullptr;  // (OP, OA)
    int N = 0, IC = 0, OC = 0, OP = 0;
    Activation act = Activation::GeluTanh;
    int OA() const { return act == Activation::SwiGLU ? OC / 2 : OC; }  // act_out's width
};

struct AdamWSegment {
    size_t offset = 0, n = 0;
    bool decay = false;
    bool operator==(const AdamWSegment& o) const {
        return offset == o.offset && n == o.n && decay == o.decay;
    }
};

// One pass's batch inputs, N entries each: token ids and targets (int32), positions and the loss
// mask. targets and mask may be null (generation embeds without a loss).
struct BatchInputs {
    const int32_t* tokens = nullptr;
    const int32_t* targets = nullptr;
    const float* positions = nullptr;
    const float* mask = nullptr;
    const int32_t* doc_start = nullptr;  // packed rows (AttentionOptions::doc_start), or null
    int N = 0;
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual DeviceKind kind() const = 0;
    virtual std::string name() const = 0;
    virtual Precision precision() const { return Precision::Fp32; }

    // ---- memory
    virtual float* alloc_floats(size_t n) = 0;  // zero-initialised, 64-byte aligned
    virtual void free_floats(float* p) = 0;
    virtual void copy_to_device(float* dst, const float* host_src, size_t n) = 0;
    virtual void copy_to_host(float* host_dst, const float* src, size_t n) = 0;
    virtual void zero(float* p, size_t n) = 0;
    // dst (n) = src, both device memory. The default suits host-memory backends.
    virtual void copy(float* dst, const float* src, size_t n) {
        std::memcpy(dst, src, n * sizeof(float));
    }
    // dst[r * dst_stride + c] = src[r * src_stride + c] (+= when accumulate) for r < rows,
    // c < cols: a block of columns of row-major matrices (cudaMemcpy2D's shape), both device
    // memory, not overlapping. The default suits host-memory backends.
    virtual void copy_2d(float* dst, size_t dst_stride, const float* src, size_t src_stride,
                         size_t rows, size_t cols, bool accumulate = false) {
        for (size_t r = 0; r < rows; ++r) {
            float* d = dst + r * dst_stride;
            const float* x = src + r * src_stride;
            if (accumulate) {
                for (size_t c = 0; c < cols; ++c) d[c] += x[c];
            } else {
                std::memcpy(d, x, cols * sizeof(float));
            }
        }
    }

    // ---- the batch of a pass, staged once
    // Takes host inputs the caller has already validated (tokens and targets in [0, V),
    // positions finite, >= 0 and inside a learned table) and returns them where the ops read
    // them: device memory on a device backend, uploaded here in one go. Ops given these
    // pointers trust them and copy nothing back to the host; a device backend keeps its own
    // host copy for what it plans on the host (the embedding gradient's row grouping). Valid
    // until the next stage_batch on this backend: one pass (forward and backward) at a time.
    // The default suits host-memory backends: the inputs as they are.
    virtual BatchInputs stage_batch(const BatchInputs& host) { return host; }
    // How many times an op has copied an input back from the device to check or plan it on the
    // host (inputs that were not staged); the model's passes keep it unchanged. Diagnostics.
    virtual uint64_t input_readbacks() const { return 0; }
    // How many times the host has waited, or may have waited, for work queued on the device:
    // synchronisations, device-to-host copies (copy_to_host, sum_squares, input readbacks),
    // uploads CUDA may order behind the queue. A training pass waits once (its losses) and the
    // optimizer once (the gradient norm); anything more stalls the queue. On CUDA one count for
    // the process. Diagnostics (`bench` prints it per step); host backends never wait: 0.
    virtual uint64_t host_waits() const { return 0; }
    // Device memory held through the device backends' allocations on this backend's device
    // (parameter arenas, activations, scratch), now and at its peak since the process started,
    // in bytes; `available` is false on host backends, whose memory is the process's (its RSS).
    // Diagnostics: `ctxengine bench` prints the peak.
    struct DeviceMemory {
        bool available = false;
        size_t current = 0, peak = 0;
    };
    virtual DeviceMemory device_memory() const { return {}; }
    // Marks on the backend's queue, for timing ops on a device without waiting for each
    // (ProfilingBackend, `ctxengine bench --profile`). timing_mark() queues a mark and returns
    // its index; timing_ms(a, b) waits until mark b has passed and returns the device
    // milliseconds from mark a to b; release_timing_marks() forgets every mark (their indices
    // start again at 0). A backend without a device clock (device_timing() false, the default)
    // refuses the other three: its ops finish before they return, so host time is their time.
    virtual bool device_timing() const { return false; }
    virtual int timing_mark();
    virtual double timing_ms(int from, int to);
    virtual void release_timing_marks();

    // ---- elementwise
    // out (n) = a + b  (writes; out may alias a or b)
    virtual void add(float* out, const float* a, const float* b, size_t n) = 0;
    // y (n) += x
    virtual void accumulate(float* y, const float* x, size_t n) = 0;
    // x (n) *= s
    virtual void scale(float* x, float s, size_t n) = 0;
    // sum of squares of x (n) in double
    virtual double sum_squares(const float* x, size_t n) = 0;

    // ---- token + position embedding
    // out (N, C) = wte[tokens[n]] (+ interp(wpe, positions[n]) if wpe != nullptr)   (writes)
    // interp: j = floor(p), f = p - j, row = (1-f) wpe[j] + f wpe[min(j+1, P-1)]; requires
    // 0 <= p <= P-1 (the model checks). tokens (N) int32 in [0, V), positions (N).
    // Vocabulary-parallel (shard.total > 0): wte (V, C) holds ids [shard.begin, shard.begin + V)
    // of shard.total; tokens (in [0, shard.total)) outside it contribute a zero row.
    virtual void embedding_forward(float* out, const int32_t* tokens, const float* positions,
                                   const float* wte, const float* wpe, int N, int C, int V,
                                   int P, VocabShard shard = {}) = 0;
    // dwte (V, C) += scatter(dout) (rows of this shard only); dwpe (P, C) += interp^T(dout)
    // when dwpe != nullptr
    virtual void embedding_backward(float* dwte, float* dwpe, const float* dout,
                                    const int32_t* tokens, const float* positions, int N, int C,
                                    int V, int P, VocabShard shard = {}) = 0;

    // ---- layer norm over the last dim
    // out (N, C) = (inp - mean) * rstd * w + b   (writes; b may be null); mean, rstd (N) saved
    virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                   const float* w, const float* b, int N, int C, float eps) = 0;
    // dinp (N, C) +=, dw (C) +=, db (C) += (db may be null)
    virtual void layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                                    const float* inp, const float* w, const float* mean,
                                    const float* rstd, int N, int C) = 0;

    // ---- RMS norm over the last dim (Llama-family blocks): layer norm without centering or bias
    // out (N, C) = inp * rstd * w (writes), rstd (N) = 1 / sqrt(mean(inp^2) + eps) saved
    virtual void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N,
                                 int C, float eps) = 0;
    // dinp (N, C) +=, dw (C) +=
    virtual void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                                  const float* w, const float* rstd, int N, int C) = 0;

    // ---- dense layer
    // out (N, OC) = inp (N, IC) @ W^T, W (OC, IC), + bias (OC) if non-null   (writes)
    virtual void matmul_forward(float* out, const float* inp, const float* W, const float* bias,
                                int N, int IC, int OC) = 0;
    // dinp (N, IC) += dout @ W (= with GradStore::Overwrite); dW (OC, IC) += dout^T @ inp;
    // dbias (OC) += colsum(dout) (dinp and dbias may be null)
    virtual void matmul_backward(float* dinp, float* dW, float* dbias, const float* dout,
                                 const float* inp, const float* W, int N, int IC, int OC,
                                 GradStore dinp_store = GradStore::Accumulate) = 0;

    // ---- dense layer with the residual add of a pre-norm block (the attention's and the MLP's
    // output projections): out (N, OC) = residual + inp @ W^T + bias (writes; out overlaps
    // neither inp nor residual). The default runs matmul_forward then add; CUDA adds the
    // residual in the product (cuBLASLt or cuBLAS with beta 1).
    virtual void matmul_residual_forward(float* out, const float* residual, const float* inp,
                                         const float* W, const float* bias, int N, int IC,
                                         int OC);

    // ---- dense layer and its activation in one op (the MLP's first product): pre (N, OC) =
    // inp @ W^T + bias (writes; kept for the backward pass), out = act(pre) (writes): (N, OC)
    // for GeluTanh, GeluErf and Relu, (N, OC / 2) for SwiGLU (pre = [gate | up], OC even). The
    // default runs matmul_forward then activation_forward or swiglu_forward; CUDA fuses GeluTanh
    // into the product (a cuBLASLt epilogue).
    virtual void matmul_activation_forward(float* pre, float* out, const float* inp,
                                           const float* W, const float* bias, int N, int IC,
                                           int OC, Activation act);
    // Its backward from the activation's gradient dact: dpre (N, OC) = the activation's
    // backward at pre (act'(pre) * dact; SwiGLU: swiglu_backward's rule, pre (N, OC) =
    // [gate | up], dact (N, OC / 2)), then matmul_backward(dinp, dW, dbias, dpre, inp, W, N,
    // IC, OC, dinp_store). dpre is the caller's (N, OC) scratch, overlapping no other argument.
    // The default writes it (activation_backward or swiglu_backward with Overwrite, then
    // matmul_backward); a backend may leave it unwritten and hand dpre to the products in
    // another form (CUDA in bf16: the activation kernel writes bf16(dpre) for the products and
    // the bias gradient's column sums, no fp32 dpre pass).
    virtual void activation_matmul_backward(float* dinp, float* dW, float* dbias, float* dpre,
                                            const float* dact, const float* pre,
                                            const float* inp, const float* W, int N, int IC,
                                            int OC, Activation act,
                                            GradStore dinp_store = GradStore::Accumulate);

    // ---- activation
    // out (n) = act(inp)   (writes)
    virtual void activation_forward(float* out, const float* inp, size_t n, Activation act) = 0;
    // dinp (n) += act'(inp) * dout (= with GradStore::Overwrite)
    virtual void activation_backward(float* dinp, const float* inp, const float* dout, size_t n,
                                     Activation act,
                                     GradStore store = GradStore::Accumulate) = 0;

    // ---- SwiGLU (Llama-family MLPs): inp (N, 2F) = [gate (F) | up (F)] per row, from one fused
    // product. out (N, F) = silu(gate) * up   (writes), silu(g) = g / (1 + exp(-g))
    virtual void swiglu_forward(float* out, const float* inp, int N, int F) = 0;
    // dinp (N, 2F) += [dout * up * silu'(gate) | dout * silu(gate)] (= with Overwrite)
    virtual void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F,
                                 GradStore store = GradStore::Accumulate) = 0;

    // ---- grouped-query attention (Llama 2/3, Mistral, Qwen2): the projection makes rows
    // grouped (N, (H + 2 Hkv) D) = [q (H heads) | k (Hkv heads) | v (Hkv heads)] with G = H / Hkv
    // query heads per key/value head. kv_repeat_forward writes qkv (N, 3 H D) = [q | k | v] with
    // query head h reading key/value head h / G, the layout every attention op takes.
    virtual void kv_repeat_forward(float* qkv, const float* grouped, int N, int H, int Hkv,
                                   int D) = 0;
    // dgrouped (N, (H + 2 Hkv) D) += dqkv mapped back: q as it is, each key/value head the sum
    // over the G query heads that read it.
    virtual void kv_repeat_backward(float* dgrouped, const float* dqkv, int N, int H, int Hkv,
                                    int D) = 0;

    // ---- contextual sparsity (Deja Vu): products over a per-row subset of a weight's rows.
    // idx (N, K) int32: row n's selected groups j in [0, M / G), -1 for none (skipped); group j
    // is the G consecutive rows [j G, (j + 1) G) of W (G = 1: MLP neurons, G = D: a head).
    // out[n * ldo + j G + g] = W[j G + g] . inp[n] + bias[j G + g] for every selected j, g < G;
    // the other entries of out are left as they were. inp (N, IC), W (M, IC), bias (M) or null.
    virtual void matmul_rows_forward(float* out, int ldo, const float* inp, const float* W,
                                     const float* bias, const int32_t* idx, int N, int IC,
                                     int K, int G) = 0;
    // out (N, OC) = bias + sum over selected j, g < G of h[n * ldh + j G + g] Wt[j G + g]
    // (writes; bias may be null): the second product of a sparse MLP (or the attention output
    // projection) with its weight stored transposed, Wt (M, OC), so a selected unit's weights
    // are one contiguous row.
    virtual void matmul_rows_project(float* out, const float* h, int ldh, const float* Wt,
                                     const float* bias, const int32_t* idx, int N, int OC,
                                     int K, int G) = 0;
    // idx (N, K) = per row of scores (N, M), the K highest (ties: the lower index), in
    // ascending index order, then -1 for those not above `threshold` (moved to the row's end);
    // threshold -inf keeps all K. K <= M. (A predictor's top-k, or its positive logits.)
    virtual void select_topk(int32_t* idx, const float* scores, int N, int M, int K,
                             float threshold) = 0;

    // ---- rotary position embedding, in place on the q and k thirds of qkv (B, T, 3C)
    // laid out [q(C) | k(C) | v(C)] per token, each C = H heads x D. positions (B, T).
    virtual void rotary_forward(float* qkv, const float* positions, int B, int T, int C, int H,
                                const RotarySpec& spec) = 0;
    // In place on dqkv: turns gradients w.r.t. the rotated q, k into gradients w.r.t. the
    // unrotated ones (the transpose of the forward map). v's gradient is left as it is.
    virtual void rotary_backward(float* dqkv, const float* positions, int B, int T, int C, int H,
                                 const RotarySpec& spec) = 0;

    // ---- causal multi-head attention with per-token float positions
    // qkv (B, T, 3C) after rotary; out (B, T, C) (writes); saved (writes): what backward needs,
    // per opt.mode (see AttentionMode): this backend's attention_saved_floats floats, whose
    // first ctx::attention_saved_floats(mode, B, T, H) are the probabilities or lse.
    // Logit(i, j) = q_i . k_j / sqrt(D) + bias_h(p_i - p_j).
    virtual void attention_forward(float* out, float* saved, const float* qkv,
                                   const float* positions, int B, int T, int C, int H,
                                   const AttentionOptions& opt) = 0;
    // dqkv (B, T, 3C) += (= with opt.dqkv_store Overwrite); bias parameter grads += (see
    // BiasSpec). saved: the forward's saved buffer; out: the forward's output (read in Flash
    // mode, may be null in Materialised mode). scratch: at least
    // attention_scratch_floats(B, T, C, H, opt.mode) floats. qkv: the forward's input, not read
    // where attention_backward_reads_qkv(opt.mode) is false (the forward saved what it needs).
    virtual void attention_backward(float* dqkv, float* scratch, const float* dout,
                                    const float* qkv, const float* saved, const float* out,
                                    const float* positions, int B, int T, int C, int H,
                                    const AttentionOptions& opt) = 0;
    virtual size_t attention_scratch_floats(int B, int T, int C, int H,
                                            AttentionMode mode) const = 0;
    // Floats of attention_forward's `saved` buffer: ctx::attention_saved_floats(mode, B, T, H),
    // or more where the backend keeps the operands its backward reads (packed bf16 q, k, v), so
    // that a caller need not keep qkv for the backward pass (attention_backward_reads_qkv).
    virtual size_t attention_saved_floats(AttentionMode mode, int B, int T, int C, int H) const = 0;
    virtual bool attention_backward_reads_qkv(AttentionMode mode) const = 0;
    // Whether attention_forward / attention_backward in `mode` apply `spec` themselves
    // (AttentionOptions::rotary): the caller then skips rotary_forward / rotary_backward and the
    // passes they make over q and k. The same values as those ops where it is true.
    virtual bool attention_fuses_rotary(AttentionMode mode, int C, int H,
                                        const RotarySpec& spec) const = 0;

    // ---- attention across blocks of a row (context parallelism: ring attention)
    // A rank's queries meet the key/value blocks of the ring one at a time; the blocks' results
    // merge by log-sum-exp, and the backward pass of each block needs only the merged out and
    // lse (as flash attention's tiles do). Key j is visible to query i when
    //   k.index[j] <= q.index[i]  (causal by global index in the whole row),
    //   k.index[j] > q.index[i] - opt.window  (opt.window > 0), and
    //   k.index[j] >= q.doc_start[i]  (packed rows, q.doc_start non-null),
    // and Logit(i, j) = q_i . k_j / sqrt(D) + bias_h(q.positions[i] - k.positions[j]) as in
    // attention_forward (a Table bias is (B, H, Tq, Tk) for this pair of blocks).
    // The default throws naming the backend (one without these ops cannot run the ring).
    // forward: q (B, Tq, 3C) rows whose q part is read; kv (B, Tk, 2C) = [k | v] of the key
    // block; out_b (B, Tq, C) = this block's softmax-weighted values, lse_b (B, H, Tq) its
    // log-sum-exp (writes; a query with no visible key gets 0 and -inf).
    virtual void attention_block_forward(float* out_b, float* lse_b, const float* q,
                                         const float* kv, const AttnBlockRows& qrows,
                                         const AttnBlockRows& krows, int B, int C, int H,
                                         const AttentionOptions& opt);
    // (out, lse) (B, Tq, C), (B, H, Tq) <- the merge with one block's (out_b, lse_b):
    // lse' = log(e^lse + e^lse_b), out' = e^(lse - lse') out + e^(lse_b - lse') out_b. Start
    // from out = 0, lse = -inf.
    virtual void attention_block_merge(float* out, float* lse, const float* out_b,
                                       const float* lse_b, int B, int Tq, int C, int H);
    // Backward of one block from the merged out and lse: P = exp(logit - lse),
    // Drow_i = dout_i . out_i, dS = P (dout v^T - Drow): dq (B, Tq, 3C; its q part) +=,
    // dkv (B, Tk, 2C) +=, the bias parameter gradients (opt.bias.da, db) +=, opt.bias.dtable
    // (B, H, Tq, Tk) += when given.
    virtual void attention_block_backward(float* dq, float* dkv, const float* dout,
                                          const float* q, const float* kv, const float* out,
                                          const float* lse, const AttnBlockRows& qrows,
                                          const AttnBlockRows& krows, int B, int C, int H,
                                          const AttentionOptions& opt);
    // Whether this backend implements `mode` for C / H head dims (flash kernels have a limit).
    virtual bool attention_mode_supported(AttentionMode mode, int C, int H) const = 0;
    // The mode to use when the caller leaves the choice to the backend ("auto").
    virtual AttentionMode attention_mode_auto(int T, int C, int H) const = 0;

    // ---- attention of new tokens over a key/value cache (generation: prefill and decode)
    // qkv (B, Tq, 3C): the newest Tq tokens of each row, q rotated (only q is read). kc, vc
    // (B, S, C): each row's cached rotated keys and values, entries [0, lens[b]) valid, the last
    // Tq of them the new tokens; kpos (B, S) their positions. Query i of row b is cache entry
    // c = lens[b] - Tq + i and attends entries j <= c (and j > c - window when window > 0) with
    // logit q.k_j / sqrt(D) + bias_h(kpos[c] - kpos[j]); a Table bias is read at
    // table[((b * H + h) * Tq + i) * S + j]. out (B, Tq, C) (writes). lens: host int32 (B), each
    // in [Tq, S]. scratch: attention_cached_scratch_floats(S) floats.
    virtual void attention_cached_forward(float* out, float* scratch, const float* qkv,
                                          const float* kc, const float* vc, const float* kpos,
                                          const int32_t* lens, int B, int Tq, int S, int C, int H,
                                          const AttentionOptions& opt) = 0;
    virtual size_t attention_cached_scratch_floats(int S) const = 0;

    // ---- softmax cross-entropy with explicit targets and a loss mask
    // losses (N) = mask[n] * -log softmax(logits[n])[targets[n]]   (writes)
    virtual void crossentropy_forward(float* losses, const float* logits, const int32_t* targets,
                                      const float* mask, int N, int V) = 0;
    // Fused forward + backward, in place: logits (N, V) become
    // dlogits = grad_scale * mask[n] * (softmax(logits[n]) - onehot(targets[n])), losses as
    // above. Rows with mask 0 get zero gradient.
    virtual void crossentropy_forward_backward(float* logits_to_dlogits, float* losses,
                                               const int32_t* targets, const float* mask, int N,
                                               int V, float grad_scale) = 0;
    // Vocabulary-parallel cross-entropy (Megatron): logits (N, V) are this rank's shard, ids
    // [shard.begin, shard.begin + V) of shard.total. Per row, stats (N, 3) = {m: max of the shard's
    // logits, z: sum over the shard of exp(logit - m), the target's logit if the shard holds it,
    // else 0}   (writes)
    virtual void crossentropy_shard_stats(float* stats, const float* logits,
                                          const int32_t* targets, int N, int V,
                                          VocabShard shard) = 0;
    // From every shard's stats (S, N, 3) (an all-gather of the above, in shard order), with
    // M = max_s m_s and Z = sum_s z_s exp(m_s - M): losses (N) = mask * (log Z + M - target
    // logit)   (writes). When logits_to_dlogits is not null, this shard's logits become
    // grad_scale * mask * (softmax - onehot) in place, softmax = exp(logit - M) / Z.
    virtual void crossentropy_shard_finish(float* losses, float* logits_to_dlogits,
                                           const float* all_stats, int S,
                                           const int32_t* targets, const float* mask, int N,
                                           int V, VocabShard shard, float grad_scale) = 0;

    // ---- the language-model head fused with the softmax cross-entropy (training and scoring):
    // logits = inp (N, C) @ W^T, W (V, C), computed for a chunk of rows at a time into scratch,
    // so the (N, V) logits never exist whole (at long context and large vocabularies they
    // outgrow every other activation: 16k tokens x 128k ids is 8 GiB in fp32). Per row n:
    //   losses[n] = mask[n] * -log softmax(logits[n])[targets[n]]   (writes)
    // and, when dinp is not null, with dlogits = grad_scale * mask * (softmax - onehot):
    //   dinp (N, C) += dlogits @ W;  dW (V, C) += dlogits^T @ inp  (when dW is not null).
    // targets and mask as in crossentropy_*; scratch: lm_head_scratch_floats(N, V) floats.
    // The chunks depend only on (N, V) and the backend, so a result repeats bit for bit. The
    // default composes matmul_forward, crossentropy_* and matmul_backward chunk by chunk.
    virtual void lm_head_loss(float* losses, float* dinp, float* dW, float* scratch,
                              const float* inp, const float* W, const int32_t* targets,
                              const float* mask, int N, int C, int V, float grad_scale);
    // Rows per chunk: as many as fit the backend's chunk budget of floats (min 1, max N), the
    // N rows split into equal chunks. CTX_LM_HEAD_CHUNK_MIB overrides the budget (MiB of fp32
    // logits per chunk; a positive integer).
    virtual int lm_head_chunk_rows(int N, int V) const;
    virtual size_t lm_head_scratch_floats(int N, int V) const;

    // ---- bf16 activation storage (a Precision::Bf16 backend whose bf16_activations() is true)
    // The activations whose only readers are matrix products (the norms' outputs, the MLP's
    // activation) are kept in bf16: the op that makes them rounds them (round-to-nearest-even)
    // as it writes, so the products read them with no rounding pass, and they take half the
    // memory. Each *_bf16 op below is its fp32 namesake with that one operand in bf16, and
    // gives the bits that op gives on the same backend with the operand rounded first (for
    // matmul_activation_forward_bf16: to within one bf16 rounding of its output). The MLP's
    // `pre` is stored in bf16 too: its readers are the activation (which the forward op applies
    // to the fp32 value before rounding it) and the backward's activation derivative. The
    // defaults refuse; backend/operand.h picks the op for a buffer's storage.
    virtual bool bf16_activations() const { return false; }
    virtual void layernorm_forward_bf16(Bf16* out, float* mean, float* rstd, const float* inp,
                                        const float* w, const float* b, int N, int C, float eps);
    virtual void rmsnorm_forward_bf16(Bf16* out, float* rstd, const float* inp, const float* w,
                                      int N, int C, float eps);
    virtual void activation_forward_bf16(Bf16* out, const float* inp, size_t n, Activation act);
    virtual void swiglu_forward_bf16(Bf16* out, const float* inp, int N, int F);
    virtual void matmul_forward_bf16(float* out, const Bf16* inp, const float* W,
                                     const float* bias, int N, int IC, int OC);
    // out = residual + inp @ W^T + bias. The default runs matmul_forward_bf16 then add.
    virtual void matmul_residual_forward_bf16(float* out, const float* residual, const Bf16* inp,
                                              const float* W, const float* bias, int N, int IC,
                                              int OC);
    // p = inp @ W^T + bias in fp32, then pre = bf16(p) and out = bf16(act(p)) (SwiGLU as in
    // matmul_activation_forward): out has the bits of matmul_activation_forward's out rounded
    // (to within one bf16 rounding where that one takes GELU from cuBLASLt's epilogue).
    virtual void matmul_activation_forward_bf16(Bf16* pre, Bf16* out, const Bf16* inp,
                                                const float* W, const float* bias, int N, int IC,
                                                int OC, Activation act);
    virtual void matmul_backward_bf16(float* dinp, float* dW, float* dbias, const float* dout,
                                      const Bf16* inp, const float* W, int N, int IC, int OC,
                                      GradStore dinp_store = GradStore::Accumulate);
    // pre (the bf16 values stored by matmul_activation_forward_bf16) and inp in bf16: the bits
    // of activation_matmul_backward on the same backend given those values in fp32.
    virtual void activation_matmul_backward_bf16(float* dinp, float* dW, float* dbias,
                                                 float* dpre, const float* dact,
                                                 const Bf16* pre, const Bf16* inp,
                                                 const float* W, int N, int IC, int OC,
                                                 Activation act,
                                                 GradStore dinp_store = GradStore::Accumulate);
    virtual void lm_head_loss_bf16(float* losses, float* dinp, float* dW, float* scratch,
                                   const Bf16* inp, const float* W, const int32_t* targets,
                                   const float* mask, int N, int C, int V, float grad_scale);
    // The MLP's backward in one op (MlpBackwardBf16): fc_proj's, then the activation's and fc's.
    // The default runs matmul_backward_bf16(dact, dW_proj, db_proj, dout, act_out, W_proj, N,
    // OA, OP, Overwrite) and activation_matmul_backward_bf16(dinp, dW_fc, db_fc, dpre, dact, pre,
    // inp, W_fc, N, IC, OC, act, dinp_store), OA = OC (OC / 2 for SwiGLU); a backend may make
    // fc's gradient another way and leave dact and dpre unwritten (CUDA, GELU tanh: its
    // derivative in the epilogue of the product that makes dact: within a bf16 rounding).
    virtual void mlp_backward_bf16(const MlpBackwardBf16& m);
    // The attention output in bf16, where attention_out_bf16(mode): its readers are the
    // output projection (a product) and the backward's rowsum(dout * out). The forward writes
    // out rounded (the bits of attention_forward's out rounded; saved the same), the backward
    // reads it as stored.
    virtual bool attention_out_bf16(AttentionMode) const { return false; }
    virtual void attention_forward_bf16(Bf16* out, float* saved, const float* qkv,
                                        const float* positions, int B, int T, int C, int H,
                                        const AttentionOptions& opt);
    virtual void attention_backward_bf16(float* dqkv, float* scratch, const float* dout,
                                         const float* qkv, const float* saved, const Bf16* out,
                                         const float* positions, int B, int T, int C, int H,
                                         const AttentionOptions& opt);

    // ---- optimizer
    // AdamW with decoupled weight decay on n contiguous floats:
    //   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  mhat = m/(1-b1^t);  vhat = v/(1-b2^t)
    //   p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p)
    virtual void adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                              const AdamWParams& hp) = 0;
    // The same over many pieces of the same arrays (a parameter arena's tensors) in one call:
    // each element of segment s as adamw_update with hp.weight_decay if s.decay, else 0.
    // Elements outside the segments are not touched. The default calls adamw_update per
    // segment; the CUDA backend makes it one launch (a step of GPT-2 124M had 148).
    virtual void adamw_update_segments(float* params, const float* grads, float* m, float* v,
                                       const std::vector<AdamWSegment>& segments,
                                       const AdamWParams& hp);
};

std::unique_ptr<Backend> make_cpu_backend(int threads);
// A cap on the bytes the CPU backends of this process hold at once (0: none, the default):
// an allocation beyond it fails with a message naming the cap (ctxengine
// --backend-memory-limit), as a device's memory would. For runs that must fit a budget, and
// to show what context or tensor parallelism makes fit.
void set_cpu_memory_limit(size_t bytes);
size_t cpu_memory_in_use();  // bytes the CPU backends hold now
// Defined by backend/cuda when built with CUDA; otherwise a stub that throws
// ctx::Error("ctxengine was built without CUDA ...").
std::unique_ptr<Backend> make_cuda_backend(int device, Precision precision = Precision::Fp32);
bool cuda_backend_available();
// Number of visible CUDA devices (0 without CUDA or without a GPU).
int cuda_device_count();

// The sm_90 warpgroup tensor-core instruction (wgmma; backend/cuda/cuda_wgmma.cuh) through a
// plain product on device memory, the check of its operand layouts (shared-memory descriptors,
// register A fragments, accumulators, scale-d) on a GPU and under the emulation before kernels
// are built on it: C (M x N, fp32, row-major) = A (M x K) B^T (+ C with accumulate), A (M x K)
// and B (N x K) row-major bf16 bit patterns; with b_n_major, C = A B for B (K x N) row-major
// (read N-major, as O = P V reads V). M a multiple of 64, N of n_tile (32, 64 or 128), K of 16 in
// [16, 256], pointers 16-byte aligned. cuda_has_wgmma: the device runs it (compute capability
// 9.0 and a build with CUDA); cuda_wgmma_gemm throws ctx::Error where it does not. With tma,
// the operands come in by the tensor memory accelerator into 128-byte swizzled tiles (the
// layout, copies and barriers of TMA-fed kernels, backend/cuda/cuda_tma.cuh): K then a multiple
// of 64 up to 256 and M any positive count.
struct WgmmaGemmOptions {
    int n_tile = 64;                // columns of C per block: 64 or 128 (or 32 without tma)
    bool a_from_registers = false;  // A as register fragments (wgmma_rs) instead of a descriptor
    bool b_n_major = false;         // B given K x N and read N-major (transposed B)
    bool accumulate = false;        // C += A B^T instead of C = A B^T
    bool tma = false;               // operands by TMA, read with the 128-byte swizzle
};
bool cuda_has_wgmma(int device);
void cuda_wgmma_gemm(float* C, const uint16_t* A, const uint16_t* B, int M, int N, int K,
                     const WgmmaGemmOptions& options);

}  // namespace ctx
