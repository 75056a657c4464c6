/*
 * pe/fire: FIRE, functional interpolation for relative positions (Li et al. 2023,
 * arXiv:2310.04418), through the engine's generic bias path (CTX_BIAS_GENERIC, plugin ABI 1.1):
 * no engine code knows this function, the plugin evaluates it and its gradient on the distance
 * tables the host passes (bias_forward / bias_backward).
 *
 * For query i and key j (j <= i) with d = p_i - p_j and the query's position q = p_i:
 *     psi(x)  = log(|c x| + 1)
 *     x       = psi(d) / (psi(max(q, L)) + eps),  L = |s| * threshold      (normalize = true)
 *     x       = psi(d)                                                     (normalize = false)
 *     b_h     = f(x)_h,  f(x) = W2 act(w1 x + b1) + b2
 * f is the paper's MLP R -> R^H: one hidden layer of `hidden` units (32) shared by the heads and
 * one output per head; act is ReLU (the paper) or tanh-GELU. As in the authors' reference code,
 * c is learnable (init 0.1), the threshold L is learnable through a multiplier s (init 1) of its
 * initial value, and eps = 1e-6; the absolute values keep psi and L defined for any sign.
 *
 * Parameters (all trained by the engine like any other):
 *     "w1" (hidden, 1), "b1" (hidden): U(-1, 1)                  (nn.Linear(1, hidden) init)
 *     "w2" (n_head, hidden), "b2" (n_head): U(-1/sqrt(hidden), 1/sqrt(hidden))
 *     "c" (1) = init_c, and with normalize "threshold_scale" (1) = 1
 * w1, w2 are decayed by AdamW; biases, c and the threshold scale are not.
 *
 * Relative or not: with normalize = false the bias depends on p_i - p_j only (shifting every
 * position changes nothing). With normalize = true (the paper's progressive interpolation) it
 * also depends on the query's position once that exceeds L: by design, so that distances at
 * any length map into [0, 1]. Extending the context changes nothing in either case.
 *
 * Cost: each call evaluates the MLP on every causal pair of the batch for one head, so a step
 * costs about 4 * hidden * H * B * T^2 / 2 flops in forward and twice that in backward, serially.
 */
#include <ctx/plugin.h>

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#define FIRE_EPS 1e-6
#define FIRE_MAX_HIDDEN 4096

enum { ACT_RELU = 0, ACT_GELU = 1 };
enum { P_W1 = 0, P_B1, P_W2, P_B2, P_C, P_S, P_COUNT };

typedef struct fire {
    int32_t n_head, hidden, act, normalize;
    double init_c, threshold; /* threshold: L at s = 1 */
    int32_t idx[P_COUNT];     /* parameter indices (P_S: -1 without normalize) */
    double* acc;              /* (3 * hidden) gradient accumulators of one backward call */
    float* scratch;           /* (4 * hidden) per-pair activations and per-block accumulators */
    /* psi(|d|) memo for one call (distances repeat: integer positions give at most T distinct
     * ones): direct-mapped, keyed by the float bits of |d|, valid while gen matches. */
    struct psi_entry {
        uint32_t key, gen;
        double value;
    } * psi_memo;
    uint32_t gen;
} fire;

#define FIRE_MEMO_BITS 12

static int32_t declare(const ctx_host_api* host, const char* name, int32_t ndim, int64_t d0,
                       int64_t d1, int32_t init, float bound, int32_t decay, ctx_err* err) {
    ctx_param_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.name = name;
    d.ndim = ndim;
    d.shape[0] = d0;
    d.shape[1] = ndim > 1 ? d1 : 1;
    d.shape[2] = d.shape[3] = 1;
    d.init = init;
    d.init_lo = -bound;
    d.init_hi = bound;
    d.weight_decay = decay;
    return host->register_param(host->host, &d, err);
}

