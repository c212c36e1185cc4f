// dspark/config.json: the released M3.1-Flash draft's fields, every refusal and validation error
// (each naming the file and the field), and the checks against the target config.
#include "model/minimax_m3/dspark/dspark_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "loader/model_config.h"
#include "model/minimax_m3/dummy_weights.h"

namespace m3 {
namespace {

using minimax_m3::dspark::CaptureConvention;
using minimax_m3::dspark::DSparkConfig;
using minimax_m3::dspark::parse_dspark_config;
using nlohmann::json;

const char* kSource = "/models/m31/dspark/config.json";

// The released draft's config (m3-architecture.md §5.2), RoPE written as the target spells it.
json released() {
  return json::parse(R"({
    "architectures": ["DSparkMiniMaxDraftModel"],
    "num_hidden_layers": 5, "hidden_size": 6144, "num_attention_heads": 64,
    "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 200064,
    "dense_intermediate_size": 12288, "dspark_ffn_hidden_size": 12288,
    "dspark_use_dense_ffn": true, "moe_layer_freq": [0, 0, 0, 0, 0],
    "hidden_act": "swigluoai", "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
    "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
                    "sliding_attention", "sliding_attention"],
    "sliding_window": 4096, "sparse_attention_config": null,
    "dspark_block_size": 7, "dspark_noise_token_id": 200058,
    "dspark_target_layer_ids": [3, 17, 31, 45, 59],
    "dspark_markov_rank": 256, "dspark_markov_head_type": "vanilla",
    "enable_confidence_head": true, "confidence_head_with_markov": true,
    "dspark_hybrid_context_fusion": false, "dspark_config": {"hybrid_context_fusion": false},
    "use_gemma_norm": true, "rms_norm_eps": 1e-06,
    "rope_theta": 5000000.0, "partial_rotary_factor": 0.5, "rotary_dim": 64,
    "quantization_config": {"quant_method": "mxfp8", "weight_block_size": [1, 32]}
  })");
}

Result<DSparkConfig> parse(const json& j) {
  return parse_dspark_config(j.dump(), kSource);
}

// Parsing `j` fails with `code`, and the message names the file and contains `field`.
void expect_error(const json& j, StatusCode code, const std::string& field) {
  auto r = parse(j);
  ASSERT_FALSE(r.is_ok()) << "accepted: " << j.dump();
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_NE(r.status().message().find(kSource), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status().message();
}

TEST(DSparkConfig, ParsesTheReleasedDraft) {
  auto r = parse(released());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const DSparkConfig& c = *r;
  EXPECT_EQ(c.num_hidden_layers, 5);
  EXPECT_EQ(c.hidden_size, 6144);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.vocab_size, 200064);
  EXPECT_EQ(c.intermediate_size, 12288);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.block_size, 7);
  EXPECT_EQ(c.noise_token_id, 200058);
  EXPECT_EQ(c.target_layer_ids, (std::vector<int64_t>{3, 17, 31, 45, 59}));
  EXPECT_EQ(c.feature_width(), 5 * 6144);
  EXPECT_EQ(c.markov_rank, 256);
  EXPECT_TRUE(c.enable_confidence_head);
  EXPECT_TRUE(c.confidence_head_with_markov);
  EXPECT_TRUE(c.use_gemma_norm);
  EXPECT_EQ(c.quant_method, "mxfp8");
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  ASSERT_TRUE(c.rope_theta.has_value());
  EXPECT_DOUBLE_EQ(*c.rope_theta, 5e6);
  EXPECT_EQ(c.rotary_dim, 64);  // 128 · 0.5: the factor wins over rotary_dim, as in the target
  EXPECT_EQ(c.capture, CaptureConvention::kLayerOutput);
  EXPECT_EQ(c.source, kSource);

  // Against the built-in M3.1-Flash target: accepted, RoPE kept.
  DSparkConfig d = c;
  EXPECT_TRUE(d.resolve_with_target(minimax_m3::builtin_m3_flash_config()).is_ok());
  EXPECT_DOUBLE_EQ(d.theta(), 5e6);
  EXPECT_EQ(d.rot_dim(), 64);
}

TEST(DSparkConfig, OptionalFieldsAndSpellings) {
  json j = released();
  // The FFN width under either name; RoPE absent (inherited from the target later).
  j.erase("dspark_ffn_hidden_size");
  j["dense_intermediate_size"] = 1024;
  for (const char* k : {"rope_theta", "partial_rotary_factor", "rotary_dim"}) j.erase(k);
  j["dspark_target_hidden_convention"] = "final_norm_last";
  j["use_gemma_norm"] = false;
  auto r = parse(j);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->intermediate_size, 1024);
  EXPECT_FALSE(r->rope_theta.has_value());
  EXPECT_FALSE(r->rotary_dim.has_value());
  EXPECT_EQ(r->capture, CaptureConvention::kFinalNormLast);
  EXPECT_FALSE(r->use_gemma_norm);
  MiniMaxM3Config target = minimax_m3::builtin_m3_flash_config();
  target.rope_theta = 1e4;
  target.rotary_dim = 32;
  DSparkConfig d = *r;
  ASSERT_TRUE(d.resolve_with_target(target).is_ok());
  EXPECT_DOUBLE_EQ(d.theta(), 1e4);
  EXPECT_EQ(d.rot_dim(), 32);

  // rope_parameters wins over the top-level fields; rotary_dim alone is read.
  j = released();
  j.erase("partial_rotary_factor");
  j["rotary_dim"] = 32;
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  r = parse(j);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_DOUBLE_EQ(*r->rope_theta, 1e6);
  EXPECT_EQ(r->rotary_dim, 32);

  j = released();
  j.erase("dspark_ffn_hidden_size");
  j.erase("dense_intermediate_size");
  j.erase("layer_types");
  r = parse(j);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->intermediate_size, 12288);  // the default: the released width
}

