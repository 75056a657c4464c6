// Greedy generation with a key/value cache (issue: long-context evaluation). The same blocks as
// Model::forward, run over only the newest tokens of each row while earlier keys and values come
// from a cache, so every step costs O(length) instead of O(length^2).
//
// Positions continue from the prompt: a prompt's tokens sit at its positions (default 0 .. n-1)
// and generated token k at last prompt position + k + 1, under the model's PE (learned tables,
// scaled RoPE, bias families, generic PEs). The result equals recomputing the whole sequence
// without a cache at every step. Length-dependent RoPE scaling (dynamic NTK) is the exception a
// cache cannot follow: when a row's length changes its rotation, every cached key and every
// hidden state behind the deeper layers' keys and values belong to the old rotation. By default
// such a row is recomputed from its tokens at that step (exact, O(n^2) while the length keeps
// changing the rotation); DynamicRope::Keep keeps the cache as it is and rotates only new
// tokens with the current scaling, as HF transformers' cached generation does.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/decoder.h"

namespace ctx {

// The cache and step machinery: rows are filled by prefill() (one prompt at a time, rows of
// different lengths) and advanced together by decode().
enum class DynamicRope { Recompute, Keep };

class SparsityPredictors;

// Contextual sparsity in decode steps (model/sparsity.h): each new token runs the top-scoring
// (1 - units) of the MLP hidden units and (1 - heads) of the heads by the predictors'
// scores. units_positive (ReLU models): of those, only units with a positive score (predicted
// active), which with units = 0 is every predicted-active unit. Prefill stays dense.
struct SparsityOptions {
    const SparsityPredictors* predictors = nullptr;  // null: dense
    float units = 0.0f;  // fraction of MLP hidden units skipped, in [0, 1)
    float heads = 0.0f;  // fraction of heads skipped, in [0, 1)
    bool units_positive = false;
};

// Called after each block of a step (layer, its activations with ln1 kept apart, N tokens).
using LayerObserver = std::function<void(int layer, const BlockActs& acts, int N)>;

class KvGenerator {
public:
    // Room for `rows` rows of up to `max_len` tokens each (prompt + generated). window > 0
    // limits attention to the last `window` tokens (the windowed control).
    KvGenerator(Model& model, int rows, int max_len, int window = 0,
                DynamicRope dynamic = DynamicRope::Recompute);
    ~KvGenerator();
    KvGenerator(const KvGenerator&) = delete;
    KvGenerator& operator=(const KvGenerator&) = delete;

    // Empties row r and runs its prompt (n >= 1 tokens at positions, strictly increasing floats
    // >= 0; nullptr: 0 .. n-1). Afterwards logits(r) are the next-token logits.
    void prefill(int r, const int32_t* tokens, const float* positions, int n);
    // Appends tokens[r] at positions[r] to every row (all rows must be prefilled) and computes
    // each row's next-token logits.
    void decode(const int32_t* tokens, const float* positions);

    const float* logits(int r) const;  // (V) of row r's newest token, host memory
    int length(int r) const { return lens_[static_cast<size_t>(r)]; }
    float last_position(int r) const;
    int rows() const { return rows_; }
    int max_len() const { return max_len_; }
    int64_t recomputed_rows() const { return recomputed_; }  // DynamicRope::Recompute events

    // Checks the options against the model (shapes, fractions; no tensor parallelism) and
    // prepares the transposed output weights the sparse products read.
    void set_sparsity(const SparsityOptions& options);
    void set_layer_observer(LayerObserver observer) { observer_ = std::move(observer); }

private:
    struct Buffers;
    struct Sparse;
    // Predicts layer l's selection (units and heads) of a decode step from z (N, C).
    void predict(int l, const float* z, int N);
    BlockSparsity block_sparsity(int l) const;  // what predict() chose, for layer l's block
    // Runs the blocks over Tq new tokens of rows [r0, r0 + nb) whose tokens/positions are
    // already in the cache slots lens - Tq .. lens - 1 (lens already advanced).
    void step(int r0, int nb, int Tq, const int32_t* tokens);

    Model& m_;
    int rows_, max_len_, window_;
    DynamicRope dynamic_;
    int64_t recomputed_ = 0;
    std::vector<int32_t> lens_;
    std::unique_ptr<Buffers> buf_;
    std::unique_ptr<Sparse> sparse_;
    LayerObserver observer_;
};

struct GenerateOptions {
    int max_new_tokens = 32;
    std::vector<int32_t> stop_tokens;       // a row ends when it produces one (not kept)
    std::vector<std::string> stop_strings;  // a row ends when its decoded text contains one
    // Turns generated tokens into text (needed for stop_strings; fills GenerateResult::text).
    std::function<std::string(const std::vector<int32_t>&)> decode;
    int window = 0;  // attend only to the last `window` tokens (0: all); the windowed control
    DynamicRope dynamic_rope = DynamicRope::Recompute;
    SparsityOptions sparsity;  // contextual sparsity of decode steps (default: dense)
};

struct GenerateResult {
    enum class Finish { Length, StopToken, StopString };
    std::vector<int32_t> tokens;  // generated tokens (without the stop token)
    Finish finish = Finish::Length;
    std::string text;             // decode(tokens), cut before the stop string (with decode)
};

const char* finish_name(GenerateResult::Finish f);  // "length" | "stop_token" | "stop_string"

// Teacher-forced decoding: each row's first `prefix` tokens are prefilled, then its true tokens
// go through decode steps one at a time (all rows together), summing -log p(the next true
// token) over the decoded positions. It scores exactly what generation computes (the cache,
// contextual sparsity), and times the decode steps alone. Rows: equal lengths > prefix.
struct DecodeScore {
    double nll_sum = 0;   // over the scored tokens
    int64_t tokens = 0;   // scored tokens: rows x (length - prefix)
    int64_t decoded = 0;  // tokens that went through decode steps
    double decode_seconds = 0;  // wall time of the decode steps (prefill excluded)
    double perplexity() const;
    double decode_tokens_per_s() const;
};
DecodeScore score_by_decoding(Model& model, const std::vector<std::vector<int32_t>>& rows,
                              int prefix, const SparsityOptions& sparsity = {});

// The general form: B rows of T input tokens (host, (B, T)) at positions (null: 0 .. T-1) with
// their targets; the first `prefix` tokens of each row are prefilled and the rest decoded one
// step at a time (window > 0: the windowed control). logprobs (B, T) = log p(targets[t] |
// tokens[0..t]) and argmax (B, T) (may be null) for t >= prefix - 1; entries before are 0.
// The DecodeScore sums over the same entries. Evaluation tasks score rows this way when they
// run with sparsity (eval/eval_plugin.h), so perplexity and recall see the sparse model.
struct DecodeRows {
    int B = 0, T = 0;
    const int32_t* tokens = nullptr;
    const float* positions = nullptr;
    const int32_t* targets = nullptr;
};
DecodeScore decode_rows(Model& model, const DecodeRows& rows, int prefix, int window,
                        const SparsityOptions& sparsity, float* logprobs, int32_t* argmax);

// Greedy (argmax, lowest id on ties) generation for a batch of prompts of any lengths.
// positions: per prompt, or empty for 0 .. n-1.
std::vector<GenerateResult> generate(Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                     const GenerateOptions& options,
                                     const std::vector<std::vector<float>>& positions = {});

}  // namespace ctx
