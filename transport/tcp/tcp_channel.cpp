// The KV channel (transport/channel.h) over TCP, with the shared-memory ring (shm/) as the
// same-host data path set up over the TCP connection. Wire format: tcp/wire.h.
//
// Threads: each kv_receiver and each kv_sender runs one io_context on one thread of its own.
// Everything a connection does happens on that thread; kv_sender's callers only touch the
// results map under its mutex.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utility>  // before Asio: its awaitable.hpp uses std::exchange

#include <boost/asio.hpp>
#include <spdlog/spdlog.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "transport/channel.h"
#include "transport/shm/shm_channel.h"
#include "transport/tcp/wire.h"

namespace tandem::transport {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using clock_type = std::chrono::steady_clock;

std::string host_identity() {
  std::string id;
  {
    std::ifstream f("/proc/sys/kernel/random/boot_id");
    std::getline(f, id);
  }
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) std::strcpy(name, "unknown-host");
  id = (id.empty() ? "no-boot-id" : id) + "/" + name;
  // Shared memory is shared within one IPC namespace and one /dev/shm mount.
  char ns[128] = {};
  if (::readlink("/proc/self/ns/ipc", ns, sizeof ns - 1) > 0) id += std::string("/") + ns;
  struct stat st {};
  if (::stat("/dev/shm", &st) == 0) id += "/shm:" + std::to_string(uint64_t(st.st_dev));
  for (auto& c : id)
    if (c == ';' || c == ' ') c = '_';
  return id;
}