TEST(DSparkConfig, RefusesWhatTheDraftCannotRun) {
  auto with = [](const std::string& key, const json& v) {
    json j = released();
    j[key] = v;
    return j;
  };
  const auto U = StatusCode::kUnimplemented;
  expect_error(with("dspark_hybrid_context_fusion", true), U, "dspark_hybrid_context_fusion");
  expect_error(with("dspark_config", {{"hybrid_context_fusion", true}}), U,
               "dspark_config.hybrid_context_fusion");
  expect_error(with("dspark_markov_head_type", "gated"), U, "dspark_markov_head_type");
  expect_error(with("dspark_use_dense_ffn", false), U, "dspark_use_dense_ffn");
  expect_error(with("moe_layer_freq", json::array({0, 1, 0, 0, 0})), U, "moe_layer_freq");
  expect_error(with("sparse_attention_config", {{"use_sparse_attention", true}}), U,
               "sparse_attention_config");
  json lt = released();
  lt["layer_types"][2] = "full_attention";
  expect_error(lt, U, "layer_types[2]");
  expect_error(with("quantization_config", {{"quant_method", "fp8"}}), U,
               "quantization_config.quant_method");
  expect_error(with("rope_parameters", {{"rope_type", "yarn"}}), U, "rope_parameters.rope_type");
  expect_error(with("hidden_act", "gelu"), U, "hidden_act");
}

TEST(DSparkConfig, ValidationErrorsNameTheField) {
  auto with = [](const std::string& key, const json& v) {
    json j = released();
    j[key] = v;
    return j;
  };
  const auto I = StatusCode::kInvalidArgument;
  json no_arch = released();
  no_arch.erase("architectures");
  expect_error(no_arch, I, "architectures");
  expect_error(with("architectures", json::array({"MiniMaxM3SparseForConditionalGeneration"})), I,
               "architectures");
  expect_error(with("num_hidden_layers", 0), I, "num_hidden_layers");
  expect_error(with("hidden_size", "6144"), I, "hidden_size");
  expect_error(with("num_key_value_heads", 5), I, "num_key_value_heads");
  expect_error(with("head_dim", -1), I, "head_dim");
  expect_error(with("dspark_ffn_hidden_size", 1024), I, "dspark_ffn_hidden_size");  // != dense
  expect_error(with("dspark_markov_rank", 0), I, "dspark_markov_rank");
  expect_error(with("dspark_block_size", 0), I, "dspark_block_size");
  expect_error(with("sliding_window", 6), I, "sliding_window");  // < the block
  expect_error(with("dspark_noise_token_id", 200064), I, "dspark_noise_token_id");
  expect_error(with("dspark_target_layer_ids", json::array()), I, "dspark_target_layer_ids");
  expect_error(with("dspark_target_layer_ids", json::array({3, "17"})), I,
               "dspark_target_layer_ids[1]");
  expect_error(with("dspark_target_layer_ids", json::array({3, 3})), I, "dspark_target_layer_ids");
  expect_error(with("dspark_target_hidden_convention", "post_norm"), I,
               "dspark_target_hidden_convention");
  expect_error(with("enable_confidence_head", 1), I, "enable_confidence_head");
  expect_error(with("partial_rotary_factor", 1.5), I, "partial_rotary_factor");
  json rd = released();
  rd.erase("partial_rotary_factor");
  rd["rotary_dim"] = 130;
  expect_error(rd, I, "rotary_dim");
  expect_error(with("rope_theta", 0.0), I, "rope_theta");
  expect_error(with("rms_norm_eps", 0.0), I, "rms_norm_eps");
  json lt = released();
  lt["layer_types"].erase(0);
  expect_error(lt, I, "layer_types");
  EXPECT_FALSE(parse_dspark_config("{", kSource).is_ok());
  EXPECT_FALSE(parse_dspark_config("[1]", kSource).is_ok());
}

TEST(DSparkConfig, CheckedAgainstTheTarget) {
  auto r = parse(released());
  ASSERT_TRUE(r.is_ok());
  const MiniMaxM3Config target = minimax_m3::builtin_m3_flash_config();
  auto expect_target_error = [&](DSparkConfig d, const MiniMaxM3Config& t,
                                 const std::string& field) {
    Status st = d.resolve_with_target(t);
    ASSERT_FALSE(st.is_ok()) << field;
    EXPECT_NE(st.message().find(kSource), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(field), std::string::npos) << st.message();
  };
  DSparkConfig d = *r;
  d.hidden_size = 4096;
  expect_target_error(d, target, "hidden_size");
  d = *r;
  d.vocab_size = 200000;
  d.noise_token_id = 1;
  expect_target_error(d, target, "vocab_size");
  d = *r;
  d.target_layer_ids = {3, 17, 60};
  expect_target_error(d, target, "dspark_target_layer_ids[2]");
  d = *r;
  d.target_layer_ids = {-1};
  expect_target_error(d, target, "dspark_target_layer_ids[0]");
  // A shorter target: layer 59 does not exist.
  expect_target_error(*r, minimax_m3::builtin_m3_flash_config(40), "dspark_target_layer_ids[3]");
}

TEST(DSparkConfig, LoadsFromADirectory) {
  const auto dir = std::filesystem::temp_directory_path() / "m3_dspark_config_test";
  std::filesystem::create_directories(dir);
  auto missing = minimax_m3::dspark::load_dspark_config((dir / "nowhere").string());
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("config.json"), std::string::npos);
  std::ofstream(dir / "config.json") << released().dump();
  auto r = minimax_m3::dspark::load_dspark_config(dir.string());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->source, (dir / "config.json").string());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace m3
