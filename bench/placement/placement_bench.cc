// One `gpulet replay` run of the openb default trace at 130 % arrived load, per policy, single
// thread: wall time over repeated runs (median and worst), the median CPU time of the thread (what
// a shared machine does not inflate), and the process's peak RSS.
// usage: bench_placement TRACE_DIR POLICY [RUNS]
// Prints one Markdown table row; bench/placement/run.sh runs one process per policy so that each
// peak RSS is that policy's own.
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "placement/fragmentation.h"
#include "placement/policy.h"
#include "placement/replay.h"
#include "placement/trace.h"

using namespace gpulet::placement;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TRACE_DIR POLICY [RUNS]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const std::string policy_name = argv[2];
  const int runs = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;
  gpulet::Result<Cluster> cluster = LoadNodes(GpuNodeListPath(dir));
  if (!cluster.ok()) {
    std::fprintf(stderr, "%s\n", cluster.status().message().c_str());
    return 1;
  }
  gpulet::Result<std::vector<Pod>> trace = LoadPods(TraceVariantPath(dir, "default"), *cluster);
  if (!trace.ok()) {
    std::fprintf(stderr, "%s\n", trace.status().message().c_str());
    return 1;
  }
  const TypicalPods typical = TypicalPods::FromWorkload(*trace);
  std::unique_ptr<Policy> policy = MakePolicy(policy_name, typical);
  if (!policy) {
    std::fprintf(stderr, "unknown policy %s\n", policy_name.c_str());
    return 2;
  }
  const std::vector<double> points = DefaultReportPoints(1.3);
  auto cpu_ms = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
  };
  std::vector<double> ms;
  std::vector<double> cpu;
  double allocated = 0;
  size_t pods = 0;
  for (int i = 0; i < runs; ++i) {
    const uint64_t seed = 42 + static_cast<uint64_t>(i);
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = cpu_ms();
    const std::vector<Pod> arrivals =
        ArrivalSequence(*trace, cluster->GpuCapacityMilli(), 1.3, seed);
    ReplayResult r = Replay(*cluster, arrivals, *policy, typical, points, seed);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
    cpu.push_back(cpu_ms() - cpu_start);
    allocated += r.final.allocated / runs;
    pods = arrivals.size();
  }
  std::sort(ms.begin(), ms.end());
  std::sort(cpu.begin(), cpu.end());
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("| %s | %zu | %.0f | %.0f | %.0f | %.1f | %.1f %% |\n", policy_name.c_str(), pods,
              ms[ms.size() / 2], ms.back(), cpu[cpu.size() / 2],
              static_cast<double>(ru.ru_maxrss) / 1024.0, allocated * 100);
  return 0;
}
