// GoogleTest executables that also run under mpirun (tests of collectives): the MPI world when
// launched by mpirun (nullptr otherwise), and a main() whose exit code fails on every rank when
// a test failed on any rank, so ctest sees one verdict.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "parallel/comm.h"

namespace ctx::test {

inline Comm* mpi_world() {
    static std::unique_ptr<Comm> c = mpi_initialized() ? make_mpi_comm() : nullptr;
    return c.get();
}

// CTX_TEST_EXPECT_WORLD=N (set by the ctest) guards against a launcher that silently ran N
// separate one-rank worlds.
inline int mpi_gtest_main(int argc, char** argv) {
    ::testing::InitGoogleTest(&argc, argv);
    const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") ||
                          std::getenv("PMIX_RANK");
    if (launched) mpi_init(&argc, &argv);
    if (const char* want = std::getenv("CTX_TEST_EXPECT_WORLD")) {
        const int have = mpi_world() ? mpi_world()->size() : 1;
        if (have != std::atoi(want)) {
            std::fprintf(stderr, "CTX_TEST_EXPECT_WORLD=%s but the MPI world has %d rank(s)\n",
                         want, have);
            return 1;
        }
    }
    const int rc = RUN_ALL_TESTS();
    int worst = rc;
    if (launched) {
        double r[1] = {double(rc != 0)};
        mpi_world()->allreduce_sum(r, 1);
        worst = r[0] > 0 ? 1 : 0;
        mpi_finalize();
    }
    return worst;
}

}  // namespace ctx::test
