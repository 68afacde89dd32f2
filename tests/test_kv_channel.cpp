// The KV channel (transport/channel.h) over TCP and over the shared-memory ring: frames arrive
// bitwise equal and in order, damaged or malformed ones are refused, broken connections fail
// what was in flight and the sender reconnects, and nothing is left in /dev/shm — also across
// two processes and after kill -9.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "tests/support/eventually.h"
#include "transport/channel.h"
#include "transport/shm/shm_channel.h"
#include "transport/tcp/wire.h"

using namespace tandem;
using testing_support::eventually;
using namespace tandem::transport;
using namespace std::chrono_literals;

namespace {

// A mode by its name (the parameterized tests run per name).
channel_mode cm(const std::string& name) { return parse_channel_mode(name).value(); }

struct shape {
  int32_t layers = 2, n_kv_head = 2, block_size = 16, head_dim = 32;
  kernels::dtype dtype = kernels::dtype::f32;
  // Payload words (4 bytes): f16/bf16 elements take half a word each, q8_0 34 bytes per 32.
  size_t floats() const {
    return size_t(layers) * 2 * n_kv_head * block_size * size_t(kernels::row_bytes(dtype, head_dim)) / 4;
  }
};

kv_block_export make_block(std::mt19937_64& rng, const shape& s, uint64_t request, uint32_t epoch, int32_t pos) {
  kv_block_export b;
  b.model_id = 0x1234;
  b.layer_begin = 0;
  b.layer_end = s.layers;
  b.pos_begin = pos;
  b.pos_end = pos + s.block_size;
  b.block_size = s.block_size;
  b.n_kv_head = s.n_kv_head;
  b.head_dim = s.head_dim;
  b.dtype = s.dtype;
  b.request = request;
  b.epoch = epoch;
  b.payload.resize(s.floats());
  std::uniform_real_distribution<float> d(-4.f, 4.f);
  for (auto& x : b.payload) x = d(rng);
  b.checksum = b.compute_checksum();
  return b;
}

std::shared_ptr<const kv_frame> make_frame(size_t n_blocks, int32_t target, uint64_t request, uint32_t epoch,
                                           const shape& s = {}, uint64_t seed = 1) {
  std::mt19937_64 rng(seed * 7919 + request);
  auto blocks = std::make_shared<std::vector<kv_block_export>>();
  for (size_t i = 0; i < n_blocks; ++i)
    blocks->push_back(make_block(rng, s, request, epoch, int32_t(i) * s.block_size));
  auto f = std::make_shared<kv_frame>();
  f->target = target;
  f->request = request;
  f->epoch = epoch;
  f->blocks = std::move(blocks);
  return f;
}

uint64_t payload_bytes(const kv_frame& f) {
  uint64_t n = 0;
  for (const auto& b : *f.blocks) n += b.payload.size() * sizeof(float);
  return n;
}

void expect_same(const kv_frame& a, const kv_frame& b) {
  EXPECT_EQ(a.target, b.target);
  EXPECT_EQ(a.request, b.request);
  EXPECT_EQ(a.epoch, b.epoch);
  ASSERT_TRUE(a.blocks && b.blocks);
  ASSERT_EQ(a.blocks->size(), b.blocks->size());
  for (size_t i = 0; i < a.blocks->size(); ++i) {
    const auto &x = (*a.blocks)[i], &y = (*b.blocks)[i];
    EXPECT_EQ(x.model_id, y.model_id);
    EXPECT_EQ(x.layer_begin, y.layer_begin);
    EXPECT_EQ(x.layer_end, y.layer_end);
    EXPECT_EQ(x.pos_begin, y.pos_begin);
    EXPECT_EQ(x.pos_end, y.pos_end);
    EXPECT_EQ(x.dtype, y.dtype);
    EXPECT_EQ(x.block_size, y.block_size);
    EXPECT_EQ(x.n_kv_head, y.n_kv_head);
    EXPECT_EQ(x.head_dim, y.head_dim);
    EXPECT_EQ(x.request, y.request);
    EXPECT_EQ(x.epoch, y.epoch);
    EXPECT_EQ(x.checksum, y.checksum);
    ASSERT_EQ(x.payload.size(), y.payload.size());
    EXPECT_EQ(0, std::memcmp(x.payload.data(), y.payload.data(), x.payload.size() * sizeof(float))) << "block " << i;
  }
}

// Frames a receiver got, in order.
struct collector {
  std::mutex mu;
  std::vector<kv_frame> frames;
  frame_handler handler() {
    return [this](kv_frame&& f) {
      std::lock_guard lk(mu);
      frames.push_back(std::move(f));
    };
  }
  size_t size() {
    std::lock_guard lk(mu);
    return frames.size();
  }
};

// Names in /dev/shm that a ring of process `pid` would have.
std::vector<std::string> leftover_rings(long pid) {
  std::vector<std::string> out;
  const std::string prefix = shm_ring::name_prefix(pid).substr(1);
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path().string());
  return out;
}

std::string leftovers_text(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + " ";
  return s;
}

