// Every message type that crosses processes survives CAF's serialization whole: a field left
// out of an inspect() overload would arrive as its default on the other side.
#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>

#include "actors/cluster.h"
#include "actors/error.h"
#include "actors/protocol.h"
#include "runtime/structured/grammar.h"

using namespace tandem;

namespace {

struct WireFixture : ::testing::Test {
  WireFixture() : sys(init(cfg)) {}
  static caf::actor_system_config& init(caf::actor_system_config& c) {
    register_error_category(c);
    register_wire_types(c);
    return c;
  }
  // Through a type-erased message, as the middleman sends it.
  caf::message round_trip(const caf::message& m) {
    std::vector<char> buf;
    caf::binary_serializer sink{sys, buf};
    auto msg = m;
    EXPECT_FALSE(sink(msg));
    caf::binary_deserializer source{sys, buf};
    caf::message out;
    EXPECT_FALSE(source(out));
    return out;
  }
  caf::actor_system_config cfg;
  caf::actor_system sys;
};

}  // namespace

TEST_F(WireFixture, RequestSpecKeepsEveryField) {
  request_spec s;
  s.id = 42;
  s.prompt = {1, 5, 9, 300};
  s.max_tokens = 17;
  s.sampling = {.temperature = 0.7f, .top_k = 5, .top_p = 0.9f, .seed = 1234567890123ull};
  s.ignore_eos = true;
  s.epoch = 3;
  s.resumed = 2;
  auto out = round_trip(caf::make_message(prefill_atom::value, s));
  ASSERT_TRUE((out.match_elements<prefill_atom, request_spec>()));
  const auto& r = out.get_as<request_spec>(1);
  EXPECT_EQ(r.id, 42u);
  EXPECT_EQ(r.prompt, s.prompt);
  EXPECT_EQ(r.max_tokens, 17);
  EXPECT_EQ(r.sampling.temperature, 0.7f);
  EXPECT_EQ(r.sampling.top_k, 5);
  EXPECT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.seed, 1234567890123ull);
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.epoch, 3u);
  EXPECT_EQ(r.resumed, 2);
  EXPECT_TRUE(r.sampling.grammar.empty());
  EXPECT_EQ(r.sampling.constraint, nullptr);
}

// A grammar travels as its text; the receiving side compiles it again (its own constraint,
// which follows the output it is given), and a text that does not compile there still arrives
// (the step then allows only the end) rather than the constraint being dropped.
TEST_F(WireFixture, GrammarTravelsAsTextAndIsRebuilt) {
  request_spec s;
  s.id = 7;
  ASSERT_TRUE(s.sampling.set_grammar("root ::= \"{\" [a-z]* \"}\"").ok());
  auto out = round_trip(caf::make_message(prefill_atom::value, s));
  const auto& r = out.get_as<request_spec>(1);
  EXPECT_EQ(r.sampling.grammar, s.sampling.grammar);
  ASSERT_NE(r.sampling.constraint, nullptr);
  EXPECT_NE(r.sampling.constraint, s.sampling.constraint);
  EXPECT_EQ(r.sampling.constraint->rules().rules(), s.sampling.constraint->rules().rules());
  request_spec bad;
  bad.sampling.grammar = "root ::= nothing";  // as from a peer that checks differently
  auto out2 = round_trip(caf::make_message(prefill_atom::value, bad));
  const auto& r2 = out2.get_as<request_spec>(1);
  EXPECT_EQ(r2.sampling.grammar, "root ::= nothing");
  EXPECT_EQ(r2.sampling.constraint, nullptr);
}

