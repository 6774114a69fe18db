// MIG partitioning costs.
//   Plan/8x7_from_scratch    ComputePlan: 8 GPUs without MIG → 7 × 1g.5gb each (56 placements)
//   Plan/8x7_reshape         ComputePlan: 8 GPUs at 3g+2g+1g+1g → 7 × 1g.5gb (keeps the 1g)
//   Plan/8x7_mixed_search    ComputePlan: 8 GPUs → 3g+2g+1g+1g (placement search with conflicts)
//   Apply/sim_8x7            ReadMigState + ApplyPlan on the simulated driver: MIG on and 7
//                            instances (GI + CI) on each of 8 GPUs; the reset between
//                            repetitions is not timed
//   Apply/sim_1gpu_reshape   one GPU from 7 × 1g.5gb to 3g+3g (7 destroys, 2 creates)
// Every repetition is one call (Iterations(1)), so median and p99 across repetitions are
// per-call latencies.
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "../common/gbench_percentiles.h"
#include "gpu/nvml.h"
#include "mig/config.h"
#include "mig/driver.h"
#include "mig/plan.h"
#include "sim/simulation.h"


namespace gpulet::mig {
namespace {

using bench::Percentiles;

std::vector<ProfileSpec> A100() {
  return {{"1g.5gb", 0, 1, 4864, {0, 1, 2, 3, 4, 5, 6}, 1},
          {"1g.10gb", 9, 1, 9856, {0, 2, 4, 6}, 2},
          {"2g.10gb", 1, 2, 9856, {0, 2, 4}, 2},
          {"3g.20gb", 2, 3, 19968, {0, 4}, 4},
          {"4g.20gb", 3, 4, 19968, {0}, 4},
          {"7g.40gb", 4, 7, 40192, {0}, 8}};
}

std::vector<GpuState> Node(bool mig, const std::vector<GpuInstance>& instances) {
  std::vector<GpuState> gpus;
  for (unsigned i = 0; i < 8; ++i) {
    GpuState g;
    g.index = i;
    g.name = "NVIDIA A100-SXM4-40GB";
    g.mig_capable = true;
    g.mig_enabled = mig;
    g.profiles = A100();
    g.instances = instances;
    gpus.push_back(g);
  }
  return gpus;
}

MigConfig Config(std::vector<std::pair<std::string, unsigned>> devices) {
  MigConfig c;
  c.file = "bench.yaml";
  c.name = "bench";
  c.entries.push_back({std::nullopt, true, std::move(devices), 1, 3, "mig-configs.bench[0]"});
  return c;
}

void RunPlan(benchmark::State& state, const MigConfig& config, const std::vector<GpuState>& gpus) {
  for (auto _ : state) {
    Result<Plan> plan = ComputePlan(config, gpus);
    if (!plan.ok()) state.SkipWithError(plan.status().message().c_str());
    benchmark::DoNotOptimize(plan);
  }
}

const std::vector<GpuInstance> kMixed = {{"2g.10gb", 0, 3, true},
                                         {"1g.5gb", 2, 9, true},
                                         {"1g.5gb", 3, 10, true},
                                         {"3g.20gb", 4, 2, true}};

void BM_PlanFromScratch(benchmark::State& state) {
  RunPlan(state, Config({{"1g.5gb", 7}}), Node(false, {}));
}
void BM_PlanReshape(benchmark::State& state) {
  RunPlan(state, Config({{"1g.5gb", 7}}), Node(true, kMixed));
}
void BM_PlanMixedSearch(benchmark::State& state) {
  RunPlan(state, Config({{"1g.5gb", 2}, {"2g.10gb", 1}, {"3g.20gb", 1}}), Node(false, {}));
}

// One simulated dgx-a100 in a temp state dir, loaded once for all apply benchmarks.
struct SimNode {
  std::string state_dir;
  std::shared_ptr<gpu::Nvml> nvml;
  ~SimNode() {
    nvml.reset();
    std::error_code ec;
    if (!state_dir.empty()) std::filesystem::remove_all(state_dir, ec);
  }
};

SimNode& Sim() {
  static SimNode node;
  if (node.nvml) return node;
  std::string tmpl = "/tmp/gpulet-bench-mig-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) std::abort();
  node.state_dir = tmpl;
  Result<sim::SimulatedNode> prepared = sim::PrepareSimulation("dgx-a100", node.state_dir);
  if (!prepared.ok()) {
    std::fprintf(stderr, "%s\n", prepared.status().message().c_str());
    std::abort();
  }
  Result<std::shared_ptr<gpu::Nvml>> nvml = gpu::Nvml::Load(prepared->library_path);
  if (!nvml.ok()) {
    std::fprintf(stderr, "%s\n", nvml.status().message().c_str());
    std::abort();
  }
  node.nvml = *nvml;
  return node;
}

Status ApplyConfig(const MigConfig& config) {
  Result<std::vector<GpuState>> state = ReadMigState(*Sim().nvml);
  if (!state.ok()) return state.status();
  Result<Plan> plan = ComputePlan(config, *state);
  if (!plan.ok()) return plan.status();
  return ApplyPlan(*Sim().nvml, *plan);
}

MigConfig Disabled() {
  MigConfig c = Config({});
  c.entries[0].mig_enabled = false;
  return c;
}

void RunApply(benchmark::State& state, const MigConfig& setup, const MigConfig& target) {
  for (auto _ : state) {
    state.PauseTiming();
    if (Status s = ApplyConfig(setup); !s.ok()) state.SkipWithError(s.message().c_str());
    state.ResumeTiming();
    if (Status s = ApplyConfig(target); !s.ok()) state.SkipWithError(s.message().c_str());
  }
}

void BM_ApplySim8x7(benchmark::State& state) {
  RunApply(state, Disabled(), Config({{"1g.5gb", 7}}));
}

void BM_ApplySimReshapeOneGpu(benchmark::State& state) {
  MigConfig setup = Config({{"1g.5gb", 7}});
  setup.entries[0].devices = std::vector<unsigned>{4};
  MigConfig target = Config({{"3g.20gb", 2}});
  target.entries[0].devices = std::vector<unsigned>{4};
  RunApply(state, setup, target);
}

BENCHMARK(BM_PlanFromScratch)->Name("Plan/8x7_from_scratch")->Apply([](auto* b) {
  Percentiles(b, 2000);
});
BENCHMARK(BM_PlanReshape)->Name("Plan/8x7_reshape")->Apply([](auto* b) { Percentiles(b, 2000); });
BENCHMARK(BM_PlanMixedSearch)->Name("Plan/8x7_mixed_search")->Apply([](auto* b) {
  Percentiles(b, 2000);
});
BENCHMARK(BM_ApplySim8x7)->Name("Apply/sim_8x7")->Apply([](auto* b) { Percentiles(b, 100); });
BENCHMARK(BM_ApplySimReshapeOneGpu)->Name("Apply/sim_1gpu_reshape")->Apply([](auto* b) {
  Percentiles(b, 100);
});

}  // namespace
}  // namespace gpulet::mig

BENCHMARK_MAIN();