// Raw sockets speaking (or breaking) the wire protocol by hand.
int connect_raw(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

bool send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += size_t(n);
  }
  return true;
}

// Reads exactly n bytes; false on EOF, error or timeout.
bool recv_all(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k <= 0) return false;
    p += k;
    n -= size_t(k);
  }
  return true;
}

// Reads one message; returns its type and header, or type 0 on EOF.
std::pair<uint32_t, std::string> recv_msg(int fd) {
  char pfx[wire::prefix_bytes];
  if (!recv_all(fd, pfx, sizeof pfx)) return {0, {}};
  const auto p = wire::get_prefix(pfx);
  if (!wire::check_prefix(p)) return {0, {}};
  std::string h(p.header_len, '\0');
  if (!recv_all(fd, h.data(), h.size())) return {0, {}};
  return {p.type, h};
}

// True when the peer closed the connection (EOF or reset) within the receive timeout.
bool closed_by_peer(int fd) {
  char c;
  for (;;) {
    const ssize_t k = ::recv(fd, &c, 1, 0);
    if (k == 0) return true;
    if (k < 0) return errno == ECONNRESET;
  }
}

int listen_raw(uint16_t& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::listen(fd, 4);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return fd;
}

std::string tcp_address(uint16_t port) { return "tcp://127.0.0.1:" + std::to_string(port); }

// ---------------------------------------------------------------------------------------------
// The same contract for both kinds.

class KvChannel : public ::testing::TestWithParam<std::string> {
 protected:
  std::string mode() const { return GetParam(); }
  receiver_options rx_opts() const {
    receiver_options o;
    o.shm_ring_bytes = 4u << 20;
    return o;
  }
  sender_options tx_opts(const kv_receiver& r) const {
    sender_options o;
    o.address = r.address();
    o.mode = cm(mode());
    return o;
  }
  void TearDown() override {
    EXPECT_TRUE(leftover_rings(::getpid()).empty()) << leftovers_text(leftover_rings(::getpid()));
  }
};

TEST_P(KvChannel, FramesArriveBitwiseEqualInSubmitOrder) {
  collector got;
  kv_receiver r(rx_opts(), got.handler());
  kv_sender s(tx_opts(r));
  EXPECT_EQ(s.kind(), "");
  std::vector<std::shared_ptr<const kv_frame>> frames;
  uint64_t req = 100;
  for (size_t n : {1, 16, 256, 1, 16, 256, 3, 3, 3, 3})
    frames.push_back(make_frame(n, int32_t(req % 3), req, uint32_t(req % 5), {}, req)), ++req;
  std::vector<transfer_id> ids;
  for (const auto& f : frames) ids.push_back(s.submit(f));  // pipelined: all before any wait
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto st = s.wait(ids[i]);
    ASSERT_EQ(st.state, transfer_state::done) << st.error.to_string();
    EXPECT_EQ(st.bytes_moved, payload_bytes(*frames[i]));
    EXPECT_EQ(s.poll(ids[i]).error.code(), errc::unknown_sequence);  // forgotten once reported
  }
  EXPECT_EQ(s.kind(), mode());
  ASSERT_EQ(got.size(), frames.size());
  EXPECT_EQ(r.frames_received(), frames.size());
  for (size_t i = 0; i < frames.size(); ++i) expect_same(got.frames[i], *frames[i]);
}

// A half-size KV cache's blocks (f16, bf16) travel as their own bytes: half an f32 frame; a
// q8_0 cache's 34/128 of it.
TEST_P(KvChannel, HalfPrecisionBlocksArriveBitwiseEqual) {
  collector got;
  kv_receiver r(rx_opts(), got.handler());
  kv_sender s(tx_opts(r));
  std::vector<std::shared_ptr<const kv_frame>> frames;
  uint64_t req = 300;
  for (auto dt : {kernels::dtype::f16, kernels::dtype::bf16, kernels::dtype::f32, kernels::dtype::q8_0})
    frames.push_back(make_frame(16, 0, req, 1, shape{.dtype = dt}, req)), ++req;
  EXPECT_EQ(payload_bytes(*frames[0]) * 2, payload_bytes(*frames[2]));
  EXPECT_EQ(payload_bytes(*frames[3]) * 128, payload_bytes(*frames[2]) * 34);
  for (const auto& f : frames) {
    const auto st = s.wait(s.submit(f));
    ASSERT_EQ(st.state, transfer_state::done) << st.error.to_string();
    EXPECT_EQ(st.bytes_moved, payload_bytes(*f));
  }
  ASSERT_EQ(got.size(), frames.size());
  for (size_t i = 0; i < frames.size(); ++i) {
    expect_same(got.frames[i], *frames[i]);
    EXPECT_EQ((*got.frames[i].blocks)[0].dtype, (*frames[i]->blocks)[0].dtype);
  }
}

