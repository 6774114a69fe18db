#include "extender/view.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "extender/extender.h"
#include "extender/request.h"
#include "extender/test_objects.h"

namespace gpulet::extender {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using namespace testobjects;

PodRequest Request(const std::string& name, const std::vector<int64_t>& units) {
  auto r = ParsePodRequest(MemoryPod(name, units));
  EXPECT_TRUE(r.ok()) << r.status().message();
  return *r;
}

// An extender whose binds succeed without an API server and which finds no pod there.
Extender OfflineExtender(ClusterView& view) {
  return Extender(
      view,
      [](const std::string&, const std::string&, const std::string&, const std::string&) {
        return Status();
      },
      [](const std::string&, const std::string&) -> Result<json> {
        return Status(ErrorCode::kNotFound, "none");
      });
}

void Publish(ClusterView& view, const std::string& node, const std::vector<Gpu>& gpus,
             const std::string& rv, json pods = json::array(), int heartbeat = 30) {
  view.UpsertObject(
      MemoryConfigMap(node, MemoryJson(node, gpus, 1, std::move(pods), heartbeat).dump(), rv));
}

TEST(ParseMemoryJson, ReadsTheContract) {
  auto m = ParseMemoryJson(
      R"({"version":1,"node":"n1","generation":42,"resource":"gpulet.io/gpu-memory-1gi",
          "unitBytes":1073741824,"heartbeatSeconds":30,"extra":"ignored",
          "gpus":[{"uuid":"GPU-a","index":0,"model":"NVIDIA H100 80GB HBM3","numaNode":0,
                   "healthy":true,"totalUnits":80,"freeUnits":60}],
          "pods":[{"namespace":"ns","name":"p","container":"c","gpu":"GPU-a","units":20}]})",
      "cm");
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->node, "n1");
  EXPECT_EQ(m->generation, 42);
  EXPECT_EQ(m->heartbeat_seconds, 30);
  ASSERT_EQ(m->gpus.size(), 1u);
  EXPECT_EQ(m->gpus[0].free_units, 60);
  ASSERT_EQ(m->pods.size(), 1u);
  EXPECT_EQ(m->pods[0].units, 20);
}

TEST(ParseMemoryJson, ErrorsNameTheField) {
  const json good = MemoryJson("n1", {{80, 60}});
  struct Case {
    const char* name;
    std::function<void(json&)> mutate;
    const char* want;
  };
  const std::vector<Case> cases = {
      {"version", [](json& j) { j["version"] = 2; }, "version: must be between 1 and 1"},
      {"no node", [](json& j) { j.erase("node"); }, "node: required"},
      {"resource type", [](json& j) { j["resource"] = 5; }, "resource: must be a string"},
      {"unit", [](json& j) { j["unitBytes"] = 0; }, "unitBytes: must be between 1"},
      {"gpus", [](json& j) { j["gpus"] = "x"; }, "gpus: required, a list"},
      {"free > total", [](json& j) { j["gpus"][0]["freeUnits"] = 90; },
       "gpus[0].freeUnits: must be between 0 and 80, got 90"},
      {"negative", [](json& j) { j["gpus"][0]["totalUnits"] = -1; }, "gpus[0].totalUnits"},
      {"float", [](json& j) { j["gpus"][0]["freeUnits"] = 1.5; },
       "gpus[0].freeUnits: must be an integer"},
      {"healthy", [](json& j) { j["gpus"][0]["healthy"] = "yes"; }, "gpus[0].healthy"},
      {"repeated uuid", [](json& j) { j["gpus"].push_back(j["gpus"][0]); }, "gpus[1].uuid"},
      {"pod name",
       [](json& j) {
         j["pods"] = json::array({json{{"namespace", "a"}}});
       },
       "pods[0].name: required"},
  };
  for (const Case& c : cases) {
    json j = good;
    c.mutate(j);
    auto m = ParseMemoryJson(j.dump(), "configmaps/gpulet-system/gpulet-memory-n1");
    ASSERT_FALSE(m.ok()) << c.name;
    EXPECT_THAT(m.status().message(),
                HasSubstr("configmaps/gpulet-system/gpulet-memory-n1: memory.json: "))
        << c.name;
    EXPECT_THAT(m.status().message(), HasSubstr(c.want)) << c.name;
  }
  EXPECT_THAT(ParseMemoryJson("{not json", "x").status().message(), HasSubstr("not valid JSON"));
}

TEST(ParsePodRequest, RequestsLimitsAndErrors) {
  PodRequest r = Request("p", {20, 0, 5});
  EXPECT_EQ(r.resource, kResource);
  ASSERT_EQ(r.steps.size(), 2u);
  EXPECT_EQ(r.steps[0].container.name, "c0");
  EXPECT_EQ(r.steps[1].container.units, 5);
  EXPECT_EQ(r.total(), 25);
  EXPECT_EQ(r.key(), "default/p");
  EXPECT_EQ(r.uid, "uid-default-p");

  json limits_only = MemoryPod("q", {0});
  limits_only["spec"]["containers"][0]["resources"] = {{"limits", {{kResource, 7}}}};
  auto q = ParsePodRequest(limits_only);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->total(), 7);

  json cpu_only = MemoryPod("cpu", {0});
  auto c = ParsePodRequest(cpu_only);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->resource.empty());

  json two = MemoryPod("two", {1, 0});
  two["spec"]["containers"][1]["resources"] = {{"limits", {{"gpulet.io/gpu-memory-512mi", "3"}}}};
  EXPECT_THAT(ParsePodRequest(two).status().message(),
              HasSubstr("spec.containers[1] (c1): asks for both"));

  json frac = MemoryPod("frac", {0});
  frac["spec"]["containers"][0]["resources"] = {{"limits", {{kResource, "1.5"}}}};
  EXPECT_THAT(ParsePodRequest(frac).status().message(),
              HasSubstr("spec.containers[0] (c0): resources.limits[\"gpulet.io/gpu-memory-1gi\"]: "
                        "must be a whole number"));

  json init = MemoryPod("init", {4});
  init["spec"]["initContainers"] =
      json::array({{{"name", "setup"}, {"resources", {{"limits", {{kResource, "30"}}}}}}});
  auto i = ParsePodRequest(init);
  ASSERT_TRUE(i.ok());
  ASSERT_EQ(i->steps.size(), 2u);
  EXPECT_EQ(i->steps[0].kind, PodRequest::Step::kInit);
  EXPECT_EQ(i->steps[0].container.units, 30);
  EXPECT_EQ(i->total(), 30);  // max(largest init container, app containers)
}

