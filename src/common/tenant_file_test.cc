#include "common/tenant_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace gpulet {
namespace {

namespace fs = std::filesystem;

class TenantDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpulet-tenant-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    tenant_ = root_ + "/tenant";
    outside_ = root_ + "/outside";
    fs::create_directories(tenant_);
    fs::create_directories(outside_);
    Write(outside_ + "/secret", "node's file\n");
  }
  void TearDown() override { fs::remove_all(root_); }
  static void Write(const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
  }
  TenantDir Open() {
    Result<TenantDir> d = TenantDir::Open(tenant_);
    EXPECT_TRUE(d.ok()) << d.status().message();
    return std::move(d).value();
  }
  std::string root_, tenant_, outside_;
};

TEST_F(TenantDirTest, ReadsARegularFileWithinItsBound) {
  Write(tenant_ + "/devices", "GPU-a::0\nGPU-a::1\n");
  TenantDir d = Open();
  Result<std::string> r = d.ReadFile("devices", 1024);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, "GPU-a::0\nGPU-a::1\n");
  Result<std::string> small = d.ReadFile("devices", 4);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), ErrorCode::kInvalidInput);
  EXPECT_NE(small.status().message().find(tenant_ + "/devices"), std::string::npos);
}

// A FIFO where a file is expected: the open must neither block nor read (the old janitor's
// std::ifstream blocked here forever).
TEST_F(TenantDirTest, AFifoIsRefusedWithoutBlocking) {
  ASSERT_EQ(::mkfifo((tenant_ + "/devices").c_str(), 0666), 0);
  TenantDir d = Open();
  Result<std::string> r = d.ReadFile("devices", 1024);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidInput);
  EXPECT_NE(r.status().message().find("FIFO"), std::string::npos) << r.status().message();
  char buf[8];
  EXPECT_FALSE(d.ReadPrefix("devices", buf, sizeof buf, sizeof buf).ok());
}

// Symlinks to /dev/zero (a read that never ends) and to a file outside are not followed.
TEST_F(TenantDirTest, SymlinksAreNotFollowed) {
  fs::create_symlink("/dev/zero", tenant_ + "/zero");
  fs::create_symlink(outside_ + "/secret", tenant_ + "/secret");
  fs::create_symlink(outside_, tenant_ + "/dir");
  TenantDir d = Open();
  for (const char* name : {"zero", "secret"}) {
    Result<std::string> r = d.ReadFile(name, 1 << 20);
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidInput) << r.status().message();
  }
  EXPECT_FALSE(d.OpenDir("dir").ok());
  EXPECT_FALSE(d.ReadFile("../outside/secret", 1024).ok());
  EXPECT_FALSE(d.OpenDir("..").ok());
}

TEST_F(TenantDirTest, ReadPrefixWantsTheExactSize) {
  Write(tenant_ + "/region", std::string(100, 'x'));
  TenantDir d = Open();
  char buf[10];
  EXPECT_TRUE(d.ReadPrefix("region", buf, sizeof buf, 100).ok());
  Status s = d.ReadPrefix("region", buf, sizeof buf, 200);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("100 bytes, expected 200"), std::string::npos) << s.message();
}

// Removing a tenant's tree unlinks its symlinks as names and never touches what they point at.
TEST_F(TenantDirTest, RemoveTreeNeverFollowsSymlinks) {
  fs::create_directories(tenant_ + "/a/b/c");
  Write(tenant_ + "/a/b/c/file", "x");
  fs::create_symlink(outside_, tenant_ + "/a/to-outside-dir");
  fs::create_symlink(outside_ + "/secret", tenant_ + "/a/b/to-secret");
  ASSERT_EQ(::mkfifo((tenant_ + "/a/fifo").c_str(), 0666), 0);
  Result<TenantDir> root = TenantDir::Open(root_);
  ASSERT_TRUE(root.ok());
  Status s = root->RemoveTree("tenant");
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_FALSE(fs::exists(tenant_));
  EXPECT_TRUE(fs::exists(outside_ + "/secret"));
  EXPECT_TRUE(root->RemoveTree("tenant").ok());  // already gone
}

TEST_F(TenantDirTest, RemoveTreeOfASymlinkRemovesTheLinkOnly) {
  fs::create_symlink(outside_, tenant_ + "/link");
  TenantDir d = Open();
  ASSERT_TRUE(d.RemoveTree("link").ok());
  EXPECT_FALSE(fs::exists(fs::symlink_status(tenant_ + "/link")));
  EXPECT_TRUE(fs::exists(outside_ + "/secret"));
}

TEST_F(TenantDirTest, ListSaysWhichEntriesAreDirectories) {
  fs::create_directories(tenant_ + "/sub");
  fs::create_symlink(tenant_ + "/sub", tenant_ + "/link");
  Write(tenant_ + "/file", "");
  TenantDir d = Open();
  Result<std::vector<TenantDir::Entry>> entries = d.List();
  ASSERT_TRUE(entries.ok());
  ASSERT_EQ(entries->size(), 3u);
  for (const auto& e : *entries) EXPECT_EQ(e.directory, e.name == "sub") << e.name;
  EXPECT_FALSE(d.List(2).ok());
}

}  // namespace
}  // namespace gpulet
