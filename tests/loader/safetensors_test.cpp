// Safetensors reading: valid files (zero-copy views, metadata, header order), and deliberately
// corrupted images: every failure is a Status naming the file and the tensor, never a crash.
#include "loader/safetensors.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "loader/safetensors_writer.h"
#include "test_util.h"

namespace m3 {
namespace {

using testing_util::contains;
using testing_util::make_temp_dir;

SafetensorsWriter two_tensor_writer() {
  SafetensorsWriter w;
  w.add_f32("b.weight", {2, 3}, {1, 2, 3, 4, 5, 6});
  w.add_bf16("a.norm", {4}, {1.0f, -2.0f, 0.5f, 3.0f});
  w.set_metadata("format", "pt");
  return w;
}

// A file image with the given header text (padded to 8) and `data_bytes` zero bytes of data.
std::vector<uint8_t> image(const std::string& header, size_t data_bytes) {
  std::string h = header;
  while (h.size() % 8) h.push_back(' ');
  std::vector<uint8_t> out(8 + h.size() + data_bytes, 0);
  for (int i = 0; i < 8; ++i) out[i] = uint8_t(uint64_t(h.size()) >> (8 * i));
  std::memcpy(out.data() + 8, h.data(), h.size());
  return out;
}

Status parse_image(const std::vector<uint8_t>& bytes, const std::string& name = "shard.safetensors") {
  Result<std::shared_ptr<SafetensorsFile>> f = SafetensorsFile::parse(bytes.data(), bytes.size(), name);
  return f.status();
}

TEST(Safetensors, WriteThenOpenGivesZeroCopyViews) {
  const std::string dir = make_temp_dir();
  const std::string path = dir + "/model.safetensors";
  ASSERT_TRUE(two_tensor_writer().write(path).is_ok());
  Result<std::shared_ptr<SafetensorsFile>> f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ((*f)->names(), (std::vector<std::string>{"b.weight", "a.norm"}));  // header order
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  const TensorView* b = (*f)->find("b.weight");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::kF32);
  EXPECT_EQ(b->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(b->nbytes, 24u);
  EXPECT_EQ(b->file, path);
  float v[6];
  std::memcpy(v, b->data, 24);
  EXPECT_EQ(v[5], 6.0f);
  const TensorView* a = (*f)->find("a.norm");
  ASSERT_NE(a, nullptr);
  uint16_t h[4];
  std::memcpy(h, a->data, 8);
  EXPECT_EQ(bf16_to_f32(h[1]), -2.0f);
  EXPECT_EQ(static_cast<const uint8_t*>(a->data), static_cast<const uint8_t*>(b->data) + 24);
  Result<TensorView> missing = (*f)->tensor("nope");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(missing.status().message(), "model.safetensors: tensor 'nope'"));
}

TEST(Safetensors, MissingFileIsNotFound) {
  Result<std::shared_ptr<SafetensorsFile>> f = SafetensorsFile::open("/nonexistent/x.safetensors");
  ASSERT_FALSE(f.is_ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(f.status().message(), "/nonexistent/x.safetensors"));
}

TEST(Safetensors, EmptyTensorsAndMetadataOnlyAreValid) {
  EXPECT_TRUE(parse_image(image(R"({"__metadata__":{"a":"b","n":3}})", 0)).is_ok());
  EXPECT_TRUE(parse_image(image(R"({"e":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]},)"
                          R"("s":{"dtype":"I64","shape":[],"data_offsets":[0,8]}})",
                          8))
                  .is_ok());
}

TEST(Safetensors, TruncatedFilesFailWithFileName) {
  const std::vector<uint8_t> good = two_tensor_writer().to_bytes();
  ASSERT_TRUE(parse_image(good).is_ok());
  for (size_t cut : {size_t(0), size_t(4), size_t(8), size_t(20), good.size() - 40, good.size() - 1}) {
    std::vector<uint8_t> bad(good.begin(), good.begin() + long(cut));
    Status s = parse_image(bad);
    ASSERT_FALSE(s.is_ok()) << cut;
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << cut;
    EXPECT_TRUE(contains(s.message(), "shard.safetensors: ")) << s.message();
  }
  // Cut inside the data section: the header is intact, the last tensor points past the end.
  std::vector<uint8_t> bad(good.begin(), good.end() - 1);
  Status s = parse_image(bad);
  EXPECT_TRUE(contains(s.message(), "tensor 'a.norm'")) << s.message();
  EXPECT_TRUE(contains(s.message(), "outside")) << s.message();
}

TEST(Safetensors, CorruptHeadersFailWithTensorName) {
  struct Case {
    std::string header;
    size_t data;
    std::string expect;
  };
  const Case cases[] = {
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", 8, "not valid JSON"},
      {R"([1,2,3])", 0, "not a JSON object"},
      {R"({"x":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})", 8, "tensor 'x': unknown dtype 'F7'"},
      {R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, "tensor 'x': shape [-2]"},
      {R"({"x":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8, "tensor 'x': shape"},
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8, "tensor 'x': data_offsets [0,16] lie outside"},
      {R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 16, "tensor 'x': data_offsets [0,8] span 8 bytes, but F32 [3] needs 12"},
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 16, "tensor 'x': invalid data_offsets"},
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", 16, "tensor 'x': invalid data_offsets"},
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 16, "tensor 'x': 'data_offsets' must be"},
      {R"({"x":{"shape":[2],"data_offsets":[0,8]}})", 8, "tensor 'x': missing string 'dtype'"},
      {R"({"x":{"dtype":"F32","data_offsets":[0,8]}})", 8, "tensor 'x': missing array 'shape'"},
      {R"({"x":[1]})", 8, "tensor 'x': header entry is not a JSON object"},
      {R"({"__metadata__":[1]})", 0, "__metadata__ is not a JSON object"},
      {R"({"__metadata__":{"x":)" + std::string(200000, '[') + std::string(200000, ']') + "}}", 0,
       "header nests more than 128 levels deep"},
      {R"({"x":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", 8, "tensor 'x': shape"},
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       16, "tensor 'y': data overlaps tensor 'x'"},
  };
  for (const Case& c : cases) {
    Status s = parse_image(image(c.header, c.data));
    ASSERT_FALSE(s.is_ok()) << c.header;
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << c.header;
    EXPECT_TRUE(contains(s.message(), "shard.safetensors: ")) << s.message();
    EXPECT_TRUE(contains(s.message(), c.expect)) << "message: " << s.message() << "\nwant: " << c.expect;
  }
}

