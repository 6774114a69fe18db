#include "slurm/node_cpus.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace gpulet::slurm {
namespace {

using ::testing::HasSubstr;

class NodeCpus : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "gpulet-cpus-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  std::string root_;
};

TEST_F(NodeCpus, FromSysfs) {
  std::filesystem::create_directories(root_ + "/devices/system/cpu");
  std::ofstream(root_ + "/devices/system/cpu/online") << "0-5,8\n";
  CpuCount c = CountCpus(root_, false, {"0-1"});
  EXPECT_EQ(c.cpus, 7u);
  EXPECT_EQ(c.source, "sysfs");
  EXPECT_EQ(c.warning, "");
}

// A real node whose sysfs cannot be read used to get the union of its GPUs' CPU lists (a
// simulation's answer): a 2-GPU node bound to one socket claimed half its CPUs.
TEST_F(NodeCpus, RealNodeWithoutSysfsCountsOnlineCpusAndWarns) {
  CpuCount c = CountCpus(root_, false, {"0-3", "0-3"});
  EXPECT_EQ(c.cpus, static_cast<unsigned>(sysconf(_SC_NPROCESSORS_ONLN)));
  EXPECT_EQ(c.source, "sysconf");
  EXPECT_THAT(c.warning, HasSubstr(root_ + "/devices/system/cpu/online unreadable"));
}

TEST_F(NodeCpus, SimulatedNodeUsesTheFixturesCpus) {
  CpuCount c = CountCpus(root_, true, {"0-3", "2-7", "bad"});
  EXPECT_EQ(c.cpus, 8u);
  EXPECT_EQ(c.source, "fixture");
  EXPECT_EQ(c.warning, "");
}

}  // namespace
}  // namespace gpulet::slurm
