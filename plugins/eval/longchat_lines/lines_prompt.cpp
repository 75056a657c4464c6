#include "lines_prompt.h"

#include <cstdint>
#include <numeric>

#include "../common/retrieval_common.h"
#include "../common/word_lists.h"

namespace longchat {
namespace {

using ctx_retrieval::kAdjectives;
using ctx_retrieval::kNouns;
using ctx_retrieval::kNumAdj;
using ctx_retrieval::kNumNoun;
using ctx_retrieval::uniform_below;

// Our wording of the task: the structure (header, lines, closing question) is the published one.
constexpr const char* kHeader =
    "I will show you a list of lines, and I need you to memorize them. Each line is named by "
    "\"line\" followed by a hyphenated two-word index, and it stores a number as its "
    "REGISTER_CONTENT. Remember the REGISTER_CONTENT that belongs to every index; after the "
    "list I will give you one index and ask for its number. The list begins now:\n\n";

}  // namespace

int64_t max_lines() { return kNumAdj * kNumNoun; }

LinesPrompt make_prompt(int64_t n_lines, uint64_t seed) {
    LinesPrompt p;
    if (n_lines < 1 || n_lines > max_lines()) return p;
    uint64_t rng[4];
    ctx_rng_seed(rng, seed);
    // Distinct indices: the first n_lines of a partial Fisher-Yates shuffle of all pairs.
    std::vector<int32_t> pairs(static_cast<size_t>(max_lines()));
    std::iota(pairs.begin(), pairs.end(), 0);
    for (int64_t i = 0; i < n_lines; ++i) {
        const auto j =
            i + static_cast<int64_t>(uniform_below(rng, static_cast<uint64_t>(max_lines() - i)));
        std::swap(pairs[static_cast<size_t>(i)], pairs[static_cast<size_t>(j)]);
        const int32_t id = pairs[static_cast<size_t>(i)];
        p.indices.push_back(std::string(kAdjectives[id / kNumNoun]) + "-" + kNouns[id % kNumNoun]);
    }
    for (int64_t i = 0; i < n_lines; ++i)
        p.values.push_back(1 + static_cast<int64_t>(uniform_below(rng, kMaxValue)));
    p.asked = static_cast<int64_t>(uniform_below(rng, static_cast<uint64_t>(n_lines)));
    p.expected = p.values[static_cast<size_t>(p.asked)];

    p.text = kHeader;
    for (int64_t i = 0; i < n_lines; ++i)
        p.text += "line " + p.indices[static_cast<size_t>(i)] + ": REGISTER_CONTENT is <" +
                  std::to_string(p.values[static_cast<size_t>(i)]) + ">\n";
    p.text += "\nThat was the whole list. Which number is the REGISTER_CONTENT of line " +
              p.indices[static_cast<size_t>(p.asked)] + "? Answer with that number.";
    return p;
}

int64_t first_integer(std::string_view text) { return ctx_retrieval::first_integer(text); }

int64_t count_lines(std::string_view prompt) {
    int64_t n = 0;
    size_t pos = 0;
    while (pos < prompt.size()) {
        size_t end = prompt.find('\n', pos);
        if (end == std::string_view::npos) end = prompt.size();
        std::string_view line = prompt.substr(pos, end - pos);
        pos = end + 1;
        while (!line.empty() && (line.front() == ' ' || line.front() == '\t'))
            line.remove_prefix(1);
        if (line.size() > 5 && line.substr(0, 5) == "line " &&
            line.find(':', 5) != std::string_view::npos)
            ++n;
    }
    return n;
}

}  // namespace longchat
