// The Slurm-on-Kubernetes mode end to end inside one process: the real Broker loop, KubeSide on
// the fake API server holding a slurmd StatefulSet and inference pods, SlurmSide on a scripted
// Slurm (slurm/fake_runner.h). What the engine decides is scaled_engine_test.cc; this checks that
// the decisions reach Slurm and the API as the contract says (drain, then replicas - 1 from
// exactly the drained count, with the read's resourceVersion), and that an unreadable side
// changes nothing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "apiserver/fake_apiserver.h"
#include "apiserver/test_objects.h"
#include "broker/broker.h"
#include "broker/k8s_side.h"
#include "broker/scaled_engine.h"
#include "broker/slurm_side.h"
#include "slurm/fake_runner.h"

namespace gpulet::broker {
namespace {

using nlohmann::json;
using slurm::CommandOutput;
using slurm::testing::FakeRunner;
using ::testing::HasSubstr;

const std::string kSts = "/apis/apps/v1/namespaces/slurm/statefulsets/slurmd-h100";

json StatefulSet(int replicas) {
  return {{"apiVersion", "apps/v1"},
          {"kind", "StatefulSet"},
          {"metadata", {{"name", "slurmd-h100"}, {"namespace", "slurm"}}},
          {"spec", {{"replicas", replicas}, {"serviceName", "slurmd"}}},
          {"status", {{"readyReplicas", replicas}}}};
}

json GpuPod(const std::string& name, bool bound) {
  return gpulet::testing::GpuPodObject(name, "inference", 1, bound ? "k8s-node-1" : "");
}

// sinfo --json (22.05 shape) for the pool's nodes; `drained` carries our drain on the last.
std::string Sinfo(int nodes, const std::string& last_reason) {
  json out = {{"nodes", json::array()}, {"errors", json::array()}};
  for (int i = 0; i < nodes; ++i) {
    json n = {{"name", PodNodeName("slurmd-h100", i)},
              {"state", "idle"},
              {"state_flags", json::array()},
              {"reason", ""},
              {"gres", "gpu:h100:4"},
              {"gres_used", "gpu:h100:0(IDX:N/A)"},
              {"alloc_cpus", 0},
              {"last_busy", 1000}};
    if (i == nodes - 1 && !last_reason.empty()) {
      n["state_flags"] = json::array({"DRAIN"});
      n["reason"] = last_reason;
    }
    out["nodes"].push_back(n);
  }
  return out.dump();
}

std::string TempDir() {
  std::string tmpl = ::testing::TempDir() + "gpulet-scaled-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

class ScaledBroker : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    Result<testing::TestPki> pki = testing::MakeTestPki(dir_);
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    auto api = testing::FakeApiServer::Start(*pki, {});
    ASSERT_TRUE(api.ok()) << api.status().message();
    api_ = std::move(*api);
    k8s::ClusterAccess access = api_->Access(*pki);
    client_ = std::make_unique<k8s::Client>(access);

    config_.namespaces = {"inference"};
    config_.slurm_namespace = "slurm";
    config_.pools = {{"slurmd-h100", 2, 0, 4, "h100"}};
    config_.k8s_max_nodes = 2;
    config_.idle_time = 0;
    config_.demand_evaluations = 1;
    config_.min_residence = 0;
    config_.cooldown = 0;
    config_.journal_path = dir_ + "/journal.json";
    runner_ = std::make_shared<FakeRunner>();
    runner_->On("sinfo --json", CommandOutput{0, Sinfo(2, ""), ""});
    runner_->On("squeue --json", CommandOutput{0, R"({"jobs":[],"errors":[]})", ""});
    runner_->On("scontrol show reservation -o",
                CommandOutput{0, "No reservations in the system\n", ""});
    api_->Put(kSts, StatefulSet(2));
    kube_ = std::make_unique<KubeSide>(*client_, config_);
    slurm_ = std::make_unique<SlurmSide>(runner_, config_);
    broker_ = std::make_unique<Broker>(config_, *slurm_, *kube_, BrokerOptions{});
    ASSERT_TRUE(broker_->Start().ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  int Replicas() const { return api_->Object(kSts).value_or(json())["spec"].value("replicas", -1); }
  int PatchesOfStatefulSet() const {
    int n = 0;
    for (const auto& r : api_->requests()) {
      if (r.method == "PATCH" && r.path == kSts) ++n;
    }
    return n;
  }
  bool Ran(const std::string& prefix) const {
    for (const std::string& c : runner_->calls()) {
      if (c.rfind(prefix, 0) == 0) return true;
    }
    return false;
  }

  std::string dir_;
  std::unique_ptr<testing::FakeApiServer> api_;
  std::unique_ptr<k8s::Client> client_;
  BrokerConfig config_;
  std::shared_ptr<FakeRunner> runner_;
  std::unique_ptr<KubeSide> kube_;
  std::unique_ptr<SlurmSide> slurm_;
  std::unique_ptr<Broker> broker_;
};

TEST_F(ScaledBroker, ObserveReadsTheStatefulSetsAndBothKindsOfGpuPods) {
  api_->Put("/api/v1/namespaces/inference/pods/wait", GpuPod("wait", false));
  api_->Put("/api/v1/namespaces/inference/pods/serve", GpuPod("serve", true));
  KubeView v = kube_->Observe();
  ASSERT_TRUE(v.ok) << v.error;
  EXPECT_EQ(v.unschedulable_gpu_pods, 1);
  EXPECT_EQ(v.inference_gpu_pods, 1);
  ASSERT_TRUE(v.stateful_sets.count("slurmd-h100"));
  EXPECT_EQ(v.stateful_sets.at("slurmd-h100").replicas, 2);
  EXPECT_TRUE(v.nodes.empty()) << "no Node is read in this mode";
  // A StatefulSet that does not exist is absent, not an error.
  api_->Delete(kSts);
  v = kube_->Observe();
  ASSERT_TRUE(v.ok) << v.error;
  EXPECT_FALSE(v.stateful_sets.count("slurmd-h100"));
}

TEST_F(ScaledBroker, DrainsTheHighestOrdinalThenScalesDownByOne) {
  api_->Put("/api/v1/namespaces/inference/pods/wait", GpuPod("wait", false));
  runner_->On(
      "scontrol update NodeName=slurmd-h100-1 State=DRAIN Reason=gpulet: broker "
      "scale-down of slurmd-h100 (lent to kubernetes)",
      CommandOutput{0, "", ""});
  Decision d = broker_->Tick(NowMs());
  ASSERT_EQ(d.action, Action::kDrain) << d.reason;
  EXPECT_EQ(d.node, "slurmd-h100-1");
  EXPECT_TRUE(
      Ran("scontrol update NodeName=slurmd-h100-1 State=DRAIN Reason=gpulet: broker "
          "scale-down of slurmd-h100"));
  EXPECT_EQ(Replicas(), 2) << "never before the node is drained";
  EXPECT_EQ(PatchesOfStatefulSet(), 0);

  // Drained and idle in Slurm: 2 → 1.
  runner_->On("sinfo --json",
              CommandOutput{0, Sinfo(2, "gpulet: broker scale-down of slurmd-h100 (lent)"), ""});
  d = broker_->Tick(NowMs());
  ASSERT_EQ(d.action, Action::kScaleDown) << d.reason;
  EXPECT_EQ(Replicas(), 1);
  EXPECT_EQ(broker_->journal().OwnerOf("slurmd-h100-1"), Owner::kKubernetes);

  // The pod is gone, and its node with it; the waiting pod got the GPUs and runs. The lend is
  // complete and nothing more is scaled.
  runner_->On("sinfo --json", CommandOutput{0, Sinfo(1, ""), ""});
  api_->Put("/api/v1/namespaces/inference/pods/wait", GpuPod("wait", true));
  d = broker_->Tick(NowMs());
  EXPECT_NE(d.action, Action::kScaleDown);
  EXPECT_EQ(broker_->journal().nodes.at("slurmd-h100-1").step, kStepAdmitted);
  EXPECT_EQ(PatchesOfStatefulSet(), 1);
}

TEST_F(ScaledBroker, AnUnreadableSlurmChangesNothing) {
  api_->Put("/api/v1/namespaces/inference/pods/wait", GpuPod("wait", false));
  runner_->On("sinfo --json", CommandOutput{1, "", "slurm_load_node: Unable to contact slurm"});
  Decision d = broker_->Tick(NowMs());
  EXPECT_EQ(d.action, Action::kNone);
  EXPECT_EQ(d.code, "unknown_slurm");
  EXPECT_THAT(d.reason, HasSubstr("Unable to contact slurm"));
  EXPECT_FALSE(Ran("scontrol update"));
  EXPECT_EQ(PatchesOfStatefulSet(), 0);
}

TEST_F(ScaledBroker, ScaleIsRefusedWhenTheReplicasChangedSinceTheDecision) {
  api_->Put(kSts, StatefulSet(3));  // someone scaled up: ordinal 2 exists and was not drained
  Status s = kube_->ScaleStatefulSet("slurmd-h100", 2, 1);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("has 3 replicas, not 2"));
  EXPECT_EQ(Replicas(), 3);
  // Re-issuing a scale that already happened is a no-op.
  EXPECT_TRUE(kube_->ScaleStatefulSet("slurmd-h100", 4, 3).ok());
  EXPECT_EQ(PatchesOfStatefulSet(), 0);
  // The patch carries the read's resourceVersion: a change in between is a 409, not a lost write.
  EXPECT_TRUE(kube_->ScaleStatefulSet("slurmd-h100", 3, 2).ok());
  EXPECT_EQ(Replicas(), 2);
}

TEST_F(ScaledBroker, StatusListsThePools) {
  const std::string s = FormatStatus(broker_->journal(), config_, NowMs());
  EXPECT_THAT(s, HasSubstr("slurmd pools: 1 lent=0 in-transit=0 (cap 2 pods)"));
  EXPECT_THAT(s, HasSubstr("pool slurmd-h100: size 2, floor 0, 4 h100 GPUs per pod"));
}

}  // namespace
}  // namespace gpulet::broker
