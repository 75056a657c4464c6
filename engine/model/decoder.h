// The decoder: explicit forward and backward over one parameter arena (llm.c), with positional
// encodings supplied by a PE plugin through the input / rotary / bias hooks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/rng.h"
#include "data/batch.h"
#include "model/arena.h"
#include "model/attention_step.h"
#include "model/block.h"
#include "model/config.h"
#include "model/generic_bias.h"
#include "model/host_span.h"
#include "model/ring_attention.h"
#include "model/tensor_parallel.h"
#include "parallel/comm.h"
#include "plugin/pe_plugin.h"

namespace ctx {

// Which attention implementation the model asks its backend for (a runtime choice, not part of
// the checkpoint). Auto: the backend's preference (flash on CUDA, materialised on the CPU).
enum class AttentionChoice { Auto = 0, Materialised = 1, Flash = 2 };
AttentionChoice attention_choice_from_name(const std::string& name);  // auto|materialised|flash
const char* attention_choice_name(AttentionChoice c);

// Called by the backward pass with ranges of the gradient arena that no later op of the step
// writes (one block of layers at a time, then the rest), so a data-parallel reducer can start
// summing them while the backward pass goes on.
using GradReadyHook = std::function<void(float* grads, size_t n)>;

struct LossSums {
    double loss_sum = 0;  // sum over tokens of mask * nll
    double mask_sum = 0;  // sum of the mask
    double mean() const { return mask_sum > 0 ? loss_sum / mask_sum : 0.0; }
};

class Model {
public:
    // pe may be null (NoPE). Parameters are initialised from seed (GPT-2 scheme; PE parameters
    // by their declarations). tp_comm: the tensor-parallel group (model/tensor_parallel.h) that
    // splits this model's matrices; null or of one rank: the whole model on this rank. The same
    // seed gives the same whole model at any tp.
    Model(const ModelConfig& config, Backend& backend, std::unique_ptr<PePlugin> pe,
          uint64_t seed, Comm* tp_comm = nullptr);
    ~Model();

    const ModelConfig& config() const { return config_; }
    Backend& backend() const { return *backend_; }
    PePlugin* pe() const { return pe_.get(); }
    // Swaps the PE for another one without trainable parameters (the current one has none
    // either): a RoPE with another base or scaling, for base-frequency adjustment or a factor
    // search. Throws ctx::Error naming the PE that has parameters.
    void replace_pe(std::unique_ptr<PePlugin> pe);
    // Swaps the MLP activation for another elementwise one (gelu_tanh, gelu_erf, relu), the
    // parameters unchanged: the first step of fine-tuning a model into ReLU form, where
    // contextual sparsity is exact (model/sparsity.h). SwiGLU, which has other shapes, is
    // refused either way.
    void set_activation(Activation act);
    const ArenaLayout& layout() const { return layout_; }
    Arena& params() { return params_; }
    const Arena& params() const { return params_; }
    Arena& grads() { return grads_; }
    const Arena& grads() const { return grads_; }
    // Number of trainable scalars of the whole model (alignment padding excluded; under tensor
    // parallelism all ranks' parts together).
    size_t num_params() const;

    // ---- tensor parallelism. layout(), params() and grads() are this rank's part; these see
    // the whole model (the same as layout() at tp = 1).
    const TensorShard& shard() const { return shard_; }
    TensorGroup& tensor_group() { return tp_; }
    bool tensor_parallel() const { return tp_.active(); }
    // Sequence parallelism (Megatron-LM; needs tp > 1): training and evaluation passes keep
    // this rank's N / tp rows of the residual stream, the norms run on them, and each
    // tensor-parallel region is entered by an all-gather and left by a reduce-scatter. Passes
    // need B x T divisible by tp. Generation steps run without it.
    void set_sequence_parallel(bool on);
    bool sequence_parallel() const { return tp_.sequence_parallel(); }
    // Context parallelism (ring attention, model/ring_attention.h; CPU backend): with a group of
    // cp > 1 ranks, forward() and forward_backward() take the whole batch on every rank of the
    // group, and each runs its zigzag share of every row's tokens (T / cp of them; T divisible
    // by 2 cp), so activations per rank shrink by cp. Losses and logits are gathered, so callers
    // see the whole rows; parameter gradients are each rank's share (sum them over the group
    // with the data-parallel ones). Null or one rank: off. Not with sequence parallelism yet.
    void set_context_parallel(Comm* cp);
    bool context_parallel() const { return cp_ != nullptr; }
    // The whole model's layout: the views of layout() with their whole shapes, in the same order.
    const ArenaLayout& full_layout() const { return full_layout_; }
    const ShardSpec& shard_spec(size_t view) const { return shard_specs_[view]; }
    // The whole tensors of `local` (an arena or host array in layout()'s layout: parameters,
    // gradients, moments) on the host, in full_layout()'s layout. Collective over the group.
    std::vector<float> gather_full(const Arena& local) const;
    std::vector<float> gather_full_host(const float* local) const;
    // This rank's part of whole tensors (host, full_layout()'s layout) into `local`.
    void scatter_full(const float* whole, Arena& local) const;
    void scatter_full_host(const float* whole, float* local) const;
    // Ranges [begin, end) of the gradient arena this rank counts in the global gradient norm:
    // split tensors on every rank, replicated ones on tensor-parallel rank 0 only (their
    // gradients are the same on every rank). The norm is the sum over the group.
    const std::vector<std::pair<size_t, size_t>>& norm_ranges() const { return norm_ranges_; }

