/*
 * pe/rope: rotary position embedding and its scaling variants (METHODS.md 1.3).
 *
 *   rotary dims  dr = floor(rotary_pct * head_dim), rounded down to even (GPT-NeoX: int(dh * pct))
 *   frequencies  theta_k = base^(-2k/dr), k = 0 .. dr/2 - 1
 *   layout       "half" (NeoX/LLaMA: dim k pairs with k + dr/2) or "interleaved" (GPT-J: 2k, 2k+1)
 *
 * The engine rotates q and k with angle (p * position_scale) * inv_freq[k] for the (float)
 * position p of each token and scales them as described at ctx_rotary_spec (plugin.h). Every
 * variant is expressed only through that spec. Option `scaling` picks it (s = `factor`,
 * L = `original_length`, default the model's context_length at create):
 *
 *   none               theta_k
 *   linear             theta_k, position_scale = 1/s                      (position interpolation)
 *   ntk                base' = base * s^(dr/(dr-2))                                  (NTK-aware)
 *   dynamic_ntk        for rows of seq_len l > L: base' = base * (s*l/L - (s-1))^(dr/(dr-2)),
 *                      else base. l is the seq_len the engine passes to rotary_spec (the row
 *                      length), not the largest position in the row (a row of Lt tokens
 *                      with original positions up to Le, as the segmented samplers make, stays
 *                      at the plain base). rotary_spec recomputes inv_freq in place when seq_len
 *                      changes, so a pointer from an earlier call sees the new values (the spec
 *                      is valid until the next call).
 *   yarn               lambda_k = 2 pi / theta_k, r_k = L / lambda_k,
 *                      gamma_k = 0 if r_k < alpha, 1 if r_k > beta, (r_k - alpha)/(beta - alpha)
 *                      otherwise; theta'_k = (1 - gamma_k) theta_k / s + gamma_k theta_k;
 *                      attention_factor m = 0.1 ln(s) + 1 (the engine multiplies q and k by m)
 *   giraffe_power      1-indexed k = 1 .. dr/2: theta*_k = base^(-2(k-1)/dr) * (1 - 2k/dr)^kp
 *                      (the last pair gets frequency 0)
 *   giraffe_truncated  theta_k if theta_k >= b; rho if a < theta_k < b; 0 if theta_k <= a.
 *                      Defaults (Giraffe): b = 2 pi / L, a = b/8, rho = b/16, where b is the
 *                      effective b (so giving only trunc_b keeps Giraffe's ratios)
 *   xpos               theta_k with amplitudes zeta_k = (2k/dr + g)/(1 + g), 0-indexed k,
 *                      amp_scale_base = B: q is scaled by zeta_k^(p/B), k by zeta_k^(-p/B)
 *   hf_yarn, llama3,   HF transformers' rope types, exactly as its rope init functions
 *   longrope           compute them (rope_hf.h, METHODS.md 5.1); longrope switches between its
 *                      short and long factors by the seq_len passed to rotary_spec, like
 *                      dynamic_ntk.
 *
 * All frequencies are computed in double and stored as float.
 *
 * extend(old_len, new_len): plain RoPE, the Giraffe bases and xPos are unchanged (logged). For
 * linear, ntk, dynamic_ntk and yarn, when `factor` was not given explicitly, extend picks the
 * interpolation factor s = new_len / original_length (Le / Lt); original_length itself is kept
 * (YaRN's L stays the pretraining context). An explicit `factor` is kept as given.
 *
 * State (save_state / load_state, for checkpoints): native-endian binary, 32 bytes:
 *   u32 magic 0x45504f52 ("ROPE" little-endian), u32 version (1), i32 scaling, u32 flags
 *   (bit 0: factor was explicit), f64 s, i64 original_length.
 * An empty state (a checkpoint written by rope 1.0 without state) leaves the instance as created.
 *
 * xPos numerics: the engine computes zeta_k^(+-p/B) in double from the float position (p >= 0:
 * the model rejects negative positions) and stores the result as float. Since zeta_k < 1, the k
 * scale zeta_k^(-p/B) grows with p; it overflows float (3.4e38) once p/B * ln(1/zeta_0) > 88.7,
 * i.e. p > 88.7 * B / ln((1+g)/g) (about 36,000 for g = 0.4, B = 512), and the q scale underflows
 * to 0 around the same place, so q.k becomes inf or NaN there. Giraffe reports the same problem in
 * fp16. The product q.k depends only on p_i - p_j, so callers with long contexts may shift all
 * positions of a row down by a common amount (METHODS.md 1.3); this plugin does not shift them.
 * create() logs the largest safe position.
 */