struct FilterCase {
  const char* name;
  std::vector<Gpu> gpus;
  std::vector<int64_t> pod;
  bool fits;
  const char* reason;          // substring when !fits
  std::vector<int> gpu_index;  // chosen GPU per container when fits
};

TEST(Filter, PerGpuFitContainersInTurn) {
  const std::vector<FilterCase> cases = {
      {"fits one GPU", {{80, 60}}, {20}, true, "", {0}},
      {"node total is not enough: one GPU must hold it",
       {{80, 40}, {80, 40}},
       {60},
       false,
       "container \"c0\" needs 60 units of gpulet.io/gpu-memory-1gi on one GPU; the largest free "
       "GPU has 40 units (GPU 0, 80 total)",
       {}},
      {"best fit: the least free GPU that fits",
       {{80, 50}, {80, 25}, {80, 30}},
       {20},
       true,
       "",
       {1}},
      {"containers in turn", {{80, 30}, {80, 20}}, {20, 20}, true, "", {1, 0}},
      {"second container no longer fits",
       {{80, 30}, {80, 10}},
       {20, 20},
       false,
       "container \"c1\" needs 20 units of gpulet.io/gpu-memory-1gi on one GPU; the largest free "
       "GPU has 10 units (GPU 0, 80 total) after this pod's earlier containers",
       {}},
      {"unhealthy GPU counts as 0 free",
       {{80, 80, false}, {80, 10}},
       {20},
       false,
       "largest free GPU has 10 units (GPU 1",
       {}},
      {"exactly full", {{80, 80}}, {80}, true, "", {0}},
      {"no GPUs", {}, {1}, false, "the node publishes no GPUs", {}},
      {"pod without memory request passes", {{80, 0}}, {0}, true, "", {}},
  };
  for (const FilterCase& c : cases) {
    FakeClock clock;
    ClusterView view(clock, {});
    Publish(view, "n1", c.gpus, "5");
    PodRequest pod = Request("p", c.pod);
    NodeVerdict v = view.Evaluate(pod, "n1");
    EXPECT_EQ(v.fits, c.fits) << c.name << ": " << v.reason;
    if (!c.fits) {
      EXPECT_THAT(v.reason, HasSubstr(c.reason)) << c.name;
      continue;
    }
    ASSERT_EQ(v.assignments.size(), c.gpu_index.size()) << c.name;
    for (size_t k = 0; k < c.gpu_index.size(); ++k) {
      EXPECT_EQ(v.assignments[k].gpu, GpuUuid("n1", static_cast<size_t>(c.gpu_index[k]))) << c.name;
    }
  }
}

TEST(Filter, SpreadPicksTheMostFreeGpu) {
  FakeClock clock;
  ClusterView view(clock, {.policy = Policy::kSpread});
  Publish(view, "n1", {{80, 50}, {80, 25}, {80, 30}}, "1");
  NodeVerdict v = view.Evaluate(Request("p", {20}), "n1");
  ASSERT_TRUE(v.fits);
  EXPECT_EQ(v.assignments[0].gpu, GpuUuid("n1", 0));
}

TEST(Filter, UnresolvableObjects) {
  FakeClock clock;
  ClusterView view(clock, {});
  Publish(view, "ok", {{80, 80}}, "1");
  // Malformed JSON, a missing key, a node mismatch, a foreign resource.
  view.UpsertObject(MemoryConfigMap("bad", "{\"version\":1,", "1"));
  json nodata = MemoryConfigMap("nodata", "", "1");
  nodata["data"] = json::object();
  view.UpsertObject(nodata);
  view.UpsertObject(MemoryConfigMap("liar", MemoryJson("other", {{80, 80}}).dump(), "1"));
  json foreign = MemoryJson("foreign", {{80, 80}});
  foreign["resource"] = "gpulet.io/gpu-memory-512mi";
  view.UpsertObject(MemoryConfigMap("foreign", foreign.dump(), "1"));

  FilterOutcome out =
      view.Filter(Request("p", {10}), {"ok", "bad", "nodata", "liar", "foreign", "missing"});
  EXPECT_EQ(out.passed, std::vector<std::string>{"ok"});
  EXPECT_TRUE(out.failed.empty());
  ASSERT_EQ(out.unresolvable.size(), 5u);
  EXPECT_THAT(
      out.unresolvable["bad"],
      HasSubstr(
          "malformed: configmaps/gpulet-system/gpulet-memory-bad: memory.json: not valid JSON"));
  EXPECT_THAT(out.unresolvable["nodata"], HasSubstr("data[\"memory.json\"]: missing"));
  EXPECT_THAT(out.unresolvable["liar"],
              HasSubstr("node: \"other\" is not the object's node \"liar\""));
  EXPECT_THAT(
      out.unresolvable["foreign"],
      HasSubstr("pool is gpulet.io/gpu-memory-512mi, the pod asks for gpulet.io/gpu-memory-1gi"));
  EXPECT_THAT(out.unresolvable["missing"],
              HasSubstr("no GPU memory object configmaps/gpulet-system/gpulet-memory-missing"));

  // Once nodes are known, a node without the pool label says so.
  view.ReplaceNodes({json{{"metadata", {{"name", "missing"}}}}});
  EXPECT_THAT(view.Evaluate(Request("p", {10}), "missing").reason,
              HasSubstr("node has no gpulet GPU memory pool"));
}