static ctx_status fire_create(const ctx_host_api* host, const ctx_model_info* model,
                              const ctx_options* options, void** instance, ctx_err* err) {
    fire* f;
    int64_t hidden;
    double init_c, threshold, b2;
    const char* act;
    int32_t i;
    if (!host || !model || !instance)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: NULL host, model or instance");
    *instance = NULL;
    if (model->struct_size < CTX_OFFSET_END(ctx_model_info, context_length))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: model info is too small");
    if (host->struct_size < CTX_OFFSET_END(ctx_host_api, rng_u64) || !host->opt_number ||
        !host->opt_integer || !host->opt_string || !host->opt_bool || !host->register_param)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: host API is too old");
    if (model->n_head <= 0)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "n_head must be positive, got %d",
                         (int)model->n_head);
    hidden = host->opt_integer(host->host, options, "hidden", 32);
    act = host->opt_string(host->host, options, "activation", "relu");
    init_c = host->opt_number(host->host, options, "init_c", 0.1);
    threshold = host->opt_number(host->host, options, "threshold",
                                 model->context_length > 0 ? (double)model->context_length : 512.0);
    if (hidden < 1 || hidden > FIRE_MAX_HIDDEN)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option hidden must be in [1, %d], got %lld", FIRE_MAX_HIDDEN,
                         (long long)hidden);
    if (!act || (strcmp(act, "relu") != 0 && strcmp(act, "gelu") != 0))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option activation must be \"relu\" or \"gelu\", got \"%s\"",
                         act ? act : "(null)");
    if (!(init_c > 0.0) || !isfinite(init_c))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option init_c must be a finite number > 0, got %g", init_c);
    if (!(threshold > 0.0) || !isfinite(threshold))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option threshold must be a finite number > 0, got %g", threshold);

    f = (fire*)calloc(1, sizeof *f);
    if (!f) return ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    f->acc = (double*)calloc((size_t)hidden * 3, sizeof(double));
    f->scratch = (float*)calloc((size_t)hidden * 4, sizeof(float));
    f->psi_memo = (struct psi_entry*)calloc((size_t)1 << FIRE_MEMO_BITS, sizeof(struct psi_entry));
    if (!f->acc || !f->scratch || !f->psi_memo) {
        free(f->acc);
        free(f->scratch);
        free(f->psi_memo);
        free(f);
        return ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    }
    f->n_head = model->n_head;
    f->hidden = (int32_t)hidden;
    f->act = strcmp(act, "gelu") == 0 ? ACT_GELU : ACT_RELU;
    f->normalize = host->opt_bool(host->host, options, "normalize", 1) != 0;
    f->init_c = init_c;
    f->threshold = threshold;
    b2 = 1.0 / sqrt((double)hidden);
    f->idx[P_W1] = declare(host, "w1", 2, hidden, 1, CTX_INIT_UNIFORM, 1.0f, 1, err);
    f->idx[P_B1] = declare(host, "b1", 1, hidden, 1, CTX_INIT_UNIFORM, 1.0f, 0, err);
    f->idx[P_W2] = declare(host, "w2", 2, f->n_head, hidden, CTX_INIT_UNIFORM, (float)b2, 1, err);
    f->idx[P_B2] = declare(host, "b2", 1, f->n_head, 1, CTX_INIT_UNIFORM, (float)b2, 0, err);
    f->idx[P_C] = declare(host, "c", 1, 1, 1, CTX_INIT_PLUGIN, 0.0f, 0, err);
    f->idx[P_S] = f->normalize
                      ? declare(host, "threshold_scale", 1, 1, 1, CTX_INIT_PLUGIN, 0.0f, 0, err)
                      : -1;
    for (i = 0; i < P_COUNT; ++i) {
        if (f->idx[i] < 0 && (i != P_S || f->normalize)) {
            free(f->acc);
            free(f->scratch);
            free(f->psi_memo);
            free(f);
            return CTX_ERR_INVALID_ARGUMENT; /* register_param wrote the message */
        }
    }
    *instance = f;
    return CTX_OK;
}

static void fire_destroy(void* instance) {
    fire* f = (fire*)instance;
    if (!f) return;
    free(f->acc);
    free(f->scratch);
    free(f->psi_memo);
    free(f);
}

