// The memory pool's publication against the fake API server, on a FakeClock: create then merge
// patch, allocations and releases, rate limit, heartbeat, generation across restarts, recreation,
// health, and the publisher's own thread.
#include "deviceplugin/memory_publisher.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

#include "apiserver/fake_apiserver.h"
#include "apiserver/rbac_check.h"
#include "sharing/test_inventories.h"

namespace gpulet::deviceplugin {
namespace {

using gpulet::testing::FakeApiServer;
using namespace std::chrono_literals;

constexpr char kPath[] = "/api/v1/namespaces/gpulet-system/configmaps/gpulet-memory-n1";

class PublisherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "gpulet-mempub-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    Result<gpulet::testing::TestPki> pki = gpulet::testing::MakeTestPki(dir_);
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    auto server = FakeApiServer::Start(*pki, {});
    ASSERT_TRUE(server.ok()) << server.status().message();
    server_ = std::move(server).value();
    k8s::ClusterAccess a = server_->Access(*pki);
    client_ = std::make_unique<k8s::Client>(a);

    auto cfg = config::ParseConfig(
        "sharing:\n  memory:\n    resources:\n    - {name: gpu, devices: [0, 5]}\n", "cfg.yaml");
    ASSERT_TRUE(cfg.ok()) << cfg.status().message();
    auto plan = sharing::BuildPlan(*inventory_, *cfg);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    plan_ = *plan;
    pool_ = *plan_.Find("gpulet.io/gpu-memory-1gi");
  }
  void TearDown() override {
    // Whatever the publisher sent (its ConfigMap read, created, patched) is granted by the node
    // agent's shipped roles.
    if (server_) {
      for (const std::string& v :
           gpulet::testing::RbacVerbsNotGranted(server_->requests(), {"deploy/base/rbac.yaml"})) {
        ADD_FAILURE() << "deploy/base/rbac.yaml does not grant " << v;
      }
    }
    std::filesystem::remove_all(dir_);
  }

  // `absence`: one List that misses a unit releases it, unless a test asks for the default.
  std::unique_ptr<MemoryPoolPublisher> MakePublisher(AbsenceOptions absence = {1, 0s}) {
    MemoryPublisherOptions o;
    o.node_name = "n1";
    o.absence = absence;
    auto p = std::make_unique<MemoryPoolPublisher>(
        o, *client_, clock_,
        [this]() -> Result<PodDeviceList> {
          if (!kubelet_up_) return Status(ErrorCode::kUnavailable, "kubelet down");
          return PodDeviceList{listed_, kubelet_};
        },
        &health_);
    p->SetPool(plan_, inventory_);
    return p;
  }

  // The published document (and the object's labels).
  nlohmann::json Published() const {
    std::optional<nlohmann::json> obj = server_->Object(kPath);
    if (!obj) return nullptr;
    EXPECT_EQ((*obj)["metadata"]["labels"]["gpulet.io/memory-pool"], "true");
    EXPECT_EQ((*obj)["metadata"]["labels"]["gpulet.io/node"], "n1");
    EXPECT_EQ((*obj)["metadata"]["labels"]["app.kubernetes.io/name"], "gpulet");
    return nlohmann::json::parse((*obj)["data"]["memory.json"].get<std::string>());
  }
  static int Free(const nlohmann::json& doc, const std::string& uuid) {
    for (const auto& g : doc["gpus"]) {
      if (g["uuid"] == uuid) return g["freeUnits"].get<int>();
    }
    return -1;
  }
  static std::vector<std::string> Units(const std::string& gpu, int n) {
    std::vector<std::string> out;
    for (int k = 0; k < n; ++k) out.push_back(sharing::MemoryUnitId(gpu, k));
    return out;
  }
  size_t Count(const std::string& method) const {
    size_t n = 0;
    for (const auto& r : server_->requests())
      n += r.method == method && r.path.find("/configmaps") != std::string::npos;
    return n;
  }