TEST(Filter, StaleOnOurClockNotTheAgents) {
  FakeClock clock;
  ClusterView view(clock, {});
  Publish(view, "n1", {{80, 80}}, "7", json::array(), /*heartbeat=*/10);
  const PodRequest pod = Request("p", {10});
  clock.Advance(std::chrono::seconds(30));  // 3 × heartbeat: not yet stale
  EXPECT_TRUE(view.Evaluate(pod, "n1").fits);
  clock.Advance(std::chrono::milliseconds(1));
  NodeVerdict v = view.Evaluate(pod, "n1");
  EXPECT_FALSE(v.fits);
  EXPECT_TRUE(v.unresolvable);
  EXPECT_THAT(v.reason, HasSubstr("stale"));
  EXPECT_THAT(v.reason, HasSubstr("unchanged for 30s1ms (stale after 30s"));
  EXPECT_EQ(view.stats().stale, 1u);
  // The same resourceVersion again (a re-list) does not refresh it; a new one does.
  Publish(view, "n1", {{80, 80}}, "7", json::array(), 10);
  EXPECT_FALSE(view.Evaluate(pod, "n1").fits);
  Publish(view, "n1", {{80, 80}}, "8", json::array(), 10);
  EXPECT_TRUE(view.Evaluate(pod, "n1").fits);

  // --stale-after overrides the heartbeat rule.
  ClusterView strict(clock, {.stale_after = std::chrono::seconds(5)});
  Publish(strict, "n1", {{80, 80}}, "1", json::array(), 10);
  clock.Advance(std::chrono::seconds(6));
  EXPECT_THAT(strict.Evaluate(pod, "n1").reason, HasSubstr("stale after 5s"));
}

TEST(Reserve, BackToBackPodsDoNotShareUnits) {
  FakeClock clock;
  ClusterView view(clock, {});
  Publish(view, "n1", {{80, 50}, {80, 30}}, "1");
  PodRequest a = Request("a", {40});
  PodRequest b = Request("b", {40});
  // Both pass filter before either is bound (the scheduler binds asynchronously).
  EXPECT_TRUE(view.Evaluate(a, "n1").fits);
  EXPECT_TRUE(view.Evaluate(b, "n1").fits);
  auto ra = view.Reserve(a, "n1");
  ASSERT_TRUE(ra.ok());
  EXPECT_EQ((*ra)[0].gpu, GpuUuid("n1", 0));
  auto rb = view.Reserve(b, "n1");
  ASSERT_FALSE(rb.ok());
  EXPECT_THAT(
      rb.status().message(),
      HasSubstr("pod default/b no longer fits on node n1: container \"c0\" needs 40 units"));
  EXPECT_THAT(rb.status().message(), HasSubstr("largest free GPU has 30 units"));
  EXPECT_EQ(view.stats().reserved_units, 40);
  // Re-reserving the same pod keeps its reservation rather than counting it twice.
  bool already = false;
  ASSERT_TRUE(view.Reserve(a, "n1", &already).ok());
  EXPECT_TRUE(already);
  EXPECT_EQ(view.stats().reservations, 1u);
  view.Unreserve(a.uid, "n1");
  EXPECT_TRUE(view.Reserve(b, "n1").ok());
}

TEST(Reserve, DroppedWhenThePodIsListedNotOnANewerGeneration) {
  FakeClock clock;
  ClusterView view(clock, {});
  Publish(view, "n1", {{80, 50}}, "1");
  PodRequest a = Request("a", {40});
  ASSERT_TRUE(view.Reserve(a, "n1").ok());
  // A newer object that does not list the pod yet (the kubelet has not allocated): still held.
  Publish(view, "n1", {{80, 50}}, "2");
  EXPECT_EQ(view.stats().reservations, 1u);
  EXPECT_FALSE(view.Evaluate(Request("b", {20}), "n1").fits);
  // The pod is listed and its units are out of freeUnits: the reservation goes.
  Publish(view, "n1", {{80, 10}}, "3",
          json::array({{{"namespace", "default"},
                        {"name", "a"},
                        {"container", "c0"},
                        {"gpu", GpuUuid("n1", 0)},
                        {"units", 40}}}));
  EXPECT_EQ(view.stats().reservations, 0u);
  EXPECT_TRUE(view.Evaluate(Request("b", {10}), "n1").fits);
}

TEST(Reserve, ExpiresAfterTheTimeout) {
  FakeClock clock;
  ClusterView view(clock, {.stale_after = std::chrono::hours(1),
                           .reservation_timeout = std::chrono::seconds(60)});
  Publish(view, "n1", {{80, 50}}, "1");
  ASSERT_TRUE(view.Reserve(Request("a", {40}), "n1").ok());
  clock.Advance(std::chrono::seconds(59));
  EXPECT_FALSE(view.Evaluate(Request("b", {20}), "n1").fits);
  clock.Advance(std::chrono::seconds(1));
  EXPECT_TRUE(view.Evaluate(Request("b", {20}), "n1").fits);
  EXPECT_EQ(view.stats().reservations, 0u);
}

TEST(Reserve, ForgottenWithTheNode) {
  FakeClock clock;
  ClusterView view(clock, {});
  Publish(view, "n1", {{80, 50}}, "1");
  ASSERT_TRUE(view.Reserve(Request("a", {40}), "n1").ok());
  view.RemoveNode("n1");
  EXPECT_EQ(view.stats().reservations, 0u);
  view.RemoveObject("gpulet-memory-n1");
  EXPECT_EQ(view.stats().objects, 0u);
}

