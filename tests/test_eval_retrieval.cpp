// eval/longchat_lines and eval/altqa (METHODS.md 3.4, 3.5): the scoring rules, the LongChat-Lines
// generator, the loaders on tests/fixtures/eval, AltQA's alteration and location breakdowns
// against a mock host with scripted outputs (model-free), and both tasks end to end through the
// real host with a tiny byte-level model.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <lua.hpp>

#include "data/tokenizer.h"
#include "model_fixtures.h"
#include "eval/eval_plugin.h"

// The plugins' host-free parts, compiled into this test directly.
#include "../plugins/eval/altqa/altqa_alter.cpp"
#include "../plugins/eval/altqa/altqa_items.cpp"
#include "../plugins/eval/longchat_lines/lines_prompt.cpp"
#include "lua/options.h"
#include "lua/runtime.h"

namespace ctx {
namespace {

using test::plugins;

std::string fixture(const std::string& rel) {
    return std::string(CTX_TEST_SOURCE_DIR) + "/tests/fixtures/eval/" + rel;
}

// ---------------------------------------------------------------- a mock ctx_eval_api
// Byte tokenizer (id = byte, 257 = EOS); generate answers each prompt with respond(prompt text).
struct Rec {
    std::string task;
    std::map<std::string, double> num;
    std::map<std::string, std::string> str;
};

struct Mock {
    std::function<std::string(const std::string&)> respond = [](const std::string&) {
        return std::string();
    };
    int32_t eos = 257;
    std::vector<std::string> prompts;
    std::vector<ctx_generate_request> requests;  // scalar fields only
    std::vector<Rec> records;
    Rec current;
    std::vector<std::string> logs;
};
Mock* g_mock = nullptr;

int64_t mock_tokenize(ctx_eval_host*, const char* text, int64_t len, int32_t* out, int64_t cap,
                      ctx_err*) {
    for (int64_t i = 0; i < len && i < cap; ++i) out[i] = static_cast<unsigned char>(text[i]);
    return len;
}
int64_t mock_detokenize(ctx_eval_host*, const int32_t* ids, int64_t n, char* out, int64_t cap,
                        ctx_err*) {
    std::string s;
    for (int64_t i = 0; i < n; ++i)
        if (ids[i] < 256) s += static_cast<char>(ids[i]);
    const auto len = static_cast<int64_t>(s.size());
    if (out && cap > 0) {
        std::copy_n(s.data(), std::min(len, cap), out);
        if (len < cap) out[len] = '\0';
    }
    return len;
}
int32_t mock_special(ctx_eval_host*, const char* role) {
    return std::string(role) == "eos" ? g_mock->eos : -1;
}
ctx_status mock_generate(ctx_eval_host*, const ctx_generate_request* req, int32_t* toks,
                         int64_t* lens, int32_t* finish, ctx_err*) {
    ctx_generate_request copy = *req;
    copy.prompts = nullptr;
    copy.prompt_lengths = nullptr;
    g_mock->requests.push_back(copy);
    const int64_t M = req->max_new_tokens;
    for (int64_t p = 0; p < req->n_prompts; ++p) {
        std::string prompt;
        for (int64_t t = 0; t < req->prompt_lengths[p]; ++t)
            prompt += static_cast<char>(req->prompts[p][t]);
        g_mock->prompts.push_back(prompt);
        const std::string out = g_mock->respond(prompt);
        const int64_t n = std::min<int64_t>(M, static_cast<int64_t>(out.size()));
        for (int64_t t = 0; t < n; ++t) toks[p * M + t] = static_cast<unsigned char>(out[t]);
        lens[p] = n;
        finish[p] = static_cast<int64_t>(out.size()) > M ? CTX_FINISH_LENGTH
                    : req->stop_at_eos                   ? CTX_FINISH_STOP_TOKEN
                                                         : CTX_FINISH_LENGTH;
    }
    return CTX_OK;
}
void mock_begin(ctx_eval_host*, const char* task) { g_mock->current = Rec{task, {}, {}}; }
void mock_number(ctx_eval_host*, const char* k, double v) { g_mock->current.num[k] = v; }
void mock_string(ctx_eval_host*, const char* k, const char* v) { g_mock->current.str[k] = v; }
ctx_status mock_end(ctx_eval_host*, ctx_err*) {
    g_mock->records.push_back(g_mock->current);
    return CTX_OK;
}
void mock_log(ctx_eval_host*, int32_t, const char* m) { g_mock->logs.emplace_back(m); }

ctx_eval_api mock_api() {
    ctx_eval_api a{};
    a.struct_size = sizeof(ctx_eval_api);
    a.record_begin = mock_begin;
    a.record_number = mock_number;
    a.record_string = mock_string;
    a.record_end = mock_end;
    a.log = mock_log;
    a.tokenize = mock_tokenize;
    a.detokenize = mock_detokenize;
    a.special_token = mock_special;
    a.generate = mock_generate;
    return a;
}

struct Result {
    ctx_status status = CTX_OK;
    std::string error;
    Mock mock;
    std::vector<Rec> of(const std::string& task) const {
        std::vector<Rec> out;
        for (const Rec& r : mock.records)
            if (r.task == task) out.push_back(r);
        return out;
    }
};

// Creates eval/<name> with a Lua options table and runs it against the mock.
Result run_mock(const std::string& name, const std::string& options_lua,
                std::function<std::string(const std::string&)> respond = {},
                size_t api_size = sizeof(ctx_eval_api)) {
    Result res;
    if (respond) res.mock.respond = std::move(respond);
    g_mock = &res.mock;
    ctx_eval_api api = mock_api();
    api.struct_size = static_cast<uint32_t>(api_size);
    const LoadedPlugin& lib = plugins().get("eval/" + name);
    lua::Runtime rt;
    rt.run_string("opts = " + options_lua, "options");
    lua_getglobal(rt.state(), "opts");
    lua::Options o = lua::Options::parse(rt.state(), -1, plugin_option_schema(*lib.descriptor),
                                         "eval/" + name + " options", "test:");
    auto* vt = static_cast<const ctx_eval_vtable*>(lib.descriptor->vtable);
    PluginHostContext host("eval/" + name, 1);
    void* inst = nullptr;
    ctx_err err{};
    res.status = vt->create(&host.api, reinterpret_cast<const ctx_options*>(&o), &inst, &err);
    if (res.status == CTX_OK) {
        res.status = vt->run(inst, &api, nullptr, &err);
        vt->destroy(inst);
    }
    res.error = err.message;
    g_mock = nullptr;
    return res;
}

// The value a LongChat-Lines prompt asks for, read from the prompt itself (a perfect model).
std::string lines_answer(const std::string& prompt) {
    std::smatch m;
    const std::regex asked("line ([a-z]+-[a-z]+)\\?");
    std::string asked_index;
    for (auto it = std::sregex_iterator(prompt.begin(), prompt.end(), asked);
         it != std::sregex_iterator(); ++it)
        asked_index = (*it)[1];
    const std::regex value("line " + asked_index + ": REGISTER_CONTENT is <([0-9]+)>");
    return std::regex_search(prompt, m, value) ? m[1].str() : "none";
}

// ================================================================ LongChat-Lines
TEST(LongChatScoring, FirstIntegerAsGiraffeParsesIt) {
    using longchat::first_integer;
    EXPECT_EQ(first_integer("The value is 123 and 456"), 123);
    EXPECT_EQ(first_integer("no number"), -1);
    EXPECT_EQ(first_integer(""), -1);
    EXPECT_EQ(first_integer("-7"), 7);  // \d+ has no sign
    EXPECT_EQ(first_integer("abc42def7"), 42);
    EXPECT_EQ(first_integer("<31874>"), 31874);
    EXPECT_EQ(first_integer("007 agents"), 7);
    EXPECT_EQ(first_integer("0"), 0);
    EXPECT_EQ(first_integer("12.5"), 12);
    EXPECT_EQ(first_integer("1234567890123456789012345"), INT64_MAX);
}

// Scripted outputs for the fixture rows, keyed by the value each prompt asks for.
std::string scripted_lines_output(const std::string& prompt) {
    const std::map<std::string, std::string> out = {
        {"902", "The value is 902 and 456"},  // first integer: right
        {"8123", "no number here"},           // -1: wrong
        {"49999", "-49999"},                  // sign ignored: right
        {"12000", "abc12000xyz"},             // glued to text: right
        {"18181", "1818 1"},                  // 1818: wrong
    };
    return out.at(lines_answer(prompt));
}

TEST(LongChatLoader, FixtureRowsGroupedByLineCountAndScored) {
    const std::string files =
        fixture("longchat_lines/lines_3.jsonl") + ";" + fixture("longchat_lines/lines_5.jsonl");
    const Result r =
        run_mock("longchat_lines", "{ file = [[" + files + "]] }", scripted_lines_output);
    ASSERT_EQ(r.status, CTX_OK) << r.error;
    const auto items = r.of("longchat_lines_items"), sums = r.of("longchat_lines");
    ASSERT_EQ(items.size(), 5u);
    ASSERT_EQ(sums.size(), 2u);
    EXPECT_EQ(sums[0].num.at("n_lines"), 3);  // counted from the prompt's "line ..:" entries
    EXPECT_EQ(sums[0].num.at("items"), 3);
    EXPECT_EQ(sums[0].num.at("correct"), 2);
    EXPECT_DOUBLE_EQ(sums[0].num.at("accuracy"), 2.0 / 3);
    EXPECT_EQ(sums[1].num.at("n_lines"), 5);  // stated by num_lines
    EXPECT_EQ(sums[1].num.at("items"), 2);
    EXPECT_DOUBLE_EQ(sums[1].num.at("accuracy"), 0.5);
    EXPECT_EQ(sums[0].str.at("source"), "file");
    const std::vector<double> expected = {902, 8123, 49999, 12000, 18181};
    const std::vector<double> predicted = {902, -1, 49999, 12000, 1818};
    const std::vector<double> correct = {1, 0, 1, 1, 0};
    for (size_t i = 0; i < items.size(); ++i) {
        EXPECT_EQ(items[i].num.at("expected"), expected[i]) << i;
        EXPECT_EQ(items[i].num.at("predicted"), predicted[i]) << i;
        EXPECT_EQ(items[i].num.at("correct"), correct[i]) << i;
        EXPECT_EQ(items[i].num.at("prompt_tokens"), static_cast<double>(r.mock.prompts[i].size()));
        EXPECT_EQ(items[i].str.at("finish"), "stop_token");
    }
    EXPECT_EQ(items[0].str.at("output"), "The value is 902 and 456");
    // defaults: Giraffe's 35 new tokens, full attention, EOS ends an output when there is one
    ASSERT_FALSE(r.mock.requests.empty());
    EXPECT_EQ(r.mock.requests[0].max_new_tokens, 35);
    EXPECT_EQ(r.mock.requests[0].window, 0);
    EXPECT_EQ(r.mock.requests[0].stop_at_eos, 1);

    // per_setting caps file rows per line count; generation settings reach the host
    const Result capped = run_mock("longchat_lines",
                                   "{ file = [[" + files +
                                       "]], per_setting = 1, window = 16, "
                                       "stop_at_eos = false, max_new_tokens = 5 }",
                                   scripted_lines_output);
    ASSERT_EQ(capped.status, CTX_OK) << capped.error;
    EXPECT_EQ(capped.of("longchat_lines_items").size(), 2u);
    EXPECT_EQ(capped.mock.requests[0].window, 16);
    EXPECT_EQ(capped.mock.requests[0].stop_at_eos, 0);
    EXPECT_EQ(capped.mock.requests[0].max_new_tokens, 5);
    // 5 new tokens: "The v" has no number
    EXPECT_EQ(capped.of("longchat_lines_items")[0].num.at("predicted"), -1);
}

TEST(LongChatGenerator, PromptStructure) {
    const std::regex line_re("line ([a-z]+)-([a-z]+): REGISTER_CONTENT is <([0-9]+)>");
    for (int64_t n : {1, 5, 200}) {
        const longchat::LinesPrompt p = longchat::make_prompt(n, 1234 + n);
        // header, n lines, a closing question
        const size_t first = p.text.find("\nline ");
        ASSERT_NE(first, std::string::npos);
        EXPECT_NE(p.text.substr(0, first).find("memorize"), std::string::npos);
        std::vector<std::string> lines;
        size_t pos = first + 1;
        while (p.text.compare(pos, 5, "line ") == 0) {
            const size_t nl = p.text.find('\n', pos);
            lines.push_back(p.text.substr(pos, nl - pos));
            pos = nl + 1;
        }
        ASSERT_EQ(static_cast<int64_t>(lines.size()), n);
        EXPECT_EQ(longchat::count_lines(p.text), n);
        std::set<std::string> seen;
        std::map<std::string, int64_t> value_of;
        for (const std::string& l : lines) {
            std::smatch m;
            ASSERT_TRUE(std::regex_match(l, m, line_re)) << l;
            const std::string index = m[1].str() + "-" + m[2].str();
            EXPECT_TRUE(seen.insert(index).second) << "repeated index " << index;
            const int64_t v = std::stoll(m[3]);
            EXPECT_GE(v, 1);
            EXPECT_LE(v, 50000);
            value_of[index] = v;
        }
        const std::string question = p.text.substr(pos);
        EXPECT_NE(question.find("REGISTER_CONTENT"), std::string::npos);
        ASSERT_NE(question.find("line " + p.indices[p.asked] + "?"), std::string::npos) << question;
        EXPECT_EQ(p.expected, value_of.at(p.indices[p.asked]));
        EXPECT_EQ(lines_answer(p.text), std::to_string(p.expected));
    }
    // values cover the range: many prompts' values are spread over [1, 50000]
    int64_t lo = 50000, hi = 1;
    for (int64_t v : longchat::make_prompt(2000, 7).values)
        lo = std::min(lo, v), hi = std::max(hi, v);
    EXPECT_LT(lo, 200);
    EXPECT_GT(hi, 49800);
    EXPECT_TRUE(longchat::make_prompt(0, 1).text.empty());
    EXPECT_TRUE(longchat::make_prompt(longchat::max_lines() + 1, 1).text.empty());
    EXPECT_EQ(longchat::make_prompt(longchat::max_lines(), 3).indices.size(),
              static_cast<size_t>(longchat::max_lines()));  // every pair, each once
}

TEST(LongChatGenerator, ReproducibleBySeed) {
    EXPECT_EQ(longchat::make_prompt(50, 9).text, longchat::make_prompt(50, 9).text);
    EXPECT_NE(longchat::make_prompt(50, 9).text, longchat::make_prompt(50, 10).text);
    const auto a = run_mock("longchat_lines", "{ lines = {4}, per_setting = 3, seed = 5 }");
    const auto b = run_mock("longchat_lines", "{ lines = {4}, per_setting = 3, seed = 5 }");
    const auto c = run_mock("longchat_lines", "{ lines = {4}, per_setting = 3, seed = 6 }");
    ASSERT_EQ(a.mock.prompts.size(), 3u);
    EXPECT_EQ(a.mock.prompts, b.mock.prompts);
    EXPECT_NE(a.mock.prompts, c.mock.prompts);
    EXPECT_NE(a.mock.prompts[0], a.mock.prompts[1]);  // items of a setting differ
}

TEST(LongChatGenerator, GeneratedPromptsScoredWithAChatTemplate) {
    const Result r = run_mock("longchat_lines",
                              "{ lines = {3, 7}, per_setting = 4, chat_template = "
                              "'USER: {prompt} ASSISTANT:', batch_size = 3 }",
                              [](const std::string& p) { return " " + lines_answer(p) + "."; });
    ASSERT_EQ(r.status, CTX_OK) << r.error;
    const auto items = r.of("longchat_lines_items"), sums = r.of("longchat_lines");
    ASSERT_EQ(items.size(), 8u);
    ASSERT_EQ(sums.size(), 2u);
    for (const Rec& s : sums) {
        EXPECT_EQ(s.num.at("items"), 4);
        EXPECT_EQ(s.num.at("accuracy"), 1.0);
        EXPECT_EQ(s.str.at("source"), "generated");
        EXPECT_EQ(s.num.at("target_tokens"), 0);
    }
    EXPECT_EQ(sums[0].num.at("n_lines"), 3);
    EXPECT_EQ(sums[1].num.at("n_lines"), 7);
    ASSERT_EQ(r.mock.prompts.size(), 8u);
    for (size_t i = 0; i < 8; ++i) {
        const std::string& p = r.mock.prompts[i];
        EXPECT_EQ(p.rfind("USER: ", 0), 0u);
        EXPECT_EQ(p.substr(p.size() - 11), " ASSISTANT:");
        EXPECT_EQ(longchat::count_lines(p), i < 4 ? 3 : 7);
    }
    EXPECT_EQ(r.mock.requests.size(), 4u);  // 4 prompts per setting in batches of 3
}

TEST(LongChatGenerator, TokenLengthTargetsFitThePrompts) {
    const Result r = run_mock("longchat_lines", "{ token_lengths = {600, 2000}, per_setting = 3 }",
                              lines_answer);
    ASSERT_EQ(r.status, CTX_OK) << r.error;
    const auto sums = r.of("longchat_lines"), items = r.of("longchat_lines_items");
    ASSERT_EQ(sums.size(), 2u);
    ASSERT_EQ(items.size(), 6u);
    const int kLongestLine = 51;  // "line " + 8-8 letter index + ": REGISTER_CONTENT is <50000>\n"
    for (const Rec& it : items) {
        const double target = it.num.at("target_tokens");
        EXPECT_LE(it.num.at("prompt_tokens"), target);  // byte tokens: every prompt fits
        EXPECT_GT(it.num.at("prompt_tokens"), target - 3 * kLongestLine);  // and fills it
    }
    EXPECT_EQ(sums[0].num.at("target_tokens"), 600);
    EXPECT_EQ(sums[1].num.at("target_tokens"), 2000);
    EXPECT_LT(sums[0].num.at("n_lines"), sums[1].num.at("n_lines"));
    EXPECT_EQ(sums[1].num.at("accuracy"), 1.0);
    EXPECT_LE(sums[1].num.at("max_prompt_tokens"), 2000);

    const Result tiny = run_mock("longchat_lines", "{ token_lengths = {50} }");
    EXPECT_EQ(tiny.status, CTX_ERR_INVALID_ARGUMENT);
    EXPECT_NE(tiny.error.find("one line already has"), std::string::npos) << tiny.error;
}

// Writes a temporary JSONL file and returns its path.
std::string temp_file(const std::string& name, const std::string& body) {
    const auto dir = std::filesystem::temp_directory_path() / "ctx_test_eval_retrieval";
    std::filesystem::create_directories(dir);
    const auto path = dir / name;
    std::ofstream(path) << body;
    return path.string();
}

TEST(LongChatLoader, BadInputIsAClearError) {
    auto expect = [](const std::string& opts, ctx_status want, const std::string& needle,
                     size_t api_size = sizeof(ctx_eval_api)) {
        const Result r = run_mock("longchat_lines", opts, {}, api_size);
        EXPECT_EQ(r.status, want) << opts;
        EXPECT_NE(r.error.find(needle), std::string::npos)
            << "'" << r.error << "' lacks '" << needle << "'";
    };
    expect("{ file = '/nonexistent/lines.jsonl' }", CTX_ERR_INVALID_ARGUMENT,
           "cannot open '/nonexistent/lines.jsonl'");
    const std::string bad =
        temp_file("bad.jsonl", "{\"prompt\": \"line a-b: x\", \"expected_number\": 1}\n{oops\n");
    expect("{ file = [[" + bad + "]] }", CTX_ERR_INVALID_ARGUMENT, bad + ":2: malformed JSON line");
    const std::string missing = temp_file("missing.jsonl", "\n{\"prompt\": \"line a-b: 1\"}\n");
    expect("{ file = [[" + missing + "]] }", CTX_ERR_INVALID_ARGUMENT,
           missing + ":2: missing field 'expected_number'");
    const std::string empty =
        temp_file("empty.jsonl", "{\"prompt\": \"  \", \"expected_number\": 1}\n");
    expect("{ file = [[" + empty + "]] }", CTX_ERR_INVALID_ARGUMENT, ":1: field 'prompt' is empty");
    const std::string nolines =
        temp_file("nolines.jsonl", "{\"prompt\": \"what?\", \"expected_number\": 1}\n");
    expect("{ file = [[" + nolines + "]] }", CTX_ERR_INVALID_ARGUMENT, "no 'num_lines' field");
    const std::string notint =
        temp_file("notint.jsonl", "{\"prompt\": \"line a-b: 1\", \"expected_number\": \"x\"}\n");
    expect("{ file = [[" + notint + "]] }", CTX_ERR_INVALID_ARGUMENT,
           "field 'expected_number' must be an integer");
    expect("{}", CTX_ERR_INVALID_ARGUMENT, "give exactly one of 'lines'");
    expect("{ lines = {3}, token_lengths = {100} }", CTX_ERR_INVALID_ARGUMENT, "exactly one");
    expect("{ lines = {0} }", CTX_ERR_INVALID_ARGUMENT, "must be a positive integer");
    expect("{ lines = {20000} }", CTX_ERR_INVALID_ARGUMENT, "exceed the 14762 distinct indices");
    expect("{ lines = {3}, chat_template = 'no slot' }", CTX_ERR_INVALID_ARGUMENT,
           "must contain \"{prompt}\" exactly once");
    expect("{ lines = {3}, max_new_tokens = 0 }", CTX_ERR_INVALID_ARGUMENT, "max_new_tokens");
    // a host older than ABI 1.2 has no generation
    expect("{ lines = {3} }", CTX_ERR_UNSUPPORTED, "needs a host with plugin ABI >= 1.2",
           offsetof(ctx_eval_api, tokenize));
}

// ================================================================ WikiQA: AltQA / FreeFormQA
TEST(AltqaScoring, PresenceOfTheStrippedAnswer) {
    EXPECT_TRUE(altqa::presence("It is 318 meters long.", " 318 \n"));
    EXPECT_TRUE(altqa::presence("along the Sallow River.", "the Sallow River"));
    EXPECT_FALSE(altqa::presence("the sallow river", "the Sallow River"));  // case-sensitive
    EXPECT_FALSE(altqa::presence("318", "3 18"));
    EXPECT_TRUE(altqa::presence("3180", "318"));  // a substring test, as Giraffe's `in`
    EXPECT_FALSE(altqa::presence("", "318"));
}

TEST(AltqaScoring, FreeFormScriptedOutputs) {
    const Result r = run_mock(
        "altqa",
        "{ mode = 'freeformqa', file = [[" + fixture("freeformqa/freeformqa_small.jsonl") + "]] }",
        [](const std::string& p) -> std::string {
            if (p.find("Fenwick") != std::string::npos) return "It runs along the Sallow River.";
            if (p.find("painted") != std::string::npos) return "marta vell";  // wrong case
            return "  copper\n";
        });
    ASSERT_EQ(r.status, CTX_OK) << r.error;
    const auto items = r.of("altqa_items"), sums = r.of("altqa");
    ASSERT_EQ(items.size(), 3u);
    EXPECT_EQ(items[0].num.at("correct"), 1);
    EXPECT_EQ(items[1].num.at("correct"), 0);
    EXPECT_EQ(items[2].num.at("correct"), 1);
    EXPECT_EQ(items[2].str.at("output"), "  copper ");  // line breaks shown as spaces
    EXPECT_EQ(items[0].str.at("mode"), "freeformqa");
    EXPECT_EQ(items[0].str.at("split"), "freeformqa_small");
    ASSERT_FALSE(sums.empty());
    EXPECT_EQ(sums[0].str.at("group"), "all");
    EXPECT_DOUBLE_EQ(sums[0].num.at("accuracy"), 2.0 / 3);
    EXPECT_EQ(r.mock.requests[0].max_new_tokens, 50);  // Giraffe's WikiQA budget
}

// The fixture's six rows: question end/start alternating, answers in the first 10%, middle and
// last 10% of the document (two each), the cycle Giraffe's notebook assumes.
const char* const kQuestionAt[] = {"end", "start", "end", "start", "end", "start"};
const char* const kAnswerAt[] = {"first10", "first10", "middle", "middle", "last10", "last10"};

std::vector<nlohmann::json> jsonl(const std::string& path) {
    std::vector<nlohmann::json> rows;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);)
        if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
    return rows;
}