    // Sizes activation buffers for rows of up to B x T tokens (whole rows: under context
    // parallelism this rank keeps T / cp of each). Called by forward when needed; call it up
    // front so no step allocates.
    void reserve(int B, int T);

    // Forward only: per-token losses (B*T) are kept (losses()), logits are not.
    LossSums forward(const Batch& batch);
    // Forward + backward. Gradients ACCUMULATE into grads() (the caller zeroes them); the loss
    // gradient is grad_scale * d(sum of masked token losses), so grad_scale = 1 / (global number
    // of trained tokens) gives the gradient of the mean loss.
    LossSums forward_backward(const Batch& batch, float grad_scale);
    // Per-token masked losses of the last forward, (B, T), host memory.
    const float* losses() const { return losses_host_.data(); }
    // Logits (B, T, V) of the last pass (forward() or forward_backward()), on the host,
    // recomputed from its kept final-norm output: a chunk of rows at a time (the passes never
    // hold all of them), or under tensor parallelism each rank's vocabulary columns, gathered
    // (collective).
    std::vector<float> logits(const Batch& batch) const;
    // Per token of the last pass (B, T), the id of its largest logit (the first of equal ones),
    // computed a chunk of rows at a time: the host never holds the whole (B, T, V) logits
    // (gathered first under tensor or context parallelism; collective there).
    std::vector<int32_t> argmax(const Batch& batch) const;
    // out (rows, V) host = the whole vocabulary's columns of `local` (rows, this rank's V),
    // backend memory; collective over the tensor-parallel group.
    void gather_vocab_columns(const float* local, size_t rows, float* out) const;

    // Attention limited to the last `window` tokens of each row by index (0: full causal). For
    // the "windowed" evaluation control; applies to forward and backward until changed.
    void set_attention_window(int window);
    int attention_window() const { return attention_window_; }

    // Attention implementation; throws when the backend cannot run the chosen mode for this
    // model's head dim. Activation buffers are resized on the next pass.
    void set_attention_choice(AttentionChoice choice);
    AttentionChoice attention_choice() const { return attention_choice_; }
    AttentionMode attention_mode() const { return attention_mode_; }

    // See GradReadyHook; an empty hook (the default) is never called.
    void set_grad_ready_hook(GradReadyHook hook) { grad_ready_ = std::move(hook); }

    // Plugin hook after the optimizer changed parameters (e.g. KERPLE clamping).
    void after_update();

    // Extends the context Lt -> new_len through the PE plugin (APE interpolation, ...).
    // Parameters whose shape changed are rebuilt; their AdamW moments in m, v (same layout as
    // params) are reset to zero and the others are kept: pass the optimizer's moment arenas.
    void extend(int new_len, Arena* adam_m, Arena* adam_v);

    // Floating point operations of one training step per token (llm.c: 6N + 6 L C T).
    double flops_per_token(int T) const;

