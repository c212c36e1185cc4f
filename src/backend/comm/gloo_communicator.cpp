#include "backend/comm/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <thread>

#include "core/dtype.h"

namespace m3::comm {

namespace {

using ReduceFn = std::function<void(void*, const void*, const void*, size_t)>;

template <typename T>
ReduceFn plain_reduce(ReduceOp op) {
  if (op == ReduceOp::kMax) {
    return [](void* c, const void* a, const void* b, size_t n) {
      T* out = static_cast<T*>(c);
      const T* x = static_cast<const T*>(a);
      const T* y = static_cast<const T*>(b);
      for (size_t i = 0; i < n; ++i) out[i] = std::max(x[i], y[i]);
    };
  }
  return [](void* c, const void* a, const void* b, size_t n) {
    T* out = static_cast<T*>(c);
    const T* x = static_cast<const T*>(a);
    const T* y = static_cast<const T*>(b);
    for (size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
  };
}

// bf16 pairs reduced in float32, rounded to nearest even.
ReduceFn bf16_reduce(ReduceOp op) {
  const bool max = op == ReduceOp::kMax;
  return [max](void* c, const void* a, const void* b, size_t n) {
    uint16_t* out = static_cast<uint16_t*>(c);
    const uint16_t* x = static_cast<const uint16_t*>(a);
    const uint16_t* y = static_cast<const uint16_t*>(b);
    for (size_t i = 0; i < n; ++i) {
      const float fx = bf16_to_f32(x[i]), fy = bf16_to_f32(y[i]);
      out[i] = f32_to_bf16(max ? std::max(fx, fy) : fx + fy);
    }
  };
}

ReduceFn reduce_fn(DataType t, ReduceOp op) {
  switch (t) {
    case DataType::kF32: return plain_reduce<float>(op);
    case DataType::kBF16: return bf16_reduce(op);
    case DataType::kI32: return plain_reduce<int32_t>(op);
    case DataType::kI64: return plain_reduce<int64_t>(op);
    case DataType::kU8: return plain_reduce<uint8_t>(op);
  }
  return plain_reduce<float>(op);
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::Context> ctx, std::chrono::milliseconds timeout)
      : ctx_(std::move(ctx)), timeout_(timeout) {}

  int rank() const override { return ctx_->rank; }
  int size() const override { return ctx_->size; }
  std::string name() const override { return "gloo"; }

  Status all_reduce(void* buf, int64_t count, DataType type, ReduceOp op) override {
    if (count <= 0) return Status::ok();
    return run("all_reduce", count, type, [&] {
      gloo::AllreduceOptions o(ctx_);
      o.setTag(next_tag());
      o.setTimeout(timeout_);
      set_typed_output(o, buf, count, type);
      o.setReduceFunction(reduce_fn(type, op));
      gloo::allreduce(o);
    });
  }

  Status all_gather(const void* send, void* recv, int64_t count, DataType type) override {
    if (count <= 0) return Status::ok();
    return run("all_gather", count, type, [&] {
      gloo::AllgatherOptions o(ctx_);
      o.setTag(next_tag());
      o.setTimeout(timeout_);
      o.setInput(static_cast<uint8_t*>(const_cast<void*>(send)), bytes(count, type));
      o.setOutput(static_cast<uint8_t*>(recv), bytes(count, type) * size());
      gloo::allgather(o);
    });
  }

  Status reduce_scatter(const void* send, void* recv, int64_t count, DataType type,
                        ReduceOp op) override {
    if (count <= 0) return Status::ok();
    // The reduction of the whole buffer, then this rank's part: the same sums in the same order
    // as all_reduce, so the two agree bitwise.
    const size_t chunk = bytes(count, type);
    scratch_.resize(chunk * static_cast<size_t>(size()));
    std::memcpy(scratch_.data(), send, scratch_.size());
    M3_RETURN_IF_ERROR(all_reduce(scratch_.data(), count * size(), type, op));
    std::memcpy(recv, scratch_.data() + chunk * static_cast<size_t>(rank()), chunk);
    return Status::ok();
  }

  Status all_to_all_v(const void* send, std::span<const int64_t> send_counts, void* recv,
                      std::span<const int64_t> recv_counts, DataType type) override {
    if (send_counts.size() != static_cast<size_t>(size()) ||
        recv_counts.size() != static_cast<size_t>(size())) {
      return invalid_argument("[comm.gloo] all_to_all_v needs one send and one receive count per "
                              "rank (" + std::to_string(size()) + ")");
    }
    const size_t eb = element_bytes(type);
    std::vector<int64_t> sb(send_counts.size()), rb(recv_counts.size());
    for (size_t r = 0; r < sb.size(); ++r) {
      if (send_counts[r] < 0 || recv_counts[r] < 0)
        return invalid_argument("[comm.gloo] all_to_all_v: negative count");
      sb[r] = send_counts[r] * static_cast<int64_t>(eb);
      rb[r] = recv_counts[r] * static_cast<int64_t>(eb);
    }
    // Gloo's alltoallv wants a buffer even where every count is zero.
    uint8_t dummy_send = 0, dummy_recv = 0;
    uint8_t* in = send ? static_cast<uint8_t*>(const_cast<void*>(send)) : &dummy_send;
    uint8_t* out = recv ? static_cast<uint8_t*>(recv) : &dummy_recv;
    int64_t total = 0;
    for (size_t r = 0; r < sb.size(); ++r) total += send_counts[r] + recv_counts[r];
    return run("all_to_all_v", total, type, [&] {
      gloo::AlltoallvOptions o(ctx_);
      o.setTag(next_tag());
      o.setTimeout(timeout_);
      o.setInput(in, sb);
      o.setOutput(out, rb);
      gloo::alltoallv(o);
    });
  }

  Status broadcast(void* buf, int64_t count, DataType type, int root) override {
    return broadcast_wait(buf, count, type, root, timeout_);
  }

  Status broadcast_wait(void* buf, int64_t count, DataType type, int root,
                        std::chrono::milliseconds timeout) override {
    if (root < 0 || root >= size())
      return invalid_argument("[comm.gloo] broadcast root " + std::to_string(root) +
                              " outside the group of " + std::to_string(size()));
    if (count <= 0) return Status::ok();
    return run("broadcast", count, type, [&] {
      gloo::BroadcastOptions o(ctx_);
      o.setTag(next_tag());
      o.setTimeout(timeout);
      o.setRoot(root);
      o.setOutput(static_cast<uint8_t*>(buf), bytes(count, type));
      gloo::broadcast(o);
    });
  }

  // Every call is synchronous: nothing is queued.
  Status synchronize() override { return failed_ ? unusable("synchronize") : Status::ok(); }

  Status barrier() override {
    return run("barrier", 0, DataType::kU8, [&] {
      gloo::BarrierOptions o(ctx_);
      o.setTag(next_tag());
      o.setTimeout(timeout_);
      gloo::barrier(o);
    });
  }

 private:
  static size_t bytes(int64_t count, DataType type) {
    return static_cast<size_t>(count) * element_bytes(type);
  }
  // The element size reaches Gloo through the type of the pointer.
  static void set_typed_output(gloo::AllreduceOptions& o, void* buf, int64_t count,
                               DataType type) {
    const size_t n = static_cast<size_t>(count);
    switch (type) {
      case DataType::kF32: o.setOutput(static_cast<float*>(buf), n); return;
      case DataType::kBF16: o.setOutput(static_cast<uint16_t*>(buf), n); return;
      case DataType::kI32: o.setOutput(static_cast<int32_t*>(buf), n); return;
      case DataType::kI64: o.setOutput(static_cast<int64_t*>(buf), n); return;
      case DataType::kU8: o.setOutput(static_cast<uint8_t*>(buf), n); return;
    }
  }
  uint32_t next_tag() { return tag_++; }
  Status unusable(const char* what) const {
    return Status(StatusCode::kUnavailable,
                  std::string("[comm.gloo] rank ") + std::to_string(rank()) + " of " +
                      std::to_string(size()) + ": " + what +
                      " after an earlier collective failed: the group is unusable");
  }

  template <typename Body>
  Status run(const char* what, int64_t count, DataType type, Body&& body) {
    if (failed_) return unusable(what);
    try {
      body();
      return Status::ok();
    } catch (const std::exception& e) {
      failed_ = true;
      return Status(StatusCode::kUnavailable,
                    std::string("[comm.gloo] rank ") + std::to_string(rank()) + " of " +
                        std::to_string(size()) + ": " + what + " of " + std::to_string(count) +
                        " " + data_type_name(type) + " failed (timeout " +
                        std::to_string(timeout_.count()) + " ms): " + e.what());
    }
  }

  std::shared_ptr<gloo::Context> ctx_;
  std::chrono::milliseconds timeout_;
  uint32_t tag_ = 0;
  bool failed_ = false;
  std::vector<uint8_t> scratch_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> create_gloo_communicator(
    int rank, int size, const std::shared_ptr<gloo::rendezvous::Store>& store,
    const GlooOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return invalid_argument("[comm.gloo] rank " + std::to_string(rank) + " of a group of " +
                            std::to_string(size));
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(options.timeout);
    ctx->connectFullMesh(*store, device);
    return std::unique_ptr<Communicator>(
        std::make_unique<GlooCommunicator>(std::move(ctx), options.timeout));
  } catch (const std::exception& e) {
    return Status(StatusCode::kUnavailable,
                  "[comm.gloo] rank " + std::to_string(rank) + " of " + std::to_string(size) +
                      " could not connect to the group within " +
                      std::to_string(options.timeout.count()) + " ms: " + e.what());
  }
}

Result<std::vector<std::unique_ptr<Communicator>>> create_local_gloo_group(
    int size, const GlooOptions& options) {
  if (size < 1) return invalid_argument("[comm.gloo] a group of " + std::to_string(size));
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<Result<std::unique_ptr<Communicator>>> made;
  made.reserve(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) made.emplace_back(Status(StatusCode::kInternal, "not made"));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] { made[static_cast<size_t>(r)] =
                                      create_gloo_communicator(r, size, store, options); });
  }
  for (std::thread& t : threads) t.join();
  std::vector<std::unique_ptr<Communicator>> out;
  for (auto& m : made) {
    if (!m.is_ok()) return m.status();
    out.push_back(std::move(m).value());
  }
  return out;
}

}  // namespace m3::comm
