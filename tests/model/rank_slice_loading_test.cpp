// Each tensor- / expert-parallel CPU rank reads only its own slices of the checkpoint
// (model/minimax_m3/tensor_parallel.h, WeightSource::load_f32_window): the bundled model loaded as
// every rank of --tp 2, --tp 4 (KV heads replicated), --tp 2 --ep 2 and --tp 4 --ep 2, and with
// attention data parallelism --tp 2 --dp 2, --tp 4 --dp 2 and --tp 4 --ep 2 --dp 2 (the heads split
// by the rank's position in its group of tp / dp, the rest over all tp ranks), with a ReadCounter
// on the checkpoint. Each rank's bytes read per stored tensor must equal its slices'
// bytes computed from the config (rows of q/k/v, the index query projection, gate/up; columns of
// o_proj and down projections; its experts only), the replicated tensors whole, and summed over the
// ranks every partitioned tensor is read exactly once. The rank's weights equal the same slices of
// the unsharded weights bit for bit, for the checkpoint and for `--load-format dummy` (whose
// NVFP4 experts and MXFP8 linears a rank generates alone).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "app/engine_stack.h"
#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "loader/checkpoint.h"
#include "loader/vision_config.h"
#include "model/minimax_m3/dummy_weights.h"
#include "model/minimax_m3/tensor_parallel.h"
#include "model/minimax_m3/vision_tower.h"
#include "model/minimax_m3/weights.h"

