// The API client and the single-object watcher against the fake API server over real TLS:
// in-cluster and kubeconfig access, GET/PATCH, bearer token and client certificates, watch
// streams that break mid-line, and 410 Gone (as an ERROR event and as an HTTP status).
#include "k8s/client.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "apiserver/fake_apiserver.h"
#include "k8s/access.h"
#include "k8s/watch.h"

namespace gpulet::k8s {
namespace {

using gpulet::testing::FakeApiServer;
using gpulet::testing::TestPki;
using namespace std::chrono_literals;

const std::string kNodePath = "/api/v1/nodes/gpu-node-1";

std::string TempDir() {
  std::string tmpl = ::testing::TempDir() + "gpulet-k8s-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Base64(const std::string& in) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    unsigned v = (static_cast<unsigned char>(in[i]) << 16) |
                 (static_cast<unsigned char>(in[i + 1]) << 8) |
                 static_cast<unsigned char>(in[i + 2]);
    out += {t[v >> 18], t[(v >> 12) & 63], t[(v >> 6) & 63], t[v & 63]};
  }
  if (i + 1 == in.size()) {
    unsigned v = static_cast<unsigned char>(in[i]) << 16;
    out += {t[v >> 18], t[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == in.size()) {
    unsigned v =
        (static_cast<unsigned char>(in[i]) << 16) | (static_cast<unsigned char>(in[i + 1]) << 8);
    out += {t[v >> 18], t[(v >> 12) & 63], t[(v >> 6) & 63], '='};
  }
  return out;
}

class ApiTest : public ::testing::Test {
 protected:
  void StartServer(FakeApiServer::Options options = {}) {
    dir_ = TempDir();
    Result<TestPki> pki = gpulet::testing::MakeTestPki(dir_);
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    pki_ = *pki;
    Result<std::unique_ptr<FakeApiServer>> s = FakeApiServer::Start(pki_, options);
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(s).value();
    Result<nlohmann::json> node = gpulet::testing::LoadRecorded("node.json");
    ASSERT_TRUE(node.ok());
    server_->Put(kNodePath, *node);
  }
  ClusterAccess Access() const {
    ClusterAccess a = server_->Access(pki_);
    return a;
  }
  std::string dir_;
  TestPki pki_;
  std::unique_ptr<FakeApiServer> server_;
};

TEST(Base64, DecodesWithPaddingAndRejectsGarbage) {
  EXPECT_EQ(*DecodeBase64("aGVsbG8="), "hello");
  EXPECT_EQ(*DecodeBase64("aGVs\nbG8h"), "hello!");
  EXPECT_FALSE(DecodeBase64("a*b").ok());
}

TEST_F(ApiTest, InClusterAccessReadsTheServiceAccountTokenAndCa) {
  StartServer();
  const std::string sa = dir_ + "/sa";
  std::filesystem::create_directories(sa);
  std::filesystem::copy_file(pki_.ca_cert, sa + "/ca.crt");
  std::ofstream(sa + "/token") << "test-token\n";
  const std::string port = server_->url().substr(server_->url().rfind(':') + 1);
  Result<ClusterAccess> a = InClusterAccess(sa, "127.0.0.1", port);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->server, server_->url());
  Client client(*a);
  Result<nlohmann::json> node = client.Get(kNodePath);
  ASSERT_TRUE(node.ok()) << node.status().message();
  EXPECT_EQ((*node)["status"]["capacity"]["nvidia.com/gpu"], "8");
  // A rotated token is picked up by the next request.
  std::ofstream(sa + "/token") << "rotated\n";
  EXPECT_EQ(client.Get(kNodePath).status().code(), ErrorCode::kUnavailable);
}

TEST(InCluster, OutsideAPodSaysToPassAKubeconfig) {
  Result<ClusterAccess> a = InClusterAccess("/nonexistent", "", "");
  EXPECT_EQ(a.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(a.status().message().find("--kubeconfig"), std::string::npos);
}

TEST_F(ApiTest, KubeconfigWithInlineCaAndClientCertificateReachesAServerThatDemandsOne) {
  FakeApiServer::Options o;
  o.require_client_cert = true;
  StartServer(o);
  const std::string kc = dir_ + "/kubeconfig";
  std::ofstream(kc) << "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
                       "clusters:\n- name: c1\n  cluster:\n    server: "
                    << server_->url()
                    << "/\n    certificate-authority-data: " << Base64(Slurp(pki_.ca_cert))
                    << "\nusers:\n- name: u1\n  user:\n    token: test-token\n"
                       "    client-certificate-data: "
                    << Base64(Slurp(pki_.client_cert))
                    << "\n    client-key: client.key\n"
                       "contexts:\n- name: test\n  context:\n    cluster: c1\n    user: u1\n";
  Result<ClusterAccess> a = LoadKubeconfig(kc);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->server, server_->url());
  EXPECT_EQ(a->client_key_file, dir_ + "/client.key");
  Result<nlohmann::json> node = Client(*a).Get(kNodePath);
  ASSERT_TRUE(node.ok()) << node.status().message();
  EXPECT_EQ((*node)["metadata"]["name"], "gpu-node-1");

  ClusterAccess no_cert = *a;
  no_cert.client_cert_data.clear();
  no_cert.client_key_file.clear();
  EXPECT_EQ(Client(no_cert).Get(kNodePath).status().code(), ErrorCode::kUnavailable);
}

TEST(Kubeconfig, ErrorsNameFileLineAndField) {
  const std::string dir = TempDir();
  const std::string kc = dir + "/kubeconfig";
  std::ofstream(kc) << "current-context: test\nclusters:\n- name: c1\n  cluster:\n"
                       "    server: ftp://example\ncontexts:\n- name: test\n  context:\n"
                       "    cluster: c1\n";
  Result<ClusterAccess> a = LoadKubeconfig(kc);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), ErrorCode::kInvalidInput);
  EXPECT_NE(a.status().message().find(kc + ":5: clusters[c1].cluster.server"), std::string::npos)
      << a.status().message();