TEST_F(WireFixture, LoadsStatsStatesAndErrorsKeepEveryField) {
  prefill_worker_load p{3, false, 1234, 7, 64};
  decode_worker_load d{2, true, 10, 100, 5, 64};
  worker_stats w;
  w.name = "decode-2";
  w.kv_total_blocks = 100;
  w.kv_free_blocks = 40;
  w.reserved_blocks = 50;
  w.active = 6;
  w.max_batch = 64;
  w.steps = 99;
  w.busy = true;
  w.finished_steps = 98;
  auto out = round_trip(caf::make_message(p, d, w, request_state::transferring, errc::checksum_mismatch,
                                          finish_reason::length, to_caf_error({errc::refused, "batch full"})));
  // (errc is a plain enum in messages, as in (fail_atom, errc, message); a caf::error carries
  // one too, with its message: only error.cpp declares errc a CAF error code.)
  ASSERT_TRUE((out.match_elements<prefill_worker_load, decode_worker_load, worker_stats, request_state, errc,
                                  finish_reason, caf::error>()))
      << to_string(out);
  const auto& p2 = out.get_as<prefill_worker_load>(0);
  EXPECT_EQ(p2.worker, 3);
  EXPECT_FALSE(p2.alive);
  EXPECT_EQ(p2.queued_tokens, 1234);
  EXPECT_EQ(p2.queued_requests, 7);
  EXPECT_EQ(p2.cached_tokens, 64);
  const auto& d2 = out.get_as<decode_worker_load>(1);
  EXPECT_EQ(d2.worker, 2);
  EXPECT_EQ(d2.free_blocks, 10);
  EXPECT_EQ(d2.total_blocks, 100);
  EXPECT_EQ(d2.batch_size, 5);
  EXPECT_EQ(d2.max_batch, 64);
  const auto& w2 = out.get_as<worker_stats>(2);
  EXPECT_EQ(w2.name, "decode-2");
  EXPECT_EQ(w2.kv_free_blocks, 40);
  EXPECT_EQ(w2.reserved_blocks, 50);
  EXPECT_EQ(w2.active, 6);
  EXPECT_EQ(w2.steps, 99u);
  EXPECT_TRUE(w2.busy);
  EXPECT_EQ(w2.finished_steps, 98u);
  EXPECT_EQ(out.get_as<request_state>(3), request_state::transferring);
  EXPECT_EQ(out.get_as<errc>(4), errc::checksum_mismatch);
  const status refused = from_caf_error(out.get_as<caf::error>(6));
  EXPECT_EQ(refused.code(), errc::refused);
  EXPECT_EQ(refused.message(), "batch full");
  EXPECT_EQ(out.get_as<finish_reason>(5), finish_reason::length);  // done_atom's reason, from a remote worker
}

TEST_F(WireFixture, KvSetsKeepNullEmptyAndPayloads) {
  kv_block_export b;
  b.model_id = 77;
  b.layer_begin = 1;
  b.layer_end = 2;
  b.pos_begin = 0;
  b.pos_end = 16;
  b.block_size = 16;
  b.n_kv_head = 2;
  b.head_dim = 4;
  b.request = 5;
  b.epoch = 1;
  b.payload.assign(2 * 2 * 16 * 4, 0.25f);
  b.payload[3] = -1.5f;
  b.checksum = b.compute_checksum();
  kv_blocks_ptr full = std::make_shared<const std::vector<kv_block_export>>(std::vector<kv_block_export>{b});
  kv_blocks_ptr empty = std::make_shared<const std::vector<kv_block_export>>();
  kv_blocks_ptr none;
  auto out = round_trip(caf::make_message(full, empty, none));
  ASSERT_TRUE((out.match_elements<kv_blocks_ptr, kv_blocks_ptr, kv_blocks_ptr>()));
  const auto& f = out.get_as<kv_blocks_ptr>(0);
  ASSERT_TRUE(f);
  ASSERT_EQ(f->size(), 1u);
  EXPECT_EQ((*f)[0].payload, b.payload);
  EXPECT_EQ((*f)[0].checksum, b.compute_checksum());
  EXPECT_EQ((*f)[0].compute_checksum(), b.checksum);  // every field came back
  ASSERT_TRUE(out.get_as<kv_blocks_ptr>(1));
  EXPECT_TRUE(out.get_as<kv_blocks_ptr>(1)->empty());
  EXPECT_FALSE(out.get_as<kv_blocks_ptr>(2));
}

