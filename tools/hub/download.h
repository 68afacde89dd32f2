#pragma once
// One file from the hub onto disk: resumable (NAME.part, Range requests), retried when the
// connection drops, checked against the size and sha256 the hub lists before it takes its name.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "tools/hub/https_client.h"

namespace tandem::hub {

struct download_request {
  std::string url;  // the hub's resolve URL (it redirects to the bytes)
  std::string dest;  // the final path; DEST.part while it comes, DEST.bad if it fails its check
  uint64_t size = 0;  // as the hub lists it
  std::string sha256;  // lowercase hex as the hub lists it (X-Linked-Etag's is checked too)
  std::string label;  // what the progress bar calls it
  get_options http;
  int retries = 5;  // after a dropped connection or a 5xx, each from where it stopped
};

// An answer that is not the file (401, 404, ...): the caller says what it means.
struct status_error : std::runtime_error {
  int status;
  status_error(int s, const std::string& what) : std::runtime_error(what), status(s) {}
};

// Downloads, checks and renames into place; returns the file's sha256. Throws failure(io_error)
// when it cannot write or the network keeps failing (the .part is kept for the next try),
// failure(checksum_mismatch) when the bytes are not the hub's (moved aside as DEST.bad),
// status_error for other answers.
std::string download(const download_request& r);

}  // namespace tandem::hub
