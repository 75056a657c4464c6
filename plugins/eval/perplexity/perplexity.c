/* eval/perplexity: perplexity of held-out documents at several lengths (METHODS.md 3.3).
 *
 * For each evaluation length L, every held-out document of n tokens gives floor((n - 1) / L)
 * non-overlapping windows; window k scores tokens kL+1 .. kL+L given everything before them in
 * the window (positions 0 .. L-1, no sliding window, no cross-window context). Per window
 *     ppl(x) = exp(-(1/L) * sum_i log p(x_i | x_<i)),
 * reported as the mean over windows (the segmented-sequences paper's number) and as the
 * token-weighted exp(mean NLL).
 *
 * Options add the position-wise NLL curve (curve_bins) with its "windowed" control (attention
 * limited to the last `window` tokens, default Lt), the extrapolation criterion of METHODS
 * 3.3, and, on the generated corpus, teacher-forced recall accuracy by distance
 * (recall_by_distance.h) on the same windows (records perplexity_curve,
 * perplexity_extrapolation and perplexity_recall).
 *
 * Positions follow the `positions` option (METHODS.md 2.4): 0 .. L-1 by default, or gaps
 * U[eps, 1] for models trained with randomized positions, drawn per window from
 * (position_seed, L, window index).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctx/plugin.h"
#include "recall_by_distance.h"

#define MAX_LENGTHS 32

typedef struct perplexity {
    int64_t lengths[MAX_LENGTHS]; /* absolute lengths, or 0 while given as multiples */
    double multiples[MAX_LENGTHS];
    int n;
    int by_multiple;
    int64_t batch_size;
    int64_t max_windows; /* per length; 0 = all */
    int positions;       /* ctx_eval_positions */
    int64_t curve_bins;  /* 0: no position-wise curve */
    int windowed;
    int64_t window;      /* 0: Lt */
    int extrapolation;
    double position_eps;
    uint64_t position_seed;
    int recall;
    double recall_edges[RECALL_MAX_BINS + 1]; /* multiples of Lt */
    int n_recall_edges;
    recall_index recalls; /* built per run */
} perplexity;

static const ctx_option_desc options[] = {
    {"multiples", CTX_OPT_NUMBER_LIST, "{1, 2, 4}",
     "evaluation lengths as multiples of the model's original training length Lt"},
    {"lengths", CTX_OPT_NUMBER_LIST, NULL, "evaluation lengths in tokens (instead of multiples)"},
    {"batch_size", CTX_OPT_INTEGER, "4", "windows scored per forward pass"},
    {"max_windows", CTX_OPT_INTEGER, "0", "at most this many windows per length (0: all)"},
    {"positions", CTX_OPT_STRING, "gap1",
     "position policy: \"gap1\" (0, 1, 2, ...) or \"uniform\" (gaps U[position_eps, 1], for "
     "models trained with randomized positions)"},
    {"position_eps", CTX_OPT_NUMBER, "0.0625", "smallest gap of the uniform policy, in (0, 1]"},
    {"position_seed", CTX_OPT_INTEGER, "0", "seed of the uniform policy's gaps"},
    {"curve_bins", CTX_OPT_INTEGER, "0",
     "position-wise NLL curve: bins per length (0: off); records task perplexity_curve"},
    {"windowed", CTX_OPT_BOOL, "false",
     "also score with attention limited to the last `window` tokens (the windowed control)"},
    {"window", CTX_OPT_INTEGER, "0", "the windowed control's window (0: the model's original Lt)"},
    {"extrapolation", CTX_OPT_BOOL, "false",
     "METHODS 3.3 criterion: for each length k > Lt below the longest, compare the summed "
     "log-likelihood of tokens i >= k of the longest windows with context k and with context Lt"},
    {"recall", CTX_OPT_BOOL, "false",
     "teacher-forced recall accuracy by distance on the generated corpus's recalls (a value is "
     "right when the greedy prediction of each of its tokens is right); with `windowed`, also "
     "under the control; records task perplexity_recall; needs a tokenizer"},
    {"recall_bins", CTX_OPT_NUMBER_LIST, "{0, 1, 2, 4, 8, 16}",
     "recall distance bin edges, increasing multiples of Lt (bins [e_k Lt, e_k+1 Lt))"},
};

