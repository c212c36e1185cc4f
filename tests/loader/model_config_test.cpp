// config.json parsing: the multimodal wrapper and bare text configs, HF-normalised and legacy
// field names (with transformers' precedence), and validation messages naming field and file.
#include "loader/model_config.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"

namespace m3 {
namespace {

using nlohmann::json;
using testing_util::contains;

std::string fixture(const std::string& name) {
  std::ifstream in(std::string(M3_REPO_ROOT) + "/tests/fixtures/loader/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A small bare text config in legacy spelling; tests patch it.
json small_legacy() {
  return json::parse(R"({
    "model_type": "minimax_m3_vl_text", "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 300,
    "rotary_dim": 8, "rope_theta": 10000, "hidden_act": "swigluoai",
    "intermediate_size": 32, "dense_intermediate_size": 96, "num_local_experts": 8,
    "num_experts_per_tok": 2, "moe_layer_freq": [0, 1, 1, 1], "eos_token_id": 2,
    "bos_token_id": 1,
    "sparse_attention_config": {"use_sparse_attention": true, "sparse_num_index_heads": 2,
      "sparse_index_dim": 16, "sparse_block_size": 16, "sparse_topk_blocks": 4,
      "sparse_local_block": 1, "sparse_init_block": 1, "sparse_attention_freq": [0, 1, 1, 1]}
  })");
}

Result<MiniMaxM3Config> parse(const json& j) { return parse_minimax_m3_config(j.dump(), "cfg.json"); }

void expect_error(const json& j, const std::string& want) {
  Result<MiniMaxM3Config> c = parse(j);
  ASSERT_FALSE(c.is_ok()) << "expected an error containing: " << want;
  EXPECT_TRUE(contains(c.status().message(), "cfg.json: ")) << c.status().message();
  EXPECT_TRUE(contains(c.status().message(), want)) << c.status().message() << "\nwant: " << want;
}

TEST(ModelConfig, RealSizeLegacyWrapper) {
  Result<MiniMaxM3Config> r = parse_minimax_m3_config(fixture("m3_legacy_config.json"), "config.json");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const MiniMaxM3Config& c = *r;
  EXPECT_TRUE(c.is_multimodal_wrapper);
  EXPECT_EQ(c.model_type, "minimax_m3_vl");
  EXPECT_EQ(c.field_prefix, "text_config.");
  EXPECT_EQ(c.hidden_size, 6144);
  EXPECT_EQ(c.num_hidden_layers, 60);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.max_position_embeddings, 1048576);
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_EQ(c.rope_theta, 5e6);
  EXPECT_EQ(c.index_n_heads, 4);
  EXPECT_EQ(c.index_topk_blocks, 16);
  EXPECT_EQ(c.index_block_size, 128);
  EXPECT_EQ(c.index_local_blocks, 1);
  EXPECT_EQ(c.index_init_blocks, 0);
  ASSERT_EQ(c.layer_types.size(), 60u);
  ASSERT_EQ(c.mlp_layer_types.size(), 60u);
  for (int i = 0; i < 60; ++i) {
    EXPECT_EQ(c.is_sparse_layer(i), i >= 3) << i;
    EXPECT_EQ(c.is_moe_layer(i), i >= 3) << i;
  }
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{200020}));
  EXPECT_EQ(c.bos_token_id, 200034);
  EXPECT_EQ(c.image_token_index, 200025);
  EXPECT_EQ(c.quantization.quant_method, "mxfp8");
  EXPECT_TRUE(contains(c.quantization.raw_json, "ue8m0"));
  EXPECT_FALSE(c.tie_word_embeddings);
}

TEST(ModelConfig, HfNormalisedWrapper) {
  Result<MiniMaxM3Config> r = parse_minimax_m3_config(fixture("m3_hf_config.json"), "config.json");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const MiniMaxM3Config& c = *r;
  EXPECT_EQ(c.num_hidden_layers, 4);
  // rope_parameters.partial_rotary_factor wins over the stale default rotary_dim 64 that
  // transformers' save_pretrained writes: int(16 * 0.5).
  EXPECT_EQ(c.rotary_dim, 8);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.layer_types, (std::vector<AttentionKind>{AttentionKind::kFull, AttentionKind::kSparse,
                                                       AttentionKind::kSparse, AttentionKind::kFull}));
  EXPECT_EQ(c.mlp_layer_types,
            (std::vector<MlpKind>{MlpKind::kDense, MlpKind::kMoe, MlpKind::kMoe, MlpKind::kMoe}));
  EXPECT_EQ(c.index_n_heads, 2);
  EXPECT_EQ(c.index_topk_blocks, 4);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(c.image_token_index, 7);  // image_token_id alias
  EXPECT_EQ(c.video_token_index, 8);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.quantization.quant_method, "");
}

