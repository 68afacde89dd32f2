#pragma once
// The pages `tandem serve` serves, compiled into the binary (no CDN, nothing fetched at run
// time): a chat page over the WebSocket protocol and the live dashboard.
#include <string_view>

namespace tandem::server {

std::string_view chat_page();  // GET /
std::string_view dashboard_page();  // GET /dashboard (reads the SSE feed /dashboard/feed)

}  // namespace tandem::server