namespace {

constexpr int socket_buffer_bytes = 4 << 20;
constexpr size_t max_shm_chunk = 4u << 20;

void tune(tcp::socket& s) {
  error_code ec;
  s.set_option(tcp::no_delay(true), ec);
  s.set_option(asio::socket_base::send_buffer_size(socket_buffer_bytes), ec);
  s.set_option(asio::socket_base::receive_buffer_size(socket_buffer_bytes), ec);
}

std::string endpoint_text(const tcp::socket& s) {
  error_code ec;
  const auto ep = s.remote_endpoint(ec);
  return ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
}

std::string version_mismatch(uint32_t sender, uint32_t receiver) {
  return "KV channel version mismatch: sender speaks version " + std::to_string(sender) + ", receiver speaks version " +
         std::to_string(receiver);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Receiver

namespace {
struct rx_session;

struct rx_core {
  receiver_options opts;
  frame_handler on_frame;
  std::string host = host_identity();
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard;
  std::thread thread;
  std::set<std::shared_ptr<rx_session>> sessions;  // io thread only
  std::atomic<uint64_t> frames{0};
  uint16_t port = 0;

  void accept();
  void close_all();
};

struct rx_session : std::enable_shared_from_this<rx_session> {
  rx_core& rx;
  tcp::socket sock;
  std::string peer;
  bool closed = false, handshaken = false, shm_mode = false;

  char pfx[wire::prefix_bytes];
  wire::prefix cur;
  std::string hdr;

  // A frame arriving over TCP.
  wire::frame_header fh;
  size_t blk = 0;
  status frame_error;

  // The shared-memory stream.
  shm_ring ring;
  uint64_t ring_pos = 0;  // the stream position the next doorbell must start at
  enum class rs { prefix, header, payload } rstate = rs::prefix;
  size_t rgot = 0;
  char rpfx[wire::prefix_bytes];
  std::string rhdr;
  wire::frame_header rfh;
  size_t rblk = 0;
  uint64_t roff = 0;
  status rerror;
  std::optional<kv_checksum> rsum;  // of the block being copied out of the ring

  std::deque<std::string> out;
  bool writing = false, close_after_write = false;

  rx_session(rx_core& r, tcp::socket s) : rx(r), sock(std::move(s)), peer(endpoint_text(sock)) {}

  void start() { read_prefix(); }

  void close() {
    if (closed) return;
    closed = true;
    error_code ec;
    sock.shutdown(tcp::socket::shutdown_both, ec);
    sock.close(ec);
    ring = shm_ring{};  // unlinks the name if the sender never mapped it
    rx.sessions.erase(shared_from_this());
  }

  void protocol_error(const std::string& why) {
    spdlog::warn("kv_receiver: closing the connection from {}: {}", peer, why);
    close();
  }

  void send(std::string m) {
    out.push_back(std::move(m));
    if (!writing) do_write();
  }
  void send_and_close(std::string m) {
    close_after_write = true;
    send(std::move(m));
  }
  void do_write() {  // everything queued, in one gather write (a release and an ack, say)
    writing = true;
    std::vector<asio::const_buffer> bufs;
    for (const auto& m : out) bufs.emplace_back(asio::buffer(m));
    asio::async_write(sock, bufs, [self = shared_from_this(), n = out.size()](error_code ec, size_t) {
      if (self->closed) return;
      if (ec) return self->close();
      self->out.erase(self->out.begin(), self->out.begin() + long(n));
      if (!self->out.empty()) return self->do_write();
      self->writing = false;
      if (self->close_after_write) self->close();
    });
  }

  void read_prefix() {
    if (close_after_write) return;  // a refusal is on its way out; read nothing more
    asio::async_read(sock, asio::buffer(pfx), [self = shared_from_this()](error_code ec, size_t) {
      if (self->closed) return;
      if (ec) return self->close();  // the sender went away (or sent a partial prefix)
      self->on_prefix();
    });
  }

  void on_prefix() {
    cur = wire::get_prefix(pfx);
    if (auto st = wire::check_prefix(cur); !st) return protocol_error(st.message());
    const auto t = wire::msg(cur.type);
    const bool from_sender = t == wire::msg::hello || t == wire::msg::frame || t == wire::msg::doorbell ||
                             t == wire::msg::mapped;
    if (!from_sender) return protocol_error("unexpected message type " + std::to_string(cur.type));
    if ((t == wire::msg::hello) == handshaken)
      return protocol_error(handshaken ? "a second hello" : "a message before the hello");
    hdr.resize(cur.header_len);
    asio::async_read(sock, asio::buffer(hdr), [self = shared_from_this()](error_code ec, size_t) {
      if (self->closed) return;
      if (ec) return self->close();
      self->on_header();
    });
  }

  void on_header() {
    switch (wire::msg(cur.type)) {
      case wire::msg::hello: return on_hello();
      case wire::msg::frame: return on_frame_header();
      case wire::msg::doorbell: return on_doorbell();
      case wire::msg::mapped: return on_mapped();
      default: return protocol_error("unexpected message");
    }
  }

  void refuse(errc code, const std::string& why) {
    spdlog::warn("kv_receiver: refusing the connection from {}: {}", peer, why);
    wire::welcome w;
    w.host = rx.host;
    w.code = code;
    w.message = why;
    send_and_close(wire::encode(w));
  }

  void on_hello() {
    wire::hello h;
    if (auto st = wire::decode(hdr, h); !st) return protocol_error(st.message());
    if (h.version != kv_channel_version) return refuse(errc::incompatible_kv, version_mismatch(h.version, kv_channel_version));
    if (h.mode != "auto" && h.mode != "tcp" && h.mode != "shm")
      return refuse(errc::invalid_argument, "unknown mode '" + h.mode + "'");
    const bool same_host = h.host == rx.host;
    if (h.mode == "shm" && !rx.opts.allow_shm)
      return refuse(errc::unsupported, "shared memory asked for, but this receiver does not allow it");
    if (h.mode == "shm" && !same_host)
      return refuse(errc::unsupported, "shared memory asked for, but the hosts differ (sender " + h.host +
                                           ", receiver " + rx.host + ")");
    wire::welcome w;
    w.host = rx.host;
    w.credit_bytes = rx.opts.credit_bytes;
    if (h.mode == "shm" || (h.mode == "auto" && rx.opts.allow_shm && same_host)) {
      try {
        ring = shm_ring::create(rx.opts.shm_ring_bytes);
        w.shm_name = ring.name();
        w.shm_bytes = ring.size();
        w.shm_nonce = ring.nonce();
        shm_mode = true;
      } catch (const failure& e) {
        if (h.mode == "shm") return refuse(e.code(), e.what());
        spdlog::warn("kv_receiver: no shared-memory ring for {} ({}), using TCP", peer, e.what());
      }
    }
    handshaken = true;
    send(wire::encode(w));
    read_prefix();
  }

  void on_mapped() {
    wire::mapped m;
    if (auto st = wire::decode(hdr, m); !st) return protocol_error(st.message());
    ring.unlink();
    if (!m.ok) {
      ring = shm_ring{};
      shm_mode = false;
    }
    read_prefix();
  }

  // Hands a checked frame over (or refuses it), then acknowledges it.
  void finish_frame(wire::frame_header& h, const status& error) {
    const uint64_t seq = h.seq;
    wire::ack a;
    a.seq = seq;
    if (!error.ok()) {
      spdlog::warn("kv_receiver: refusing frame {} from {}: {}", seq, peer, error.to_string());
      a.code = error.code();
      a.message = error.message();
    } else {
      rx.frames.fetch_add(1, std::memory_order_relaxed);
      try {
        kv_frame f;
        f.target = h.target;
        f.request = h.request;
        f.epoch = h.epoch;
        f.blocks = std::make_shared<const std::vector<kv_block_export>>(std::move(h.blocks));
        rx.on_frame(std::move(f));
      } catch (const std::exception& e) {
        a.code = errc::worker_failed;
        a.message = std::string("the frame handler threw: ") + e.what();
      }
    }
    send(wire::encode(a));
  }

  static void check_block(const kv_block_export& b, size_t i, uint64_t seq, status& error) {
    if (!error.ok()) return;
    const uint64_t got = b.compute_checksum();
    if (got != b.checksum)
      error = {errc::checksum_mismatch, "frame " + std::to_string(seq) + " block " + std::to_string(i) +
                                            ": checksum mismatch (announced " + std::to_string(b.checksum) +
                                            ", computed " + std::to_string(got) + ")"};
  }

  // A refused header: negative ack when its sequence number is known, then close.
  void refuse_frame(const wire::frame_header& h, const status& st) {
    spdlog::warn("kv_receiver: bad frame header from {}: {}", peer, st.to_string());
    if (!h.have_seq) return close();
    wire::ack a;
    a.seq = h.seq;
    a.code = st.code();
    a.message = st.message();
    send_and_close(wire::encode(a));
  }

  void on_frame_header() {
    if (auto st = wire::decode_frame_header(hdr, fh); !st) return refuse_frame(fh, st);
    blk = 0;
    frame_error = {};
    read_block();
  }

  void read_block() {
    if (blk == fh.blocks.size()) {
      finish_frame(fh, frame_error);
      return read_prefix();
    }
    auto& b = fh.blocks[blk];
    // Allocated just before its bytes arrive: the zeroing, the landing and the checksum then
    // touch memory that is still in cache.
    b.payload.resize(fh.payload_bytes[blk] / sizeof(float));
    asio::async_read(sock, asio::buffer(b.payload.data(), fh.payload_bytes[blk]),
                     [self = shared_from_this()](error_code ec, size_t) {
                       if (self->closed) return;
                       if (ec) return self->close();
                       check_block(self->fh.blocks[self->blk], self->blk, self->fh.seq, self->frame_error);
                       ++self->blk;
                       self->read_block();
                     });
  }

  void on_doorbell() {
    wire::doorbell d;
    if (auto st = wire::decode(hdr, d); !st) return protocol_error(st.message());
    if (!shm_mode || !ring.mapped()) return protocol_error("a doorbell on a connection without a ring");
    const uint64_t off = ring.size() ? d.pos % ring.size() : 0;
    if (d.pos != ring_pos || d.len == 0 || d.len > ring.size() || off + d.len > ring.size())
      return protocol_error("doorbell [" + std::to_string(d.pos) + ", +" + std::to_string(d.len) +
                            ") outside the ring (expected position " + std::to_string(ring_pos) + ", ring of " +
                            std::to_string(ring.size()) + " bytes)");
    std::vector<std::pair<wire::frame_header, status>> done;
    const status st = consume_ring(ring.data() + off, d.len, done);
    ring_pos += d.len;
    wire::release r;
    r.pos = ring_pos;
    send(wire::encode(r));  // the sender may refill while the handler runs
    for (auto& [h, err] : done) finish_frame(h, err);
    if (!st.ok()) {
      if (st.code() == errc::malformed_file) return protocol_error(st.message());
      return refuse_frame(rfh, st);
    }
    read_prefix();
  }

  // Copies ring bytes into the frame being assembled. Returns an error when a header is bad
  // (malformed_file: a broken prefix, close at once; else: refuse the frame in rfh, then close).
  status consume_ring(const char* p, size_t n, std::vector<std::pair<wire::frame_header, status>>& done) {
    while (n > 0) {
      switch (rstate) {
        case rs::prefix: {
          const size_t k = std::min(n, wire::prefix_bytes - rgot);
          std::memcpy(rpfx + rgot, p, k);
          p += k, n -= k, rgot += k;
          if (rgot < wire::prefix_bytes) break;
          rgot = 0;
          const auto pre = wire::get_prefix(rpfx);
          if (auto st = wire::check_prefix(pre); !st) return {errc::malformed_file, "ring: " + st.message()};
          if (pre.type != uint32_t(wire::msg::frame)) return {errc::malformed_file, "ring: not a frame"};
          rhdr.resize(pre.header_len);
          rstate = rs::header;
          break;
        }
        case rs::header: {
          const size_t k = std::min<size_t>(n, rhdr.size() - rgot);
          std::memcpy(rhdr.data() + rgot, p, k);
          p += k, n -= k, rgot += k;
          if (rgot < rhdr.size()) break;
          rgot = 0;
          if (auto st = wire::decode_frame_header(rhdr, rfh); !st) return st;
          rblk = 0;
          roff = 0;
          rerror = {};
          rstate = rs::payload;
          if (rfh.blocks.empty()) {
            done.emplace_back(std::move(rfh), rerror);
            rstate = rs::prefix;
          }
          break;
        }
        case rs::payload: {
          auto& b = rfh.blocks[rblk];
          const uint64_t bytes = rfh.payload_bytes[rblk];
          if (roff == 0) {
            b.payload.resize(bytes / sizeof(float));
            rsum.emplace(b);
          }
          // Copied and hashed in pieces that stay in L1/L2: the checksum costs no extra pass.
          const size_t k = size_t(std::min<uint64_t>(n, bytes - roff));
          char* dst = reinterpret_cast<char*>(b.payload.data()) + roff;
          for (size_t done_bytes = 0; done_bytes < k;) {
            const size_t piece = std::min<size_t>(k - done_bytes, 32u << 10);
            std::memcpy(dst + done_bytes, p + done_bytes, piece);
            rsum->update(dst + done_bytes, piece);
            done_bytes += piece;
          }
          p += k, n -= k, roff += k;
          if (roff < bytes) break;
          if (const uint64_t got = rsum->digest(); got != b.checksum && rerror.ok())
            rerror = {errc::checksum_mismatch, "frame " + std::to_string(rfh.seq) + " block " + std::to_string(rblk) +
                                                   ": checksum mismatch (announced " + std::to_string(b.checksum) +
                                                   ", computed " + std::to_string(got) + ")"};
          rsum.reset();
          roff = 0;
          if (++rblk == rfh.blocks.size()) {
            done.emplace_back(std::move(rfh), rerror);
            rstate = rs::prefix;
          }
          break;
        }
      }
    }
    return {};
  }
};

}  // namespace

struct kv_receiver::impl : rx_core {};

void rx_core::accept() {
  acceptor.async_accept([this](error_code ec, tcp::socket s) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
    if (!ec) {
      tune(s);
      auto sess = std::make_shared<rx_session>(*this, std::move(s));
      sessions.insert(sess);
      sess->start();
    } else {
      spdlog::warn("kv_receiver: accept failed: {}", ec.message());
    }
    accept();
  });
}

void rx_core::close_all() {
  auto all = sessions;
  for (auto& s : all) s->close();
}

kv_receiver::kv_receiver(receiver_options opts, frame_handler on_frame) : impl_(std::make_unique<impl>()) {
  impl_->opts = std::move(opts);
  impl_->on_frame = std::move(on_frame);
  const auto& o = impl_->opts;
  try {
    const tcp::endpoint ep(asio::ip::make_address(o.bind_host), o.port);
    impl_->acceptor.open(ep.protocol());
    impl_->acceptor.set_option(asio::socket_base::reuse_address(true));
    impl_->acceptor.bind(ep);
    impl_->acceptor.listen(asio::socket_base::max_listen_connections);
    impl_->port = impl_->acceptor.local_endpoint().port();
  } catch (const boost::system::system_error& e) {
    throw failure(errc::io_error, "kv_receiver cannot listen on " + o.bind_host + ":" + std::to_string(o.port) +
                                      ": " + e.code().message());
  }
  impl_->guard.emplace(impl_->io.get_executor());
  impl_->accept();
  impl_->thread = std::thread([p = impl_.get()] { p->io.run(); });
}

kv_receiver::~kv_receiver() {
  asio::post(impl_->io, [p = impl_.get()] {
    error_code ec;
    p->acceptor.close(ec);
    p->close_all();
  });
  impl_->guard.reset();
  impl_->thread.join();
}

uint16_t kv_receiver::port() const { return impl_->port; }

std::string kv_receiver::address() const {
  return "tcp://" + impl_->opts.bind_host + ":" + std::to_string(impl_->port) + ";host=" + impl_->host;
}

void kv_receiver::drop_connections() {
  if (impl_->io.get_executor().running_in_this_thread()) return impl_->close_all();
  std::promise<void> done;
  asio::post(impl_->io, [&] {
    impl_->close_all();
    done.set_value();
  });
  done.get_future().wait();
}

uint64_t kv_receiver::frames_received() const { return impl_->frames.load(); }

// ---------------------------------------------------------------------------------------------
// Sender

namespace {

struct tx_frame {
  transfer_id id = 0;
  std::shared_ptr<const kv_frame> frame;
  uint64_t bytes = 0;
  uint64_t seq = 0;
  clock_type::time_point deadline;
};

struct out_msg {
  std::string head;
  std::shared_ptr<const kv_frame> payloads;  // TCP frames: the blocks' payloads follow `head`
};

struct tx_conn;

struct tx_core {
  sender_options opts;
  std::string host, port, where;
  asio::io_context io;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard;
  std::thread thread;