/* Checks that params (and grads, if given) hold this plugin's tensors with their shapes. */
static ctx_status check_tensors(const fire* f, const ctx_tensor* params, const ctx_tensor* grads,
                                int32_t n_params, const char* call, ctx_err* err) {
    int32_t i;
    int64_t want[P_COUNT];
    want[P_W1] = f->hidden;
    want[P_B1] = f->hidden;
    want[P_W2] = (int64_t)f->n_head * f->hidden;
    want[P_B2] = f->n_head;
    want[P_C] = 1;
    want[P_S] = 1;
    if (!params) return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "%s: NULL params", call);
    for (i = 0; i < P_COUNT; ++i) {
        const int32_t k = f->idx[i];
        int64_t numel = 1;
        int32_t dd;
        if (k < 0) continue;
        if (k >= n_params)
            return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                             "%s: expected at least %d parameters, got %d", call, (int)k + 1,
                             (int)n_params);
        for (dd = 0; dd < params[k].ndim && dd < 4; ++dd) numel *= params[k].shape[dd];
        if (!params[k].data || numel != want[i] || (grads && (!grads[k].data)))
            return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                             "%s: parameter %d has %lld entries, expected %lld", call, (int)k,
                             (long long)numel, (long long)want[i]);
    }
    return CTX_OK;
}

static ctx_status fire_init_params(void* instance, ctx_tensor* params, int32_t n_params,
                                   ctx_err* err) {
    const fire* f = (const fire*)instance;
    if (!f) return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "init_params: NULL instance");
    if (check_tensors(f, params, NULL, n_params, "init_params", err) != CTX_OK)
        return CTX_ERR_INVALID_ARGUMENT;
    params[f->idx[P_C]].data[0] = (float)f->init_c;
    if (f->normalize) params[f->idx[P_S]].data[0] = 1.0f;
    return CTX_OK;
}

static ctx_status fire_bias_spec(void* instance, int64_t seq_len, ctx_bias_spec* spec,
                                 ctx_err* err) {
    (void)seq_len;
    if (!instance || !spec)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "bias_spec: NULL instance or spec");
    if (spec->struct_size < CTX_OFFSET_END(ctx_bias_spec, param_b))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "bias_spec: spec struct_size %u is too small", spec->struct_size);
    spec->kind = CTX_BIAS_GENERIC;
    spec->slopes = NULL;
    spec->param_a = spec->param_b = -1;
    return CTX_OK;
}

/* ---- the function and its derivatives, one (distance, query) pair at a time */

/* x = psi(d) / (psi(max(q, L)) + eps) (or psi(d)); dx_dc, dx_ds: its derivatives w.r.t. c and
 * the threshold scale s (0 without normalize, or where q >= L). One fire_call per bias_forward /
 * bias_backward call: it holds c, s, L and memos psi(|d|) by distance and the normalisation of
 * the last query position (pairs of one query come together in the host's order; the memo is
 * only a shortcut, any order gives the same values). */
typedef struct fire_call {
    fire* f;
    double c, s, L; /* c, s and L = |s| * threshold */
    double ac, sc;  /* |c|, sign(c) */
    int has_q;      /* memo of the last query position: */
    float q;
    double Bn, dB_dc, dB_dm, dm_ds;
} fire_call;

static fire_call call_of(fire* f, const ctx_tensor* params) {
    fire_call p;
    memset(&p, 0, sizeof p);
    p.f = f;
    p.c = params[f->idx[P_C]].data[0];
    p.s = f->normalize ? params[f->idx[P_S]].data[0] : 1.0;
    p.L = fabs(p.s) * f->threshold;
    p.ac = fabs(p.c);
    p.sc = p.c > 0 ? 1.0 : (p.c < 0 ? -1.0 : 0.0);
    if (++f->gen == 0) { /* wrapped: forget every entry */
        memset(f->psi_memo, 0, sizeof(struct psi_entry) << FIRE_MEMO_BITS);
        f->gen = 1;
    }
    return p;
}

static inline double psi_abs(fire_call* p, float ad) {
    uint32_t key, slot;
    struct psi_entry* e;
    memcpy(&key, &ad, sizeof key);
    slot = (key * 2654435761u) >> (32 - FIRE_MEMO_BITS);
    e = &p->f->psi_memo[slot];
    if (e->gen != p->f->gen || e->key != key) {
        e->key = key;
        e->gen = p->f->gen;
        e->value = log1p(p->ac * (double)ad);
    }
    return e->value;
}