    // ---- the stages of the stack, for every pass that runs it (forward and backward here,
    // KvGenerator's cached steps). N tokens; buffers are the caller's, device memory.
    const TransformerBlock& block() const { return block_; }
    BlockWeights layer_weights(int l) const { return layer(l, params_); }
    // x (N, C) = wte[tokens] (+ the input PE at positions) (-> embedding layernorm). encoded
    // (N, C) and mean, rstd (N) are kept for backward. tokens: host (N); positions: device (N),
    // positions_host the same on the host (a generic input PE runs there).
    void embed(float* x, float* encoded, float* mean, float* rstd, const int32_t* tokens,
               const float* positions, const float* positions_host, int N);
    // logits (N, V) = head(final layernorm(x (N, C))); ln (N, C), mean, rstd (N) kept.
    void head(float* logits, Operand ln, float* mean, float* rstd, const float* x, int N);
    // The final norm alone (head's first half): ln (N, C), mean, rstd (N).
    void head_norm(Operand ln, float* mean, float* rstd, const float* x, int N);
    const float* head_weight() const;  // (V, C): wte when tied, else lm_head.weight
    // The last pass's logits, N rows, recomputed a chunk at a time from the kept final norm (not
    // tensor-parallel): each chunk into dst + r0 V when dst is given, then f(r0, n, its rows).
    void logit_chunks(size_t N, float* dst,
                      const std::function<void(size_t, size_t, const float*)>& f = {}) const;
    // The checks every row passes before it runs: tokens (and targets, when given) in the
    // vocabulary, positions finite, >= 0 and within a learned table. Host memory, n tokens of
    // row `row` starting at column first_col (for the messages).
    void check_row(const int32_t* tokens, const int32_t* targets, const float* positions, int n,
                   int row, int first_col) const;
    // The PE's rotation for rows of T tokens (rotary_dims 0 without a rotary PE).
    RotarySpec rotary_spec(int T);
    // The PE's attention bias for rows of T tokens with its parameters' gradients; a generic
    // bias is a Table over this model's (B, H, T, T) training table.
    BiasSpec bias_spec(int T);
    bool bias_is_generic() const { return bias_generic_; }
    // Generic bias: table (rows, H, Tq, S) device memory, filled for the pairs packed in `pairs`
    // (see GenericBiasPairs) from the PE's current parameters.
    void fill_bias_table(GenericBiasPairs& pairs, float* table, int rows, int Tq, int S);

private:
    struct Acts;   // activation buffers
    void build_layout();
    void build_layout_for(const TensorShard& s, ArenaLayout& out, std::vector<ShardSpec>* specs,
                          std::vector<size_t>* pe_index) const;
    void cross_entropy(bool train, int N, float grad_scale);
    void init_params(uint64_t seed);
    BlockWeights layer(int l, const Arena& a) const;
    BlockActs layer_acts(int l, int B, int T) const;
    void check_batch(const Batch& b) const;
    LossSums run_pass(const Batch& b, bool train, float grad_scale);
    LossSums run_pass_cp(const Batch& b, bool train, float grad_scale);
    LossSums run_pass_cp_padded(const Batch& b, bool train, float grad_scale);
    AttentionStep& attention_step();
    BlockBias block_bias();
    void forward_impl(const Batch& b);
    void backward_impl(const Batch& b);
    void stage_batch(const Batch& b);
    // The PE parameters as plugin tensors over `base`, which holds the PE span of an arena
    // (pe_span()): the arena memory itself on the CPU backend, a host copy on others.
    std::vector<ctx_tensor> pe_tensors(float* base) const;
    size_t pe_begin() const;  // arena offset where the PE parameters start (they come last)
    // The PE parameters' span of `a` (params, grads or a new arena) as host memory, read in.
    HostSpan pe_span(const Arena& a) const;
    void announce_grads(size_t begin, size_t end);
    bool pe_bias_is_generic();
    int64_t input_table_rows() const;  // rows of a learned input table, -1 without one

    ModelConfig config_;
    Backend* backend_;
    std::unique_ptr<PePlugin> pe_;
    TensorShard shard_;  // this rank's part (tp = 1: the whole model)
    TensorGroup tp_;
    ArenaLayout layout_;
    ArenaLayout full_layout_;
    std::vector<ArenaLayout> rank_layouts_;  // every tensor-parallel rank's layout (sizes differ
                                             // when tp does not divide the vocabulary)
    std::vector<ShardSpec> shard_specs_;  // per view of layout_
    std::vector<std::pair<size_t, size_t>> norm_ranges_;
    Arena params_, grads_;
    std::vector<size_t> pe_view_index_;  // plugin parameter i -> index in layout_.views()
    // Arena offset of layer l's first parameter (l < L) and of what follows the layers (l = L):
    // layer l's parameters (and gradients) are [layer_offsets_[l], layer_offsets_[l + 1]).
    std::vector<size_t> layer_offsets_;
    ctx_input_spec input_spec_{};
    TransformerBlock block_;
    // The attention step of the current forward pass, reused by its backward pass.
    CausalAttention attention_;
    // Context parallelism: the group, its ring step, this rank's share of the batch, and the
    // whole batch of the pass (host; every rank of the group has it).
    Comm* cp_ = nullptr;
    std::unique_ptr<RingAttention> ring_;
    BatchBuffers cp_local_, cp_padded_;  // this rank's tokens; rows padded to 2 cp chunks
    int cp_padded_T_ = 0;  // the padded length of the last pass's rows (0: not padded)
    std::vector<float> cp_losses_, cp_losses_all_;  // this rank's losses, every rank's
    const Batch* cp_whole_ = nullptr;
    // Generic bias (CTX_BIAS_GENERIC): the causal pairs of the batch (sized by reserve()) and
    // host staging of a (rows, H, Tq, S) table for non-CPU backends, and of all heads' table
    // under tensor parallelism (each rank keeps its heads).
    bool bias_generic_ = false;
    GenericBiasPairs bias_pairs_;
    std::vector<float> bias_stage_, bias_all_heads_;
    int reserved_B_ = 0, reserved_T_ = 0;
    int attention_window_ = 0;
    AttentionChoice attention_choice_ = AttentionChoice::Auto;
    AttentionMode attention_mode_ = AttentionMode::Materialised;
    GradReadyHook grad_ready_;
    std::unique_ptr<Acts> acts_;
    std::vector<float> losses_host_;
};

}  // namespace ctx
