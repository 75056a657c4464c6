// Needle-in-a-haystack prompts of an exact token length, for any tokenizer (eval/passkey,
// eval/ruler_niah; METHODS.md 5.4). Host-free and header-only: tests compile it directly with
// their own token counter.
//
// A prompt is
//     head \n haystack[0, b1) \n needle_1 \n haystack[b1, b2) \n needle_2 ... haystack[bk, c) \n
//     tail
// (empty pieces and their separators left out), where the haystack is a long text stream (noise
// sentences, an essay, distractor needles) cut after c bytes. Needle j goes at b_j: the last
// sentence start at or before depth_j * c (the end of the haystack counts as one, so depth 1 puts
// a needle right before the tail). The length is hit by the cut c, found by bisection on the
// token count of the whole prompt; c moves by whole UTF-8 characters, so the filler is cut at
// character granularity (as landmark attention cuts its garbage text) and the prompt lands within
// a token of the target for any tokenizer whose count grows by at most one per added character.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "retrieval_common.h"

namespace ctx_retrieval {

using CountTokens = std::function<int64_t(const std::string&)>;

// A text stream that grows on demand: grow(text) appends more (noise repeats, the next
// document, more distractor needles) and returns false once it cannot.
class Haystack {
public:
    explicit Haystack(std::function<bool(std::string&)> grow) : grow_(std::move(grow)) {}
    // The stream with at least n bytes, or fewer when it cannot grow that far.
    const std::string& text(size_t n) {
        while (text_.size() < n && grow_(text_)) {
        }
        return text_;
    }

private:
    std::function<bool(std::string&)> grow_;
    std::string text_;
};

// A haystack that repeats `unit` forever, units separated by one space.
inline Haystack repeating_haystack(std::string unit) {
    return Haystack([unit = std::move(unit)](std::string& t) {
        if (!t.empty()) t += ' ';
        t += unit;
        return true;
    });
}

struct Needle {
    std::string text;
    double depth = 0;  // in [0, 1]: fraction of the haystack before it
};

struct Assembled {
    std::string text;
    int64_t haystack_bytes = 0;          // c: bytes of the haystack stream used
    std::vector<size_t> needle_offsets;  // byte offset of each needle's text in `text`
    std::string haystack_before;         // haystack text before needle 0 (its chunks, joined)
    std::string haystack_after;          // and after it
};

inline bool is_space_byte(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Whether a sentence starts at byte i of s: the start, or a non-space after a line break, or
// after ". ", "? ", "! ".
inline bool sentence_starts_at(const std::string& s, size_t i) {
    if (i == 0) return true;
    if (i >= s.size() || is_space_byte(s[i])) return false;
    if (s[i - 1] == '\n') return true;
    return i >= 2 && is_space_byte(s[i - 1]) &&
           (s[i - 2] == '.' || s[i - 2] == '?' || s[i - 2] == '!');
}

// Where a needle aimed at byte p of a haystack cut at c goes: c itself when p >= c, else the last
// sentence start at or before p (within 400 bytes), else the last word start (within 100), else
// p. A sentence of an essay can be long; a needle never splits a word unless a word is.
inline size_t needle_boundary(const std::string& s, size_t p, size_t c) {
    if (p >= c) return c;
    const size_t lo = p > 400 ? p - 400 : 0;
    for (size_t i = p + 1; i-- > lo;)
        if (sentence_starts_at(s, i)) return i;
    const size_t wlo = p > 100 ? p - 100 : 0;
    for (size_t i = p + 1; i-- > wlo;)
        if (i == 0 || (is_space_byte(s[i - 1]) && !is_space_byte(s[i]))) return i;
    return p;
}

// The largest UTF-8 character boundary <= c (so a cut never splits a character).
inline size_t utf8_floor(const std::string& s, size_t c) {
    c = std::min(c, s.size());
    while (c > 0 && c < s.size() && (static_cast<unsigned char>(s[c]) & 0xC0) == 0x80) --c;
    return c;
}

inline std::string_view trim_right(std::string_view v) {
    while (!v.empty() && is_space_byte(v.back())) v.remove_suffix(1);
    return v;
}

constexpr size_t kAtEnd = static_cast<size_t>(-1);  // a needle placed at the haystack's end

// Needle positions in a haystack cut at c: a byte offset at a sentence start, or kAtEnd.
inline std::vector<size_t> place_needles(const std::string& hs, size_t c,
                                         const std::vector<Needle>& needles) {
    std::vector<size_t> at;
    for (const Needle& n : needles) {
        const double d = std::clamp(n.depth, 0.0, 1.0);
        const auto p = static_cast<size_t>(std::llround(d * static_cast<double>(c)));
        const size_t b = needle_boundary(hs, p, c);
        at.push_back(b >= c ? kAtEnd : b);
    }
    return at;
}

// The prompt with the haystack cut after c bytes and the needles at `at` (place_needles; a
// position past c counts as the end).
inline Assembled assemble(const std::string& head, Haystack& haystack, size_t c,
                          const std::vector<Needle>& needles, const std::vector<size_t>& at,
                          const std::string& tail) {
    const std::string& hs = haystack.text(c);
    c = utf8_floor(hs, std::min(c, hs.size()));
    // needle order: by position, then by index (so a chain given in order stays in order)
    std::vector<std::pair<size_t, size_t>> order;
    for (size_t j = 0; j < needles.size(); ++j) order.emplace_back(std::min(at[j], c), j);
    std::sort(order.begin(), order.end());
    Assembled a;
    a.haystack_bytes = static_cast<int64_t>(c);
    a.needle_offsets.assign(needles.size(), 0);
    bool after_first = false;
    auto add = [&](std::string_view piece, bool haystack_chunk) {
        if (piece.empty()) return;
        if (!a.text.empty()) a.text += '\n';
        a.text.append(piece);
        if (!haystack_chunk) return;
        std::string& side = after_first ? a.haystack_after : a.haystack_before;
        if (!side.empty()) side += '\n';
        side.append(piece);
    };
    add(head, false);
    size_t prev = 0;
    for (const auto& [b, j] : order) {
        add(trim_right(std::string_view(hs).substr(prev, b - prev)), true);
        prev = b;
        if (!a.text.empty()) a.text += '\n';
        a.needle_offsets[j] = a.text.size();
        a.text += needles[j].text;
        after_first = after_first || j == 0;
    }
    add(trim_right(std::string_view(hs).substr(prev, c - prev)), true);
    add(tail, false);
    return a;
}

// The prompt with needles placed for the cut c itself.
inline Assembled assemble(const std::string& head, Haystack& haystack, size_t c,
                          const std::vector<Needle>& needles, const std::string& tail) {
    const std::string& hs = haystack.text(c);
    return assemble(head, haystack, c, needles, place_needles(hs, std::min(c, hs.size()), needles),
                    tail);
}

struct FittedPrompt {
    Assembled prompt;
    int64_t tokens = 0;       // of prompt.text
    double needle_depth = 0;  // measured: haystack tokens before needle 0 / all haystack tokens
};

// The largest cut c >= lo whose prompt has at most target tokens (tokens(lo) <= target): doubling
// then bisection, then the next few characters, since merges can make counts wiggle.
inline size_t largest_fitting_cut(Haystack& haystack, size_t lo, int64_t target,
                                  const std::function<int64_t(size_t)>& tokens_at) {
    size_t step = static_cast<size_t>(std::max<int64_t>(target - tokens_at(lo), 16));
    size_t hi = lo + step;
    for (;;) {
        const size_t avail = haystack.text(hi).size();
        if (avail < hi) {
            if (tokens_at(avail) <= target)
                fail("the haystack text ran out (" + std::to_string(avail) +
                     " bytes) before the prompt reached " + std::to_string(target) + " tokens");
            hi = avail;
            break;
        }
        if (tokens_at(hi) > target) break;
        lo = hi;
        step *= 2;
        hi = lo + step;
    }
    while (hi - lo > 1) {  // tokens_at(lo) <= target < tokens_at(hi)
        const size_t mid = lo + (hi - lo) / 2;
        (tokens_at(mid) <= target ? lo : hi) = mid;
    }
    size_t best = lo;
    int64_t best_tokens = tokens_at(lo);
    for (size_t c = lo + 1; c <= lo + 16 && best_tokens < target; ++c) {
        const int64_t t = tokens_at(c);
        if (t <= target && t > best_tokens) best = c, best_tokens = t;
    }
    return best;
}

// The prompt whose token count is the largest <= target. Two passes: the first finds the cut
// with needles placed for each candidate cut; the second freezes those needle positions and
// finds the cut again, so the count moves by whole characters only (a needle hopping to the next
// sentence start would change it by more). Fails when even the fixed text (head, needles, tail)
// has more than target tokens, or when the haystack stream ends first.
inline FittedPrompt fit_prompt(const std::string& head, Haystack& haystack,
                               const std::vector<Needle>& needles, const std::string& tail,
                               int64_t target, const CountTokens& count) {
    const int64_t fixed = count(assemble(head, haystack, 0, needles, tail).text);
    if (fixed > target)
        fail("the fixed text (task, needles, question) alone has " + std::to_string(fixed) +
             " tokens, more than the target " + std::to_string(target));
    const size_t rough = largest_fitting_cut(haystack, 0, target, [&](size_t c) {
        return count(assemble(head, haystack, c, needles, tail).text);
    });
    const std::string& hs = haystack.text(rough);
    const std::vector<size_t> at = place_needles(hs, std::min(rough, hs.size()), needles);
    size_t lo = 0;  // every needle position inside the haystack
    for (size_t b : at)
        if (b != kAtEnd) lo = std::max(lo, b);
    auto tokens_at = [&](size_t c) {
        return count(assemble(head, haystack, c, needles, at, tail).text);
    };
    const size_t cut =
        tokens_at(lo) <= target ? largest_fitting_cut(haystack, lo, target, tokens_at) : rough;
    FittedPrompt f;
    f.prompt = assemble(head, haystack, cut, needles, at, tail);
    f.tokens = count(f.prompt.text);
    const auto& p = f.prompt;
    const int64_t before = p.haystack_before.empty() ? 0 : count(p.haystack_before);
    const int64_t after = p.haystack_after.empty() ? 0 : count(p.haystack_after);
    f.needle_depth = before + after > 0
                         ? static_cast<double>(before) / static_cast<double>(before + after)
                         : 0.0;
    return f;
}

// RULER's depth grid: n even depths in [0, 1] (n >= 2), both ends included.
inline std::vector<double> even_depths(int64_t n) {
    std::vector<double> d;
    for (int64_t i = 0; i < n; ++i)
        d.push_back(static_cast<double>(i) / static_cast<double>(n - 1));
    return d;
}

}  // namespace ctx_retrieval