TEST(Prioritize, BestFitPrefersLeastLeftoverSpreadTheOpposite) {
  FakeClock clock;
  ClusterView best(clock, {});
  ClusterView spread(clock, {.policy = Policy::kSpread});
  for (ClusterView* v : {&best, &spread}) {
    Publish(*v, "tight", {{80, 20}, {80, 0}}, "1");
    Publish(*v, "roomy", {{80, 80}, {80, 80}}, "1");
    Publish(*v, "half", {{80, 40}, {80, 40}}, "1");
    Publish(*v, "full", {{80, 10}}, "1");
  }
  const PodRequest pod = Request("p", {20});
  auto b = best.Prioritize(pod, {"tight", "roomy", "half", "full", "missing"});
  ASSERT_EQ(b.size(), 5u);
  EXPECT_EQ(b[0], std::make_pair(std::string("tight"), 10));
  EXPECT_GT(b[2].second, b[1].second);
  EXPECT_EQ(b[3].second, 0);  // does not fit
  EXPECT_EQ(b[4].second, 0);
  for (const auto& [host, score] : b) {
    EXPECT_GE(score, 0);
    EXPECT_LE(score, kMaxExtenderPriority);
  }
  auto s = spread.Prioritize(pod, {"tight", "roomy", "half"});
  EXPECT_GT(s[1].second, s[2].second);
  EXPECT_GT(s[2].second, s[0].second);
}

TEST(Objects, ReplaceRemovesWhatIsGone) {
  FakeClock clock;
  ClusterView view(clock, {});
  Publish(view, "a", {{80, 80}}, "1");
  Publish(view, "b", {{80, 80}}, "1");
  view.ReplaceObjects({MemoryConfigMap("b", MemoryJson("b", {{80, 80}}).dump(), "1")});
  EXPECT_EQ(view.stats().objects, 1u);
  EXPECT_TRUE(view.Evaluate(Request("p", {1}), "a").unresolvable);
  // Objects that are not ours (no node label, no prefix) are ignored.
  view.UpsertObject(json{{"metadata", {{"name", "unrelated"}}}});
  EXPECT_EQ(view.stats().objects, 1u);
}

// Prioritize after filter reuses the filter's lookups: whatever changes in between (an object
// removed, republished or gone stale, a reservation) is seen as if evaluated afresh.
TEST(Filter, NodesWithMoreThanEightGpus) {
  FakeClock clock;
  ClusterView view(clock, {});
  std::vector<Gpu> gpus(10, Gpu{80, 5});
  gpus[9] = {80, 30};
  Publish(view, "big", gpus, "1");
  NodeVerdict v = view.Evaluate(Request("p", {30}), "big");
  ASSERT_TRUE(v.fits) << v.reason;
  ASSERT_EQ(v.assignments.size(), 1u);
  EXPECT_EQ(v.assignments[0].gpu, GpuUuid("big", 9));
  EXPECT_EQ(v.score, 10);
  EXPECT_THAT(view.Evaluate(Request("p", {31}), "big").reason,
              HasSubstr("the largest free GPU has 30 units (GPU 9, 80 total)"));
}

TEST(Prioritize, AfterFilterSeesChangesInBetween) {
  FakeClock clock;
  ClusterView view(clock, {});
  Publish(view, "tight", {{80, 20}, {80, 0}}, "1");
  Publish(view, "roomy", {{80, 80}, {80, 80}}, "1");
  Publish(view, "half", {{80, 40}, {80, 40}}, "1");
  const PodRequest pod = Request("p", {20});
  const std::vector<std::string> all = {"tight", "roomy", "half"};
  ASSERT_EQ(view.Filter(pod, all).passed, all);
  const auto fresh = view.Prioritize(pod, all);
  EXPECT_EQ(fresh[0].second, 10);
  ASSERT_EQ(view.Filter(pod, all).passed, all);
  EXPECT_EQ(view.Prioritize(pod, all), fresh);  // unchanged view: same answer

  view.RemoveObject("gpulet-memory-roomy");
  auto p = view.Prioritize(pod, all);
  EXPECT_EQ(p[1], std::make_pair(std::string("roomy"), 0));
  EXPECT_EQ(p[0], fresh[0]);

  Publish(view, "roomy", {{80, 80}, {80, 80}}, "2");
  ASSERT_EQ(view.Filter(pod, all).passed, all);
  Publish(view, "tight", {{80, 0}, {80, 0}}, "2");  // now full
  EXPECT_EQ(view.Prioritize(pod, all)[0].second, 0);

  ASSERT_EQ(view.Filter(pod, {"roomy", "half"}).passed.size(), 2u);
  ASSERT_TRUE(view.Reserve(Request("other", {60}), "roomy").ok());
  const auto reserved = view.Prioritize(pod, {"roomy", "half"});
  ClusterView again(clock, {});
  Publish(again, "roomy", {{80, 20}, {80, 80}}, "1");
  Publish(again, "half", {{80, 40}, {80, 40}}, "1");
  EXPECT_EQ(reserved, again.Prioritize(pod, {"roomy", "half"}));

  ASSERT_EQ(view.Filter(pod, {"half"}).passed.size(), 1u);
  clock.Advance(std::chrono::seconds(91));  // past 3 × heartbeat since published: stale
  EXPECT_EQ(view.Prioritize(pod, {"half"})[0].second, 0);
  // A different list than the filter passed: every node looked up.
  EXPECT_EQ(view.Prioritize(pod, {"missing", "half"})[0].second, 0);
}

