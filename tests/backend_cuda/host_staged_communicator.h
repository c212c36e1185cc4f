// GPU ranks without NCCL, for tests on one GPU (NCCL refuses two ranks on one device): a
// communicator over device buffers that waits for the rank's stream, copies the buffer to the
// host, runs the collective on a host communicator (Gloo, in this process) and copies the result
// back. Synchronous, so it cannot be captured into a CUDA graph (a call on a capturing stream
// fails); the tensor-parallel model's numerics are the same as over NCCL up to the order of the
// float32 sums of two ranks, which is exact (a + b = b + a).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/comm/communicator.h"

namespace m3::testing {

class HostStagedCommunicator final : public comm::Communicator {
 public:
  HostStagedCommunicator(std::unique_ptr<comm::Communicator> host, int device, cudaStream_t stream)
      : host_(std::move(host)), device_(device), stream_(stream) {}

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string name() const override { return "host-staged " + host_->name(); }

  Status all_reduce(void* buf, int64_t count, comm::DataType type, comm::ReduceOp op) override {
    const size_t bytes = static_cast<size_t>(count) * comm::element_bytes(type);
    std::vector<uint8_t> h(bytes);
    M3_RETURN_IF_ERROR(to_host(h.data(), buf, bytes));
    M3_RETURN_IF_ERROR(host_->all_reduce(h.data(), count, type, op));
    return to_device(buf, h.data(), bytes);
  }
  Status all_gather(const void* send, void* recv, int64_t count, comm::DataType type) override {
    const size_t bytes = static_cast<size_t>(count) * comm::element_bytes(type);
    std::vector<uint8_t> s(bytes), r(bytes * static_cast<size_t>(size()));
    M3_RETURN_IF_ERROR(to_host(s.data(), send, bytes));
    M3_RETURN_IF_ERROR(host_->all_gather(s.data(), r.data(), count, type));
    return to_device(recv, r.data(), r.size());
  }
  Status reduce_scatter(const void*, void*, int64_t, comm::DataType, comm::ReduceOp) override {
    return Status(StatusCode::kUnimplemented, "[host-staged] reduce_scatter is not staged");
  }
  Status all_to_all_v(const void*, std::span<const int64_t>, void*, std::span<const int64_t>,
                      comm::DataType) override {
    return Status(StatusCode::kUnimplemented, "[host-staged] all_to_all_v is not staged");
  }
  Status broadcast(void* buf, int64_t count, comm::DataType type, int root) override {
    const size_t bytes = static_cast<size_t>(count) * comm::element_bytes(type);
    std::vector<uint8_t> h(bytes);
    M3_RETURN_IF_ERROR(to_host(h.data(), buf, bytes));
    M3_RETURN_IF_ERROR(host_->broadcast(h.data(), count, type, root));
    return to_device(buf, h.data(), bytes);
  }
  Status barrier() override { return host_->barrier(); }
  Status synchronize() override { return check(cudaStreamSynchronize(stream_), "synchronize"); }

 private:
  Status check(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return Status::ok();
    cudaGetLastError();
    return Status(StatusCode::kInternal,
                  std::string("[host-staged] ") + what + ": " + cudaGetErrorString(e));
  }
  Status to_host(void* h, const void* d, size_t bytes) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    M3_RETURN_IF_ERROR(check(cudaStreamIsCapturing(stream_, &capturing), "cudaStreamIsCapturing"));
    if (capturing != cudaStreamCaptureStatusNone)
      return Status(StatusCode::kInternal,
                    "[host-staged] collectives cannot be captured into a CUDA graph");
    M3_RETURN_IF_ERROR(check(cudaSetDevice(device_), "cudaSetDevice"));
    M3_RETURN_IF_ERROR(check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
    return check(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
  }
  Status to_device(void* d, const void* h, size_t bytes) {
    M3_RETURN_IF_ERROR(
        check(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync"));
    return check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  std::unique_ptr<comm::Communicator> host_;
  int device_;
  cudaStream_t stream_;
};

}  // namespace m3::testing