#include <ctx/plugin.h>

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rope_hf.h"

#define ROPE_PI 3.14159265358979323846
#define ROPE_STATE_MAGIC 0x45504f52u
#define ROPE_STATE_VERSION 1u
#define ROPE_STATE_SIZE 32u

typedef enum rope_scaling {
    SCALE_NONE = 0,
    SCALE_LINEAR = 1,
    SCALE_NTK = 2,
    SCALE_DYNAMIC_NTK = 3,
    SCALE_YARN = 4,
    SCALE_GIRAFFE_POWER = 5,
    SCALE_GIRAFFE_TRUNCATED = 6,
    SCALE_XPOS = 7,
    SCALE_HF_YARN = 8,
    SCALE_LLAMA3 = 9,
    SCALE_LONGROPE = 10,
    SCALE_COUNT = 11
} rope_scaling;

static const char* const scaling_names[SCALE_COUNT] = {
    "none",  "linear", "ntk",     "dynamic_ntk", "yarn",    "giraffe_power",
    "giraffe_truncated", "xpos", "hf_yarn", "llama3", "longrope"};

#define BIT(m) (1u << (m))
/* modes whose factor extend() may pick (s = Le / original_length) */
#define FACTOR_MODES                                                                            \
    (BIT(SCALE_LINEAR) | BIT(SCALE_NTK) | BIT(SCALE_DYNAMIC_NTK) | BIT(SCALE_YARN) |            \
     BIT(SCALE_HF_YARN) | BIT(SCALE_LLAMA3))
/* modes that read `factor` (longrope: for its attention factor only) */
#define FACTOR_OPTION_MODES (FACTOR_MODES | BIT(SCALE_LONGROPE))
#define HF_MODES (BIT(SCALE_HF_YARN) | BIT(SCALE_LLAMA3) | BIT(SCALE_LONGROPE))

/* Options that belong to some scaling modes only; present with another mode, they are an error. */
static const struct {
    const char* name;
    uint32_t modes;
} mode_options[] = {
    {"factor", FACTOR_OPTION_MODES},
    {"original_length", FACTOR_OPTION_MODES | BIT(SCALE_GIRAFFE_TRUNCATED)},
    {"power", BIT(SCALE_GIRAFFE_POWER)},
    {"trunc_a", BIT(SCALE_GIRAFFE_TRUNCATED)},
    {"trunc_b", BIT(SCALE_GIRAFFE_TRUNCATED)},
    {"trunc_rho", BIT(SCALE_GIRAFFE_TRUNCATED)},
    {"yarn_alpha", BIT(SCALE_YARN)},
    {"yarn_beta", BIT(SCALE_YARN)},
    {"xpos_gamma", BIT(SCALE_XPOS)},
    {"xpos_scale_base", BIT(SCALE_XPOS)},
    {"yarn_beta_fast", BIT(SCALE_HF_YARN)},
    {"yarn_beta_slow", BIT(SCALE_HF_YARN)},
    {"mscale", BIT(SCALE_HF_YARN)},
    {"mscale_all_dim", BIT(SCALE_HF_YARN)},
    {"attention_factor", BIT(SCALE_HF_YARN) | BIT(SCALE_LONGROPE)},
    {"low_freq_factor", BIT(SCALE_LLAMA3)},
    {"high_freq_factor", BIT(SCALE_LLAMA3)},
    {"short_factor", BIT(SCALE_LONGROPE)},
    {"long_factor", BIT(SCALE_LONGROPE)},
};

typedef struct rope {
    int32_t rotary_dims;
    int32_t layout;
    int32_t scaling;        /* rope_scaling */
    int32_t factor_explicit; /* 1: `factor` was given, extend() keeps it */
    double base;
    double factor;          /* s */
    int64_t original_length; /* L */
    double power;           /* giraffe_power kp */
    double trunc_a, trunc_b, trunc_rho;
    uint32_t trunc_given;   /* bits 0, 1, 2: trunc_a, trunc_b, trunc_rho were options */
    double yarn_alpha, yarn_beta;
    double xpos_gamma, xpos_scale_base;
    rope_hf hf;             /* hf_yarn, llama3, longrope */
    float position_scale, attention_factor;
    int64_t freq_len;       /* dynamic_ntk, longrope: the seq_len inv_freq is for, -1 if none */
    float* inv_freq;        /* (rotary_dims / 2) */
    float* amp_base;        /* (rotary_dims / 2), xpos only */
} rope;