  std::ofstream(kc) << "current-context: nope\ncontexts: []\n";
  a = LoadKubeconfig(kc);
  EXPECT_NE(a.status().message().find("no context named \"nope\""), std::string::npos)
      << a.status().message();
  EXPECT_EQ(LoadKubeconfig(dir + "/missing").status().code(), ErrorCode::kNotFound);
}

// client-go refuses a cluster with insecure-skip-tls-verify and a CA (file or data), naming the
// reason in these words; so do we, with the file, line and field.
TEST(Kubeconfig, SkipVerifyTogetherWithACaIsRefusedAsClientGoRefusesIt) {
  const std::string dir = TempDir();
  const std::string kc = dir + "/kubeconfig";
  for (const std::string& ca : {std::string("certificate-authority: ca.crt"),
                                "certificate-authority-data: " + Base64("pem")}) {
    std::ofstream(kc) << "current-context: test\nclusters:\n- name: c1\n  cluster:\n"
                         "    server: https://10.0.0.1:6443\n    " << ca << "\n"
                         "    insecure-skip-tls-verify: true\ncontexts:\n- name: test\n"
                         "  context:\n    cluster: c1\n";
    Result<ClusterAccess> a = LoadKubeconfig(kc);
    ASSERT_FALSE(a.ok()) << ca;
    EXPECT_EQ(a.status().code(), ErrorCode::kInvalidInput);
    EXPECT_NE(a.status().message().find(
                  kc + ":7: clusters[c1].cluster.insecure-skip-tls-verify: specifying a root "
                       "certificates file with the insecure flag is not allowed"),
              std::string::npos)
        << a.status().message();
  }
  std::ofstream(kc) << "current-context: test\nclusters:\n- name: c1\n  cluster:\n"
                       "    server: https://10.0.0.1:6443\n    insecure-skip-tls-verify: true\n"
                       "contexts:\n- name: test\n  context:\n    cluster: c1\n";
  Result<ClusterAccess> alone = LoadKubeconfig(kc);
  ASSERT_TRUE(alone.ok()) << alone.status().message();
  EXPECT_TRUE(alone->insecure_skip_tls_verify);
  std::filesystem::remove_all(dir);
}

