#pragma once
// `tandem serve`: HTTP/1.1 and WebSocket on one port (Boost.Beast). Every connection is served
// by a connection actor (tandem::connection) that subscribes to all of its requests, while its
// socket I/O runs on its own strand; the strand pulls events at the pace it can write them, so
// a slow or broken client never stalls others. All Beast code lives in http_server.cpp.
#include <chrono>
#include <memory>
#include <string>

#include "actors/pipeline.h"
#include "tools/server/api.h"

namespace tandem::server {

struct server_config {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;  // 0: any free port (see http_server::port)
  std::string api_key;  // required on /v1/* and the WebSocket when set
  std::string admin_key;  // /admin/* exist only when set
  size_t max_body_bytes = 1 << 20;  // larger bodies get 413
  size_t max_frame_bytes = 1 << 20;  // larger WebSocket messages close with 1009
  size_t max_requests_per_connection = 32;  // in flight on one WebSocket
  size_t outgoing_limit_bytes = 1 << 20;  // queued for one slow client before its requests pause
  std::chrono::milliseconds header_timeout{10000};
  std::chrono::milliseconds grace{10000};  // shutdown: how long in-flight requests may finish
  int io_threads = 2;
  bool stop_on_signals = false;  // SIGINT/SIGTERM call stop() (for `tandem serve`)
};

class http_server {
 public:
  http_server(pipeline& p, served_model m, server_config cfg);  // binds; throws failure(io_error)
  ~http_server();
  uint16_t port() const;
  void run();  // serves until stop() has drained (or the grace period ended)
  void stop();  // thread-safe; call from any thread (not from a signal handler)

  struct impl;  // opaque

 private:
  std::shared_ptr<impl> impl_;
};

}  // namespace tandem::server
