// Two real `gpulet broker run` processes contending for one Lease, sharing one journal file, on a
// real Slurm 22.05 and the fake API server: the standby waits while the leader renews (no
// flapping), and when the leader dies the standby takes over from the journal as the leader left
// it, not from the copy it read at start.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <regex>

#include "common/process.h"
#include "tests/broker/broker_support.h"

namespace gpulet::broker_testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

int CountMatches(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// A broker process with its own log.
class BrokerProcess {
 public:
  BrokerProcess(std::string config, std::string log)
      : config_(std::move(config)), log_(std::move(log)) {}
  ~BrokerProcess() { Kill(SIGKILL); }
  Status Start() {
    Result<pid_t> pid =
        SpawnProcess({GpuletBinary(), "broker", "run", "--config", config_}, std::nullopt, log_);
    if (!pid.ok()) return pid.status();
    pid_ = *pid;
    return {};
  }
  void Kill(int sig) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  bool running() const { return pid_ > 0 && ProcessAlive(pid_); }
  std::string Log() const { return slurm_testing::ReadFile(log_); }
  int Decisions(const std::string& code) const {
    return CountMatches(Log(), "event=broker_decision action=none node= reason_code=" + code + " ");
  }
  int Led() const {
    // Decisions taken as leader: every decision line that is not a standby's.
    const std::string log = Log();
    return CountMatches(log, "event=broker_decision") -
           CountMatches(log, "reason_code=not_leader ");
  }

 private:
  std::string config_, log_;
  pid_t pid_ = -1;
};

class BrokerReplicas : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = slurm_testing::ClusterUnavailableReason(); !why.empty()) {
      GPULET_SKIP_OR_FAIL_IN_CI(why);
    }
    ASSERT_EQ(w_.Start(), "");
    const std::string dir = w_.dir_.path();
    slurm_testing::WriteFile(dir + "/kubeconfig",
                             "apiVersion: v1\nkind: Config\ncurrent-context: t\n"
                             "clusters:\n- name: t\n  cluster:\n    server: " +
                                 w_.api_->url() +
                                 "\n    certificate-authority: " + w_.pki_.ca_cert +
                                 "\nusers:\n- name: t\n  user:\n    token: test-token\n"
                                 "contexts:\n- name: t\n  context: {cluster: t, user: t}\n");
    // Lease 3 s, interval 300 ms: the leader renews about ten times per lease.
    slurm_testing::WriteFile(
        dir + "/broker.yaml",
        "slurm:\n  nodes: [gpua, gpub]\n  idleTime: 0s\n  timeout: 10s\n"
        "kubernetes:\n  namespaces: [inference]\n  maxNodes: 1\n"
        "  kubeconfig: " +
            dir +
            "/kubeconfig\n"
            "rules:\n  demandEvaluations: 2\n  minResidence: 0s\n  cooldown: 0s\n"
            "  returnAfterIdle: 1h\n  interval: 300ms\n"
            "journal: " +
            dir +
            "/journal.json\n"
            "lease: {namespace: kube-system, name: gpulet-broker, duration: 3s}\n"
            "metrics: {address: \"127.0.0.1:0\"}\n");
  }
  std::string Config() const { return w_.dir_.path() + "/broker.yaml"; }
  std::string LogPath(const std::string& name) const {
    return w_.dir_.path() + "/" + name + ".log";
  }
  json Lease() const {
    return w_.api_
        ->Object("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/gpulet-broker")
        .value_or(json());
  }
  BrokerWorld w_;
};

TEST_F(BrokerReplicas, StandbyWaitsThenTakesOverFromTheLeadersJournal) {
  BrokerProcess a(Config(), LogPath("a")), b(Config(), LogPath("b"));
  ASSERT_TRUE(a.Start().ok());
  ASSERT_TRUE(WaitFor([&] { return a.Led() >= 1; })) << a.Log();
  // b starts now and reads the journal as it is now: no node lent.
  ASSERT_TRUE(b.Start().ok());
  ASSERT_TRUE(WaitFor([&] { return b.Decisions("not_leader") >= 1; })) << b.Log();

  // a lends a node while b stands by.
  w_.Demand(1);
  std::string lent;
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& [name, e] : w_.DiskJournal().nodes) {
      if (e.owner == Owner::kKubernetes && w_.Admitted(name)) lent = name;  // journal, then act
    }
    return !lent.empty();
  })) << a.Log();
  w_.Demand(0);

  // No flapping: while a runs, b stays standby through many renewals and a never stands down.
  ASSERT_TRUE(WaitFor([&] { return b.Decisions("not_leader") >= 15; })) << b.Log();
  EXPECT_EQ(a.Decisions("not_leader"), 0) << a.Log();
  EXPECT_EQ(b.Led(), 0) << b.Log();
  EXPECT_EQ(Lease()["spec"]["holderIdentity"].get<std::string>().empty(), false);
  EXPECT_EQ(Lease()["spec"].value("leaseTransitions", 0), 0) << Lease().dump();

  // The leader dies without a word. b takes over after the lease runs out on its clock.
  a.Kill(SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return b.Led() >= 5; })) << b.Log();
  EXPECT_THAT(b.Log(), HasSubstr("event=broker_lease_acquired"));
  EXPECT_THAT(b.Log(), HasSubstr("event=broker_journal_reloaded term=1 nodes=1"));
  EXPECT_EQ(Lease()["spec"].value("leaseTransitions", 0), 1) << Lease().dump();
  // b kept a's transition: the node is still Kubernetes' in the journal and in both clusters.
  EXPECT_EQ(w_.DiskJournal().OwnerOf(lent), Owner::kKubernetes);
  EXPECT_TRUE(w_.Admitted(lent));
  EXPECT_TRUE(w_.SlurmDrainedByBroker(lent)) << w_.SlurmLine(lent);
  b.Kill(SIGTERM);
}

}  // namespace
}  // namespace gpulet::broker_testing