static ctx_status fail(ctx_err* err, const char* message) {
    ctx_err_set(err, message);
    return CTX_ERR_INVALID_ARGUMENT;
}

static ctx_status create(const ctx_host_api* host, const ctx_options* opts, void** instance,
                         ctx_err* err) {
    perplexity* p = calloc(1, sizeof(perplexity));
    if (!p) return CTX_ERR_OUT_OF_MEMORY;
    double values[MAX_LENGTHS];
    char msg[CTX_ERR_MESSAGE_CAP];
    const int has_lengths = host->opt_has(host->host, opts, "lengths");
    const int has_multiples = host->opt_has(host->host, opts, "multiples");
    if (has_lengths && has_multiples) {
        free(p);
        return fail(err, "give either 'lengths' or 'multiples', not both");
    }
    int64_t n;
    if (has_lengths) {
        n = host->opt_number_list(host->host, opts, "lengths", values, MAX_LENGTHS);
        p->by_multiple = 0;
    } else if (has_multiples) {
        n = host->opt_number_list(host->host, opts, "multiples", values, MAX_LENGTHS);
        p->by_multiple = 1;
    } else {
        values[0] = 1, values[1] = 2, values[2] = 4;
        n = 3;
        p->by_multiple = 1;
    }
    if (n < 1 || n > MAX_LENGTHS) {
        snprintf(msg, sizeof msg, "option '%s' needs 1 to %d values, got %lld",
                 p->by_multiple ? "multiples" : "lengths", MAX_LENGTHS, (long long)n);
        free(p);
        return fail(err, msg);
    }
    for (int i = 0; i < n; ++i) {
        const double v = values[i];
        const int bad = p->by_multiple ? !(v > 0) : !(v >= 1 && v == floor(v));
        if (bad) {
            snprintf(msg, sizeof msg, "option '%s' value %g at index %d must be %s",
                     p->by_multiple ? "multiples" : "lengths", v, i + 1,
                     p->by_multiple ? "positive" : "a positive integer");
            free(p);
            return fail(err, msg);
        }
        if (p->by_multiple) p->multiples[i] = v;
        else p->lengths[i] = (int64_t)v;
    }
    p->n = (int)n;
    p->batch_size = host->opt_integer(host->host, opts, "batch_size", 4);
    p->max_windows = host->opt_integer(host->host, opts, "max_windows", 0);
    if (p->batch_size < 1 || p->max_windows < 0) {
        free(p);
        return fail(err, "option 'batch_size' must be >= 1 and 'max_windows' >= 0");
    }
    p->curve_bins = host->opt_integer(host->host, opts, "curve_bins", 0);
    p->windowed = host->opt_bool(host->host, opts, "windowed", 0);
    p->window = host->opt_integer(host->host, opts, "window", 0);
    p->extrapolation = host->opt_bool(host->host, opts, "extrapolation", 0);
    if (p->curve_bins < 0 || p->window < 0) {
        free(p);
        return fail(err, "options 'curve_bins' and 'window' must be >= 0");
    }
    {
        const char* policy = host->opt_string(host->host, opts, "positions", "gap1");
        p->positions = ctx_eval_positions_from_name(policy);
        p->position_eps = host->opt_number(host->host, opts, "position_eps", 0.0625);
        p->position_seed = (uint64_t)host->opt_integer(host->host, opts, "position_seed", 0);
        if (p->positions < 0) {
            snprintf(msg, sizeof msg,
                     "option 'positions' must be \"gap1\" or \"uniform\", got \"%s\"",
                     policy ? policy : "(null)");
            free(p);
            return fail(err, msg);
        }
        if (!(p->position_eps > 0 && p->position_eps <= 1)) {
            snprintf(msg, sizeof msg, "option 'position_eps' must be in (0, 1], got %g",
                     p->position_eps);
            free(p);
            return fail(err, msg);
        }
    }
    p->recall = host->opt_bool(host->host, opts, "recall", 0);
    if (host->opt_has(host->host, opts, "recall_bins")) {
        const int64_t k = host->opt_number_list(host->host, opts, "recall_bins", p->recall_edges,
                                                RECALL_MAX_BINS + 1);
        int ok = k >= 2 && k <= RECALL_MAX_BINS + 1 && p->recall_edges[0] >= 0;
        for (int64_t i = 1; ok && i < k; ++i) ok = p->recall_edges[i] > p->recall_edges[i - 1];
        if (!ok) {
            snprintf(msg, sizeof msg,
                     "option 'recall_bins' needs 2 to %d increasing multiples of Lt starting at "
                     ">= 0 (got %lld values)",
                     RECALL_MAX_BINS + 1, (long long)k);
            free(p);
            return fail(err, msg);
        }
        p->n_recall_edges = (int)k;
    } else {
        static const double defaults[] = {0, 1, 2, 4, 8, 16};
        p->n_recall_edges = 6;
        memcpy(p->recall_edges, defaults, sizeof defaults);
    }
    *instance = p;
    return CTX_OK;
}

