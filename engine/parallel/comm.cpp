// The world of one, in every build (tests and `ctxengine bench` use it directly).
#include <cstring>

#include "parallel/comm.h"

namespace ctx {
namespace {

class SingleComm final : public Comm {
public:
    int rank() const override { return 0; }
    int size() const override { return 1; }
    void allreduce_sum(float*, size_t) override {}
    void allreduce_sum(double*, size_t) override {}
    void barrier() override {}
    void allgather(const void* send, size_t bytes, void* recv) override {
        if (bytes) std::memcpy(recv, send, bytes);
    }
    void broadcast(void*, size_t, int) override {}
    void reduce_scatter_sum(float*, size_t) override {}
    void sendrecv(const void* send, void* recv, size_t bytes, int, int) override {
        if (bytes) std::memcpy(recv, send, bytes);  // to and from itself
    }
    std::unique_ptr<Comm> split(int, int) override { return std::make_unique<SingleComm>(); }
};

}  // namespace

std::unique_ptr<Comm> make_single_comm() { return std::make_unique<SingleComm>(); }

}  // namespace ctx
