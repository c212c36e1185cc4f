#include "backend/cuda/comm/one_shot_communicator.h"

#include <string>
#include <utility>

namespace m3::comm {
namespace {

class OneShotCommunicator final : public Communicator {
 public:
  OneShotCommunicator(std::unique_ptr<Communicator> inner,
                      std::shared_ptr<cuda::OneShotAllReduce> one_shot, CUstream_st* stream)
      : inner_(std::move(inner)), one_shot_(std::move(one_shot)), stream_(stream) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name() + " + one-shot all-reduce"; }

  Status all_reduce(void* buf, int64_t count, DataType type, ReduceOp op) override {
    if (type == DataType::kF32 && op == ReduceOp::kSum && count > 0 &&
        count <= one_shot_->max_elements())
      return one_shot_->all_reduce(rank(), static_cast<float*>(buf), count, stream_);
    return inner_->all_reduce(buf, count, type, op);
  }
  Status all_gather(const void* send, void* recv, int64_t count, DataType type) override {
    return inner_->all_gather(send, recv, count, type);
  }
  Status reduce_scatter(const void* send, void* recv, int64_t count, DataType type,
                        ReduceOp op) override {
    return inner_->reduce_scatter(send, recv, count, type, op);
  }
  Status all_to_all_v(const void* send, std::span<const int64_t> send_counts, void* recv,
                      std::span<const int64_t> recv_counts, DataType type) override {
    return inner_->all_to_all_v(send, send_counts, recv, recv_counts, type);
  }
  Status broadcast(void* buf, int64_t count, DataType type, int root) override {
    return inner_->broadcast(buf, count, type, root);
  }
  Status barrier() override { return inner_->barrier(); }
  Status synchronize() override {
    M3_RETURN_IF_ERROR(inner_->synchronize());
    return one_shot_->error(rank());
  }

 private:
  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<cuda::OneShotAllReduce> one_shot_;
  CUstream_st* stream_;
};

}  // namespace

std::unique_ptr<Communicator> with_one_shot_all_reduce(
    std::unique_ptr<Communicator> inner, std::shared_ptr<cuda::OneShotAllReduce> one_shot,
    CUstream_st* stream) {
  return std::make_unique<OneShotCommunicator>(std::move(inner), std::move(one_shot), stream);
}

}  // namespace m3::comm