  std::string dir_;
  std::unique_ptr<FakeApiServer> server_;
  std::unique_ptr<k8s::Client> client_;
  FakeClock clock_;
  gpu::HealthBoard health_;
  std::shared_ptr<const gpu::Inventory> inventory_ =
      std::make_shared<gpu::Inventory>(sharing::testing::WholeGpus(8));
  sharing::Plan plan_;
  sharing::Resource pool_;
  std::map<std::string, PodContainer> listed_;
  bool kubelet_up_ = true;
  KubeletInstance kubelet_{1, 100, 5};
};

TEST_F(PublisherTest, CreatesTheObjectAsTheContractSays) {
  auto p = MakePublisher();
  ASSERT_TRUE(p->Tick().ok());
  nlohmann::json doc = Published();
  ASSERT_TRUE(doc.is_object());
  EXPECT_EQ(doc["version"], 1);
  EXPECT_EQ(doc["node"], "n1");
  EXPECT_EQ(doc["resource"], "gpulet.io/gpu-memory-1gi");
  EXPECT_EQ(doc["unitBytes"], uint64_t{1} << 30);
  EXPECT_EQ(doc["heartbeatSeconds"], 30);
  EXPECT_GT(doc["generation"].get<uint64_t>(), static_cast<uint64_t>(clock_.WallMillis()) - 1);
  ASSERT_EQ(doc["gpus"].size(), 2u);
  EXPECT_EQ(doc["gpus"][0]["uuid"], "GPU-0");
  EXPECT_EQ(doc["gpus"][0]["index"], 0);
  EXPECT_EQ(doc["gpus"][0]["numaNode"], 0);
  EXPECT_EQ(doc["gpus"][1]["uuid"], "GPU-5");
  EXPECT_EQ(doc["gpus"][1]["numaNode"], 1);
  EXPECT_EQ(doc["gpus"][1]["healthy"], true);
  EXPECT_EQ(doc["gpus"][1]["totalUnits"], 79);
  EXPECT_EQ(doc["gpus"][1]["freeUnits"], 79);
  EXPECT_TRUE(doc["pods"].empty());
  EXPECT_EQ(Count("POST"), 1u);
  EXPECT_EQ(p->publications(), 1u);
}

TEST_F(PublisherTest, AllocationsAndReleasesChangeTheObjectAtMostOncePerSecond) {
  auto p = MakePublisher();
  ASSERT_TRUE(p->Tick().ok());
  const uint64_t g1 = Published()["generation"];

  // An Allocate counts at once, but the next publication waits for the rate limit.
  p->OnAllocate(pool_, Units("GPU-5", 20));
  ASSERT_TRUE(p->Tick().ok());
  EXPECT_EQ(p->publications(), 1u);
  clock_.Advance(1s);
  ASSERT_TRUE(p->Tick().ok());
  nlohmann::json doc = Published();
  EXPECT_EQ(Free(doc, "GPU-5"), 59);
  EXPECT_GT(doc["generation"].get<uint64_t>(), g1);
  EXPECT_TRUE(doc["pods"].empty());  // the kubelet has not listed them yet
  EXPECT_EQ(Count("PATCH"), 1u);
  for (const auto& r : server_->requests()) {
    if (r.method == "PATCH") {
      EXPECT_EQ(r.content_type, "application/merge-patch+json");
    }
  }

  // The kubelet lists them: the pod appears, still 59 free.
  for (const std::string& id : Units("GPU-5", 20)) listed_[id] = {"team-a", "infer", "server"};
  clock_.Advance(5s);
  ASSERT_TRUE(p->Tick().ok());
  doc = Published();
  EXPECT_EQ(Free(doc, "GPU-5"), 59);
  ASSERT_EQ(doc["pods"].size(), 1u);
  EXPECT_EQ(doc["pods"][0], nlohmann::json({{"namespace", "team-a"},
                                            {"name", "infer"},
                                            {"container", "server"},
                                            {"gpu", "GPU-5"},
                                            {"units", 20}}));

  // While the kubelet cannot be asked, nothing is released.
  kubelet_up_ = false;
  listed_.clear();
  clock_.Advance(5s);
  ASSERT_TRUE(p->Tick().ok());
  EXPECT_EQ(Free(Published(), "GPU-5"), 59);

  // The pod ended: no longer listed, its units are free again.
  kubelet_up_ = true;
  clock_.Advance(5s);
  ASSERT_TRUE(p->Tick().ok());
  doc = Published();
  EXPECT_EQ(Free(doc, "GPU-5"), 79);
  EXPECT_TRUE(doc["pods"].empty());
}

