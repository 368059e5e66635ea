// runtime::ParseHostPort: the rendezvous and service addresses users type.
#include "runtime/util.h"

#include "gtest/gtest.h"

namespace lspo::runtime {
namespace {

TEST(ParseHostPortTest, HostsAndPortsAreSplit) {
  auto a = ParseHostPort("10.0.0.5:29500", "distributed.rendezvous");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "10.0.0.5");
  EXPECT_EQ(a->port, 29500);
  auto b = ParseHostPort("node-1.cluster:1", "x");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->host, "node-1.cluster");
  EXPECT_EQ(b->port, 1);
  auto c = ParseHostPort("[::1]:65535", "x");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host, "::1");
  EXPECT_EQ(c->port, 65535);
}

TEST(ParseHostPortTest, MalformedValuesAreNamedWithTheForm) {
  for (const char* v : {"", "host", ":29500", "host:", "host:0", "host:65536", "host:12a",
                        "::1:29500", "[::1]29500", "[::1:29500", "host:-1", "host:123456"}) {
    auto r = ParseHostPort(v, "distributed.rendezvous");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << v;
    EXPECT_NE(r.status().message().find(std::string("distributed.rendezvous = '") + v + "'"),
              std::string::npos)
        << r.status();
    EXPECT_NE(r.status().message().find("use host:port"), std::string::npos) << r.status();
  }
}

}  // namespace
}  // namespace lspo::runtime
