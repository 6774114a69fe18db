// The device side of NodePrepareResources: Preparer::Prepare alone, without gRPC or the API
// server (bench/dra measures those), on the simulated dgx-h100 and a fake driver root.
//   Prepare/1_gpu         gpu-1: CDI spec with the driver's edits, record
//   Prepare/8_gpus        gpu-0 … gpu-7 in one claim
//   Prepare/memory_share  gpu-3-mem, 20 GiB: limits directory, region, spec, record
//   Prepare/dynamic_mig   gpu-0-mig-1g-10gb-3: MIG on, GPU + compute instance, discovery, spec
// Every repetition is one Prepare (Iterations(1)); the Unprepare after it is not timed.
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "../common/gbench_percentiles.h"
#include "dra/names.h"
#include "dra/node_preparer.h"
#include "gpu/inventory.h"
#include "gpu/nvml.h"
#include "mig/layout_lock.h"
#include "sim/simulation.h"


namespace gpulet::dra {
namespace {

namespace fs = std::filesystem;

using bench::Percentiles;

void Touch(const fs::path& p) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << "x";
}

struct Node {
  std::unique_ptr<Preparer> preparer;
  std::string error;
};

// One simulated node and one preparer for the whole run.
Node& TheNode() {
  static Node node = [] {
    Node n;
    char tmpl[] = "/tmp/gpulet-bench-dra-prepare-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      n.error = "mkdtemp failed";
      return n;
    }
    const std::string tmp = tmpl;
    Result<sim::SimulatedNode> sim = sim::PrepareSimulation("dgx-h100", tmp + "/sim");
    if (!sim.ok()) {
      n.error = sim.status().message();
      return n;
    }
    Result<std::shared_ptr<gpu::Nvml>> nvml = gpu::Nvml::Load(sim->library_path);
    if (!nvml.ok()) {
      n.error = nvml.status().message();
      return n;
    }
    gpu::DiscoverOptions discover;
    discover.sysfs_root = sim->sysfs_root;
    discover.procfs_root = sim->procfs_root;
    Result<gpu::Inventory> inv = gpu::Discover(**nvml, discover);
    if (!inv.ok()) {
      n.error = inv.status().message();
      return n;
    }
    const std::string root = tmp + "/driver";
    const std::string lib = root + "/usr/lib/x86_64-linux-gnu/";
    for (const char* l : {"libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so",
                          "libnvidia-nvvm.so", "libnvidia-gpucomp.so"}) {
      Touch(lib + l + "." + inv->driver_version);
      fs::create_symlink(std::string(l) + "." + inv->driver_version, lib + l + ".1");
    }
    for (const char* b : {"nvidia-smi", "nvidia-debugdump", "nvidia-cuda-mps-control"}) {
      Touch(root + "/usr/bin/" + b);
    }
    for (const char* d : {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}) Touch(root + "/dev/" + d);
    for (const gpu::Gpu& g : inv->gpus) Touch(root + g.device_path());
    for (int i = 0; i < 8 * 135 + 3; ++i) {
      Touch(root + "/dev/nvidia-caps/nvidia-cap" + std::to_string(i));
    }
    NodePreparerOptions o;
    o.node_name = "bench-node";
    o.inventory = *inv;
    o.nvml = *nvml;
    o.discover = discover;
    o.mig_lock_file = mig::LayoutLockPath(sim->state_dir);
    // The spec and the state on tmpfs, as /var/run/cdi and /run/gpulet/dra are on a node.
    char shm[] = "/dev/shm/gpulet-bench-dra-prepare-XXXXXX";
    const std::string fast = mkdtemp(shm) != nullptr ? shm : tmp;
    o.cdi_root = fast + "/cdi";
    o.driver_root = root;
    o.nvidia_spec_dirs = {};
    o.state_dir = fast + "/state";
    o.cuda_library = "/opt/gpulet/lib/libgpulet-cuda.so";
    Result<std::unique_ptr<Preparer>> p = MakeNodePreparer(o);
    if (!p.ok()) {
      n.error = p.status().message();
      return n;
    }
    n.preparer = std::move(p).value();
    return n;
  }();
  return node;
}

std::string Uid(uint64_t n) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "b%07llx-0000-4000-8000-000000000000",
                static_cast<unsigned long long>(n & 0xfffffff));
  return buf;
}

void RunPrepare(benchmark::State& state, const std::vector<AllocatedDevice>& devices) {
  Node& node = TheNode();
  if (!node.preparer) {
    state.SkipWithError(node.error.c_str());
    return;
  }
  static uint64_t next = 0;
  for (auto _ : state) {
    Claim c;
    c.ref = {"bench", "claim", Uid(++next)};
    c.allocated = true;
    c.devices = devices;
    Result<PrepareResult> r = node.preparer->Prepare(c);
    state.PauseTiming();
    if (!r.ok()) {
      state.SkipWithError(r.status().message().c_str());
      state.ResumeTiming();
      break;
    }
    Status s = node.preparer->Unprepare(c.ref, r->record_json);
    if (!s.ok()) state.SkipWithError(s.message().c_str());
    state.ResumeTiming();
  }
}

AllocatedDevice Device(const std::string& name) {
  AllocatedDevice d;
  d.request = "gpu";
  d.driver = kDriverName;
  d.pool = "bench-node";
  d.device = name;
  return d;
}

void BM_Prepare1Gpu(benchmark::State& state) { RunPrepare(state, {Device("gpu-1")}); }

void BM_Prepare8Gpus(benchmark::State& state) {
  std::vector<AllocatedDevice> all;
  for (int i = 0; i < 8; ++i) all.push_back(Device("gpu-" + std::to_string(i)));
  RunPrepare(state, all);
}

void BM_PrepareMemoryShare(benchmark::State& state) {
  AllocatedDevice d = Device("gpu-3-mem");
  d.share_id = "5f5f5f5f-0000-4000-8000-000000000001";
  d.consumed["memory"] = int64_t{20} << 30;
  RunPrepare(state, {d});
}

void BM_PrepareDynamicMig(benchmark::State& state) {
  RunPrepare(state, {Device("gpu-0-mig-1g-10gb-3")});
}

BENCHMARK(BM_Prepare1Gpu)->Name("Prepare/1_gpu")->Apply([](auto* b) { Percentiles(b, 300); });
BENCHMARK(BM_Prepare8Gpus)->Name("Prepare/8_gpus")->Apply([](auto* b) { Percentiles(b, 300); });
BENCHMARK(BM_PrepareMemoryShare)->Name("Prepare/memory_share")->Apply([](auto* b) {
  Percentiles(b, 300);
});
BENCHMARK(BM_PrepareDynamicMig)->Name("Prepare/dynamic_mig")->Apply([](auto* b) {
  Percentiles(b, 60);
});

}  // namespace
}  // namespace gpulet::dra

BENCHMARK_MAIN();
