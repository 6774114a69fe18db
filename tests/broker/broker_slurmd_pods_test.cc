// The broker's Slurm-on-Kubernetes mode against a real Slurm 22.05 with dynamic nodes
// (tests/slurm/slurm_pod_cluster.sh): two "pods" of the StatefulSet slurmd-h100 are
// `gpulet slurm pod` processes in network namespaces of their own, each given 4 of a simulated
// DGX H100's GPUs; the fake API server holds the StatefulSet and the inference pods, and the test
// plays the StatefulSet controller (a lowered replica count terminates the highest ordinal's pod,
// a raised one starts it). Root and Slurm as for tests/slurm.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "apiserver/fake_apiserver.h"
#include "apiserver/test_objects.h"
#include "broker/broker.h"
#include "broker/journal.h"
#include "broker/scaled_engine.h"
#include "common/process.h"
#include "tests/slurm/slurm_test_support.h"

extern char** environ;

namespace gpulet::broker_testing {
namespace {

using namespace gpulet::broker;  // NOLINT(google-build-using-namespace): test
using gpulet::testing::CommandResult;
using gpulet::testing::GpuletBinary;
using gpulet::testing::RunCommand;
using nlohmann::json;
using slurm_testing::Cluster;
using slurm_testing::ReadFile;
using slurm_testing::TempDir;
using slurm_testing::WaitFor;
using slurm_testing::WriteFile;
using ::testing::HasSubstr;

const std::string kSts = "/apis/apps/v1/namespaces/slurm/statefulsets/slurmd-h100";

json GpuPod(bool bound) {
  return gpulet::testing::GpuPodObject("llm", "inference", 4, bound ? "k8s-gpu-1" : "");
}

class SlurmdPodsBroker : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = slurm_testing::ClusterUnavailableReason(); !why.empty()) {
      GPULET_SKIP_OR_FAIL_IN_CI(why);
    }
    if (access("/usr/bin/nsenter", X_OK) != 0) {
      GPULET_SKIP_OR_FAIL_IN_CI("nsenter (util-linux) is needed");
    }
    ASSERT_EQ(cluster_.Start(), "") << "cluster did not start";
    setenv("SLURM_CONF", cluster_.conf().c_str(), 1);
    Result<gpulet::testing::TestPki> pki = gpulet::testing::MakeTestPki(dir_.path());
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    auto api = gpulet::testing::FakeApiServer::Start(*pki, {});
    ASSERT_TRUE(api.ok()) << api.status().message();
    api_ = std::move(*api);
    k8s::ClusterAccess access = api_->Access(*pki);
    client_ = std::make_unique<k8s::Client>(access);
    api_->Put(kSts, {{"apiVersion", "apps/v1"},
                     {"kind", "StatefulSet"},
                     {"metadata", {{"name", "slurmd-h100"}, {"namespace", "slurm"}}},
                     {"spec", {{"replicas", 2}, {"serviceName", "slurmd"}}}});