TEST(Safetensors, HeaderLengthBeyondFileFails) {
  std::vector<uint8_t> bytes = two_tensor_writer().to_bytes();
  for (int i = 0; i < 8; ++i) bytes[i] = 0xFF;
  Status s = parse_image(bytes);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(contains(s.message(), "header length")) << s.message();
}

TEST(Safetensors, CorruptedFileOnDiskFailsOnOpen) {
  const std::string dir = make_temp_dir();
  std::vector<uint8_t> bytes = two_tensor_writer().to_bytes();
  bytes.resize(bytes.size() - 3);
  ASSERT_TRUE(write_file_bytes(dir + "/model-00001-of-00001.safetensors", bytes).is_ok());
  Result<std::shared_ptr<SafetensorsFile>> f =
      SafetensorsFile::open(dir + "/model-00001-of-00001.safetensors");
  ASSERT_FALSE(f.is_ok());
  EXPECT_TRUE(contains(f.status().message(), "model-00001-of-00001.safetensors: tensor 'a.norm'"))
      << f.status().message();
  ASSERT_TRUE(write_file_bytes(dir + "/empty.safetensors", {}).is_ok());
  EXPECT_EQ(SafetensorsFile::open(dir + "/empty.safetensors").status().code(), StatusCode::kDataLoss);
}

TEST(Safetensors, RandomCorruptionNeverCrashes) {
  const std::vector<uint8_t> good = two_tensor_writer().to_bytes();
  std::mt19937 rng(11);
  int failures = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> bad = good;
    const int flips = 1 + int(rng() % 4);
    for (int i = 0; i < flips; ++i) bad[rng() % bad.size()] = uint8_t(rng());
    if (rng() % 4 == 0) bad.resize(rng() % bad.size());
    Result<std::shared_ptr<SafetensorsFile>> f = SafetensorsFile::parse(bad.data(), bad.size(), "f");
    if (!f.is_ok()) {
      ++failures;
      continue;
    }
    // Whatever parsed must be in bounds.
    for (const std::string& n : (*f)->names()) {
      const TensorView* v = (*f)->find(n);
      if (v->nbytes == 0) continue;
      const uint8_t* p = static_cast<const uint8_t*>(v->data);
      ASSERT_GE(p, bad.data());
      ASSERT_LE(p + v->nbytes, bad.data() + bad.size());
      ASSERT_EQ(size_t(v->numel()) * dtype_size(v->dtype), v->nbytes);
    }
  }
  EXPECT_GT(failures, 100);  // the corruption does get noticed
}

// ---- TensorStore -------------------------------------------------------------------------

