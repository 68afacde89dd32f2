#include "runtime/engine/step.h"

#include <chrono>

namespace tandem {

step_result run_step(engine& eng, step_work work) {
  const auto t0 = std::chrono::steady_clock::now();
  step_result r;
  for (seq_id s : work.frees) (void)eng.free_sequence(s);

  // Every entry that wants logits, in batch order, with what to do with its row.
  struct wanted {
    work_id id;
    int32_t index;
    const sampling_params* sampling;
    const std::vector<token_id>* output;
    const prompt_ptr* prompt;
  };
  std::vector<wanted> rows;
  std::vector<batch_entry> batch;

  for (auto& im : work.imports) {
    const seq_id s = eng.create_sequence();
    std::vector<const kv_block_export*> parts;
    for (const auto& piece : im.kv)
      if (piece)
        for (const auto& b : *piece) parts.push_back(&b);
    status st = eng.import_kv(s, parts, im.tokens);
    if (st.ok() && im.kv_tokens >= 0 && eng.sequence_length(s) != im.kv_tokens)
      st = {errc::incompatible_kv, "the KV set covers " + std::to_string(eng.sequence_length(s)) + " positions, not " +
                                       std::to_string(im.kv_tokens) + ": it is incomplete"};
    if (!st.ok()) {
      (void)eng.free_sequence(s);
      r.imports.push_back({im.id, 0, st});
      continue;
    }
    r.imports.push_back({im.id, s, {}});
    if (im.feed.empty()) {
      batch.push_back({s, im.last, true});
    } else {
      for (size_t i = 0; i < im.feed.size(); ++i) batch.push_back({s, im.feed[i], i + 1 == im.feed.size()});
    }
    rows.push_back({im.id, im.index, &im.sampling, &im.output, &im.prompt});
  }
  for (auto& d : work.decodes) {
    batch.push_back({d.seq, d.last, true});
    rows.push_back({d.id, d.index, &d.sampling, &d.output, &d.prompt});
  }
  std::vector<std::pair<size_t, seq_id>> chunk_seq;  // chunk index -> sequence
  for (size_t i = 0; i < work.chunks.size(); ++i) {
    auto& c = work.chunks[i];
    seq_id s = c.seq;
    if (s == 0) {
      s = eng.create_sequence();
      r.created_seqs.push_back({c.id, s});
    }
    chunk_seq.emplace_back(i, s);
    for (size_t t = 0; t < c.tokens.size(); ++t) {
      const bool want = c.last && t + 1 == c.tokens.size();
      batch.push_back({s, c.tokens[t], want});
      if (want) rows.push_back({c.id, c.first_index, &c.sampling, &c.output, &c.prompt});
    }
  }
  r.batch_tokens = int32_t(batch.size());

  // Streamed chunks: after every layer group, that group's blocks from stream_from on.
  struct streamed {
    work_id id;
    seq_id seq;
    int32_t from;
    uint32_t epoch;
  };
  std::vector<streamed> streams;
  if (work.on_kv_piece)
    for (auto [i, s] : chunk_seq) {
      const auto& c = work.chunks[i];
      if (c.stream_from >= 0) streams.push_back({c.id, s, c.stream_from, c.epoch});
    }
  const int32_t n_layer = eng.config().n_layer;
  const int32_t group = std::max(1, work.stream_layer_group);
  int32_t group_begin = 0;
  engine::layer_hook hook;
  if (!streams.empty())
    hook = [&](int32_t l) {
      if ((l + 1) % group != 0 && l + 1 != n_layer) return;
      for (const auto& st : streams) {
        auto piece = std::make_shared<std::vector<kv_block_export>>();
        if (eng.export_kv(st.seq, group_begin, l + 1, st.from, *piece, st.id, st.epoch).ok())
          work.on_kv_piece(st.id, std::move(piece));
      }
      group_begin = l + 1;
    };

  std::vector<float> logits;
  r.error = eng.forward(batch, logits, hook);
  if (r.error.ok()) {
    const size_t V = size_t(eng.config().n_vocab);
    std::vector<float> adjusted;
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& sp = *rows[i].sampling;
      const uint64_t index = uint64_t(rows[i].index);
      const auto& vocab = eng.get_model().tok();
      auto l =
          adjusted_logits(std::span<const float>(logits).subspan(i * V, V), sp, index, vocab, adjusted, *rows[i].output,
                          *rows[i].prompt ? std::span<const token_id>(**rows[i].prompt) : std::span<const token_id>());
      l = constrained_logits(l, sp, *rows[i].output, vocab, adjusted);
      const token_id tok = sample(l, sp, index);
      std::shared_ptr<const token_logprobs> lp;
      if (sp.logprobs >= 0)
        lp = std::make_shared<token_logprobs>(
            logprobs_of(std::span<const float>(logits).subspan(i * V, V), tok, sp.logprobs));
      r.tokens.push_back({rows[i].id, tok, rows[i].index, std::move(lp)});
    }
    for (auto [i, s] : chunk_seq) {
      const auto& c = work.chunks[i];
      if (!c.last || !c.export_kv) continue;
      auto blocks = std::make_shared<std::vector<kv_block_export>>();
      if (eng.export_kv(s, 0, eng.config().n_layer, 0, *blocks, c.id, c.epoch).ok())
        r.exports.push_back({c.id, std::move(blocks)});
    }
  }
  // As /admin/state counts them: a block only the prefix cache holds is free to take (it is
  // evicted on demand), so it is counted free, and reported apart.
  r.free_blocks = eng.available_blocks();
  r.cached_only_blocks = r.free_blocks - eng.kv_pool().free_blocks();
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace tandem
