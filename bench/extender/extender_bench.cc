// Scheduler extender figures (markdown on stdout, for docs/benchmarks.md):
//  1. filter + prioritize latency, node-cache mode, through real HTTP (a kept-alive connection, as
//     kube-scheduler's client keeps one), for 1,000 and 5,000 nodes × 8 GPUs; the extender's view
//     filled from the fake API server by its own watches. One sample = POST /filter with every
//     node name + POST /prioritize with the nodes that passed, each timed from the request sent
//     to the answer read (the client's parsing of the filter answer in between is not counted).
//     The in-process columns: the same two calls on the Extender directly, without HTTP; the
//     "HTTP alone" columns: the same bodies through the HTTP server to handlers that answer
//     precomputed replies (the transport's share). Two node-list modes: the same list for every
//     pod, and a list rotated by one node per pod (no list repeats, as kube-scheduler starts each
//     pod's search where the last stopped).
//  2. bind throughput: POST /bind from 16 concurrent clients, each bind reading the pod (GET),
//     reserving units and creating the Binding in the fake API server (HTTPS on loopback, one TLS connection per call
//     as src/k8s/client makes them).
#include <httplib.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "apiserver/fake_apiserver.h"
#include "extender/service.h"
#include "extender/test_objects.h"
#include "metrics/collector.h"
#include "metrics/http_server.h"

