// A ModelStep as bytes, for runners whose ranks live in other processes: the process that runs
// the engine broadcasts each step to the others (--nnodes), which decode it and run the same step
// on their ranks. The encoding is the host's byte order (every node runs the same build on the
// same architecture), with a magic number and a version so that a mismatch fails clearly.
// Decoding checks every length against the bytes left: corrupt or truncated input is an
// invalid_argument, never a crash.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/model.h"

namespace m3 {

// A decoded step that owns the arrays its spans point into. Not copyable (the spans would point
// into the source); moving keeps them valid (vectors keep their buffers).
struct WireStep {
  WireStep() = default;
  WireStep(const WireStep&) = delete;
  WireStep& operator=(const WireStep&) = delete;
  WireStep(WireStep&&) = default;
  WireStep& operator=(WireStep&&) = default;

  ModelStep step;
  std::vector<std::vector<int32_t>> tokens, block_tables;
  std::vector<std::vector<float>> embedding_values;
};

std::vector<char> encode_step(const ModelStep& step);
Result<WireStep> decode_step(const char* data, size_t size);

}  // namespace m3