TEST(ExtenderArgs, NodeNamesParsedAsTheSchedulerSendsThem) {
  FakeClock clock;
  ClusterView view(clock, {});
  Publish(view, "n1", {{80, 80}}, "1");
  Publish(view, "n2", {{80, 10}}, "1");
  Extender ext = OfflineExtender(view);
  const json pod = MemoryPod("p", {20});
  auto filter = [&](const json& args) {
    Answer a = ext.Filter(args.dump());
    EXPECT_EQ(a.status, 200) << a.body;
    return json::parse(a.body);
  };
  EXPECT_EQ(
      filter({{"Pod", pod}, {"Nodes", nullptr}, {"NodeNames", {"n1", "n2", "n3"}}})["NodeNames"],
      json::array({"n1"}));
  // Go matches field names regardless of case.
  EXPECT_EQ(filter({{"Pod", pod}, {"nodeNames", {"n1", "n2"}}})["NodeNames"], json::array({"n1"}));
  EXPECT_EQ(filter({{"Pod", pod}, {"NodeNames", json::array()}})["NodeNames"], json::array());
  // Names nested deeper are not the list.
  EXPECT_EQ(
      filter(
          {{"Pod", pod}, {"NodeNames", {"n1"}}, {"Extra", {{"NodeNames", {"n2"}}}}})["NodeNames"],
      json::array({"n1"}));
  for (const json& bad : {json::array({"n1", 2}), json::array({"n1", {{"a", 1}}}),
                          json::array({"n1", json::array({"n2"})})}) {
    Answer a = ext.Filter(json{{"Pod", pod}, {"NodeNames", bad}}.dump());
    EXPECT_EQ(a.status, 400);
    EXPECT_THAT(a.body, HasSubstr("ExtenderArgs.NodeNames[1]: must be a string"));
  }
  // As the scheduler writes it (read without the general parser), and variants that are not.
  const std::string pj = pod.dump();
  for (const std::string& body :
       {"{\"Pod\":" + pj + ",\"Nodes\":null,\"NodeNames\":[\"n1\",\"n2\"]}",
        " {\n \"NodeNames\" : [ \"n2\" , \"n1\" ] ,\"Pod\" : " + pj + " } ",
        "{\"Pod\":" + pj + ",\"NodeNames\":[\"n\\u0031\"]}",
        "{\"Pod\":" + pj + ",\"X\":[1,{\"a\":\"]\\\"\"}],\"NodeNames\":[\"n1\"]}"}) {
    Answer a = ext.Filter(body);
    ASSERT_EQ(a.status, 200) << body;
    EXPECT_EQ(json::parse(a.body)["NodeNames"], json::array({"n1"})) << body;
  }
  for (const std::string& body : {"{\"Pod\":" + pj + ",\"NodeNames\":[\"n1\"]} x",
                                  "{\"Pod\":" + pj + ",\"NodeNames\":[\"n1\",]}",
                                  "{\"Pod\":" + pj + ",\"X\":[1,],\"NodeNames\":[\"n1\"]}",
                                  std::string("{\"Pod\":{\"a\":},\"NodeNames\":[\"n1\"]}")}) {
    EXPECT_EQ(ext.Filter(body).status, 400) << body;
  }
  Answer a = ext.Filter(json{{"Pod", pod}, {"NodeNames", "n1"}}.dump());
  EXPECT_EQ(a.status, 400);
  EXPECT_THAT(a.body, HasSubstr("NodeNames: must be a list"));
  Answer p = ext.Prioritize(json{{"Pod", pod}, {"NodeNames", {"n1", "n2"}}}.dump());
  ASSERT_EQ(p.status, 200);
  EXPECT_EQ(json::parse(p.body),
            json::parse(R"([{"Host":"n1","Score":2},{"Host":"n2","Score":0}])"));
}

// Filter's one-comparison path for one-container pods must still see the units bound pods hold.
TEST(Filter, SeesReservationsOnTheFastPath) {
  FakeClock clock;
  ViewOptions options;
  options.reservation_timeout = std::chrono::seconds(20);
  ClusterView view(clock, options);
  Publish(view, "n1", {{80, 30}}, "1");
  Publish(view, "n2", {{80, 30}}, "1");
  const PodRequest b = Request("b", {20});
  const std::vector<std::string> both = {"n1", "n2"};
  ASSERT_EQ(view.Filter(b, both).passed, both);
  ASSERT_TRUE(view.Reserve(Request("a", {20}), "n1").ok());
  FilterOutcome f = view.Filter(b, both);
  EXPECT_EQ(f.passed, std::vector<std::string>{"n2"});
  // The units a pending bind holds are no preemption victim's: unresolvable for now.
  EXPECT_THAT(f.unresolvable["n1"], HasSubstr("the largest free GPU has 10 units"));
  view.Unreserve("uid-default-a", "n1");
  EXPECT_EQ(view.Filter(b, both).passed, both);
  ASSERT_TRUE(view.Reserve(Request("a", {20}), "n1").ok());
  ASSERT_TRUE(view.Reserve(Request("c", {20}), "n2").ok());
  EXPECT_TRUE(view.Filter(b, both).passed.empty());
  clock.Advance(std::chrono::seconds(21));  // reservations expired
  EXPECT_EQ(view.Filter(b, both).passed, both);
  ASSERT_TRUE(view.Reserve(Request("a", {20}), "n1").ok());
  // The node lists pod a: its reservation is dropped, the published free units count.
  Publish(view, "n1", {{80, 10}}, "2",
          json::array({{{"namespace", "default"}, {"name", "a"}, {"units", 20}}}));
  EXPECT_EQ(view.Filter(b, both).passed, std::vector<std::string>{"n2"});
  Publish(view, "n1", {{80, 30}}, "3",
          json::array({{{"namespace", "default"}, {"name", "a"}, {"units", 0}}}));
  EXPECT_EQ(view.Filter(b, both).passed, both);
  EXPECT_EQ(view.stats().reservations, 0u);
}

