// Checkpoint: format detection from dtypes and companion tensors, scale-shape checks, exact
// dequantisation through load_f32, and error messages that name the file and the tensor.
#include "loader/checkpoint.h"

#include <cmath>
#include <cstring>
#include <random>

#include "core/dtype.h"
#include "loader/safetensors_writer.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"
#include "test_util.h"

namespace m3 {
namespace {

using testing_util::contains;
using testing_util::make_temp_dir;

const std::string kL = "language_model.model.layers.3.";

std::vector<float> ramp(int64_t n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = scale * float((i * 7919) % 97 - 48) / 48.0f;
  return v;
}

void add_f32_scalar(SafetensorsWriter& w, const std::string& name, float v) {
  w.add(name, DType::kF32, {1}, &v, 4);
}

struct Fixture {
  std::string dir;
  Mxfp8Tensor mx;
  Nvfp4Tensor ct;  // compressed-tensors
  Nvfp4Tensor mo;  // ModelOpt
};

// A two-shard checkpoint with every supported format.
Fixture make_checkpoint() {
  Fixture f;
  f.dir = make_temp_dir();
  SafetensorsWriter s1, s2;
  s1.add_bf16("language_model.model.norm.weight", {8}, ramp(8, 1.0f));
  s1.add_f32(kL + "block_sparse_moe.e_score_correction_bias", {4}, {0.5f, -1, 2, 0});
  s1.add_f16(kL + "self_attn.q_norm.weight", {4}, {1, 2, 3, 4});
  f.mx = *quantize_mxfp8(ramp(64 * 32, 3.0f).data(), 64, 32);
  s2.add_u8(kL + "self_attn.q_proj.weight", DType::kF8E4M3, {64, 32}, f.mx.codes);
  s2.add_u8(kL + "self_attn.q_proj.weight_scale_inv", DType::kU8, {64, 1}, f.mx.scales);
  f.ct = *quantize_nvfp4(ramp(6 * 32, 2.0f).data(), 6, 32, Nvfp4GlobalScale::kDivide);
  const std::string e0 = kL + "block_sparse_moe.experts.0.w1.";
  s2.add_u8(e0 + "weight_packed", DType::kU8, {6, 16}, f.ct.packed);
  s2.add_u8(e0 + "weight_scale", DType::kF8E4M3, {6, 2}, f.ct.scales);
  add_f32_scalar(s2, e0 + "weight_global_scale", f.ct.global_scale);
  f.mo = *quantize_nvfp4(ramp(4 * 16, 0.5f).data(), 4, 16, Nvfp4GlobalScale::kMultiply);
  const std::string e1 = kL + "block_sparse_moe.experts.1.w2.";
  s1.add_u8(e1 + "weight", DType::kU8, {4, 8}, f.mo.packed);
  s1.add_u8(e1 + "weight_scale", DType::kF8E4M3, {4, 1}, f.mo.scales);
  add_f32_scalar(s1, e1 + "weight_scale_2", f.mo.global_scale);
  add_f32_scalar(s1, e1 + "input_scale", 123.0f);
  std::map<std::string, std::string> map;
  for (const std::string& n : s1.names()) map[n] = "model-00001-of-00002.safetensors";
  for (const std::string& n : s2.names()) map[n] = "model-00002-of-00002.safetensors";
  EXPECT_TRUE(s1.write(f.dir + "/model-00001-of-00002.safetensors").is_ok());
  EXPECT_TRUE(s2.write(f.dir + "/model-00002-of-00002.safetensors").is_ok());
  EXPECT_TRUE(write_safetensors_index(f.dir, map).is_ok());
  return f;
}

double ref_e4m3(int c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}

TEST(Checkpoint, DetectsEveryFormat) {
  Fixture f = make_checkpoint();
  Result<std::unique_ptr<Checkpoint>> c = Checkpoint::open(f.dir);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  const Checkpoint& ck = **c;
  EXPECT_TRUE(ck.check_all().is_ok()) << ck.check_all().message();
  const std::vector<std::string> want = {
      kL + "block_sparse_moe.e_score_correction_bias",
      kL + "block_sparse_moe.experts.0.w1.weight",
      kL + "block_sparse_moe.experts.1.w2.weight",
      kL + "self_attn.q_norm.weight",
      kL + "self_attn.q_proj.weight",
      "language_model.model.norm.weight",
  };
  EXPECT_EQ(ck.names(), want);  // companions (scales, input_scale) are not logical weights
  EXPECT_EQ(*ck.format("language_model.model.norm.weight"), WeightFormat::kBF16);
  EXPECT_EQ(*ck.format(want[0]), WeightFormat::kF32);
  EXPECT_EQ(*ck.format(want[3]), WeightFormat::kF16);
  EXPECT_EQ(*ck.format(want[4]), WeightFormat::kMxfp8);
  EXPECT_EQ(*ck.format(want[1]), WeightFormat::kNvfp4Compressed);
  EXPECT_EQ(*ck.format(want[2]), WeightFormat::kNvfp4ModelOpt);
  EXPECT_EQ(*ck.shape(want[1]), (std::vector<int64_t>{6, 32}));  // [out, 2 * packed cols]
  EXPECT_EQ(*ck.shape(want[2]), (std::vector<int64_t>{4, 16}));
  EXPECT_FALSE(ck.has(kL + "self_attn.q_proj.weight_scale_inv"));
  EXPECT_EQ(ck.format("nope").status().code(), StatusCode::kNotFound);
}

TEST(Checkpoint, LoadF32DequantisesExactly) {
  Fixture f = make_checkpoint();
  std::unique_ptr<Checkpoint> c = Checkpoint::open(f.dir).value();
  // MXFP8 against an independent double formula (exact in float).
  Result<HostTensorF32> q = c->load_f32(kL + "self_attn.q_proj.weight", {64, 32});
  ASSERT_TRUE(q.is_ok()) << q.status().to_string();
  for (int64_t i = 0; i < 64 * 32; ++i) {
    const double want = std::ldexp(ref_e4m3(f.mx.codes[i]), f.mx.scales[i / 32] - 127);
    ASSERT_EQ(q->data[size_t(i)], float(want)) << i;
  }
  // NVFP4 compressed: code * (scale / global) (the defined order), ModelOpt: code * (scale * g2).
  Result<HostTensorF32> e0 = c->load_f32(kL + "block_sparse_moe.experts.0.w1.weight", {6, 32});
  ASSERT_TRUE(e0.is_ok()) << e0.status().to_string();
  for (int64_t i = 0; i < 6 * 32; ++i) {
    const uint8_t byte = f.ct.packed[size_t(i / 2)];
    const float factor = float(ref_e4m3(f.ct.scales[size_t(i / 16)])) / f.ct.global_scale;
    ASSERT_EQ(e0->data[size_t(i)], e2m1_to_f32(i % 2 ? byte >> 4 : byte & 0xF) * factor) << i;
  }
  Result<HostTensorF32> e1 = c->load_f32(kL + "block_sparse_moe.experts.1.w2.weight", {4, 16});
  ASSERT_TRUE(e1.is_ok()) << e1.status().to_string();
  for (int64_t i = 0; i < 4 * 16; ++i) {
    const uint8_t byte = f.mo.packed[size_t(i / 2)];
    const float factor = float(ref_e4m3(f.mo.scales[size_t(i / 16)])) * f.mo.global_scale;
    ASSERT_EQ(e1->data[size_t(i)], e2m1_to_f32(i % 2 ? byte >> 4 : byte & 0xF) * factor) << i;
  }
  // Plain formats.
  Result<HostTensorF32> n = c->load_f32("language_model.model.norm.weight", {8});
  ASSERT_TRUE(n.is_ok());
  const std::vector<float> r = ramp(8, 1.0f);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(n->data[size_t(i)], bf16_to_f32(f32_to_bf16(r[size_t(i)])));
  Result<HostTensorF32> h = c->load_f32(kL + "self_attn.q_norm.weight", {4});
  EXPECT_EQ(h->data, (std::vector<float>{1, 2, 3, 4}));
  Result<HostTensorF32> b = c->load_f32(kL + "block_sparse_moe.e_score_correction_bias", {4});
  EXPECT_EQ(b->data, (std::vector<float>{0.5f, -1, 2, 0}));
}

TEST(Checkpoint, ShapeMismatchNamesFileAndTensor) {
  const std::string dir = make_temp_dir();
  SafetensorsWriter s1, s2;
  s1.add_f32("a", {1}, {1});
  s2.add_bf16(kL + "self_attn.q_proj.weight", {64, 16}, std::vector<float>(64 * 16, 1.0f));
  ASSERT_TRUE(s1.write(dir + "/model-00001-of-00002.safetensors").is_ok());
  ASSERT_TRUE(s2.write(dir + "/model-00002-of-00002.safetensors").is_ok());
  ASSERT_TRUE(write_safetensors_index(dir, {{"a", "model-00001-of-00002.safetensors"},
                                            {kL + "self_attn.q_proj.weight",
                                             "model-00002-of-00002.safetensors"}})
                  .is_ok());
  std::unique_ptr<Checkpoint> c = Checkpoint::open(dir).value();
  Result<HostTensorF32> t = c->load_f32(kL + "self_attn.q_proj.weight", {64, 32});
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().message(),
            "model-00002-of-00002.safetensors: tensor "
            "'language_model.model.layers.3.self_attn.q_proj.weight': expected shape [64,32], "
            "found [64,16]");
}

// Opens a single-file checkpoint made by `fill`.
std::unique_ptr<Checkpoint> open_with(const std::function<void(SafetensorsWriter&)>& fill) {
  const std::string dir = make_temp_dir();
  SafetensorsWriter w;
  fill(w);
  EXPECT_TRUE(w.write(dir + "/model.safetensors").is_ok());
  Result<std::unique_ptr<Checkpoint>> c = Checkpoint::open(dir);
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  return std::move(c).value();
}

void expect_error(const Checkpoint& c, const std::string& name, const std::string& want) {
  EXPECT_TRUE(c.has(name)) << name;
  Result<WeightFormat> f = c.format(name);
  ASSERT_FALSE(f.is_ok()) << name;
  EXPECT_TRUE(contains(f.status().message(), "model.safetensors: tensor '")) << f.status().message();
  EXPECT_TRUE(contains(f.status().message(), want)) << f.status().message() << "\nwant: " << want;
  EXPECT_FALSE(c.load_f32_any(name).is_ok());
  EXPECT_TRUE(contains(c.check_all().message(), want));
}

TEST(Checkpoint, Mxfp8InputDimNotDivisible) {
  auto c = open_with([](SafetensorsWriter& w) {
    w.add_u8("x.weight", DType::kF8E4M3, {4, 48}, std::vector<uint8_t>(4 * 48, 0x38));
    w.add_u8("x.weight_scale_inv", DType::kU8, {4, 1}, std::vector<uint8_t>(4, 127));
  });
  expect_error(*c, "x.weight",
               "tensor 'x.weight': input dimension 48 of logical shape [4,48] is not divisible by "
               "the MXFP8 block size 32");
}

TEST(Checkpoint, WrongScaleShapeNamesScaleTensor) {
  auto c = open_with([](SafetensorsWriter& w) {
    w.add_u8("x.weight", DType::kF8E4M3, {4, 64}, std::vector<uint8_t>(4 * 64, 0x38));
    w.add_u8("x.weight_scale_inv", DType::kU8, {4, 3}, std::vector<uint8_t>(12, 127));
    w.add_u8("y.weight_packed", DType::kU8, {2, 16}, std::vector<uint8_t>(32, 0x11));
    w.add_u8("y.weight_scale", DType::kF8E4M3, {2, 1}, std::vector<uint8_t>(2, 0x38));
    add_f32_scalar(w, "y.weight_global_scale", 1.0f);
    w.add_u8("z.weight_packed", DType::kU8, {2, 8}, std::vector<uint8_t>(16, 0x11));
    w.add_u8("z.weight_scale", DType::kU8, {2, 1}, std::vector<uint8_t>(2, 0x38));
    add_f32_scalar(w, "z.weight_global_scale", 1.0f);
  });
  expect_error(*c, "x.weight",
               "tensor 'x.weight_scale_inv': expected shape [4,2] for the MXFP8 scales of "
               "'x.weight' [4,64], found [4,3]");
  expect_error(*c, "y.weight", "tensor 'y.weight_scale': expected shape [2,2]");
  expect_error(*c, "z.weight", "tensor 'z.weight_scale': NVFP4 scales must be F8_E4M3, found U8");
}

TEST(Checkpoint, MissingCompanionsAndConflicts) {
  auto c = open_with([](SafetensorsWriter& w) {
    w.add_u8("a.weight", DType::kF8E4M3, {2, 32}, std::vector<uint8_t>(64, 0x38));
    w.add_u8("b.weight", DType::kF8E4M3, {2, 32}, std::vector<uint8_t>(64, 0x38));
    add_f32_scalar(w, "b.weight_scale", 1.0f);
    w.add_u8("c.weight_packed", DType::kU8, {2, 8}, std::vector<uint8_t>(16, 0));
    w.add_u8("c.weight_scale", DType::kF8E4M3, {2, 1}, std::vector<uint8_t>(2, 0x38));
    w.add_u8("d.weight", DType::kU8, {2, 8}, std::vector<uint8_t>(16, 0));
    w.add_u8("e.weight_packed", DType::kU8, {2, 8}, std::vector<uint8_t>(16, 0));
    w.add_u8("e.weight_scale", DType::kF8E4M3, {2, 1}, std::vector<uint8_t>(2, 0x38));
    w.add_f32("e.weight_global_scale", {2}, {1, 1});
    w.add("f.weight", DType::kI64, {2}, std::vector<int64_t>{1, 2}.data(), 16);
    add_f32_scalar(w, "orphan.weight_scale_2", 1.0f);
  });
  expect_error(*c, "a.weight", "F8_E4M3 weight without 'a.weight_scale_inv'");
  Result<WeightFormat> b = c->format("b.weight");
  EXPECT_EQ(b.status().code(), StatusCode::kUnimplemented);
  expect_error(*c, "c.weight", "needs 'c.weight_scale' and 'c.weight_global_scale'");
  expect_error(*c, "d.weight", "U8 weight is not NVFP4 (ModelOpt)");
  expect_error(*c, "e.weight", "tensor 'e.weight_global_scale': expected one F32 value");
  expect_error(*c, "f.weight", "dtype I64 is not a supported weight format");
  EXPECT_TRUE(contains(c->check_all().message(),
                       "tensor 'orphan.weight_scale_2': scale tensor belongs to no quantised"));
}

TEST(Checkpoint, RawZeroCopyAccess) {
  Fixture f = make_checkpoint();
  std::unique_ptr<Checkpoint> c = Checkpoint::open(f.dir).value();
  Result<TensorView> s = c->raw(kL + "self_attn.q_proj.weight_scale_inv");
  ASSERT_TRUE(s.is_ok());
  EXPECT_EQ(s->dtype, DType::kU8);
  EXPECT_EQ(s->shape, (std::vector<int64_t>{64, 1}));
  EXPECT_EQ(std::memcmp(s->data, f.mx.scales.data(), 64), 0);
  EXPECT_TRUE(contains(s->file, "model-00002-of-00002.safetensors"));
  Result<StoredWeight> w = c->stored(kL + "block_sparse_moe.experts.0.w1.weight");
  ASSERT_TRUE(w.is_ok());
  EXPECT_EQ(w->data_name, kL + "block_sparse_moe.experts.0.w1.weight_packed");
  EXPECT_EQ(w->data.shape, (std::vector<int64_t>{6, 16}));
  EXPECT_EQ(w->scale.dtype, DType::kF8E4M3);
  EXPECT_EQ(w->global_scale_name, kL + "block_sparse_moe.experts.0.w1.weight_global_scale");
  EXPECT_FALSE(c->raw("missing").is_ok());
}

}  // namespace
}  // namespace m3
