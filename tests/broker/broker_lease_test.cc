// Leader election and the Kubernetes adapter's reads against the fake API server (no Slurm).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/broker/broker_support.h"

namespace gpulet::broker_testing {
namespace {

class BrokerApi : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<testing::TestPki> pki = testing::MakeTestPki(dir_.path());
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    auto api = testing::FakeApiServer::Start(*pki, {});
    ASSERT_TRUE(api.ok());
    api_ = std::move(*api);
    k8s::ClusterAccess access;
    access.server = api_->url();
    access.ca_file = pki->ca_cert;
    access.token = "test-token";
    client_ = std::make_unique<k8s::Client>(access);
    config_.nodes = {"gpua", "gpub"};
    config_.namespaces = {"inference"};
    config_.lease_namespace = "kube-system";
    config_.lease_name = "gpulet-broker";
    config_.lease_duration = 30 * 1000;
  }
  TempDir dir_;
  std::unique_ptr<testing::FakeApiServer> api_;
  std::unique_ptr<k8s::Client> client_;
  BrokerConfig config_;
};

TEST_F(BrokerApi, OneLeaseHolderAtATime) {
  KubeSide side(*client_, config_);
  const TimeMs t0 = NowMs();
  Result<bool> a = side.AcquireLease("broker-a", t0);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_TRUE(*a);  // created
  EXPECT_FALSE(*side.AcquireLease("broker-b", t0 + 1000));  // fresh: b waits
  EXPECT_TRUE(*side.AcquireLease("broker-a", t0 + 2000));   // a renews
  EXPECT_FALSE(*side.AcquireLease("broker-b", t0 + 20000));
  // a stops renewing: after the lease duration b takes over, and a is out.
  EXPECT_TRUE(*side.AcquireLease("broker-b", t0 + 2000 + 31000));
  EXPECT_FALSE(*side.AcquireLease("broker-a", t0 + 2000 + 32000));
  auto lease = api_->Object(
      "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/gpulet-broker");
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ((*lease)["spec"]["holderIdentity"], "broker-b");
  EXPECT_EQ((*lease)["spec"]["leaseDurationSeconds"], 30);
}

TEST_F(BrokerApi, StaleLeaseUpdateIsAConflict) {
  KubeSide side(*client_, config_);
  ASSERT_TRUE(*side.AcquireLease("broker-a", NowMs()));
  const std::string path = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/gpulet-broker";
  Result<json> stale = client_->Patch(
      path, json{{"metadata", {{"resourceVersion", "1"}}}, {"spec", {{"holderIdentity", "x"}}}},
      k8s::PatchType::kMerge);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(k8s::HttpStatusOf(stale.status()), 409);
  EXPECT_EQ((*api_->Object(path))["spec"]["holderIdentity"], "broker-a");
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
  api_->Put("/api/v1/namespaces/kube-system/pods/ds", RunningPod("kube-system", "ds", "gpua", true));
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

}  // namespace
}  // namespace gpulet::broker_testing
