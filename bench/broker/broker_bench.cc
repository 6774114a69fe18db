// Pool broker figures (markdown on stdout, for docs/benchmarks.md):
//  1. Evaluation cost at scale: 1,000 Slurm nodes and 10,000 pending jobs, with the parsing of
//     `sinfo --json` and `squeue --json` (generated here in Slurm 22.05's format) included.
//  2. Decision latency: from the demand signal (an Unschedulable GPU pod appears in the API
//     server) to the node usable in Kubernetes (uncordoned, untainted, labelled), excluding the
//     drain wait: the Slurm side answers from a script in which a drain takes effect at once, the
//     Kubernetes side is the fake API server over HTTPS on loopback, demandEvaluations = 1.
#include <spdlog/spdlog.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apiserver/fake_apiserver.h"
#include "broker/broker.h"
#include "broker/engine.h"
#include "broker/slurm_side.h"

namespace gpulet::broker {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Stats {
  double median, p99, max;
};
Stats Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[std::min(v.size() - 1, v.size() * 99 / 100)], v.back()};
}

std::string SinfoJson(int nodes, TimeMs now) {
  json arr = json::array();
  for (int i = 0; i < nodes; ++i) {
    const bool busy = i % 4 != 0;
    arr.push_back({{"name", "gpu" + std::to_string(10000 + i)},
                   {"state", busy ? "mixed" : "idle"},
                   {"state_flags", i % 97 == 0 ? json::array({"DRAIN"}) : json::array()},
                   {"reason", i % 97 == 0 ? "bad fan" : ""},
                   {"gres", "gpu:h100:8(S:0-1)"},
                   {"gres_used", busy ? "gpu:h100:8(IDX:0-7)" : "gpu:h100:0(IDX:N/A)"},
                   {"alloc_cpus", busy ? 64 : 0},
                   {"last_busy", now / 1000 - 3600 - i},
                   {"partitions", json::array({"gpu"})}});
  }
  return json{{"meta", json::object()}, {"errors", json::array()}, {"nodes", arr}}.dump();
}

std::string SqueueJson(int jobs) {
  json arr = json::array();
  for (int i = 0; i < jobs; ++i) {
    arr.push_back({{"job_id", 100000 + i},
                   {"job_state", "PENDING"},
                   {"state_reason", i % 3 == 0 ? "Resources" : "Priority"},
                   {"node_count", 1 + i % 4},
                   {"tres_per_node", "gres:gpu:h100:" + std::to_string(1 + i % 8)},
                   {"tres_per_job", ""},
                   {"required_nodes", i % 50 == 0 ? "gpu[10000-10003]" : ""},
                   {"nodes", ""},
                   {"partition", "gpu"}});
  }
  return json{{"meta", json::object()}, {"errors", json::array()}, {"jobs", arr}}.dump();
}

void EvaluationCost(int runs) {
  const TimeMs now = NowMs();
  const std::string sinfo = SinfoJson(1000, now);
  const std::string squeue = SqueueJson(10000);
  BrokerConfig c;
  for (int i = 0; i < 1000; ++i) c.nodes.push_back("gpu" + std::to_string(10000 + i));
  c.namespaces = {"inference"};
  c.k8s_max_nodes = 100;
  KubeView kube;
  kube.ok = true;
  kube.unschedulable_gpu_pods = 5;
  for (const std::string& n : c.nodes) kube.nodes[n] = KubeNode{n, true, true};
  Journal j;
  j.demand_streak = 10;
  std::vector<double> parse, eval, total;
  Decision last;
  for (int r = 0; r < runs; ++r) {
    auto t0 = Clock::now();
    SlurmView v;
    v.nodes = *ParseSinfoJson(sinfo, now);
    v.jobs = *ParseSqueueJson(squeue);
    v.ok = true;
    auto t1 = Clock::now();
    last = Evaluate(v, kube, j, c, now);
    auto t2 = Clock::now();
    parse.push_back(Ms(t1 - t0));
    eval.push_back(Ms(t2 - t1));
    total.push_back(Ms(t2 - t0));
  }
  Stats p = Summarize(parse), e = Summarize(eval), t = Summarize(total);
  std::printf("### Evaluation cost: 1,000 nodes, 10,000 pending jobs (%d runs)\n\n", runs);
  std::printf("Input: sinfo --json %.1f MB, squeue --json %.1f MB (generated, Slurm 22.05 "
              "format). Decision: %s %s (%s).\n\n",
              sinfo.size() / 1e6, squeue.size() / 1e6, ActionName(last.action), last.node.c_str(),
              last.code.c_str());
  std::printf("| step | median ms | p99 ms | max ms |\n|---|---|---|---|\n");
  std::printf("| parse sinfo + squeue JSON | %.1f | %.1f | %.1f |\n", p.median, p.p99, p.max);
  std::printf("| Evaluate (rules) | %.2f | %.2f | %.2f |\n", e.median, e.p99, e.max);
  std::printf("| total | %.1f | %.1f | %.1f |\n\n", t.median, t.p99, t.max);
}

