#pragma once
// The model engine a worker actor owns: one model (shared, read-only), its own thread pool,
// its own KV block pool. No global state, so several engines live in one process.
//
// Forward work is a batch of entries, each one token of one sequence. Prefill is a batch of
// one sequence's next tokens (chunks of any size: chunked prefill); decode is a batch of one
// token for each of several sequences of different lengths (continuous batching); a mix of
// both is the colocated step.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/thread_pool.h"
#include "runtime/errors.h"
#include "runtime/kv/kv_cache.h"
#include "runtime/model/model.h"
#include "runtime/kv/prefix_cache.h"

namespace tandem {

using seq_id = int64_t;

struct engine_options {
  int n_threads = 1;
  // Cores shared with the process's other engines (kernels/thread_pool.h): the engine then
  // computes on as many of them as the share allows (at least n_threads while it is busy).
  std::shared_ptr<kernels::core_share> cores;
  int core_group = 0;  // its kind in the share (kernels::core_share::join)
  int32_t block_size = 16;
  // KV pool size: n_kv_blocks if > 0, else as many blocks as kv_memory_bytes holds.
  int32_t n_kv_blocks = 0;
  int64_t kv_memory_bytes = 256ll << 20;
  // batch_invariant (the default): a token's logits do not depend on the batch it is computed
  // in, so recovery by re-prefill is exact (kernels/cpu/matmul.h); fastest: GEMM prefill.
  kernels::cpu::matmul_mode matmul = kernels::cpu::matmul_mode::batch_invariant;
  // Element type of the KV cache (f32, f16 or bf16; kv_cache.h). f16 halves what decode
  // reads per step, what a KV link moves and what the host store holds, against f32.
  kernels::dtype kv_dtype = kernels::dtype::f16;
  // Full blocks are named by content (runtime/kv/prefix_cache.h) and kept after their sequence
  // ends, until the pool needs them: a prompt that starts like an earlier one reuses them.
  bool prefix_cache = false;
};

// What the prefix cache did so far (counters since the engine started, and its size now).
struct prefix_cache_stats {
  uint64_t hit_tokens = 0;  // prompt tokens attach_prefix found cached
  uint64_t lookup_tokens = 0;  // prompt tokens attach_prefix was asked about
  uint64_t published_blocks = 0;
  uint64_t evicted_blocks = 0;
  int32_t cached_blocks = 0;  // named blocks held now (in use or not)
};

// The KV blocks one worker's engine holds: `blocks` when positive, else as many of the model's
// blocks (block_size tokens, kv_dtype) as `memory_bytes` holds, at least one. The engine, the
// router's prefix-cache capacity and a node's announcement all size a worker by this rule.
int32_t kv_blocks_per_worker(const model& m, int32_t block_size, kernels::dtype kv_dtype, int32_t blocks,
                             int64_t memory_bytes);

// The prefix-cache salt of engines of this model with these options: equal salts mean equal
// block keys name equal bytes (the router computes keys with it too).
uint64_t engine_prefix_salt(const model& m, int32_t block_size, kernels::cpu::matmul_mode matmul,
                            kernels::dtype kv_dtype);

struct batch_entry {
  seq_id seq = 0;
  token_id token = 0;
  bool want_logits = false;
};

class engine {
 public:
  engine(std::shared_ptr<const model> m, engine_options opts);
  ~engine();
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  const model& get_model() const { return *model_; }
  const llama_config& config() const { return model_->config(); }
  const kv_block_pool& kv_pool() const { return pool_; }
  int n_threads() const { return pool_threads_.size(); }
  // In a core share: whether this engine has work now (its owner says: a decode worker while it
  // holds sequences, a prefill worker while a step runs); others then leave it its floor.
  void set_busy(bool busy) { pool_threads_.set_busy(busy); }
  // An engine of another group in the share is busy (a decode engine: a prefill one computes).
  bool other_groups_busy() const { return pool_threads_.other_groups_busy(); }

  seq_id create_sequence();
  status free_sequence(seq_id s);  // returns every block the sequence holds
  bool has_sequence(seq_id s) const { return seqs_.count(s) != 0; }
  int32_t sequence_length(seq_id s) const;  // tokens in its KV cache; -1 if unknown
  // Blocks a sequence would need to grow by n tokens (0 if its last block has room).
  int32_t blocks_needed(seq_id s, int32_t n_tokens) const;
  // Blocks a forward pass can take: free ones and cached ones no sequence holds (evicted on
  // demand, least recently used first).
  int32_t available_blocks() const;
  // Blocks that become available when s is freed (those no other sequence shares).
  int32_t blocks_freed_by(seq_id s) const;
  int32_t block_size() const { return opts_.block_size; }

