#include "model/step_channel.h"

namespace m3 {

Status send_step(comm::Communicator& c, const ModelStep* step) {
  std::vector<char> bytes;
  if (step) bytes = encode_step(*step);
  int64_t n = step ? static_cast<int64_t>(bytes.size()) : -1;
  M3_RETURN_IF_ERROR(c.broadcast(&n, 1, comm::DataType::kI64, 0));
  if (n > 0) M3_RETURN_IF_ERROR(c.broadcast(bytes.data(), n, comm::DataType::kU8, 0));
  return Status::ok();
}

Result<std::optional<WireStep>> receive_step(comm::Communicator& c,
                                             std::chrono::milliseconds idle_wait) {
  int64_t n = 0;
  M3_RETURN_IF_ERROR(c.broadcast_wait(&n, 1, comm::DataType::kI64, 0, idle_wait));
  if (n < 0) return std::optional<WireStep>();  // node 0 shut down
  std::vector<char> bytes(static_cast<size_t>(n));
  if (n > 0) M3_RETURN_IF_ERROR(c.broadcast(bytes.data(), n, comm::DataType::kU8, 0));
  M3_ASSIGN_OR_RETURN(WireStep step, decode_step(bytes.data(), bytes.size()));
  return std::optional<WireStep>(std::move(step));
}

}  // namespace m3