// Slurm answered from a script: one idle node, drained as soon as the broker drains it.
class ScriptedSlurm : public slurm::CommandRunner {
 public:
  Result<slurm::CommandOutput> Run(const std::vector<std::string>& argv,
                                   std::chrono::milliseconds) const override {
    std::lock_guard<std::mutex> lock(mu_);
    std::string line;
    for (const auto& a : argv) line += a + " ";
    if (argv[0] == "sinfo") {
      json n = {{"name", "gpua"}, {"state", "idle"},       {"state_flags", json::array()},
                {"reason", ""},   {"gres", "gpu:h100:8"}, {"gres_used", "gpu:h100:0"},
                {"alloc_cpus", 0}, {"last_busy", 1}};
      if (drained_) {
        n["state_flags"] = json::array({"DRAIN"});
        n["reason"] = reason_;
      }
      return slurm::CommandOutput{0, json{{"errors", json::array()}, {"nodes", {n}}}.dump(), ""};
    }
    if (argv[0] == "squeue") {
      return slurm::CommandOutput{0, R"({"errors":[],"jobs":[]})", ""};
    }
    if (line.find("show reservation") != std::string::npos) {
      return slurm::CommandOutput{0, "No reservations in the system\n", ""};
    }
    if (line.find("State=DRAIN") != std::string::npos) {
      drained_ = true;
      reason_ = argv.back().substr(std::string("Reason=").size());
      return slurm::CommandOutput{0, "", ""};
    }
    if (line.find("State=RESUME") != std::string::npos) {
      drained_ = false;
      return slurm::CommandOutput{0, "", ""};
    }
    if (line.find("show node") != std::string::npos) {
      return slurm::CommandOutput{
          0,
          "NodeName=gpua State=" + std::string(drained_ ? "IDLE+DRAIN" : "IDLE") +
              (drained_ ? " Reason=" + reason_ + " [root@2026-01-01T00:00:00]" : "") + "\n",
          ""};
    }
    return slurm::CommandOutput{1, "", "unexpected " + line};
  }
  void Reset() {
    std::lock_guard<std::mutex> lock(mu_);
    drained_ = false;
  }

 private:
  mutable std::mutex mu_;
  mutable bool drained_ = false;
  mutable std::string reason_;
};

json Node() {
  return {{"metadata", {{"name", "gpua"}, {"labels", json::object()}}},
          {"spec",
           {{"unschedulable", true},
            {"taints", json::array({{{"key", "gpulet.io/pool"},
                                     {"value", "slurm"},
                                     {"effect", "NoSchedule"}}})}}}};
}

json PendingPod() {
  return {{"metadata", {{"name", "web"}, {"namespace", "inference"}}},
          {"spec", {{"containers", json::array({{{"name", "c"},
                                                 {"resources",
                                                  {{"limits", {{"nvidia.com/gpu", "1"}}}}}}})}}},
          {"status",
           {{"phase", "Pending"},
            {"conditions", json::array({{{"type", "PodScheduled"},
                                         {"status", "False"},
                                         {"reason", "Unschedulable"}}})}}}};
}

int DecisionLatency(int runs) {
  std::string tmpl = "/tmp/gpulet-broker-bench-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) return 1;
  const std::string dir = tmpl;
  Result<testing::TestPki> pki = testing::MakeTestPki(dir);
  if (!pki.ok()) {
    std::fprintf(stderr, "%s\n", pki.status().message().c_str());
    return 1;
  }
  auto api = testing::FakeApiServer::Start(*pki, {});
  if (!api.ok()) return 1;
  k8s::ClusterAccess access = (*api)->Access(*pki);
  k8s::Client client(access);
  BrokerConfig c;
  c.nodes = {"gpua"};
  c.namespaces = {"inference"};
  c.idle_time = 0;
  c.demand_evaluations = 1;
  c.cooldown = 0;
  c.min_residence = 0;
  c.journal_path = dir + "/journal.json";
  auto runner = std::make_shared<ScriptedSlurm>();
  SlurmSide slurm_side(runner, c);
  KubeSide kube_side(client, c);
  std::vector<double> latency, evals;
  for (int r = 0; r < runs; ++r) {
    runner->Reset();
    std::filesystem::remove(c.journal_path);
    (*api)->Put("/api/v1/nodes/gpua", Node());
    (*api)->Delete("/api/v1/namespaces/inference/pods/web");
    Broker b(c, slurm_side, kube_side, {});
    if (!b.Start().ok()) return 1;
    auto t0 = Clock::now();
    (*api)->Put("/api/v1/namespaces/inference/pods/web", PendingPod());
    int ticks = 0;
    for (; ticks < 10; ++ticks) {
      auto e0 = Clock::now();
      Decision d = b.Tick(NowMs());
      evals.push_back(Ms(Clock::now() - e0));
      if (d.action == Action::kAdmit) break;
    }
    latency.push_back(Ms(Clock::now() - t0));
  }
  std::filesystem::remove_all(dir);
  Stats l = Summarize(latency), e = Summarize(evals);
  std::printf("### Decision latency: demand signal → node usable in Kubernetes (%d runs)\n\n",
              runs);
  std::printf("Two evaluations (drain, then admit after a fresh read), demandEvaluations=1, the "
              "drain wait and the evaluation interval excluded; Slurm answered from a script, "
              "Kubernetes = fake API server over HTTPS on loopback.\n\n");
  std::printf("| measure | median ms | p99 ms | max ms |\n|---|---|---|---|\n");
  std::printf("| signal → usable in Kubernetes | %.1f | %.1f | %.1f |\n", l.median, l.p99, l.max);
  std::printf("| one evaluation (observe + decide + act) | %.1f | %.1f | %.1f |\n\n", e.median,
              e.p99, e.max);
  return 0;
}

}  // namespace
}  // namespace gpulet::broker

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::atoi(argv[1]) : 20;
  spdlog::set_level(spdlog::level::warn);
  gpulet::broker::EvaluationCost(std::max(3, runs / 4));
  return gpulet::broker::DecisionLatency(runs);
}
