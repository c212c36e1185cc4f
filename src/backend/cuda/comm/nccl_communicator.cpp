#include "backend/cuda/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace m3::comm {

namespace {

ncclDataType_t nccl_type(DataType t) {
  switch (t) {
    case DataType::kF32: return ncclFloat32;
    case DataType::kBF16: return ncclBfloat16;
    case DataType::kI32: return ncclInt32;
    case DataType::kI64: return ncclInt64;
    case DataType::kU8: return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kMax ? ncclMax : ncclSum; }

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, cudaStream_t stream, cudaEvent_t done,
                   std::chrono::milliseconds timeout)
      : comm_(comm), rank_(rank), size_(size), stream_(stream), done_(done), timeout_(timeout) {}
  ~NcclCommunicator() override {
    if (comm_ != nullptr) {
      if (aborted_) {
        ncclCommAbort(comm_);
      } else {
        ncclCommDestroy(comm_);
      }
    }
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (barrier_buf_ != nullptr) cudaFree(barrier_buf_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }

  Status all_reduce(void* buf, int64_t count, DataType type, ReduceOp op) override {
    if (count <= 0) return Status::ok();
    return check("all_reduce", ncclAllReduce(buf, buf, static_cast<size_t>(count), nccl_type(type),
                                             nccl_op(op), comm_, stream_));
  }
  Status all_gather(const void* send, void* recv, int64_t count, DataType type) override {
    if (count <= 0) return Status::ok();
    return check("all_gather", ncclAllGather(send, recv, static_cast<size_t>(count),
                                             nccl_type(type), comm_, stream_));
  }
  Status reduce_scatter(const void* send, void* recv, int64_t count, DataType type,
                        ReduceOp op) override {
    if (count <= 0) return Status::ok();
    return check("reduce_scatter",
                 ncclReduceScatter(send, recv, static_cast<size_t>(count), nccl_type(type),
                                   nccl_op(op), comm_, stream_));
  }
  Status all_to_all_v(const void* send, std::span<const int64_t> send_counts, void* recv,
                      std::span<const int64_t> recv_counts, DataType type) override {
    if (send_counts.size() != static_cast<size_t>(size_) ||
        recv_counts.size() != static_cast<size_t>(size_)) {
      return invalid_argument("[comm.nccl] all_to_all_v needs one send and one receive count "
                              "per rank (" + std::to_string(size_) + ")");
    }
    const size_t eb = element_bytes(type);
    const char* in = static_cast<const char*>(send);
    char* out = static_cast<char*>(recv);
    // Point-to-point sends and receives to every peer in one group: NCCL runs them together.
    if (ncclResult_t r = ncclGroupStart(); r != ncclSuccess) return check("all_to_all_v", r);
    size_t send_at = 0, recv_at = 0;
    ncclResult_t first = ncclSuccess;
    for (int peer = 0; peer < size_; ++peer) {
      const auto sc = static_cast<size_t>(send_counts[static_cast<size_t>(peer)]);
      const auto rc = static_cast<size_t>(recv_counts[static_cast<size_t>(peer)]);
      if (sc > 0 && first == ncclSuccess)
        first = ncclSend(in + send_at * eb, sc, nccl_type(type), peer, comm_, stream_);
      if (rc > 0 && first == ncclSuccess)
        first = ncclRecv(out + recv_at * eb, rc, nccl_type(type), peer, comm_, stream_);
      send_at += sc;
      recv_at += rc;
    }
    const ncclResult_t end = ncclGroupEnd();
    return check("all_to_all_v", first != ncclSuccess ? first : end);
  }
  Status broadcast(void* buf, int64_t count, DataType type, int root) override {
    if (root < 0 || root >= size_)
      return invalid_argument("[comm.nccl] broadcast root " + std::to_string(root) +
                              " outside the group of " + std::to_string(size_));
    if (count <= 0) return Status::ok();
    return check("broadcast", ncclBroadcast(buf, buf, static_cast<size_t>(count),
                                            nccl_type(type), root, comm_, stream_));
  }
  // A one-element all-reduce, then a wait: the host returns once every rank got there.
  Status barrier() override {
    if (barrier_buf_ == nullptr) {
      if (cudaMalloc(&barrier_buf_, sizeof(int32_t)) != cudaSuccess) {
        cudaGetLastError();
        return Status(StatusCode::kResourceExhausted, "[comm.nccl] barrier buffer");
      }
    }
    M3_RETURN_IF_ERROR(all_reduce(barrier_buf_, 1, DataType::kI32, ReduceOp::kSum));
    return synchronize();
  }

  // The watchdog: polls the stream's last collective until it completes, NCCL reports an
  // asynchronous error, or the timeout passes (then the communicator is aborted).
  Status synchronize() override {
    if (aborted_) return unusable("synchronize");
    if (cudaEventRecord(done_, stream_) != cudaSuccess) {
      cudaGetLastError();
      return Status(StatusCode::kInternal, "[comm.nccl] cudaEventRecord failed");
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (true) {
      const cudaError_t q = cudaEventQuery(done_);
      if (q == cudaSuccess) return Status::ok();
      if (q != cudaErrorNotReady) {
        return Status(StatusCode::kInternal,
                      std::string("[comm.nccl] waiting for collectives: ") + cudaGetErrorString(q));
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        abort_comm();
        return Status(StatusCode::kUnavailable,
                      "[comm.nccl] rank " + std::to_string(rank_) + " of " +
                          std::to_string(size_) + ": " + ncclGetErrorString(async));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        abort_comm();
        return Status(StatusCode::kUnavailable,
                      "[comm.nccl] rank " + std::to_string(rank_) + " of " +
                          std::to_string(size_) + ": collectives did not finish within " +
                          std::to_string(timeout_.count()) +
                          " ms (a rank died or stopped calling); the communicator is aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  Status check(const char* what, ncclResult_t r) {
    if (aborted_) return unusable(what);
    if (r == ncclSuccess) return Status::ok();
    return Status(StatusCode::kUnavailable, std::string("[comm.nccl] rank ") +
                                                std::to_string(rank_) + " of " +
                                                std::to_string(size_) + ": " + what + ": " +
                                                ncclGetErrorString(r));
  }
  Status unusable(const char* what) const {
    return Status(StatusCode::kUnavailable,
                  std::string("[comm.nccl] rank ") + std::to_string(rank_) + ": " + what +
                      " after the communicator was aborted: the group is unusable");
  }
  void abort_comm() {
    aborted_ = true;
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  ncclComm_t comm_;
  int rank_, size_;
  cudaStream_t stream_;
  cudaEvent_t done_;
  std::chrono::milliseconds timeout_;
  bool aborted_ = false;
  void* barrier_buf_ = nullptr;
};

}  // namespace

Result<NcclUniqueId> make_nccl_unique_id() {
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
    return Status(StatusCode::kUnavailable,
                  std::string("[comm.nccl] ncclGetUniqueId: ") + ncclGetErrorString(r));
  }
  NcclUniqueId out;
  static_assert(sizeof(id.internal) == sizeof(out.bytes));
  std::memcpy(out.bytes.data(), id.internal, sizeof(id.internal));
  return out;
}

Result<std::unique_ptr<Communicator>> create_nccl_communicator(int rank, int size, int device,
                                                               const NcclUniqueId& id,
                                                               CUstream_st* stream,
                                                               const NcclOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return invalid_argument("[comm.nccl] rank " + std::to_string(rank) + " of a group of " +
                            std::to_string(size));
  }
  if (cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    return invalid_argument("[comm.nccl] no CUDA device " + std::to_string(device));
  }
  ncclUniqueId nid;
  std::memcpy(nid.internal, id.bytes.data(), sizeof(nid.internal));
  // ncclCommInitRank blocks until every rank of the group has joined, with no timeout of its own:
  // a rank that dies after the unique id was handed out (another node's process, say) would hang
  // this one for ever. So the join runs on a thread of its own and is given options.timeout
  // (--dist-timeout). A join abandoned here that completes later aborts its communicator.
  struct Join {
    std::mutex m;
    std::condition_variable cv;
    bool done = false, abandoned = false;
    ncclComm_t comm = nullptr;
    ncclResult_t result = ncclSuccess;
  };
  auto join = std::make_shared<Join>();
  std::thread([join, nid, size, rank, device] {
    cudaSetDevice(device);
    ncclComm_t c = nullptr;
    const ncclResult_t r = ncclCommInitRank(&c, size, nid, rank);
    std::lock_guard<std::mutex> lock(join->m);
    if (join->abandoned) {
      if (r == ncclSuccess) ncclCommAbort(c);
      return;
    }
    join->comm = c;
    join->result = r;
    join->done = true;
    join->cv.notify_all();
  }).detach();
  ncclComm_t comm = nullptr;
  {
    std::unique_lock<std::mutex> lock(join->m);
    if (!join->cv.wait_for(lock, options.timeout, [&] { return join->done; })) {
      join->abandoned = true;
      return Status(StatusCode::kUnavailable,
                    "[comm.nccl] rank " + std::to_string(rank) + " of " + std::to_string(size) +
                        ": the group was not complete within " +
                        std::to_string(options.timeout.count()) +
                        " ms (--dist-timeout): a rank never joined");
    }
    if (join->result != ncclSuccess) {
      return Status(StatusCode::kUnavailable, "[comm.nccl] rank " + std::to_string(rank) +
                                                  " of " + std::to_string(size) +
                                                  " could not join: " +
                                                  ncclGetErrorString(join->result));
    }
    comm = join->comm;
  }
  cudaEvent_t done = nullptr;
  if (cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess) {
    cudaGetLastError();
    ncclCommDestroy(comm);
    return Status(StatusCode::kInternal, "[comm.nccl] cudaEventCreate failed");
  }
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(
      comm, rank, size, stream, done, options.timeout));
}

}  // namespace m3::comm