// Filter and prioritize through the extender (scheduler-shaped bodies: the node lists are
// remembered by their bytes) give the answers the view gives for the same names looked up one by
// one, whatever changes in between: objects published, changed, removed and re-added (slots
// freed and reused), reservations made, dropped and expired, nodes deleted, time passing.
TEST(RememberedLists, AnswersEqualLookingEveryNameUp) {
  FakeClock clock;
  ViewOptions options;
  options.reservation_timeout = std::chrono::seconds(20);
  ClusterView view(clock, options);
  Extender ext = OfflineExtender(view);
  std::mt19937 rng(7);
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  std::vector<std::string> nodes;
  for (int i = 0; i < 24; ++i) nodes.push_back("node-" + std::to_string(i));
  // A few lists, repeated: all nodes, a half, a reordering, one with unknown names.
  std::vector<std::vector<std::string>> lists = {nodes};
  lists.push_back(std::vector<std::string>(nodes.begin(), nodes.begin() + 12));
  lists.push_back(std::vector<std::string>(nodes.rbegin(), nodes.rend()));
  lists.push_back({"node-3", "ghost-1", "node-5", "ghost-2"});
  int version = 1;
  auto publish = [&](const std::string& node) {
    std::vector<Gpu> gpus(1 + static_cast<size_t>(pick(4)));
    for (Gpu& g : gpus) {
      g.free = pick(81);
      g.healthy = pick(10) != 0;
    }
    Publish(view, node, gpus, std::to_string(++version));
  };
  for (const std::string& n : nodes) publish(n);
  int checked = 0;
  for (int step = 0; step < 600; ++step) {
    const std::string& node = nodes[static_cast<size_t>(pick(static_cast<int>(nodes.size())))];
    switch (pick(8)) {
      case 0:
        publish(node);
        break;
      case 1:
        view.RemoveObject("gpulet-memory-" + node);
        break;
      case 2:
        (void)view.Reserve(Request("r" + std::to_string(step), {1 + pick(40)}), node);
        break;
      case 3:
        view.RemoveNode(node);
        break;
      case 4:
        clock.Advance(std::chrono::seconds(pick(12)));
        break;
      default:
        break;
    }
    const json pod = MemoryPod("p" + std::to_string(pick(3)),
                               pick(3) == 0 ? std::vector<int64_t>{1 + pick(30), 1 + pick(30)}
                                            : std::vector<int64_t>{1 + pick(60)});
    auto parsed = ParsePodRequest(pod);
    ASSERT_TRUE(parsed.ok());
    const std::vector<std::string>& names = lists[static_cast<size_t>(pick(4))];
    // Filter: the extender's answer against each name looked up.
    Answer f = ext.Filter(CacheModeArgs(pod, names));
    ASSERT_EQ(f.status, 200);
    const json fr = json::parse(f.body);
    const FilterOutcome want = view.Filter(*parsed, names);
    ASSERT_EQ(fr["NodeNames"].get<std::vector<std::string>>(), want.passed) << "step " << step;
    ASSERT_EQ((fr["FailedNodes"].get<std::map<std::string, std::string>>()), want.failed);
    ASSERT_EQ((fr["FailedAndUnresolvableNodes"].get<std::map<std::string, std::string>>()),
              want.unresolvable);
    // Prioritize of what passed (the list filter remembered), and of the whole list.
    for (const std::vector<std::string>& asked : {want.passed, names}) {
      Answer p = ext.Prioritize(CacheModeArgs(pod, asked));
      ASSERT_EQ(p.status, 200);
      const auto scores = view.Prioritize(*parsed, asked);
      const json pr = json::parse(p.body);
      ASSERT_EQ(pr.size(), scores.size());
      for (size_t i = 0; i < scores.size(); ++i) {
        ASSERT_EQ(pr[i]["Host"], scores[i].first);
        ASSERT_EQ(pr[i]["Score"], scores[i].second) << "step " << step << " " << scores[i].first;
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, 600);
  EXPECT_LE(view.remembered_lists(), 8u);
}

TEST(RememberedLists, ARepeatedListIsResolvedOnceAndTheCacheIsBounded) {
  FakeClock clock;
  ClusterView view(clock, {});
  Publish(view, "a", {{80, 80}}, "1");
  Publish(view, "b", {{80, 5}}, "1");
  Publish(view, "c", {{80, 80}}, "1");
  Extender ext = OfflineExtender(view);
  const json pod = MemoryPod("p", {20});
  const std::string body = CacheModeArgs(pod, {"a", "b", "c"});
  ASSERT_EQ(json::parse(ext.Filter(body).body)["NodeNames"], json::array({"a", "c"}));
  EXPECT_EQ(view.remembered_lists(), 2u);  // the list asked, and the one that passed
  ASSERT_EQ(ext.Prioritize(CacheModeArgs(pod, {"a", "c"})).status, 200);
  ASSERT_EQ(json::parse(ext.Filter(body).body)["NodeNames"], json::array({"a", "c"}));
  EXPECT_EQ(view.remembered_lists(), 2u);
  // A node whose object appears later is found in a list remembered before it had one.
  ASSERT_EQ(json::parse(ext.Filter(CacheModeArgs(pod, {"a", "d"})).body)["NodeNames"],
            json::array({"a"}));
  Publish(view, "d", {{80, 80}}, "1");
  EXPECT_EQ(json::parse(ext.Filter(CacheModeArgs(pod, {"a", "d"})).body)["NodeNames"],
            json::array({"a", "d"}));
  // A freed slot reused by another node: each name still finds its own object.
  view.RemoveObject("gpulet-memory-a");
  Publish(view, "e", {{80, 1}}, "1");
  const json r = json::parse(ext.Filter(CacheModeArgs(pod, {"a", "e", "c"})).body);
  EXPECT_EQ(r["NodeNames"], json::array({"c"}));
  EXPECT_THAT(r["FailedAndUnresolvableNodes"]["a"].get<std::string>(),
              HasSubstr("no GPU memory object"));
  // No pod listed on e holds units preemption could free: unresolvable.
  EXPECT_THAT(r["FailedAndUnresolvableNodes"]["e"].get<std::string>(),
              HasSubstr("largest free GPU has 1 unit"));
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(ext.Filter(CacheModeArgs(pod, {"c", "n" + std::to_string(i)})).status, 200);
  }
  EXPECT_EQ(view.remembered_lists(), 8u);
  // A list larger than half the byte bound is answered the same and not kept.
  ClusterView small(clock, {.remembered_bytes = 64});
  Publish(small, "a", {{80, 80}}, "1");
  Extender small_ext = OfflineExtender(small);
  ASSERT_EQ(json::parse(small_ext.Filter(CacheModeArgs(pod, {"a", "b"})).body)["NodeNames"],
            json::array({"a"}));
  EXPECT_EQ(small.remembered_lists(), 2u);  // both lists are under 32 bytes
  const std::vector<std::string> long_list = {"a", "node-with-a-long-name", "another-long-one"};
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(json::parse(small_ext.Filter(CacheModeArgs(pod, long_list)).body)["NodeNames"],
              json::array({"a"}));
  }
  EXPECT_EQ(small.remembered_lists(), 2u);
  // Lists the general parser reads (escapes) are answered the same and not remembered.
  ClusterView plain(clock, {});
  Publish(plain, "a", {{80, 80}}, "1");
  Extender plain_ext = OfflineExtender(plain);
  const std::string escaped = "{\"Pod\":" + pod.dump() + ",\"NodeNames\":[\"\\u0061\"]}";
  EXPECT_EQ(json::parse(plain_ext.Filter(escaped).body)["NodeNames"], json::array({"a"}));
  EXPECT_EQ(plain.remembered_lists(), 0u);
}

