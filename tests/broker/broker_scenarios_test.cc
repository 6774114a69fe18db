// The broker's scenarios against a real Slurm 22.05 on loopback and the fake Kubernetes API
// server: each test starts its own small cluster (about 3 s) so tests stay independent and
// parallel-safe.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>

#include "tests/broker/broker_support.h"

namespace gpulet::broker_testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class BrokerScenario : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = slurm_testing::ClusterUnavailableReason(); !why.empty()) {
      GPULET_SKIP_OR_FAIL_IN_CI(why);
    }
    ASSERT_EQ(w_.Start(), "");
  }
  BrokerWorld w_;
};

TEST_F(BrokerScenario, LendsAnIdleNodeOnlyAfterAFreshReadShowsItDrained) {
  Broker& b = w_.NewBroker();
  w_.Demand(2);
  Decision first = b.Tick(NowMs());
  EXPECT_EQ(first.action, Action::kNone);
  EXPECT_EQ(first.code, "demand_building");
  Decision drain = b.Tick(NowMs());
  ASSERT_EQ(drain.action, Action::kDrain) << drain.reason;
  const std::string node = drain.node;
  // Slurm has it drained with our reason; Kubernetes does not have it yet.
  EXPECT_TRUE(w_.SlurmDrainedByBroker(node)) << w_.SlurmLine(node);
  EXPECT_THAT(w_.SlurmLine(node), Not(HasSubstr("DOWN")));
  EXPECT_TRUE(w_.CordonedAndTainted(node));
  EXPECT_EQ(w_.DiskJournal().OwnerOf(node), Owner::kLending);
  Decision admit = b.Tick(NowMs());
  ASSERT_EQ(admit.action, Action::kAdmit) << admit.reason;
  EXPECT_TRUE(w_.Admitted(node));
  EXPECT_EQ(w_.DiskJournal().OwnerOf(node), Owner::kKubernetes);
  // The other node stays with Slurm and schedulable there.
  const std::string other = node == "gpua" ? "gpub" : "gpua";
  EXPECT_TRUE(w_.CordonedAndTainted(other));
  EXPECT_THAT(w_.SlurmLine(other), Not(HasSubstr("DRAIN")));
}

TEST_F(BrokerScenario, NoLendWhileTheOnlyCandidateRunsAJobOrIsPlannedForOne) {
  w_.config_.nodes = {"gpua"};
  Broker& b = w_.NewBroker();
  std::string err;
  std::string job = w_.cluster_.Submit("-w gpua --gres=gpu:h100:1", "sleep 300", &err);
  ASSERT_NE(job, "") << err;
  ASSERT_TRUE(w_.cluster_.WaitJobState(job, "RUNNING"));
  w_.Demand(3);
  for (int i = 0; i < 4; ++i) {
    Decision d = b.Tick(NowMs());
    EXPECT_EQ(d.action, Action::kNone) << d.reason;
    if (i >= 1) {
      EXPECT_THAT(d.reason, HasSubstr("gpua: not plainly idle"));
    }
  }
  w_.cluster_.Sh("scancel " + job);
  ASSERT_TRUE(
      WaitFor([&] { return w_.SlurmLine("gpua").find("State=IDLE ") != std::string::npos; }));
  // A pending job that names gpua (held back by its begin time) plans the node.
  std::string planned =
      w_.cluster_.Submit("-w gpua --begin=now+3600 --gres=gpu:h100:1", "true", &err);
  ASSERT_NE(planned, "") << err;
  for (int i = 0; i < 3; ++i) {
    Decision d = b.Tick(NowMs());
    EXPECT_EQ(d.action, Action::kNone) << d.reason;
    EXPECT_THAT(d.reason, HasSubstr("named by pending job " + planned));
  }
  EXPECT_THAT(w_.SlurmLine("gpua"), Not(HasSubstr("DRAIN")));
  EXPECT_TRUE(w_.CordonedAndTainted("gpua"));
  // Once the plan is gone the node is lent.
  w_.cluster_.Sh("scancel " + planned);
  auto seen = w_.TickUntil([](const Decision& d) { return d.action == Action::kDrain; }, 20);
  EXPECT_EQ(seen.back().action, Action::kDrain);
}

