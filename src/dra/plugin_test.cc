// The kubelet plugin against the fake API server (claims as the scheduler leaves them) and a
// recording Preparer: the checks before a Prepare, idempotency, conflicts, half-way failures,
// Unprepare from the checkpoint, restarts, corrupted and foreign checkpoints, the API server down,
// and the gRPC surface (registration, DRAPlugin v1 and v1beta1, the health stream v1 and v1alpha1)
// over real Unix sockets.
#include "dra/plugin.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "apiserver/fake_apiserver.h"
#include "common/files.h"
#include "dra/fake_preparer.h"
#include "dra/test_claims.h"
#include "dra_health_v1.grpc.pb.h"
#include "dra_health_v1alpha1.grpc.pb.h"
#include "dra_v1.grpc.pb.h"
#include "dra_v1beta1.grpc.pb.h"
#include "k8s/client.h"
#include "pluginregistration_v1.grpc.pb.h"
#include "support/wait_until.h"

namespace gpulet::dra {
namespace {

namespace fs = std::filesystem;
namespace drav1 = ::k8s::io::kubelet::pkg::apis::dra::v1;
namespace drav1beta1 = ::k8s::io::kubelet::pkg::apis::dra::v1beta1;
using gpulet::testing::FakeApiServer;
using testing::ClaimObjectPath;
using testing::MakeClaimObject;
using testing::TestClaim;
using testing::TestResult;

constexpr char kNode[] = "node-1";

// One DRAResourceHealth version (`Api`) over `ch`: the stream opens with the plugin's current
// list (`devices_now` entries), then carries the complete list again after SetDeviceHealth, each
// field as the wire defines it (HEALTHY 1, UNHEALTHY 2; a message cut to 1024 characters).
template <typename Api, typename Response>
void ExpectHealthStream(DraPlugin& plugin, const std::shared_ptr<grpc::Channel>& ch,
                        int devices_now) {
  auto health = Api::NewStub(ch);
  grpc::ClientContext ctx;
  auto reader = health->NodeWatchResources(&ctx, {});
  Response msg;
  ASSERT_TRUE(reader->Read(&msg));  // the complete list at once
  EXPECT_EQ(msg.devices_size(), devices_now);
  plugin.SetDeviceHealth({{"gpu-0", DeviceHealthReport::Health::kHealthy, "", 0},
                          {"gpu-1", DeviceHealthReport::Health::kUnhealthy,
                           "XID 79 " + std::string(2000, 'x'), 45}});
  ASSERT_TRUE(reader->Read(&msg));
  ASSERT_EQ(msg.devices_size(), 2);
  EXPECT_EQ(msg.devices(0).device().pool_name(), kNode);
  EXPECT_EQ(msg.devices(0).device().device_name(), "gpu-0");
  EXPECT_EQ(static_cast<int>(msg.devices(0).health()), 1);
  EXPECT_EQ(static_cast<int>(msg.devices(1).health()), 2);
  EXPECT_EQ(msg.devices(1).health_check_timeout_seconds(), 45);
  EXPECT_EQ(msg.devices(1).message().size(), 1024u);
  EXPECT_EQ(msg.devices(1).message().substr(1021), "...");
  EXPECT_GT(msg.devices(1).last_updated_time(), 0);
  ctx.TryCancel();
}

std::string TempDir() {
  std::string tmpl = "/tmp/gdp-XXXXXX";  // short: socket paths are at most 107 bytes
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

class DraPluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    fs::create_directories(dir_ + "/pki");
    Result<gpulet::testing::TestPki> pki = gpulet::testing::MakeTestPki(dir_ + "/pki");
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    pki_ = *pki;
    Result<std::unique_ptr<FakeApiServer>> s = FakeApiServer::Start(pki_, {});
    ASSERT_TRUE(s.ok()) << s.status().message();
    api_ = std::move(s).value();
    client_ = std::make_unique<k8s::Client>(api_->Access(pki_));
    ASSERT_TRUE(WriteFileAtomic(dir_ + "/boot_id", "boot-a\n").ok());
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  PluginOptions Options(const std::string& instance = "") const {
    PluginOptions o;
    o.node_name = kNode;
    o.registry_dir = dir_ + "/reg";
    o.plugins_dir = dir_ + "/plugins";
    o.boot_id_path = dir_ + "/boot_id";
    o.instance = instance;
    return o;
  }

  std::unique_ptr<DraPlugin> StartPlugin(const std::string& instance = "",
                                         const k8s::Client* client = nullptr) {
    auto p = std::make_unique<DraPlugin>(Options(instance), client ? client : client_.get(),
                                         &preparer_);
    Status s = p->Start();
    EXPECT_TRUE(s.ok()) << s.message();
    return p;
  }

  // A claim allocated on this node and reserved, put into the API server.
  TestClaim PutClaim(const std::string& name, std::vector<TestResult> results) {
    TestClaim c;
    c.name = name;
    c.uid = "uid-" + name;
    c.node = kNode;
    c.results = std::move(results);
    api_->Put(ClaimObjectPath(c.namespace_, c.name), MakeClaimObject(c));
    return c;
  }

  static ClaimRef Ref(const TestClaim& c) { return ClaimRef{c.namespace_, c.name, c.uid}; }

  size_t ClaimGets() const {
    size_t n = 0;
    for (const auto& r : api_->requests()) {
      n += r.method == "GET" && r.path.find("/resourceclaims/") != std::string::npos;
    }
    return n;
  }

  Result<LoadedCheckpoint> Disk(DraPlugin& p) {
    return LoadCheckpoint(p.checkpoint_path(), kNode, "boot-a");
  }

  std::string dir_;
  gpulet::testing::TestPki pki_;
  std::unique_ptr<FakeApiServer> api_;
  std::unique_ptr<k8s::Client> client_;
  FakePreparer preparer_;
};

TEST_F(DraPluginTest, PreparesFromTheClaimAndIsIdempotent) {
  auto plugin = StartPlugin();
  TestClaim c = PutClaim("one", {TestResult{"gpu/full", "gpu-0"}, TestResult{"mem", "gpu-1-mem", "s-1"}});
  auto out = plugin->Prepare({Ref(c)});
  ASSERT_EQ(out.size(), 1u);
  const ClaimPrepareOutcome& o = out.at(c.uid);
  ASSERT_EQ(o.error, "");
  ASSERT_EQ(o.devices.size(), 2u);
  EXPECT_EQ(o.devices[0].device, "gpu-0");
  EXPECT_EQ(o.devices[0].pool, kNode);
  EXPECT_EQ(o.devices[0].requests, std::vector<std::string>{"gpu"});  // subrequest stripped
  EXPECT_EQ(o.devices[0].cdi_device_ids.at(0), "gpu.gpulet.io/gpu=uid-one-gpu-0");
  EXPECT_EQ(o.devices[1].share_id, "s-1");
  EXPECT_EQ(preparer_.live().size(), 2u);
  Result<LoadedCheckpoint> disk = Disk(*plugin);
  ASSERT_TRUE(disk.ok());
  ASSERT_EQ(disk->outcome, LoadedCheckpoint::Outcome::kLoaded);
  ASSERT_EQ(disk->checkpoint.claims.count(c.uid), 1u);
  EXPECT_EQ(disk->checkpoint.claims.at(c.uid).state, CheckpointEntry::State::kPrepared);

  // Again with the same UID: the same answer, no API call, no second Prepare.
  const size_t gets = ClaimGets();
  auto again = plugin->Prepare({Ref(c)});
  EXPECT_EQ(again.at(c.uid).error, "");
  ASSERT_EQ(again.at(c.uid).devices.size(), 2u);
  EXPECT_EQ(again.at(c.uid).devices[1].cdi_device_ids, o.devices[1].cdi_device_ids);
  EXPECT_EQ(ClaimGets(), gets);
  EXPECT_EQ(preparer_.prepare_calls(), 1u);

  // status.devices, written by the plugin's worker (bounded wait).
  nlohmann::json devices;
  gpulet::testing::WaitUntil(
      [&] {
        std::optional<nlohmann::json> obj = api_->Object(ClaimObjectPath("default", "one"));
        if (obj && (*obj)["status"].contains("devices")) devices = (*obj)["status"]["devices"];
        return !devices.empty();
      },
      std::chrono::seconds(5));
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0]["driver"], "gpu.gpulet.io");
  EXPECT_EQ(devices[0]["device"], "gpu-0");
  EXPECT_EQ(devices[1]["shareID"], "s-1");
  EXPECT_EQ(devices[1]["conditions"][0]["type"], "Ready");
}

