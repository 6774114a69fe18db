// `gpulet plugin` on a simulated dgx-h100 against the kubelet harness: registration, allocation
// over the real socket, errors, configuration, and start-up without a kubelet.
#include <fstream>

#include "tests/deviceplugin/plugin_fixture.h"

namespace gpulet::testing {
namespace {

TEST_F(PluginFixture, RegistersEightHealthyGpusAndAllocates) {
  StartHarness();
  StartPlugin();
  WaitForDevices(8, 8);
  std::optional<ResourceState> st = harness_->State(kGpu);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->endpoint, "nvidia-gpu.sock");
  EXPECT_TRUE(st->options.get_preferred_allocation_available());
  std::vector<HarnessDevice> devices = harness_->Devices(kGpu);
  for (size_t i = 0; i < devices.size(); ++i) {
    EXPECT_EQ(devices[i].id.rfind("GPU-", 0), 0u) << devices[i].id;
    EXPECT_EQ(devices[i].numa_nodes, std::vector<int64_t>{i < 4 ? 0 : 1});
  }

  std::vector<std::string> ids = DeviceIds();
  Result<std::vector<std::string>> pref = harness_->GetPreferredAllocation(kGpu, ids, {ids[6]}, 2);
  ASSERT_TRUE(pref.ok()) << pref.status().message();
  EXPECT_EQ(*pref, (std::vector<std::string>{ids[4], ids[6]}));  // same socket as GPU 6

  Result<v1beta1::ContainerAllocateResponse> alloc = harness_->Allocate(kGpu, *pref);
  ASSERT_TRUE(alloc.ok()) << alloc.status().message();
  EXPECT_EQ(alloc->envs().at("NVIDIA_VISIBLE_DEVICES"), ids[4] + "," + ids[6]);

  EXPECT_EQ(plugin_->Stop(SIGTERM), 0);
  EXPECT_TRUE(Sockets() == std::vector<std::string>{"kubelet.sock"});
  Status ended = harness_->WaitFor(
      kGpu, [](const ResourceState& s) { return s.stream_ended; }, 30s);
  EXPECT_TRUE(ended.ok()) << ended.message();
}

TEST_F(PluginFixture, AllocateRejectsUnknownAndDuplicatedIds) {
  StartHarness();
  StartPlugin();
  WaitForDevices(8, 8);
  std::vector<std::string> ids = DeviceIds();

  Result<v1beta1::ContainerAllocateResponse> unknown = harness_->Allocate(kGpu, {"GPU-bogus"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("unknown device ID \"GPU-bogus\""), std::string::npos)
      << unknown.status().message();
  Result<v1beta1::ContainerAllocateResponse> dup = harness_->Allocate(kGpu, {ids[1], ids[1]});
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("requested twice"), std::string::npos)
      << dup.status().message();
  Result<std::vector<std::string>> pref = harness_->GetPreferredAllocation(kGpu, ids, {"GPU-x"}, 2);
  EXPECT_FALSE(pref.ok());

  // The plugin is still up and serving.
  Result<v1beta1::ContainerAllocateResponse> ok = harness_->Allocate(kGpu, {ids[0]});
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_TRUE(plugin_->Running());
}

TEST_F(PluginFixture, WaitsForAbsentKubelet) {
  StartPlugin();
  ASSERT_TRUE(
      Eventually([&] { return Sockets() == std::vector<std::string>{"nvidia-gpu.sock"}; }, 60s))
      << plugin_->Log();
  // It keeps serving (and retrying) without a kubelet.
  ASSERT_TRUE(plugin_->WaitForLog("event=plugin_manager_started", 30s));
  EXPECT_TRUE(plugin_->Running());
  StartHarness();
  WaitForDevices(8, 8);
}

TEST_F(PluginFixture, StrategiesFromConfigFileEnvAndFlags) {
  std::string cfg = tmp_.path() + "/config.yaml";
  std::ofstream(cfg) << "version: v1\nflags:\n  plugin:\n    deviceListStrategy: volume-mounts\n"
                        "    deviceIDStrategy: index\n    passDeviceSpecs: true\n";
  StartHarness();
  // File says index; the environment says uuid (env beats file); the flag adds CDI (flag beats
  // env for the list strategy).
  StartPlugin({"--config", cfg, "--device-list-strategy", "volume-mounts,cdi-cri"},
              {{"DEVICE_ID_STRATEGY", "uuid"}, {"DEVICE_LIST_STRATEGY", "envvar"}});
  WaitForDevices(8, 8);
  std::vector<std::string> ids = DeviceIds();
  Result<v1beta1::ContainerAllocateResponse> r = harness_->Allocate(kGpu, {ids[2]});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->envs().at("NVIDIA_VISIBLE_DEVICES"), "/var/run/nvidia-container-devices");
  ASSERT_EQ(r->mounts_size(), 1);
  EXPECT_EQ(r->mounts(0).container_path(), "/var/run/nvidia-container-devices/" + ids[2]);
  ASSERT_EQ(r->cdi_devices_size(), 1);
  EXPECT_EQ(r->cdi_devices(0).name(), "nvidia.com/gpu=" + ids[2]);
  bool has_dev2 = false;
  for (const auto& d : r->devices()) has_dev2 |= d.container_path() == "/dev/nvidia2";
  EXPECT_TRUE(has_dev2);
}