TEST_P(KvChannel, PollReportsPendingThenDone) {
  collector got;
  kv_receiver r(rx_opts(), got.handler());
  kv_sender s(tx_opts(r));
  const auto f = make_frame(16, 1, 7, 2);
  const auto id = s.submit(f);
  transfer_status st;
  ASSERT_TRUE(eventually([&] { return (st = s.poll(id)).state != transfer_state::pending; }))
      << "the transfer was still pending after 10 s";
  ASSERT_EQ(st.state, transfer_state::done) << st.error.to_string();
  EXPECT_EQ(st.bytes_moved, payload_bytes(*f));
}

TEST_P(KvChannel, FramesLargerThanTheRingAndTheCredit) {
  collector got;
  auto o = rx_opts();
  o.shm_ring_bytes = 1u << 20;
  o.credit_bytes = 1u << 20;  // less than one frame: one frame at a time
  kv_receiver r(o, got.handler());
  kv_sender s(tx_opts(r));
  const shape big{4, 4, 16, 64};  // 64 KiB... x 4 layers -> 256 KiB per block
  std::vector<std::shared_ptr<const kv_frame>> frames;
  std::vector<transfer_id> ids;
  for (int i = 0; i < 3; ++i) {
    frames.push_back(make_frame(24, i, 900 + i, 1, big, i));  // 6 MiB each
    ids.push_back(s.submit(frames.back()));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto st = s.wait(ids[i]);
    ASSERT_EQ(st.state, transfer_state::done) << st.error.to_string();
    EXPECT_EQ(st.bytes_moved, payload_bytes(*frames[i]));
  }
  ASSERT_EQ(got.size(), frames.size());
  for (size_t i = 0; i < frames.size(); ++i) expect_same(got.frames[i], *frames[i]);
}

TEST_P(KvChannel, DamagedPayloadIsRefusedAndNeverHandedOver) {
  collector got;
  kv_receiver r(rx_opts(), got.handler());
  kv_sender s(tx_opts(r));
  auto bad = std::const_pointer_cast<kv_frame>(make_frame(16, 0, 5, 1));
  auto blocks = std::make_shared<std::vector<kv_block_export>>(*bad->blocks);
  (*blocks)[9].payload[123] += 1.0f;  // after the checksum was computed
  bad->blocks = blocks;
  const auto good = make_frame(4, 0, 6, 1);
  const auto a = s.submit(bad), b = s.submit(good);
  const auto sa = s.wait(a);
  EXPECT_EQ(sa.state, transfer_state::failed);
  EXPECT_EQ(sa.error.code(), errc::checksum_mismatch) << sa.error.to_string();
  EXPECT_NE(sa.error.message().find("block 9"), std::string::npos) << sa.error.message();
  const auto sb = s.wait(b);  // the connection survives a refused frame
  ASSERT_EQ(sb.state, transfer_state::done) << sb.error.to_string();
  ASSERT_EQ(got.size(), 1u);
  expect_same(got.frames[0], *good);
  EXPECT_EQ(r.frames_received(), 1u);
}

// A handler that holds the first frame until released, so the next one is surely in flight.
// Released, it runs `on_first` (if set) before it returns: on the receiver's own thread, so what
// that does surely comes before the receiver reads or acknowledges anything more.
struct gate {
  std::promise<void> entered_p, release_p;
  std::shared_future<void> release = release_p.get_future().share();
  std::atomic<int> calls{0};
  std::function<void()> on_first;  // set before release_p: read only after the release
  frame_handler handler() {
    return [this](kv_frame&&) {
      if (calls.fetch_add(1) == 0) {
        entered_p.set_value();
        release.wait();
        if (on_first) on_first();
      }
    };
  }
};

TEST_P(KvChannel, DroppedConnectionsFailInFlightFramesAndTheSenderReconnects) {
  gate g;
  kv_receiver r(rx_opts(), g.handler());
  kv_sender s(tx_opts(r));
  const auto f = make_frame(16, 0, 1, 1);
  const auto a = s.submit(f), b = s.submit(f);
  g.entered_p.get_future().wait();  // a is in the handler, b in flight behind it
  // The connections drop while a's handler runs (drop_connections on the receiver's thread
  // closes them at once): before a's acknowledgement is sent and before b is read.
  g.on_first = [&r] { r.drop_connections(); };
  g.release_p.set_value();
  const auto sa = s.wait(a);
  EXPECT_EQ(sa.state, transfer_state::failed) << "its acknowledgement came after the drop";
  EXPECT_EQ(sa.error.code(), errc::io_error) << sa.error.to_string();
  const auto sb = s.wait(b);
  EXPECT_EQ(sb.state, transfer_state::failed);
  EXPECT_EQ(sb.error.code(), errc::io_error) << sb.error.to_string();
  const auto sc = s.wait(s.submit(f));  // reconnects
  ASSERT_EQ(sc.state, transfer_state::done) << sc.error.to_string();
  EXPECT_EQ(s.kind(), mode());
}

