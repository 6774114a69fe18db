// bench_dra_slices RUNS: time from a device change to the ResourceSlice update landing in the API
// server, for gpulet's slice publisher (src/dra/publisher.h) against the fake API server over
// HTTPS (real client, real TLS, the server's ResourceSlice validation on every write).
//   - health: a GPU's health flips on the HealthBoard (an XID, then recovery); measured from
//     HealthBoard::Update until the publisher's writes of the new generation have been answered
//     (every slice of the pool carries it), through the publisher's own health thread;
//   - inventory: SetDevices with one GPU fewer / back again (a rescan), to the same point.
// The node is the simulated dgx-h100 (8 H100s with every MIG placement: 8 counter sets and
// about 230 devices in 6 slices; every change rewrites all of them at a new generation).
// Prints a Markdown table on stdout, with the load average at the end (latency on a shared machine
// is mostly waiting for a core; the CPU column is the work itself).
#include <stdlib.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "apiserver/fake_apiserver.h"
#include "dra/publisher.h"
#include "gpu/inventory.h"
#include "gpu/nvml.h"
#include "mig/driver.h"
#include "sim/simulation.h"

#include "../common/stats.h"

namespace {

using namespace gpulet;
using namespace std::chrono_literals;
using Millis = std::chrono::duration<double, std::milli>;

using gpulet::bench::Stats;
using gpulet::bench::Summarize;

// CPU time of the whole process (publisher, client and fake API server), in ms.
double CpuMs() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 +
         (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "bench_dra_slices: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::max(2, std::atoi(argv[1])) : 200;
  spdlog::set_level(spdlog::level::warn);  // one "published" line per change would swamp the table
  char tmpl[] = "/tmp/gpulet-bench-dra-slices-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return Fail("mkdtemp");
  const std::string dir = tmpl;
  Result<sim::SimulatedNode> node = sim::PrepareSimulation("dgx-h100", dir + "/sim");
  if (!node.ok()) return Fail(node.status().message());
  Result<std::shared_ptr<gpu::Nvml>> nvml = gpu::Nvml::Load(node->library_path);
  if (!nvml.ok()) return Fail(nvml.status().message());
  gpu::DiscoverOptions opts;
  opts.sysfs_root = node->sysfs_root;
  opts.procfs_root = node->procfs_root;
  Result<gpu::Inventory> inv = gpu::Discover(**nvml, opts);
  if (!inv.ok()) return Fail(inv.status().message());
  Result<std::vector<mig::GpuState>> mig = mig::ReadMigState(**nvml);
  if (!mig.ok()) return Fail(mig.status().message());

  Result<testing::TestPki> pki = testing::MakeTestPki(dir);
  if (!pki.ok()) return Fail(pki.status().message());
  auto api = testing::FakeApiServer::Start(*pki, {});
  if (!api.ok()) return Fail(api.status().message());
  (*api)->Put("/api/v1/nodes/bench-node",
              {{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", "bench-node"}}}});
  k8s::Client client((*api)->Access(*pki));

  dra::PublisherOptions po;
  po.slices.node_name = "bench-node";
  po.slices.sysfs_root = node->sysfs_root;
  po.initial_backoff = 10ms;
  dra::SlicePublisher publisher(client, po);
  auto full = std::make_shared<gpu::Inventory>(*inv);
  auto fewer = std::make_shared<gpu::Inventory>(*inv);
  fewer->gpus.pop_back();
  std::vector<mig::GpuState> fewer_mig(mig->begin(), mig->end() - 1);
  publisher.SetDevices(full, *mig);
  gpu::HealthBoard board;
  publisher.FollowHealth(board);
  if (Status s = publisher.Start(); !s.ok()) return Fail(s.message());
  if (!publisher.WaitPublished(publisher.input_version(), 60s)) return Fail("first publication");
  const size_t slices = publisher.desired().size();
  size_t devices = 0;
  for (const auto& s : publisher.desired()) {
    devices += s["spec"].value("devices", nlohmann::json::array()).size();
  }

  std::vector<double> health, inventory;
  const std::string uuid = inv->gpus[3].uuid;
  const uint64_t writes_before = publisher.stats().writes;
  const double cpu0 = CpuMs();
  for (int i = 0; i < runs; ++i) {
    const uint64_t v = publisher.input_version();
    const auto t0 = std::chrono::steady_clock::now();
    board.Update({{uuid, gpu::DeviceHealth{i % 2 == 1, i % 2 == 1 ? "" : "XID 79"}}});
    if (!publisher.WaitPublished(v + 1, 60s)) return Fail("health change not published");
    health.push_back(Millis(std::chrono::steady_clock::now() - t0).count());
  }
  const uint64_t health_writes = publisher.stats().writes - writes_before;
  const double cpu1 = CpuMs();
  for (int i = 0; i < runs; ++i) {
    const uint64_t v = publisher.input_version();
    const auto t0 = std::chrono::steady_clock::now();
    if (i % 2 == 0) {
      publisher.SetDevices(fewer, fewer_mig);
    } else {
      publisher.SetDevices(full, *mig);
    }
    if (!publisher.WaitPublished(v + 1, 60s)) return Fail("inventory change not published");
    inventory.push_back(Millis(std::chrono::steady_clock::now() - t0).count());
  }
  const double cpu2 = CpuMs();
  const dra::PublisherStats st = publisher.stats();
  // The pure part on its own: building the pool's slices (JSON) from the inventory.
  std::vector<double> build;
  dra::SliceInputs in;
  in.inventory = full.get();
  in.mig = *mig;
  dra::SliceOptions so = po.slices;
  so.node_uid = "uid";
  for (int i = 0; i < runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    Result<std::vector<nlohmann::json>> built = dra::BuildSlices(in, so, i + 1);
    if (!built.ok()) return Fail(built.status().message());
    build.push_back(Millis(std::chrono::steady_clock::now() - t0).count());
  }
  const Stats b = Summarize(build);
  publisher.Stop();
  api->reset();
  std::string rm = "rm -rf '" + dir + "'";
  if (std::system(rm.c_str()) != 0) return Fail("cleanup");


  const Stats h = Summarize(health), d = Summarize(inventory);
  std::printf("Node: simulated dgx-h100, %zu slices, %zu devices; %d changes of each kind.\n\n",
              slices, devices, runs);
  std::printf("| change | n | median | p99 | max | writes per change | CPU per change |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  std::printf("| health (XID taint / recovery) | %zu | %.2f ms | %.2f ms | %.2f ms | %.1f | %.1f ms |\n",
              h.n, h.p50, h.p99, h.max, static_cast<double>(health_writes) / runs,
              (cpu1 - cpu0) / runs);
  std::printf("| inventory (one GPU gone / back) | %zu | %.2f ms | %.2f ms | %.2f ms | %.1f | %.1f ms |\n",
              d.n, d.p50, d.p99, d.max,
              static_cast<double>(st.writes - writes_before - health_writes) / runs,
              (cpu2 - cpu1) / runs);
  std::printf("| BuildSlices alone (no I/O) | %zu | %.2f ms | %.2f ms | %.2f ms | | |\n", b.n, b.p50,
              b.p99, b.max);
  std::printf("\nCPU per change: the whole process (publisher, client and fake API server, TLS on "
              "both ends), user + system.\n");
  std::printf("\nfinal generation %lld, %llu passes, %llu failed requests\n",
              static_cast<long long>(st.generation), static_cast<unsigned long long>(st.passes),
              static_cast<unsigned long long>(st.failed_requests));
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) == 3) {
    std::printf("load average at the end: %.2f %.2f %.2f\n", load[0], load[1], load[2]);
  }
  return 0;
}