static void destroy(void* instance) { free(instance); }

typedef struct window_ref {
    int64_t doc, start;
} window_ref;

/* The first n_windows non-overlapping windows of length L (+ 1 target) of the documents, in
 * document order; *n_windows is capped at what exists. NULL (and *n_windows 0) when none. */
static window_ref* list_windows(const ctx_eval_api* api, ctx_eval_host* h, int64_t L,
                                int64_t max_windows, int64_t* n_windows) {
    const int64_t n_docs = api->num_documents(h);
    int64_t n = 0, w = 0;
    for (int64_t d = 0; d < n_docs; ++d) {
        const int64_t len = api->document_length(h, d);
        if (len > L) n += (len - 1) / L;
    }
    if (max_windows > 0 && n > max_windows) n = max_windows;
    *n_windows = n;
    if (n == 0) return NULL;
    window_ref* windows = malloc(sizeof(window_ref) * (size_t)n);
    if (!windows) {
        *n_windows = -1;
        return NULL;
    }
    for (int64_t d = 0; d < n_docs && w < n; ++d) {
        const int64_t len = api->document_length(h, d);
        for (int64_t k = 0; len > L && k < (len - 1) / L && w < n; ++k)
            windows[w++] = (window_ref){d, k * L};
    }
    return windows;
}

/* Scores every window with attention limited to the last `attn_window` tokens (0: full): sums
 * of per-window perplexity and NLL, (pos_nll, length L, when non-NULL) the NLL summed over
 * windows at each row position, and (recall, when non-NULL) the recalls of each window. */
static ctx_status score_windows(perplexity* p, const ctx_eval_api* api, ctx_eval_host* h,
                                const window_ref* windows, int64_t n_windows, int64_t L,
                                int64_t attn_window, double* sum_ppl, double* sum_nll,
                                double* pos_nll, recall_tally* recall, ctx_err* err) {
    const int64_t B = p->batch_size;
    ctx_status st = CTX_OK;
    int32_t* buf = malloc(sizeof(int32_t) * (size_t)(B * (L + 1)));
    int32_t* tok = malloc(sizeof(int32_t) * (size_t)(B * L));
    int32_t* tgt = malloc(sizeof(int32_t) * (size_t)(B * L));
    float* pos = malloc(sizeof(float) * (size_t)(B * L));
    float* lp = malloc(sizeof(float) * (size_t)(B * L));
    int32_t* am = recall ? malloc(sizeof(int32_t) * (size_t)(B * L)) : NULL;
    *sum_ppl = *sum_nll = 0;
    if (pos_nll) memset(pos_nll, 0, sizeof(double) * (size_t)L);
    if (!buf || !tok || !tgt || !pos || !lp || (recall && !am)) {
        st = CTX_ERR_OUT_OF_MEMORY;
        ctx_err_set(err, "out of memory for evaluation buffers");
    }
    if (st == CTX_OK && attn_window > 0 && !ctx_eval_api_has(api, row_logprobs_windowed)) {
        st = CTX_ERR_INVALID_ARGUMENT;
        ctx_err_set(err, "the windowed control needs a host with eval API 1.2 or newer");
    }
    for (int64_t first = 0; st == CTX_OK && first < n_windows; first += B) {
        const int64_t rows = n_windows - first < B ? n_windows - first : B;
        for (int64_t r = 0; r < rows && st == CTX_OK; ++r) {
            int32_t* row = buf + r * (L + 1);
            st = api->copy_tokens(h, windows[first + r].doc, windows[first + r].start, L + 1,
                                  row, err);
            for (int64_t t = 0; t < L; ++t) {
                tok[r * L + t] = row[t];
                tgt[r * L + t] = row[t + 1];
            }
            {
                /* gaps seeded per (seed, length, window): independent of batching */
                uint64_t rng[4];
                ctx_rng_seed(rng, p->position_seed ^ ((uint64_t)L << 40) ^
                                      (uint64_t)(first + r) * 0x9E3779B97F4A7C15ull);
                ctx_fill_eval_positions(pos + r * L, L, p->positions, p->position_eps, rng);
            }
        }
        if (st == CTX_OK && recall) {
            ctx_score_request q;
            memset(&q, 0, sizeof q);
            q.struct_size = sizeof q;
            q.tokens = tok, q.positions = pos, q.targets = tgt;
            q.n_rows = rows, q.row_len = L, q.window = (int32_t)attn_window;
            q.logprobs = lp, q.argmax = am;
            st = api->score_rows(h, &q, err);
        } else if (st == CTX_OK) {
            st = attn_window > 0
                     ? api->row_logprobs_windowed(h, tok, pos, tgt, rows, L, (int32_t)attn_window,
                                                  lp, err)
                     : api->row_logprobs(h, tok, pos, tgt, rows, L, lp, err);
        }
        for (int64_t r = 0; r < rows && st == CTX_OK && recall; ++r)
            st = recall_tally_window(recall, &p->recalls, api, h, windows[first + r].doc,
                                     windows[first + r].start, L, buf + r * (L + 1), am + r * L,
                                     lp + r * L, err);
        for (int64_t r = 0; r < rows && st == CTX_OK; ++r) {
            double nll = 0;
            for (int64_t t = 0; t < L; ++t) {
                nll -= lp[r * L + t];
                if (pos_nll) pos_nll[t] -= lp[r * L + t];
            }
            *sum_nll += nll;
            *sum_ppl += exp(nll / (double)L);
        }
    }
    free(buf);
    free(tok);
    free(tgt);
    free(pos);
    free(lp);
    free(am);
    return st;
}

