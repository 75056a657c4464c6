// A deterministic synthetic corpus of long English-like documents with long-range dependencies,
// for testing context extension end to end without downloading data.
//
// How the long-range dependency arises. A document keeps `facts_per_doc` facts "live": each is
// a (phrase, value) pair such as ("the vault code of Harbor Station", "48213") whose value is
// drawn at random, so nothing but an earlier mention can predict it. The document opens with a
// block stating the live facts ("Note: the vault code of Harbor Station is 48213."), then runs
// paragraphs of filler generated from a small grammar and word lists (locally predictable:
// spelling and sentence shape; not trivially: word choices are random). Each live fact is
// scheduled to be RECALLED at a distance d after its latest mention, d log-uniform in
// [min_distance, max_distance] bytes (defaults 192..4096: 3*64 .. 16*256), as a reminder
// ("Reminder: the vault code of Harbor Station is 48213.") or a question ("Question: what is the
// vault code of Harbor Station? Answer: 48213."). After max_recalls_per_fact recalls (or when a
// due recall is skipped, probability 1 - recall_rate) the fact retires and a new one is stated
// inline ("Note: ..."), so dependencies run through the whole document, not only its start. A
// model that sees d bytes of context can copy a recalled value; one limited to fewer bytes can
// only guess it (1 in 10^5 for a vault code). Bytes are tokens under the byte tokenizer, so the
// spans below index tokens too.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ctx {

struct CorpusOptions {
    int64_t n_docs = 1000;
    int64_t min_len = 2000;   // document length in bytes, uniform in [min_len, max_len]
    int64_t max_len = 12000;
    uint64_t seed = 1;
    int facts_per_doc = 6;          // facts live at once
    double recall_rate = 0.9;       // P(a fact that falls due is recalled) else it retires
    int max_recalls_per_fact = 3;   // then it retires and a new fact is stated
    int64_t min_distance = 192;     // bytes from a value's latest mention to its recall
    int64_t max_distance = 4096;
    double far_fraction = 0.0;      // P(a distance is drawn from [max_distance, far_distance])
    int64_t far_distance = 0;       //   (log-uniform): a tail of far recalls
    double local_repeat = 0.0;      // P(a filler name/thing/place is the paragraph's own)
    void validate() const;          // ctx::Error naming the bad field
};

// A recalled value and the mention it can be copied from. Offsets are bytes of the document.
struct RecallSpan {
    int64_t value_begin = 0, value_end = 0;    // the recalled value: text[value_begin, value_end)
    int64_t source_begin = 0, source_end = 0;  // the latest earlier mention of the same value
    bool question = false;                     // "Question: ... Answer: V." (else "Reminder:")
    // Context needed to see the source's first byte when predicting the value's first byte.
    int64_t distance() const { return value_begin - source_begin; }
    bool operator==(const RecallSpan&) const = default;
};

struct CorpusDoc {
    std::string text;
    std::vector<RecallSpan> recalls;  // in document order, as the generator placed them
    int64_t n_facts = 0;              // facts stated (opening block and inline)
};

// Document `index` depends only on (options, index), not on n_docs: generating 10 or 1000
// documents gives the same first 10.
CorpusDoc generate_document(const CorpusOptions& options, int64_t index);
std::vector<CorpusDoc> generate_corpus(const CorpusOptions& options);

// The recall spans of a document, recovered from its text alone (for evaluation on decoded
// shards, where the generator's record is gone). For a generated document this equals
// doc.recalls. A recall whose phrase was never stated earlier is not reported.
std::vector<RecallSpan> find_recall_spans(std::string_view text);

}  // namespace ctx
