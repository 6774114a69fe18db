// `gpulet exporter --kubernetes` against the kubelet harness's pod-resources v1 service: whole,
// time-sliced, MPS and MIG allocations get pod labels; the kubelet going away and coming back.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "kubelet/kubelet_harness.h"
#include "process.h"

namespace gpulet::testing {
namespace {

using Pods = std::vector<PodAssignment>;

PodAssignment Pod(const std::string& ns, const std::string& name, const std::string& resource,
                  std::vector<std::string> ids) {
  return {ns, name, "main", resource, std::move(ids)};
}

class PodAttribution : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("gpulet-podattr-test");
    std::filesystem::create_directories(dir_ + "/kubelet");
  }
  void TearDown() override {
    exporter_.Stop();
    kubelet_.Stop();
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }
  std::string Global(const std::string& fixture) {
    return Gpulet() + " --simulate " + fixture + " --sim-state " + dir_ + "/sim";
  }
  nlohmann::json Info(const std::string& fixture) {
    std::string out;
    EXPECT_EQ(RunShell(Global(fixture) + " info -o json 2>/dev/null", &out), 0) << out;
    return nlohmann::json::parse(out.substr(out.find('{')));
  }
  void ServeKubelet() {
    Status s = kubelet_.Start(dir_ + "/kubelet");
    ASSERT_TRUE(s.ok()) << s.message();
    socket_ = kubelet_.pod_resources_socket();
  }
  void StartExporter(const std::string& fixture, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {Gpulet(),       "--simulate",
                                     fixture,        "--sim-state",
                                     dir_ + "/sim",  "exporter",
                                     "--hostname",   "node-a",
                                     "-c",           "200",
                                     "-a",           "127.0.0.1:0",
                                     "--kubernetes", "--pod-resources-socket",
                                     socket_,        "--pod-refresh-interval",
                                     "200"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    ASSERT_TRUE(exporter_.Start(argv, dir_ + "/exporter.log"));
    port_ = WaitServing(exporter_);
    ASSERT_NE(port_, 0) << exporter_.log();
  }
  bool Has(const std::string& needle) {
    return WaitFor([&] { return HttpGet(port_, "/metrics").find(needle) != std::string::npos; });
  }

  std::string dir_, socket_;
  KubeletHarness kubelet_;
  Child exporter_;
  int port_ = 0;
};

TEST_F(PodAttribution, WholeTimeSlicedAndMpsPodsGetLabels) {
  const auto info = Info("dgx-h100");
  const std::string gpu0 = info["gpus"][0]["uuid"], gpu1 = info["gpus"][1]["uuid"];
  kubelet_.SetPodResources({Pod("ml", "whole", "nvidia.com/gpu", {gpu1}),
                            Pod("ml", "ts-a", "nvidia.com/gpu.shared", {gpu0 + "::1"}),
                            Pod("ml", "ts-b", "nvidia.com/gpu.shared", {gpu0 + "::2"}),
                            Pod("ml", "mps-c", "nvidia.com/gpu", {"5::3"})});
  ServeKubelet();
  StartExporter("dgx-h100", {"--kubernetes-virtual-gpus"});
  const std::string gpu0_prefix = "DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\"" + gpu0 + "\"";
  EXPECT_TRUE(Has(",container=\"main\",namespace=\"ml\",pod=\"ts-a\",vgpu=\"1\"} "));
  const std::string text = HttpGet(port_, "/metrics");
  // One series per pod and replica on the shared GPU (dcgm-exporter's vgpu label).
  for (const char* pod : {"ts-a\",vgpu=\"1", "ts-b\",vgpu=\"2"}) {
    const size_t at = text.find(std::string("pod=\"") + pod + "\"} ");
    ASSERT_NE(at, std::string::npos) << pod;
  }
  size_t count = 0;
  for (size_t p = text.find(gpu0_prefix); p != std::string::npos; p = text.find(gpu0_prefix, p + 1))
    ++count;
  EXPECT_EQ(count, 2u);
  EXPECT_NE(text.find("pod=\"whole\""), std::string::npos);
  EXPECT_NE(text.find("DCGM_FI_DEV_GPU_TEMP{gpu=\"5\""), std::string::npos);
  EXPECT_NE(text.find("pod=\"mps-c\",vgpu=\"3\"} "), std::string::npos);
  // GPUs nobody holds carry no pod labels.
  EXPECT_NE(text.find("device=\"nvidia7\",modelName=\"NVIDIA H100 80GB "
                      "HBM3\",Hostname=\"node-a\",DCGM_FI_DRIVER_VERSION="),
            std::string::npos);
}

TEST_F(PodAttribution, MigDevicesMapToTheirGpuInstance) {
  const auto info = Info("dgx-a100");
  std::string mig_uuid, profile;
  int gpu = -1;
  for (const auto& g : info["gpus"]) {
    for (const auto& m : g.value("mig_devices", nlohmann::json::array())) {
      mig_uuid = m["uuid"];
      profile = m.value("profile", "");
      gpu = g["index"];
      break;
    }
    if (gpu >= 0) break;
  }
  ASSERT_GE(gpu, 0)
      << "gpulet info on dgx-a100 lists no MIG devices (the fixture has two MIG GPUs)";
  kubelet_.SetPodResources({Pod("inf", "mig-pod", "nvidia.com/mig-" + profile, {mig_uuid})});
  ServeKubelet();
  StartExporter("dgx-a100");
  EXPECT_TRUE(Has(",GPU_I_PROFILE=\"" + profile + "\""));
  EXPECT_TRUE(Has("pod=\"mig-pod\"} ")) << exporter_.log();
}

// Dynamic Resource Allocation (issue 22 item 6): the devices of gpulet's driver (gpu.gpulet.io)
// in a container's dynamic_resources get the pod's labels: a whole GPU, memory shares of one GPU
// (one series per share with --kubernetes-virtual-gpus) and a MIG placement, found among GPU 1's
// six 1g.5gb devices by where its GPU instance starts. Another driver's devices are not ours.
TEST_F(PodAttribution, DraClaimDevicesGetLabels) {
  auto claim = [](const std::string& name, const std::string& device,
                  std::optional<std::string> share = std::nullopt) {
    return ClaimDevice{name,   "ml",  "gpu.gpulet.io", "node-a",
                       device, {"gpu.gpulet.io/claim=" + name + "-" + device}, std::move(share)};
  };
  Pods pods = {{"ml", "dra-whole", "main", "", {}, {claim("c1", "gpu-2")}},
               {"ml", "dra-share-a", "main", "", {}, {claim("c2", "gpu-3-mem", "share-a")}},
               {"ml", "dra-share-b", "main", "", {}, {claim("c3", "gpu-3-mem", "share-b")}},
               {"ml", "dra-mig", "main", "", {}, {claim("c4", "gpu-1-mig-1g-5gb-3")}},
               {"ml", "other-driver", "main", "", {},
                {ClaimDevice{"c5", "ml", "gpu.nvidia.com", "node-a", "gpu-4", {}, std::nullopt}}}};
  kubelet_.SetPodResources(pods);
  ServeKubelet();
  StartExporter("dgx-a100", {"--kubernetes-virtual-gpus"});
  // A line of the exposition holding every one of `parts`.
  auto line_with = [&](std::vector<std::string> parts) {
    return WaitFor([&] {
      std::istringstream lines(HttpGet(port_, "/metrics"));
      for (std::string l; std::getline(lines, l);) {
        if (l.rfind("DCGM_FI_DEV_GPU_TEMP{", 0) != 0) continue;
        bool all = true;
        for (const std::string& p : parts) all = all && l.find(p) != std::string::npos;
        if (all) return true;
      }
      return false;
    });
  };
  EXPECT_TRUE(line_with({"{gpu=\"2\"", "pod=\"dra-whole\"", "namespace=\"ml\""})) << exporter_.log();
  EXPECT_TRUE(line_with({"{gpu=\"3\"", "pod=\"dra-share-a\",vgpu=\"share-a\""}));
  EXPECT_TRUE(line_with({"{gpu=\"3\"", "pod=\"dra-share-b\",vgpu=\"share-b\""}));
  // 1g.5gb at memory slice 3 on GPU 1 is GPU instance 10 (testing/fixtures/dgx-a100.yaml).
  EXPECT_TRUE(line_with({"{gpu=\"1\"", "GPU_I_ID=\"10\"", "pod=\"dra-mig\""}));
  const std::string text = HttpGet(port_, "/metrics");
  EXPECT_EQ(text.find("pod=\"other-driver\""), std::string::npos);
  size_t mig_pods = 0;
  for (size_t p = text.find("pod=\"dra-mig\""); p != std::string::npos;
       p = text.find("pod=\"dra-mig\"", p + 1)) {
    const size_t start = text.rfind('\n', p);
    const std::string l = text.substr(start + 1, text.find('\n', p) - start - 1);
    if (l.rfind("DCGM_FI_DEV_GPU_TEMP{", 0) == 0) {
      ++mig_pods;
      EXPECT_NE(l.find("GPU_I_ID=\"10\""), std::string::npos) << l;
    }
  }
  EXPECT_EQ(mig_pods, 1u) << "only GPU instance 10 of the six 1g.5gb devices";
}

TEST_F(PodAttribution, KubeletGoneKeepsServingAndReconnects) {
  const auto info = Info("dgx-h100");
  const std::string gpu0 = info["gpus"][0]["uuid"];
  kubelet_.SetPodResources({Pod("ml", "first", "nvidia.com/gpu", {gpu0})});
  ServeKubelet();
  StartExporter("dgx-h100");
  ASSERT_TRUE(Has("pod=\"first\""));

  kubelet_.Stop();  // both sockets removed
  ASSERT_FALSE(std::filesystem::exists(socket_));
  ASSERT_TRUE(WaitFor(
      [&] { return exporter_.log().find("pod_resources_unavailable") != std::string::npos; }));
  int status = 0;
  const std::string during = HttpGet(port_, "/metrics", &status);
  EXPECT_EQ(status, 200);
  EXPECT_NE(during.find("DCGM_FI_DEV_GPU_TEMP{gpu=\"7\""), std::string::npos);
  EXPECT_NE(during.find("pod=\"first\""), std::string::npos);  // last good mapping kept

  kubelet_.SetPodResources({Pod("ml", "second", "nvidia.com/gpu", {gpu0})});
  ServeKubelet();  // a new socket file, as after a kubelet restart
  ASSERT_TRUE(Has("pod=\"second\"")) << exporter_.log();
  EXPECT_EQ(HttpGet(port_, "/metrics").find("pod=\"first\""), std::string::npos);
  EXPECT_NE(exporter_.log().find("pod_resources_recovered"), std::string::npos);
}

// As dcgm-exporter: one series per device unless --kubernetes-virtual-gpus, so device-wide
// alerts fire once per GPU, not once per pod.
TEST_F(PodAttribution, OneSeriesPerGpuByDefault) {
  const auto info = Info("dgx-h100");
  const std::string gpu0 = info["gpus"][0]["uuid"];
  kubelet_.SetPodResources({Pod("ml", "ts-a", "nvidia.com/gpu.shared", {gpu0 + "::1"}),
                            Pod("ml", "ts-b", "nvidia.com/gpu.shared", {gpu0 + "::2"})});
  ServeKubelet();
  StartExporter("dgx-h100");
  EXPECT_TRUE(Has("container=\"main,main\",namespace=\"ml,ml\",pod=\"ts-a,ts-b\"} "));
  const std::string text = HttpGet(port_, "/metrics");
  const std::string gpu0_prefix = "DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\"" + gpu0 + "\"";
  size_t count = 0;
  for (size_t p = text.find(gpu0_prefix); p != std::string::npos; p = text.find(gpu0_prefix, p + 1))
    ++count;
  EXPECT_EQ(count, 1u);
}

}  // namespace
}  // namespace gpulet::testing