TEST_F(BrokerScenario, ReservationWithinLookaheadBlocksTheLend) {
  w_.config_.nodes = {"gpub"};
  Broker& b = w_.NewBroker();
  CommandResult r = w_.cluster_.Sh(
      "scontrol create reservation reservationname=maint starttime=now+600 duration=60 "
      "nodes=gpub users=root flags=ignore_jobs");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  w_.Demand(1);
  for (int i = 0; i < 3; ++i) {
    Decision d = b.Tick(NowMs());
    EXPECT_EQ(d.action, Action::kNone) << d.reason;
  }
  EXPECT_THAT(b.Tick(NowMs()).reason, HasSubstr("claimed by reservation maint"));
}

// A job lands on the node between the broker's read and its drain: the drain then waits for the
// job, and Kubernetes gets the node only when Slurm shows it drained.
TEST_F(BrokerScenario, DrainWaitsForARunningJobToFinish) {
  w_.config_.nodes = {"gpua"};
  Broker& b = w_.NewBroker();
  std::string job;
  w_.runner_->trigger = "State=DRAIN";
  w_.runner_->hook = [&] {
    job = w_.cluster_.Submit("-w gpua --gres=gpu:h100:1", "sleep 4");
    w_.cluster_.WaitJobState(job, "RUNNING");
  };
  w_.Demand(1);
  auto seen = w_.TickUntil([](const Decision& d) { return d.action == Action::kDrain; }, 5);
  ASSERT_EQ(seen.back().action, Action::kDrain);
  ASSERT_NE(job, "");
  Decision waiting = b.Tick(NowMs());
  EXPECT_EQ(waiting.code, "waiting_drain") << waiting.reason;
  EXPECT_TRUE(w_.CordonedAndTainted("gpua"));
  EXPECT_EQ(w_.cluster_.JobState(job), "RUNNING");
  bool exposed_early = false;  // Kubernetes saw the node before Slurm had it drained
  seen = w_.TickUntil(
      [&](const Decision& d) {
        if (d.action != Action::kAdmit && !w_.CordonedAndTainted("gpua")) exposed_early = true;
        return d.action == Action::kAdmit;
      },
      200);
  ASSERT_EQ(seen.back().action, Action::kAdmit);
  EXPECT_FALSE(exposed_early);
  EXPECT_EQ(w_.cluster_.JobState(job), "COMPLETED");  // never killed
  EXPECT_TRUE(w_.Admitted("gpua"));
}

TEST_F(BrokerScenario, LendIsCancelledWhenDemandVanishes) {
  w_.config_.nodes = {"gpua"};
  Broker& b = w_.NewBroker();
  std::string job;
  w_.runner_->trigger = "State=DRAIN";
  w_.runner_->hook = [&] {
    job = w_.cluster_.Submit("-w gpua --gres=gpu:h100:1", "sleep 300");
    w_.cluster_.WaitJobState(job, "RUNNING");
  };
  w_.Demand(1);
  auto seen = w_.TickUntil([](const Decision& d) { return d.action == Action::kDrain; }, 5);
  ASSERT_EQ(seen.back().action, Action::kDrain);
  EXPECT_THAT(w_.SlurmLine("gpua"), HasSubstr("DRAIN"));
  w_.Demand(0);
  seen = w_.TickUntil([](const Decision& d) { return d.action == Action::kCancelLend; }, 5);
  ASSERT_EQ(seen.back().action, Action::kCancelLend);
  EXPECT_THAT(w_.SlurmLine("gpua"), Not(HasSubstr("DRAIN")));
  EXPECT_EQ(w_.cluster_.JobState(job), "RUNNING");
  EXPECT_EQ(w_.DiskJournal().OwnerOf("gpua"), Owner::kSlurm);
  EXPECT_TRUE(w_.CordonedAndTainted("gpua"));
  (void)b;
}

