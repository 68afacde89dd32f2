#pragma once
// The KV channel's wire format (internal to transport/; tests include it to speak the protocol
// by hand: a peer with another version, garbage after a valid prefix).
//
// Every message, both directions, is a 12-byte prefix {magic, type, header length} (little
// endian) and a msgpack header of that length. A `frame` message is followed by the raw payload
// bytes of its blocks, in block order, each of the length its header announces. In shared-memory
// mode the same frame bytes (prefix, header, payloads) go into the ring instead, and a
// `doorbell` on the TCP connection says where; `release` tells the sender ring bytes are free.
//
//   sender -> receiver: hello [version, host_identity, mode]
//                       frame [version, seq, target, request, epoch, [[block fields..., payload bytes]...]]
//                       doorbell [ring position, length]    mapped [ok, message]
//   receiver -> sender: welcome [version, host_identity, credit_bytes, errc, message, shm name,
//                                ring bytes, ring nonce]
//                       ack [seq, errc, message]            release [ring position consumed]
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/errors.h"
#include "runtime/kv/kv_cache.h"
#include "transport/channel.h"

namespace tandem::transport::wire {

constexpr uint32_t magic = 0x314b5654;  // "TVK1" as little-endian bytes
constexpr size_t prefix_bytes = 12;

enum class msg : uint32_t { hello = 1, welcome = 2, frame = 3, ack = 4, doorbell = 5, release = 6, mapped = 7 };

// Bounds a receiver enforces before it allocates anything.
constexpr uint32_t max_control_header = 64u << 10;  // every message but frame
constexpr uint32_t max_frame_header = 16u << 20;
constexpr size_t max_blocks = 65536;  // per frame
constexpr int32_t max_dim = 1 << 20;  // each of block_size, n_kv_head, head_dim, layers
constexpr uint64_t max_block_floats = 1ull << 28;  // 1 GiB of payload per block
constexpr uint64_t max_frame_payload = 4ull << 30;  // 4 GiB per frame

struct prefix {
  uint32_t magic = 0;
  uint32_t type = 0;
  uint32_t header_len = 0;
};
void put_prefix(char* out, msg type, uint32_t header_len);
prefix get_prefix(const char* in);
// Checks magic, a known type and the header length against its bound.
status check_prefix(const prefix& p);

struct hello {
  uint32_t version = kv_channel_version;
  std::string host;
  channel_mode mode = channel_mode::automatic;  // on the wire by its name
};
struct welcome {
  uint32_t version = kv_channel_version;
  std::string host;
  uint64_t credit_bytes = 0;
  errc code = errc::ok;
  std::string message;
  std::string shm_name;  // empty: TCP
  uint64_t shm_bytes = 0;
  uint64_t shm_nonce = 0;
};
struct ack {
  uint64_t seq = 0;
  errc code = errc::ok;
  std::string message;
};
struct doorbell {
  uint64_t pos = 0;
  uint64_t len = 0;
};
struct release {
  uint64_t pos = 0;
};
struct mapped {
  bool ok = true;
  std::string message;
};

// Each returns the whole message: prefix + header.
std::string encode(const hello& m);
std::string encode(const welcome& m);
std::string encode(const ack& m);
std::string encode(const doorbell& m);
std::string encode(const release& m);
std::string encode(const mapped& m);
// A frame's prefix + header; the payloads follow it on the wire.
std::string encode_frame_header(uint64_t seq, const kv_frame& f);

// Decoders never throw; a malformed header gives invalid_argument.
status decode(std::string_view body, hello& m);
status decode(std::string_view body, welcome& m);
status decode(std::string_view body, ack& m);
status decode(std::string_view body, doorbell& m);
status decode(std::string_view body, release& m);
status decode(std::string_view body, mapped& m);

// A frame header: the frame's fields, every block's fields but no payload, each block's payload
// length in bytes, and the sequence number. Validates versions, shapes and sizes: each
// payload must be block_size*n_kv_head*head_dim*2*(layer_end-layer_begin) floats, within the
// bounds above. `seq` is set as soon as it could be read (for a negative ack), else 0.
struct frame_header {
  uint64_t seq = 0;
  bool have_seq = false;
  int32_t target = 0;
  uint64_t request = 0;
  uint32_t epoch = 0;
  std::vector<kv_block_export> blocks;  // payloads empty
  std::vector<uint64_t> payload_bytes;
  uint64_t total_payload = 0;
};
status decode_frame_header(std::string_view body, frame_header& h);

// Floats a block of this shape holds, or 0 when the shape is invalid or out of bounds.
uint64_t block_floats(const kv_block_export& b);  // elements (of b.dtype), 0 if out of bounds

}  // namespace tandem::transport::wire