TEST_F(PublisherTest, AnAllocationTheKubeletNeverListsIsReleasedByALaterList) {
  auto p = MakePublisher();
  ASSERT_TRUE(p->Tick().ok());
  clock_.Advance(4s);
  p->OnAllocate(pool_, Units("GPU-0", 3));
  clock_.Advance(1s);
  ASSERT_TRUE(p->Tick().ok());  // this List began 1 s after the Allocate: too early to tell
  EXPECT_EQ(Free(Published(), "GPU-0"), 76);
  clock_.Advance(5s);
  ASSERT_TRUE(p->Tick().ok());  // 6 s after, and not listed: the container is gone
  EXPECT_EQ(Free(Published(), "GPU-0"), 79);
  // While the kubelet cannot be asked, an allocation stays counted.
  p->OnAllocate(pool_, Units("GPU-0", 2));
  kubelet_up_ = false;
  clock_.Advance(5s);
  ASSERT_TRUE(p->Tick().ok());
  clock_.Advance(5s);
  ASSERT_TRUE(p->Tick().ok());
  EXPECT_EQ(Free(Published(), "GPU-0"), 77);
}

// Issue 23 item 7: after a kubelet restart the first Lists are empty, then partial; units held by
// running containers stay held (the old publisher freed them on the first empty List, and the
// extender booked them twice). Absence counts only once confirmed by several Lists of one kubelet
// over a minute.
TEST_F(PublisherTest, AKubeletRestartsEmptyListDoesNotFreeHeldUnits) {
  auto p = MakePublisher(AbsenceOptions{3, 60s});
  for (const std::string& id : Units("GPU-5", 10)) listed_[id] = {"team-a", "infer", "server"};
  for (const std::string& id : Units("GPU-0", 4)) listed_[id] = {"team-b", "train", "main"};
  ASSERT_TRUE(p->Tick().ok());
  EXPECT_EQ(Free(Published(), "GPU-5"), 69);
  // The kubelet restarts: a new socket, an empty List, then one that lists only team-b.
  kubelet_ = {1, 101, 6};
  const auto held = listed_;
  listed_.clear();
  for (int i = 0; i < 6; ++i) {
    clock_.Advance(5s);
    ASSERT_TRUE(p->Tick().ok());
    EXPECT_EQ(Free(Published(), "GPU-5"), 69) << "list " << i;
    EXPECT_EQ(Free(Published(), "GPU-0"), 75) << "list " << i;
  }
  for (const std::string& id : Units("GPU-0", 4)) listed_[id] = held.at(id);
  clock_.Advance(5s);
  ASSERT_TRUE(p->Tick().ok());
  EXPECT_EQ(Free(Published(), "GPU-5"), 69);
  // Another restart before the evidence was complete starts it over.
  kubelet_ = {1, 102, 7};
  for (int i = 0; i < 10; ++i) {
    clock_.Advance(5s);
    ASSERT_TRUE(p->Tick().ok());
    EXPECT_EQ(Free(Published(), "GPU-5"), 69) << "list " << i;
  }
  // The same kubelet keeps missing them for a minute and more: team-a really ended.
  for (int i = 0; i < 4; ++i) {
    clock_.Advance(5s);
    ASSERT_TRUE(p->Tick().ok());
  }
  nlohmann::json doc = Published();
  EXPECT_EQ(Free(doc, "GPU-5"), 79);
  EXPECT_EQ(Free(doc, "GPU-0"), 75);
  ASSERT_EQ(doc["pods"].size(), 1u);
  EXPECT_EQ(doc["pods"][0]["namespace"], "team-b");
}