TEST_F(BrokerScenario, ReturnEvictsPodsWaitsForThePdbAndResumes) {
  w_.LendOnly("gpub");
  // A serving pod (PDB: no disruption allowed yet) and a DaemonSet pod on the lent node.
  w_.api_->Put("/api/v1/namespaces/batch/pods/cache", RunningPod("batch", "cache", "gpub"));
  w_.api_->Put("/api/v1/namespaces/kube-system/pods/agent",
               RunningPod("kube-system", "agent", "gpub", true));
  w_.api_->Put("/apis/policy/v1/namespaces/batch/poddisruptionbudgets/cache",
               Pdb("batch", "cache", "cache", 0));
  auto seen = w_.TickUntil([](const Decision& d) { return d.action == Action::kEvict; }, 10);
  ASSERT_EQ(seen.back().action, Action::kEvict);
  EXPECT_TRUE(w_.CordonedAndTainted("gpub"));
  EXPECT_EQ(w_.K8sNode("gpub")["metadata"]["labels"].count("gpulet.io/pool"), 0u);
  // Blocked for a while: retried, the node stays drained in Slurm.
  for (int i = 0; i < 3; ++i) {
    Decision d = w_.broker_->Tick(NowMs());
    EXPECT_EQ(d.action, Action::kEvict);
    EXPECT_TRUE(w_.api_->Object("/api/v1/namespaces/batch/pods/cache").has_value());
    EXPECT_TRUE(w_.SlurmDrainedByBroker("gpub"));
  }
  w_.api_->Put("/apis/policy/v1/namespaces/batch/poddisruptionbudgets/cache",
               Pdb("batch", "cache", "cache", 1));
  seen = w_.TickUntil([](const Decision& d) { return d.action == Action::kResume; }, 20);
  ASSERT_EQ(seen.back().action, Action::kResume) << seen.back().reason;
  EXPECT_FALSE(w_.api_->Object("/api/v1/namespaces/batch/pods/cache").has_value());
  EXPECT_TRUE(w_.api_->Object("/api/v1/namespaces/kube-system/pods/agent").has_value());
  EXPECT_THAT(w_.SlurmLine("gpub"), Not(HasSubstr("DRAIN")));
  EXPECT_EQ(w_.DiskJournal().OwnerOf("gpub"), Owner::kSlurm);
  // Slurm can use it again.
  std::string err;
  std::string job = w_.cluster_.Submit("-w gpub --gres=gpu:l4:2", "true", &err);
  ASSERT_NE(job, "") << err;
  EXPECT_EQ(w_.cluster_.WaitOutput(job), "");
  EXPECT_EQ(w_.cluster_.JobState(job), "COMPLETED");
}

TEST_F(BrokerScenario, SlurmDemandTakesALentNodeBack) {
  w_.LendOnly("gpua");
  w_.config_.return_after_idle = 3600 * 1000;  // idleness alone would not return it
  w_.api_->Put("/api/v1/namespaces/inference/pods/server",
               RunningPod("inference", "server", "gpua"));
  for (int i = 0; i < 2; ++i) EXPECT_EQ(w_.broker_->Tick(NowMs()).action, Action::kNone);
  // A training job that needs 4 H100s can only run on gpua.
  std::string err;
  std::string job = w_.cluster_.Submit("--gres=gpu:h100:4", "true", &err);
  ASSERT_NE(job, "") << err;
  auto seen = w_.TickUntil([](const Decision& d) { return d.action == Action::kResume; }, 40);
  ASSERT_EQ(seen.back().action, Action::kResume) << seen.back().reason;
  bool slurm_demand = false;
  for (const Decision& d : seen) slurm_demand |= d.code == "slurm_demand";
  EXPECT_TRUE(slurm_demand);
  EXPECT_EQ(w_.cluster_.WaitOutput(job), "");
  EXPECT_EQ(w_.cluster_.JobState(job), "COMPLETED");
}