TEST_F(ApiTest, UntrustedServerCertificateFails) {
  StartServer();
  ClusterAccess a = Access();
  a.ca_file.clear();
  a.ca_data = "-----BEGIN CERTIFICATE-----\nnot a cert\n-----END CERTIFICATE-----\n";
  Result<nlohmann::json> r = Client(a).Get(kNodePath);
  EXPECT_EQ(r.status().code(), ErrorCode::kUnavailable);
}

TEST_F(ApiTest, GetMapsHttpErrorsToCodesWithTheServersMessage) {
  StartServer();
  Result<nlohmann::json> missing = Client(Access()).Get("/api/v1/nodes/nope");
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(missing.status().message().find("HTTP 404"), std::string::npos);
  ClusterAccess bad = Access();
  bad.token = "wrong";
  Result<nlohmann::json> denied = Client(bad).Get(kNodePath);
  EXPECT_EQ(denied.status().code(), ErrorCode::kUnavailable);
  EXPECT_NE(denied.status().message().find("HTTP 401"), std::string::npos)
      << denied.status().message();
}

// GETs keep their connection (no TCP or TLS handshake after the first), also across the
// Client's copies and from several threads; writes each open their own, so a write whose answer
// was lost is never sent again on a reused connection.
TEST_F(ApiTest, GetsReuseTheirConnectionWritesDoNot) {
  StartServer();
  Client client(Access());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(client.Get(kNodePath).ok());
  Client copy = client;
  ASSERT_TRUE(copy.Get(kNodePath).ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(client.Patch(kNodePath, {{"metadata", {{"labels", {{"k", std::to_string(i)}}}}}},
                             PatchType::kMerge)
                    .ok());
  }
  std::set<int> get_ports, patch_ports;
  size_t gets = 0, patches = 0;
  for (const auto& r : server_->requests()) {
    if (r.method == "GET") {
      get_ports.insert(r.remote_port);
      ++gets;
    }
    if (r.method == "PATCH") {
      patch_ports.insert(r.remote_port);
      ++patches;
    }
  }
  EXPECT_EQ(gets, 6u);
  EXPECT_EQ(get_ports.size(), 1u);  // one connection for all six
  EXPECT_EQ(patches, 3u);
  EXPECT_EQ(patch_ports.size(), 3u);
  EXPECT_EQ(patch_ports.count(*get_ports.begin()), 0u);

  // Concurrent GETs each get a handle (at most 4 stay pooled); all succeed.
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10; ++i) ok += client.Get(kNodePath).ok();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 80);
}

// A 429's Retry-After reaches the caller (the DRA publisher and status writer wait that long).
TEST_F(ApiTest, RetryAfterOfA429IsPassedBack) {
  StartServer();
  Client client(Access());
  server_->InjectWriteFault({"PATCH", kNodePath, gpulet::testing::WriteFault::Kind::kTooManyRequests,
                             429, 7, std::chrono::milliseconds(0), 1});
  const nlohmann::json patch = {{"metadata", {{"labels", {{"k", "v"}}}}}};
  ApiResult<nlohmann::json> refused = client.Patch(kNodePath, patch, PatchType::kMerge);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.http_status(), 429);
  EXPECT_EQ(refused.retry_after(), std::chrono::seconds(7));
  ApiResult<nlohmann::json> done = client.Patch(kNodePath, patch, PatchType::kMerge);
  ASSERT_TRUE(done.ok()) << done.status().message();
  ApiResult<nlohmann::json> missing = client.Get("/api/v1/nodes/absent");
  EXPECT_EQ(missing.http_status(), 404);
  EXPECT_EQ(missing.retry_after(), std::chrono::seconds(0));
}

