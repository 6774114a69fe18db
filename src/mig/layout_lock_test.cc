#include "mig/layout_lock.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

namespace gpulet::mig {
namespace {

std::string TempPath() {
  std::string dir = ::testing::TempDir() + "gpulet-miglock-XXXXXX";
  EXPECT_NE(mkdtemp(dir.data()), nullptr);
  return dir + "/sub/mig-layout.lock";  // the directory is created on demand
}

TEST(LayoutLock, ApplyExcludesRescanUntilReleased) {
  const std::string path = TempPath();
  {
    Result<LayoutLock> apply = LayoutLock::Exclusive(path);
    ASSERT_TRUE(apply.ok()) << apply.status().message();
    EXPECT_TRUE(apply->held());
    EXPECT_FALSE(LayoutLock::TryShared(path).has_value());  // a rescan defers
  }
  std::optional<LayoutLock> rescan = LayoutLock::TryShared(path);
  ASSERT_TRUE(rescan.has_value());
  EXPECT_TRUE(rescan->held());
  // Rescans share it with each other.
  std::optional<LayoutLock> other = LayoutLock::TryShared(path);
  ASSERT_TRUE(other.has_value());
  EXPECT_TRUE(other->held());
}

TEST(LayoutLock, MovedLockStaysHeld) {
  const std::string path = TempPath();
  Result<LayoutLock> apply = LayoutLock::Exclusive(path);
  ASSERT_TRUE(apply.ok());
  LayoutLock moved = std::move(apply).value();
  EXPECT_TRUE(moved.held());
  EXPECT_FALSE(LayoutLock::TryShared(path).has_value());
}

TEST(LayoutLock, UnwritableLocationLetsRescanProceed) {
  std::optional<LayoutLock> l = LayoutLock::TryShared("/proc/gpulet-no/mig-layout.lock");
  ASSERT_TRUE(l.has_value());
  EXPECT_FALSE(l->held());
  Result<LayoutLock> apply = LayoutLock::Exclusive("/proc/gpulet-no/mig-layout.lock");
  EXPECT_FALSE(apply.ok());
  EXPECT_NE(apply.status().message().find("/proc/gpulet-no/mig-layout.lock"), std::string::npos);
}

TEST(LayoutLock, PathForSimulatedAndRealNodes) {
  unsetenv("GPULET_MIG_LOCK_FILE");
  EXPECT_EQ(LayoutLockPath("/tmp/s"), "/tmp/s/mig-layout.lock");
  EXPECT_EQ(LayoutLockPath(""), kDefaultLayoutLockFile);
  setenv("GPULET_MIG_LOCK_FILE", "/x/y.lock", 1);
  EXPECT_EQ(LayoutLockPath("/tmp/s"), "/x/y.lock");
  unsetenv("GPULET_MIG_LOCK_FILE");
}

}  // namespace
}  // namespace gpulet::mig
