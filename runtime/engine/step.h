#pragma once
// One worker step on an engine, described as data: what to free, import, prefill and decode.
// Workers (prefill, decode, colocated) build a step_work on their actor thread, run it on
// their compute thread with run_step, and apply the step_result back on the actor thread.
// Keeping it here, free of actors, lets the same step be unit-tested directly.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/engine/sampler.h"

namespace tandem {

using work_id = uint64_t;  // the caller's id for a sequence (a request id)
using kv_blocks_ptr = std::shared_ptr<const std::vector<kv_block_export>>;
using prompt_ptr = std::shared_ptr<const std::vector<token_id>>;  // shared by a request's steps

struct step_work {
  std::vector<seq_id> frees;  // sequences to drop before anything else
  struct import_item {  // KV arriving from elsewhere; decoded in this same step
    work_id id = 0;
    std::vector<kv_blocks_ptr> kv;  // its pieces; together one complete set
    token_id last = 0;  // the last token generated so far (its KV is not in the blocks yet)
    int32_t index = 0;  // the index of the token this step samples
    sampling_params sampling;
    int32_t kv_tokens = -1;  // positions the set must cover (-1: unchecked); a lost tail is caught here
    std::vector<token_id> tokens;  // the tokens the set holds, if known: names its blocks (prefix keys)
    // Instead of `last`: several tokens to compute after the set (a prompt's tail when its
    // cached blocks came from the host store); the last one's logits are sampled.
    std::vector<token_id> feed;
    std::vector<token_id> output;  // the output so far, when sampling.needs_output() (else empty)
    prompt_ptr prompt;  // the prompt's tokens, when sampling.repeats() (else null)
  };
  std::vector<import_item> imports;
  struct chunk_item {  // part of a prompt
    work_id id = 0;
    seq_id seq = 0;  // 0: create the sequence first
    std::vector<token_id> tokens;
    bool last = false;  // completes the prompt: sample token 0 from its logits
    bool export_kv = false;  // ... and export the prompt's KV blocks
    sampling_params sampling;
    // Streaming: >= 0 sends the KV as it is made, every layer group, from this position on
    // (0 for the first streamed chunk of a prompt, the chunk's start after that).
    int32_t stream_from = -1;
    uint32_t epoch = 0;  // tags the streamed pieces
    int32_t first_index = 0;  // output index of the token sampled at the end (resumed requests: > 0)
    std::vector<token_id> output;  // the output so far (first_index tokens), when sampling.needs_output()
    prompt_ptr prompt;  // the whole prompt, when sampling.repeats()
  };
  std::vector<chunk_item> chunks;
  struct decode_item {  // one token for a running sequence
    work_id id = 0;
    seq_id seq = 0;
    token_id last = 0;
    int32_t index = 0;
    sampling_params sampling;
    std::vector<token_id> output;  // the output so far (index tokens), when sampling.needs_output()
    prompt_ptr prompt;  // the prompt's tokens, when sampling.repeats()
  };
  std::vector<decode_item> decodes;
  // Where streamed pieces go, called on the compute thread during the forward pass.
  std::function<void(work_id, kv_blocks_ptr)> on_kv_piece;
  int32_t stream_layer_group = 4;  // layers per streamed piece
};

struct step_result {
  status error;  // the forward pass failed (nothing changed but frees/imports)
  double ms = 0;
  int32_t batch_tokens = 0;
  int32_t free_blocks = 0;  // engine pool after the step: free, or held only by the prefix cache
  int32_t cached_only_blocks = 0;  // of those, the ones the prefix cache keeps (evictable)
  struct created {
    work_id id;
    seq_id seq;
  };
  std::vector<created> created_seqs;
  struct imported {
    work_id id;
    seq_id seq;
    status st;
  };
  std::vector<imported> imports;
  struct sampled {
    work_id id;
    token_id token;
    int32_t index;
    std::shared_ptr<const token_logprobs> logprobs;  // when its sampling asks for them
  };
  std::vector<sampled> tokens;  // for completed prompts (index 0), imports and decodes
  struct exported {
    work_id id;
    kv_blocks_ptr kv;
  };
  std::vector<exported> exports;
};

// Runs the step. Sequences created for chunks are reported even when the forward fails, so
// the caller can free them.
step_result run_step(engine& eng, step_work work);

}  // namespace tandem
