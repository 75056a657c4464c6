#include "passkey_prompt.h"

#include <vector>

namespace passkey {

const char* const kTaskLine =
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
    "them. I will quiz you about the important information there.";
const char* const kFiller =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
const char* const kQuestion = "What is the pass key?";
const char* const kAnswerPrefix = " The pass key is";

std::string key_sentence(int64_t key) {
    const std::string k = std::to_string(key);
    return "The pass key is " + k + ". Remember it. " + k + " is the pass key.";
}

PasskeyPrompt make_prompt(int64_t target_tokens, double depth, uint64_t seed,
                          const std::string& chat_template,
                          const ctx_retrieval::CountTokens& count) {
    uint64_t rng[4];
    ctx_rng_seed(rng, seed);
    PasskeyPrompt p;
    p.key = 1 + static_cast<int64_t>(ctx_retrieval::uniform_below(rng, kMaxKey));
    // The template wraps the task, filler and question; the answer prefix comes after it, where
    // the model's own answer begins (as RULER places its answer prefix).
    std::string head = kTaskLine, tail = kQuestion;
    if (!chat_template.empty()) {
        const size_t at = chat_template.find("{prompt}");
        head = chat_template.substr(0, at) + head;
        tail += chat_template.substr(at + 8);
    }
    tail += kAnswerPrefix;
    ctx_retrieval::Haystack filler = ctx_retrieval::repeating_haystack(kFiller);
    const std::vector<ctx_retrieval::Needle> needles = {{key_sentence(p.key), depth}};
    ctx_retrieval::FittedPrompt f =
        ctx_retrieval::fit_prompt(head, filler, needles, tail, target_tokens, count);
    p.text = std::move(f.prompt.text);
    p.tokens = f.tokens;
    p.key_offset = f.prompt.needle_offsets[0];
    p.needle_depth = f.needle_depth;
    p.filler_bytes = f.prompt.haystack_bytes;
    return p;
}

}  // namespace passkey