  std::mutex mu;
  std::condition_variable cv;
  std::map<transfer_id, transfer_status> results;
  transfer_id next_id = 1;
  std::string kind;

  // io thread only
  std::shared_ptr<tx_conn> conn;
  std::deque<tx_frame> queue;  // submitted, not started

  void complete(transfer_id t, transfer_status s) {
    {
      std::lock_guard lk(mu);
      auto i = results.find(t);
      if (i != results.end()) i->second = std::move(s);
    }
    cv.notify_all();
  }
  void fail(transfer_id t, const status& st) { complete(t, transfer_status{transfer_state::failed, st, 0}); }
  void connect();
  void on_submit(tx_frame f);
  void run_sync(std::function<void()> fn) {
    if (io.get_executor().running_in_this_thread()) return fn();
    std::promise<void> done;
    asio::post(io, [&] {
      fn();
      done.set_value();
    });
    done.get_future().wait();
  }
};

struct tx_conn : std::enable_shared_from_this<tx_conn> {
  tx_core& s;
  tcp::socket sock;
  tcp::resolver resolver;
  asio::steady_timer timer;
  bool timer_armed = false;
  enum class st { connecting, handshaking, ready, dead } state = st::connecting;
  clock_type::time_point connect_deadline;

  uint64_t credit = 0, unacked = 0, next_seq = 1;
  std::deque<tx_frame> inflight;  // started, not yet acknowledged, in sequence order

