// SlicePublisher against the fake API server (real client, real TLS): the API holds exactly the
// node's current slices at one generation; health turns into taints and back; the kubelet's wipe
// is undone; refused writes are retried until they land; the server's validation (API limits)
// accepts 16 GPUs.
#include "dra/publisher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <set>

#include "apiserver/fake_apiserver.h"
#include "dra/names.h"
#include "mig/driver.h"
#include "sim/sim_node.h"
#include "support/wait_until.h"

namespace gpulet::dra {
namespace {

using nlohmann::json;
using gpulet::testing::FakeApiServer;
using gpulet::testing::WaitUntil;
using gpulet::testing::WriteFault;
using namespace std::chrono_literals;

const std::string kSlices = "/apis/resource.k8s.io/v1/resourceslices";
const std::string kNode = "node-a";

struct Devices {
  std::shared_ptr<const gpu::Inventory> inventory;
  std::vector<mig::GpuState> mig;
};

Devices Load(const std::string& fixture) {
  Devices d;
  Result<gpu::testing::SimNode> sim = gpu::testing::OpenSimNode(fixture);
  EXPECT_TRUE(sim.ok()) << sim.status().message();
  if (!sim.ok()) return d;
  Result<gpu::Inventory> inv = gpu::Discover(*sim->nvml, sim->options);
  EXPECT_TRUE(inv.ok()) << inv.status().message();
  if (inv.ok()) d.inventory = std::make_shared<gpu::Inventory>(*inv);
  Result<std::vector<mig::GpuState>> mig = mig::ReadMigState(*sim->nvml);
  EXPECT_TRUE(mig.ok()) << mig.status().message();
  if (mig.ok()) d.mig = *mig;
  return d;
}

// `d` doubled: GPUs 8-15 copies of 0-7 with their own UUIDs and bus ids.
Devices Doubled(const Devices& d) {
  auto inv = std::make_shared<gpu::Inventory>(*d.inventory);
  std::vector<mig::GpuState> mig = d.mig;
  const size_t n = inv->gpus.size();
  for (size_t i = 0; i < n; ++i) {
    gpu::Gpu g = inv->gpus[i];
    g.index = static_cast<unsigned>(n + i);
    g.uuid += "-b";
    g.pci_bus_id = "00000001" + g.pci_bus_id.substr(8);
    inv->gpus.push_back(g);
    mig::GpuState s = d.mig[i];
    s.index = g.index;
    mig.push_back(s);
  }
  inv->links.assign(2 * n, std::vector<gpu::Link>(2 * n));
  return {inv, mig};
}

class SlicePublisherTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string tmpl = ::testing::TempDir() + "gpulet-dra-pub-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    Result<gpulet::testing::TestPki> pki = gpulet::testing::MakeTestPki(dir_);
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    pki_ = *pki;
  }
  static void TearDownTestSuite() {
    std::string cmd = "rm -rf '" + dir_ + "'";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  void SetUp() override {
    auto api = FakeApiServer::Start(pki_, {});
    ASSERT_TRUE(api.ok()) << api.status().message();
    api_ = std::move(*api);
    api_->Put("/api/v1/nodes/" + kNode,
              {{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", kNode}}}});
    node_uid_ = api_->Object("/api/v1/nodes/" + kNode)->at("metadata").value("uid", "");
    client_ = std::make_unique<k8s::Client>(api_->Access(pki_));
  }
  void TearDown() override {
    publisher_.reset();
    client_.reset();
    api_.reset();
  }
  SlicePublisher& Make(PublisherOptions o = {}) {
    o.slices.node_name = kNode;
    o.initial_backoff = 20ms;
    o.max_backoff = 200ms;
    publisher_ = std::make_unique<SlicePublisher>(*client_, o);
    return *publisher_;
  }
  // The slices of this node and driver in the fake API server, by name.
  std::map<std::string, json> Stored() const {
    std::map<std::string, json> out;
    auto list = client_->Get(kSlices);
    if (!list.ok()) return out;
    for (const json& s : (*list)["items"]) {
      if (s["spec"]["nodeName"] == kNode && s["spec"]["driver"] == kDriverName) {
        out[s["metadata"]["name"]] = s;
      }
    }
    return out;
  }
  // The stored slices are exactly the publisher's desired ones, at one generation.
  bool Converged() const {
    const std::vector<json> want = publisher_->desired();
    const std::map<std::string, json> have = Stored();
    if (want.empty() || want.size() != have.size()) return false;
    for (const json& w : want) {
      auto it = have.find(w["metadata"]["name"]);
      if (it == have.end() || it->second["spec"] != w["spec"]) return false;
    }
    return true;
  }
  static std::optional<json> FindDevice(const std::map<std::string, json>& slices,
                                        const std::string& name) {
    for (const auto& [_, s] : slices) {
      if (!s["spec"].contains("devices")) continue;
      for (const json& d : s["spec"]["devices"]) {
        if (d["name"] == name) return d;
      }
    }
    return std::nullopt;
  }

  static inline std::string dir_;
  static inline gpulet::testing::TestPki pki_;
  gpu::HealthBoard board_;  // outlives publisher_ (TearDown resets it first)
  std::unique_ptr<FakeApiServer> api_;
  std::unique_ptr<k8s::Client> client_;
  std::unique_ptr<SlicePublisher> publisher_;
  std::string node_uid_;
};

TEST_F(SlicePublisherTest, PublishesOneGenerationOwnedByTheNodeAndWritesNothingWhenUnchanged) {
  Devices d = Load("dgx-h100");
  SlicePublisher& p = Make();
  p.SetDevices(d.inventory, d.mig);
  ASSERT_TRUE(p.PublishOnce().ok());
  ASSERT_TRUE(Converged());
  std::map<std::string, json> stored = Stored();
  for (const auto& [name, s] : stored) {
    EXPECT_EQ(s["spec"]["pool"]["generation"], 1) << name;
    EXPECT_EQ(s["metadata"]["ownerReferences"][0]["uid"], node_uid_);
  }
  const uint64_t writes = p.stats().writes;
  EXPECT_EQ(writes, stored.size());
  ASSERT_TRUE(p.PublishOnce().ok());
  EXPECT_EQ(p.stats().writes, writes);  // nothing changed, nothing written
  EXPECT_EQ(p.stats().generation, 1);
  // Fewer GPUs: fewer slices; the extra ones are deleted and the rest move to generation 2.
  auto half = std::make_shared<gpu::Inventory>(*d.inventory);
  half->gpus.resize(2);
  p.SetDevices(half, {d.mig[0], d.mig[1]});
  ASSERT_TRUE(p.PublishOnce().ok());
  ASSERT_TRUE(Converged());
  std::map<std::string, json> after = Stored();
  EXPECT_LT(after.size(), stored.size());
  for (const auto& [name, s] : after) EXPECT_EQ(s["spec"]["pool"]["generation"], 2) << name;
  EXPECT_FALSE(FindDevice(after, "gpu-2").has_value());
  EXPECT_TRUE(FindDevice(after, "gpu-1").has_value());
}

TEST_F(SlicePublisherTest, OtherDriversAndNodesSlicesAreLeftAlone) {
  json other = {{"apiVersion", "resource.k8s.io/v1"},
                {"kind", "ResourceSlice"},
                {"metadata", {{"name", "node-a-other"}}},
                {"spec",
                 {{"driver", "other.example.com"},
                  {"nodeName", kNode},
                  {"pool", {{"name", kNode}, {"generation", 9}, {"resourceSliceCount", 1}}},
                  {"devices", json::array()}}}};
  ASSERT_TRUE(client_->Post(kSlices, other).ok());
  json elsewhere = other;
  elsewhere["metadata"]["name"] = "node-b-gpu";
  elsewhere["spec"]["driver"] = kDriverName;
  elsewhere["spec"]["nodeName"] = "node-b";
  ASSERT_TRUE(client_->Post(kSlices, elsewhere).ok());
  Devices d = Load("l4-pcie");
  SlicePublisher& p = Make();
  p.SetDevices(d.inventory, d.mig);
  ASSERT_TRUE(p.PublishOnce().ok());
  EXPECT_TRUE(api_->Object(kSlices + "/node-a-other").has_value());
  EXPECT_TRUE(api_->Object(kSlices + "/node-b-gpu").has_value());
  EXPECT_TRUE(Converged());
}

TEST_F(SlicePublisherTest, AnXidTaintsTheGpuAndRecoveryClearsIt) {
  Devices d = Load("dgx-h100");
  SlicePublisher& p = Make();
  p.SetDevices(d.inventory, d.mig);
  p.FollowHealth(board_);
  ASSERT_TRUE(p.Start().ok());
  ASSERT_TRUE(p.WaitPublished(p.input_version(), 30s));
  const std::string uuid = d.inventory->gpus[5].uuid;
  board_.Update({{uuid, {false, "XID 79"}}});
  ASSERT_TRUE(WaitUntil([&] {
    const std::optional<json> g = FindDevice(Stored(), "gpu-5");
    return g.has_value() && g->contains("taints");
  }));
  std::map<std::string, json> tainted = Stored();
  const json t = FindDevice(tainted, "gpu-5").value()["taints"][0];
  EXPECT_EQ(t["key"], kUnhealthyTaintKey);
  EXPECT_EQ(t["effect"], "NoSchedule");
  EXPECT_EQ(t["value"], "xid-79");
  EXPECT_TRUE(FindDevice(tainted, "gpu-5-mem").value().contains("taints"));
  EXPECT_FALSE(FindDevice(tainted, "gpu-4").value().contains("taints"));
  const int64_t gen = tainted.begin()->second["spec"]["pool"]["generation"];
  EXPECT_GE(gen, 2);
  board_.Update({{uuid, {true, ""}}});
  ASSERT_TRUE(WaitUntil([&] {
    const std::optional<json> g = FindDevice(Stored(), "gpu-5");
    return g.has_value() && !g->contains("taints");
  }));
  ASSERT_TRUE(WaitUntil([&] { return Converged(); }));
  for (const auto& [name, s] : Stored()) {
    EXPECT_GT(s["spec"]["pool"]["generation"].get<int64_t>(), gen) << name;
  }
  // A lost GPU is tainted too.
  board_.Update({{uuid, {false, "GPU is lost"}}});
  ASSERT_TRUE(WaitUntil([&] {
    const std::optional<json> g = FindDevice(Stored(), "gpu-5");
    return g.has_value() && g->contains("taints") && (*g)["taints"][0]["value"] == "gpu-is-lost";
  }));
}

TEST_F(SlicePublisherTest, SlicesTheKubeletWipesAreRepublished) {
  Devices d = Load("dgx-a100");
  SlicePublisher& p = Make();
  p.SetDevices(d.inventory, d.mig);
  ASSERT_TRUE(p.Start().ok());
  ASSERT_TRUE(p.WaitPublished(p.input_version(), 30s));
  ASSERT_TRUE(WaitUntil([&] { return Converged(); }));
  ASSERT_TRUE(api_->WaitForOpenWatches(1, 30s));
  const size_t count = Stored().size();
  for (int round = 0; round < 3; ++round) {
    // The kubelet at its start: every slice of the node, in one deletecollection.
    auto wiped = client_->Delete(kSlices + "?fieldSelector=" +
                                 k8s::EscapeQueryValue("spec.nodeName=" + kNode));
    ASSERT_TRUE(wiped.ok()) << wiped.status().message();
    ASSERT_EQ((*wiped)["items"].size(), count);
    ASSERT_TRUE(WaitUntil([&] { return Stored().size() == count && Converged(); }))
        << "round " << round;
  }
  EXPECT_GE(p.stats().wipes_seen, 3u);
  // One slice deleted by hand and one changed by someone else: both put back.
  const std::string first = Stored().begin()->first;
  api_->Delete(kSlices + "/" + first);
  const std::string last = Stored().rbegin()->first;
  json changed = *api_->Object(kSlices + "/" + last);
  changed["spec"]["devices"] = json::array();
  changed["spec"].erase("sharedCounters");
  api_->Put(kSlices + "/" + last, changed);
  ASSERT_TRUE(WaitUntil([&] { return Converged(); }));
}

TEST_F(SlicePublisherTest, RefusedWritesAreRetriedUntilTheyLand) {
  Devices d = Load("dgx-h100");
  SlicePublisher& p = Make();
  p.SetDevices(d.inventory, d.mig);
  api_->InjectWriteFault({"POST", kSlices, WriteFault::Kind::kServerError, 503, 1, 0ms, 3});
  api_->InjectWriteFault({"POST", kSlices, WriteFault::Kind::kTooManyRequests, 429, 1, 0ms, 1});
  api_->InjectWriteFault({"POST", kSlices, WriteFault::Kind::kTimeout, 504, 1, 100ms, 1});
  api_->InjectWriteFault({"POST", kSlices, WriteFault::Kind::kLostAnswer, 200, 1, 0ms, 2});
  ASSERT_TRUE(p.Start().ok());
  ASSERT_TRUE(WaitUntil([&] { return Converged(); }, 60s));
  EXPECT_GE(p.stats().failed_requests, 5u);
  // Every slice at one generation, though some landed in passes that failed.
  std::set<int64_t> gens;
  for (const auto& [_, s] : Stored()) gens.insert(s["spec"]["pool"]["generation"].get<int64_t>());
  EXPECT_EQ(gens.size(), 1u);
  // Updates and deletes meet faults too.
  api_->InjectWriteFault({"PATCH", kSlices, WriteFault::Kind::kServerError, 500, 1, 0ms, 2});
  api_->InjectWriteFault({"DELETE", kSlices, WriteFault::Kind::kServerError, 500, 1, 0ms, 2});
  auto fewer = std::make_shared<gpu::Inventory>(*d.inventory);
  fewer->gpus.resize(1);
  p.SetDevices(fewer, {d.mig[0]});
  ASSERT_TRUE(WaitUntil([&] { return !FindDevice(Stored(), "gpu-1").has_value() && Converged(); },
                        60s));
}

TEST_F(SlicePublisherTest, NothingIsPublishedWithoutTheNodesUid) {
  api_->Delete("/api/v1/nodes/" + kNode);
  Devices d = Load("l4-pcie");
  SlicePublisher& p = Make();
  p.SetDevices(d.inventory, d.mig);
  EXPECT_FALSE(p.PublishOnce().ok());
  EXPECT_TRUE(Stored().empty());
  api_->Put("/api/v1/nodes/" + kNode,
            {{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", kNode}}}});
  ASSERT_TRUE(p.PublishOnce().ok());
  EXPECT_FALSE(Stored().empty());
}

TEST_F(SlicePublisherTest, SixteenGpusPassTheServersValidation) {
  Devices d = Doubled(Load("hgx-h200"));
  ASSERT_EQ(d.inventory->gpus.size(), 16u);
  SlicePublisher& p = Make();
  p.SetDevices(d.inventory, d.mig);
  Status s = p.PublishOnce();
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(Converged());
  std::map<std::string, json> stored = Stored();
  size_t sets = 0;
  for (const auto& [_, sl] : stored) sets += sl["spec"].value("sharedCounters", json::array()).size();
  EXPECT_EQ(sets, 16u);
  EXPECT_TRUE(FindDevice(stored, "gpu-15-mig-7g-141gb-0").has_value());
  // A publisher with an unknown policy does not start.
  PublisherOptions bad;
  bad.slices.placement_policy = "nope";
  EXPECT_FALSE(Make(bad).Start().ok());
}

}  // namespace
}  // namespace gpulet::dra