static double input_of(fire_call* p, float d, float q, double* dx_dc, double* dx_ds) {
    const float ad = fabsf(d);
    const double A = psi_abs(p, ad);
    const double dA_dc = p->sc * ad / (1.0 + p->ac * ad);
    if (!p->f->normalize) {
        if (dx_dc) *dx_dc = dA_dc;
        if (dx_ds) *dx_ds = 0.0;
        return A;
    }
    if (!p->has_q || q != p->q) {
        const double aq = fabsf(q), m = aq > p->L ? aq : p->L;
        p->has_q = 1;
        p->q = q;
        p->Bn = log1p(p->ac * m) + FIRE_EPS;
        p->dB_dc = p->sc * m / (1.0 + p->ac * m);
        p->dB_dm = p->ac / (1.0 + p->ac * m);
        p->dm_ds = aq > p->L ? 0.0 : (p->s > 0 ? 1.0 : (p->s < 0 ? -1.0 : 0.0)) * p->f->threshold;
    }
    if (dx_dc) *dx_dc = dA_dc / p->Bn - A * p->dB_dc / (p->Bn * p->Bn);
    if (dx_ds) *dx_ds = -A / (p->Bn * p->Bn) * p->dB_dm * p->dm_ds;
    return A / p->Bn;
}

static const float kGeluK = 0.7978845608f; /* sqrt(2 / pi) */

/* act(z) and act'(z) in float. The MLP runs in float (vectorised over the hidden units, with
 * eight partial sums per reduction); x, the per-pair input, and every sum over pairs are double. */
static inline float act_value(int32_t act, float z) {
    if (act == ACT_RELU) return z > 0.0f ? z : 0.0f;
    return 0.5f * z * (1.0f + tanhf(kGeluK * (z + 0.044715f * z * z * z)));
}

static inline float act_grad(int32_t act, float z) {
    float t;
    if (act == ACT_RELU) return z > 0.0f ? 1.0f : 0.0f;
    t = tanhf(kGeluK * (z + 0.044715f * z * z * z));
    return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * kGeluK * (1.0f + 3.0f * 0.044715f * z * z);
}

/* f(x) - b2 = sum_u w2[u] act(w1[u] x + b1[u]) for one head's row w2. */
static inline float mlp_value(int32_t act, int32_t hidden, const float* w1, const float* b1,
                              const float* w2, float x) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int32_t u = 0, t;
    if (act == ACT_RELU) {
        for (; u + 8 <= hidden; u += 8)
            for (t = 0; t < 8; ++t) {
                const float z = w1[u + t] * x + b1[u + t];
                acc[t] += w2[u + t] * (z > 0.0f ? z : 0.0f);
            }
    }
    for (; u < hidden; ++u) acc[u & 7] += w2[u] * act_value(act, w1[u] * x + b1[u]);
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static ctx_status check_call(const fire* f, const ctx_tensor* params, const ctx_tensor* grads,
                             int32_t n_params, int32_t head, const float* distance,
                             const float* query_pos, int64_t n, const void* io, const char* call,
                             ctx_err* err) {
    if (!f) return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "%s: NULL instance", call);
    if (check_tensors(f, params, grads, n_params, call, err) != CTX_OK)
        return CTX_ERR_INVALID_ARGUMENT;
    if (head < 0 || head >= f->n_head)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "%s: head %d is outside [0, %d)", call,
                         (int)head, (int)f->n_head);
    if (n < 0 || (n > 0 && (!distance || !query_pos || !io)))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "%s: bad pair arrays (n = %lld)", call,
                         (long long)n);
    return CTX_OK;
}