// status.devices is written through every write fault the API server can answer with (issue 26
// item 7): 503, 429, a timeout, a lost answer (the write landed; the plugin reads the claim back
// and stops), and a conflict (another writer changed the claim after the plugin read it). Each
// device carries the Preparer's data.
TEST_F(DraPluginTest, DeviceStatusIsWrittenThroughWriteFaults) {
  using gpulet::testing::WriteFault;
  using namespace std::chrono_literals;
  auto plugin = StartPlugin();
  struct Case {
    std::string name;
    WriteFault fault;
    bool conflict = false;
  };
  const std::string status_prefix = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/";
  std::vector<Case> cases = {
      {"s503", {"PATCH", status_prefix + "s503", WriteFault::Kind::kServerError, 503, 1, 0ms, 2}},
      {"s429", {"PATCH", status_prefix + "s429", WriteFault::Kind::kTooManyRequests, 429, 1, 0ms, 1}},
      {"stimeout", {"PATCH", status_prefix + "stimeout", WriteFault::Kind::kTimeout, 504, 1, 100ms, 1}},
      {"slost", {"PATCH", status_prefix + "slost", WriteFault::Kind::kLostAnswer, 200, 1, 0ms, 1}},
      {"sconflict", {}, true},
  };
  std::atomic<bool> bumped{false};
  api_->BeforeEachWrite([&](const gpulet::testing::RecordedRequest& req) {
    // Another controller writes the claim between the plugin's read and its status write.
    if (req.path.find("/sconflict/status") == std::string::npos || bumped.exchange(true)) return;
    std::optional<nlohmann::json> obj = api_->Object(ClaimObjectPath("default", "sconflict"));
    if (!obj) return;
    (*obj)["metadata"]["labels"]["touched"] = "yes";
    api_->Put(ClaimObjectPath("default", "sconflict"), *obj);
  });
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    if (!c.conflict) api_->InjectWriteFault(c.fault);
    TestClaim claim = PutClaim(c.name, {TestResult{"gpu", "gpu-" + std::to_string(&c - &cases[0])}});
    auto out = plugin->Prepare({Ref(claim)});
    ASSERT_EQ(out.at(claim.uid).error, "");  // a status write never fails the Prepare
    nlohmann::json devices;
    gpulet::testing::WaitUntil(
        [&] {
          std::optional<nlohmann::json> obj = api_->Object(ClaimObjectPath("default", c.name));
          if (obj && (*obj)["status"].contains("devices")) devices = (*obj)["status"]["devices"];
          return !devices.empty();
        },
        std::chrono::seconds(10));
    ASSERT_EQ(devices.size(), 1u);
    EXPECT_EQ(devices[0]["driver"], "gpu.gpulet.io");
    EXPECT_EQ(devices[0]["data"]["fakeKey"], claim.uid + "/" + devices[0]["device"].get<std::string>());
    if (c.conflict) {
      EXPECT_TRUE(bumped.load());
      std::optional<nlohmann::json> obj = api_->Object(ClaimObjectPath("default", c.name));
      ASSERT_TRUE(obj.has_value());
      EXPECT_EQ((*obj)["metadata"]["labels"]["touched"], "yes");  // the other write is kept
    }
  }
  // The lost answer's write landed once; the plugin read the claim back instead of writing again.
  size_t lost_writes = 0;
  for (const auto& r : api_->requests()) {
    lost_writes += r.method == "PATCH" && r.path.find("/slost/status") != std::string::npos;
  }
  EXPECT_EQ(lost_writes, 1u);
}

