#include "common/files.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace gpulet {
namespace {

class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpulet-files-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Slurp(const std::string& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  int Entries() {
    int n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir_)) ++n;
    return n;
  }
  std::string dir_;
};

TEST_F(FilesTest, WritesAndReplaces) {
  const std::string p = dir_ + "/state.json";
  ASSERT_TRUE(WriteFileAtomic(p, "one").ok());
  EXPECT_EQ(Slurp(p), "one");
  ASSERT_TRUE(WriteFileAtomic(p, "two, longer").ok());
  EXPECT_EQ(Slurp(p), "two, longer");
  EXPECT_EQ(Entries(), 1) << "no temporary file is left behind";
}

TEST_F(FilesTest, AppliesTheModeRegardlessOfUmask) {
  const std::string p = dir_ + "/f";
  ASSERT_TRUE(WriteFileAtomic(p, "x", 0640).ok());
  struct stat st {};
  ASSERT_EQ(stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  ASSERT_TRUE(WriteFileAtomic(p, "x", 0666).ok());
  ASSERT_EQ(stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u);
}

TEST_F(FilesTest, MissingDirectoryIsNotFoundAndNamesThePath) {
  const std::string p = dir_ + "/no/such/dir/f";
  Status s = WriteFileAtomic(p, "x");
  EXPECT_EQ(s.code(), ErrorCode::kNotFound);
  EXPECT_NE(s.message().find(p), std::string::npos) << s.message();
}

TEST_F(FilesTest, FailedReplaceKeepsTheOldContentAndLeavesNoTemporary) {
  const std::string p = dir_ + "/sub";
  std::filesystem::create_directory(p);  // a directory where a file should go: rename fails
  std::filesystem::create_directory(p + "/keep");
  Status s = WriteFileAtomic(p, "x");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rename"), std::string::npos) << s.message();
  EXPECT_TRUE(std::filesystem::is_directory(p + "/keep"));
  EXPECT_EQ(Entries(), 1);
}

TEST_F(FilesTest, ReadIsBounded) {
  const std::string p = dir_ + "/big";
  ASSERT_TRUE(WriteFileAtomic(p, std::string(5000, 'a')).ok());
  Result<std::string> whole = ReadFileBounded(p, 5000);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  EXPECT_EQ(whole->size(), 5000u);
  Result<std::string> too_big = ReadFileBounded(p, 4999);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), ErrorCode::kInvalidInput);
  EXPECT_NE(too_big.status().message().find(p), std::string::npos);
  EXPECT_EQ(ReadFileBounded(dir_ + "/none").status().code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace gpulet
