// Pod attribution: device-ID resolution, and the watcher against a pod-resources v1 server on a
// unix socket (a minimal in-test kubelet).
#include "metrics/pod_resources.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

#include "podresources_v1.grpc.pb.h"

namespace gpulet::metrics {
namespace {

gpu::Inventory Node() {
  gpu::Inventory inv;
  for (unsigned i = 0; i < 2; ++i) {
    gpu::Gpu g;
    g.index = i;
    g.uuid = "GPU-" + std::to_string(i);
    if (i == 1) {
      g.mig_enabled = true;
      for (unsigned m = 0; m < 2; ++m) {
        gpu::MigDevice d;
        d.parent_index = 1;
        d.mig_index = m;
        d.uuid = "MIG-1-" + std::to_string(m);
        d.gpu_instance_id = 5 + m;
        g.mig_devices.push_back(d);
      }
    }
    inv.gpus.push_back(g);
  }
  return inv;
}

TEST(ResolveDeviceId, UuidsIndicesAndReplicaSuffixes) {
  const gpu::Inventory inv = Node();
  using K = EntityKey;
  EXPECT_EQ(ResolveDeviceId(inv, "GPU-0", false), (K{0, -1}));
  EXPECT_EQ(ResolveDeviceId(inv, "GPU-0::3", false), (K{0, -1}));     // time-sliced replica
  EXPECT_EQ(ResolveDeviceId(inv, "MIG-1-1", false), (K{1, 6}));
  EXPECT_EQ(ResolveDeviceId(inv, "MIG-1-0::1", false), (K{1, 5}));
  EXPECT_EQ(ResolveDeviceId(inv, "0", true), (K{0, -1}));
  EXPECT_EQ(ResolveDeviceId(inv, "0::2", true), (K{0, -1}));
  EXPECT_EQ(ResolveDeviceId(inv, "1:1", true), (K{1, 6}));
  EXPECT_FALSE(ResolveDeviceId(inv, "0", false));   // index from a foreign resource
  EXPECT_FALSE(ResolveDeviceId(inv, "7", true));
  EXPECT_FALSE(ResolveDeviceId(inv, "GPU-9", true));
  EXPECT_FALSE(ResolveDeviceId(inv, "1:9", true));
  EXPECT_FALSE(ResolveDeviceId(inv, "x", true));
}

void AddPod(v1::ListPodResourcesResponse& r, const std::string& ns, const std::string& name,
            const std::string& container, const std::string& resource,
            std::vector<std::string> ids) {
  auto* pod = r.add_pod_resources();
  pod->set_name(name);
  pod->set_namespace_(ns);
  auto* c = pod->add_containers();
  c->set_name(container);
  auto* d = c->add_devices();
  d->set_resource_name(resource);
  for (auto& id : ids) d->add_device_ids(id);
}

// Whole GPU, time-sliced (two pods, replicas of GPU 0), MPS, MIG, and a foreign resource.
v1::ListPodResourcesResponse Cluster() {
  v1::ListPodResourcesResponse r;
  AddPod(r, "ml", "ts-a", "main", "nvidia.com/gpu.shared", {"GPU-0::1"});
  AddPod(r, "ml", "ts-b", "main", "nvidia.com/gpu.shared", {"GPU-0::2", "GPU-0::3"});
  AddPod(r, "ml", "mps-c", "worker", "nvidia.com/gpu", {"0::4"});
  AddPod(r, "ml", "mig-d", "main", "nvidia.com/mig-1g.10gb", {"MIG-1-1"});
  AddPod(r, "other", "fpga", "main", "example.com/fpga", {"0"});
  return r;
}

TEST(BuildPodMap, EveryResourceKindMapsBackToItsGpu) {
  PodMap map = BuildPodMap(Cluster(), Node(), {"nvidia.com/"});
  ASSERT_EQ(map.size(), 2u);
  const auto& gpu0 = map.at({0, -1});
  // One entry per replica (ts-b holds two, as dcgm-exporter's vgpu label tells them apart);
  // fpga is not a GPU.
  ASSERT_EQ(gpu0.size(), 4u);
  EXPECT_EQ(gpu0[0], (PodRef{"ml", "mps-c", "worker", "4", ""}));
  EXPECT_EQ(gpu0[1], (PodRef{"ml", "ts-a", "main", "1", ""}));
  EXPECT_EQ(gpu0[2], (PodRef{"ml", "ts-b", "main", "2", ""}));
  EXPECT_EQ(gpu0[3], (PodRef{"ml", "ts-b", "main", "3", ""}));
  EXPECT_EQ(map.at({1, 6}), (std::vector<PodRef>{{"ml", "mig-d", "main", "", ""}}));
}

// DRA (issue 22 item 6): the names of gpulet's driver (src/dra/names.h) as the entities they use.
TEST(ResolveDraDevice, WholeSharedAndMigDevices) {
  gpu::Inventory inv = Node();
  inv.gpus[1].mig_devices[0].profile = "1g.10gb+me";
  inv.gpus[1].mig_devices[1].profile = "1g.10gb+me";
  using K = EntityKey;
  // GPU instance 5 starts at memory slice 0, instance 6 at slice 1.
  const MigPlacementLookup placement = [](unsigned gpu, unsigned gi) -> std::optional<unsigned> {
    if (gpu == 1 && gi >= 5 && gi <= 6) return gi - 5;
    return std::nullopt;
  };
  EXPECT_EQ(ResolveDraDevice(inv, "gpu-0", placement), (K{0, -1}));
  EXPECT_EQ(ResolveDraDevice(inv, "gpu-1-mem", placement), (K{1, -1}));
  EXPECT_EQ(ResolveDraDevice(inv, "gpu-1-mig-1g-10gb-me-1", placement), (K{1, 6}));
  EXPECT_EQ(ResolveDraDevice(inv, "gpu-1-mig-1g-10gb-me-0", placement), (K{1, 5}));
  EXPECT_FALSE(ResolveDraDevice(inv, "gpu-1-mig-1g-10gb-me-4", placement));  // not made (yet)
  EXPECT_FALSE(ResolveDraDevice(inv, "gpu-1-mig-3g-40gb-0", placement));
  EXPECT_FALSE(ResolveDraDevice(inv, "gpu-2", placement));  // not this node's
  EXPECT_FALSE(ResolveDraDevice(inv, "gpu-x", placement));
  EXPECT_FALSE(ResolveDraDevice(inv, "GPU-0", placement));
  // Without a placement lookup a MIG name resolves only where its profile is unique on the GPU.
  EXPECT_FALSE(ResolveDraDevice(inv, "gpu-1-mig-1g-10gb-me-1", {}));
  inv.gpus[1].mig_devices[0].profile = "3g.40gb";
  EXPECT_EQ(ResolveDraDevice(inv, "gpu-1-mig-1g-10gb-me-1", {}), (K{1, 6}));
  EXPECT_EQ(ResolveDraDevice(inv, "gpu-1-mig-3g-40gb-0", {}), (K{1, 5}));
}

TEST(BuildPodMap, DynamicResourcesOfGpuletsDriver) {
  v1::ListPodResourcesResponse r;
  auto add = [&](const std::string& pod, const std::string& driver, const std::string& device,
                 const std::string& share) {
    auto* p = r.add_pod_resources();
    p->set_name(pod);
    p->set_namespace_("ml");
    auto* c = p->add_containers();
    c->set_name("main");
    auto* claim = c->add_dynamic_resources();
    claim->set_claim_name(pod + "-claim");
    claim->set_claim_namespace("ml");
    auto* d = claim->add_claim_resources();
    d->set_driver_name(driver);
    d->set_pool_name("node-a");
    d->set_device_name(device);
    d->add_cdi_devices()->set_name("gpu.gpulet.io/claim=" + pod);
    if (!share.empty()) d->set_share_id(share);
  };
  add("whole", "gpu.gpulet.io", "gpu-0", "");
  add("share-a", "gpu.gpulet.io", "gpu-1-mem", "s-a");
  add("share-b", "gpu.gpulet.io", "gpu-1-mem", "s-b");
  add("nvidia", "gpu.nvidia.com", "gpu-0", "");  // another driver's names mean other things
  add("unknown", "gpu.gpulet.io", "gpu-7", "");
  // A container with both: a device-plugin GPU and a claim.
  auto* both = r.add_pod_resources();
  both->set_name("both");
  both->set_namespace_("ml");
  auto* c = both->add_containers();
  c->set_name("main");
  auto* dp = c->add_devices();
  dp->set_resource_name("nvidia.com/gpu");
  dp->add_device_ids("GPU-1");
  auto* claim = c->add_dynamic_resources();
  claim->set_claim_name("both-claim");
  claim->set_claim_namespace("ml");
  auto* d = claim->add_claim_resources();
  d->set_driver_name("gpu.gpulet.io");
  d->set_device_name("gpu-0");

  PodMap map = BuildPodMap(r, Node(), {"nvidia.com/"}, {});
  ASSERT_EQ(map.size(), 2u);
  // A claim's device carries the claim and the allocation result (dcgm-exporter's dra_* labels).
  EXPECT_EQ(map.at({0, -1}),
            (std::vector<PodRef>{
                {"ml", "both", "main", "", "", "both-claim", "ml", "gpu.gpulet.io", "", "gpu-0"},
                {"ml", "whole", "main", "", "", "whole-claim", "ml", "gpu.gpulet.io", "node-a",
                 "gpu-0"}}));
  EXPECT_EQ(map.at({1, -1}),
            (std::vector<PodRef>{{"ml", "both", "main", "", ""},
                                 {"ml", "share-a", "main", "s-a", "", "share-a-claim", "ml",
                                  "gpu.gpulet.io", "node-a", "gpu-1-mem"},
                                 {"ml", "share-b", "main", "s-b", "", "share-b-claim", "ml",
                                  "gpu.gpulet.io", "node-a", "gpu-1-mem"}}));
}

TEST(ApplyPodUids, NamesEveryKnownPod) {
  PodMap map = BuildPodMap(Cluster(), Node(), {"nvidia.com/"});
  PodUidMap uids = {{{"ml", "ts-a"}, "uid-a"}, {{"ml", "ts-b"}, "uid-b"}, {{"ml", "mig-d"}, "uid-d"}};
  EXPECT_FALSE(ApplyPodUids(map, uids));  // mps-c has none
  const auto& gpu0 = map.at({0, -1});
  EXPECT_EQ(gpu0[0].uid, "");
  EXPECT_EQ(gpu0[1].uid, "uid-a");
  EXPECT_EQ(gpu0[2].uid, "uid-b");
  EXPECT_EQ(gpu0[3].uid, "uid-b");
  EXPECT_EQ(map.at({1, 6})[0].uid, "uid-d");
  uids[{"ml", "mps-c"}] = "uid-c";
  EXPECT_TRUE(ApplyPodUids(map, uids));
}

class FakeKubelet final : public v1::PodResourcesLister::Service {
 public:
  explicit FakeKubelet(v1::ListPodResourcesResponse r) : response_(std::move(r)) {}
  grpc::Status List(grpc::ServerContext*, const v1::ListPodResourcesRequest*,
                    v1::ListPodResourcesResponse* out) override {
    *out = response_;
    ++calls;
    return grpc::Status::OK;
  }
  std::atomic<int> calls{0};

