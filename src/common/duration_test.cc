#include "common/duration.h"

#include <gtest/gtest.h>

namespace gpulet {
namespace {

using namespace std::chrono_literals;

TEST(ParseDuration, GoGrammar) {
  struct Case {
    const char* text;
    std::chrono::milliseconds want;
  } cases[] = {
      {"0", 0ms},
      {"500ms", 500ms},
      {"30s", 30s},
      {"5m", 5min},
      {"1h", 1h},
      {"1h30m", 90min},
      {"2h45m10s", 2h + 45min + 10s},
      {"1.5s", 1500ms},
      {".5s", 500ms},
      {"1500us", 1ms},
      {"2000000ns", 2ms},
      {"3\xC2\xB5s", 0ms},
      {"1d", 24h},
      {"+10s", 10s},
      {"0s", 0ms},
  };
  for (const Case& c : cases) {
    Result<std::chrono::milliseconds> d = ParseDuration(c.text);
    ASSERT_TRUE(d.ok()) << c.text << ": " << d.status().message();
    EXPECT_EQ(*d, c.want) << c.text;
  }
}

TEST(ParseDuration, RefusesWhatGoRefuses) {
  for (const char* bad : {"", "10", "-1s", "s", "1x", "1.2.3s", "ms", "1 s", "abc"}) {
    Result<std::chrono::milliseconds> d = ParseDuration(bad);
    EXPECT_FALSE(d.ok()) << bad;
    if (!d.ok()) {
      EXPECT_EQ(d.status().code(), ErrorCode::kInvalidInput);
      EXPECT_NE(d.status().message().find(std::string("\"") + bad + "\""), std::string::npos);
    }
  }
}

TEST(ParseDuration, BareNumberUsesTheCallersUnit) {
  EXPECT_EQ(*ParseDuration("30", 1000ms), 30s);
  EXPECT_EQ(*ParseDuration("2m", 1000ms), 2min);
  EXPECT_FALSE(ParseDuration("30s5", 1000ms).ok());
}

TEST(FormatDuration, RoundTrips) {
  for (std::chrono::milliseconds d :
       {0ms, 250ms, std::chrono::milliseconds(45s), std::chrono::milliseconds(90min),
        std::chrono::milliseconds(1h + 1ms), std::chrono::milliseconds(26h)}) {
    Result<std::chrono::milliseconds> back = ParseDuration(FormatDuration(d));
    ASSERT_TRUE(back.ok()) << FormatDuration(d);
    EXPECT_EQ(*back, d) << FormatDuration(d);
  }
  EXPECT_EQ(FormatDuration(90min), "1h30m");
}

}  // namespace
}  // namespace gpulet
