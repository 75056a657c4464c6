#include "data/batch.h"

#include <cstddef>

namespace ctx {

void BatchBuffers::resize(int b, int t) {
    B = b;
    T = t;
    const size_t n = static_cast<size_t>(b) * t;
    tokens.assign(n, 0);
    targets.assign(n, 0);
    positions.assign(n, 0.0f);
    mask.assign(n, 0.0f);
    doc_start.clear();
}

Batch BatchBuffers::batch() const {
    return Batch{B, T, tokens.data(), positions.data(), targets.data(), mask.data(),
                 doc_start.empty() ? nullptr : doc_start.data()};
}

}  // namespace ctx