TEST(AltqaSplit, PublishedPromptsRoundTripAndLocations) {
    const auto rows = jsonl(fixture("altqa/altqa_small.jsonl"));
    const auto fields = jsonl(fixture("altqa/altqa_fields.jsonl"));
    ASSERT_EQ(rows.size(), 6u);
    for (size_t i = 0; i < rows.size(); ++i) {
        const std::string human = rows[i]["conversations"][0]["value"];
        const std::string answer = rows[i]["conversations"][1]["value"];
        const altqa::Prompt p = altqa::split_prompt(human);
        EXPECT_EQ(p.render(), human) << i;  // exact pieces
        EXPECT_STREQ(altqa::where_name(p.where), kQuestionAt[i]) << i;
        // the document, and nothing else but (row 4) an instruction line with no Document: label
        const std::string doc = fields[i]["document"];
        EXPECT_EQ(p.document.substr(p.document.size() - std::min(p.document.size(), doc.size())),
                  doc)
            << i;
        EXPECT_EQ(p.document.size() == doc.size(), i != 4) << p.document;
        EXPECT_NE(p.question.find(fields[i]["question"].get<std::string>()), std::string::npos)
            << i;
        EXPECT_EQ(altqa::answer_location(p.document, answer), kAnswerAt[i]) << i;
        // moving the question keeps the document and the question whole
        altqa::Prompt moved = p;
        ASSERT_TRUE(altqa::move_question(moved, altqa::Where::Start));
        EXPECT_EQ(moved.render().find(p.question), moved.before.size()) << i;
        ASSERT_TRUE(altqa::move_question(moved, altqa::Where::End));
        EXPECT_NE(moved.render().find(p.document + moved.between + p.question), std::string::npos);
    }
    // no question to find: all document, nothing moves
    altqa::Prompt plain = altqa::split_prompt("Just a statement.\n\nAnother one.");
    EXPECT_EQ(plain.where, altqa::Where::Unknown);
    EXPECT_FALSE(altqa::move_question(plain, altqa::Where::Start));
    EXPECT_EQ(plain.render(), "Just a statement.\n\nAnother one.");
    // one paragraph: lines are the blocks
    const altqa::Prompt lines = altqa::split_prompt("Doc line one 1999.\nDoc line two.\nWhen?");
    EXPECT_EQ(lines.where, altqa::Where::End);
    EXPECT_EQ(lines.question, "When?");
    const std::string pad(200, '.');
    EXPECT_EQ(altqa::answer_location("x 12 " + pad + " 2012", "12"), "first10");
    EXPECT_EQ(altqa::answer_location("2012 " + pad + " 12", "12"), "last10");  // whole numbers only
    EXPECT_EQ(altqa::answer_location("Ab " + pad + " ab", "ab"), "last10");    // case-sensitive
    EXPECT_EQ(altqa::answer_location(pad + " ab " + pad, " ab"), "middle");
    EXPECT_EQ(altqa::answer_location("nothing", "12"), "absent");
}

