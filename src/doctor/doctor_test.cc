// gpulet doctor against a simulated node (dgx-h100 through the simulated NVML library), a fake
// /dev, a fake kubelet device-plugins directory with live unix sockets and a checkpoint, CDI specs,
// an MPS pipe and the fake API server: healthy → every check passes; each broken piece → the
// matching check fails (or warns) and says how to fix it.
#include "doctor/doctor.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "apiserver/fake_apiserver.h"
#include "k8s/client.h"
#include "sim/simulation.h"

namespace gpulet::doctor {
namespace {

namespace fs = std::filesystem;

std::string TempDir() {
  std::string tmpl = "/tmp/gpulet-doctor-XXXXXX";  // short: unix socket paths are limited
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

// A listening unix socket, closed (and optionally left behind as a stale file) on destruction.
class UnixListener {
 public:
  explicit UnixListener(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::copy(path.begin(), path.end(), addr.sun_path);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << path;
    EXPECT_EQ(::listen(fd_, 8), 0);
  }
  ~UnixListener() { Close(); }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  std::string path_;
  int fd_ = -1;
};

config::Config ParseOrDie(const std::string& yaml) {
  Result<config::Config> c = config::ParseConfig(yaml, "test-config.yaml");
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? *c : config::Config{};
}

class DoctorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = TempDir();
    Result<sim::SimulatedNode> node = sim::PrepareSimulation("dgx-h100", root_ + "/sim");
    ASSERT_TRUE(node.ok()) << node.status().message();
    node_ = *node;
    Rediscover();
    ASSERT_TRUE(driver_.discover.ok()) << driver_.discover.message();

    // /dev with every node the driver needs.
    opts_.dev_root = root_ + "/dev";
    fs::create_directories(opts_.dev_root);
    for (const char* n : {"nvidiactl", "nvidia-uvm"}) std::ofstream(opts_.dev_root + "/" + n);
    for (const gpu::Gpu& g : driver_.inventory->gpus) {
      std::ofstream(opts_.dev_root + "/nvidia" + std::to_string(g.minor));
    }
    // A CDI spec from nvidia-ctk.
    opts_.cdi_dirs = {root_ + "/cdi"};
    opts_.runtime_configs = {root_ + "/containerd.toml"};
    fs::create_directories(root_ + "/cdi");
    std::ofstream(root_ + "/cdi/nvidia.yaml")
        << "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n"
           "  - name: all\n";
    // The kubelet with gpulet registered.
    opts_.device_plugin_path = root_ + "/dp";
    fs::create_directories(opts_.device_plugin_path);
    kubelet_ = std::make_unique<UnixListener>(opts_.device_plugin_path + "/kubelet.sock");
    plugin_ = std::make_unique<UnixListener>(opts_.device_plugin_path + "/nvidia-gpu.sock");
    WriteCheckpoint({"nvidia.com/gpu"});
    // MPS configured and its daemon's control pipe present.
    opts_.config = ParseOrDie(
        "version: v1\nflags:\n  migStrategy: none\nsharing:\n  mps:\n"
        "    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n");
    opts_.mps_root = root_ + "/mps";
    fs::create_directories(opts_.mps_root + "/nvidia.com-gpu/pipe");
    ASSERT_EQ(::mkfifo((opts_.mps_root + "/nvidia.com-gpu/pipe/control").c_str(), 0600), 0);
    // The daemon's pid file names a live process (this one).
    std::ofstream(opts_.mps_root + "/nvidia.com-gpu/pipe/nvidia-cuda-mps-control.pid")
        << ::getpid() << "\n";
    // The API server, with the node's capacity as the kubelet reports it.
    Result<testing::TestPki> pki = testing::MakeTestPki(root_);
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    Result<std::unique_ptr<testing::FakeApiServer>> api = testing::FakeApiServer::Start(*pki, {});
    ASSERT_TRUE(api.ok()) << api.status().message();
    api_ = std::move(api).value();
    api_->Put("/api/v1/nodes/gpu-node-1", *testing::LoadRecorded("node.json"));
    k8s::ClusterAccess a = api_->Access(*pki);
    client_ = std::make_unique<k8s::Client>(a);
    opts_.api = client_.get();
    opts_.node_name = "gpu-node-1";
    // No DRA driver on this node (an empty plugin registry): the DRA checks skip.
    opts_.plugins_registry = root_ + "/plugins_registry";
    fs::create_directories(opts_.plugins_registry);
  }
  void TearDown() override {
    driver_ = {};
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  void Rediscover() {
    driver_ = {};
    Result<std::shared_ptr<gpu::Nvml>> nvml = gpu::Nvml::Load(node_.library_path);
    driver_.load = nvml.status();
    if (!nvml.ok()) return;
    driver_.nvml = *nvml;
    gpu::DiscoverOptions d;
    d.sysfs_root = node_.sysfs_root;
    d.procfs_root = node_.procfs_root;
    Result<gpu::Inventory> inv = gpu::Discover(*driver_.nvml, d);
    driver_.discover = inv.status();
    if (inv.ok()) driver_.inventory = *inv;
  }
  void WriteCheckpoint(const std::vector<std::string>& resources) {
    nlohmann::json reg = nlohmann::json::object();
    for (const std::string& r : resources) reg[r] = {"GPU-a", "GPU-b"};
    std::ofstream(opts_.device_plugin_path + "/kubelet_internal_checkpoint") << nlohmann::json{
        {"Data", {{"PodDeviceEntries", nullptr}, {"RegisteredDevices", reg}}},
        {"Checksum", 12345}}.dump();
  }
  Check Find(const std::vector<Check>& checks, const std::string& id) {
    for (const Check& c : checks) {
      if (c.id == id) return c;
    }
    ADD_FAILURE() << "no check " << id;
    return {};
  }
  // Runs every check and returns the one named `id`, expecting the others not to FAIL.
  Check Only(const std::string& id) {
    std::vector<Check> all = RunChecks(driver_, opts_);
    for (const Check& c : all) {
      if (c.id != id) {
        EXPECT_NE(c.verdict, Verdict::kFail) << c.id << ": " << c.detail;
      }
    }
    return Find(all, id);
  }

  std::string root_;
  sim::SimulatedNode node_;
  DriverState driver_;
  DoctorOptions opts_;
  std::unique_ptr<UnixListener> kubelet_, plugin_;
  std::unique_ptr<testing::FakeApiServer> api_;
  std::unique_ptr<k8s::Client> client_;
};

TEST_F(DoctorTest, HealthyNodePassesEveryCheckInOrder) {
  std::vector<Check> checks = RunChecks(driver_, opts_);
  const std::vector<std::string> order = {"driver",
                                          "device-nodes",
                                          "container-runtime",
                                          "kubelet",
                                          "plugin-registration",
                                          "gpu-health",
                                          "mig-strategy",
                                          "mps",
                                          "kubernetes",
                                          "dra-api",
                                          "cdi",
                                          "dra-resources"};
  ASSERT_EQ(checks.size(), order.size());
  for (size_t i = 0; i < checks.size(); ++i) {
    EXPECT_EQ(checks[i].id, order[i]);
    // The DRA checks skip on a node where gpulet's DRA driver is not registered.
    const bool dra = i >= 9;
    EXPECT_EQ(checks[i].verdict, dra ? Verdict::kSkip : Verdict::kPass)
        << checks[i].id << ": " << checks[i].detail;
    if (dra) {
      EXPECT_NE(checks[i].detail.find("pass --dra"), std::string::npos) << checks[i].detail;
    }
    EXPECT_TRUE(checks[i].fix.empty()) << checks[i].id;
  }
  EXPECT_FALSE(AnyFailed(checks));
  EXPECT_NE(checks[0].detail.find("550.54.15"), std::string::npos) << checks[0].detail;
  EXPECT_NE(checks[4].detail.find("nvidia.com/gpu (2 devices)"), std::string::npos);
  EXPECT_NE(checks[8].detail.find("nvidia.com/gpu capacity 8, allocatable 8"), std::string::npos);
  nlohmann::json j = ToJson(checks);
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_EQ(j["summary"]["pass"], 9);
  EXPECT_EQ(j["summary"]["skip"], 3);
  EXPECT_NE(FormatText(checks).find("[PASS] driver"), std::string::npos);
}

TEST_F(DoctorTest, NoDriverFailsWithTheRuntimeFix) {
  Result<std::shared_ptr<gpu::Nvml>> nvml = gpu::Nvml::Load("/nonexistent/libnvidia-ml.so.1");
  DriverState d;
  d.load = nvml.status();
  std::vector<Check> checks = RunChecks(d, opts_);
  Check c = Find(checks, "driver");
  EXPECT_EQ(c.verdict, Verdict::kFail);
  EXPECT_NE(c.fix.find("NVIDIA container runtime"), std::string::npos) << c.fix;
  EXPECT_EQ(Find(checks, "gpu-health").verdict, Verdict::kSkip);
  EXPECT_TRUE(AnyFailed(checks));
  EXPECT_FALSE(ToJson(checks)["ok"].get<bool>());
  EXPECT_NE(FormatText(checks).find("       fix: "), std::string::npos);
}

TEST_F(DoctorTest, MissingUvmDeviceNodeIsNamed) {
  fs::remove(opts_.dev_root + "/nvidia-uvm");
  fs::remove(opts_.dev_root + "/nvidia3");
  Check c = Only("device-nodes");
  EXPECT_EQ(c.verdict, Verdict::kFail);
  EXPECT_NE(c.detail.find(opts_.dev_root + "/nvidia-uvm"), std::string::npos) << c.detail;
  EXPECT_NE(c.detail.find(opts_.dev_root + "/nvidia3"), std::string::npos) << c.detail;
  EXPECT_NE(c.fix.find("nvidia-modprobe"), std::string::npos);
}

TEST_F(DoctorTest, NoCdiSpecAndNoNvidiaRuntimeFails) {
  fs::remove(root_ + "/cdi/nvidia.yaml");
  std::ofstream(root_ + "/containerd.toml") << "[plugins.\"io.containerd.grpc.v1.cri\"]\n";
  Check c = Only("container-runtime");
  EXPECT_EQ(c.verdict, Verdict::kFail);
  EXPECT_NE(c.fix.find("nvidia-ctk"), std::string::npos);
  // The nvidia runtime configured in containerd is enough.
  std::ofstream(root_ + "/containerd.toml")
      << "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\n"
         "  BinaryName = \"/usr/bin/nvidia-container-runtime\"\n";
  EXPECT_EQ(Only("container-runtime").verdict, Verdict::kPass);
}

TEST_F(DoctorTest, KubeletSocketMissingOrStaleFails) {
  kubelet_->Close();  // the file stays: a stale socket
  Check c = Only("kubelet");
  EXPECT_EQ(c.verdict, Verdict::kFail);
  EXPECT_NE(c.detail.find("nothing accepts connections"), std::string::npos) << c.detail;
  fs::remove(opts_.device_plugin_path + "/kubelet.sock");
  c = Only("kubelet");
  EXPECT_EQ(c.verdict, Verdict::kFail);
  EXPECT_NE(c.detail.find("kubelet.sock is missing"), std::string::npos) << c.detail;
}

TEST_F(DoctorTest, PluginSocketWithoutRegistrationFails) {
  WriteCheckpoint({});
  Check c = Only("plugin-registration");
  EXPECT_EQ(c.verdict, Verdict::kFail);
  EXPECT_NE(c.detail.find("not registered with the kubelet: nvidia.com/gpu (nvidia-gpu.sock)"),
            std::string::npos)
      << c.detail;
}

TEST_F(DoctorTest, NoPluginSocketMeansGpuletIsNotRunning) {
  plugin_.reset();
  fs::remove(opts_.device_plugin_path + "/nvidia-gpu.sock");
  std::vector<Check> checks = RunChecks(driver_, opts_);
  Check c = Find(checks, "plugin-registration");
  EXPECT_EQ(c.verdict, Verdict::kFail);
  EXPECT_NE(c.fix.find("gpulet node is not running"), std::string::npos) << c.fix;
}

TEST_F(DoctorTest, MissingCheckpointWarnsAndStaleRegistrationWarns) {
  fs::remove(opts_.device_plugin_path + "/kubelet_internal_checkpoint");
  EXPECT_EQ(Only("plugin-registration").verdict, Verdict::kWarn);
  WriteCheckpoint({"nvidia.com/gpu", "nvidia.com/mig-1g.10gb"});
  Check c = Only("plugin-registration");
  EXPECT_EQ(c.verdict, Verdict::kWarn);
  EXPECT_NE(c.detail.find("nvidia.com/mig-1g.10gb with no socket"), std::string::npos) << c.detail;
}

TEST_F(DoctorTest, LostGpuFailsHealth) {
  ASSERT_TRUE(sim::SetLost(sim::ControlFile(node_.state_dir), 3, true).ok());
  Rediscover();
  Check c = Find(RunChecks(driver_, opts_), "gpu-health");
  EXPECT_EQ(c.verdict, Verdict::kFail);
  EXPECT_NE(c.detail.find("3"), std::string::npos) << c.detail;
  EXPECT_NE(c.fix.find("reset"), std::string::npos) << c.fix;
}

TEST_F(DoctorTest, UncorrectableEccFailsHealthNamingTheGpu) {
  ASSERT_TRUE(sim::ControlFile(node_.state_dir)
                  .Update([](sim::ControlState& s) { s.gpus[5].ecc_double_bit = 2; })
                  .ok());
  Check c = Only("gpu-health");
  EXPECT_EQ(c.verdict, Verdict::kFail);
  EXPECT_NE(c.detail.find("GPU 5"), std::string::npos) << c.detail;
  EXPECT_NE(c.detail.find("uncorrectable ECC"), std::string::npos) << c.detail;
}

TEST_F(DoctorTest, MpsPipeLeftByADeadDaemonFails) {
  EXPECT_EQ(Only("mps").verdict, Verdict::kPass);
  // A child that has exited and been reaped: its pid names no process.
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);
  std::ofstream(opts_.mps_root + "/nvidia.com-gpu/pipe/nvidia-cuda-mps-control.pid") << child;
  Check c = Only("mps");
  EXPECT_EQ(c.verdict, Verdict::kFail);
  EXPECT_NE(c.detail.find("not running"), std::string::npos) << c.detail;
  EXPECT_NE(c.detail.find("gone"), std::string::npos) << c.detail;
}

TEST_F(DoctorTest, MpsConfiguredWithoutDaemonFails) {
  fs::remove(opts_.mps_root + "/nvidia.com-gpu/pipe/control");
  Check c = Only("mps");
  EXPECT_EQ(c.verdict, Verdict::kFail);
  EXPECT_NE(c.detail.find("no MPS control daemon pipe"), std::string::npos);
  opts_.config = ParseOrDie("version: v1\n");
  EXPECT_EQ(Only("mps").verdict, Verdict::kSkip);
}

TEST_F(DoctorTest, NoGpuCapacityIsGpusInvisibleToKubernetes) {
  nlohmann::json node = *api_->Object("/api/v1/nodes/gpu-node-1");
  node["status"]["capacity"].erase("nvidia.com/gpu");
  node["status"]["allocatable"].erase("nvidia.com/gpu");
  api_->Put("/api/v1/nodes/gpu-node-1", node);
  Check c = Only("kubernetes");
  EXPECT_EQ(c.verdict, Verdict::kFail);
  EXPECT_NE(c.detail.find("GPUs invisible to Kubernetes: no device plugin registered"),
            std::string::npos)
      << c.detail;
  // Unhealthy devices show as allocatable below capacity.
  node["status"]["capacity"]["nvidia.com/gpu"] = "8";
  node["status"]["allocatable"]["nvidia.com/gpu"] = "7";
  api_->Put("/api/v1/nodes/gpu-node-1", node);
  EXPECT_EQ(Only("kubernetes").verdict, Verdict::kWarn);
  opts_.node_name = "no-such-node";
  EXPECT_EQ(Only("kubernetes").verdict, Verdict::kFail);
  opts_.api = nullptr;
  EXPECT_EQ(Only("kubernetes").verdict, Verdict::kSkip);
}

// DRA prerequisites (issue 22 item 6). The driver's registration socket turns the checks on.
TEST_F(DoctorTest, TheDriversRegistrationSocketTurnsTheDraChecksOn) {
  UnixListener reg(opts_.plugins_registry + "/gpu.gpulet.io-reg.sock");
  // Discovery of the group, as kube-apiserver 1.34+ answers it.
  api_->Put("/apis/resource.k8s.io",
            {{"kind", "APIGroup"},
             {"apiVersion", "v1"},
             {"name", "resource.k8s.io"},
             {"versions",
              {{{"groupVersion", "resource.k8s.io/v1"}, {"version", "v1"}},
               {{"groupVersion", "resource.k8s.io/v1beta2"}, {"version", "v1beta2"}}}},
             {"preferredVersion", {{"groupVersion", "resource.k8s.io/v1"}, {"version", "v1"}}}});
  opts_.runtime_configs = {std::string(GPULET_SOURCE_DIR) +
                           "/src/doctor/testdata/containerd-1.7-cdi.toml"};
  // The overlay's class for whole GPUs maps nvidia.com/gpu, which the device plugin serves here.
  api_->Put("/apis/resource.k8s.io/v1/deviceclasses/gpu.gpulet.io",
            {{"apiVersion", "resource.k8s.io/v1"},
             {"kind", "DeviceClass"},
             {"metadata", {{"name", "gpu.gpulet.io"}}},
             {"spec",
              {{"selectors",
                {{{"cel",
                   {{"expression", "device.driver == \"gpu.gpulet.io\" && "
                                   "device.attributes[\"gpu.gpulet.io\"].type == \"gpu\""}}}}}},
               {"extendedResourceName", "nvidia.com/gpu"}}}});
  // Another driver's class for the same name is not gpulet's business.
  api_->Put("/apis/resource.k8s.io/v1/deviceclasses/other",
            {{"apiVersion", "resource.k8s.io/v1"},
             {"kind", "DeviceClass"},
             {"metadata", {{"name", "other"}}},
             {"spec",
              {{"selectors", {{{"cel", {{"expression", "device.driver == \"x.example.com\""}}}}}},
               {"extendedResourceName", "nvidia.com/gpu.shared"}}}});
  std::vector<Check> checks = RunChecks(driver_, opts_);
  Check api = Find(checks, "dra-api");
  EXPECT_EQ(api.verdict, Verdict::kPass) << api.detail;
  EXPECT_NE(api.detail.find("resource.k8s.io/v1 served (versions: v1, v1beta2)"),
            std::string::npos)
      << api.detail;
  Check cdi = Find(checks, "cdi");
  EXPECT_EQ(cdi.verdict, Verdict::kPass) << cdi.detail;
  EXPECT_NE(cdi.detail.find("enable_cdi = true"), std::string::npos) << cdi.detail;
  Check both = Find(checks, "dra-resources");
  EXPECT_EQ(both.verdict, Verdict::kFail) << both.detail;
  EXPECT_NE(both.detail.find("nvidia.com/gpu (DeviceClass gpu.gpulet.io)"), std::string::npos)
      << both.detail;
  EXPECT_EQ(both.detail.find("nvidia.com/gpu.shared"), std::string::npos) << both.detail;
  EXPECT_NE(both.fix.find("gpulet.io/dra"), std::string::npos) << both.fix;

  // The device plugin gone from this node, its config advertising MPS replicas as
  // nvidia.com/gpu: still a conflict (the config is what `gpulet node` would serve here).
  plugin_.reset();
  fs::remove(opts_.device_plugin_path + "/nvidia-gpu.sock");
  Check config_only = CheckDraResources(opts_);
  EXPECT_EQ(config_only.verdict, Verdict::kFail) << config_only.detail;
  // Renamed to nvidia.com/gpu.shared, which no class of this driver maps: no conflict.
  opts_.config = ParseOrDie(
      "version: v1\nsharing:\n  mps:\n    renameByDefault: true\n    resources:\n"
      "      - name: nvidia.com/gpu\n        replicas: 4\n");
  Check alone = CheckDraResources(opts_);
  EXPECT_EQ(alone.verdict, Verdict::kPass) << alone.detail;
  EXPECT_NE(alone.detail.find("nvidia.com/gpu.shared"), std::string::npos) << alone.detail;
  // The config's own names count too: time-slicing advertising nvidia.com/gpu conflicts.
  opts_.config = ParseOrDie(
      "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
      "      - name: nvidia.com/gpu\n        replicas: 4\n");
  EXPECT_EQ(CheckDraResources(opts_).verdict, Verdict::kFail);
}

TEST_F(DoctorTest, DraApiNeedsResourceV1) {
  opts_.dra = true;
  Check c = CheckDraApi(opts_);
  EXPECT_EQ(c.verdict, Verdict::kFail) << c.detail;
  EXPECT_NE(c.detail.find("does not serve the group resource.k8s.io"), std::string::npos)
      << c.detail;
  EXPECT_NE(c.fix.find("1.34"), std::string::npos) << c.fix;
  // A 1.32 cluster: betas only.
  api_->Put("/apis/resource.k8s.io",
            {{"kind", "APIGroup"},
             {"name", "resource.k8s.io"},
             {"versions", {{{"groupVersion", "resource.k8s.io/v1beta1"}, {"version", "v1beta1"}}}}});
  c = CheckDraApi(opts_);
  EXPECT_EQ(c.verdict, Verdict::kFail) << c.detail;
  EXPECT_NE(c.detail.find("without v1 (versions: v1beta1)"), std::string::npos) << c.detail;
  opts_.api = nullptr;
  EXPECT_EQ(CheckDraApi(opts_).verdict, Verdict::kSkip);
  opts_.dra = false;
  EXPECT_EQ(CheckDraApi(opts_).verdict, Verdict::kSkip);
}

// The container runtime's CDI settings, from the config files in src/doctor/testdata.
TEST_F(DoctorTest, CdiIsReadFromTheRuntimeConfig) {
  opts_.dra = true;
  const std::string data = std::string(GPULET_SOURCE_DIR) + "/src/doctor/testdata/";
  struct Case {
    std::string file;
    Verdict verdict;
    std::string detail;
  };
  const std::vector<Case> cases = {
      {"containerd-1.7-cdi.toml", Verdict::kPass, "enable_cdi = true"},
      {"containerd-1.7-default.toml", Verdict::kWarn, "no enable_cdi: off in containerd 1.7"},
      {"containerd-1.7-cdi-off.toml", Verdict::kFail,
       "plugins.io.containerd.grpc.v1.cri.enable_cdi = false"},
      {"containerd-1.7-etc-only.toml", Verdict::kFail, "leaves out /var/run/cdi"},
      {"containerd-2.0-default.toml", Verdict::kPass, "CDI on by default (containerd 2.0+)"},
      {"crio-etc-only.conf", Verdict::kFail, "crio.runtime.cdi_spec_dirs"},
      {"crio.conf.d", Verdict::kPass, "CRI-O reads CDI specs from /var/run/cdi"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.file);
    opts_.runtime_configs = {data + k.file, "/nonexistent/etc/docker/daemon.json"};
    Check c = CheckCdi(opts_);
    EXPECT_EQ(c.verdict, k.verdict) << c.detail;
    EXPECT_NE(c.detail.find(k.detail), std::string::npos) << c.detail;
    if (k.verdict != Verdict::kPass) {
      EXPECT_NE(c.fix.find("enable_cdi = true"), std::string::npos) << c.fix;
    }
  }
  // One bad runtime config among good ones fails; none readable warns.
  opts_.runtime_configs = {data + "containerd-2.0-default.toml", data + "crio-etc-only.conf"};
  EXPECT_EQ(CheckCdi(opts_).verdict, Verdict::kFail);
  opts_.runtime_configs = {root_ + "/no-containerd.toml", root_ + "/no-crio.conf"};
  Check none = CheckCdi(opts_);
  EXPECT_EQ(none.verdict, Verdict::kWarn) << none.detail;
  EXPECT_NE(none.detail.find("no containerd or CRI-O config readable"), std::string::npos);
  // Another CDI directory for the driver.
  opts_.cdi_root = "/etc/cdi";
  opts_.runtime_configs = {data + "containerd-1.7-etc-only.toml"};
  EXPECT_EQ(CheckCdi(opts_).verdict, Verdict::kPass);
}

// Without API access the overlay's classes are assumed: the device plugin's nvidia.com/gpu here
// is a conflict on a DRA node.
TEST_F(DoctorTest, DraResourcesWithoutApiAssumeTheOverlaysClasses) {
  opts_.dra = true;
  opts_.api = nullptr;
  Check c = CheckDraResources(opts_);
  EXPECT_EQ(c.verdict, Verdict::kFail) << c.detail;
  EXPECT_NE(c.detail.find("nvidia.com/gpu"), std::string::npos) << c.detail;
  EXPECT_NE(c.detail.find("assuming deploy/overlays/dra's"), std::string::npos) << c.detail;
  // No device-plugin socket left, but the config's MPS replicas are still nvidia.com/gpu.
  plugin_.reset();
  fs::remove(opts_.device_plugin_path + "/nvidia-gpu.sock");
  EXPECT_EQ(CheckDraResources(opts_).verdict, Verdict::kFail);
  // A node whose config serves nothing from the device plugin: nothing from both.
  opts_.config = ParseOrDie("version: v1\n");
  Check alone = CheckDraResources(opts_);
  EXPECT_EQ(alone.verdict, Verdict::kPass) << alone.detail;
  EXPECT_NE(alone.detail.find("none here"), std::string::npos) << alone.detail;
}

gpu::Inventory MigInventory(std::vector<std::vector<std::string>> profiles_per_gpu) {
  gpu::Inventory inv;
  for (size_t i = 0; i < profiles_per_gpu.size(); ++i) {
    gpu::Gpu g;
    g.index = static_cast<unsigned>(i);
    g.mig_capable = true;
    g.mig_enabled = !profiles_per_gpu[i].empty();
    for (const std::string& p : profiles_per_gpu[i]) {
      gpu::MigDevice m;
      m.profile = p;
      g.mig_devices.push_back(m);
    }
    inv.gpus.push_back(g);
  }
  return inv;
}

TEST(MigStrategy, MatchesTheConfiguredStrategy) {
  const auto none = ParseOrDie("version: v1\nflags:\n  migStrategy: none\n");
  const auto single = ParseOrDie("version: v1\nflags:\n  migStrategy: single\n");
  const auto mixed = ParseOrDie("version: v1\nflags:\n  migStrategy: mixed\n");
  const auto uniform = MigInventory({{"1g.10gb", "1g.10gb"}, {"1g.10gb"}});
  const auto varied = MigInventory({{"1g.10gb", "3g.40gb"}, {}});
  const auto whole = MigInventory({{}, {}});
  EXPECT_EQ(CheckMigStrategy(uniform, none).verdict, Verdict::kWarn);
  EXPECT_NE(CheckMigStrategy(uniform, none).fix.find("mig-mixed"), std::string::npos);
  EXPECT_EQ(CheckMigStrategy(uniform, single).verdict, Verdict::kPass);
  EXPECT_EQ(CheckMigStrategy(varied, single).verdict, Verdict::kFail);
  EXPECT_NE(CheckMigStrategy(varied, single).detail.find("1g.10gb, 3g.40gb"), std::string::npos);
  EXPECT_EQ(CheckMigStrategy(varied, mixed).verdict, Verdict::kPass);
  EXPECT_EQ(CheckMigStrategy(whole, mixed).verdict, Verdict::kWarn);
  EXPECT_EQ(CheckMigStrategy(whole, std::nullopt).verdict, Verdict::kPass);
}

}  // namespace
}  // namespace gpulet::doctor
