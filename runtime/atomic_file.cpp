#include "runtime/atomic_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "runtime/errors.h"

namespace tandem {

void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& fill) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  auto fail = [&](const std::string& what) {
    const std::string reason = std::strerror(errno);
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw failure(errc::io_error, what + ": " + reason);
  };
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot write '" + tmp + "'");
    fill(out);
    if (!out.flush()) fail("cannot write '" + tmp + "'");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename '" + tmp + "' to '" + path + "'");
}

}  // namespace tandem
