// Shared fixture: a kubelet harness on a private device-plugin directory and `gpulet plugin
// --simulate dgx-h100` with a private simulated-node state, plus helpers to drive `gpulet sim`.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "testing/kubelet/kubelet_harness.h"
#include "tests/deviceplugin/plugin_process.h"

namespace gpulet::testing {

using namespace std::chrono_literals;

inline constexpr char kGpu[] = "nvidia.com/gpu";

class PluginFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    plugin_dir_ = tmp_.path() + "/plugins";
    sim_state_ = tmp_.path() + "/sim";
    std::filesystem::create_directories(plugin_dir_);
  }
  void TearDown() override {
    if (plugin_ && HasFailure())
      std::fprintf(stderr, "--- plugin log ---\n%s\n", plugin_->Log().c_str());
    // SIGTERM first, so the plugin stops what it started (MPS daemons) as in production; the
    // process object SIGKILLs only one that does not exit in time.
    if (plugin_) plugin_->Stop(SIGTERM, std::chrono::seconds(10));
    plugin_.reset();
    if (harness_) harness_->Stop();
  }

  void StartHarness() {
    HarnessOptions o;
    o.dial_timeout = 10s;
    StartHarness(o);
  }
  void StartHarness(const HarnessOptions& o) {
    harness_ = std::make_unique<KubeletHarness>(o);
    Status s = harness_->Start(plugin_dir_);
    ASSERT_TRUE(s.ok()) << s.message();
  }

  std::vector<std::string> PluginArgs(std::vector<std::string> extra = {}) const {
    std::vector<std::string> args = {
        "--simulate",           fixture_,    "--sim-state",           sim_state_, "plugin",
        "--device-plugin-path", plugin_dir_, "--health-quiet-period", "2s"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  void StartPlugin(std::vector<std::string> extra = {},
                   std::map<std::string, std::string> env = {}) {
    plugin_ = std::make_unique<GpuletProcess>(
        PluginArgs(std::move(extra)), tmp_.path() + "/plugin-" + std::to_string(++starts_) + ".log",
        std::move(env));
    ASSERT_TRUE(plugin_->Start());
  }

  // `gpulet --simulate <fixture> --sim-state S sim <verb…>`, which must succeed.
  void Sim(std::vector<std::string> verb) {
    std::vector<std::string> args = {"--simulate", fixture_, "--sim-state", sim_state_, "sim"};
    args.insert(args.end(), verb.begin(), verb.end());
    RunResult r = RunGpulet(args);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }

  // Waits for `resource` to be registered and streaming `count` devices, `healthy` of them healthy.
  void WaitForDevices(size_t count, size_t healthy, std::chrono::milliseconds timeout = 60s,
                      const std::string& resource = kGpu) {
    Status s = harness_->WaitFor(
        resource,
        [&](const ResourceState& st) {
          return st.registered && st.streaming && st.devices.size() == count &&
                 st.HealthyCount() == healthy;
        },
        timeout);
    ASSERT_TRUE(s.ok()) << s.message();
  }

  std::vector<std::string> DeviceIds(const std::string& resource = kGpu) const {
    std::vector<std::string> ids;
    for (const HarnessDevice& d : harness_->Devices(resource)) ids.push_back(d.id);
    return ids;
  }

  // Socket files in the plugin directory (what a kubelet restart deletes).
  std::vector<std::string> Sockets() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(plugin_dir_)) {
      if (e.is_socket()) out.push_back(e.path().filename().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  TempDir tmp_;
  std::string fixture_ = "dgx-h100";
  std::string plugin_dir_;
  std::string sim_state_;
  std::unique_ptr<KubeletHarness> harness_;
  std::unique_ptr<GpuletProcess> plugin_;
  int starts_ = 0;
};

}  // namespace gpulet::testing
