// `gpulet exporter --kubernetes --kubernetes-virtual-gpus` end to end: the simulated driver runs
// processes on a shared GPU, a fake /proc gives their cgroups (cgroup v1 and v2, cgroupfs and
// systemd drivers, every QoS class), the kubelet harness lists the pods holding the GPU's
// replicas, and a fake API server names the pods' UIDs. Each pod then gets its own
// DCGM_FI_DEV_GPU_UTIL and DCGM_FI_DEV_FB_USED (the sum over its processes), beside the device's
// own series; every other field gets one copy per pod and replica.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "apiserver/fake_apiserver.h"
#include "kubelet/kubelet_harness.h"
#include "process.h"
#include "sim/control.h"

namespace gpulet::testing {
namespace {

namespace fs = std::filesystem;

constexpr const char* kUidA = "0a1b2c3d-1111-4aaa-8aaa-000000000001";
constexpr const char* kUidB = "0a1b2c3d-2222-4bbb-8bbb-000000000002";
constexpr const char* kUidC = "0a1b2c3d-3333-4ccc-8ccc-000000000003";

std::string Underscored(std::string uid) {
  for (char& c : uid) {
    if (c == '-') c = '_';
  }
  return uid;
}

class VirtualGpus : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("gpulet-vgpu-test");
    ASSERT_FALSE(dir_.empty());
    fs::create_directories(dir_ + "/kubelet");
    fs::create_directories(dir_ + "/sim");
    fs::create_directories(dir_ + "/proc");
    Result<TestPki> pki = MakeTestPki(dir_);
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    pki_ = *pki;
    auto api = FakeApiServer::Start(pki_, {});
    ASSERT_TRUE(api.ok()) << api.status().message();
    api_ = std::move(api).value();
    std::ofstream(dir_ + "/kubeconfig")
        << "apiVersion: v1\nkind: Config\ncurrent-context: t\n"
           "clusters:\n- name: t\n  cluster:\n    server: "
        << api_->url() << "\n    certificate-authority: " << pki_.ca_cert
        << "\nusers:\n- name: t\n  user:\n    token: test-token\n"
           "contexts:\n- name: t\n  context: {cluster: t, user: t}\n";
    // Pods of this node, and one of the same name on another node (the field selector).
    PutPod("ml", "a", kUidA, "node-a");
    PutPod("ml", "b", kUidB, "node-a");
    PutPod("ml", "c", kUidC, "node-a");
    PutPod("ml", "whole", "0a1b2c3d-4444-4ddd-8ddd-000000000004", "node-a");
    PutPod("other", "a", "0a1b2c3d-9999-4999-8999-000000000009", "node-b");
  }
  void TearDown() override {
    exporter_.Stop();
    kubelet_.Stop();
    api_.reset();
    if (!HasFailure()) fs::remove_all(dir_);
  }