static ctx_status fire_bias_forward(void* instance, const ctx_tensor* params, int32_t n_params,
                                    int32_t head, const float* distance, const float* query_pos,
                                    int64_t n, float* bias, ctx_err* err) {
    fire* f = (fire*)instance; /* the psi memo changes: calls are serial (plugin ABI) */
    const float *w1, *b1, *w2;
    double b2;
    fire_call p;
    int64_t k;
    if (check_call(f, params, NULL, n_params, head, distance, query_pos, n, bias, "bias_forward",
                   err) != CTX_OK)
        return CTX_ERR_INVALID_ARGUMENT;
    w1 = params[f->idx[P_W1]].data;
    b1 = params[f->idx[P_B1]].data;
    w2 = params[f->idx[P_W2]].data + (size_t)head * f->hidden;
    b2 = params[f->idx[P_B2]].data[head];
    p = call_of(f, params);
    for (k = 0; k < n; ++k) {
        const float x = (float)input_of(&p, distance[k], query_pos[k], NULL, NULL);
        bias[k] = (float)(b2 + mlp_value(f->act, f->hidden, w1, b1, w2, x));
    }
    return CTX_OK;
}

/* One pair's ReLU backward, elementwise over the hidden units (vectorised): block sums of the
 * gradients of w2, w1, b1 and gz_u = d loss / d z_u. */
static void relu_backward_pair(int32_t H, const float* restrict w1, const float* restrict b1,
                               const float* restrict w2, float xf, float g, float* restrict bw1,
                               float* restrict bb1, float* restrict bw2, float* restrict gzs) {
    int32_t u;
    for (u = 0; u < H; ++u) {
        const float z = w1[u] * xf + b1[u];
        const float on = z > 0.0f ? 1.0f : 0.0f;
        const float gz = g * w2[u] * on;
        bw2[u] += g * (z * on);
        bw1[u] += gz * xf;
        bb1[u] += gz;
        gzs[u] = gz;
    }
}

/* Pairs per block of float gradient accumulators (flushed into the double ones after each). */
#define FIRE_BLOCK 64

static ctx_status fire_bias_backward(void* instance, const ctx_tensor* params, ctx_tensor* grads,
                                     int32_t n_params, int32_t head, const float* distance,
                                     const float* query_pos, int64_t n, const float* dbias,
                                     ctx_err* err) {
    fire* f = (fire*)instance; /* the psi memo changes: calls are serial (plugin ABI) */
    const int32_t H = f ? f->hidden : 0;
    const float *w1, *b1, *w2;
    double *gw1, *gb1, *gw2, gb2 = 0.0, gc = 0.0, gs = 0.0;
    float *bw1, *bb1, *bw2, *gzs;
    fire_call p;
    int64_t k0, k;
    int32_t u, t;
    if (check_call(f, params, grads, n_params, head, distance, query_pos, n, dbias,
                   "bias_backward", err) != CTX_OK)
        return CTX_ERR_INVALID_ARGUMENT;
    if (!grads) return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "bias_backward: NULL grads");
    w1 = params[f->idx[P_W1]].data;
    b1 = params[f->idx[P_B1]].data;
    w2 = params[f->idx[P_W2]].data + (size_t)head * H;
    gw1 = f->acc;
    gb1 = f->acc + H;
    gw2 = f->acc + 2 * (size_t)H;
    bw1 = f->scratch; /* (H) block sums of d/dw1, d/db1, d/dw2 */
    bb1 = f->scratch + H;
    bw2 = f->scratch + 2 * (size_t)H;
    gzs = f->scratch + 3 * (size_t)H; /* (H) d loss / d z_u of one pair */
    memset(f->acc, 0, sizeof(double) * 3 * (size_t)H);
    p = call_of(f, params);
    for (k0 = 0; k0 < n; k0 += FIRE_BLOCK) {
        const int64_t k1 = n - k0 < FIRE_BLOCK ? n : k0 + FIRE_BLOCK;
        memset(f->scratch, 0, sizeof(float) * 3 * (size_t)H);
        for (k = k0; k < k1; ++k) {
            const float g = dbias[k];
            double dx_dc, dx_ds, x;
            float xf, acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, gx;
            if (g == 0.0f) continue;
            x = input_of(&p, distance[k], query_pos[k], &dx_dc, &dx_ds);
            xf = (float)x;
            gb2 += g;
            if (f->act == ACT_RELU) {
                relu_backward_pair(H, w1, b1, w2, xf, g, bw1, bb1, bw2, gzs);
            } else {
                for (u = 0; u < H; ++u) {
                    const float z = w1[u] * xf + b1[u];
                    const float gz = g * w2[u] * act_grad(f->act, z);
                    bw2[u] += g * act_value(f->act, z);
                    bw1[u] += gz * xf;
                    bb1[u] += gz;
                    gzs[u] = gz;
                }
            }
            for (u = 0; u + 8 <= H; u += 8) /* gx = sum_u gz_u w1_u */
                for (t = 0; t < 8; ++t) acc[t] += gzs[u + t] * w1[u + t];
            for (; u < H; ++u) acc[u & 7] += gzs[u] * w1[u];
            gx = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
            gc += gx * dx_dc;
            gs += gx * dx_ds;
        }
        for (u = 0; u < H; ++u) {
            gw1[u] += bw1[u];
            gb1[u] += bb1[u];
            gw2[u] += bw2[u];
        }
    }
    for (u = 0; u < H; ++u) {
        grads[f->idx[P_W1]].data[u] += (float)gw1[u];
        grads[f->idx[P_B1]].data[u] += (float)gb1[u];
        grads[f->idx[P_W2]].data[(size_t)head * H + u] += (float)gw2[u];
    }
    grads[f->idx[P_B2]].data[head] += (float)gb2;
    grads[f->idx[P_C]].data[0] += (float)gc;
    if (f->normalize) grads[f->idx[P_S]].data[0] += (float)gs;
    return CTX_OK;
}

