// Leader election and the Kubernetes adapter's reads against the fake API server (no Slurm).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "apiserver/rbac_check.h"
#include "slurm/fake_runner.h"
#include "tests/broker/broker_support.h"

namespace gpulet::broker_testing {
namespace {

Journal DiskJournalOf(const std::string& path) {
  Result<Journal> j = LoadJournal(path);
  return j.ok() ? *j : Journal{};
}

class BrokerApi : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<testing::TestPki> pki = testing::MakeTestPki(dir_.path());
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    auto api = testing::FakeApiServer::Start(*pki, {});
    ASSERT_TRUE(api.ok());
    api_ = std::move(*api);
    k8s::ClusterAccess access = api_->Access(*pki);
    client_ = std::make_unique<k8s::Client>(access);
    config_.nodes = {"gpua", "gpub"};
    config_.namespaces = {"inference"};
    config_.lease_namespace = "kube-system";
    config_.lease_name = "gpulet-broker";
    config_.lease_duration = 30 * 1000;
  }
  // Whatever the broker sent in the test (lease, node reads and taint patches, pod lists,
  // evictions) is granted by its shipped roles.
  void TearDown() override {
    if (!api_) return;
    for (const std::string& v :
         testing::RbacVerbsNotGranted(api_->requests(), {"deploy/broker/rbac.yaml"})) {
      ADD_FAILURE() << "deploy/broker/rbac.yaml does not grant " << v;
    }
  }
  TempDir dir_;
  std::unique_ptr<testing::FakeApiServer> api_;
  std::unique_ptr<k8s::Client> client_;
  BrokerConfig config_;
};

TEST_F(BrokerApi, OneLeaseHolderAtATime) {
  FakeClock clock_a, clock_b;
  LeaseElector a(*client_, config_, "broker-a", clock_a);
  LeaseElector b(*client_, config_, "broker-b", clock_b);
  Result<bool> got = a.TryAcquireOrRenew();
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_TRUE(*got);  // created
  EXPECT_EQ(a.terms(), 1u);
  EXPECT_TRUE(a.HeldFor(std::chrono::seconds(29)));
  EXPECT_FALSE(*b.TryAcquireOrRenew());  // fresh: b waits
  clock_a.Advance(std::chrono::seconds(2));
  EXPECT_TRUE(*a.TryAcquireOrRenew());  // a renews
  clock_b.Advance(std::chrono::seconds(20));
  EXPECT_FALSE(*b.TryAcquireOrRenew());  // a renewed since b last looked: b's wait restarts
  clock_b.Advance(std::chrono::seconds(29));
  EXPECT_FALSE(*b.TryAcquireOrRenew());
  // a stops renewing: once b has seen the same record for the lease duration, b takes over.
  clock_b.Advance(std::chrono::seconds(2));
  EXPECT_TRUE(*b.TryAcquireOrRenew());
  EXPECT_EQ(b.terms(), 1u);
  EXPECT_FALSE(*a.TryAcquireOrRenew());
  EXPECT_FALSE(a.HeldFor(std::chrono::seconds(0)));
  auto lease =
      api_->Object("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/gpulet-broker");
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ((*lease)["spec"]["holderIdentity"], "broker-b");
  EXPECT_EQ((*lease)["spec"]["leaseDurationSeconds"], 30);
  EXPECT_EQ((*lease)["spec"]["leaseTransitions"], 1);
}

// The holder's renewTime is another host's wall clock: a standby whose clock runs ahead (or a
// holder whose clock lags) must not take the lease early. Only the standby's own clock counts.
TEST_F(BrokerApi, RenewTimeFromAnotherHostsClockIsNotComparedWithOurs) {
  const std::string path =
      "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/gpulet-broker";
  // A live holder whose clock is an hour behind ours.
  api_->Put(path, json{{"apiVersion", "coordination.k8s.io/v1"},
                       {"kind", "Lease"},
                       {"metadata", {{"name", "gpulet-broker"}, {"namespace", "kube-system"}}},
                       {"spec",
                        {{"holderIdentity", "broker-a"},
                         {"leaseDurationSeconds", 30},
                         {"renewTime", FormatMicroTime(NowMs() - 3600 * 1000)}}}});
  FakeClock clock;
  LeaseElector b(*client_, config_, "broker-b", clock);
  EXPECT_FALSE(*b.TryAcquireOrRenew());
  clock.Advance(std::chrono::seconds(29));
  EXPECT_FALSE(*b.TryAcquireOrRenew());
  clock.Advance(std::chrono::seconds(1));
  EXPECT_TRUE(*b.TryAcquireOrRenew());  // unchanged for 30 s on b's clock
}

