// Branch-free float exp, log and tanh that GCC/Clang vectorize inside `#pragma omp simd` loops (glibc's
// expf/tanhf are scalar calls unless -ffast-math, which we do not use). The softmax of attention,
// the cross-entropy over the vocabulary, the GELU and the KERPLE biases run through these.
//
// exp: Cephes expf's range reduction and polynomial (x = n ln2 + r, |r| <= ln2/2, 2^n built in the
// exponent bits); relative error below 2e-7 (~2 ulp) over the whole range. Inputs below -87.3
// return 0 (true value < 1.2e-38), inputs above 88 are clamped to 88 (exp = 1.65e38; never reached:
// callers pass x - max <= 0 or a clamped tanh argument). NaN inputs give unspecified finite values.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace ctx::cpu {

inline float fast_exp(float x) {
    constexpr float kLog2e = 1.44269504088896341f;
    constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
    const float xc = x > 88.0f ? 88.0f : (x < -87.3f ? -87.3f : x);
    // n = round(x / ln2) by the 1.5 * 2^23 trick (floorf does not vectorize without -ffast-math)
    constexpr float kRound = 12582912.0f;
    const float n = (xc * kLog2e + kRound) - kRound;
    const float r = xc - n * kLn2Hi - n * kLn2Lo;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float e = p * r * r + r + 1.0f;                                      // exp(r)
    const float scale = std::bit_cast<float>((int32_t(n) + 127) << 23);  // 2^n, n in [-126, 127]
    return x < -87.3f ? 0.0f : e * scale;
}

// log: Cephes logf (x = m 2^e, m in [sqrt(1/2), sqrt(2)), polynomial in m - 1); error below
// 2e-7 * max(1, |log x|). x must be a positive normal
// float: 0, subnormals, inf and NaN give unspecified finite values (callers mask d = 0 away).
inline float fast_log(float x) {
    const int32_t bits = std::bit_cast<int32_t>(x);
    int32_t e = ((bits >> 23) & 0xff) - 127;
    float m = std::bit_cast<float>((bits & 0x007fffff) | 0x3f800000);  // [1, 2)
    const bool big = m > 1.41421356f;
    m = big ? 0.5f * m : m;
    e = big ? e + 1 : e;
    const float f = m - 1.0f, z = f * f;
    float y = 7.0376836292e-2f;
    y = y * f - 1.1514610310e-1f;
    y = y * f + 1.1676998740e-1f;
    y = y * f - 1.2420140846e-1f;
    y = y * f + 1.4249322787e-1f;
    y = y * f - 1.6668057665e-1f;
    y = y * f + 2.0000714765e-1f;
    y = y * f - 2.4999993993e-1f;
    y = y * f + 3.3333331174e-1f;
    y = y * f * z;
    const float ef = float(e);
    y += -2.12194440e-4f * ef;
    y += -0.5f * z;
    return f + y + 0.693359375f * ef;
}

// tanh(x) = 1 - 2 / (1 + exp(2x)); absolute error below ~2e-7 (the GELU needs absolute accuracy).
inline float fast_tanh(float x) {
    const float xc = x > 20.0f ? 20.0f : (x < -20.0f ? -20.0f : x);
    return 1.0f - 2.0f / (1.0f + fast_exp(2.0f * xc));
}

// max(x[0 .. n)), n >= 1. Written as a compare-and-select: GCC vectorises that under
// `omp simd reduction(max)`, but not std::max (a serial vmaxss chain at 4 cycles per element:
// 17x slower, and 40% of the attention forward and 74% of the cross-entropy at our sizes).
// Same result as std::max for every input, NaNs included (a NaN x[i] never replaces m).
// Whole blocks of 16 with a constant trip count (no scalar epilogue), the rest scalar.
inline float row_max(const float* x, int n) {
    float lane_max[16];
    for (int l = 0; l < 16; l++) lane_max[l] = x[0];
    int i0 = 1;
    for (; i0 + 16 <= n; i0 += 16) {
#pragma omp simd
        for (int l = 0; l < 16; l++) lane_max[l] = x[i0 + l] > lane_max[l] ? x[i0 + l] : lane_max[l];
    }
    float m = x[0];
    for (int l = 0; l < 16; l++) m = lane_max[l] > m ? lane_max[l] : m;
    for (int i = i0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

// Softmax numerators in place: x[j] = exp(x[j] - mx) for j < n, returning their sum. The row
// has room for `room` >= n floats; the loop runs on to the next multiple of 16 within that room,
// writing 0 there, so it ends on whole vectors: the scalar remainder of a loop of n iterations
// (up to 15 scalar exps per row) was most of the attention softmax's time at T = 128.
// The end of a loop over n entries carried on to whole 16-float vectors within `room` entries.
inline int whole_vector_end(int n, int room) { return std::min(room, (n + 15) / 16 * 16); }

inline float exp_shifted_sum(float* x, int n, int room, float mx) {
    const int end = whole_vector_end(n, room);
    // Blocks of 16 with a constant trip count, so GCC emits whole vectors and no scalar
    // epilogue (a loop to `end` ran much of its exps scalar); 16 lane sums added in lane order
    // at the end: the same sum on AVX2 and AVX-512.
    float lane_sum[16] = {};
    int j0 = 0;
    for (; j0 + 16 <= end; j0 += 16) {
        float* xb = x + j0;
        const int valid = n - j0;
#pragma omp simd
        for (int l = 0; l < 16; l++) {
            const float e = l < valid ? fast_exp(xb[l] - mx) : 0.0f;
            xb[l] = e;
            lane_sum[l] += e;
        }
    }
    for (int l = 0; j0 + l < end; l++) {  // only when `room` ends inside a vector
        const float e = j0 + l < n ? fast_exp(x[j0 + l] - mx) : 0.0f;
        x[j0 + l] = e;
        lane_sum[l] += e;
    }
    float sum = 0.0f;
    for (int l = 0; l < 16; l++) sum += lane_sum[l];
    return sum;
}

}  // namespace ctx::cpu
