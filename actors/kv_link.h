#pragma once
// A KV link: moves requests' KV blocks from one prefill worker to one decode worker through a
// transport (transport/). Decode never starts on partial KV: the decode worker imports the
// complete, checksummed set and only then acknowledges; the reply ends the prefill side's lease.
// Credits: the router reserved the blocks on the decode side before the link was asked.
#include <atomic>
#include <map>
#include <set>
#include <memory>

#include "actors/protocol.h"
#include "runtime/fault_injection.h"
#include "transport/channel.h"
#include "transport/transport.h"

namespace tandem {

struct kv_link_options {
  actor_name name = link_name(0, 0);  // "kv_link-p0-d1": its logs and metrics say so
  // channel: to a decode worker in another process, over transport/channel.h (this link then
  // lives in the prefill worker's process, and its decode worker's KV receiver stages what
  // lands); the others within one process (runtime/kinds.h).
  kv_transport_kind transport = kv_transport_kind::local;
  std::shared_ptr<metrics::registry> metrics;
  std::shared_ptr<fault_hooks> faults = no_faults();  // what faults this link meets (tests, tandem chaos)
  tandem::channel_mode channel_mode = tandem::channel_mode::automatic;  // channel: shm on one host, else tcp
  std::string kv_address;  // "channel": the decode process's KV receiver
  int32_t target = 0;  // "channel": the decode worker's index there
};

struct kv_link_state {
  kv_link_options opts;
  std::string label;  // opts.name as text, made once: its logs and metric labels
  decode_worker_actor decode;
  std::unique_ptr<transport::kv_transport> transport;
  // "channel": frames sent and not yet acknowledged (what they carried, for the accounting).
  std::unique_ptr<transport::kv_sender> sender;
  struct unacked_frame {
    transport::transfer_id id;
    request_id request;
    request_actor req;
    uint64_t bytes;
    steady::time_point sent;
  };
  std::vector<unacked_frame> unacked;
  std::set<request_id> failed_frames;  // requests with a frame that failed (seen while reaping)
  struct closing_transfer {  // "channel": a transfer waiting for its frames' acknowledgements
    request_spec spec;
    request_actor req;
    std::vector<token_id> generated;
    caf::typed_response_promise<bool> promise;
  };
  std::vector<closing_transfer> closing;  // in arrival order
  std::shared_ptr<std::atomic<bool>> ticking;  // a tick is in the mailbox (the sender told us)
  uint64_t transfers = 0, bytes = 0;
  int32_t in_flight = 0;  // transfers not answered yet (waiting for acknowledgements or the decode worker)
  bool retiring = false;  // a restart replaced this link: end once in_flight is 0
  struct held_transfer {  // fault injection: a transfer held back (delay_kv)
    request_spec spec;
    request_actor req;
    kv_blocks_ptr kv;
    std::vector<token_id> generated;
    caf::typed_response_promise<bool> promise;
  };
  std::map<uint64_t, held_transfer> held;
  uint64_t next_held = 1;
  static inline const char* name = "kv_link";
};

kv_link_actor::behavior_type kv_link_behavior(kv_link_actor::stateful_pointer<kv_link_state> self,
                                              decode_worker_actor decode, kv_link_options opts);

}  // namespace tandem