static ctx_status fire_extend(const ctx_host_api* host, void* instance, int64_t old_len,
                              int64_t new_len, ctx_err* err) {
    const fire* f = (const fire*)instance;
    if (!f) return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "extend: NULL instance");
    if (old_len <= 0 || new_len <= 0)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "extend: lengths must be positive, got %lld -> %lld", (long long)old_len,
                         (long long)new_len);
    ctx_host_logf(host, CTX_LOG_INFO,
             "extend %lld -> %lld: nothing to change (%s)", (long long)old_len,
             (long long)new_len,
             f->normalize ? "the query normalisation max(p_i, L) follows the positions"
                          : "the bias is a function of p_i - p_j");
    return CTX_OK;
}

static const ctx_pe_vtable fire_vtable = {
    sizeof(ctx_pe_vtable),
    CTX_PE_HOOK_BIAS,
    fire_create,
    fire_destroy,
    fire_init_params, /* c and the threshold scale */
    NULL,             /* input_spec */
    NULL,             /* input_forward */
    NULL,             /* input_backward */
    NULL,             /* rotary_spec */
    fire_bias_spec,
    fire_extend,
    NULL, /* extend_params: shapes never change */
    NULL, /* after_update */
    NULL, /* save_state: stateless */
    NULL, /* load_state */
    fire_bias_forward,
    fire_bias_backward,
};

static const ctx_option_desc fire_options[] = {
    {"hidden", CTX_OPT_INTEGER, "32", "hidden units of the MLP (shared by the heads)"},
    {"activation", CTX_OPT_STRING, "relu", "\"relu\" (the paper) or \"gelu\" (tanh form)"},
    {"init_c", CTX_OPT_NUMBER, "0.1", "initial c of psi(x) = log(|c x| + 1)"},
    {"threshold", CTX_OPT_NUMBER, "context_length",
     "initial L of the query normalisation psi(max(p_i, L)); learnable through a scale"},
    {"normalize", CTX_OPT_BOOL, "true",
     "divide by psi(max(p_i, L)) (the paper); false: the purely relative f(psi(p_i - p_j))"},
};

static const ctx_plugin_descriptor fire_descriptor = {
    CTX_PLUGIN_ABI_MAJOR,
    CTX_PLUGIN_ABI_MINOR,
    sizeof(ctx_plugin_descriptor),
    CTX_PLUGIN_PE,
    "fire",
    "1.0.0",
    "FIRE (Li et al. 2023): per-head bias f(psi(p_i - p_j) / psi(max(p_i, L))) with a learned "
    "MLP f, psi(x) = log(|c x| + 1); a generic-bias plugin (ABI 1.1)",
    fire_options,
    (int32_t)(sizeof fire_options / sizeof fire_options[0]),
    &fire_vtable,
};

CTX_PLUGIN_EXPORT const ctx_plugin_descriptor* ctx_plugin_query(void) { return &fire_descriptor; }