// issue 26 item 7: write faults on the Lease. A renewal that meets 5xx, 429 or a timeout is an
// error and extends nothing: the holder stops acting when its own lease runs out. A create or a
// renewal that landed but whose answer was lost is found ours on the next round, and a lost
// create still starts a term (the caller re-reads shared state).
TEST_F(BrokerApi, LeaseWritesThatFailOrLoseTheirAnswer) {
  using testing::WriteFault;
  const std::string leases = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases";
  FakeClock clock;
  LeaseElector a(*client_, config_, "broker-a", clock);
  api_->InjectWriteFault({.method = "POST", .kind = WriteFault::Kind::kLostAnswer});
  Result<bool> first = a.TryAcquireOrRenew();
  EXPECT_FALSE(first.ok());  // created, but we could not know
  ASSERT_TRUE(api_->Object(leases + "/gpulet-broker").has_value());
  EXPECT_FALSE(a.HeldFor(std::chrono::seconds(0)));
  Result<bool> second = a.TryAcquireOrRenew();
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_TRUE(*second);
  EXPECT_EQ(a.terms(), 1u);
  EXPECT_TRUE(a.HeldFor(std::chrono::seconds(29)));

  for (WriteFault fault : {WriteFault{.method = "PATCH", .code = 503},
                           WriteFault{.method = "PATCH",
                                      .kind = WriteFault::Kind::kTooManyRequests},
                           WriteFault{.method = "PATCH", .kind = WriteFault::Kind::kTimeout,
                                      .delay = std::chrono::milliseconds(100)}}) {
    clock.Advance(std::chrono::seconds(10));
    api_->InjectWriteFault(fault);
    Result<bool> renewed = a.TryAcquireOrRenew();
    EXPECT_FALSE(renewed.ok());
  }
  // 30 s after the last renewal that landed, the failed ones extended nothing.
  EXPECT_FALSE(a.HeldFor(std::chrono::seconds(0)));
  // A renewal whose answer is lost landed: the next round renews it, still the same term.
  api_->InjectWriteFault({.method = "PATCH", .kind = WriteFault::Kind::kLostAnswer});
  EXPECT_FALSE(a.TryAcquireOrRenew().ok());
  Result<bool> again = a.TryAcquireOrRenew();
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_TRUE(*again);
  EXPECT_EQ(a.terms(), 1u);
  EXPECT_EQ((*api_->Object(leases + "/gpulet-broker"))["spec"]["holderIdentity"], "broker-a");
}

TEST_F(BrokerApi, StaleLeaseUpdateIsAConflict) {
  LeaseElector a(*client_, config_, "broker-a", RealClock());
  ASSERT_TRUE(*a.TryAcquireOrRenew());
  const std::string path =
      "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/gpulet-broker";
  k8s::ApiResult<json> stale = client_->Patch(
      path, json{{"metadata", {{"resourceVersion", "1"}}}, {"spec", {{"holderIdentity", "x"}}}},
      k8s::PatchType::kMerge);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.http_status(), 409);
  EXPECT_EQ((*api_->Object(path))["spec"]["holderIdentity"], "broker-a");
}

// The HTTP status travels in the error value, not in its message text.
TEST_F(BrokerApi, ApiErrorsCarryTheirHttpStatus) {
  k8s::ApiResult<json> missing = client_->Get("/api/v1/nodes/nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.http_status(), 404);
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  api_->Put("/api/v1/nodes/gpua", Node("gpua"));
  k8s::ApiResult<json> found = client_->Get("/api/v1/nodes/gpua");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found.http_status(), 0);
  // A PodDisruptionBudget's refusal (429) counts as blocked, whatever the message says.
  api_->Put("/api/v1/namespaces/inference/pods/serve", RunningPod("inference", "serve", "gpua"));
  api_->Put("/apis/policy/v1/namespaces/inference/poddisruptionbudgets/pdb",
            Pdb("inference", "pdb", "serve", 0));
  KubeSide side(*client_, config_);
  Result<EvictionResult> evicted = side.Evict({"inference/serve"});
  ASSERT_TRUE(evicted.ok()) << evicted.status().message();
  EXPECT_EQ(evicted->blocked, 1);
  EXPECT_EQ(evicted->evicted, 0);
  // No HTTP answer at all: 0.
  k8s::ClusterAccess nowhere;
  nowhere.server = "https://127.0.0.1:1";
  k8s::ApiResult<json> refused = k8s::Client(nowhere).Get("/api/v1/nodes/gpua");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.http_status(), 0);
}

