#include "runtime/scheduler/prefix_view.h"

namespace tandem {

prefix_view::worker* prefix_view::find(int32_t w) {
  if (w < 0) return nullptr;
  if (size_t(w) >= workers_.size()) workers_.resize(size_t(w) + 1);
  return &workers_[size_t(w)];
}

int32_t prefix_view::overlap(int32_t w, std::span<const block_key> keys) const {
  if (w < 0 || size_t(w) >= workers_.size()) return 0;
  const worker& wk = workers_[size_t(w)];
  int32_t n = 0;
  for (block_key k : keys) {
    if (!wk.where.count(k)) break;
    ++n;
  }
  return n;
}

void prefix_view::record(int32_t w, std::span<const block_key> keys) {
  worker* wk = find(w);
  if (!wk || capacity_ <= 0) return;
  // Tail first, so the chain's head is the most recent and leaves last (as in the worker).
  for (size_t i = keys.size(); i-- > 0;) {
    auto it = wk->where.find(keys[i]);
    if (it != wk->where.end()) {
      wk->lru.splice(wk->lru.begin(), wk->lru, it->second);
    } else {
      wk->lru.push_front(keys[i]);
      wk->where.emplace(keys[i], wk->lru.begin());
    }
  }
  while (int32_t(wk->lru.size()) > capacity_) {
    wk->where.erase(wk->lru.back());
    wk->lru.pop_back();
  }
}

void prefix_view::forget(int32_t w) {
  if (worker* wk = find(w)) *wk = worker{};
}

int32_t prefix_view::size(int32_t w) const {
  return w < 0 || size_t(w) >= workers_.size() ? 0 : int32_t(workers_[size_t(w)].lru.size());
}

}  // namespace tandem
