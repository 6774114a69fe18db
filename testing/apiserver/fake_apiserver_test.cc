// The API server stand-in behaves as kube-apiserver does where gpulet depends on it (issue 26,
// items 5–8): selector watches turn a label change into ADDED/DELETED, BOOKMARK, 410 and other
// ERROR events in the middle of a stream, timeoutSeconds; no-op patches write nothing; strategic
// merge is refused where it differs from a merge patch; PUT and DELETE with preconditions; uid and
// creationTimestamp defaulting; injected write faults; binding and eviction refusals. Every check
// goes through the real client over TLS.
#include "apiserver/fake_apiserver.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <thread>

#include "apiserver/test_objects.h"
#include "k8s/client.h"
#include "support/wait_until.h"

namespace gpulet::testing {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

const std::string kCms = "/api/v1/namespaces/ns/configmaps";

json Cm(const std::string& name, bool labelled) {
  json cm = {{"apiVersion", "v1"},
             {"kind", "ConfigMap"},
             {"metadata", {{"name", name}, {"namespace", "ns"}}},
             {"data", {{"k", "v"}}}};
  if (labelled) cm["metadata"]["labels"]["pick"] = "yes";
  return cm;
}

// One watch in a thread; records "TYPE name" lines and how the stream ended.
class Watcher {
 public:
  Watcher(const k8s::Client& client, std::string path) {
    thread_ = std::thread([this, &client, path] {
      k8s::WatchResult r = client.Watch(
          path,
          [this](const k8s::WatchEvent& e) {
            std::lock_guard<std::mutex> lock(mu_);
            std::string name;
            if (e.object.contains("metadata") && e.object["metadata"].contains("name")) {
              name = e.object["metadata"].value("name", "");
            }
            events_.push_back(e.type + (name.empty() ? "" : " " + name));
            objects_.push_back(e.object);
            return true;
          },
          &stop_);
      std::lock_guard<std::mutex> lock(mu_);
      end_ = r.end;
      error_ = r.error.message();
      ended_ = true;
    });
  }
  ~Watcher() {
    stop_ = true;
    thread_.join();
  }
  std::vector<std::string> events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  json object(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    return objects_.at(i);
  }
  bool WaitEvents(size_t n) {
    return WaitUntil([&] { return events().size() >= n; }, 20s);
  }
  bool WaitEnded() {
    return WaitUntil(
        [&] {
          std::lock_guard<std::mutex> lock(mu_);
          return ended_;
        },
        20s);
  }
  k8s::WatchEnd end() {
    std::lock_guard<std::mutex> lock(mu_);
    return end_;
  }
  std::string error() {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

 private:
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::string> events_;
  std::vector<json> objects_;
  k8s::WatchEnd end_ = k8s::WatchEnd::kClosed;
  std::string error_;
  bool ended_ = false;
  std::thread thread_;
};

class FakeApiServerTest : public ::testing::Test {
 protected:
  // One throwaway PKI for the suite: making RSA keys is the slow part of each test.
  static void SetUpTestSuite() {
    std::string tmpl = ::testing::TempDir() + "gpulet-fakeapi-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    Result<TestPki> pki = MakeTestPki(dir_);
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    pki_ = *pki;
  }
  static void TearDownTestSuite() {
    std::string cmd = "rm -rf '" + dir_ + "'";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  void SetUp() override {
    ASSERT_FALSE(pki_.ca_cert.empty());
    FakeApiServer::Options options;
    options.pod_termination = 300ms;
    auto api = FakeApiServer::Start(pki_, options);
    ASSERT_TRUE(api.ok()) << api.status().message();
    api_ = std::move(*api);
    client_ = std::make_unique<k8s::Client>(api_->Access(pki_));
  }
  void TearDown() override {
    client_.reset();
    api_.reset();
  }
  static inline std::string dir_;
  static inline TestPki pki_;
  std::unique_ptr<FakeApiServer> api_;
  std::unique_ptr<k8s::Client> client_;
};

// An object whose label is removed leaves a label-selected watch as DELETED; one that gains the
// label enters it as ADDED (cache_watcher.go). The old stand-in looked only at the new object,
// so a watcher never heard that an object stopped matching.
TEST_F(FakeApiServerTest, LabelChangesMoveObjectsInAndOutOfASelectedWatch) {
  api_->Put(kCms + "/a", Cm("a", true));
  api_->Put(kCms + "/b", Cm("b", false));
  Watcher w(*client_, kCms + "?watch=1&labelSelector=pick%3Dyes");
  ASSERT_TRUE(w.WaitEvents(1));
  EXPECT_EQ(w.events()[0], "ADDED a");
  ASSERT_TRUE(api_->WaitForOpenWatches(1, 10s));
  api_->Put(kCms + "/a", Cm("a", false));  // stops matching
  api_->Put(kCms + "/b", Cm("b", true));   // starts matching
  json b = Cm("b", true);
  b["data"]["k"] = "w";
  api_->Put(kCms + "/b", b);  // still matching
  api_->Put(kCms + "/a", [] {
    json a = Cm("a", false);
    a["data"]["k"] = "x";
    return a;
  }());  // changed, never matching: nothing
  api_->Delete(kCms + "/b");
  ASSERT_TRUE(w.WaitEvents(5));
  EXPECT_EQ(w.events(), (std::vector<std::string>{"ADDED a", "DELETED a", "ADDED b",
                                                  "MODIFIED b", "DELETED b"}));
  // The DELETED of a carries its last matching state at the event's version.
  json gone = w.object(1);
  EXPECT_EQ(gone["metadata"]["labels"]["pick"], "yes");
  EXPECT_GT(std::stoull(gone["metadata"].value("resourceVersion", "0")), 0u);
}

TEST_F(FakeApiServerTest, FieldSelectedWatchSeesAPodLeaveItsNode) {
  api_->Put("/api/v1/namespaces/ns/pods/p", GpuPodObject("p", "ns", 1, "n1"));
  Watcher w(*client_, "/api/v1/pods?watch=1&fieldSelector=spec.nodeName%3Dn1");
  ASSERT_TRUE(w.WaitEvents(1));
  ASSERT_TRUE(api_->WaitForOpenWatches(1, 10s));
  api_->Put("/api/v1/namespaces/ns/pods/p", GpuPodObject("p", "ns", 1, "n2"));
  ASSERT_TRUE(w.WaitEvents(2));
  EXPECT_EQ(w.events()[1], "DELETED p");
}

TEST_F(FakeApiServerTest, BookmarksOnlyForWatchesThatAskAndCarryTheVersion) {
  api_->Put(kCms + "/a", Cm("a", true));
  Watcher with(*client_, kCms + "?watch=1&allowWatchBookmarks=true");
  Watcher without(*client_, kCms + "?watch=1");
  ASSERT_TRUE(with.WaitEvents(1));
  ASSERT_TRUE(without.WaitEvents(1));
  ASSERT_TRUE(api_->WaitForOpenWatches(2, 10s));
  const uint64_t v = api_->Put(kCms + "/a", Cm("a", false));
  ASSERT_TRUE(with.WaitEvents(2));
  api_->SendBookmarks();
  ASSERT_TRUE(with.WaitEvents(3));
  EXPECT_EQ(with.events()[2], "BOOKMARK");
  EXPECT_EQ(with.object(2)["metadata"]["resourceVersion"], std::to_string(v));
  EXPECT_EQ(with.object(2)["kind"], "ConfigMap");
  api_->Put(kCms + "/b", Cm("b", true));
  ASSERT_TRUE(without.WaitEvents(3));
  EXPECT_EQ(without.events(), (std::vector<std::string>{"ADDED a", "MODIFIED a", "ADDED b"}));
}

TEST_F(FakeApiServerTest, GoneInTheMiddleOfAStreamEndsItAsGone) {
  api_->Put(kCms + "/a", Cm("a", true));
  Watcher w(*client_, kCms + "?watch=1");
  ASSERT_TRUE(w.WaitEvents(1));
  ASSERT_TRUE(api_->WaitForOpenWatches(1, 10s));
  api_->ExpireWatches();
  ASSERT_TRUE(w.WaitEnded());
  EXPECT_EQ(w.end(), k8s::WatchEnd::kGone);
}

TEST_F(FakeApiServerTest, OtherErrorEventsArriveAndEndTheStream) {
  api_->Put(kCms + "/a", Cm("a", true));
  Watcher w(*client_, kCms + "?watch=1");
  ASSERT_TRUE(w.WaitEvents(1));
  ASSERT_TRUE(api_->WaitForOpenWatches(1, 10s));
  api_->SendWatchError(500, "InternalError", "etcd went away");
  ASSERT_TRUE(w.WaitEvents(2));
  EXPECT_EQ(w.events()[1], "ERROR");
  EXPECT_EQ(w.object(1)["code"], 500);
  ASSERT_TRUE(w.WaitEnded());
  EXPECT_EQ(w.end(), k8s::WatchEnd::kClosed);
}

TEST_F(FakeApiServerTest, TimeoutSecondsEndsTheStreamCleanly) {
  api_->Put(kCms + "/a", Cm("a", true));
  Watcher w(*client_, kCms + "?watch=1&timeoutSeconds=1");
  ASSERT_TRUE(w.WaitEnded());
  EXPECT_EQ(w.end(), k8s::WatchEnd::kClosed);
  EXPECT_EQ(w.events(), (std::vector<std::string>{"ADDED a"}));
}

TEST_F(FakeApiServerTest, CreateAssignsUidAndCreationTimestampThatUpdatesKeep) {
  json cm = Cm("c", false);
  cm["metadata"]["uid"] = "chosen-by-client";
  k8s::ApiResult<json> made = client_->Post(kCms, cm);
  ASSERT_TRUE(made.ok()) << made.status().message();
  const std::string uid = (*made)["metadata"].value("uid", "");
  EXPECT_FALSE(uid.empty());
  EXPECT_NE(uid, "chosen-by-client");
  EXPECT_FALSE((*made)["metadata"].value("creationTimestamp", "").empty());
  k8s::ApiResult<json> patched = client_->Patch(
      kCms + "/c", {{"metadata", {{"uid", "other"}}}, {"data", {{"k", "w"}}}},
      k8s::PatchType::kMerge);
  ASSERT_TRUE(patched.ok());
  EXPECT_EQ((*patched)["metadata"]["uid"], uid);
}

TEST_F(FakeApiServerTest, ANoOpPatchWritesNothing) {
  api_->Put(kCms + "/a", Cm("a", true));
  const uint64_t before = api_->current_version();
  Watcher w(*client_, kCms + "?watch=1");
  ASSERT_TRUE(w.WaitEvents(1));
  ASSERT_TRUE(api_->WaitForOpenWatches(1, 10s));
  k8s::ApiResult<json> same =
      client_->Patch(kCms + "/a", {{"data", {{"k", "v"}}}}, k8s::PatchType::kMerge);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(api_->current_version(), before);
  EXPECT_EQ((*same)["metadata"]["resourceVersion"], std::to_string(before));
  // The next real change is the next event: nothing was sent for the no-op.
  api_->Put(kCms + "/b", Cm("b", true));
  ASSERT_TRUE(w.WaitEvents(2));
  EXPECT_EQ(w.events()[1], "ADDED b");
}

TEST_F(FakeApiServerTest, StrategicMergeOfAListIsRefusedNotGuessed) {
  api_->Put("/api/v1/nodes/n1", {{"metadata", {{"name", "n1"}}},
                                 {"spec", {{"taints", json::array({{{"key", "a"}}})}}}});
  k8s::ApiResult<json> r =
      client_->Patch("/api/v1/nodes/n1", {{"spec", {{"taints", json::array({{{"key", "b"}}})}}}},
                     k8s::PatchType::kStrategicMerge);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.http_status(), 422);
  EXPECT_EQ((*api_->Object("/api/v1/nodes/n1"))["spec"]["taints"].size(), 1u);
  k8s::ApiResult<json> maps = client_->Patch(
      "/api/v1/nodes/n1", {{"metadata", {{"labels", {{"x", "y"}}}}}},
      k8s::PatchType::kStrategicMerge);
  EXPECT_TRUE(maps.ok());
}

TEST_F(FakeApiServerTest, InjectedWriteFaultsHitOnlyTheirWrites) {
  api_->Put(kCms + "/a", Cm("a", true));
  const json patch = {{"data", {{"k", "w"}}}};
  api_->InjectWriteFault({.method = "PATCH", .path_prefix = kCms, .code = 503});
  k8s::ApiResult<json> r = client_->Patch(kCms + "/a", patch, k8s::PatchType::kMerge);
  EXPECT_EQ(r.http_status(), 503);
  EXPECT_EQ((*api_->Object(kCms + "/a"))["data"]["k"], "v");

  api_->InjectWriteFault({.kind = WriteFault::Kind::kTooManyRequests, .retry_after_seconds = 7});
  r = client_->Patch(kCms + "/a", patch, k8s::PatchType::kMerge);
  EXPECT_EQ(r.http_status(), 429);

  api_->InjectWriteFault({.kind = WriteFault::Kind::kTimeout, .delay = 200ms});
  r = client_->Patch(kCms + "/a", patch, k8s::PatchType::kMerge);
  EXPECT_EQ(r.http_status(), 504);
  EXPECT_EQ((*api_->Object(kCms + "/a"))["data"]["k"], "v");

  // The write lands but its answer is lost: the client sees a transport error, no HTTP status.
  api_->InjectWriteFault({.kind = WriteFault::Kind::kLostAnswer});
  r = client_->Patch(kCms + "/a", patch, k8s::PatchType::kMerge);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.http_status(), 0);
  EXPECT_EQ((*api_->Object(kCms + "/a"))["data"]["k"], "w");

