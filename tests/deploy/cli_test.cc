// The operator commands through the real binary: `gpulet quota` on the shipped examples,
// `gpulet doctor` on a simulated node (healthy and broken, text and JSON), and
// `gpulet config-sync` against the fake API server (once, then following a label change).
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "../cli/run_command.h"
#include "apiserver/fake_apiserver.h"
#include <yaml-cpp/yaml.h>

namespace gpulet::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

const std::string kSource = GPULET_SOURCE_DIR;

std::string TempDir() {
  std::string tmpl = "/tmp/gpulet-deploycli-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t Count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t p = haystack.find(needle); p != std::string::npos; p = haystack.find(needle, p + 1))
    ++n;
  return n;
}

TEST(QuotaCommand, RendersTheExampleTenantsCheckedAgainstTheExampleFleet) {
  const std::string ex = kSource + "/deploy/examples/";
  CommandResult r =
      RunCommand(GpuletBinary() + " quota --tenants " + ex + "tenants.yaml --inventory " + ex +
                 "inventory-h100-node.json --inventory " + ex +
                 "inventory-a100-mig-node.json --shared-replicas 4 2>/dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Count(r.output, "kind: ResourceQuota"), 4u);
  EXPECT_EQ(Count(r.output, "kind: LimitRange"), 0u);  // its max would demand limits everywhere
  EXPECT_EQ(Count(r.output, "kind: ValidatingAdmissionPolicy\n"), 4u);
  EXPECT_NE(r.output.find("requests.nvidia.com/mig-1g.5gb: \"14\""), std::string::npos) << r.output;
}

TEST(QuotaCommand, OverBudgetExitsThreeNamingFileLineField) {
  const std::string dir = TempDir();
  std::ofstream(dir + "/t.yaml") << "tenants:\n  - namespace: a\n    gpus: 9\n";
  CommandResult r = RunCommand(GpuletBinary() + " quota --tenants " + dir + "/t.yaml --inventory " +
                               kSource + "/deploy/examples/inventory-h100-node.json");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find(dir + "/t.yaml:2: tenants: requests.nvidia.com/gpu sums to 9, the fleet "
                                "has 8 whole GPUs"),
            std::string::npos)
      << r.output;
}

class Listener {
 public:
  explicit Listener(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::copy(path.begin(), path.end(), addr.sun_path);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(fd_, 4), 0);
  }
  ~Listener() { ::close(fd_); }

 private:
  int fd_ = -1;
};

class DoctorCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    fs::create_directories(dir_ + "/dev");
    for (const char* n : {"nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1", "nvidia2", "nvidia3",
                          "nvidia4", "nvidia5", "nvidia6", "nvidia7"}) {
      std::ofstream(dir_ + "/dev/" + n);
    }
    fs::create_directories(dir_ + "/cdi");
    std::ofstream(dir_ + "/cdi/nvidia.yaml") << "kind: nvidia.com/gpu\n";
    fs::create_directories(dir_ + "/dp");
    kubelet_ = std::make_unique<Listener>(dir_ + "/dp/kubelet.sock");
    plugin_ = std::make_unique<Listener>(dir_ + "/dp/nvidia-gpu.sock");
    std::ofstream(dir_ + "/dp/kubelet_internal_checkpoint")
        << R"({"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":["GPU-0"]}},"Checksum":1})";
  }
  std::string Doctor(const std::string& extra) {
    return GpuletBinary() + " --simulate dgx-h100 --sim-state " + dir_ + "/sim doctor --dev-root " +
           dir_ + "/dev --cdi-dir " + dir_ + "/cdi --runtime-config " + dir_ +
           "/none.toml --device-plugin-path " + dir_ + "/dp --mps-root " + dir_ + "/mps " + extra;
  }
  std::string dir_;
  std::unique_ptr<Listener> kubelet_, plugin_;
};

