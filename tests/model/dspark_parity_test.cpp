// Parity of m3serve's DSpark draft (float32, CPU) with a fixture computed by another
// implementation: tools/train_tiny/train_dspark.py writes, for a few fixed contexts on m3-tiny, the
// greedy block its PyTorch mirror of the draft proposes and the base and Markov-corrected logits at a
// few ids per slot (tests/fixtures/m3_tiny/dspark_parity.json, for the draft it writes to
// models/m3-tiny/dspark). The whole path is compared: the target's capture, the features under the
// draft's convention, the context K/V, the block forward, lm_head and the Markov chain.
//
// Error model of the tolerance. Both sides compute in float32 from the same bf16 weights; they
// differ only in summation order (BLAS vs cpu::dot), mean-of-squares precision (float vs double)
// and RoPE cos/sin (float vs double). One float32 dot product of length K <= 1280 has a worst-case
// relative error K·u ~ 8e-5 (u = 6e-8); a logit passes through about 30 such stages (6 target
// layers, 2 draft layers, fc, lm_head, each with several products and a norm), and attention
// softmaxes and RMSNorms can amplify a relative error by a small factor. Worst case ~ 30 × 8e-5
// ≈ 2.4e-3 relative; we allow |a − b| <= 2e-3 + 2e-3·|b| (typical errors are ~1e-5, so a wrong
// convention, mask or position, which moves logits by O(1), fails by orders of magnitude).
// A greedy token may differ only where the fixture's top-2 margin is within twice that tolerance;
// after such a flip the Markov chain's `prev` differs, so later corrected logits are not compared
// (the base logits, which do not depend on the chain, still are).
//
// The bundled-draft test is compiled only when the fixture exists (CMake defines
// M3_DSPARK_PARITY_FIXTURE); the plumbing test always runs: it writes a random draft to disk,
// produces a fixture from the C++ draft in the same layout, checks it back, and checks that
// perturbed fixtures and another draft fail.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "loader/checkpoint.h"
#include "loader/safetensors_writer.h"
#include "model/minimax_m3/dspark/dspark_draft.h"
#include "model/minimax_m3/dspark/dspark_dummy_weights.h"
#include "model/minimax_m3/dspark/target_features.h"
#include "model/minimax_m3/model.h"
#include "dspark_reference.h"

namespace m3 {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using minimax_m3::Model;
using minimax_m3::PagedKvCache;
using minimax_m3::dspark::CaptureConvention;
using minimax_m3::dspark::DSparkConfig;
using minimax_m3::dspark::DSparkDraft;

const std::string kTinyDir = std::string(M3_REPO_ROOT) + "/models/m3-tiny";
constexpr double kAbsTol = 2e-3, kRelTol = 2e-3;

double tol(double expected) { return kAbsTol + kRelTol * std::abs(expected); }

struct Target {
  MiniMaxM3Config cfg;
  std::unique_ptr<Checkpoint> ckpt;
  std::unique_ptr<Model> model;
  std::vector<float> final_norm;
};

void load_target(CpuBackend& backend, Target* t) {
  auto cfg = load_minimax_m3_config(kTinyDir);
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  t->cfg = *cfg;
  auto ckpt = Checkpoint::open(kTinyDir);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  t->ckpt = std::move(ckpt).value();
  auto model = Model::load(t->cfg, *t->ckpt, &backend);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  t->model = std::move(model).value();
  t->final_norm.resize(static_cast<size_t>(t->cfg.hidden_size));
  backend.copy_to_host(t->final_norm.data(), t->model->weights().final_norm.data(),
                       static_cast<int64_t>(t->final_norm.size() * sizeof(float)));
}

// The draft in `dir` (config.json + safetensors), as m3serve loads models/m3-tiny/dspark.
Result<std::unique_ptr<DSparkDraft>> load_draft(const std::string& dir, const Target& t,
                                                CpuBackend& backend) {
  M3_ASSIGN_OR_RETURN(DSparkConfig cfg, minimax_m3::dspark::load_dspark_config(dir));
  M3_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> src, Checkpoint::open(dir));
  return DSparkDraft::load(cfg, t.cfg, *src, dir,
                           minimax_m3::dspark::TargetSharedWeights::view_of(t.model->weights()),
                           &backend);
}

