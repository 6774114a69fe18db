// The contract of the decision engine, rule by rule.
#include "broker/engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "broker/engine_test_objects.h"

namespace gpulet::broker {
namespace {

using ::testing::HasSubstr;

using namespace testobjects;

BrokerConfig Config() {
  BrokerConfig c;
  c.nodes = {"gpua", "gpub", "gpuc"};
  c.namespaces = {"inference"};
  c.slurm_min_nodes = 1;
  c.k8s_max_nodes = 2;
  c.k8s_min_nodes = 0;
  c.idle_time = 10 * kMin;
  c.reservation_lookahead = 60 * kMin;
  c.demand_evaluations = 3;
  c.min_residence = 15 * kMin;
  c.cooldown = 5 * kMin;
  c.return_after_idle = 30 * kMin;
  c.eviction_timeout = 10 * kMin;
  return c;
}

SlurmNode Drained(const std::string& name, const std::string& reason, int gpus = 4) {
  SlurmNode n = Idle(name, 60 * kMin, gpus);
  n.flags = {"DRAIN"};
  n.reason = reason;
  return n;
}

KubeNode Cordoned(const std::string& name) {
  KubeNode k;
  k.name = name;
  k.unschedulable = true;
  k.slurm_taint = true;
  return k;
}

KubeNode Admitted(const std::string& name, int inference_pods = 0) {
  KubeNode k;
  k.name = name;
  k.pool_label = true;
  k.inference_pods = inference_pods;
  k.non_daemonset_pods = inference_pods;
  for (int i = 0; i < inference_pods; ++i) k.evictable.push_back("inference/p" + std::to_string(i));
  return k;
}

struct World {
  SlurmView slurm;
  KubeView kube;
  Journal journal;
  World() {
    slurm.ok = true;
    kube.ok = true;
    for (const char* n : {"gpua", "gpub", "gpuc"}) {
      slurm.nodes[n] = Idle(n, 60 * kMin);
      kube.nodes[n] = Cordoned(n);
    }
  }
  void Demand(int pods, int streak_before) {
    kube.unschedulable_gpu_pods = pods;
    journal.demand_streak = streak_before;
  }
  Decision Run(const BrokerConfig& c = Config(), TimeMs now = kNow) const {
    return Evaluate(slurm, kube, journal, c, now);
  }
};

const std::string kOurs = std::string(kBrokerReasonPrefix) + " lent to kubernetes";

// ---- fail closed -------------------------------------------------------------------------------

TEST(Engine, SlurmUnknownMeansNoAction) {
  World w;
  w.Demand(3, 10);
  w.slurm.ok = false;
  w.slurm.error = "sinfo: slurmctld not reachable";
  Decision d = w.Run();
  EXPECT_EQ(d.action, Action::kNone);
  EXPECT_EQ(d.code, "unknown_slurm");
  EXPECT_THAT(d.reason, HasSubstr("slurmctld not reachable"));
  EXPECT_EQ(d.journal, w.journal);  // not even the streak moves
}

TEST(Engine, KubernetesUnknownMeansNoAction) {
  World w;
  w.Demand(3, 10);
  w.kube.ok = false;
  w.kube.error = "GET /api/v1/pods: HTTP 500";
  Decision d = w.Run();
  EXPECT_EQ(d.action, Action::kNone);
  EXPECT_EQ(d.code, "unknown_kubernetes");
}

TEST(Engine, NodeInTransitMissingFromAViewMeansNoAction) {
  World w;
  w.journal.nodes["gpua"] = {Owner::kLending, kStepDraining, kNow, kNow, 4, 0};
  w.slurm.nodes.erase("gpua");
  Decision d = w.Run();
  EXPECT_EQ(d.action, Action::kNone);
  EXPECT_EQ(d.code, "unknown_node");
}

// ---- lending -----------------------------------------------------------------------------------

TEST(Engine, DemandMustLastNEvaluations) {
  World w;
  w.Demand(2, 0);
  Decision d = w.Run();
  EXPECT_EQ(d.action, Action::kNone);
  EXPECT_EQ(d.code, "demand_building");
  EXPECT_EQ(d.journal.demand_streak, 1);
  w.journal = d.journal;
  d = w.Run();
  EXPECT_EQ(d.action, Action::kNone);
  w.journal = d.journal;
  d = w.Run();
  EXPECT_EQ(d.action, Action::kDrain);
  EXPECT_EQ(d.journal.demand_streak, 3);
}

TEST(Engine, LendsTheLongestIdleNodeWithOurReason) {
  World w;
  w.slurm.nodes["gpua"] = Idle("gpua", 20 * kMin);
  w.slurm.nodes["gpub"] = Idle("gpub", 90 * kMin);
  w.slurm.nodes["gpuc"] = Idle("gpuc", 30 * kMin);
  w.Demand(1, 2);
  Decision d = w.Run();
  ASSERT_EQ(d.action, Action::kDrain);
  EXPECT_EQ(d.node, "gpub");
  EXPECT_EQ(d.drain_reason.rfind(kBrokerReasonPrefix, 0), 0u);
  EXPECT_EQ(d.journal.OwnerOf("gpub"), Owner::kLending);
  EXPECT_EQ(d.journal.nodes.at("gpub").gpus, 4);
  EXPECT_EQ(d.journal.last_transition, kNow);
}

struct BlockCase {
  const char* name;
  std::function<void(World&)> setup;
  const char* expect;
};

class LendBlocked : public ::testing::TestWithParam<BlockCase> {};

TEST_P(LendBlocked, OnlyCandidateIsRefused) {
  World w;
  w.slurm.nodes.erase("gpub");
  w.slurm.nodes.erase("gpuc");
  w.kube.nodes.erase("gpub");
  w.kube.nodes.erase("gpuc");
  BrokerConfig c = Config();
  c.nodes = {"gpua", "gpuz"};  // gpuz: a second managed node that Slurm does not show
  w.Demand(1, 5);
  GetParam().setup(w);
  Decision d = Evaluate(w.slurm, w.kube, w.journal, c, kNow);
  EXPECT_EQ(d.action, Action::kNone) << d.reason;
  EXPECT_THAT(d.reason, HasSubstr(GetParam().expect));
}

INSTANTIATE_TEST_SUITE_P(
    Engine, LendBlocked,
    ::testing::Values(
        BlockCase{"Running", [](World& w) { w.slurm.nodes["gpua"].state = "mixed"; }, "mixed"},
        BlockCase{"Allocated", [](World& w) { w.slurm.nodes["gpua"].state = "allocated"; },
                  "allocated"},
        BlockCase{"Completing", [](World& w) { w.slurm.nodes["gpua"].flags = {"COMPLETING"}; },
                  "COMPLETING"},
        BlockCase{"Planned", [](World& w) { w.slurm.nodes["gpua"].flags = {"PLANNED"}; },
                  "PLANNED"},
        BlockCase{"Reserved", [](World& w) { w.slurm.nodes["gpua"].flags = {"RESERVED"}; },
                  "RESERVED"},
        BlockCase{"Maint", [](World& w) { w.slurm.nodes["gpua"].flags = {"MAINT"}; }, "MAINT"},
        BlockCase{"PoweredDown", [](World& w) { w.slurm.nodes["gpua"].flags = {"POWERED_DOWN"}; },
                  "POWERED"},
        BlockCase{"NotResponding",
                  [](World& w) { w.slurm.nodes["gpua"].flags = {"NOT_RESPONDING"}; },
                  "NOT_RESPONDING"},
        BlockCase{"AdminDrained", [](World& w) { w.slurm.nodes["gpua"] = Drained("gpua", "fan"); },
                  "DRAIN"},
        BlockCase{"Down", [](World& w) { w.slurm.nodes["gpua"].state = "down"; }, "down"},
        BlockCase{"NotIdleLongEnough",
                  [](World& w) { w.slurm.nodes["gpua"] = Idle("gpua", 9 * kMin); }, "idle for"},
        BlockCase{"GpusInUse", [](World& w) { w.slurm.nodes["gpua"].gpus_used = 1; }, "job holds"},
        BlockCase{"NamedByPendingJob",
                  [](World& w) {
                    SlurmJob j;
                    j.id = "42";
                    j.state = "PENDING";
                    j.reason = "BeginTime";
                    j.required_nodes = {"gpua"};
                    w.slurm.jobs.push_back(j);
                  },
                  "pending job 42"},
        BlockCase{"SchedNodes",
                  [](World& w) {
                    SlurmJob j;
                    j.id = "43";
                    j.state = "PENDING";
                    j.reason = "Resources";
                    j.sched_nodes = {"gpua"};
                    w.slurm.jobs.push_back(j);
                  },
                  "pending job 43"},
        BlockCase{"ReservationWithinLookahead",
                  [](World& w) {
                    w.slurm.reservations.push_back(
                        {"maint", {"gpua"}, kNow + 30 * kMin, kNow + 90 * kMin});
                  },
                  "reservation maint"},
        BlockCase{"NoKubernetesNode", [](World& w) { w.kube.nodes.erase("gpua"); },
                  "no Kubernetes node"},
        BlockCase{"RecentlyReturned",
                  [](World& w) { w.journal.returned_at["gpua"] = kNow - 5 * kMin; },
                  "minResidence"},
        BlockCase{"SlurmNeedsItsGpus",
                  [](World& w) {
                    SlurmJob j;
                    j.id = "77";
                    j.state = "PENDING";
                    j.reason = "Resources";
                    j.gpus_per_node = 4;
                    j.node_count = 1;
                    w.slurm.jobs.push_back(j);
                  },
                  "pending job 77"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Engine, ReservationBeyondLookaheadDoesNotBlock) {
  World w;
  w.slurm.reservations.push_back(
      {"later", {"gpua", "gpub", "gpuc"}, kNow + 120 * kMin, kNow + 180 * kMin});
  w.Demand(1, 5);
  EXPECT_EQ(w.Run().action, Action::kDrain);
}

TEST(Engine, LendKeepsRoomForLargestPendingJob) {
  World w;  // three 4-GPU nodes; a pending job needs 2 nodes x 4 GPUs: one node may go
  SlurmJob j;
  j.id = "9";
  j.state = "PENDING";
  j.reason = "Resources";
  j.gpus_per_node = 4;
  j.node_count = 2;
  w.slurm.jobs.push_back(j);
  w.slurm.nodes["gpua"].state = "allocated";  // busy, still Slurm capacity
  w.Demand(1, 5);
  Decision d = w.Run();
  ASSERT_EQ(d.action, Action::kDrain) << d.reason;
  // With one node already lent, the last free one must stay.
  w.journal = d.journal;
  w.journal.nodes[d.node].owner = Owner::kKubernetes;
  w.journal.nodes[d.node].step = kStepAdmitted;
  w.journal.last_transition = kNow - 60 * kMin;
  d = w.Run();
  EXPECT_EQ(d.action, Action::kNone) << d.reason;
  EXPECT_THAT(d.reason, HasSubstr("pending job 9"));
}

TEST(Engine, CapFloorAndCooldown) {
  World w;
  w.Demand(1, 5);
  BrokerConfig c = Config();
  c.k8s_max_nodes = 0;
  EXPECT_EQ(w.Run(c).code, "k8s_cap");
  c = Config();
  c.slurm_min_nodes = 3;
  EXPECT_EQ(w.Run(c).code, "slurm_floor");
  w.journal.last_transition = kNow - 4 * kMin;
  EXPECT_EQ(w.Run().code, "cooldown");
  w.journal.last_transition = kNow - 5 * kMin;
  EXPECT_EQ(w.Run().action, Action::kDrain);
}

TEST(Engine, OneNodeInTransitAtATime) {
  World w;
  w.Demand(5, 10);
  w.journal.nodes["gpua"] = {Owner::kLending, kStepDraining, kNow - kMin, kNow - kMin, 4, 0};
  w.slurm.nodes["gpua"].flags = {"DRAIN"};
  w.slurm.nodes["gpua"].state = "mixed";
  w.slurm.nodes["gpua"].reason = kOurs;
  Decision d = w.Run();
  EXPECT_EQ(d.action, Action::kNone);
  EXPECT_EQ(d.code, "waiting_drain");
  EXPECT_EQ(d.node, "gpua");
}

// ---- carrying a lend ---------------------------------------------------------------------------

TEST(Engine, AdmitsOnlyWhenDrainedAndIdle) {
  World w;
  w.Demand(5, 10);
  w.journal.nodes["gpua"] = {Owner::kLending, kStepDraining, kNow - kMin, kNow - kMin, 4, 0};
  w.slurm.nodes["gpua"] = Drained("gpua", kOurs);
  w.slurm.nodes["gpua"].flags.insert("COMPLETING");
  EXPECT_EQ(w.Run().action, Action::kNone);
  w.slurm.nodes["gpua"] = Drained("gpua", kOurs);
  w.slurm.nodes["gpua"].alloc_cpus = 1;
  EXPECT_EQ(w.Run().action, Action::kNone);
  w.slurm.nodes["gpua"] = Drained("gpua", kOurs);
  Decision d = w.Run();
  ASSERT_EQ(d.action, Action::kAdmit);
  EXPECT_EQ(d.node, "gpua");
  EXPECT_EQ(d.journal.OwnerOf("gpua"), Owner::kKubernetes);
  // The next evaluation confirms the admission once Kubernetes shows it.
  w.journal = d.journal;
  d = w.Run();
  EXPECT_EQ(d.action, Action::kAdmit);  // still cordoned: re-issued
  w.kube.nodes["gpua"] = Admitted("gpua");
  d = w.Run();
  EXPECT_NE(d.action, Action::kAdmit);
  EXPECT_EQ(d.journal.nodes.at("gpua").step, kStepAdmitted);
}

TEST(Engine, AdminDrainDuringLendIsLeftAlone) {
  World w;
  w.Demand(5, 10);
  w.journal.nodes["gpua"] = {Owner::kLending, kStepDraining, kNow - kMin, kNow - kMin, 4, 0};
  w.slurm.nodes["gpua"] = Drained("gpua", "bad PSU");
  Decision d = w.Run();
  EXPECT_EQ(d.action, Action::kRelease);
  EXPECT_EQ(d.journal.OwnerOf("gpua"), Owner::kSlurm);
}

TEST(Engine, LendCancelledWhenDemandVanishes) {
  World w;
  w.journal.nodes["gpua"] = {Owner::kLending, kStepDraining, kNow - kMin, kNow - kMin, 4, 0};
  w.slurm.nodes["gpua"] = Drained("gpua", kOurs);
  w.slurm.nodes["gpua"].state = "mixed";  // still draining a job
  w.kube.unschedulable_gpu_pods = 0;
  w.journal.quiet_streak = 1;
  EXPECT_EQ(w.Run().action, Action::kNone);  // 2 quiet evaluations < 3
  w.journal.quiet_streak = 2;
  Decision d = w.Run();
  EXPECT_EQ(d.action, Action::kCancelLend);
  EXPECT_EQ(d.journal.OwnerOf("gpua"), Owner::kSlurm);
}

TEST(Engine, DrainNotAppliedIsReissuedOrCancelled) {
  World w;
  w.Demand(5, 10);
  w.journal.nodes["gpua"] = {Owner::kLending, kStepDraining, kNow - kMin, kNow - kMin, 4, 0};
  Decision d = w.Run();
  EXPECT_EQ(d.action, Action::kDrain);
  EXPECT_EQ(d.node, "gpua");
  w.slurm.nodes["gpua"].state = "allocated";
  d = w.Run();
  EXPECT_EQ(d.action, Action::kCancelLend);
  EXPECT_EQ(d.code, "lost_to_job");
}

// ---- returning ---------------------------------------------------------------------------------

World LentWorld(TimeMs lent_for, TimeMs last_pod) {
  World w;
  w.journal.nodes["gpua"] = {Owner::kKubernetes, kStepAdmitted, kNow - lent_for, kNow - lent_for, 4,
                             kNow - last_pod};
  w.journal.last_transition = kNow - lent_for;
  w.slurm.nodes["gpua"] = Drained("gpua", kOurs);
  w.kube.nodes["gpua"] = Admitted("gpua");
  return w;
}

TEST(Engine, IdleLentNodeReturnsAfterResidence) {
  World w = LentWorld(40 * kMin, 31 * kMin);
  Decision d = w.Run();
  ASSERT_EQ(d.action, Action::kStartReturn) << d.reason;
  EXPECT_EQ(d.code, "k8s_idle");
  EXPECT_EQ(d.journal.OwnerOf("gpua"), Owner::kReturning);
  // Not yet idle long enough, or too recent: no return.
  EXPECT_EQ(LentWorld(40 * kMin, 29 * kMin).Run().action, Action::kNone);
  World young = LentWorld(10 * kMin, 40 * kMin);
  young.journal.last_transition = kNow - 60 * kMin;
  EXPECT_EQ(young.Run().action, Action::kNone);
  // Pods seen now reset the idle clock.
  World busy = LentWorld(40 * kMin, 31 * kMin);
  busy.kube.nodes["gpua"] = Admitted("gpua", 1);
  d = busy.Run();
  EXPECT_EQ(d.action, Action::kNone);
  EXPECT_EQ(d.journal.nodes.at("gpua").last_pod_seen, kNow);
}

TEST(Engine, KubernetesFloorKeepsLentNode) {
  World w = LentWorld(40 * kMin, 31 * kMin);
  BrokerConfig c = Config();
  c.k8s_min_nodes = 1;
  Decision d = w.Run(c);
  EXPECT_EQ(d.action, Action::kNone);
  EXPECT_EQ(d.code, "k8s_floor");
  // The floor holds the return back, not a lend.
  w.Demand(1, 5);
  d = w.Run(c);
  EXPECT_EQ(d.action, Action::kDrain) << d.reason;
  EXPECT_NE(d.node, "gpua");
}

TEST(Engine, SlurmDemandReturnsABusyLentNode) {
  World w = LentWorld(40 * kMin, 0);
  w.kube.nodes["gpua"] = Admitted("gpua", 2);
  SlurmJob j;
  j.id = "5";
  j.state = "PENDING";
  j.reason = "Resources";
  j.gpus_per_node = 4;
  j.node_count = 3;
  w.slurm.jobs.push_back(j);
  Decision d = w.Run();
  ASSERT_EQ(d.action, Action::kStartReturn);
  EXPECT_EQ(d.code, "slurm_demand");
  // A job that would not fit even with the node back does not pull it.
  w.slurm.jobs[0].node_count = 4;
  EXPECT_EQ(w.Run().action, Action::kNone);
}

// ---- GPU types ---------------------------------------------------------------------------------
// Slurm runs a typed job (gres gpu:h100:4) only on GPUs of that type: an L4 node is no help to it.

SlurmNode Typed(SlurmNode n, const std::string& type) {
  n.gpu_types = {{type, n.gpus}};
  return n;
}

TEST(Engine, AnH100JobDoesNotPullBackALentL4Node) {
  World w = LentWorld(40 * kMin, 0);
  w.kube.nodes["gpua"] = Admitted("gpua", 2);  // busy in Kubernetes: only Slurm demand returns it
  w.slurm.nodes["gpua"] = Typed(Drained("gpua", kOurs), "l4");
  w.slurm.nodes["gpub"] = Typed(w.slurm.nodes["gpub"], "h100");
  w.slurm.nodes["gpuc"] = Typed(w.slurm.nodes["gpuc"], "h100");
  w.slurm.jobs.push_back(PendingJob("7", "h100", 4, 3));  // needs three H100 nodes
  Decision d = w.Run();
  EXPECT_EQ(d.action, Action::kNone) << d.reason;
  // The same job asking for L4 GPUs (1 node x 4) does pull it back once Slurm has none left.
  w.slurm.jobs[0] = PendingJob("8", "l4", 4, 1);
  d = w.Run();
  EXPECT_EQ(d.action, Action::kStartReturn) << d.reason;
  EXPECT_EQ(d.code, "slurm_demand");
  EXPECT_THAT(d.reason, HasSubstr("pending job 8 (4 l4 GPUs) needs gpua"));
  // An untyped job takes any GPU: it counts the L4 node too.
  w.slurm.jobs[0] = PendingJob("9", "", 4, 3);
  EXPECT_EQ(w.Run().action, Action::kStartReturn);
}

TEST(Engine, LendsAnL4NodeWhileAnH100JobWaits) {
  World w;
  w.slurm.nodes["gpua"] = Typed(w.slurm.nodes["gpua"], "h100");
  w.slurm.nodes["gpub"] = Typed(w.slurm.nodes["gpub"], "h100");
  w.slurm.nodes["gpuc"] = Typed(w.slurm.nodes["gpuc"], "l4");
  w.slurm.nodes["gpuc"].last_busy = kNow - 30 * kMin;     // the least idle: picked last by default
  w.slurm.jobs.push_back(PendingJob("7", "h100", 4, 2));  // needs both H100 nodes
  w.Demand(1, 5);
  Decision d = w.Run();
  ASSERT_EQ(d.action, Action::kDrain) << d.reason;
  EXPECT_EQ(d.node, "gpuc");
}

TEST(Engine, MigProfilesAreTypesToo) {
  World w = LentWorld(40 * kMin, 0);
  w.kube.nodes["gpua"] = Admitted("gpua", 2);
  SlurmNode lent = Drained("gpua", kOurs, 14);
  lent.gpu_types = {{"1g.10gb", 14}};
  w.slurm.nodes["gpua"] = lent;
  w.slurm.jobs.push_back(PendingJob("3", "3g.40gb", 2, 1));
  EXPECT_EQ(w.Run().action, Action::kNone);
  w.slurm.jobs[0] = PendingJob("4", "1g.10gb", 2, 1);
  w.slurm.nodes["gpub"] = Typed(w.slurm.nodes["gpub"], "h100");
  w.slurm.nodes["gpuc"] = Typed(w.slurm.nodes["gpuc"], "h100");
  EXPECT_EQ(w.Run().action, Action::kStartReturn);
}

TEST(Engine, ReturnEvictsThenResumesWhenRegistered) {
  World w = LentWorld(40 * kMin, 40 * kMin);
  w.journal.nodes["gpua"].owner = Owner::kReturning;
  w.journal.nodes["gpua"].step = kStepCordoned;
  // Cordon not visible yet → re-issued.
  Decision d = w.Run();
  EXPECT_EQ(d.action, Action::kStartReturn);
  w.kube.nodes["gpua"] = Cordoned("gpua");
  w.kube.nodes["gpua"].non_daemonset_pods = 2;
  w.kube.nodes["gpua"].evictable = {"inference/a", "batch/b"};
  d = w.Run();
  ASSERT_EQ(d.action, Action::kEvict);
  EXPECT_EQ(d.evict, (std::vector<std::string>{"inference/a", "batch/b"}));
  EXPECT_EQ(d.journal.nodes.at("gpua").step, kStepEvicting);
  EXPECT_EQ(d.journal.nodes.at("gpua").step_since, kNow);
  // Blocked by a PDB for a while: evictions retried, the clock kept.
  w.journal = d.journal;
  d = w.Run(Config(), kNow + 5 * kMin);
  EXPECT_EQ(d.action, Action::kEvict);
  EXPECT_EQ(d.journal.nodes.at("gpua").step_since, kNow);
  // Empty, but slurmd lost GPUs → wait.
  w.kube.nodes["gpua"] = Cordoned("gpua");
  w.slurm.nodes["gpua"].gpus = 2;
  d = w.Run();
  EXPECT_EQ(d.action, Action::kNone);
  EXPECT_EQ(d.code, "waiting_slurmd");
  w.slurm.nodes["gpua"].gpus = 4;
  w.slurm.nodes["gpua"].flags.insert("NOT_RESPONDING");
  EXPECT_EQ(w.Run().code, "waiting_slurmd");
  w.slurm.nodes["gpua"].flags.erase("NOT_RESPONDING");
  d = w.Run();
  ASSERT_EQ(d.action, Action::kResume);
  EXPECT_EQ(d.journal.OwnerOf("gpua"), Owner::kSlurm);
  EXPECT_EQ(d.journal.returned_at.at("gpua"), kNow);
}

TEST(Engine, EvictionTimeoutAbortsTheReturn) {
  World w = LentWorld(40 * kMin, 40 * kMin);
  w.journal.nodes["gpua"] = {
      Owner::kReturning, kStepEvicting, kNow - 50 * kMin, kNow - 10 * kMin, 4, 0};
  w.kube.nodes["gpua"] = Cordoned("gpua");
  w.kube.nodes["gpua"].non_daemonset_pods = 1;
  Decision d = w.Run();
  EXPECT_EQ(d.action, Action::kAbortReturn);
  EXPECT_EQ(d.journal.OwnerOf("gpua"), Owner::kKubernetes);
}

TEST(Engine, AdminDrainIsNeverResumed) {
  World w = LentWorld(40 * kMin, 40 * kMin);
  w.journal.nodes["gpua"].owner = Owner::kReturning;
  w.journal.nodes["gpua"].step = kStepEvicting;
  w.kube.nodes["gpua"] = Cordoned("gpua");
  w.slurm.nodes["gpua"].reason = "replace DIMM";
  Decision d = w.Run();
  EXPECT_EQ(d.action, Action::kRelease);
  EXPECT_EQ(d.code, "admin_drain");
  EXPECT_EQ(d.journal.OwnerOf("gpua"), Owner::kSlurm);
}

// ---- hysteresis --------------------------------------------------------------------------------

TEST(Engine, FlappingDemandNeverLends) {
  World w;
  for (int i = 0; i < 20; ++i) {
    w.kube.unschedulable_gpu_pods = (i % 3 == 2) ? 0 : 4;  // two on, one off
    Decision d = w.Run(Config(), kNow + i * kMin);
    EXPECT_EQ(d.action, Action::kNone) << i << ": " << d.reason;
    w.journal = d.journal;
  }
}

TEST(Engine, HostlistExpansion) {
  bool ok = false;
  EXPECT_EQ(ExpandHostlist("gpu[01-03,07],login1", &ok),
            (std::set<std::string>{"gpu01", "gpu02", "gpu03", "gpu07", "login1"}));
  EXPECT_TRUE(ok);
  EXPECT_EQ(ExpandHostlist("", &ok), std::set<std::string>{});
  EXPECT_TRUE(ok);
  EXPECT_TRUE(ExpandHostlist("gpu[3-1]", &ok).empty());
  EXPECT_FALSE(ok);
  EXPECT_TRUE(ExpandHostlist("gpu[1-", &ok).empty());
  EXPECT_FALSE(ok);
}

TEST(Engine, JobFits) {
  SlurmJob j;
  j.gpus_per_node = 4;
  j.node_count = 2;
  EXPECT_TRUE(JobFits(j, {4, 4}));
  EXPECT_FALSE(JobFits(j, {4, 2, 2}));
  SlurmJob total;
  total.gpus_per_job = 6;
  EXPECT_TRUE(JobFits(total, {4, 2}));
  EXPECT_FALSE(JobFits(total, {4, 1}));
}

}  // namespace
}  // namespace gpulet::broker