TEST_F(BrokerApi, ObserveCountsDemandAndPodsPerNode) {
  api_->Put("/api/v1/nodes/gpua", Node("gpua"));
  api_->Put("/api/v1/namespaces/inference/pods/want", PendingGpuPod("inference", "want"));
  json cpu_only = PendingGpuPod("inference", "cpu");
  cpu_only["spec"]["containers"][0]["resources"] = json::object();
  api_->Put("/api/v1/namespaces/inference/pods/cpu", cpu_only);
  api_->Put("/api/v1/namespaces/other/pods/elsewhere", PendingGpuPod("other", "elsewhere"));
  api_->Put("/api/v1/namespaces/inference/pods/serve", RunningPod("inference", "serve", "gpua"));
  api_->Put("/api/v1/namespaces/batch/pods/b", RunningPod("batch", "b", "gpua"));
  api_->Put("/api/v1/namespaces/kube-system/pods/ds",
            RunningPod("kube-system", "ds", "gpua", true));
  json done = RunningPod("batch", "done", "gpua");
  done["status"]["phase"] = "Succeeded";
  api_->Put("/api/v1/namespaces/batch/pods/done", done);
  KubeSide side(*client_, config_);
  KubeView v = side.Observe();
  ASSERT_TRUE(v.ok) << v.error;
  EXPECT_EQ(v.unschedulable_gpu_pods, 1);
  ASSERT_EQ(v.nodes.count("gpua"), 1u);
  EXPECT_EQ(v.nodes.count("gpub"), 0u);  // no such Node: absent, not an error
  const KubeNode& n = v.nodes.at("gpua");
  EXPECT_TRUE(n.unschedulable);
  EXPECT_TRUE(n.slurm_taint);
  EXPECT_FALSE(n.pool_label);
  EXPECT_EQ(n.non_daemonset_pods, 2);
  EXPECT_EQ(n.inference_pods, 1);
  EXPECT_THAT(n.evictable, ::testing::UnorderedElementsAre("inference/serve", "batch/b"));
  // Admit and return are merge patches that keep other taints.
  json node = Node("gpua");
  node["spec"]["taints"].push_back({{"key", "other"}, {"effect", "NoSchedule"}});
  api_->Put("/api/v1/nodes/gpua", node);
  ASSERT_TRUE(side.Admit("gpua").ok());
  json after = *api_->Object("/api/v1/nodes/gpua");
  EXPECT_FALSE(after["spec"]["unschedulable"].get<bool>());
  EXPECT_EQ(after["spec"]["taints"].size(), 1u);
  EXPECT_EQ(after["metadata"]["labels"]["gpulet.io/pool"], "inference");
  ASSERT_TRUE(side.StartReturn("gpua").ok());
  after = *api_->Object("/api/v1/nodes/gpua");
  EXPECT_TRUE(after["spec"]["unschedulable"].get<bool>());
  EXPECT_EQ(after["spec"]["taints"].size(), 2u);
  EXPECT_EQ(after["metadata"]["labels"].count("gpulet.io/pool"), 0u);
  // An API failure makes the whole view unknown.
  api_.reset();
  KubeView down = side.Observe();
  EXPECT_FALSE(down.ok);
  EXPECT_FALSE(down.error.empty());
}

// issue 26 item 9: a taint another controller adds between the broker's read of the node and its
// rewrite of spec.taints survives (the rewrite carries the read's resourceVersion, meets 409 and
// reads again). Without the precondition the merge patch replaced the whole list and lost it.
TEST_F(BrokerApi, TaintRewriteKeepsATaintAddedInBetween) {
  api_->Put("/api/v1/nodes/gpua", Node("gpua"));
  KubeSide side(*client_, config_);
  const json not_ready = {{"key", "node.kubernetes.io/not-ready"}, {"effect", "NoExecute"}};
  int raced = 0;
  api_->BeforeEachWrite([&](const testing::RecordedRequest& r) {
    if (r.method != "PATCH" || r.path != "/api/v1/nodes/gpua" || raced++ > 0) return;
    json node = *api_->Object("/api/v1/nodes/gpua");
    node["spec"]["taints"].push_back(not_ready);
    api_->Put("/api/v1/nodes/gpua", node);
  });
  ASSERT_TRUE(side.StartReturn("gpua").ok());
  json after = *api_->Object("/api/v1/nodes/gpua");
  EXPECT_THAT(after["spec"]["taints"], ::testing::Contains(not_ready));
  EXPECT_TRUE(after["spec"]["unschedulable"].get<bool>());

  raced = 0;
  ASSERT_TRUE(side.Admit("gpua").ok());
  after = *api_->Object("/api/v1/nodes/gpua");
  EXPECT_THAT(after["spec"]["taints"], ::testing::Contains(not_ready));
  for (const json& t : after["spec"]["taints"]) EXPECT_NE(t.value("key", ""), "gpulet.io/pool");
  EXPECT_FALSE(after["spec"]["unschedulable"].get<bool>());
  EXPECT_EQ(raced, 2);  // the hook ran for the raced PATCH and the retried one
}

