#include "extender/equivalence.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "common/clock.h"
#include "extender/extender.h"
#include "extender/scoring.h"
#include "placement/artifact.h"

namespace gpulet::extender {
namespace {

using nlohmann::json;

constexpr int64_t kUnitsPerGpu = placement::kMilliPerGpu;

std::string GpuUuid(const std::string& node, size_t i) {
  return "GPU-" + node + "-" + std::to_string(i);
}

json NodeObject(const placement::Cluster& cluster, const placement::Node& node) {
  json gpus = json::array();
  for (size_t i = 0; i < node.gpu_free.size(); ++i) {
    gpus.push_back({{"uuid", GpuUuid(node.name, i)},
                    {"index", i},
                    {"model", cluster.models[static_cast<size_t>(node.model)]},
                    {"healthy", true},
                    {"totalUnits", kUnitsPerGpu},
                    {"freeUnits", node.gpu_free[i] * kUnitsPerGpu / placement::kMilliPerGpu}});
  }
  const json memory = {{"version", 1},
                       {"node", node.name},
                       {"generation", 1},
                       {"resource", kEquivalenceResource},
                       {"unitBytes", 1 << 20},
                       {"heartbeatSeconds", 30},
                       {"gpus", gpus},
                       {"pods", json::array()}};
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata",
           {{"name", std::string(kObjectPrefix) + node.name},
            {"namespace", "gpulet-system"},
            {"resourceVersion", "1"},
            {"labels", {{kMemoryPoolLabel, "true"}, {kNodeLabel, node.name}}}}},
          {"data", {{"memory.json", memory.dump()}}}};
}

std::string Describe(const Placed& p) {
  return p.node.empty() ? "not placed" : p.node + "/gpu" + std::to_string(p.gpu);
}

}  // namespace

json EquivalencePod(const placement::Pod& pod) {
  const std::string units = std::to_string(pod.gpu_milli);
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", pod.name}, {"namespace", "replay"}, {"uid", "uid-" + pod.name}}},
          {"spec",
           {{"schedulerName", "gpulet-memory"},
            {"containers",
             {{{"name", "main"},
               {"image", "registry.k8s.io/pause:3.9"},
               {"resources",
                {{"limits", {{kEquivalenceResource, units}}},
                 {"requests", {{kEquivalenceResource, units}}}}}}}}}},
          {"status", {{"phase", "Pending"}}}};
}

Result<EquivalenceSetup> PrepareEquivalence(const placement::Cluster& nodes,
                                            const std::vector<placement::Pod>& trace,
                                            const EquivalenceOptions& options) {
  EquivalenceSetup s;
  s.cluster.models = nodes.models;
  for (const placement::Node& n : nodes.nodes) {
    if (n.GpuCount() == 0 || n.model < 0) continue;
    if (options.max_nodes > 0 && s.cluster.nodes.size() >= options.max_nodes) break;
    if (n.GpuCount() > placement::kMaxGpusPerNode) {
      return Status(ErrorCode::kInvalidInput, "node " + n.name + ": more than 32 GPUs");
    }
    placement::Node g = n;
    g.cpu_milli = g.cpu_free = 0;
    g.memory_mib = g.memory_free = 0;
    s.cluster.nodes.push_back(std::move(g));
  }
  if (s.cluster.nodes.empty()) return Status(ErrorCode::kInvalidInput, "no GPU nodes");
  const std::vector<uint32_t> rank =
      placement::ArtifactNodeRanks(s.cluster.nodes.size(), options.seed);
  const int width = std::max<int>(4, static_cast<int>(std::to_string(rank.size() - 1).size()));
  for (size_t i = 0; i < s.cluster.nodes.size(); ++i) {
    std::string prefix = std::to_string(rank[i]);
    prefix.insert(0, static_cast<size_t>(width) - prefix.size(), '0');
    std::string name = s.cluster.nodes[i].name;
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    s.cluster.nodes[i].name = prefix + "-" + name;
  }
  std::vector<placement::Pod> projected;
  projected.reserve(trace.size());
  for (const placement::Pod& p : trace) projected.push_back(GpuOnly(p));
  s.typical = placement::ArtifactTypicalPods(projected);
  const std::vector<placement::Pod> arrivals = placement::ArtifactArrivals(
      projected, s.cluster.GpuCapacityMilli(), options.load, options.seed);
  for (const placement::Pod& p : arrivals) {
    if (p.num_gpu != 1) continue;
    if (options.max_pods > 0 && s.arrivals.size() >= options.max_pods) break;
    placement::Pod a = p;
    a.name = "p-" + std::to_string(s.arrivals.size());
    s.arrivals.push_back(std::move(a));
  }
  for (const placement::Node& n : s.cluster.nodes) s.objects.push_back(NodeObject(s.cluster, n));
  return s;
}

