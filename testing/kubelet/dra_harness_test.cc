// The kubelet's DRA side against gpulet's DRA kubelet plugin (with the tests' Preparer and the fake
// API server): registration through plugins_registry, the service picked, one batched Prepare per
// driver, retries, Unprepare, health (v1 as the kubelet 1.37 picks it, v1alpha1 as older kubelets
// do), deregistration and the delayed slice wipe, a rolling update.
#include "kubelet/dra_harness.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

#include "apiserver/fake_apiserver.h"
#include "common/files.h"
#include "dra/fake_preparer.h"
#include "dra/plugin.h"
#include "dra/test_claims.h"
#include "k8s/client.h"
#include "pluginregistration_v1.grpc.pb.h"
#include "support/wait_until.h"

namespace gpulet::testing {
namespace {

namespace fs = std::filesystem;
using dra::testing::ClaimObjectPath;
using dra::testing::MakeClaimObject;
using dra::testing::TestClaim;
using dra::testing::TestResult;
using std::chrono::milliseconds;

constexpr char kNode[] = "node-1";
constexpr char kDriver[] = "gpu.gpulet.io";

// A registration socket that advertises the given supported versions (the services a plugin
// lists, in its order), to see what the harness picks from them.
class FixedRegistration final : public ::pluginregistration::Registration::Service {
 public:
  FixedRegistration(std::string endpoint, std::vector<std::string> versions)
      : endpoint_(std::move(endpoint)), versions_(std::move(versions)) {}
  grpc::Status GetInfo(grpc::ServerContext*, const ::pluginregistration::InfoRequest*,
                       ::pluginregistration::PluginInfo* info) override {
    info->set_type("DRAPlugin");
    info->set_name(kDriver);
    info->set_endpoint(endpoint_);
    for (const std::string& v : versions_) info->add_supported_versions(v);
    return grpc::Status::OK;
  }
  grpc::Status NotifyRegistrationStatus(
      grpc::ServerContext*, const ::pluginregistration::RegistrationStatus*,
      ::pluginregistration::RegistrationStatusResponse*) override {
    return grpc::Status::OK;
  }

 private:
  std::string endpoint_;
  std::vector<std::string> versions_;
};

class DraHarnessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gdh-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fs::create_directories(dir_ + "/pki");
    Result<TestPki> pki = MakeTestPki(dir_ + "/pki");
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    Result<std::unique_ptr<FakeApiServer>> s = FakeApiServer::Start(*pki, {});
    ASSERT_TRUE(s.ok());
    api_ = std::move(s).value();
    client_ = std::make_unique<k8s::Client>(api_->Access(*pki));
    ASSERT_TRUE(WriteFileAtomic(dir_ + "/boot_id", "boot-a\n").ok());
  }
  void TearDown() override {
    if (harness_) harness_->Stop();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // `health_services`: the kubelet's list (empty: the 1.37 default, v1 then v1alpha1).
  void StartHarness(milliseconds wiping_delay = milliseconds(30000),
                    std::vector<std::string> health_services = {}) {
    DraHarnessOptions o;
    o.registry_dir = dir_ + "/reg";
    o.kubelet_root = dir_;
    o.wiping_delay = wiping_delay;
    if (!health_services.empty()) o.health_services = std::move(health_services);
    harness_ = std::make_unique<DraKubeletHarness>(o);
    ASSERT_TRUE(harness_->Start().ok());
  }

  std::unique_ptr<dra::DraPlugin> StartPlugin(const std::string& instance = "") {
    dra::PluginOptions o;
    o.node_name = kNode;
    o.registry_dir = dir_ + "/reg";
    o.plugins_dir = dir_ + "/plugins";
    o.boot_id_path = dir_ + "/boot_id";
    o.instance = instance;
    auto p = std::make_unique<dra::DraPlugin>(o, client_.get(), &preparer_);
    Status s = p->Start();
    EXPECT_TRUE(s.ok()) << s.message();
    return p;
  }

  DraClaimRef PutClaim(const std::string& name, std::vector<TestResult> results) {
    TestClaim c;
    c.name = name;
    c.uid = "uid-" + name;
    c.node = kNode;
    c.results = std::move(results);
    api_->Put(ClaimObjectPath(c.namespace_, c.name), MakeClaimObject(c));
    return DraClaimRef{c.namespace_, c.name, c.uid, kDriver};
  }

  std::string dir_;
  std::unique_ptr<FakeApiServer> api_;
  std::unique_ptr<k8s::Client> client_;
  dra::FakePreparer preparer_;
  std::unique_ptr<DraKubeletHarness> harness_;
};

TEST_F(DraHarnessTest, RegistersPreparesInOneBatchAndUnprepares) {
  StartHarness();
  auto plugin = StartPlugin();
  ASSERT_TRUE(harness_->WaitForDriver(kDriver, milliseconds(10000)));
  std::optional<DraRegistration> reg = harness_->Driver(kDriver);
  ASSERT_TRUE(reg.has_value());
  EXPECT_EQ(reg->service, "v1.DRAPlugin");  // the newest both sides know
  EXPECT_EQ(reg->health_service, "v1.DRAResourceHealth");  // the kubelet 1.37's preference
  EXPECT_EQ(reg->endpoint, plugin->dra_socket());
  EXPECT_EQ(plugin->registration_state(), 1);  // NotifyRegistrationStatus arrived first
  EXPECT_TRUE(harness_->refused().empty());

  DraClaimRef a = PutClaim("a", {TestResult{"gpu", "gpu-0"}});
  DraClaimRef b = PutClaim("b", {TestResult{"mem", "gpu-1-mem", "s-1", "20Gi"}});
  auto out = harness_->PreparePod({a, b});
  EXPECT_EQ(harness_->prepare_calls(), 1u);  // one call for both claims of the driver
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out.at(a.uid).error, "");
  ASSERT_EQ(out.at(b.uid).devices.size(), 1u);
  EXPECT_EQ(out.at(b.uid).devices[0].share_id, "s-1");
  EXPECT_EQ(out.at(b.uid).devices[0].cdi_device_ids.at(0), "gpu.gpulet.io/gpu=uid-b-gpu-1-mem");
  // Another pod sharing claim a: not prepared again.
  out = harness_->PreparePod({a});
  EXPECT_EQ(harness_->prepare_calls(), 1u);
  EXPECT_EQ(out.at(a.uid).error, "");

