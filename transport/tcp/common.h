#pragma once
// What the TCP channel's two halves (tcp/receiver.cpp, tcp/sender.cpp) share: Asio, the
// socket settings, the version-mismatch message.
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

namespace tandem::transport::tcp_detail {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using clock_type = std::chrono::steady_clock;

inline constexpr int socket_buffer_bytes = 4 << 20;
inline constexpr size_t max_shm_chunk = 4u << 20;

inline void tune(tcp::socket& s) {
  error_code ec;
  s.set_option(tcp::no_delay(true), ec);
  s.set_option(asio::socket_base::send_buffer_size(socket_buffer_bytes), ec);
  s.set_option(asio::socket_base::receive_buffer_size(socket_buffer_bytes), ec);
}

inline std::string endpoint_text(const tcp::socket& s) {
  error_code ec;
  const auto ep = s.remote_endpoint(ec);
  return ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
}

inline std::string version_mismatch(uint32_t sender, uint32_t receiver) {
  return "KV channel version mismatch: sender speaks version " + std::to_string(sender) + ", receiver speaks version " +
         std::to_string(receiver);
}

}  // namespace tandem::transport::tcp_detail
