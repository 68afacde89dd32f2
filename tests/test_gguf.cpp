// The GGUF reader on good files, and on every kind of bad one: each gives its clear error,
// never a crash or an out-of-bounds read (the suite also runs under ASan).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "runtime/errors.h"
#include "runtime/gguf/gguf.h"
#include "runtime/model/model.h"
#include "runtime/model/synth.h"

using namespace tandem;
namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::string temp_path(const std::string& name) {
  const auto dir = fs::temp_directory_path() / "tandem-test-gguf";
  fs::create_directories(dir);
  return (dir / name).string();
}

// A small valid file: metadata of several types and two tensors.
std::vector<uint8_t> good_file() {
  gguf::writer w;
  w.set_string("general.architecture", "test");
  w.set_u32("test.count", 7);
  w.set_f32("test.ratio", 0.5f);
  w.set_bool("test.flag", true);
  w.set_strings("test.words", {"a", "bc", ""});
  w.set_i32s("test.ints", {-1, 2, 3});
  std::vector<float> f(64);
  for (int i = 0; i < 64; ++i) f[size_t(i)] = float(i);
  std::vector<uint8_t> bytes(f.size() * 4);
  std::memcpy(bytes.data(), f.data(), bytes.size());
  w.add_tensor("a.weight", {16, 4}, kernels::dtype::f32, bytes);
  std::vector<uint8_t> q(2 * sizeof(kernels::block_q8_0));
  kernels::quantize_row_q8_0(f.data(), reinterpret_cast<kernels::block_q8_0*>(q.data()), 64);
  w.add_tensor("b.weight", {64}, kernels::dtype::q8_0, q);
  const auto p = temp_path("good.gguf");
  w.write(p);
  return read_all(p);
}

errc parse_error(const std::vector<uint8_t>& bytes, std::string* message = nullptr) {
  try {
    gguf::file::parse(bytes.data(), bytes.size());
  } catch (const failure& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return errc::ok;
}

// Offsets of fields inside good_file(), found by searching for known byte patterns.
size_t find(const std::vector<uint8_t>& b, const std::string& needle) {
  auto it = std::search(b.begin(), b.end(), needle.begin(), needle.end());
  EXPECT_NE(it, b.end()) << needle;
  return size_t(it - b.begin());
}

}  // namespace

TEST(Gguf, ReadsWhatTheWriterWrote) {
  const auto b = good_file();
  auto f = gguf::file::parse(b.data(), b.size());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "test");
  EXPECT_EQ(f.get_uint("test.count"), 7u);
  EXPECT_DOUBLE_EQ(f.get_float("test.ratio"), 0.5);
  EXPECT_TRUE(f.get_bool("test.flag", false));
  EXPECT_EQ(f.get_string_array("test.words"), (std::vector<std::string>{"a", "bc", ""}));
  EXPECT_EQ(f.get_int_array("test.ints"), (std::vector<int32_t>{-1, 2, 3}));
  ASSERT_EQ(f.tensors().size(), 2u);
  const auto* a = f.find_tensor("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{16, 4}));
  EXPECT_EQ(static_cast<const float*>(a->data)[63], 63.0f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data) % 32, reinterpret_cast<uintptr_t>(b.data()) % 32);
  EXPECT_EQ(f.find_tensor("b.weight")->type, kernels::dtype::q8_0);
  EXPECT_EQ(f.get_uint("missing", 3), 3u);
}

TEST(Gguf, TypedGettersNameTheKey) {
  const auto b = good_file();
  auto f = gguf::file::parse(b.data(), b.size());
  try {
    f.get_uint("nope");
    FAIL();
  } catch (const failure& e) {
    EXPECT_EQ(e.code(), errc::missing_key);
    EXPECT_NE(std::string(e.what()).find("nope"), std::string::npos);
  }
  try {
    f.get_uint("test.words");
    FAIL();
  } catch (const failure& e) {
    EXPECT_EQ(e.code(), errc::malformed_file);
    EXPECT_NE(std::string(e.what()).find("test.words"), std::string::npos);
  }
}