static int uses_factor(const rope* r) { return (FACTOR_MODES & BIT(r->scaling)) != 0; }
static int reads_factor(const rope* r) { return (FACTOR_OPTION_MODES & BIT(r->scaling)) != 0; }
/* Modes whose frequencies depend on the row length. */
static int length_dependent(const rope* r) {
    return r->scaling == SCALE_DYNAMIC_NTK || r->scaling == SCALE_LONGROPE;
}

/* theta_k = base^(-2k/dr) in double. */
static double plain_theta(double base, int32_t k, int32_t dr) {
    return pow(base, -2.0 * (double)k / (double)dr);
}

/* Fills inv_freq, amp_base, position_scale and attention_factor for rows of seq_len tokens. */
static void compute_spec(rope* r, int64_t seq_len) {
    const int32_t dr = r->rotary_dims, half = dr / 2;
    const double s = r->factor, L = (double)r->original_length;
    double base = r->base;
    int32_t k;
    r->position_scale = 1.0f;
    r->attention_factor = 1.0f;
    if (r->scaling == SCALE_NTK) base = r->base * pow(s, (double)dr / (double)(dr - 2));
    if (r->scaling == SCALE_DYNAMIC_NTK && (double)seq_len > L)
        base = r->base * pow(s * (double)seq_len / L - (s - 1.0), (double)dr / (double)(dr - 2));
    for (k = 0; k < half; ++k) {
        const double theta = plain_theta(base, k, dr);
        double out = theta;
        switch (r->scaling) {
            case SCALE_YARN: {
                const double lambda = 2.0 * ROPE_PI / theta;
                const double ratio = L / lambda;
                double gamma;
                if (ratio < r->yarn_alpha)
                    gamma = 0.0;
                else if (ratio > r->yarn_beta)
                    gamma = 1.0;
                else
                    gamma = (ratio - r->yarn_alpha) / (r->yarn_beta - r->yarn_alpha);
                out = (1.0 - gamma) * theta / s + gamma * theta;
                break;
            }
            case SCALE_GIRAFFE_POWER: /* 1-indexed i = k + 1: (1 - 2i/dr)^kp, 0 for i = dr/2 */
                out = theta * pow(1.0 - 2.0 * (double)(k + 1) / (double)dr, r->power);
                break;
            case SCALE_GIRAFFE_TRUNCATED:
                out = theta >= r->trunc_b ? theta : (theta > r->trunc_a ? r->trunc_rho : 0.0);
                break;
            case SCALE_XPOS:
                r->amp_base[k] = (float)((2.0 * (double)k / (double)dr + r->xpos_gamma) /
                                         (1.0 + r->xpos_gamma));
                break;
            case SCALE_HF_YARN:
                out = rope_hf_yarn_freq(&r->hf, theta, k, dr, base, s, L);
                break;
            case SCALE_LLAMA3:
                out = rope_hf_llama3_freq(&r->hf, theta, s, L);
                break;
            case SCALE_LONGROPE:
                out = rope_hf_longrope_freq(&r->hf, theta, k, (double)seq_len > L);
                break;
            default: break;
        }
        r->inv_freq[k] = (float)out;
    }
    if (r->scaling == SCALE_LINEAR) r->position_scale = (float)(1.0 / s);
    if (r->scaling == SCALE_YARN) r->attention_factor = (float)(0.1 * log(s) + 1.0);
    if (r->scaling == SCALE_HF_YARN) r->attention_factor = (float)rope_hf_yarn_attention(&r->hf, s);
    if (r->scaling == SCALE_LONGROPE)
        r->attention_factor = (float)rope_hf_longrope_attention(&r->hf, s, L);
    r->freq_len = seq_len;
}

/* Giraffe's defaults for the truncated basis (those not given as options): b = 2 pi / L, and
 * a = b/8, rho = b/16 of the effective b. Called again when load_state restores L. */
static void truncated_defaults(rope* r) {
    if (!(r->trunc_given & 2u)) r->trunc_b = 2.0 * ROPE_PI / (double)r->original_length;
    if (!(r->trunc_given & 1u)) r->trunc_a = r->trunc_b / 8.0;
    if (!(r->trunc_given & 4u)) r->trunc_rho = r->trunc_b / 16.0;
}

