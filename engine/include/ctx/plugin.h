/*
 * ctxengine plugin ABI (C, stable).
 *
 * A plugin is a shared library that exports one function:
 *
 *     const ctx_plugin_descriptor* ctx_plugin_query(void);
 *
 * The descriptor's first two fields are the ABI version the plugin was built against. The host
 * rejects a plugin whose major differs from its own, or whose minor is newer than its own, and
 * says both versions. Rules that keep old plugins loadable:
 *   - structs carry `struct_size` and new fields are only appended;
 *   - vtable slots are only appended; a NULL slot means "not provided";
 *   - no C++ exception crosses this boundary: every call returns ctx_status and, on failure, writes
 *     a message into the ctx_err the host passed in.
 * Everything a plugin needs from the host (logging, options, random numbers) comes through
 * ctx_host_api, so a plugin links against nothing but libc/libm.
 *
 * Tensors handed across the ABI are fp32 host memory (ctx_tensor). The engine owns all parameter
 * storage: a plugin declares its parameters (name, shape) through host->register_param while it is
 * created, and receives views into the engine's parameter and gradient arenas in every later call.
 */
#ifndef CTX_PLUGIN_H
#define CTX_PLUGIN_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CTX_PLUGIN_ABI_MAJOR 1
#define CTX_PLUGIN_ABI_MINOR 4

/* Bytes a struct must have for `field` to be present: the offset where `field` ends. Structs
 * only grow at the end, so `x->struct_size >= CTX_OFFSET_END(type, field)` says whether the
 * other side was built with `field`. */
#define CTX_OFFSET_END(type, field) (offsetof(type, field) + sizeof(((type*)0)->field))

#if defined(_WIN32)
#define CTX_PLUGIN_EXPORT __declspec(dllexport)
#else
#define CTX_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* ---------------------------------------------------------------- status and errors */
typedef enum ctx_status {
    CTX_OK = 0,
    CTX_ERR_INVALID_ARGUMENT = 1, /* bad option value, shape mismatch, position out of range */
    CTX_ERR_UNSUPPORTED = 2,      /* the call is valid but this plugin cannot do it */
    CTX_ERR_OUT_OF_MEMORY = 3,
    CTX_ERR_INTERNAL = 4
} ctx_status;

#define CTX_ERR_MESSAGE_CAP 512
typedef struct ctx_err {
    char message[CTX_ERR_MESSAGE_CAP]; /* NUL-terminated; the host prefixes the plugin name */
} ctx_err;

/* ---------------------------------------------------------------- tensors */
typedef enum ctx_dtype { CTX_F32 = 0 } ctx_dtype;

typedef struct ctx_tensor {
    float* data;       /* host memory, row-major, contiguous */
    int32_t dtype;     /* ctx_dtype; always CTX_F32 in ABI 1.x */
    int32_t ndim;      /* 1..4 */
    int64_t shape[4];  /* unused trailing entries are 1 */
} ctx_tensor;

/* ---------------------------------------------------------------- options */
typedef enum ctx_option_type {
    CTX_OPT_NUMBER = 1,  /* Lua number (integers accepted) */
    CTX_OPT_INTEGER = 2, /* Lua integer, or a float with an integral value */
    CTX_OPT_BOOL = 3,
    CTX_OPT_STRING = 4,
    CTX_OPT_NUMBER_LIST = 5 /* Lua sequence of numbers */
} ctx_option_type;

/* A declared option. The host validates the recipe's table against this list before create():
 * unknown keys and wrong types are reported with the recipe's file:line. */
typedef struct ctx_option_desc {
    const char* name;
    int32_t type;              /* ctx_option_type */
    const char* default_value; /* printable default for --list-plugins, may be NULL */
    const char* help;
} ctx_option_desc;

/* Opaque, owned by the host, and valid only during create(): read every option there. */
typedef struct ctx_options ctx_options;

/* ---------------------------------------------------------------- host services */
typedef enum ctx_log_level {
    CTX_LOG_DEBUG = 0,
    CTX_LOG_INFO = 1,
    CTX_LOG_WARN = 2,
    CTX_LOG_ERROR = 3
} ctx_log_level;

typedef enum ctx_param_init {
    CTX_INIT_ZEROS = 0,
    CTX_INIT_NORMAL = 1,  /* N(0, init_scale^2) */
    CTX_INIT_UNIFORM = 2, /* U(init_lo, init_hi) */
    CTX_INIT_PLUGIN = 3   /* the plugin's init_params() fills it */
} ctx_param_init;

