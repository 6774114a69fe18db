// Fault tests: kubelet restarts, a killed plugin, XIDs, ECC and lost GPUs on a simulated dgx-h100.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "tests/deviceplugin/plugin_fixture.h"

namespace gpulet::testing {
namespace {

Status WaitHealth(KubeletHarness& h, const std::vector<std::string>& ids, size_t gpu, bool healthy,
                  size_t healthy_count) {
  const std::string id = ids.at(gpu);
  return h.WaitFor(
      kGpu,
      [&](const ResourceState& st) {
        if (st.HealthyCount() != healthy_count) return false;
        for (const HarnessDevice& d : st.devices) {
          if (d.id == id) return d.healthy() == healthy;
        }
        return false;
      },
      60s);
}

TEST_F(PluginFixture, KubeletRestartedHundredTimesWithAllocations) {
  StartHarness();
  StartPlugin();
  WaitForDevices(8, 8);
  std::vector<std::string> ids = DeviceIds();
  for (int i = 0; i < 100; ++i) {
    const int before = harness_->RegistrationCount(kGpu);
    Status r = harness_->Restart();
    ASSERT_TRUE(r.ok()) << r.message();
    Status s = harness_->WaitFor(
        kGpu,
        [&](const ResourceState& st) {
          return st.registrations > before && st.registered && st.streaming &&
                 st.devices.size() == 8 && st.HealthyCount() == 8;
        },
        60s);
    ASSERT_TRUE(s.ok()) << "restart " << i << ": " << s.message();
    // No stale socket: exactly the kubelet's and ours.
    EXPECT_EQ(Sockets(), (std::vector<std::string>{"kubelet.sock", "nvidia-gpu.sock"})) << i;
    Result<v1beta1::ContainerAllocateResponse> a = harness_->Allocate(kGpu, {ids[i % 8]});
    ASSERT_TRUE(a.ok()) << "restart " << i << ": " << a.status().message();
    EXPECT_EQ(a->envs().at("NVIDIA_VISIBLE_DEVICES"), ids[i % 8]);
  }
  EXPECT_TRUE(plugin_->Running());
}

// issue 26 item 1: gpulet serves again and registers when its socket disappears. A kubelet that
// keys clients by resource name and handles the old stream's end after that Register
// (disconnect_delay) disconnects the NEW client; gpulet sees the kubelet end its stream and
// registers once more. Before, it stayed registered in its own eyes while the kubelet refused
// every Allocate. A kubelet keyed by socket path needs one registration.
class ReRegistration : public PluginFixture {
 protected:
  void SurvivesWith(HarnessOptions::ClientKey key) {
    const bool by_name = key == HarnessOptions::ClientKey::kResourceName;
    HarnessOptions o;
    o.dial_timeout = 10s;
    o.client_key = key;
    o.disconnect_delay = 1500ms;
    StartHarness(o);
    StartPlugin();
    WaitForDevices(8, 8);
    const ResourceState first = *harness_->State(kGpu);
    ASSERT_TRUE(std::filesystem::remove(plugin_dir_ + "/" + first.endpoint));
    Status s = harness_->WaitFor(
        kGpu,
        [&](const ResourceState& st) {
          return st.registrations >= first.registrations + (by_name ? 2 : 1) && st.registered &&
                 st.streaming && st.HealthyCount() == 8 && st.disconnects == (by_name ? 1 : 0);
        },
        60s);
    ASSERT_TRUE(s.ok()) << s.message();
    Result<v1beta1::ContainerAllocateResponse> a = harness_->Allocate(kGpu, {first.devices[0].id});
    ASSERT_TRUE(a.ok()) << a.status().message();
    if (by_name) {
      EXPECT_NE(plugin_->Log().find("event=stream_lost"), std::string::npos);
    }
  }
};

TEST_F(ReRegistration, SurvivesAKubeletKeyingClientsByResourceName) {
  SurvivesWith(HarnessOptions::ClientKey::kResourceName);
}

TEST_F(ReRegistration, SurvivesAKubeletKeyingClientsBySocketPath) {
  SurvivesWith(HarnessOptions::ClientKey::kSocketPath);
}

// issue 26 item 3: admitted as the kubelet admits (free devices offered, an init container's
// device reused as mustInclude, the answer intersected with the offer), gpulet's preferred
// allocation keeps the reused device and completes it from the free ones.
TEST_F(PluginFixture, PreferredAllocationAsTheKubeletCallsIt) {
  using Kind = KubeletHarness::ContainerAdmission::Kind;
  StartHarness();
  StartPlugin();
  WaitForDevices(8, 8);
  auto other = harness_->Admit(kGpu, {"pod-a", "main"}, 3);
  ASSERT_TRUE(other.ok()) << other.status().message();
  EXPECT_TRUE(other->preferred_called);
  auto init = harness_->Admit(kGpu, {"pod-b", "init", Kind::kInit}, 1);
  ASSERT_TRUE(init.ok()) << init.status().message();
  auto app = harness_->Admit(kGpu, {"pod-b", "main"}, 4);
  ASSERT_TRUE(app.ok()) << app.status().message();
  EXPECT_TRUE(app->preferred_called);
  ASSERT_EQ(app->ids.size(), 4u);
  EXPECT_NE(std::find(app->ids.begin(), app->ids.end(), init->ids[0]), app->ids.end());
  for (const std::string& id : app->ids) {  // never one of pod-a's
    EXPECT_EQ(std::find(other->ids.begin(), other->ids.end(), id), other->ids.end()) << id;
  }
  // One left free: a request for two fails admission, as the kubelet's would.
  EXPECT_FALSE(harness_->Admit(kGpu, {"pod-c", "main"}, 2).ok());
}

TEST_F(PluginFixture, PluginKilledAndRestarted) {
  StartHarness();
  StartPlugin();
  WaitForDevices(8, 8);
  EXPECT_EQ(plugin_->Stop(SIGKILL), -1);
  Status ended = harness_->WaitFor(
      kGpu, [](const ResourceState& s) { return s.stream_ended; }, 30s);
  ASSERT_TRUE(ended.ok()) << ended.message();
  EXPECT_EQ(harness_->State(kGpu)->HealthyCount(), 0u);  // the kubelet marks them unhealthy

  StartPlugin();  // finds its stale socket file and replaces it
  Status s = harness_->WaitFor(
      kGpu,
      [](const ResourceState& st) {
        return st.registrations >= 2 && st.streaming && st.HealthyCount() == 8;
      },
      60s);
  ASSERT_TRUE(s.ok()) << s.message();
  std::vector<std::string> ids = DeviceIds();
  EXPECT_TRUE(harness_->Allocate(kGpu, {ids[0], ids[1]}).ok());
}

TEST_F(PluginFixture, Xid79MarksOnlyThatGpuAndRecovers) {
  StartHarness();
  StartPlugin();
  WaitForDevices(8, 8);
  std::vector<std::string> ids = DeviceIds();
  Sim({"xid", "--gpu", "3", "--code", "79"});
  Status s = WaitHealth(*harness_, ids, 3, false, 7);
  ASSERT_TRUE(s.ok()) << s.message();

  // The kubelet offers only healthy devices; preferred allocation and allocation keep working.
  std::vector<std::string> available;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i != 3) available.push_back(ids[i]);
  }
  Result<std::vector<std::string>> pref = harness_->GetPreferredAllocation(kGpu, available, {}, 4);
  ASSERT_TRUE(pref.ok()) << pref.status().message();
  EXPECT_EQ(*pref, (std::vector<std::string>{ids[4], ids[5], ids[6], ids[7]}));
  Result<v1beta1::ContainerAllocateResponse> a = harness_->Allocate(kGpu, *pref);
  ASSERT_TRUE(a.ok()) << a.status().message();

