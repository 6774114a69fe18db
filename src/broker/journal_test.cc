#include "broker/journal.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

namespace gpulet::broker {
namespace {

class TempDir {
 public:
  TempDir() {
    std::string t = "/tmp/gpulet-broker-journal-XXXXXX";
    if (mkdtemp(t.data()) != nullptr) path_ = t;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

Journal Sample() {
  Journal j;
  j.nodes["gpua"] = {Owner::kLending, kStepDraining, 100, 110, 4, 0};
  j.nodes["gpub"] = {Owner::kReturning, kStepEvicting, 200, 220, 2, 150};
  j.demand_streak = 3;
  j.quiet_streak = 0;
  j.last_transition = 220;
  j.returned_at["gpuc"] = 50;
  return j;
}

TEST(Journal, RoundTripsThroughAFile) {
  TempDir dir;
  const std::string path = dir.path() + "/journal.json";
  ASSERT_TRUE(SaveJournal(path, Sample()).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  Result<Journal> back = LoadJournal(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(*back, Sample());
  // Overwriting replaces the whole content.
  Journal empty;
  ASSERT_TRUE(SaveJournal(path, empty).ok());
  EXPECT_EQ(*LoadJournal(path), empty);
}

TEST(Journal, MissingFileIsEmptyCorruptFileIsAnError) {
  TempDir dir;
  Result<Journal> j = LoadJournal(dir.path() + "/none.json");
  ASSERT_TRUE(j.ok());
  EXPECT_TRUE(j->nodes.empty());
  const std::string bad = dir.path() + "/bad.json";
  std::ofstream(bad) << "{\"version\":1,\"nodes\":{\"gpua\":{\"owner\":\"pirate\"}}}";
  Result<Journal> r = LoadJournal(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidInput);
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr(bad + ": nodes.gpua.owner"));
  std::ofstream(bad) << "not json";
  EXPECT_FALSE(LoadJournal(bad).ok());
}

TEST(Journal, SaveFailsInAMissingDirectory) {
  Status s = SaveJournal("/nonexistent-dir/journal.json", Sample());
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), ::testing::HasSubstr("/nonexistent-dir/journal.json"));
}

}  // namespace
}  // namespace gpulet::broker