namespace m3::minimax_m3 {
namespace {

const std::string kModel = std::string(M3_REPO_ROOT) + "/models/m3-tiny";

struct Layout {
  int tp = 1, ep = 1, dp = 1;
  std::string name() const {
    return "tp" + std::to_string(tp) + (ep > 1 ? "_ep" + std::to_string(ep) : std::string()) +
           (dp > 1 ? "_dp" + std::to_string(dp) : std::string());
  }
  ParallelLayout at(int rank) const {
    ParallelLayout l{rank, tp, nullptr, ep};
    l.dp = dp;
    return l;
  }
};

// The bytes of the language model's tensors: everything stored but the vision tower's, which the
// vision loader reads apart (once, on the server's first rank).
uint64_t language_model_bytes(const Checkpoint& ck) {
  std::set<std::string> vision;
  const std::optional<VisionConfig> vc = load_vision_config(kModel).value();
  const Result<std::string> prefix = find_vision_prefix(ck);
  if (vc && prefix.is_ok()) {
    for (const std::string& n : vision_weight_names(*vc, *prefix)) vision.insert(n);
  }
  uint64_t total = 0;
  for (const std::string& n : ck.store().names()) {
    if (!vision.count(n)) total += ck.raw(n).value().nbytes;
  }
  return total;
}

// How many ranks read each element of a tensor, summed over the ranks: partitioned over all ranks
// (once), over an attention group's ranks (query heads: once per group), by KV heads (once per
// group and rank sharing a KV head), or whole on every rank.
enum class Sharing { kPartitioned, kHeads, kKvHeads, kReplicated };

struct Expected {
  std::map<std::string, uint64_t> bytes;   // stored name -> bytes this rank reads
  std::map<std::string, Sharing> sharing;  // stored name -> how the ranks share it
};

// This rank's reads, from the config and the rank's slices alone (not from the loader's code).
Expected expected_reads(const Checkpoint& ck, const MiniMaxM3Config& c, const WeightNaming& n,
                        const RankSlices& rs) {
  Expected e;
  auto esize = [&](const std::string& name) {
    return static_cast<uint64_t>(dtype_size(ck.stored(name).value().data.dtype));
  };
  auto whole = [&](const std::string& name) {
    e.bytes[name] += ck.stored(name).value().data.nbytes;
    e.sharing[name] = Sharing::kReplicated;
  };
  auto part = [&](const std::string& name, int64_t rows, int64_t cols, Sharing s) {
    e.bytes[name] += static_cast<uint64_t>(rows * cols) * esize(name);
    e.sharing[name] = s;
  };
  const int64_t hd = c.hidden_size, d = c.head_dim, dix = c.index_head_dim;
  whole(n.model_prefix + "embed_tokens.weight");
  whole(n.model_prefix + "norm.weight");
  // The LM head: the rank's vocabulary rows (all of them at one rank). Tied to the embedding, the
  // rows are read a second time from the embedding's tensor (not in this file's models).
  if (n.lm_head.empty()) {
    e.bytes[n.model_prefix + "embed_tokens.weight"] +=
        static_cast<uint64_t>(rs.vocab_count * hd) * esize(n.model_prefix + "embed_tokens.weight");
  } else {
    part(n.lm_head, rs.vocab_count, hd, Sharing::kPartitioned);
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = n.layer(i), a = p + "self_attn.", m = p + "block_sparse_moe.";
    whole(p + "input_layernorm.weight");
    whole(p + "post_attention_layernorm.weight");
    part(a + "q_proj.weight", rs.q_count * d, hd, Sharing::kHeads);
    part(a + "k_proj.weight", rs.kv_count * d, hd, Sharing::kKvHeads);
    part(a + "v_proj.weight", rs.kv_count * d, hd, Sharing::kKvHeads);
    part(a + "o_proj.weight", hd, rs.q_count * d, Sharing::kHeads);
    whole(a + "q_norm.weight");
    whole(a + "k_norm.weight");
    if (c.layer_types[size_t(i)] == AttentionKind::kSparse) {
      part(a + "index_q_proj.weight", rs.kv_count * dix, hd, Sharing::kKvHeads);
      whole(a + "index_k_proj.weight");
      whole(a + "index_q_norm.weight");
      whole(a + "index_k_norm.weight");
    }
    if (c.mlp_layer_types[size_t(i)] == MlpKind::kDense) {
      part(p + "mlp.gate_proj.weight", rs.dense_count, hd, Sharing::kPartitioned);
      part(p + "mlp.up_proj.weight", rs.dense_count, hd, Sharing::kPartitioned);
      part(p + "mlp.down_proj.weight", hd, rs.dense_count, Sharing::kPartitioned);
      continue;
    }
    whole(m + "gate.weight");
    whole(m + "e_score_correction_bias");
    for (int64_t x = rs.expert_begin; x < rs.expert_begin + rs.expert_count; ++x) {
      const std::string ex = m + "experts." + std::to_string(x) + ".";
      part(ex + "w1.weight", rs.inter_count, hd, Sharing::kPartitioned);
      part(ex + "w3.weight", rs.inter_count, hd, Sharing::kPartitioned);
      part(ex + "w2.weight", hd, rs.inter_count, Sharing::kPartitioned);
    }
    const std::string s = m + "shared_experts.";
    part(s + "gate_proj.weight", rs.shared_count, hd, Sharing::kPartitioned);
    part(s + "up_proj.weight", rs.shared_count, hd, Sharing::kPartitioned);
    part(s + "down_proj.weight", hd, rs.shared_count, Sharing::kPartitioned);
  }
  return e;
}

std::vector<float> download(Backend* b, const DeviceBuffer<float>& buf) {
  std::vector<float> h(static_cast<size_t>(buf.size()));
  if (!h.empty()) b->copy_to_host(h.data(), buf.data(), static_cast<int64_t>(h.size() * 4));
  return h;
}

std::vector<float> rows_of(const std::vector<float>& w, int64_t cols, int64_t begin,
                           int64_t count) {
  return std::vector<float>(w.begin() + begin * cols, w.begin() + (begin + count) * cols);
}

std::vector<float> cols_of(const std::vector<float>& w, int64_t cols, int64_t begin,
                           int64_t count) {
  std::vector<float> out;
  for (size_t r = 0; r < w.size() / size_t(cols); ++r)
    out.insert(out.end(), w.begin() + int64_t(r) * cols + begin,
               w.begin() + int64_t(r) * cols + begin + count);
  return out;
}

// Gate rows [begin, begin + count) then the same up rows, of a fused [2·inter, hidden].
std::vector<float> gate_up_of(const std::vector<float>& w, int64_t inter, int64_t hidden,
                              int64_t begin, int64_t count) {
  std::vector<float> out = rows_of(w, hidden, begin, count);
  const std::vector<float> up = rows_of(w, hidden, inter + begin, count);
  out.insert(out.end(), up.begin(), up.end());
  return out;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every sharded weight of `rank` equals the same slice of `full`, bit for bit.
void expect_rank_weights_are_slices(Backend* fb, const ModelWeights& full, Backend* rb,
                                    const ModelWeights& rank, const MiniMaxM3Config& c,
                                    const RankSlices& rs, const std::string& what) {
  const int64_t hd = c.hidden_size, d = c.head_dim, dix = c.index_head_dim;
  auto same = [&](const DeviceBuffer<float>& got, const std::vector<float>& want,
                  const std::string& name) {
    EXPECT_TRUE(bitwise_equal(download(rb, got), want)) << what << ": " << name;
  };
  auto get = [&](const DeviceBuffer<float>& b) { return download(fb, b); };
  for (size_t i = 0; i < full.layers.size(); ++i) {
    const LayerWeights& f = full.layers[i];
    const LayerWeights& r = rank.layers[i];
    const std::string l = "layer " + std::to_string(i) + " ";
    same(r.wq, rows_of(get(f.wq), hd, rs.q_begin * d, rs.q_count * d), l + "q_proj");
    same(r.wk, rows_of(get(f.wk), hd, rs.kv_begin * d, rs.kv_count * d), l + "k_proj");
    same(r.wv, rows_of(get(f.wv), hd, rs.kv_begin * d, rs.kv_count * d), l + "v_proj");
    same(r.wo, cols_of(get(f.wo), c.num_attention_heads * d, rs.q_begin * d, rs.q_count * d),
         l + "o_proj");
    if (f.sparse)
      same(r.wiq, rows_of(get(f.wiq), hd, rs.kv_begin * dix, rs.kv_count * dix),
           l + "index_q_proj");
    if (!f.moe) {
      const int64_t di = c.dense_intermediate_size;
      same(r.mlp_w13, gate_up_of(get(f.mlp_w13), di, hd, rs.dense_begin, rs.dense_count),
           l + "dense gate/up");
      same(r.mlp_w2, cols_of(get(f.mlp_w2), di, rs.dense_begin, rs.dense_count), l + "dense down");
      continue;
    }
    ASSERT_EQ(r.expert_w13.size(), size_t(rs.expert_count));
    for (int64_t x = 0; x < rs.expert_count; ++x) {
      const size_t fx = size_t(rs.expert_begin + x);
      const int64_t in = c.intermediate_size;
      same(r.expert_w13[size_t(x)],
           gate_up_of(get(f.expert_w13[fx]), in, hd, rs.inter_begin, rs.inter_count),
           l + "expert " + std::to_string(fx) + " w1/w3");
      same(r.expert_w2[size_t(x)],
           cols_of(get(f.expert_w2[fx]), in, rs.inter_begin, rs.inter_count),
           l + "expert " + std::to_string(fx) + " w2");
    }
    const int64_t si = c.shared_intermediate_size * c.n_shared_experts;
    same(r.shared_w13, gate_up_of(get(f.shared_w13), si, hd, rs.shared_begin, rs.shared_count),
         l + "shared gate/up");
    same(r.shared_w2, cols_of(get(f.shared_w2), si, rs.shared_begin, rs.shared_count),
         l + "shared down");
  }
}

class ShardedRankLoading : public ::testing::TestWithParam<Layout> {};

TEST_P(ShardedRankLoading, EachRankReadsExactlyItsSlices) {
  const Layout layout = GetParam();
  auto cfg = load_minimax_m3_config(kModel);
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  std::unique_ptr<Checkpoint> ck = Checkpoint::open(kModel).value();
  const WeightNaming naming = detect_naming(*ck, *cfg).value();

  CpuBackend full_backend(1);
  ReadCounter full_reads;
  ck->set_read_counter(&full_reads);
  Result<ModelWeights> full = load_weights(*ck, *cfg, &full_backend);
  ASSERT_TRUE(full.is_ok()) << full.status().to_string();
  const uint64_t stored_total = language_model_bytes(*ck);
  // lm_head and the embedding are separate tensors, so one unsharded load reads each language-model
  // tensor once.
  EXPECT_EQ(full_reads.total(), stored_total);

  std::map<std::string, uint64_t> summed;
  Expected any;
  for (int r = 0; r < layout.tp; ++r) {
    const RankSlices rs = rank_slices(*cfg, r, layout.tp, layout.ep, layout.dp);
    ReadCounter reads;
    ck->set_read_counter(&reads);
    CpuBackend backend(1);
    Result<ModelWeights> w = load_weights(*ck, *cfg, &backend, layout.at(r));
    ck->set_read_counter(nullptr);
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    if (layout.dp > 1) {
      // The heads are those of the rank's position in its attention group of tp / dp ranks; the
      // feed-forward slices those of the rank among all tp.
      const int group = layout.tp / layout.dp;
      const RankSlices heads = rank_slices(*cfg, r % group, group);
      const RankSlices ffn = rank_slices(*cfg, r, layout.tp, layout.ep);
      EXPECT_EQ(rs.q_begin, heads.q_begin);
      EXPECT_EQ(rs.q_count, heads.q_count);
      EXPECT_EQ(rs.kv_begin, heads.kv_begin);
      EXPECT_EQ(rs.kv_count, heads.kv_count);
      EXPECT_EQ(rs.inter_begin, ffn.inter_begin);
      EXPECT_EQ(rs.expert_begin, ffn.expert_begin);
      EXPECT_EQ(rs.dense_begin, ffn.dense_begin);
      EXPECT_EQ(rs.shared_begin, ffn.shared_begin);
    }
    const Expected want = expected_reads(*ck, *cfg, naming, rs);
    const std::map<std::string, uint64_t> got = reads.by_tensor();
    EXPECT_EQ(got, want.bytes) << layout.name() << " rank " << r;
    for (const auto& [name, b] : got) summed[name] += b;
    any.sharing.insert(want.sharing.begin(), want.sharing.end());
    std::printf("[ %-40s ] %s rank %d: %.2f MiB of %.2f MiB read\n", "rank slice loading",
                layout.name().c_str(), r, double(reads.total()) / (1 << 20),
                double(stored_total) / (1 << 20));
    expect_rank_weights_are_slices(&full_backend, *full, &backend, *w, *cfg, rs,
                                   layout.name() + " rank " + std::to_string(r));
  }
  // Over the ranks: a partitioned tensor is read once, a query-head tensor once per attention
  // group, a KV-head tensor once per group and rank sharing a KV head (tp / dp / Hkv where a
  // group's ranks exceed the KV heads), a replicated one by every rank.
  const std::map<std::string, uint64_t> once = full_reads.by_tensor();
  const uint64_t head_copies = uint64_t(layout.dp);
  const int64_t group = layout.tp / layout.dp;
  const uint64_t kv_copies =
      head_copies * uint64_t(std::max<int64_t>(1, group / cfg->num_key_value_heads));
  for (const auto& [name, sharing] : any.sharing) {
    const uint64_t copies = sharing == Sharing::kPartitioned ? 1
                            : sharing == Sharing::kHeads     ? head_copies
                            : sharing == Sharing::kKvHeads   ? kv_copies
                                                             : uint64_t(layout.tp);
    EXPECT_EQ(summed[name], copies * once.at(name)) << layout.name() << ": " << name;
  }
}

// The startup report's "checkpoint read" line gives the bytes each served rank read, measured as
// the ranks load (make_engine, as `m3serve serve` builds it): they must equal the rank's slices
// computed from the config, and one rank reads the whole checkpoint.
class ServedRankReads : public ::testing::TestWithParam<Layout> {};

TEST_P(ServedRankReads, StartupReportGivesEachRanksSlicesRead) {
  const Layout layout = GetParam();
  auto cfg = load_minimax_m3_config(kModel);
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  std::unique_ptr<Checkpoint> ck = Checkpoint::open(kModel).value();
  const WeightNaming naming = detect_naming(*ck, *cfg).value();
  const uint64_t stored_total = language_model_bytes(*ck);

  app::EngineStackOptions o;
  o.device = "cpu";
  o.num_threads = 2;
  o.tensor_parallel = layout.tp;
  o.expert_parallel = layout.ep;
  o.dp_attention = layout.dp;
  o.context_length = 256;
  o.kv_cache_bytes = int64_t{16} << 20;
  auto engine = app::make_engine(kModel, o);
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  std::string line;
  for (const std::string& l : engine->report) {
    if (l.rfind("checkpoint read: ", 0) == 0) line = l;
  }
  ASSERT_FALSE(line.empty()) << "no 'checkpoint read' line in the startup report";
  uint64_t summed = 0;
  for (int r = 0; r < layout.tp; ++r) {
    const std::string key = "by rank " + std::to_string(r) + " (";
    const size_t at = line.find(key);
    ASSERT_NE(at, std::string::npos) << line;
    const uint64_t reported = std::stoull(line.substr(at + key.size()));
    EXPECT_EQ(line.compare(line.find(')', at) - 6, 6, " bytes"), 0) << line;
    uint64_t want = 0;
    if (layout.tp == 1) {
      want = stored_total;
    } else {
      const RankSlices rs = rank_slices(*cfg, r, layout.tp, layout.ep, layout.dp);
      for (const auto& [name, b] : expected_reads(*ck, *cfg, naming, rs).bytes) want += b;
    }
    EXPECT_EQ(reported, want) << layout.name() << " rank " << r << ": " << line;
    summed += reported;
  }
  EXPECT_EQ(line.find("by rank " + std::to_string(layout.tp)), std::string::npos) << line;
  std::printf("[ %-40s ] %s: %s\n", "startup report", layout.name().c_str(), line.c_str());
  // Sharded ranks together read at least the whole checkpoint (the replicated tensors more than
  // once), each of them less.
  if (layout.tp > 1) {
    EXPECT_GE(summed, stored_total);
    EXPECT_LT(summed / uint64_t(layout.tp), stored_total);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ServedRankReads,
                         ::testing::Values(Layout{1, 1, 1}, Layout{2, 1, 1}, Layout{2, 2, 1}),
                         [](const ::testing::TestParamInfo<Layout>& i) {
                           return i.param.name();
                         });

// `--load-format dummy`: a rank generates only its slices, and they equal the same slices of the
// unsharded dummy model (the experts are NVFP4, the linears MXFP8: block-aligned windows).
// Under --dp only the attention slices differ, so one dp layout covers it (CI time).
class DummyRankLoading : public ::testing::TestWithParam<Layout> {};

TEST_P(DummyRankLoading, DummyRanksEqualTheUnshardedDummy) {
  const Layout layout = GetParam();
  auto cfg = load_minimax_m3_config(kModel);
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  DummyWeightSource src(*cfg);
  CpuBackend full_backend(1);
  Result<ModelWeights> full = load_weights(src, *cfg, &full_backend);
  ASSERT_TRUE(full.is_ok()) << full.status().to_string();
  for (int r = 0; r < layout.tp; ++r) {
    CpuBackend backend(1);
    Result<ModelWeights> w = load_weights(src, *cfg, &backend, layout.at(r));
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    expect_rank_weights_are_slices(&full_backend, *full, &backend, *w, *cfg,
                                   rank_slices(*cfg, r, layout.tp, layout.ep, layout.dp),
                                   "dummy " + layout.name() + " rank " + std::to_string(r));
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ShardedRankLoading,
                         ::testing::Values(Layout{2, 1}, Layout{4, 1}, Layout{2, 2}, Layout{4, 2},
                                           Layout{2, 1, 2}, Layout{4, 1, 2}, Layout{4, 2, 2}),
                         [](const ::testing::TestParamInfo<Layout>& i) { return i.param.name(); });
INSTANTIATE_TEST_SUITE_P(Layouts, DummyRankLoading,
                         ::testing::Values(Layout{2, 1}, Layout{4, 1}, Layout{2, 2}, Layout{4, 2},
                                           Layout{4, 2, 2}),
                         [](const ::testing::TestParamInfo<Layout>& i) { return i.param.name(); });

// A dummy window equals the same window of the whole tensor in each stored format, and columns off
// the scale blocks are refused as the checkpoint refuses them.
TEST(ShardedDummyWeightWindow, EqualsTheWholeTensorsWindow) {
  auto cfg = load_minimax_m3_config(kModel);
  ASSERT_TRUE(cfg.is_ok());
  DummyWeightSource src(*cfg);
  const int64_t hd = cfg->hidden_size, in = cfg->intermediate_size;
  struct Case {
    std::string name;
    std::vector<int64_t> shape;
    WeightWindow w;
  };
  const std::string m = "model.layers.1.block_sparse_moe.";
  const std::vector<Case> cases = {
      {"model.layers.0.self_attn.q_proj.weight", {8 * 32, hd}, {64, 128, 0, hd}},  // MXFP8
      {"model.layers.0.self_attn.o_proj.weight", {hd, 8 * 32}, {0, hd, 96, 160}},  // MXFP8
      {m + "experts.3.w1.weight", {in, hd}, {80, 160, 0, hd}},                     // NVFP4
      {m + "experts.3.w2.weight", {hd, in}, {0, hd, 160, 320}},                    // NVFP4
      {"model.embed_tokens.weight", {cfg->vocab_size, hd}, {7, 9, 3, 250}},        // BF16
  };
  for (const Case& c : cases) {
    Result<WeightFormat> f = src.format(c.name);
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    HostTensorF32 whole = src.load_f32(c.name, c.shape).value();
    Result<HostTensorF32> got = src.load_f32_window(c.name, c.shape, c.w);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    std::vector<float> want;
    for (int64_t r = c.w.row_begin; r < c.w.row_end; ++r)
      for (int64_t k = c.w.col_begin; k < c.w.col_end; ++k)
        want.push_back(whole.data[size_t(r * c.shape[1] + k)]);
    EXPECT_TRUE(bitwise_equal(got->data, want)) << c.name;
  }
  const Status off =
      src.load_f32_window(m + "experts.3.w2.weight", {hd, in}, {0, hd, 8, 40}).status();
  EXPECT_EQ(off.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(off.message().find("[8, 40)"), std::string::npos) << off.message();
  EXPECT_NE(off.message().find("16-element"), std::string::npos) << off.message();
}

}  // namespace
}  // namespace m3::minimax_m3
