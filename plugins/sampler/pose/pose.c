/*
 * sampler/pose: PoSE, positional skip-wise training (METHODS.md 5.2; Zhu et al., arXiv 2309.10400).
 *
 * A row of L = row_len tokens simulates positions up to Le = window_len. It is cut into N chunks
 * (option `chunks`, default 2) at N - 1 cut points drawn as a uniform subset of {1 .. L-1} (Floyd),
 * so chunk i has l_i >= 1 tokens and starts at row offset st_i = l_0 + ... + l_{i-1}. Skip biases:
 * u_0 = 0 and u_i uniform on {u_{i-1} .. Le - L} (non-decreasing, the paper's scheme), so chunk i
 * has the contiguous positions st_i + u_i .. st_i + u_i + l_i - 1; the last one is at most
 * Le - 1.
 *
 * Content (option `content`):
 *   "skip"       (default, v_i = u_i): the document's tokens at those positions, so content and
 *                positions agree, as in chunk-alpha;
 *   "contiguous" (v_i = 0): the row's tokens are x[0 .. L-1], with the skipped positions.
 * Targets: every token predicts its true next token x[p + 1] (x[r + 1] for contiguous content),
 * mask 1. At the last token of a chunk followed by a skip (u_{i+1} > u_i), option `boundary`, as
 * for sampler/chunk: "concat" (default) the next chunk's first token, "next" the true next token,
 * "mask" the true next token with mask 0. With contiguous content the next row token is the true
 * next token, so "concat" and "next" agree there.
 */
#include <ctx/plugin.h>

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { BOUNDARY_CONCAT = 0, BOUNDARY_NEXT = 1, BOUNDARY_MASK = 2 };
enum { CONTENT_SKIP = 0, CONTENT_CONTIGUOUS = 1 };

typedef struct pose_sampler {
    int64_t chunks;
    int32_t boundary, content;
} pose_sampler;

static ctx_status pose_create(const ctx_host_api* host, const ctx_options* options,
                              void** instance, ctx_err* err) {
    double n;
    const char *boundary, *content;
    int32_t b, c;
    pose_sampler* p;
    if (!host || !instance)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: NULL host or instance");
    if (host->struct_size < CTX_OFFSET_END(ctx_host_api, opt_string) || !host->opt_number ||
        !host->opt_string)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: the host API is too old");
    *instance = NULL;

    n = host->opt_number(host->host, options, "chunks", 2.0);
    if (!(isfinite(n) && n >= 1.0 && n <= 1e6 && n == floor(n)))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                            "option 'chunks' must be an integer >= 1, got %g", n);

    boundary = host->opt_string(host->host, options, "boundary", "concat");
    if (boundary && strcmp(boundary, "concat") == 0)
        b = BOUNDARY_CONCAT;
    else if (boundary && strcmp(boundary, "next") == 0)
        b = BOUNDARY_NEXT;
    else if (boundary && strcmp(boundary, "mask") == 0)
        b = BOUNDARY_MASK;
    else
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                            "option 'boundary' must be \"concat\", \"next\" or \"mask\", got \"%s\"",
                            boundary ? boundary : "(null)");

    content = host->opt_string(host->host, options, "content", "skip");
    if (content && strcmp(content, "skip") == 0)
        c = CONTENT_SKIP;
    else if (content && strcmp(content, "contiguous") == 0)
        c = CONTENT_CONTIGUOUS;
    else
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                            "option 'content' must be \"skip\" or \"contiguous\", got \"%s\"",
                            content ? content : "(null)");

    p = (pose_sampler*)calloc(1, sizeof *p);
    if (!p) return ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    p->chunks = (int64_t)n;
    p->boundary = b;
    p->content = c;
    *instance = p;
    return CTX_OK;
}

static void pose_destroy(void* instance) { free(instance); }

