// Kinds have one spelling each: to_string and parse are inverses for every value, anything
// else parses to nothing, and actor names round-trip.
#include <gtest/gtest.h>

#include "runtime/kinds.h"

using namespace tandem;

namespace {

template <class E, class Parse>
void round_trips(std::initializer_list<E> all, Parse parse) {
  for (E e : all) {
    const auto s = to_string(e);
    EXPECT_NE(s, "?");
    const auto back = parse(s);
    ASSERT_TRUE(back) << s;
    EXPECT_EQ(*back, e) << s;
  }
  EXPECT_FALSE(parse(""));
  EXPECT_FALSE(parse("nonsense"));
  EXPECT_FALSE(parse(std::string(to_string(*all.begin())) + " "));  // exact, not a prefix
}

}  // namespace

TEST(Kinds, EveryKindRoundTripsByItsName) {
  round_trips({serving_mode::disaggregated, serving_mode::colocated, serving_mode::automatic}, parse_serving_mode);
  round_trips({worker_kind::prefill, worker_kind::decode, worker_kind::colocated}, parse_worker_kind);
  round_trips({node_role::prefill, node_role::decode}, parse_node_role);
  round_trips(
      {kv_transport_kind::handoff, kv_transport_kind::local, kv_transport_kind::shm, kv_transport_kind::channel},
      parse_kv_transport_kind);
  round_trips({channel_mode::automatic, channel_mode::tcp, channel_mode::shm}, parse_channel_mode);
  round_trips({actor_kind::prefill, actor_kind::decode, actor_kind::colocated, actor_kind::kv_link, actor_kind::request,
               actor_kind::router, actor_kind::kv_store},
              parse_actor_kind);
  EXPECT_EQ(to_string(channel_mode::automatic), "auto");  // the flag's spelling
  EXPECT_FALSE(parse_node_role("colocated"));  // a node is prefill or decode
}

TEST(Kinds, ActorNamesHaveOneSpelling) {
  const struct {
    actor_name name;
    const char* text;
  } table[] = {
      {worker_name(worker_kind::decode, 1), "decode-1"},
      {worker_name(worker_kind::colocated, 0), "colocated-0"},
      {link_name(0, 3), "kv_link-p0-d3"},
      {link_name(12, 7), "kv_link-p12-d7"},
      {request_name(424242), "request-424242"},
      {actor_name{actor_kind::router}, "router"},
      {actor_name{actor_kind::kv_store}, "kv_store"},
  };
  for (const auto& row : table) {
    EXPECT_EQ(row.name.str(), row.text);
    const auto back = parse_actor_name(row.text);
    ASSERT_TRUE(back) << row.text;
    EXPECT_EQ(*back, row.name) << row.text;
  }
  for (const char* bad : {"decode", "decode-", "decode-x", "decode--1", "decode-+1", "router-1", "kv_link-p0",
                          "kv_link-0-1", "kv_link-p0-d", "kv_link-p-d1", "p0->d1", "decode-99999999999", "lambda-1"})
    EXPECT_FALSE(parse_actor_name(bad)) << bad;
}
