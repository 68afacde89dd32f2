#pragma once
// What crosses a process boundary (CAF 0.17's middleman): the inspect() overloads of every
// message type a worker in another process exchanges with the router and the request actors,
// and the wire version. Included by protocol.h before any message is made, so that every
// translation unit sees the same (serializable) definition of each type.
//
// KV payloads never travel this way: a KV link moves them over transport/channel.h, and the
// control messages that mention a KV set carry it empty. kv_blocks_ptr is still serializable
// (its payloads included) so that a message is never silently emptied on the wire.
#include <caf/error.hpp>
#include <caf/none.hpp>
#include <utility>

#include <caf/meta/load_callback.hpp>
#include <caf/meta/type_name.hpp>

#include <memory>
#include <vector>

#include "runtime/kv/kv_cache.h"
#include "runtime/scheduler/policy.h"
#include "runtime/request_types.h"
#include "runtime/engine/sampler.h"
#include "runtime/serving_config.h"

namespace caf {
class actor_system_config;
}

namespace tandem {

// Bumped whenever a message type that crosses processes changes shape or meaning. A peer
// with another version is refused at join time (actors/cluster.h), before any such message.
// History: 2: sampling_params carries logit_bias, stop tokens, min_tokens, penalties, logprobs;
//   token_logprobs. 3: done carries finish_reason (an enum), errc travels as its value, refusals
//   as caf::error. 4: the join is hello (version alone), then node_hello / node_welcome
//   (inspected, not JSON); a node link is asked for by (p, d). 5: a decode worker takes (tick)
//   (its pacing), step_settings carries tpot_target_ms and decode_pace_ms. 6: sampling_params
//   carries a grammar. 7: request_spec carries its client. 8: workers tell a request their name
//   and its cached tokens. 9: worker_stats carries the current step's sequences and prompt
//   tokens; decode_worker_load its local_prefill_tokens, step_settings local_prefill (auto mode).
constexpr uint32_t wire_version = 9;

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sampling_params& x) {
  return f(caf::meta::type_name("sampling_params"), x.temperature, x.top_k, x.top_p, x.seed, x.bias_tokens,
           x.bias_values, x.stop_tokens, x.min_tokens, x.presence_penalty, x.frequency_penalty, x.logprobs,
           x.repetition_penalty, x.grammar, caf::meta::load_callback([&]() -> caf::error {
             // The compiled form is rebuilt here (the text was checked where the request came
             // in); should it not compile, the text stays and the step allows only the end.
             x.constraint.reset();
             if (!x.grammar.empty()) {
               std::string text = x.grammar;
               if (!x.set_grammar(text).ok()) x.grammar = std::move(text);
             }
             return caf::none;
           }));
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_logprobs& x) {
  return f(caf::meta::type_name("token_logprobs"), x.logprob, x.top_ids, x.top_logprobs);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, request_spec& x) {
  return f(caf::meta::type_name("request_spec"), x.id, x.prompt, x.max_tokens, x.sampling, x.ignore_eos, x.epoch,
           x.resumed, x.client);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, prefill_worker_load& x) {
  return f(caf::meta::type_name("prefill_worker_load"), x.worker, x.alive, x.queued_tokens, x.queued_requests,
           x.cached_tokens);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, decode_worker_load& x) {
  return f(caf::meta::type_name("decode_worker_load"), x.worker, x.alive, x.free_blocks, x.total_blocks, x.batch_size,
           x.max_batch, x.local_prefill_tokens);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_block_export& x) {
  return f(caf::meta::type_name("kv_block_export"), x.model_id, x.layer_begin, x.layer_end, x.pos_begin, x.pos_end,
           x.dtype, x.block_size, x.n_kv_head, x.head_dim, x.request, x.epoch, x.checksum, x.payload);
}

// A shared, immutable set: written as (present, blocks), read into a fresh set.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, std::shared_ptr<const std::vector<kv_block_export>>& x) {
  bool present = x != nullptr;
  std::vector<kv_block_export> blocks;
  if constexpr (Inspector::reads_state) {
    if (x) blocks = *x;
  }
  return f(caf::meta::type_name("kv_blocks"), present, blocks, caf::meta::load_callback([&]() -> caf::error {
             x = present ? std::make_shared<const std::vector<kv_block_export>>(std::move(blocks)) : nullptr;
             return caf::none;
           }));
}

// The settings a router sends its joining nodes (runtime/serving_config.h).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_settings& x) {
  return f(caf::meta::type_name("kv_settings"), x.dtype, x.block_size, x.prefix_cache, x.stream, x.stream_layer_group,
           x.store_memory_bytes, x.store_disk_path, x.store_disk_bytes, x.transport);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_settings& x) {
  return f(caf::meta::type_name("step_settings"), x.matmul, x.chunk_size, x.prefill_token_budget,
           x.colocated_token_budget, x.max_batch, x.tpot_target_ms, x.decode_pace_ms, x.local_prefill);
}

// Announces every type above (and the handles and containers the messages hold) to an actor
// system, under the same names on every side, as CAF 0.17's middleman requires.
void register_wire_types(caf::actor_system_config& cfg);

}  // namespace tandem
