// libFuzzer target for the BPE tokenizer loaders (data/bpe_load.cpp and everything a loaded
// tokenizer.json configures: normalizers, pre-tokenizers with PCRE2 patterns, the BPE model,
// added tokens, the decoder). The input is
//   a tokenizer.json text                        (no NUL byte), or
//   vocab.json, a NUL byte, merges.txt            (GPT-2's two files, load_bpe_vocab_merges)
// Loading must succeed or raise ctx::Error. A tokenizer that loads then encodes a short text
// taken from the input and decodes the ids again, so the tables it built are used; every id it
// produces must name a token of the vocabulary.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/error.h"
#include "data/bpe_tokenizer.h"
#include "data/utf8.h"
#include "fuzz_support.h"

namespace {

// Token ids index dense per-id tables, so an id of 10^8 (which the loader accepts) costs
// gigabytes: a memory limit, not a bug. Inputs with a number of 6 or more digits are skipped,
// which bounds ids (and so memory) below 10^5.
bool has_long_number(std::string_view s) {
    size_t run = 0;
    for (char c : s) {
        run = (c >= '0' && c <= '9') ? run + 1 : 0;
        if (run >= 6) return true;
    }
    return false;
}

// A text to encode: the input's last bytes (made valid UTF-8) followed by the first tokens of
// the vocabulary decoded, which gives the merges something to merge.
std::string sample_text(const ctx::BpeTokenizer& tok, std::string_view input) {
    const size_t tail = std::min<size_t>(input.size(), 48);
    std::string text = ctx::utf8::to_valid_lossy(input.substr(input.size() - tail));
    for (int32_t id = 0; id < std::min<int32_t>(tok.vocab_size(), 24); ++id)
        if (tok.id_to_token(id)) text += tok.decode(&id, 1);
    return text;
}

void exercise(const ctx::BpeTokenizer& tok, std::string_view input) {
    (void)tok.describe();
    (void)tok.eos_id();
    const std::string text = sample_text(tok, input);
    const std::vector<int32_t> ids = tok.encode(text);
    for (int32_t id : ids)
        if (id < 0 || id >= tok.vocab_size() || !tok.id_to_token(id)) __builtin_trap();
    (void)tok.decode(ids);
    (void)tok.decode(ids, /*skip_special=*/true);
    (void)tok.token_to_id(text);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    ctx::fuzz::silence_logging();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view input(reinterpret_cast<const char*>(data), size);
    if (has_long_number(input)) return 0;
    std::unique_ptr<ctx::BpeTokenizer> tok;
    try {
        const size_t nul = input.find('\0');
        if (nul == std::string_view::npos) {
            tok = ctx::parse_bpe_tokenizer_json(input, "fuzz/tokenizer.json");
        } else {
            const ctx::fuzz::MemFile vocab(input.substr(0, nul));
            const ctx::fuzz::MemFile merges(input.substr(nul + 1));
            tok = ctx::load_bpe_vocab_merges(vocab.path(), merges.path());
        }
    } catch (const ctx::Error& e) {
        ctx::fuzz::note(e);
        return 0;
    }
    try {
        exercise(*tok, input);
    } catch (const ctx::Error& e) {  // e.g. PCRE2's match limit on a pathological pattern
        ctx::fuzz::note(e);
    }
    return 0;
}