  auto un = harness_->UnpreparePod({a, b});
  EXPECT_EQ(un.at(a.uid), "");
  EXPECT_EQ(un.at(b.uid), "");
  EXPECT_TRUE(preparer_.live().empty());
}

TEST_F(DraHarnessTest, RetriesAFailedClaimOnly) {
  StartHarness();
  auto plugin = StartPlugin();
  ASSERT_TRUE(harness_->WaitForDriver(kDriver, milliseconds(10000)));
  DraClaimRef a = PutClaim("a", {TestResult{"gpu", "gpu-0"}});
  DraClaimRef b = PutClaim("b", {TestResult{"gpu", "gpu-1"}, TestResult{"gpu", "gpu-2"}});
  preparer_.FailPrepare(1, "transient");  // a first, then b fails half-way
  auto out = harness_->PreparePod({a, b}, /*attempts=*/3, milliseconds(10));
  EXPECT_EQ(out.at(a.uid).error, "");
  EXPECT_EQ(out.at(b.uid).error, "");
  EXPECT_EQ(harness_->prepare_calls(), 2u);
  EXPECT_EQ(preparer_.live().size(), 3u);
}

// The plugin stops (its sockets go): the driver is deregistered, and its slices are wiped after
// the wiping delay; a plugin back in time cancels the wipe.
TEST_F(DraHarnessTest, DeregistrationWipesSlicesAfterTheDelayUnlessBackInTime) {
  std::vector<std::string> wiped;
  std::mutex mu;
  DraHarnessOptions o;
  o.registry_dir = dir_ + "/reg";
  o.wiping_delay = milliseconds(300);
  o.wipe_slices = [&](const std::string& d) {
    std::lock_guard<std::mutex> lk(mu);
    wiped.push_back(d);
  };
  harness_ = std::make_unique<DraKubeletHarness>(o);
  ASSERT_TRUE(harness_->Start().ok());
  EXPECT_EQ(harness_->wipes(), std::vector<std::string>{""});  // the node's slices at start
  {
    DraClaimRef a = PutClaim("a", {TestResult{"gpu", "gpu-0"}});
    auto plugin = StartPlugin();
    ASSERT_TRUE(harness_->WaitForDriver(kDriver, milliseconds(10000)));
    ASSERT_EQ(harness_->PreparePod({a}).at(a.uid).error, "");
  }  // the plugin is killed with claim a prepared
  ASSERT_TRUE(harness_->WaitForDriverGone(kDriver, milliseconds(10000)));
  auto plugin = StartPlugin();  // back within the delay
  ASSERT_TRUE(harness_->WaitForDriver(kDriver, milliseconds(10000)));
  // Unprepare through the new process works from the checkpoint.
  EXPECT_EQ(harness_->UnpreparePod({DraClaimRef{"default", "a", "uid-a", kDriver}}).at("uid-a"), "");
  EXPECT_TRUE(preparer_.live().empty());
  plugin->Stop();
  ASSERT_TRUE(harness_->WaitForDriverGone(kDriver, milliseconds(10000)));
  // Gone for good: the wipe comes.
  WaitUntil([&] { return harness_->wipes().size() == 2; }, milliseconds(5000));
  EXPECT_EQ(harness_->wipes(), (std::vector<std::string>{"", kDriver}));
  std::lock_guard<std::mutex> lk(mu);
  EXPECT_EQ(wiped, (std::vector<std::string>{"", kDriver}));
}

