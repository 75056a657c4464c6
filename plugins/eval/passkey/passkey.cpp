// eval/passkey: landmark attention's passkey retrieval (METHODS.md 5.4).
//
// A prompt is the task line, filler sentences repeated, the key sentence "The pass key is K.
// Remember it. K is the pass key." at a chosen depth of the filler, the rest of the filler, and
// "What is the pass key? The pass key is"; K is uniform in [1, 50000]. Prompts are generated at
// exact token lengths (token_lengths, or multiples of Lt) for a grid of depths. Scored two ways:
// generated (the first integer of the greedy output equals K) and teacher-forced (" K" appended:
// its log-probability, and whether the argmax predicts every one of its tokens), each with full
// attention and with the windowed control. Records: passkey_items, passkey (per length and
// depth), passkey_by_length, passkey_effective_length (probe_runner.h).
#include <string>
#include <vector>

#include "../common/probe_runner.h"
#include "passkey_prompt.h"

namespace {

using namespace ctx_retrieval;

const ctx_option_desc kOptions[] = {CTX_PROBE_OPTIONS("12", "5", "10")};

ctx_status create(const ctx_host_api* host, const ctx_options* opts, void** instance,
                  ctx_err* err) {
    return entry_point(
        err, [&] { *instance = new ProbeOptions(read_probe_options(host, opts, 12, 5, 10)); });
}

void destroy(void* instance) { delete static_cast<ProbeOptions*>(instance); }

void run_task(const ProbeOptions& o, const ctx_eval_api* api, ctx_eval_host* h) {
    require_probe_api(api, o, "eval/passkey");
    ctx_eval_model_info info{};
    info.struct_size = sizeof info;
    api->model_info(h, &info);
    const CountTokens count = [&](const std::string& s) {
        return static_cast<int64_t>(tokenize(api, h, s).size());
    };
    std::vector<ProbeSetting> settings;
    for (int64_t len : probe_lengths(o, info.trained_length)) {
        for (double depth : o.depths) {
            ProbeSetting s{len, depth, {}};
            for (int64_t k = 0; k < o.per_setting; ++k) {
                passkey::PasskeyPrompt p;
                try {
                    p = passkey::make_prompt(len, depth, item_seed(o.seed, len, depth, k),
                                             o.chat_template, count);
                } catch (const TaskError& e) {
                    fail("length " + std::to_string(len) + ": " + e.what());
                }
                ProbeItem it;
                it.prompt = std::move(p.text);
                it.prompt_tokens = p.tokens;
                it.needle_depth = p.needle_depth;
                it.expected = p.key;
                it.tf_answer = " " + std::to_string(p.key);
                s.items.push_back(std::move(it));
            }
            settings.push_back(std::move(s));
        }
    }
    ProbeTask task;
    task.name = "passkey";
    task.score_field = "correct";
    task.score = [](const ProbeItem& it, const std::string& out) {
        return first_integer(out) == it.expected ? 1.0 : 0.0;
    };
    task.item_fields = [](RecordWriter& w, const ProbeItem& it, const ItemScores& full,
                          const ItemScores& win) {
        // the integer read from an output (-1: none); NaN where nothing was generated
        auto predicted = [](const ItemScores& s) {
            return std::isfinite(s.score) ? static_cast<double>(first_integer(s.output)) : NAN;
        };
        w.num("expected", static_cast<double>(it.expected))
            .num("predicted", predicted(full))
            .num("windowed_predicted", predicted(win));
    };
    run_probe(task, o, settings, api, h);
}

ctx_status run(void* instance, const ctx_eval_api* api, ctx_eval_host* h, ctx_err* err) {
    return entry_point(err, [&] { run_task(*static_cast<const ProbeOptions*>(instance), api, h); });
}

const ctx_eval_vtable kVtable = {sizeof(ctx_eval_vtable), create, destroy, run};

const ctx_plugin_descriptor kDescriptor = {
    CTX_PLUGIN_ABI_MAJOR,
    CTX_PLUGIN_ABI_MINOR,
    sizeof(ctx_plugin_descriptor),
    CTX_PLUGIN_EVAL,
    "passkey",
    "1.0.0",
    "Passkey retrieval by length and depth, generated and teacher-forced, with the windowed "
    "control (landmark attention; METHODS.md 5.4)",
    kOptions,
    static_cast<int32_t>(sizeof kOptions / sizeof kOptions[0]),
    &kVtable};

}  // namespace

extern "C" CTX_PLUGIN_EXPORT const ctx_plugin_descriptor* ctx_plugin_query(void) {
    return &kDescriptor;
}
