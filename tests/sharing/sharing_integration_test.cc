// GPU sharing through the kubelet harness: `gpulet plugin` on simulated dgx-h100 / dgx-a100 nodes
// with time-slicing, MIG strategies, per-GPU sharing, MPS (with the nvidia-cuda-mps-control
// stand-in) and MIG re-discovery.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "tests/deviceplugin/plugin_fixture.h"

namespace gpulet::testing {
namespace {

namespace fs = std::filesystem;

std::string BaseId(const std::string& id) { return id.substr(0, id.rfind("::")); }

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class SharingFixture : public PluginFixture {
 protected:
  std::string WriteConfig(const std::string& text) {
    std::string path = tmp_.path() + "/config-" + std::to_string(++configs_) + ".yaml";
    std::ofstream(path) << text;
    return path;
  }
  // Devices of `resource` grouped by their backing device.
  std::map<std::string, std::vector<HarnessDevice>> ByBase(const std::string& resource) const {
    std::map<std::string, std::vector<HarnessDevice>> out;
    for (const HarnessDevice& d : harness_->Devices(resource)) out[BaseId(d.id)].push_back(d);
    return out;
  }
  int configs_ = 0;
};

TEST_F(SharingFixture, TimeSlicingOnDgxH100) {
  std::string cfg = WriteConfig(
      "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n"
      "      replicas: 4\n");
  StartHarness();
  StartPlugin({"--config", cfg});
  WaitForDevices(32, 32);
  std::map<std::string, std::vector<HarnessDevice>> by_gpu = ByBase(kGpu);
  ASSERT_EQ(by_gpu.size(), 8u);
  for (const auto& [gpu, replicas] : by_gpu) {
    EXPECT_EQ(gpu.rfind("GPU-", 0), 0u);
    std::set<std::string> ids;
    for (const HarnessDevice& d : replicas) ids.insert(d.id);
    EXPECT_EQ(ids, (std::set<std::string>{gpu + "::0", gpu + "::1", gpu + "::2", gpu + "::3"}));
    // Replicas carry their GPU's NUMA node.
    for (const HarnessDevice& d : replicas) EXPECT_EQ(d.numa_nodes, replicas[0].numa_nodes);
  }

  // Distributed: four replicas land on four GPUs.
  std::vector<std::string> ids = DeviceIds();
  Result<std::vector<std::string>> pref = harness_->GetPreferredAllocation(kGpu, ids, {}, 4);
  ASSERT_TRUE(pref.ok()) << pref.status().message();
  std::set<std::string> gpus;
  for (const std::string& id : *pref) gpus.insert(BaseId(id));
  EXPECT_EQ(gpus.size(), 4u);

  // Two replicas of one GPU: the container is told the GPU once.
  const std::string gpu = by_gpu.begin()->first;
  Result<v1beta1::ContainerAllocateResponse> alloc =
      harness_->Allocate(kGpu, {gpu + "::1", gpu + "::3"});
  ASSERT_TRUE(alloc.ok()) << alloc.status().message();
  EXPECT_EQ(alloc->envs().at("NVIDIA_VISIBLE_DEVICES"), gpu);
}

TEST_F(SharingFixture, PackedPolicyAndFailRequestsGreaterThanOne) {
  std::string cfg = WriteConfig(
      "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n"
      "    failRequestsGreaterThanOne: true\n    resources:\n    - name: gpu\n      replicas: 2\n");
  StartHarness();
  StartPlugin({"--config", cfg}, {{"REPLICA_ALLOCATION_POLICY", "packed"}});
  const std::string shared = "nvidia.com/gpu.shared";
  WaitForDevices(16, 16, 60s, shared);
  EXPECT_FALSE(harness_->State(kGpu).has_value());  // every GPU is shared, none plain
  std::vector<std::string> ids = DeviceIds(shared);
  Result<std::vector<std::string>> pref = harness_->GetPreferredAllocation(shared, ids, {}, 2);
  ASSERT_TRUE(pref.ok()) << pref.status().message();
  ASSERT_EQ(pref->size(), 2u);
  EXPECT_EQ(BaseId((*pref)[0]), BaseId((*pref)[1]));  // packed: both on one GPU

  Result<v1beta1::ContainerAllocateResponse> two = harness_->Allocate(shared, *pref);
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().message().find("nvidia.com/gpu.shared"), std::string::npos)
      << two.status().message();
  EXPECT_NE(two.status().message().find("got a request for 2"), std::string::npos)
      << two.status().message();
  EXPECT_TRUE(harness_->Allocate(shared, {(*pref)[0]}).ok());
}

TEST_F(SharingFixture, PerGpuSharingSideBySide) {
  std::string cfg = WriteConfig(
      "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
      "    - name: gpu\n      rename: gpu.shared\n      devices: [0, 1]\n      replicas: 4\n"
      "    - name: gpu\n      rename: gpu.shared\n      devices: [\"7\"]\n      replicas: 2\n");
  StartHarness();
  StartPlugin({"--config", cfg});
  const std::string shared = "nvidia.com/gpu.shared";
  WaitForDevices(5, 5);
  WaitForDevices(10, 10, 60s, shared);
  EXPECT_EQ(Sockets(), (std::vector<std::string>{"kubelet.sock", "nvidia-gpu.shared.sock",
                                                 "nvidia-gpu.sock"}));
  std::map<std::string, std::vector<HarnessDevice>> by_gpu = ByBase(shared);
  ASSERT_EQ(by_gpu.size(), 3u);
  std::multiset<size_t> counts;
  for (const auto& [gpu, replicas] : by_gpu) counts.insert(replicas.size());
  EXPECT_EQ(counts, (std::multiset<size_t>{2, 4, 4}));
  // No GPU is offered twice.
  for (const std::string& id : DeviceIds()) EXPECT_EQ(by_gpu.count(id), 0u) << id;
}

TEST_F(SharingFixture, ReplicasFollowTheirGpuHealthAndRecover) {
  std::string cfg = WriteConfig(
      "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n"
      "      replicas: 3\n");
  StartHarness();
  StartPlugin({"--config", cfg});
  WaitForDevices(24, 24);
  Sim({"xid", "--gpu", "3", "--code", "79"});
  WaitForDevices(24, 21);
  std::set<std::string> sick;
  for (const HarnessDevice& d : harness_->Devices(kGpu)) {
    if (!d.healthy()) sick.insert(BaseId(d.id));
  }
  EXPECT_EQ(sick.size(), 1u);  // all three replicas of one GPU
  // The quiet period (2 s in the fixture) passes without new errors: every replica recovers.
  WaitForDevices(24, 24);
}

TEST_F(SharingFixture, MixedMigOnDgxA100) {
  fixture_ = "dgx-a100";
  StartHarness();
  StartPlugin({"--mig-strategy", "mixed", "--pass-device-specs"});
  WaitForDevices(6, 6);
  WaitForDevices(9, 9, 60s, "nvidia.com/mig-1g.5gb");
  WaitForDevices(1, 1, 60s, "nvidia.com/mig-2g.10gb");
  WaitForDevices(1, 1, 60s, "nvidia.com/mig-3g.20gb");
  std::vector<std::string> big = DeviceIds("nvidia.com/mig-3g.20gb");
  ASSERT_EQ(big.size(), 1u);
  EXPECT_EQ(big[0].rfind("MIG-", 0), 0u);
  Result<v1beta1::ContainerAllocateResponse> a = harness_->Allocate("nvidia.com/mig-3g.20gb", big);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->envs().at("NVIDIA_VISIBLE_DEVICES"), big[0]);
  std::set<std::string> paths;
  for (const auto& d : a->devices()) paths.insert(d.container_path());
  EXPECT_TRUE(paths.count("/dev/nvidia0")) << "parent GPU node missing";
  int caps = 0;
  for (const std::string& p : paths) caps += p.rfind("/dev/nvidia-caps/nvidia-cap", 0) == 0;
  EXPECT_EQ(caps, 2);  // GI and CI capability nodes