TEST_F(WireFixture, TandemErrorsKeepCodeAndMessage) {
  auto out =
      round_trip(caf::make_message(to_caf_error({errc::unsupported, "wire version 9 is not this router's (1)"})));
  ASSERT_TRUE(out.match_elements<caf::error>());
  const status s = from_caf_error(out.get_as<caf::error>(0));
  EXPECT_EQ(s.code(), errc::unsupported);
  EXPECT_NE(s.message().find("wire version 9"), std::string::npos);
}

// The join: what a node announces and what the router answers, every field (a setting lost on
// the way would make the node's workers compute differently from the router's expectation).
TEST_F(WireFixture, JoinHelloAndWelcomeKeepEveryField) {
  node_hello h{
      node_role::decode, "n1", "host-a", "cpu (avx2, 2 threads per worker)", "tcp://10.0.0.2:9;host=a", 3, 2, 777,
      0xfeedbeefull};
  auto out = round_trip(caf::make_message(join_atom::value, h));
  ASSERT_TRUE((out.match_elements<join_atom, node_hello>()));
  const auto& hr = out.get_as<node_hello>(1);
  EXPECT_EQ(hr.role, node_role::decode);
  EXPECT_EQ(hr.name, "n1");
  EXPECT_EQ(hr.host, "host-a");
  EXPECT_EQ(hr.device, h.device);
  EXPECT_EQ(hr.kv_address, h.kv_address);
  EXPECT_EQ(hr.workers, 3);
  EXPECT_EQ(hr.threads, 2);
  EXPECT_EQ(hr.kv_blocks, 777);
  EXPECT_EQ(hr.model_id, 0xfeedbeefull);

  node_welcome w;
  w.node = 9;
  w.indices = {4, 5, 6};
  w.kv = {kernels::dtype::q8_0, 32, false, false, 2, 1234, "/tmp/x", 99, kv_transport_kind::shm};
  w.steps = {kernels::cpu::matmul_mode::fastest, 100, 300, 200, 17, 30.0, 12.5};
  w.kv_channel = channel_mode::tcp;
  w.heartbeat_ms = 55;
  auto wo = round_trip(caf::make_message(w));
  ASSERT_TRUE((wo.match_elements<node_welcome>()));
  const auto& r = wo.get_as<node_welcome>(0);
  EXPECT_EQ(r.node, 9u);
  EXPECT_EQ(r.indices, w.indices);
  EXPECT_EQ(r.kv.dtype, kernels::dtype::q8_0);
  EXPECT_EQ(r.kv.block_size, 32);
  EXPECT_FALSE(r.kv.prefix_cache);
  EXPECT_FALSE(r.kv.stream);
  EXPECT_EQ(r.kv.stream_layer_group, 2);
  EXPECT_EQ(r.kv.store_memory_bytes, 1234);
  EXPECT_EQ(r.kv.store_disk_path, "/tmp/x");
  EXPECT_EQ(r.kv.store_disk_bytes, 99);
  EXPECT_EQ(r.kv.transport, kv_transport_kind::shm);
  EXPECT_EQ(r.steps.matmul, kernels::cpu::matmul_mode::fastest);
  EXPECT_EQ(r.steps.chunk_size, 100);
  EXPECT_EQ(r.steps.prefill_token_budget, 300);
  EXPECT_EQ(r.steps.colocated_token_budget, 200);
  EXPECT_EQ(r.steps.max_batch, 17);
  EXPECT_EQ(r.steps.tpot_target_ms, 30.0);
  EXPECT_EQ(r.steps.decode_pace_ms, 12.5);
  EXPECT_EQ(r.kv_channel, channel_mode::tcp);
  EXPECT_EQ(r.heartbeat_ms, 55);
}
