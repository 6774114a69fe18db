// gpulet replay: replays a GPU trace in the Alibaba openb format through placement policies and
// reports the GPU allocation ratio against the arrived load (the FGD paper's experiment).
#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "cli/commands.h"
#include "common/files.h"
#include "placement/artifact.h"
#include "placement/fragmentation.h"
#include "placement/policy.h"
#include "placement/replay.h"
#include "placement/report.h"
#include "placement/trace.h"

namespace gpulet::cli {
namespace {

namespace pl = placement;

struct ReplayFlags {
  std::string policy = "all";
  uint64_t seed = 42;
  std::string seeds;
  std::string trace = "default";
  std::string trace_dir = "../shared/traces/alibaba-openb";
  std::string nodes;
  std::string load = "130%";
  std::string output_dir = "replay-out";
  double coverage = 0.95;
  int jobs = 1;
  std::string protocol = "artifact";
};

Result<uint64_t> ParseSeed(const std::string& text) {
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    return Status(ErrorCode::kUsage, "--seeds: not a seed: '" + text + "'");
  return v;
}

// "42..51", "1,5,9" or "7".
Result<std::vector<uint64_t>> ParseSeeds(const std::string& text) {
  std::vector<uint64_t> out;
  if (size_t dots = text.find(".."); dots != std::string::npos) {
    Result<uint64_t> from = ParseSeed(text.substr(0, dots));
    if (!from.ok()) return from.status();
    Result<uint64_t> to = ParseSeed(text.substr(dots + 2));
    if (!to.ok()) return to.status();
    if (*to < *from || *to - *from >= 10000)
      return Status(ErrorCode::kUsage, "--seeds: bad range '" + text + "'");
    for (uint64_t s = *from; s <= *to; ++s) out.push_back(s);
    return out;
  }
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    Result<uint64_t> s = ParseSeed(text.substr(start, comma - start));
    if (!s.ok()) return s.status();
    out.push_back(*s);
    start = comma + 1;
  }
  return out;
}

// "130%" or "1.3".
Result<double> ParseLoad(const std::string& text) {
  std::string t = text;
  double scale = 1;
  if (!t.empty() && t.back() == '%') {
    t.pop_back();
    scale = 0.01;
  }
  double v = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || ec != std::errc() || end != t.data() + t.size())
    return Status(ErrorCode::kUsage, "--load: not a number: '" + text + "'");
  v *= scale;
  if (v <= 0 || v > 10)
    return Status(ErrorCode::kUsage, "--load: must be in (0, 1000%], got '" + text + "'");
  return v;
}

Result<std::vector<std::string>> ParsePolicies(const std::string& text) {
  if (text == "all") return pl::PolicyNames();
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string name = text.substr(start, comma - start);
    const auto& known = pl::PolicyNames();
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      return Status(ErrorCode::kUsage,
                    "--policy: unknown policy '" + name + "' (known: " + list + ", all)");
    }
    out.push_back(name);
    start = comma + 1;
  }
  return out;
}

bool IsPath(const std::string& trace) {
  return trace.find('/') != std::string::npos || trace.ends_with(".csv");
}

std::string Percent(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", v * 100);
  return buf;
}