// Right for rows 0, 2, 3, 5 (the correct answer appears), wrong for rows 1 and 4.
std::string scripted_altqa_output(const std::string& p) {
    if (p.find("Brindlecove") != std::string::npos) return "It was 1742.";
    if (p.find("Quillon") != std::string::npos) return "about 300 meters";
    if (p.find("Gannet") != std::string::npos) return "27 km";
    if (p.find("Orrin") != std::string::npos) return "64";
    if (p.find("Tessel") != std::string::npos) return "in 1987";
    return "5120 books";
}

void expect_breakdown(const Result& r) {
    ASSERT_EQ(r.status, CTX_OK) << r.error;
    const auto items = r.of("altqa_items");
    ASSERT_EQ(items.size(), 6u);
    for (size_t i = 0; i < 6; ++i) {
        EXPECT_EQ(items[i].str.at("question_location"), kQuestionAt[i]) << i;
        EXPECT_EQ(items[i].str.at("answer_location"), kAnswerAt[i]) << i;
        EXPECT_EQ(items[i].num.at("row"), static_cast<double>(i));
    }
    std::map<std::string, std::pair<double, double>> got;  // group/value -> (items, accuracy)
    for (const Rec& s : r.of("altqa"))
        got[s.str.at("group") + "/" + s.str.at("value")] = {s.num.at("items"),
                                                            s.num.at("accuracy")};
    const std::map<std::string, std::pair<double, double>> want = {
        {"all/all", {6, 4.0 / 6}},
        {"question_location/start", {3, 2.0 / 3}},  // rows 1 x, 3 ok, 5 ok
        {"question_location/end", {3, 2.0 / 3}},    // rows 0 ok, 2 ok, 4 x
        {"answer_location/first10", {2, 0.5}},
        {"answer_location/middle", {2, 1.0}},
        {"answer_location/last10", {2, 0.5}}};
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [k, v] : want) {
        EXPECT_EQ(got.at(k).first, v.first) << k;
        EXPECT_DOUBLE_EQ(got.at(k).second, v.second) << k;
    }
}