Result<EquivalenceReport> RunEquivalence(const EquivalenceSetup& setup,
                                         const EquivalenceOptions& options,
                                         const LiveExtender& live) {
  const std::unique_ptr<placement::ArtifactPolicy> policy =
      placement::MakeArtifactPolicy(options.policy, setup.typical);
  if (!policy) return Status(ErrorCode::kUsage, "unknown policy \"" + options.policy + "\"");
  if (policy->DrawsNode()) {
    return Status(ErrorCode::kUsage,
                  "random draws its nodes: its placements cannot be compared one by one");
  }
  EquivalenceReport r;
  r.pods = static_cast<int64_t>(setup.arrivals.size());

  // The replay.
  using SteadyClock = std::chrono::steady_clock;
  auto t0 = SteadyClock::now();
  std::vector<std::optional<placement::Decision>> decisions;
  placement::ArtifactReplay(setup.cluster, setup.arrivals, *policy, setup.typical, {},
                            options.seed, &decisions);
  r.replay_seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  for (const auto& d : decisions) {
    Placed p;
    if (d) {
      p.node = setup.cluster.nodes[d->node].name;
      for (int i = 0; i < placement::kMaxGpusPerNode; ++i) {
        if (d->choice.gpus >> i & 1U) {
          p.gpu = i;
          break;
        }
      }
    }
    r.replay.push_back(std::move(p));
  }

  // The live path, as kube-scheduler drives it.
  t0 = SteadyClock::now();
  std::vector<std::string> all;
  for (const placement::Node& n : setup.cluster.nodes) all.push_back(n.name);
  for (const placement::Pod& pod : setup.arrivals) {
    Placed placed;
    std::vector<std::string> candidates;  // node affinity: the pod's GPU models
    for (size_t i = 0; i < all.size(); ++i) {
      const int model = setup.cluster.nodes[i].model;
      if (!pod.model_constrained || (pod.model_mask >> model & 1U)) candidates.push_back(all[i]);
    }
    const json pod_json = EquivalencePod(pod);
    live.create_pod(pod_json);
    std::vector<std::string> passed;
    if (!candidates.empty()) {
      auto [status, body] = live.call(
          "filter", json{{"Pod", pod_json}, {"Nodes", nullptr}, {"NodeNames", candidates}}.dump());
      const json answer = json::parse(body, nullptr, false);
      if (status != 200 || !answer.is_object() || !answer["NodeNames"].is_array()) {
        return Status(ErrorCode::kInternal,
                      pod.name + ": filter answered " + std::to_string(status) + ": " + body);
      }
      passed = answer["NodeNames"].get<std::vector<std::string>>();
    }
    if (!passed.empty()) {
      auto [status, body] = live.call(
          "prioritize", json{{"Pod", pod_json}, {"Nodes", nullptr}, {"NodeNames", passed}}.dump());
      const json answer = json::parse(body, nullptr, false);
      if (status != 200 || !answer.is_array() || answer.size() != passed.size()) {
        return Status(ErrorCode::kInternal,
                      pod.name + ": prioritize answered " + std::to_string(status) + ": " + body);
      }
      // selectHost: the highest score; among equal ones, the smallest name.
      std::string best;
      int64_t best_score = -1;
      for (const json& h : answer) {
        const std::string host = h.value("Host", "");
        const int64_t score = h.value("Score", int64_t{0});
        if (score > best_score || (score == best_score && host < best)) {
          best = host;
          best_score = score;
        }
      }
      auto [bstatus, bbody] = live.call("bind", json{{"PodName", pod.name},
                                                     {"PodNamespace", "replay"},
                                                     {"PodUID", "uid-" + pod.name},
                                                     {"Node", best}}
                                                    .dump());
      const json bound = json::parse(bbody, nullptr, false);
      if (bstatus != 200 || !bound.is_object() || bound.value("Error", "x") != "") {
        return Status(ErrorCode::kInternal,
                      pod.name + ": bind to " + best + " answered " + std::to_string(bstatus) +
                          ": " + bbody);
      }
      placed.node = best;
      if (auto held = live.reserved("uid-" + pod.name, best); held && held->size() == 1) {
        for (size_t i = 0; i < static_cast<size_t>(placement::kMaxGpusPerNode); ++i) {
          if ((*held)[0].gpu == GpuUuid(best, i)) placed.gpu = static_cast<int>(i);
        }
      }
    }
    r.live.push_back(std::move(placed));
  }
  r.live_seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();

  for (size_t i = 0; i < r.live.size(); ++i) {
    if (r.live[i] == r.replay[i]) {
      ++r.identical;
    } else if (r.differences.size() < 10) {
      r.differences.push_back(setup.arrivals[i].name + ": live " + Describe(r.live[i]) +
                              ", replay " + Describe(r.replay[i]));
    }
    if (r.live[i].node.empty()) {
      ++r.failed;
    } else {
      ++r.placed;
    }
  }
  return r;
}