    config_.namespaces = {"inference"};
    config_.slurm_namespace = "slurm";
    config_.pools = {{"slurmd-h100", 2, 0, 4, "h100"}};
    config_.k8s_max_nodes = 1;
    config_.idle_time = 0;
    config_.demand_evaluations = 1;
    config_.min_residence = 0;
    config_.cooldown = 0;
    config_.return_after_idle = 0;
    config_.eviction_timeout = 3600 * 1000;
    config_.command_timeout = 10 * 1000;
    config_.journal_path = dir_.path() + "/journal.json";
    kube_ = std::make_unique<KubeSide>(*client_, config_);
    slurm_ = std::make_unique<SlurmSide>(std::make_shared<slurm::ProcessRunner>(), config_);
    broker_ = std::make_unique<Broker>(config_, *slurm_, *kube_, BrokerOptions{});
    ASSERT_TRUE(broker_->Start().ok());
  }
  void TearDown() override {
    for (int i = 0; i < 2; ++i) Kill(i);
  }

  // Starts the pod of ordinal `i` (GPUs 4i..4i+3 of the simulated DGX H100).
  void StartPod(int i) {
    const std::string name = PodNodeName("slurmd-h100", i);
    if (netns_[i].empty()) {
      CommandResult ns =
          RunCommand(slurm_testing::SourceDir() + "/tests/slurm/slurm_pod_cluster.sh pod " +
                     cluster_.dir() + " " + name);
      ASSERT_EQ(ns.exit_code, 0) << ns.output;
      netns_[i] = ns.output.substr(0, ns.output.find('\n'));
    }
    const std::string dir = cluster_.dir() + "/" + name;
    std::filesystem::create_directories(dir + "/etc");
    WriteFile(dir + "/labels",
              "slurm.gpulet.io/partition=\"gpu\"\nslurm.gpulet.io/features=\"h100\"\n");
    std::string gpus;
    for (int g = 4 * i; g < 4 * i + 4; ++g) gpus += (gpus.empty() ? "" : ",") + std::to_string(g);
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e;
      if (kv.rfind("POD_NAME=", 0) == 0 || kv.rfind("KUBERNETES_SERVICE_HOST=", 0) == 0) continue;
      env.push_back(kv);
    }
    env.push_back("NVIDIA_VISIBLE_DEVICES=" + gpus);
    env.push_back("GPULET_SIM_VISIBLE_DEVICES=" + gpus);
    Result<pid_t> pid = SpawnProcess({"/usr/bin/nsenter",
                                      "--net=/run/netns/" + netns_[i],
                                      GpuletBinary(),
                                      "--simulate",
                                      "dgx-h100",
                                      "--sim-state",
                                      cluster_.dir() + "/sim",
                                      "slurm",
                                      "pod",
                                      "--node-name",
                                      name,
                                      "--slurm-conf",
                                      cluster_.conf(),
                                      "--conf-dir",
                                      dir + "/etc",
                                      "--dev-root",
                                      dir,
                                      "--pod-labels-file",
                                      dir + "/labels",
                                      "--poll-interval",
                                      "300ms",
                                      "--slurmd-log",
                                      dir + "/slurmd.out"},
                                     env, dir + "/pod.log");
    ASSERT_TRUE(pid.ok()) << pid.status().message();
    pid_[i] = *pid;
  }
  // SIGTERM, as the StatefulSet controller deletes the pod; its exit code (-1: still running).
  int TerminatePod(int i) {
    kill(pid_[i], SIGTERM);
    int st = 0;
    const bool exited = WaitFor([&] { return waitpid(pid_[i], &st, WNOHANG) == pid_[i]; });
    pid_[i] = -1;
    return exited && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  void Kill(int i) {
    if (pid_[i] > 0) StopProcess(pid_[i], std::chrono::seconds(5));
    pid_[i] = -1;
  }
  bool Idle(const std::string& node) const {
    const std::string line = cluster_.NodeLine(node);
    return line.find("State=IDLE") != std::string::npos && line.find("DRAIN") == std::string::npos;
  }
  std::string PodLog(int i) const {
    return ReadFile(cluster_.dir() + "/" + PodNodeName("slurmd-h100", i) + "/pod.log");
  }
  int Replicas() const { return api_->Object(kSts).value_or(json())["spec"].value("replicas", -1); }
  Decision Tick() { return broker_->Tick(NowMs()); }
  // Ticks until a decision with `action` (bounded); that decision, or the last one.
  Decision TickUntil(Action action) {
    Decision d;
    WaitFor([&] {
      d = Tick();
      return d.action == action;
    });
    return d;
  }

  Cluster cluster_{"slurm_pod_cluster.sh"};
  TempDir dir_;
  std::unique_ptr<gpulet::testing::FakeApiServer> api_;
  std::unique_ptr<k8s::Client> client_;
  BrokerConfig config_;
  std::unique_ptr<KubeSide> kube_;
  std::unique_ptr<SlurmSide> slurm_;
  std::unique_ptr<Broker> broker_;
  std::string netns_[2];
  pid_t pid_[2] = {-1, -1};
};