TEST(AltqaBreakdown, DetectedLocations) {
    expect_breakdown(run_mock("altqa", "{ file = [[" + fixture("altqa/altqa_small.jsonl") + "]] }",
                              scripted_altqa_output));
}

TEST(AltqaBreakdown, GiraffeRowOrderLabelsAgreeOnTheFixture) {
    expect_breakdown(run_mock(
        "altqa",
        "{ file = [[" + fixture("altqa/altqa_small.jsonl") + "]], locations = 'row_order' }",
        scripted_altqa_output));
}

TEST(AltqaBreakdown, FieldRowsAndTwoSplits) {
    const std::string files =
        fixture("altqa/altqa_small.jsonl") + ";" + fixture("altqa/altqa_fields.jsonl");
    const Result r = run_mock("altqa", "{ file = [[" + files + "]] }", scripted_altqa_output);
    ASSERT_EQ(r.status, CTX_OK) << r.error;
    EXPECT_EQ(r.of("altqa_items").size(), 12u);
    std::map<std::string, double> all;  // split -> accuracy of group all
    for (const Rec& s : r.of("altqa"))
        if (s.str.at("group") == "all") all[s.str.at("split")] = s.num.at("items");
    EXPECT_EQ(
        all, (std::map<std::string, double>{{"altqa_small", 6}, {"altqa_fields", 6}, {"all", 12}}));
    // field rows: the question after the document, a blank line between
    const auto fields = jsonl(fixture("altqa/altqa_fields.jsonl"));
    EXPECT_EQ(r.mock.prompts[6], fields[0]["document"].get<std::string>() + "\n\n" +
                                     fields[0]["question"].get<std::string>());
}

