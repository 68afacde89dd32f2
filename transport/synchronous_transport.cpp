#include "transport/synchronous_transport.h"

#include <string>

namespace tandem::transport {

region_id synchronous_transport::register_memory(void* base, size_t size) {
  std::lock_guard<std::mutex> lk(mu_);
  const region_id id = next_region_++;
  regions_.emplace(id, region{static_cast<std::byte*>(base), size});
  return id;
}

status synchronous_transport::unregister_memory(region_id r) {
  std::lock_guard<std::mutex> lk(mu_);
  if (regions_.erase(r) == 0) return {errc::invalid_argument, "region " + std::to_string(r) + " is not registered"};
  return {};
}

status synchronous_transport::check(const copy_op& op) const {
  for (auto [id, off] : {std::pair{op.src, op.src_offset}, std::pair{op.dst, op.dst_offset}}) {
    auto it = regions_.find(id);
    if (it == regions_.end()) return {errc::invalid_argument, "region " + std::to_string(id) + " is not registered"};
    if (off > it->second.size || op.size > it->second.size - off)
      return {errc::invalid_argument, "copy of " + std::to_string(op.size) + " bytes at offset " + std::to_string(off) +
                                          " overruns region " + std::to_string(id) + " (" +
                                          std::to_string(it->second.size) + " bytes)"};
  }
  return {};
}

transfer_id synchronous_transport::submit(std::vector<copy_op> ops) {
  std::lock_guard<std::mutex> lk(mu_);
  const transfer_id id = next_transfer_++;
  transfer_status st;
  auto fail = [&](status s) {
    st.state = transfer_state::failed;
    st.error = std::move(s);
    finished_.emplace(id, st);
    return id;
  };
  // Validate the whole batch first: a bad op fails the transfer before any byte moves.
  for (const auto& op : ops)
    if (status s = check(op); !s.ok()) return fail(std::move(s));
  for (const auto& op : ops) {
    status s = copy(regions_.at(op.dst).base + op.dst_offset, regions_.at(op.src).base + op.src_offset, op.size);
    if (!s.ok()) return fail(std::move(s));
    st.bytes_moved += op.size;
  }
  st.state = transfer_state::done;
  finished_.emplace(id, st);
  return id;
}

transfer_status synchronous_transport::poll(transfer_id t) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = finished_.find(t);
  if (it == finished_.end()) {
    transfer_status st;
    st.state = transfer_state::failed;
    st.error = {errc::unknown_sequence, "transfer " + std::to_string(t) + " is unknown (or already polled)"};
    return st;
  }
  transfer_status st = it->second;
  finished_.erase(it);
  return st;
}

}  // namespace tandem::transport
