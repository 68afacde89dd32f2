#include "runtime/fault_injection.h"

namespace tandem {

std::shared_ptr<fault_hooks> no_faults() {
  static const auto none = std::make_shared<fault_hooks>();
  return none;
}

fault_hooks::blocks damaged_copy(const fault_hooks::blocks& kv) {
  auto damaged = std::make_shared<std::vector<kv_block_export>>(*kv);
  for (auto& b : *damaged)
    if (!b.payload.empty()) {
      b.payload[b.payload.size() / 2] += 1.0f;
      break;
    }
  return damaged;
}

}  // namespace tandem