TEST_F(BrokerScenario, AnAdminDrainIsNeverUndone) {
  w_.LendOnly("gpub");
  // The admin takes the node for repairs while it is lent.
  CommandResult r =
      w_.cluster_.Sh("scontrol update nodename=gpub state=drain reason=\"replace DIMM\"");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto seen = w_.TickUntil([](const Decision& d) { return d.action == Action::kRelease; }, 20);
  ASSERT_EQ(seen.back().action, Action::kRelease) << seen.back().reason;
  EXPECT_EQ(seen.back().code, "admin_drain");
  EXPECT_THAT(w_.SlurmLine("gpub"), HasSubstr("Reason=replace DIMM"));
  EXPECT_THAT(w_.SlurmLine("gpub"), HasSubstr("DRAIN"));
  // And it is no candidate for a new lend either.
  w_.Demand(2);
  for (int i = 0; i < 4; ++i) {
    Decision d = w_.broker_->Tick(NowMs());
    EXPECT_EQ(d.action, Action::kNone) << d.reason;
  }
  EXPECT_THAT(w_.SlurmLine("gpub"), HasSubstr("Reason=replace DIMM"));
}

TEST_F(BrokerScenario, SlurmControllerUnreachableMeansNoAction) {
  w_.Demand(3);
  w_.config_.command_timeout = 3000;
  Broker& b = w_.NewBroker();
  EXPECT_EQ(b.Tick(NowMs()).code, "demand_building");
  // Stop slurmctld (the first pid the cluster script recorded).
  std::string pid = slurm_testing::ReadFile(w_.cluster_.dir() + "/pids");
  pid = pid.substr(0, pid.find('\n'));
  ASSERT_FALSE(pid.empty());
  ASSERT_EQ(kill(std::stoi(pid), SIGKILL), 0);
  const json before_a = w_.K8sNode("gpua"), before_b = w_.K8sNode("gpub");
  for (int i = 0; i < 3; ++i) {
    Decision d = b.Tick(NowMs());
    EXPECT_EQ(d.action, Action::kNone);
    EXPECT_EQ(d.code, "unknown_slurm") << d.reason;
  }
  EXPECT_EQ(w_.K8sNode("gpua")["spec"], before_a["spec"]);
  EXPECT_EQ(w_.K8sNode("gpub")["spec"], before_b["spec"]);
  EXPECT_TRUE(w_.DiskJournal().nodes.empty());
  EXPECT_THAT(b.metrics().Prometheus(), HasSubstr("gpulet_broker_errors_total{side=\"slurm\"} 3"));
}

TEST_F(BrokerScenario, FlappingDemandFlapsNoNode) {
  w_.config_.demand_evaluations = 3;
  Broker& b = w_.NewBroker();
  for (int i = 0; i < 12; ++i) {
    w_.Demand(i % 3 == 2 ? 0 : 2);  // on, on, off, …
    Decision d = b.Tick(NowMs());
    EXPECT_EQ(d.action, Action::kNone) << i << ": " << d.reason;
  }
  EXPECT_THAT(w_.SlurmLine("gpua"), Not(HasSubstr("DRAIN")));
  EXPECT_THAT(w_.SlurmLine("gpub"), Not(HasSubstr("DRAIN")));
}