TEST(AltqaBreakdown, LongPromptsSkippedAndCounted) {
    const std::string file = "{ file = [[" + fixture("altqa/altqa_small.jsonl") + "]]";
    const Result r = run_mock("altqa", file + ", max_prompt_tokens = 560 }", scripted_altqa_output);
    ASSERT_EQ(r.status, CTX_OK) << r.error;
    ASSERT_EQ(r.of("altqa_items").size(), 2u);  // rows 1 and 5 have at most 560 bytes
    EXPECT_EQ(r.of("altqa")[0].num.at("items"), 2);
    EXPECT_EQ(r.of("altqa")[0].num.at("skipped"), 4);
    const Result none = run_mock("altqa", file + ", max_prompt_tokens = 10 }");
    ASSERT_EQ(none.status, CTX_OK) << none.error;
    ASSERT_EQ(none.of("altqa").size(), 1u);  // only "all", empty
    EXPECT_EQ(none.of("altqa")[0].num.at("items"), 0);
    EXPECT_TRUE(std::isnan(none.of("altqa")[0].num.at("accuracy")));
}

TEST(AltqaBreakdown, QuestionMovedToStartOrEnd) {
    const auto fields = jsonl(fixture("altqa/altqa_fields.jsonl"));
    for (const std::string to : {"start", "end"}) {
        const Result r = run_mock("altqa",
                                  "{ file = [[" + fixture("altqa/altqa_small.jsonl") +
                                      "]], question_position = '" + to + "' }",
                                  scripted_altqa_output);
        ASSERT_EQ(r.status, CTX_OK) << r.error;
        const auto items = r.of("altqa_items");
        ASSERT_EQ(items.size(), 6u);
        for (size_t i = 0; i < 6; ++i) {
            EXPECT_EQ(items[i].str.at("question_location"), to);
            EXPECT_EQ(items[i].str.at("answer_location"), kAnswerAt[i]);
            const std::string& p = r.mock.prompts[i];
            const std::string q = fields[i]["question"], d = fields[i]["document"];
            const size_t qa = p.find(q), da = p.find(d);
            ASSERT_NE(qa, std::string::npos);
            ASSERT_NE(da, std::string::npos);
            EXPECT_EQ(qa < da, to == "start") << p;
        }
    }
    const Result bad =
        run_mock("altqa", "{ file = 'x', locations = 'row_order', question_position = 'end' }");
    EXPECT_NE(bad.error.find("cannot be combined"), std::string::npos) << bad.error;
}

