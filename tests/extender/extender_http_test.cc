// The extender through real HTTP, against the fake API server, with requests shaped as
// kube-scheduler's HTTPExtender sends them (POST <urlPrefix>/<verb>, Content-Type
// application/json, extender/v1 structs marshalled by Go: PascalCase, nil pointers as null).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <thread>

#include "apiserver/fake_apiserver.h"
#include "extender/service.h"
#include "extender/test_objects.h"
#include "support/wait_until.h"

namespace gpulet::extender {
namespace {

using gpulet::testing::FakeApiServer;
using gpulet::testing::TestPki;
using nlohmann::json;
using ::testing::HasSubstr;
using namespace testobjects;

constexpr const char* kNs = "gpulet-system";

std::string TempDir() {
  std::string tmpl = ::testing::TempDir() + "gpulet-extender-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

std::string ObjectPath(const std::string& node) {
  return std::string("/api/v1/namespaces/") + kNs + "/configmaps/gpulet-memory-" + node;
}

class ExtenderHttpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    auto pki = gpulet::testing::MakeTestPki(dir_);
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    pki_ = *pki;
    auto s = FakeApiServer::Start(pki_, {});
    ASSERT_TRUE(s.ok()) << s.status().message();
    api_ = std::move(s).value();
    k8s::ClusterAccess a = api_->Access(pki_);
    client_ = std::make_unique<k8s::Client>(a);
  }

  void AddNode(const std::string& node, const std::vector<Gpu>& gpus, json pods = json::array()) {
    api_->Put(
        "/api/v1/nodes/" + node,
        {{"apiVersion", "v1"},
         {"kind", "Node"},
         {"metadata", {{"name", node}, {"labels", {{"gpulet.io/gpu-memory.pool", "true"}}}}}});
    Publish(node, gpus, std::move(pods));
  }
  // Returns the object's new resourceVersion.
  std::string Publish(const std::string& node, const std::vector<Gpu>& gpus,
                      json pods = json::array()) {
    return std::to_string(
        api_->Put(ObjectPath(node),
                  MemoryConfigMap(node, MemoryJson(node, gpus, ++generation_, pods).dump())));
  }
  // Waits until the extender has seen version `rv` of the node's object.
  bool Seen(const std::string& node, const std::string& rv) {
    return WaitFor([&] { return service_->view().ObjectVersion(node) == rv; });
  }
  json AddPod(const std::string& name, const std::vector<int64_t>& units) {
    json pod = MemoryPod(name, units);
    api_->Put("/api/v1/namespaces/default/pods/" + name, pod);
    return pod;
  }

  void StartExtender(std::chrono::milliseconds reservation_check = std::chrono::seconds(5)) {
    ServiceOptions o;
    o.address = "127.0.0.1:0";
    o.view.ns = kNs;
    o.reservation_check = reservation_check;
    service_ = std::make_unique<Service>(*client_, clock_, o);
    Status s = service_->Start();
    ASSERT_TRUE(s.ok()) << s.message();
    http_ = std::make_unique<httplib::Client>("127.0.0.1", service_->port());
    http_->set_read_timeout(30, 0);
  }

  // POST as kube-scheduler does; returns {status, body}.
  std::pair<int, std::string> Call(const std::string& verb, const std::string& body) {
    auto r = http_->Post("/" + verb, body, "application/json");
    if (!r) return {0, ""};
    return {r->status, r->body};
  }
  json Filter(const json& pod, const std::vector<std::string>& nodes) {
    auto [status, body] = Call("filter", CacheModeArgs(pod, nodes));
    EXPECT_EQ(status, 200) << body;
    return json::parse(body, nullptr, false);
  }
  json Bind(const json& pod, const std::string& node) {
    auto [status, body] = Call("bind", BindingArgs(pod, node));
    EXPECT_EQ(status, 200) << body;
    return json::parse(body, nullptr, false);
  }
  // A positive condition the watch brings; the view has no change hook to wait on.
  static bool WaitFor(const std::function<bool()>& cond) {
    return testing::WaitUntil(cond, std::chrono::seconds(15));
  }
  std::string NodeOf(const std::string& pod) {
    auto p = api_->Object("/api/v1/namespaces/default/pods/" + pod);
    return p && (*p)["spec"].contains("nodeName") ? (*p)["spec"]["nodeName"].get<std::string>()
                                                  : "";
  }

  void TearDown() override {
    service_.reset();
    api_.reset();
  }