// issue 26 item 8: a pod under two PodDisruptionBudgets is refused by the eviction subresource
// with a Failure Status inside a 201. It is blocked, not counted as evicted, and stays.
TEST_F(BrokerApi, APodUnderTwoBudgetsIsBlockedNotEvicted) {
  api_->Put("/api/v1/namespaces/inference/pods/serve", RunningPod("inference", "serve", "gpua"));
  api_->Put("/apis/policy/v1/namespaces/inference/poddisruptionbudgets/a",
            Pdb("inference", "a", "serve", 5));
  api_->Put("/apis/policy/v1/namespaces/inference/poddisruptionbudgets/b",
            Pdb("inference", "b", "serve", 5));
  KubeSide side(*client_, config_);
  Result<EvictionResult> r = side.Evict({"inference/serve"});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->evicted, 0);
  EXPECT_EQ(r->blocked, 1);
  EXPECT_TRUE(api_->Object("/api/v1/namespaces/inference/pods/serve").has_value());
}

// Dry run: the decisions are made and counted, nothing is drained and no journal is written.
// The same setup without dry run drains, journals, counts the transition and shows in status.
TEST_F(BrokerApi, DryRunDecidesWithoutActing) {
  api_->Put("/api/v1/nodes/gpua", Node("gpua"));
  api_->Put("/api/v1/namespaces/inference/pods/want", PendingGpuPod("inference", "want"));
  auto runner = std::make_shared<slurm::testing::FakeRunner>();
  runner->On("sinfo --json",
             slurm::CommandOutput{0,
                                  R"({"errors":[],"nodes":[{"name":"gpua","state":"idle",
                                  "gres":"gpu:4","alloc_cpus":0,"last_busy":1}]})",
                                  ""});
  runner->On("squeue --json", slurm::CommandOutput{0, R"({"errors":[],"jobs":[]})", ""});
  runner->On("scontrol show reservation -o", slurm::CommandOutput{0, "", ""});
  runner->On("scontrol update NodeName=gpua State=DRAIN Reason=gpulet-broker: lent to kubernetes",
             slurm::CommandOutput{0, "", ""});
  config_.nodes = {"gpua"};
  config_.lease_name.clear();
  config_.idle_time = 0;
  config_.demand_evaluations = 2;
  config_.journal_path = dir_.path() + "/journal.json";
  KubeSide kube(*client_, config_);
  SlurmSide slurm_side(runner, config_);
  {
    Broker dry(config_, slurm_side, kube, BrokerOptions{true, "t"});
    ASSERT_TRUE(dry.Start().ok());
    EXPECT_EQ(dry.Tick(NowMs()).action, Action::kNone);
    Decision d = dry.Tick(NowMs());
    EXPECT_EQ(d.action, Action::kDrain);
    EXPECT_EQ(d.node, "gpua");
    for (const std::string& c : runner->calls()) {
      EXPECT_THAT(c, ::testing::Not(::testing::HasSubstr("update")));
    }
    EXPECT_FALSE(std::filesystem::exists(config_.journal_path));
    EXPECT_THAT(dry.metrics().Prometheus(),
                ::testing::HasSubstr(
                    "gpulet_broker_decisions_total{action=\"drain\",reason=\"k8s_demand\"} 1"));
    EXPECT_THAT(dry.metrics().Prometheus(),
                ::testing::Not(::testing::HasSubstr("gpulet_broker_transitions_total{")));
  }
  Broker real(config_, slurm_side, kube, BrokerOptions{false, "t"});
  ASSERT_TRUE(real.Start().ok());
  real.Tick(NowMs());
  ASSERT_EQ(real.Tick(NowMs()).action, Action::kDrain);
  EXPECT_EQ(runner->calls().back(),
            "scontrol update NodeName=gpua State=DRAIN Reason=gpulet-broker: lent to kubernetes");
  EXPECT_EQ(DiskJournalOf(config_.journal_path).OwnerOf("gpua"), Owner::kLending);
  const std::string prom = real.metrics().Prometheus();
  EXPECT_THAT(prom, ::testing::HasSubstr("gpulet_broker_transitions_total{action=\"drain\"} 1"));
  EXPECT_THAT(prom, ::testing::HasSubstr("gpulet_broker_nodes{owner=\"lending\"} 1"));
  const std::string status = FormatStatus(real.journal(), config_, NowMs());
  EXPECT_THAT(status, ::testing::HasSubstr("in-transit=1"));
  EXPECT_THAT(status, ::testing::HasSubstr("gpua\tlending\tdraining\t"));
  // The HTTP endpoint serves the same.
  BrokerHttp http(real.metrics());
  ASSERT_TRUE(http.Start("127.0.0.1:0").ok());
  CommandResult got =
      RunCommand("curl -s http://127.0.0.1:" + std::to_string(http.port()) + "/metrics");
  EXPECT_THAT(got.output, ::testing::HasSubstr("gpulet_broker_nodes{owner=\"lending\"} 1"));
}

}  // namespace
}  // namespace gpulet::broker_testing
