#include "data/windows.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"

namespace ctx {

std::vector<Window> make_windows(const std::vector<int64_t>& doc_lengths, int64_t window_len,
                                 const std::vector<int64_t>& doc_ids) {
    CTX_CHECK(window_len > 0, "window length must be positive, got {}", window_len);
    std::vector<Window> out;
    for (int64_t d : doc_ids) {
        CTX_CHECK(d >= 0 && d < static_cast<int64_t>(doc_lengths.size()),
                  "document {} does not exist ({} documents)", d, doc_lengths.size());
        const int64_t n = windows_in_doc(doc_lengths[static_cast<size_t>(d)], window_len);
        for (int64_t k = 0; k < n; ++k) out.push_back({d, k * window_len});
    }
    return out;
}

std::vector<Window> make_windows(const DocStore& docs, int64_t window_len) {
    std::vector<int64_t> ids(static_cast<size_t>(docs.n_docs()));
    std::iota(ids.begin(), ids.end(), int64_t{0});
    return make_windows(docs.doc_lengths(), window_len, ids);
}

DocSplit split_documents(int64_t n_docs, double val_fraction, double test_fraction,
                         uint64_t seed) {
    CTX_CHECK(n_docs >= 0, "split: n_docs must be >= 0, got {}", n_docs);
    CTX_CHECK(val_fraction >= 0 && test_fraction >= 0 && val_fraction + test_fraction <= 1.0,
              "split: fractions must be >= 0 with val + test <= 1, got val {} and test {}",
              val_fraction, test_fraction);
    std::vector<int64_t> ids(static_cast<size_t>(n_docs));
    std::iota(ids.begin(), ids.end(), int64_t{0});
    // Fisher-Yates with our own Rng: std::shuffle's algorithm is implementation-defined, and
    // the split must be the same on every platform.
    Rng rng(seed ^ 0x5EED5B1175ull);
    for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[rng.below(i)]);
    const auto n_val = static_cast<size_t>(std::llround(static_cast<double>(n_docs) * val_fraction));
    const auto n_test = std::min(ids.size() - n_val, static_cast<size_t>(std::llround(
                                                         static_cast<double>(n_docs) * test_fraction)));
    DocSplit s;
    s.val.assign(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(n_val));
    s.test.assign(ids.begin() + static_cast<ptrdiff_t>(n_val),
                  ids.begin() + static_cast<ptrdiff_t>(n_val + n_test));
    s.train.assign(ids.begin() + static_cast<ptrdiff_t>(n_val + n_test), ids.end());
    std::sort(s.train.begin(), s.train.end());
    std::sort(s.val.begin(), s.val.end());
    std::sort(s.test.begin(), s.test.end());
    return s;
}

}  // namespace ctx
