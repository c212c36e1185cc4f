// The CPU vision path against transformers' minimax_m3_vl (tests/fixtures/vision_golden/, made by
// tools/reference/vision_golden.py; format in tools/reference/README.md). M3_VISION_GOLDEN_DIR
// overrides the fixture directory. A missing file is a failure, never a skip.
//
// Bounds (error model):
//  * decoding: PIL and our decoders (libpng, libjpeg-turbo with the default integer IDCT, libwebp;
//    EXIF orientation applied) give the same bytes: exact (a checksum for the large images);
//  * pixel values against the processor: our resize is torchvision's uint8 bicubic arithmetic
//    (integer, exact) and the normalisation the processor's float32 expression: bitwise;
//  * tower and projector (fed the processor's own pixel values): every value is a chain of a
//    few float32 dot products of length <= 1176 through LayerNorms; float32 rounding of either
//    side is ~sqrt(K) 2^-24 ~ 2e-6 relative per dot, ~1e-5 through 2 layers; bound 1e-4 of the
//    row's scale (max(1, max|ref|));
//  * logits: the text goldens' 5e-5 of the row scale (golden_fixture.h), argmax where the
//    reference margin exceeds twice that; checked twice, with the reference's own projector
//    outputs as the image features (the text side alone) and with ours (the whole path);
//  * the real vision shapes with hashed weights: see the last test.
// The reference's vision RoPE must be the three-axis one (manifest.json's summary.vision_rope):
// transformers 5.17.0's is not (see the test below), and vision_golden.py patches it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>

#include "backend/cpu/cpu_backend.h"
#include "golden_fixture.h"
#include "loader/checkpoint.h"
#include "loader/weight_source.h"
#include "loader/vision_config.h"
#include "model/minimax_m3/model_dir.h"
#include "model/minimax_m3/vision_tower.h"
#include "server/media/image_decode.h"
#include "server/media/image_preprocess.h"

