// The memory pool end to end: `gpulet plugin` on the simulated dgx-h100 (8 × H100 80GB, 79 units
// of 1Gi each) against the kubelet harness and the fake API server. A kubelet that follows
// GetPreferredAllocation places a sequence of memory-sized pods (1–79 GiB, multi-container pods
// among them): every container's units come from one GPU, releases (pods leaving the
// pod-resources listing) return units, and the published ConfigMap follows. A request larger than
// any GPU's free memory, and a kubelet that ignores the preference, get clear errors. `gpulet
// node` exports the allocated units per GPU.
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "apiserver/fake_apiserver.h"
#include "tests/deviceplugin/plugin_fixture.h"

namespace gpulet::testing {
namespace {

constexpr char kMem[] = "gpulet.io/gpu-memory-1gi";
constexpr char kObject[] = "/api/v1/namespaces/gpulet-system/configmaps/gpulet-memory-n1";
constexpr int kUnitsPerGpu = 79;  // floor(81559 MiB / 1 GiB)

std::string GpuOf(const std::string& id) { return id.substr(0, id.find("::")); }

class MemoryPoolFixture : public PluginFixture {
 protected:
  void StartAll(const std::string& verb = "plugin") {
    auto pki = MakeTestPki(tmp_.path());
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    auto api = FakeApiServer::Start(*pki, {});
    ASSERT_TRUE(api.ok()) << api.status().message();
    api_ = std::move(api).value();
    const std::string kubeconfig = tmp_.path() + "/kubeconfig";
    std::ofstream(kubeconfig) << "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n"
                                 "  cluster:\n    server: "
                              << api_->url() << "\n    certificate-authority: " << pki->ca_cert
                              << "\nusers:\n- name: u\n  user:\n    token: test-token\n"
                                 "contexts:\n- name: x\n  context: {cluster: c, user: u}\n"
                                 "current-context: x\n";
    const std::string cfg = tmp_.path() + "/config.yaml";
    std::ofstream(cfg) << "version: v1\nsharing:\n  memory:\n    unit: 1Gi\n    resources:\n"
                          "    - name: nvidia.com/gpu\n      devices: all\n";
    labels_ = tmp_.path() + "/labels";
    StartHarness();
    // A released pod's units are free once 3 Lists in a row miss them (taken every 200 ms here,
    // no minimum span): the test releases dozens of pods.
    std::vector<std::string> args = {"--config",        cfg,   "--kubeconfig",
                                     kubeconfig,        "--node-name",
                                     "n1",              "--labels-file",
                                     labels_,           "--release-after",
                                     "0s",              "--pod-resources-interval",
                                     "200ms"};
    if (verb == "node") {
      // `gpulet node`: the exporter too, on a free port, collecting twice a second.
      args.insert(args.end(), {"-a", "127.0.0.1:0", "-c", "500"});
    }
    std::vector<std::string> all = PluginArgs(args);
    std::replace(all.begin(), all.end(), std::string("plugin"), verb);
    plugin_ = std::make_unique<GpuletProcess>(
        all, tmp_.path() + "/" + verb + ".log",
        std::map<std::string, std::string>{
            {"GPULET_POD_RESOURCES_SOCKET", harness_->pod_resources_socket()}});
    ASSERT_TRUE(plugin_->Start());
    WaitForDevices(8 * kUnitsPerGpu, 8 * kUnitsPerGpu, 60s, kMem);
    for (const std::string& id : DeviceIds(kMem)) {
      ASSERT_NE(id.find("::mem-"), std::string::npos) << id;
      all_.push_back(id);
    }
  }

  std::vector<std::string> Free() const {
    std::vector<std::string> out;
    for (const std::string& id : all_) {
      if (!held_.count(id)) out.push_back(id);
    }
    return out;
  }
  std::map<std::string, int> FreePerGpu() const {
    std::map<std::string, int> out;
    for (const std::string& id : all_) out[GpuOf(id)] += held_.count(id) ? 0 : 1;
    return out;
  }