TEST(AltqaAlteration, Rules) {
    for (uint64_t seed = 0; seed < 300; ++seed) {
        uint64_t rng[4];
        ctx_rng_seed(rng, seed);
        for (int year : {1000, 1891, 2100}) {
            const std::string y = altqa::altered_number(std::to_string(year), rng);
            const int d = std::stoi(y) - year;
            EXPECT_TRUE(d != 0 && d >= -10 && d <= 10) << year << " -> " << y;
        }
        for (const char* lit :
             {"7", "0", "250", "2101", "999", "40213", "05", "123456789012345678901"}) {
            const std::string n = lit, m = altqa::altered_number(n, rng);
            EXPECT_EQ(m.size(), n.size()) << n << " -> " << m;
            EXPECT_NE(m, n);
            EXPECT_TRUE(altqa::is_number(m)) << m;
            if (n.size() > 1) {
                EXPECT_NE(m[0], '0') << n << " -> " << m;
            }
        }
    }
    // every value is reachable: single digits take all 9 others, 0 included
    std::set<std::string> digits, years;
    uint64_t rng[4];
    ctx_rng_seed(rng, 1);
    for (int i = 0; i < 500; ++i) digits.insert(altqa::altered_number("7", rng));
    for (int i = 0; i < 500; ++i) years.insert(altqa::altered_number("1950", rng));
    EXPECT_EQ(digits.size(), 9u);
    EXPECT_EQ(digits.count("0"), 1u);
    EXPECT_EQ(years.size(), 20u);
    EXPECT_TRUE(altqa::is_year("1000") && altqa::is_year("2100"));
    EXPECT_FALSE(altqa::is_year("0999") || altqa::is_year("2101") || altqa::is_year("999"));
}

