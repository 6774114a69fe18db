#include "cudashim/region.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

namespace gpulet::cudashim {
namespace {

class RegionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpulet-region-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(RegionTest, CreatedWorldWritableWhateverTheUmask) {
  const mode_t old = ::umask(077);
  const std::string err = CreateRegion(dir_, {{"GPU-a", 1000, 0}});
  ::umask(old);
  ASSERT_EQ(err, "");
  struct stat st {};
  ASSERT_EQ(::stat((dir_ + "/memory.region").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u);
}

TEST_F(RegionTest, AdmitsUpToTheLimitExactly) {
  ASSERT_EQ(CreateRegion(dir_, {{"GPU-a", 1000, 0}, {"GPU-b", 50, 0}}), "");
  Region r;
  ASSERT_EQ(r.Open(dir_), "");
  EXPECT_EQ(r.FindGpu("GPU-b"), 1);
  EXPECT_EQ(r.FindGpu("GPU-c"), -1);
  const int p = r.Attach();
  ASSERT_GE(p, 0);
  EXPECT_TRUE(r.Admit(p, 0, 600));
  EXPECT_TRUE(r.Admit(p, 0, 400));
  EXPECT_FALSE(r.Admit(p, 0, 1));
  EXPECT_FALSE(r.Admit(p, 1, UINT64_MAX));  // no overflow past the limit
  r.Release(p, 0, 400);
  EXPECT_EQ(r.Usage()[0].used, 600u);
  EXPECT_EQ(r.Usage()[0].peak, 1000u);
  r.Release(p, 0, 10'000);  // never more than the process holds
  EXPECT_EQ(r.Usage()[0].used, 0u);
  EXPECT_TRUE(r.Admit(p, 1, 70, /*force=*/true));
  EXPECT_EQ(r.Usage()[1].used, 70u);
}

TEST_F(RegionTest, RefusesAnotherLayoutVersionAndLeavesItAlone) {
  ASSERT_EQ(CreateRegion(dir_, {{"GPU-a", 1000, 0}}), "");
  const std::string path = dir_ + "/memory.region";
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    const uint32_t v2 = 2;
    f.seekp(8);
    f.write(reinterpret_cast<const char*>(&v2), sizeof v2);
  }
  Region r;
  const std::string err = r.Open(dir_);
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_NE(err.find("layout version 2"), std::string::npos) << err;
  EXPECT_FALSE(r.is_open());
}

TEST_F(RegionTest, MissingAndForeignFilesNameTheFileAndCause) {
  Region r;
  std::string err = r.Open(dir_);
  EXPECT_NE(err.find(dir_ + "/memory.region: open"), std::string::npos) << err;
  EXPECT_NE(err.find("No such file"), std::string::npos) << err;
  std::ofstream(dir_ + "/memory.region") << std::string(8192, 'x');
  err = r.Open(dir_);
  EXPECT_NE(err.find("bad magic"), std::string::npos) << err;
}

TEST_F(RegionTest, DeadProcessesShareIsReaped) {
  ASSERT_EQ(CreateRegion(dir_, {{"GPU-a", 1000, 0}}), "");
  const pid_t child = ::fork();
  if (child == 0) {
    Region r;
    if (!r.Open(dir_).empty()) ::_exit(1);
    const int p = r.Attach();
    ::_exit(p >= 0 && r.Admit(p, 0, 900) ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  Region r;
  ASSERT_EQ(r.Open(dir_), "");
  EXPECT_EQ(r.Usage()[0].used, 900u);  // still counted: nobody reaped yet
  const int p = r.Attach();            // attaching reaps
  EXPECT_EQ(r.Usage()[0].used, 0u);
  EXPECT_TRUE(r.Admit(p, 0, 1000));
}

TEST_F(RegionTest, AReusedPidIsNotTheOwner) {
  ASSERT_EQ(CreateRegion(dir_, {{"GPU-a", 1000, 0}}), "");
  Region r;
  ASSERT_EQ(r.Open(dir_), "");
  const int p = r.Attach();
  ASSERT_TRUE(r.Admit(p, 0, 500));
  EXPECT_TRUE(OwnerAlive(::getpid(), ProcessStartTime(::getpid())));
  EXPECT_FALSE(OwnerAlive(::getpid(), ProcessStartTime(::getpid()) + 1));
  // Our own pid with another start time: what a slot looks like after its owner died and the pid
  // went to a new process.
  RegionLayout* layout = nullptr;
  {
    Region raw;
    ASSERT_EQ(raw.Open(dir_), "");
  }
  (void)layout;
  EXPECT_EQ(r.Reap(), 0);  // the real owner (us) is alive
}

TEST(RegionLiveness, ZombiesAndMissingProcessesAreDead) {
  EXPECT_FALSE(OwnerAlive(0, 0));
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  // Wait for its exit without reaping it (WNOWAIT): it stays a zombie, its /proc entry says Z.
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT), 0);
  bool zombie = false;
  ProcessStartTime(child, &zombie);
  ASSERT_TRUE(zombie);
  EXPECT_FALSE(OwnerAlive(child, ProcessStartTime(child)));
  ::waitpid(child, nullptr, 0);
  EXPECT_FALSE(OwnerAlive(child, 0));
}

}  // namespace
}  // namespace gpulet::cudashim