  // What a kubelet does for one container: ask for the preference, allocate it, record it.
  Status Place(const std::string& pod, const std::string& container, int gib) {
    Result<std::vector<std::string>> pref = harness_->GetPreferredAllocation(kMem, Free(), {}, gib);
    if (!pref.ok()) return pref.status();
    EXPECT_EQ(pref->size(), static_cast<size_t>(gib));
    std::set<std::string> gpus;
    for (const std::string& id : *pref) {
      gpus.insert(GpuOf(id));
      EXPECT_FALSE(held_.count(id)) << id << " is held already";
    }
    EXPECT_EQ(gpus.size(), 1u) << pod << "/" << container << " (" << gib << " GiB) spans GPUs";
    Result<v1beta1::ContainerAllocateResponse> alloc = harness_->Allocate(kMem, *pref);
    if (!alloc.ok()) return alloc.status();
    EXPECT_EQ(alloc->envs().at("NVIDIA_VISIBLE_DEVICES"), *gpus.begin());
    EXPECT_EQ(alloc->envs().at("GPULET_GPU_MEMORY_LIMIT"),
              std::to_string(static_cast<uint64_t>(gib) << 30));
    for (const std::string& id : *pref) held_[id] = pod;
    pods_[pod].push_back(PodAssignment{"team", pod, container, kMem, *pref});
    return Status::Ok();
  }
  void Release(const std::string& pod) {
    for (auto it = held_.begin(); it != held_.end();) {
      it = it->second == pod ? held_.erase(it) : std::next(it);
    }
    pods_.erase(pod);
    ++releases_;
  }
  void Publish() {
    std::vector<PodAssignment> all;
    for (const auto& [pod, containers] : pods_) {
      all.insert(all.end(), containers.begin(), containers.end());
    }
    harness_->SetPodResources(all);
  }

  // Waits until the published object says what the kubelet's view says: free units per GPU and
  // the containers holding them.
  void ExpectPublishedMatches() {
    std::map<std::string, int> want_free = FreePerGpu();
    std::multiset<std::string> want_pods;
    for (const auto& [pod, containers] : pods_) {
      for (const PodAssignment& c : containers) {
        want_pods.insert(pod + "/" + c.container + "@" + GpuOf(c.device_ids[0]) + "=" +
                         std::to_string(c.device_ids.size()));
      }
    }
    nlohmann::json last;
    const bool matched = Eventually(
        [&] {
          std::optional<nlohmann::json> obj = api_->Object(kObject);
          if (!obj) return false;
          last = nlohmann::json::parse((*obj)["data"]["memory.json"].get<std::string>());
          std::map<std::string, int> free;
          for (const auto& g : last["gpus"]) free[g["uuid"]] = g["freeUnits"];
          std::multiset<std::string> pods;
          for (const auto& p : last["pods"]) {
            pods.insert(p["name"].get<std::string>() + "/" + p["container"].get<std::string>() +
                        "@" + p["gpu"].get<std::string>() + "=" +
                        std::to_string(p["units"].get<int>()));
          }
          return free == want_free && pods == want_pods;
        },
        30s);
    ASSERT_TRUE(matched) << "published: " << last.dump();
    EXPECT_EQ(last["resource"], kMem);
    EXPECT_EQ(last["node"], "n1");
    if (last["generation"].get<uint64_t>() <= generation_) {
      ADD_FAILURE() << "generation did not increase: " << last["generation"];
    }
    generation_ = last["generation"];
  }

