// eval/ruler_niah: RULER's needle-in-a-haystack tasks and variable tracking (METHODS.md 5.4).
//
// Needles "One of the special magic {type} for {key} is: {value}." hidden in a haystack (noise
// sentences, an essay made of the held-out documents, or nothing but distractor needles), then
// "What are all the special magic {type} for {key} mentioned in the provided text?" and the
// answer prefix. Variants: single, multikey (3 distractor keys, or the all-needle haystack),
// multivalue (4 values for the key, all required), multiquery (4 keys asked), vt (a chain
// VAR X = n and 4 hops VAR B = VAR A; name all 5 variables). An item scores the fraction of its
// gold values found in the greedy output, ignoring case; single and multikey are also scored
// teacher-forced (" value" appended). Prompts leave max_new_tokens of the target length for the
// answer. Records: ruler_niah_items, ruler_niah (per length and depth), ruler_niah_by_length,
// ruler_niah_effective_length (probe_runner.h).
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../common/probe_runner.h"
#include "niah_prompt.h"

namespace {

using namespace ctx_retrieval;

const ctx_option_desc kOptions[] = {
    {"variant", CTX_OPT_STRING, "single",
     "\"single\", \"multikey\", \"multivalue\", \"multiquery\" or \"vt\" (variable tracking)"},
    {"haystack", CTX_OPT_STRING, "noise",
     "\"noise\" (repeated sentences), \"essay\" (the held-out documents) or \"needle\" "
     "(distractor needles only; multikey)"},
    {"value_type", CTX_OPT_STRING, "numbers",
     "needle values: \"numbers\" (7 digits), \"words\" or \"uuids\" (not for vt)"},
    CTX_PROBE_OPTIONS("128 (vt: 30)", "40", "2")};

struct Config {
    ProbeOptions probe;
    niah::Spec spec;
};

Config read_config(const ctx_host_api* host, const ctx_options* opts) {
    Config c;
    const std::string variant = host->opt_string(host->host, opts, "variant", "single");
    if (!niah::parse_variant(variant, &c.spec.variant))
        fail("option 'variant': unknown task variant \"" + variant +
             "\" (expected single, multikey, multivalue, multiquery or vt)");
    const std::string haystack = host->opt_string(host->host, opts, "haystack", "noise");
    if (!niah::parse_haystack(haystack, &c.spec.haystack))
        fail("option 'haystack' must be \"noise\", \"essay\" or \"needle\", got \"" + haystack +
             "\"");
    const std::string type = host->opt_string(host->host, opts, "value_type", "numbers");
    if (!niah::parse_value_type(type, &c.spec.value_type))
        fail("option 'value_type' must be \"numbers\", \"words\" or \"uuids\", got \"" + type +
             "\"");
    const bool vt = c.spec.variant == niah::Variant::VariableTracking;
    if (vt && host->opt_has(host->host, opts, "value_type"))
        fail(
            "option 'value_type' does not apply to variant \"vt\" (its values are 5-digit numbers "
            "and its answers variable names)");
    if (c.spec.haystack == niah::HaystackKind::Needle && c.spec.variant != niah::Variant::MultiKey)
        fail(
            "haystack \"needle\" (every sentence a distractor needle) is for variant "
            "\"multikey\", not \"" +
            variant + "\"");
    c.probe = read_probe_options(host, opts, vt ? 30 : 128, 40, 2);
    return c;
}

// The essay haystack: held-out documents in order from `first`, cycled, separated by blank
// lines; detokenized once per run.
class Essays {
public:
    Essays(const ctx_eval_api* api, ctx_eval_host* h) : api_(api), h_(h) {
        n_docs_ = api->num_documents ? api->num_documents(h) : 0;
        if (n_docs_ <= 0)
            fail(
                "haystack \"essay\" needs held-out documents: pass data = <documents> to "
                "ctx.run_eval");
    }
    const std::string& doc(int64_t d) {
        auto it = text_.find(d);
        if (it != text_.end()) return it->second;
        const int64_t len = api_->document_length(h_, d);
        std::vector<int32_t> ids(static_cast<size_t>(std::max<int64_t>(len, 0)));
        ctx_err err{};
        if (len > 0 && api_->copy_tokens(h_, d, 0, len, ids.data(), &err) != CTX_OK)
            fail(std::string("reading document ") + std::to_string(d) + ": " + err.message);
        return text_[d] = detokenize(api_, h_, ids.data(), len);
    }
    Haystack stream(uint64_t seed) {
        int64_t next = static_cast<int64_t>(seed % static_cast<uint64_t>(n_docs_));
        int64_t empty_run = 0;
        return Haystack([this, next, empty_run](std::string& s) mutable {
            while (empty_run < n_docs_) {
                const std::string& t = doc(next);
                next = (next + 1) % n_docs_;
                if (strip(t).empty()) {
                    ++empty_run;
                    continue;
                }
                empty_run = 0;
                if (!s.empty()) s += "\n\n";
                s.append(strip(t));
                return true;
            }
            return false;  // every document is empty
        });
    }

private:
    const ctx_eval_api* api_;
    ctx_eval_host* h_;
    int64_t n_docs_ = 0;
    std::map<int64_t, std::string> text_;
};

void run_task(const Config& c, const ctx_eval_api* api, ctx_eval_host* h) {
    const ProbeOptions& o = c.probe;
    require_probe_api(api, o, "eval/ruler_niah");
    ctx_eval_model_info info{};
    info.struct_size = sizeof info;
    api->model_info(h, &info);
    const CountTokens count = [&](const std::string& s) {
        return static_cast<int64_t>(tokenize(api, h, s).size());
    };
    std::unique_ptr<Essays> essays;
    if (c.spec.haystack == niah::HaystackKind::Essay) essays = std::make_unique<Essays>(api, h);
    std::vector<ProbeSetting> settings;
    for (int64_t len : probe_lengths(o, info.trained_length)) {
        const int64_t prompt_target = len - o.gen.max_new_tokens;
        if (prompt_target < 1)
            fail("length " + std::to_string(len) + " leaves no room for a prompt after " +
                 std::to_string(o.gen.max_new_tokens) + " answer tokens (max_new_tokens)");
        for (double depth : o.depths) {
            ProbeSetting s{len, depth, {}};
            for (int64_t k = 0; k < o.per_setting; ++k) {
                const uint64_t seed = item_seed(o.seed, len, depth, k);
                niah::NiahPrompt p;
                try {
                    if (essays) {
                        Haystack essay = essays->stream(mix_seed(seed, 0x6573736179ull));
                        p = niah::make_prompt(c.spec, prompt_target, depth, seed, o.chat_template,
                                              count, &essay);
                    } else {
                        p = niah::make_prompt(c.spec, prompt_target, depth, seed, o.chat_template,
                                              count, nullptr);
                    }
                } catch (const TaskError& e) {
                    fail("length " + std::to_string(len) + " (prompt " +
                         std::to_string(prompt_target) + " tokens + max_new_tokens " +
                         std::to_string(o.gen.max_new_tokens) + "): " + e.what());
                }
                ProbeItem it;
                it.prompt = std::move(p.text);
                it.prompt_tokens = p.tokens;
                it.needle_depth = p.needle_depth;
                it.gold = std::move(p.gold);
                it.tf_answer = std::move(p.tf_answer);
                s.items.push_back(std::move(it));
            }
            settings.push_back(std::move(s));
        }
    }
    ProbeTask task;
    task.name = "ruler_niah";
    const bool vt = c.spec.variant == niah::Variant::VariableTracking;
    task.labels = {{"variant", niah::variant_name(c.spec.variant)},
                   {"haystack", niah::haystack_name(c.spec.haystack)},
                   {"value_type", vt ? "variables" : niah::value_type_name(c.spec.value_type)}};
    task.score_field = "score";
    task.score = [](const ProbeItem& it, const std::string& out) {
        return niah::score_output(out, it.gold);
    };
    task.item_fields = [](RecordWriter& w, const ProbeItem& it, const ItemScores&,
                          const ItemScores&) {
        std::string gold;
        for (const std::string& g : it.gold) gold += (gold.empty() ? "" : " ") + g;
        w.str("gold", gold);
    };
    run_probe(task, o, settings, api, h);
}

ctx_status create(const ctx_host_api* host, const ctx_options* opts, void** instance,
                  ctx_err* err) {
    return entry_point(err, [&] { *instance = new Config(read_config(host, opts)); });
}

void destroy(void* instance) { delete static_cast<Config*>(instance); }

ctx_status run(void* instance, const ctx_eval_api* api, ctx_eval_host* h, ctx_err* err) {
    return entry_point(err, [&] { run_task(*static_cast<const Config*>(instance), api, h); });
}

const ctx_eval_vtable kVtable = {sizeof(ctx_eval_vtable), create, destroy, run};

const ctx_plugin_descriptor kDescriptor = {
    CTX_PLUGIN_ABI_MAJOR,
    CTX_PLUGIN_ABI_MINOR,
    sizeof(ctx_plugin_descriptor),
    CTX_PLUGIN_EVAL,
    "ruler_niah",
    "1.0.0",
    "RULER needle-in-a-haystack (single, multikey, multivalue, multiquery) and variable "
    "tracking by length and depth, with the windowed control and effective length (METHODS.md "
    "5.4)",
    kOptions,
    static_cast<int32_t>(sizeof kOptions / sizeof kOptions[0]),
    &kVtable};

}  // namespace

extern "C" CTX_PLUGIN_EXPORT const ctx_plugin_descriptor* ctx_plugin_query(void) {
    return &kDescriptor;
}
