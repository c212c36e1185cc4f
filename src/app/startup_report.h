// What `m3serve serve` says about the model it loaded, before it reports ready: the checkpoint's
// weight formats by role, where the weights and the KV cache live, and how large the pool is.
#pragma once

#include <string>
#include <vector>

#include "loader/weight_source.h"

namespace m3::app {

// The storage formats of the text model's weights by role, e.g. "MXFP8 dense linears, NVFP4
// routed experts, BF16 embeddings and head" ("BF16/MXFP8 dense linears" where a role is mixed).
// Norms, the router and biases are not counted.
std::string weight_formats_summary(const WeightSource& weights);

}  // namespace m3::app
