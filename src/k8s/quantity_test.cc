#include "k8s/quantity.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpulet::k8s {
namespace {

using ::testing::HasSubstr;

TEST(QuantityTest, EveryFormTheApiServerWritesOrAccepts) {
  const std::vector<std::pair<std::string, int64_t>> cases = {
      {"0", 0},
      {"20", 20},
      {"+20", 20},
      {"007", 7},
      {"2k", 2000},  // the canonical form of 2000
      {"2Ki", 2048},
      {"1Mi", 1 << 20},
      {"1.5Gi", 1610612736},
      {"1.5k", 1500},
      {"1M", 1000000},
      {"3G", 3000000000},
      {"1T", 1000000000000},
      {"1P", 1000000000000000},
      {"1E", 1000000000000000000},  // E alone is exa
      {"1Ti", int64_t{1} << 40},
      {"1Pi", int64_t{1} << 50},
      {"7Ei", (int64_t{7} << 60)},
      {"1e3", 1000},
      {"1E3", 1000},  // E with digits is an exponent
      {"1e+3", 1000},
      {"2000m", 2},
      {"2000000u", 2},
      {"2000000000n", 2},
      {"1.", 1},
      {"1.G", 1000000000},
      {".5k", 500},
      {"0.000e9", 0},
      {"-0", 0},
      {"1200e-2", 12},
      {"9223372036854775807", INT64_MAX},
  };
  for (const auto& [text, want] : cases) {
    auto v = ParseWholeQuantity(text);
    ASSERT_TRUE(v.ok()) << text << ": " << v.status().message();
    EXPECT_EQ(*v, want) << text;
  }
}

TEST(QuantityTest, RejectsWhatUpstreamRejectsAndWhatIsNotAWholeCount) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "not a quantity"},
      {"1K", "unknown suffix"},  // kilo is lower-case k
      {"1KiB", "unknown suffix"},
      {"1ki", "unknown suffix"},
      {"1b", "unknown suffix"},
      {" 1", "not a quantity"},
      {"1 ", "unknown suffix"},
      {"1e", "unknown suffix"},
      {"1e+", "unknown suffix"},
      {"1e1.5", "unknown suffix"},
      {"1.5.5", "unknown suffix"},
      {"--1", "not a quantity"},
      {"Ki", "not a quantity"},
      {"0x10", "unknown suffix"},
      {"1Gi3", "unknown suffix"},
      {"-1", "negative"},
      {"-2k", "negative"},
      {"1500m", "not a whole number"},
      {"15e-1", "not a whole number"},
      {"0.5", "not a whole number"},
      {"1n", "not a whole number"},
      {"9223372036854775808", "larger than"},
      {"8Ei", "larger than"},
      {"1e19", "larger than"},
      {"1e100000000000", "larger than"},
      {"1e-100000000000", "not a whole number"},
      {"99999999999999999999999999999999999999999999", "larger than"},
  };
  for (const auto& [text, why] : cases) {
    auto v = ParseWholeQuantity(text);
    ASSERT_FALSE(v.ok()) << text << " = " << *v;
    EXPECT_EQ(v.status().code(), ErrorCode::kInvalidInput);
    EXPECT_THAT(v.status().message(), HasSubstr(why)) << text;
  }
  EXPECT_THAT(ParseWholeQuantity("2k", 1000).status().message(), HasSubstr("larger than 1000"));
  EXPECT_EQ(*ParseWholeQuantity("1Ki", 1024), 1024);
}

}  // namespace
}  // namespace gpulet::k8s
