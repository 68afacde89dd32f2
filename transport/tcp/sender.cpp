// The KV channel's sending half over TCP (transport/channel.h): one connection kept open,
// frames pipelined under the receiver's credit, the shared-memory ring when the receiver
// offers one. One io_context on one thread of its own; callers only touch the results map
// under its mutex. Wire format: tcp/wire.h.
#include "transport/tcp/common.h"

namespace tandem::transport {

using namespace tcp_detail;

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

  std::function<void()> on_settled;  // set before the first submit; called after each completion

  void complete(transfer_id t, transfer_status s) {
    {
      std::lock_guard lk(mu);
      auto i = results.find(t);
      if (i != results.end()) i->second = std::move(s);
    }
    cv.notify_all();
    if (on_settled) on_settled();
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
      const bool expected =
          self->state == st::handshaking ? t == wire::msg::welcome : (t == wire::msg::ack || t == wire::msg::release);
      if (!expected)
        return self->fail(
            {errc::io_error, "unexpected message type " + std::to_string(self->cur.type) + " from " + self->s.where});
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
        if (s.opts.mode == channel_mode::shm) return fail({e.code(), std::string("shared memory: ") + e.what()});
        spdlog::warn("kv_sender: cannot map the ring of {} ({}), using TCP", s.where, e.what());
        send({wire::encode(wire::mapped{false, e.what()}), nullptr});
      }
    } else if (s.opts.mode == channel_mode::shm) {
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
    if (a.code == errc::ok) s.complete(f.id, transfer_status{transfer_state::done, {}, f.bytes});
    else s.fail(f.id, {a.code, a.message});
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
  if (!conn) connect();
  else conn->pump();
}

}  // namespace

struct kv_sender::impl : tx_core {};

kv_sender::kv_sender(sender_options opts) : impl_(std::make_unique<impl>()) {
  auto& o = impl_->opts;
  o = std::move(opts);
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

void kv_sender::on_settled(std::function<void()> fn) { impl_->on_settled = std::move(fn); }

void kv_sender::connect() {
  asio::post(impl_->io, [p = impl_.get()] {
    if (!p->conn) p->connect();
  });
}

void kv_sender::disconnect() {
  impl_->run_sync([p = impl_.get()] {
    if (auto c = p->conn) c->fail({errc::io_error, "disconnected (kv_sender::disconnect)"});
  });
}

}  // namespace tandem::transport