  // Prefix reuse (with engine_options::prefix_cache). Gives the empty sequence s the cached
  // full blocks that start `prompt`, at most up to its last token (whose logits the caller
  // needs computed): the tokens it now holds, a multiple of the block size (0 without a hit).
  int32_t attach_prefix(seq_id s, std::span<const token_id> prompt);
  // How many leading tokens of `prompt` attach_prefix would give now (recency untouched).
  int32_t cached_prefix_tokens(std::span<const token_id> prompt) const;
  bool prefix_cache_enabled() const { return prefix_ != nullptr; }
  uint64_t prefix_salt() const { return salt_; }
  prefix_cache_stats prefix_stats() const;
  // Adds full blocks fetched from elsewhere (a KV store) to the prefix cache: blocks[i] is the
  // block named keys[i], tagged with that key under its checksum. Each is checked as import_kv
  // checks (checksum, model, layout, one whole block); the first refused ends the run. Returns
  // how many are cached now (added or already there).
  int32_t cache_blocks(std::span<const block_key> keys, std::span<const kv_block_export> blocks);
  // Keys of the full blocks a sequence holds now (the tokens it was computed or imported with).
  std::vector<block_key> sequence_keys(seq_id s) const;
  // With the prefix cache: starts `prompt` on a new sequence with its cached prefix attached,
  // unless another request (per `claims`) is computing its next uncached block: then 0, and
  // the caller asks again later. `reused` gets the attached tokens (when it waits: those it
  // will find, cached or being computed); the rest is claimed by id.
  seq_id start_prompt(uint64_t id, std::span<const token_id> prompt, prefix_claims& claims, int32_t& reused);

  // Runs one forward pass over `batch`. Entries of one sequence must appear in order; each
  // entry takes the next position of its sequence. `logits` receives one row of n_vocab per
  // entry with want_logits, in batch order. All-or-nothing: on out_of_kv_blocks,
  // context_overflow or unknown_sequence nothing changes.
  // `after_layer(l)`, if set, runs on the calling thread as soon as layer l's K/V of the whole
  // batch is in the cache: a prefill worker streams finished layers while later ones compute.
  using layer_hook = std::function<void(int32_t layer)>;
  status forward(std::span<const batch_entry> batch, std::vector<float>& logits, const layer_hook& after_layer = {});

  // Appends `tokens` to s; `last_logits` gets the logits after the last token.
  status prefill(seq_id s, std::span<const token_id> tokens, std::vector<float>& last_logits);
  // Advances each sequence by one token; logits: [seqs.size(), n_vocab].
  status decode(std::span<const seq_id> seqs, std::span<const token_id> tokens, std::vector<float>& logits);

  // A sequence's KV as blocks (what a KV link moves) and the way back into another engine.
  status export_kv(seq_id s, std::vector<kv_block_export>& out) const;
  // Part of it: layers [layer_begin, layer_end) of the blocks holding positions from
  // `from_pos` on (appended to out). Streaming a prefill sends such pieces as they finish.
  // Each piece is tagged with (request, epoch) under its checksum.
  status export_kv(seq_id s, int32_t layer_begin, int32_t layer_end, int32_t from_pos,
                   std::vector<kv_block_export>& out, uint64_t request = 0, uint32_t epoch = 0) const;
  // Imports into an empty sequence. Pieces may split a block by layers, and a block may come
  // more than once as it fills (the piece with the most positions wins), but together they
  // must cover every layer of consecutive blocks from position 0 with one length per block.
  // Refuses a piece whose checksum, model or shape do not match, or an incomplete set
  // (checksum_mismatch / incompatible_kv), leaving s empty.
  // `tokens`, when it covers the imported positions, names the blocks for the prefix cache.
  status import_kv(seq_id s, std::span<const kv_block_export> blocks, std::span<const token_id> tokens = {});
  status import_kv(seq_id s, std::span<const kv_block_export* const> blocks, std::span<const token_id> tokens = {});

 private:
  struct sequence {
    std::vector<block_id> blocks;
    int32_t n_tokens = 0;
    // For the prefix cache: the tokens its KV holds (empty when unknown: an import without
    // them), and the keys of its first keys.size() full blocks.
    std::vector<token_id> tokens;
    std::vector<block_key> keys;
    bool keyable = true;
  };
  // Names the sequence's newly full blocks in the prefix cache.
  void publish_full_blocks(sequence& sq);
  // Makes n blocks free, evicting unused cached ones if needed: false if it cannot.
  bool make_room(int32_t n);
  // Attention for entries [first, first + n_tok) of a batch (one sequence, consecutive
  // positions) and one KV head; last_pos orders tasks by cost.
  struct attn_task {
    int32_t first, n_tok, kv_head, last_pos;
  };
  struct scratch;
  void run_layers(std::span<const batch_entry> batch, std::span<const int32_t> pos, std::span<sequence* const> seqs,
                  const layer_hook& after_layer);

  std::shared_ptr<const model> model_;
  engine_options opts_;
  kernels::thread_pool pool_threads_;
  kv_block_pool pool_;
  uint64_t salt_ = 0;
  std::unique_ptr<prefix_index> prefix_;  // after pool_: destroyed first, it holds pool blocks
  prefix_cache_stats prefix_counts_;
  std::map<seq_id, sequence> seqs_;
  seq_id next_seq_ = 1;
  std::unique_ptr<scratch> scratch_;
};

}  // namespace tandem