  // Spent: the next write succeeds; reads never meet a write fault.
  api_->InjectWriteFault({.method = "POST"});
  EXPECT_TRUE(client_->Get(kCms + "/a").ok());
  EXPECT_TRUE(client_->Patch(kCms + "/a", {{"data", {{"k", "z"}}}}, k8s::PatchType::kMerge).ok());
}

TEST_F(FakeApiServerTest, BindingRefusesPodsBeingDeletedOrGatedAndSetsPodScheduled) {
  const std::string pods = "/api/v1/namespaces/ns/pods/";
  api_->Put(pods + "gated", [] {
    json p = GpuPodObject("gated", "ns", 1, "");
    p["spec"]["schedulingGates"] = json::array({{{"name", "wait"}}});
    return p;
  }());
  api_->Put(pods + "leaving", [] {
    json p = GpuPodObject("leaving", "ns", 1, "");
    p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z";
    return p;
  }());
  api_->Put(pods + "ok", GpuPodObject("ok", "ns", 1, ""));
  const json binding = {{"target", {{"kind", "Node"}, {"name", "n1"}}}};
  for (const char* name : {"gated", "leaving"}) {
    k8s::ApiResult<json> r = client_->Post(pods + name + "/binding", binding);
    EXPECT_EQ(r.http_status(), 409) << name;
    EXPECT_EQ((*api_->Object(pods + name))["spec"].value("nodeName", ""), "") << name;
  }
  ASSERT_TRUE(client_->Post(pods + "ok/binding", binding).ok());
  json bound = *api_->Object(pods + "ok");
  EXPECT_EQ(bound["spec"]["nodeName"], "n1");
  bool scheduled = false;
  for (const json& c : bound["status"]["conditions"]) {
    if (c["type"] == "PodScheduled") scheduled = c["status"] == "True";
  }
  EXPECT_TRUE(scheduled);
}

TEST_F(FakeApiServerTest, EvictionLeavesARunningPodTerminatingThenGone) {
  const std::string pod = "/api/v1/namespaces/ns/pods/run";
  api_->Put(pod, GpuPodObject("run", "ns", 1, "n1"));
  k8s::ApiResult<json> r = client_->Post(
      pod + "/eviction", {{"apiVersion", "policy/v1"},
                          {"kind", "Eviction"},
                          {"metadata", {{"name", "run"}, {"namespace", "ns"}}}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  std::optional<json> terminating = api_->Object(pod);
  ASSERT_TRUE(terminating.has_value());  // Terminating, not gone
  EXPECT_TRUE(terminating->at("metadata").contains("deletionTimestamp"));
  EXPECT_EQ(terminating->at("metadata").value("deletionGracePeriodSeconds", 0), 30);
  EXPECT_TRUE(WaitUntil([&] { return !api_->Object(pod).has_value(); }, 20s));
}

TEST_F(FakeApiServerTest, EvictionChecksEveryBudgetButNotForPodsThatAreNotRunning) {
  const std::string pods = "/api/v1/namespaces/ns/pods/";
  const std::string pdbs = "/apis/policy/v1/namespaces/ns/poddisruptionbudgets/";
  json labelled = GpuPodObject("two", "ns", 1, "n1");
  labelled["metadata"]["labels"] = {{"app", "x"}, {"tier", "gpu"}};
  api_->Put(pods + "two", labelled);
  api_->Put(pdbs + "by-app", {{"metadata", {{"name", "by-app"}, {"namespace", "ns"}}},
                              {"spec", {{"selector", {{"matchLabels", {{"app", "x"}}}}}}},
                              {"status", {{"disruptionsAllowed", 1}}}});
  api_->Put(pdbs + "by-tier",
            {{"metadata", {{"name", "by-tier"}, {"namespace", "ns"}}},
             {"spec",
              {{"selector",
                {{"matchExpressions",
                  json::array({{{"key", "tier"}, {"operator", "In"},
                                {"values", json::array({"gpu"})}}})}}}}},
             {"status", {{"disruptionsAllowed", 0}}}});
  k8s::ApiResult<json> r = client_->Post(pods + "two/eviction", {{"metadata", {{"name", "two"}}}});
  ASSERT_FALSE(r.ok());  // a Failure Status in a 201, code 500
  EXPECT_EQ(r.http_status(), 500);
  EXPECT_NE(r.status().message().find("more than one PodDisruptionBudget"), std::string::npos);
  EXPECT_FALSE(api_->Object(pods + "two")->at("metadata").contains("deletionTimestamp"));

  // Pending: no budget is consulted, the pod goes at once (it is not bound).
  json pending = GpuPodObject("wait", "ns", 1, "");
  pending["metadata"]["labels"] = {{"tier", "gpu"}};
  api_->Put(pods + "wait", pending);
  ASSERT_TRUE(client_->Post(pods + "wait/eviction", {{"metadata", {{"name", "wait"}}}}).ok());
  EXPECT_FALSE(api_->Object(pods + "wait").has_value());
}

// gpulet's client has no PUT or DELETE (it uses neither); the stand-in serves them as upstream
// does for tests and tools, checked here with a plain HTTPS client.
TEST_F(FakeApiServerTest, PutAndDeleteHonourPreconditions) {
  api_->Put(kCms + "/a", Cm("a", true));
  httplib::SSLClient http("127.0.0.1", std::stoi(api_->url().substr(api_->url().rfind(':') + 1)));
  http.set_ca_cert_path(pki_.ca_cert.c_str());
  http.enable_server_certificate_verification(true);
  const httplib::Headers auth = {{"Authorization", "Bearer test-token"}};
  json body = *api_->Object(kCms + "/a");
  const std::string uid = body["metadata"]["uid"];
  body["data"]["k"] = "put";
  body["metadata"]["resourceVersion"] = "1";  // stale
  auto r = http.Put(kCms + "/a", auth, body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 409);
  body["metadata"].erase("resourceVersion");  // unconditional
  r = http.Put(kCms + "/a", auth, body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ((*api_->Object(kCms + "/a"))["data"]["k"], "put");
  r = http.Put(kCms + "/missing", auth, Cm("missing", false).dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);

  const json wrong_uid = {{"preconditions", {{"uid", "not-" + uid}}}};
  r = http.Delete(kCms + "/a", auth, wrong_uid.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 409);
  EXPECT_TRUE(api_->Object(kCms + "/a").has_value());
  const json right_uid = {{"preconditions", {{"uid", uid}}}};
  r = http.Delete(kCms + "/a", auth, right_uid.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_FALSE(api_->Object(kCms + "/a").has_value());

  // A bound pod deleted with gracePeriodSeconds 0 goes at once.
  api_->Put("/api/v1/namespaces/ns/pods/p", GpuPodObject("p", "ns", 1, "n1"));
  r = http.Delete("/api/v1/namespaces/ns/pods/p", auth, R"({"gracePeriodSeconds":0})",
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_FALSE(api_->Object("/api/v1/namespaces/ns/pods/p").has_value());
}

// resource.k8s.io/v1 as the DRA driver and the kubelet use it (issue 22): slices listed, watched
// and wiped by spec.nodeName; a claim's status written only through /status (the scheduler's
// way), its main-path writes keeping the status; slices the real server refuses are refused.
const std::string kSlices = "/apis/resource.k8s.io/v1/resourceslices";
const std::string kClaims = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims";

json Slice(const std::string& name, const std::string& node, size_t devices) {
  json s = {{"apiVersion", "resource.k8s.io/v1"},
            {"kind", "ResourceSlice"},
            {"metadata", {{"name", name}}},
            {"spec",
             {{"driver", "gpu.gpulet.io"},
              {"nodeName", node},
              {"pool", {{"name", node}, {"generation", 1}, {"resourceSliceCount", 1}}},
              {"devices", json::array()}}}};
  for (size_t i = 0; i < devices; ++i) {
    s["spec"]["devices"].push_back({{"name", "gpu-" + std::to_string(i)}});
  }
  return s;
}

TEST_F(FakeApiServerTest, SlicesAreSelectedWatchedAndWipedByNodeName) {
  ASSERT_TRUE(client_->Post(kSlices, Slice("a-0", "node-a", 1)).ok());
  ASSERT_TRUE(client_->Post(kSlices, Slice("a-1", "node-a", 1)).ok());
  ASSERT_TRUE(client_->Post(kSlices, Slice("b-0", "node-b", 1)).ok());
  const std::string sel = "fieldSelector=" + k8s::EscapeQueryValue("spec.nodeName=node-a");
  auto list = client_->Get(kSlices + "?" + sel);
  ASSERT_TRUE(list.ok()) << list.status().message();
  ASSERT_EQ((*list)["items"].size(), 2u);
  Watcher w(*client_, kSlices + "?watch=1&" + sel + "&resourceVersion=" +
                          (*list)["metadata"]["resourceVersion"].get<std::string>());
  ASSERT_TRUE(api_->WaitForOpenWatches(1, 10s));
  auto wiped = client_->Delete(kSlices + "?" + sel);  // the kubelet's deletecollection
  ASSERT_TRUE(wiped.ok()) << wiped.status().message();
  EXPECT_EQ((*wiped)["items"].size(), 2u);
  ASSERT_TRUE(w.WaitEvents(2));
  EXPECT_EQ(w.events(), (std::vector<std::string>{"DELETED a-0", "DELETED a-1"}));
  EXPECT_FALSE(api_->Object(kSlices + "/a-0").has_value());
  EXPECT_TRUE(api_->Object(kSlices + "/b-0").has_value());
  auto gone = client_->Delete(kSlices + "/a-0");
  EXPECT_EQ(gone.http_status(), 404);
}

TEST_F(FakeApiServerTest, SlicesBeyondTheApiLimitsAreRefusedAsTheRealServerDoes) {
  auto ok = client_->Post(kSlices, Slice("s", "n", 128));
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  auto too_many = client_->Post(kSlices, Slice("t", "n", 129));
  EXPECT_EQ(too_many.http_status(), 422);
  json counted = Slice("c", "n", 65);
  counted["spec"]["devices"][0]["consumesCounters"] =
      json::array({{{"counterSet", "gpu-0"}, {"counters", {{"memory", {{"value", "1"}}}}}}});
  EXPECT_EQ(client_->Post(kSlices, counted).http_status(), 422);  // 64 with counters
  json both = Slice("b", "n", 1);
  both["spec"]["sharedCounters"] =
      json::array({{{"name", "gpu-0"}, {"counters", {{"memory", {{"value", "1"}}}}}}});
  EXPECT_EQ(client_->Post(kSlices, both).http_status(), 422);  // devices and counters
  json sets = Slice("k", "n", 0);
  for (int i = 0; i < 9; ++i) {
    sets["spec"]["sharedCounters"].push_back(
        {{"name", "gpu-" + std::to_string(i)}, {"counters", {{"memory", {{"value", "1"}}}}}});
  }
  EXPECT_EQ(client_->Post(kSlices, sets).http_status(), 422);  // 9 counter sets
  sets["spec"]["sharedCounters"].erase(8);
  EXPECT_TRUE(client_->Post(kSlices, sets).ok());
  json attrs = Slice("a", "n", 1);
  for (int i = 0; i < 33; ++i) {
    attrs["spec"]["devices"][0]["attributes"]["a" + std::to_string(i)] = {{"int", i}};
  }
  EXPECT_EQ(client_->Post(kSlices, attrs).http_status(), 422);  // 33 attributes
  // nodeName is immutable.
  auto moved = client_->Patch(kSlices + "/s", {{"spec", {{"nodeName", "other"}}}},
                              k8s::PatchType::kMerge);
  EXPECT_EQ(moved.http_status(), 422);
}

TEST_F(FakeApiServerTest, ClaimStatusIsWrittenOnlyThroughTheStatusSubresource) {
  json claim = {{"apiVersion", "resource.k8s.io/v1"},
                {"kind", "ResourceClaim"},
                {"metadata", {{"name", "c"}, {"namespace", "ns"}}},
                {"spec", {{"devices", {{"requests", json::array()}}}}},
                {"status", {{"allocation", {{"devices", {{"results", json::array()}}}}}}}};
  auto created = client_->Post(kClaims, claim);
  ASSERT_TRUE(created.ok()) << created.status().message();
  // A create carries no status: kube-apiserver answers an empty one (status: {}).
  EXPECT_EQ(created->value("status", json()), json::object());
  const json allocation = {
      {"devices",
       {{"results", json::array({{{"request", "r"}, {"driver", "gpu.gpulet.io"},
                                  {"pool", "n"}, {"device", "gpu-0"}}})}}}};
  auto main = client_->Patch(kClaims + "/c", {{"status", {{"allocation", allocation}}}},
                             k8s::PatchType::kMerge);
  ASSERT_TRUE(main.ok()) << main.status().message();
  EXPECT_EQ(main->value("status", json()), json::object());  // ignored on the main path
  auto status = client_->Patch(kClaims + "/c/status",
                               {{"status", {{"allocation", allocation}}},
                                {"spec", {{"devices", {{"requests", "changed"}}}}}},
                               k8s::PatchType::kMerge);
  ASSERT_TRUE(status.ok()) << status.status().message();
  EXPECT_EQ((*status)["status"]["allocation"], allocation);
  EXPECT_EQ((*status)["spec"]["devices"]["requests"], json::array());  // spec kept
  auto read = client_->Get(kClaims + "/c/status");
  ASSERT_TRUE(read.ok());
  EXPECT_EQ((*read)["status"]["allocation"], allocation);
  // A later main-path write keeps the status the scheduler wrote.
  auto labelled = client_->Patch(kClaims + "/c", {{"metadata", {{"labels", {{"x", "y"}}}}}},
                                 k8s::PatchType::kMerge);
  ASSERT_TRUE(labelled.ok());
  EXPECT_EQ((*labelled)["status"]["allocation"], allocation);
  EXPECT_EQ(client_->Get(kClaims + "/missing/status").http_status(), 404);
}

// What tests/differential/apiserver_test.sh found kube-apiserver answering, kept here so that a
// change to the stand-in that loses it fails without a cluster.
TEST_F(FakeApiServerTest, ErrorsNameTheResourceAsTheRealServerDoes) {
  const std::string cms = "/api/v1/namespaces/ns/configmaps";
  const json cm = {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", {{"name", "a"}}}};
  auto created = client_->Post(cms, cm);
  ASSERT_TRUE(created.ok()) << created.status().message();
  EXPECT_EQ((*created)["metadata"]["namespace"], "ns");  // from the URL
  EXPECT_NE(client_->Post(cms, cm).status().message().find("configmaps \"a\" already exists"),
            std::string::npos);
  EXPECT_NE(client_->Get(cms + "/b").status().message().find("configmaps \"b\" not found"),
            std::string::npos);
  auto stale = client_->Patch(cms + "/a", {{"metadata", {{"resourceVersion", "1"}}}},
                              k8s::PatchType::kMerge);
  EXPECT_EQ(stale.http_status(), 409);
  EXPECT_NE(stale.status().message().find("Operation cannot be fulfilled on configmaps \"a\""),
            std::string::npos);
  const std::string leases = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l";
  EXPECT_NE(client_->Get(leases).status().message().find(
                "leases.coordination.k8s.io \"l\" not found"),
            std::string::npos);
  json bad = cm;
  bad["metadata"]["name"] = "Bad_Name";
  auto invalid = client_->Post(cms, bad);
  EXPECT_EQ(invalid.http_status(), 422);
  EXPECT_NE(invalid.status().message().find("ConfigMap \"Bad_Name\" is invalid: metadata.name"),
            std::string::npos);
  auto failed_test = client_->Patch(
      cms + "/a", json::array({{{"op", "test"}, {"path", "/data/k"}, {"value", "x"}}}),
      k8s::PatchType::kJsonPatch);
  EXPECT_EQ(failed_test.http_status(), 422);
  auto unsupported = client_->Get(cms + "?fieldSelector=data.k%3Dv");
  EXPECT_EQ(unsupported.http_status(), 400);
  // A configmap's DELETE answers a Success Status; a pod's, the pod.
  auto deleted = client_->Delete(cms + "/a");
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ((*deleted)["kind"], "Status");
  EXPECT_EQ((*deleted)["details"]["kind"], "configmaps");
  auto pod = client_->Post("/api/v1/namespaces/ns/pods",
                           {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", {{"name", "p"}}},
                            {"status", {{"phase", "Running"}}}});
  ASSERT_TRUE(pod.ok());
  EXPECT_EQ((*pod)["status"]["phase"], "Pending");  // a create's status is the server's
  EXPECT_EQ((*pod)["metadata"]["generation"], 1);
  EXPECT_EQ((*client_->Delete("/api/v1/namespaces/ns/pods/p"))["kind"], "Pod");
}

TEST_F(FakeApiServerTest, ListsAreTypedAndPagedAsTheRealServerDoes) {
  const std::string cms = "/api/v1/namespaces/ns/configmaps";
  for (const char* name : {"a", "b", "c"}) {
    ASSERT_TRUE(client_->Post(cms, {{"apiVersion", "v1"}, {"kind", "ConfigMap"},
                                    {"metadata", {{"name", name}}}})
                    .ok());
  }
  auto page = client_->Get(cms + "?limit=2");
  ASSERT_TRUE(page.ok());
  EXPECT_EQ((*page)["kind"], "ConfigMapList");
  ASSERT_EQ((*page)["items"].size(), 2u);
  EXPECT_FALSE((*page)["items"][0].contains("kind"));  // items carry no kind or apiVersion
  EXPECT_EQ((*page)["metadata"]["remainingItemCount"], 1);
  const std::string next = (*page)["metadata"]["continue"];
  auto rest = client_->Get(cms + "?limit=2&continue=" + k8s::EscapeQueryValue(next));
  ASSERT_TRUE(rest.ok());
  ASSERT_EQ((*rest)["items"].size(), 1u);
  EXPECT_EQ((*rest)["items"][0]["metadata"]["name"], "c");
  EXPECT_FALSE((*rest)["metadata"].contains("continue"));
}

TEST(FakeApiServerNamespaces, ACreateInAMissingNamespaceIsNotFoundWhenAsked) {
  std::string tmpl = ::testing::TempDir() + "gpulet-fakeapi-ns-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  Result<TestPki> pki = MakeTestPki(tmpl);
  ASSERT_TRUE(pki.ok());
  FakeApiServer::Options options;
  options.require_namespaces = true;
  auto api = FakeApiServer::Start(*pki, options);
  ASSERT_TRUE(api.ok());
  k8s::Client client((*api)->Access(*pki));
  const json cm = {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", {{"name", "a"}}}};
  auto refused = client.Post("/api/v1/namespaces/ns/configmaps", cm);
  EXPECT_EQ(refused.http_status(), 404);
  EXPECT_NE(refused.status().message().find("namespaces \"ns\" not found"), std::string::npos);
  auto ns = client.Post("/api/v1/namespaces",
                        {{"apiVersion", "v1"},
                         {"kind", "Namespace"},
                         {"metadata", {{"name", "ns"}}}});
  ASSERT_TRUE(ns.ok());
  EXPECT_EQ((*ns)["metadata"]["labels"]["kubernetes.io/metadata.name"], "ns");
  EXPECT_TRUE(client.Post("/api/v1/namespaces/ns/configmaps", cm).ok());
  api->reset();
  std::filesystem::remove_all(tmpl);
}

}  // namespace
}  // namespace gpulet::testing
