/* Teacher-forced recall accuracy by distance for eval/perplexity (docs/EVAL.md).
 *
 * On documents of the generated corpus (ctx/recall_spans.h) every recalled value can only be
 * predicted by copying it from its source, the latest earlier mention. Inside a scored window
 * a recall counts when its source token and all of its value tokens lie in the window; it is
 * correct when the model's greedy prediction (argmax) of every value token, given the true
 * prefix, is that token. Recalls are binned by distance = (first value token) - (first source
 * token), in tokens, with bin edges given as multiples of Lt. The same windows scored with the
 * windowed control give the accuracy a model limited to its last W tokens reaches: for
 * distances >= W it is what can be guessed without the source. */
#ifndef CTX_EVAL_RECALL_BY_DISTANCE_H
#define CTX_EVAL_RECALL_BY_DISTANCE_H

#include "ctx/plugin.h"

#define RECALL_MAX_BINS 16

typedef struct recall_item {
    int64_t value_begin, value_end; /* value tokens [value_begin, value_end) of the document */
    int64_t source;                 /* the token holding the source's first byte */
    int question;                   /* "Question: ... Answer: V." (else "Reminder: ... is V.") */
} recall_item;

typedef struct recall_doc {
    recall_item* items;
    int64_t n;
    int loaded;
} recall_doc;

/* Recall spans of the held-out documents in token indices, found on first use. */
typedef struct recall_index {
    recall_doc* docs;
    int64_t n_docs;
    int64_t skipped; /* documents whose per-token decoding does not add up to their text */
} recall_index;

/* Counts per distance bin for one length and one attention window. */
typedef struct recall_tally {
    int n_bins;
    int64_t edges[RECALL_MAX_BINS + 1]; /* tokens; bin b is [edges[b], edges[b + 1]) */
    int64_t count[RECALL_MAX_BINS], correct[RECALL_MAX_BINS];
    int64_t questions[RECALL_MAX_BINS], questions_correct[RECALL_MAX_BINS]; /* of the above */
    double value_nll[RECALL_MAX_BINS];  /* summed over value tokens */
    int64_t value_tokens[RECALL_MAX_BINS];
} recall_tally;

ctx_status recall_index_init(recall_index* index, const ctx_eval_api* api, ctx_eval_host* h,
                             ctx_err* err);
void recall_index_free(recall_index* index);

/* Bins from edge multiples of lt, keeping those that start below the window length L. */
void recall_tally_init(recall_tally* tally, const double* edge_multiples, int n_edges, int64_t lt,
                       int64_t L);

/* Scores the recalls of one window: tokens = document tokens [start, start + L] (L + 1 of
 * them), argmax and logprobs (L each) predict tokens[1..L]. Loads the document's spans on
 * first use. */
ctx_status recall_tally_window(recall_tally* tally, recall_index* index, const ctx_eval_api* api,
                               ctx_eval_host* h, int64_t doc, int64_t start, int64_t L,
                               const int32_t* tokens, const int32_t* argmax,
                               const float* logprobs, ctx_err* err);

#endif