static ctx_status pose_sample(void* instance, const int32_t* window, int64_t window_len,
                              uint64_t rng_state[4], ctx_sample_row* row, ctx_err* err) {
    const pose_sampler* p = (const pose_sampler*)instance;
    int64_t L, N, free_len, i, r;
    int64_t* cut; /* (N + 1): 0, the N - 1 sorted cut points, L */
    int64_t* u;   /* (N) skip biases */
    if (!p || !window || !row || !rng_state)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "sample: NULL argument");
    L = row->row_len;
    N = p->chunks;
    if (L <= 0 || L > window_len)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                            "row_len %lld must be in [1, window_len = %lld]", (long long)L,
                            (long long)window_len);
    if (N > L)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                            "option 'chunks' = %lld: more chunks than the row has tokens "
                            "(row_len %lld)", (long long)N, (long long)L);
    free_len = window_len - L; /* Le - Lt: the largest skip */

    cut = (int64_t*)malloc(sizeof(int64_t) * (size_t)(2 * N + 1));
    if (!cut) return ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    u = cut + N + 1;
    /* the cut points: a uniform (N-1)-subset of {1 .. L-1}, i.e. of {0 .. L-2} shifted by one */
    ctx_rng_sorted_subset(rng_state, L - 1, N - 1, cut + 1);
    for (i = 1; i < N; ++i) ++cut[i];
    cut[0] = 0;
    cut[N] = L;
    u[0] = 0;
    for (i = 1; i < N; ++i)
        u[i] = u[i - 1] + (int64_t)ctx_rng_below(rng_state, (uint64_t)(free_len - u[i - 1] + 1));

    for (i = 0; i < N; ++i) {
        for (r = cut[i]; r < cut[i + 1]; ++r) {
            const int64_t pos = r + u[i];
            const int64_t src = p->content == CONTENT_SKIP ? pos : r;
            row->tokens[r] = window[src];
            if (row->source) row->source[r] = src;
            row->positions[r] = (float)pos;
            row->targets[r] = window[src + 1];
            row->loss_mask[r] = 1.0f;
            if (r == cut[i + 1] - 1 && i + 1 < N && u[i + 1] > u[i]) { /* a skip follows */
                if (p->boundary == BOUNDARY_CONCAT)
                    row->targets[r] = window[p->content == CONTENT_SKIP ? r + 1 + u[i + 1] : r + 1];
                else if (p->boundary == BOUNDARY_MASK)
                    row->loss_mask[r] = 0.0f;
            }
        }
    }
    free(cut);
    return CTX_OK;
}

static const ctx_option_desc pose_options[] = {
    {"chunks", CTX_OPT_NUMBER, "2",
     "N: the row is cut into N chunks at uniformly random points (paper: 2)"},
    {"content", CTX_OPT_STRING, "skip",
     "\"skip\": the document's tokens at the skipped positions (content follows positions); "
     "\"contiguous\": the row's first row_len tokens, only the positions skip"},
    {"boundary", CTX_OPT_STRING, "concat",
     "target at a chunk's last token before a skip: \"concat\" the next chunk's first token, "
     "\"next\" the true next token, \"mask\" no loss"},
};

static const ctx_sampler_vtable pose_vtable = {
    sizeof(ctx_sampler_vtable),
    pose_create,
    pose_destroy,
    pose_sample,
};

static const ctx_plugin_descriptor pose_descriptor = {
    CTX_PLUGIN_ABI_MAJOR,
    CTX_PLUGIN_ABI_MINOR,
    sizeof(ctx_plugin_descriptor),
    CTX_PLUGIN_SAMPLER,
    "pose",
    "1.0.0",
    "PoSE: the row in N chunks with non-decreasing random position skips up to window_len "
    "(METHODS 5.2)",
    pose_options,
    (int32_t)(sizeof pose_options / sizeof pose_options[0]),
    &pose_vtable,
};

CTX_PLUGIN_EXPORT const ctx_plugin_descriptor* ctx_plugin_query(void) { return &pose_descriptor; }