int RunReplay(const ReplayFlags& f) {
  Result<std::vector<std::string>> policies = ParsePolicies(f.policy);
  if (!policies.ok()) return ReportError(policies.status());
  std::vector<uint64_t> seeds = {f.seed};
  if (!f.seeds.empty()) {
    Result<std::vector<uint64_t>> s = ParseSeeds(f.seeds);
    if (!s.ok()) return ReportError(s.status());
    seeds = *s;
  }
  Result<double> load = ParseLoad(f.load);
  if (!load.ok()) return ReportError(load.status());
  if (f.protocol != "artifact" && f.protocol != "literal")
    return ReportError(Status(ErrorCode::kUsage,
                              "--protocol: must be artifact or literal, got '" + f.protocol + "'"));
  const bool artifact = f.protocol == "artifact";

  const std::string trace_path =
      IsPath(f.trace) ? f.trace : pl::TraceVariantPath(f.trace_dir, f.trace);
  if (!std::filesystem::exists(trace_path))
    return ReportError(
        Status(ErrorCode::kNotFound,
               "--trace: " + trace_path +
                   " not found (a variant name such as default, cpu050, "
                   "gpushare40, gpuspec10, multigpu20 is looked up in --trace-dir)"));
  std::string nodes_path = f.nodes;
  if (nodes_path.empty()) {
    const std::string beside =
        pl::GpuNodeListPath(std::filesystem::path(trace_path).parent_path().string());
    nodes_path = std::filesystem::exists(beside) ? beside : pl::GpuNodeListPath(f.trace_dir);
  }
  Result<pl::Cluster> cluster = pl::LoadNodes(nodes_path);
  if (!cluster.ok()) return ReportError(cluster.status());
  if (cluster->nodes.empty())
    return ReportError(Status(ErrorCode::kInvalidInput, nodes_path + ": no GPU nodes"));
  Result<std::vector<pl::Pod>> trace = pl::LoadPods(trace_path, *cluster);
  if (!trace.ok()) return ReportError(trace.status());
  if (trace->empty())
    return ReportError(Status(ErrorCode::kInvalidInput, trace_path + ": no pods"));

  // Both protocols are described in docs/placement.md; artifact.h and replay.h say what differs.
  const pl::TypicalPods typical = artifact ? pl::ArtifactTypicalPods(*trace, f.coverage)
                                           : pl::TypicalPods::FromWorkload(*trace, f.coverage);
  std::vector<std::unique_ptr<pl::Policy>> made;
  std::vector<std::unique_ptr<pl::ArtifactPolicy>> made_artifact;
  for (const std::string& name : *policies) {
    if (artifact)
      made_artifact.push_back(pl::MakeArtifactPolicy(name, typical));
    else
      made.push_back(pl::MakePolicy(name, typical));
  }
  const std::vector<double> points = pl::DefaultReportPoints(*load);
  std::vector<std::vector<pl::Pod>> arrivals;
  for (uint64_t seed : seeds)
    arrivals.push_back(artifact
                           ? pl::ArtifactArrivals(*trace, cluster->GpuCapacityMilli(), *load, seed)
                           : pl::ArrivalSequence(*trace, cluster->GpuCapacityMilli(), *load, seed));

  // Every (policy, seed) run is independent: --jobs threads take them in turn.
  const size_t total = policies->size() * seeds.size();
  std::vector<pl::ReplayResult> runs(total);
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < total; i = next++) {
      const size_t p = i / seeds.size(), s = i % seeds.size();
      runs[i] = artifact ? pl::ArtifactReplay(*cluster, arrivals[s], *made_artifact[p], typical,
                                              points, seeds[s])
                         : pl::Replay(*cluster, arrivals[s], *made[p], typical, points, seeds[s]);
    }
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < std::min<int>(f.jobs, static_cast<int>(total)); ++t)
    threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();

  const std::vector<pl::PolicySummary> summaries = pl::Summarize(runs);
  pl::ReportInfo info{IsPath(f.trace) ? trace_path : f.trace, nodes_path, *load};
  std::error_code ec;
  std::filesystem::create_directories(f.output_dir, ec);
  if (ec)
    return ReportError(
        Status(ErrorCode::kNotFound, "--output-dir: " + f.output_dir + ": " + ec.message()));
  for (const auto& [name, content] :
       {std::pair<std::string, std::string>{"replay.csv", pl::RenderCsv(summaries)},
        {"replay.json", pl::RenderJson(info, summaries, runs)},
        {"replay.svg", pl::RenderSvg(info, summaries)}}) {
    Status s = WriteFileAtomic(f.output_dir + "/" + name, content);
    if (!s.ok()) return ReportError(s);
  }

  std::printf(
      "trace %s: %zu GPU nodes, %.0f GPUs, %zu pods, %zu typical pod shapes; load %s, "
      "%zu seed(s); protocol %s\n",
      info.trace.c_str(), cluster->nodes.size(),
      static_cast<double>(cluster->GpuCapacityMilli()) / pl::kMilliPerGpu, trace->size(),
      typical.pods().size(), Percent(*load).c_str(), seeds.size(), f.protocol.c_str());
  std::printf("%-14s %-22s %-22s %s\n", "policy", "allocation at 100%",
              ("allocation at " + Percent(*load)).c_str(), "failed pods (mean)");
  for (const pl::PolicySummary& s : summaries) {
    auto at = [&](double x) -> std::string {
      for (const pl::PointSummary& p : s.points)
        if (std::abs(p.arrived - x) < 1e-9)
          return Percent(p.mean) + (s.seeds.size() > 1 ? " ±" + Percent(p.stddev) : "");
      return "-";
    };
    std::printf("%-14s %-22s %-22s %.1f\n", s.policy.c_str(), at(1.0).c_str(),
                at(points.empty() ? *load : points.back()).c_str(), s.failed_pods_total_mean);
  }
  std::printf("wrote %s/replay.csv, replay.json, replay.svg\n", f.output_dir.c_str());
  return 0;
}

}  // namespace

