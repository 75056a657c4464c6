/*
 * pe/rope (private): the rope types of HF transformers (METHODS.md 5.1) exactly as transformers'
 * rope init functions compute them, for checkpoints that carry them in config.json:
 *   hf_yarn   YaRN with the correction range over dimension INDICES (floor/ceil, clamped to
 *             [0, dr-1]) from beta_fast / beta_slow, a linear ramp over k mixing theta_k / s and
 *             theta_k, attention factor given, or from mscale / mscale_all_dim, or 0.1 ln s + 1;
 *             pe/rope's `yarn` is the paper's form (ramp over the frequency ratio r_k), a
 *             different function;
 *   llama3    Llama 3.1's wavelength bands: lambda_k = 2 pi / theta_k above L0 / low_freq_factor
 *             scaled by 1/s, below L0 / high_freq_factor kept, between mixed smoothly;
 *   longrope  per-pair factors: theta_k / short_factor_k while the row length is <= L0,
 *             theta_k / long_factor_k beyond; attention factor given, or sqrt(1 + ln s / ln L0)
 *             for s > 1, else 1.
 * theta_k = base^(-2k/dr); L0 = original_length; s = factor.
 */
#ifndef CTX_PLUGIN_ROPE_HF_H
#define CTX_PLUGIN_ROPE_HF_H

#include <ctx/plugin.h>

#include <stdint.h>

typedef struct rope_hf {
    double beta_fast, beta_slow;              /* hf_yarn: 32, 1 */
    double attention_factor;                  /* hf_yarn, longrope: > 0 given, 0: derived */
    double mscale, mscale_all_dim;            /* hf_yarn: 0 when absent */
    double low_freq_factor, high_freq_factor; /* llama3: 1, 4 */
    double* short_factor;                     /* longrope: (dr/2) each */
    double* long_factor;
} rope_hf;

enum { ROPE_HF_YARN = 0, ROPE_HF_LLAMA3 = 1, ROPE_HF_LONGROPE = 2 };

/* Reads the options of `type` (ROPE_HF_*) for dr/2 = half pairs. */
ctx_status rope_hf_read(const ctx_host_api* host, const ctx_options* options, int32_t type,
                        int32_t half, rope_hf* h, ctx_err* err);
void rope_hf_free(rope_hf* h);

/* The scaled frequency of pair k (theta = theta_k). */
double rope_hf_yarn_freq(const rope_hf* h, double theta, int32_t k, int32_t dr, double base,
                         double s, double L0);
double rope_hf_llama3_freq(const rope_hf* h, double theta, double s, double L0);
double rope_hf_longrope_freq(const rope_hf* h, double theta, int32_t k, int use_long);

/* The attention factor (q and k rotations scaled by it). */
double rope_hf_yarn_attention(const rope_hf* h, double s);
double rope_hf_longrope_attention(const rope_hf* h, double s, double L0);

#endif
