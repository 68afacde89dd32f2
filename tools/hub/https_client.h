#pragma once
// A small blocking HTTP(S) GET client for the model hub: TLS with the system's trust store
// (OpenSSL honours SSL_CERT_FILE / SSL_CERT_DIR), redirects, Range requests, HTTPS proxies by
// CONNECT tunnel, and a token sent only to the host it belongs to. Beast and Asio stay inside
// https_client.cpp (they dominate build time).
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace tandem::hub {

struct url {
  std::string scheme;  // "http" or "https"
  std::string userinfo;  // "user:password" (a proxy's credentials), usually empty
  std::string host;  // without brackets for IPv6 literals
  std::string port;  // always set (the scheme's default when the URL has none)
  std::string target;  // path and query, at least "/"
  std::string str() const;
};
// Throws failure(invalid_argument) naming the URL when it is not http(s)://HOST[:PORT][/PATH].
url parse_url(const std::string& s);
std::string lower(std::string s);  // ASCII lower case (host names, quant tags)
std::string env(const char* name);  // an environment variable's value, "" when unset
// `location` (a redirect's Location: absolute, or a path on the same origin) against `base`.
url resolve_location(const url& base, const std::string& location);

// The proxy `u` goes through, if any: HTTPS_PROXY / https_proxy for https URLs, HTTP_PROXY /
// http_proxy for http ones, unless NO_PROXY / no_proxy names the host (a comma-separated list of
// hosts, domain suffixes with or without a leading dot, or `*`).
std::optional<url> proxy_for(const url& u);

// Percent-encodes a path for a URL, keeping '/' (a repository's file may sit in a folder).
std::string encode_path(const std::string& path);

struct response_head {
  int status = 0;
  std::string url;  // the URL that answered
  std::map<std::string, std::string> fields;  // lowercased names
  std::string field(const std::string& lower_name) const;
};

struct get_options {
  std::map<std::string, std::string> fields;  // extra request fields (Range, ...)
  // Sent as `Authorization: Bearer TOKEN` only to `token_host` (the hub's own host): a redirect
  // to another host (a CDN's signed URL) must not carry it, as huggingface_hub does.
  std::string token, token_host;
  int max_redirects = 10;
  // Limit for each step (connect, handshake, one read): a stalled transfer fails after it.
  std::chrono::seconds step_timeout{30};
};

// The body of the final response, chunk by chunk; may throw to abort the transfer.
using body_sink = std::function<void(const char* data, size_t n)>;

struct get_result {
  response_head head;  // the final response (after the redirects)
  std::vector<response_head> chain;  // every response, redirects first
  std::string body;  // when get() was given no sink
};

// A network failure (unreachable, TLS, timeout, dropped connection), as opposed to an answer.
struct transfer_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// GET `u`, following redirects (301, 302, 303, 307, 308). The final response's body goes to
// `sink` (when given, and only for 2xx answers; others are read into `body`). `on_head` sees
// the final head before its body. Throws transfer_error on any network failure, including a
// connection that drops mid-body (so the caller can retry from where the sink stopped).
get_result get(const std::string& u, const get_options& o, const body_sink& sink = nullptr,
               const std::function<void(const get_result&)>& on_head = nullptr);

}  // namespace tandem::hub
