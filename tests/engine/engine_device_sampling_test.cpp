// The engine with a runner that samples rows itself (ModelRunner::forward_sampling, as the CUDA
// runner does on the GPU): outputs equal host sampling, only rows whose parameters need nothing
// but the logits are offered, and a runner's bad token fails its step's requests, not the engine.
#include <gtest/gtest.h>

#include "engine_test_util.h"

namespace m3 {
namespace {

using namespace m3::testing;

struct EngineRun {
  std::vector<Outcome> out;
  int64_t device_rows = 0, host_rows = 0;
};

EngineRun run_requests(const std::vector<GenerateRequest>& reqs, bool device, bool bad_token = false) {
  EngineFixtureConfig f;
  f.eos = {7};
  FakeModel* model = nullptr;
  auto e = make_engine(f, &model);
  model->device_sampling = device;
  model->bad_device_token = bad_token;
  std::vector<RequestHandle> hs;
  std::vector<int32_t> ns;
  for (const GenerateRequest& r : reqs) {
    auto h = e->submit(r);
    EXPECT_TRUE(h.is_ok()) << h.status().to_string();
    hs.push_back(std::move(h).value());
    ns.push_back(r.params.n);
  }
  EngineRun run;
  run.out = run_all(*e, hs, ns);
  run.device_rows = model->device_rows;
  run.host_rows = model->host_rows;
  return run;
}

GenerateRequest request(int32_t seed, float temperature, int32_t max_tokens) {
  GenerateRequest r;
  r.prompt_tokens = prompt_of(seed, 6 + seed % 5, 50);
  r.params.temperature = temperature;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  r.params.seed = 1000 + seed;
  return r;
}

TEST(EngineDeviceSampling, OutputsEqualHostSampling) {
  std::vector<GenerateRequest> reqs;
  reqs.push_back(request(1, 0.0f, 9));  // greedy
  GenerateRequest t = request(2, 0.8f, 9);
  t.params.top_k = 10;
  t.params.top_p = 0.9f;
  t.params.min_p = 0.05f;
  reqs.push_back(t);
  GenerateRequest n = request(3, 1.2f, 7);
  n.params.n = 3;  // three sequences, three random streams
  reqs.push_back(n);
  const EngineRun host = run_requests(reqs, false), dev = run_requests(reqs, true);
  ASSERT_EQ(host.out.size(), dev.out.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_TRUE(dev.out[i].error.is_ok()) << dev.out[i].error.to_string();
    EXPECT_EQ(dev.out[i].tokens, host.out[i].tokens) << "request " << i;
    EXPECT_EQ(dev.out[i].usage.completion_tokens, host.out[i].usage.completion_tokens);
  }
  EXPECT_EQ(dev.host_rows, 0);  // every row was offered
  EXPECT_EQ(dev.device_rows, 9 + 9 + 3 * 7);
}

TEST(EngineDeviceSampling, RowsThatNeedTheHostSamplerGetTheirLogits) {
  // Each of these needs more than the logits: logprobs, a penalty (token history), a logit
  // bias, or the min_tokens mask (while it is active).
  std::vector<GenerateRequest> reqs;
  GenerateRequest lp = request(4, 0.0f, 5);
  lp.params.logprobs = true;
  lp.params.top_logprobs = 2;
  reqs.push_back(lp);
  GenerateRequest pen = request(5, 0.7f, 5);
  pen.params.presence_penalty = 0.5f;
  reqs.push_back(pen);
  GenerateRequest rep = request(6, 0.7f, 5);
  rep.params.repetition_penalty = 1.3f;
  reqs.push_back(rep);
  GenerateRequest bias = request(7, 0.0f, 5);
  bias.params.logit_bias = {{3, 50.0f}};
  reqs.push_back(bias);
  const EngineRun host = run_requests(reqs, false), dev = run_requests(reqs, true);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(dev.out[i].tokens, host.out[i].tokens);
  EXPECT_EQ(dev.device_rows, 0);
  EXPECT_EQ(dev.host_rows, 4 * 5);
  ASSERT_EQ(dev.out[0].detail[0].size(), 5u);
  EXPECT_EQ(dev.out[0].detail[0][0].top_logprobs.size(), 2u);  // logprobs still reported

  // min_tokens: the first 4 rows mask EOS (host), the rest are offered.
  GenerateRequest mt = request(8, 0.0f, 10);
  mt.params.ignore_eos = false;
  mt.params.min_tokens = 4;
  mt.params.max_tokens = 10;
  const EngineRun h2 = run_requests({mt}, false), d2 = run_requests({mt}, true);
  EXPECT_EQ(d2.out[0].tokens, h2.out[0].tokens);
  EXPECT_EQ(d2.host_rows, 4);
  EXPECT_EQ(d2.device_rows, static_cast<int64_t>(d2.out[0].tokens[0].size()) - 4);
}

TEST(EngineDeviceSampling, ABadTokenFailsTheStepsRequestsOnly) {
  const EngineRun bad = run_requests({request(9, 0.0f, 4)}, true, /*bad_token=*/true);
  ASSERT_TRUE(bad.out[0].done);
  EXPECT_FALSE(bad.out[0].error.is_ok());
  EXPECT_NE(bad.out[0].error.to_string().find("outside the vocabulary"), std::string::npos)
      << bad.out[0].error.to_string();
  // Rows the engine did not offer (logprobs) are never device-sampled, bad runner or not.
  GenerateRequest lp = request(10, 0.0f, 4);
  lp.params.logprobs = true;
  const EngineRun ok = run_requests({lp}, true, /*bad_token=*/true);
  EXPECT_TRUE(ok.out[0].error.is_ok()) << ok.out[0].error.to_string();
  EXPECT_EQ(ok.out[0].tokens[0].size(), 4u);
}

}  // namespace
}  // namespace m3
