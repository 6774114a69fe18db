#include "extender/scoring.h"

#include <algorithm>
#include <sstream>

#include <spdlog/spdlog.h>

#include "extender/view.h"
#include "placement/policy.h"
#include "placement/trace.h"

namespace gpulet::extender {

Result<std::shared_ptr<const PlacementScorer>> PlacementScorer::Make(
    std::string_view policy, placement::TypicalPods typical, std::vector<std::string> models) {
  const std::vector<std::string>& names = placement::PolicyNames();
  if (std::find(names.begin(), names.end(), policy) == names.end()) {
    std::string choices;
    for (const std::string& n : names) choices += (choices.empty() ? "" : ", ") + n;
    return Status(ErrorCode::kUsage, "--policy: must be one of " + choices + " (as `gpulet " +
                                         "replay --policy` takes them) or spread, got \"" +
                                         std::string(policy) + "\"");
  }
  if (models.size() > 64) {
    return Status(ErrorCode::kInvalidInput, "placement: more than 64 GPU models");
  }
  auto s = std::shared_ptr<PlacementScorer>(new PlacementScorer());
  s->policy_ = placement::MakeArtifactPolicy(policy, typical);
  s->models_ = std::move(models);
  return std::shared_ptr<const PlacementScorer>(std::move(s));
}

int32_t ShareOf(int64_t units, int64_t total) {
  if (total <= 0) return placement::kMilliPerGpu;
  const int64_t milli = units >= total ? placement::kMilliPerGpu
                                       : units * placement::kMilliPerGpu / total;
  return static_cast<int32_t>(std::clamp<int64_t>(milli, 1, placement::kMilliPerGpu));
}

std::vector<int> PickScores(const placement::ArtifactPolicy& policy,
                            std::span<const std::optional<double>> scores,
                            std::span<const std::string_view> names) {
  std::vector<int> out(scores.size(), 0);
  std::vector<std::pair<size_t, double>> scored;
  scored.reserve(scores.size());
  for (size_t i = 0; i < scores.size(); ++i) {
    if (scores[i]) scored.emplace_back(i, *scores[i]);
  }
  if (scored.empty()) return out;
  if (policy.DrawsNode()) {  // random: every node alike, the scheduler draws
    for (const auto& [i, s] : scored) out[i] = kMaxExtenderPriority;
    return out;
  }
  const size_t best = placement::ArtifactPick(std::span(scored), policy, [&](size_t a, size_t b) {
    return names[a] < names[b];
  });
  double lowest = scored[0].second, highest = scored[0].second;
  for (const auto& [i, s] : scored) {
    lowest = std::min(lowest, s);
    highest = std::max(highest, s);
  }
  for (size_t k = 0; k < scored.size(); ++k) {
    const auto& [i, s] = scored[k];
    if (k == best) {
      out[i] = kMaxExtenderPriority;
    } else if (highest > lowest) {
      out[i] = static_cast<int>((s - lowest) * (kMaxExtenderPriority - 1) / (highest - lowest));
    } else {
      out[i] = kMaxExtenderPriority - 1;
    }
  }
  return out;
}

placement::Pod GpuOnly(placement::Pod pod) {
  pod.cpu_milli = 0;
  pod.memory_mib = 0;
  return pod;
}

Result<placement::TypicalPods> LoadWorkload(const std::string& path,
                                            std::vector<std::string>& models) {
  // First pass: the models the gpu_spec column names; second: the pods with their masks.
  placement::Cluster cluster;
  for (const std::string& m : models) cluster.InternModel(m);
  auto first = placement::LoadPods(path, cluster);
  if (!first.ok()) return first.status();
  for (const placement::Pod& p : *first) {
    std::istringstream in(p.gpu_spec);
    std::string model;
    while (std::getline(in, model, '|')) {
      if (model.empty() || cluster.FindModel(model) >= 0) continue;
      if (cluster.models.size() >= 64) {
        return Status(ErrorCode::kInvalidInput, path + ": more than 64 GPU models in gpu_spec");
      }
      cluster.InternModel(model);
    }
  }
  auto pods = placement::LoadPods(path, cluster);
  if (!pods.ok()) return pods.status();
  for (placement::Pod& p : *pods) p = GpuOnly(std::move(p));
  models = cluster.models;
  return placement::ArtifactTypicalPods(*pods);
}

Result<std::shared_ptr<const PlacementScorer>> PolicyFromFlags(const std::string& policy,
                                                               const std::string& workload) {
  if (policy == "spread") {
    if (!workload.empty()) {
      spdlog::warn(
          "event=extender_option_ignored option=--workload reason=\"--policy spread does not "
          "use it\"");
    }
    return std::shared_ptr<const PlacementScorer>();
  }
  const std::vector<std::string>& names = placement::PolicyNames();
  if (std::find(names.begin(), names.end(), policy) == names.end()) {
    return PlacementScorer::Make(policy, {}, {});  // the error naming the choices
  }
  placement::TypicalPods typical;
  std::vector<std::string> models;
  if (!workload.empty()) {
    auto t = LoadWorkload(workload, models);
    if (!t.ok()) return Status(t.status().code(), "--workload: " + t.status().message());
    typical = std::move(t).value();
  } else if (policy == "fgd" || policy == "fgd-bestfit") {
    return Status(ErrorCode::kUsage,
                  "--policy " + policy +
                      " needs --workload: a pod list (openb CSV columns, as `gpulet replay "
                      "--trace` reads them) whose typical pods FGD measures fragmentation "
                      "against; or choose another policy, e.g. bestfit (docs/placement.md, "
                      "\"Live path = replay\")");
  }
  return PlacementScorer::Make(policy, std::move(typical), std::move(models));
}

}  // namespace gpulet::extender