json EquivalenceExport(const EquivalenceSetup& setup, const EquivalenceReport& report) {
  json nodes = json::array();
  int64_t capacity = 0;
  for (const placement::Node& n : setup.cluster.nodes) {
    nodes.push_back({{"name", n.name},
                     {"model", setup.cluster.models[static_cast<size_t>(n.model)]},
                     {"gpus", n.GpuCount()}});
    capacity += static_cast<int64_t>(n.GpuCount()) * kUnitsPerGpu;
  }
  json arrivals = json::array();
  int64_t placed = 0, placed_units = 0;
  for (size_t i = 0; i < setup.arrivals.size(); ++i) {
    const placement::Pod& p = setup.arrivals[i];
    json models = json::array();
    for (size_t m = 0; p.model_constrained && m < setup.cluster.models.size(); ++m) {
      if (p.model_mask >> m & 1U) models.push_back(setup.cluster.models[m]);
    }
    const Placed replay = i < report.replay.size() ? report.replay[i] : Placed{};
    if (!replay.node.empty()) {
      ++placed;
      placed_units += p.gpu_milli;
    }
    arrivals.push_back({{"name", p.name},
                        {"units", p.gpu_milli},
                        {"models", models},
                        {"replay", {{"node", replay.node}, {"gpu", replay.gpu}}}});
  }
  return {{"resource", kEquivalenceResource},
          {"unitsPerGpu", kUnitsPerGpu},
          {"nodes", nodes},
          {"objects", setup.objects},
          {"arrivals", arrivals},
          {"replay",
           {{"placed", placed},
            {"failed", static_cast<int64_t>(setup.arrivals.size()) - placed},
            {"placedUnits", placed_units},
            {"capacityUnits", capacity}}}};
}

Result<EquivalenceReport> RunEquivalenceInProcess(const EquivalenceSetup& setup,
                                                  const EquivalenceOptions& options,
                                                  const std::string& live_policy) {
  auto scorer = PlacementScorer::Make(live_policy.empty() ? options.policy : live_policy,
                                      setup.typical, setup.cluster.models);
  if (!scorer.ok()) return scorer.status();
  FakeClock clock;
  ViewOptions vo;
  vo.stale_after = std::chrono::hours(24);
  vo.placement = *scorer;
  ClusterView view(clock, vo);
  for (const json& o : setup.objects) view.UpsertObject(o);
  std::map<std::string, json> store;  // namespace/name → pod
  Extender ext(
      view,
      [&](const std::string& ns, const std::string& name, const std::string&,
          const std::string& node) {
        store[ns + "/" + name]["spec"]["nodeName"] = node;
        return Status::Ok();
      },
      [&](const std::string& ns, const std::string& name) -> Result<json> {
        auto it = store.find(ns + "/" + name);
        if (it == store.end()) return Status(ErrorCode::kNotFound, "pod " + ns + "/" + name);
        return it->second;
      });
  LiveExtender live;
  live.call = [&](const std::string& verb, const std::string& body) {
    const Answer a = verb == "filter"       ? ext.Filter(body)
                     : verb == "prioritize" ? ext.Prioritize(body)
                                            : ext.Bind(body);
    return std::pair{a.status, a.body};
  };
  live.create_pod = [&](const json& pod) {
    store[pod["metadata"]["namespace"].get<std::string>() + "/" +
          pod["metadata"]["name"].get<std::string>()] = pod;
  };
  live.reserved = [&](const std::string& uid, const std::string& node) {
    return view.ReservationOf(uid, node);
  };
  return RunEquivalence(setup, options, live);
}

}  // namespace gpulet::extender
