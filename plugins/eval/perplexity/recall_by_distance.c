/* Teacher-forced recall accuracy by distance: see recall_by_distance.h. */
#include "recall_by_distance.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctx/recall_spans.h"

ctx_status recall_index_init(recall_index* index, const ctx_eval_api* api, ctx_eval_host* h,
                             ctx_err* err) {
    memset(index, 0, sizeof *index);
    if (!ctx_eval_api_has(api, detokenize) || !ctx_eval_api_has(api, score_rows))
        return ctx_err_setf(err, CTX_ERR_UNSUPPORTED,
                            "option 'recall' needs a host with eval API 1.3 or newer");
    index->n_docs = api->num_documents(h);
    index->docs = calloc((size_t)(index->n_docs > 0 ? index->n_docs : 1), sizeof(recall_doc));
    if (!index->docs) return ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    return CTX_OK;
}

void recall_index_free(recall_index* index) {
    for (int64_t d = 0; d < index->n_docs; ++d) free(index->docs[d].items);
    free(index->docs);
    memset(index, 0, sizeof *index);
}

/* The token holding byte b: the last token whose first byte is <= b (tokens that decode to
 * nothing share their successor's start and lose the tie to it). */
static int64_t token_of_byte(const int64_t* starts, int64_t n, int64_t b) {
    int64_t lo = 0, hi = n; /* first index with starts[i] > b */
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (starts[mid] <= b) lo = mid + 1;
        else hi = mid;
    }
    return lo - 1;
}

/* Decodes document d token by token (so byte offsets map to tokens), checks that the pieces add
 * up to the document's decoded text, and converts its recall spans to token indices. */
static ctx_status load_doc(recall_index* index, const ctx_eval_api* api, ctx_eval_host* h,
                           int64_t d, ctx_err* err) {
    recall_doc* rd = &index->docs[d];
    const int64_t n = api->document_length(h, d);
    int32_t* ids = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    int64_t* starts = malloc(sizeof(int64_t) * (size_t)(n + 1));
    int64_t cap = n * 4 + 64, len = 0, whole = 0, n_spans = 0;
    char *text = malloc((size_t)cap), *check = NULL;
    ctx_recall_span* spans = NULL;
    ctx_status st = CTX_OK;
    rd->loaded = 1;
    if (!ids || !starts || !text) st = ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == CTX_OK) st = api->copy_tokens(h, d, 0, n, ids, err);
    for (int64_t i = 0; st == CTX_OK && i < n; ++i) {
        int64_t k = api->detokenize(h, ids + i, 1, text + len, cap - len, err);
        if (k < 0) {
            st = CTX_ERR_INVALID_ARGUMENT;
            break;
        }
        if (len + k + 1 > cap) { /* grow and decode this token again */
            cap = 2 * (len + k + 1);
            char* grown = realloc(text, (size_t)cap);
            if (!grown) {
                st = ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
                break;
            }
            text = grown;
            k = api->detokenize(h, ids + i, 1, text + len, cap - len, err);
        }
        starts[i] = len;
        len += k;
    }
    if (st == CTX_OK) {
        starts[n] = len;
        check = malloc((size_t)len + 1);
        if (!check) st = ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    }
    if (st == CTX_OK) {
        whole = api->detokenize(h, ids, n, check, len + 1, err);
        if (whole < 0) st = CTX_ERR_INVALID_ARGUMENT;
    }
    if (st == CTX_OK && (whole != len || memcmp(check, text, (size_t)len) != 0)) {
        /* a tokenizer whose tokens do not decode one by one (multi-byte characters split
         * across byte-level BPE tokens): no byte offsets, so no recalls from this document */
        ++index->skipped;
    } else if (st == CTX_OK) {
        n_spans = ctx_find_recall_spans(text, len, NULL, 0);
        if (n_spans > 0) spans = malloc(sizeof(ctx_recall_span) * (size_t)n_spans);
        if (n_spans > 0 && spans) n_spans = ctx_find_recall_spans(text, len, spans, n_spans);
        if (n_spans < 0 || (n_spans > 0 && !spans)) {
            st = ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
        } else if (n_spans > 0) {
            rd->items = malloc(sizeof(recall_item) * (size_t)n_spans);
            if (!rd->items) st = ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
            for (int64_t s = 0; st == CTX_OK && s < n_spans; ++s) {
                recall_item* it = &rd->items[rd->n++];
                it->value_begin = token_of_byte(starts, n, spans[s].value_begin);
                it->value_end = token_of_byte(starts, n, spans[s].value_end - 1) + 1;
                it->source = token_of_byte(starts, n, spans[s].source_begin);
                it->question = spans[s].question;
            }
        }
    }
    free(ids);
    free(starts);
    free(text);
    free(check);
    free(spans);
    return st;
}

void recall_tally_init(recall_tally* tally, const double* edge_multiples, int n_edges, int64_t lt,
                       int64_t L) {
    memset(tally, 0, sizeof *tally);
    for (int e = 0; e + 1 < n_edges && tally->n_bins < RECALL_MAX_BINS; ++e) {
        const int64_t lo = (int64_t)(edge_multiples[e] * (double)lt + 0.5);
        if (lo >= L) break; /* no recall of that distance fits a window of L tokens */
        tally->edges[tally->n_bins] = lo;
        tally->edges[tally->n_bins + 1] = (int64_t)(edge_multiples[e + 1] * (double)lt + 0.5);
        ++tally->n_bins;
    }
}

ctx_status recall_tally_window(recall_tally* tally, recall_index* index, const ctx_eval_api* api,
                               ctx_eval_host* h, int64_t doc, int64_t start, int64_t L,
                               const int32_t* tokens, const int32_t* argmax,
                               const float* logprobs, ctx_err* err) {
    recall_doc* rd = &index->docs[doc];
    if (!rd->loaded) {
        const ctx_status st = load_doc(index, api, h, doc, err);
        if (st != CTX_OK) return st;
    }
    for (int64_t i = 0; i < rd->n; ++i) {
        const recall_item* it = &rd->items[i];
        /* the source is an input and every value token a target of this window */
        if (it->source < start || it->value_begin < start + 1 || it->value_end > start + L + 1)
            continue;
        const int64_t distance = it->value_begin - it->source;
        int b = -1;
        for (int k = 0; k < tally->n_bins && b < 0; ++k)
            if (distance >= tally->edges[k] && distance < tally->edges[k + 1]) b = k;
        if (b < 0) continue;
        int right = 1;
        for (int64_t j = it->value_begin; j < it->value_end; ++j) {
            const int64_t t = j - start - 1; /* row position whose target is token j */
            right = right && argmax[t] == tokens[t + 1];
            tally->value_nll[b] -= logprobs[t];
        }
        tally->value_tokens[b] += it->value_end - it->value_begin;
        tally->count[b] += 1;
        tally->correct[b] += right;
        tally->questions[b] += it->question != 0;
        tally->questions_correct[b] += it->question != 0 && right;
    }
    return CTX_OK;
}
