// The Slurm-on-Kubernetes decisions (scaled_engine.h), rule by rule: slurmd StatefulSet pools
// are scaled down only after their highest ordinal's node is drained and idle, and up again when
// Slurm needs the GPUs or Kubernetes no longer uses them.
#include "broker/scaled_engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "broker/engine_test_objects.h"

namespace gpulet::broker {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

using namespace testobjects;

BrokerConfig Config() {
  BrokerConfig c;
  c.namespaces = {"inference"};
  c.slurm_namespace = "slurm";
  c.pools = {{"slurmd-h100", 3, 1, 4, "h100"}, {"slurmd-l4", 2, 0, 2, "l4"}};
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

SlurmNode Busy(SlurmNode n) {
  n.state = "mixed";
  n.alloc_cpus = 8;
  n.gpus_used = 2;
  n.last_busy = kNow;
  return n;
}

SlurmNode WithDrain(SlurmNode n, const std::string& reason) {
  n.flags.insert("DRAIN");
  n.reason = reason;
  return n;
}

// Both pools at full size, every node idle for an hour.
struct World {
  SlurmView slurm;
  KubeView kube;
  Journal journal;
  BrokerConfig config = Config();

  World() {
    slurm.ok = true;
    kube.ok = true;
    for (int i = 0; i < 3; ++i) Put(Idle(PodNodeName("slurmd-h100", i), 60 * kMin, 4, "h100"));
    for (int i = 0; i < 2; ++i) Put(Idle(PodNodeName("slurmd-l4", i), 60 * kMin, 2, "l4"));
    Replicas("slurmd-h100", 3);
    Replicas("slurmd-l4", 2);
  }
  void Put(SlurmNode n) { slurm.nodes[n.name] = std::move(n); }
  void Replicas(const std::string& sts, int r) {
    kube.stateful_sets[sts] = {sts, r, r, "1"};
    // Nodes of pods that no longer exist are gone from Slurm (the entrypoint deletes them).
    for (int i = r; i < 10; ++i) slurm.nodes.erase(PodNodeName(sts, i));
  }
  Decision Eval(TimeMs now = kNow) {
    Decision d = EvaluateScaled(slurm, kube, journal, config, now);
    journal = d.journal;
    return d;
  }
  // Evaluations with demand until one acts (bounded).
  Decision EvalWithDemand(int pods = 2) {
    kube.unschedulable_gpu_pods = pods;
    Decision d;
    for (int i = 0; i < 5; ++i) {
      d = Eval();
      if (d.action != Action::kNone) break;
    }
    return d;
  }
};

TEST(ScaledEngine, UnreadableSlurmOrKubernetesMeansNoAction) {
  World w;
  w.slurm.ok = false;
  w.slurm.error = "sinfo --json: exit 1: slurmctld down";
  Decision d = w.Eval();
  EXPECT_EQ(d.action, Action::kNone);
  EXPECT_EQ(d.code, "unknown_slurm");
  EXPECT_THAT(d.reason, HasSubstr("slurmctld down"));
  World k;
  k.kube.ok = false;
  k.kube.error = "statefulsets: 503";
  EXPECT_EQ(k.Eval().code, "unknown_kubernetes");
}

TEST(ScaledEngine, DemandDrainsTheHighestOrdinalWithAGpuletReasonAfterTheStreak) {
  World w;
  w.kube.unschedulable_gpu_pods = 2;
  EXPECT_EQ(w.Eval().code, "demand_building");
  EXPECT_EQ(w.Eval().code, "demand_building");
  Decision d = w.Eval();
  ASSERT_EQ(d.action, Action::kDrain);
  // The longest idle of the pools' highest ordinals; h100-2 and l4-1 idle alike → first pool.
  EXPECT_EQ(d.node, "slurmd-h100-2");
  EXPECT_EQ(d.stateful_set, "slurmd-h100");
  EXPECT_THAT(d.drain_reason, StartsWith("gpulet: broker scale-down"));
  EXPECT_THAT(d.drain_reason, StartsWith(kScaleDownReasonPrefix));
  EXPECT_EQ(w.journal.OwnerOf("slurmd-h100-2"), Owner::kLending);
  EXPECT_EQ(w.journal.nodes.at("slurmd-h100-2").gpus, 4);
}

// Dynamic nodes (slurmd -Z) carry DYNAMIC (22.05) or DYNAMIC_NORM (23.02+): not a state.
TEST(ScaledEngine, ADynamicNodeFlagDoesNotMakeANodeBusy) {
  for (const char* flag : {"DYNAMIC", "DYNAMIC_NORM"}) {
    World w;
    for (auto& [name, n] : w.slurm.nodes) n.flags.insert(flag);
    Decision d = w.EvalWithDemand();
    ASSERT_EQ(d.action, Action::kDrain) << flag << ": " << d.reason;
    EXPECT_EQ(d.node, "slurmd-h100-2");
    w.Put(WithDrain(w.slurm.nodes.at("slurmd-h100-2"), "gpulet: broker scale-down of x"));
    EXPECT_EQ(w.Eval().action, Action::kScaleDown) << flag;
  }
}

TEST(ScaledEngine, NeverSnatchesABusyHighestOrdinalEvenWhenALowerOneIsIdle) {
  World w;
  w.config.pools.pop_back();  // the H100 pool only
  w.Put(Busy(w.slurm.nodes.at("slurmd-h100-2")));
  Decision d = w.EvalWithDemand();
  EXPECT_EQ(d.action, Action::kNone);
  EXPECT_EQ(d.code, "no_candidate");
  EXPECT_THAT(d.reason, HasSubstr("slurmd-h100-2"));
  EXPECT_TRUE(w.journal.nodes.empty());
}

TEST(ScaledEngine, AnAdminDrainedHighestOrdinalIsLeftAlone) {
  World w;
  w.config.pools.pop_back();
  w.Put(WithDrain(w.slurm.nodes.at("slurmd-h100-2"), "bad DIMM, ticket 123"));
  Decision d = w.EvalWithDemand();
  EXPECT_EQ(d.action, Action::kNone);
  EXPECT_EQ(d.code, "no_candidate");
  EXPECT_THAT(d.reason, HasSubstr("not plainly idle"));
}

TEST(ScaledEngine, ScalesDownOnlyOnceTheDrainedNodeIsIdleThenByExactlyOne) {
  World w;
  ASSERT_EQ(w.EvalWithDemand().node, "slurmd-h100-2");
  // A job still runs on the drained node: wait.
  w.Put(WithDrain(Busy(w.slurm.nodes.at("slurmd-h100-2")), "gpulet: broker scale-down of x"));
  Decision d = w.Eval();
  EXPECT_EQ(d.action, Action::kNone);
  EXPECT_EQ(d.code, "waiting_drain");
  // Finished: drained and idle → 3 → 2 replicas.
  w.Put(WithDrain(Idle("slurmd-h100-2", 0, 4, "h100"), "gpulet: broker scale-down of x"));
  d = w.Eval();
  ASSERT_EQ(d.action, Action::kScaleDown);
  EXPECT_EQ(d.stateful_set, "slurmd-h100");
  EXPECT_EQ(d.replicas_from, 3);
  EXPECT_EQ(d.replicas_to, 2);
  EXPECT_EQ(w.journal.OwnerOf("slurmd-h100-2"), Owner::kKubernetes);
  // Not applied yet: re-issued (idempotent: from 3 to 2 again).
  d = w.Eval();
  EXPECT_EQ(d.action, Action::kScaleDown);
  EXPECT_EQ(d.code, "scale_down_pending");
  // Applied: the pod and its Slurm node are gone; the lend is done.
  w.Replicas("slurmd-h100", 2);
  w.kube.unschedulable_gpu_pods = 0;
  d = w.Eval();
  EXPECT_NE(d.action, Action::kScaleDown);
  EXPECT_EQ(w.journal.nodes.at("slurmd-h100-2").step, kStepAdmitted);
}

TEST(ScaledEngine, ADrainThatIsNotOursDuringTheLendAbandonsItAndStays) {
  World w;
  ASSERT_EQ(w.EvalWithDemand().node, "slurmd-h100-2");
  w.Put(WithDrain(Idle("slurmd-h100-2", 0, 4, "h100"), "maintenance"));
  Decision d = w.Eval();
  EXPECT_EQ(d.action, Action::kRelease);
  EXPECT_EQ(d.code, "admin_drain");
  EXPECT_FALSE(w.journal.nodes.count("slurmd-h100-2"));
  // The pod's own health drain ("gpulet: GPU …") is not the broker's either.
  World h;
  ASSERT_EQ(h.EvalWithDemand().node, "slurmd-h100-2");
  h.Put(WithDrain(Idle("slurmd-h100-2", 0, 4, "h100"), "gpulet: GPU GPU-1 XID 79"));
  EXPECT_EQ(h.Eval().action, Action::kRelease);
}

TEST(ScaledEngine, AJobThatTookTheNodeBeforeTheDrainCancelsTheLend) {
  World w;
  ASSERT_EQ(w.EvalWithDemand().node, "slurmd-h100-2");
  w.Put(Busy(w.slurm.nodes.at("slurmd-h100-2")));  // drain not applied, a job started
  Decision d = w.Eval();
  EXPECT_EQ(d.action, Action::kCancelLend);
  EXPECT_EQ(d.code, "lost_to_job");
}

TEST(ScaledEngine, DemandGoneCancelsTheLendAndResumesOnlyOurDrain) {
  World w;
  ASSERT_EQ(w.EvalWithDemand().node, "slurmd-h100-2");
  w.Put(WithDrain(Busy(w.slurm.nodes.at("slurmd-h100-2")), "gpulet: broker scale-down of x"));
  w.kube.unschedulable_gpu_pods = 0;
  Decision d;
  for (int i = 0; i < 3; ++i) d = w.Eval();
  EXPECT_EQ(d.action, Action::kCancelLend);
  EXPECT_EQ(d.code, "demand_gone");
  EXPECT_FALSE(w.journal.nodes.count("slurmd-h100-2"));
}

TEST(ScaledEngine, ReplicasRaisedBySomeoneElseCancelTheLend) {
  World w;
  ASSERT_EQ(w.EvalWithDemand().node, "slurmd-h100-2");
  w.kube.stateful_sets["slurmd-h100"].replicas = 4;
  Decision d = w.Eval();
  EXPECT_EQ(d.action, Action::kCancelLend);
  EXPECT_EQ(d.code, "replicas_changed");
}

TEST(ScaledEngine, FloorsAndCapsHold) {
  World w;
  w.config.pools = {{"slurmd-h100", 3, 3, 4, "h100"}};
  Decision d = w.EvalWithDemand();
  EXPECT_EQ(d.code, "no_candidate");
  EXPECT_THAT(d.reason, HasSubstr("at its floor of 3"));

  World cap;
  cap.config.k8s_max_nodes = 1;
  cap.Replicas("slurmd-l4", 1);     // one pod lent already (by hand: no journal entry)
  cap.kube.inference_gpu_pods = 1;  // and in use
  d = cap.EvalWithDemand();
  EXPECT_EQ(d.code, "k8s_cap");
}

TEST(ScaledEngine, APendingJobOfThePoolsGpuTypeKeepsItsNodeButNotAnotherTypes) {
  World w;
  // 12 h100 GPUs pending: the h100 pool (3 x 4) is needed whole; the l4 pool is not.
  w.slurm.jobs = {PendingJob("77", "h100", 4, 3)};
  w.Put(Busy(w.slurm.nodes.at("slurmd-h100-0")));  // capacity-bound: it cannot start now
  w.slurm.nodes.at("slurmd-h100-0").state = "mixed";
  w.slurm.jobs[0].reason = "Resources";
  Decision d = w.EvalWithDemand();
  ASSERT_EQ(d.action, Action::kDrain);
  EXPECT_EQ(d.node, "slurmd-l4-1");
}

TEST(ScaledEngine, SlurmDemandOfThePoolsTypeScalesItBackUp) {
  World w;
  w.config.min_residence = 0;
  w.Replicas("slurmd-h100", 2);
  w.Replicas("slurmd-l4", 1);
  w.kube.inference_gpu_pods = 3;  // Kubernetes uses what it borrowed
  w.journal.nodes["slurmd-h100-2"] = {
      Owner::kKubernetes, kStepAdmitted, kNow - kMin, kNow - kMin, 4, kNow};
  w.journal.nodes["slurmd-l4-1"] = {
      Owner::kKubernetes, kStepAdmitted, kNow - 2 * kMin, kNow - 2 * kMin, 2, kNow};
  // A job of 3 x 4 h100 GPUs does not fit in 2 h100 pods; it would with the third.
  w.slurm.jobs = {PendingJob("88", "h100", 4, 3)};
  Decision d = w.Eval();
  ASSERT_EQ(d.action, Action::kScaleUp) << d.reason;
  EXPECT_EQ(d.stateful_set, "slurmd-h100");  // not the l4 pool, lent longer
  EXPECT_EQ(d.replicas_from, 2);
  EXPECT_EQ(d.replicas_to, 3);
  EXPECT_EQ(d.code, "slurm_demand");
  EXPECT_EQ(w.journal.OwnerOf("slurmd-h100-2"), Owner::kReturning);
  // The new pod registers with its GPUs: returned.
  w.Replicas("slurmd-h100", 3);
  w.Put(Idle("slurmd-h100-2", 0, 4, "h100"));
  d = w.Eval();
  EXPECT_EQ(d.action, Action::kRelease);
  EXPECT_EQ(d.code, "returned");
  EXPECT_FALSE(w.journal.nodes.count("slurmd-h100-2"));
}

TEST(ScaledEngine, IdleKubernetesGetsItsBorrowedPodsTakenBackAfterReturnAfterIdle) {
  World w;
  w.Replicas("slurmd-h100", 2);
  w.journal.nodes["slurmd-h100-2"] = {
      Owner::kKubernetes, kStepAdmitted, kNow - 20 * kMin, kNow - 20 * kMin, 4, kNow - 20 * kMin};
  Decision d = w.Eval();
  EXPECT_EQ(d.action, Action::kNone) << "idle for 20m < returnAfterIdle 30m";
  d = w.Eval(kNow + 11 * kMin);
  EXPECT_EQ(d.action, Action::kScaleUp);
  EXPECT_EQ(d.code, "k8s_idle");
  // Not applied yet: re-issued.
  d = w.Eval(kNow + 12 * kMin);
  EXPECT_EQ(d.action, Action::kScaleUp);
  EXPECT_EQ(d.code, "scale_up_pending");
  // The new pod stays Pending (no free GPUs): after evictionTimeout the scale-up is undone.
  w.kube.stateful_sets["slurmd-h100"].replicas = 3;
  d = w.Eval(kNow + 13 * kMin);
  EXPECT_EQ(d.code, "waiting_slurmd");
  d = w.Eval(kNow + 22 * kMin);
  ASSERT_EQ(d.action, Action::kScaleDown);
  EXPECT_EQ(d.code, "return_timeout");
  EXPECT_EQ(d.replicas_from, 3);
  EXPECT_EQ(d.replicas_to, 2);
}

TEST(ScaledEngine, KubernetesFloorKeepsLentPods) {
  World w;
  w.config.k8s_min_nodes = 1;
  w.Replicas("slurmd-h100", 2);
  w.journal.nodes["slurmd-h100-2"] = {
      Owner::kKubernetes, kStepAdmitted, kNow - 60 * kMin, kNow - 60 * kMin, 4, kNow - 60 * kMin};
  Decision d = w.Eval();
  EXPECT_EQ(d.action, Action::kNone);
  EXPECT_EQ(d.code, "k8s_floor");
}

TEST(ScaledEngine, AMissingStatefulSetOrNodeInTransitIsUnknown) {
  World w;
  ASSERT_EQ(w.EvalWithDemand().node, "slurmd-h100-2");
  World gone = w;
  gone.kube.stateful_sets.erase("slurmd-h100");
  EXPECT_EQ(gone.Eval().code, "unknown_statefulset");
  World missing = w;
  missing.slurm.nodes.erase("slurmd-h100-2");
  Decision d = missing.Eval();
  EXPECT_EQ(d.action, Action::kNone);
  EXPECT_EQ(d.code, "unknown_node");
}

TEST(ScaledEngine, CooldownSeparatesTransitions) {
  World w;
  w.config.pools.pop_back();
  ASSERT_EQ(w.EvalWithDemand().action, Action::kDrain);
  w.Put(WithDrain(Idle("slurmd-h100-2", 0, 4, "h100"), "gpulet: broker scale-down of x"));
  ASSERT_EQ(w.Eval().action, Action::kScaleDown);
  w.Replicas("slurmd-h100", 2);
  Decision d = w.Eval();
  EXPECT_EQ(d.code, "cooldown");
}

TEST(ScaledEngine, PodNodeNamesMapBackToTheirPool) {
  const BrokerConfig c = Config();
  int ordinal = -1;
  ASSERT_NE(c.PoolOf("slurmd-h100-12", &ordinal), nullptr);
  EXPECT_EQ(ordinal, 12);
  EXPECT_EQ(c.PoolOf("slurmd-h100-", &ordinal), nullptr);
  EXPECT_EQ(c.PoolOf("slurmd-h100-01", &ordinal), nullptr);
  EXPECT_EQ(c.PoolOf("slurmd-h100-x", &ordinal), nullptr);
  EXPECT_EQ(c.PoolOf("gpua", &ordinal), nullptr);
}

}  // namespace
}  // namespace gpulet::broker