typedef struct ctx_param_desc {
    uint32_t struct_size;
    const char* name; /* unique within the plugin, e.g. "wpe" */
    int32_t ndim;
    int64_t shape[4];
    int32_t init;           /* ctx_param_init */
    float init_scale;       /* for CTX_INIT_NORMAL */
    float init_lo, init_hi; /* for CTX_INIT_UNIFORM */
    int32_t weight_decay;   /* 1: AdamW decays it; 0: it does not */
} ctx_param_desc;

typedef struct ctx_host_api {
    uint32_t struct_size;
    uint32_t abi_major, abi_minor; /* the host's version */
    void* host;                    /* pass back as the first argument of every callback */

    void (*log)(void* host, int32_t level, const char* message);

    /* Options. Absent keys return the default. Types were validated against the descriptor. */
    int32_t (*opt_has)(void* host, const ctx_options* opts, const char* key);
    double (*opt_number)(void* host, const ctx_options* opts, const char* key, double dflt);
    int64_t (*opt_integer)(void* host, const ctx_options* opts, const char* key, int64_t dflt);
    int32_t (*opt_bool)(void* host, const ctx_options* opts, const char* key, int32_t dflt);
    /* The returned string lives as long as opts. */
    const char* (*opt_string)(void* host, const ctx_options* opts, const char* key, const char* dflt);
    /* Copies up to cap numbers; returns the list's length (-1 if absent). */
    int64_t (*opt_number_list)(void* host, const ctx_options* opts, const char* key, double* out,
                               int64_t cap);

    /* Declares a trainable parameter; valid only inside create() and extend(). Returns its index
     * (0, 1, ... in declaration order) or -1 with a message in err. */
    int32_t (*register_param)(void* host, const ctx_param_desc* desc, ctx_err* err);

    /* Deterministic random numbers from the engine's seeded stream (for init). */
    uint64_t (*rng_u64)(void* host);
} ctx_host_api;

/* ---------------------------------------------------------------- descriptor */
typedef enum ctx_plugin_kind {
    CTX_PLUGIN_PE = 1,
    CTX_PLUGIN_SAMPLER = 2,
    CTX_PLUGIN_EVAL = 3
} ctx_plugin_kind;

typedef struct ctx_plugin_descriptor {
    uint32_t abi_major; /* must stay the first two fields in every ABI version */
    uint32_t abi_minor;
    uint32_t struct_size; /* sizeof(ctx_plugin_descriptor) as the plugin saw it */
    int32_t kind;         /* ctx_plugin_kind */
    const char* name;     /* "rope": registered as "<kind>/<name>", e.g. "pe/rope" */
    const char* version;  /* the plugin's own version, free form */
    const char* description;
    const ctx_option_desc* options;
    int32_t n_options;
    const void* vtable; /* ctx_pe_vtable / ctx_sampler_vtable / ctx_eval_vtable by kind */
} ctx_plugin_descriptor;

typedef const ctx_plugin_descriptor* (*ctx_plugin_query_fn)(void);
#define CTX_PLUGIN_QUERY_SYMBOL "ctx_plugin_query"

/* ================================================================= positional encodings
 * A PE plugin uses any of three hooks (DESIGN.md decision 4), announced in pe_vtable.hooks:
 *   input : a vector added to each token embedding, either a learned table the engine looks up
 *           with linear interpolation at fractional positions (CTX_INPUT_TABLE) or values the plugin
 *           computes from the positions (CTX_INPUT_GENERIC);
 *   rotary: frequencies and scales; the engine rotates q and k;
 *   bias  : a per-head additive attention-logit bias of p_i - p_j, from a family the engine
 *           evaluates inside attention (and differentiates w.r.t. its per-head parameters), or
 *           (ABI 1.1, CTX_BIAS_GENERIC) any function the plugin evaluates and differentiates
 *           itself on tables of distances through bias_forward / bias_backward.
 */
typedef struct ctx_model_info {
    uint32_t struct_size;
    int32_t d_model, n_head, head_dim, n_layer, vocab_size;
    int32_t context_length; /* Lt: the training context the model was built for */
} ctx_model_info;

enum { CTX_PE_HOOK_INPUT = 1u, CTX_PE_HOOK_ROTARY = 2u, CTX_PE_HOOK_BIAS = 4u };