// Capture the context's hidden states with one prefill, commit them, propose for the anchor.
Result<minimax_m3::dspark::DSparkProposal> propose(const Target& t, CpuBackend& backend,
                                                   DSparkDraft& draft,
                                                   const std::vector<int32_t>& context,
                                                   int32_t anchor) {
  const int64_t n = static_cast<int64_t>(context.size());
  const int64_t pages = (n + t.cfg.index_block_size - 1) / t.cfg.index_block_size;
  PagedKvCache cache(&backend, t.cfg, std::max<int64_t>(1, pages));
  std::vector<int32_t> table;
  for (int64_t i = 0; i < std::max<int64_t>(1, pages); ++i) table.push_back(static_cast<int32_t>(i));
  ModelSlice slice;
  slice.tokens = context;
  slice.block_table = table;
  slice.logits_rows.push_back(static_cast<int32_t>(n - 1));
  ModelOutput out;
  M3_RETURN_IF_ERROR(t.model->forward(std::span<const ModelSlice>(&slice, 1), &cache, &out,
                                      minimax_m3::dspark::capture_layers_for(draft.config())));
  M3_ASSIGN_OR_RETURN(std::vector<float> features,
                      minimax_m3::dspark::build_context_features(
                          out.hidden[0], n, draft.config(), t.cfg, draft.config().capture,
                          t.final_norm));
  auto dcache = draft.new_cache();
  M3_RETURN_IF_ERROR(draft.append_context(features, n, dcache.get()));
  return draft.propose(anchor, *dcache);
}

