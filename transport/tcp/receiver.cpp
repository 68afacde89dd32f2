// The KV channel's receiving half over TCP (transport/channel.h), with the shared-memory
// ring (shm/) as the same-host data path set up over the TCP connection. Wire format:
// tcp/wire.h. One io_context on one thread of its own; everything a connection does happens
// there.
#include "transport/tcp/common.h"

namespace tandem::transport {

using namespace tcp_detail;

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
    const bool from_sender =
        t == wire::msg::hello || t == wire::msg::frame || t == wire::msg::doorbell || t == wire::msg::mapped;
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
    if (h.version != kv_channel_version)
      return refuse(errc::incompatible_kv, version_mismatch(h.version, kv_channel_version));
    const bool same_host = h.host == rx.host;
    if (h.mode == channel_mode::shm && !rx.opts.allow_shm)
      return refuse(errc::unsupported, "shared memory asked for, but this receiver does not allow it");
    if (h.mode == channel_mode::shm && !same_host)
      return refuse(errc::unsupported,
                    "shared memory asked for, but the hosts differ (sender " + h.host + ", receiver " + rx.host + ")");
    wire::welcome w;
    w.host = rx.host;
    w.credit_bytes = rx.opts.credit_bytes;
    if (h.mode == channel_mode::shm || (h.mode == channel_mode::automatic && rx.opts.allow_shm && same_host)) {
      try {
        ring = shm_ring::create(rx.opts.shm_ring_bytes);
        w.shm_name = ring.name();
        w.shm_bytes = ring.size();
        w.shm_nonce = ring.nonce();
        shm_mode = true;
      } catch (const failure& e) {
        if (h.mode == channel_mode::shm) return refuse(e.code(), e.what());
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
    throw failure(errc::io_error, "kv_receiver cannot listen on " + o.bind_host + ":" + std::to_string(o.port) + ": " +
                                      e.code().message());
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

}  // namespace tandem::transport
