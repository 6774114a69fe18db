// The pure parts of the MPS supervisor and the errors it reports before starting anything.
// Daemons themselves are exercised in tests/mps (integration) with the stand-in control program.
#include "mps/supervisor.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

namespace gpulet::mps {
namespace {

std::string MakeTempDir() {
  std::string tmpl = ::testing::TempDir() + "gpulet-mps-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

DaemonSpec OneGpu() {
  DaemonSpec s;
  s.resource_name = "nvidia.com/gpu.shared";
  s.gpu_uuids = {"GPU-aaaa"};
  s.gpu_indices = {0};
  s.memory_bytes = {80ull << 30};
  s.replicas = 4;
  return s;
}

TEST(MpsPathsFor, ResourceNameBecomesOneDirectory) {
  DaemonPaths p = PathsFor("/run/nvidia/mps", "nvidia.com/gpu.shared");
  EXPECT_EQ(p.pipe_dir, "/run/nvidia/mps/nvidia.com_gpu.shared/pipe");
  EXPECT_EQ(p.log_dir, "/run/nvidia/mps/nvidia.com_gpu.shared/log");
  EXPECT_EQ(p.shm_dir, "/run/nvidia/mps/shm");
}

TEST(MpsPathsFor, TrailingSlashAndEverySlash) {
  DaemonPaths p = PathsFor("/tmp/x/", "a/b/c");
  EXPECT_EQ(p.pipe_dir, "/tmp/x/a_b_c/pipe");
  EXPECT_EQ(p.log_dir, "/tmp/x/a_b_c/log");
  EXPECT_EQ(p.shm_dir, "/tmp/x/shm");
  EXPECT_EQ(PathsFor("/", "r").pipe_dir, "/r/pipe");
}

TEST(MpsPathsFor, PidFileInPipeDir) {
  EXPECT_EQ(PidFilePath(PathsFor("/m", "x/y")), "/m/x_y/pipe/nvidia-cuda-mps-control.pid");
}

TEST(MpsActiveThreadPercentage, HundredOverReplicasAtLeastOne) {
  struct Case {
    int replicas, want;
  } cases[] = {{1, 100}, {2, 50},  {3, 33},  {4, 25},  {7, 14},  {10, 10},
               {48, 2},  {100, 1}, {101, 1}, {500, 1}, {0, 100}, {-3, 100}};
  for (const Case& c : cases) {
    EXPECT_EQ(ActiveThreadPercentage(c.replicas), c.want) << "replicas=" << c.replicas;
  }
}

TEST(MpsPinnedMemLimit, MemoryOverReplicasInMiB) {
  struct Case {
    uint64_t bytes;
    int replicas;
    std::string want;
  } cases[] = {
      {80ull << 30, 1, "81920M"},                                 // H100 80 GiB, whole
      {80ull << 30, 2, "40960M"},    {80ull << 30, 3, "27306M"},  // rounded down
      {85899345920ull, 4, "20480M"},                              // 80 GiB in bytes
      {24ull << 30, 10, "2457M"},                                 // L4
      {(1ull << 20) + 1, 1, "1M"},                                // below a MiB is dropped
      {1ull << 20, 2, "0M"},         {0, 2, "0M"},
      {16ull << 30, 0, "16384M"},  // replicas < 1 counts as 1
  };
  for (const Case& c : cases) {
    EXPECT_EQ(PinnedMemLimit(c.bytes, c.replicas), c.want)
        << "bytes=" << c.bytes << " replicas=" << c.replicas;
  }
}

TEST(MpsSupervisor, MissingBinaryNamesThePath) {
  const std::string dir = MakeTempDir();
  SupervisorOptions o;
  o.control_binary = dir + "/no-such-mps-control";
  o.root = dir + "/root";
  Supervisor sup(o, nullptr);
  Status s = sup.Start({OneGpu()}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kNotFound);
  EXPECT_NE(s.message().find(dir + "/no-such-mps-control"), std::string::npos) << s.message();
  EXPECT_FALSE(sup.Healthy("nvidia.com/gpu.shared"));
  // Nothing was created for a daemon that never started.
  struct stat st {};
  EXPECT_NE(stat((dir + "/root").c_str(), &st), 0);
}

TEST(MpsSupervisor, BinaryNotInPathNamesIt) {
  SupervisorOptions o;
  o.control_binary = "gpulet-test-no-such-mps-control-xyz";
  o.root = MakeTempDir();
  Supervisor sup(o, nullptr);
  Status s = sup.Start({OneGpu()}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kNotFound);
  EXPECT_NE(s.message().find("gpulet-test-no-such-mps-control-xyz"), std::string::npos);
  EXPECT_NE(s.message().find("PATH"), std::string::npos) << s.message();
}

TEST(MpsSupervisor, BinaryNotExecutable) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/mps-control";
  std::ofstream(path) << "#!/bin/sh\n";
  chmod(path.c_str(), 0644);
  SupervisorOptions o;
  o.control_binary = path;
  o.root = dir + "/root";
  Supervisor sup(o, nullptr);
  Status s = sup.Start({OneGpu()}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kNotFound);
  EXPECT_NE(s.message().find(path + ": not an executable file"), std::string::npos) << s.message();
}

TEST(MpsSupervisor, RootNotWritableNamesThePath) {
  // A regular file where the root's parent should be: fails for every user, root included.
  const std::string dir = MakeTempDir();
  std::ofstream(dir + "/file") << "x";
  SupervisorOptions o;
  o.control_binary = "/bin/true";
  o.root = dir + "/file/mps";
  Supervisor sup(o, nullptr);
  Status s = sup.Start({OneGpu()}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kInvalidInput);
  EXPECT_NE(s.message().find(dir + "/file/mps"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("cannot create"), std::string::npos) << s.message();
}

TEST(MpsSupervisor, RootWithoutPermissionNamesThePath) {
  if (geteuid() == 0) GTEST_SKIP() << "root may write anywhere";
  const std::string dir = MakeTempDir();
  ASSERT_EQ(mkdir((dir + "/ro").c_str(), 0555), 0);
  SupervisorOptions o;
  o.control_binary = "/bin/true";
  o.root = dir + "/ro/mps";
  Supervisor sup(o, nullptr);
  Status s = sup.Start({OneGpu()}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(dir + "/ro/mps"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("Permission denied"), std::string::npos) << s.message();
}

TEST(MpsSupervisor, InvalidSpecsNameResourceAndField) {
  SupervisorOptions o;
  o.control_binary = "/bin/true";
  o.root = MakeTempDir();
  struct Case {
    std::function<void(DaemonSpec&)> edit;
    std::string want;
  } cases[] = {
      {[](DaemonSpec& s) { s.resource_name.clear(); }, "resource_name: must not be empty"},
      {[](DaemonSpec& s) { s.gpu_uuids.clear(); }, "gpu_uuids: must not be empty"},
      {[](DaemonSpec& s) { s.gpu_indices.push_back(1); }, "gpu_indices and memory_bytes"},
      {[](DaemonSpec& s) { s.memory_bytes.clear(); }, "gpu_indices and memory_bytes"},
      {[](DaemonSpec& s) { s.replicas = 0; }, "replicas: must be >= 1, got 0"},
  };
  for (const Case& c : cases) {
    DaemonSpec spec = OneGpu();
    c.edit(spec);
    Supervisor sup(o, nullptr);
    Status s = sup.Start({spec}, nullptr);
    ASSERT_FALSE(s.ok()) << c.want;
    EXPECT_EQ(s.code(), ErrorCode::kInvalidInput);
    EXPECT_NE(s.message().find(c.want), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("specs[0]"), std::string::npos) << s.message();
  }
  Supervisor sup(o, nullptr);
  Status dup = sup.Start({OneGpu(), OneGpu()}, nullptr);
  EXPECT_NE(dup.message().find("specs[1] (nvidia.com/gpu.shared): resource_name: duplicate"),
            std::string::npos)
      << dup.message();
}

TEST(MpsSupervisor, DaemonThatFailsToStartIsAnErrorWithItsOutput) {
  // /bin/false as the control binary: `-d` exits 1.
  SupervisorOptions o;
  o.control_binary = "/bin/false";
  o.root = MakeTempDir();
  Supervisor sup(o, nullptr);
  Status s = sup.Start({OneGpu()}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kUnavailable);
  EXPECT_NE(s.message().find("/bin/false -d` exited 1"), std::string::npos) << s.message();
  EXPECT_FALSE(sup.Healthy("nvidia.com/gpu.shared"));
  sup.Stop();  // idempotent after a failed Start
  sup.Stop();
}

TEST(MpsSupervisor, NoSpecsStartsNothingAndStops) {
  SupervisorOptions o;
  o.control_binary = "/bin/true";
  o.root = MakeTempDir();
  Supervisor sup(o, nullptr);
  Status s = sup.Start({}, nullptr);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_FALSE(sup.Healthy("nvidia.com/gpu.shared"));
  EXPECT_EQ(sup.Start({}, nullptr).code(), ErrorCode::kInternal);  // once only
  sup.Stop();
}

TEST(MpsSupervisor, StopWithoutStartIsHarmless) {
  Supervisor sup(SupervisorOptions{}, nullptr);
  sup.Stop();
  EXPECT_FALSE(sup.Healthy("anything"));
  EXPECT_EQ(sup.DaemonPid("anything"), -1);
}

}  // namespace
}  // namespace gpulet::mps