// The fixture layout train_dspark.py writes, from a C++ proposal (for the plumbing test).
json fixture_case(const std::string& name, const std::vector<int32_t>& context, int32_t anchor,
                  const minimax_m3::dspark::DSparkProposal& p, const DSparkConfig& cfg) {
  const int64_t v = cfg.vocab_size;
  json slots = json::array();
  for (size_t k = 0; k < p.tokens.size(); ++k) {
    const float* row = p.logits.data() + k * static_cast<size_t>(v);
    std::vector<int32_t> order(static_cast<size_t>(v));
    for (int32_t i = 0; i < v; ++i) order[static_cast<size_t>(i)] = i;
    std::partial_sort(order.begin(), order.begin() + 8, order.end(),
                      [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    std::vector<int32_t> ids(order.begin(), order.begin() + 8);
    for (int64_t f : {int64_t{0}, int64_t{anchor}, cfg.noise_token_id, v - 1})
      ids.push_back(static_cast<int32_t>(f));
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    json lg = json::array(), base = json::array();
    for (int32_t i : ids) {
      lg.push_back(row[i]);
      base.push_back(p.base_logits[k * static_cast<size_t>(v) + static_cast<size_t>(i)]);
    }
    slots.push_back({{"token", p.tokens[k]},
                     {"margin", row[order[0]] - row[order[1]]},
                     {"ids", ids},
                     {"logits", lg},
                     {"base_logits", base}});
  }
  return {{"name", name}, {"context_tokens", context}, {"anchor", anchor}, {"slots", slots}};
}

// Every disagreement between the C++ draft and the fixture, as readable lines (empty: parity).
std::vector<std::string> check_fixture(const json& fx, const Target& t, CpuBackend& backend,
                                       DSparkDraft& draft) {
  std::vector<std::string> bad;
  const int64_t v = draft.config().vocab_size;
  const std::string conv = minimax_m3::dspark::capture_convention_name(draft.config().capture);
  if (fx.value("convention", conv) != conv)
    bad.push_back("fixture convention " + fx.value("convention", std::string()) +
                  " != the draft's " + conv);
  if (!fx.contains("cases") || fx["cases"].empty()) {
    bad.push_back("fixture has no cases");
    return bad;
  }
  for (const json& c : fx["cases"]) {
    const std::string name = c.value("name", std::string("?"));
    const auto context = c.at("context_tokens").get<std::vector<int32_t>>();
    const int32_t anchor = c.at("anchor").get<int32_t>();
    auto p = propose(t, backend, draft, context, anchor);
    if (!p.is_ok()) {
      bad.push_back(name + ": " + p.status().to_string());
      continue;
    }
    bool diverged = false;
    const json& slots = c.at("slots");
    if (slots.size() != p->tokens.size()) bad.push_back(name + ": slot count differs");
    for (size_t k = 0; k < std::min(slots.size(), p->tokens.size()); ++k) {
      const json& s = slots[k];
      const auto ids = s.at("ids").get<std::vector<int32_t>>();
      const auto lg = s.at("logits").get<std::vector<double>>();
      const auto base = s.at("base_logits").get<std::vector<double>>();
      const std::string where = name + " slot " + std::to_string(k);
      double top = 0.0;
      for (size_t j = 0; j < ids.size(); ++j) {
        if (ids[j] < 0 || ids[j] >= v) {
          bad.push_back(where + ": id " + std::to_string(ids[j]) + " outside the vocabulary");
          continue;
        }
        const size_t at = k * static_cast<size_t>(v) + static_cast<size_t>(ids[j]);
        const double b = p->base_logits[at];
        if (std::abs(b - base[j]) > tol(base[j]))
          bad.push_back(where + ": base logit of id " + std::to_string(ids[j]) + " " +
                        std::to_string(b) + ", fixture " + std::to_string(base[j]));
        top = std::max(top, std::abs(lg[j]));
        if (diverged) continue;
        const double l = p->logits[at];
        if (std::abs(l - lg[j]) > tol(lg[j]))
          bad.push_back(where + ": logit of id " + std::to_string(ids[j]) + " " +
                        std::to_string(l) + ", fixture " + std::to_string(lg[j]));
      }
      const int32_t want = s.at("token").get<int32_t>();
      if (!diverged && p->tokens[k] != want) {
        const double margin = s.at("margin").get<double>();
        if (margin > 2.0 * tol(top))
          bad.push_back(where + ": token " + std::to_string(p->tokens[k]) + ", fixture " +
                        std::to_string(want) + " (top-2 margin " + std::to_string(margin) + ")");
        diverged = true;  // a near tie flipped: later slots condition on another prev
      }
    }
  }
  return bad;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += x + "\n";
  return s;
}

// A random draft at m3-tiny's shape written as the trainer writes one: config.json and
// model.safetensors with every tensor BF16 under the released prefix.
void write_random_draft(const std::string& dir, uint64_t seed) {
  const DSparkConfig c = testing::m3_tiny_draft_config();
  const std::string prefix = "language_model.model.dspark.";
  minimax_m3::dspark::DummyDSparkWeightSource src(c, seed, prefix);
  const int64_t h = c.hidden_size, d = c.head_dim, r = c.markov_rank, v = c.vocab_size,
                i = c.intermediate_size, q = c.num_attention_heads * d,
                kv = c.num_key_value_heads * d;
  auto shape_of = [&](const std::string& n) -> std::vector<int64_t> {
    auto ends = [&](const std::string& s) {
      return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0;
    };
    if (ends("fc.weight")) return {h, c.feature_width()};
    if (ends("markov_w1.weight") || ends("markov_w2.weight")) return {v, r};
    if (ends("confidence_head.proj.weight")) return {1, h + r};
    if (ends("confidence_head.proj.bias")) return {1};
    if (ends("q_proj.weight")) return {q, h};
    if (ends("k_proj.weight") || ends("v_proj.weight")) return {kv, h};
    if (ends("o_proj.weight")) return {h, q};
    if (ends("q_norm.weight") || ends("k_norm.weight")) return {d};
    if (ends("gate_proj.weight") || ends("up_proj.weight")) return {i, h};
    if (ends("down_proj.weight")) return {h, i};
    return {h};  // the hidden-size norms
  };
  fs::create_directories(dir);
  SafetensorsWriter w;
  for (const std::string& n : minimax_m3::dspark::dspark_weight_names(c, prefix)) {
    auto t = src.load_f32(n, shape_of(n));
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    w.add_bf16(n, t->shape, t->data);
  }
  ASSERT_TRUE(w.write(dir + "/model.safetensors").is_ok());
  const json cfg = {{"architectures", {"DSparkMiniMaxDraftModel"}},
                    {"num_hidden_layers", 2},
                    {"hidden_size", 256},
                    {"num_attention_heads", 8},
                    {"num_key_value_heads", 2},
                    {"head_dim", 32},
                    {"vocab_size", 4096},
                    {"dspark_ffn_hidden_size", 1024},
                    {"layer_types", {"sliding_attention", "sliding_attention"}},
                    {"sliding_window", 512},
                    {"dspark_block_size", 7},
                    {"dspark_noise_token_id", 4090},
                    {"dspark_target_layer_ids", {1, 2, 3, 4, 5}},
                    {"dspark_markov_rank", 64},
                    {"rope_theta", 10000.0},
                    {"rotary_dim", 16},
                    {"dspark_target_hidden_convention", "final_norm_last"}};
  std::ofstream(dir + "/config.json") << cfg.dump(2);
}

std::vector<int32_t> tokens_of(int64_t n, uint64_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint64_t s = seed;
  for (auto& x : t) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    x = static_cast<int32_t>((s >> 33) % 4000);  // ordinary (non-special) ids
  }
  return t;
}

TEST(DSparkParity, FixturePlumbingOnARandomDraftOnDisk) {
  CpuBackend backend(2);
  Target t;
  load_target(backend, &t);
  const fs::path base = fs::temp_directory_path() / ("m3_dspark_parity_" + std::to_string(getpid()));
  write_random_draft((base / "a").string(), 5);
  write_random_draft((base / "b").string(), 6);
  auto draft = load_draft((base / "a").string(), t, backend);
  ASSERT_TRUE(draft.is_ok()) << draft.status().to_string();
  EXPECT_EQ((*draft)->config().capture, CaptureConvention::kFinalNormLast);

  // A fixture in the trainer's layout from this draft, through text and back.
  json fx = {{"convention", "final_norm_last"}, {"cases", json::array()}};
  for (auto [n, seed] : {std::pair<int64_t, uint64_t>{24, 1}, {70, 2}}) {
    const auto toks = tokens_of(n + 1, seed);
    const std::vector<int32_t> ctx(toks.begin(), toks.end() - 1);
    auto p = propose(t, backend, **draft, ctx, toks.back());
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    fx["cases"].push_back(
        fixture_case("random_" + std::to_string(n), ctx, toks.back(), *p, (*draft)->config()));
  }
  fx = json::parse(fx.dump());
  EXPECT_EQ(check_fixture(fx, t, backend, **draft), std::vector<std::string>{});

  // A logit moved by ten tolerances, a base logit, a token with a clear margin: each is caught.
  {
    json bad = fx;
    json& s = bad["cases"][0]["slots"][2];
    s["logits"][0] = s["logits"][0].get<double>() + 10 * tol(s["logits"][0].get<double>());
    const auto f = check_fixture(bad, t, backend, **draft);
    ASSERT_EQ(f.size(), 1u) << join(f);
    EXPECT_NE(f[0].find("slot 2: logit of id"), std::string::npos) << f[0];
  }
  {
    json bad = fx;
    json& s = bad["cases"][1]["slots"][6];
    s["base_logits"][1] = s["base_logits"][1].get<double>() - 0.5;
    const auto f = check_fixture(bad, t, backend, **draft);
    ASSERT_EQ(f.size(), 1u) << join(f);
    EXPECT_NE(f[0].find("slot 6: base logit"), std::string::npos) << f[0];
  }
  {
    json bad = fx;
    json& s = bad["cases"][0]["slots"][0];
    s["token"] = (s["token"].get<int32_t>() + 1) % 4096;
    s["margin"] = 1.0;
    const auto f = check_fixture(bad, t, backend, **draft);
    ASSERT_FALSE(f.empty());
    EXPECT_NE(f[0].find("slot 0: token"), std::string::npos) << f[0];
  }
  {
    json bad = fx;
    bad["convention"] = "layer_output";
    EXPECT_FALSE(check_fixture(bad, t, backend, **draft).empty());
  }
  // Another draft does not pass this fixture.
  auto other = load_draft((base / "b").string(), t, backend);
  ASSERT_TRUE(other.is_ok()) << other.status().to_string();
  EXPECT_GT(check_fixture(fx, t, backend, **other).size(), 10u);
  fs::remove_all(base);
}

#ifdef M3_DSPARK_PARITY_FIXTURE
// The bundled trained draft against the trainer's PyTorch fixture.
TEST(DSparkParity, BundledDraftMatchesTheTrainer) {
  CpuBackend backend(2);
  Target t;
  load_target(backend, &t);
  std::ifstream in(M3_DSPARK_PARITY_FIXTURE);
  ASSERT_TRUE(in.good()) << M3_DSPARK_PARITY_FIXTURE;
  std::stringstream ss;
  ss << in.rdbuf();
  const json fx = json::parse(ss.str());
  auto draft = load_draft(kTinyDir + "/dspark", t, backend);
  ASSERT_TRUE(draft.is_ok()) << draft.status().to_string();
  EXPECT_GE(fx["cases"].size(), 2u);
  const auto bad = check_fixture(fx, t, backend, **draft);
  EXPECT_TRUE(bad.empty()) << join(bad);
}
#endif

}  // namespace
}  // namespace m3