// Issue 23: the API server writes requests in canonical form ("2k" for 2,000); every form of the
// quantity grammar must be read, and what is not a whole count refused with the field.
TEST(ParsePodRequest, QuantitiesInEveryCanonicalForm) {
  for (const auto& [text, units] : std::vector<std::pair<std::string, int64_t>>{
           {"2k", 2000}, {"2Ki", 2048}, {"1e3", 1000}, {"2000m", 2}, {"1.5k", 1500}}) {
    json pod = MemoryPod("q", {0});
    pod["spec"]["containers"][0]["resources"] = {{"requests", {{kResource, text}}}};
    auto r = ParsePodRequest(pod);
    ASSERT_TRUE(r.ok()) << text << ": " << r.status().message();
    EXPECT_EQ(r->total(), units) << text;
  }
  FakeClock clock;
  ClusterView view(clock, {});
  Publish(view, "n1", {{4096, 2048}}, "1");
  json pod = MemoryPod("q", {0});
  pod["spec"]["containers"][0]["resources"] = {{"limits", {{kResource, "2Ki"}}}};
  EXPECT_TRUE(view.Evaluate(*ParsePodRequest(pod), "n1").fits);
  pod["spec"]["containers"][0]["resources"] = {{"limits", {{kResource, "3k"}}}};
  EXPECT_FALSE(view.Evaluate(*ParsePodRequest(pod), "n1").fits);
  pod["spec"]["containers"][0]["resources"] = {{"limits", {{kResource, "1500m"}}}};
  EXPECT_THAT(ParsePodRequest(pod).status().message(),
              HasSubstr("resources.limits[\"gpulet.io/gpu-memory-1gi\"]: must be a whole number "
                        "of units: \"1500m\": not a whole number"));
  pod["spec"]["containers"][0]["resources"] = {{"limits", {{kResource, "2K"}}}};
  EXPECT_THAT(ParsePodRequest(pod).status().message(), HasSubstr("unknown suffix"));
}

// Issue 23: a pool renamed in the node agent's config (`rename: example.com/vram`) publishes that
// name in its objects; the extender must judge pods asking for it per GPU too.
TEST(Filter, RenamedPoolIsJudgedPerGpu) {
  FakeClock clock;
  ClusterView view(clock, {});
  json m = MemoryJson("n1", {{80, 40}, {80, 40}});
  m["resource"] = "example.com/vram";
  view.UpsertObject(MemoryConfigMap("n1", m.dump(), "1"));
  Extender ext = OfflineExtender(view);
  json pod = MemoryPod("big", {50}, "default", "example.com/vram");
  json f = json::parse(ext.Filter(CacheModeArgs(pod, {"n1"})).body);
  EXPECT_TRUE(f["NodeNames"].empty()) << f;
  const std::string reason =
      f["FailedAndUnresolvableNodes"].value("n1", "") + f["FailedNodes"].value("n1", "");
  EXPECT_THAT(reason, HasSubstr("needs 50 units of example.com/vram on one GPU"));
  // A name the operator lists is recognised before any object publishes it.
  ClusterView listed(clock, {.memory_resources = {"example.com/hbm"}});
  EXPECT_TRUE(listed.IsMemoryResource("example.com/hbm"));
  EXPECT_FALSE(listed.IsMemoryResource("example.com/vram"));
  EXPECT_TRUE(view.IsMemoryResource("example.com/vram"));
}

// Issue 23: init containers as the kubelet's device manager allocates them. A sidecar
// (restartPolicy: Always) keeps its units beside the app's; an ordinary init container's units
// are reused first by the next container, which then stays on that GPU.
TEST(Filter, InitContainersAndSidecarsAsTheKubeletAllocates) {
  FakeClock clock;
  ClusterView view(clock, {});
  auto with_init = [](std::vector<int64_t> app, int64_t init, bool sidecar) {
    json pod = MemoryPod("p", app);
    json c = {{"name", "init"}, {"resources", {{"limits", {{kResource, std::to_string(init)}}}}}};
    if (sidecar) c["restartPolicy"] = "Always";
    pod["spec"]["initContainers"] = json::array({c});
    auto r = ParsePodRequest(pod);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return *r;
  };
  // Sidecar 30 + app 30 on one GPU with 50 free and another with 20: the app finds no GPU.
  Publish(view, "n1", {{80, 50}, {80, 20}}, "1");
  PodRequest sidecar = with_init({30}, 30, true);
  EXPECT_EQ(sidecar.total(), 60);
  NodeVerdict v = view.Evaluate(sidecar, "n1");
  EXPECT_FALSE(v.fits);
  EXPECT_THAT(v.reason, HasSubstr("container \"c0\" needs 30 units"));
  // The same as an ordinary init container: the app reuses its units.
  PodRequest init = with_init({30}, 30, false);
  EXPECT_EQ(init.total(), 30);
  v = view.Evaluate(init, "n1");
  EXPECT_TRUE(v.fits) << v.reason;
  ASSERT_EQ(v.assignments.size(), 1u);  // the app's units come from the init container's
  EXPECT_EQ(v.assignments[0].units, 30);
  // Init 20 goes to the tightest GPU (25 free); the app (40) reuses those 20 and must find the
  // other 20 on the same GPU, which has 5: no fit (counting the app alone, GPU 1 would do).
  Publish(view, "n2", {{80, 25}, {80, 60}}, "1");
  v = view.Evaluate(with_init({40}, 20, false), "n2");
  EXPECT_FALSE(v.fits);
  EXPECT_THAT(v.reason, HasSubstr("it reuses 20 units an init container released on GPU 0"));
  // An init container larger than the app: the pod holds the init container's units.
  Publish(view, "n3", {{80, 70}}, "1");
  PodRequest big_init = with_init({10}, 70, false);
  EXPECT_EQ(big_init.total(), 70);
  ASSERT_TRUE(view.Evaluate(big_init, "n3").fits);
  auto held = view.Reserve(big_init, "n3");
  ASSERT_TRUE(held.ok()) << held.status().message();
  EXPECT_EQ(view.stats().reserved_units, 70);
}