  // An XID on a MIG device marks that device only.
  Sim({"xid", "--gpu", "0", "--mig", "0", "--code", "79"});
  WaitForDevices(1, 0, 60s, "nvidia.com/mig-3g.20gb");
  EXPECT_EQ(harness_->State("nvidia.com/mig-1g.5gb")->HealthyCount(), 9u);
  EXPECT_EQ(harness_->State("nvidia.com/mig-2g.10gb")->HealthyCount(), 1u);
  WaitForDevices(1, 1, 60s, "nvidia.com/mig-3g.20gb");  // recovers after the quiet period

  // An XID on the parent GPU marks every MIG device of it, and nothing else.
  Sim({"xid", "--gpu", "1", "--code", "79"});
  WaitForDevices(9, 2, 60s, "nvidia.com/mig-1g.5gb");  // GPU 1's seven 1g.5gb go Unhealthy
  EXPECT_EQ(harness_->State("nvidia.com/mig-3g.20gb")->HealthyCount(), 1u);
  EXPECT_EQ(harness_->State(kGpu)->HealthyCount(), 6u);
}

TEST_F(SharingFixture, MigStrategySingleWithMixedProfilesIsAClearError) {
  fixture_ = "dgx-a100";
  StartHarness();
  RunResult r = RunGpulet(PluginArgs({"--mig-strategy", "single"}));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("flags.migStrategy: single"), std::string::npos) << r.output;
  EXPECT_TRUE(harness_->Resources().empty());  // nothing was advertised
}

