#include "tools/hub/https_client.h"

#include <utility>  // before Asio: its awaitable.hpp uses std::exchange without including it

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast.hpp>
#include <boost/beast/ssl.hpp>
#include <openssl/evp.h>
#include <tandem/version.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <limits>
#include <memory>

#include "runtime/errors.h"

namespace tandem::hub {
namespace {

namespace asio = boost::asio;
namespace ssl = asio::ssl;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

std::string host_port(const url& u) {
  const bool v6 = u.host.find(':') != std::string::npos;
  return (v6 ? "[" + u.host + "]" : u.host) + ":" + u.port;
}

std::string base64(const std::string& s) {
  std::string out(4 * ((s.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(s.data()), int(s.size()));
  out.resize(size_t(n));
  return out;
}

bool is_redirect(int status) {
  return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}

// Runs one asynchronous operation to its end. Everything here is blocking for the caller, but
// Beast's per-operation timeouts (tcp_stream::expires_after) apply to asynchronous operations
// only, and a stalled download must fail rather than hang.
template <class Start>
beast::error_code run(asio::io_context& ioc, Start&& start) {
  beast::error_code ec;
  start([&ec](beast::error_code e, auto&&...) { ec = e; });
  ioc.restart();
  ioc.run();
  return ec;
}

[[noreturn]] void fail(const std::string& what, const beast::error_code& ec) {
  std::string msg = what + ": " + ec.message();
  if (ec.category() == asio::error::get_ssl_category() && msg.find("certificate verify failed") != std::string::npos)
    msg += " (the server's certificate is not trusted or does not name the host; SSL_CERT_FILE names a CA bundle)";
  throw transfer_error(msg);
}

response_head head_of(const http::response_header<>& h, const url& u) {
  response_head r;
  r.status = int(h.result_int());
  r.url = u.str();
  for (const auto& f : h) r.fields[lower(std::string(f.name_string()))] = std::string(f.value());
  return r;
}

// The request and its answer on an open stream (plain TCP or TLS).
template <class Stream>
void exchange(Stream& s, beast::tcp_stream& tcp, asio::io_context& ioc, const url& u, const std::string& target,
              const get_options& o, get_result& r, const body_sink& sink,
              const std::function<void(const get_result&)>& on_head, bool& redirected) {
  http::request<http::empty_body> req{http::verb::get, target, 11};
  const bool default_port = (u.scheme == "https" && u.port == "443") || (u.scheme == "http" && u.port == "80");
  req.set(http::field::host, default_port ? u.host : host_port(u));
  req.set(http::field::user_agent, "tandem/" TANDEM_VERSION);
  req.set(http::field::accept_encoding, "identity");
  if (!o.token.empty() && lower(u.host) == lower(o.token_host))
    req.set(http::field::authorization, "Bearer " + o.token);
  for (const auto& [k, v] : o.fields) req.set(k, v);
  tcp.expires_after(o.step_timeout);
  if (auto ec = run(ioc, [&](auto h) { http::async_write(s, req, h); })) fail("cannot send to " + host_port(u), ec);

  beast::flat_buffer fb;
  http::response_parser<http::buffer_body> p;
  // No limit (files are GBs). Not boost::none: Boost 1.74 compares a length with it as an
  // optional, and every length is greater than none ("body limit exceeded").
  p.body_limit(std::numeric_limits<std::uint64_t>::max());
  tcp.expires_after(o.step_timeout);
  if (auto ec = run(ioc, [&](auto h) { http::async_read_header(s, fb, p, h); }))
    fail("no answer from " + host_port(u), ec);
  r.chain.push_back(head_of(p.get().base(), u));
  r.head = r.chain.back();
  if (is_redirect(r.head.status) && !r.head.field("location").empty()) {
    redirected = true;  // its body (if any) is not needed: the connection is dropped
    return;
  }
  if (on_head) on_head(r);
  const bool to_sink = sink && r.head.status >= 200 && r.head.status < 300;
  std::vector<char> buf(1 << 16);
  while (!p.is_done()) {
    p.get().body().data = buf.data();
    p.get().body().size = buf.size();
    tcp.expires_after(o.step_timeout);
    auto ec = run(ioc, [&](auto h) { http::async_read(s, fb, p, h); });
    if (ec == http::error::need_buffer) ec = {};
    const size_t n = buf.size() - p.get().body().size;
    // Bytes that arrived before a failure are delivered first: a retry resumes after them.
    if (n > 0) {
      if (to_sink) sink(buf.data(), n);
      else if (r.body.size() + n > (64u << 20)) throw transfer_error("answer from " + u.str() + " is too large");
      else r.body.append(buf.data(), n);
    }
    if (ec) fail("transfer from " + host_port(u) + " broke off", ec);
  }
}

// The tunnel through an HTTP proxy: CONNECT host:port, then the caller's TLS runs inside it.
void connect_tunnel(beast::tcp_stream& tcp, asio::io_context& ioc, const url& proxy, const url& u,
                    std::chrono::seconds timeout) {
  http::request<http::empty_body> req{http::verb::connect, host_port(u), 11};
  req.set(http::field::host, host_port(u));
  req.set(http::field::user_agent, "tandem/" TANDEM_VERSION);
  if (!proxy.userinfo.empty()) req.set(http::field::proxy_authorization, "Basic " + base64(proxy.userinfo));
  tcp.expires_after(timeout);
  if (auto ec = run(ioc, [&](auto h) { http::async_write(tcp, req, h); }))
    fail("cannot talk to the proxy " + host_port(proxy), ec);
  beast::flat_buffer fb;
  http::response_parser<http::empty_body> p;
  p.skip(true);  // a 200 answer to CONNECT has no body whatever its fields say
  tcp.expires_after(timeout);
  if (auto ec = run(ioc, [&](auto h) { http::async_read(tcp, fb, p, h); }))
    fail("no answer from the proxy " + host_port(proxy), ec);
  if (p.get().result_int() != 200)
    throw transfer_error("the proxy " + host_port(proxy) + " refused a tunnel to " + host_port(u) + ": " +
                         std::to_string(p.get().result_int()) + " " + std::string(p.get().reason()));
}

}  // namespace

std::string url::str() const {
  const bool v6 = host.find(':') != std::string::npos;
  return scheme + "://" + (v6 ? "[" + host + "]" : host) + ":" + port + target;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

url parse_url(const std::string& s) {
  url u;
  const size_t sep = s.find("://");
  if (sep == std::string::npos) throw failure(errc::invalid_argument, "'" + s + "' is not an http(s):// URL");
  u.scheme = lower(s.substr(0, sep));
  if (u.scheme != "http" && u.scheme != "https")
    throw failure(errc::invalid_argument, "'" + s + "': only http:// and https:// URLs are supported");
  std::string rest = s.substr(sep + 3);
  const size_t slash = rest.find_first_of("/?");
  std::string authority = rest.substr(0, slash);
  u.target = slash == std::string::npos ? "/" : rest.substr(slash);
  if (u.target[0] == '?') u.target = "/" + u.target;
  if (const size_t at = authority.rfind('@'); at != std::string::npos) {
    u.userinfo = authority.substr(0, at);
    authority = authority.substr(at + 1);
  }
  std::string port;
  if (!authority.empty() && authority[0] == '[') {  // [IPv6]:port
    const size_t close = authority.find(']');
    if (close == std::string::npos) throw failure(errc::invalid_argument, "'" + s + "': bad IPv6 address");
    u.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size() && authority[close + 1] == ':') port = authority.substr(close + 2);
  } else {
    const size_t colon = authority.rfind(':');
    u.host = authority.substr(0, colon);
    if (colon != std::string::npos) port = authority.substr(colon + 1);
  }
  if (u.host.empty()) throw failure(errc::invalid_argument, "'" + s + "' has no host");
  if (!port.empty() && !std::all_of(port.begin(), port.end(), [](unsigned char c) { return std::isdigit(c); }))
    throw failure(errc::invalid_argument, "'" + s + "' has a bad port");
  u.port = port.empty() ? (u.scheme == "https" ? "443" : "80") : port;
  return u;
}

url resolve_location(const url& base, const std::string& location) {
  if (location.find("://") != std::string::npos) return parse_url(location);
  url u = base;
  if (location.rfind("//", 0) == 0) return parse_url(base.scheme + ":" + location);
  if (!location.empty() && location[0] == '/') {
    u.target = location;
  } else {  // relative to the current path's folder
    const std::string path = base.target.substr(0, base.target.find('?'));
    u.target = path.substr(0, path.rfind('/') + 1) + location;
  }
  return u;
}

std::optional<url> proxy_for(const url& u) {
  std::string no_proxy = env("NO_PROXY");
  if (no_proxy.empty()) no_proxy = env("no_proxy");
  const std::string host = lower(u.host);
  size_t start = 0;
  while (start <= no_proxy.size()) {
    size_t end = no_proxy.find(',', start);
    if (end == std::string::npos) end = no_proxy.size();
    std::string e = lower(no_proxy.substr(start, end - start));
    start = end + 1;
    e.erase(0, e.find_first_not_of(" \t"));
    e.erase(e.find_last_not_of(" \t") + 1);
    if (e == "*") return std::nullopt;
    if (e.rfind("*.", 0) == 0) e.erase(0, 1);
    if (!e.empty() && e[0] == '.') e.erase(0, 1);
    if (e.empty()) continue;
    if (host == e || (host.size() > e.size() && host.compare(host.size() - e.size(), e.size(), e) == 0 &&
                      host[host.size() - e.size() - 1] == '.'))
      return std::nullopt;
  }
  std::string p = u.scheme == "https" ? env("HTTPS_PROXY") : env("HTTP_PROXY");
  if (p.empty()) p = u.scheme == "https" ? env("https_proxy") : env("http_proxy");
  if (p.empty()) return std::nullopt;
  if (p.find("://") == std::string::npos) p = "http://" + p;  // "host:port", as curl accepts it
  url proxy = parse_url(p);
  if (proxy.scheme != "http")
    throw failure(errc::unsupported, "proxy '" + p + "': only http:// proxies are supported (HTTP CONNECT)");
  return proxy;
}

std::string encode_path(const std::string& path) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : path) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') out += char(c);
    else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string response_head::field(const std::string& lower_name) const {
  const auto it = fields.find(lower_name);
  return it == fields.end() ? "" : it->second;
}

get_result get(const std::string& start_url, const get_options& o, const body_sink& sink,
               const std::function<void(const get_result&)>& on_head) {
  get_result r;
  url u = parse_url(start_url);
  for (int hop = 0;; ++hop) {
    asio::io_context ioc;
    const std::optional<url> proxy = proxy_for(u);
    const url& peer = proxy ? *proxy : u;
    tcp::resolver resolver(ioc);
    beast::error_code ec;
    const auto addrs = resolver.resolve(peer.host, peer.port, ec);
    if (ec) fail("cannot resolve " + peer.host, ec);

    std::optional<ssl::context> ctx;
    std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> tls;
    std::unique_ptr<beast::tcp_stream> plain;
    if (u.scheme == "https") {
      ctx.emplace(ssl::context::tls_client);
      ctx->set_default_verify_paths();  // the system's CAs, or SSL_CERT_FILE / SSL_CERT_DIR
      ctx->set_verify_mode(ssl::verify_peer);
      tls = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(ioc, *ctx);
    } else {
      plain = std::make_unique<beast::tcp_stream>(ioc);
    }
    beast::tcp_stream& tcp = tls ? beast::get_lowest_layer(*tls) : *plain;
    tcp.expires_after(o.step_timeout);
    if (auto e = run(ioc, [&](auto h) { tcp.async_connect(addrs, h); }))
      fail(proxy ? "cannot connect to the proxy " + host_port(peer) : "cannot connect to " + host_port(u), e);

    bool redirected = false;
    if (tls) {
      if (proxy) connect_tunnel(tcp, ioc, *proxy, u, o.step_timeout);
      boost::system::error_code not_ip;
      (void)asio::ip::make_address(u.host, not_ip);
      if (not_ip && !SSL_set_tlsext_host_name(tls->native_handle(), u.host.c_str()))  // SNI: names, not addresses
        throw transfer_error("cannot set the TLS server name " + u.host);
      tls->set_verify_callback(ssl::host_name_verification(u.host));
      tcp.expires_after(o.step_timeout);
      if (auto e = run(ioc, [&](auto h) { tls->async_handshake(ssl::stream_base::client, h); }))
        fail("TLS with " + host_port(u) + " failed", e);
      exchange(*tls, tcp, ioc, u, u.target, o, r, sink, on_head, redirected);
    } else {
      // Plain HTTP through a proxy: the request names the whole URL (absolute form).
      exchange(*plain, tcp, ioc, u, proxy ? u.str() : u.target, o, r, sink, on_head, redirected);
    }
    if (!redirected) return r;
    if (hop + 1 > o.max_redirects)
      throw transfer_error("more than " + std::to_string(o.max_redirects) + " redirects from " + start_url);
    u = resolve_location(u, r.head.field("location"));
  }
}

}  // namespace tandem::hub