  void PutPod(const std::string& ns, const std::string& name, const std::string& uid,
              const std::string& node) {
    api_->Put("/api/v1/namespaces/" + ns + "/pods/" + name,
              {{"apiVersion", "v1"},
               {"kind", "Pod"},
               {"metadata", {{"name", name}, {"namespace", ns}, {"uid", uid}}},
               {"spec", {{"nodeName", node}}},
               {"status", {{"phase", "Running"}}}});
  }
  void Cgroup(unsigned pid, const std::string& text) {
    fs::create_directories(dir_ + "/proc/" + std::to_string(pid));
    std::ofstream(dir_ + "/proc/" + std::to_string(pid) + "/cgroup") << text;
  }
  void SetProcesses(unsigned gpu, std::vector<sim::SimProcess> procs) {
    sim::ControlFile control(dir_ + "/sim");
    ASSERT_TRUE(control.Update([&](sim::ControlState& s) { s.processes[gpu] = procs; }).ok());
  }
  std::string Uuid(unsigned gpu) {
    std::string out;
    EXPECT_EQ(
        RunShell(Gpulet() + " --simulate dgx-h100 --sim-state " + dir_ + "/sim info -o json", &out),
        0)
        << out;
    const auto j = nlohmann::json::parse(out.substr(out.find('{')));
    return j["gpus"][gpu]["uuid"];
  }
  void Start(std::vector<std::string> extra) {
    Status s = kubelet_.Start(dir_ + "/kubelet");
    ASSERT_TRUE(s.ok()) << s.message();
    std::vector<std::string> argv = {Gpulet(),
                                     "--simulate",
                                     "dgx-h100",
                                     "--sim-state",
                                     dir_ + "/sim",
                                     "exporter",
                                     "--hostname",
                                     "node-a",
                                     "-c",
                                     "200",
                                     "-a",
                                     "127.0.0.1:0",
                                     "--kubernetes",
                                     "--pod-resources-socket",
                                     kubelet_.pod_resources_socket(),
                                     "--pod-refresh-interval",
                                     "200",
                                     "--proc-root",
                                     dir_ + "/proc",
                                     "--kubeconfig",
                                     dir_ + "/kubeconfig"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    ASSERT_TRUE(exporter_.Start(argv, dir_ + "/exporter.log"));
    port_ = WaitServing(exporter_);
    ASSERT_NE(port_, 0) << exporter_.log();
  }
  bool Has(const std::string& needle) {
    return WaitFor([&] { return HttpGet(port_, "/metrics").find(needle) != std::string::npos; });
  }
  static size_t Count(const std::string& text, const std::string& needle) {
    size_t n = 0;
    for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
    return n;
  }

  std::string dir_;
  TestPki pki_;
  std::unique_ptr<FakeApiServer> api_;
  KubeletHarness kubelet_;
  Child exporter_;
  int port_ = 0;
};

TEST_F(VirtualGpus, PerPodUtilisationAndMemoryFromProcesses) {
  ::setenv("NODE_NAME", "node-a", 1);  // upstream's variable: the pods of this node only
  const std::string gpu0 = Uuid(0), gpu1 = Uuid(1);
  // Pod a: two processes (cgroup v1 cgroupfs burstable, cgroup v2 systemd burstable); pod b: one
  // (cgroup v2 systemd besteffort); pod c: none yet; pid 3001 runs outside any pod.
  Cgroup(1001, std::string("12:memory:/kubepods/burstable/pod") + kUidA +
                   "/0123456789abcdef\n11:pids:/kubepods/burstable/pod" + kUidA +
                   "/0123456789abcdef\n0::/\n");
  Cgroup(1002, std::string("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod") +
                   Underscored(kUidA) + ".slice/cri-containerd-0123456789abcdef.scope\n");
  Cgroup(2001, std::string("0::/kubepods.slice/kubepods-besteffort.slice/"
                           "kubepods-besteffort-pod") +
                   Underscored(kUidB) + ".slice/cri-containerd-fedcba9876543210.scope\n");
  Cgroup(3001, "0::/system.slice/nvidia-persistenced.service\n");
  Cgroup(4001, std::string("0::/kubepods.slice/kubepods-pod") + Underscored(kUidC) +
                   ".slice/crio-0011.scope\n");  // guaranteed: no QoS level in the path
  SetProcesses(
      0, {{1001, 2048, 30, 10}, {1002, 1024, 15, 5}, {2001, 4096, 40, 20}, {3001, 512, 5, 1}});
  kubelet_.SetPodResources({{"ml", "a", "main", "nvidia.com/gpu.shared", {gpu0 + "::1"}},
                            {"ml", "b", "main", "nvidia.com/gpu.shared", {gpu0 + "::2"}},
                            {"ml", "c", "main", "nvidia.com/gpu.shared", {gpu0 + "::3"}},
                            {"ml", "whole", "main", "nvidia.com/gpu", {gpu1}}});
  Start({"--kubernetes-virtual-gpus"});

  const std::string a = std::string(",container=\"main\",namespace=\"ml\",pod=\"a\",pod_uid=\"") +
                        kUidA + "\",vgpu=\"1\"} ";
  const std::string b = std::string(",container=\"main\",namespace=\"ml\",pod=\"b\",pod_uid=\"") +
                        kUidB + "\",vgpu=\"2\"} ";
  const std::string c = std::string(",container=\"main\",namespace=\"ml\",pod=\"c\",pod_uid=\"") +
                        kUidC + "\",vgpu=\"3\"} ";
  ASSERT_TRUE(Has(a + "45\n")) << HttpGet(port_, "/metrics") << exporter_.log();
  const std::string text = HttpGet(port_, "/metrics");
  const std::string gpu0_util = "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"" + gpu0 + "\"";
  const std::string gpu0_fb = "DCGM_FI_DEV_FB_USED{gpu=\"0\",UUID=\"" + gpu0 + "\"";
  // Pod a: 30 + 15 %, 2048 + 1024 MiB; pod b: 40 %, 4096 MiB; pod c: idle.
  EXPECT_NE(text.find(a + "3072\n"), std::string::npos) << text;
  EXPECT_NE(text.find(b + "40\n"), std::string::npos);
  EXPECT_NE(text.find(b + "4096\n"), std::string::npos);
  EXPECT_EQ(Count(text, c + "0\n"), 2u);
  // The device's own series stays, once, without pod labels: 1 + 3 pods for each field.
  EXPECT_EQ(Count(text, gpu0_util), 4u);
  EXPECT_EQ(Count(text, gpu0_fb), 4u);
  size_t device_only = 0;
  for (size_t p = text.find(gpu0_util); p != std::string::npos; p = text.find(gpu0_util, p + 1)) {
    const std::string line = text.substr(p, text.find('\n', p) - p);
    if (line.find("pod=") == std::string::npos) ++device_only;
  }
  EXPECT_EQ(device_only, 1u);
  // Other fields: one copy per pod and replica, no device-only series (as dcgm-exporter).
  EXPECT_EQ(Count(text, "DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\"" + gpu0 + "\""), 3u);
  EXPECT_NE(text.find(",container=\"main\",namespace=\"ml\",pod=\"b\",vgpu=\"2\"} "),
            std::string::npos);
  // The whole GPU's pod gets its process series too (no processes: 0); GPUs nobody holds keep
  // one series.
  EXPECT_NE(text.find(std::string("pod=\"whole\",pod_uid=\"0a1b2c3d-4444-4ddd-8ddd-"
                                  "000000000004\"} 0\n")),
            std::string::npos);
  EXPECT_EQ(Count(text, "DCGM_FI_DEV_GPU_UTIL{gpu=\"5\""), 1u);

  // Processes change: b's exits, c's starts; the next collections follow.
  SetProcesses(0, {{1001, 2048, 30, 10}, {1002, 1024, 15, 5}, {4001, 8192, 70, 30}});
  ASSERT_TRUE(Has(c + "70\n")) << HttpGet(port_, "/metrics");
  ASSERT_TRUE(Has(c + "8192\n"));
  const std::string later = HttpGet(port_, "/metrics");
  EXPECT_EQ(Count(later, b + "0\n"), 2u) << later;
  // Only node-a's pods were asked for.
  bool selected = false;
  for (const RecordedRequest& r : api_->requests()) {
    if (r.path == "/api/v1/pods")
      selected = r.query.find("spec.nodeName%3Dnode-a") != std::string::npos;
  }
  EXPECT_TRUE(selected);
}

// Without API-server access the pods' UIDs are unknown: their processes cannot be told apart, so
// the per-pod GPU_UTIL/FB_USED series are left out (never a made-up 0) and the device's stays.
TEST_F(VirtualGpus, NoPodUidsNoPerPodProcessSeries) {
  const std::string gpu0 = Uuid(0);
  Cgroup(1001, std::string("0::/kubepods/burstable/pod") + kUidA + "/c\n");
  SetProcesses(0, {{1001, 2048, 30, 10}});
  kubelet_.SetPodResources({{"ml", "a", "main", "nvidia.com/gpu.shared", {gpu0 + "::1"}}});
  std::ofstream(dir_ + "/kubeconfig") << "apiVersion: v1\nkind: Config\n";  // no cluster
  Start({"--kubernetes-virtual-gpus"});
  ASSERT_TRUE(Has("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\"" + gpu0 + "\""));
  ASSERT_TRUE(Has(",pod=\"a\",vgpu=\"1\"} ")) << exporter_.log();
  const std::string text = HttpGet(port_, "/metrics");
  EXPECT_EQ(Count(text, "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\""), 1u) << text;
  EXPECT_EQ(text.find("pod_uid="), std::string::npos);
  EXPECT_NE(exporter_.log().find("event=pod_uids_unavailable"), std::string::npos);
}

}  // namespace
}  // namespace gpulet::testing