namespace m3 {
namespace {

using golden::json;
namespace fs = std::filesystem;

fs::path fixture_dir() {
  if (const char* d = std::getenv("M3_VISION_GOLDEN_DIR"); d != nullptr && *d != '\0') return d;
  return golden::repo_root() / "tests" / "fixtures" / "vision_golden";
}

// The bytes of a fixture file; fails the test (fatal in the caller via ASSERT_NO_FATAL_FAILURE).
void read_file(const fs::path& p, std::string* out) {
  ASSERT_TRUE(fs::exists(p)) << "vision golden file missing: " << p;
  std::ifstream in(p, std::ios::binary);
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

template <typename T>
std::span<const T> view(const std::string& bytes, int64_t offset, int64_t count,
                        const std::string& what) {
  const size_t end = size_t(offset + count) * sizeof(T);
  EXPECT_LE(end, bytes.size()) << what << ": file too short";
  if (offset < 0 || end > bytes.size()) return {};
  return {reinterpret_cast<const T*>(bytes.data()) + offset, size_t(count)};
}

struct Processor {
  json meta;
  std::string decoded, levels, values;
  std::array<float, 3> m{}, s{};  // the processor's fused normalisation: 255 mean, 255 std
  int patch_values = 0;
};

void load_processor(Processor* p) {
  const fs::path d = fixture_dir();
  std::string text;
  ASSERT_NO_FATAL_FAILURE(read_file(d / "processor.json", &text));
  p->meta = json::parse(text);
  ASSERT_NO_FATAL_FAILURE(read_file(d / "decoded.u8", &p->decoded));
  ASSERT_NO_FATAL_FAILURE(read_file(d / "pixel_levels.u8", &p->levels));
  ASSERT_NO_FATAL_FAILURE(read_file(d / "pixel_values.f32", &p->values));
  for (int c = 0; c < 3; ++c) {
    p->m[size_t(c)] = float(p->meta["image_mean"][size_t(c)].get<double>()) * 255.0f;
    p->s[size_t(c)] = float(p->meta["image_std"][size_t(c)].get<double>()) * 255.0f;
  }
  const int P = p->meta["patch_size"], T = p->meta["temporal_patch_size"];
  p->patch_values = 3 * T * P * P;
}

// The processor's float32 pixel values from its uint8 levels ((x - 255 mean) / (255 std)).
std::vector<float> hf_values(const Processor& p, const json& e) {
  const int64_t n = e["num_patches"].get<int64_t>() * p.patch_values;
  auto lv = view<uint8_t>(p.levels, e["levels_offset"], n, "pixel_levels.u8");
  std::vector<float> v(size_t(lv.size()));
  const int per_channel = p.patch_values / 3;
  for (size_t i = 0; i < lv.size(); ++i) {
    const size_t c = (i % size_t(p.patch_values)) / size_t(per_channel);
    v[i] = (float(lv[i]) - p.m[c]) / p.s[c];
  }
  return v;
}

// The fixture's checksum of bytes too large to store (vision_golden.py's poly_hash):
// sum_i (b_i + 1) * P^i mod 2^64 with P the FNV-64 prime, as 16 hex digits.
std::string poly_hash(std::span<const uint8_t> bytes) {
  uint64_t h = 0, power = 1;
  for (uint8_t b : bytes) {
    h += (uint64_t(b) + 1) * power;
    power *= 0x100000001B3ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

// The image set the vision issue names: tiny, strip, square, photo and camera sizes, portrait,
// RGBA, grayscale, palette, EXIF-rotated JPEG, WebP lossless and lossy.
constexpr const char* kRequiredImages[] = {
    "one_1x1",       "strip_27x500",   "square_224x224", "photo_1000x700", "huge_4000x3000",
    "tall_20x300",   "rgba_61x45",     "gray_90x70",     "palette_50x80",  "exif6_90x60",
    "exif3_64x40",   "jpeg_123x77"};

TEST(VisionGolden, ProcessorMatchesTransformers) {
  Processor p;
  ASSERT_NO_FATAL_FAILURE(load_processor(&p));
  ASSERT_FALSE(p.meta["images"].empty());
  for (const char* want : kRequiredImages) {
    bool present = false;
    for (const json& e : p.meta["images"]) present |= e["name"] == want;
    EXPECT_TRUE(present) << "the fixture lacks the image " << want
                         << " (left out by vision_golden.py: " << p.meta.value("left_out", json::array()).dump() << ")";
  }
  server::VisionPreprocessConfig cfg;
  cfg.patch_size = p.meta["patch_size"];
  cfg.temporal_patch_size = p.meta["temporal_patch_size"];
  cfg.merge_size = p.meta["merge_size"];
  for (int c = 0; c < 3; ++c) {
    cfg.mean[size_t(c)] = float(p.meta["image_mean"][size_t(c)].get<double>());
    cfg.std[size_t(c)] = float(p.meta["image_std"][size_t(c)].get<double>());
  }
  const int per_channel = p.patch_values / 3;
  for (const json& e : p.meta["images"]) {
    const std::string name = e["name"];
    std::string bytes;
    ASSERT_NO_FATAL_FAILURE(read_file(fixture_dir() / "images" / e["file"].get<std::string>(), &bytes));
    auto dec = server::decode_image(bytes, server::ImageLimits{}, "image");
    ASSERT_TRUE(std::holds_alternative<server::RgbImage>(dec)) << name << ": not decoded";
    const server::RgbImage& img = std::get<server::RgbImage>(dec);
    // The size after EXIF orientation (stored_width x stored_height before it).
    ASSERT_EQ(img.width, e["width"].get<int>()) << name;
    ASSERT_EQ(img.height, e["height"].get<int>()) << name;
    // 1. Decoding: PIL's convert("RGB") bytes (EXIF orientation applied), or their checksum.
    if (e["decoded_offset"].get<int64_t>() >= 0) {
      auto want_dec = view<uint8_t>(p.decoded, e["decoded_offset"], int64_t(img.pixels.size()), name);
      int64_t dec_diff = 0;
      for (size_t i = 0; i < want_dec.size(); ++i) dec_diff += img.pixels[i] != want_dec[i];
      EXPECT_EQ(dec_diff, 0) << name << ": decoded bytes differ from PIL's";
    } else {
      EXPECT_EQ(poly_hash(img.pixels), e["decoded_hash"].get<std::string>())
          << name << ": decoded bytes differ from PIL's";
    }
    // 2. The whole pre-processing against the processor's pixel values and grid.
    server::PreprocessOverrides ov;
    if (!e["max_pixels"].is_null()) ov.max_pixels = e["max_pixels"].get<int64_t>();
    auto pre = server::preprocess_image(img, cfg, ov, "image");
    ASSERT_TRUE(std::holds_alternative<server::PixelPatches>(pre)) << name;
    const server::PixelPatches& ours = std::get<server::PixelPatches>(pre);
    EXPECT_EQ(ours.grid_t, e["grid_thw"][0].get<int>()) << name;
    EXPECT_EQ(ours.grid_h, e["grid_thw"][1].get<int>()) << name;
    EXPECT_EQ(ours.grid_w, e["grid_thw"][2].get<int>()) << name;
    if (ours.grid_h != e["grid_thw"][1].get<int>() || ours.grid_w != e["grid_thw"][2].get<int>())
      continue;
    ASSERT_EQ(int64_t(ours.values.size()), e["num_patches"].get<int64_t>() * p.patch_values) << name;
    // The levels, hence the values, are exact: our resize is torchvision's integer arithmetic and
    // the normalisation the processor's float32 expression.
    if (e["levels_offset"].get<int64_t>() >= 0) {
      const std::vector<float> hf = hf_values(p, e);
      ASSERT_EQ(ours.values.size(), hf.size()) << name;
      if (e["values_offset"].get<int64_t>() >= 0) {  // the stored float32 values: bit-exact levels
        auto fv = view<float>(p.values, e["values_offset"], int64_t(hf.size()), name);
        int64_t bad = 0;
        for (size_t i = 0; i < fv.size(); ++i) bad += fv[i] != hf[i];
        EXPECT_EQ(bad, 0) << name << ": pixel_levels.u8 does not reproduce pixel_values.f32";
      }
      int64_t off = 0;
      double worst = 0;
      for (size_t i = 0; i < hf.size(); ++i) {
        off += ours.values[i] != hf[i];
        worst = std::max(worst, std::fabs(double(ours.values[i]) - hf[i]));
      }
      EXPECT_EQ(off, 0) << name << ": " << off << " of " << hf.size()
                        << " pixel values differ from the processor's, by up to " << worst;
      std::printf("%-16s grid %dx%d: %zu values, %lld off the processor's\n", name.c_str(),
                  ours.grid_h, ours.grid_w, hf.size(), static_cast<long long>(off));
    } else {
      // Only a checksum of the processor's levels: recover ours from our values (each must give
      // its value back bitwise through the processor's expression) and compare checksums.
      std::vector<uint8_t> levels(ours.values.size());
      int64_t not_a_level = 0;
      for (size_t i = 0; i < ours.values.size(); ++i) {
        const size_t c = (i % size_t(p.patch_values)) / size_t(per_channel);
        const float lv = std::nearbyint(ours.values[i] * p.s[c] + p.m[c]);
        levels[i] = uint8_t(std::clamp(lv, 0.0f, 255.0f));
        not_a_level += (float(levels[i]) - p.m[c]) / p.s[c] != ours.values[i];
      }
      EXPECT_EQ(not_a_level, 0) << name;
      EXPECT_EQ(poly_hash(levels), e["levels_hash"].get<std::string>())
          << name << ": pixel values differ from the processor's";
      std::printf("%-16s grid %dx%d: %zu values, checksum %s the processor's\n", name.c_str(),
                  ours.grid_h, ours.grid_w, ours.values.size(),
                  poly_hash(levels) == e["levels_hash"].get<std::string>() ? "equals" : "DIFFERS from");
    }
  }
}

// The model part of the fixture (tower, projector and logits of a small model) is compiled in
// when its files are there at configure time (M3_VISION_GOLDEN_MODEL); the processor part above
// needs only the processor's files.
#ifdef M3_VISION_GOLDEN_MODEL
const json* find_image(const Processor& p, const std::string& name) {
  for (const json& e : p.meta["images"])
    if (e["name"] == name) return &e;
  return nullptr;
}

void expect_rows_close(std::span<const float> ours, std::span<const float> ref, int64_t width,
                       double rel, const std::string& what) {
  ASSERT_EQ(ours.size(), ref.size()) << what;
  double worst = 0;
  int64_t worst_at = -1;
  for (int64_t r = 0; r * width < int64_t(ref.size()); ++r) {
    double scale = 1.0;
    for (int64_t j = 0; j < width; ++j) scale = std::max(scale, double(std::fabs(ref[size_t(r * width + j)])));
    for (int64_t j = 0; j < width; ++j) {
      const size_t i = size_t(r * width + j);
      const double ratio = std::fabs(double(ours[i]) - ref[i]) / (rel * scale);
      if (ratio > worst) worst = ratio, worst_at = int64_t(i);
    }
  }
  EXPECT_LE(worst, 1.0) << what << ": worst at " << worst_at << " ours " << ours[size_t(worst_at)]
                        << " ref " << ref[size_t(worst_at)];
  std::printf("%s: worst |ours - ref| is %.3f of the bound\n", what.c_str(), worst);
}

// The small text model's logits for the fixture's prompt with `features` (one text-hidden row per
// image placeholder, in prompt order) in place of the placeholders' embeddings, against HF's.
void check_logits(const std::string& mdir, const json& ex, const std::string& logits_b,
                  std::span<const float> features, int64_t Ht, const std::string& what) {
  CpuBackend backend(2);
  auto loaded = minimax_m3::load_model_dir(mdir, &backend);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  const std::vector<int32_t> ids = ex["ids"].get<std::vector<int32_t>>();
  const int64_t n = int64_t(ids.size()), V = ex["vocab"];
  const int64_t pages = golden::pages_for(loaded->config, n);
  minimax_m3::PagedKvCache cache(&backend, loaded->config, pages);
  testing::SimplePagePool pool(pages);
  testing::SequenceRunner runner(loaded->model.get(), &cache, &pool);
  ASSERT_TRUE(runner.reserve(n).is_ok());
  minimax_m3::SequenceInput in;
  in.tokens = ids;
  in.block_table = runner.block_table();
  for (int64_t i = 0; i < n; ++i) in.logits_rows.push_back(int32_t(i));
  const int32_t img = ex["image_token_id"];
  size_t next = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (ids[size_t(i)] != img) continue;
    ASSERT_LE((next + 1) * size_t(Ht), features.size()) << "more placeholders than features";
    in.embeddings.push_back({int32_t(i), std::span<const float>(features).subspan(next * size_t(Ht), size_t(Ht))});
    ++next;
  }
  ASSERT_EQ(next * size_t(Ht), features.size()) << "placeholders and image features differ";
  minimax_m3::ForwardOutput out;
  Status s = loaded->model->forward(std::span<const minimax_m3::SequenceInput>(&in, 1), &cache, &out);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  ASSERT_EQ(int64_t(out.logits[0].size()), n * V);
  auto ref = view<float>(logits_b, 0, n * V, "logits.f32");
  expect_rows_close(out.logits[0], ref, V, golden::kRelTol, what);
  int compared = 0;
  for (int64_t t = 0; t < n; ++t) {
    double scale = 1.0;
    for (int64_t j = 0; j < V; ++j) scale = std::max(scale, double(std::fabs(ref[size_t(t * V + j)])));
    if (ex["argmax_margin"][size_t(t)].get<double>() <= 2 * golden::kRelTol * scale) continue;
    const auto row = std::span<const float>(out.logits[0]).subspan(size_t(t * V), size_t(V));
    EXPECT_EQ(testing::argmax(row), ex["argmax"][size_t(t)].get<int32_t>()) << what << ": position " << t;
    ++compared;
  }
  EXPECT_GT(compared, int(n / 2)) << "too few positions with a clear argmax";
}

TEST(VisionGolden, TowerProjectorAndLogitsMatchTransformers) {
  Processor p;
  ASSERT_NO_FATAL_FAILURE(load_processor(&p));
  const fs::path d = fixture_dir();
  std::string text, tower_b, proj_b, logits_b;
  ASSERT_NO_FATAL_FAILURE(read_file(d / "model_expected.json", &text));
  const json ex = json::parse(text);
  ASSERT_NO_FATAL_FAILURE(read_file(d / "tower.f32", &tower_b));
  ASSERT_NO_FATAL_FAILURE(read_file(d / "projector.f32", &proj_b));
  ASSERT_NO_FATAL_FAILURE(read_file(d / "logits.f32", &logits_b));
  // The reference's vision RoPE must be the three-axis one our tower implements (and the released
  // checkpoint was trained with). transformers 5.17.0's MiniMaxM3VLVisionRotaryEmbedding is not:
  // it rotates all 80 head dims with 20 frequencies (theta^(-2j/40)) per axis for the first two
  // columns (t, h) of the (t, h, w) position ids, so the width is dropped (a regression of
  // transformers PR #48105). A fixture made with it matched a numpy model of exactly that to 2e-6
  // of the row scale and misses ours by ~0.6; vision_golden.py now patches the class when the
  // installed one is not the three-axis ladder and records which in manifest.json.
  {
    std::string mtext;
    ASSERT_NO_FATAL_FAILURE(read_file(d / "manifest.json", &mtext));
    const json man = json::parse(mtext);
    const std::string rope = man.contains("summary") && man["summary"].is_object()
                                 ? man["summary"].value("vision_rope", std::string())
                                 : std::string();
    EXPECT_EQ(rope.rfind("three-axis", 0), 0u)
        << "the fixture's reference vision RoPE is '" << (rope.empty() ? "(not recorded)" : rope)
        << "'; a fixture from transformers 5.17.0 without the patch in vision_golden.py has the "
           "2-axis (t, h) RoPE, which the released checkpoint does not use: regenerate it";
  }
  const std::string mdir = (d / "model").string();
  for (const char* f : {"config.json", "model.safetensors"})
    ASSERT_TRUE(fs::exists(d / "model" / f)) << "vision golden file missing: " << (d / "model" / f);

  auto vc = load_vision_config(mdir);
  ASSERT_TRUE(vc.is_ok()) << vc.status().to_string();
  ASSERT_TRUE(vc->has_value()) << mdir << ": no vision_config";
  auto ckpt = Checkpoint::open(mdir);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  auto vw = load_vision_weights(**ckpt, **vc);
  ASSERT_TRUE(vw.is_ok()) << vw.status().to_string();
  VisionTower tower(**vc, std::move(*vw));

  const int64_t Hv = ex["tower_hidden"], Ht = ex["text_hidden"];
  int64_t tower_row = 0, proj_row = 0;
  std::vector<float> features;  // every image's projector output, in prompt order
  for (size_t k = 0; k < ex["images"].size(); ++k) {
    const std::string name = ex["images"][k];
    const json* e = find_image(p, name);
    ASSERT_NE(e, nullptr) << name << " is not in processor.json";
    const std::vector<float> pixels = hf_values(p, *e);
    const auto& g = ex["grid_thw"][k];
    auto st = tower.encode_stages(pixels, g[0], g[1], g[2]);
    ASSERT_TRUE(st.is_ok()) << st.status().to_string();
    const int64_t tr = ex["tower_rows"][k], pr = ex["projector_rows"][k];
    expect_rows_close(st->tower, view<float>(tower_b, tower_row * Hv, tr * Hv, "tower.f32"), Hv,
                      1e-4, name + " tower");
    expect_rows_close(st->output, view<float>(proj_b, proj_row * Ht, pr * Ht, "projector.f32"), Ht,
                      1e-4, name + " projector");
    features.insert(features.end(), st->output.begin(), st->output.end());
    tower_row += tr;
    proj_row += pr;
  }

  // The text side alone: HF's own projector outputs as the image features. Then the whole path.
  check_logits(mdir, ex, logits_b, view<float>(proj_b, 0, int64_t(features.size()), "projector.f32"),
               Ht, "logits from the reference's image features");
  check_logits(mdir, ex, logits_b, features, Ht, "logits");
}

// The real vision shapes (32 layers, hidden 1280, projector 6144) with weights from
// vision_golden.py's counter hash (hash_weight: exactly representable float32 values, no weights
// in the fixture), on one image; real_shape.json holds transformers' tower and projector outputs
// in part (rows, columns, sums). The same float32 dots as above through 32 layers instead of 2:
// |Δ| <= ~sqrt(K) 2^-24 relative per dot (K <= 5120: 4.3e-6), growing at most linearly over the
// ~6 ops in series per layer (~200 in all, 8.6e-4), so the bound is 1e-3 of the output's largest
// magnitude; the sums of |values| to 1e-4 relative.
uint32_t golden_hash(uint64_t idx, uint32_t tensor_no, uint32_t seed) {
  uint32_t x = static_cast<uint32_t>(idx * 0x9E3779B1ull + (uint64_t{tensor_no} + 1) * 0x85EBCA77ull + seed);
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  return x ^ (x >> 16);
}

// vision_golden.py's hash_weight for the tensors of real_shape.json's weight_order, generated
// when the loader asks for one.
class HashedVisionWeights final : public WeightSource {
 public:
  HashedVisionWeights(std::vector<std::string> order, uint32_t seed)
      : order_(std::move(order)), seed_(seed) {}
  bool has(const std::string& name) const override { return index(name) >= 0; }
  Result<WeightFormat> format(const std::string& name) const override {
    if (!has(name)) return not_found(name);
    return WeightFormat::kF32;
  }
  std::vector<std::string> names() const override { return order_; }
  Result<HostTensorF32> load_f32(const std::string& name,
                                 const std::vector<int64_t>& shape) const override {
    const int64_t no = index(name);
    if (no < 0) return not_found(name);
    HostTensorF32 t;
    t.shape = shape;
    t.data.resize(size_t(t.numel()));
    const bool ln_weight = shape.size() == 1 && name.ends_with(".weight") &&
                           (name.find("layer_norm") != std::string::npos ||
                            name.find("layrnorm") != std::string::npos);
    double step = 0;  // linear weights: 2^(-23 - e), 2^-e the power of two nearest sqrt(3 / fan_in)
    if (shape.size() >= 2) {
      int64_t fan_in = 1;
      for (size_t i = 1; i < shape.size(); ++i) fan_in *= shape[i];
      // Python's round(): half to even, as nearbyint in the default rounding mode.
      const double e = std::nearbyint(-std::log2(std::sqrt(3.0 / double(fan_in))));
      step = std::ldexp(1.0, int(-23 - e));
    }
    for (size_t i = 0; i < t.data.size(); ++i) {
      const uint32_t h = golden_hash(i, uint32_t(no), seed_);
      if (ln_weight) {
        t.data[i] = float(1.0 + (double(h >> 20) - 2048.0) * std::ldexp(1.0, -14));
      } else if (shape.size() == 1) {
        t.data[i] = float((double(h >> 8) - double(1 << 23)) * std::ldexp(1.0, -27));
      } else {
        t.data[i] = float((double(h >> 8) - double(1 << 23)) * step);
      }
    }
    return t;
  }

 private:
  int64_t index(const std::string& name) const {
    for (size_t i = 0; i < order_.size(); ++i)
      if (order_[i] == name) return int64_t(i);
    return -1;
  }
  std::vector<std::string> order_;
  uint32_t seed_;
};

void expect_close_to(std::span<const float> ours, const json& ref, double bound,
                     const std::string& what) {
  ASSERT_EQ(ours.size(), ref.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    const double d = std::fabs(double(ours[i]) - ref[i].get<double>());
    EXPECT_LE(d, bound) << what << " [" << i << "]: ours " << ours[i] << " ref " << ref[i];
    worst = std::max(worst, d / bound);
  }
  std::printf("%s: worst |ours - ref| is %.3f of the bound\n", what.c_str(), worst);
}

// Rows, columns and sums of `out` ([rows, width]) against real_shape.json's `stats`.
void expect_stats(const std::vector<float>& out, int64_t width, const json& stats,
                  const std::string& what) {
  const int64_t rows = int64_t(out.size()) / width;
  ASSERT_EQ(stats["shape"][0].get<int64_t>(), rows) << what;
  ASSERT_EQ(stats["shape"][1].get<int64_t>(), width) << what;
  const double bound = 1e-3 * stats["max_abs"].get<double>();
  const std::span<const float> all(out);
  expect_close_to(all.subspan(0, 16), stats["row0_first16"], bound, what + " row 0");
  expect_close_to(all.subspan(size_t((rows - 1) * width), 16), stats["row_last_first16"], bound,
                  what + " last row");
  std::vector<float> col0(static_cast<size_t>(rows));
  double sum_abs = 0;
  for (int64_t r = 0; r < rows; ++r) col0[size_t(r)] = out[size_t(r * width)];
  for (float v : out) sum_abs += std::fabs(double(v));
  expect_close_to(col0, stats["col0"], bound, what + " column 0");
  const double want = stats["sum_abs"].get<double>();
  EXPECT_NEAR(sum_abs, want, 1e-4 * want) << what << ": sum of |values|";
}

TEST(VisionGolden, RealShapesWithHashedWeightsMatchTransformers) {
  Processor p;
  ASSERT_NO_FATAL_FAILURE(load_processor(&p));
  std::string text;
  ASSERT_NO_FATAL_FAILURE(read_file(fixture_dir() / "real_shape.json", &text));
  const json rs = json::parse(text);
  ASSERT_FALSE(rs["smoke"].get<bool>()) << "real_shape.json is from a --smoke run (2 layers)";
  VisionConfig c;
  const json& vd = rs["vision_config"];
  c.hidden_size = vd["hidden_size"];
  c.intermediate_size = vd["intermediate_size"];
  c.num_hidden_layers = vd["num_hidden_layers"];
  c.num_attention_heads = vd["num_attention_heads"];
  c.patch_size = vd["patch_size"];
  c.temporal_patch_size = vd["temporal_patch_size"];
  c.spatial_merge_size = vd["spatial_merge_size"];
  c.num_channels = vd["num_channels"];
  c.layer_norm_eps = vd["layer_norm_eps"];
  c.projector_hidden_size = vd["projector_hidden_size"];
  c.text_hidden_size = rs["text_hidden_size"];
  HashedVisionWeights src(rs["weight_order"].get<std::vector<std::string>>(),
                          rs["weight_seed"].get<uint32_t>());
  auto vw = load_vision_weights(src, c);
  ASSERT_TRUE(vw.is_ok()) << vw.status().to_string();
  CpuBackend backend(2);
  VisionTower tower(c, std::move(*vw), &backend);
  const json* e = find_image(p, rs["image"].get<std::string>());
  ASSERT_NE(e, nullptr) << rs["image"] << " is not in processor.json";
  const std::vector<float> pixels = hf_values(p, *e);
  const auto& g = rs["grid_thw"];
  auto st = tower.encode_stages(pixels, g[0], g[1], g[2]);
  ASSERT_TRUE(st.is_ok()) << st.status().to_string();
  expect_stats(st->tower, c.hidden_size, rs["tower"], "real-shape tower");
  expect_stats(st->output, c.text_hidden_size, rs["projector"], "real-shape projector");
  const double bound = 1e-3 * rs["projector"]["max_abs"].get<double>();
  expect_close_to(std::span<const float>(st->output).subspan(0, size_t(c.text_hidden_size)),
                  rs["projector_row0"], bound, "real-shape projector row 0");
}

#endif  // M3_VISION_GOLDEN_MODEL

}  // namespace
}  // namespace m3
