#include "slurm/id_list.h"

#include <gtest/gtest.h>

namespace gpulet::slurm {
namespace {

TEST(IdList, ParsesRangesAndSingles) {
  auto ids = ParseIdList("0-2, 7 ,9-10");
  ASSERT_TRUE(ids);
  EXPECT_EQ(*ids, (std::set<unsigned>{0, 1, 2, 7, 9, 10}));
  EXPECT_TRUE(ParseIdList("")->empty());
}

TEST(IdList, RejectsMalformed) {
  for (const char* bad : {"a", "1-", "-1", "3-1", "1,,2", "1.5", "99999999999"}) {
    EXPECT_FALSE(ParseIdList(bad)) << bad;
  }
  EXPECT_FALSE(ParseIdList("0-10", 5));
}

TEST(IdList, FormatsCompactly) {
  EXPECT_EQ(FormatIdList({0, 1, 2, 3, 112, 113, 200}), "0-3,112-113,200");
  EXPECT_EQ(FormatIdList({5}), "5");
  EXPECT_EQ(FormatIdList({}), "");
  EXPECT_EQ(FormatIdList(*ParseIdList("56-111,168-223")), "56-111,168-223");
}

}  // namespace
}  // namespace gpulet::slurm
