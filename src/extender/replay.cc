#include "extender/replay.h"

#include <algorithm>

#include "extender/view.h"

namespace gpulet::extender {
namespace {

using nlohmann::json;
constexpr const char* kResource = "gpulet.io/gpu-memory-1gi";

// A node as the kubelet and device plugin see it: free units per GPU, and the pods placed.
struct KubeletNode {
  std::string name;
  std::vector<int64_t> total, free;
  json placed = json::array();
  // Best fit on one GPU; false when no GPU has the units (the plugin refuses the allocation).
  bool Admit(const std::string& pod, int64_t units) {
    int best = -1;
    for (size_t g = 0; g < free.size(); ++g) {
      if (free[g] >= units && (best < 0 || free[g] < free[static_cast<size_t>(best)])) {
        best = static_cast<int>(g);
      }
    }
    if (best < 0) return false;
    free[static_cast<size_t>(best)] -= units;
    placed.push_back({{"namespace", "replay"},
                      {"name", pod},
                      {"container", "main"},
                      {"gpu", name + "-gpu" + std::to_string(best)},
                      {"units", units}});
    return true;
  }
  json Object(int64_t generation, int64_t rv) const {
    json gpus = json::array();
    for (size_t g = 0; g < free.size(); ++g) {
      gpus.push_back({{"uuid", name + "-gpu" + std::to_string(g)},
                      {"index", g},
                      {"healthy", true},
                      {"totalUnits", total[g]},
                      {"freeUnits", free[g]}});
    }
    const json memory = {
        {"version", 1},          {"node", name},         {"generation", generation},
        {"resource", kResource}, {"unitBytes", 1 << 30}, {"heartbeatSeconds", 30},
        {"gpus", gpus},          {"pods", placed}};
    return {{"metadata",
             {{"name", std::string(kObjectPrefix) + name},
              {"namespace", "gpulet-system"},
              {"resourceVersion", std::to_string(rv)},
              {"labels", {{kNodeLabel, name}}}}},
            {"data", {{"memory.json", memory.dump()}}}};
  }
};

std::vector<KubeletNode> Nodes(const placement::Cluster& cluster,
                               const std::map<std::string, int64_t>& gib) {
  std::vector<KubeletNode> out;
  for (const placement::Node& n : cluster.nodes) {
    if (n.GpuCount() == 0 || n.model < 0) continue;
    KubeletNode k;
    k.name = n.name;
    auto it = gib.find(cluster.models[static_cast<size_t>(n.model)]);
    const int64_t units = it == gib.end() ? 16 : it->second;
    k.total.assign(static_cast<size_t>(n.GpuCount()), units);
    k.free = k.total;
    out.push_back(std::move(k));
  }
  return out;
}

}  // namespace

int64_t MemoryRequestUnits(const placement::Pod& pod, const placement::Cluster& cluster,
                           const std::map<std::string, int64_t>& gib) {
  int64_t smallest = 0;
  for (size_t m = 0; m < cluster.models.size(); ++m) {
    if (pod.model_constrained && !(pod.model_mask & (uint64_t{1} << m))) continue;
    auto it = gib.find(cluster.models[m]);
    const int64_t g = it == gib.end() ? 16 : it->second;
    if (smallest == 0 || g < smallest) smallest = g;
  }
  if (smallest == 0) return 0;  // no model it may use
  return std::max<int64_t>(1, (int64_t{pod.gpu_milli} * smallest + 999) / 1000);
}

Result<ReplayReport> ReplayMemoryRequests(const placement::Cluster& cluster,
                                          const std::vector<placement::Pod>& pods,
                                          const ReplayOptions& options) {
  ReplayReport report;
  std::vector<std::pair<std::string, int64_t>> stream;  // (name, units) of the sharing pods
  for (const placement::Pod& p : pods) {
    if (!p.IsSharing()) continue;
    const int64_t u = MemoryRequestUnits(p, cluster, options.gpu_memory_gib);
    if (u > 0) stream.emplace_back(p.name, u);
  }
  report.sharing_pods = static_cast<int64_t>(stream.size());
  const std::vector<KubeletNode> initial = Nodes(cluster, options.gpu_memory_gib);
  report.nodes = static_cast<int64_t>(initial.size());
  for (const KubeletNode& k : initial) {
    report.gpus += static_cast<int64_t>(k.total.size());
    for (int64_t t : k.total) report.fleet_units += t;
  }
  if (stream.empty() || initial.empty()) {
    return Status(ErrorCode::kInvalidInput, "the trace has no GPU-sharing pods or no GPU nodes");
  }
  const int64_t budget =
      static_cast<int64_t>(options.offered_load * static_cast<double>(report.fleet_units));
  std::vector<std::string> names;
  for (const KubeletNode& k : initial) names.push_back(k.name);

  // With the extender: the real view, objects republished every publish_every binds.
  {
    FakeClock clock;
    ClusterView view(clock,
                     {.stale_after = std::chrono::hours(24), .placement = options.placement});
    std::vector<KubeletNode> nodes = initial;
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < nodes.size(); ++i) index[nodes[i].name] = i;
    int64_t rv = 1, generation = 1;
    for (const KubeletNode& k : nodes) view.UpsertObject(k.Object(generation, rv));
    std::vector<size_t> dirty;
    int64_t asked = 0;
    ReplayCounts& c = report.with_extender;
    for (size_t i = 0; asked < budget; ++i) {
      const auto& [base, units] = stream[i % stream.size()];
      const std::string name = base + "-" + std::to_string(i / stream.size());
      asked += units;
      ++c.offered;
      PodRequest pod;
      pod.ns = "replay";
      pod.name = name;
      pod.uid = "replay-" + name;
      pod.resource = kResource;
      pod.steps = {{{"main", units}, PodRequest::Step::kApp}};
      // The scheduler's cycle: filter, then prioritize the nodes that passed.
      const FilterOutcome passed = view.Filter(pod, names);
      if (passed.passed.empty()) {
        ++c.unschedulable;
        continue;
      }
      const auto scores = view.Prioritize(pod, passed.passed);
      size_t best = 0;
      for (size_t n = 1; n < scores.size(); ++n) {
        if (scores[n].second > scores[best].second) best = n;
      }
      const std::string& node = scores[best].first;
      if (!view.Reserve(pod, node).ok()) {  // bind refused: the scheduler retries later
        ++c.unschedulable;
        continue;
      }
      ++c.admitted;
      KubeletNode& k = nodes[index[node]];
      if (k.Admit(name, units)) {
        c.placed_units += units;
      } else {
        ++c.refused_by_kubelet;
      }
      dirty.push_back(index[node]);
      if (static_cast<int>(dirty.size()) >= options.publish_every) {
        ++generation;
        for (size_t d : dirty) view.UpsertObject(nodes[d].Object(generation, ++rv));
        dirty.clear();
      }
    }
  }