  bool shm = false;
  shm_ring ring;
  uint64_t ring_head = 0, ring_tail = 0;  // written / released stream positions
  bool streaming = false, step_posted = false;
  uint64_t stream_seq = 0;
  std::string stream_head;
  std::vector<std::pair<const char*, size_t>> spans;
  size_t span_i = 0, span_off = 0;

  std::deque<out_msg> out;
  bool writing = false;
  char pfx[wire::prefix_bytes];
  wire::prefix cur;
  std::string hdr;

  explicit tx_conn(tx_core& owner) : s(owner), sock(owner.io), resolver(owner.io), timer(owner.io) {}

  bool dead() const { return state == st::dead; }

  void fail(const status& why) {
    if (dead()) return;
    state = st::dead;
    error_code ec;
    sock.close(ec);
    resolver.cancel();
    timer.cancel();
    ring = shm_ring{};
    streaming = false;
    for (auto& f : inflight) s.fail(f.id, why);
    inflight.clear();
    // Frames not started yet fail too: the caller resubmits, and the next submit reconnects.
    for (auto& f : s.queue) s.fail(f.id, why);
    s.queue.clear();
    if (s.conn.get() == this) s.conn.reset();
  }

  void fail_io(const error_code& ec, const char* during) {
    if (ec == asio::error::eof || ec == asio::error::connection_reset || ec == asio::error::broken_pipe)
      return fail({errc::io_error, "connection to " + s.where + " closed by the receiver (" + during + ")"});
    fail({errc::io_error, "connection to " + s.where + " failed (" + during + "): " + ec.message()});
  }