static ctx_status check_factor(double s, const char* what, ctx_err* err) {
    if (!(isfinite(s) && s >= 1.0))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "%s 'factor' must be a finite number >= 1, got %g", what, s);
    return CTX_OK;
}

/* Reads a number option that must be finite and > lo (strict) or >= lo. */
static ctx_status read_number(const ctx_host_api* host, const ctx_options* options,
                              const char* name, double dflt, double lo, int strict, double* out,
                              ctx_err* err) {
    const double v = host->opt_number(host->host, options, name, dflt);
    if (!isfinite(v) || (strict ? !(v > lo) : !(v >= lo)))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option '%s' must be a finite number %s %g, got %g", name,
                         strict ? ">" : ">=", lo, v);
    *out = v;
    return CTX_OK;
}

static ctx_status read_scaling_options(const ctx_host_api* host, const ctx_model_info* model,
                                       const ctx_options* options, rope* r, ctx_err* err) {
    ctx_status st;
    if (!host->opt_has)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: the host API lacks opt_has");
    r->factor = 1.0;
    r->factor_explicit = host->opt_has(host->host, options, "factor") != 0;
    if (reads_factor(r)) {
        r->factor = host->opt_number(host->host, options, "factor", 1.0);
        if ((st = check_factor(r->factor, "option", err)) != CTX_OK) return st;
    }
    r->original_length = model->context_length;
    if (host->opt_has(host->host, options, "original_length")) {
        if (!host->opt_integer)
            return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: the host API lacks opt_integer");
        r->original_length = host->opt_integer(host->host, options, "original_length", 0);
        if (r->original_length < 1)
            return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                             "option 'original_length' must be an integer >= 1, got %lld",
                             (long long)r->original_length);
    } else if ((reads_factor(r) || r->scaling == SCALE_GIRAFFE_TRUNCATED) &&
               r->original_length < 1) {
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "scaling = %s needs 'original_length' (the model's context_length is "
                         "%d)",
                         scaling_names[r->scaling], (int)model->context_length);
    }
    if ((r->scaling == SCALE_NTK || r->scaling == SCALE_DYNAMIC_NTK) && r->rotary_dims < 4)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "scaling = %s needs at least 4 rotary dims (its exponent is dr/(dr-2)), "
                         "got %d",
                         scaling_names[r->scaling], (int)r->rotary_dims);
    switch (r->scaling) {
        case SCALE_YARN:
            if ((st = read_number(host, options, "yarn_alpha", 1.0, 0.0, 0, &r->yarn_alpha, err)))
                return st;
            if ((st = read_number(host, options, "yarn_beta", 32.0, 0.0, 1, &r->yarn_beta, err)))
                return st;
            if (!(r->yarn_alpha < r->yarn_beta))
                return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                                 "scaling = yarn requires yarn_alpha < yarn_beta, got "
                                 "'yarn_alpha' = %g and 'yarn_beta' = %g",
                                 r->yarn_alpha, r->yarn_beta);
            break;
        case SCALE_GIRAFFE_POWER:
            if ((st = read_number(host, options, "power", 0.5, 0.0, 1, &r->power, err))) return st;
            break;
        case SCALE_GIRAFFE_TRUNCATED:
            r->trunc_given = (host->opt_has(host->host, options, "trunc_a") ? 1u : 0u) |
                             (host->opt_has(host->host, options, "trunc_b") ? 2u : 0u) |
                             (host->opt_has(host->host, options, "trunc_rho") ? 4u : 0u);
            truncated_defaults(r);
            if ((st = read_number(host, options, "trunc_b", r->trunc_b, 0.0, 1, &r->trunc_b, err)))
                return st;
            truncated_defaults(r); /* a and rho default to the effective b */
            if ((st = read_number(host, options, "trunc_a", r->trunc_a, 0.0, 0, &r->trunc_a, err)))
                return st;
            if ((st = read_number(host, options, "trunc_rho", r->trunc_rho, 0.0, 0, &r->trunc_rho,
                                  err)))
                return st;
            if (!(r->trunc_a < r->trunc_b))
                return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                                 "scaling = giraffe_truncated requires a < b, got 'trunc_a' = %g "
                                 "and 'trunc_b' = %g",
                                 r->trunc_a, r->trunc_b);
            break;
        case SCALE_HF_YARN:
            return rope_hf_read(host, options, ROPE_HF_YARN, r->rotary_dims / 2, &r->hf, err);
        case SCALE_LLAMA3:
            return rope_hf_read(host, options, ROPE_HF_LLAMA3, r->rotary_dims / 2, &r->hf, err);
        case SCALE_LONGROPE:
            return rope_hf_read(host, options, ROPE_HF_LONGROPE, r->rotary_dims / 2, &r->hf, err);
        case SCALE_XPOS:
            if ((st = read_number(host, options, "xpos_gamma", 0.4, 0.0, 1, &r->xpos_gamma, err)))
                return st;
            if ((st = read_number(host, options, "xpos_scale_base", 512.0, 0.0, 1,
                                  &r->xpos_scale_base, err)))
                return st;
            break;
        default: break;
    }
    return CTX_OK;
}