 private:
  v1::ListPodResourcesResponse response_;
};

std::unique_ptr<grpc::Server> Serve(const std::string& socket, FakeKubelet* svc) {
  grpc::ServerBuilder b;
  b.AddListeningPort("unix://" + socket, grpc::InsecureServerCredentials());
  b.RegisterService(svc);
  return b.BuildAndStart();
}

class WatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpulet-podres-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    socket_ = dir_ + "/kubelet.sock";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_, socket_;
  gpu::Inventory inv_ = Node();
};

TEST_F(WatcherTest, ListsReconnectsAfterRestartAndSurvivesSocketLoss) {
  FakeKubelet first(Cluster());
  auto server = Serve(socket_, &first);
  ASSERT_TRUE(server);
  PodResourcesOptions opts;
  opts.socket = socket_;
  opts.call_timeout = std::chrono::seconds(5);
  PodResourcesWatcher w(inv_, opts, [](PodMap) {});
  auto map = w.ListOnce();
  ASSERT_TRUE(map.ok()) << map.status().message();
  EXPECT_EQ(map->at({0, -1}).size(), 4u);

  // Kubelet gone: the socket disappears.
  server->Shutdown();
  server.reset();
  std::filesystem::remove(socket_);
  auto gone = w.ListOnce();
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), ErrorCode::kUnavailable);

  // Kubelet back on a recreated socket with a different pod list.
  v1::ListPodResourcesResponse later;
  AddPod(later, "ml", "new", "main", "nvidia.com/gpu", {"GPU-0"});
  FakeKubelet second(later);
  server = Serve(socket_, &second);
  ASSERT_TRUE(server);
  map = w.ListOnce();
  ASSERT_TRUE(map.ok()) << map.status().message();
  EXPECT_EQ(map->at({0, -1}), (std::vector<PodRef>{{"ml", "new", "main", "", ""}}));
  EXPECT_EQ(second.calls.load(), 1);
}