  void arm_timer() {
    if (timer_armed || dead()) return;
    const bool watch = state != st::ready || !inflight.empty();
    if (!watch) return;
    timer_armed = true;
    const auto tick = std::clamp<std::chrono::milliseconds>(s.opts.timeout / 8, std::chrono::milliseconds(1),
                                                            std::chrono::milliseconds(50));
    timer.expires_after(tick);
    timer.async_wait([self = shared_from_this()](error_code) {
      self->timer_armed = false;
      if (self->dead()) return;
      const auto now = clock_type::now();
      const auto ms = std::to_string(self->s.opts.timeout.count());
      if (self->state != st::ready && now > self->connect_deadline)
        return self->fail({errc::io_error, "timed out connecting to " + self->s.where + " (" + ms + " ms)"});
      if (!self->inflight.empty() && now > self->inflight.front().deadline)
        return self->fail({errc::io_error, "timed out: frame " + std::to_string(self->inflight.front().seq) +
                                               " not acknowledged by " + self->s.where + " within " + ms + " ms"});
      self->arm_timer();
    });
  }

  void start() {
    connect_deadline = clock_type::now() + s.opts.timeout;
    arm_timer();
    resolver.async_resolve(s.host, s.port, [self = shared_from_this()](error_code ec, tcp::resolver::results_type r) {
      if (self->dead()) return;
      if (ec) return self->fail({errc::io_error, "cannot resolve " + self->s.where + ": " + ec.message()});
      asio::async_connect(self->sock, r, [self](error_code ec, const tcp::endpoint&) {
        if (self->dead()) return;
        if (ec) return self->fail({errc::io_error, "cannot connect to " + self->s.where + ": " + ec.message()});
        tune(self->sock);
        self->state = st::handshaking;
        wire::hello h;
        h.host = host_identity();
        h.mode = self->s.opts.mode;
        self->send({wire::encode(h), nullptr});
        self->read_msg();
      });
    });
  }

