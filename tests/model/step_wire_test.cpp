#include "model/step_wire.h"

#include <gtest/gtest.h>

#include <vector>

namespace m3 {
namespace {

// Two slices: a prefill chunk with prompt-logit rows and an input embedding, and a sampled
// decode row of attention group 3; captured layers.
struct Example {
  std::vector<int32_t> t0{5, 6, 7, 8}, t1{9};
  std::vector<int32_t> b0{3, 1}, b1{0, 2, 4};
  std::vector<float> emb{0.5f, -1.25f, 3.0f};
  ModelStep step;
  Example() {
    step.capture_layers = {0, 2};
    ModelSlice a;
    a.tokens = t0;
    a.start_pos = 130;
    a.block_table = b0;
    a.logits_rows = {0, 3};
    a.embeddings.push_back(InputEmbedding{2, emb});
    ModelSlice b;
    b.tokens = t1;
    b.start_pos = 257;
    b.dp_group = 3;  // attention data parallelism: the slice's group
    b.block_table = b1;
    b.logits_rows = {0};
    DeviceSampling d;
    d.temperature = 0.7f;
    d.top_k = 40;
    d.top_p = 0.95f;
    d.min_p = 0.05f;
    d.rng = RngKey{11, 2, 33};
    b.sample = d;
    step.slices = {a, b};
  }
};

TEST(StepWire, RoundTripKeepsEveryField) {
  Example ex;
  const std::vector<char> bytes = encode_step(ex.step);
  Result<WireStep> got = decode_step(bytes.data(), bytes.size());
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  WireStep w = std::move(got).value();  // moving keeps the spans valid
  const ModelStep& s = w.step;
  EXPECT_EQ(s.capture_layers, (std::vector<int32_t>{0, 2}));
  ASSERT_EQ(s.slices.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const ModelSlice& a = s.slices[i];
    const ModelSlice& b = ex.step.slices[i];
    EXPECT_EQ(std::vector<int32_t>(a.tokens.begin(), a.tokens.end()),
              std::vector<int32_t>(b.tokens.begin(), b.tokens.end()));
    EXPECT_EQ(a.start_pos, b.start_pos);
    EXPECT_EQ(a.dp_group, b.dp_group);
    EXPECT_EQ(std::vector<int32_t>(a.block_table.begin(), a.block_table.end()),
              std::vector<int32_t>(b.block_table.begin(), b.block_table.end()));
    EXPECT_EQ(a.logits_rows, b.logits_rows);
    EXPECT_EQ(a.sample.has_value(), b.sample.has_value());
    ASSERT_EQ(a.embeddings.size(), b.embeddings.size());
  }
  EXPECT_EQ(s.slices[1].dp_group, 3);
  const ModelSlice& a = s.slices[0];
  EXPECT_EQ(a.embeddings[0].token_index, 2);
  EXPECT_EQ(std::vector<float>(a.embeddings[0].values.begin(), a.embeddings[0].values.end()),
            ex.emb);
  const DeviceSampling& d = *s.slices[1].sample;
  EXPECT_EQ(d.temperature, 0.7f);
  EXPECT_EQ(d.top_k, 40);
  EXPECT_EQ(d.top_p, 0.95f);
  EXPECT_EQ(d.min_p, 0.05f);
  EXPECT_EQ(d.rng.seed, 11u);
  EXPECT_EQ(d.rng.stream, 2u);
  EXPECT_EQ(d.rng.counter, 33u);
  // The decoded step encodes to the same bytes.
  EXPECT_EQ(encode_step(s), bytes);
}

TEST(StepWire, EmptyStepRoundTrips) {
  ModelStep empty;
  const std::vector<char> bytes = encode_step(empty);
  Result<WireStep> got = decode_step(bytes.data(), bytes.size());
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_TRUE(got->step.slices.empty());
}

// The smallest slice (no tokens, table, rows, sampling or embeddings) is 45 bytes, the bound
// decode_step checks a slice count against; its attention group still travels (a follower's GPUs
// run attention only on their group's slices).
TEST(StepWire, SmallestSliceKeepsItsGroup) {
  ModelStep st;
  st.slices.resize(2);
  st.slices[1].dp_group = 5;
  const std::vector<char> bytes = encode_step(st);
  EXPECT_EQ(bytes.size(), 4 + 4 + 8 + 8 + 2 * 45u) << "magic, version, layers, count, slices";
  Result<WireStep> got = decode_step(bytes.data(), bytes.size());
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  ASSERT_EQ(got->step.slices.size(), 2u);
  EXPECT_EQ(got->step.slices[0].dp_group, 0);
  EXPECT_EQ(got->step.slices[1].dp_group, 5);
}

TEST(StepWire, EveryTruncationIsAnErrorNotACrash) {
  Example ex;
  const std::vector<char> bytes = encode_step(ex.step);
  for (size_t n = 0; n < bytes.size(); ++n) {
    Result<WireStep> got = decode_step(bytes.data(), n);
    ASSERT_FALSE(got.is_ok()) << "decoded from " << n << " of " << bytes.size() << " bytes";
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
  }
  std::vector<char> longer = bytes;
  longer.push_back(0);
  EXPECT_FALSE(decode_step(longer.data(), longer.size()).is_ok());
}

TEST(StepWire, CorruptBytesAreErrorsNotCrashes) {
  Example ex;
  const std::vector<char> bytes = encode_step(ex.step);
  // Every single byte set to 0xff in turn: decoding either fails cleanly or yields some step;
  // under the sanitizers nothing may read out of bounds or allocate without limit.
  int refused = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::vector<char> bad = bytes;
    bad[i] = static_cast<char>(0xff);
    if (!decode_step(bad.data(), bad.size()).is_ok()) ++refused;
  }
  EXPECT_GT(refused, 0);
  std::vector<char> wrong_magic = bytes;
  wrong_magic[0] ^= 1;
  Result<WireStep> got = decode_step(wrong_magic.data(), wrong_magic.size());
  ASSERT_FALSE(got.is_ok());
  EXPECT_NE(got.status().message().find("not a step of this build"), std::string::npos);
}

}  // namespace
}  // namespace m3