TEST(AltqaAlteration, EveryWholeOccurrenceAndOnlyThose) {
    const auto rows = jsonl(fixture("alter/alter_items.jsonl"));
    const std::vector<int64_t> whole = {3, 2, 2, 1};
    for (size_t i = 0; i < whole.size(); ++i) {
        const std::string doc = rows[i]["document"], ans = rows[i]["answer"];
        const altqa::Alteration a = altqa::alter_item(doc, ans, 42 + i);
        ASSERT_TRUE(a.ok) << i;
        const std::string orig(ctx_retrieval::strip(ans));
        EXPECT_EQ(a.replaced, whole[i]) << i;
        EXPECT_TRUE(altqa::whole_number_matches(a.document, orig).empty()) << a.document;
        EXPECT_EQ(static_cast<int64_t>(altqa::whole_number_matches(a.document, a.answer).size()),
                  whole[i]);
        // the same text with the whole occurrences put back is the original
        EXPECT_EQ(altqa::replace_whole_number(a.document, a.answer, orig), doc);
        // determinism, and another seed draws another number
        const altqa::Alteration again = altqa::alter_item(doc, ans, 42 + i);
        EXPECT_EQ(again.document, a.document);
        EXPECT_EQ(again.answer, a.answer);
    }
    const std::string doc = rows[0]["document"];
    const altqa::Alteration a = altqa::alter_item(doc, "1891", 1);
    for (const char* kept : {"18910", "1891.5", "21891"})  // longer numbers stay as they were
        EXPECT_NE(a.document.find(kept), std::string::npos) << kept;
    std::set<std::string> answers;
    for (uint64_t s = 0; s < 20; ++s) answers.insert(altqa::alter_item(doc, "1891", s).answer);
    EXPECT_GT(answers.size(), 5u);
    EXPECT_EQ(altqa::whole_number_matches("1,250 and 2.50 and 250, 250.", "250"),
              (std::vector<size_t>{19, 24}));
    EXPECT_FALSE(altqa::alter_item("Marta Vell", "Marta Vell", 1).ok);
    EXPECT_EQ(altqa::alter_item("x", "Marta Vell", 1).reason, "non-numeric answer");
    EXPECT_EQ(altqa::alter_item("12 floors", "99", 1).reason, "answer not in document");
}

TEST(AltqaAlteration, ThroughThePlugin) {
    const std::string opts =
        "{ file = [[" + fixture("alter/alter_items.jsonl") + "]], alter = true";
    const Result r = run_mock("altqa", opts + " }");
    ASSERT_EQ(r.status, CTX_OK) << r.error;
    const auto items = r.of("altqa_items");
    ASSERT_EQ(items.size(),
              4u);  // "Marta Vell" (non-numeric) and "99" (not in the document) skipped
    const auto rows = jsonl(fixture("alter/alter_items.jsonl"));
    const std::vector<int64_t> whole = {3, 2, 2, 1};
    for (size_t i = 0; i < 4; ++i) {
        const std::string orig(ctx_retrieval::strip(rows[i]["answer"].get<std::string>()));
        EXPECT_EQ(items[i].num.at("altered"), 1);
        EXPECT_EQ(items[i].str.at("original_answer"), orig);
        const std::string ans = items[i].str.at("answer");
        EXPECT_NE(ans, orig);
        const std::string& p = r.mock.prompts[i];
        EXPECT_TRUE(altqa::whole_number_matches(p, orig).empty()) << p;
        EXPECT_EQ(static_cast<int64_t>(altqa::whole_number_matches(p, ans).size()), whole[i]) << p;
    }
    EXPECT_EQ(r.of("altqa")[0].num.at("skipped"), 2);
    size_t warned = 0;
    for (const std::string& l : r.mock.logs)
        warned += l.find("alter: skipped 1 rows") != std::string::npos;
    EXPECT_EQ(warned, 2u);
    // deterministic by seed
    EXPECT_EQ(run_mock("altqa", opts + " }").mock.prompts, r.mock.prompts);
    EXPECT_NE(run_mock("altqa", opts + ", seed = 3 }").mock.prompts, r.mock.prompts);
    // published rows: the numbers in the document part change too
    const Result conv = run_mock(
        "altqa", "{ file = [[" + fixture("altqa/altqa_small.jsonl") + "]], alter = true }");
    ASSERT_EQ(conv.status, CTX_OK) << conv.error;
    EXPECT_EQ(conv.of("altqa_items").size(), 6u);
    EXPECT_EQ(conv.mock.prompts[0].find("1742"), std::string::npos);
    const Result ff = run_mock("altqa", "{ file = 'x', mode = 'freeformqa', alter = true }");
    EXPECT_NE(ff.error.find("option 'alter' needs mode \"altqa\""), std::string::npos) << ff.error;
}

