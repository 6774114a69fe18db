// KubeSide on the fake API server: which of a node's pods a return waits for and evicts.
#include "broker/k8s_side.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "apiserver/fake_apiserver.h"
#include "apiserver/test_objects.h"

namespace gpulet::broker {
namespace {

using nlohmann::json;

// A static pod's mirror, as the kubelet creates it: the config.mirror annotation and the Node as
// its owner.
json MirrorPodObject(const std::string& name, const std::string& node) {
  json p = gpulet::testing::GpuPodObject(name, "kube-system", 0, node);
  p["spec"]["containers"][0].erase("resources");
  p["metadata"]["annotations"] = {{"kubernetes.io/config.mirror", "0123abcd"},
                                  {"kubernetes.io/config.source", "file"}};
  p["metadata"]["ownerReferences"] =
      json::array({{{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node}, {"uid", "n-1"}}});
  return p;
}

TEST(KubeSideObserve, AReturnNeitherWaitsForNorEvictsMirrorPodsOrDaemonSetPods) {
  std::string dir = ::testing::TempDir() + "gpulet-k8s-side-XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  Result<testing::TestPki> pki = testing::MakeTestPki(dir);
  ASSERT_TRUE(pki.ok()) << pki.status().message();
  auto api = testing::FakeApiServer::Start(*pki, {});
  ASSERT_TRUE(api.ok()) << api.status().message();
  k8s::Client client((*api)->Access(*pki));
  BrokerConfig config;
  config.nodes = {"gpua"};
  config.namespaces = {"inference"};

  (*api)->Put("/api/v1/nodes/gpua", {{"apiVersion", "v1"},
                                     {"kind", "Node"},
                                     {"metadata", {{"name", "gpua"}}},
                                     {"spec", {{"unschedulable", true}}}});
  (*api)->Put("/api/v1/namespaces/kube-system/pods/node-proxy-gpua",
              MirrorPodObject("node-proxy-gpua", "gpua"));
  json agent = gpulet::testing::GpuPodObject("gpulet-x1", "gpulet-system", 0, "gpua");
  agent["metadata"]["ownerReferences"] = json::array({{{"kind", "DaemonSet"}, {"name", "gpulet"}}});
  (*api)->Put("/api/v1/namespaces/gpulet-system/pods/gpulet-x1", agent);
  (*api)->Put("/api/v1/namespaces/inference/pods/web",
              gpulet::testing::GpuPodObject("web", "inference", 1, "gpua"));

  KubeSide kube(client, config);
  KubeView v = kube.Observe();
  ASSERT_TRUE(v.ok) << v.error;
  ASSERT_EQ(v.nodes.count("gpua"), 1u);
  EXPECT_EQ(v.nodes["gpua"].non_daemonset_pods, 1);
  EXPECT_EQ(v.nodes["gpua"].inference_pods, 1);
  EXPECT_EQ(v.nodes["gpua"].evictable, std::vector<std::string>{"inference/web"});

  // With the inference pod gone, nothing is left to wait for: the static pod stays on the node.
  (*api)->Delete("/api/v1/namespaces/inference/pods/web");
  v = kube.Observe();
  ASSERT_TRUE(v.ok) << v.error;
  EXPECT_EQ(v.nodes["gpua"].non_daemonset_pods, 0);
  EXPECT_TRUE(v.nodes["gpua"].evictable.empty());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gpulet::broker