TEST_F(ApiTest, PatchMergesLabelsAndBumpsTheResourceVersion) {
  StartServer();
  Client client(Access());
  const std::string before = (*client.Get(kNodePath))["metadata"]["resourceVersion"];
  Result<nlohmann::json> merged =
      client.Patch(kNodePath, {{"metadata", {{"labels", {{"nvidia.com/gpu.product", "H100"}}}}}},
                   PatchType::kMerge);
  ASSERT_TRUE(merged.ok()) << merged.status().message();
  EXPECT_EQ((*merged)["metadata"]["labels"]["nvidia.com/gpu.product"], "H100");
  EXPECT_EQ((*merged)["metadata"]["labels"]["kubernetes.io/os"], "linux");
  EXPECT_NE((*merged)["metadata"]["resourceVersion"], before);
  Result<nlohmann::json> smp =
      client.Patch(kNodePath, {{"metadata", {{"labels", {{"nvidia.com/gpu.product", nullptr}}}}}},
                   PatchType::kStrategicMerge);
  ASSERT_TRUE(smp.ok()) << smp.status().message();
  EXPECT_FALSE(
      (*server_->Object(kNodePath))["metadata"]["labels"].contains("nvidia.com/gpu.product"));
  const auto reqs = server_->requests();
  EXPECT_EQ(reqs.back().content_type, "application/strategic-merge-patch+json");
  EXPECT_EQ(reqs.back().method, "PATCH");
}

// Collects what a watcher reports, for waiting on from the test thread.
class Recorder {
 public:
  void Add(const std::optional<nlohmann::json>& o) {
    std::lock_guard<std::mutex> lock(mu_);
    seen_.push_back(o);
    cv_.notify_all();
  }
  // Waits until some reported object has label key=value.
  bool WaitForLabel(const std::string& key, const std::string& value) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, 20s, [&] {
      for (const auto& o : seen_) {
        if (o && (*o)["metadata"]["labels"].value(key, "") == value) return true;
      }
      return false;
    });
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::optional<nlohmann::json>> seen_;
};

class WatchTest : public ApiTest {
 protected:
  void StartWatcher() {
    WatcherOptions wo;
    wo.initial_backoff = 50ms;
    wo.max_backoff = 200ms;
    client_ = std::make_unique<Client>(Access());
    watcher_ = std::make_unique<ObjectWatcher>(*client_, NodeRef("gpu-node-1"), wo);
    thread_ = std::thread([this] {
      watcher_->Run(stop_, [this](const std::optional<nlohmann::json>& o) { rec_.Add(o); });
    });
  }
  void SetLabel(const std::string& value) {
    nlohmann::json node = *server_->Object(kNodePath);
    node["metadata"]["labels"]["test"] = value;
    server_->Put(kNodePath, node);
  }
  void TearDown() override {
    stop_.Stop();
    if (thread_.joinable()) thread_.join();
  }
  StopSignal stop_;
  Recorder rec_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<ObjectWatcher> watcher_;
  std::thread thread_;
};

TEST_F(WatchTest, DeliversTheObjectThenEveryChange) {
  StartServer();
  StartWatcher();
  ASSERT_TRUE(rec_.WaitForLabel("kubernetes.io/os", "linux"));
  ASSERT_TRUE(server_->WaitForOpenWatches(1, 20s));
  SetLabel("one");
  ASSERT_TRUE(rec_.WaitForLabel("test", "one"));
  SetLabel("two");
  ASSERT_TRUE(rec_.WaitForLabel("test", "two"));
  EXPECT_EQ(watcher_->stats().lists.load(), 1u);
  // The watch asked for the right object from the version the GET returned.
  bool found = false;
  for (const auto& r : server_->requests()) {
    if (r.query.find("watch=1") != std::string::npos) {
      found = true;
      EXPECT_NE(r.query.find("fieldSelector=metadata.name%3Dgpu-node-1"), std::string::npos)
          << r.query;
      EXPECT_NE(r.query.find("resourceVersion="), std::string::npos) << r.query;
    }
  }
  EXPECT_TRUE(found);
}

TEST_F(WatchTest, BrokenStreamResumesFromTheLastVersionWithoutMissingAChange) {
  StartServer();
  StartWatcher();
  ASSERT_TRUE(server_->WaitForOpenWatches(1, 20s));
  SetLabel("before");
  ASSERT_TRUE(rec_.WaitForLabel("test", "before"));
  const std::string last = watcher_->resource_version();
  server_->BreakWatches();
  SetLabel("during");  // made while the stream is down or reconnecting
  ASSERT_TRUE(rec_.WaitForLabel("test", "during"));
  EXPECT_GE(watcher_->stats().reconnects.load(), 1u);
  EXPECT_EQ(watcher_->stats().lists.load(), 1u);  // resumed, not re-listed
  bool resumed = false;
  for (const auto& r : server_->requests()) {
    if (r.query.find("resourceVersion=" + last) != std::string::npos) resumed = true;
  }
  EXPECT_TRUE(resumed) << "no watch resumed from " << last;
}

