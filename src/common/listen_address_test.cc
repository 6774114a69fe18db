#include "common/listen_address.h"

#include <gtest/gtest.h>

namespace gpulet {
namespace {

TEST(ParseListenAddress, Forms) {
  EXPECT_EQ(*ParseListenAddress(":9400"), (ListenAddress{"0.0.0.0", 9400}));
  EXPECT_EQ(*ParseListenAddress("127.0.0.1:0"), (ListenAddress{"127.0.0.1", 0}));
  EXPECT_EQ(*ParseListenAddress("[::1]:8080"), (ListenAddress{"::1", 8080}));
  EXPECT_EQ(*ParseListenAddress("localhost:1"), (ListenAddress{"localhost", 1}));
}

TEST(ParseListenAddress, RefusesNamingTheText) {
  for (const char* bad : {"9400", ":", ":abc", ":70000", "[::1]9400", "::1:9400", ":123456"}) {
    Result<ListenAddress> a = ParseListenAddress(bad);
    ASSERT_FALSE(a.ok()) << bad;
    EXPECT_EQ(a.status().code(), ErrorCode::kUsage);
    EXPECT_NE(a.status().message().find(bad), std::string::npos) << a.status().message();
  }
}

TEST(IsLoopback, Hosts) {
  EXPECT_TRUE(IsLoopback("127.0.0.1"));
  EXPECT_TRUE(IsLoopback("::1"));
  EXPECT_TRUE(IsLoopback("localhost"));
  EXPECT_FALSE(IsLoopback("0.0.0.0"));
  EXPECT_FALSE(IsLoopback("10.0.0.1"));
}

}  // namespace
}  // namespace gpulet
