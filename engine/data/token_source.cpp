#include "data/token_source.h"

#include "core/error.h"

namespace ctx {

TokenSource::TokenSource(std::vector<int32_t> tokens, int vocab_size)
    : tokens_(std::move(tokens)), vocab_size_(vocab_size) {
    CTX_CHECK(vocab_size_ > 0, "vocab_size must be positive, got {}", vocab_size_);
    for (size_t i = 0; i < tokens_.size(); ++i)
        CTX_CHECK(tokens_[i] >= 0 && tokens_[i] < vocab_size_,
                  "token {} at index {} is outside the vocabulary [0, {})", tokens_[i], i,
                  vocab_size_);
}

TokenSource TokenSource::from_text(const std::string& text) {
    std::vector<int32_t> t(text.size());
    for (size_t i = 0; i < text.size(); ++i) t[i] = static_cast<unsigned char>(text[i]);
    return TokenSource(std::move(t), 256);
}

void TokenSource::sample(BatchBuffers& out, int B, int T, Rng& rng) const {
    CTX_CHECK(static_cast<int64_t>(tokens_.size()) >= T + 1,
              "the data holds {} tokens, fewer than one row of {} tokens plus its target",
              tokens_.size(), T);
    if (out.B != B || out.T != T) out.resize(B, T);
    const uint64_t starts = tokens_.size() - static_cast<size_t>(T);  // s in [0, n - T - 1]
    for (int b = 0; b < B; ++b) {
        const size_t s = static_cast<size_t>(rng.below(starts));
        for (int t = 0; t < T; ++t) {
            const size_t i = static_cast<size_t>(b) * T + t;
            out.tokens[i] = tokens_[s + t];
            out.targets[i] = tokens_[s + t + 1];
            out.positions[i] = static_cast<float>(t);
            out.mask[i] = 1.0f;
        }
    }
}

int64_t TokenSource::num_windows(int T) const {
    if (tokens_.size() < 2) return 0;
    return static_cast<int64_t>((tokens_.size() - 1) / static_cast<size_t>(T));
}

void TokenSource::window(BatchBuffers& out, int64_t first, int B, int T) const {
    CTX_CHECK(first >= 0 && first + B <= num_windows(T), "windows {}..{} do not exist ({} of "
              "length {})", first, first + B - 1, num_windows(T), T);
    if (out.B != B || out.T != T) out.resize(B, T);
    for (int b = 0; b < B; ++b) {
        const size_t s = static_cast<size_t>(first + b) * T;
        for (int t = 0; t < T; ++t) {
            const size_t i = static_cast<size_t>(b) * T + t;
            out.tokens[i] = tokens_[s + t];
            out.targets[i] = tokens_[s + t + 1];
            out.positions[i] = static_cast<float>(t);
            out.mask[i] = 1.0f;
        }
    }
}

}  // namespace ctx