  void send(out_msg m) {
    out.push_back(std::move(m));
    if (!writing) do_write();
  }

  // Everything queued goes out in one gather write: each message's header, then (frames over
  // TCP) each block's payload in place, never copied.
  void do_write() {
    writing = true;
    std::vector<asio::const_buffer> bufs;
    for (const auto& m : out) {
      bufs.emplace_back(asio::buffer(m.head));
      if (m.payloads && m.payloads->blocks)
        for (const auto& b : *m.payloads->blocks)
          if (!b.payload.empty()) bufs.emplace_back(b.payload.data(), b.payload.size() * sizeof(float));
    }
    asio::async_write(sock, bufs, [self = shared_from_this(), n = out.size()](error_code ec, size_t) {
      if (self->dead()) return;
      if (ec) return self->fail_io(ec, "sending");
      self->out.erase(self->out.begin(), self->out.begin() + long(n));
      if (!self->out.empty()) return self->do_write();
      self->writing = false;
    });
  }

  void read_msg() {
    asio::async_read(sock, asio::buffer(pfx), [self = shared_from_this()](error_code ec, size_t) {
      if (self->dead()) return;
      if (ec) return self->fail_io(ec, "reading");
      self->cur = wire::get_prefix(self->pfx);
      if (auto st = wire::check_prefix(self->cur); !st)
        return self->fail({errc::io_error, "from " + self->s.where + ": " + st.message()});
      const auto t = wire::msg(self->cur.type);
      const bool expected = self->state == st::handshaking ? t == wire::msg::welcome
                                                           : (t == wire::msg::ack || t == wire::msg::release);
      if (!expected)
        return self->fail({errc::io_error, "unexpected message type " + std::to_string(self->cur.type) + " from " +
                                               self->s.where});
      self->hdr.resize(self->cur.header_len);
      asio::async_read(self->sock, asio::buffer(self->hdr), [self](error_code ec, size_t) {
        if (self->dead()) return;
        if (ec) return self->fail_io(ec, "reading");
        switch (wire::msg(self->cur.type)) {
          case wire::msg::welcome: self->on_welcome(); break;
          case wire::msg::ack: self->on_ack(); break;
          default: self->on_release(); break;
        }
        if (!self->dead()) self->read_msg();
      });
    });
  }