static void rope_destroy(void* instance) {
    rope* r = (rope*)instance;
    if (!r) return;
    free(r->inv_freq);
    free(r->amp_base);
    rope_hf_free(&r->hf);
    free(r);
}

static ctx_status rope_create(const ctx_host_api* host, const ctx_model_info* model,
                              const ctx_options* options, void** instance, ctx_err* err) {
    double base, pct;
    const char *layout_name, *scaling_name;
    int32_t layout, dims, scaling = -1, i;
    size_t j;
    ctx_status st;
    rope* r;

    if (!host || !model || !instance)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: NULL host, model or instance");
    if (host->struct_size < CTX_OFFSET_END(ctx_host_api, rng_u64) || !host->opt_number ||
        !host->opt_string)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: the host API is too old");
    if (model->struct_size < CTX_OFFSET_END(ctx_model_info, context_length))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: model info is too small");
    *instance = NULL;

    base = host->opt_number(host->host, options, "base", 10000.0);
    if (!(isfinite(base) && base > 0.0))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option 'base' must be a finite number > 0, got %g", base);

    pct = host->opt_number(host->host, options, "rotary_pct", 1.0);
    if (!(pct > 0.0 && pct <= 1.0))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option 'rotary_pct' must be in (0, 1], got %g", pct);
    if (model->head_dim <= 0)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "head_dim must be positive, got %d",
                         (int)model->head_dim);
    dims = (int32_t)floor(pct * (double)model->head_dim);
    dims -= dims % 2;
    if (dims <= 0)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option 'rotary_pct' = %g gives %d rotary dims for head_dim %d "
                         "(need at least 2)",
                         pct, (int)dims, (int)model->head_dim);

    layout_name = host->opt_string(host->host, options, "layout", "half");
    if (layout_name && strcmp(layout_name, "half") == 0)
        layout = CTX_ROTARY_HALF;
    else if (layout_name && strcmp(layout_name, "interleaved") == 0)
        layout = CTX_ROTARY_INTERLEAVED;
    else
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option 'layout' must be \"half\" or \"interleaved\", got \"%s\"",
                         layout_name ? layout_name : "(null)");

    scaling_name = host->opt_string(host->host, options, "scaling", "none");
    for (i = 0; i < SCALE_COUNT; ++i)
        if (scaling_name && strcmp(scaling_name, scaling_names[i]) == 0) scaling = i;
    if (scaling < 0)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option 'scaling' must be one of none, linear, ntk, dynamic_ntk, yarn, "
                         "giraffe_power, giraffe_truncated, xpos, hf_yarn, llama3, longrope; got "
                         "\"%s\"",
                         scaling_name ? scaling_name : "(null)");

    /* Options of other modes: name the option, the modes it belongs to and the chosen one. */
    if (host->opt_has) {
        for (j = 0; j < sizeof mode_options / sizeof mode_options[0]; ++j) {
            char modes[160];
            size_t n = 0;
            int32_t m, count = 0, seen = 0;
            if ((mode_options[j].modes & BIT(scaling)) ||
                !host->opt_has(host->host, options, mode_options[j].name))
                continue;
            for (m = 0; m < SCALE_COUNT; ++m) count += (mode_options[j].modes & BIT(m)) != 0;
            modes[0] = '\0';
            for (m = 0; m < SCALE_COUNT; ++m) {
                if (!(mode_options[j].modes & BIT(m))) continue;
                ++seen;
                n += (size_t)snprintf(modes + n, sizeof modes - n, "%s%s",
                                      seen == 1 ? "" : (seen == count ? " or " : ", "),
                                      scaling_names[m]);
                if (n >= sizeof modes) break;
            }
            return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                             "option '%s' applies only to scaling = %s, not scaling = %s",
                             mode_options[j].name, modes, scaling_names[scaling]);
        }
    }

    r = (rope*)calloc(1, sizeof *r);
    if (!r) return ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    r->rotary_dims = dims;
    r->layout = layout;
    r->scaling = scaling;
    r->base = base;
    if ((st = read_scaling_options(host, model, options, r, err)) != CTX_OK) {
        rope_destroy(r);
        return st;
    }
    r->inv_freq = (float*)calloc((size_t)(dims / 2), sizeof(float));
    if (scaling == SCALE_XPOS) r->amp_base = (float*)calloc((size_t)(dims / 2), sizeof(float));
    if (!r->inv_freq || (scaling == SCALE_XPOS && !r->amp_base)) {
        rope_destroy(r);
        return ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    }
    compute_spec(r, 0);
    if (scaling == SCALE_XPOS)
        ctx_host_logf(host, CTX_LOG_INFO,
                 "xpos: the key scale zeta^(-p/B) exceeds float range beyond position %.0f "
                 "(88.7 * B / ln((1+g)/g), B = %g, g = %g)",
                 88.7 * r->xpos_scale_base / log((1.0 + r->xpos_gamma) / r->xpos_gamma),
                 r->xpos_scale_base, r->xpos_gamma);
    *instance = r;
    return CTX_OK;
}