  // No further events and a healthy probe: Healthy again after the quiet period (2 s).
  s = WaitHealth(*harness_, ids, 3, true, 8);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(plugin_->WaitForLog("event=device_recovered", 10s));
}

// Defect: a rescan that found a MIG re-layout (on another GPU) rebuilt the health monitor, whose
// tracker wrote every device Healthy; XID 79 fires once, so GPU 2 was advertised Healthy for good.
TEST_F(PluginFixture, XidUnhealthySurvivesAMigRelayoutOnAnotherGpu) {
  fixture_ = "dgx-a100";  // GPUs 0 and 1 in MIG mode; 2..7 are nvidia.com/gpu under "mixed"
  StartHarness();
  plugin_ = std::make_unique<GpuletProcess>(
      std::vector<std::string>{"--simulate", fixture_, "--sim-state", sim_state_, "plugin",
                               "--device-plugin-path", plugin_dir_, "--health-quiet-period", "0",
                               "--mig-strategy", "mixed", "--rescan-interval", "200ms"},
      tmp_.path() + "/plugin.log");
  ASSERT_TRUE(plugin_->Start());
  WaitForDevices(6, 6);
  WaitForDevices(1, 1, 60s, "nvidia.com/mig-3g.20gb");
  const std::vector<std::string> ids = DeviceIds();  // GPUs 2..7
  Sim({"xid", "--gpu", "2", "--code", "79"});
  Status s = WaitHealth(*harness_, ids, 0, false, 5);
  ASSERT_TRUE(s.ok()) << s.message();

  const std::string mig_file = tmp_.path() + "/mig.yaml";
  std::ofstream(mig_file) << "version: v1\nmig-configs:\n  two-big:\n    - devices: [1]\n"
                             "      mig-enabled: true\n      mig-devices: {\"3g.20gb\": 2}\n";
  RunResult apply = RunGpulet({"--simulate", fixture_, "--sim-state", sim_state_, "mig", "apply",
                               "-f", mig_file, "-c", "two-big"});
  ASSERT_EQ(apply.exit_code, 0) << apply.output;
  WaitForDevices(3, 3, 60s, "nvidia.com/mig-3g.20gb");  // the rescan found the new layout

  // An event after the re-layout: once GPU 3 shows unhealthy, the stream reflects every health
  // change made before it, so GPU 2 must still be unhealthy in the same update.
  Sim({"xid", "--gpu", "3", "--code", "79"});
  s = harness_->WaitFor(
      kGpu,
      [&](const ResourceState& st) {
        for (const HarnessDevice& d : st.devices) {
          if (d.id == ids[1]) return !d.healthy();
        }
        return false;
      },
      60s);
  ASSERT_TRUE(s.ok()) << s.message();
  for (const HarnessDevice& d : harness_->Devices(kGpu)) {
    if (d.id == ids[0]) {
      EXPECT_FALSE(d.healthy()) << "GPU 2 (XID 79) re-advertised Healthy";
    }
  }
  EXPECT_EQ(harness_->State(kGpu)->HealthyCount(), 4u);
}