TEST_F(DraPluginTest, RefusesClaimsNotForThisNode) {
  auto plugin = StartPlugin();
  TestClaim replaced = PutClaim("replaced", {TestResult{"gpu", "gpu-0"}});
  TestClaim unallocated = PutClaim("unallocated", {TestResult{"gpu", "gpu-0"}});
  unallocated.allocated = false;
  api_->Put(ClaimObjectPath("default", "unallocated"), MakeClaimObject(unallocated));
  TestClaim other_node = PutClaim("othernode", {TestResult{"gpu", "gpu-0"}});
  other_node.node = "node-2";
  api_->Put(ClaimObjectPath("default", "othernode"), MakeClaimObject(other_node));
  TestResult foreign_pool{"gpu", "gpu-0"};
  foreign_pool.pool = "node-9";
  TestClaim other_pool = PutClaim("otherpool", {foreign_pool});
  TestClaim unreserved = PutClaim("unreserved", {TestResult{"gpu", "gpu-0"}});
  unreserved.reserved_for.clear();
  api_->Put(ClaimObjectPath("default", "unreserved"), MakeClaimObject(unreserved));
  ClaimRef replaced_ref = Ref(replaced);
  replaced_ref.uid = "uid-older";
  ClaimRef missing{"default", "missing", "uid-missing"};
  ClaimRef hostile{"default/../../api", "x", "uid-h"};

  auto out = plugin->Prepare({replaced_ref, Ref(unallocated), Ref(other_node), Ref(other_pool),
                              Ref(unreserved), missing, hostile});
  ASSERT_EQ(out.size(), 7u);
  auto expect = [&](const std::string& uid, const std::string& text) {
    EXPECT_NE(out.at(uid).error.find(text), std::string::npos) << uid << ": " << out.at(uid).error;
    EXPECT_TRUE(out.at(uid).devices.empty());
  };
  expect("uid-older", "has UID uid-replaced, not uid-older: it was deleted and created again");
  expect(unallocated.uid, "is not allocated (status.allocation is missing)");
  expect(other_node.uid, "nodeSelector names node node-2, not this node node-1");
  expect(other_pool.uid, "device gpu-0 is in pool node-9, not this node's pool node-1");
  expect(unreserved.uid, "is not reserved for any pod");
  expect("uid-missing", "ResourceClaim default/missing not found");
  expect("uid-h", "is not a valid namespace, name and UID");
  EXPECT_EQ(preparer_.prepare_calls(), 0u);
  EXPECT_TRUE(preparer_.live().empty());
  Result<LoadedCheckpoint> disk = Disk(*plugin);
  ASSERT_TRUE(disk.ok());
  EXPECT_TRUE(disk->checkpoint.claims.empty());
}