TEST_F(SlurmdPodsBroker, ScalesThePoolDownOnlyAfterItsHighestOrdinalDrainedAndBackUp) {
  StartPod(0);
  StartPod(1);
  ASSERT_TRUE(WaitFor([&] { return Idle("slurmd-h100-0") && Idle("slurmd-h100-1"); }))
      << PodLog(0) << PodLog(1) << cluster_.NodeLine("slurmd-h100-1");

  // A job runs on the highest ordinal: demand or not, it is not taken, though ordinal 0 is idle.
  std::string err;
  const std::string job = cluster_.Submit("-w slurmd-h100-1 --gres=gpu:h100:1", "sleep 300", &err);
  ASSERT_NE(job, "") << err;
  ASSERT_TRUE(cluster_.WaitJobState(job, "RUNNING"));
  api_->Put("/api/v1/namespaces/inference/pods/llm", GpuPod(false));
  Decision d = Tick();
  EXPECT_EQ(d.action, Action::kNone);
  EXPECT_EQ(d.code, "no_candidate") << d.reason;
  EXPECT_THAT(cluster_.NodeLine("slurmd-h100-1"), ::testing::Not(HasSubstr("DRAIN")));

  // The job ends: the node is drained with the broker's reason, then the pool shrinks by one.
  cluster_.Sh("scancel " + job);
  ASSERT_TRUE(WaitFor([&] { return Idle("slurmd-h100-1"); })) << cluster_.NodeLine("slurmd-h100-1");
  d = TickUntil(Action::kDrain);
  ASSERT_EQ(d.action, Action::kDrain) << d.reason;
  EXPECT_EQ(d.node, "slurmd-h100-1");
  EXPECT_THAT(cluster_.NodeLine("slurmd-h100-1"),
              HasSubstr("Reason=gpulet: broker scale-down of slurmd-h100"));
  d = TickUntil(Action::kScaleDown);
  ASSERT_EQ(d.action, Action::kScaleDown) << d.reason;
  EXPECT_EQ(Replicas(), 1);
  EXPECT_TRUE(Idle("slurmd-h100-0")) << "ordinal 0 untouched";

  // The StatefulSet controller terminates pod 1: its node leaves Slurm, the pod exits 0.
  EXPECT_EQ(TerminatePod(1), 0) << PodLog(1);
  EXPECT_NE(cluster_.Sh("scontrol show node -o slurmd-h100-1").exit_code, 0)
      << "the node should be gone from Slurm";
  api_->Put("/api/v1/namespaces/inference/pods/llm", GpuPod(true));
  d = Tick();
  EXPECT_EQ(broker_->journal().nodes.at("slurmd-h100-1").step, kStepAdmitted) << d.reason;

  // Kubernetes no longer uses the GPUs: the pool grows back, the new pod registers, returned.
  api_->Delete("/api/v1/namespaces/inference/pods/llm");
  d = TickUntil(Action::kScaleUp);
  ASSERT_EQ(d.action, Action::kScaleUp) << d.reason;
  EXPECT_EQ(Replicas(), 2);
  StartPod(1);
  ASSERT_TRUE(WaitFor([&] { return Idle("slurmd-h100-1"); })) << PodLog(1);
  d = TickUntil(Action::kRelease);
  EXPECT_EQ(d.code, "returned") << d.reason;
  EXPECT_TRUE(broker_->journal().nodes.empty());
  EXPECT_THAT(cluster_.NodeLine("slurmd-h100-1"), HasSubstr("Gres=gpu:h100:4"));
}

}  // namespace
}  // namespace gpulet::broker_testing