  std::string dir_;
  TestPki pki_;
  std::unique_ptr<FakeApiServer> api_;
  std::unique_ptr<k8s::Client> client_;
  FakeClock clock_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<httplib::Client> http_;
  int64_t generation_ = 0;
};

TEST_F(ExtenderHttpTest, FilterPrioritizeBindOnAHundredNodes) {
  // node-i: 8 GPUs of 80 units; GPU 0 has i % 50 free, the others 0; every tenth node has one
  // more GPU with 35 free (the tightest fit for a 30-unit pod).
  std::vector<std::string> names;
  for (int i = 0; i < 100; ++i) {
    const std::string n = "node-" + std::to_string(i);
    std::vector<Gpu> gpus(8, Gpu{80, 0});
    gpus[0].free = i % 50;
    if (i % 10 == 3) gpus[5].free = 35;
    AddNode(n, gpus);
    names.push_back(n);
  }
  json pod = AddPod("inference", {30});
  StartExtender();

  json f = Filter(pod, names);
  ASSERT_TRUE(f["NodeNames"].is_array()) << f;
  EXPECT_TRUE(f["Nodes"].is_null());
  EXPECT_EQ(f["Error"], "");
  std::set<std::string> passed;
  for (const auto& n : f["NodeNames"]) passed.insert(n.get<std::string>());
  for (int i = 0; i < 100; ++i) {
    const std::string n = names[static_cast<size_t>(i)];
    const bool fits = i % 50 >= 30 || i % 10 == 3;
    EXPECT_EQ(passed.count(n), fits ? 1u : 0u) << n;
    if (!fits) {
      // No pod the node lists holds units there: unresolvable (preemption cannot free them).
      ASSERT_TRUE(f["FailedAndUnresolvableNodes"].contains(n)) << n;
      EXPECT_THAT(f["FailedAndUnresolvableNodes"][n].get<std::string>(),
                  HasSubstr("needs 30 units of gpulet.io/gpu-memory-1gi on one GPU; the largest "
                            "free GPU has " +
                            std::to_string(i % 50) + " unit"));
    }
  }
  EXPECT_TRUE(f["FailedNodes"].empty());

  // Prioritize gets the nodes that passed, as the scheduler sends them.
  std::vector<std::string> candidates(passed.begin(), passed.end());
  auto [status, body] = Call("prioritize", CacheModeArgs(pod, candidates));
  ASSERT_EQ(status, 200) << body;
  json scores = json::parse(body);
  ASSERT_TRUE(scores.is_array());
  ASSERT_EQ(scores.size(), candidates.size());
  std::string best;
  int64_t best_score = -1;
  for (const auto& hp : scores) {
    ASSERT_TRUE(hp.contains("Host") && hp.contains("Score")) << hp;
    const int64_t s = hp["Score"];
    EXPECT_GE(s, 0);
    EXPECT_LE(s, 10);
    if (s > best_score) {
      best_score = s;
      best = hp["Host"];
    }
  }
  EXPECT_EQ(best, "node-30");  // exactly 30 free on one GPU, the rest full: no leftover

  json b = Bind(pod, best);
  EXPECT_EQ(b["Error"], "") << b;
  EXPECT_EQ(NodeOf("inference"), best);
  EXPECT_THAT(service_->extender().Metrics(), HasSubstr("gpulet_extender_reserved_units 30"));
  EXPECT_THAT(service_->extender().Metrics(),
              HasSubstr("gpulet_extender_binds_total{result=\"bound\"} 1"));
}

TEST_F(ExtenderHttpTest, NonCacheModeAnswersWithNodeObjects) {
  AddNode("a", {{80, 40}});
  AddNode("b", {{80, 10}});
  json pod = AddPod("p", {20});
  StartExtender();
  json nodes = {
      {"metadata", json::object()},
      {"items", json::array({*api_->Object("/api/v1/nodes/a"), *api_->Object("/api/v1/nodes/b")})}};
  auto [status, body] =
      Call("filter", json{{"Pod", pod}, {"Nodes", nodes}, {"NodeNames", nullptr}}.dump());
  ASSERT_EQ(status, 200) << body;
  json f = json::parse(body);
  EXPECT_TRUE(f["NodeNames"].is_null());
  ASSERT_EQ(f["Nodes"]["items"].size(), 1u);
  EXPECT_EQ(f["Nodes"]["items"][0]["metadata"]["name"], "a");
  EXPECT_TRUE(f["FailedAndUnresolvableNodes"].contains("b"));  // no listed pod to preempt
}

TEST_F(ExtenderHttpTest, TwoPodsBoundWithinOnePublicationPeriodDoNotOverCommit) {
  AddNode("n1", {{80, 50}, {80, 0}});
  json a = AddPod("a", {40});
  json b = AddPod("b", {40});
  StartExtender();
  // The scheduler filters b before a's bind arrives (binding is asynchronous): both pass.
  EXPECT_EQ(Filter(a, {"n1"})["NodeNames"], json::array({"n1"}));
  EXPECT_EQ(Filter(b, {"n1"})["NodeNames"], json::array({"n1"}));
  EXPECT_EQ(Bind(a, "n1")["Error"], "");
  json refused = Bind(b, "n1");
  EXPECT_THAT(refused["Error"].get<std::string>(),
              HasSubstr("pod default/b no longer fits on node n1"));
  EXPECT_EQ(NodeOf("a"), "n1");
  EXPECT_EQ(NodeOf("b"), "");
  // The retry of b is filtered out with the reservation counted.
  json again = Filter(b, {"n1"});
  EXPECT_TRUE(again["NodeNames"].empty());
  EXPECT_THAT(again["FailedAndUnresolvableNodes"]["n1"].get<std::string>(),
              HasSubstr("largest free GPU has 10"));
  // A newer publication that does not list a yet keeps the reservation.
  ASSERT_TRUE(Seen("n1", Publish("n1", {{80, 50}, {80, 0}})));
  EXPECT_TRUE(Filter(b, {"n1"})["NodeNames"].empty());
  // The agent publishes a in `pods` (its units out of freeUnits): the reservation is dropped and
  // the object's own numbers count.
  ASSERT_TRUE(Seen("n1", Publish("n1", {{80, 10}, {80, 0}},
                                 json::array({{{"namespace", "default"},
                                               {"name", "a"},
                                               {"container", "c0"},
                                               {"gpu", GpuUuid("n1", 0)},
                                               {"units", 40}}}))));
  EXPECT_EQ(service_->view().stats().reservations, 0u);
  EXPECT_TRUE(Filter(b, {"n1"})["NodeNames"].empty());
  // a's units are released (the pod ended): b fits again and binds.
  ASSERT_TRUE(Seen("n1", Publish("n1", {{80, 50}, {80, 0}})));
  EXPECT_EQ(Filter(b, {"n1"})["NodeNames"].size(), 1u);
  EXPECT_EQ(Bind(b, "n1")["Error"], "");
  EXPECT_EQ(NodeOf("b"), "n1");
}

TEST_F(ExtenderHttpTest, ConcurrentBindsOnOneGpuNeverOverCommit) {
  AddNode("n1", {{80, 80}});
  std::vector<json> pods;
  for (int i = 0; i < 16; ++i) pods.push_back(AddPod("p" + std::to_string(i), {10}));
  StartExtender();
  for (const json& p : pods) ASSERT_EQ(Filter(p, {"n1"})["NodeNames"].size(), 1u);
  std::atomic<int> bound{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      httplib::Client c("127.0.0.1", service_->port());
      for (size_t i = static_cast<size_t>(t); i < pods.size(); i += 4) {
        auto r = c.Post("/bind", BindingArgs(pods[i], "n1"), "application/json");
        if (r && r->status == 200 && json::parse(r->body)["Error"] == "") ++bound;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bound.load(), 8);  // 80 units, 10 each
  EXPECT_EQ(service_->view().stats().reserved_units, 80);
}

TEST_F(ExtenderHttpTest, StaleOrMalformedNodesAreFilteredWithAReason) {
  AddNode("good", {{80, 80}});
  AddNode("stale", {{80, 80}});
  api_->Put("/api/v1/nodes/nothing", {{"metadata", {{"name", "nothing"}}}});
  // Malformed objects of every kind; none may crash the extender.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"garbage", "{\"version\":1, \"gpus\": [tru"},
      {"wrongtypes",
       R"({"version":1,"node":"wrongtypes","generation":"x","resource":"r","unitBytes":1,"gpus":[]})"},
      {"negative", MemoryJson("negative", {{80, -5}}).dump()},
      {"huge",
       R"({"version":1,"node":"huge","generation":1,"resource":"gpulet.io/gpu-memory-1gi","unitBytes":1,"gpus":[{"uuid":"g","totalUnits":1e300,"freeUnits":1}]})"},
      {"array", "[1,2,3]"},
      {"deep", std::string(5000, '[') + std::string(5000, ']')},
  };
  std::vector<std::string> names = {"good", "stale", "nothing", "absent"};
  for (const auto& [node, text] : bad) {
    api_->Put("/api/v1/nodes/" + node, {{"metadata", {{"name", node}}}});
    api_->Put(ObjectPath(node), MemoryConfigMap(node, text));
    names.push_back(node);
  }
  json pod = AddPod("p", {10});
  StartExtender();
  // "good" keeps publishing (a new resourceVersion each heartbeat), "stale" does not.
  clock_.Advance(std::chrono::seconds(60));
  ASSERT_TRUE(Seen("good", Publish("good", {{80, 80}})));
  clock_.Advance(std::chrono::seconds(31));  // "stale": 91 s > 3 × 30 s
  json f = Filter(pod, names);
  EXPECT_EQ(f["NodeNames"], json::array({"good"}));
  const json& un = f["FailedAndUnresolvableNodes"];
  EXPECT_THAT(un["stale"].get<std::string>(),
              HasSubstr("stale: configmaps/gpulet-system/gpulet-memory-stale unchanged for 1m31s "
                        "(stale after 1m30s"));
  EXPECT_THAT(un["nothing"].get<std::string>(), HasSubstr("node has no gpulet GPU memory pool"));
  EXPECT_THAT(un["absent"].get<std::string>(), HasSubstr("no GPU memory object"));
  EXPECT_THAT(un["garbage"].get<std::string>(), HasSubstr("memory.json: not valid JSON"));
  EXPECT_THAT(un["wrongtypes"].get<std::string>(), HasSubstr("generation: must be an integer"));
  EXPECT_THAT(un["negative"].get<std::string>(), HasSubstr("gpus[0].freeUnits: must be between 0"));
  EXPECT_THAT(un["huge"].get<std::string>(), HasSubstr("gpus[0].totalUnits: must be an integer"));
  EXPECT_THAT(un["array"].get<std::string>(), HasSubstr("must be a JSON object"));
  EXPECT_THAT(un["deep"].get<std::string>(), HasSubstr("malformed"));
  EXPECT_TRUE(f["FailedNodes"].empty());
  // Binding onto a stale node is refused too.
  EXPECT_THAT(Bind(pod, "stale")["Error"].get<std::string>(), HasSubstr("stale"));
  EXPECT_EQ(NodeOf("p"), "");
  EXPECT_EQ(http_->Get("/healthz")->status, 200);
  EXPECT_THAT(http_->Get("/metrics")->body, HasSubstr("gpulet_extender_node_objects_malformed 6"));
}

TEST_F(ExtenderHttpTest, BadJsonGets400) {
  AddNode("n1", {{80, 80}});
  json pod = AddPod("p", {10});
  StartExtender();
  for (const std::string verb : {"filter", "prioritize", "bind"}) {
    for (const std::string body : {"{not json", "", "[]", "null"}) {
      auto [status, text] = Call(verb, body);
      EXPECT_EQ(status, 400) << verb << " " << body << ": " << text;
    }
  }
  EXPECT_EQ(Call("filter", R"({"Pod":null,"NodeNames":["n1"]})").first, 400);
  EXPECT_EQ(Call("filter", json{{"Pod", pod}, {"NodeNames", {1, 2}}}.dump()).first, 400);
  EXPECT_EQ(Call("bind", R"({"PodName":"p"})").first, 400);
  EXPECT_EQ(http_->Post("/nope", "{}", "application/json")->status, 413);  // bodies: verbs only
  // Still serving.
  EXPECT_EQ(Filter(pod, {"n1"})["NodeNames"], json::array({"n1"}));
  EXPECT_THAT(http_->Get("/metrics")->body, HasSubstr("gpulet_extender_bad_requests_total 15"));
}

TEST_F(ExtenderHttpTest, BindWithoutFilterReadsThePodAndReportsApiErrors) {
  AddNode("n1", {{80, 80}});
  json pod = AddPod("p", {10});
  json ghost = MemoryPod("ghost", {10});
  StartExtender();
  // Not seen by filter (another extender replica, or a restart): the pod is read from the API.
  EXPECT_EQ(Bind(pod, "n1")["Error"], "");
  EXPECT_EQ(NodeOf("p"), "n1");
  // Bound again: refused (the API server shows it bound), and the first bind's reservation stays.
  json again = Bind(pod, "n1");
  EXPECT_THAT(again["Error"].get<std::string>(), HasSubstr("already bound to node n1"));
  EXPECT_EQ(service_->view().stats().reservations, 1u);
  // A pod the API does not have.
  EXPECT_THAT(Bind(ghost, "n1")["Error"].get<std::string>(), HasSubstr("404"));
}

TEST_F(ExtenderHttpTest, PlainHttpOnlyOnLoopback) {
  AddNode("n1", {{80, 80}});
  ServiceOptions o;
  o.address = "0.0.0.0:0";
  o.view.ns = kNs;
  Service s(*client_, clock_, o);
  Status st = s.Start();
  EXPECT_EQ(st.code(), ErrorCode::kUsage);
  EXPECT_THAT(st.message(), HasSubstr("plain HTTP is served on loopback only"));
}

// Issue 35, item 2: HTTPS without client certificates on every interface would serve /bind to any
// pod that reaches the port: refused at start, naming the field. On loopback (a sidecar) the same
// web config serves, verified by the client against the CA, as kube-scheduler's tlsConfig.caFile
// does.
TEST_F(ExtenderHttpTest, HttpsWithoutClientCertificatesOnlyOnLoopback) {
  AddNode("n1", {{80, 80}});
  json pod = AddPod("p", {10});
  std::ofstream(dir_ + "/web.yml") << "tls_server_config:\n  cert_file: " << pki_.server_cert
                                   << "\n  key_file: " << pki_.server_key << "\n";
  ServiceOptions o;
  o.address = "0.0.0.0:0";
  o.web_config_file = dir_ + "/web.yml";
  o.view.ns = kNs;
  {
    Service open(*client_, clock_, o);
    const Status refused = open.Start();
    EXPECT_EQ(refused.code(), ErrorCode::kUsage);
    EXPECT_THAT(refused.message(), HasSubstr("tls_server_config.client_auth_type"));
    EXPECT_THAT(refused.message(), HasSubstr("RequireAndVerifyClientCert"));
    EXPECT_EQ(open.port(), 0);  // nothing was served
  }
  o.address = "127.0.0.1:0";
  Service s(*client_, clock_, o);
  Status st = s.Start();
  ASSERT_TRUE(st.ok()) << st.message();
  httplib::SSLClient tls("127.0.0.1", s.port());
  tls.set_ca_cert_path(pki_.ca_cert.c_str());
  tls.enable_server_certificate_verification(true);
  auto r = tls.Post("/filter", CacheModeArgs(pod, {"n1"}), "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["NodeNames"], json::array({"n1"}));
  auto b = tls.Post("/bind", BindingArgs(pod, "n1"), "application/json");
  ASSERT_TRUE(b);
  EXPECT_EQ(json::parse(b->body)["Error"], "");
  EXPECT_EQ(NodeOf("p"), "n1");
}

// Issue 35, item 2: which listeners may serve the verbs, decided before anything starts.
TEST_F(ExtenderHttpTest, VerbsNeedClientCertificatesOffLoopback) {
  const std::string tls = "tls_server_config:\n  cert_file: s.crt\n  key_file: s.key\n";
  std::ofstream(dir_ + "/tls.yml") << tls;
  std::ofstream(dir_ + "/mtls.yml")
      << tls << "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n";
  EXPECT_TRUE(CheckVerbsListener("0.0.0.0:8888", dir_ + "/mtls.yml").ok());
  EXPECT_TRUE(CheckVerbsListener(":8888", dir_ + "/mtls.yml").ok());
  for (const char* loopback : {"127.0.0.1:8888", "[::1]:8888", "localhost:8888"}) {
    EXPECT_TRUE(CheckVerbsListener(loopback, "").ok()) << loopback;
    EXPECT_TRUE(CheckVerbsListener(loopback, dir_ + "/tls.yml").ok()) << loopback;
  }
  const Status open = CheckVerbsListener(":8888", dir_ + "/tls.yml");
  EXPECT_EQ(open.code(), ErrorCode::kUsage);
  EXPECT_THAT(open.message(), HasSubstr(dir_ + "/tls.yml: tls_server_config.client_auth_type"));
  EXPECT_EQ(CheckVerbsListener("10.0.0.1:8888", "").code(), ErrorCode::kUsage);
}

// Issue 23, item 1: the extender as deployed (deploy/extender/web-config.yaml, certificates from
// deploy/extender/make-certs.sh) answers only a client with the scheduler's certificate.
TEST_F(ExtenderHttpTest, MutualTlsAsDeployedAnswersOnlyTheSchedulersCertificate) {
  AddNode("n1", {{80, 80}});
  json pod = AddPod("p", {10});
  const std::string certs = dir_ + "/certs";
  const std::string script = std::string(GPULET_SOURCE_DIR) + "/deploy/extender/make-certs.sh";
  ASSERT_EQ(std::system((script + " " + certs + " gpulet-system > /dev/null").c_str()), 0);
  // The shipped web config, its mount path pointed at the issued files.
  std::ifstream in(std::string(GPULET_SOURCE_DIR) + "/deploy/extender/web-config.yaml");
  std::string web((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_THAT(web, HasSubstr("RequireAndVerifyClientCert"));
  for (size_t at; (at = web.find("/etc/gpulet-extender/tls/")) != std::string::npos;) {
    web.replace(at, std::strlen("/etc/gpulet-extender/tls/"), certs + "/extender/");
  }
  std::ofstream(dir_ + "/web.yml") << web;
  // The scheduler's side: kube-scheduler-config.yaml presents the client certificate of Secret
  // gpulet-extender-client, mounted at /etc/gpulet-extender-client.
  std::ifstream sched_in(std::string(GPULET_SOURCE_DIR) +
                         "/deploy/extender/kube-scheduler-config.yaml");
  const std::string sched((std::istreambuf_iterator<char>(sched_in)),
                          std::istreambuf_iterator<char>());
  EXPECT_THAT(sched, HasSubstr("certFile: /etc/gpulet-extender-client/tls.crt"));
  EXPECT_THAT(sched, HasSubstr("keyFile: /etc/gpulet-extender-client/tls.key"));
  EXPECT_THAT(sched, HasSubstr("caFile: /etc/gpulet-extender-client/ca.crt"));

  ServiceOptions o;
  o.address = "127.0.0.1:0";
  o.web_config_file = dir_ + "/web.yml";
  o.view.ns = kNs;
  Service s(*client_, clock_, o);
  Status st = s.Start();
  ASSERT_TRUE(st.ok()) << st.message();
  const std::string host = "gpulet-extender.gpulet-system.svc";  // the certificate's name
  auto client = [&](const std::string& cert, const std::string& key) {
    auto c = cert.empty() ? std::make_unique<httplib::SSLClient>(host, s.port())
                          : std::make_unique<httplib::SSLClient>(host, s.port(), cert, key);
    c->set_hostname_addr_map({{host, "127.0.0.1"}});
    c->set_ca_cert_path((certs + "/scheduler/ca.crt").c_str());
    c->enable_server_certificate_verification(true);
    c->set_connection_timeout(5, 0);
    c->set_read_timeout(10, 0);
    return c;
  };
  // No certificate: nothing, not even /healthz.
  auto anonymous = client("", "");
  EXPECT_FALSE(anonymous->Post("/filter", CacheModeArgs(pod, {"n1"}), "application/json"));
  EXPECT_FALSE(anonymous->Post("/bind", BindingArgs(pod, "n1"), "application/json"));
  EXPECT_FALSE(anonymous->Get("/healthz"));
  // A certificate from another CA (the cluster's own client CA, say): nothing either.
  auto stranger = client(pki_.client_cert, pki_.client_key);
  EXPECT_FALSE(stranger->Post("/bind", BindingArgs(pod, "n1"), "application/json"));
  EXPECT_EQ(NodeOf("p"), "");
  // kube-scheduler's certificate: served.
  auto scheduler = client(certs + "/scheduler/tls.crt", certs + "/scheduler/tls.key");
  auto f = scheduler->Post("/filter", CacheModeArgs(pod, {"n1"}), "application/json");
  ASSERT_TRUE(f) << httplib::to_string(f.error());
  EXPECT_EQ(json::parse(f->body)["NodeNames"], json::array({"n1"}));
  auto b = scheduler->Post("/bind", BindingArgs(pod, "n1"), "application/json");
  ASSERT_TRUE(b) << httplib::to_string(b.error());
  EXPECT_EQ(json::parse(b->body)["Error"], "");
  EXPECT_EQ(NodeOf("p"), "n1");
}

// Issue 23, item 1: a bind names a pod; the pod itself (its UID, spec and state) is read from the
// API server, never from a request, and names cannot change the API path.
TEST_F(ExtenderHttpTest, ForgedBindsAreRefused) {
  AddNode("n1", {{80, 50}});
  json pod = AddPod("big", {70});  // fits nowhere: 50 free
  api_->Put("/api/v1/namespaces/default/pods/cpu", MemoryPod("cpu", {0}));
  StartExtender();
  // A filter request describing "big" as a 1-unit pod under its real UID: bind still judges the
  // pod the API server has (70 units) and refuses.
  json forged = pod;
  forged["spec"]["containers"][0]["resources"] = {{"limits", {{kResource, "1"}}}};
  ASSERT_EQ(Filter(forged, {"n1"})["NodeNames"], json::array({"n1"}));
  EXPECT_THAT(Bind(forged, "n1")["Error"].get<std::string>(),
              HasSubstr("pod default/big no longer fits on node n1"));
  EXPECT_EQ(NodeOf("big"), "");
  // A UID that is not the pod's (a recreated pod, or a guess).
  json other = AddPod("small", {10});
  json wrong_uid = json::parse(BindingArgs(other, "n1"));
  wrong_uid["PodUID"] = "0b7a6c43-forged";
  auto [status, body] = Call("bind", wrong_uid.dump());
  EXPECT_EQ(status, 200);
  EXPECT_THAT(body, HasSubstr("has UID uid-default-small, the request names 0b7a6c43-forged"));
  EXPECT_EQ(NodeOf("small"), "");
  // No UID at all.
  wrong_uid.erase("PodUID");
  EXPECT_EQ(Call("bind", wrong_uid.dump()).first, 400);
  // A pod that asks for no GPU memory is not the extender's to place.
  EXPECT_THAT(Bind(MemoryPod("cpu", {0}), "n1")["Error"].get<std::string>(),
              HasSubstr("asks for no GPU memory resource"));
  EXPECT_EQ(NodeOf("cpu"), "");
  // A node without an object (or that does not exist).
  EXPECT_THAT(Bind(other, "nowhere")["Error"].get<std::string>(),
              HasSubstr("no GPU memory object"));
  // Names that would change the API path.
  for (const std::string name : {"small/binding", "small?x=1", "..", "small%2Fbinding"}) {
    json args = json::parse(BindingArgs(other, "n1"));
    args["PodName"] = name;
    EXPECT_EQ(Call("bind", args.dump()).first, 400) << name;
    args["PodName"] = "small";
    args["PodNamespace"] = "default/pods/small";
    EXPECT_EQ(Call("bind", args.dump()).first, 400) << name;
  }
  EXPECT_EQ(NodeOf("small"), "");
  EXPECT_EQ(PathSegment("a/b?c%d"), "a%2Fb%3Fc%25d");
  EXPECT_EQ(PathSegment(".."), "%2E%2E");
  // The real pod, with its UID: bound.
  EXPECT_EQ(Bind(other, "n1")["Error"], "");
  EXPECT_EQ(NodeOf("small"), "n1");
  // Bound already: refused before any reservation.
  EXPECT_THAT(Bind(other, "n1")["Error"].get<std::string>(), HasSubstr("already bound"));
}

// Issue 34, seen with the real kube-scheduler: a pod naming the memory resource with 0 units is
// one the scheduler calls the extender for (managedResources match on the name) and leaves the
// bind to; refused, it stayed Pending for ever. It is bound, and holds nothing.
TEST_F(ExtenderHttpTest, APodAskingZeroUnitsIsBoundWithoutAReservation) {
  AddNode("n1", {{80, 10}});
  StartExtender();
  json pod = MemoryPod("zero", {});
  pod["spec"]["containers"] = json::array(
      {{{"name", "c0"},
        {"image", "registry.k8s.io/pause:3.9"},
        {"resources", {{"limits", {{kResource, "0"}}}, {"requests", {{kResource, "0"}}}}}}});
  api_->Put("/api/v1/namespaces/default/pods/zero", pod);
  ASSERT_EQ(Filter(pod, {"n1"})["NodeNames"], json::array({"n1"}));
  EXPECT_EQ(Bind(pod, "n1")["Error"], "");
  EXPECT_EQ(NodeOf("zero"), "n1");
  EXPECT_FALSE(service_->view().ReservationOf("uid-default-zero", "n1"));
  EXPECT_EQ(service_->view().stats().reserved_units, 0);
}

// Issue 23, item 3: a reservation ends when the API server says its pod is gone, well before the
// fixed timeout.
// issue 26 item 7: the Binding write's faults. An answer lost after the write landed is a success
// (the pod is read back); a write the API server holds past the extender's 4 s (inside the
// scheduler's 5 s) is given up, found not to have landed, and its reservation released, so the
// retry fits.
TEST_F(ExtenderHttpTest, BindWriteFaultsAreResolvedByReadingThePodBack) {
  using gpulet::testing::WriteFault;
  AddNode("n1", {{80, 50}});
  json lost = AddPod("lost", {30});
  json slow = AddPod("slow", {20});
  StartExtender();
  api_->InjectWriteFault({.method = "POST",
                          .path_prefix = "/api/v1/namespaces/default/pods/lost/binding",
                          .kind = WriteFault::Kind::kLostAnswer});
  EXPECT_EQ(Bind(lost, "n1")["Error"], "");
  EXPECT_EQ(NodeOf("lost"), "n1");
  api_->InjectWriteFault({.method = "POST",
                          .path_prefix = "/api/v1/namespaces/default/pods/slow/binding",
                          .kind = WriteFault::Kind::kTimeout,
                          .delay = std::chrono::seconds(6)});
  EXPECT_NE(Bind(slow, "n1")["Error"], "");
  EXPECT_EQ(NodeOf("slow"), "");
  // 50 free: 30 held by "lost"; "slow"'s 20 were released, so its retry fits.
  EXPECT_EQ(Bind(slow, "n1")["Error"], "");
  EXPECT_EQ(NodeOf("slow"), "n1");
}

TEST_F(ExtenderHttpTest, AReservationEndsWhenItsPodIsDeleted) {
  AddNode("n1", {{80, 50}});
  json a = AddPod("a", {40});
  json b = AddPod("b", {40});
  StartExtender(std::chrono::milliseconds(50));
  ASSERT_EQ(Bind(a, "n1")["Error"], "");
  EXPECT_TRUE(Filter(b, {"n1"})["NodeNames"].empty());
  // a is deleted before its node ever listed it (it never started).
  api_->Delete("/api/v1/namespaces/default/pods/a");
  EXPECT_TRUE(WaitFor([&] { return service_->view().stats().reservations == 0; }));
  EXPECT_EQ(Filter(b, {"n1"})["NodeNames"], json::array({"n1"}));
}

// kube-scheduler retries a pod the extender turned away only on a cluster event (issue 34: on
// the real scheduler a pod waited minutes after the pod holding its units was deleted). The
// filter looks up the reservations on the nodes that fail, so the retry that the deletion's own
// event causes finds the units free, without waiting for the periodic check (here: never).
TEST_F(ExtenderHttpTest, AFilterEndsTheReservationsOfDeletedPodsOnTheNodesThatFail) {
  AddNode("n1", {{80, 50}});
  json a = AddPod("a", {40});
  json b = AddPod("b", {40});
  StartExtender(std::chrono::hours(1));
  ASSERT_EQ(Bind(a, "n1")["Error"], "");
  json failed = Filter(b, {"n1"});
  EXPECT_TRUE(failed["NodeNames"].empty());
  EXPECT_TRUE(failed["FailedNodes"].contains("n1") ||
              failed["FailedAndUnresolvableNodes"].contains("n1"))
      << failed.dump();
  EXPECT_EQ(service_->view().stats().reservations, 1u);  // a still exists: it keeps its units
  api_->Delete("/api/v1/namespaces/default/pods/a");
  EXPECT_EQ(Filter(b, {"n1"})["NodeNames"], json::array({"n1"}));
  EXPECT_EQ(service_->view().stats().reservations, 0u);
}

// The retry that a deletion causes comes moments after the deletion, and so often moments after
// the last lookup found the pod alive (kube-scheduler 1.37's retry of a preemptor after its victim
// is deleted; the periodic check). A lookup older than the request does not count: here each
// first filter looks `a` up and finds it alive, and the filter right after the deletion must
// still find the units free (the periodic check never runs).
TEST_F(ExtenderHttpTest, ALookupFromBeforeTheRequestDoesNotHideADeletion) {
  AddNode("n1", {{80, 50}});
  json b = AddPod("b", {40});
  StartExtender(std::chrono::hours(1));
  for (int round = 0; round < 5; ++round) {
    const std::string name = "a" + std::to_string(round);
    json a = AddPod(name, {40});
    ASSERT_EQ(Bind(a, "n1")["Error"], "");
    ASSERT_TRUE(Filter(b, {"n1"})["NodeNames"].empty());  // a holds the units, looked up alive
    api_->Delete("/api/v1/namespaces/default/pods/" + name);
    EXPECT_EQ(Filter(b, {"n1"})["NodeNames"], json::array({"n1"})) << "round " << round;
    EXPECT_EQ(service_->view().stats().reservations, 0u);
  }
}

TEST(FailedNodesOf, NamesBothMapsAndNothingElse) {
  EXPECT_EQ(FailedNodesOf(R"({"NodeNames":["a"],"FailedNodes":{"b":"x"},)"
                          R"("FailedAndUnresolvableNodes":{"c":"y"},"Error":""})"),
            (std::set<std::string>{"b", "c"}));
  EXPECT_TRUE(FailedNodesOf("not json").empty());
  EXPECT_TRUE(FailedNodesOf(R"({"FailedNodes":null})").empty());
}

}  // namespace
}  // namespace gpulet::extender