typedef enum ctx_input_kind {
    CTX_INPUT_TABLE = 1,  /* engine: x += interp(params[table_param], p) */
    CTX_INPUT_GENERIC = 2 /* plugin: input_forward() adds into x */
} ctx_input_kind;

typedef struct ctx_input_spec {
    uint32_t struct_size;
    int32_t kind;        /* ctx_input_kind */
    int32_t table_param; /* CTX_INPUT_TABLE: index of a (rows, d_model) parameter */
} ctx_input_spec;

typedef enum ctx_rotary_layout {
    CTX_ROTARY_HALF = 0,       /* NeoX/LLaMA: dim k pairs with k + dr/2 */
    CTX_ROTARY_INTERLEAVED = 1 /* GPT-J: dim 2k pairs with 2k+1 */
} ctx_rotary_layout;

/* With a = (p * position_scale) * inv_freq[k] and R(a) the 2-D rotation of pair k, the engine sets
 *     q' = attention_factor * zeta_k^( p / amp_scale_base) * R(a) q
 *     k' = attention_factor * zeta_k^(-p / amp_scale_base) * R(a) k
 * where zeta_k = amp_base[k] if amp_base != NULL (xPos) and 1 otherwise; v is not touched. */
typedef struct ctx_rotary_spec {
    uint32_t struct_size;
    int32_t rotary_dims;      /* dr: even, 0 < dr <= head_dim; dims >= dr pass through */
    int32_t layout;           /* ctx_rotary_layout */
    const float* inv_freq;    /* (dr/2) theta_k; owned by the plugin instance */
    float position_scale;     /* linear position interpolation: 1/s; 1 otherwise */
    float attention_factor;   /* YaRN's m; 1 otherwise */
    const float* amp_base;    /* (dr/2) xPos zeta_k, or NULL */
    float amp_scale_base;     /* xPos B (e.g. 512) */
} ctx_rotary_spec;

typedef enum ctx_bias_kind {
    CTX_BIAS_NONE = 0,
    CTX_BIAS_LINEAR = 1,       /* -slope[h] * (p_i - p_j)                     (ALiBi) */
    CTX_BIAS_KERPLE_LOG = 2,   /* -r1[h] * log(1 + r2[h] * |p_i - p_j|)               */
    CTX_BIAS_KERPLE_POWER = 3, /* -r1[h] * |p_i - p_j|^r2[h]                          */
    CTX_BIAS_T5 = 4,           /* table[h][bucket(p_i - p_j)]                         */
    CTX_BIAS_GENERIC = 5       /* ABI 1.1: f_h(p_i - p_j, p_i) from bias_forward/backward */
} ctx_bias_kind;

typedef struct ctx_bias_spec {
    uint32_t struct_size;
    int32_t kind;           /* ctx_bias_kind */
    /* LINEAR with fixed slopes: slopes points at (n_head) floats owned by the plugin and
     * param_a = -1. Learnable families name parameters instead: */
    const float* slopes;
    int32_t param_a;        /* LINEAR (learnable slope) / KERPLE r1 / T5 table: param index or -1 */
    int32_t param_b;        /* KERPLE r2: param index or -1 */
    int32_t num_buckets;    /* T5 */
    int32_t max_distance;   /* T5 */
} ctx_bias_spec;

