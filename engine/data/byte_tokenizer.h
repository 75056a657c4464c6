// Byte-level tokenizer: token t < 256 is the byte t; three specials follow. Every byte string
// round-trips exactly (encode then decode), so any text, UTF-8 or not, is representable and the
// corpus' byte offsets are token offsets (recall spans from data/corpus.h index tokens directly).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ctx {

class ByteTokenizer {
public:
    static constexpr int32_t kBos = 256;
    static constexpr int32_t kEos = 257;
    static constexpr int32_t kPad = 258;
    static constexpr int32_t kVocabSize = 259;

    // How decode() renders the specials.
    enum class Specials {
        Skip,    // nothing: decode(encode(s, true, true)) == s
        Marker   // visible markers "<|bos|>", "<|eos|>", "<|pad|>" (for logs and debugging)
    };

    int32_t vocab_size() const { return kVocabSize; }

    // Bytes -> tokens; specials only when asked (BOS before, EOS after).
    std::vector<int32_t> encode(std::string_view text, bool add_bos = false,
                                bool add_eos = false) const;
    // Tokens -> bytes. A token outside [0, vocab_size) is a ctx::Error naming its index.
    std::string decode(const int32_t* tokens, size_t n, Specials specials = Specials::Skip) const;
    std::string decode(const std::vector<int32_t>& tokens,
                       Specials specials = Specials::Skip) const {
        return decode(tokens.data(), tokens.size(), specials);
    }

    static bool is_special(int32_t t) { return t >= 256 && t < kVocabSize; }
    // "<|bos|>" etc.; "" for a byte token.
    static const char* special_marker(int32_t t);
};

}  // namespace ctx