  std::unique_ptr<FakeApiServer> api_;
  std::string labels_;
  std::vector<std::string> all_;
  std::map<std::string, std::string> held_;  // unit → pod
  std::map<std::string, std::vector<PodAssignment>> pods_;
  int releases_ = 0;
  uint64_t generation_ = 0;
};

TEST_F(MemoryPoolFixture, PodsOfEverySizeGetUnitsOfOneGpuAndReleasesReturnThem) {
  StartAll();
  std::ifstream labels(labels_);
  std::stringstream ss;
  ss << labels.rdbuf();
  EXPECT_NE(ss.str().find("gpulet.io/gpu-memory.pool=true"), std::string::npos) << ss.str();
  EXPECT_NE(ss.str().find("gpulet.io/gpu-memory.unit=1Gi"), std::string::npos) << ss.str();
  ExpectPublishedMatches();

  // A deterministic sequence: sizes 1..79 GiB, every fourth pod with two or three containers.
  uint32_t seed = 12345;
  auto next = [&](int lo, int hi) {
    seed = seed * 1103515245u + 12345u;
    return lo + static_cast<int>((seed >> 8) % static_cast<uint32_t>(hi - lo + 1));
  };
  std::vector<std::string> order;  // pods by age
  int placed = 0, refused = 0;
  for (int i = 0; i < 60; ++i) {
    const std::string pod = "pod-" + std::to_string(i);
    const int containers = i % 4 == 3 ? next(2, 3) : 1;
    for (int c = 0; c < containers; ++c) {
      const int gib = i == 0 ? 79 : i == 1 ? 1 : next(1, containers > 1 ? 30 : 79);
      Status s = Place(pod, "c" + std::to_string(c), gib);
      while (!s.ok()) {
        // Refused only when no GPU has `gib` free units; then the oldest pod leaves.
        ++refused;
        // (When the whole node has fewer free units, a real kubelet would not even ask.)
        EXPECT_TRUE(s.message().find("has " + std::to_string(gib) + " free units") !=
                        std::string::npos ||
                    s.message().find("exceeds the") != std::string::npos)
            << s.message();
        for (const auto& [gpu, free] : FreePerGpu()) EXPECT_LT(free, gib) << gpu;
        ASSERT_FALSE(order.empty());
        Release(order.front());
        order.erase(order.begin());
        Publish();
        s = Place(pod, "c" + std::to_string(c), gib);
      }
      ++placed;
    }
    order.push_back(pod);
    Publish();
    if (i == 20 || i == 59) ExpectPublishedMatches();
  }
  EXPECT_GT(releases_, 0);
  EXPECT_GT(refused, 0);
  std::fprintf(stderr, "memory pool: %d containers placed, %d refusals, %d releases\n", placed,
               refused, releases_);

  // Every pod leaves: all units come back.
  while (!order.empty()) {
    Release(order.front());
    order.erase(order.begin());
  }
  Publish();
  ExpectPublishedMatches();
  for (const auto& [gpu, free] : FreePerGpu()) EXPECT_EQ(free, kUnitsPerGpu) << gpu;
}

TEST_F(MemoryPoolFixture, TooLargeAndSpanningRequestsGetClearErrors) {
  StartAll();
  // 80 GiB: more than one H100's 79 units, although 632 are free on the node.
  Result<std::vector<std::string>> pref = harness_->GetPreferredAllocation(kMem, Free(), {}, 80);
  ASSERT_FALSE(pref.ok());
  EXPECT_NE(pref.status().message().find(
                "no GPU of gpulet.io/gpu-memory-1gi has 80 free units for one container"),
            std::string::npos)
      << pref.status().message();

  // A kubelet that ignores the preference and hands out units of two GPUs.
  const std::string a = GpuOf(all_.front()), b = GpuOf(all_.back());
  ASSERT_NE(a, b);
  Result<v1beta1::ContainerAllocateResponse> alloc =
      harness_->Allocate(kMem, {a + "::mem-0", a + "::mem-1", b + "::mem-0"});
  ASSERT_FALSE(alloc.ok());
  const std::string msg = alloc.status().message();
  EXPECT_NE(msg.find("memory units must all be on one GPU"), std::string::npos) << msg;
  EXPECT_NE(msg.find(a + "::mem-0"), std::string::npos) << msg;
  EXPECT_NE(msg.find(b + "::mem-0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did not follow GetPreferredAllocation"), std::string::npos) << msg;
}

TEST_F(MemoryPoolFixture, NodeExportsAllocatedUnitsPerGpu) {
  StartAll("node");
  ASSERT_TRUE(plugin_->WaitForLog("event=listening", 30s)) << plugin_->Log();
  std::smatch m;
  const std::string log = plugin_->Log();
  ASSERT_TRUE(std::regex_search(log, m, std::regex("event=listening [^\\n]* port=([0-9]+)")));
  httplib::Client http("127.0.0.1", std::stoi(m[1]));
  ASSERT_TRUE(Place("gauge", "c0", 20).ok());
  const std::string gpu = held_.begin()->first.substr(0, held_.begin()->first.find("::"));
  std::string body;
  const bool seen = Eventually(
      [&] {
        httplib::Result r = http.Get("/metrics");
        if (!r || r->status != 200) return false;
        body = r->body;
        return body.find("UUID=\"" + gpu + "\",resource=\"gpulet.io/gpu-memory-1gi\"} 20\n") !=
               std::string::npos;
      },
      30s);
  ASSERT_TRUE(seen) << body.substr(0, 4000);
  EXPECT_NE(body.find("# TYPE gpulet_memory_pool_allocated_units gauge"), std::string::npos);
  EXPECT_NE(body.find("gpulet_memory_pool_units{"), std::string::npos);
}

}  // namespace
}  // namespace gpulet::testing