typedef struct ctx_pe_vtable {
    uint32_t struct_size;
    uint32_t hooks; /* CTX_PE_HOOK_* bits */

    /* Reads options, declares parameters (host->register_param), returns an instance. */
    ctx_status (*create)(const ctx_host_api* host, const ctx_model_info* model,
                         const ctx_options* options, void** instance, ctx_err* err);
    void (*destroy)(void* instance);

    /* Fills parameters declared with CTX_INIT_PLUGIN (may be NULL if none). */
    ctx_status (*init_params)(void* instance, ctx_tensor* params, int32_t n_params, ctx_err* err);

    /* input hook */
    ctx_status (*input_spec)(void* instance, ctx_input_spec* spec, ctx_err* err);
    /* CTX_INPUT_GENERIC only: x (n_tokens, d_model) += f(positions). */
    ctx_status (*input_forward)(void* instance, const ctx_tensor* params, int32_t n_params,
                                const float* positions, int64_t n_tokens, float* x, ctx_err* err);
    /* CTX_INPUT_GENERIC with parameters: grads += d f / d params . dx (may be NULL). */
    ctx_status (*input_backward)(void* instance, const ctx_tensor* params, ctx_tensor* grads,
                                 int32_t n_params, const float* positions, int64_t n_tokens,
                                 const float* dx, ctx_err* err);

    /* rotary hook; seq_len is the length of the rows about to run (dynamic scaling uses it). */
    ctx_status (*rotary_spec)(void* instance, int64_t seq_len, ctx_rotary_spec* spec, ctx_err* err);

    /* bias hook */
    ctx_status (*bias_spec)(void* instance, int64_t seq_len, ctx_bias_spec* spec, ctx_err* err);

    /* Extend the context from old_len to new_len (Lt -> Le). A plugin whose parameters change
     * shape re-declares them with host->register_param (same names, new shapes) and then, in
     * extend_params, fills the new tensors from the old ones. */
    ctx_status (*extend)(const ctx_host_api* host, void* instance, int64_t old_len,
                         int64_t new_len, ctx_err* err);
    ctx_status (*extend_params)(void* instance, const ctx_tensor* old_params,
                                ctx_tensor* new_params, int32_t n_params, ctx_err* err);

    /* Called after every optimizer update (e.g. KERPLE clamps r1, r2). May be NULL. */
    ctx_status (*after_update)(void* instance, ctx_tensor* params, int32_t n_params, ctx_err* err);

    /* Plugin state that is not a parameter (current length, scale), for checkpoints. Writes at
     * most cap bytes and returns the size needed in *size. May be NULL if stateless. */
    ctx_status (*save_state)(void* instance, void* buffer, size_t cap, size_t* size, ctx_err* err);
    ctx_status (*load_state)(void* instance, const void* buffer, size_t size, ctx_err* err);

    /* ---- ABI 1.1: the generic bias (CTX_BIAS_GENERIC). The host reads these slots only when
     * struct_size covers them, and refuses CTX_BIAS_GENERIC from a plugin that lacks them.
     * Each call covers one head and n (query i, key j <= i) pairs of a batch: distance[k] =
     * p_i - p_j and query_pos[k] = p_i for pair k (fp32; the host forms the difference in double
     * before rounding). Every causal pair of every row is passed; the order of pairs is the
     * host's and may change. A bias that reads only distance is relative (shifting all positions
     * changes nothing); query_pos is there for functions that also normalise by the query's
     * position (FIRE). The host calls these serially, never concurrently, once per head per
     * forward / backward pass, with views of the plugin's parameters (and gradients).
     *   bias_forward : bias[k] = f_head(distance[k], query_pos[k])                  (writes)
     *   bias_backward: grads[p] += sum_k dbias[k] * d f_head(distance[k], query_pos[k]) / d params[p]
     */
    ctx_status (*bias_forward)(void* instance, const ctx_tensor* params, int32_t n_params,
                               int32_t head, const float* distance, const float* query_pos,
                               int64_t n, float* bias, ctx_err* err);
    ctx_status (*bias_backward)(void* instance, const ctx_tensor* params, ctx_tensor* grads,
                                int32_t n_params, int32_t head, const float* distance,
                                const float* query_pos, int64_t n, const float* dbias,
                                ctx_err* err);
} ctx_pe_vtable;

/* ================================================================= samplers
 * A sampler turns one window of a document (original positions 0..window_len-1) into one training
 * row of row_len tokens with original float positions, targets and a loss mask (METHODS.md 2). */
typedef struct ctx_sample_row {
    int32_t* tokens;    /* (row_len) */
    float* positions;   /* (row_len) original positions */
    int32_t* targets;   /* (row_len) */
    float* loss_mask;   /* (row_len) 1 trains the target, 0 does not */
    int64_t row_len;
    /* ABI 1.4. NULL, or (row_len): the window index each token was copied from (tokens[r] ==
     * window[source[r]]). The host asks for it when rows are packed (several documents per
     * window) to find each token's document; it fills the array with -1 before the call. */
    int64_t* source;
} ctx_sample_row;

typedef struct ctx_sampler_vtable {
    uint32_t struct_size;
    ctx_status (*create)(const ctx_host_api* host, const ctx_options* options, void** instance,
                         ctx_err* err);
    void (*destroy)(void* instance);
    /* window: (window_len + 1) tokens, the last one only a target. rng_state: a 4 x u64 stream the
     * host owns and checkpoints; draw from it with ctx_rng_next_u64 (xoshiro256**). */
    ctx_status (*sample)(void* instance, const int32_t* window, int64_t window_len,
                         uint64_t rng_state[4], ctx_sample_row* row, ctx_err* err);
} ctx_sampler_vtable;