// Pod UIDs come from the API server only when the kubelet lists a pod not named before.
TEST_F(WatcherTest, AsksForPodUidsOnlyForNewPods) {
  FakeKubelet kubelet(Cluster());
  auto server = Serve(socket_, &kubelet);
  ASSERT_TRUE(server);
  PodResourcesOptions opts;
  opts.socket = socket_;
  int uid_lists = 0;
  bool api_down = false;
  opts.list_pod_uids = [&]() -> Result<PodUidMap> {
    ++uid_lists;
    if (api_down) return Status(ErrorCode::kUnavailable, "GET /api/v1/pods: connection refused");
    return PodUidMap{{{"ml", "ts-a"}, "uid-a"},
                     {{"ml", "ts-b"}, "uid-b"},
                     {{"ml", "mps-c"}, "uid-c"},
                     {{"ml", "mig-d"}, "uid-d"}};
  };
  PodResourcesWatcher w(inv_, opts, [](PodMap) {});
  auto map = w.ListOnce();
  ASSERT_TRUE(map.ok()) << map.status().message();
  EXPECT_EQ(uid_lists, 1);
  EXPECT_EQ(map->at({0, -1})[1].uid, "uid-a");
  map = w.ListOnce();
  ASSERT_TRUE(map.ok());
  EXPECT_EQ(uid_lists, 1);  // every pod known
  EXPECT_EQ(map->at({1, 6})[0].uid, "uid-d");

  // A new pod while the API server is down: listed without a UID, asked again next time.
  server->Shutdown();
  server.reset();
  std::filesystem::remove(socket_);
  v1::ListPodResourcesResponse later = Cluster();
  AddPod(later, "ml", "late", "main", "nvidia.com/gpu", {"GPU-0::9"});
  FakeKubelet second(later);
  server = Serve(socket_, &second);
  ASSERT_TRUE(server);
  api_down = true;
  map = w.ListOnce();
  ASSERT_TRUE(map.ok()) << map.status().message();
  EXPECT_EQ(uid_lists, 2);
  const auto& gpu0 = map->at({0, -1});  // late, mps-c, ts-a, ts-b, ts-b
  EXPECT_EQ(gpu0[0].pod, "late");
  EXPECT_EQ(gpu0[0].uid, "");
  EXPECT_EQ(gpu0[2].uid, "uid-a");  // known pods keep their last UIDs
}