static ctx_status rope_rotary_spec(void* instance, int64_t seq_len, ctx_rotary_spec* spec,
                                   ctx_err* err) {
    rope* r = (rope*)instance;
    if (!r || !spec)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "rotary_spec: NULL instance or spec");
    if (spec->struct_size < CTX_OFFSET_END(ctx_rotary_spec, amp_scale_base))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "rotary_spec: spec struct_size %u is too small", spec->struct_size);
    /* Only dynamic NTK and longrope depend on the row length; recompute when it changes. */
    if (length_dependent(r) && seq_len != r->freq_len) compute_spec(r, seq_len);
    spec->rotary_dims = r->rotary_dims;
    spec->layout = r->layout;
    spec->inv_freq = r->inv_freq;
    spec->position_scale = r->position_scale;
    spec->attention_factor = r->attention_factor;
    spec->amp_base = r->scaling == SCALE_XPOS ? r->amp_base : NULL;
    spec->amp_scale_base = r->scaling == SCALE_XPOS ? (float)r->xpos_scale_base : 512.0f;
    return CTX_OK;
}

static ctx_status rope_extend(const ctx_host_api* host, void* instance, int64_t old_len,
                              int64_t new_len, ctx_err* err) {
    rope* r = (rope*)instance;
    double s;
    if (!r) return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "extend: NULL instance");
    if (old_len <= 0 || new_len <= 0)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "extend: lengths must be positive, got %lld -> %lld", (long long)old_len,
                         (long long)new_len);
    if (r->scaling == SCALE_NONE) {
        ctx_host_logf(host, CTX_LOG_INFO,
                 "extend %lld -> %lld: plain RoPE is unchanged (same frequencies at every "
                 "position; use a scaling variant to adapt them)",
                 (long long)old_len, (long long)new_len);
        return CTX_OK;
    }
    if (!uses_factor(r)) {
        ctx_host_logf(host, CTX_LOG_INFO,
                 "extend %lld -> %lld: scaling = %s is unchanged (it has no interpolation factor)",
                 (long long)old_len, (long long)new_len, scaling_names[r->scaling]);
        return CTX_OK;
    }
    if (r->factor_explicit) {
        ctx_host_logf(host, CTX_LOG_INFO,
                 "extend %lld -> %lld: scaling = %s keeps the explicit factor %g",
                 (long long)old_len, (long long)new_len, scaling_names[r->scaling], r->factor);
        return CTX_OK;
    }
    s = (double)new_len / (double)r->original_length;
    if (s < 1.0)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "extend: new length %lld is shorter than original_length %lld, which "
                         "would give 'factor' %g < 1",
                         (long long)new_len, (long long)r->original_length, s);
    r->factor = s;
    compute_spec(r, length_dependent(r) ? r->freq_len : 0);
    ctx_host_logf(host, CTX_LOG_INFO,
             "extend %lld -> %lld: scaling = %s now uses factor s = %lld / %lld = %g "
             "(original_length kept)",
             (long long)old_len, (long long)new_len, scaling_names[r->scaling],
             (long long)new_len, (long long)r->original_length, s);
    return CTX_OK;
}

