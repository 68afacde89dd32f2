#pragma once
// Which router is current. The root supervisor restarts a router that dies; request actors,
// connections and the pipeline API look the router up here rather than holding the first one.
#include <mutex>

#include "actors/protocol.h"

namespace tandem {

class router_directory {
 public:
  router_actor get() const {
    std::lock_guard<std::mutex> lk(mu_);
    return current_;
  }
  // No router will come any more (shutdown, or past the root's restart intensity).
  bool gone() const {
    std::lock_guard<std::mutex> lk(mu_);
    return gone_;
  }
  void set(router_actor r) {
    std::lock_guard<std::mutex> lk(mu_);
    current_ = std::move(r);
  }
  // The root (gateway): submits, and cancels of requests not yet accepted, go through it so
  // that a cancel never overtakes its submit.
  caf::actor gateway() const {
    std::lock_guard<std::mutex> lk(mu_);
    return gateway_;
  }
  void set_gateway(caf::actor g) {
    std::lock_guard<std::mutex> lk(mu_);
    gateway_ = std::move(g);
  }
  // A router comes again (the root recovers from degraded): submits and rejoins go to it.
  void reopen(caf::actor gateway) {
    std::lock_guard<std::mutex> lk(mu_);
    gone_ = false;
    gateway_ = std::move(gateway);
  }
  void close() {
    std::lock_guard<std::mutex> lk(mu_);
    gone_ = true;
    current_ = nullptr;
    gateway_ = nullptr;
  }

 private:
  mutable std::mutex mu_;
  router_actor current_;
  caf::actor gateway_;
  bool gone_ = false;
};

}  // namespace tandem
