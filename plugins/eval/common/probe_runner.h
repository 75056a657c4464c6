// The length x depth sweep eval/passkey and eval/ruler_niah share (docs/EVAL.md): options,
// generation and teacher-forced scoring of every item with full attention and with the windowed
// control, and the records (per item, per (length, depth), per length, effective length).
// Header-only like retrieval_common.h; the tasks supply the prompts and the scoring rule.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "haystack.h"
#include "retrieval_common.h"

namespace ctx_retrieval {

// Option declarations both tasks have (defaults as printable text), listed inside each task's
// ctx_option_desc array.
// clang-format off
#define CTX_PROBE_OPTIONS(MAX_NEW_TOKENS, NUM_DEPTHS, PER_SETTING)                              \
    {"token_lengths", CTX_OPT_NUMBER_LIST, NULL,                                                \
     "target lengths in tokens (exclusive with multiples)"},                                   \
    {"multiples", CTX_OPT_NUMBER_LIST, "{1, 2, 4}",                                             \
     "target lengths as multiples of the model's original Lt"},                                \
    {"depths", CTX_OPT_NUMBER_LIST, NULL,                                                       \
     "needle depths in [0, 1] (fraction of the haystack before the needle)"},                  \
    {"num_depths", CTX_OPT_INTEGER, NUM_DEPTHS,                                                 \
     "when depths is absent: this many even depths in [0, 1], both ends included"},            \
    {"per_setting", CTX_OPT_INTEGER, PER_SETTING, "prompts per (length, depth)"},              \
    {"seed", CTX_OPT_INTEGER, "0", "generator seed"},                                           \
    {"max_new_tokens", CTX_OPT_INTEGER, MAX_NEW_TOKENS, "greedy tokens generated per prompt"},  \
    {"generate", CTX_OPT_BOOL, "true", "score greedy generations"},                            \
    {"teacher_forced", CTX_OPT_BOOL, "true",                                                    \
     "score the gold answer teacher-forced (log-probability, argmax of every token)"},         \
    {"windowed", CTX_OPT_BOOL, "true",                                                          \
     "also score with attention limited to the last `window` tokens (the windowed control)"},  \
    {"window", CTX_OPT_INTEGER, "0", "the windowed control's window (0: the model's original Lt)"}, \
    {"threshold", CTX_OPT_NUMBER, "85.6",                                                       \
     "effective length: the longest length whose score (percent) stays at or above this"},    \
    {"relative_threshold", CTX_OPT_NUMBER, "0.8",                                               \
     "effective length relative to the shortest length's score: this fraction of it"},        \
    {"chat_template", CTX_OPT_STRING, "",                                                       \
     "wraps each prompt before the answer prefix; must contain {prompt} once"},                \
    {"stop_at_eos", CTX_OPT_BOOL, "true if the tokenizer has an EOS",                          \
     "end an output at the end-of-text token"},                                                \
    {"batch_size", CTX_OPT_INTEGER, "8", "prompts per generate / score call"},                 \
    {"output_chars", CTX_OPT_INTEGER, "100", "bytes of each output kept in the item records"}

// clang-format on
struct ProbeOptions {
    std::vector<int64_t> token_lengths;  // or, when empty:
    std::vector<double> multiples;       // of the model's original Lt
    std::vector<double> depths;
    int64_t per_setting = 10;
    uint64_t seed = 0;
    GenSettings gen;
    bool stop_at_eos_given = false;
    bool generate = true, teacher_forced = true, windowed = true;
    int64_t window = 0;  // 0: Lt
    double threshold = 85.6, relative_threshold = 0.8;
    std::string chat_template;
    int64_t output_chars = 100;
};

inline ProbeOptions read_probe_options(const ctx_host_api* host, const ctx_options* opts,
                                       int64_t default_max_new_tokens, int64_t default_num_depths,
                                       int64_t default_per_setting) {
    ProbeOptions o;
    auto has = [&](const char* k) { return host->opt_has(host->host, opts, k) != 0; };
    if (has("token_lengths") && has("multiples"))
        fail("give either 'token_lengths' (tokens) or 'multiples' (of Lt), not both");
    for (double v : number_list_option(host, opts, "token_lengths")) {
        if (!(v >= 1 && v == std::floor(v) && v < 1e12))
            fail("option 'token_lengths' value " + num_text(v) + " must be a positive integer");
        o.token_lengths.push_back(static_cast<int64_t>(v));
    }
    o.multiples = number_list_option(host, opts, "multiples");
    for (double m : o.multiples)
        if (!(m > 0 && m < 1e6)) fail("option 'multiples' value " + num_text(m) + " must be > 0");
    if (o.token_lengths.empty() && o.multiples.empty()) o.multiples = {1, 2, 4};
    if (has("depths") && has("num_depths"))
        fail("give either 'depths' (a list) or 'num_depths' (an even grid), not both");
    o.depths = number_list_option(host, opts, "depths", 1000);
    for (size_t i = 0; i < o.depths.size(); ++i)
        if (!(o.depths[i] >= 0 && o.depths[i] <= 1))
            fail("option 'depths' value " + num_text(o.depths[i]) + " at index " +
                 std::to_string(i + 1) + " must be in [0, 1]");
    if (o.depths.empty())
        o.depths =
            even_depths(integer_option(host, opts, "num_depths", default_num_depths, 2, 1000));
    o.per_setting = integer_option(host, opts, "per_setting", default_per_setting, 1, 1 << 20);
    o.seed = static_cast<uint64_t>(host->opt_integer(host->host, opts, "seed", 0));
    o.gen.max_new_tokens = static_cast<int32_t>(
        integer_option(host, opts, "max_new_tokens", default_max_new_tokens, 1, 1 << 20));
    o.gen.batch_size = integer_option(host, opts, "batch_size", 8, 1, 1 << 20);
    o.stop_at_eos_given = has("stop_at_eos");
    o.gen.stop_at_eos = host->opt_bool(host->host, opts, "stop_at_eos", 1) ? 1 : 0;
    o.generate = host->opt_bool(host->host, opts, "generate", 1) != 0;
    o.teacher_forced = host->opt_bool(host->host, opts, "teacher_forced", 1) != 0;
    if (!o.generate && !o.teacher_forced)
        fail("options 'generate' and 'teacher_forced' are both false: nothing to score");
    o.windowed = host->opt_bool(host->host, opts, "windowed", 1) != 0;
    o.window = integer_option(host, opts, "window", 0, 0, INT32_MAX);
    o.threshold = host->opt_number(host->host, opts, "threshold", 85.6);
    if (!(o.threshold > 0 && o.threshold <= 100))
        fail("option 'threshold' is a percentage in (0, 100], got " + num_text(o.threshold));
    o.relative_threshold = host->opt_number(host->host, opts, "relative_threshold", 0.8);
    if (!(o.relative_threshold > 0 && o.relative_threshold <= 1))
        fail("option 'relative_threshold' must be in (0, 1], got " +
             num_text(o.relative_threshold));
    o.chat_template = host->opt_string(host->host, opts, "chat_template", "");
    check_template(o.chat_template);
    o.output_chars = integer_option(host, opts, "output_chars", 100, 0, 1 << 20);
    return o;
}

// ---------------------------------------------------------------- items and results
struct ProbeItem {
    std::string prompt;             // the whole prompt text
    int64_t prompt_tokens = 0;      // as fitted
    double needle_depth = 0;        // measured
    std::string tf_answer;          // teacher-forced continuation; "" when not scored that way
    int64_t expected = -1;          // passkey: K
    std::vector<std::string> gold;  // ruler_niah: values (or variable names)
};

struct ProbeSetting {
    int64_t length = 0;  // target tokens
    double depth = 0;
    std::vector<ProbeItem> items;
};

// One item under one attention mode (full, or the windowed control).
struct ItemScores {
    double score = NAN;       // the task's rule on the greedy output
    double tf_correct = NAN;  // 1 when the argmax predicts every answer token
    double logprob = NAN;     // sum of the answer tokens' log-probabilities
    std::string output;
    int32_t finish = CTX_FINISH_LENGTH;
};

struct ProbeTask {
    std::string name;  // records: name, name_items, name_by_length, name_effective_length
    std::vector<std::pair<std::string, std::string>> labels;  // leading fields of every record
    const char* score_field = "score";                        // the item record's score column
    std::function<double(const ProbeItem&, const std::string& output)> score;
    // task columns of the item record, after needle_depth
    std::function<void(RecordWriter&, const ProbeItem&, const ItemScores& full,
                       const ItemScores& windowed)>
        item_fields;
};

// Target lengths in tokens: token_lengths, or multiples of Lt (rounded).
inline std::vector<int64_t> probe_lengths(const ProbeOptions& o, int64_t lt) {
    if (!o.token_lengths.empty()) return o.token_lengths;
    std::vector<int64_t> out;
    for (double m : o.multiples)
        out.push_back(std::max<int64_t>(1, std::llround(m * static_cast<double>(lt))));
    return out;
}

// Item k of (length, depth): its own stream, whatever else is evaluated.
inline uint64_t item_seed(uint64_t seed, int64_t length, double depth, int64_t k) {
    return mix_seed(mix_seed(seed, static_cast<uint64_t>(length), static_cast<uint64_t>(k)),
                    static_cast<uint64_t>(std::llround(depth * 1e9)));
}

// Teacher-forced scores of prompt + answer rows (the rows listed in `which`): the answer tokens'
// summed log-probability and whether the argmax predicts each of them. Rows are padded to the
// longest in a call; as many rows per call as keep the host's logits under 2^26 floats.
inline void teacher_forced(const ctx_eval_api* api, ctx_eval_host* h,
                           const std::vector<std::vector<int32_t>>& prompts,
                           const std::vector<std::vector<int32_t>>& answers,
                           const std::vector<size_t>& which, int32_t window, int64_t batch_size,
                           int64_t vocab, std::vector<ItemScores>* out) {
    for (size_t first = 0; first < which.size();) {
        size_t n = 0;
        int64_t row_len = 0;
        while (first + n < which.size()) {
            const size_t r = which[first + n];
            const int64_t len = static_cast<int64_t>(prompts[r].size() + answers[r].size()) - 1;
            const int64_t longest = std::max(row_len, len);
            if (n > 0 && (static_cast<int64_t>(n) >= batch_size ||
                          static_cast<int64_t>(n + 1) * longest * std::max<int64_t>(vocab, 1) >
                              (int64_t(1) << 26)))
                break;
            row_len = longest;
            ++n;
        }
        const size_t cells = n * static_cast<size_t>(row_len);
        std::vector<int32_t> tokens(cells, 0), targets(cells, 0), argmax(cells, 0);
        std::vector<float> positions(cells), logprobs(cells);
        for (size_t i = 0; i < n; ++i) {
            const size_t r = which[first + i];
            std::vector<int32_t> row = prompts[r];
            row.insert(row.end(), answers[r].begin(), answers[r].end());
            for (int64_t t = 0; t < row_len; ++t) {
                const size_t at = i * static_cast<size_t>(row_len) + static_cast<size_t>(t);
                positions[at] = static_cast<float>(t);
                if (t + 1 < static_cast<int64_t>(row.size())) {
                    tokens[at] = row[static_cast<size_t>(t)];
                    targets[at] = row[static_cast<size_t>(t) + 1];
                }
            }
        }
        ctx_score_request q{};
        q.struct_size = sizeof q;
        q.tokens = tokens.data();
        q.positions = positions.data();
        q.targets = targets.data();
        q.n_rows = static_cast<int64_t>(n);
        q.row_len = row_len;
        q.window = window;
        q.logprobs = logprobs.data();
        q.argmax = argmax.data();
        ctx_err err{};
        const ctx_status st = api->score_rows(h, &q, &err);
        if (st != CTX_OK) throw TaskError(std::string("score_rows failed: ") + err.message, st);
        for (size_t i = 0; i < n; ++i) {
            const size_t r = which[first + i];
            const size_t p = prompts[r].size();
            double lp = 0;
            bool all = true;
            for (size_t a = 0; a < answers[r].size(); ++a) {
                const size_t at = i * static_cast<size_t>(row_len) + p - 1 + a;
                lp += logprobs[at];
                all = all && argmax[at] == answers[r][a];
            }
            (*out)[r].logprob = lp;
            (*out)[r].tf_correct = all ? 1 : 0;
        }
        first += n;
    }
}

// Mean of the finite values (NaN when there are none).
inline double finite_mean(const std::vector<double>& v) {
    double s = 0;
    int64_t n = 0;
    for (double x : v)
        if (std::isfinite(x)) s += x, ++n;
    return n > 0 ? s / static_cast<double>(n) : NAN;
}

// The longest length L such that every length <= L scores at least `threshold`; 0 when the
// shortest already scores below it. lengths ascending.
inline int64_t effective_length(const std::vector<std::pair<int64_t, double>>& scores,
                                double threshold) {
    int64_t best = 0;
    for (const auto& [len, s] : scores) {
        if (!(s >= threshold)) break;
        best = len;
    }
    return best;
}

// Per-length sums for the by-length and effective-length records.
struct LengthTally {
    std::vector<double> acc, tf, lp, wacc, wtf, wlp;
};

inline void write_labels(RecordWriter& w, const ProbeTask& task) {
    for (const auto& [k, v] : task.labels) w.str(k.c_str(), v);
}

// Scores one (length, depth) setting: every item generated and/or teacher-forced, with full
// attention and (when windowed) with attention limited to the last W tokens; writes the item
// records and the setting's record.
inline void run_setting(const ProbeTask& task, const ProbeOptions& o, const GenSettings& gen,
                        int32_t window, int64_t lt, int64_t vocab, const ProbeSetting& s,
                        const ctx_eval_api* api, ctx_eval_host* h, LengthTally* tally) {
    const size_t n = s.items.size();
    std::vector<std::vector<int32_t>> prompts(n), answers(n);
    for (size_t i = 0; i < n; ++i) {
        prompts[i] = tokenize(api, h, s.items[i].prompt);
        if (prompts[i].empty()) fail("a prompt tokenizes to no tokens");
    }
    std::vector<ItemScores> full(n), win(n);
    const int64_t M = gen.max_new_tokens;
    if (o.generate) {
        const std::vector<GenOutput> outs = generate_all(api, h, prompts, gen);
        std::vector<size_t> again;  // prompts the window changes
        for (size_t i = 0; i < n; ++i) {
            full[i].output = outs[i].text;
            full[i].finish = outs[i].finish;
            full[i].score = task.score(s.items[i], outs[i].text);
            if (window > 0) {
                if (static_cast<int64_t>(prompts[i].size()) + M <= window)
                    win[i] = full[i];  // everything fits in the window: the same computation
                else
                    again.push_back(i);
            }
        }
        if (!again.empty()) {
            std::vector<std::vector<int32_t>> sub;
            for (size_t i : again) sub.push_back(prompts[i]);
            GenSettings g = gen;
            g.window = window;
            const std::vector<GenOutput> wouts = generate_all(api, h, sub, g);
            for (size_t k = 0; k < again.size(); ++k) {
                ItemScores& w = win[again[k]];
                w.output = wouts[k].text;
                w.finish = wouts[k].finish;
                w.score = task.score(s.items[again[k]], wouts[k].text);
            }
        }
    }
    if (o.teacher_forced) {
        std::vector<size_t> scored, again;
        for (size_t i = 0; i < n; ++i) {
            if (s.items[i].tf_answer.empty()) continue;
            answers[i] = tokenize(api, h, s.items[i].tf_answer);
            if (answers[i].empty())
                fail("the answer '" + s.items[i].tf_answer + "' tokenizes to nothing");
            scored.push_back(i);
        }
        teacher_forced(api, h, prompts, answers, scored, 0, gen.batch_size, vocab, &full);
        for (size_t i : scored) {
            if (window <= 0) continue;
            if (static_cast<int64_t>(prompts[i].size() + answers[i].size()) - 1 <= window) {
                win[i].logprob = full[i].logprob;
                win[i].tf_correct = full[i].tf_correct;
            } else {
                again.push_back(i);
            }
        }
        teacher_forced(api, h, prompts, answers, again, window, gen.batch_size, vocab, &win);
    }
    const size_t chars = static_cast<size_t>(o.output_chars);
    std::vector<double> acc, tf, lp, wacc, wtf, wlp, tokens, depth;
    for (size_t i = 0; i < n; ++i) {
        const ProbeItem& it = s.items[i];
        RecordWriter w(api, h, (task.name + "_items").c_str());
        write_labels(w, task);
        w.num("length", static_cast<double>(s.length))
            .num("depth", s.depth)
            .num("item", static_cast<double>(i))
            .num("prompt_tokens", static_cast<double>(prompts[i].size()))
            .num("needle_depth", it.needle_depth);
        task.item_fields(w, it, full[i], win[i]);
        w.num(task.score_field, full[i].score)
            .num("tf_correct", full[i].tf_correct)
            .num("logprob", full[i].logprob)
            .num((std::string("windowed_") + task.score_field).c_str(), win[i].score)
            .num("windowed_tf_correct", win[i].tf_correct)
            .num("windowed_logprob", win[i].logprob)
            .str("finish", o.generate ? finish_name(full[i].finish) : "")
            .str("output", record_text(full[i].output, chars))
            .str("windowed_output", record_text(win[i].output, chars))
            .end();
        acc.push_back(full[i].score);
        tf.push_back(full[i].tf_correct);
        lp.push_back(full[i].logprob);
        wacc.push_back(win[i].score);
        wtf.push_back(win[i].tf_correct);
        wlp.push_back(win[i].logprob);
        tokens.push_back(static_cast<double>(prompts[i].size()));
        depth.push_back(it.needle_depth);
    }
    RecordWriter w(api, h, task.name.c_str());
    write_labels(w, task);
    w.num("length", static_cast<double>(s.length))
        .num("multiple", static_cast<double>(s.length) / static_cast<double>(lt))
        .num("depth", s.depth)
        .num("items", static_cast<double>(n))
        .num("mean_prompt_tokens", finite_mean(tokens))
        .num("needle_depth", finite_mean(depth))
        .num("accuracy", finite_mean(acc))
        .num("tf_accuracy", finite_mean(tf))
        .num("mean_logprob", finite_mean(lp))
        .num("window", window)
        .num("windowed_accuracy", finite_mean(wacc))
        .num("windowed_tf_accuracy", finite_mean(wtf))
        .num("windowed_mean_logprob", finite_mean(wlp))
        .num("max_new_tokens", static_cast<double>(M))
        .end();
    auto append = [](std::vector<double>& to, const std::vector<double>& from) {
        to.insert(to.end(), from.begin(), from.end());
    };
    append(tally->acc, acc);
    append(tally->tf, tf);
    append(tally->lp, lp);
    append(tally->wacc, wacc);
    append(tally->wtf, wtf);
    append(tally->wlp, wlp);
}

// The by-length records and, with two or more lengths, the effective lengths of every metric
// that was measured.
inline void length_records(const ProbeTask& task, const ProbeOptions& o, int32_t window, int64_t lt,
                           const std::map<int64_t, LengthTally>& by_length, const ctx_eval_api* api,
                           ctx_eval_host* h) {
    std::map<std::string, std::vector<std::pair<int64_t, double>>> metric;  // name -> (L, mean)
    for (const auto& [len, t] : by_length) {
        const double v[6] = {finite_mean(t.acc),  finite_mean(t.tf),  finite_mean(t.lp),
                             finite_mean(t.wacc), finite_mean(t.wtf), finite_mean(t.wlp)};
        RecordWriter w(api, h, (task.name + "_by_length").c_str());
        write_labels(w, task);
        w.num("length", static_cast<double>(len))
            .num("multiple", static_cast<double>(len) / static_cast<double>(lt))
            .num("items", static_cast<double>(t.acc.size()))
            .num("accuracy", v[0])
            .num("tf_accuracy", v[1])
            .num("mean_logprob", v[2])
            .num("window", window)
            .num("windowed_accuracy", v[3])
            .num("windowed_tf_accuracy", v[4])
            .num("windowed_mean_logprob", v[5])
            .end();
        log(api, h, CTX_LOG_INFO,
            task.name + " at " + std::to_string(len) + " tokens: accuracy " + num_text(v[0]) +
                ", teacher-forced " + num_text(v[1]) +
                (window > 0 ? ", windowed (" + std::to_string(window) + ") " + num_text(v[3]) +
                                  " / " + num_text(v[4])
                            : std::string()));
        const char* names[4] = {"accuracy", "tf_accuracy", "windowed_accuracy",
                                "windowed_tf_accuracy"};
        const double vals[4] = {v[0], v[1], v[3], v[4]};
        for (int m = 0; m < 4; ++m) metric[names[m]].emplace_back(len, 100.0 * vals[m]);
    }
    if (by_length.size() < 2) return;
    for (const char* name :
         {"accuracy", "tf_accuracy", "windowed_accuracy", "windowed_tf_accuracy"}) {
        const auto& scores = metric[name];
        bool measured = true;
        for (const auto& [len, s] : scores) measured = measured && std::isfinite(s);
        if (!measured) continue;
        const double shortest = scores.front().second;
        const double rel = o.relative_threshold * shortest;
        RecordWriter w(api, h, (task.name + "_effective_length").c_str());
        write_labels(w, task);
        w.str("metric", name)
            .num("lengths", static_cast<double>(scores.size()))
            .num("longest_length", static_cast<double>(scores.back().first))
            .num("threshold", o.threshold)
            .num("effective_length", static_cast<double>(effective_length(scores, o.threshold)))
            .num("shortest_length", static_cast<double>(scores.front().first))
            .num("shortest_score", shortest)
            .num("relative_threshold", o.relative_threshold)
            .num("relative_effective_length",
                 shortest > 0 ? static_cast<double>(effective_length(scores, rel)) : NAN)
            .end();
    }
}

// The whole sweep: settings in the order given, then the per-length summaries.
inline void run_probe(const ProbeTask& task, const ProbeOptions& o,
                      const std::vector<ProbeSetting>& settings, const ctx_eval_api* api,
                      ctx_eval_host* h) {
    ctx_eval_model_info info{};
    info.struct_size = sizeof info;
    api->model_info(h, &info);
    const int64_t lt = info.trained_length > 0 ? info.trained_length : info.context_length;
    GenSettings gen = o.gen;
    if (!o.stop_at_eos_given) gen.stop_at_eos = api->special_token(h, "eos") >= 0 ? 1 : 0;
    gen.window = 0;
    const int32_t window =
        o.windowed ? static_cast<int32_t>(o.window > 0 ? o.window : std::max<int64_t>(lt, 1)) : 0;
    std::map<int64_t, LengthTally> by_length;
    for (const ProbeSetting& s : settings)
        run_setting(task, o, gen, window, lt, info.vocab_size, s, api, h, &by_length[s.length]);
    length_records(task, o, window, lt, by_length, api, h);
}

// The host services a probe needs: text and generation (ABI 1.2), score_rows (1.3) when
// teacher-forced scoring is on.
inline void require_probe_api(const ctx_eval_api* api, const ProbeOptions& o, const char* task) {
    require_text_api(api, task);
    if (o.teacher_forced && !ctx_eval_api_has(api, score_rows))
        throw TaskError(std::string(task) +
                            " needs a host with plugin ABI >= 1.3 (score_rows) for teacher-forced "
                            "scoring; pass teacher_forced = false on an older host",
                        CTX_ERR_UNSUPPORTED);
}

}  // namespace ctx_retrieval