TEST_F(PluginFixture, ReloadKeepsUnchangedStreamsAndRestartsChangedOnes) {
  std::string cfg = tmp_.path() + "/config.yaml";
  std::ofstream(cfg) << "version: v1\nflags:\n  plugin:\n    deviceListStrategy: envvar\n";
  StartHarness();
  StartPlugin({"--config", cfg});
  WaitForDevices(8, 8);
  ASSERT_EQ(harness_->RegistrationCount(kGpu), 1);

  // SIGHUP with an unchanged plan: reloaded, same registration and stream.
  plugin_->Signal(SIGHUP);
  ASSERT_TRUE(plugin_->WaitForLog("event=reload ", 30s));
  // A change that does not alter the plan (a comment) through the file watch.
  std::ofstream(cfg) << "# same\nversion: v1\nflags:\n  plugin:\n    deviceListStrategy: envvar\n";
  ASSERT_TRUE(plugin_->WaitForLog("event=reload ", 30s, 2));
  EXPECT_EQ(harness_->RegistrationCount(kGpu), 1);
  EXPECT_TRUE(harness_->State(kGpu)->streaming);

  // A malformed file is rejected and the current setup kept.
  std::ofstream(cfg) << "version: v1\nflags:\n  plugin:\n    deviceListStrategy: [\n";
  ASSERT_TRUE(plugin_->WaitForLog("event=reload_failed", 30s));
  EXPECT_EQ(harness_->RegistrationCount(kGpu), 1);

  // A real change restarts the resource: re-registered, new behaviour.
  std::ofstream(cfg) << "version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-annotations\n";
  Status s = harness_->WaitFor(
      kGpu, [](const ResourceState& st) { return st.registrations >= 2 && st.streaming; }, 30s);
  ASSERT_TRUE(s.ok()) << s.message();
  std::vector<std::string> ids = DeviceIds();
  Result<v1beta1::ContainerAllocateResponse> r = harness_->Allocate(kGpu, {ids[0]});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->envs().count("NVIDIA_VISIBLE_DEVICES"), 0u);
  ASSERT_EQ(r->annotations().size(), 1u);
  EXPECT_EQ(r->annotations().begin()->second, "nvidia.com/gpu=" + ids[0]);
}

struct BadConfig {
  const char* name;
  const char* text;
  const char* want;  // substring of the error
};

TEST_F(PluginFixture, MalformedConfigFilesExitWithClearErrors) {
  const BadConfig corpus[] = {
      {"bad_enum", "version: v1\nflags:\n  migStrategy: bogus\n", "config.yaml:3"},
      // (An unknown key is only a warning now, as in NVIDIA's parser; a missing required one
      // is still an error naming file:line:field.)
      {"missing_replicas",
       "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n",
       "replicas"},
      {"unknown_version", "version: v2\n", "version"},
      {"not_yaml", "version: v1\nflags: [\n", "config.yaml"},
      {"wrong_type", "version: v1\nflags:\n  failOnInitError: maybe\n", "failOnInitError"},
  };
  for (const BadConfig& c : corpus) {
    std::string path = tmp_.path() + "/config.yaml";
    std::ofstream(path) << c.text;
    RunResult r = RunGpulet(PluginArgs({"--config", path}));
    EXPECT_EQ(r.exit_code, 3) << c.name << ": " << r.output;  // kInvalidInput
    EXPECT_NE(r.output.find(c.want), std::string::npos) << c.name << ": " << r.output;
    EXPECT_NE(r.output.find("gpulet: error:"), std::string::npos) << c.name;
  }
  RunResult bad_flag = RunGpulet(PluginArgs({"--device-id-strategy", "serial"}));
  EXPECT_EQ(bad_flag.exit_code, 2) << bad_flag.output;
  EXPECT_NE(bad_flag.output.find("--device-id-strategy"), std::string::npos) << bad_flag.output;
}

TEST_F(PluginFixture, InitErrorExitsOrStaysUp) {
  std::vector<std::string> args = {"--nvml-library", tmp_.path() + "/missing-libnvidia-ml.so.1",
                                   "plugin", "--device-plugin-path", plugin_dir_};
  RunResult fail = RunGpulet(args);
  EXPECT_EQ(fail.exit_code, 10) << fail.output;  // kNvmlLibraryMissing

  args.push_back("--fail-on-init-error=false");
  GpuletProcess p(args, tmp_.path() + "/noinit.log");
  ASSERT_TRUE(p.Start());
  ASSERT_TRUE(p.WaitForLog("event=init_failed", 30s)) << p.Log();
  EXPECT_TRUE(p.Running());
  EXPECT_TRUE(Sockets().empty());
  EXPECT_EQ(p.Stop(SIGTERM), 0) << p.Log();
}

}  // namespace
}  // namespace gpulet::testing