TEST_F(WatchTest, GoneAsAnErrorEventReListsAndCatchesUp) {
  StartServer();
  StartWatcher();
  ASSERT_TRUE(server_->WaitForOpenWatches(1, 20s));
  ASSERT_TRUE(rec_.WaitForLabel("kubernetes.io/os", "linux"));
  SetLabel("fresh");
  ASSERT_TRUE(rec_.WaitForLabel("test", "fresh"));
  // Everything the watcher knows is compacted away, and a change happens meanwhile.
  server_->ExpireVersionsBefore(server_->current_version() + 1);
  server_->BreakWatches();
  SetLabel("after-compaction");
  ASSERT_TRUE(rec_.WaitForLabel("test", "after-compaction"));
  EXPECT_GE(watcher_->stats().gone.load(), 1u);
  EXPECT_GE(watcher_->stats().lists.load(), 2u);
}

TEST_F(WatchTest, GoneAsHttpStatusReListsToo) {
  StartServer();
  server_->SetGoneAsHttpStatus(true);
  StartWatcher();
  ASSERT_TRUE(server_->WaitForOpenWatches(1, 20s));
  server_->ExpireVersionsBefore(server_->current_version() + 1);
  server_->BreakWatches();
  SetLabel("http-410");
  ASSERT_TRUE(rec_.WaitForLabel("test", "http-410"));
  EXPECT_GE(watcher_->stats().gone.load(), 1u);
  EXPECT_GE(watcher_->stats().lists.load(), 2u);
}

TEST_F(WatchTest, DeletionIsReportedAsAbsentAndRecreationAsTheObject) {
  StartServer();
  StartWatcher();
  ASSERT_TRUE(server_->WaitForOpenWatches(1, 20s));
  ASSERT_TRUE(rec_.WaitForLabel("kubernetes.io/os", "linux"));
  const size_t before = rec_.count();
  server_->Delete(kNodePath);
  Result<nlohmann::json> node = gpulet::testing::LoadRecorded("node.json");
  (*node)["metadata"]["labels"]["test"] = "recreated";
  server_->Put(kNodePath, *node);
  ASSERT_TRUE(rec_.WaitForLabel("test", "recreated"));
  EXPECT_GE(rec_.count(), before + 2);
}

// The stop flag ends an open (idle) watch stream: Watch returns kStopped without an error (a
// stream that ended any other way is kClosed or kBroken). A client that missed the flag would hang
// in join() until the ctest timeout, which fails the test.
TEST_F(WatchTest, StopEndsAnOpenWatchPromptly) {
  StartServer();
  Client client(Access());
  std::atomic<bool> stop{false};
  std::atomic<int> events{0};
  WatchResult result;
  result.end = WatchEnd::kFailed;
  std::thread watch([&] {
    result = client.Watch(
        "/api/v1/nodes?watch=1&fieldSelector=metadata.name%3Dgpu-node-1",
        [&](const WatchEvent&) {
          ++events;
          return true;
        },
        &stop);
  });
  ASSERT_TRUE(server_->WaitForOpenWatches(1, 20s));
  stop = true;
  watch.join();  // the client checks the flag at least once a second while the stream is idle
  EXPECT_EQ(result.end, WatchEnd::kStopped);
  EXPECT_TRUE(result.error.ok()) << result.error.message();
}

// The watcher loop built on it also ends on the stop signal, after it delivered the object.
TEST_F(WatchTest, StopEndsTheWatcherLoop) {
  StartServer();
  StartWatcher();
  ASSERT_TRUE(server_->WaitForOpenWatches(1, 20s));
  ASSERT_TRUE(rec_.WaitForLabel("kubernetes.io/os", "linux"));
  stop_.Stop();
  thread_.join();
  EXPECT_EQ(watcher_->stats().lists.load(), 1u);
}

}  // namespace
}  // namespace gpulet::k8s