void RegisterReplay(CLI::App& app, GlobalOptions& /*global*/, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "replay",
      "Replay a GPU trace (Alibaba openb format) through placement policies: GPU allocation "
      "ratio against arrived load, failed pods, fragmentation (CSV, JSON, SVG plot)");
  auto f = std::make_shared<ReplayFlags>();
  cmd->add_option("--policy", f->policy,
                  "A policy, a comma-separated list, or all: random, dotprod, gpuclustering, "
                  "gpupacking, bestfit, fgd, fgd-bestfit")
      ->capture_default_str();
  cmd->add_option("--seed", f->seed, "Seed of the arrival order and tie-breaking")
      ->capture_default_str();
  cmd->add_option("--seeds", f->seeds,
                  "Several seeds (42..51 or 1,2,3): mean and spread over them; overrides --seed");
  cmd->add_option("--trace", f->trace,
                  "Pod list: a variant name (default, cpu050, gpushare40, gpuspec10, multigpu20, "
                  "...) looked up in --trace-dir, or a CSV path")
      ->capture_default_str();
  cmd->add_option("--trace-dir", f->trace_dir, "Directory of the openb trace files")
      ->envname("GPULET_TRACE_DIR")
      ->capture_default_str();
  cmd->add_option("--nodes", f->nodes,
                  "Node list CSV (default: openb_node_list_gpu_node.csv beside the trace, else in "
                  "--trace-dir); CPU-only nodes are left out");
  cmd->add_option("--load", f->load,
                  "Stop when the arrived GPU request reaches this share of the GPU capacity "
                  "(130% or 1.3)")
      ->capture_default_str();
  cmd->add_option("--output-dir", f->output_dir, "Where replay.csv, replay.json, replay.svg go")
      ->capture_default_str();
  cmd->add_option("--typical-coverage", f->coverage,
                  "FGD's typical pods: the most frequent shapes covering this share of the pods")
      ->check(CLI::Range(0.01, 1.0))
      ->capture_default_str();
  cmd->add_option("--protocol", f->protocol,
                  "artifact: the FGD artifact's simulator (arrivals, integer scores, tie-breaking, "
                  "measurement); literal: the paper's section 6.1 as written (docs/placement.md)")
      ->envname("GPULET_REPLAY_PROTOCOL")
      ->capture_default_str();
  cmd->add_option("--jobs", f->jobs, "Runs (policy x seed) in parallel; each run is one thread")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->callback([f, &exit_code] { exit_code = RunReplay(*f); });
}

}  // namespace gpulet::cli