static const char* policy_name(const perplexity* p) {
    return p->positions == CTX_EVAL_POSITIONS_UNIFORM ? "uniform" : "gap1";
}

/* Scores all windows of length L; writes the perplexity record and, when asked, the binned
 * position-wise curve (with its windowed control). */
static ctx_status eval_length(perplexity* p, const ctx_eval_api* api, ctx_eval_host* h,
                              int64_t L, double multiple, int64_t lt, int64_t control_window,
                              ctx_err* err) {
    int64_t n_windows = 0;
    window_ref* windows = list_windows(api, h, L, p->max_windows, &n_windows);
    double sum_ppl = 0, sum_nll = 0, w_ppl = 0, w_nll = 0;
    double *curve = NULL, *w_curve = NULL;
    const int windowed = p->windowed && control_window > 0;
    recall_tally recall, w_recall;
    ctx_status st = CTX_OK;
    recall_tally_init(&recall, p->recall_edges, p->n_recall_edges, lt, L);
    recall_tally_init(&w_recall, p->recall_edges, p->n_recall_edges, lt, L);
    if (n_windows < 0) return ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    if (n_windows == 0) {
        char msg[160];
        snprintf(msg, sizeof msg, "no held-out document is longer than %lld tokens", (long long)L);
        api->log(h, CTX_LOG_WARN, msg);
    }
    if (p->curve_bins > 0 && n_windows > 0) {
        curve = calloc((size_t)L, sizeof(double));
        w_curve = calloc((size_t)L, sizeof(double));
        if (!curve || !w_curve) st = ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    }
    if (st == CTX_OK && n_windows > 0)
        st = score_windows(p, api, h, windows, n_windows, L, 0, &sum_ppl, &sum_nll, curve,
                           p->recall ? &recall : NULL, err);
    if (st == CTX_OK && n_windows > 0 && windowed && control_window < L) {
        st = score_windows(p, api, h, windows, n_windows, L, control_window, &w_ppl, &w_nll,
                           w_curve, p->recall ? &w_recall : NULL, err);
    } else if (st == CTX_OK && windowed) {
        /* a window of at least the row's length is full causal attention: same numbers */
        w_ppl = sum_ppl, w_nll = sum_nll, w_recall = recall;
        if (curve) memcpy(w_curve, curve, sizeof(double) * (size_t)L);
    }
    const int64_t tokens = n_windows * L;
    if (st == CTX_OK) {
        api->record_begin(h, "perplexity");
        api->record_number(h, "length", (double)L);
        api->record_number(h, "multiple", multiple);
        api->record_string(h, "positions", policy_name(p));
        api->record_number(h, "windows", (double)n_windows);
        api->record_number(h, "tokens", (double)tokens);
        api->record_number(h, "mean_ppl", n_windows ? sum_ppl / (double)n_windows : NAN);
        api->record_number(h, "token_ppl", tokens ? exp(sum_nll / (double)tokens) : NAN);
        api->record_number(h, "mean_nll", tokens ? sum_nll / (double)tokens : NAN);
        if (p->windowed) {
            api->record_number(h, "window", (double)control_window);
            api->record_number(h, "windowed_mean_ppl",
                               windowed && n_windows ? w_ppl / (double)n_windows : NAN);
            api->record_number(h, "windowed_mean_nll",
                               windowed && tokens ? w_nll / (double)tokens : NAN);
        }
        st = api->record_end(h, err);
    }
    /* Bin b covers row positions [b L / bins, (b + 1) L / bins): mean NLL per token there. */
    for (int64_t b = 0; st == CTX_OK && curve && b < p->curve_bins && b < L; ++b) {
        const int64_t bins = p->curve_bins < L ? p->curve_bins : L;
        const int64_t lo = b * L / bins, hi = (b + 1) * L / bins;
        double s = 0, ws = 0;
        for (int64_t t = lo; t < hi; ++t) {
            s += curve[t];
            ws += w_curve[t];
        }
        const double n = (double)(hi - lo) * (double)n_windows;
        api->record_begin(h, "perplexity_curve");
        api->record_number(h, "length", (double)L);
        api->record_string(h, "positions", policy_name(p));
        api->record_number(h, "bin", (double)b);
        api->record_number(h, "pos_start", (double)lo);
        api->record_number(h, "pos_end", (double)hi);
        api->record_number(h, "tokens", n);
        api->record_number(h, "mean_nll", s / n);
        if (p->windowed) {
            api->record_number(h, "window", (double)control_window);
            api->record_number(h, "windowed_mean_nll", windowed ? ws / n : NAN);
        }
        st = api->record_end(h, err);
    }
    for (int b = 0; st == CTX_OK && p->recall && b < recall.n_bins; ++b) {
        api->record_begin(h, "perplexity_recall");
        api->record_number(h, "length", (double)L);
        api->record_number(h, "multiple", multiple);
        api->record_string(h, "positions", policy_name(p));
        api->record_number(h, "distance_from", (double)recall.edges[b]);
        api->record_number(h, "distance_to", (double)recall.edges[b + 1]);
        api->record_number(h, "recalls", (double)recall.count[b]);
        api->record_number(h, "accuracy", recall.count[b] ? (double)recall.correct[b] /
                                                                (double)recall.count[b]
                                                          : NAN);
        api->record_number(h, "questions", (double)recall.questions[b]);
        api->record_number(h, "question_accuracy",
                           recall.questions[b] ? (double)recall.questions_correct[b] /
                                                     (double)recall.questions[b]
                                               : NAN);
        api->record_number(h, "value_nll", recall.value_tokens[b]
                                               ? recall.value_nll[b] / (double)recall.value_tokens[b]
                                               : NAN);
        if (p->windowed) {
            const recall_tally* w = &w_recall;
            api->record_number(h, "window", (double)control_window);
            api->record_number(h, "windowed_accuracy",
                               windowed && w->count[b] ? (double)w->correct[b] / (double)w->count[b]
                                                       : NAN);
            api->record_number(h, "windowed_value_nll",
                               windowed && w->value_tokens[b]
                                   ? w->value_nll[b] / (double)w->value_tokens[b]
                                   : NAN);
        }
        st = api->record_end(h, err);
    }
    free(curve);
    free(w_curve);
    free(windows);
    return st;
}