TEST(Gguf, EveryTruncationIsAClearError) {
  const auto b = good_file();
  // The file may end in alignment padding after the last tensor; cutting only padding is fine.
  size_t data_end = 0;
  {
    auto f = gguf::file::parse(b.data(), b.size());
    for (const auto& t : f.tensors())
      data_end = std::max(data_end, size_t(static_cast<const uint8_t*>(t.data) - b.data()) + t.size_bytes);
  }
  ASSERT_GT(data_end, 0u);
  EXPECT_NO_THROW(gguf::file::parse(b.data(), data_end));
  // Every shorter prefix: header, metadata, tensor infos and data.
  for (size_t n = 0; n < data_end; ++n) {
    std::vector<uint8_t> cut(b.begin(), b.begin() + long(n));
    std::string msg;
    const errc e = parse_error(cut, &msg);
    ASSERT_EQ(e, errc::malformed_file) << "prefix of " << n << " bytes: " << msg;
    ASSERT_TRUE(msg.find("truncated") != std::string::npos || msg.find("too small") != std::string::npos ||
                msg.find("does not fit") != std::string::npos)
        << msg;
  }
}

TEST(Gguf, WrongMagic) {
  auto b = good_file();
  b[0] = 'X';
  std::string msg;
  EXPECT_EQ(parse_error(b, &msg), errc::malformed_file);
  EXPECT_NE(msg.find("magic"), std::string::npos);
}

TEST(Gguf, UnsupportedVersion) {
  auto b = good_file();
  b[4] = 1;
  std::string msg;
  EXPECT_EQ(parse_error(b, &msg), errc::unsupported);
  EXPECT_NE(msg.find("version 1"), std::string::npos);
}