TEST_F(DraHarnessTest, RollingUpdateGoesToTheNewestInstance) {
  StartHarness(milliseconds(200));
  auto old_pod = StartPlugin("old-pod");
  ASSERT_TRUE(harness_->WaitForDriver(kDriver, milliseconds(10000)));
  DraClaimRef a = PutClaim("a", {TestResult{"gpu", "gpu-0"}});
  ASSERT_EQ(harness_->PreparePod({a}).at(a.uid).error, "");
  auto new_pod = StartPlugin("new-pod");
  WaitUntil(
      [&] {
        auto d = harness_->Driver(kDriver);
        return d && d->endpoint == new_pod->dra_socket();
      },
      milliseconds(4000));
  ASSERT_EQ(harness_->Driver(kDriver)->endpoint, new_pod->dra_socket());
  old_pod->Stop();
  // The new instance unprepares what the old one prepared (state on disk, one lock).
  EXPECT_EQ(harness_->UnpreparePod({a}).at(a.uid), "");
  EXPECT_TRUE(preparer_.live().empty());
  EXPECT_TRUE(harness_->WaitForDriver(kDriver, milliseconds(100)));
  EXPECT_EQ(harness_->wipes(), std::vector<std::string>{""});  // the driver never left
}

// The plugin's health list reaches the kubelet over the version it picked: v1 for a kubelet 1.37,
// v1alpha1 for a kubelet that speaks only that (1.31-1.36).
TEST_F(DraHarnessTest, HealthStreamReachesTheKubeletOverV1AndV1alpha1) {
  for (const std::string version : {"v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"}) {
    SCOPED_TRACE(version);
    StartHarness(milliseconds(30000),
                 version == "v1.DRAResourceHealth"
                     ? std::vector<std::string>{}
                     : std::vector<std::string>{"v1alpha1.DRAResourceHealth"});
    auto plugin = StartPlugin();
    ASSERT_TRUE(harness_->WaitForDriver(kDriver, milliseconds(10000)));
    EXPECT_EQ(harness_->Driver(kDriver)->health_service, version);
    plugin->SetDeviceHealth({{"gpu-0", dra::DeviceHealthReport::Health::kHealthy, "", 0},
                             {"gpu-1", dra::DeviceHealthReport::Health::kUnhealthy, "XID 79", 0}});
    ASSERT_TRUE(harness_->WaitForHealth(
        kDriver, [](const std::vector<DraDeviceHealth>& l) { return l.size() == 2; },
        milliseconds(10000)));
    auto list = harness_->Health(kDriver);
    EXPECT_EQ(list[0].health, "Healthy");
    EXPECT_EQ(list[1].device, "gpu-1");
    EXPECT_EQ(list[1].pool, kNode);
    EXPECT_EQ(list[1].health, "Unhealthy");
    EXPECT_EQ(list[1].message, "XID 79");
    plugin->Stop();
    harness_->Stop();
    harness_.reset();
  }
}

// As the kubelet 1.37 picks: the DRAPlugin service by the plugin's order (the first it speaks),
// the health service by the kubelet's (v1 before v1alpha1), none when only unknown ones are listed.
TEST_F(DraHarnessTest, PicksServicesAsTheKubeletDoes) {
  struct Case {
    std::vector<std::string> advertised, kubelet_health;
    std::string service, health;
  };
  const std::vector<Case> cases = {
      {{"v1beta1.DRAPlugin", "v1.DRAPlugin", "v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth"},
       {},
       "v1beta1.DRAPlugin",
       "v1.DRAResourceHealth"},
      {{"v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"},
       {"v1alpha1.DRAResourceHealth"},
       "v1.DRAPlugin",
       "v1alpha1.DRAResourceHealth"},
      {{"v2.DRAPlugin", "v1.DRAPlugin", "v2.DRAResourceHealth"}, {}, "v1.DRAPlugin", ""},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    StartHarness(milliseconds(30000), cases[i].kubelet_health);
    const std::string socket = dir_ + "/reg/fixed-" + std::to_string(i) + "-reg.sock";
    FixedRegistration service(dir_ + "/plugins/none.sock", cases[i].advertised);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
    builder.RegisterService(&service);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    ASSERT_NE(server, nullptr);
    ASSERT_TRUE(harness_->WaitForDriver(kDriver, milliseconds(10000)));
    std::optional<DraRegistration> reg = harness_->Driver(kDriver);
    ASSERT_TRUE(reg.has_value());
    EXPECT_EQ(reg->service, cases[i].service);
    EXPECT_EQ(reg->health_service, cases[i].health);
    harness_->Stop();
    harness_.reset();
    server->Shutdown();
    fs::remove(socket);
  }
}

TEST_F(DraHarnessTest, RefusesAnEndpointOutsideTheKubeletRoot) {
  DraHarnessOptions o;
  o.registry_dir = dir_ + "/reg";
  o.kubelet_root = "/var/lib/kubelet";
  harness_ = std::make_unique<DraKubeletHarness>(o);
  ASSERT_TRUE(harness_->Start().ok());
  auto plugin = StartPlugin();
  WaitUntil([&] { return !harness_->refused().empty(); }, milliseconds(4000));
  ASSERT_EQ(harness_->refused().size(), 1u);
  EXPECT_NE(harness_->refused()[0].find("is outside /var/lib/kubelet"), std::string::npos);
  EXPECT_FALSE(harness_->Driver(kDriver).has_value());
  EXPECT_EQ(plugin->registration_state(), -1);
}

}  // namespace
}  // namespace gpulet::testing
