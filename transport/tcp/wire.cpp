// The KV channel's wire format: encoders and bounds-checked decoders (see wire.h).
#include "transport/tcp/wire.h"

#include <msgpack.hpp>

#include <cstdio>
#include <cstring>

namespace tandem::transport::wire {
namespace {

// Limits for msgpack itself: a few bytes of garbage must not make it reserve huge arrays.
const msgpack::unpack_limit limits(/*array*/ max_blocks + 16, /*map*/ 16, /*str*/ 1u << 16, /*bin*/ 1u << 16,
                                   /*ext*/ 0, /*depth*/ 8);

struct builder {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk{buf};
  explicit builder(size_t reserve = 256) : buf(reserve) {
    char zero[prefix_bytes] = {};
    buf.write(zero, sizeof zero);
  }
  std::string finish(msg type) {
    put_prefix(buf.data(), type, uint32_t(buf.size() - prefix_bytes));
    return std::string(buf.data(), buf.size());
  }
};

status bad(const std::string& what) { return {errc::invalid_argument, "malformed header: " + what}; }

// Unpacks `body` as an array of at least `min_n` elements.
status unpack_array(std::string_view body, msgpack::object_handle& oh, size_t min_n, const char* what) {
  try {
    size_t off = 0;
    oh = msgpack::unpack(body.data(), body.size(), off, nullptr, nullptr, limits);
    if (off != body.size()) return bad(std::string(what) + ": trailing bytes");
  } catch (const std::exception& e) {
    return bad(std::string(what) + ": " + e.what());
  }
  const auto& o = oh.get();
  if (o.type != msgpack::type::ARRAY || o.via.array.size < min_n)
    return bad(std::string(what) + ": not an array of " + std::to_string(min_n));
  return {};
}

template <class T>
bool get(const msgpack::object& o, T& v) {
  try {
    o.convert(v);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

bool get_errc(const msgpack::object& o, errc& e) {
  uint32_t v = 0;
  if (!get(o, v) || v > uint32_t(errc::shutting_down)) return false;
  e = errc(v);
  return true;
}

}  // namespace

void put_prefix(char* out, msg type, uint32_t header_len) {
  const uint32_t v[3] = {magic, uint32_t(type), header_len};
  std::memcpy(out, v, sizeof v);
}

prefix get_prefix(const char* in) {
  prefix p;
  std::memcpy(&p.magic, in, 4);
  std::memcpy(&p.type, in + 4, 4);
  std::memcpy(&p.header_len, in + 8, 4);
  return p;
}

status check_prefix(const prefix& p) {
  if (p.magic != magic) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", p.magic);
    return bad(std::string("bad magic 0x") + hex + " (not a tandem KV channel peer?)");
  }
  if (p.type < uint32_t(msg::hello) || p.type > uint32_t(msg::mapped))
    return bad("unknown message type " + std::to_string(p.type));
  const uint32_t bound = p.type == uint32_t(msg::frame) ? max_frame_header : max_control_header;
  if (p.header_len == 0 || p.header_len > bound)
    return bad("header length " + std::to_string(p.header_len) + " outside 1.." + std::to_string(bound));
  return {};
}

std::string encode(const hello& m) {
  builder b;
  b.pk.pack_array(3);
  b.pk.pack(m.version);
  b.pk.pack(m.host);
  b.pk.pack(std::string(to_string(m.mode)));
  return b.finish(msg::hello);
}

std::string encode(const welcome& m) {
  builder b;
  b.pk.pack_array(8);
  b.pk.pack(m.version);
  b.pk.pack(m.host);
  b.pk.pack(m.credit_bytes);
  b.pk.pack(uint32_t(m.code));
  b.pk.pack(m.message);
  b.pk.pack(m.shm_name);
  b.pk.pack(m.shm_bytes);
  b.pk.pack(m.shm_nonce);
  return b.finish(msg::welcome);
}

std::string encode(const ack& m) {
  builder b(64 + m.message.size());
  b.pk.pack_array(3);
  b.pk.pack(m.seq);
  b.pk.pack(uint32_t(m.code));
  b.pk.pack(m.message);
  return b.finish(msg::ack);
}

std::string encode(const doorbell& m) {
  builder b(64);
  b.pk.pack_array(2);
  b.pk.pack(m.pos);
  b.pk.pack(m.len);
  return b.finish(msg::doorbell);
}

std::string encode(const release& m) {
  builder b(64);
  b.pk.pack_array(1);
  b.pk.pack(m.pos);
  return b.finish(msg::release);
}

std::string encode(const mapped& m) {
  builder b(64 + m.message.size());
  b.pk.pack_array(2);
  b.pk.pack(m.ok);
  b.pk.pack(m.message);
  return b.finish(msg::mapped);
}

std::string encode_frame_header(uint64_t seq, const kv_frame& f) {
  static const std::vector<kv_block_export> none;
  const auto& blocks = f.blocks ? *f.blocks : none;
  builder b(64 + blocks.size() * 96);
  b.pk.pack_array(6);
  b.pk.pack(kv_channel_version);
  b.pk.pack(seq);
  b.pk.pack(f.target);
  b.pk.pack(f.request);
  b.pk.pack(f.epoch);
  b.pk.pack_array(uint32_t(blocks.size()));
  for (const auto& k : blocks) {
    b.pk.pack_array(13);
    b.pk.pack(k.model_id);
    b.pk.pack(k.layer_begin);
    b.pk.pack(k.layer_end);
    b.pk.pack(k.pos_begin);
    b.pk.pack(k.pos_end);
    b.pk.pack(uint32_t(k.dtype));
    b.pk.pack(k.block_size);
    b.pk.pack(k.n_kv_head);
    b.pk.pack(k.head_dim);
    b.pk.pack(k.request);
    b.pk.pack(k.epoch);
    b.pk.pack(k.checksum);
    b.pk.pack(uint64_t(k.payload.size() * sizeof(float)));
  }
  return b.finish(msg::frame);
}

status decode(std::string_view body, hello& m) {
  msgpack::object_handle oh;
  if (auto st = unpack_array(body, oh, 1, "hello"); !st) return st;
  const auto& a = oh.get().via.array;
  // The version first and alone: a peer of another version may lay out the rest differently.
  if (!get(a.ptr[0], m.version)) return bad("hello: version");
  if (m.version != kv_channel_version) return {};
  std::string mode;
  if (a.size < 3 || !get(a.ptr[1], m.host) || !get(a.ptr[2], mode)) return bad("hello: fields");
  const auto parsed = parse_channel_mode(mode);
  if (!parsed) return bad("hello: unknown mode '" + mode + "' (auto, tcp or shm)");
  m.mode = *parsed;
  return {};
}

status decode(std::string_view body, welcome& m) {
  msgpack::object_handle oh;
  if (auto st = unpack_array(body, oh, 1, "welcome"); !st) return st;
  const auto& a = oh.get().via.array;
  if (!get(a.ptr[0], m.version)) return bad("welcome: version");
  if (m.version != kv_channel_version) return {};
  if (a.size < 8 || !get(a.ptr[1], m.host) || !get(a.ptr[2], m.credit_bytes) || !get_errc(a.ptr[3], m.code) ||
      !get(a.ptr[4], m.message) || !get(a.ptr[5], m.shm_name) || !get(a.ptr[6], m.shm_bytes) ||
      !get(a.ptr[7], m.shm_nonce))
    return bad("welcome: fields");
  return {};
}

status decode(std::string_view body, ack& m) {
  msgpack::object_handle oh;
  if (auto st = unpack_array(body, oh, 3, "ack"); !st) return st;
  const auto& a = oh.get().via.array;
  if (!get(a.ptr[0], m.seq) || !get_errc(a.ptr[1], m.code) || !get(a.ptr[2], m.message)) return bad("ack: fields");
  return {};
}

status decode(std::string_view body, doorbell& m) {
  msgpack::object_handle oh;
  if (auto st = unpack_array(body, oh, 2, "doorbell"); !st) return st;
  const auto& a = oh.get().via.array;
  if (!get(a.ptr[0], m.pos) || !get(a.ptr[1], m.len)) return bad("doorbell: fields");
  return {};
}

status decode(std::string_view body, release& m) {
  msgpack::object_handle oh;
  if (auto st = unpack_array(body, oh, 1, "release"); !st) return st;
  if (!get(oh.get().via.array.ptr[0], m.pos)) return bad("release: fields");
  return {};
}

status decode(std::string_view body, mapped& m) {
  msgpack::object_handle oh;
  if (auto st = unpack_array(body, oh, 2, "mapped"); !st) return st;
  const auto& a = oh.get().via.array;
  if (!get(a.ptr[0], m.ok) || !get(a.ptr[1], m.message)) return bad("mapped: fields");
  return {};
}

uint64_t block_floats(const kv_block_export& b) {
  auto in = [](int32_t v) { return v > 0 && v <= max_dim; };
  if (b.layer_begin < 0 || b.layer_end <= b.layer_begin || !in(b.layer_end - b.layer_begin) || !in(b.block_size) ||
      !in(b.n_kv_head) || !in(b.head_dim))
    return 0;
  // Each factor is at most 2^20: multiply step by step, bounding as we go.
  uint64_t n = uint64_t(b.block_size) * uint64_t(b.n_kv_head);
  if (n > max_block_floats) return 0;
  n *= uint64_t(b.head_dim);
  if (n > max_block_floats) return 0;
  n *= 2ull * uint64_t(b.layer_end - b.layer_begin);
  return n > max_block_floats ? 0 : n;
}

status decode_frame_header(std::string_view body, frame_header& h) {
  h = frame_header{};
  msgpack::object_handle oh;
  if (auto st = unpack_array(body, oh, 6, "frame"); !st) return st;
  const auto& a = oh.get().via.array;
  uint32_t version = 0;
  if (!get(a.ptr[0], version)) return bad("frame: version");
  if (get(a.ptr[1], h.seq)) h.have_seq = true;
  if (version != kv_channel_version)
    return {errc::incompatible_kv, "frame of KV channel version " + std::to_string(version) + ", this end speaks " +
                                       std::to_string(kv_channel_version)};
  if (!h.have_seq || !get(a.ptr[2], h.target) || !get(a.ptr[3], h.request) || !get(a.ptr[4], h.epoch))
    return bad("frame: fields");
  const auto& bl = a.ptr[5];
  if (bl.type != msgpack::type::ARRAY) return bad("frame: blocks");
  const uint32_t n = bl.via.array.size;
  if (n > max_blocks) return bad("frame: " + std::to_string(n) + " blocks, at most " + std::to_string(max_blocks));
  h.blocks.resize(n);
  h.payload_bytes.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    const auto& o = bl.via.array.ptr[i];
    auto& k = h.blocks[i];
    uint32_t dt = 0;
    uint64_t bytes = 0;
    if (o.type != msgpack::type::ARRAY || o.via.array.size != 13) return bad("block " + std::to_string(i));
    const auto* f = o.via.array.ptr;
    if (!get(f[0], k.model_id) || !get(f[1], k.layer_begin) || !get(f[2], k.layer_end) || !get(f[3], k.pos_begin) ||
        !get(f[4], k.pos_end) || !get(f[5], dt) || !get(f[6], k.block_size) || !get(f[7], k.n_kv_head) ||
        !get(f[8], k.head_dim) || !get(f[9], k.request) || !get(f[10], k.epoch) || !get(f[11], k.checksum) ||
        !get(f[12], bytes))
      return bad("block " + std::to_string(i) + " fields");
    k.dtype = kernels::dtype(dt);
    const uint64_t floats = block_floats(k);
    if (floats == 0)
      return {errc::invalid_argument,
              "block " + std::to_string(i) + ": shape out of bounds (layers [" + std::to_string(k.layer_begin) + "," +
                  std::to_string(k.layer_end) + "), block_size " + std::to_string(k.block_size) + ", n_kv_head " +
                  std::to_string(k.n_kv_head) + ", head_dim " + std::to_string(k.head_dim) + ")"};
    if (!kv_dtype_supported(k.dtype))
      return {errc::invalid_argument, "block " + std::to_string(i) + ": KV element type " + std::to_string(dt) +
                                          " is not f32, f16, bf16 or q8_0"};
    if (const auto why = kv_dtype_problem(k.dtype, k.head_dim); !why.empty())
      return {errc::invalid_argument, "block " + std::to_string(i) + ": " + why};
    const uint64_t want = uint64_t(kernels::row_bytes(k.dtype, int64_t(floats)));  // whole rows: whole blocks
    if (bytes != want)
      return {errc::invalid_argument, "block " + std::to_string(i) + ": payload of " + std::to_string(bytes) +
                                          " bytes, its shape holds " + std::to_string(want)};
    h.payload_bytes[i] = bytes;
    h.total_payload += bytes;
    if (h.total_payload > max_frame_payload)
      return {errc::invalid_argument, "frame payload over " + std::to_string(max_frame_payload) + " bytes"};
  }
  return {};
}

}  // namespace tandem::transport::wire
