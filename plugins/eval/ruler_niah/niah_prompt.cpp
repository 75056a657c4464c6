#include "niah_prompt.h"

#include <set>
#include <utility>

#include "../common/word_lists.h"

namespace niah {
namespace {

using ctx_retrieval::fail;
using ctx_retrieval::uniform_below;

// The needle, question and answer prefix are RULER's task definition (METHODS.md 5.4); the
// headers and the variable-tracking answer prefix are our wording.
const char* const kNoise =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

std::string header(ValueType t) {
    const std::string type = value_type_name(t);
    return "A few special magic " + type +
           " are hidden in the text below. Read it closely and keep them in mind: I will ask "
           "you about the " +
           type + " afterwards.";
}

const char* const kChainHeader =
    "Keep track of the chain of variable assignments hidden in the text below.";

// RULER's 40 even depths in [0, 1], for the needles the sweep does not place.
double grid_depth(uint64_t rng[4]) { return static_cast<double>(uniform_below(rng, 40)) / 39.0; }

// "a, b, c, and d" (RULER joins the asked keys of multiquery this way).
std::string join_keys(const std::vector<std::string>& keys) {
    if (keys.size() == 1) return keys[0];
    std::string s;
    for (size_t i = 0; i + 1 < keys.size(); ++i) s += keys[i] + ", ";
    return s + "and " + keys.back();
}

// n distinct draws of make() that also avoid `taken`.
template <class Make>
std::vector<std::string> distinct(size_t n, std::set<std::string>* taken, Make make) {
    std::vector<std::string> out;
    while (out.size() < n) {
        std::string v = make();
        if (taken->insert(v).second) out.push_back(std::move(v));
    }
    return out;
}

std::string variable_name(uint64_t rng[4]) {
    std::string s(5, 'A');
    for (char& c : s) c = static_cast<char>('A' + uniform_below(rng, 26));
    return s;
}

}  // namespace

const char* variant_name(Variant v) {
    switch (v) {
        case Variant::Single:
            return "single";
        case Variant::MultiKey:
            return "multikey";
        case Variant::MultiValue:
            return "multivalue";
        case Variant::MultiQuery:
            return "multiquery";
        case Variant::VariableTracking:
            return "vt";
    }
    return "?";
}
const char* haystack_name(HaystackKind h) {
    return h == HaystackKind::Noise ? "noise" : h == HaystackKind::Essay ? "essay" : "needle";
}
const char* value_type_name(ValueType t) {
    return t == ValueType::Numbers ? "numbers" : t == ValueType::Words ? "words" : "uuids";
}
bool parse_variant(std::string_view name, Variant* out) {
    for (Variant v : {Variant::Single, Variant::MultiKey, Variant::MultiValue, Variant::MultiQuery,
                      Variant::VariableTracking})
        if (name == variant_name(v)) return *out = v, true;
    return false;
}
bool parse_haystack(std::string_view name, HaystackKind* out) {
    for (HaystackKind h : {HaystackKind::Noise, HaystackKind::Essay, HaystackKind::Needle})
        if (name == haystack_name(h)) return *out = h, true;
    return false;
}
bool parse_value_type(std::string_view name, ValueType* out) {
    for (ValueType t : {ValueType::Numbers, ValueType::Words, ValueType::Uuids})
        if (name == value_type_name(t)) return *out = t, true;
    return false;
}

std::string needle_sentence(ValueType t, const std::string& key, const std::string& value) {
    return std::string("One of the special magic ") + value_type_name(t) + " for " + key +
           " is: " + value + ".";
}

std::string random_value(ValueType t, uint64_t rng[4]) {
    if (t == ValueType::Numbers)  // 7 digits
        return std::to_string(1000000 + uniform_below(rng, 9000000));
    if (t == ValueType::Words)
        return ctx_retrieval::kValueWords[uniform_below(
            rng, static_cast<uint64_t>(ctx_retrieval::kNumValueWords))];
    // a version-4 UUID: 8-4-4-4-12 lower-case hex digits
    static const char* const hex = "0123456789abcdef";
    std::string s;
    for (int i = 0; i < 32; ++i) {
        if (i == 8 || i == 12 || i == 16 || i == 20) s += '-';
        uint64_t d = uniform_below(rng, 16);
        if (i == 12) d = 4;
        if (i == 16) d = 8 + (d & 3);
        s += hex[d];
    }
    return s;
}

std::string random_key(uint64_t rng[4]) {
    using namespace ctx_retrieval;
    return std::string(kAdjectives[uniform_below(rng, static_cast<uint64_t>(kNumAdj))]) + "-" +
           kNouns[uniform_below(rng, static_cast<uint64_t>(kNumNoun))];
}

NiahPrompt make_prompt(const Spec& spec, int64_t target_tokens, double depth, uint64_t seed,
                       const std::string& chat_template, const ctx_retrieval::CountTokens& count,
                       ctx_retrieval::Haystack* essay) {
    uint64_t rng[4];
    ctx_rng_seed(rng, seed);
    NiahPrompt p;
    std::vector<ctx_retrieval::Needle> needles;
    std::string head, question, answer_prefix;
    std::set<std::string> keys_taken, values_taken;
    const ValueType t = spec.value_type;
    const std::string type = value_type_name(t);
    auto value = [&] { return random_value(t, rng); };
    auto key = [&] { return random_key(rng); };

    if (spec.variant == Variant::VariableTracking) {
        const std::string v = std::to_string(10000 + uniform_below(rng, 90000));
        std::set<std::string> names_taken;
        const std::vector<std::string> names =
            distinct(kChainHops + 1, &names_taken, [&] { return variable_name(rng); });
        // hops at grid depths at or after the first statement, in chain order
        std::vector<double> hop_depths;
        std::vector<double> later;
        for (int i = 0; i < 40; ++i)
            if (i / 39.0 >= depth) later.push_back(i / 39.0);
        if (later.empty()) later.push_back(1.0);
        for (int i = 0; i < kChainHops; ++i)
            hop_depths.push_back(later[uniform_below(rng, later.size())]);
        std::sort(hop_depths.begin(), hop_depths.end());
        needles.push_back({"VAR " + names[0] + " = " + v, depth});
        for (int i = 1; i <= kChainHops; ++i)
            needles.push_back({"VAR " + names[i] + " = VAR " + names[i - 1], hop_depths[i - 1]});
        p.gold = names;
        p.keys = {v};
        head = kChainHeader;
        question =
            "Question: Find all variables that are assigned the value " + v + " in the text above.";
        answer_prefix = " Answer: The variables assigned the value " + v + " are:";
    } else {
        std::vector<std::string> asked;
        if (spec.variant == Variant::MultiQuery) {
            asked = distinct(kMultiQueries, &keys_taken, key);
            for (size_t i = 0; i < asked.size(); ++i) {
                const std::string v = distinct(1, &values_taken, value)[0];
                needles.push_back(
                    {needle_sentence(t, asked[i], v), i == 0 ? depth : grid_depth(rng)});
                p.gold.push_back(v);
            }
        } else {
            asked = distinct(1, &keys_taken, key);
            const int n_values = spec.variant == Variant::MultiValue ? kMultiValues : 1;
            for (int i = 0; i < n_values; ++i) {
                const std::string v = distinct(1, &values_taken, value)[0];
                needles.push_back(
                    {needle_sentence(t, asked[0], v), i == 0 ? depth : grid_depth(rng)});
                p.gold.push_back(v);
            }
            if (spec.variant == Variant::MultiKey && spec.haystack != HaystackKind::Needle) {
                for (const std::string& k : distinct(kMultiKeyDistractors, &keys_taken, key))
                    needles.push_back({needle_sentence(t, k, distinct(1, &values_taken, value)[0]),
                                       grid_depth(rng)});
            }
            if (spec.variant == Variant::Single || spec.variant == Variant::MultiKey)
                p.tf_answer = " " + p.gold[0];
        }
        p.keys = asked;
        head = header(t);
        const std::string k = join_keys(asked);
        question = "What are all the special magic " + type + " for " + k +
                   " mentioned in the provided text?";
        answer_prefix =
            " The special magic " + type + " for " + k + " mentioned in the provided text are";
    }

    if (!chat_template.empty()) {
        const size_t at = chat_template.find("{prompt}");
        head = chat_template.substr(0, at) + head;
        question += chat_template.substr(at + 8);
    }
    const std::string tail = question + answer_prefix;

    ctx_retrieval::Haystack noise = ctx_retrieval::repeating_haystack(kNoise);
    // all-needle haystack: distractor needles with other keys, drawn from the item's own stream
    uint64_t hay_rng[4];
    ctx_rng_seed(hay_rng, ctx_retrieval::mix_seed(seed, 0x6e6565646c65ull));
    ctx_retrieval::Haystack needle_hay([&](std::string& s) {
        std::string k;
        do k = random_key(hay_rng);
        while (keys_taken.count(k));
        if (!s.empty()) s += ' ';
        s += needle_sentence(t, k, random_value(t, hay_rng));
        return true;
    });
    ctx_retrieval::Haystack* hay = &noise;
    if (spec.haystack == HaystackKind::Needle) hay = &needle_hay;
    if (spec.haystack == HaystackKind::Essay) {
        if (!essay) fail("haystack \"essay\" needs essay text (held-out documents)");
        hay = essay;
    }
    ctx_retrieval::FittedPrompt f =
        ctx_retrieval::fit_prompt(head, *hay, needles, tail, target_tokens, count);
    p.text = std::move(f.prompt.text);
    p.tokens = f.tokens;
    p.needle_depth = f.needle_depth;
    p.gold_offset = f.prompt.needle_offsets[0];
    return p;
}

double score_output(std::string_view output, const std::vector<std::string>& gold) {
    if (gold.empty()) return 0;
    int found = 0;
    for (const std::string& g : gold) found += ctx_retrieval::contains_ignore_case(output, g);
    return static_cast<double>(found) / static_cast<double>(gold.size());
}

}  // namespace niah
