// Speculative decoding with the DSpark draft on the real-shape CUDA path at forced acceptance,
// against plain decode in the same process: MiniMax-M3.1-Flash shapes (builtin_m3_flash_config)
// with weights generated on the GPU in the real formats, the released draft layout
// (default_dspark_config_for the 60-layer target: 5 layers, window 4096, Markov rank 256) with
// dummy weights, B sequences at context C (default 4096; M3_BENCH_CTX).
//
// Per batch B (1, 4, 16) the median over 15 runs (after 3 warm-ups) of
//  * plain: one decode step, forward() of B one-token slices greedy-sampled on the GPU (the
//    decode path, CUDA graphs; token ids back);
//  * verify: forward() of B slices of N = block + 1 tokens with every row's logits back and the
//    draft's hidden-state capture (B·N decode rows, what a speculative step runs);
//  * draft: per sequence, appending L verified positions to the draft's context, one propose
//    and the truncation back (so C stays fixed). The propose is timed both ways: greedy on the
//    device (propose_greedy: no host round trip per slot; the one the speed-ups use) and with a
//    host argmax picker (propose: each slot's row copied back, as for a sampled request), each
//    with its phases on the GPU's timeline (CUDA events: upload + embedding, per-layer q|k|v +
//    RoPE, block attention, o + MLP summed over the layers, lm_head, Markov chain + picks); and
//    the batched propose (propose_greedy_batch: one draft forward for all B sequences' blocks),
//    whose speed-ups are printed next to the serial ones (the engine batches greedy sequences
//    this way; sampled ones are proposed one after another, with the host picker).
// The target's times are measured on models of 3 and L layers (3 dense-MLP layers, then MoE;
// L = M3_BENCH_LAYERS, default 8, at most 60: the largest slice that fits, since the longer the
// slice the less the extrapolation amplifies timing noise) and extrapolated to 60
// (t3 + 57 (tL - t3) / (L - 3), as cuda_model_decode_bench does with its largest model); the
// draft runs whole. With forced acceptance L (tokens committed per verify,
// the engine's --speculative-simulate-accept-length) a round commits B·L tokens in
//   verify_60(B) + B · (append(L) + propose)          (serial proposes)
//   verify_60(B) + B · append(L) + propose_batch(B)   (batched, the engine's greedy order)
// and plain decode B tokens in decode_60(B). Printed: the tokens/s and the speed-up of each for
// L = 3, 5, 7. Not counted: the engine's host work (verification over the B·N
// rows of logits, scheduling), the same kind of cost plain decoding has less of.
//
// Usage: cuda_dspark_bench [results.tsv (appended)|-]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/minimax_m3/cuda/cuda_dspark_draft.h"
#include "model/minimax_m3/cuda/cuda_m3_model.h"
#include "model/minimax_m3/dspark/dspark_engine_draft.h"
#include "model/minimax_m3/dummy_weights.h"

