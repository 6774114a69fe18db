// Discovery benchmark: from dlopen + nvmlInit to a complete Inventory, on the simulated driver.
//   in-process: Nvml::Load + Discover + shutdown, repeated (the library stays mapped after the
//               first load, as it would in a long-running agent that re-discovers);
//   cold:       a fresh `gpulet info --output json` process each time (dlopen, fixture parse,
//               init, discovery, JSON), the figure a user sees.
// Prints a markdown table; bench/discovery/run.sh puts it into docs/benchmarks.md.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpu/inventory.h"
#include "gpu/nvml.h"
#include "sim/simulation.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

struct Stats {
  double median_ms = 0, p99_ms = 0;
};

Stats Summarise(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Stats s;
  s.median_ms = v[v.size() / 2];
  s.p99_ms = v[std::min(v.size() - 1, static_cast<size_t>(v.size() * 0.99))];
  return s;
}

bool InProcess(const std::string& fixture, const std::string& state, int runs, Stats* out,
               size_t* gpus, size_t* migs) {
  auto node = gpulet::sim::PrepareSimulation(fixture, state);
  if (!node.ok()) {
    std::fprintf(stderr, "%s\n", node.status().message().c_str());
    return false;
  }
  gpulet::gpu::DiscoverOptions opt;
  opt.sysfs_root = node->sysfs_root;
  opt.procfs_root = node->procfs_root;
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    auto t0 = Clock::now();
    auto nvml = gpulet::gpu::Nvml::Load(node->library_path);
    if (!nvml.ok()) {
      std::fprintf(stderr, "%s\n", nvml.status().message().c_str());
      return false;
    }
    auto inv = gpulet::gpu::Discover(**nvml, opt);
    if (!inv.ok()) {
      std::fprintf(stderr, "%s\n", inv.status().message().c_str());
      return false;
    }
    *gpus = inv->gpus.size();
    *migs = inv->MigDeviceCount();
    nvml->reset();  // nvmlShutdown
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  *out = Summarise(ms);
  return true;
}

bool ColdProcess(const std::string& gpulet, const std::string& fixture, const std::string& state,
                 int runs, Stats* out) {
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    std::vector<std::string> args = {gpulet, "--simulate", fixture, "--sim-state", state,
                                     "info", "--output", "json"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    auto t0 = Clock::now();
    pid_t pid = 0;
    if (posix_spawn(&pid, gpulet.c_str(), &fa, nullptr, argv.data(), environ) != 0) return false;
    int status = 0;
    waitpid(pid, &status, 0);
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    posix_spawn_file_actions_destroy(&fa);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "gpulet info failed on %s\n", fixture.c_str());
      return false;
    }
  }
  *out = Summarise(ms);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s GPULET_BINARY STATE_DIR [RUNS]\n", argv[0]);
    return 2;
  }
  const std::string gpulet = argv[1], state = argv[2];
  const int runs = argc > 3 ? std::atoi(argv[3]) : 200;
  std::printf("| fixture | GPUs | MIG devices | in-process median | in-process p99 | cold process median | cold process p99 |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const char* fixture : {"dgx-a100", "dgx-h100", "synthetic-64"}) {
    Stats in, cold;
    size_t gpus = 0, migs = 0;
    const std::string dir = state + "/" + fixture;
    if (!InProcess(fixture, dir, runs, &in, &gpus, &migs)) return 1;
    if (!ColdProcess(gpulet, fixture, dir, std::max(20, runs / 5), &cold)) return 1;
    std::printf("| %s | %zu | %zu | %.3f ms | %.3f ms | %.2f ms | %.2f ms |\n", fixture, gpus, migs,
                in.median_ms, in.p99_ms, cold.median_ms, cold.p99_ms);
  }
  std::printf("\nIn-process: `Nvml::Load` (dlopen + symbol table + nvmlInit_v2, fixture parse in the "
              "simulated driver) + `Discover` + shutdown, %d runs. Cold process: a fresh "
              "`gpulet info --output json`, %d runs.\n",
              runs, std::max(20, runs / 5));
  return 0;
}
