// A simulated day (compressed: one evaluation = one simulated minute): a scripted inference
// demand curve with two peaks and a training queue on the real Slurm, with a stand-in for the
// Kubernetes scheduler that binds pending pods to lent nodes. Every decision is checked against
// the rules: cooldown between transition starts, one node in transit, the cap, residence, no
// node handed over with a job on it, no training job killed, and everything back in Slurm at the
// end of the day.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/broker/broker_support.h"

namespace gpulet::broker_testing {
namespace {

constexpr TimeMs kMinute = 60 * 1000;

// Inference pods wanted at minute m: a morning peak and a smaller evening one.
int DemandAt(int m) {
  if (m >= 10 && m < 40) return 3;
  if (m >= 70 && m < 85) return 1;
  return 0;
}

TEST(BrokerDay, DecisionsFollowTheRules) {
  if (std::string why = slurm_testing::ClusterUnavailableReason(); !why.empty()) {
    GPULET_SKIP_OR_FAIL_IN_CI(why);
  }
  BrokerWorld w;
  ASSERT_EQ(w.Start(), "");
  w.config_.demand_evaluations = 3;
  w.config_.cooldown = 5 * kMinute;
  w.config_.min_residence = 10 * kMinute;
  w.config_.return_after_idle = 15 * kMinute;
  w.config_.k8s_max_nodes = 1;
  w.config_.slurm_min_nodes = 1;
  Broker& b = w.NewBroker();

  const TimeMs start = NowMs();
  std::vector<std::string> jobs;
  std::map<std::string, TimeMs> admitted_at;
  TimeMs last_transition = 0;
  int demand_run = 0, lends = 0, returns = 0;
  int running = 0;  // inference pods bound to lent nodes
  const int kMinutes = 150;
  for (int m = 0; m < kMinutes; ++m) {
    const TimeMs now = start + m * kMinute;
    // The training queue: a 4-GPU job (only gpua fits it) at minutes 20, 50 and 100.
    if (m == 20 || m == 50 || m == 100) {
      std::string err;
      std::string id = w.cluster_.Submit("--gres=gpu:h100:4", "sleep 1", &err);
      ASSERT_NE(id, "") << err;
      jobs.push_back(id);
    }
    // The scheduler stand-in: bind pending pods to admitted nodes (two per node), drop pods
    // beyond the curve.
    const int want = DemandAt(m);
    std::vector<std::string> lent;
    for (const auto& [name, e] : b.journal().nodes) {
      if (e.owner == Owner::kKubernetes && w.Admitted(name)) lent.push_back(name);
    }
    while (running > want) {
      --running;
      w.api_->Delete("/api/v1/namespaces/inference/pods/run-" + std::to_string(running));
    }
    while (running < want && running < 2 * static_cast<int>(lent.size())) {
      const std::string name = "run-" + std::to_string(running);
      w.api_->Put("/api/v1/namespaces/inference/pods/" + name,
                  RunningPod("inference", name, lent[running / 2]));
      ++running;
    }
    w.Demand(want - running);
    demand_run = want - running > 0 ? demand_run + 1 : 0;

    Decision d = b.Tick(now);
    const Journal& j = b.journal();
    SCOPED_TRACE("minute " + std::to_string(m) + ": " + ActionName(d.action) + " " + d.node + " (" +
                 d.reason + ")");
    EXPECT_LE(j.InTransit(), 1);
    EXPECT_LE(j.Lent(), w.config_.k8s_max_nodes);
    EXPECT_NE(d.code, "unknown_slurm");
    EXPECT_NE(d.code, "unknown_kubernetes");
    switch (d.action) {
      case Action::kDrain:
        ++lends;
        EXPECT_GE(demand_run, w.config_.demand_evaluations);
        if (last_transition > 0) {
          EXPECT_GE(now - last_transition, w.config_.cooldown);
        }
        last_transition = now;
        break;
      case Action::kStartReturn:
        ++returns;
        if (last_transition > 0) {
          EXPECT_GE(now - last_transition, w.config_.cooldown);
        }
        EXPECT_GE(now - admitted_at[d.node], w.config_.min_residence);
        last_transition = now;
        break;
      case Action::kAdmit:
        EXPECT_THAT(w.SlurmLine(d.node), ::testing::HasSubstr("CPUAlloc=0 "));
        admitted_at[d.node] = now;
        last_transition = now;
        break;
      case Action::kResume:
      case Action::kCancelLend:
      case Action::kAbortReturn:
      case Action::kRelease:
        last_transition = now;
        break;
      default:
        break;
    }
    // Jobs take real seconds: give them some time to move.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_GE(lends, 2);
  EXPECT_GE(returns, 2);
  EXPECT_TRUE(b.journal().nodes.empty()) << JournalToJson(b.journal());
  EXPECT_THAT(w.SlurmLine("gpua"), ::testing::Not(::testing::HasSubstr("DRAIN")));
  EXPECT_THAT(w.SlurmLine("gpub"), ::testing::Not(::testing::HasSubstr("DRAIN")));
  for (const std::string& id : jobs) {
    w.cluster_.WaitOutput(id);
    EXPECT_EQ(w.cluster_.JobState(id), "COMPLETED") << id;
  }
}

}  // namespace
}  // namespace gpulet::broker_testing