static ctx_status rope_save_state(void* instance, void* buffer, size_t cap, size_t* size,
                                  ctx_err* err) {
    const rope* r = (const rope*)instance;
    unsigned char b[ROPE_STATE_SIZE];
    const uint32_t magic = ROPE_STATE_MAGIC, version = ROPE_STATE_VERSION;
    const uint32_t flags = r && r->factor_explicit ? 1u : 0u;
    if (!r || !size) return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "save_state: NULL argument");
    memcpy(b + 0, &magic, 4);
    memcpy(b + 4, &version, 4);
    memcpy(b + 8, &r->scaling, 4);
    memcpy(b + 12, &flags, 4);
    memcpy(b + 16, &r->factor, 8);
    memcpy(b + 24, &r->original_length, 8);
    *size = ROPE_STATE_SIZE;
    if (buffer && cap >= ROPE_STATE_SIZE) memcpy(buffer, b, ROPE_STATE_SIZE);
    return CTX_OK;
}

static ctx_status rope_load_state(void* instance, const void* buffer, size_t size, ctx_err* err) {
    rope* r = (rope*)instance;
    const unsigned char* b = (const unsigned char*)buffer;
    uint32_t magic, version, flags;
    int32_t scaling;
    double s;
    int64_t L;
    ctx_status st;
    if (!r) return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "load_state: NULL instance");
    if (size == 0) return CTX_OK; /* written by rope 1.0, which had no state */
    if (!buffer || size < 8)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "load_state: expected %u bytes, got %llu", ROPE_STATE_SIZE,
                         (unsigned long long)size);
    memcpy(&magic, b, 4);
    memcpy(&version, b + 4, 4);
    if (magic != ROPE_STATE_MAGIC)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "load_state: not a pe/rope state (magic 0x%08x)", (unsigned)magic);
    if (version != ROPE_STATE_VERSION)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "load_state: state version %u is not supported (this plugin reads %u)",
                         (unsigned)version, ROPE_STATE_VERSION);
    if (size != ROPE_STATE_SIZE)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "load_state: expected %u bytes for version %u, got %llu",
                         ROPE_STATE_SIZE, ROPE_STATE_VERSION, (unsigned long long)size);
    memcpy(&scaling, b + 8, 4);
    memcpy(&flags, b + 12, 4);
    memcpy(&s, b + 16, 8);
    memcpy(&L, b + 24, 8);
    if (scaling != r->scaling)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "load_state: the state is for scaling = %s, this instance uses "
                         "scaling = %s",
                         scaling >= 0 && scaling < SCALE_COUNT ? scaling_names[scaling] : "?",
                         scaling_names[r->scaling]);
    if ((st = check_factor(s, "load_state:", err)) != CTX_OK) return st;
    if (L < 1)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "load_state: 'original_length' must be >= 1, got %lld", (long long)L);
    if (r->scaling == SCALE_GIRAFFE_TRUNCATED) {
        /* Cutoffs that were not options follow the restored L (the model may have been
         * re-created at its extended length). */
        rope t = *r;
        t.original_length = L;
        truncated_defaults(&t);
        if (!(t.trunc_a < t.trunc_b))
            return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                             "load_state: original_length %lld gives trunc_b = %g <= trunc_a = %g",
                             (long long)L, t.trunc_b, t.trunc_a);
        r->trunc_a = t.trunc_a;
        r->trunc_b = t.trunc_b;
        r->trunc_rho = t.trunc_rho;
    }
    r->factor = s;
    r->original_length = L;
    r->factor_explicit = (flags & 1u) != 0;
    compute_spec(r, length_dependent(r) ? r->freq_len : 0);
    return CTX_OK;
}

