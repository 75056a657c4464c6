// The landmark-attention passkey prompt (METHODS.md 5.4), free of any host so tests can compile
// passkey_prompt.cpp directly with their own token counter.
#pragma once

#include <cstdint>
#include <string>

#include "../common/haystack.h"

namespace passkey {

constexpr int64_t kMaxKey = 50000;  // K is uniform in [1, kMaxKey]

// The fixed texts of the task (landmark attention's wording).
extern const char* const kTaskLine;
extern const char* const kFiller;        // one block of filler sentences, repeated with spaces
extern const char* const kQuestion;      // asked after the haystack
extern const char* const kAnswerPrefix;  // " The pass key is": the model continues with K
std::string key_sentence(int64_t key);

struct PasskeyPrompt {
    std::string text;          // the whole prompt, chat template included
    int64_t key = 0;           // K
    int64_t tokens = 0;        // of text
    size_t key_offset = 0;     // byte offset of the key sentence in text
    double needle_depth = 0;   // measured: filler tokens before the key sentence / all filler
    int64_t filler_bytes = 0;  // bytes of filler used
};

// A prompt of the largest token count <= target_tokens (within one token for the tokenizers we
// test), with the key sentence at `depth` of the filler. K comes from `seed` alone, so the same
// seed gives the same K at every length and depth. chat_template ("" or a text with "{prompt}"
// once) wraps task line, filler and question; the answer prefix follows it.
PasskeyPrompt make_prompt(int64_t target_tokens, double depth, uint64_t seed,
                          const std::string& chat_template,
                          const ctx_retrieval::CountTokens& count);

}  // namespace passkey