/* ================================================================= evaluation tasks
 * An eval plugin reads held-out documents and scores the model through the host: it never sees
 * the model itself. Results are records (flat key -> number/string rows): the host writes each to
 * the log, to metrics.jsonl and to <out_dir>/<task>.csv, adding the recipe's tags (method, ...). */
typedef struct ctx_eval_host ctx_eval_host; /* opaque: the model, data, metrics sink */

typedef struct ctx_eval_model_info {
    uint32_t struct_size;
    int32_t vocab_size;
    int32_t context_length; /* Lt the model was trained at (after any extend: the new length) */
    int32_t trained_length; /* the original Lt before any extend() */
} ctx_eval_model_info;

/* Generation (ABI 1.2, ctx_eval_api.generate). */
typedef enum ctx_finish {
    CTX_FINISH_LENGTH = 0,      /* max_new_tokens reached */
    CTX_FINISH_STOP_TOKEN = 1,  /* produced a stop token (EOS), which is not returned */
    CTX_FINISH_STOP_STRING = 2  /* the decoded output contains a stop string */
} ctx_finish;

typedef struct ctx_generate_request {
    uint32_t struct_size;
    int64_t n_prompts;
    const int32_t* const* prompts;   /* n_prompts arrays of token ids */
    const int64_t* prompt_lengths;   /* (n_prompts), each >= 1 */
    int32_t max_new_tokens;
    int32_t window;                  /* attend only to the last `window` tokens; 0: all */
    int32_t stop_at_eos;             /* 1: the tokenizer's "eos" token ends a prompt's output */
    int32_t n_stop_strings;
    const char* const* stop_strings; /* a prompt's generation ends once its decoded output
                                      * contains one; the returned tokens include the token that
                                      * completed it (cut the decoded text at the match) */
} ctx_generate_request;

/* Teacher-forced scoring of rows (ABI 1.3, ctx_eval_api.score_rows). Inputs as row_logprobs;
 * each output may be NULL when not wanted. */
typedef struct ctx_score_request {
    uint32_t struct_size;
    const int32_t* tokens;    /* (n_rows, row_len) */
    const float* positions;   /* (n_rows, row_len) */
    const int32_t* targets;   /* (n_rows, row_len) */
    int64_t n_rows, row_len;
    int32_t window;           /* attend only to the last `window` tokens; 0: all */
    float* logprobs;          /* out (n_rows, row_len): log p(targets[r][t] | tokens[r][0..t]) */
    int32_t* argmax;          /* out (n_rows, row_len): the most likely next token (greedy
                               * prediction; ties go to the lowest id) */
} ctx_score_request;

