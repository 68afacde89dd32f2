#pragma once
// Files written whole or not at all (models made on first use, cache records).
#include <functional>
#include <ostream>
#include <string>

namespace tandem {

// `fill` writes the content to a per-process temporary beside `path` ("PATH.tmp.PID"), which a
// rename then puts in place: a reader, or another process making the same file, never sees a
// part of it. Throws failure(io_error) naming the file; the temporary is removed on failure.
void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& fill);

}  // namespace tandem
