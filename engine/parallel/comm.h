// Collectives behind one interface (DESIGN.md decision 7). Processes come from mpirun; a single
// process without mpirun gets a world of one.
#pragma once

#include <cstddef>
#include <memory>

namespace ctx {

class Comm {
public:
    virtual ~Comm() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    // In-place sums over all ranks.
    virtual void allreduce_sum(float* data, size_t n) = 0;
    virtual void allreduce_sum(double* data, size_t n) = 0;
    virtual void barrier() = 0;
    // Every rank contributes `bytes` bytes; recv (size() * bytes) receives them in rank order.
    virtual void allgather(const void* send, size_t bytes, void* recv) = 0;
    // In place: data holds size() blocks of n; afterwards its first block is the sum over ranks
    // of every rank's block number rank() (MPI_Reduce_scatter_block with MPI_IN_PLACE).
    virtual void reduce_scatter_sum(float* data, size_t n) = 0;
    // Sends `bytes` bytes to rank dest and receives as many from rank src into recv (a ring's
    // step: MPI_Sendrecv). recv must not overlap send.
    virtual void sendrecv(const void* send, void* recv, size_t bytes, int dest, int src) = 0;
    // The same exchange started without waiting, so computation can overlap it (the ring's next
    // block travels while this one is used): send must stay unchanged and recv untouched until
    // the returned exchange's wait() (also called by its destructor). The default exchanges at
    // once (blocking).
    class Exchange {
    public:
        virtual ~Exchange() = default;
        virtual void wait() {}
    };
    virtual std::unique_ptr<Exchange> start_sendrecv(const void* send, void* recv, size_t bytes,
                                                     int dest, int src) {
        sendrecv(send, recv, bytes, dest, src);
        return std::make_unique<Exchange>();
    }
    // Rank `root`'s buffer is copied to every rank.
    virtual void broadcast(void* data, size_t bytes, int root) = 0;
    // The ranks with the same color form one new communicator, ordered by key (MPI_Comm_split).
    // Collective over this communicator.
    virtual std::unique_ptr<Comm> split(int color, int key) = 0;
    // The MPI_Comm behind this communicator (a `const MPI_Comm*`), for code that calls MPI
    // directly (the gradient reducer); null for a world of one.
    virtual const void* mpi_native() const { return nullptr; }
};

// A world of one: every collective is the identity.
std::unique_ptr<Comm> make_single_comm();
// MPI_COMM_WORLD. Requires mpi_init() first. In a build without MPI (CTX_MPI=OFF,
// comm_nompi.cpp) the world of one.
std::unique_ptr<Comm> make_mpi_comm();

// MPI_Init / MPI_Finalize for the executable. Safe to call once each; tests that never call
// them use make_single_comm(). Without MPI: mpi_init ends the process (exit 2) when a launcher
// started several ranks, mpi_initialized() is false, mpi_abort is exit.
void mpi_init(int* argc, char*** argv);
void mpi_finalize();
bool mpi_initialized();
// Ends every rank (MPI_Abort) so a failure on one never leaves the others hanging.
[[noreturn]] void mpi_abort(int code);

}  // namespace ctx