typedef struct ctx_eval_api {
    uint32_t struct_size;
    /* Per-token log-probabilities of rows: tokens/positions/targets (n_rows, row_len) row-major;
     * logprobs out (n_rows, row_len) = log p(targets[r][t] | tokens[r][0..t]). */
    ctx_status (*row_logprobs)(ctx_eval_host* host, const int32_t* tokens, const float* positions,
                               const int32_t* targets, int64_t n_rows, int64_t row_len,
                               float* logprobs, ctx_err* err);
    /* Records a single named number (a one-field record). */
    void (*metric)(ctx_eval_host* host, const char* name, double value);

    void (*model_info)(ctx_eval_host* host, ctx_eval_model_info* info);
    /* Held-out documents (the split the recipe passed): count, lengths, token copies. */
    int64_t (*num_documents)(ctx_eval_host* host);
    int64_t (*document_length)(ctx_eval_host* host, int64_t doc);
    /* Copies tokens [start, start + n) of document doc into out; returns CTX_ERR_INVALID_ARGUMENT
     * when the span is outside the document. */
    ctx_status (*copy_tokens)(ctx_eval_host* host, int64_t doc, int64_t start, int64_t n,
                              int32_t* out, ctx_err* err);
    /* Structured results: begin, add fields, end. Field order is kept (CSV column order). */
    void (*record_begin)(ctx_eval_host* host, const char* task);
    void (*record_number)(ctx_eval_host* host, const char* key, double value);
    void (*record_string)(ctx_eval_host* host, const char* key, const char* value);
    ctx_status (*record_end)(ctx_eval_host* host, ctx_err* err);
    /* Progress/log lines from the task. */
    void (*log)(ctx_eval_host* host, int32_t level, const char* message);

    /* ---- ABI 1.2: text, generation and the windowed control. Check struct_size before use
     * (ctx_eval_api_has(api, field)); a host older than 1.2 does not provide them. */

    /* Text -> token ids with the tokenizer the recipe gave ctx.run_eval (its `tokenizer`, or
     * the byte tokenizer for byte-level models). Returns the number of ids and writes at most
     * cap of them (cap 0 asks for the count); -1 with a message on error (no tokenizer, text
     * that is not valid UTF-8, ...). */
    int64_t (*tokenize)(ctx_eval_host* host, const char* text, int64_t text_len, int32_t* out,
                        int64_t cap, ctx_err* err);
    /* Ids -> text (UTF-8, special tokens skipped). Returns the byte length and writes at most
     * cap bytes plus a terminating NUL when it fits; -1 with a message on error. */
    int64_t (*detokenize)(ctx_eval_host* host, const int32_t* ids, int64_t n, char* out,
                          int64_t cap, ctx_err* err);
    /* The id of a special token by role: "eos", "bos"; -1 when the tokenizer has none. */
    int32_t (*special_token)(ctx_eval_host* host, const char* role);
    /* row_logprobs with attention limited to the last `window` tokens of each row (by index;
     * 0: full causal attention): the "windowed" control of position-wise loss curves. */
    ctx_status (*row_logprobs_windowed)(ctx_eval_host* host, const int32_t* tokens,
                                        const float* positions, const int32_t* targets,
                                        int64_t n_rows, int64_t row_len, int32_t window,
                                        float* logprobs, ctx_err* err);
    /* Greedy generation with a KV cache, prompts split across ranks and gathered. See
     * ctx_generate_request; out_tokens (n_prompts, max_new_tokens) row-major, out_lengths and
     * out_finish (ctx_finish) (n_prompts). */
    ctx_status (*generate)(ctx_eval_host* host, const ctx_generate_request* request,
                           int32_t* out_tokens, int64_t* out_lengths, int32_t* out_finish,
                           ctx_err* err);

    /* ---- ABI 1.3 */
    /* Log-probabilities and greedy predictions of rows in one pass, optionally windowed (see
     * ctx_score_request): teacher-forced retrieval scores need the argmax, not only log p. */
    ctx_status (*score_rows)(ctx_eval_host* host, const ctx_score_request* request, ctx_err* err);
} ctx_eval_api;

/* True when the host's eval API is new enough to have `field`. */
#define ctx_eval_api_has(api, field) \
    ((api)->struct_size >= CTX_OFFSET_END(ctx_eval_api, field) && (api)->field)



typedef struct ctx_eval_vtable {
    uint32_t struct_size;
    ctx_status (*create)(const ctx_host_api* host, const ctx_options* options, void** instance,
                         ctx_err* err);
    void (*destroy)(void* instance);
    ctx_status (*run)(void* instance, const ctx_eval_api* api, ctx_eval_host* eval_host,
                      ctx_err* err);
} ctx_eval_vtable;

/* ---------------------------------------------------------------- helpers for plugin authors
 * Inline conveniences, not part of the ABI. */
static inline void ctx_err_set(ctx_err* err, const char* message) {
    if (!err) return;
    size_t i = 0;
    for (; message && message[i] && i + 1 < CTX_ERR_MESSAGE_CAP; ++i) err->message[i] = message[i];
    err->message[i] = '\0';
}

/* printf-style error: formats into err and returns status, so `return ctx_err_setf(err,
 * CTX_ERR_INVALID_ARGUMENT, "option 'alpha' must be in (0, 1], got %g", a);` reads as one step. */
static inline ctx_status ctx_err_setf(ctx_err* err, ctx_status status, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline ctx_status ctx_err_setf(ctx_err* err, ctx_status status, const char* fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, CTX_ERR_MESSAGE_CAP, fmt, ap);
        va_end(ap);
    }
    return status;
}