TEST_P(KvChannel, AReceiverThatGoesAwayFailsTransfersUntilANewOneListens) {
  auto g = std::make_unique<gate>();
  auto r = std::make_unique<kv_receiver>(rx_opts(), g->handler());
  const uint16_t port = r->port();
  kv_sender s(tx_opts(*r));
  const auto f = make_frame(16, 0, 1, 1);
  const auto a = s.submit(f), b = s.submit(f);
  g->entered_p.get_future().wait();  // a is in the handler, b in flight behind it
  // Its connections close while a's handler runs (on the receiver's thread: before b is read),
  // then the receiver goes away for good.
  std::promise<void> dropped;
  g->on_first = [rx = r.get(), &dropped] {
    rx->drop_connections();
    dropped.set_value();
  };
  g->release_p.set_value();
  dropped.get_future().wait();
  r.reset();
  const auto sa = s.wait(a);
  EXPECT_EQ(sa.state, transfer_state::failed) << "its acknowledgement came after the drop";
  const auto sb = s.wait(b);
  EXPECT_EQ(sb.state, transfer_state::failed);
  EXPECT_EQ(sb.error.code(), errc::io_error);
  const auto sc = s.wait(s.submit(f));  // nobody listens
  EXPECT_EQ(sc.state, transfer_state::failed);
  EXPECT_EQ(sc.error.code(), errc::io_error) << sc.error.to_string();
  collector got;
  auto o = rx_opts();
  o.port = port;
  kv_receiver r2(o, got.handler());
  const auto sd = s.wait(s.submit(f));
  ASSERT_EQ(sd.state, transfer_state::done) << sd.error.to_string();
  ASSERT_EQ(got.size(), 1u);
  expect_same(got.frames[0], *f);
}

TEST_P(KvChannel, AnUnacknowledgedFrameTimesOut) {
  gate g;
  kv_receiver r(rx_opts(), g.handler());
  auto o = tx_opts(r);
  o.timeout = 300ms;
  kv_sender s(o);
  const auto f = make_frame(1, 0, 1, 1);
  const auto st = s.wait(s.submit(f));
  EXPECT_EQ(st.state, transfer_state::failed);
  EXPECT_EQ(st.error.code(), errc::io_error);
  EXPECT_NE(st.error.message().find("timed out"), std::string::npos) << st.error.message();
  g.release_p.set_value();
  const auto st2 = s.wait(s.submit(f));
  EXPECT_EQ(st2.state, transfer_state::done) << st2.error.to_string();
}

TEST_P(KvChannel, GarbageOnTheSocketDoesNotStopTheReceiver) {
  collector got;
  kv_receiver r(rx_opts(), got.handler());
  std::mt19937_64 rng(3);
  {  // random bytes
    const int fd = connect_raw(r.port());
    ASSERT_GE(fd, 0);
    std::string junk(8192, '\0');
    for (auto& c : junk) c = char(rng());
    send_all(fd, junk);
    EXPECT_TRUE(closed_by_peer(fd));
    ::close(fd);
  }
  {  // a valid prefix announcing a 4 GiB header
    const int fd = connect_raw(r.port());
    std::string p(wire::prefix_bytes, '\0');
    wire::put_prefix(p.data(), wire::msg::hello, 0xffffffffu);
    send_all(fd, p);
    EXPECT_TRUE(closed_by_peer(fd));
    ::close(fd);
  }
  auto handshake = [&](int fd) {
    wire::hello h;
    h.host = "elsewhere";
    h.mode = channel_mode::tcp;
    send_all(fd, wire::encode(h));
    const auto [type, body] = recv_msg(fd);
    ASSERT_EQ(type, uint32_t(wire::msg::welcome));
    wire::welcome w;
    ASSERT_TRUE(wire::decode(body, w));
    EXPECT_EQ(w.code, errc::ok) << w.message;
  };
  {  // a frame whose header is not msgpack
    const int fd = connect_raw(r.port());
    handshake(fd);
    std::string m(wire::prefix_bytes, '\0');
    m += std::string(100, '\xc1');  // 0xc1 is never valid msgpack
    wire::put_prefix(m.data(), wire::msg::frame, 100);
    send_all(fd, m);
    EXPECT_TRUE(closed_by_peer(fd));
    ::close(fd);
  }
  {  // payload sizes that do not match the blocks' shape: a negative ack, then closed
    const int fd = connect_raw(r.port());
    handshake(fd);
    auto f = std::const_pointer_cast<kv_frame>(make_frame(2, 0, 1, 1));
    auto blocks = std::make_shared<std::vector<kv_block_export>>(*f->blocks);
    (*blocks)[1].payload.resize(10);
    f->blocks = blocks;
    send_all(fd, wire::encode_frame_header(42, *f));
    const auto [type, body] = recv_msg(fd);
    ASSERT_EQ(type, uint32_t(wire::msg::ack));
    wire::ack a;
    ASSERT_TRUE(wire::decode(body, a));
    EXPECT_EQ(a.seq, 42u);
    EXPECT_EQ(a.code, errc::invalid_argument) << a.message;
    EXPECT_TRUE(closed_by_peer(fd));
    ::close(fd);
  }
  {  // an absurd shape (2^20 heads of 2^20 dims)
    const int fd = connect_raw(r.port());
    handshake(fd);
    auto f = std::const_pointer_cast<kv_frame>(make_frame(1, 0, 1, 1));
    auto blocks = std::make_shared<std::vector<kv_block_export>>(*f->blocks);
    (*blocks)[0].n_kv_head = 1 << 20;
    (*blocks)[0].head_dim = 1 << 20;
    f->blocks = blocks;
    send_all(fd, wire::encode_frame_header(43, *f));
    const auto [type, body] = recv_msg(fd);
    ASSERT_EQ(type, uint32_t(wire::msg::ack));
    wire::ack a;
    ASSERT_TRUE(wire::decode(body, a));
    EXPECT_EQ(a.code, errc::invalid_argument) << a.message;
    ::close(fd);
  }
  {  // a doorbell on a TCP connection, pointing anywhere
    const int fd = connect_raw(r.port());
    handshake(fd);
    send_all(fd, wire::encode(wire::doorbell{1ull << 40, 1ull << 30}));
    EXPECT_TRUE(closed_by_peer(fd));
    ::close(fd);
  }
  EXPECT_EQ(r.frames_received(), 0u);
  kv_sender s(tx_opts(r));
  const auto f = make_frame(16, 2, 9, 3);
  const auto st = s.wait(s.submit(f));
  ASSERT_EQ(st.state, transfer_state::done) << st.error.to_string();
  ASSERT_EQ(got.size(), 1u);
  expect_same(got.frames[0], *f);
}