TEST(ModelConfig, BareLegacyTextConfig) {
  Result<MiniMaxM3Config> r = parse(small_legacy());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_FALSE(r->is_multimodal_wrapper);
  EXPECT_EQ(r->field_prefix, "");
  EXPECT_EQ(r->rotary_dim, 8);
  EXPECT_EQ(r->index_init_blocks, 1);
  EXPECT_EQ(r->eos_token_ids, (std::vector<int64_t>{2}));
  EXPECT_FALSE(r->is_sparse_layer(0));
  EXPECT_TRUE(r->is_sparse_layer(1));
  EXPECT_FALSE(r->is_moe_layer(0));
}

TEST(ModelConfig, LegacySparseFieldsOverrideFlatOnes) {
  json j = small_legacy();
  j["index_topk_blocks"] = 99;      // transformers applies the legacy value last
  j["index_n_heads"] = 7;
  Result<MiniMaxM3Config> r = parse(j);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->index_topk_blocks, 4);
  EXPECT_EQ(r->index_n_heads, 2);
  j["layer_types"] = {"full_attention", "full_attention", "full_attention", "minimax_m3_sparse"};
  r = parse(j);  // explicit layer_types win over sparse_attention_freq
  ASSERT_TRUE(r.is_ok());
  EXPECT_FALSE(r->is_sparse_layer(1));
  EXPECT_TRUE(r->is_sparse_layer(3));
}

TEST(ModelConfig, DefaultsWhenLayerListsAreAbsent) {
  json j = small_legacy();
  j.erase("moe_layer_freq");
  j.erase("sparse_attention_config");
  Result<MiniMaxM3Config> r = parse(j);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  for (int i = 0; i < 4; ++i) {
    EXPECT_FALSE(r->is_sparse_layer(i));  // transformers: all "full_attention"
    EXPECT_TRUE(r->is_moe_layer(i));      // transformers: all "sparse"
  }
}

TEST(ModelConfig, IntegerFrequencies) {
  json j = small_legacy();
  j["moe_layer_freq"] = 2;
  j["sparse_attention_config"]["sparse_attention_freq"] = 1;
  Result<MiniMaxM3Config> r = parse(j);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->mlp_layer_types,
            (std::vector<MlpKind>{MlpKind::kMoe, MlpKind::kDense, MlpKind::kMoe, MlpKind::kDense}));
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(r->is_sparse_layer(i));
  j["moe_layer_freq"] = 0;
  expect_error(j, "moe_layer_freq: an integer frequency must be >= 1");
  j["moe_layer_freq"] = {0, 2, 1, 1};
  expect_error(j, "moe_layer_freq[1]: expected 0 or 1");
}

TEST(ModelConfig, RotaryDimSources) {
  json j = small_legacy();
  j["partial_rotary_factor"] = 0.25;  // top-level factor beats rotary_dim
  EXPECT_EQ(parse(j)->rotary_dim, 4);
  j["rope_parameters"] = {{"rope_theta", 500.0}, {"partial_rotary_factor", 0.5}};
  EXPECT_EQ(parse(j)->rotary_dim, 8);
  EXPECT_EQ(parse(j)->rope_theta, 500.0);  // rope_parameters beats top-level rope_theta
  j.erase("rope_parameters");
  j.erase("partial_rotary_factor");
  j.erase("rotary_dim");
  EXPECT_EQ(parse(j)->rotary_dim, 16);  // nothing given: the whole head (factor 1.0)
  j["rotary_dim"] = 7;
  expect_error(j, "rotary_dim: must be even");
  j["rotary_dim"] = 32;
  expect_error(j, "rotary_dim: must be even and in (0, head_dim = 16]");
  j["rotary_dim"] = 8;
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  Result<MiniMaxM3Config> y = parse(j);
  ASSERT_FALSE(y.is_ok());
  EXPECT_EQ(y.status().code(), StatusCode::kUnimplemented);
  EXPECT_TRUE(contains(y.status().message(), "rope_scaling.rope_type 'yarn'"));
}