TEST(DeviceAbsence, NeedsEnoughListsOverTheSpanFromOneKubelet) {
  using T = Clock::TimePoint;
  DeviceAbsence a(AbsenceOptions{3, 60s});
  const KubeletInstance k1{1, 1, 1}, k2{1, 2, 2};
  const T t0 = T(std::chrono::hours(1));
  EXPECT_FALSE(a.Gone("x", {}));
  a.Observe({"x"}, k1, t0);
  EXPECT_TRUE(a.Listed("x"));
  a.Observe({}, k1, t0 + 10s);
  a.Observe({}, k1, t0 + 20s);
  a.Observe({}, k1, t0 + 30s);
  EXPECT_FALSE(a.Gone("x", {}));  // three Lists, but over 20 s
  a.Observe({}, k1, t0 + 70s);
  EXPECT_TRUE(a.Gone("x", {}));
  EXPECT_FALSE(a.Gone("x", t0 + 25s));  // a directory first seen later: its own evidence
  EXPECT_TRUE(a.AllGone({"x", "never-listed"}, {}));
  EXPECT_FALSE(a.AllGone({"x", "never-listed"}, t0 + 25s));
  a.Observe({}, k2, t0 + 80s);  // a restarted kubelet: start over
  EXPECT_FALSE(a.Gone("x", {}));
  a.Observe({}, k2, t0 + 110s);
  a.Observe({}, k2, t0 + 140s);
  EXPECT_TRUE(a.Gone("x", {}));
  EXPECT_TRUE(a.AllGone({}, t0 + 80s));
  EXPECT_FALSE(a.AllGone({}, t0 + 81s));
  // Many Lists later the history stays bounded and the answers the same.
  for (int i = 0; i < 1000; ++i) a.Observe({"y"}, k2, t0 + 150s + i * 1s);
  EXPECT_FALSE(a.Gone("y", {}));
  EXPECT_TRUE(a.Gone("x", {}));
}

TEST_F(PublisherTest, HeartbeatRepublishesWithoutChange) {
  auto p = MakePublisher();
  ASSERT_TRUE(p->Tick().ok());
  const uint64_t g1 = Published()["generation"];
  for (int i = 0; i < 29; ++i) {
    clock_.Advance(1s);
    ASSERT_TRUE(p->Tick().ok());
  }
  EXPECT_EQ(p->publications(), 1u);
  clock_.Advance(1s);
  ASSERT_TRUE(p->Tick().ok());
  EXPECT_EQ(p->publications(), 2u);
  EXPECT_EQ(Published()["generation"].get<uint64_t>(), g1 + 1);
}

// issue 26 item 7: write faults on the publication. A create or patch that meets 5xx, 429 or a
// timeout is retried at the next tick and publishes what is true then; one whose answer was lost
// landed, and the next publication still goes above its generation (the object is read again).
TEST_F(PublisherTest, WriteFaultsAreRetriedAndGenerationsNeverGoBack) {
  using gpulet::testing::WriteFault;
  auto p = MakePublisher();
  server_->InjectWriteFault({.method = "POST", .kind = WriteFault::Kind::kLostAnswer});
  EXPECT_FALSE(p->Tick().ok());  // created, answer lost
  ASSERT_TRUE(server_->Object(kPath).has_value());
  uint64_t last = Published()["generation"].get<uint64_t>();
  clock_.Advance(1s);
  ASSERT_TRUE(p->Tick().ok());  // heartbeat not due, but the last publication failed: again
  EXPECT_GT(Published()["generation"].get<uint64_t>(), last);
  last = Published()["generation"].get<uint64_t>();

  const int free_before = Free(Published(), "GPU-0");
  int units = 0;
  for (WriteFault fault :
       {WriteFault{.method = "PATCH", .code = 500},
        WriteFault{.method = "PATCH", .kind = WriteFault::Kind::kTooManyRequests},
        WriteFault{.method = "PATCH", .kind = WriteFault::Kind::kTimeout, .delay = 100ms},
        WriteFault{.method = "PATCH", .kind = WriteFault::Kind::kLostAnswer}}) {
    const std::string unit = sharing::MemoryUnitId("GPU-0", units++);
    listed_[unit] = PodContainer{"ns", "pod-" + std::to_string(units), "main"};
    p->OnAllocate(pool_, {unit});
    clock_.Advance(1s);
    server_->InjectWriteFault(fault);
    EXPECT_FALSE(p->Tick().ok()) << static_cast<int>(fault.kind);
    clock_.Advance(1s);
    ASSERT_TRUE(p->Tick().ok()) << static_cast<int>(fault.kind);
    const nlohmann::json doc = Published();
    EXPECT_GT(doc["generation"].get<uint64_t>(), last) << static_cast<int>(fault.kind);
    last = doc["generation"].get<uint64_t>();
    EXPECT_EQ(Free(doc, "GPU-0"), free_before - units) << static_cast<int>(fault.kind);
  }
}