TEST(AltqaLoader, BadInputIsAClearError) {
    auto expect = [](const std::string& body, const std::string& needle) {
        const std::string path = temp_file("altqa_bad.jsonl", body);
        const Result r = run_mock("altqa", "{ file = [[" + path + "]] }");
        EXPECT_EQ(r.status, CTX_ERR_INVALID_ARGUMENT) << body;
        EXPECT_NE(r.error.find(needle), std::string::npos)
            << "'" << r.error << "' lacks '" << needle << "'";
    };
    expect("{\"conversations\": [{\"from\": \"human\", \"value\": \"doc. Q?\"}]}\n",
           "altqa_bad.jsonl:1: 'conversations' needs a \"human\" turn");
    expect("{\"conversations\": [{\"from\": \"human\"}]}\n",
           ":1: conversations[0]: expected {\"from\"");
    expect(
        "{\"conversations\": [{\"from\": \"human\", \"value\": \" \"}, {\"from\": \"gpt\", "
        "\"value\": \"1\"}]}\n",
        "the human turn (the prompt) is empty");
    expect("{\"document\": \"d 1\", \"question\": \"q?\"}\n", ":1: missing field 'answer'");
    expect("{\"document\": \"d 1\", \"question\": \"q?\", \"answer\": \"  \"}\n",
           "field 'answer' is empty");
    expect("{\"text\": \"x\"}\n", ":1: expected 'conversations' (published rows) or 'document'");
    expect("[1, 2]\n", "[element 0]: expected a JSON object");
    expect("\n\n", "holds no rows");
    const Result none = run_mock("altqa", "{}");
    EXPECT_NE(none.error.find("option 'file' is required"), std::string::npos) << none.error;
    const Result mode = run_mock("altqa", "{ file = 'x', mode = 'numeric' }");
    EXPECT_NE(mode.error.find("option 'mode' must be"), std::string::npos) << mode.error;
}

// ================================================================ the real host, end to end
struct ByteModelHost {
    ModelConfig config = [] {
        ModelConfig c = test::tiny_config();
        c.vocab_size = 259;  // the byte tokenizer's
        c.context_length = 64;
        return c;
    }();
    Model model{config, test::cpu(), test::make_pe("rope", config), 3};
    MemoryDocs docs{{{1, 2, 3}}, 259};
    std::unique_ptr<Comm> comm = make_single_comm();
    std::unique_ptr<Tokenizer> tokenizer = load_tokenizer("byte");
    std::vector<Record> records;

    void run(const std::string& name, const std::string& options_lua) {
        EvalContext ctx;
        ctx.model = &model;
        ctx.documents = &docs;
        ctx.comm = comm.get();
        ctx.trained_length = config.context_length;
        ctx.tokenizer = tokenizer.get();
        ctx.collected = &records;
        ctx.tags["method"] = "e2e";
        lua::Runtime rt;
        rt.run_string("opts = " + options_lua, "options");
        lua_getglobal(rt.state(), "opts");
        const LoadedPlugin& lib = plugins().get("eval/" + name);
        lua::Options o = lua::Options::parse(rt.state(), -1, plugin_option_schema(*lib.descriptor),
                                             "opts", "test:");
        EvalPlugin plugin(lib, o, 1);
        plugin.run(ctx);
    }
    std::vector<Record> of(const std::string& task) const {
        std::vector<Record> out;
        for (const Record& r : records)
            if (r["task"] == task) out.push_back(r);
        return out;
    }
};

TEST(RetrievalEndToEnd, LongChatLinesWithAByteModel) {
    ByteModelHost host;
    host.run("longchat_lines",
             "{ lines = {2, 3}, per_setting = 2, max_new_tokens = 6, window = 32 }");
    const auto items = host.of("longchat_lines_items"), sums = host.of("longchat_lines");
    ASSERT_EQ(items.size(), 4u);
    ASSERT_EQ(sums.size(), 2u);
    for (const Record& s : sums) {
        double correct = 0, n = 0;
        for (const Record& it : items) {
            if (it["n_lines"] != s["n_lines"]) continue;
            ++n;
            correct += it["correct"].get<double>();
            // the record's prediction is the rule applied to the recorded output
            EXPECT_EQ(it["predicted"].get<int64_t>(),
                      longchat::first_integer(it["output"].get<std::string>()));
            EXPECT_EQ(it["correct"].get<int>(), it["predicted"] == it["expected"] ? 1 : 0);
            EXPECT_LE(it["prompt_tokens"].get<int>(), 2000);
        }
        EXPECT_EQ(n, 2);
        EXPECT_EQ(s["items"].get<int>(), 2);
        EXPECT_DOUBLE_EQ(s["accuracy"].get<double>(), correct / n);
        EXPECT_EQ(s["window"].get<int>(), 32);
        EXPECT_EQ(s["method"], "e2e");
    }
}

TEST(RetrievalEndToEnd, AltqaWithAByteModel) {
    ByteModelHost host;
    host.run("altqa",
             "{ file = [[" + fixture("altqa/altqa_small.jsonl") + "]], max_new_tokens = 4 }");
    const auto items = host.of("altqa_items"), sums = host.of("altqa");
    ASSERT_EQ(items.size(), 6u);
    std::map<std::string, std::pair<int, int>> tally;  // group/value -> (items, correct)
    for (const Record& it : items) {
        const bool ok =
            altqa::presence(it["output"].get<std::string>(), it["answer"].get<std::string>());
        EXPECT_EQ(it["correct"].get<int>(), ok ? 1 : 0);
        for (const std::string& key :
             {std::string("all/all"),
              "question_location/" + it["question_location"].get<std::string>(),
              "answer_location/" + it["answer_location"].get<std::string>()}) {
            ++tally[key].first;
            tally[key].second += ok;
        }
    }
    ASSERT_EQ(sums.size(), tally.size());
    for (const Record& s : sums) {
        const auto& [n, c] =
            tally.at(s["group"].get<std::string>() + "/" + s["value"].get<std::string>());
        EXPECT_EQ(s["items"].get<int>(), n);
        EXPECT_DOUBLE_EQ(s["accuracy"].get<double>(), static_cast<double>(c) / n);
    }
}

}  // namespace
}  // namespace ctx