/* METHODS 3.3: on the windows of the longest length Lmax, for each k with Lt < k < Lmax, the
 * summed log-likelihood of the predictions made at row positions t >= k (where a context of k
 * tokens is shorter than the full prefix) with context k (attention to the last k tokens) and
 * with context Lt. The model extrapolates to k when the former is larger. */
static ctx_status eval_extrapolation(perplexity* p, const ctx_eval_api* api, ctx_eval_host* h,
                                     const int64_t* lengths, int n, int64_t lt, ctx_err* err) {
    int64_t lmax = 0, n_windows = 0;
    for (int i = 0; i < n; ++i)
        if (lengths[i] > lmax) lmax = lengths[i];
    window_ref* windows = list_windows(api, h, lmax, p->max_windows, &n_windows);
    double *at_lt = NULL, *at_k = NULL, ppl, nll;
    ctx_status st = CTX_OK;
    if (n_windows <= 0) {
        free(windows);
        api->log(h, CTX_LOG_WARN, "extrapolation: no held-out window of the longest length");
        return n_windows < 0 ? ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory") : CTX_OK;
    }
    at_lt = calloc((size_t)lmax, sizeof(double));
    at_k = calloc((size_t)lmax, sizeof(double));
    if (!at_lt || !at_k) st = ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == CTX_OK)
        st = score_windows(p, api, h, windows, n_windows, lmax, lt, &ppl, &nll, at_lt, NULL, err);
    for (int i = 0; st == CTX_OK && i < n; ++i) {
        const int64_t k = lengths[i];
        double ll_k = 0, ll_lt = 0;
        if (k <= lt || k >= lmax) continue;
        st = score_windows(p, api, h, windows, n_windows, lmax, k, &ppl, &nll, at_k, NULL, err);
        for (int64_t t = k; t < lmax; ++t) {
            ll_k -= at_k[t];
            ll_lt -= at_lt[t];
        }
        if (st != CTX_OK) break;
        api->record_begin(h, "perplexity_extrapolation");
        api->record_number(h, "context", (double)k);
        api->record_number(h, "trained_length", (double)lt);
        api->record_number(h, "length", (double)lmax);
        api->record_string(h, "positions", policy_name(p));
        api->record_number(h, "windows", (double)n_windows);
        api->record_number(h, "tokens", (double)((lmax - k) * n_windows));
        api->record_number(h, "loglik_context", ll_k);
        api->record_number(h, "loglik_trained", ll_lt);
        api->record_number(h, "extrapolates", ll_k > ll_lt ? 1.0 : 0.0);
        st = api->record_end(h, err);
    }
    free(at_lt);
    free(at_k);
    free(windows);
    return st;
}

