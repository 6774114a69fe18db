// Sharing hot paths, in process: what one kubelet call costs the plugin once the plan is built.
//   Allocate/ts_8x48       one replica of an 8-GPU × 48-replica time-sliced resource
//   Allocate/mps_8x48      the same on an MPS resource (mounts and per-container limits)
//   Preferred/ts_8x48/N    GetPreferredAllocation of N replicas out of 384 (distributed, packed)
//   BuildPlan/mig_8x7      mixed MIG plan for 8 GPUs × 7 MIG devices, plus time-slicing on top
// Every repetition is one call (Iterations(1)), so the median and p99 across repetitions are the
// per-call latencies.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <string>
#include <vector>

#include "deviceplugin/allocate.h"
#include "deviceplugin/preferred.h"
#include "sharing/plan.h"
#include "sharing/test_inventories.h"

namespace gpulet {
namespace {

constexpr int kRepetitions = 2000;

double Percentile(const std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  std::vector<double> s = v;
  std::sort(s.begin(), s.end());
  const size_t i = std::min(s.size() - 1, static_cast<size_t>(p * static_cast<double>(s.size())));
  return s[i];
}

sharing::Plan MakePlan(const gpu::Inventory& inv, const std::string& yaml) {
  Result<config::Config> cfg = config::ParseConfig(yaml, "bench.yaml");
  if (!cfg.ok()) std::abort();
  Result<sharing::Plan> plan = sharing::BuildPlan(inv, *cfg);
  if (!plan.ok()) std::abort();
  return *plan;
}

const gpu::Inventory& Gpus8() {
  static const gpu::Inventory inv = sharing::testing::WholeGpus(8);
  return inv;
}

const sharing::Resource& Shared(bool mps) {
  static const sharing::Plan ts = MakePlan(
      Gpus8(), "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 48}\n");
  static const sharing::Plan m =
      MakePlan(Gpus8(), "sharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 48}\n");
  return (mps ? m : ts).resources.at(0);
}

void Allocate(benchmark::State& state, bool mps) {
  const sharing::Resource& r = Shared(mps);
  deviceplugin::AllocateOptions o;
  o.pass_device_specs = true;
  o.mps[r.name] =
      deviceplugin::MpsMount{"/run/nvidia/mps/nvidia.com_gpu/pipe", "/run/nvidia/mps/shm"};
  size_t next = 0;
  for (auto _ : state) {
    // The last replica of a GPU: the longest lookup.
    const std::string& id = r.devices[(next++ % 8) * 48 + 47].id;
    auto resp = deviceplugin::BuildContainerAllocateResponse(r, Gpus8(), o, {id}, "bench");
    benchmark::DoNotOptimize(resp);
  }
}

void Preferred(benchmark::State& state, deviceplugin::ReplicaPolicy policy) {
  const sharing::Resource& r = Shared(false);
  std::vector<std::string> all;
  for (const auto& d : r.devices) all.push_back(d.id);
  const int size = static_cast<int>(state.range(0));
  for (auto _ : state) {
    auto ids = deviceplugin::PreferredAllocation(r, Gpus8(), all, {}, size, policy);
    benchmark::DoNotOptimize(ids);
  }
}

void PlanMig(benchmark::State& state) {
  static const gpu::Inventory inv =
      sharing::testing::MigEverywhere(8, std::vector<std::string>(7, "1g.10gb"));
  static const config::Config cfg = *config::ParseConfig(
      "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n"
      "    - {name: mig-1g.10gb, replicas: 4}\n",
      "bench.yaml");
  for (auto _ : state) {
    auto plan = sharing::BuildPlan(inv, cfg);
    benchmark::DoNotOptimize(plan);
  }
}

void Register(benchmark::internal::Benchmark* b) {
  b->Iterations(1)
      ->Repetitions(kRepetitions)
      ->ReportAggregatesOnly(true)
      ->Unit(benchmark::kMicrosecond)
      ->ComputeStatistics("p50", [](const std::vector<double>& v) { return Percentile(v, 0.50); })
      ->ComputeStatistics("p99", [](const std::vector<double>& v) { return Percentile(v, 0.99); });
}

}  // namespace
}  // namespace gpulet

int main(int argc, char** argv) {
  using namespace gpulet;
  Register(benchmark::RegisterBenchmark("Allocate/ts_8x48", Allocate, false));
  Register(benchmark::RegisterBenchmark("Allocate/mps_8x48", Allocate, true));
  for (auto policy :
       {deviceplugin::ReplicaPolicy::kDistributed, deviceplugin::ReplicaPolicy::kPacked}) {
    Register(
        benchmark::RegisterBenchmark(
            (std::string("Preferred/ts_8x48/") + deviceplugin::ReplicaPolicyName(policy)).c_str(),
            Preferred, policy)
            ->Arg(1)
            ->Arg(8));
  }
  Register(benchmark::RegisterBenchmark("BuildPlan/mig_8x7_mixed_ts4", PlanMig));
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