/* printf-style logging through the host (no-op when host or its log callback is NULL). */
static inline void ctx_host_logf(const ctx_host_api* host, int32_t level, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline void ctx_host_logf(const ctx_host_api* host, int32_t level, const char* fmt, ...) {
    char buf[512];
    va_list ap;
    if (!host || !host->log) return;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    host->log(host->host, level, buf);
}

/* xoshiro256** step on a host-owned 4-word state (samplers use it so the host can checkpoint). */
static inline uint64_t ctx_rng_next_u64(uint64_t s[4]) {
    const uint64_t r = ((s[1] * 5) << 7 | (s[1] * 5) >> 57) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return r;
}

/* Uniform integer in [0, n) without modulo bias (n > 0): draws again above the largest multiple
 * of n. */
static inline uint64_t ctx_rng_below(uint64_t s[4], uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t r;
    do r = ctx_rng_next_u64(s); while (r >= limit);
    return r % n;
}

/* Uniform double in [0, 1) with 53 random bits. */
static inline double ctx_rng_unit(uint64_t s[4]) {
    return (double)(ctx_rng_next_u64(s) >> 11) * (1.0 / 9007199254740992.0);
}

/* A uniform k-subset of {0 .. n-1} (0 <= k <= n) in ascending order in out[0 .. k): Floyd's
 * algorithm, exactly k draws (for j = n-k .. n-1: t = below(j + 1), or j itself when t was
 * already picked), kept sorted by insertion. */
static inline void ctx_rng_sorted_subset(uint64_t s[4], int64_t n, int64_t k, int64_t* out) {
    int64_t j, i, m = 0;
    for (j = n - k; j < n; ++j) {
        int64_t x = (int64_t)ctx_rng_below(s, (uint64_t)(j + 1)), lo = 0, hi = m;
        while (lo < hi) {
            const int64_t mid = lo + (hi - lo) / 2;
            if (out[mid] < x) lo = mid + 1; else hi = mid;
        }
        if (lo < m && out[lo] == x) { /* taken: j is new and above every earlier pick */
            x = j;
            lo = m;
        }
        for (i = m; i > lo; --i) out[i] = out[i - 1];
        out[lo] = x;
        ++m;
    }
}

/* Seeds a 4-word xoshiro256** state from one number (splitmix64), e.g. from (seed, window). */
static inline void ctx_rng_seed(uint64_t s[4], uint64_t seed) {
    int i;
    for (i = 0; i < 4; ++i) {
        uint64_t z = (seed += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        s[i] = z ^ (z >> 31);
    }
}

/* Evaluation position policies (METHODS.md 2.4). A model trained with randomized positions
 * (gaps U[eps, 2]) is evaluated with gaps U[eps, 1] (Giraffe's best) or with gap 1, so an eval
 * task offers the choice: parse the option with ctx_eval_positions_from_name and number each row
 * with ctx_fill_eval_positions. */
typedef enum ctx_eval_positions {
    CTX_EVAL_POSITIONS_GAP1 = 0,    /* p_i = i: the usual numbering */
    CTX_EVAL_POSITIONS_UNIFORM = 1  /* p_0 = 0, p_{i+1} = p_i + g_i, g_i ~ U[eps, 1] */
} ctx_eval_positions;

/* "gap1" | "uniform" -> the policy, or -1 for any other name. */
static inline int ctx_eval_positions_from_name(const char* name) {
    if (!name) return -1;
    if (strcmp(name, "gap1") == 0) return CTX_EVAL_POSITIONS_GAP1;
    if (strcmp(name, "uniform") == 0) return CTX_EVAL_POSITIONS_UNIFORM;
    return -1;
}

/* Positions of one row of n tokens under `policy`. Uniform gaps draw from rng (seed it per row,
 * e.g. from the window, so results do not depend on batching or ranks) and are accumulated in
 * double; a float rounding that would repeat a position is nudged up so positions stay strictly
 * increasing. eps must be in (0, 1]. */
static inline void ctx_fill_eval_positions(float* positions, int64_t n, int policy, double eps,
                                           uint64_t rng[4]) {
    int64_t i;
    double p = 0;
    for (i = 0; i < n; ++i) {
        if (policy != CTX_EVAL_POSITIONS_UNIFORM) {
            positions[i] = (float)i;
            continue;
        }
        if (i > 0) {
            p += eps + (1.0 - eps) * ctx_rng_unit(rng);
        }
        positions[i] = (float)p;
        if (i > 0 && positions[i] <= positions[i - 1]) {
            /* the next float above a positive float: its bit pattern plus one */
            uint32_t bits;
            memcpy(&bits, &positions[i - 1], sizeof bits);
            ++bits;
            memcpy(&positions[i], &bits, sizeof bits);
        }
    }
}

#ifdef __cplusplus
} /* extern "C" */
#endif
#endif /* CTX_PLUGIN_H */
