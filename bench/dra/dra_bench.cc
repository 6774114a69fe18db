// bench_dra RUNS: NodePrepareResources latency of gpulet's DRA kubelet plugin (src/dra/plugin.h)
// through real gRPC over a Unix socket, driven by the kubelet's DRA side (testing/kubelet/
// dra_harness.h), each claim read from the fake API server over HTTPS, the checkpoint written to
// disk (fsync'd) twice per call. The device side is the tests' recording Preparer
// (src/dra/fake_preparer.h): these figures are the plugin's own cost, without CDI specs or MIG.
//   - one claim of one GPU; one claim of eight GPUs (eight results);
//   - NodeUnprepareResources for the same claims.
// Then the product: `gpulet dra --simulate dgx-h100` as a child process with the node preparer
// (a CDI spec per claim under a temporary --cdi-root, the driver's files from a fake driver root),
// the same two claims through the same harness, and the process's RSS (VmRSS, VmHWM) afterwards.
// Prints a Markdown table on stdout.
#include <spdlog/spdlog.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <signal.h>
#include <string>
#include <thread>
#include <vector>

#include "apiserver/fake_apiserver.h"
#include "common/files.h"
#include "dra/fake_preparer.h"
#include "dra/plugin.h"
#include "dra/test_claims.h"
#include "k8s/client.h"
#include "kubelet/dra_harness.h"
#include "tests/deviceplugin/plugin_process.h"

#include "../common/stats.h"

namespace {

using namespace gpulet;
using namespace std::chrono_literals;
using Micros = std::chrono::duration<double, std::micro>;

using gpulet::bench::Stats;
using gpulet::bench::Summarize;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "bench_dra: %s\n", what.c_str());
  std::exit(1);
}

void Touch(const std::string& path) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << "";
}

// VmRSS, VmHWM, RssAnon and RssFile of `pid`, in KiB.
struct Memory {
  long rss = 0, hwm = 0, anon = 0, file = 0;
};
Memory Rss(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  Memory m;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) m.rss = std::atol(line.c_str() + 6);
    if (line.rfind("VmHWM:", 0) == 0) m.hwm = std::atol(line.c_str() + 6);
    if (line.rfind("RssAnon:", 0) == 0) m.anon = std::atol(line.c_str() + 8);
    if (line.rfind("RssFile:", 0) == 0) m.file = std::atol(line.c_str() + 8);
  }
  return m;
}