TEST_F(WatcherTest, TimerRefreshDeliversMapsAndKeepsLastOnFailure) {
  FakeKubelet kubelet(Cluster());
  auto server = Serve(socket_, &kubelet);
  ASSERT_TRUE(server);
  PodResourcesOptions opts;
  opts.socket = socket_;
  opts.refresh = std::chrono::milliseconds(50);
  std::mutex mu;
  std::condition_variable cv;
  int deliveries = 0;
  PodMap last;
  PodResourcesWatcher w(inv_, opts, [&](PodMap m) {
    std::lock_guard lock(mu);
    ++deliveries;
    last = std::move(m);
    cv.notify_all();
  });
  w.Start();
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return deliveries >= 3; }));
    EXPECT_EQ(last.size(), 2u);
  }
  server->Shutdown();
  server.reset();
  std::filesystem::remove(socket_);
  const int calls_before = kubelet.calls.load();
  // Three more refreshes, each failing (the socket is gone).
  ASSERT_TRUE(w.WaitForRefreshes(w.refreshes() + 3, std::chrono::seconds(30)));
  w.Stop();
  std::lock_guard lock(mu);
  EXPECT_EQ(kubelet.calls.load(), calls_before);
  EXPECT_EQ(last.size(), 2u);  // no empty map was delivered on failure
}

}  // namespace
}  // namespace gpulet::metrics