TEST_F(DraPluginTest, RefusesDevicesAnotherClaimHolds) {
  auto plugin = StartPlugin();
  TestClaim a = PutClaim("a", {TestResult{"gpu", "gpu-0"}});
  TestClaim same = PutClaim("same", {TestResult{"gpu", "gpu-0"}});
  TestClaim mig = PutClaim("mig", {TestResult{"gpu", "gpu-0-mig-1g-10gb-0"}});
  TestClaim share_on_whole = PutClaim("shareonwhole", {TestResult{"m", "gpu-0-mem", "s-9"}});
  TestClaim s1 = PutClaim("s1", {TestResult{"m", "gpu-1-mem", "s-1"}});
  TestClaim s2 = PutClaim("s2", {TestResult{"m", "gpu-1-mem", "s-2"}});
  TestClaim s1again = PutClaim("s1again", {TestResult{"m", "gpu-1-mem", "s-1"}});
  TestResult admin{"watch", "gpu-0"};
  admin.admin_access = true;
  TestClaim monitor = PutClaim("monitor", {admin});
  auto out = plugin->Prepare({Ref(a), Ref(same), Ref(mig), Ref(share_on_whole), Ref(s1), Ref(s2),
                              Ref(s1again), Ref(monitor)});
  EXPECT_EQ(out.at(a.uid).error, "");
  EXPECT_NE(out.at(same.uid).error.find("device gpu-0 conflicts with gpu-0, prepared for "
                                        "ResourceClaim default/a (uid uid-a)"),
            std::string::npos)
      << out.at(same.uid).error;
  EXPECT_NE(out.at(mig.uid).error.find("conflicts with gpu-0"), std::string::npos);
  EXPECT_NE(out.at(share_on_whole.uid).error.find("conflicts with gpu-0"), std::string::npos);
  EXPECT_EQ(out.at(s1.uid).error, "");
  EXPECT_EQ(out.at(s2.uid).error, "");  // another share of the same device
  EXPECT_NE(out.at(s1again.uid).error.find("conflicts with gpu-1-mem"), std::string::npos);
  EXPECT_EQ(out.at(monitor.uid).error, "");  // admin access
  EXPECT_EQ(preparer_.prepare_calls(), 4u);
}

TEST_F(DraPluginTest, HalfWayFailureLeavesNothingAndTheBatchGoesOn) {
  auto plugin = StartPlugin();
  TestClaim two = PutClaim("two", {TestResult{"g", "gpu-0"}, TestResult{"g", "gpu-1"}});
  TestClaim other = PutClaim("other", {TestResult{"g", "gpu-2"}});
  preparer_.FailPrepare(1, "gpu-1: injected failure");
  auto out = plugin->Prepare({Ref(two), Ref(other)});
  EXPECT_NE(out.at(two.uid).error.find("gpu-1: injected failure"), std::string::npos);
  EXPECT_EQ(out.at(other.uid).error, "");
  EXPECT_EQ(preparer_.live(), (std::set<std::string>{"uid-other/gpu-2"}));
  Result<LoadedCheckpoint> disk = Disk(*plugin);
  ASSERT_TRUE(disk.ok());
  EXPECT_EQ(disk->checkpoint.claims.count(two.uid), 0u);
  EXPECT_EQ(disk->checkpoint.claims.count(other.uid), 1u);
  // The kubelet retries: now it works.
  out = plugin->Prepare({Ref(two)});
  EXPECT_EQ(out.at(two.uid).error, "");
  EXPECT_EQ(preparer_.live().size(), 3u);
}

