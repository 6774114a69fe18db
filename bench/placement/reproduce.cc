// The FGD artifact's experiment under its own protocol (placement/artifact.h): every policy x seed
// on one pod list, in parallel threads, and the seed mean of the allocation at every 5 % of
// arrived load from 50 % to 130 % (what the artifact's analysis reports).
// usage: bench_placement_reproduce TRACE_DIR VARIANT POLICIES FIRST_SEED SEEDS JOBS
//   POLICIES: comma-separated (random,dotprod,gpuclustering,gpupacking,bestfit,fgd,fgd-bestfit)
// Prints CSV on stdout: policy,arrived_pct,mean,sd,n (sd over the seeds, population, as the
// artifact's summary); the wall time of all runs on stderr as "wall_s=...".
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "placement/artifact.h"
#include "placement/trace.h"

using namespace gpulet::placement;

int main(int argc, char** argv) {
  if (argc < 7) {
    std::fprintf(stderr, "usage: %s TRACE_DIR VARIANT POLICIES FIRST_SEED SEEDS JOBS\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const std::string variant = argv[2];
  std::vector<std::string> names;
  for (std::string rest = argv[3]; !rest.empty();) {
    const size_t comma = rest.find(',');
    names.push_back(rest.substr(0, comma));
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
  }
  const uint64_t first_seed = std::strtoull(argv[4], nullptr, 10);
  const int seeds = std::max(1, std::atoi(argv[5]));
  const int jobs = std::max(1, std::atoi(argv[6]));

  const auto start = std::chrono::steady_clock::now();
  gpulet::Result<Cluster> cluster = LoadNodes(GpuNodeListPath(dir));
  if (!cluster.ok()) {
    std::fprintf(stderr, "%s\n", cluster.status().message().c_str());
    return 1;
  }
  gpulet::Result<std::vector<Pod>> trace = LoadPods(TraceVariantPath(dir, variant), *cluster);
  if (!trace.ok()) {
    std::fprintf(stderr, "%s\n", trace.status().message().c_str());
    return 1;
  }
  const TypicalPods typical = ArtifactTypicalPods(*trace);
  std::vector<std::unique_ptr<ArtifactPolicy>> policies;
  for (const std::string& n : names) {
    policies.push_back(MakeArtifactPolicy(n, typical));
    if (!policies.back()) {
      std::fprintf(stderr, "unknown policy %s\n", n.c_str());
      return 2;
    }
  }
  const std::vector<double> points = DefaultReportPoints(1.3);
  std::vector<std::vector<Pod>> arrivals;
  for (int s = 0; s < seeds; ++s)
    arrivals.push_back(ArtifactArrivals(*trace, cluster->GpuCapacityMilli(), 1.3,
                                        first_seed + static_cast<uint64_t>(s)));
  const size_t total = policies.size() * static_cast<size_t>(seeds);
  std::vector<ReplayResult> runs(total);
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < total; i = next++) {
      const size_t p = i / static_cast<size_t>(seeds), s = i % static_cast<size_t>(seeds);
      runs[i] =
          ArtifactReplay(*cluster, arrivals[s], *policies[p], typical, points, first_seed + s);
    }
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < jobs; ++t) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::printf("policy,arrived_pct,mean,sd,n\n");
  for (size_t p = 0; p < policies.size(); ++p) {
    for (const double point : points) {
      std::vector<double> v;
      for (int s = 0; s < seeds; ++s)
        for (const LoadPoint& lp : runs[p * static_cast<size_t>(seeds) + s].points)
          if (std::abs(lp.arrived - point) < 1e-9) v.push_back(lp.allocated * 100);
      if (v.empty()) continue;
      double mean = 0, var = 0;
      for (double x : v) mean += x / static_cast<double>(v.size());
      for (double x : v) var += (x - mean) * (x - mean) / static_cast<double>(v.size());
      std::printf("%s,%ld,%.3f,%.3f,%zu\n", names[p].c_str(), std::lround(point * 100), mean,
                  std::sqrt(var), v.size());
    }
  }
  std::fprintf(stderr, "wall_s=%.2f runs=%zu jobs=%d\n", wall, total, jobs);
  return 0;
}
