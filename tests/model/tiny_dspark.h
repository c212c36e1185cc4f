// The DSpark draft shape of the bundled m3-tiny (models/m3-tiny/dspark, as
// tools/train_tiny/train_dspark.py trains it), for tests that build one without reading it.
#pragma once

#include "model/minimax_m3/dspark/dspark_config.h"

namespace m3::testing {

// Hidden 256, 8 / 2 heads of 32, FFN 1024, window 512, noise token 4090, target layers 1..5,
// Markov rank 64; RoPE left unset (taken from the target).
inline minimax_m3::dspark::DSparkConfig m3_tiny_draft_config() {
  minimax_m3::dspark::DSparkConfig c;
  c.num_hidden_layers = 2;
  c.hidden_size = 256;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.vocab_size = 4096;
  c.intermediate_size = 1024;
  c.sliding_window = 512;
  c.noise_token_id = 4090;
  c.target_layer_ids = {1, 2, 3, 4, 5};
  c.markov_rank = 64;
  c.source = "m3-tiny draft config";
  return c;
}

}  // namespace m3::testing