TEST_F(DraPluginTest, ApiServerDownIsAClearPerClaimError) {
  auto plugin = StartPlugin();
  TestClaim c = PutClaim("c", {TestResult{"g", "gpu-0"}});
  api_.reset();  // the API server is gone
  auto out = plugin->Prepare({Ref(c)});
  EXPECT_NE(out.at(c.uid).error.find("ResourceClaim default/c: cannot read it from the API server "
                                     "(nothing was prepared; the kubelet retries)"),
            std::string::npos)
      << out.at(c.uid).error;
  EXPECT_EQ(preparer_.prepare_calls(), 0u);
  EXPECT_TRUE(preparer_.live().empty());
  Result<LoadedCheckpoint> disk = Disk(*plugin);
  ASSERT_TRUE(disk.ok());
  EXPECT_TRUE(disk->checkpoint.claims.empty());
}

TEST_F(DraPluginTest, UnprepareWorksAfterTheClaimIsDeleted) {
  auto plugin = StartPlugin();
  TestClaim c = PutClaim("c", {TestResult{"g", "gpu-0"}});
  ASSERT_EQ(plugin->Prepare({Ref(c)}).at(c.uid).error, "");
  api_->Delete(ClaimObjectPath("default", "c"));
  ClaimRef never{"default", "never", "uid-never"};
  auto out = plugin->Unprepare({Ref(c), never});
  ASSERT_EQ(out.size(), 2u);  // every requested claim gets an entry
  EXPECT_EQ(out.at(c.uid), "");
  EXPECT_EQ(out.at("uid-never"), "");
  EXPECT_TRUE(preparer_.live().empty());
  Result<LoadedCheckpoint> disk = Disk(*plugin);
  ASSERT_TRUE(disk.ok());
  EXPECT_TRUE(disk->checkpoint.claims.empty());
  // A failed Unprepare keeps the entry; the retry succeeds.
  ASSERT_EQ(plugin->Prepare({Ref(PutClaim("d", {TestResult{"g", "gpu-1"}}))}).at("uid-d").error, "");
  preparer_.FailUnprepare("busy");
  ClaimRef d{"default", "d", "uid-d"};
  EXPECT_NE(plugin->Unprepare({d}).at("uid-d").find("busy"), std::string::npos);
  EXPECT_EQ(preparer_.live().size(), 1u);
  EXPECT_EQ(plugin->Unprepare({d}).at("uid-d"), "");
  EXPECT_TRUE(preparer_.live().empty());
}

// The plugin killed between Prepare and Unprepare: a new process (same directories) unprepares
// from the checkpoint, without the API server.
TEST_F(DraPluginTest, RestartedPluginUnpreparesFromTheCheckpoint) {
  TestClaim c = PutClaim("c", {TestResult{"g", "gpu-0"}, TestResult{"m", "gpu-1-mem", "s-1"}});
  {
    auto first = StartPlugin();
    ASSERT_EQ(first->Prepare({Ref(c)}).at(c.uid).error, "");
  }  // gone without an Unprepare
  api_.reset();
  auto second = StartPlugin();
  auto out = second->Unprepare({Ref(c)});
  EXPECT_EQ(out.at(c.uid), "");
  EXPECT_TRUE(preparer_.live().empty());
  auto calls = preparer_.calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[1].op, "unprepare");
  EXPECT_NE(calls[1].record.find("uid-c/gpu-1-mem/s-1"), std::string::npos);
}

// Killed while the Preparer ran: no entry was written; the kubelet's Unprepare of that claim still
// reaches the Preparer (empty record), which removes what the claim's names hold.
TEST_F(DraPluginTest, PrepareKilledHalfWayIsUndoneByUnprepare) {
  TestClaim c = PutClaim("c", {TestResult{"g", "gpu-0"}});
  auto plugin = StartPlugin();
  Claim claim;
  claim.ref = Ref(c);
  claim.devices = {AllocatedDevice{"g", kDriverName, kNode, "gpu-0", "", {}, false}};
  ASSERT_TRUE(preparer_.Prepare(claim).ok());  // what the killed process had done
  EXPECT_EQ(plugin->Unprepare({Ref(c)}).at(c.uid), "");
  EXPECT_TRUE(preparer_.live().empty());
  EXPECT_EQ(preparer_.calls().back().record, "");
  // A "preparing" entry in a checkpoint is undone the same way.
  Checkpoint cp;
  cp.node_name = kNode;
  cp.boot_id = "boot-a";
  CheckpointEntry e;
  e.ref = Ref(c);
  e.state = CheckpointEntry::State::kPreparing;
  cp.claims[c.uid] = e;
  ASSERT_TRUE(WriteCheckpoint(plugin->checkpoint_path(), cp).ok());
  ASSERT_TRUE(preparer_.Prepare(claim).ok());
  EXPECT_EQ(plugin->Unprepare({Ref(c)}).at(c.uid), "");
  EXPECT_TRUE(preparer_.live().empty());
  Result<LoadedCheckpoint> disk = Disk(*plugin);
  ASSERT_TRUE(disk.ok());
  EXPECT_TRUE(disk->checkpoint.claims.empty());
}