  void on_welcome() {
    wire::welcome w;
    if (auto st = wire::decode(hdr, w); !st) return fail({errc::io_error, "from " + s.where + ": " + st.message()});
    if (w.version != kv_channel_version)
      return fail({errc::incompatible_kv, version_mismatch(kv_channel_version, w.version) + " (" + s.where + ")"});
    if (w.code != errc::ok) return fail({w.code, "receiver " + s.where + " refused the connection: " + w.message});
    credit = w.credit_bytes;
    if (!w.shm_name.empty()) {
      try {
        ring = shm_ring::open(w.shm_name, size_t(w.shm_bytes), w.shm_nonce);
        shm = true;
        send({wire::encode(wire::mapped{true, ""}), nullptr});
      } catch (const failure& e) {
        if (s.opts.mode == "shm") return fail({e.code(), std::string("shared memory: ") + e.what()});
        spdlog::warn("kv_sender: cannot map the ring of {} ({}), using TCP", s.where, e.what());
        send({wire::encode(wire::mapped{false, e.what()}), nullptr});
      }
    } else if (s.opts.mode == "shm") {
      return fail({errc::unsupported, "receiver " + s.where + " offered no shared memory"});
    }
    state = st::ready;
    {
      std::lock_guard lk(s.mu);
      s.kind = shm ? "shm" : "tcp";
    }
    pump();
  }

  void on_ack() {
    wire::ack a;
    if (auto st = wire::decode(hdr, a); !st) return fail({errc::io_error, "from " + s.where + ": " + st.message()});
    if (inflight.empty() || inflight.front().seq != a.seq)
      return fail({errc::io_error, "acknowledgement of unknown frame " + std::to_string(a.seq) + " from " + s.where});
    const tx_frame f = std::move(inflight.front());
    inflight.pop_front();
    unacked -= f.bytes;
    if (streaming && stream_seq == f.seq) streaming = false;
    if (a.code == errc::ok)
      s.complete(f.id, transfer_status{transfer_state::done, {}, f.bytes});
    else
      s.fail(f.id, {a.code, a.message});
    pump();
  }

  void on_release() {
    wire::release r;
    if (auto st = wire::decode(hdr, r); !st) return fail({errc::io_error, "from " + s.where + ": " + st.message()});
    if (!shm || r.pos < ring_tail || r.pos > ring_head)
      return fail({errc::io_error, "bad ring release " + std::to_string(r.pos) + " from " + s.where});
    ring_tail = r.pos;
    pump();
  }

  bool credit_allows(const tx_frame& f) const { return unacked == 0 || unacked + f.bytes <= credit; }

  tx_frame& start_frame() {
    tx_frame f = std::move(s.queue.front());
    s.queue.pop_front();
    f.seq = next_seq++;
    f.deadline = clock_type::now() + s.opts.timeout;
    unacked += f.bytes;
    inflight.push_back(std::move(f));
    arm_timer();
    return inflight.back();
  }

  void pump() {
    if (state != st::ready) return;
    if (shm) {
      if (!step_posted) {
        step_posted = true;
        asio::post(s.io, [self = shared_from_this()] { self->shm_step(); });
      }
      return;
    }
    while (!s.queue.empty() && credit_allows(s.queue.front())) {
      auto& f = start_frame();
      send({wire::encode_frame_header(f.seq, *f.frame), f.frame});
    }
  }