namespace {

using namespace m3;
using namespace m3::minimax_m3;

constexpr int64_t kRuns = 15;

double median_ms(const std::function<void()>& run) {
  std::vector<double> ms;
  for (int64_t s = 0; s < kRuns + 3; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    const auto t1 = std::chrono::steady_clock::now();
    if (s >= 3) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void check(const Status& s, const char* what) {
  if (!s.is_ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.to_string().c_str());
    std::exit(1);
  }
}

std::unique_ptr<CudaM3Model> load(int64_t layers, int64_t pages) {
  const MiniMaxM3Config cfg = builtin_m3_flash_config(layers);
  DummyWeightSource src(cfg);
  CudaM3Options o;
  o.num_kv_pages = pages;
  o.max_batch = 128;
  o.gpu_dummy_weights = true;
  auto m = CudaM3Model::load(cfg, src, o);
  check(m.status(), "load target");
  return std::move(m).value();
}

struct TargetTimes {
  double decode_ms = 0, verify_ms = 0;
};

// Plain decode and verify steps of `batch` sequences at context `ctx` on `model`.
TargetTimes time_target(CudaM3Model* model, int64_t batch, int64_t ctx, int64_t verify_tokens,
                        const std::vector<int32_t>& capture) {
  const int64_t blocks = (ctx + verify_tokens + 127) / 128;
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(batch));
  std::vector<std::vector<int32_t>> one(static_cast<size_t>(batch)), many(static_cast<size_t>(batch));
  std::vector<SequenceInput> dec(static_cast<size_t>(batch)), ver(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const size_t i = static_cast<size_t>(b);
    for (int64_t j = 0; j < blocks; ++j) tables[i].push_back(static_cast<int32_t>(b * blocks + j));
    one[i] = {static_cast<int32_t>((1000 + 7919 * b) % 200000)};
    for (int64_t t = 0; t < verify_tokens; ++t)
      many[i].push_back(static_cast<int32_t>((1000 + 7919 * b + 31 * t) % 200000));
    dec[i].tokens = one[i];
    dec[i].start_pos = ctx;
    dec[i].block_table = tables[i];
    dec[i].logits_rows = {0};
    // Greedy-sampled on the GPU, as the engine's runner does for plain greedy rows (only token
    // ids come back); verify rows come back as logits (verification runs on the host).
    dec[i].sample = DeviceSampling{0.0f, 0, 1.0f, 0.0f, RngKey{1, static_cast<uint64_t>(b), 0}};
    ver[i].tokens = many[i];
    ver[i].start_pos = ctx;
    ver[i].block_table = tables[i];
    for (int64_t t = 0; t < verify_tokens; ++t) ver[i].logits_rows.push_back(static_cast<int32_t>(t));
  }
  TargetTimes t;
  ForwardOutput out;
  t.decode_ms = median_ms([&] { check(model->forward(dec, &out), "decode step"); });
  t.verify_ms = median_ms([&] { check(model->forward(ver, &out, capture), "verify step"); });
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const char* tsv_path = argc > 1 && std::string(argv[1]) != "-" ? argv[1] : nullptr;
  const int64_t ctx = std::getenv("M3_BENCH_CTX") ? std::atoll(std::getenv("M3_BENCH_CTX")) : 4096;
  const std::vector<int64_t> batches = {1, 4, 16};
  const MiniMaxM3Config whole = builtin_m3_flash_config(60);
  dspark::DSparkConfig dcfg = dspark::default_dspark_config_for(whole);
  const int64_t block = dcfg.block_size, verify_tokens = block + 1;
  const int64_t pages = 16 * ((ctx + verify_tokens + 127) / 128 + 1);

  const int64_t big = std::getenv("M3_BENCH_LAYERS")
                          ? std::clamp<int64_t>(std::atoll(std::getenv("M3_BENCH_LAYERS")), 4, 60)
                          : 8;
  // Target: 3 and `big` layers (the capture asks for the draft's count of layers, clipped to the
  // slice).
  TargetTimes t3[3], tbig[3];
  for (int64_t layers : {int64_t{3}, big}) {
    auto model = load(layers, pages);
    std::vector<int32_t> capture;
    for (size_t i = 0; i < dcfg.target_layer_ids.size(); ++i)
      capture.push_back(static_cast<int32_t>(std::min<int64_t>(static_cast<int64_t>(i), layers - 1)));
    for (size_t i = 0; i < batches.size(); ++i)
      (layers == 3 ? t3 : tbig)[i] = time_target(model.get(), batches[i], ctx, verify_tokens, capture);
  }

  // The draft next to a 3-layer target (it reads the embedding and lm_head only).
  auto target = load(3, pages);
  CudaDSparkOptions o;
  o.max_sequences = 16;  // the largest batch, for the batched propose
  o.dummy_weights = true;
  o.resolve_against = &whole;
  auto dr = CudaDSparkDraft::load(dcfg, target.get(), nullptr, "dummy draft weights", o);
  check(dr.status(), "load draft");
  CudaDSparkDraft& draft = **dr;
  const DSparkCudaPlan& plan = draft.plan();
  std::printf("draft: %lld layers, hidden %lld, window %lld, Markov rank %lld; %.1f MB weights, "
              "%.1f MB context per sequence\n",
              (long long)plan.layers, (long long)plan.hidden, (long long)plan.window,
              (long long)plan.rank, draft.weight_bytes() / 1e6, plan.kv_bytes_per_sequence / 1e6);
  auto state = draft.new_state();
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> features(static_cast<size_t>((ctx + 8) * plan.feature_width));
  for (float& f : features) f = normal(rng);
  check(draft.append_features(*state, std::span<const float>(features.data(),
                                                              static_cast<size_t>(ctx * plan.feature_width)),
                              ctx),
        "draft context");
  // The other sequences of the batched propose, each with the same context.
  std::vector<std::unique_ptr<DraftState>> others;
  std::vector<DraftState*> batch_states = {state.get()};
  for (int64_t i = 1; i < batches.back(); ++i) {
    others.push_back(draft.new_state());
    batch_states.push_back(others.back().get());
    check(draft.append_features(*others.back(),
                                std::span<const float>(features.data(),
                                                       static_cast<size_t>(ctx * plan.feature_width)),
                                ctx),
          "draft context");
  }
  const DraftTokenPicker greedy = [](std::span<const float> logits, int64_t) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  };
  std::vector<int32_t> tokens;
  const double propose_host_ms =
      median_ms([&] { check(draft.propose(*state, 1234, greedy, &tokens), "propose"); });
  const double propose_ms =
      median_ms([&] { check(draft.propose_greedy(*state, 1234, &tokens), "propose_greedy"); });
  // Phases of one more call of each (timing adds an event per phase, so kept out of the medians).
  auto phases = [&](const char* what, const std::function<Status()>& call) {
    draft.set_phase_timing(true);
    check(call(), what);
    draft.set_phase_timing(false);
    const CudaDSparkPhaseTimes& t = draft.last_phase_times();
    std::printf("  %-22s upload+embed %.3f, qkv+rope %.3f, attention %.3f, o+mlp %.3f, lm_head "
                "%.3f, markov+pick %.3f; sum %.3f ms\n",
                what, t.upload_embed_ms, t.qkv_rope_ms, t.attention_ms, t.o_mlp_ms, t.lm_head_ms,
                t.chain_ms, t.total_ms());
  };
  std::printf("draft propose phases (GPU timeline, layers summed):\n");
  phases("propose_greedy", [&] { return draft.propose_greedy(*state, 1234, &tokens); });
  phases("propose (host picker)", [&] { return draft.propose(*state, 1234, greedy, &tokens); });
  // One draft forward for a batch's blocks (propose_greedy_batch).
  std::vector<std::vector<int32_t>> batch_tokens;
  auto batch_call = [&](int64_t b) {
    const std::vector<int32_t> anchors(static_cast<size_t>(b), 1234);
    return draft.propose_greedy_batch(
        std::span<DraftState* const>(batch_states.data(), static_cast<size_t>(b)), anchors,
        &batch_tokens);
  };
  std::vector<double> batch_propose_ms;
  for (int64_t b : batches)
    batch_propose_ms.push_back(median_ms([&] { check(batch_call(b), "propose_greedy_batch"); }));
  phases("batched, 16 sequences", [&] { return batch_call(batches.back()); });
  double append_ms[8] = {};
  for (int64_t L : {3, 5, 7}) {
    append_ms[L] = median_ms([&] {
      check(draft.append_features(*state,
                                  std::span<const float>(features.data() + ctx * plan.feature_width,
                                                         static_cast<size_t>(L * plan.feature_width)),
                                  L),
            "append");
      check(draft.truncate(*state, ctx), "truncate");
    });
  }
  std::printf("draft per sequence: propose %.3f ms greedy on the device, %.3f ms with the host "
              "picker; append + truncate of 3 / 5 / 7 positions %.3f / %.3f / %.3f ms\n",
              propose_ms, propose_host_ms, append_ms[3], append_ms[5], append_ms[7]);
  for (size_t i = 0; i < batches.size(); ++i)
    std::printf("draft batched propose of %lld sequences: %.3f ms\n", (long long)batches[i],
                batch_propose_ms[i]);