TEST_F(PublisherTest, GenerationKeepsIncreasingAcrossRestartsAndDeletion) {
  uint64_t last = 0;
  {
    auto p = MakePublisher();
    ASSERT_TRUE(p->Tick().ok());
    clock_.Advance(30s);
    ASSERT_TRUE(p->Tick().ok());
    last = Published()["generation"];
  }
  {
    // A restarted agent goes on above the previous generation.
    auto p = MakePublisher();
    ASSERT_TRUE(p->Tick().ok());
    EXPECT_GT(Published()["generation"].get<uint64_t>(), last);
  }
  // Even when the existing object is ahead of the wall clock (a clock stepped back): it reads it.
  std::optional<nlohmann::json> obj = server_->Object(kPath);
  ASSERT_TRUE(obj.has_value());
  nlohmann::json ahead = Published();
  ahead["generation"] = uint64_t{9'000'000'000'000'000};
  (*obj)["data"]["memory.json"] = ahead.dump();
  server_->Put(kPath, *obj);
  auto p = MakePublisher();
  ASSERT_TRUE(p->Tick().ok());
  EXPECT_EQ(Published()["generation"].get<uint64_t>(), uint64_t{9'000'000'000'000'001});
  // Someone deletes the object: the next publication recreates it.
  server_->Delete(kPath);
  p->OnAllocate(pool_, Units("GPU-0", 1));
  clock_.Advance(1s);
  ASSERT_TRUE(p->Tick().ok());
  nlohmann::json doc = Published();
  ASSERT_TRUE(doc.is_object());
  EXPECT_EQ(doc["generation"].get<uint64_t>(), uint64_t{9'000'000'000'000'002});
  EXPECT_EQ(Free(doc, "GPU-0"), 78);
}

TEST_F(PublisherTest, AnUnhealthyGpuIsPublishedUnhealthy) {
  auto p = MakePublisher();
  ASSERT_TRUE(p->Tick().ok());
  health_.Update({{"GPU-0", gpu::DeviceHealth{false, "XID 79"}}});
  clock_.Advance(1s);
  ASSERT_TRUE(p->Tick().ok());
  nlohmann::json doc = Published();
  EXPECT_EQ(doc["gpus"][0]["healthy"], false);
  EXPECT_EQ(doc["gpus"][1]["healthy"], true);
}

TEST_F(PublisherTest, NoPoolNoObject) {
  auto p = MakePublisher();
  p->SetPool(sharing::Plan{}, inventory_);
  EXPECT_FALSE(p->has_pool());
  ASSERT_TRUE(p->Tick().ok());
  EXPECT_FALSE(server_->Object(kPath).has_value());
}

TEST_F(PublisherTest, ItsThreadPublishesOnTheClock) {
  auto p = MakePublisher();
  p->Start();
  ASSERT_TRUE(p->WaitForPublications(1, 30s));
  ASSERT_TRUE(clock_.WaitForSleepers(1));
  p->OnAllocate(pool_, Units("GPU-0", 40));
  clock_.Advance(1s);
  ASSERT_TRUE(p->WaitForPublications(2, 30s));
  p->Stop();
  EXPECT_EQ(Free(Published(), "GPU-0"), 39);
}

}  // namespace
}  // namespace gpulet::deviceplugin