TEST_F(DraPluginTest, CorruptedCheckpointIsKeptAsideAndRebuiltFromTheApiServer) {
  TestClaim c = PutClaim("c", {TestResult{"g", "gpu-0"}});
  TestClaim unreserved = PutClaim("unreserved", {TestResult{"g", "gpu-3"}});
  unreserved.reserved_for.clear();
  api_->Put(ClaimObjectPath("default", "unreserved"), MakeClaimObject(unreserved));
  TestClaim elsewhere = PutClaim("elsewhere", {TestResult{"g", "gpu-0"}});
  elsewhere.node = "node-2";
  api_->Put(ClaimObjectPath("default", "elsewhere"), MakeClaimObject(elsewhere));
  std::string path;
  {
    auto first = StartPlugin();
    ASSERT_EQ(first->Prepare({Ref(c)}).at(c.uid).error, "");
    path = first->checkpoint_path();
  }
  ASSERT_TRUE(WriteFileAtomic(path, "{\"version\": 1, \"claims\": {garbage", 0600).ok());
  auto second = StartPlugin();  // no crash loop
  EXPECT_FALSE(second->rebuild_pending());
  bool kept = false;
  for (const auto& f : fs::directory_iterator(fs::path(path).parent_path())) {
    kept |= f.path().filename().string().rfind("checkpoint.json.corrupt-", 0) == 0;
  }
  EXPECT_TRUE(kept);
  Result<LoadedCheckpoint> disk = Disk(*second);
  ASSERT_TRUE(disk.ok());
  ASSERT_EQ(disk->outcome, LoadedCheckpoint::Outcome::kLoaded);
  EXPECT_EQ(disk->checkpoint.claims.size(), 1u);  // only the reserved claim of this node
  EXPECT_EQ(disk->checkpoint.claims.count(c.uid), 1u);
  EXPECT_EQ(second->Unprepare({Ref(c)}).at(c.uid), "");
  EXPECT_TRUE(preparer_.live().empty());
}

// A corrupted checkpoint while the API server is down: the plugin still starts, refuses to claim
// an unknown claim is unprepared, and a later instance (or call) rebuilds once the server answers.
TEST_F(DraPluginTest, RebuildWaitsForTheApiServer) {
  TestClaim c = PutClaim("c", {TestResult{"g", "gpu-0"}});
  k8s::ClusterAccess dead = api_->Access(pki_);
  dead.server = "https://127.0.0.1:1";
  k8s::Client dead_client(dead);
  std::string path;
  {
    auto first = StartPlugin();
    path = first->checkpoint_path();
  }
  ASSERT_TRUE(WriteFileAtomic(path, "not json", 0600).ok());
  {
    auto blind = StartPlugin("", &dead_client);
    EXPECT_TRUE(blind->rebuild_pending());
    EXPECT_NE(blind->Unprepare({Ref(c)}).at(c.uid).find("rebuilding its checkpoint"),
              std::string::npos);
  }
  // The pending rebuild is on disk: the next start with the API server does it.
  Result<LoadedCheckpoint> pending = LoadCheckpoint(path, kNode, "boot-a");
  ASSERT_TRUE(pending.ok());
  EXPECT_TRUE(pending->checkpoint.rebuild_pending);
  auto seeing = StartPlugin();
  EXPECT_FALSE(seeing->rebuild_pending());
  EXPECT_EQ(preparer_.live(), (std::set<std::string>{"uid-c/gpu-0"}));
}

TEST_F(DraPluginTest, CheckpointOfAnotherBootIsForeign) {
  TestClaim c = PutClaim("c", {TestResult{"g", "gpu-0"}});
  std::string path;
  {
    auto first = StartPlugin();
    ASSERT_EQ(first->Prepare({Ref(c)}).at(c.uid).error, "");
    path = first->checkpoint_path();
  }
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/boot_id", "boot-b\n").ok());  // a reboot
  auto second = StartPlugin();
  Result<LoadedCheckpoint> disk = LoadCheckpoint(path, kNode, "boot-b");
  ASSERT_TRUE(disk.ok());
  ASSERT_EQ(disk->outcome, LoadedCheckpoint::Outcome::kLoaded);
  EXPECT_EQ(disk->checkpoint.claims.count(c.uid), 1u);
  bool kept = false;
  for (const auto& f : fs::directory_iterator(fs::path(path).parent_path())) {
    kept |= f.path().filename().string().rfind("checkpoint.json.foreign-", 0) == 0;
  }
  EXPECT_TRUE(kept);
}