// q8_0 rows are whole 32-blocks: a header that claims q8_0 KV of head_dim 16 is refused, naming it.
TEST(KvChannelWire, Q8BlocksNeedWholeBlocksPerRow) {
  const auto ok = make_frame(2, 0, 4, 1, shape{.dtype = kernels::dtype::q8_0});
  wire::frame_header h;
  ASSERT_TRUE(wire::decode_frame_header(wire::encode_frame_header(1, *ok).substr(wire::prefix_bytes), h));
  EXPECT_EQ(h.total_payload, payload_bytes(*ok));
  auto bad = std::make_shared<kv_frame>(*ok);
  auto blocks = std::make_shared<std::vector<kv_block_export>>(*ok->blocks);
  for (auto& b : *blocks) b.head_dim = 16;
  bad->blocks = blocks;
  const auto st = wire::decode_frame_header(wire::encode_frame_header(1, *bad).substr(wire::prefix_bytes), h);
  EXPECT_EQ(st.code(), errc::invalid_argument);
  EXPECT_NE(st.message().find("head_dim"), std::string::npos) << st.message();
}

TEST(KvChannelWire, MutatedFrameHeadersNeverCrashTheDecoder) {
  const auto f = make_frame(3, 1, 2, 3);
  const std::string whole = wire::encode_frame_header(5, *f);
  const std::string body = whole.substr(wire::prefix_bytes);
  wire::frame_header h;
  ASSERT_TRUE(wire::decode_frame_header(body, h));
  EXPECT_EQ(h.seq, 5u);
  EXPECT_EQ(h.blocks.size(), 3u);
  EXPECT_EQ(h.total_payload, payload_bytes(*f));
  std::mt19937_64 rng(11);
  for (int i = 0; i < 20000; ++i) {
    std::string m = body;
    for (int k = 0, n = 1 + int(rng() % 4); k < n; ++k) m[rng() % m.size()] = char(rng());
    if (rng() % 4 == 0) m.resize(rng() % m.size());
    wire::frame_header g;
    if (wire::decode_frame_header(m, g)) {  // whatever decodes is within bounds
      EXPECT_LE(g.total_payload, wire::max_frame_payload);
      for (size_t b = 0; b < g.blocks.size(); ++b)
        EXPECT_EQ(g.payload_bytes[b],
                  uint64_t(kernels::row_bytes(g.blocks[b].dtype, int64_t(wire::block_floats(g.blocks[b])))));
    }
  }
}