TEST(ModelConfig, TokenIds) {
  json j = small_legacy();
  j["eos_token_id"] = {5, 6};
  EXPECT_EQ(parse(j)->eos_token_ids, (std::vector<int64_t>{5, 6}));
  j["eos_token_id"] = nullptr;
  j["bos_token_id"] = nullptr;
  EXPECT_TRUE(parse(j)->eos_token_ids.empty());
  EXPECT_EQ(parse(j)->bos_token_id, -1);
  j["eos_token_id"] = "x";
  expect_error(j, "eos_token_id: expected an integer or a list");
  j["eos_token_id"] = 300;
  expect_error(j, "eos_token_id: 300 is outside the vocabulary");
  json w = {{"model_type", "minimax_m3_vl"}, {"text_config", small_legacy()}, {"eos_token_id", 9}};
  w["text_config"].erase("eos_token_id");
  EXPECT_EQ(parse(w)->eos_token_ids, (std::vector<int64_t>{9}));  // wrapper as fallback
}

TEST(ModelConfig, RejectsOtherModels) {
  json j = small_legacy();
  j["model_type"] = "llama";
  expect_error(j, "model_type 'llama' is not a MiniMax-M3 model");
  j["model_type"] = "minimax_m3_vl";
  j["architectures"] = {"LlamaForCausalLM"};
  expect_error(j, "architectures [LlamaForCausalLM] is not a MiniMax-M3 model");
  j["architectures"] = {"MiniMaxM3SparseForConditionalGeneration"};
  EXPECT_TRUE(parse(j).is_ok());
  Result<MiniMaxM3Config> bad = parse_minimax_m3_config("{not json", "cfg.json");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_TRUE(contains(bad.status().message(), "cfg.json: not valid JSON"));
  expect_error(json::array(), "not a JSON object");
}

TEST(ModelConfig, TypeErrorsNameTheField) {
  json w = {{"model_type", "minimax_m3_vl"}, {"text_config", small_legacy()}};
  w["text_config"]["hidden_size"] = "big";
  expect_error(w, "text_config.hidden_size: expected an integer, found \"big\"");
  w["text_config"]["hidden_size"] = 64.5;
  expect_error(w, "text_config.hidden_size: expected an integer");
  w["text_config"]["hidden_size"] = 64;
  w["text_config"]["sparse_attention_config"]["sparse_block_size"] = true;
  expect_error(w, "text_config.sparse_attention_config.sparse_block_size: expected an integer");
  w["text_config"]["sparse_attention_config"]["sparse_block_size"] = 16;
  w["text_config"]["layer_types"] = {"full_attention", "sliding", "full_attention", "full_attention"};
  expect_error(w, "text_config.layer_types[1]: unknown attention type 'sliding'");
  w["text_config"].erase("layer_types");
  w["text_config"]["scoring_func"] = "softmax";
  expect_error(w, "scoring_func 'softmax' is not supported");
}

TEST(ModelConfig, ValidateNamesFieldAndFile) {
  json j = small_legacy();
  j["num_key_value_heads"] = 3;
  expect_error(j, "num_key_value_heads: 3 does not divide num_attention_heads 4");
  j = small_legacy();
  j["sparse_attention_config"]["sparse_num_index_heads"] = 1;
  expect_error(j, "index_n_heads: 1 must equal num_key_value_heads 2");
  j = small_legacy();
  j["moe_layer_freq"] = {0, 1, 1};
  expect_error(j, "mlp_layer_types: has 3 entries (from mlp_layer_types or moe_layer_freq), but "
                  "num_hidden_layers is 4");
  j = small_legacy();
  j["sparse_attention_config"]["sparse_attention_freq"] = {1, 1, 1, 1, 1};
  expect_error(j, "layer_types: has 5 entries");
  j = small_legacy();
  j["sparse_attention_config"]["sparse_topk_blocks"] = 1;
  expect_error(j, "index_topk_blocks: 1 is less than index_local_blocks (1) + index_init_blocks (1)");
  j = small_legacy();
  j["num_experts_per_tok"] = 9;
  expect_error(j, "num_experts_per_tok: 9 exceeds num_local_experts 8");
  j = small_legacy();
  j["hidden_size"] = 0;
  expect_error(j, "hidden_size: must be positive");
  // With no sparse layer the indexer fields are not constrained.
  j = small_legacy();
  j["sparse_attention_config"]["sparse_attention_freq"] = {0, 0, 0, 0};
  j["sparse_attention_config"]["sparse_num_index_heads"] = 1;
  EXPECT_TRUE(parse(j).is_ok());
}

TEST(ModelConfig, LoadFromDirectory) {
  Result<MiniMaxM3Config> r = load_minimax_m3_config("/nonexistent-dir");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(r.status().message(), "/nonexistent-dir/config.json"));
}

}  // namespace
}  // namespace m3