TEST_F(DoctorCommand, HealthySimulatedNodeExitsZero) {
  CommandResult r = RunCommand(Doctor("--output json 2>/dev/null"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_EQ(j["summary"]["fail"], 0);
  EXPECT_EQ(j["checks"][0]["id"], "driver");
  EXPECT_EQ(j["checks"][0]["status"], "PASS");
  r = RunCommand(Doctor(""));
  EXPECT_NE(r.output.find("[PASS] plugin-registration"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[SKIP] kubernetes"), std::string::npos) << r.output;
}

TEST_F(DoctorCommand, BrokenKubeletExitsOneWithTheFix) {
  kubelet_.reset();
  fs::remove(dir_ + "/dp/kubelet.sock");
  CommandResult r = RunCommand(Doctor(""));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("[FAIL] kubelet"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fix: start the kubelet"), std::string::npos) << r.output;
}

TEST_F(DoctorCommand, NoDriverFailsTheDriverCheck) {
  CommandResult r = RunCommand(GpuletBinary() +
                               " --nvml-library /nonexistent/libnvidia-ml.so.1 doctor "
                               "--dev-root " +
                               dir_ + "/dev --device-plugin-path " + dir_ + "/dp");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("[FAIL] driver"), std::string::npos) << r.output;
}

class ConfigSyncCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    Result<TestPki> pki = MakeTestPki(dir_);
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    Result<std::unique_ptr<FakeApiServer>> s = FakeApiServer::Start(*pki, {});
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(s).value();
    server_->Put(kNode, *LoadRecorded("node.json"));
    server_->Put(kCm, *LoadRecorded("configmap.json"));
    std::ofstream(dir_ + "/kubeconfig")
        << "apiVersion: v1\nkind: Config\ncurrent-context: t\nclusters:\n- name: c\n  cluster:\n"
           "    server: "
        << server_->url() << "\n    certificate-authority: ca.crt\n"
        << "users:\n- name: u\n  user:\n    token: test-token\ncontexts:\n- name: t\n  context:\n"
           "    cluster: c\n    user: u\n";
  }
  std::string Cmd(const std::string& extra) {
    return GpuletBinary() + " config-sync --kubeconfig " + dir_ +
           "/kubeconfig --node-name gpu-node-1 "
           "--configmap gpulet-system/gpulet-config --output " +
           dir_ + "/config.yaml " + extra;
  }
  void SetLabel(const std::string& v) {
    nlohmann::json n = *server_->Object(kNode);
    n["metadata"]["labels"]["nvidia.com/device-plugin.config"] = v;
    server_->Put(kNode, n);
  }
  std::string Config(const std::string& key) {
    return (*server_->Object(kCm))["data"][key].get<std::string>();
  }
  const std::string kNode = "/api/v1/nodes/gpu-node-1";
  const std::string kCm = "/api/v1/namespaces/gpulet-system/configmaps/gpulet-config";
  std::string dir_;
  std::unique_ptr<FakeApiServer> server_;
};

TEST_F(ConfigSyncCommand, OnceWritesTheDefaultThenTheLabelledConfig) {
  CommandResult r = RunCommand(Cmd("--once --default time-slicing"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Slurp(dir_ + "/config.yaml"), Config("time-slicing"));
  SetLabel("mps");
  r = RunCommand(Cmd("--once"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Slurp(dir_ + "/config.yaml"), Config("mps"));
  SetLabel("nope");
  r = RunCommand(Cmd("--once"));
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("no config \"nope\""), std::string::npos) << r.output;
}

TEST_F(ConfigSyncCommand, FollowsALabelChangeAndStopsOnSigterm) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + Cmd("2>/dev/null")).c_str(), nullptr);
    _exit(127);
  }
  auto wait_for = [&](const std::string& content) {
    for (int i = 0; i < 600; ++i) {
      if (Slurp(dir_ + "/config.yaml") == content) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  };
  EXPECT_TRUE(wait_for(Config("default")));
  ASSERT_TRUE(server_->WaitForOpenWatches(2, 30s));
  SetLabel("time-slicing");
  EXPECT_TRUE(wait_for(Config("time-slicing")));
  kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// Every named config in the shipped ConfigMap plans on the node it is meant for (what the
// DaemonSet's `gpulet node` will advertise), checked through `gpulet labels`, which builds the same
// sharing plan and reports it in GFD's labels.
struct NamedConfigCase {
  std::string config;
  std::string fixture;
  std::vector<std::string> expected;  // "key=value" lines, or "error:<text>" for a refused plan
};

TEST(ConfigMapPlans, EveryNamedConfigPlansOnItsNode) {
  const std::vector<NamedConfigCase> cases = {
      {"default", "dgx-h100", {"nvidia.com/gpu.sharing-strategy=none", "nvidia.com/gpu.count=8"}},
      {"time-slicing",
       "dgx-h100",
       {"nvidia.com/gpu.sharing-strategy=time-slicing", "nvidia.com/gpu.replicas=4",
        "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3-SHARED"}},
      // Renamed: GFD still reports the entry's replicas, without -SHARED in the product.
      {"time-slicing-split",
       "dgx-h100",
       {"nvidia.com/gpu.sharing-strategy=time-slicing", "nvidia.com/gpu.replicas=4",
        "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"}},
      {"mig-mixed",
       "dgx-a100",
       {"nvidia.com/mig.strategy=mixed", "nvidia.com/mig-1g.5gb.count=9",
        "nvidia.com/mig-3g.20gb.count=1", "nvidia.com/mig-2g.10gb.count=1"}},
      // dgx-a100 mixes profiles on GPU 0: strategy single must refuse the node, not half-advertise.
      {"mig-single", "dgx-a100", {"error:migStrategy"}},
      {"mps", "dgx-h100", {"nvidia.com/gpu.sharing-strategy=mps", "nvidia.com/mps.capable=true"}},
  };
  YAML::Node cm = YAML::LoadFile(kSource + "/deploy/base/configmap.yaml");
  EXPECT_EQ(cm["data"].size(), cases.size()) << "a named config has no case here";
  const std::string dir = TempDir();
  for (const NamedConfigCase& c : cases) {
    SCOPED_TRACE(c.config);
    ASSERT_TRUE(cm["data"][c.config]) << "missing from the ConfigMap";
    const std::string path = dir + "/" + c.config + ".yaml";
    std::ofstream(path) << cm["data"][c.config].as<std::string>();
    CommandResult r = RunCommand(std::string(GPULET_BUILD_DIR) + "/gpulet --simulate " + c.fixture +
                                 " --sim-state " + dir + "/state-" + c.fixture +
                                 " labels --oneshot --no-timestamp -o - --config-file " + path);
    for (const std::string& e : c.expected) {
      if (e.rfind("error:", 0) == 0) {
        EXPECT_NE(r.exit_code, 0) << r.output;
        EXPECT_NE(r.output.find(e.substr(6)), std::string::npos) << r.output;
      } else {
        EXPECT_EQ(r.exit_code, 0) << r.output;
        EXPECT_NE(r.output.find(e + "\n"), std::string::npos) << e << " in:\n" << r.output;
      }
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gpulet::testing
