// cpu_tile_gemm.h, the small-matrix product under the CPU attention kernels: against a
// double-precision triple loop for every row count up to kTileMR, column counts around the vector
// width and the tile width (tails), A read directly and transposed, alpha, accumulate, K = 0 and
// leading dimensions larger than the matrix; columns past N and rows past M never written; and
// the property the kernels rely on for reproducibility: an element's value does not depend on
// how the product is cut into calls (rows, column ranges).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/cpu_tile_gemm.h"

namespace {

using ctx::cpu::kTileCols;
using ctx::cpu::kTileLanes;
using ctx::cpu::kTileMR;
using ctx::cpu::tile_gemm;
using ctx::cpu::tile_gemm_rows;

std::vector<float> random_vector(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return v;
}

struct Case {
    int M, N, K;
    bool a_transposed, accumulate;
    float alpha;
};

void check_case(const Case& c) {
    SCOPED_TRACE(testing::Message() << "M=" << c.M << " N=" << c.N << " K=" << c.K
                                    << " At=" << c.a_transposed << " acc=" << c.accumulate
                                    << " alpha=" << c.alpha);
    // A stored (M, K) with ld K + 3, or (K, M) with ld M + 5 when transposed; B (K, N) ld N + 7;
    // C (M + 2, N + 9): the extra rows and columns are sentinels that must stay as they were.
    const ptrdiff_t lda = c.a_transposed ? c.M + 5 : c.K + 3, ldb = c.N + 7, ldc = c.N + 9;
    const size_t a_size = size_t(c.a_transposed ? c.K : c.M) * lda + 1;
    const std::vector<float> A = random_vector(a_size, 11 + c.M);
    const std::vector<float> B = random_vector(size_t(std::max(c.K, 1)) * ldb, 23 + c.N);
    const std::vector<float> C0 = random_vector(size_t(c.M + 2) * ldc, 37 + c.K);
    const ptrdiff_t a_rs = c.a_transposed ? 1 : lda, a_ks = c.a_transposed ? lda : 1;
    std::vector<float> C = C0;
    tile_gemm(c.M, c.N, c.K, c.alpha, A.data(), a_rs, a_ks, B.data(), ldb, C.data(), ldc,
              c.accumulate);
    for (int r = 0; r < c.M + 2; r++)
        for (int n = 0; n < ldc; n++) {
            const size_t at = size_t(r) * ldc + n;
            if (r >= c.M || n >= c.N) {
                ASSERT_EQ(C[at], C0[at]) << "wrote outside the product at row " << r << " col " << n;
                continue;
            }
            double want = 0.0, scale = 0.0;
            for (int k = 0; k < c.K; k++) {
                const double p = double(A[r * a_rs + k * a_ks]) * double(B[size_t(k) * ldb + n]);
                want += p;
                scale += std::fabs(p);
            }
            want *= c.alpha;
            if (c.accumulate) want += C0[at];
            const double tol = 1e-6 * (std::fabs(c.alpha) * scale + 1.0);
            ASSERT_NEAR(C[at], want, tol) << "row " << r << " col " << n;
        }
}

TEST(TileGemm, MatchesTripleLoopOnEveryTileShape) {
    const int Ns[] = {1, kTileLanes - 1, kTileLanes, kTileLanes + 1, kTileCols - 1, kTileCols,
                      kTileCols + 3, 2 * kTileCols + kTileLanes, 130};
    for (int M = 1; M <= 2 * kTileMR + 1; M++)
        for (int N : Ns)
            for (int K : {0, 1, 7, 32, 65})
                for (bool at : {false, true})
                    for (bool acc : {false, true})
                        check_case({M, N, K, at, acc, acc ? 0.125f : 1.0f});
}

TEST(TileGemm, AttentionShapes) {
    // The per-head products of a T = 128, D = 32 / 64 model: scores (M 64, N <= 128, K D),
    // probabilities x values (M 64, N D, K <= 128), and the transposed backward products.
    for (int D : {32, 64, 40})
        for (const Case& c : {Case{64, 128, D, false, false, 0.17f}, Case{64, D, 128, false, false, 1.0f},
                              Case{128, D, 64, true, true, 0.17f}})
            check_case(c);
}

// The attention kernels trim each row group's columns and depth to the causal part, so one
// element may be computed as part of a whole vector in one call and of a tail in another: its
// value must be the same bits.
TEST(TileGemm, ElementDoesNotDependOnHowTheProductIsCut) {
    const int M = 11, N = 3 * kTileCols + 5, K = 48;
    const std::vector<float> A = random_vector(size_t(M) * K, 5), B = random_vector(size_t(K) * N, 6);
    std::vector<float> whole(size_t(M) * N), cut(size_t(M) * N, 0.0f);
    tile_gemm(M, N, K, 0.3f, A.data(), K, 1, B.data(), N, whole.data(), N, false);
    // Row by row, each row in column ranges of odd widths starting at odd offsets.
    for (int r = 0; r < M; r++)
        for (int j = 0; j < N;) {
            const int w = std::min(N - j, 1 + (r * 7 + j) % (kTileCols + 2));
            tile_gemm_rows(1, w, K, 0.3f, A.data() + size_t(r) * K, K, 1, B.data() + j, N,
                           cut.data() + size_t(r) * N + j, N, false);
            j += w;
        }
    for (size_t i = 0; i < whole.size(); i++) ASSERT_EQ(whole[i], cut[i]) << "element " << i;
}

TEST(TileGemm, TransposeIntoEveryBlockAndEdge) {
    for (int rows : {1, 7, 8, 9, 16, 23})
        for (int cols : {1, 5, 8, 13, 32}) {
            const ptrdiff_t lds = cols + 3, ldd = rows + 2;
            const std::vector<float> src = random_vector(size_t(rows) * lds, rows * 100 + cols);
            std::vector<float> dst(size_t(cols) * ldd + 1, -7.0f);
            ctx::cpu::transpose_into(dst.data(), ldd, src.data(), lds, rows, cols);
            for (int c = 0; c < cols; c++)
                for (int r = 0; r < ldd; r++)
                    ASSERT_EQ(dst[size_t(c) * ldd + r], r < rows ? src[size_t(r) * lds + c] : -7.0f)
                        << rows << "x" << cols << " at dst row " << c << " col " << r;
        }
}

}  // namespace
