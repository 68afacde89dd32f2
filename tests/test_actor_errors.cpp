// tandem errors survive the trip through CAF: an actor that fails with a tandem status is seen
// by its requester with the same code and message.
#include <gtest/gtest.h>

#include <caf/all.hpp>

#include "actors/error.h"

using namespace tandem;

namespace {
using alloc_atom = caf::atom_constant<caf::atom("alloc")>;

// (An argument, because CAF 0.17 dereferences a null tuple for argument-less spawns: UBSan.)
caf::behavior failing_pool(caf::event_based_actor*, int32_t free_blocks) {
  return {[free_blocks](alloc_atom, int32_t n) -> caf::result<int32_t> {
    if (n > free_blocks) return to_caf_error(status{errc::out_of_kv_blocks, "need " + std::to_string(n) + ", 4 free"});
    return n;
  }};
}
}  // namespace

TEST(ActorErrors, RoundTripThroughARequest) {
  caf::actor_system_config cfg;
  register_error_category(cfg);
  cfg.set("scheduler.max-threads", 2);
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto pool = sys.spawn(failing_pool, int32_t(4));
  bool got_error = false;
  self->request(pool, std::chrono::seconds(5), alloc_atom::value, int32_t(9))
      .receive([](int32_t) { FAIL() << "expected an error"; },
               [&](caf::error& e) {
                 got_error = true;
                 const status st = from_caf_error(e);
                 EXPECT_EQ(st.code(), errc::out_of_kv_blocks);
                 EXPECT_EQ(st.message(), "need 9, 4 free");
                 const std::string rendered = sys.render(e);
                 EXPECT_NE(rendered.find("tandem: out_of_kv_blocks"), std::string::npos) << rendered;
               });
  EXPECT_TRUE(got_error);
  self->request(pool, std::chrono::seconds(5), alloc_atom::value, int32_t(2))
      .receive([](int32_t n) { EXPECT_EQ(n, 2); }, [](caf::error& e) { FAIL() << caf::to_string(e); });
  caf::anon_send_exit(pool, caf::exit_reason::user_shutdown);
}

TEST(ActorErrors, ForeignErrorsGetTheNearestCodeAndKeepTheirText) {
  const status st = from_caf_error(caf::make_error(caf::sec::request_timeout));
  EXPECT_EQ(st.code(), errc::timeout);
  EXPECT_NE(st.message().find("request_timeout"), std::string::npos) << st.message();
  EXPECT_EQ(from_caf_error(caf::make_error(caf::sec::request_receiver_down)).code(), errc::worker_failed);
  EXPECT_EQ(from_caf_error(caf::make_error(caf::sec::no_route_to_receiving_node)).code(), errc::worker_failed);
  EXPECT_EQ(from_caf_error(caf::make_error(caf::sec::unexpected_message)).code(), errc::internal);
  EXPECT_EQ(from_caf_error(to_caf_error({errc::refused, "batch full"})).code(), errc::refused);
  EXPECT_TRUE(from_caf_error(caf::error{}).ok());
  EXPECT_FALSE(to_caf_error(status{}));
}
