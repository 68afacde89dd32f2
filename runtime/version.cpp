#include <tandem/version.h>

namespace tandem {
const char* version() noexcept { return TANDEM_VERSION; }
}  // namespace tandem
