// Live path = replay through real HTTP (issue 25 item 5): a reduced openb trace's one-GPU arrivals
// through the running extender (Service: its watches over the fake API server, its HTTP server),
// filter → prioritize → the scheduler's pick → bind, as kube-scheduler calls them, against the
// artifact replay of `gpulet replay`; every pod's node and GPU must be the same.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <stdlib.h>

#include "apiserver/fake_apiserver.h"
#include "apiserver/rbac_check.h"
#include "extender/equivalence.h"
#include "extender/scoring.h"
#include "extender/service.h"
#include "placement/trace.h"
#include "support/require.h"

namespace gpulet::extender {
namespace {

using gpulet::testing::FakeApiServer;
using nlohmann::json;

class PolicyReplayTest : public ::testing::TestWithParam<const char*> {};

TEST_P(PolicyReplayTest, ReducedOpenbTraceSamePlacementsThroughHttp) {
  const std::string dir = std::string(GPULET_SOURCE_DIR) + "/../shared/traces/alibaba-openb";
  GPULET_REQUIRE_SHARED(placement::GpuNodeListPath(dir));
  auto cluster = placement::LoadNodes(placement::GpuNodeListPath(dir));
  ASSERT_TRUE(cluster.ok()) << cluster.status().message();
  auto pods = placement::LoadPods(placement::TraceVariantPath(dir, "default"), *cluster);
  ASSERT_TRUE(pods.ok()) << pods.status().message();
  EquivalenceOptions o;
  o.policy = GetParam();
  o.seed = 43;
  o.max_nodes = 32;
  o.max_pods = 200;
  o.load = 2.6;  // about 160 GPUs asked of 32 nodes' 134: some pods find no room
  auto setup = PrepareEquivalence(*cluster, *pods, o);
  ASSERT_TRUE(setup.ok()) << setup.status().message();
  ASSERT_EQ(setup->arrivals.size(), 200u);

  std::string dir_tmpl = ::testing::TempDir() + "gpulet-policy-replay-XXXXXX";
  ASSERT_NE(mkdtemp(dir_tmpl.data()), nullptr);
  auto pki = gpulet::testing::MakeTestPki(dir_tmpl);
  ASSERT_TRUE(pki.ok()) << pki.status().message();
  auto api = FakeApiServer::Start(*pki, {});
  ASSERT_TRUE(api.ok()) << api.status().message();
  for (const json& cm : setup->objects) {
    (*api)->Put("/api/v1/namespaces/gpulet-system/configmaps/" +
                    cm["metadata"]["name"].get<std::string>(),
                cm);
  }
  k8s::Client client((*api)->Access(*pki));
  auto scorer = PlacementScorer::Make(o.policy, setup->typical, setup->cluster.models);
  ASSERT_TRUE(scorer.ok()) << scorer.status().message();
  FakeClock clock;
  ServiceOptions so;
  so.address = "127.0.0.1:0";
  so.view.stale_after = std::chrono::hours(24);
  so.view.placement = *scorer;
  so.watch_nodes = false;
  Service service(client, clock, so);
  ASSERT_TRUE(service.Start().ok());
  httplib::Client http("127.0.0.1", service.port());
  http.set_read_timeout(30, 0);

  LiveExtender live;
  live.call = [&](const std::string& verb, const std::string& body) {
    auto r = http.Post("/" + verb, body, "application/json");
    return r ? std::pair{r->status, r->body} : std::pair{0, std::string()};
  };
  live.create_pod = [&](const json& pod) {
    (*api)->Put("/api/v1/namespaces/replay/pods/" + pod["metadata"]["name"].get<std::string>(),
                pod);
  };
  live.reserved = [&](const std::string& uid, const std::string& node) {
    return service.view().ReservationOf(uid, node);
  };
  auto r = RunEquivalence(*setup, o, live);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->pods, 200);
  EXPECT_EQ(r->identical, r->pods) << ::testing::PrintToString(r->differences);
  EXPECT_GT(r->placed, 0);
  EXPECT_GT(r->failed, 0);
  for (size_t i = 0; i < r->live.size(); ++i) {
    ASSERT_EQ(r->live[i], r->replay[i]) << setup->arrivals[i].name;
    if (r->live[i].node.empty()) continue;
    // Bound in the API server where the replay placed it.
    auto p = (*api)->Object("/api/v1/namespaces/replay/pods/" + setup->arrivals[i].name);
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ((*p)["spec"].value("nodeName", ""), r->replay[i].node);
  }
  service.Stop();
  // Every request the extender sent (watches, pod reads, Bindings) is one its shipped roles grant.
  for (const std::string& v :
       gpulet::testing::RbacVerbsNotGranted((*api)->requests(), {"deploy/extender/rbac.yaml"})) {
    ADD_FAILURE() << "deploy/extender/rbac.yaml does not grant " << v;
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, PolicyReplayTest,
                         ::testing::Values("fgd", "bestfit", "gpuclustering"),
                         [](const auto& info) {
                           std::string n = info.param;
                           n.erase(std::remove(n.begin(), n.end(), '-'), n.end());
                           return n;
                         });

}  // namespace
}  // namespace gpulet::extender