  // Writes one chunk of the frame being streamed into the ring and rings the doorbell; one
  // chunk per turn of the io loop, so acks and releases are taken in between.
  void shm_step() {
    step_posted = false;
    if (dead()) return;
    if (!streaming) {
      if (s.queue.empty() || !credit_allows(s.queue.front())) return;
      auto& f = start_frame();
      stream_seq = f.seq;
      stream_head = wire::encode_frame_header(f.seq, *f.frame);
      spans.clear();
      spans.emplace_back(stream_head.data(), stream_head.size());
      if (f.frame->blocks)
        for (const auto& b : *f.frame->blocks)
          if (!b.payload.empty())
            spans.emplace_back(reinterpret_cast<const char*>(b.payload.data()), b.payload.size() * sizeof(float));
      span_i = span_off = 0;
      streaming = true;
    }
    const uint64_t size = ring.size();
    const uint64_t free = size - (ring_head - ring_tail);
    if (free == 0) return;  // a release will call pump()
    const uint64_t off = ring_head % size;
    uint64_t len = std::min<uint64_t>({free, size - off, std::max<uint64_t>(size / 4, 1), max_shm_chunk});
    char* dst = ring.data() + off;
    uint64_t put = 0;
    while (put < len && span_i < spans.size()) {
      const size_t k = size_t(std::min<uint64_t>(len - put, spans[span_i].second - span_off));
      std::memcpy(dst + put, spans[span_i].first + span_off, k);
      put += k;
      span_off += k;
      if (span_off == spans[span_i].second) ++span_i, span_off = 0;
    }
    send({wire::encode(wire::doorbell{ring_head, put}), nullptr});
    ring_head += put;
    if (span_i == spans.size()) streaming = false;
    pump();
  }
};

void tx_core::connect() {
  conn = std::make_shared<tx_conn>(*this);
  conn->start();
}

void tx_core::on_submit(tx_frame f) {
  queue.push_back(std::move(f));
  if (!conn)
    connect();
  else
    conn->pump();
}

}  // namespace

struct kv_sender::impl : tx_core {};

kv_sender::kv_sender(sender_options opts) : impl_(std::make_unique<impl>()) {
  auto& o = impl_->opts;
  o = std::move(opts);
  if (o.mode != "auto" && o.mode != "tcp" && o.mode != "shm")
    throw failure(errc::invalid_argument, "kv_sender: mode '" + o.mode + "' is none of auto, tcp, shm");
  if (o.timeout.count() <= 0) throw failure(errc::invalid_argument, "kv_sender: timeout must be positive");
  std::string a = o.address;
  if (a.rfind("tcp://", 0) == 0) a = a.substr(6);
  a = a.substr(0, a.find(';'));
  const auto colon = a.rfind(':');
  std::string host = colon == std::string::npos ? "" : a.substr(0, colon);
  const std::string port = colon == std::string::npos ? "" : a.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const bool digits = !port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos;
  if (host.empty() || !digits || std::stoul(port) == 0 || std::stoul(port) > 65535)
    throw failure(errc::invalid_argument, "kv_sender: bad address '" + o.address + "' (want tcp://HOST:PORT)");
  impl_->host = host;
  impl_->port = port;
  impl_->where = host + ":" + port;
  impl_->guard.emplace(impl_->io.get_executor());
  impl_->thread = std::thread([p = impl_.get()] { p->io.run(); });
}

kv_sender::~kv_sender() {
  impl_->run_sync([p = impl_.get()] {
    if (auto c = p->conn) c->fail({errc::shutting_down, "kv_sender destroyed"});
    for (auto& f : p->queue) p->fail(f.id, {errc::shutting_down, "kv_sender destroyed"});
    p->queue.clear();
  });
  impl_->guard.reset();
  impl_->thread.join();
}

std::string kv_sender::kind() const {
  std::lock_guard lk(impl_->mu);
  return impl_->kind;
}

transfer_id kv_sender::submit(std::shared_ptr<const kv_frame> frame) {
  tx_frame f;
  {
    std::lock_guard lk(impl_->mu);
    f.id = impl_->next_id++;
    impl_->results.emplace(f.id, transfer_status{});
  }
  if (!frame) {
    impl_->fail(f.id, {errc::invalid_argument, "kv_sender::submit: no frame"});
    return f.id;
  }
  if (frame->blocks)
    for (const auto& b : *frame->blocks) f.bytes += b.payload.size() * sizeof(float);
  f.frame = std::move(frame);
  const transfer_id id = f.id;
  asio::post(impl_->io, [p = impl_.get(), f = std::move(f)]() mutable { p->on_submit(std::move(f)); });
  return id;
}

transfer_status kv_sender::poll(transfer_id t) {
  std::lock_guard lk(impl_->mu);
  auto i = impl_->results.find(t);
  if (i == impl_->results.end())
    return {transfer_state::failed, {errc::unknown_sequence, "unknown transfer " + std::to_string(t)}, 0};
  if (i->second.state == transfer_state::pending) return i->second;
  auto s = std::move(i->second);
  impl_->results.erase(i);
  return s;
}

transfer_status kv_sender::wait(transfer_id t) {
  {
    std::unique_lock lk(impl_->mu);
    impl_->cv.wait(lk, [&] {
      auto i = impl_->results.find(t);
      return i == impl_->results.end() || i->second.state != transfer_state::pending;
    });
  }
  return poll(t);
}

void kv_sender::disconnect() {
  impl_->run_sync([p = impl_.get()] {
    if (auto c = p->conn) c->fail({errc::io_error, "disconnected (kv_sender::disconnect)"});
  });
}

}  // namespace tandem::transport