TEST_F(SharingFixture, MigStrategyNoneAndSingleOnDgxH100AreWholeGpus) {
  StartHarness();
  StartPlugin({"--mig-strategy", "single"});
  WaitForDevices(8, 8);
  for (const std::string& id : DeviceIds()) EXPECT_EQ(id.rfind("GPU-", 0), 0u);
}

TEST_F(SharingFixture, ConfigErrorsNameFileLineField) {
  std::string cfg = WriteConfig(
      "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
      "    - name: gpu\n      devices: [0, 12]\n      replicas: 2\n");
  RunResult r = RunGpulet(PluginArgs({"--config", cfg}));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find(cfg + ":7: sharing.timeSlicing.resources[0].devices[1]: unknown device "
                                "\"12\""),
            std::string::npos)
      << r.output;
  RunResult p = RunGpulet(PluginArgs({"--replica-allocation-policy", "spread"}));
  EXPECT_EQ(p.exit_code, 2) << p.output;
  // The error names upstream's flag, of which --replica-allocation-policy is an alias.
  EXPECT_NE(p.output.find("--shared-devices-allocation-policy: invalid value \"spread\""),
            std::string::npos)
      << p.output;
}

// The stand-in control program, built next to the binary.
std::string MpsStandIn() {
  const char* dir = std::getenv("GPULET_BUILD_DIR");
  return std::string(dir && *dir ? dir : GPULET_BUILD_DIR) + "/mps/nvidia-cuda-mps-control";
}