// A peer that maps the receiver's ring itself and lies in it and in its doorbells.
TEST(KvChannelWire, GarbageInTheRingAndDoorbellsOutOfBoundsAreRefused) {
  collector got;
  receiver_options o;
  o.shm_ring_bytes = 1u << 20;
  kv_receiver r(o, got.handler());
  auto open_ring = [&](int fd) {
    wire::hello h;
    h.host = host_identity();
    h.mode = channel_mode::shm;
    send_all(fd, wire::encode(h));
    const auto [type, body] = recv_msg(fd);
    EXPECT_EQ(type, uint32_t(wire::msg::welcome));
    wire::welcome w;
    EXPECT_TRUE(wire::decode(body, w));
    EXPECT_FALSE(w.shm_name.empty()) << w.message;
    auto ring = shm_ring::open(w.shm_name, w.shm_bytes, w.shm_nonce);
    send_all(fd, wire::encode(wire::mapped{true, ""}));
    return ring;
  };
  std::mt19937_64 rng(5);
  for (const auto& bell : {wire::doorbell{0, 2u << 20}, wire::doorbell{1u << 19, (1u << 19) + 1},
                           wire::doorbell{4096, 16}, wire::doorbell{0, 0}}) {
    const int fd = connect_raw(r.port());
    auto ring = open_ring(fd);
    send_all(fd, wire::encode(bell));
    EXPECT_TRUE(closed_by_peer(fd)) << bell.pos << "+" << bell.len;
    ::close(fd);
  }
  {  // random bytes in the ring
    const int fd = connect_raw(r.port());
    auto ring = open_ring(fd);
    for (size_t i = 0; i < 65536; ++i) ring.data()[i] = char(rng());
    send_all(fd, wire::encode(wire::doorbell{0, 65536}));
    EXPECT_TRUE(closed_by_peer(fd));
    ::close(fd);
  }
  {  // a well-formed frame in the ring whose payload was damaged after its checksum
    const int fd = connect_raw(r.port());
    auto ring = open_ring(fd);
    auto f = std::const_pointer_cast<kv_frame>(make_frame(2, 0, 1, 1));
    const std::string head = wire::encode_frame_header(1, *f);
    std::memcpy(ring.data(), head.data(), head.size());
    size_t at = head.size();
    for (const auto& b : *f->blocks) {
      std::memcpy(ring.data() + at, b.payload.data(), b.payload.size() * 4);
      at += b.payload.size() * 4;
    }
    ring.data()[head.size() + 100] ^= 1;
    send_all(fd, wire::encode(wire::doorbell{0, at}));
    auto [type, body] = recv_msg(fd);  // release, then the negative ack
    EXPECT_EQ(type, uint32_t(wire::msg::release));
    std::tie(type, body) = recv_msg(fd);
    ASSERT_EQ(type, uint32_t(wire::msg::ack));
    wire::ack a;
    ASSERT_TRUE(wire::decode(body, a));
    EXPECT_EQ(a.code, errc::checksum_mismatch) << a.message;
    ::close(fd);
  }
  EXPECT_EQ(r.frames_received(), 0u);
  EXPECT_TRUE(leftover_rings(::getpid()).empty()) << leftovers_text(leftover_rings(::getpid()));
  kv_sender s({.address = r.address(), .mode = cm("shm")});
  const auto f = make_frame(100, 2, 9, 3);  // 1.6 MiB through a 1 MiB ring
  const auto st = s.wait(s.submit(f));
  ASSERT_EQ(st.state, transfer_state::done) << st.error.to_string();
  ASSERT_EQ(got.size(), 1u);
  expect_same(got.frames[0], *f);
}