// `runs` claims of 1 GPU, then of 8, each prepared and unprepared through `kubelet` one after the
// other; prints a table row (runs, p50, p99, max) per call and size, named after `label`. `claims`
// numbers the claims (their names and UUIDs) across calls.
void PrepareUnprepareRows(testing::DraKubeletHarness& kubelet, testing::FakeApiServer& api,
                          int runs, const std::string& label, int& claims) {
  for (int gpus : {1, 8}) {
    std::vector<double> prep, unprep;
    for (int i = 0; i < runs; ++i) {
      dra::testing::TestClaim c;
      c.name = "c" + std::to_string(++claims);
      char uid[40];
      std::snprintf(uid, sizeof(uid), "6f1c2e3a-0000-4000-8000-%012d", claims);
      c.uid = uid;
      c.node = "node-1";
      for (int g = 0; g < gpus; ++g) c.results.push_back({"gpu", "gpu-" + std::to_string(g)});
      api.Put(dra::testing::ClaimObjectPath(c.namespace_, c.name), dra::testing::MakeClaimObject(c));
      testing::DraClaimRef ref{c.namespace_, c.name, c.uid, dra::kDriverName};
      auto t0 = std::chrono::steady_clock::now();
      auto out = kubelet.PreparePod({ref});
      auto t1 = std::chrono::steady_clock::now();
      if (!out.at(c.uid).error.empty()) Die(out.at(c.uid).error);
      auto un = kubelet.UnpreparePod({ref});
      auto t2 = std::chrono::steady_clock::now();
      if (!un.at(c.uid).empty()) Die(un.at(c.uid));
      prep.push_back(Micros(t1 - t0).count());
      unprep.push_back(Micros(t2 - t1).count());
    }
    for (auto [what, v] : {std::pair{"prepare", prep}, std::pair{"unprepare", unprep}}) {
      Stats s = Summarize(v);
      std::printf("| %s%s, one claim of %d GPU%s | %zu | %.0f µs | %.0f µs | %.0f µs |\n",
                  label.c_str(), what, gpus, gpus == 1 ? "" : "s", s.n, s.p50, s.p99, s.max);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::max(10, std::atoi(argv[1])) : 1000;
  spdlog::set_level(spdlog::level::warn);
  char tmpl[] = "/tmp/bdra-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) Die("mkdtemp");
  const std::string dir = tmpl;
  // The CDI specs and the preparer's records go where the deployment puts them: on tmpfs
  // (/var/run/cdi, /run/gpulet/dra); /dev/shm stands for it. The plugin's checkpoint stays on
  // disk (/var/lib/kubelet/plugins in a deployment, `dir` here).
  char shm_tmpl[] = "/dev/shm/gpulet-dra-bench-XXXXXX";
  const bool have_shm = std::filesystem::is_directory("/dev/shm") && mkdtemp(shm_tmpl) != nullptr;
  const std::string tmpfs = have_shm ? std::string(shm_tmpl) : dir;
  std::filesystem::create_directories(dir + "/pki");
  Result<testing::TestPki> pki = testing::MakeTestPki(dir + "/pki");
  if (!pki.ok()) Die(pki.status().message());
  auto api = testing::FakeApiServer::Start(*pki, {});
  if (!api.ok()) Die(api.status().message());
  k8s::Client client((*api)->Access(*pki));
  if (!WriteFileAtomic(dir + "/boot_id", "bench\n").ok()) Die("boot_id");

  testing::DraHarnessOptions ho;
  ho.registry_dir = dir + "/reg";
  testing::DraKubeletHarness kubelet(ho);
  if (!kubelet.Start().ok()) Die("harness");
  dra::PluginOptions po;
  po.node_name = "node-1";
  po.registry_dir = dir + "/reg";
  po.plugins_dir = dir + "/plugins";
  po.boot_id_path = dir + "/boot_id";
  dra::FakePreparer preparer;
  dra::DraPlugin plugin(po, &client, &preparer);
  if (Status s = plugin.Start(); !s.ok()) Die(s.message());
  if (!kubelet.WaitForDriver(dra::kDriverName, 10s)) Die("the plugin did not register");

  std::printf("| NodePrepareResources (fake preparer, real gRPC + API server GET + checkpoint) "
              "| runs | p50 | p99 | max |\n|---|---|---|---|---|\n");
  int claims = 0;
  PrepareUnprepareRows(kubelet, **api, runs, "", claims);
  // Where the time goes: one GET of a claim from the API server (on the connection k8s::Client
  // keeps between GETs), one checkpoint write (temp + fsync + rename + fsync).
  {
    dra::testing::TestClaim c;
    c.name = "probe";
    c.uid = "uid-probe";
    c.node = "node-1";
    c.results = {{"gpu", "gpu-0"}};
    (*api)->Put(dra::testing::ClaimObjectPath(c.namespace_, c.name), dra::testing::MakeClaimObject(c));
    std::vector<double> get, write;
    dra::Checkpoint cp;
    cp.node_name = "node-1";
    cp.boot_id = "bench";
    for (int i = 0; i < std::min(runs, 200); ++i) {
      auto t0 = std::chrono::steady_clock::now();
      auto r = client.Get(dra::testing::ClaimObjectPath(c.namespace_, c.name));
      auto t1 = std::chrono::steady_clock::now();
      if (!r.ok()) Die(r.status().message());
      if (!dra::WriteCheckpoint(dir + "/probe.json", cp).ok()) Die("write");
      auto t2 = std::chrono::steady_clock::now();
      get.push_back(Micros(t1 - t0).count());
      write.push_back(Micros(t2 - t1).count());
    }
    for (auto [what, v] : {std::pair{"of which: one claim GET over HTTPS", get},
                           std::pair{"of which: one checkpoint write (fsync)", write}}) {
      Stats s = Summarize(v);
      std::printf("| %s | %zu | %.0f µs | %.0f µs | %.0f µs |\n", what, s.n, s.p50, s.p99, s.max);
    }
  }
  kubelet.Stop();
  plugin.Stop();

  // The product binary with the node preparer.
  {
    const std::string root = dir + "/driver";
    Touch(root + "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15");
    Touch(root + "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15");
    Touch(root + "/usr/bin/nvidia-smi");
    for (const char* n : {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}) Touch(root + "/dev/" + n);
    for (int i = 0; i < 8; ++i) Touch(root + "/dev/nvidia" + std::to_string(i));
    std::ofstream(dir + "/kubeconfig")
        << "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: "
        << (*api)->url() << "\n    certificate-authority: " << pki->ca_cert
        << "\nusers:\n- name: u\n  user:\n    token: test-token\n"
           "contexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n";
    // The slices' owner: the Node.
    (*api)->Put("/api/v1/nodes/node-1",
                {{"apiVersion", "v1"},
                 {"kind", "Node"},
                 {"metadata", {{"name", "node-1"}, {"uid", "node-1-uid"}}}});
    testing::DraHarnessOptions ho2;
    ho2.registry_dir = dir + "/reg2";
    testing::DraKubeletHarness kubelet2(ho2);
    if (!kubelet2.Start().ok()) Die("harness");
    testing::GpuletProcess dra_process(
        {"dra", "--simulate", "dgx-h100", "--sim-state", dir + "/sim", "--node-name", "node-1",
         "--kubeconfig", dir + "/kubeconfig", "--plugins-registry", dir + "/reg2", "--plugin-dir",
         dir + "/plugins2", "--cdi-root", tmpfs + "/cdi", "--driver-root", root, "--state-dir",
         tmpfs + "/state", "--boot-id-file", dir + "/boot_id"},
        dir + "/dra.log");
    if (!dra_process.Start()) Die("cannot start gpulet dra");
    if (!kubelet2.WaitForDriver(dra::kDriverName, 30s)) Die("gpulet dra did not register:\n" + dra_process.Log());
    // As deployed, it publishes the node's ResourceSlices (and watches them): the timing starts
    // once they are there.
    for (auto until = std::chrono::steady_clock::now() + 30s;;) {
      auto slices = client.Get("/apis/resource.k8s.io/v1/resourceslices");
      if (slices.ok() && (*slices)["items"].is_array() && !(*slices)["items"].empty()) break;
      if (std::chrono::steady_clock::now() > until) Die("gpulet dra published no slices:\n" + dra_process.Log());
      std::this_thread::sleep_for(50ms);
    }
    PrepareUnprepareRows(kubelet2, **api, runs,
                         "`gpulet dra` (node preparer, CDI spec written): ", claims);
    const Memory m = Rss(dra_process.pid());
    // For a breakdown by mapping: GPULET_BENCH_SMAPS=<file> keeps the process's smaps.
    if (const char* keep = std::getenv("GPULET_BENCH_SMAPS"); keep != nullptr && *keep != 0) {
      std::ifstream in("/proc/" + std::to_string(dra_process.pid()) + "/smaps");
      std::ofstream(keep) << in.rdbuf();
      // And its threads' names, one line each, in <file>.threads.
      std::ofstream threads(std::string(keep) + ".threads");
      std::error_code ec;
      for (const auto& t : std::filesystem::directory_iterator(
               "/proc/" + std::to_string(dra_process.pid()) + "/task", ec)) {
        std::string name;
        std::getline(std::ifstream(t.path() / "comm"), name);
        threads << name << "\n";
      }
    }
    std::printf("\n`gpulet dra --simulate dgx-h100` after %d claims prepared and unprepared: "
                "VmRSS %.1f MiB (anonymous %.1f MiB, file-backed %.1f MiB), VmHWM %.1f MiB.\n",
                runs * 2, m.rss / 1024.0, m.anon / 1024.0, m.file / 1024.0, m.hwm / 1024.0);
    dra_process.Stop(SIGTERM);
    kubelet2.Stop();
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (have_shm) std::filesystem::remove_all(tmpfs, ec);
  return 0;
}