TEST_F(SharingFixture, MpsWithStandInDaemonCrashAndRecovery) {
  ASSERT_TRUE(fs::exists(MpsStandIn())) << "no MPS stand-in at " << MpsStandIn();
  const std::string root = tmp_.path() + "/mps";
  std::string cfg = WriteConfig(
      "version: v1\nsharing:\n  mps:\n    resources:\n    - name: gpu\n      rename: gpu.mps\n"
      "      devices: [2, 3]\n      replicas: 4\n");
  StartHarness();
  StartPlugin({"--config", cfg, "--mps-root", root, "--mps-control-binary", MpsStandIn(),
               "--mps-on-exit", "quit"});
  const std::string mps = "nvidia.com/gpu.mps";
  WaitForDevices(6, 6);
  WaitForDevices(8, 8, 60s, mps);

  const std::string dir = root + "/nvidia.com_gpu.mps";
  const std::string log = dir + "/log/control.log";
  ASSERT_TRUE(Eventually(
      [&] {
        return ReadAll(log).find("CMD set_default_active_thread_percentage 25") !=
               std::string::npos;
      },
      30s))
      << ReadAll(log);
  EXPECT_NE(ReadAll(log).find("set_default_device_pinned_mem_limit 1 "), std::string::npos)
      << ReadAll(log);

  std::vector<std::string> ids = DeviceIds(mps);
  Result<v1beta1::ContainerAllocateResponse> a = harness_->Allocate(mps, {ids[0]});
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->envs().at("CUDA_MPS_PIPE_DIRECTORY"), "/mps/nvidia.com_gpu.mps/pipe");
  EXPECT_EQ(a->envs().at("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "25");
  EXPECT_NE(a->envs().at("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT").rfind("0=", 0), std::string::npos);
  std::map<std::string, std::string> mounts;
  for (const auto& m : a->mounts()) mounts[m.container_path()] = m.host_path();
  EXPECT_EQ(mounts["/mps/nvidia.com_gpu.mps/pipe"], dir + "/pipe");
  EXPECT_EQ(mounts["/dev/shm"], root + "/shm");
  EXPECT_FALSE(harness_->Allocate(mps, {ids[0], ids[1]}).ok());  // MPS: one replica per request

  // The daemon dies: its replicas go Unhealthy, it is restarted, they come back.
  std::string pid_text = ReadAll(dir + "/pipe/nvidia-cuda-mps-control.pid");
  const pid_t pid = static_cast<pid_t>(std::atol(pid_text.c_str()));
  ASSERT_GT(pid, 1) << pid_text;
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  WaitForDevices(8, 0, 60s, mps);
  EXPECT_EQ(harness_->State(kGpu)->HealthyCount(), 6u);
  WaitForDevices(8, 8, 60s, mps);

  EXPECT_EQ(plugin_->Stop(SIGTERM), 0);
  EXPECT_TRUE(Eventually([&] { return ReadAll(log).find("QUIT") != std::string::npos; }, 30s))
      << ReadAll(log);
}

TEST_F(SharingFixture, MpsDaemonRestartsWhenItsResourceChangesOnReload) {
  ASSERT_TRUE(fs::exists(MpsStandIn())) << "no MPS stand-in at " << MpsStandIn();
  const std::string root = tmp_.path() + "/mps";
  const std::string cfg = tmp_.path() + "/mps.yaml";
  auto write = [&](int replicas) {
    std::ofstream(cfg + ".tmp") << "version: v1\nsharing:\n  mps:\n    resources:\n"
                                   "    - name: gpu\n      rename: gpu.mps\n      devices: [0]\n"
                                   "      replicas: "
                                << replicas << "\n";
    fs::rename(cfg + ".tmp", cfg);
  };
  write(4);
  StartHarness();
  StartPlugin({"--config", cfg, "--mps-root", root, "--mps-control-binary", MpsStandIn(),
               "--mps-on-exit", "quit"});
  const std::string mps = "nvidia.com/gpu.mps";
  WaitForDevices(4, 4, 60s, mps);
  const std::string log = root + "/nvidia.com_gpu.mps/log/control.log";
  // A reload that does not change the MPS resource leaves the daemon alone.
  plugin_->Signal(SIGHUP);
  ASSERT_TRUE(plugin_->WaitForLog("event=reload ", 30s));
  EXPECT_EQ(plugin_->CountInLog("event=mps_started"), 1);
  // Two replicas instead of four: the running supervisor restarts that daemon alone, with the
  // new defaults.
  write(2);
  WaitForDevices(2, 2, 60s, mps);
  ASSERT_TRUE(plugin_->WaitForLog("event=mps_updated", 30s));
  EXPECT_EQ(plugin_->CountInLog("event=mps_started"), 1);
  EXPECT_TRUE(Eventually(
      [&] {
        return ReadAll(log).find("CMD set_default_active_thread_percentage 50") !=
               std::string::npos;
      },
      30s))
      << ReadAll(log);
  Result<v1beta1::ContainerAllocateResponse> a = harness_->Allocate(mps, {DeviceIds(mps)[0]});
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->envs().at("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "50");
}

// A restart or an upgrade of gpulet must not take the MPS servers of running pods away: by
// default the daemons are left running at exit and the next gpulet adopts them (same pid, no
// QUIT), instead of quitting and starting new ones.
TEST_F(SharingFixture, MpsDaemonsSurviveAGpuletRestartAndAreAdopted) {
  ASSERT_TRUE(fs::exists(MpsStandIn())) << "no MPS stand-in at " << MpsStandIn();
  const std::string root = tmp_.path() + "/mps";
  std::string cfg = WriteConfig(
      "version: v1\nsharing:\n  mps:\n    resources:\n    - name: gpu\n      rename: gpu.mps\n"
      "      devices: [1]\n      replicas: 2\n");
  StartHarness();
  StartPlugin({"--config", cfg, "--mps-root", root, "--mps-control-binary", MpsStandIn()});
  const std::string mps = "nvidia.com/gpu.mps";
  WaitForDevices(2, 2, 60s, mps);
  const std::string dir = root + "/nvidia.com_gpu.mps";
  const std::string pid_file = dir + "/pipe/nvidia-cuda-mps-control.pid";
  ASSERT_TRUE(Eventually([&] { return std::atol(ReadAll(pid_file).c_str()) > 1; }, 30s));
  const pid_t pid = static_cast<pid_t>(std::atol(ReadAll(pid_file).c_str()));

  EXPECT_EQ(plugin_->Stop(SIGTERM), 0);
  EXPECT_TRUE(plugin_->WaitForLog("event=mps_detached", 1s));
  EXPECT_EQ(::kill(pid, 0), 0) << "the MPS daemon was stopped with gpulet";
  EXPECT_EQ(ReadAll(dir + "/log/control.log").find("QUIT"), std::string::npos);

  // The next gpulet adopts the running daemon; this one quits it at exit (test cleanup).
  StartPlugin({"--config", cfg, "--mps-root", root, "--mps-control-binary", MpsStandIn(),
               "--mps-on-exit", "quit"});
  WaitForDevices(2, 2, 60s, mps);
  ASSERT_TRUE(plugin_->WaitForLog("event=mps_daemon_adopted", 30s));
  EXPECT_EQ(plugin_->CountInLog("event=mps_daemon_started"), 0);
  EXPECT_EQ(static_cast<pid_t>(std::atol(ReadAll(pid_file).c_str())), pid);
  EXPECT_EQ(plugin_->Stop(SIGTERM), 0);
  EXPECT_TRUE(Eventually(
      [&] { return ReadAll(dir + "/log/control.log").find("QUIT") != std::string::npos; }, 30s));
}

// Repartitions GPU 1 of the dgx-a100 node from 7 × 1g.5gb to 2 × 3g.20gb with `gpulet mig apply`.
void RepartitionGpu1(const std::string& fixture, const std::string& sim_state,
                     const std::string& dir) {
  std::string mig = dir + "/mig.yaml";
  std::ofstream(mig) << "version: v1\nmig-configs:\n  two-big:\n"
                        "    - devices: [1]\n      mig-enabled: true\n"
                        "      mig-devices: {\"3g.20gb\": 2}\n";
  RunResult apply = RunGpulet({"--simulate", fixture, "--sim-state", sim_state, "mig", "apply",
                               "-f", mig, "-c", "two-big"});
  ASSERT_EQ(apply.exit_code, 0) << apply.output;
}

TEST_F(SharingFixture, RediscoversMigLayoutWithoutRestart) {
  fixture_ = "dgx-a100";
  StartHarness();
  const std::string labels = tmp_.path() + "/gfd-labels";
  StartPlugin({"--mig-strategy", "mixed", "--rescan-interval", "300ms", "--labels-file", labels});
  WaitForDevices(9, 9, 60s, "nvidia.com/mig-1g.5gb");
  WaitForDevices(1, 1, 60s, "nvidia.com/mig-3g.20gb");
  WaitForDevices(6, 6);
  // GFD's labels for the plan being served, in the NFD feature file.
  EXPECT_NE(ReadAll(labels).find("nvidia.com/mig-1g.5gb.count=9\n"), std::string::npos)
      << ReadAll(labels);
  EXPECT_NE(ReadAll(labels).find("nvidia.com/mig.strategy=mixed\n"), std::string::npos);
  const int gpu_registrations = harness_->RegistrationCount(kGpu);
  const int mid_registrations = harness_->RegistrationCount("nvidia.com/mig-2g.10gb");
  RepartitionGpu1(fixture_, sim_state_, tmp_.path());
  if (HasFatalFailure()) return;
  WaitForDevices(2, 2, 60s, "nvidia.com/mig-1g.5gb");
  WaitForDevices(3, 3, 60s, "nvidia.com/mig-3g.20gb");
  ASSERT_TRUE(plugin_->WaitForLog("event=inventory_changed", 30s));
  // The labels follow the new layout.
  for (int i = 0;
       i < 600 && ReadAll(labels).find("nvidia.com/mig-3g.20gb.count=3\n") == std::string::npos;
       ++i) {
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_NE(ReadAll(labels).find("nvidia.com/mig-3g.20gb.count=3\n"), std::string::npos)
      << ReadAll(labels);
  // Resources whose devices did not change keep their registration and stream.
  EXPECT_EQ(harness_->RegistrationCount(kGpu), gpu_registrations);
  EXPECT_EQ(harness_->RegistrationCount("nvidia.com/mig-2g.10gb"), mid_registrations);
  EXPECT_TRUE(harness_->State(kGpu)->streaming);
  // The new MIG devices are allocatable, with their own capability nodes.
  std::vector<std::string> big = DeviceIds("nvidia.com/mig-3g.20gb");
  Result<v1beta1::ContainerAllocateResponse> a =
      harness_->Allocate("nvidia.com/mig-3g.20gb", {big.back()});
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->envs().at("NVIDIA_VISIBLE_DEVICES"), big.back());
  EXPECT_TRUE(plugin_->Running());
}

}  // namespace
}  // namespace gpulet::testing