namespace gpulet::extender {
namespace {

using Steady = std::chrono::steady_clock;
using nlohmann::json;
using namespace testobjects;

double Ms(Steady::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Stats {
  double median, p99;
};
Stats Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[std::min(v.size() - 1, v.size() * 99 / 100)]};
}

struct Setup {
  std::unique_ptr<testing::FakeApiServer> api;
  std::unique_ptr<k8s::Client> client;
  std::unique_ptr<Service> service;
  std::vector<std::string> names;
};

bool Start(Setup& s, int nodes, const testing::TestPki& pki) {
  auto api = testing::FakeApiServer::Start(pki, {});
  if (!api.ok()) return false;
  s.api = std::move(api).value();
  std::mt19937 rng(42);
  std::uniform_int_distribution<int> free(0, 80);
  for (int i = 0; i < nodes; ++i) {
    const std::string n = "gpu-node-" + std::to_string(i);
    std::vector<Gpu> gpus(8);
    for (Gpu& g : gpus) g.free = free(rng);
    s.api->Put("/api/v1/nodes/" + n,
               {{"metadata", {{"name", n}, {"labels", {{"gpulet.io/gpu-memory.pool", "true"}}}}}});
    s.api->Put("/api/v1/namespaces/gpulet-system/configmaps/gpulet-memory-" + n,
               MemoryConfigMap(n, MemoryJson(n, gpus).dump()));
    s.names.push_back(n);
  }
  k8s::ClusterAccess a = s.api->Access(pki);
  s.client = std::make_unique<k8s::Client>(a);
  ServiceOptions o;
  o.address = "127.0.0.1:0";
  o.threads = 16;
  o.view.stale_after = std::chrono::hours(1);
  s.service = std::make_unique<Service>(*s.client, RealClock(), o);
  Status st = s.service->Start();
  if (!st.ok()) std::fprintf(stderr, "start: %s\n", st.message().c_str());
  return st.ok();
}

// `rotate`: each pod's list starts one node further on, as kube-scheduler's own filtering does
// (it starts each pod's search where the previous one stopped), so no list repeats and the
// extender resolves every name of every filter call; prioritize then gets the filter's answer.
void Latency(int nodes, int runs, const testing::TestPki& pki, bool rotate) {
  Setup s;
  if (!Start(s, nodes, pki)) return;
  httplib::Client c("127.0.0.1", s.service->port());
  c.set_keep_alive(true);
  c.set_tcp_nodelay(true);  // as Go's net/http, kube-scheduler's client
  const json pod = MemoryPod("bench", {20});
  std::string filter_body = CacheModeArgs(pod, s.names);
  std::vector<double> total, filter;
  size_t passed = 0;
  for (int i = 0; i < runs + 5; ++i) {
    if (rotate) {
      std::rotate(s.names.begin(), s.names.begin() + 1, s.names.end());
      filter_body = CacheModeArgs(pod, s.names);
    }
    const auto t0 = Steady::now();
    auto f = c.Post("/filter", filter_body, "application/json");
    const auto t1 = Steady::now();
    if (!f || f->status != 200) {
      std::fprintf(stderr, "filter failed\n");
      return;
    }
    // The scheduler's own JSON work between the calls is not the extender's: not timed.
    const json fr = json::parse(f->body);
    std::vector<std::string> ok = fr["NodeNames"].get<std::vector<std::string>>();
    const std::string prioritize_body = CacheModeArgs(pod, ok);
    const auto t2 = Steady::now();
    auto p = c.Post("/prioritize", prioritize_body, "application/json");
    const auto t3 = Steady::now();
    if (!p || p->status != 200) return;
    passed = ok.size();
    if (i < 5) continue;  // warm-up
    filter.push_back(Ms(t1 - t0));
    total.push_back(Ms((t1 - t0) + (t3 - t2)));
  }
  // The transport alone: the same bodies to a server whose handlers answer precomputed replies.
  std::vector<double> floor;
  {
    const std::string filter_reply = s.service->extender().Filter(filter_body).body;
    const json fr = json::parse(filter_reply);
    const std::string prioritize_body =
        CacheModeArgs(pod, fr["NodeNames"].get<std::vector<std::string>>());
    const std::string prioritize_reply = s.service->extender().Prioritize(prioritize_body).body;
    metrics::Publisher pub;
    metrics::HttpOptions o;
    o.address = "127.0.0.1:0";
    o.post_routes["/filter"] = [&](const std::string&) {
      return metrics::HttpOptions::PostReply{200, "application/json", filter_reply};
    };
    o.post_routes["/prioritize"] = [&](const std::string&) {
      return metrics::HttpOptions::PostReply{200, "application/json", prioritize_reply};
    };
    metrics::MetricsServer server(pub, o);
    if (!server.Start().ok()) return;
    httplib::Client fc("127.0.0.1", server.port());
    fc.set_keep_alive(true);
    fc.set_tcp_nodelay(true);
    for (int i = 0; i < runs + 5; ++i) {
      const auto t0 = Steady::now();
      auto f = fc.Post("/filter", filter_body, "application/json");
      auto p = fc.Post("/prioritize", prioritize_body, "application/json");
      if (!f || !p) return;
      if (i >= 5) floor.push_back(Ms(Steady::now() - t0));
    }
  }
  // The same calls in process (no HTTP, no socket): the extender's own share of the time.
  std::vector<double> own;
  for (int i = 0; rotate && i < runs; ++i) {
    std::rotate(s.names.begin(), s.names.begin() + 1, s.names.end());
    const std::string body = CacheModeArgs(pod, s.names);
    const auto t0 = Steady::now();
    const Answer a = s.service->extender().Filter(body);
    const auto t1 = Steady::now();
    const std::string prioritize_body =
        CacheModeArgs(pod, json::parse(a.body)["NodeNames"].get<std::vector<std::string>>());
    const auto t2 = Steady::now();
    const Answer b = s.service->extender().Prioritize(prioritize_body);
    own.push_back(Ms((t1 - t0) + (Steady::now() - t2)));
    if (a.status != 200 || b.status != 200) return;
  }
  if (!rotate) {
    const json fr = json::parse(s.service->extender().Filter(filter_body).body);
    const std::string prioritize_body =
        CacheModeArgs(pod, fr["NodeNames"].get<std::vector<std::string>>());
    for (int i = 0; i < runs; ++i) {
      const auto t0 = Steady::now();
      const Answer a = s.service->extender().Filter(filter_body);
      const Answer b = s.service->extender().Prioritize(prioritize_body);
      own.push_back(Ms(Steady::now() - t0));
      if (a.status != 200 || b.status != 200) return;
    }
  }
  const Stats f = Summarize(filter), t = Summarize(total), o = Summarize(own), h = Summarize(floor);
  std::printf(
      "| %d × 8 | %s | %zu | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %d |\n", nodes,
      rotate ? "new each pod" : "same", passed, f.median, f.p99, t.median, t.p99, o.median, o.p99,
      h.median, h.p99, runs);
}

void Binds(int pods, int clients, const testing::TestPki& pki) {
  Setup s;
  if (!Start(s, 100, pki)) return;
  std::vector<json> all;
  for (int i = 0; i < pods; ++i) {
    json p = MemoryPod("pod-" + std::to_string(i), {1});
    s.api->Put("/api/v1/namespaces/default/pods/pod-" + std::to_string(i), p);
    all.push_back(std::move(p));
  }
  // The scheduler filters each pod first (bind still reads each pod from the API server: a
  // filter request is never taken as the pod).
  {
    httplib::Client c("127.0.0.1", s.service->port());
    for (const json& p : all)
      c.Post("/filter", CacheModeArgs(p, {"gpu-node-0"}), "application/json");
  }
  std::atomic<int> ok{0}, refused{0};
  std::vector<std::thread> threads;
  const auto t0 = Steady::now();
  for (int t = 0; t < clients; ++t) {
    threads.emplace_back([&, t] {
      httplib::Client c("127.0.0.1", s.service->port());
      c.set_keep_alive(true);
      c.set_tcp_nodelay(true);
      for (size_t i = static_cast<size_t>(t); i < all.size(); i += static_cast<size_t>(clients)) {
        const std::string node = s.names[i % s.names.size()];
        auto r = c.Post("/bind", BindingArgs(all[i], node), "application/json");
        if (r && r->status == 200 && json::parse(r->body)["Error"] == "") {
          ++ok;
        } else {
          ++refused;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(Steady::now() - t0).count();
  std::printf("| %d | %d | %d | %d | %.2f | %.0f |\n", pods, clients, ok.load(), refused.load(),
              secs, ok.load() / secs);
}

}  // namespace
}  // namespace gpulet::extender

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  const int runs = argc > 1 ? std::atoi(argv[1]) : 200;
  const int pods = argc > 2 ? std::atoi(argv[2]) : 2000;
  std::string dir = "/tmp/gpulet-bench-extender-XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) return 1;
  auto pki = gpulet::testing::MakeTestPki(dir);
  if (!pki.ok()) return 1;
  std::printf(
      "### Filter + prioritize, node-cache mode, real HTTP\n\n"
      "Pod asking for 20 units (1 GiB each); every node 8 GPUs of 80 units with 0–80 free "
      "(seeded). Times in ms. Node list \"same\": every pod's filter gets the same names (a "
      "stable cluster; the extender resolves a list it has seen by comparing its bytes); \"new "
      "each pod\": each list starts one node further on, as the scheduler's own search does, so "
      "every filter looks each name up. In-process: the same filter + prioritize called on the "
      "extender directly (no HTTP): its own share. HTTP alone: the same request and answer "
      "bodies through the same HTTP server with handlers that return precomputed answers.\n\n"
      "| nodes × GPUs | node list | passed | filter median | filter p99 | filter+prioritize median "
      "| "
      "filter+prioritize p99 | in-process median | in-process p99 | HTTP alone median | "
      "HTTP alone p99 | runs |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (bool rotate : {false, true}) {
    gpulet::extender::Latency(1000, runs, *pki, rotate);
    gpulet::extender::Latency(5000, runs, *pki, rotate);
  }
  std::printf(
      "\n### Bind throughput against the fake API server\n\n"
      "| pods | clients | bound | refused | seconds | binds/s |\n|---|---|---|---|---|---|\n");
  gpulet::extender::Binds(pods, 16, *pki);
  std::filesystem::remove_all(dir);
  return 0;
}
