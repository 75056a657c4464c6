// The process world of a build without MPI (CMake -DCTX_MPI=OFF; docs/ARCHITECTURE.md): the
// world is this one process. It replaces comm_mpi.cpp so the same executable and tests build
// where Open MPI cannot be installed or carried (the GPU bundle, docs/CUDA.md).
#include <cstdio>
#include <cstdlib>

#include "parallel/comm.h"

namespace ctx {

std::unique_ptr<Comm> make_mpi_comm() { return make_single_comm(); }

// Started as one of several ranks (mpirun, srun, torchrun), each copy would train alone on the
// whole data and write the same outputs: end the process instead, as a failing MPI_Init would.
void mpi_init(int*, char***) {
    for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE"}) {
        const char* v = std::getenv(var);
        if (v == nullptr || std::atoi(v) <= 1) continue;
        std::fprintf(stderr,
                     "ctxengine: the launcher started %s ranks (%s), but this build has no MPI "
                     "(CMake CTX_MPI=OFF) and runs as a single process; run it without mpirun, "
                     "or use a build with MPI\n",
                     v, var);
        std::exit(2);
    }
}

void mpi_finalize() {}

bool mpi_initialized() { return false; }

void mpi_abort(int code) { std::exit(code); }

}  // namespace ctx
