// The MPI world (builds with CTX_MPI=ON, the default); comm_nompi.cpp replaces this file in
// builds without MPI.
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <limits>

#include "core/error.h"
#include "parallel/comm.h"

namespace ctx {
namespace {

void check_mpi(int rc, const char* call) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    fail("{} failed: {}", call, std::string(msg, len));
}

class MpiComm final : public Comm {
public:
    // Takes ownership of `comm` unless it is MPI_COMM_WORLD.
    explicit MpiComm(MPI_Comm comm = MPI_COMM_WORLD) : comm_(comm) {
        MPI_Comm_rank(comm_, &rank_);
        MPI_Comm_size(comm_, &size_);
    }
    ~MpiComm() override {
        int fin = 0;
        MPI_Finalized(&fin);
        if (comm_ != MPI_COMM_WORLD && !fin) MPI_Comm_free(&comm_);
    }
    MpiComm(const MpiComm&) = delete;
    MpiComm& operator=(const MpiComm&) = delete;
    int rank() const override { return rank_; }
    int size() const override { return size_; }
    void allreduce_sum(float* data, size_t n) override { reduce(data, n, MPI_FLOAT); }
    void allreduce_sum(double* data, size_t n) override { reduce(data, n, MPI_DOUBLE); }
    void barrier() override { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }
    void allgather(const void* send, size_t bytes, void* recv) override {
        CTX_CHECK(bytes <= static_cast<size_t>(std::numeric_limits<int>::max()),
                  "allgather of {} bytes is too large", bytes);
        check_mpi(MPI_Allgather(send, static_cast<int>(bytes), MPI_BYTE, recv,
                                static_cast<int>(bytes), MPI_BYTE, comm_),
                  "MPI_Allgather");
    }
    void broadcast(void* data, size_t bytes, int root) override {
        const size_t chunk = static_cast<size_t>(std::numeric_limits<int>::max());
        for (size_t off = 0; off < bytes; off += chunk)
            check_mpi(MPI_Bcast(static_cast<char*>(data) + off,
                                static_cast<int>(std::min(chunk, bytes - off)), MPI_BYTE, root,
                                comm_),
                      "MPI_Bcast");
    }

    void reduce_scatter_sum(float* data, size_t n) override {
        if (size_ == 1) return;
        CTX_CHECK(n <= static_cast<size_t>(std::numeric_limits<int>::max()),
                  "reduce-scatter of {} floats per rank is too large", n);
        check_mpi(MPI_Reduce_scatter_block(MPI_IN_PLACE, data, static_cast<int>(n), MPI_FLOAT,
                                           MPI_SUM, comm_),
                  "MPI_Reduce_scatter_block");
    }
    void sendrecv(const void* send, void* recv, size_t bytes, int dest, int src) override {
        CTX_CHECK(bytes <= static_cast<size_t>(std::numeric_limits<int>::max()),
                  "sendrecv of {} bytes is too large", bytes);
        check_mpi(MPI_Sendrecv(send, static_cast<int>(bytes), MPI_BYTE, dest, 0, recv,
                               static_cast<int>(bytes), MPI_BYTE, src, 0, comm_,
                               MPI_STATUS_IGNORE),
                  "MPI_Sendrecv");
    }
    // MPI_Irecv + MPI_Isend; wait() is MPI_Waitall (Open MPI moves large messages along inside
    // MPI calls, so the overlap is best effort).
    class MpiExchange final : public Exchange {
    public:
        MpiExchange() = default;
        ~MpiExchange() override {
            if (pending_ && std::uncaught_exceptions() == 0) wait();
        }
        void wait() override {
            if (!pending_) return;
            pending_ = false;
            check_mpi(MPI_Waitall(2, reqs_, MPI_STATUSES_IGNORE), "MPI_Waitall (sendrecv)");
        }
        MPI_Request reqs_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
        bool pending_ = true;
    };
    std::unique_ptr<Exchange> start_sendrecv(const void* send, void* recv, size_t bytes, int dest,
                                             int src) override {
        CTX_CHECK(bytes <= static_cast<size_t>(std::numeric_limits<int>::max()),
                  "sendrecv of {} bytes is too large", bytes);
        auto x = std::make_unique<MpiExchange>();
        const int n = static_cast<int>(bytes);
        check_mpi(MPI_Irecv(recv, n, MPI_BYTE, src, 1, comm_, &x->reqs_[0]), "MPI_Irecv");
        check_mpi(MPI_Isend(send, n, MPI_BYTE, dest, 1, comm_, &x->reqs_[1]), "MPI_Isend");
        return x;
    }
    std::unique_ptr<Comm> split(int color, int key) override {
        MPI_Comm sub = MPI_COMM_NULL;
        check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
        return std::make_unique<MpiComm>(sub);
    }
    const void* mpi_native() const override { return &comm_; }

private:
    template <typename T>
    void reduce(T* data, size_t n, MPI_Datatype type) {
        if (size_ == 1) return;
        // MPI counts are int: reduce in chunks so arenas over 2^31 elements still work.
        const size_t chunk = static_cast<size_t>(std::numeric_limits<int>::max());
        for (size_t off = 0; off < n; off += chunk) {
            const int count = static_cast<int>(std::min(chunk, n - off));
            check_mpi(MPI_Allreduce(MPI_IN_PLACE, data + off, count, type, MPI_SUM,
                                    comm_),
                      "MPI_Allreduce");
        }
    }
    int rank_ = 0, size_ = 1;
    MPI_Comm comm_;
};

bool g_we_initialized = false;

}  // namespace

std::unique_ptr<Comm> make_mpi_comm() {
    CTX_CHECK(mpi_initialized(), "internal: make_mpi_comm() before mpi_init()");
    return std::make_unique<MpiComm>();
}

void mpi_init(int* argc, char*** argv) {
    int flag = 0;
    MPI_Initialized(&flag);
    if (flag) return;
    check_mpi(MPI_Init(argc, argv), "MPI_Init");
    g_we_initialized = true;
}

void mpi_finalize() {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin && g_we_initialized) MPI_Finalize();
}

void mpi_abort(int code) {
    if (mpi_initialized()) MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code);
}

bool mpi_initialized() {
    int flag = 0;
    MPI_Initialized(&flag);
    return flag != 0;
}

}  // namespace ctx