void write_two_shards(const std::string& dir) {
  SafetensorsWriter s1, s2;
  s1.add_f32("x.weight", {2}, {1, 2});
  s1.add_f32("y.weight", {1}, {3});
  s2.add_f32("z.weight", {3}, {4, 5, 6});
  ASSERT_TRUE(s1.write(dir + "/model-00001-of-00002.safetensors").is_ok());
  ASSERT_TRUE(s2.write(dir + "/model-00002-of-00002.safetensors").is_ok());
}

TEST(TensorStore, ShardedIndex) {
  const std::string dir = make_temp_dir();
  write_two_shards(dir);
  ASSERT_TRUE(write_safetensors_index(dir, {{"x.weight", "model-00001-of-00002.safetensors"},
                                            {"y.weight", "model-00001-of-00002.safetensors"},
                                            {"z.weight", "model-00002-of-00002.safetensors"}})
                  .is_ok());
  Result<TensorStore> s = TensorStore::open_dir(dir);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->names(), (std::vector<std::string>{"x.weight", "y.weight", "z.weight"}));
  EXPECT_TRUE(contains(s->find("z.weight")->file, "model-00002-of-00002.safetensors"));
  EXPECT_EQ(s->files().size(), 2u);
}

TEST(TensorStore, MissingShardNamesShardAndTensor) {
  const std::string dir = make_temp_dir();
  write_two_shards(dir);
  ASSERT_TRUE(write_safetensors_index(dir, {{"x.weight", "model-00001-of-00002.safetensors"},
                                            {"w.weight", "model-00003-of-00003.safetensors"}})
                  .is_ok());
  Result<TensorStore> s = TensorStore::open_dir(dir);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(s.status().message(), "model.safetensors.index.json")) << s.status().message();
  EXPECT_TRUE(contains(s.status().message(), "model-00003-of-00003.safetensors"));
  EXPECT_TRUE(contains(s.status().message(), "'w.weight'"));
}

TEST(TensorStore, TensorMissingFromItsShard) {
  const std::string dir = make_temp_dir();
  write_two_shards(dir);
  ASSERT_TRUE(write_safetensors_index(dir, {{"z.weight", "model-00001-of-00002.safetensors"}}).is_ok());
  Result<TensorStore> s = TensorStore::open_dir(dir);
  ASSERT_FALSE(s.is_ok());
  EXPECT_TRUE(contains(s.status().message(), "model-00001-of-00002.safetensors: tensor 'z.weight'"))
      << s.status().message();
}

TEST(TensorStore, BadIndexFiles) {
  const std::string dir = make_temp_dir();
  write_two_shards(dir);
  ASSERT_TRUE(write_safetensors_index(dir, {{"x.weight", "../etc/passwd"}}).is_ok());
  Result<TensorStore> s = TensorStore::open_dir(dir);
  ASSERT_FALSE(s.is_ok());
  EXPECT_TRUE(contains(s.status().message(), "not a file inside the model directory"));
  const std::string text = "{\"weight_map\": 3}";
  ASSERT_TRUE(write_file_bytes(dir + "/model.safetensors.index.json",
                               std::vector<uint8_t>(text.begin(), text.end()))
                  .is_ok());
  EXPECT_TRUE(contains(TensorStore::open_dir(dir).status().message(), "weight_map"));
  ASSERT_TRUE(write_file_bytes(dir + "/model.safetensors.index.json", {'{', 'x'}).is_ok());
  EXPECT_EQ(TensorStore::open_dir(dir).status().code(), StatusCode::kDataLoss);
}

TEST(TensorStore, SingleFileAndLooseFiles) {
  const std::string dir = make_temp_dir();
  EXPECT_EQ(TensorStore::open_dir(dir).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(TensorStore::open_dir(dir + "/missing").status().code(), StatusCode::kNotFound);
  write_two_shards(dir);  // no index: every *.safetensors
  Result<TensorStore> loose = TensorStore::open_dir(dir);
  ASSERT_TRUE(loose.is_ok());
  EXPECT_EQ(loose->names().size(), 3u);
  SafetensorsWriter dup;
  dup.add_f32("x.weight", {1}, {9});
  ASSERT_TRUE(dup.write(dir + "/extra.safetensors").is_ok());
  Result<TensorStore> clash = TensorStore::open_dir(dir);
  ASSERT_FALSE(clash.is_ok());
  EXPECT_TRUE(contains(clash.status().message(), "'x.weight'")) << clash.status().message();
  ASSERT_TRUE(two_tensor_writer().write(dir + "/model.safetensors").is_ok());
  Result<TensorStore> single = TensorStore::open_dir(dir);  // model.safetensors wins
  ASSERT_TRUE(single.is_ok());
  EXPECT_EQ(single->names(), (std::vector<std::string>{"a.norm", "b.weight"}));
}

}  // namespace
}  // namespace m3