  FILE* tsv = tsv_path ? std::fopen(tsv_path, "a") : nullptr;
  std::printf("\nM3.1-Flash, 60 layers extrapolated from 3 and %lld (t3 + 57 (t%lld - t3) / %lld), "
              "context %lld, verify %lld tokens per sequence\n",
              (long long)big, (long long)big, (long long)(big - 3), (long long)ctx,
              (long long)verify_tokens);
  std::printf("spec: one propose_greedy per sequence; batched: one propose_greedy_batch per "
              "round (the engine's order for greedy requests)\n");
  std::printf("%-6s %-12s %-12s %-10s %-8s %-12s %-8s %-12s %-8s\n", "batch", "decode60 ms",
              "verify60 ms", "plain t/s", "accept", "spec t/s", "speedup", "batched t/s",
              "speedup");
  for (size_t i = 0; i < batches.size(); ++i) {
    const int64_t b = batches[i];
    const double span = static_cast<double>(big - 3);
    const double dec60 = t3[i].decode_ms + 57.0 * (tbig[i].decode_ms - t3[i].decode_ms) / span;
    const double ver60 = t3[i].verify_ms + 57.0 * (tbig[i].verify_ms - t3[i].verify_ms) / span;
    const double plain = 1e3 * static_cast<double>(b) / dec60;
    for (int64_t L : {3, 5, 7}) {
      const double round = ver60 + static_cast<double>(b) * (append_ms[L] + propose_ms);
      const double spec = 1e3 * static_cast<double>(b * L) / round;
      const double round_b =
          ver60 + static_cast<double>(b) * append_ms[L] + batch_propose_ms[i];
      const double spec_b = 1e3 * static_cast<double>(b * L) / round_b;
      std::printf("%-6lld %-12.3f %-12.3f %-10.1f %-8lld %-12.1f %-8.2f %-12.1f %-8.2f\n",
                  (long long)b, dec60, ver60, plain, (long long)L, spec, spec / plain, spec_b,
                  spec_b / plain);
      // Columns after the first nine: the batched propose's time and tokens/s.
      if (tsv)
        std::fprintf(tsv,
                     "dspark\t%lld\t%lld\t%lld\t%.4f\t%.4f\t%.4f\t%.4f\t%.2f\t%.2f\t%.4f\t%.2f\n",
                     (long long)b, (long long)ctx, (long long)L, dec60, ver60, propose_ms,
                     append_ms[L], plain, spec, batch_propose_ms[i], spec_b);
    }
  }
  if (tsv) std::fclose(tsv);
  return 0;
}