TEST(Gguf, BadTensorOffset) {
  auto b = good_file();
  // b.weight's info ends with its offset (u64), right after its type (u32 = 8).
  const size_t name = find(b, "b.weight");
  const size_t off_pos = name + 8 + 4 + 8 + 4;  // name, n_dims, one dim, type
  const uint64_t huge = uint64_t(1) << 40;
  std::memcpy(&b[off_pos], &huge, 8);
  std::string msg;
  EXPECT_EQ(parse_error(b, &msg), errc::malformed_file);
  EXPECT_NE(msg.find("b.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("outside the data section"), std::string::npos) << msg;

  const uint64_t misaligned = 3;
  std::memcpy(&b[off_pos], &misaligned, 8);
  EXPECT_EQ(parse_error(b, &msg), errc::malformed_file);
  EXPECT_NE(msg.find("aligned"), std::string::npos) << msg;
}

// Every tensor of a type tandem lacks is named at once, with the presets that would load.
TEST(Gguf, UnsupportedTensorTypesAreAllNamed) {
  auto b = good_file();
  const size_t a_type = find(b, "a.weight") + 8 + 4 + 16;  // name, n_dims, two dims
  const size_t b_type = find(b, "b.weight") + 8 + 4 + 8;  // name, n_dims, one dim
  const uint32_t q5_0 = 6, iq4_xs = 23;
  std::memcpy(&b[a_type], &q5_0, 4);
  std::memcpy(&b[b_type], &iq4_xs, 4);
  std::string msg;
  EXPECT_EQ(parse_error(b, &msg), errc::unsupported);
  EXPECT_NE(msg.find("'a.weight' (Q5_0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'b.weight' (IQ4_XS"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2 tensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Q4_K_M"), std::string::npos) << msg;
}

TEST(Gguf, LyingCountsDoNotAllocate) {
  auto b = good_file();
  const uint64_t huge = uint64_t(1) << 60;
  auto c = b;
  std::memcpy(&c[16], &huge, 8);  // metadata count
  EXPECT_EQ(parse_error(c), errc::malformed_file);
  c = b;
  std::memcpy(&c[8], &huge, 8);  // tensor count
  EXPECT_EQ(parse_error(c), errc::malformed_file);
  c = b;
  const size_t words = find(c, "test.words") + 10 + 4 + 4;  // key, value type, element type
  std::memcpy(&c[words], &huge, 8);  // array length
  std::string msg;
  EXPECT_EQ(parse_error(c, &msg), errc::malformed_file);
  EXPECT_NE(msg.find("test.words"), std::string::npos) << msg;
}

TEST(Gguf, RandomCorruptionNeverCrashes) {
  const auto b = good_file();
  uint64_t x = 12345;
  for (int round = 0; round < 2000; ++round) {
    auto c = b;
    for (int k = 0; k < 4; ++k) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      c[size_t((x >> 33) % c.size())] = uint8_t(x >> 24);
    }
    try {
      gguf::file::parse(c.data(), c.size());
    } catch (const failure& e) {
      EXPECT_NE(e.code(), errc::ok);
    }
  }
}

TEST(Gguf, MissingFileIsAnIoError) {
  try {
    gguf::file::open("/nonexistent/model.gguf");
    FAIL();
  } catch (const failure& e) {
    EXPECT_EQ(e.code(), errc::io_error);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model.gguf"), std::string::npos);
  }
}

TEST(Gguf, SynthModelsRoundTripThroughTheModelLoader) {
  for (auto t : {kernels::dtype::f32, kernels::dtype::f16, kernels::dtype::bf16, kernels::dtype::q8_0}) {
    const auto p = temp_path("synth-" + std::string(kernels::to_string(t)) + ".gguf");
    synthesize_model(find_synth_preset("tiny"), t, p);
    auto m = model::load(p);
    EXPECT_EQ(m->config().dim, 64);
    EXPECT_EQ(m->config().n_kv_head, 2);
    EXPECT_EQ(m->weight_type(), t);
    EXPECT_EQ(m->tok().n_vocab(), 300);
    // Deterministic: the same preset, type and seed give the same bytes.
    const auto p2 = p + ".again";
    synthesize_model(find_synth_preset("tiny"), t, p2);
    EXPECT_EQ(read_all(p), read_all(p2));
  }
}

TEST(Gguf, ModelLoaderNamesWhatIsMissing) {
  gguf::writer w;
  w.set_string("general.architecture", "gptx");
  const auto p = temp_path("arch.gguf");
  w.write(p);
  try {
    model::load(p);
    FAIL();
  } catch (const failure& e) {
    EXPECT_EQ(e.code(), errc::unsupported);
    EXPECT_NE(std::string(e.what()).find("gptx"), std::string::npos);
  }
  // A real model with one tensor dropped.
  const auto full = temp_path("tiny-full.gguf");
  synthesize_model(find_synth_preset("tiny"), kernels::dtype::f32, full);
  auto f = gguf::file::open(full);
  gguf::writer w2;
  for (const auto& [k, v] : f.metadata()) w2.set(k, v);
  for (const auto& t : f.tensors()) {
    if (t.name == "blk.1.ffn_up.weight") continue;
    const auto* d = static_cast<const uint8_t*>(t.data);
    w2.add_tensor(t.name, t.shape, t.type, std::vector<uint8_t>(d, d + t.size_bytes));
  }
  const auto p2 = temp_path("tiny-missing.gguf");
  w2.write(p2);
  try {
    model::load(p2);
    FAIL();
  } catch (const failure& e) {
    EXPECT_EQ(e.code(), errc::missing_key);
    EXPECT_NE(std::string(e.what()).find("blk.1.ffn_up.weight"), std::string::npos);
  }
}

// Two tensors whose data ranges overlap (a corrupted offset that still lies inside the data
// section and is aligned) are refused, naming both; before, the file loaded and computed garbage.
TEST(Gguf, OverlappingTensorsAreRefused) {
  auto b = good_file();
  const size_t name = find(b, "b.weight");
  const size_t off_pos = name + 8 + 4 + 8 + 4;  // name, n_dims, one dim, type
  const uint64_t inside_a = 32;  // a.weight holds [0, 256)
  std::memcpy(&b[off_pos], &inside_a, 8);
  std::string msg;
  EXPECT_EQ(parse_error(b, &msg), errc::malformed_file);
  EXPECT_NE(msg.find("overlap"), std::string::npos) << msg;
  EXPECT_NE(msg.find("a.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("b.weight"), std::string::npos) << msg;
}

// An RMS epsilon or a RoPE base that is NaN, infinite, zero or negative is refused by name.
TEST(Gguf, NonsenseNormEpsilonAndRopeBaseAreRefused) {
  const auto full = temp_path("tiny-eps.gguf");
  synthesize_model(find_synth_preset("tiny"), kernels::dtype::f32, full);
  auto f = gguf::file::open(full);
  auto with = [&](const std::string& key, float value) {
    gguf::writer w;
    for (const auto& [k, v] : f.metadata()) w.set(k, v);
    w.set_f32(key, value);
    for (const auto& t : f.tensors()) {
      const auto* d = static_cast<const uint8_t*>(t.data);
      w.add_tensor(t.name, t.shape, t.type, std::vector<uint8_t>(d, d + t.size_bytes));
    }
    const auto p = temp_path("tiny-bad.gguf");
    w.write(p);
    return p;
  };
  for (const std::string key : {"llama.attention.layer_norm_rms_epsilon", "llama.rope.freq_base"})
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 0.0f, -1e-5f}) {
      try {
        model::load(with(key, bad));
        ADD_FAILURE() << key << " = " << bad << " loaded";
      } catch (const failure& e) {
        EXPECT_EQ(e.code(), errc::malformed_file) << e.what();
        EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
      }
    }
  EXPECT_NO_THROW(model::load(with("llama.attention.layer_norm_rms_epsilon", 1e-6f)));
}
