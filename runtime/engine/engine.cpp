#include "runtime/engine/engine.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <span>
#include <unordered_map>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops.h"
#include "runtime/engine/row_split.h"

namespace tandem {

namespace cpu = kernels::cpu;

// Activations for one forward pass, grown on demand and reused across calls.
struct engine::scratch {
  std::vector<float> x, xn, q, k, v, attn, proj, gate, up;  // [T, width] each
  // [T, head_dim / 2, 2] for each distinct (RoPE base, scale) of the layers (Gemma 3: two)
  std::vector<std::vector<float>> rope_cs;
  std::vector<std::vector<const void*>> kptr, vptr;  // per thread: block pointers
  std::vector<engine::attn_task> attn_tasks;  // this forward's attention work
  // Decode: several matmuls on one x as one job of row slices, each run by one participant
  // with its own single-thread pool (no nested dispatch).
  struct slice_task {
    const kernels::weight_view* w;
    float* y;
    int64_t r0, r1, bytes;
  };
  std::vector<slice_task> slices;
  std::vector<std::unique_ptr<kernels::thread_pool>> solo;  // one size-1 pool per participant
  // A prefill's row pieces on several threads: their sizes (by each thread's speed so far),
  // which are taken in the job running, and what each participant computed in it.
  row_split split{1};
  std::unique_ptr<std::atomic<bool>[]> piece_taken;
  std::vector<int64_t> split_rows;
  std::vector<double> split_seconds;
};

namespace {
void grow(std::vector<float>& v, int64_t n) {
  if (int64_t(v.size()) < n) v.resize(size_t(n));
}
int32_t div_up(int32_t a, int32_t b) { return (a + b - 1) / b; }
}  // namespace

uint64_t engine_prefix_salt(const model& m, int32_t block_size, kernels::cpu::matmul_mode matmul,
                            kernels::dtype kv_dtype) {
  const llama_config& c = m.config();
  return prefix_salt(m.identity(), kv_layout{c.n_layer, c.n_kv_head, c.head_dim, block_size, kv_dtype}, kv_dtype,
                     int32_t(matmul));
}

int32_t kv_blocks_per_worker(const model& m, int32_t block_size, kernels::dtype kv_dtype, int32_t blocks,
                             int64_t memory_bytes) {
  if (blocks > 0) return blocks;
  const llama_config& mc = m.config();
  const int64_t block_bytes = kv_layout{mc.n_layer, mc.n_kv_head, mc.head_dim, block_size, kv_dtype}.bytes_per_block();
  return int32_t(std::clamp<int64_t>(memory_bytes / std::max<int64_t>(1, block_bytes), 1, INT32_MAX));
}

engine::engine(std::shared_ptr<const model> m, engine_options opts)
    : model_(std::move(m)),
      opts_(opts),
      pool_threads_(opts.cores, opts.n_threads, opts.core_group),
      pool_(kv_layout{model_->config().n_layer, model_->config().n_kv_head, model_->config().head_dim, opts.block_size,
                      opts.kv_dtype},
            kv_blocks_per_worker(*model_, opts.block_size, opts.kv_dtype, opts.n_kv_blocks, opts.kv_memory_bytes)),
      scratch_(std::make_unique<scratch>()) {
  if (opts.block_size <= 0) throw failure(errc::invalid_argument, "KV block size must be positive");
  salt_ = engine_prefix_salt(*model_, opts.block_size, opts.matmul, opts.kv_dtype);
  if (opts.prefix_cache) prefix_ = std::make_unique<prefix_index>(pool_);
  scratch_->kptr.resize(size_t(pool_threads_.size()));
  for (int i = 0; i < pool_threads_.size(); ++i) scratch_->solo.push_back(std::make_unique<kernels::thread_pool>(1));
  scratch_->vptr.resize(size_t(pool_threads_.size()));
}

engine::~engine() = default;

seq_id engine::create_sequence() {
  const seq_id s = next_seq_++;
  seqs_.emplace(s, sequence{});
  return s;
}

status engine::free_sequence(seq_id s) {
  auto it = seqs_.find(s);
  if (it == seqs_.end()) return {errc::unknown_sequence, "sequence " + std::to_string(s) + " does not exist"};
  for (block_id b : it->second.blocks) pool_.release(b);
  seqs_.erase(it);
  return {};
}

int32_t engine::sequence_length(seq_id s) const {
  auto it = seqs_.find(s);
  return it == seqs_.end() ? -1 : it->second.n_tokens;
}

int32_t engine::blocks_needed(seq_id s, int32_t n_tokens) const {
  auto it = seqs_.find(s);
  const int32_t have = it == seqs_.end() ? 0 : int32_t(it->second.blocks.size());
  const int32_t len = it == seqs_.end() ? 0 : it->second.n_tokens;
  return std::max(0, div_up(len + n_tokens, opts_.block_size) - have);
}

int32_t engine::available_blocks() const { return pool_.free_blocks() + (prefix_ ? prefix_->evictable() : 0); }

bool engine::make_room(int32_t n) {
  if (n <= pool_.free_blocks()) return true;
  if (prefix_) prefix_->evict(n - pool_.free_blocks());
  return n <= pool_.free_blocks();
}

int32_t engine::attach_prefix(seq_id s, std::span<const token_id> prompt) {
  auto it = seqs_.find(s);
  if (!prefix_ || it == seqs_.end() || it->second.n_tokens != 0 || prompt.empty()) return 0;
  sequence& sq = it->second;
  prefix_counts_.lookup_tokens += prompt.size();
  const auto keys = prompt_block_keys(salt_, prompt, opts_.block_size);
  const auto blocks = prefix_->match(keys);
  for (block_id b : blocks) {
    pool_.retain(b);
    sq.blocks.push_back(b);
  }
  sq.n_tokens = int32_t(blocks.size()) * opts_.block_size;
  sq.tokens.assign(prompt.begin(), prompt.begin() + sq.n_tokens);
  sq.keys.assign(keys.begin(), keys.begin() + std::ptrdiff_t(blocks.size()));
  prefix_counts_.hit_tokens += uint64_t(sq.n_tokens);
  return sq.n_tokens;
}

int32_t engine::blocks_freed_by(seq_id s) const {
  auto it = seqs_.find(s);
  if (it == seqs_.end()) return 0;
  const sequence& sq = it->second;
  int32_t n = 0;
  for (size_t i = 0; i < sq.blocks.size(); ++i) {
    const int32_t refs = pool_.ref_count(sq.blocks[i]);
    const bool cached_here = prefix_ && i < sq.keys.size() && prefix_->block_of(sq.keys[i]) == sq.blocks[i];
    if (refs == 1 || (refs == 2 && cached_here)) ++n;
  }
  return n;
}

int32_t engine::cache_blocks(std::span<const block_key> keys, std::span<const kv_block_export> blocks) {
  if (!prefix_) return 0;
  const kv_layout& lay = pool_.layout();
  int32_t n = 0;
  for (size_t i = 0; i < keys.size() && i < blocks.size(); ++i, ++n) {
    if (prefix_->block_of(keys[i]) >= 0) continue;
    const kv_block_export& e = blocks[i];
    const bool ok = e.request == keys[i] && e.checksum == e.compute_checksum() && e.model_id == model_->identity() &&
                    e.dtype == lay.dtype && e.block_size == lay.block_size && e.n_kv_head == lay.n_kv_head &&
                    e.head_dim == lay.head_dim && e.layer_begin == 0 && e.layer_end == lay.n_layer &&
                    e.pos_begin % lay.block_size == 0 && e.pos_end - e.pos_begin == lay.block_size &&
                    int64_t(e.payload.size()) == lay.words_per_block();
    if (!ok || !make_room(1)) break;
    const block_id b = pool_.allocate();
    std::memcpy(pool_.block_data(b), e.payload.data(), e.payload.size() * sizeof(float));
    prefix_->insert(keys[i], b);
    pool_.release(b);  // only the cache holds it until a sequence attaches it
  }
  if (n > 0) (void)prefix_->match(keys.first(size_t(n)));
  return n;
}

seq_id engine::start_prompt(uint64_t id, std::span<const token_id> prompt, prefix_claims& claims, int32_t& reused) {
  reused = 0;
  if (!prefix_ || prompt.empty()) return create_sequence();
  const auto keys = prompt_block_keys(salt_, prompt, opts_.block_size);
  const int32_t cached = prefix_->count_cached(keys);
  if (claims.blocked(id, keys, cached)) {
    reused = (cached + claims.claimed_run(keys, cached, id)) * opts_.block_size;
    return 0;
  }
  const seq_id s = create_sequence();
  reused = attach_prefix(s, prompt);
  claims.claim(id, std::span(keys).subspan(size_t(reused / opts_.block_size)));
  return s;
}

int32_t engine::cached_prefix_tokens(std::span<const token_id> prompt) const {
  if (!prefix_ || prompt.empty()) return 0;
  const auto keys = prompt_block_keys(salt_, prompt, opts_.block_size);
  return prefix_->count_cached(keys) * opts_.block_size;
}

prefix_cache_stats engine::prefix_stats() const {
  prefix_cache_stats st = prefix_counts_;
  if (prefix_) {
    st.evicted_blocks = prefix_->evicted_total();
    st.cached_blocks = prefix_->size();
  }
  return st;
}

std::vector<block_key> engine::sequence_keys(seq_id s) const {
  auto it = seqs_.find(s);
  if (it == seqs_.end() || !it->second.keyable) return {};
  const sequence& sq = it->second;
  std::vector<block_key> keys = sq.keys;
  block_key parent = keys.empty() ? salt_ : keys.back();
  const size_t bs = size_t(opts_.block_size);
  for (size_t b = keys.size(); (b + 1) * bs <= size_t(sq.n_tokens) && (b + 1) * bs <= sq.tokens.size(); ++b) {
    parent = next_block_key(parent, std::span(sq.tokens).subspan(b * bs, bs));
    keys.push_back(parent);
  }
  return keys;
}

void engine::publish_full_blocks(sequence& sq) {
  if (!prefix_ || !sq.keyable) return;
  const size_t bs = size_t(opts_.block_size);
  const size_t before = sq.keys.size();
  block_key parent = sq.keys.empty() ? salt_ : sq.keys.back();
  for (size_t b = before; (b + 1) * bs <= size_t(sq.n_tokens) && (b + 1) * bs <= sq.tokens.size(); ++b) {
    parent = next_block_key(parent, std::span(sq.tokens).subspan(b * bs, bs));
    sq.keys.push_back(parent);
    // Already cached under this key (computed twice at once): this copy stays private.
    if (prefix_->insert(parent, sq.blocks[b])) ++prefix_counts_.published_blocks;
  }
  if (sq.keys.size() != before) (void)prefix_->match(sq.keys);  // head first in recency
}

status engine::forward(std::span<const batch_entry> batch, std::vector<float>& logits, const layer_hook& after_layer) {
  const llama_config& c = config();
  const int32_t T = int32_t(batch.size());
  if (T == 0) return {};

  // Validate everything and count blocks before touching any state (all-or-nothing).
  std::unordered_map<seq_id, int32_t> added;
  std::vector<int32_t> pos(static_cast<size_t>(T));
  std::vector<sequence*> seqs(static_cast<size_t>(T));
  for (int32_t t = 0; t < T; ++t) {
    const auto& e = batch[size_t(t)];
    auto it = seqs_.find(e.seq);
    if (it == seqs_.end()) return {errc::unknown_sequence, "sequence " + std::to_string(e.seq) + " does not exist"};
    if (e.token < 0 || e.token >= c.n_vocab)
      return {errc::invalid_argument,
              "token id " + std::to_string(e.token) + " is outside the vocabulary (" + std::to_string(c.n_vocab) + ")"};
    seqs[size_t(t)] = &it->second;
    pos[size_t(t)] = it->second.n_tokens + added[e.seq]++;
    if (pos[size_t(t)] >= c.n_ctx)
      return {errc::context_overflow,
              "sequence " + std::to_string(e.seq) + " would exceed the context length " + std::to_string(c.n_ctx)};
  }
  int32_t need = 0;
  for (auto& [s, n] : added) need += blocks_needed(s, n);
  if (!make_room(need))
    return {errc::out_of_kv_blocks,
            "batch needs " + std::to_string(need) + " KV blocks, " + std::to_string(pool_.free_blocks()) + " free"};
  for (auto& [s, n] : added) {
    sequence& sq = seqs_.at(s);
    for (int32_t i = blocks_needed(s, n); i > 0; --i) sq.blocks.push_back(pool_.allocate());
  }

  // The hook may export these positions before forward returns: count them in first.
  for (auto& [s, n] : added) seqs_.at(s).n_tokens += n;
  for (int32_t t = 0; t < T; ++t) {
    sequence& sq = *seqs[size_t(t)];
    if (sq.keyable && int32_t(sq.tokens.size()) == pos[size_t(t)]) sq.tokens.push_back(batch[size_t(t)].token);
    else sq.keyable = false;  // its earlier tokens are unknown: its blocks cannot be named
  }
  run_layers(batch, pos, seqs, after_layer);
  if (prefix_)
    for (auto& [s, n] : added) publish_full_blocks(seqs_.at(s));

  // Logits only for the rows asked for: the output head is the largest matmul per token.
  std::vector<int32_t> rows;
  for (int32_t t = 0; t < T; ++t)
    if (batch[size_t(t)].want_logits) rows.push_back(t);
  logits.resize(rows.size() * size_t(c.n_vocab));
  if (!rows.empty()) {
    scratch& s = *scratch_;
    grow(s.xn, int64_t(rows.size()) * c.dim);
    for (size_t i = 0; i < rows.size(); ++i)
      cpu::rms_norm(s.x.data() + int64_t(rows[i]) * c.dim, model_->output_norm().data(),
                    s.xn.data() + int64_t(i) * c.dim, 1, c.dim, c.rms_eps);
    cpu::matmul(model_->output(), s.xn.data(), int64_t(rows.size()), logits.data(), pool_threads_, opts_.matmul);
    if (c.final_logit_softcap > 0) cpu::softcap(logits.data(), int64_t(logits.size()), c.final_logit_softcap);
  }
  return {};
}

void engine::run_layers(std::span<const batch_entry> batch, std::span<const int32_t> pos,
                        std::span<sequence* const> seqs, const layer_hook& after_layer) {
  const llama_config& c = config();
  const int64_t T = int64_t(batch.size());
  const int64_t q_dim = int64_t(c.n_head) * c.head_dim, kv_dim = int64_t(c.n_kv_head) * c.head_dim;
  const int32_t n_rep = c.n_head / c.n_kv_head, bs = opts_.block_size;
  scratch& s = *scratch_;
  grow(s.x, T * c.dim);
  grow(s.xn, T * c.dim);
  grow(s.q, T * q_dim);
  grow(s.k, T * kv_dim);
  grow(s.v, T * kv_dim);
  grow(s.attn, T * q_dim);
  grow(s.proj, T * c.dim);
  grow(s.gate, T * c.ffn_dim);
  grow(s.up, T * c.ffn_dim);
  const architecture_traits& arch = traits(c.arch);
  const auto rope_apply = arch.rope == rope_style::neox ? &cpu::rope_apply_neox : &cpu::rope_apply;

  // Row-wise elementwise work on rows [r0, r1): split over `pool` when there are enough rows to
  // pay for a dispatch (prefill), inline otherwise (decode, or one thread's piece of the fused
  // job below, whose pool has one thread). Rows are independent: the same results whatever the
  // split (the serial parts of a 2-thread prefill were its weak scaling).
  auto rows_parallel = [&](int64_t r0, int64_t r1, kernels::thread_pool& pool, int64_t width, auto&& fn) {
    if ((r1 - r0) * width < (int64_t(1) << 15) || pool.size() == 1) return fn(r0, r1);
    pool.parallel_for(r1 - r0, 1, [&](int64_t a, int64_t b, int) { fn(r0 + a, r0 + b); });
  };
  // One angle table per distinct (base, scale) of the layers (model.h: rope_variants).
  if (s.rope_cs.size() < c.rope_variants.size()) s.rope_cs.resize(c.rope_variants.size());
  for (size_t i = 0; i < c.rope_variants.size(); ++i) {
    grow(s.rope_cs[i], T * c.head_dim);
    rows_parallel(0, T, pool_threads_, 16 * c.head_dim, [&](int64_t r0, int64_t r1) {  // sin/cos: dearer than a copy
      cpu::rope_table(pos.data() + r0, r1 - r0, c.head_dim, c.rope_variants[i].first,
                      s.rope_cs[i].data() + r0 * c.head_dim, c.rope_variants[i].second,
                      c.rope_freq_factors.empty() ? nullptr : c.rope_freq_factors.data());
    });
  }
  // y_i = in · W_iᵀ for weights that share one input. The RMSNorm (or SwiGLU) before a
  // projection is fused into it where the kernels convert x anyway (cpu::fuses_input: each
  // row is normed as it is quantized or rounded to bf16, in L1); elsewhere the input is formed
  // once into `formed` for all of them. Bitwise the same either way.
  // One token (decode): one job whose tasks are row slices of every weight (a slice of rows is
  // itself a weight_view), instead of one dispatch per weight; larger batches: cpu::matmul_group
  // (one conversion of the input and one job for weights with panels of one type).
  auto matmuls = [&](int64_t r0, int64_t r1, kernels::thread_pool& pool, cpu::matmul_input in, int64_t width,
                     float* formed, std::initializer_list<std::pair<const kernels::weight_view*, float*>> mats) {
    const int64_t m = r1 - r0;
    // Rows [r0, r1): the input's rows (and SwiGLU's up rows), the outputs' rows.
    in.x += r0 * width;
    if (in.op == cpu::input_op::silu_mul || in.op == cpu::input_op::gelu_mul) in.aux += r0 * width;
    if (in.op != cpu::input_op::none &&
        !std::all_of(mats.begin(), mats.end(), [](const auto& wy) { return cpu::fuses_input(*wy.first); })) {
      cpu::form_input(in, m, width, formed + r0 * width, pool);
      in = cpu::matmul_input{formed + r0 * width};
    }
    const int threads = pool.size();
    if (m != 1 || threads == 1) {
      std::array<cpu::matmul_output, 4> outs;
      size_t n = 0;
      for (auto [w, y] : mats) outs.at(n++) = {w, y + r0 * w->rows};
      cpu::matmul_group(std::span<const cpu::matmul_output>(outs.data(), n), in, m, pool, opts_.matmul);
      return;
    }
    s.slices.clear();
    for (auto [w, y] : mats) {
      const int64_t row_bytes = kernels::row_bytes(w->type, w->cols), bytes = w->rows * row_bytes;
      // Slices of at least 128 KiB of weights (as cpu::matmul's decode split), one per thread.
      const int64_t parts = std::clamp<int64_t>(bytes / (int64_t(1) << 17), 1, threads);
      const int64_t align = kernels::row_align(*w);
      const int64_t per = ((w->rows + parts - 1) / parts + align - 1) / align * align;
      for (int64_t w0 = 0; w0 < w->rows; w0 += per)
        s.slices.push_back(
            {w, y + r0 * w->rows, w0, std::min(w->rows, w0 + per), std::min(per, w->rows - w0) * row_bytes});
    }
    std::stable_sort(s.slices.begin(), s.slices.end(), [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
    pool.for_each_dynamic(int64_t(s.slices.size()), [&](int64_t i, int p) {
      const auto& t = s.slices[size_t(i)];
      cpu::matmul(kernels::slice_rows(*t.w, t.r0, t.r1), in, 1, t.y + t.r0, *s.solo[size_t(p)], opts_.matmul);
    });
  };

  // x: [T, dim] ← token embeddings
  const auto& emb = model_->tok_embd();
  const int64_t emb_row = kernels::row_bytes(emb.type, c.dim);
  rows_parallel(0, T, pool_threads_, c.dim, [&](int64_t r0, int64_t r1) {
    for (int64_t t = r0; t < r1; ++t)
      kernels::dequantize_row(emb.type, static_cast<const uint8_t*>(emb.data) + batch[size_t(t)].token * emb_row,
                              s.x.data() + t * c.dim, c.dim);
    if (c.embedding_scale != 1.0f) cpu::scale_inplace(s.x.data() + r0 * c.dim, (r1 - r0) * c.dim, c.embedding_scale);
  });

  // Attention work, the same for every layer: runs of consecutive entries of one sequence
  // (consecutive positions), cut into tiles, times KV heads. Order: the sequences with the
  // longest contexts first (balance); within one, head by head and the longest tiles first, so
  // that the tiles a thread takes in turn read the same head's K/V (one head's blocks stay in
  // its L2; taking the heads in turn made every thread stream all of them from L3 at long
  // contexts). Each task writes its own rows: the order changes no result.
  s.attn_tasks.clear();
  const int32_t tile = cpu::attention_tile_tokens(n_rep);
  for (int32_t t0 = 0; t0 < int32_t(T);) {
    int32_t t1 = t0 + 1;
    while (t1 < int32_t(T) && t1 - t0 < tile && seqs[size_t(t1)] == seqs[size_t(t0)] &&
           pos[size_t(t1)] == pos[size_t(t1) - 1] + 1)
      ++t1;
    for (int32_t g = 0; g < c.n_kv_head; ++g) s.attn_tasks.push_back({t0, t1 - t0, g, pos[size_t(t1) - 1]});
    t0 = t1;
  }
  // Per sequence: its last position in the batch and its first entry (a stable tie-break).
  std::unordered_map<const sequence*, std::pair<int32_t, int32_t>> seq_key;
  for (const attn_task& a : s.attn_tasks) {
    auto [it, fresh] = seq_key.try_emplace(seqs[size_t(a.first)], a.last_pos, a.first);
    if (!fresh) it->second = {std::max(it->second.first, a.last_pos), std::min(it->second.second, a.first)};
  }
  std::stable_sort(s.attn_tasks.begin(), s.attn_tasks.end(), [&](const attn_task& a, const attn_task& b) {
    const sequence *sa = seqs[size_t(a.first)], *sb = seqs[size_t(b.first)];
    if (sa != sb) {
      const auto ka = seq_key[sa], kb = seq_key[sb];
      return ka.first != kb.first ? ka.first > kb.first : ka.second < kb.second;
    }
    return a.kv_head != b.kv_head ? a.kv_head < b.kv_head : a.last_pos > b.last_pos;
  });

  const kernels::dtype kvt = pool_.layout().dtype;
  const int64_t kv_row_bytes = kernels::row_bytes(kvt, c.head_dim);
  const cpu::k_order k_order = cpu::kv_k_order(kvt);  // K transposed in its blocks but for q8_0
  cpu::input_op act = cpu::input_op::none;  // the gated activation, fused into the down projection's input
  switch (arch.activation) {
    case ffn_activation::silu: act = cpu::input_op::silu_mul; break;
    case ffn_activation::gelu_tanh: act = cpu::input_op::gelu_mul; break;
  }

  // A layer is row-wise work around one step that mixes rows, attention. Rows [r0, r1) on
  // `pool` (one thread's piece of the fused job below and its single-thread pool, or the whole
  // batch and the engine's pool):
  // Layer l's q/k/v and what each token needs before attention: q: [T, n_head, head_dim], k
  // and v: [T, n_kv_head, head_dim]; biases, per-head q/k norms, RoPE, then its K/V into the
  // cache (in the cache's dtype; later entries of the batch attend to it).
  auto before_attention = [&](int32_t l, int64_t r0, int64_t r1, kernels::thread_pool& pool) {
    const layer_weights& w = model_->layers()[size_t(l)];
    const cpu::matmul_input attn_in{s.x.data(), cpu::input_op::rms_norm, w.attn_norm.data(), c.rms_eps};
    matmuls(r0, r1, pool, attn_in, c.dim, s.xn.data(), {{&w.wq, s.q.data()}, {&w.wk, s.k.data()}, {&w.wv, s.v.data()}});
    const float* cs = s.rope_cs[size_t(w.rope_variant)].data();
    rows_parallel(r0, r1, pool, q_dim + 2 * kv_dim, [&](int64_t t0, int64_t t1) {
      const int64_t n = t1 - t0;
      float* q = s.q.data() + t0 * q_dim;
      float* k = s.k.data() + t0 * kv_dim;
      float* v = s.v.data() + t0 * kv_dim;
      if (!w.bq.empty()) {
        cpu::add_rows(q, w.bq.data(), n, q_dim);
        cpu::add_rows(k, w.bk.data(), n, kv_dim);
        cpu::add_rows(v, w.bv.data(), n, kv_dim);
      }
      if (!w.q_norm.empty()) {  // each head normalised on its own: rows of head_dim
        cpu::rms_norm(q, w.q_norm.data(), q, n * c.n_head, c.head_dim, c.rms_eps);
        cpu::rms_norm(k, w.k_norm.data(), k, n * c.n_kv_head, c.head_dim, c.rms_eps);
      }
      rope_apply(q, cs + t0 * c.head_dim, n, c.n_head, c.head_dim);
      for (int64_t t = t0; t < t1; ++t) {
        const int32_t p = pos[size_t(t)];
        const block_id b = seqs[size_t(t)]->blocks[size_t(p / bs)];
        const int64_t off = int64_t(p % bs) * kv_row_bytes;
        for (int32_t h = 0; h < c.n_kv_head; ++h) {
          // RoPE fused into the K write: the rotated row goes straight into the block.
          cpu::store_k_row_roped(kvt, k_order, arch.rope, s.k.data() + t * kv_dim + int64_t(h) * c.head_dim,
                                 cs + t * c.head_dim, pool_.k(b, l, h), p % bs, bs, c.head_dim);
          kernels::quantize_row(kvt, s.v.data() + t * kv_dim + int64_t(h) * c.head_dim,
                                static_cast<uint8_t*>(pool_.v(b, l, h)) + off, c.head_dim);
        }
      }
    });
  };
  // Tasks: (tile of a run of one sequence's consecutive entries, KV head), costliest (longest
  // context) first, handed out dynamically. The GQA group's query heads of a tile read each
  // K/V row once.
  auto attention = [&](int32_t l) {
    const int32_t window = model_->layers()[size_t(l)].sliding ? c.sliding_window : 0;
    pool_threads_.for_each_dynamic(int64_t(s.attn_tasks.size()), [&](int64_t i, int thread) {
      const attn_task& task = s.attn_tasks[size_t(i)];
      auto& kp = s.kptr[size_t(thread)];
      auto& vp = s.vptr[size_t(thread)];
      const sequence& sq = *seqs[size_t(task.first)];
      const int32_t pos0 = pos[size_t(task.first)];
      const int32_t nb = div_up(pos0 + task.n_tok, bs);
      kp.resize(size_t(nb));
      vp.resize(size_t(nb));
      for (int32_t b = 0; b < nb; ++b) {
        kp[size_t(b)] = pool_.k(sq.blocks[size_t(b)], l, task.kv_head);
        vp[size_t(b)] = pool_.v(sq.blocks[size_t(b)], l, task.kv_head);
      }
      const int64_t q_off = int64_t(task.first) * q_dim + int64_t(task.kv_head) * n_rep * c.head_dim;
      cpu::attention_causal(s.q.data() + q_off, q_dim, task.n_tok, n_rep, pos0, kp.data(), vp.data(), kvt, k_order, bs,
                            c.head_dim, c.attn_scale, s.attn.data() + q_off, q_dim, window);
    });
  };
  // Layer l after attention: the output projection, the FFN, each joining the residual x
  // (Gemma's post-norms normalise a block's output first).
  auto after_attention = [&](int32_t l, int64_t r0, int64_t r1, kernels::thread_pool& pool) {
    const layer_weights& w = model_->layers()[size_t(l)];
    auto add_residual = [&](const std::vector<float>& post_norm) {
      rows_parallel(r0, r1, pool, c.dim, [&](int64_t t0, int64_t t1) {
        float* proj = s.proj.data() + t0 * c.dim;
        if (!post_norm.empty()) cpu::rms_norm(proj, post_norm.data(), proj, t1 - t0, c.dim, c.rms_eps);
        cpu::add_inplace(s.x.data() + t0 * c.dim, proj, (t1 - t0) * c.dim);
      });
    };
    matmuls(r0, r1, pool, {s.attn.data()}, q_dim, nullptr, {{&w.wo, s.proj.data()}});
    add_residual(w.attn_post_norm);
    const cpu::matmul_input ffn_in{s.x.data(), cpu::input_op::rms_norm, w.ffn_norm.data(), c.rms_eps};
    matmuls(r0, r1, pool, ffn_in, c.dim, s.xn.data(), {{&w.w_gate, s.gate.data()}, {&w.w_up, s.up.data()}});
    // [T, ffn_dim] each; the activation formed in place where the kernels do not fuse it
    matmuls(r0, r1, pool, {s.gate.data(), act, s.up.data()}, c.ffn_dim, s.gate.data(), {{&w.w_down, s.proj.data()}});
    add_residual(w.ffn_post_norm);
  };

  // A prefill-sized batch on several threads: everything from one layer's attention to the
  // next one's is row-wise, so it runs as one job in which each thread takes one piece of the
  // rows through all of it (the output projection, the FFN, the next layer's q/k/v and KV
  // writes), each matmul on its own rows with a single-thread pool. The threads then meet twice
  // per layer instead of at every matmul and elementwise step, and each reads the rows it wrote
  // itself. Split by weight panels instead, every thread read all of x from the other core and
  // the VM's speed jitter was paid at ~11 barriers per layer: a 2-thread q8_0 prefill of 509
  // tokens ran at a median 1.81x one thread's speed, against 1.90x this way, and 25% faster
  // (docs/performance.md).
  // Each thread reads all the weights, once per piece: cutting pieces smaller (so that a thread
  // could take over part of a slow one's) read them again per piece and cost f32, whose 25 MB
  // per layer do not stay in L3, ~7% (2011 against 2149 tok/s). So a thread's piece is sized
  // by the speed it showed in the jobs before (row_split: one vCPU of a VM often runs slower
  // than the other for seconds), and a thread that has not started its piece by the time
  // another is done leaves it to that one. The same kernels on the same rows: bitwise the
  // results of the batch-wide path, whatever the pieces.
  const int threads = pool_threads_.active();
  const bool fused = threads > 1 && T >= 64 * int64_t(threads);
  if (!fused) {
    for (int32_t l = 0; l < c.n_layer; ++l) {
      before_attention(l, 0, T, pool_threads_);
      if (after_layer) after_layer(l);
      attention(l);
      after_attention(l, 0, T, pool_threads_);
    }
    return;
  }
  if (s.split.threads() != threads) {
    s.split = row_split(threads);
    s.piece_taken = std::make_unique<std::atomic<bool>[]>(size_t(threads));
    s.split_rows.assign(size_t(threads), 0);
    s.split_seconds.assign(size_t(threads), 0);
  }
  auto row_job = [&](auto&& stretch) {
    for (int q = 0; q < threads; ++q) {
      s.piece_taken[size_t(q)].store(false, std::memory_order_relaxed);
      s.split_rows[size_t(q)] = 0;
      s.split_seconds[size_t(q)] = 0;
    }
    pool_threads_.for_each_dynamic(threads, [&](int64_t, int p) {
      auto run = [&](int q) {
        const row_split::piece pc = s.split.piece_of(q, T);
        if (pc.begin == pc.end) return;
        const auto t0 = std::chrono::steady_clock::now();
        stretch(pc.begin, pc.end, *s.solo[size_t(p)]);
        if (p >= threads) return;  // a core share grew since `threads` was read: a helper only
        s.split_seconds[size_t(p)] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        s.split_rows[size_t(p)] += pc.end - pc.begin;
      };
      // Its own piece first, then any piece whose thread has not started it.
      if (p < threads && !s.piece_taken[size_t(p)].exchange(true, std::memory_order_acq_rel)) run(p);
      for (int q = 0; q < threads; ++q)
        if (!s.piece_taken[size_t(q)].exchange(true, std::memory_order_acq_rel)) run(q);
    });
    s.split.observe(s.split_rows, s.split_seconds);
  };
  row_job([&](int64_t r0, int64_t r1, kernels::thread_pool& solo) { before_attention(0, r0, r1, solo); });
  for (int32_t l = 0; l < c.n_layer; ++l) {
    if (after_layer) after_layer(l);
    attention(l);
    row_job([&](int64_t r0, int64_t r1, kernels::thread_pool& solo) {
      after_attention(l, r0, r1, solo);
      if (l + 1 < c.n_layer) before_attention(l + 1, r0, r1, solo);
    });
  }
}

status engine::prefill(seq_id s, std::span<const token_id> tokens, std::vector<float>& last_logits) {
  if (tokens.empty()) return {errc::invalid_argument, "prefill needs at least one token"};
  std::vector<batch_entry> batch(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) batch[i] = {s, tokens[i], i + 1 == tokens.size()};
  return forward(batch, last_logits);
}

status engine::decode(std::span<const seq_id> seqs, std::span<const token_id> tokens, std::vector<float>& logits) {
  if (seqs.size() != tokens.size()) return {errc::invalid_argument, "decode needs one token per sequence"};
  std::vector<batch_entry> batch(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (size_t j = 0; j < i; ++j)
      if (seqs[j] == seqs[i])
        return {errc::invalid_argument, "sequence " + std::to_string(seqs[i]) + " appears twice in a decode batch"};
    batch[i] = {seqs[i], tokens[i], true};
  }
  return forward(batch, logits);
}

status engine::export_kv(seq_id s, std::vector<kv_block_export>& out) const {
  out.clear();
  return export_kv(s, 0, config().n_layer, 0, out);
}

status engine::export_kv(seq_id s, int32_t layer_begin, int32_t layer_end, int32_t from_pos,
                         std::vector<kv_block_export>& out, uint64_t request, uint32_t epoch) const {
  auto it = seqs_.find(s);
  if (it == seqs_.end()) return {errc::unknown_sequence, "sequence " + std::to_string(s) + " does not exist"};
  const kv_layout& lay = pool_.layout();
  if (layer_begin < 0 || layer_end > lay.n_layer || layer_begin >= layer_end || from_pos < 0)
    return {errc::invalid_argument, "export_kv: bad layer or position range"};
  const sequence& sq = it->second;
  const int64_t per_layer = lay.words_per_layer();
  for (size_t i = size_t(from_pos / lay.block_size); i < sq.blocks.size(); ++i) {
    kv_block_export e;
    e.model_id = model_->identity();
    e.layer_begin = layer_begin;
    e.layer_end = layer_end;
    e.pos_begin = int32_t(i) * lay.block_size;
    e.pos_end = std::min(sq.n_tokens, e.pos_begin + lay.block_size);
    if (e.pos_end <= e.pos_begin) break;
    e.dtype = lay.dtype;
    e.block_size = lay.block_size;
    e.n_kv_head = lay.n_kv_head;
    e.head_dim = lay.head_dim;
    e.request = request;
    e.epoch = epoch;
    // block memory: [n_layer][2][n_kv_head][block_size x head_dim]; a layer range is contiguous
    const float* src = pool_.block_data(sq.blocks[i]) + int64_t(layer_begin) * per_layer;
    e.payload.assign(src, src + int64_t(layer_end - layer_begin) * per_layer);
    e.checksum = e.compute_checksum();
    out.push_back(std::move(e));
  }
  return {};
}

status engine::import_kv(seq_id s, std::span<const kv_block_export> blocks, std::span<const token_id> tokens) {
  std::vector<const kv_block_export*> parts;
  parts.reserve(blocks.size());
  for (const auto& b : blocks) parts.push_back(&b);
  return import_kv(s, std::span<const kv_block_export* const>(parts), tokens);
}

status engine::import_kv(seq_id s, std::span<const kv_block_export* const> blocks, std::span<const token_id> tokens) {
  auto it = seqs_.find(s);
  if (it == seqs_.end()) return {errc::unknown_sequence, "sequence " + std::to_string(s) + " does not exist"};
  sequence& sq = it->second;
  if (sq.n_tokens != 0) return {errc::invalid_argument, "import needs an empty sequence"};
  const kv_layout& lay = pool_.layout();
  const int64_t per_layer = lay.words_per_layer();
  // cover[block][layer]: the piece that provides it (the one with the most positions).
  std::vector<std::vector<const kv_block_export*>> cover;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const kv_block_export& e = *blocks[i];
    const std::string which = "KV block " + std::to_string(i);
    if (e.checksum != e.compute_checksum())
      return {errc::checksum_mismatch, which + " fails its checksum: corrupted in transit"};
    if (e.model_id != model_->identity()) return {errc::incompatible_kv, which + " was made by a different model"};
    if (e.dtype != lay.dtype)
      return {errc::incompatible_kv, which + " holds " + std::string(kernels::to_string(e.dtype)) +
                                         " KV; this engine's cache is " + std::string(kernels::to_string(lay.dtype)) +
                                         " (--kv-dtype must match on both sides)"};
    if (e.block_size != lay.block_size || e.n_kv_head != lay.n_kv_head || e.head_dim != lay.head_dim ||
        e.layer_begin < 0 || e.layer_end > lay.n_layer || e.layer_begin >= e.layer_end ||
        int64_t(e.payload.size()) != int64_t(e.layer_end - e.layer_begin) * per_layer)
      return {errc::incompatible_kv, which + " has a different layout than this engine's cache"};
    if (e.pos_begin < 0 || e.pos_begin % lay.block_size != 0 || e.pos_end <= e.pos_begin ||
        e.pos_end - e.pos_begin > lay.block_size || e.pos_end > config().n_ctx)
      return {errc::incompatible_kv, which + " has positions that are not one block's"};
    const size_t b = size_t(e.pos_begin / lay.block_size);
    if (b >= cover.size()) cover.resize(b + 1, std::vector<const kv_block_export*>(size_t(lay.n_layer), nullptr));
    for (int32_t l = e.layer_begin; l < e.layer_end; ++l) {
      auto& c = cover[b][size_t(l)];
      if (!c || c->pos_end < e.pos_end) c = &e;
    }
  }
  int32_t n_tokens = 0;
  for (size_t b = 0; b < cover.size(); ++b) {
    const std::string which = "KV block at position " + std::to_string(b * size_t(lay.block_size));
    for (const auto* c : cover[b])
      if (!c) return {errc::incompatible_kv, which + " is missing layers: the KV set is incomplete"};
    const int32_t end = cover[b][0]->pos_end;
    for (const auto* c : cover[b])
      if (c->pos_end != end) return {errc::incompatible_kv, which + " has layers of different lengths"};
    if (b + 1 < cover.size() && end - cover[b][0]->pos_begin != lay.block_size)
      return {errc::incompatible_kv, which + " is partial but not the last: positions do not continue"};
    n_tokens = end;
  }
  if (!make_room(int32_t(cover.size())))
    return {errc::out_of_kv_blocks, "import needs " + std::to_string(cover.size()) + " KV blocks, " +
                                        std::to_string(pool_.free_blocks()) + " free"};
  for (const auto& layers : cover) {
    const block_id b = pool_.allocate();
    float* dst = pool_.block_data(b);
    for (int32_t l = 0; l < lay.n_layer; ++l) {
      const kv_block_export& e = *layers[size_t(l)];
      std::memcpy(dst + int64_t(l) * per_layer, e.payload.data() + int64_t(l - e.layer_begin) * per_layer,
                  size_t(per_layer) * sizeof(float));
    }
    sq.blocks.push_back(b);
  }
  sq.n_tokens = n_tokens;
  if (int32_t(tokens.size()) >= n_tokens) {
    sq.tokens.assign(tokens.begin(), tokens.begin() + n_tokens);
    publish_full_blocks(sq);
  } else {
    sq.keyable = false;
  }
  return {};
}

}  // namespace tandem
