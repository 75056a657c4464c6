/*
 * The recall markup of ctxengine's generated corpus (docs/CORPORA.md), for eval tasks.
 *
 * A generated document states facts ("Note: <phrase> is <value>.") and later recalls them
 * ("Reminder: <phrase> is <value>." or "Question: what is <phrase>? Answer: <value>."). A recall's
 * value can only be predicted by copying it from the latest earlier mention of the same phrase,
 * its source. ctx_find_recall_spans recovers every recall and its source from the text alone, so
 * an eval plugin can score retrieval by distance on held-out documents. The engine's corpus
 * generator (data/corpus.h) and its tests use this same parser.
 *
 * Header-only C (static inline), allocation through malloc; no engine symbol is needed.
 */
#ifndef CTX_RECALL_SPANS_H
#define CTX_RECALL_SPANS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Byte offsets into the text. */
typedef struct ctx_recall_span {
    int64_t value_begin, value_end;   /* the recalled value: text[value_begin, value_end) */
    int64_t source_begin, source_end; /* the latest earlier mention of the same value */
    int32_t question;                 /* 1: "Question: ... Answer: V." 0: "Reminder: ..." */
} ctx_recall_span;

/* Position of needle in text[from, len), or -1. */
static inline int64_t ctx_recall_find_(const char* text, int64_t len, int64_t from,
                                       const char* needle) {
    const int64_t n = (int64_t)strlen(needle);
    for (int64_t i = from; i + n <= len; ++i)
        if (text[i] == needle[0] && memcmp(text + i, needle, (size_t)n) == 0) return i;
    return -1;
}

/* A mention: phrase text[phrase_begin, phrase_end), value text[value_begin, value_end). */
typedef struct ctx_recall_mention_ {
    int64_t phrase_begin, phrase_end, value_begin, value_end;
} ctx_recall_mention_;

/* Finds the recalls of `text` in document order. Writes at most `cap` spans to `out` (out may be
 * NULL when cap is 0) and returns how many there are, or -1 when memory runs out.
 *
 * A mention starts at a marker ("Note: ", "Reminder: ", "Question: what is ") and ends at the
 * first '.' after it; one without a '.' (cut off by the document's end) or containing a newline
 * is ignored. Its phrase and value are split at the last " is " (Note, Reminder) or at
 * "? Answer: " (Question). A Reminder or Question whose phrase was mentioned before is a recall;
 * every mention, recall or not, becomes the phrase's latest mention. */
static inline int64_t ctx_find_recall_spans(const char* text, int64_t len, ctx_recall_span* out,
                                            int64_t cap) {
    static const char* const markers[3] = {"Note: ", "Reminder: ", "Question: what is "};
    const char* answer = "? Answer: ";
    int64_t next[3], n_out = 0, n_men = 0, cap_men = 64;
    ctx_recall_mention_* men = (ctx_recall_mention_*)malloc(sizeof(ctx_recall_mention_) * 64);
    if (!men) return -1;
    for (int m = 0; m < 3; ++m) next[m] = ctx_recall_find_(text, len, 0, markers[m]);
    for (;;) {
        int m = -1;
        for (int k = 0; k < 3; ++k)
            if (next[k] >= 0 && (m < 0 || next[k] < next[m])) m = k;
        if (m < 0) break;
        const int64_t at = next[m];
        next[m] = ctx_recall_find_(text, len, at + 1, markers[m]);
        const int64_t body = at + (int64_t)strlen(markers[m]);
        int64_t dot = -1, newline = 0;
        for (int64_t i = body; i < len; ++i) {
            if (text[i] == '.') {
                dot = i;
                break;
            }
            newline |= text[i] == '\n';
        }
        if (dot < 0 || newline) continue;
        int64_t phrase_end, vbegin;
        if (m == 2) {
            const int64_t q = ctx_recall_find_(text, dot, body, answer);
            if (q < 0) continue;
            phrase_end = q;
            vbegin = q + (int64_t)strlen(answer);
        } else {
            int64_t k = -1;
            for (int64_t i = dot - 4; i >= body; --i)
                if (memcmp(text + i, " is ", 4) == 0) {
                    k = i;
                    break;
                }
            if (k < 0) continue;
            phrase_end = k;
            vbegin = k + 4;
        }
        if (vbegin >= dot || phrase_end == body) continue;
        /* the latest earlier mention of the same phrase */
        int64_t latest = -1;
        const int64_t plen = phrase_end - body;
        for (int64_t i = n_men - 1; i >= 0 && latest < 0; --i)
            if (men[i].phrase_end - men[i].phrase_begin == plen &&
                memcmp(text + men[i].phrase_begin, text + body, (size_t)plen) == 0)
                latest = i;
        if (m != 0 && latest >= 0) {
            if (n_out < cap) {
                ctx_recall_span r;
                r.value_begin = vbegin;
                r.value_end = dot;
                r.source_begin = men[latest].value_begin;
                r.source_end = men[latest].value_end;
                r.question = m == 2;
                out[n_out] = r;
            }
            ++n_out;
        }
        if (latest >= 0) { /* now the latest: move it to the end so later searches stop early */
            memmove(men + latest, men + latest + 1,
                    sizeof(ctx_recall_mention_) * (size_t)(n_men - latest - 1));
            --n_men;
        }
        if (n_men == cap_men) {
            ctx_recall_mention_* grown = (ctx_recall_mention_*)realloc(
                men, sizeof(ctx_recall_mention_) * (size_t)(cap_men * 2));
            if (!grown) {
                free(men);
                return -1;
            }
            men = grown;
            cap_men *= 2;
        }
        men[n_men].phrase_begin = body;
        men[n_men].phrase_end = phrase_end;
        men[n_men].value_begin = vbegin;
        men[n_men].value_end = dot;
        ++n_men;
    }
    free(men);
    return n_out;
}

#ifdef __cplusplus
}
#endif

#endif /* CTX_RECALL_SPANS_H */
