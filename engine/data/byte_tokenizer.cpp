#include "data/byte_tokenizer.h"

#include "core/error.h"

namespace ctx {

const char* ByteTokenizer::special_marker(int32_t t) {
    switch (t) {
        case kBos: return "<|bos|>";
        case kEos: return "<|eos|>";
        case kPad: return "<|pad|>";
        default: return "";
    }
}

std::vector<int32_t> ByteTokenizer::encode(std::string_view text, bool add_bos,
                                           bool add_eos) const {
    std::vector<int32_t> out;
    out.reserve(text.size() + (add_bos ? 1 : 0) + (add_eos ? 1 : 0));
    if (add_bos) out.push_back(kBos);
    // unsigned char: bytes >= 0x80 must map to 128..255, not to negative ids.
    for (char c : text) out.push_back(static_cast<unsigned char>(c));
    if (add_eos) out.push_back(kEos);
    return out;
}

std::string ByteTokenizer::decode(const int32_t* tokens, size_t n, Specials specials) const {
    std::string out;
    out.reserve(n);
    for (size_t i = 0; i < n; ++i) {
        const int32_t t = tokens[i];
        CTX_CHECK(t >= 0 && t < kVocabSize,
                  "byte tokenizer: token {} at index {} is outside the vocabulary [0, {})", t, i,
                  kVocabSize);
        if (t < 256)
            out.push_back(static_cast<char>(static_cast<unsigned char>(t)));
        else if (specials == Specials::Marker)
            out += special_marker(t);
    }
    return out;
}

}  // namespace ctx