static const ctx_option_desc rope_options[] = {
    {"base", CTX_OPT_NUMBER, "10000", "frequency base: theta_k = base^(-2k/dr); > 0"},
    {"rotary_pct", CTX_OPT_NUMBER, "1.0",
     "fraction of each head's dims that rotate, in (0, 1]; dr = floor(pct * head_dim) rounded "
     "down to even (GPT-NeoX/Pythia 0.25, LLaMA 1.0)"},
    {"layout", CTX_OPT_STRING, "half",
     "pairing of rotated dims: \"half\" (NeoX/LLaMA: k with k + dr/2) or \"interleaved\" (GPT-J: "
     "2k with 2k+1)"},
    {"scaling", CTX_OPT_STRING, "none",
     "none | linear | ntk | dynamic_ntk | yarn | giraffe_power | giraffe_truncated | xpos "
     "(METHODS.md 1.3) | hf_yarn | llama3 | longrope (transformers' rope types, METHODS.md 5.1)"},
    {"factor", CTX_OPT_NUMBER, "1",
     "scale s >= 1 for linear, ntk, dynamic_ntk, yarn, hf_yarn, llama3 (if absent, extend() sets "
     "s = Le / original_length) and longrope (its attention factor)"},
    {"original_length", CTX_OPT_INTEGER, "context_length",
     "L, the pretraining context (linear, ntk, dynamic_ntk, yarn, giraffe_truncated, hf_yarn, "
     "llama3, longrope)"},
    {"power", CTX_OPT_NUMBER, "0.5", "giraffe_power exponent kp > 0"},
    {"trunc_a", CTX_OPT_NUMBER, "b/8", "giraffe_truncated lower cutoff a >= 0 (a < b)"},
    {"trunc_b", CTX_OPT_NUMBER, "2*pi/original_length", "giraffe_truncated upper cutoff b > 0"},
    {"trunc_rho", CTX_OPT_NUMBER, "b/16", "giraffe_truncated frequency for a < theta < b, >= 0"},
    {"yarn_alpha", CTX_OPT_NUMBER, "1", "yarn ramp start alpha >= 0 (in r_k = L / lambda_k)"},
    {"yarn_beta", CTX_OPT_NUMBER, "32", "yarn ramp end beta > alpha"},
    {"xpos_gamma", CTX_OPT_NUMBER, "0.4", "xpos g > 0: zeta_k = (2k/dr + g)/(1 + g)"},
    {"xpos_scale_base", CTX_OPT_NUMBER, "512", "xpos scale base B > 0: zeta_k^(+-p/B)"},
    {"yarn_beta_fast", CTX_OPT_NUMBER, "32", "hf_yarn beta_fast: rotations that end the ramp"},
    {"yarn_beta_slow", CTX_OPT_NUMBER, "1", "hf_yarn beta_slow: rotations that start it"},
    {"mscale", CTX_OPT_NUMBER, "absent", "hf_yarn mscale (with mscale_all_dim)"},
    {"mscale_all_dim", CTX_OPT_NUMBER, "absent", "hf_yarn mscale_all_dim (with mscale)"},
    {"attention_factor", CTX_OPT_NUMBER, "derived",
     "hf_yarn, longrope: the q/k scale; default from factor as transformers derives it"},
    {"low_freq_factor", CTX_OPT_NUMBER, "1", "llama3 low_freq_factor"},
    {"high_freq_factor", CTX_OPT_NUMBER, "4", "llama3 high_freq_factor (> low_freq_factor)"},
    {"short_factor", CTX_OPT_NUMBER_LIST, "required",
     "longrope: dr/2 factors used while the row length <= original_length"},
    {"long_factor", CTX_OPT_NUMBER_LIST, "required",
     "longrope: dr/2 factors used beyond original_length"},
};

/* Designated initializers: slots not named here (and slots appended in later ABI minors) are
 * NULL. */
static const ctx_pe_vtable rope_vtable = {
    .struct_size = sizeof(ctx_pe_vtable),
    .hooks = CTX_PE_HOOK_ROTARY,
    .create = rope_create,
    .destroy = rope_destroy,
    .rotary_spec = rope_rotary_spec,
    .extend = rope_extend,
    .save_state = rope_save_state,
    .load_state = rope_load_state,
};

static const ctx_plugin_descriptor rope_descriptor = {
    CTX_PLUGIN_ABI_MAJOR,
    CTX_PLUGIN_ABI_MINOR,
    sizeof(ctx_plugin_descriptor),
    CTX_PLUGIN_PE,
    "rope",
    "1.0.0",
    "Rotary position embedding (Su et al.): theta_k = base^(-2k/dr) on the first rotary_pct of "
    "each head, half or interleaved pairs; scaling = linear, ntk, dynamic_ntk, yarn, "
    "giraffe_power, giraffe_truncated, xpos, or transformers' hf_yarn, llama3, longrope",
    rope_options,
    (int32_t)(sizeof rope_options / sizeof rope_options[0]),
    &rope_vtable,
};

CTX_PLUGIN_EXPORT const ctx_plugin_descriptor* ctx_plugin_query(void) { return &rope_descriptor; }