// Two instances of a rolling update: their own sockets, one state; prepared through one,
// unprepared through the other.
TEST_F(DraPluginTest, RollingUpdateInstancesShareTheState) {
  auto a = StartPlugin("pod-a");
  auto b = StartPlugin("pod-b");
  EXPECT_EQ(a->registration_socket(), dir_ + "/reg/gpu.gpulet.io-pod-a-reg.sock");
  EXPECT_EQ(b->dra_socket(), dir_ + "/plugins/gpu.gpulet.io/dra-pod-b.sock");
  EXPECT_TRUE(fs::exists(a->dra_socket()));
  EXPECT_TRUE(fs::exists(b->registration_socket()));
  TestClaim c = PutClaim("c", {TestResult{"g", "gpu-0"}});
  TestClaim d = PutClaim("d", {TestResult{"g", "gpu-0"}});
  ASSERT_EQ(a->Prepare({Ref(c)}).at(c.uid).error, "");
  // b sees a's claim: the conflict is caught across instances.
  EXPECT_NE(b->Prepare({Ref(d)}).at(d.uid).error.find("conflicts"), std::string::npos);
  EXPECT_EQ(b->Unprepare({Ref(c)}).at(c.uid), "");
  EXPECT_TRUE(preparer_.live().empty());
  a->Stop();
  EXPECT_FALSE(fs::exists(a->dra_socket()));
  EXPECT_TRUE(fs::exists(b->dra_socket()));  // the other instance's socket is left alone
}

