// SupervisorMpsControl with real processes: the nvidia-cuda-mps-control stand-in (testing/mps)
// on the simulated dgx-h100: a daemon per claim, the config's defaults set exactly, gone at Stop.
#include "dra/mps_control.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "sim/sim_node.h"

namespace gpulet::dra {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(SupervisorMpsControlTest, ADaemonPerClaimWithTheConfigsDefaults) {
  Result<gpu::testing::SimNode> node = gpu::testing::OpenSimNode("dgx-h100");
  ASSERT_TRUE(node.ok()) << node.status().message();
  mps::SupervisorOptions o;
  o.control_binary = std::string(GPULET_BUILD_DIR) + "/mps/nvidia-cuda-mps-control";
  o.root = gpu::testing::MakeTempDir() + "/mps";
  Result<std::shared_ptr<SupervisorMpsControl>> mps = SupervisorMpsControl::Create(o, node->nvml);
  ASSERT_TRUE(mps.ok()) << mps.status().message();

  MpsRequest req;
  req.claim_uid = "a3c1e2f0-1111-4222-8333-944455556666";
  req.gpu_uuids = {"GPU-a", "GPU-b"};
  req.gpu_indices = {2, 3};
  req.memory_bytes = {80ull << 30, 80ull << 30};
  req.active_thread_percentage = 30;
  req.pinned_memory_bytes = 10ull << 30;
  Result<MpsDaemonDirs> dirs = (*mps)->Start(req);
  ASSERT_TRUE(dirs.ok()) << dirs.status().message();
  const mps::DaemonPaths paths =
      mps::PathsFor(o.root, SupervisorMpsControl::ResourceName(req.claim_uid));
  EXPECT_EQ(dirs->pipe_dir, paths.pipe_dir);
  EXPECT_EQ(dirs->shm_dir, paths.shm_dir);
  EXPECT_TRUE(std::filesystem::exists(paths.pipe_dir));
  const std::string log = ReadAll(paths.log_dir + "/control.log");
  EXPECT_THAT(log, HasSubstr("CUDA_VISIBLE_DEVICES=GPU-a,GPU-b"));
  EXPECT_THAT(log, HasSubstr("CMD set_default_active_thread_percentage 30"));
  EXPECT_THAT(log, HasSubstr("CMD set_default_device_pinned_mem_limit 0 10240M"));
  EXPECT_THAT(log, HasSubstr("CMD set_default_device_pinned_mem_limit 1 10240M"));

  ASSERT_TRUE((*mps)->Stop(req.claim_uid).ok());
  EXPECT_THAT(ReadAll(paths.log_dir + "/control.log"), HasSubstr("QUIT"));
  EXPECT_TRUE((*mps)->Stop(req.claim_uid).ok());  // idempotent
}

}  // namespace
}  // namespace gpulet::dra