// `gpulet mig apply` holds the MIG layout lock (<sim-state>/mig-layout.lock here) while it
// changes GPU and compute instances; the plugin's rescan must not advertise what it sees then.
// The test plays an apply in progress: it holds the lock and changes the layout underneath.
TEST_F(PluginFixture, RescanDefersWhileTheMigLayoutLockIsHeld) {
  fixture_ = "dgx-a100";
  StartHarness();
  plugin_ = std::make_unique<GpuletProcess>(
      std::vector<std::string>{"--log-level", "debug", "--simulate", fixture_, "--sim-state",
                               sim_state_, "plugin", "--device-plugin-path", plugin_dir_,
                               "--mig-strategy", "mixed", "--rescan-interval", "200ms"},
      tmp_.path() + "/plugin.log");
  ASSERT_TRUE(plugin_->Start());
  WaitForDevices(1, 1, 60s, "nvidia.com/mig-3g.20gb");
  WaitForDevices(9, 9, 60s, "nvidia.com/mig-1g.5gb");

  const int lock =
      ::open((sim_state_ + "/mig-layout.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(lock, 0);
  ASSERT_EQ(::flock(lock, LOCK_EX), 0);
  const std::string mig_file = tmp_.path() + "/mig.yaml";
  std::ofstream(mig_file) << "version: v1\nmig-configs:\n  two-big:\n    - devices: [1]\n"
                             "      mig-enabled: true\n      mig-devices: {\"3g.20gb\": 2}\n";
  // The change itself goes around the lock (another lock file), as if made inside our apply.
  RunResult apply = RunGpulet({"--simulate", fixture_, "--sim-state", sim_state_, "mig", "apply",
                               "-f", mig_file, "-c", "two-big"},
                              60s, {{"GPULET_MIG_LOCK_FILE", tmp_.path() + "/other.lock"}});
  ASSERT_EQ(apply.exit_code, 0) << apply.output;
  // Two rescans after the change, both deferred: nothing of the new layout is advertised.
  const int deferred = plugin_->CountInLog("event=rescan_deferred");
  ASSERT_TRUE(plugin_->WaitForLog("event=rescan_deferred", 30s, deferred + 2)) << plugin_->Log();
  EXPECT_EQ(harness_->Devices("nvidia.com/mig-3g.20gb").size(), 1u);
  EXPECT_EQ(harness_->Devices("nvidia.com/mig-1g.5gb").size(), 9u);

  ::close(lock);  // the apply is done: the next rescan picks the new layout up
  WaitForDevices(3, 3, 60s, "nvidia.com/mig-3g.20gb");
  WaitForDevices(2, 2, 60s, "nvidia.com/mig-1g.5gb");
  EXPECT_TRUE(plugin_->WaitForLog("event=rescan_resumed", 10s)) << plugin_->Log();
}

// `gpulet mig apply` itself waits for the lock (a rescan or another apply holding it), says so,
// and applies once it is free.
TEST_F(PluginFixture, MigApplyWaitsForTheLayoutLock) {
  fixture_ = "dgx-a100";
  const std::string lock_path = tmp_.path() + "/layout.lock";
  const int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(lock, 0);
  ASSERT_EQ(::flock(lock, LOCK_SH), 0);  // a rescan in progress
  const std::string mig_file = tmp_.path() + "/mig.yaml";
  std::ofstream(mig_file) << "version: v1\nmig-configs:\n  two-big:\n    - devices: [1]\n"
                             "      mig-enabled: true\n      mig-devices: {\"3g.20gb\": 2}\n";
  GpuletProcess apply({"--simulate", fixture_, "--sim-state", sim_state_, "mig", "apply", "-f",
                       mig_file, "-c", "two-big"},
                      tmp_.path() + "/apply.log", {{"GPULET_MIG_LOCK_FILE", lock_path}});
  ASSERT_TRUE(apply.Start());
  ASSERT_TRUE(apply.WaitForLog("waiting for the MIG layout lock", 30s)) << apply.Log();
  EXPECT_EQ(apply.CountInLog("applied"), 0);
  ::close(lock);
  ASSERT_TRUE(apply.WaitForLog("applied", 60s)) << apply.Log();
  // It exits by itself once applied; a SIGTERM sent meanwhile (slower under ASan, whose exit
  // work comes after the log line) would make its exit a signal's.
  ASSERT_TRUE(Eventually([&] { return !apply.Running(); }, 60s)) << apply.Log();
  EXPECT_EQ(apply.Stop(SIGTERM, 30s), 0) << apply.Log();
}

TEST_F(PluginFixture, IgnoredXidChangesNothing) {
  StartHarness();
  StartPlugin();
  WaitForDevices(8, 8);
  std::vector<std::string> ids = DeviceIds();
  Sim({"xid", "--gpu", "2", "--code", "13"});
  ASSERT_TRUE(plugin_->WaitForLog("event=xid_ignored", 30s)) << plugin_->Log();
  // Events are handled in order: once the later XID 48 shows, XID 13 has been handled.
  Sim({"xid", "--gpu", "5", "--code", "48"});
  Status s = WaitHealth(*harness_, ids, 5, false, 7);
  ASSERT_TRUE(s.ok()) << s.message();
  for (const HarnessDevice& d : harness_->Devices(kGpu)) {
    if (d.id == ids[2]) {
      EXPECT_TRUE(d.healthy());
    }
  }
  EXPECT_EQ(plugin_->CountInLog("event=device_unhealthy uuid=" + ids[2]), 0);
}

TEST_F(PluginFixture, DisabledXidIsIgnored) {
  StartHarness();
  StartPlugin({}, {{"DP_DISABLE_HEALTHCHECKS", "79"}});
  WaitForDevices(8, 8);
  std::vector<std::string> ids = DeviceIds();
  Sim({"xid", "--gpu", "1", "--code", "79"});
  Sim({"ecc", "--gpu", "6", "--double-bit", "1"});
  Status s = WaitHealth(*harness_, ids, 6, false, 7);
  ASSERT_TRUE(s.ok()) << s.message();
  for (const HarnessDevice& d : harness_->Devices(kGpu)) {
    if (d.id == ids[1]) {
      EXPECT_TRUE(d.healthy());
    }
  }
}

TEST_F(PluginFixture, LostGpuStaysUnhealthyUntilRestored) {
  StartHarness();
  // Debug: one event=health_probe line per probe cycle (every second), which this test counts.
  StartPlugin({"--log-level", "debug"});
  WaitForDevices(8, 8);
  std::vector<std::string> ids = DeviceIds();
  Sim({"lose", "--gpu", "6"});
  Status s = WaitHealth(*harness_, ids, 6, false, 7);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(plugin_->WaitForLog("GPU is lost", 10s));
  // Three more probe cycles that find the GPU lost span more than the 2 s quiet period: it is
  // still lost, so still unhealthy (the probe keeps failing) and nothing recovered.
  const int recovered = plugin_->CountInLog("event=device_recovered");
  const int lost_probes = plugin_->CountInLog("event=health_probe lost=1");
  ASSERT_TRUE(plugin_->WaitForLog("event=health_probe lost=1", 30s, lost_probes + 3));
  EXPECT_EQ(harness_->State(kGpu)->HealthyCount(), 7u);
  EXPECT_EQ(plugin_->CountInLog("event=device_recovered"), recovered);
  // The other GPUs keep working.
  EXPECT_TRUE(harness_->Allocate(kGpu, {ids[0]}).ok());

  Sim({"restore", "--gpu", "6"});
  s = WaitHealth(*harness_, ids, 6, true, 8);
  ASSERT_TRUE(s.ok()) << s.message();
}

}  // namespace
}  // namespace gpulet::testing