TEST_F(DraPluginTest, ServesRegistrationDraV1V1beta1AndHealthOverSockets) {
  auto plugin = StartPlugin();
  {
    auto ch = grpc::CreateChannel("unix:" + plugin->registration_socket(),
                                  grpc::InsecureChannelCredentials());
    auto reg = ::pluginregistration::Registration::NewStub(ch);
    grpc::ClientContext ctx;
    ::pluginregistration::PluginInfo info;
    ASSERT_TRUE(reg->GetInfo(&ctx, {}, &info).ok());
    EXPECT_EQ(info.type(), "DRAPlugin");
    EXPECT_EQ(info.name(), "gpu.gpulet.io");
    EXPECT_EQ(info.endpoint(), plugin->dra_socket());
    EXPECT_EQ(std::vector<std::string>(info.supported_versions().begin(),
                                       info.supported_versions().end()),
              (std::vector<std::string>{"v1.DRAPlugin", "v1beta1.DRAPlugin",
                                        "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"}));
    grpc::ClientContext ctx2;
    ::pluginregistration::RegistrationStatus st;
    st.set_plugin_registered(true);
    ::pluginregistration::RegistrationStatusResponse r;
    ASSERT_TRUE(reg->NotifyRegistrationStatus(&ctx2, st, &r).ok());
    EXPECT_EQ(plugin->registration_state(), 1);
  }
  auto ch = grpc::CreateChannel("unix:" + plugin->dra_socket(), grpc::InsecureChannelCredentials());
  TestClaim c = PutClaim("c", {TestResult{"m", "gpu-1-mem", "s-1"}});
  {
    auto v1 = drav1::DRAPlugin::NewStub(ch);
    grpc::ClientContext ctx;
    drav1::NodePrepareResourcesRequest req;
    auto* cl = req.add_claims();
    cl->set_namespace_("default");
    cl->set_name("c");
    cl->set_uid(c.uid);
    auto* missing = req.add_claims();
    missing->set_namespace_("default");
    missing->set_name("gone");
    missing->set_uid("uid-gone");
    drav1::NodePrepareResourcesResponse resp;
    ASSERT_TRUE(v1->NodePrepareResources(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.claims().size(), 2u);
    const auto& ok = resp.claims().at(c.uid);
    EXPECT_EQ(ok.error(), "");
    ASSERT_EQ(ok.devices_size(), 1);
    EXPECT_EQ(ok.devices(0).device_name(), "gpu-1-mem");
    EXPECT_EQ(ok.devices(0).pool_name(), kNode);
    EXPECT_EQ(ok.devices(0).request_names(0), "m");
    EXPECT_EQ(ok.devices(0).share_id(), "s-1");
    EXPECT_EQ(ok.devices(0).cdi_device_ids(0), "gpu.gpulet.io/gpu=uid-c-gpu-1-mem");
    EXPECT_NE(resp.claims().at("uid-gone").error().find("not found"), std::string::npos);
  }
  {
    auto v1beta1 = drav1beta1::DRAPlugin::NewStub(ch);
    grpc::ClientContext ctx;
    drav1beta1::NodeUnprepareResourcesRequest req;
    auto* cl = req.add_claims();
    cl->set_namespace_("default");
    cl->set_name("c");
    cl->set_uid(c.uid);
    drav1beta1::NodeUnprepareResourcesResponse resp;
    ASSERT_TRUE(v1beta1->NodeUnprepareResources(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.claims().count(c.uid), 1u);
    EXPECT_EQ(resp.claims().at(c.uid).error(), "");
    EXPECT_TRUE(preparer_.live().empty());
  }
  // v1 (what the kubelet 1.37 picks) and v1alpha1 (kubelets 1.31-1.36) serve the same list.
  ExpectHealthStream<::v1::DRAResourceHealth, ::v1::NodeWatchResourcesResponse>(*plugin, ch, 0);
  ExpectHealthStream<::v1alpha1::DRAResourceHealth, ::v1alpha1::NodeWatchResourcesResponse>(
      *plugin, ch, 2);
  EXPECT_EQ(::v1::HEALTHY, 1);
  EXPECT_EQ(::v1::UNHEALTHY, 2);
  EXPECT_EQ(::v1alpha1::UNHEALTHY, 2);
}

// Without a change the stream still sends the complete list every health_resend, each with a new
// last_updated_time: the kubelet reads a device it has not heard of for 30 s as Unknown.
TEST_F(DraPluginTest, TheHealthStreamRepeatsTheListBeforeTheKubeletTimesItOut) {
  PluginOptions o = Options();
  o.health_resend = std::chrono::milliseconds(200);
  DraPlugin plugin(o, client_.get(), &preparer_);
  ASSERT_TRUE(plugin.Start().ok());
  plugin.SetDeviceHealth({{"gpu-0", DeviceHealthReport::Health::kUnhealthy, "XID 79", 0}});
  auto ch = grpc::CreateChannel("unix:" + plugin.dra_socket(), grpc::InsecureChannelCredentials());
  auto health = ::v1::DRAResourceHealth::NewStub(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto reader = health->NodeWatchResources(&ctx, {});
  ::v1::NodeWatchResourcesResponse first, msg;
  ASSERT_TRUE(reader->Read(&first));
  ASSERT_EQ(first.devices_size(), 1);
  // Resends with no change in between; last_updated_time is in Unix seconds, so a later second
  // shows after about five of them.
  do {
    ASSERT_TRUE(reader->Read(&msg));
    ASSERT_EQ(msg.devices_size(), 1);
    EXPECT_EQ(msg.devices(0).device().device_name(), "gpu-0");
    EXPECT_EQ(msg.devices(0).health(), ::v1::UNHEALTHY);
    EXPECT_EQ(msg.devices(0).message(), "XID 79");
  } while (msg.devices(0).last_updated_time() == first.devices(0).last_updated_time());
  EXPECT_GT(msg.devices(0).last_updated_time(), first.devices(0).last_updated_time());
  ctx.TryCancel();
  plugin.Stop();
}

TEST_F(DraPluginTest, RefusesBadOptions) {
  PluginOptions o = Options("../escape");
  DraPlugin bad(o, client_.get(), &preparer_);
  EXPECT_EQ(bad.Start().code(), ErrorCode::kUsage);
  PluginOptions no_node = Options();
  no_node.node_name.clear();
  DraPlugin nameless(no_node, client_.get(), &preparer_);
  EXPECT_EQ(nameless.Start().code(), ErrorCode::kUsage);
  // A registration path over 107 bytes falls back to a hashed name.
  PluginOptions deep = Options("0123456789abcdef0123456789abcdef0123");
  deep.registry_dir = dir_ + "/" + std::string(40, 'r');
  DraPlugin hashed(deep, client_.get(), &preparer_);
  ASSERT_TRUE(hashed.Start().ok());
  EXPECT_LE(hashed.registration_socket().size(), 107u);
  EXPECT_EQ(hashed.registration_socket().find("0123456789abcdef0123"), std::string::npos);
  EXPECT_TRUE(fs::exists(hashed.registration_socket()));
}

}  // namespace
}  // namespace gpulet::dra