// The real binary: killed (SIGKILL) while a return waits on a PDB, restarted, it resumes the
// return from its journal instead of starting over or forgetting it.
TEST_F(BrokerScenario, BrokerKilledMidTransitionResumesFromTheJournal) {
  w_.LendOnly("gpub");
  w_.broker_.reset();
  w_.api_->Put("/api/v1/namespaces/batch/pods/cache", RunningPod("batch", "cache", "gpub"));
  w_.api_->Put("/apis/policy/v1/namespaces/batch/poddisruptionbudgets/cache",
               Pdb("batch", "cache", "cache", 0));
  const std::string dir = w_.dir_.path();
  std::ofstream(dir + "/kubeconfig")
      << "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n"
         "  cluster:\n    server: "
      << w_.api_->url() << "\n    certificate-authority: " << w_.pki_.ca_cert
      << "\nusers:\n- name: u\n  user:\n    token: test-token\n"
         "contexts:\n- name: x\n  context: {cluster: c, user: u}\n"
         "current-context: x\n";
  std::ofstream(dir + "/broker.yaml")
      << "slurm:\n  nodes: [gpub]\n  idleTime: 0s\nkubernetes:\n  namespaces: [inference]\n"
         "  maxNodes: 1\n  kubeconfig: "
      << dir
      << "/kubeconfig\nrules:\n  demandEvaluations: 2\n  minResidence: 0s\n"
         "  cooldown: 0s\n  returnAfterIdle: 0s\n  evictionTimeout: 1h\n  interval: 200ms\n"
         "journal: "
      << w_.config_.journal_path << "\nmetrics: {address: \"127.0.0.1:0\"}\n";
  auto start = [&] {
    return RunCommand("export SLURM_CONF=" + w_.cluster_.conf() + "; " + GpuletBinary() +
                      " broker run --config " + dir + "/broker.yaml >>" + dir +
                      "/broker.log 2>&1 & echo $!")
        .output;
  };
  std::string pid = start();
  ASSERT_TRUE(WaitFor(
      [&] {
        auto j = w_.DiskJournal();
        return j.OwnerOf("gpub") == Owner::kReturning && j.nodes.at("gpub").step == kStepEvicting;
      },
      std::chrono::seconds(30)))
      << slurm_testing::ReadFile(dir + "/broker.log");
  const TimeMs evicting_since = w_.DiskJournal().nodes.at("gpub").step_since;
  ASSERT_EQ(kill(std::stoi(pid), SIGKILL), 0);
  EXPECT_TRUE(w_.SlurmDrainedByBroker("gpub"));
  EXPECT_TRUE(w_.CordonedAndTainted("gpub"));
  // Restarted: it carries on with the same return (same eviction clock) and finishes it.
  pid = start();
  CommandResult status =
      RunCommand(GpuletBinary() + " broker status --config " + dir + "/broker.yaml");
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_THAT(status.output, HasSubstr("gpub\treturning\tevicting"));
  // Three evaluations of the restarted broker, each blocked by the PDB: the eviction clock stays.
  auto evictions = [&] {
    const std::string log = slurm_testing::ReadFile(dir + "/broker.log");
    int n = 0;
    for (size_t at = log.find("event=broker_evict "); at != std::string::npos;
         at = log.find("event=broker_evict ", at + 1)) {
      ++n;
    }
    return n;
  };
  const int before = evictions();
  ASSERT_TRUE(WaitFor([&] { return evictions() >= before + 3; }, std::chrono::seconds(30)))
      << slurm_testing::ReadFile(dir + "/broker.log");
  EXPECT_EQ(w_.DiskJournal().nodes.at("gpub").step_since, evicting_since);
  w_.api_->Put("/apis/policy/v1/namespaces/batch/poddisruptionbudgets/cache",
               Pdb("batch", "cache", "cache", 1));
  EXPECT_TRUE(WaitFor([&] { return w_.SlurmLine("gpub").find("DRAIN") == std::string::npos; },
                      std::chrono::seconds(30)))
      << slurm_testing::ReadFile(dir + "/broker.log");
  EXPECT_EQ(w_.DiskJournal().OwnerOf("gpub"), Owner::kSlurm);
  // The decision is logged once scontrol has returned, which may be after the node shows it.
  EXPECT_TRUE(WaitFor([&] {
    return slurm_testing::ReadFile(dir + "/broker.log")
               .find("event=broker_decision action=resume node=gpub") != std::string::npos;
  })) << slurm_testing::ReadFile(dir + "/broker.log");
  kill(std::stoi(pid), SIGTERM);
  std::string log = slurm_testing::ReadFile(dir + "/broker.log");
  EXPECT_THAT(log, HasSubstr("event=broker_resume node=gpub owner=returning step=evicting"));
}

}  // namespace
}  // namespace gpulet::broker_testing