static ctx_status run(void* instance, const ctx_eval_api* api, ctx_eval_host* h, ctx_err* err) {
    perplexity* p = instance;
    ctx_eval_model_info info = {0};
    int64_t lengths[MAX_LENGTHS];
    api->model_info(h, &info);
    const int64_t lt = info.trained_length > 0 ? info.trained_length : info.context_length;
    const int64_t control = p->window > 0 ? p->window : lt;
    ctx_status st = p->recall ? recall_index_init(&p->recalls, api, h, err) : CTX_OK;
    for (int i = 0; st == CTX_OK && i < p->n; ++i) {
        const int64_t L = p->by_multiple ? (int64_t)llround(p->multiples[i] * (double)lt)
                                         : p->lengths[i];
        const double multiple = (double)L / (double)lt;
        if (L < 1) {
            st = fail(err, "an evaluation length rounds to 0 tokens");
            break;
        }
        lengths[i] = L;
        st = eval_length(p, api, h, L, multiple, lt, control, err);
    }
    if (st == CTX_OK && p->recall && p->recalls.skipped > 0) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "recall: %lld documents skipped: their tokens do not decode one by one",
                 (long long)p->recalls.skipped);
        api->log(h, CTX_LOG_WARN, msg);
    }
    if (p->recall) recall_index_free(&p->recalls);
    if (st != CTX_OK) return st;
    return p->extrapolation ? eval_extrapolation(p, api, h, lengths, p->n, lt, err) : CTX_OK;
}

static const ctx_eval_vtable vtable = {sizeof(ctx_eval_vtable), create, destroy, run};

static const ctx_plugin_descriptor descriptor = {
    CTX_PLUGIN_ABI_MAJOR, CTX_PLUGIN_ABI_MINOR, sizeof(ctx_plugin_descriptor), CTX_PLUGIN_EVAL,
    "perplexity", "1.2.0",
    "mean per-window and token-weighted perplexity at multiples of Lt (METHODS.md 3.3)",
    options, (int32_t)(sizeof options / sizeof options[0]), &vtable};

CTX_PLUGIN_EXPORT const ctx_plugin_descriptor* ctx_plugin_query(void) { return &descriptor; }