INSTANTIATE_TEST_SUITE_P(Kinds, KvChannel, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

// ---------------------------------------------------------------------------------------------
// Negotiation

TEST(KvChannelSetup, AutoPicksSharedMemoryOnOneHostAndTcpOtherwise) {
  collector got;
  kv_receiver shm_ok({}, got.handler());
  receiver_options no;
  no.allow_shm = false;
  kv_receiver shm_off(no, got.handler());
  const auto f = make_frame(1, 0, 1, 1);
  auto kind_of = [&](const kv_receiver& r, const std::string& mode) {
    kv_sender s({.address = r.address(), .mode = cm(mode)});
    const auto st = s.wait(s.submit(f));
    EXPECT_EQ(st.state, transfer_state::done) << mode << ": " << st.error.to_string();
    return s.kind();
  };
  EXPECT_EQ(kind_of(shm_ok, "auto"), "shm");
  EXPECT_EQ(kind_of(shm_ok, "tcp"), "tcp");
  EXPECT_EQ(kind_of(shm_ok, "shm"), "shm");
  EXPECT_EQ(kind_of(shm_off, "auto"), "tcp");
  EXPECT_EQ(kind_of(shm_off, "tcp"), "tcp");
  EXPECT_TRUE(leftover_rings(::getpid()).empty());
}

TEST(KvChannelSetup, SharedMemoryModeFailsClearlyWhereItIsNotAllowed) {
  collector got;
  receiver_options no;
  no.allow_shm = false;
  kv_receiver r(no, got.handler());
  kv_sender s({.address = r.address(), .mode = cm("shm")});
  const auto st = s.wait(s.submit(make_frame(1, 0, 1, 1)));
  EXPECT_EQ(st.state, transfer_state::failed);
  EXPECT_EQ(st.error.code(), errc::unsupported);
  EXPECT_NE(st.error.message().find("does not allow"), std::string::npos) << st.error.message();
  EXPECT_EQ(got.size(), 0u);
}

TEST(KvChannelSetup, SharedMemoryModeFailsWhenTheHostsDiffer) {
  collector got;
  kv_receiver r({}, got.handler());
  const int fd = connect_raw(r.port());
  ASSERT_GE(fd, 0);
  wire::hello h;
  h.host = "another-machine";
  h.mode = channel_mode::shm;
  send_all(fd, wire::encode(h));
  const auto [type, body] = recv_msg(fd);
  ASSERT_EQ(type, uint32_t(wire::msg::welcome));
  wire::welcome w;
  ASSERT_TRUE(wire::decode(body, w));
  EXPECT_EQ(w.code, errc::unsupported);
  EXPECT_NE(w.message.find("another-machine"), std::string::npos) << w.message;
  EXPECT_TRUE(w.shm_name.empty());
  ::close(fd);
  h.mode = channel_mode::automatic;  // auto from another host: TCP
  const int fd2 = connect_raw(r.port());
  send_all(fd2, wire::encode(h));
  const auto [type2, body2] = recv_msg(fd2);
  ASSERT_EQ(type2, uint32_t(wire::msg::welcome));
  ASSERT_TRUE(wire::decode(body2, w));
  EXPECT_EQ(w.code, errc::ok);
  EXPECT_TRUE(w.shm_name.empty());
  ::close(fd2);
}

TEST(KvChannelSetup, HostIdentityIsStableAndInTheAddress) {
  EXPECT_EQ(host_identity(), host_identity());
  EXPECT_FALSE(host_identity().empty());
  kv_receiver r({}, [](kv_frame&&) {});
  EXPECT_EQ(r.address(), "tcp://127.0.0.1:" + std::to_string(r.port()) + ";host=" + host_identity());
  EXPECT_THROW(kv_sender({.address = "nonsense"}), failure);
  EXPECT_THROW(kv_sender({.address = "tcp://127.0.0.1:99999"}), failure);
  EXPECT_FALSE(parse_channel_mode("rdma"));  // a mode is one of the enum's, by its name
  receiver_options taken;
  taken.port = r.port();
  taken.bind_host = "127.0.0.1";
  // SO_REUSEADDR does not let two listeners share a port.
  EXPECT_THROW(kv_receiver(taken, [](kv_frame&&) {}), failure);
}

TEST(KvChannelSetup, AReceiverRefusesASenderOfAnotherVersionNamingBoth) {
  kv_receiver r({}, [](kv_frame&&) {});
  const int fd = connect_raw(r.port());
  ASSERT_GE(fd, 0);
  wire::hello h;
  h.version = 99;
  h.host = host_identity();
  h.mode = channel_mode::automatic;
  send_all(fd, wire::encode(h));
  const auto [type, body] = recv_msg(fd);
  ASSERT_EQ(type, uint32_t(wire::msg::welcome));
  wire::welcome w;
  ASSERT_TRUE(wire::decode(body, w));
  EXPECT_EQ(w.version, kv_channel_version);
  EXPECT_EQ(w.code, errc::incompatible_kv);
  EXPECT_NE(w.message.find("version 99"), std::string::npos) << w.message;
  EXPECT_NE(w.message.find("version " + std::to_string(kv_channel_version)), std::string::npos) << w.message;
  EXPECT_TRUE(closed_by_peer(fd));
  ::close(fd);
}

TEST(KvChannelSetup, ASenderRefusesAReceiverOfAnotherVersionNamingBoth) {
  uint16_t port = 0;
  const int lfd = listen_raw(port);
  std::thread fake([&] {  // a receiver of version 7
    const int fd = ::accept(lfd, nullptr, nullptr);
    recv_msg(fd);
    wire::welcome w;
    w.version = 7;
    w.credit_bytes = 1 << 20;
    send_all(fd, wire::encode(w));
    closed_by_peer(fd);
    ::close(fd);
  });
  {
    kv_sender s({.address = tcp_address(port), .mode = cm("auto")});
    const auto st = s.wait(s.submit(make_frame(1, 0, 1, 1)));
    EXPECT_EQ(st.state, transfer_state::failed);
    EXPECT_EQ(st.error.code(), errc::incompatible_kv);
    EXPECT_NE(st.error.message().find("version 7"), std::string::npos) << st.error.message();
    EXPECT_NE(st.error.message().find("version " + std::to_string(kv_channel_version)), std::string::npos);
  }
  fake.join();
  ::close(lfd);
}

// ---------------------------------------------------------------------------------------------
// Two processes

// A forked child running a receiver: it reports its port, then one record per frame
// (target, request, epoch, blocks, xor of block checksums — the receiver checked each against
// the payload, so equal records mean bitwise equal frames), and exits when the pipe closes.
struct child_receiver {
  pid_t pid = -1;
  int to_child = -1, from_child = -1;
  uint16_t port = 0;

  explicit child_receiver(bool allow_shm) {
    int a[2], b[2];
    EXPECT_EQ(::pipe(a), 0);
    EXPECT_EQ(::pipe(b), 0);
    pid = ::fork();
    if (pid == 0) {
      ::close(a[1]);
      ::close(b[0]);
      const int out = b[1];
      {
        receiver_options o;
        o.allow_shm = allow_shm;
        o.shm_ring_bytes = 2u << 20;
        kv_receiver r(o, [out](kv_frame&& f) {
          uint64_t rec[5] = {uint64_t(f.target), f.request, f.epoch, f.blocks->size(), 0};
          for (const auto& k : *f.blocks) rec[4] ^= k.checksum;
          (void)!::write(out, rec, sizeof rec);
        });
        const uint16_t p = r.port();
        (void)!::write(out, &p, sizeof p);
        char c;
        while (::read(a[0], &c, 1) > 0) {}
      }
      ::_exit(0);
    }
    ::close(a[0]);
    ::close(b[1]);
    to_child = a[1];
    from_child = b[0];
    EXPECT_TRUE(recv_pipe(&port, sizeof port));
  }
  bool recv_pipe(void* p, size_t n) {
    auto* c = static_cast<char*>(p);
    while (n > 0) {
      const ssize_t k = ::read(from_child, c, n);
      if (k <= 0) return false;
      c += k;
      n -= size_t(k);
    }
    return true;
  }
  int finish() {
    ::close(to_child);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ::close(from_child);
    return status;
  }
};

class KvChannelProcesses : public ::testing::TestWithParam<std::string> {};

TEST_P(KvChannelProcesses, FramesCrossProcessesIntact) {
  child_receiver c(true);
  ASSERT_GT(c.port, 0);
  kv_sender s({.address = tcp_address(c.port), .mode = cm(GetParam())});
  std::vector<std::shared_ptr<const kv_frame>> frames;
  std::vector<transfer_id> ids;
  uint64_t req = 1;
  for (size_t n : {1, 16, 256, 7, 256}) {
    frames.push_back(make_frame(n, int32_t(req), 1000 + req, uint32_t(req), {}, req));
    ids.push_back(s.submit(frames.back()));
    ++req;
  }
  for (auto id : ids) {
    const auto st = s.wait(id);
    ASSERT_EQ(st.state, transfer_state::done) << st.error.to_string();
  }
  EXPECT_EQ(s.kind(), GetParam());
  for (const auto& f : frames) {
    uint64_t rec[5];
    ASSERT_TRUE(c.recv_pipe(rec, sizeof rec));
    uint64_t x = 0;
    for (const auto& k : *f->blocks) x ^= k.checksum;
    EXPECT_EQ(rec[0], uint64_t(f->target));
    EXPECT_EQ(rec[1], f->request);
    EXPECT_EQ(rec[2], f->epoch);
    EXPECT_EQ(rec[3], f->blocks->size());
    EXPECT_EQ(rec[4], x);
  }
  const pid_t child = c.pid;
  EXPECT_EQ(c.finish(), 0);
  EXPECT_TRUE(leftover_rings(child).empty()) << leftovers_text(leftover_rings(child));
}

TEST_P(KvChannelProcesses, KillingTheReceiverMidTransferLeavesNothingBehind) {
  child_receiver c(true);
  ASSERT_GT(c.port, 0);
  kv_sender s({.address = tcp_address(c.port), .mode = cm(GetParam())});
  const shape big{4, 4, 16, 64};
  const auto f = make_frame(16, 0, 1, 1, big);  // 4 MiB, twice the child's ring
  std::vector<transfer_id> ids;
  for (int i = 0; i < 100; ++i) ids.push_back(s.submit(f));
  ASSERT_EQ(s.wait(ids[0]).state, transfer_state::done);
  ::kill(c.pid, SIGKILL);
  int failed = 0;
  for (size_t i = 1; i < ids.size(); ++i) failed += s.wait(ids[i]).state == transfer_state::failed;
  EXPECT_GT(failed, 0);
  const pid_t child = c.pid;
  c.finish();
  EXPECT_TRUE(leftover_rings(child).empty()) << leftovers_text(leftover_rings(child));
}

TEST_P(KvChannelProcesses, KillingTheSenderMidTransferLeavesNothingBehind) {
  int a[2];
  ASSERT_EQ(::pipe(a), 0);
  const std::string mode = GetParam();
  const pid_t pid = ::fork();  // before this process starts any thread
  if (pid == 0) {
    ::close(a[1]);
    uint16_t port = 0;
    if (::read(a[0], &port, sizeof port) != sizeof port) ::_exit(1);
    kv_sender s({.address = tcp_address(port), .mode = cm(mode)});
    const auto f = make_frame(16, 0, 1, 1, shape{4, 4, 16, 64});
    for (;;) s.wait(s.submit(f));
  }
  ::close(a[0]);
  std::atomic<uint64_t> n{0};
  receiver_options o;
  o.shm_ring_bytes = 2u << 20;
  kv_receiver r(o, [&](kv_frame&&) { ++n; });
  const uint16_t port = r.port();
  ASSERT_EQ(::write(a[1], &port, sizeof port), ssize_t(sizeof port));
  const bool three = eventually([&] { return n >= 3; }, 30s);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  ::close(a[1]);
  ASSERT_TRUE(three) << "the sender process delivered " << n.load() << " frames in 30 s, not 3";
  EXPECT_TRUE(leftover_rings(::getpid()).empty()) << leftovers_text(leftover_rings(::getpid()));
  // The receiver still serves others.
  kv_sender s({.address = r.address(), .mode = cm(mode)});
  const auto st = s.wait(s.submit(make_frame(4, 0, 2, 1)));
  EXPECT_EQ(st.state, transfer_state::done) << st.error.to_string();
  EXPECT_TRUE(leftover_rings(::getpid()).empty());
}

INSTANTIATE_TEST_SUITE_P(Kinds, KvChannelProcesses, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

}  // namespace
