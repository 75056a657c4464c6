/* pe/rope: the HF transformers rope types (rope_hf.h; METHODS.md 5.1). */
#include "rope_hf.h"

#include <math.h>
#include <stdlib.h>

#define HF_PI 3.14159265358979323846

static ctx_status read_positive(const ctx_host_api* host, const ctx_options* options,
                                const char* name, double dflt, double* out, ctx_err* err) {
    const double v = host->opt_number(host->host, options, name, dflt);
    if (!(isfinite(v) && v > 0.0))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                            "option '%s' must be a finite number > 0, got %g", name, v);
    *out = v;
    return CTX_OK;
}

/* A list option of exactly `half` positive finite numbers (malloc'd into *out). */
static ctx_status read_factors(const ctx_host_api* host, const ctx_options* options,
                               const char* name, int32_t half, double** out, ctx_err* err) {
    int64_t n, i;
    double* v;
    if (!host->opt_number_list)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: the host API lacks lists");
    n = host->opt_number_list(host->host, options, name, NULL, 0);
    if (n < 0)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                            "scaling = longrope needs option '%s' (a list of %d factors, one per "
                            "rotary pair)", name, (int)half);
    if (n != half)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                            "option '%s' has %lld factors; the rotary dims give %d pairs", name,
                            (long long)n, (int)half);
    v = (double*)malloc(sizeof(double) * (size_t)half);
    if (!v) return ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    host->opt_number_list(host->host, options, name, v, half);
    for (i = 0; i < half; ++i)
        if (!(isfinite(v[i]) && v[i] > 0.0)) {
            const double bad = v[i];
            free(v);
            return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                                "option '%s': factor %lld must be a finite number > 0, got %g",
                                name, (long long)i + 1, bad);
        }
    *out = v;
    return CTX_OK;
}

ctx_status rope_hf_read(const ctx_host_api* host, const ctx_options* options, int32_t type,
                        int32_t half, rope_hf* h, ctx_err* err) {
    ctx_status st;
    const int given_af = host->opt_has(host->host, options, "attention_factor") != 0;
    h->attention_factor = 0.0;
    if (given_af && (st = read_positive(host, options, "attention_factor", 1.0,
                                        &h->attention_factor, err)))
        return st;
    switch (type) {
        case ROPE_HF_YARN:
            if ((st = read_positive(host, options, "yarn_beta_fast", 32.0, &h->beta_fast, err)) ||
                (st = read_positive(host, options, "yarn_beta_slow", 1.0, &h->beta_slow, err)))
                return st;
            h->mscale = host->opt_number(host->host, options, "mscale", 0.0);
            h->mscale_all_dim = host->opt_number(host->host, options, "mscale_all_dim", 0.0);
            if (!(isfinite(h->mscale) && h->mscale >= 0.0 && isfinite(h->mscale_all_dim) &&
                  h->mscale_all_dim >= 0.0))
                return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                                    "options 'mscale' and 'mscale_all_dim' must be finite and "
                                    ">= 0, got %g and %g", h->mscale, h->mscale_all_dim);
            return CTX_OK;
        case ROPE_HF_LLAMA3:
            if ((st = read_positive(host, options, "low_freq_factor", 1.0, &h->low_freq_factor,
                                    err)) ||
                (st = read_positive(host, options, "high_freq_factor", 4.0, &h->high_freq_factor,
                                    err)))
                return st;
            if (!(h->low_freq_factor < h->high_freq_factor))
                return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                                    "scaling = llama3 requires low_freq_factor < high_freq_factor, "
                                    "got %g and %g", h->low_freq_factor, h->high_freq_factor);
            return CTX_OK;
        case ROPE_HF_LONGROPE:
            if ((st = read_factors(host, options, "short_factor", half, &h->short_factor, err)))
                return st;
            return read_factors(host, options, "long_factor", half, &h->long_factor, err);
        default:
            return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "unknown HF rope type %d",
                                (int)type);
    }
}

void rope_hf_free(rope_hf* h) {
    free(h->short_factor);
    free(h->long_factor);
    h->short_factor = h->long_factor = NULL;
}

/* The dimension index at which a wavelength turns `rotations` times over L0. */
static double correction_dim(double rotations, int32_t dr, double base, double L0) {
    return (double)dr * log(L0 / (rotations * 2.0 * HF_PI)) / (2.0 * log(base));
}

double rope_hf_yarn_freq(const rope_hf* h, double theta, int32_t k, int32_t dr, double base,
                         double s, double L0) {
    double low = floor(correction_dim(h->beta_fast, dr, base, L0));
    double high = ceil(correction_dim(h->beta_slow, dr, base, L0));
    double ramp;
    if (low < 0.0) low = 0.0;
    if (high > (double)(dr - 1)) high = (double)(dr - 1);
    if (low == high) high += 0.001; /* as transformers: no division by zero */
    ramp = ((double)k - low) / (high - low);
    ramp = ramp < 0.0 ? 0.0 : (ramp > 1.0 ? 1.0 : ramp);
    /* ramp 0: extrapolate (theta_k), ramp 1: interpolate (theta_k / s) */
    return theta / s * ramp + theta * (1.0 - ramp);
}

static double yarn_mscale(double s, double m) { return s <= 1.0 ? 1.0 : 0.1 * m * log(s) + 1.0; }

double rope_hf_yarn_attention(const rope_hf* h, double s) {
    if (h->attention_factor > 0.0) return h->attention_factor;
    if (h->mscale > 0.0 && h->mscale_all_dim > 0.0)
        return yarn_mscale(s, h->mscale) / yarn_mscale(s, h->mscale_all_dim);
    return yarn_mscale(s, 1.0);
}

double rope_hf_llama3_freq(const rope_hf* h, double theta, double s, double L0) {
    const double wavelen = 2.0 * HF_PI / theta;
    double smooth;
    if (wavelen < L0 / h->high_freq_factor) return theta;  /* high frequencies: kept */
    if (wavelen > L0 / h->low_freq_factor) return theta / s; /* low frequencies: interpolated */
    smooth = (L0 / wavelen - h->low_freq_factor) / (h->high_freq_factor - h->low_freq_factor);
    return (1.0 - smooth) * theta / s + smooth * theta;
}

double rope_hf_longrope_freq(const rope_hf* h, double theta, int32_t k, int use_long) {
    return theta / (use_long ? h->long_factor[k] : h->short_factor[k]);
}

double rope_hf_longrope_attention(const rope_hf* h, double s, double L0) {
    if (h->attention_factor > 0.0) return h->attention_factor;
    return s <= 1.0 ? 1.0 : sqrt(1.0 + log(s) / log(L0));
}
