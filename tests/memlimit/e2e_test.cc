// End to end: `gpulet plugin` on a simulated HGX H200 with gpulet.memoryLimits, Allocate of two
// replicas (of four) through the kubelet harness, then the probe run with exactly the returned
// environment and mounts in a private mount namespace (unshare -m; /usr and /etc are overlays
// there, so the host is never touched) and no LD_PRELOAD: /etc/ld.so.preload loads the library.
// The container gets half the GPU, and the limit holds.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/process.h"
#include "cudashim/region.h"
#include "sim/fixture.h"
#include "support/build_dir.h"
#include "support/require.h"
#include "tests/deviceplugin/plugin_fixture.h"

namespace gpulet::testing {
namespace {

constexpr uint64_t kMiB = 1024ULL * 1024ULL;

class MemoryLimitE2E : public PluginFixture {};

TEST_F(MemoryLimitE2E, TwoReplicasGetHalfTheGpuAndTheLimitHolds) {
  GPULET_REQUIRE_ROOT("a private mount namespace");
  fixture_ = "hgx-h200";
  const std::string state = tmp_.path() + "/state";
  const std::string config = tmp_.path() + "/config.yaml";
  std::ofstream(config) << "version: v1\n"
                           "sharing:\n  timeSlicing:\n    resources:\n"
                           "      - {name: gpu, replicas: 4}\n"
                           "gpulet:\n  memoryLimits:\n    resources:\n      - name: gpu\n"
                           "    library: "
                        << BuildDir()
                        << "/lib/libgpulet-cuda.so\n"
                           "    stateDir: "
                        << state << "\n";
  StartHarness();
  // The node names the driver the library calls (the simulated one); the container's environment
  // and LD_LIBRARY_PATH do not.
  StartPlugin({"--config-file", config},
              {{"GPULET_CONTAINER_CUDA_DRIVER", BuildDir() + "/cuda_sim/libcuda.so.1"}});
  WaitForDevices(32, 32, 60s);
  auto fixture =
      sim::LoadFixture(std::string(GPULET_SOURCE_DIR) + "/testing/fixtures/hgx-h200.yaml");
  ASSERT_TRUE(fixture.ok());
  const std::string uuid = fixture->gpus[0].uuid;
  const uint64_t limit = 2 * (fixture->gpus[0].memory_mib * kMiB / 4);

  Result<v1beta1::ContainerAllocateResponse> alloc =
      harness_->Allocate(kGpu, {uuid + "::0", uuid + "::1"});
  ASSERT_TRUE(alloc.ok()) << alloc.status().message();
  // The library, the limits file beside it (both read-only), the writable accounting directory
  // and /etc/ld.so.preload.
  ASSERT_EQ(alloc->mounts_size(), 4);
  EXPECT_EQ(alloc->envs().at("GPULET_CUDA_DIR"), "/run/gpulet/cuda");

  // The region the plugin wrote and the limits it decided: this GPU, two shares of four.
  std::string region_dir, limits_file;
  for (const auto& m : alloc->mounts()) {
    if (m.container_path() == "/run/gpulet/cuda") region_dir = m.host_path();
    if (m.container_path() == "/usr/lib/gpulet/gpulet-cuda.limits") {
      limits_file = m.host_path();
      EXPECT_TRUE(m.read_only());
    }
  }
  cudashim::Region region;
  ASSERT_EQ(region.Open(region_dir, /*read_only=*/true), "");
  ASSERT_EQ(region.LoadLimits(limits_file), "");
  ASSERT_EQ(region.Usage().size(), 1u);
  EXPECT_EQ(region.Usage()[0].uuid, uuid);
  EXPECT_EQ(region.Usage()[0].limit, limit);

  // The container: overlays over /usr and /etc, a tmpfs on /run, then the response's mounts.
  const std::string ovl = tmp_.path() + "/ovl";
  for (const char* d : {"uu", "uw", "eu", "ew"}) std::filesystem::create_directories(ovl + "/" + d);
  std::ostringstream sh;
  sh << "set -e\n"
     << "mount -t overlay overlay -o lowerdir=/usr,upperdir=" << ovl << "/uu,workdir=" << ovl
     << "/uw /usr\n"
     << "mount -t overlay overlay -o lowerdir=/etc,upperdir=" << ovl << "/eu,workdir=" << ovl
     << "/ew /etc\n"
     << "mount -t tmpfs tmpfs /run\n";
  for (const auto& m : alloc->mounts()) {
    const std::string c = ShellQuote(m.container_path()), h = ShellQuote(m.host_path());
    sh << "mkdir -p \"$(dirname " << c << ")\"\n"
       << "if [ -d " << h << " ]; then mkdir -p " << c << "; else touch " << c << "; fi\n"
       << "mount --bind " << h << " " << c << "\n";
    if (m.read_only()) sh << "mount -o remount,bind,ro " << c << "\n";
  }
  // Exactly the returned environment, plus what the simulated node needs to be found.
  sh << "exec env -i";
  for (const auto& [k, v] : alloc->envs()) sh << " " << ShellQuote(k + "=" + v);
  sh << " " << ShellQuote("LD_LIBRARY_PATH=" + BuildDir() + "/sim:" + BuildDir() + "/cuda_sim") << " "
     << ShellQuote("GPULET_SIM_FIXTURE=" + fixture->path)
     << " GPULET_CUDA_SIM_CONTEXT_BYTES=" << 512 * kMiB << " "
     << ShellQuote(BuildDir() + "/bin/memlimit_probe") << " --via link init fill alloc " << 1024 * kMiB
     << " info\n";
  CommandSpec spec;
  spec.argv = {"unshare", "-m", "--propagation", "private", "sh", "-c", sh.str()};
  spec.timeout = std::chrono::seconds(120);
  auto out = RunCommand(spec);
  ASSERT_TRUE(out.ok()) << out.status().message();
  ASSERT_EQ(out->exit_code, 0) << out->out << out->err;
  EXPECT_NE(out->out.find("init rc=0"), std::string::npos) << out->out << out->err;
  EXPECT_NE(out->out.find("last_rc=2"), std::string::npos) << out->out;  // OUT_OF_MEMORY
  // 512 MiB context + 1 GiB chunks: everything that fits in half the GPU, and not a byte more.
  const uint64_t fits = (limit - 512 * kMiB) / (1024 * kMiB) * (1024 * kMiB);
  EXPECT_NE(out->out.find("admitted=" + std::to_string(fits) + " "), std::string::npos) << out->out;
  EXPECT_NE(out->out.find("cu_total=" + std::to_string(limit) + " "), std::string::npos)
      << out->out;
  EXPECT_NE(out->out.find("nvml_total=" + std::to_string(limit) + " "), std::string::npos)
      << out->out;
  EXPECT_LE(region.Usage()[0].peak, limit);
  EXPECT_EQ(region.Usage()[0].peak, fits + 512 * kMiB);
}

}  // namespace
}  // namespace gpulet::testing
