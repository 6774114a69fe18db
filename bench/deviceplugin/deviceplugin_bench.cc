// bench_deviceplugin RUNS: starts `gpulet plugin --simulate F` against an in-process kubelet
// harness and measures, over the real unix socket:
//   - GetPreferredAllocation and Allocate latency (p50/p99) on dgx-h100 (8) and synthetic-64 (64);
//   - health propagation: an XID queued in the simulated driver → the harness sees Unhealthy;
//   - kubelet restart → the plugin re-registered and streaming again;
//   - RSS of the plugin process on dgx-h100.
// Prints a Markdown table on stdout.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "sim/control.h"
#include "testing/kubelet/kubelet_harness.h"
#include "tests/deviceplugin/plugin_process.h"

#include "../common/stats.h"

namespace {

using namespace gpulet;
using namespace gpulet::testing;
using namespace std::chrono_literals;
using Micros = std::chrono::duration<double, std::micro>;

constexpr char kGpu[] = "nvidia.com/gpu";

using gpulet::bench::Stats;
using gpulet::bench::Summarize;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "bench_deviceplugin: %s\n", what.c_str());
  std::exit(1);
}

long RssKiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

struct Node {
  TempDir tmp;
  std::string plugin_dir = tmp.path() + "/plugins";
  std::string sim_state = tmp.path() + "/sim";
  KubeletHarness harness;
  std::unique_ptr<GpuletProcess> plugin;

  Node(const std::string& fixture, const std::string& quiet) {
    std::filesystem::create_directories(plugin_dir);
    Status s = harness.Start(plugin_dir);
    if (!s.ok()) Die(s.message());
    plugin = std::make_unique<GpuletProcess>(
        std::vector<std::string>{"--simulate", fixture, "--sim-state", sim_state, "--log-level",
                                 "warn", "plugin", "--device-plugin-path", plugin_dir,
                                 "--health-quiet-period", quiet},
        tmp.path() + "/plugin.log");
    if (!plugin->Start()) Die("cannot start gpulet plugin");
    s = harness.WaitFor(
        kGpu,
        [](const ResourceState& st) {
          return st.streaming && !st.devices.empty() && st.HealthyCount() == st.devices.size();
        },
        60s);
    if (!s.ok()) Die(s.message() + "\n" + plugin->Log());
  }
  ~Node() {
    plugin->Stop(SIGTERM);
    harness.Stop();
  }
  std::vector<std::string> Ids() const {
    std::vector<std::string> ids;
    for (const HarnessDevice& d : harness.Devices(kGpu)) ids.push_back(d.id);
    return ids;
  }
};

void Row(const char* what, const Stats& s, const char* unit, const char* target) {
  std::printf("| %s | %zu | %.1f %s | %.1f %s | %.1f %s | %s |\n", what, s.n, s.p50, unit, s.p99,
              unit, s.max, unit, target);
}

void AllocationLatency(const std::string& fixture, int size, int runs) {
  Node node(fixture, "60s");
  std::vector<std::string> ids = node.Ids();
  std::vector<double> pref, alloc;
  for (int i = 0; i < runs; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    Result<std::vector<std::string>> p = node.harness.GetPreferredAllocation(kGpu, ids, {}, size);
    auto t1 = std::chrono::steady_clock::now();
    if (!p.ok()) Die(p.status().message());
    Result<v1beta1::ContainerAllocateResponse> a = node.harness.Allocate(kGpu, *p);
    auto t2 = std::chrono::steady_clock::now();
    if (!a.ok()) Die(a.status().message());
    pref.push_back(Micros(t1 - t0).count());
    alloc.push_back(Micros(t2 - t1).count());
  }
  std::string label =
      fixture + " (" + std::to_string(ids.size()) + " GPUs), size " + std::to_string(size);
  Row(("GetPreferredAllocation, " + label).c_str(), Summarize(pref), "µs", "p99 < 1000 µs");
  Row(("Allocate, " + label).c_str(), Summarize(alloc), "µs", "p99 < 1000 µs");
}

void HealthAndRestart(int runs) {
  Node node("dgx-h100", "100ms");
  std::vector<std::string> ids = node.Ids();
  sim::ControlFile control(node.sim_state);
  std::vector<double> health;
  for (int i = 0; i < runs; ++i) {
    const unsigned gpu = static_cast<unsigned>(i % ids.size());
    const std::string id = ids[gpu];
    auto t0 = std::chrono::steady_clock::now();
    Result<sim::ControlState> r = control.Update([gpu](sim::ControlState& st) {
      sim::SimEvent e;
      e.gpu = gpu;
      e.type = 0x8;  // nvmlEventTypeXidCriticalError
      e.data = 79;
      st.Queue(e);
    });
    if (!r.ok()) Die(r.status().message());
    auto unhealthy = [&](bool want) {
      return [&, want](const ResourceState& st) {
        for (const HarnessDevice& d : st.devices) {
          if (d.id == id) return d.healthy() != want;
        }
        return false;
      };
    };
    Status s = node.harness.WaitFor(kGpu, unhealthy(true), 30s);
    auto t1 = std::chrono::steady_clock::now();
    if (!s.ok()) Die(s.message());
    health.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    s = node.harness.WaitFor(kGpu, unhealthy(false), 30s);  // recovers after the quiet period
    if (!s.ok()) Die(s.message());
  }
  Row("Health event → harness sees Unhealthy (dgx-h100)", Summarize(health), "ms", "p99 < 20 ms");

  std::vector<double> restart;
  for (int i = 0; i < std::max(10, runs); ++i) {
    const int before = node.harness.RegistrationCount(kGpu);
    auto t0 = std::chrono::steady_clock::now();
    Status s = node.harness.Restart();
    if (!s.ok()) Die(s.message());
    s = node.harness.WaitFor(
        kGpu,
        [before](const ResourceState& st) { return st.registrations > before && st.streaming; },
        30s);
    auto t1 = std::chrono::steady_clock::now();
    if (!s.ok()) Die(s.message());
    restart.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  Row("Kubelet restart → re-registered and streaming (dgx-h100)", Summarize(restart), "ms",
      "< 500 ms");
  long rss = RssKiB(node.plugin->pid());
  std::printf(
      "| RSS of `gpulet plugin` (dgx-h100, after the runs above) | 1 | %.1f MiB | | | < 20 MiB |\n",
      rss / 1024.0);
}

}  // namespace

int main(int argc, char** argv) {
  int runs = argc > 1 ? std::atoi(argv[1]) : 2000;
  std::printf("| Measure | n | p50 | p99 | max | Target |\n|---|---|---|---|---|---|\n");
  AllocationLatency("dgx-h100", 2, runs);
  AllocationLatency("dgx-h100", 8, runs);
  AllocationLatency("synthetic-64", 8, runs);
  AllocationLatency("synthetic-64", 32, runs);
  HealthAndRestart(std::max(20, runs / 40));
  std::printf(
      "\nOver the real unix socket through the kubelet harness (gRPC client in the bench "
      "process, plugin in its own process, simulated NVML).\n");
  return 0;
}