  // Node totals only: allocatable minus requests, least allocated node first.
  {
    std::vector<KubeletNode> nodes = initial;
    std::vector<int64_t> requested(nodes.size(), 0), allocatable(nodes.size(), 0);
    for (size_t n = 0; n < nodes.size(); ++n) {
      for (int64_t t : nodes[n].total) allocatable[n] += t;
    }
    int64_t asked = 0;
    ReplayCounts& c = report.node_totals_only;
    for (size_t i = 0; asked < budget; ++i) {
      const auto& [base, units] = stream[i % stream.size()];
      asked += units;
      ++c.offered;
      int best = -1;
      double best_used = 2;
      for (size_t n = 0; n < nodes.size(); ++n) {
        if (allocatable[n] - requested[n] < units) continue;
        const double used =
            static_cast<double>(requested[n] + units) / static_cast<double>(allocatable[n]);
        if (used < best_used) {
          best_used = used;
          best = static_cast<int>(n);
        }
      }
      if (best < 0) {
        ++c.unschedulable;
        continue;
      }
      ++c.admitted;
      const size_t b = static_cast<size_t>(best);
      if (nodes[b].Admit(base + "-" + std::to_string(i / stream.size()), units)) {
        requested[b] += units;
        c.placed_units += units;
      } else {
        ++c.refused_by_kubelet;  // UnexpectedAdmissionError: the pod fails, its request is freed
      }
    }
  }
  return report;
}

}  // namespace gpulet::extender
