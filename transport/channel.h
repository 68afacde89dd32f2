#pragma once
// The KV data path between processes: a KV link's sender half (in the prefill process) sends
// frames of whole KV blocks to a receiver (one per decode process), which hands each landed,
// checked frame to the process's decode worker named in it. Control (who sends what, when the
// set is complete) travels as CAF messages; the bytes travel only here.
//
// Kinds (one folder each): tcp/ (Boost.Asio; msgpack header, then the raw payloads written
// with scatter/gather) and shm/ (a shared-memory ring between two processes on one host, set
// up over the TCP connection, which stays as the channel's control: acks, credits, close).
// A sender asks for "auto": shared memory when both ends report the same host, else TCP.
//
// As transport.h: submit() starts a send, poll() says when it is done (acknowledged by the
// receiver after its handler took the frame) or failed (connection broken, timeout, the
// receiver refused the frame's checksum). A failed sender reconnects on its next submit.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/errors.h"
#include "runtime/kinds.h"
#include "runtime/kv/kv_cache.h"
#include "transport/transport.h"

namespace tandem::transport {

// Frames carry this version; a peer with another is refused at the handshake, with the two
// versions in the error.
constexpr uint32_t kv_channel_version = 1;

// One frame: blocks of one request's prefill attempt for one decode worker of the receiver.
struct kv_frame {
  int32_t target = 0;  // decode worker index, as the receiving process knows it
  uint64_t request = 0;  // request id
  uint32_t epoch = 0;  // prefill attempt
  // Whole blocks, payloads included. Shared, not copied: a KV link sends the very set the
  // prefill worker exported (actors' kv_blocks_ptr); the receiver hands over a fresh one.
  std::shared_ptr<const std::vector<kv_block_export>> blocks;
};

// This machine's identity for "same host" (may the two ends share memory?): the kernel's boot
// id, the hostname, the IPC namespace and the /dev/shm device, joined by '/'.
std::string host_identity();

struct receiver_options {
  std::string bind_host = "127.0.0.1";
  uint16_t port = 0;  // 0: an ephemeral port (see port())
  bool allow_shm = true;  // offer a shared-memory ring to same-host senders
  size_t shm_ring_bytes = 64u << 20;  // per sender connection
  size_t credit_bytes = 256u << 20;  // payload bytes a sender may have unacknowledged
};

// Runs the frame handler on the receiver's own thread, one frame at a time per connection, in
// the order each sender submitted them. A frame whose blocks fail their checksums is refused
// (the sender's poll() reports checksum_mismatch) and never handed over.
using frame_handler = std::function<void(kv_frame&&)>;

class kv_receiver {
 public:
  // Listens at once; throws failure(io_error) if it cannot (port taken, bad address).
  kv_receiver(receiver_options opts, frame_handler on_frame);
  ~kv_receiver();  // closes every connection and joins its threads
  kv_receiver(const kv_receiver&) = delete;
  kv_receiver& operator=(const kv_receiver&) = delete;

  uint16_t port() const;
  // "tcp://HOST:PORT;host=HOST_IDENTITY" — what a decode process announces for its senders.
  std::string address() const;
  // Fault injection and tests: closes every connection now (senders see them break).
  void drop_connections();
  uint64_t frames_received() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

struct sender_options {
  std::string address;  // as kv_receiver::address() gives it
  channel_mode mode = channel_mode::automatic;  // shm is refused when the hosts differ
  std::chrono::milliseconds timeout{5000};  // connect, and each frame's acknowledgement
};

class kv_sender {
 public:
  // Parses the address (invalid_argument on a bad one); connects on the first submit.
  explicit kv_sender(sender_options opts);
  ~kv_sender();
  kv_sender(const kv_sender&) = delete;
  kv_sender& operator=(const kv_sender&) = delete;

  // "tcp" or "shm" once connected, "" before.
  std::string kind() const;
  // Connects now, in the background (handshake, shared-memory ring), so that the first frame
  // does not wait for it. Harmless if connected; a failure shows at the next submit.
  void connect();
  // Starts sending `frame` (it is shared, not copied: keep it unchanged until polled done or
  // failed). Frames are delivered in submit order.
  transfer_id submit(std::shared_ptr<const kv_frame> frame);
  // As kv_transport::poll: pending, done (bytes_moved = payload bytes), or failed with why;
  // forgotten once it reported done or failed.
  transfer_status poll(transfer_id t);
  // Blocks until transfer t is done or failed, then reports it as poll. It ends: connecting and
  // each frame's acknowledgement are bounded by the timeout (a frame waiting for credit behind
  // others waits for theirs too).
  transfer_status wait(transfer_id t);
  // Called after any frame is done or failed (on the sender's own thread, or on the caller's
  // for a frame refused at submit), so that a caller need not block in wait(): an actor polls
  // its frames when told. Set it before the first submit; it must not call into this sender.
  void on_settled(std::function<void()> fn);
  // Drops the connection (fault injection, tests); frames in flight or not yet started fail
  // (io_error). So does a broken connection, a timeout or a refused handshake.
  void disconnect();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace tandem::transport