// Issue 23: reservations are the pod's (UID), not its name's: a StatefulSet pod recreated under
// the same name is another pod, and an object listing the earlier one is no evidence for it.
TEST(Reserve, KeyedByUidAndEndedOnEvidence) {
  FakeClock clock;
  ClusterView view(clock, {});
  const json earlier = json::array(
      {{{"namespace", "default"}, {"name", "a"}, {"gpu", GpuUuid("n1", 0)}, {"units", 20}}});
  Publish(view, "n1", {{80, 60}}, "1", earlier);  // the earlier pod a still listed
  PodRequest a = Request("a", {40});
  a.uid = "uid-new";
  bool already = true;
  ASSERT_TRUE(view.Reserve(a, "n1", &already).ok());
  EXPECT_FALSE(already);
  // A republication still listing (the earlier) a does not end the new pod's reservation.
  Publish(view, "n1", {{80, 60}}, "2", earlier);
  EXPECT_EQ(view.stats().reservations, 1u);
  // Another pod with the same name but yet another UID is not "already" reserved.
  PodRequest again = Request("a", {10});
  again.uid = "uid-third";
  ASSERT_TRUE(view.Reserve(again, "n1", &already).ok());
  EXPECT_FALSE(already);
  EXPECT_EQ(view.stats().reserved_units, 50);
  // The earlier pod leaves, then the new one is listed: that is evidence.
  Publish(view, "n1", {{80, 30}}, "3");
  EXPECT_EQ(view.stats().reservations, 2u);
  Publish(
      view, "n1", {{80, 20}}, "4",
      json::array(
          {{{"namespace", "default"}, {"name", "a"}, {"gpu", GpuUuid("n1", 0)}, {"units", 40}}}));
  EXPECT_EQ(view.stats().reservations, 0u);
  // The API server says the pod is gone: EndReservation.
  PodRequest b = Request("b", {10});
  ASSERT_TRUE(view.Reserve(b, "n1").ok());
  ASSERT_EQ(view.Reservations().size(), 1u);
  EXPECT_EQ(view.Reservations()[0].uid, "uid-default-b");
  view.EndReservation("uid-default-b");
  EXPECT_EQ(view.stats().reservations, 0u);
  // No UID, no reservation.
  PodRequest anonymous = Request("c", {10});
  anonymous.uid.clear();
  EXPECT_EQ(view.Reserve(anonymous, "n1").status().code(), ErrorCode::kInvalidInput);
}

// Issue 23: a node where evicting every pod it lists still leaves no GPU with the units is
// unresolvable (the scheduler then preempts nobody there); elsewhere the reason says what
// preemption could free, and where.
TEST(Filter, SaysWhatPreemptionCouldFree) {
  FakeClock clock;
  ClusterView view(clock, {});
  const json pods =
      json::array({{{"namespace", "t"}, {"name", "x"}, {"gpu", GpuUuid("n1", 0)}, {"units", 60}},
                   {{"namespace", "t"}, {"name", "y"}, {"gpu", GpuUuid("n1", 1)}, {"units", 10}}});
  Publish(view, "n1", {{80, 20}, {80, 30}}, "1", pods);
  FilterOutcome f = view.Filter(Request("p", {70}), {"n1"});
  ASSERT_EQ(f.failed.count("n1"), 1u);
  EXPECT_THAT(f.failed["n1"], HasSubstr("preemption could free 80 units on GPU 0"));
  // 90 units: no GPU has that many even empty.
  f = view.Filter(Request("p", {90}), {"n1"});
  ASSERT_EQ(f.unresolvable.count("n1"), 1u);
  EXPECT_THAT(f.unresolvable["n1"], HasSubstr("preemption cannot help"));
  // Units held but not listed (another allocation in flight) are nobody's to evict.
  Publish(view, "n2", {{80, 20}, {80, 30}}, "1");
  f = view.Filter(Request("p", {40}), {"n2"});
  EXPECT_THAT(f.unresolvable["n2"], HasSubstr("frees at most 30 units on one GPU"));
}

// Issue 23: a request may name at most kMaxNodeNames nodes, in either parser's shape.
TEST(ExtenderArgs, AtMostFifteenThousandNodes) {
  FakeClock clock;
  ClusterView view(clock, {});
  Extender ext = OfflineExtender(view);
  const json pod = MemoryPod("p", {1});
  std::vector<std::string> names(kMaxNodeNames);
  for (size_t i = 0; i < names.size(); ++i) names[i] = "n" + std::to_string(i);
  EXPECT_EQ(ext.Filter(CacheModeArgs(pod, names)).status, 200);
  names.push_back("one-more");
  Answer a = ext.Filter(CacheModeArgs(pod, names));
  EXPECT_EQ(a.status, 400);
  EXPECT_THAT(a.body, HasSubstr("more than 15000 nodes"));
  // Escaped names go through the SAX reader: the same bound.
  std::string escaped = "{\"Pod\":" + pod.dump() + ",\"NodeNames\":[";
  for (size_t i = 0; i <= kMaxNodeNames; ++i)
    escaped += (i ? ",\"\\u0061" : "\"\\u0061") + std::to_string(i) + "\"";
  escaped += "]}";
  a = ext.Filter(escaped);
  EXPECT_EQ(a.status, 400);
  EXPECT_THAT(a.body, HasSubstr("more than 15000 nodes"));
}

}  // namespace
}  // namespace gpulet::extender
