// libgpulet-cuda.so with real processes: the probe program (tests/memlimit/memlimit_probe.cc),
// linked against the simulated libcuda.so.1, runs under LD_PRELOAD with a fresh accounting region
// per test. Every check reads what a process printed or what the region holds afterwards.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/process.h"
#include "cudashim/region.h"
#include "sim/fixture.h"
#include "sim/simulation.h"
#include "support/build_dir.h"

extern char** environ;

namespace gpulet::cudashim {
namespace {

using gpulet::testing::BuildDir;

constexpr uint64_t kMiB = 1024ULL * 1024ULL;

// "key=value key=value" of the line that starts with `head` (the last one printed).
std::map<std::string, std::string> Line(const std::string& out, const std::string& head) {
  std::map<std::string, std::string> kv;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(head + " ", 0) != 0 && line != head) continue;
    kv.clear();
    std::istringstream words(line.substr(head.size()));
    std::string w;
    while (words >> w) {
      const auto eq = w.find('=');
      if (eq != std::string::npos) kv[w.substr(0, eq)] = w.substr(eq + 1);
    }
  }
  return kv;
}

uint64_t U(const std::map<std::string, std::string>& kv, const std::string& key) {
  auto it = kv.find(key);
  EXPECT_NE(it, kv.end()) << "no " << key;
  return it == kv.end() ? UINT64_MAX : std::stoull(it->second);
}

class MemLimitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpulet-memlimit-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    acct_ = root_ + "/acct";
    std::filesystem::create_directories(acct_);
    auto node = sim::PrepareSimulation("hgx-h200", root_ + "/sim");
    ASSERT_TRUE(node.ok()) << node.status().message();
    fixture_path_ = node->fixture_path;
    auto fixture = sim::LoadFixture(node->fixture_path);
    ASSERT_TRUE(fixture.ok());
    uuid0_ = fixture->gpus[0].uuid;
    uuid1_ = fixture->gpus[1].uuid;
    physical_ = fixture->gpus[0].memory_mib * kMiB;
    // The library reads its limits from the file beside it: each test has its own copy.
    std::filesystem::create_directories(root_ + "/lib");
    std::filesystem::copy_file(BuildDir() + "/lib/libgpulet-cuda.so",
                               root_ + "/lib/libgpulet-cuda.so");
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // The node's driver: the simulated one, named in the limits file (the library never searches).
  static std::string Driver() { return BuildDir() + "/cuda_sim/libcuda.so.1"; }

  void MakeRegion(uint64_t limit, uint64_t context_bytes = 0) {
    ASSERT_EQ(CreateRegion(acct_, {{uuid0_, limit, context_bytes}}, /*replace=*/true), "");
    ASSERT_EQ(WriteLimitsFile(root_ + "/lib/" + kLimitsFileName, {{uuid0_, limit, context_bytes}},
                              /*passthrough=*/false, Driver()),
              "");
  }

  std::vector<std::string> Env(const std::map<std::string, std::string>& extra = {}) const {
    std::map<std::string, std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e;
      const auto eq = kv.find('=');
      if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    env["LD_PRELOAD"] = root_ + "/lib/libgpulet-cuda.so";
    env["LD_LIBRARY_PATH"] = BuildDir() + "/sim:" + BuildDir() + "/cuda_sim";
    env["GPULET_CUDA_DIR"] = acct_;
    env["GPULET_CUDA_SIM_CONTEXT_BYTES"] = std::to_string(context_);
    env["GPULET_CUDA_SIM_MODULE_BYTES"] = std::to_string(2 * kMiB);
    env.erase("GPULET_CUDA_PASSTHROUGH");
#ifdef GPULET_ASAN_RUNTIME
    // ASan must be the first object of the process: preloaded ahead of the library (itself
    // built with ASan here). With the library first, ASan's own start-up can spin in an
    // interceptor whose real function is not resolved yet (seen: sigaltstack).
    env["LD_PRELOAD"] = std::string(GPULET_ASAN_RUNTIME) + " " + env["LD_PRELOAD"];
#endif
    for (const auto& [k, v] : extra) env[k] = v;
    std::vector<std::string> out;
    for (const auto& [k, v] : env) out.push_back(k + "=" + v);
    return out;
  }

  CommandOutput Probe(std::vector<std::string> args,
                      const std::map<std::string, std::string>& extra = {}) {
    args.insert(args.begin(), BuildDir() + "/bin/memlimit_probe");
    CommandSpec spec;
    spec.argv = args;
    spec.env = Env(extra);
    spec.timeout = std::chrono::seconds(60);
    auto out = RunCommand(spec);
    EXPECT_TRUE(out.ok());
    if (!out.ok()) return {};
    EXPECT_EQ(out->exit_code, 0) << out->out << out->err;
    return *out;
  }

  GpuUsage Usage() {
    Region r;
    EXPECT_EQ(r.Open(acct_, /*read_only=*/true), "");
    return r.is_open() ? r.Usage().at(0) : GpuUsage{};
  }

  // Starts a probe that ends in `hold`; returns its pid once it printed "holding".
  pid_t StartHolder(std::vector<std::string> args, const std::string& log) {
    args.insert(args.begin(), BuildDir() + "/bin/memlimit_probe");
    args.push_back("hold");
    auto pid = SpawnProcess(args, Env(), log);
    EXPECT_TRUE(pid.ok());
    return pid.ok() ? *pid : -1;
  }

  // The log once it holds `text`.
  static std::string WaitFor(const std::string& log, const std::string& text) {
    for (int i = 0; i < 6000; ++i) {  // a bound, not a timing assertion
      std::ifstream f(log);
      std::stringstream ss;
      ss << f.rdbuf();
      if (ss.str().find(text) != std::string::npos) return ss.str();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << log << " never printed " << text;
    return "";
  }
  static std::string WaitHolding(const std::string& log) { return WaitFor(log, "holding"); }

  static void Kill(pid_t pid) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }

  // Runs tests/memlimit/memlimit_model.cc (the library against the driver model) with `args`,
  // GPUs 0 and 1 limited to `limit` each; its last line.
  std::string Model(std::vector<std::string> args, uint64_t limit,
                    std::map<std::string, std::string> extra = {}) {
    const std::vector<GpuLimit> gpus = {{uuid0_, limit, 0}, {uuid1_, limit, 0}};
    EXPECT_EQ(CreateRegion(acct_, gpus, /*replace=*/true), "");
    EXPECT_EQ(WriteLimitsFile(root_ + "/lib/" + kLimitsFileName, gpus, false, Driver()), "");
    args.insert(args.begin(), acct_);
    args.insert(args.begin(), BuildDir() + "/bin/memlimit_model");
    CommandSpec spec;
    spec.argv = args;
    extra["MODEL_LIMIT"] = std::to_string(limit);
    spec.env = Env(extra);
    spec.timeout = std::chrono::seconds(120);
    auto out = RunCommand(spec);
    EXPECT_TRUE(out.ok());
    if (!out.ok()) return "";
    EXPECT_EQ(out->exit_code, 0) << out->out << out->err;
    const std::string text = out->out;
    const size_t end = text.find_last_not_of('\n');
    const size_t start = text.rfind('\n', end);
    return text.substr(
        start == std::string::npos ? 0 : start + 1,
        end == std::string::npos ? 0 : end - (start == std::string::npos ? 0 : start + 1) + 1);
  }

  std::string root_, acct_, uuid0_, uuid1_, fixture_path_;
  uint64_t physical_ = 0;
  uint64_t context_ = 4 * kMiB;
};

TEST_F(MemLimitTest, EveryWayToReachTheDriverIsCounted) {
  for (const std::string via : {"link", "dlsym", "procaddr"}) {
    SCOPED_TRACE(via);
    MakeRegion(64 * kMiB);
    const CommandOutput out = Probe({"--via", via, "init", "fill", "alloc", "1048576", "owners"});
    EXPECT_EQ(Line(out.out, "init")["rc"], "0");
    auto fill = Line(out.out, "fill");
    EXPECT_EQ(fill["last_rc"], "2");  // CUDA_ERROR_OUT_OF_MEMORY
    // The context (measured: 4 MiB) and 60 chunks of 1 MiB fill the 64 MiB exactly.
    EXPECT_EQ(U(fill, "admitted"), 60 * kMiB);
    EXPECT_EQ(Usage().used, 64 * kMiB);
    EXPECT_EQ(Usage().context_bytes, context_);
    auto owners = Line(out.out, "owners");
    EXPECT_EQ(owners["cuMemAlloc_v2"], "libgpulet-cuda.so:cuMemAlloc_v2");
    EXPECT_EQ(owners["cuMemFree_v2"], "libgpulet-cuda.so:cuMemFree_v2");
    EXPECT_EQ(owners["cuArrayCreate_v2"], "libgpulet-cuda.so:cuArrayCreate_v2");
    EXPECT_EQ(owners["cuMemGetInfo_v2"], "libgpulet-cuda.so:cuMemGetInfo_v2");
    EXPECT_EQ(owners["cuLaunchKernel"], "libcuda.so.1:cuLaunchKernel");  // never wrapped
  }
}

TEST_F(MemLimitTest, DlsymRtldNextStaysRelativeToTheCaller) {
#ifdef GPULET_ASAN_RUNTIME
  // ASan preloaded first intercepts dlsym itself, in front of the library, so RTLD_NEXT is
  // resolved relative to ASan's runtime there: this ABI detail is checked by the normal build.
  GTEST_SKIP() << "ASan's own dlsym interceptor stands in front of the library's";
#endif
  MakeRegion(64 * kMiB);
  // Were our dlsym to call libc's (not jump to it), libc would search after our library and
  // find the driver's function; relative to the program, the next one is ours.
  const CommandOutput out = Probe({"rtldnext"});
  EXPECT_EQ(Line(out.out, "rtldnext")["cuMemAlloc_v2"], "libgpulet-cuda.so:cuMemAlloc_v2");
}

TEST_F(MemLimitTest, ProcAddressAsTheCuda13RuntimeDoes) {
  MakeRegion(64 * kMiB);
  const CommandOutput out = Probe({"--via", "procaddr", "init", "owners", "ptsz", "exporttable"});
  EXPECT_GT(U(Line(out.out, "procaddr"), "resolved"), 40u);
  auto owners = Line(out.out, "owners");
  // cuGetProcAddress asked for itself hands out the wrapper; each version gets its own variant.
  EXPECT_EQ(owners["cuGetProcAddress_v2"], "libgpulet-cuda.so:cuGetProcAddress_v2");
  EXPECT_EQ(owners["cuGetProcAddress"], "libgpulet-cuda.so:cuGetProcAddress");
  // The fixture's driver is CUDA 12.4: asked with 13000 it answers its newest, _v3 (v4 is 12.5).
  EXPECT_EQ(owners["cuCtxCreate_v4"], "libgpulet-cuda.so:cuCtxCreate_v3");
  EXPECT_EQ(owners["cuCtxCreate_v3"], "libgpulet-cuda.so:cuCtxCreate_v3");
  EXPECT_EQ(owners["cuCtxCreate_v2"], "libgpulet-cuda.so:cuCtxCreate_v2");
  EXPECT_EQ(owners["cuMemAllocFromPoolAsync"], "libgpulet-cuda.so:cuMemAllocFromPoolAsync");
  EXPECT_EQ(owners["cuDevicePrimaryCtxReset_v2"], "libgpulet-cuda.so:cuDevicePrimaryCtxReset_v2");
  // Unwrapped entry points and the private export tables come from the driver untouched.
  EXPECT_EQ(owners["cuGetExportTable"], "libcuda.so.1:cuGetExportTable");
  EXPECT_EQ(owners["cuDriverGetVersion"], "libcuda.so.1:cuDriverGetVersion");
  EXPECT_EQ(Line(out.out, "exporttable")["driver_table"], "1");
  auto ptsz = Line(out.out, "ptsz");
  EXPECT_EQ(ptsz["rc"], "0");
  EXPECT_EQ(ptsz["cuMemAllocAsync"], "libgpulet-cuda.so:cuMemAllocAsync_ptsz");
  EXPECT_EQ(ptsz["cuGraphUpload"], "libgpulet-cuda.so:cuGraphUpload_ptsz");
  EXPECT_EQ(ptsz["cuGraphInstantiateWithParams"],
            "libgpulet-cuda.so:cuGraphInstantiateWithParams_ptsz");
}

// A CUDA 13 driver answers "cuCtxSynchronize" at 13000 with its _v2 (a context argument), as the
// real H200's driver 580 did in scripts/device-check.sh: the library hands out its own _v2, so a
// synchronize still settles the pools, and says nothing about an unknown variant.
TEST_F(MemLimitTest, ACuda13DriverGetsTheContextSynchronizeVariant) {
  // The fixture with a CUDA 13.0 driver: a copy of this test's own, never the shared one.
  std::string text;
  {
    std::ifstream in(fixture_path_);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto at = text.find("cuda_version: 12040");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, std::strlen("cuda_version: 12040"), "cuda_version: 13000");
  const std::string cuda13 = root_ + "/hgx-h200-cuda13.yaml";
  std::ofstream(cuda13) << text;
  MakeRegion(64 * kMiB);
  const CommandOutput out =
      Probe({"--via", "procaddr", "init", "owners", "sync"}, {{"GPULET_SIM_FIXTURE", cuda13}});
  auto owners = Line(out.out, "owners");
  EXPECT_EQ(owners["cuCtxSynchronize_v2"], "libgpulet-cuda.so:cuCtxSynchronize_v2");
  EXPECT_EQ(owners["cuCtxCreate_v4"], "libgpulet-cuda.so:cuCtxCreate_v4");
  EXPECT_EQ(Line(out.out, "sync")["rc"], "0");
  // (The model's made-up cuMemAllocManaged_v2 still draws its warning: that one is unknown.)
  EXPECT_EQ(out.err.find("cuGetProcAddress(cuCtxSynchronize)"), std::string::npos) << out.err;
}

// Each counted API, past the limit: the first call that does not fit answers OUT_OF_MEMORY, and
// the region holds exactly what was admitted.
TEST_F(MemLimitTest, EveryCountedApiStopsAtTheLimit) {
  struct Case {
    const char* api;
    uint64_t chunk;
  };
  const Case cases[] = {{"alloc", 2 * kMiB},  {"pitch", 2 * kMiB},   {"managed", 2 * kMiB},
                        {"create", 2 * kMiB}, {"async", 2 * kMiB},   {"pool", 2 * kMiB},
                        {"array", 2 * kMiB},  {"array3d", 2 * kMiB}, {"mipmap", 2 * kMiB},
                        {"module", 2 * kMiB}, {"library", 2 * kMiB}, {"context", 4 * kMiB},
                        // issue 36 item 5: the file and fat-binary loaders, green contexts
                        {"modulefile", 2 * kMiB}, {"fatbinary", 2 * kMiB},
                        {"libraryfile", 2 * kMiB}, {"green", 4 * kMiB}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.api);
    MakeRegion(64 * kMiB);
    const CommandOutput out =
        Probe({"init", "fill", c.api, std::to_string(c.chunk), "info", "freeall", "sync", "info"});
    auto fill = Line(out.out, "fill");
    EXPECT_EQ(fill["last_rc"], "2");
    const uint64_t count = U(fill, "count");
    EXPECT_EQ(count * c.chunk, 64 * kMiB - context_);
    auto info = Line(out.out, "info");  // after freeall + sync: only the context is left
    EXPECT_EQ(U(info, "cu_free"), 64 * kMiB - context_);
    EXPECT_EQ(Line(out.out, "freeall")["failures"], "0");
  }
}

TEST_F(MemLimitTest, EightProcessesFourThreadsNeverOverAdmit) {
  const uint64_t limit = 256 * kMiB;
  MakeRegion(limit);
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  const std::string go = root_ + "/go";
  for (int i = 0; i < 8; ++i) {
    logs.push_back(root_ + "/race" + std::to_string(i) + ".log");
    pids.push_back(StartHolder({"init", "wait", go, "race", "4", "alloc", "1048576"}, logs.back()));
  }
  for (const std::string& log : logs) EXPECT_EQ(Line(WaitFor(log, "init rc="), "init")["rc"], "0");
  std::ofstream(go) << "go\n";  // all 32 threads start together
  uint64_t admitted = 0;
  for (const std::string& log : logs) admitted += U(Line(WaitHolding(log), "race"), "admitted");
  // Eight contexts of 4 MiB and 1 MiB chunks: the limit is reached exactly, never passed.
  EXPECT_EQ(admitted + 8 * context_, limit);
  EXPECT_EQ(Usage().used, limit);
  EXPECT_EQ(Usage().peak, limit);
  for (pid_t p : pids) Kill(p);
  Region r;
  ASSERT_EQ(r.Open(acct_), "");
  EXPECT_EQ(r.Reap(), 8);
  EXPECT_EQ(r.Usage().at(0).used, 0u);
}

TEST_F(MemLimitTest, AKilledHoldersMemoryReturns) {
  MakeRegion(64 * kMiB);
  const std::string log = root_ + "/holder.log";
  const pid_t holder = StartHolder({"init", "fill", "alloc", "1048576"}, log);
  EXPECT_EQ(U(Line(WaitHolding(log), "fill"), "admitted"), 60 * kMiB);
  // While it lives, a second process cannot even create its context.
  EXPECT_EQ(Line(Probe({"init"}).out, "init")["rc"], "2");
  Kill(holder);
  // Its share returns: the next process reaps it and gets everything.
  const CommandOutput out = Probe({"init", "fill", "alloc", "1048576"});
  EXPECT_EQ(U(Line(out.out, "fill"), "admitted"), 60 * kMiB);
}

TEST_F(MemLimitTest, LimitBelowTheContextIsACleanOutOfMemory) {
  MakeRegion(2 * kMiB);  // the context takes 4 MiB
  const CommandOutput out = Probe({"init"});
  EXPECT_EQ(Line(out.out, "init")["rc"], "2");
  EXPECT_EQ(Usage().used, 0u);
  // Measured once, it is charged before the driver is asked next time.
  EXPECT_EQ(Usage().context_bytes, context_);
  EXPECT_EQ(Line(Probe({"init"}).out, "init")["rc"], "2");
}

TEST_F(MemLimitTest, MemGetInfoAndNvmlAgree) {
  const uint64_t limit = 1024 * kMiB;
  MakeRegion(limit);
  const CommandOutput out = Probe({"init", "alloc", "alloc", std::to_string(100 * kMiB), "info"});
  auto info = Line(out.out, "info");
  const uint64_t used = context_ + 100 * kMiB;
  EXPECT_EQ(U(info, "cu_total"), limit);
  EXPECT_EQ(U(info, "total_mem"), limit);
  EXPECT_EQ(U(info, "cu_free"), limit - used);
  EXPECT_EQ(U(info, "nvml_total"), limit);
  EXPECT_EQ(U(info, "nvml_free"), limit - used);
  EXPECT_EQ(U(info, "nvml_used"), used);
  EXPECT_EQ(U(info, "nvml2_total"), limit);
  EXPECT_EQ(U(info, "nvml2_free"), limit - used);
  EXPECT_EQ(U(info, "nvml2_used"), used);
  EXPECT_EQ(U(info, "nvml2_reserved"), 0u);
}

TEST_F(MemLimitTest, UsagePastTheLimitReadsZeroFreeNotAnError) {
  MakeRegion(64 * kMiB, context_);
  // Another process of the container holds more than the limit (a size the driver chose after
  // the fact, or a limit lowered under it).
  Region r;
  ASSERT_EQ(r.Open(acct_), "");
  const int me = r.Attach();
  ASSERT_TRUE(r.Admit(me, 0, 100 * kMiB, /*force=*/true));
  const CommandOutput out = Probe({"init", "info"});
  EXPECT_EQ(Line(out.out, "init")["rc"], "2");  // nothing fits, not even a context
  // Without a context cuMemGetInfo has nothing to answer; NVML does, and says full, not -36 MiB.
  auto info = Line(out.out, "info");
  EXPECT_EQ(U(info, "nvml_total"), 64 * kMiB);
  EXPECT_EQ(U(info, "nvml_free"), 0u);
  EXPECT_EQ(U(info, "nvml_used"), 64 * kMiB);
  EXPECT_EQ(U(info, "nvml2_free"), 0u);
}

TEST_F(MemLimitTest, PoolsAreChargedForWhatTheyHold) {
  MakeRegion(64 * kMiB);
  const CommandOutput out =
      Probe({"init", "fill", "async", "2097152", "freeall", "info", "alloc", "async", "2097152",
             "sync", "info", "fill", "pool", "2097152", "freeall", "trim", "info", "sync", "info"});
  // Freed blocks stay in the pool: still charged, and a new block is served from them.
  std::istringstream lines(out.out);
  std::vector<std::map<std::string, std::string>> seen;
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("info ", 0) == 0) seen.push_back(Line(line, "info"));
  }
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(U(seen[0], "cu_free"), 0u);
  EXPECT_EQ(Line(out.out, "alloc")["rc"], "0");
  // A synchronization lets the pool give back what it does not use.
  EXPECT_EQ(U(seen[1], "cu_free"), 64 * kMiB - context_ - 2 * kMiB);
  // An explicit pool trimmed after its blocks were freed gives them back; the default pool still
  // holds the block freed last until the next synchronization.
  EXPECT_EQ(U(seen[2], "cu_free"), 64 * kMiB - context_ - 2 * kMiB);
  EXPECT_EQ(U(seen[3], "cu_free"), 64 * kMiB - context_);
}

TEST_F(MemLimitTest, FailsClosedNamingTheFileAndTheCause) {
  MakeRegion(64 * kMiB);
  acct_ = root_ + "/missing";
  CommandOutput out = Probe({"init"});
  EXPECT_EQ(Line(out.out, "init")["rc"], "3");  // CUDA_ERROR_NOT_INITIALIZED
  EXPECT_NE(out.err.find(root_ + "/missing/memory.region"), std::string::npos) << out.err;
  EXPECT_NE(out.err.find("No such file"), std::string::npos) << out.err;

  // The operator's switch (the limits file's, not the environment's): pass-through, said so.
  ASSERT_EQ(WriteLimitsFile(root_ + "/lib/" + kLimitsFileName, {{uuid0_, 64 * kMiB, 0}},
                            /*passthrough=*/true, Driver()),
            "");
  out = Probe({"init", "alloc", "alloc", std::to_string(512 * kMiB)},
              {{"GPULET_CUDA_PASSTHROUGH", "0"}});
  EXPECT_EQ(Line(out.out, "alloc")["rc"], "0");
  EXPECT_NE(out.err.find("NOT enforced"), std::string::npos) << out.err;
}

TEST_F(MemLimitTest, RefusesARegionOfAnotherLayoutVersion) {
  MakeRegion(64 * kMiB);
  {
    std::fstream f(acct_ + "/memory.region", std::ios::in | std::ios::out | std::ios::binary);
    const uint32_t v = 7;
    f.seekp(8);
    f.write(reinterpret_cast<const char*>(&v), sizeof v);
  }
  const CommandOutput out = Probe({"init"});
  EXPECT_EQ(Line(out.out, "init")["rc"], "3");
  EXPECT_NE(out.err.find("layout version 7"), std::string::npos) << out.err;
}

// ---- issue 24: the library against a driver model written from the Driver API reference ---------
// (testing/cuda_sim). Each run checks after every step that what the region holds is what the
// model's driver holds, and that the driver never holds more than the limit.

// Item 2: thread A frees X, thread B is handed X before A's library records the free.
TEST_F(MemLimitTest, AddressReuseBetweenThreadsKeepsEveryCharge) {
  EXPECT_EQ(Model({"reuse-race"}, 256 * kMiB), "ok reuse-race");
}

// Item 1: create, map, release (vectorAddMMAP): the memory lives while mapped.
TEST_F(MemLimitTest, VmmMemoryIsChargedWhileMapped) {
  const std::string last = Model({"vmm-mapped"}, 256 * kMiB);
  EXPECT_EQ(last.rfind("ok vmm-mapped", 0), 0u) << last;
}

TEST_F(MemLimitTest, VmmMemoryIsChargedWhileRetained) {
  EXPECT_EQ(Model({"vmm-retain"}, 256 * kMiB), "ok vmm-retain");
}

TEST_F(MemLimitTest, VmmMemoryIsChargedWhileImported) {
  EXPECT_EQ(Model({"vmm-import"}, 256 * kMiB), "ok vmm-import");
}

// Item 3: stream capture of cuMemAllocAsync, graph launches, trim, and an oversized graph.
TEST_F(MemLimitTest, GraphMemoryIsChargedWhenTheGraphRuns) {
  EXPECT_EQ(Model({"graph"}, 256 * kMiB), "ok graph");
}

// Item 4: a neighbour allocating 10 GiB during a module load, 1 GiB while the context is measured.
TEST_F(MemLimitTest, ANeighbourCannotSkewAModuleSize) {
  EXPECT_EQ(Model({"neighbour-module"}, 256 * kMiB), "ok neighbour-module");
}
TEST_F(MemLimitTest, ANeighbourCannotSkewTheContextSize) {
  EXPECT_EQ(Model({"neighbour-context"}, 256 * kMiB),
            "ok neighbour-context context_bytes=" + std::to_string(context_));
}

// Item 5: the stream's device, the driver's array sizes, an unknown variant passed through.
TEST_F(MemLimitTest, AsyncAllocationOnAnotherDevicesStreamChargesThatDevice) {
  EXPECT_EQ(Model({"stream-device"}, 256 * kMiB), "ok stream-device");
}
TEST_F(MemLimitTest, ArraysAreChargedTheDriversSize) {
  EXPECT_EQ(Model({"arrays"}, 256 * kMiB), "ok arrays");
}
TEST_F(MemLimitTest, AnUnknownVariantIsPassedThroughUntouched) {
  EXPECT_EQ(Model({"procaddr"}, 256 * kMiB), "ok procaddr");
}

// A pool destroyed with blocks out keeps its memory until the last block is freed.
TEST_F(MemLimitTest, APoolDestroyedWithBlocksOutStaysChargedUntilTheLastIsFreed) {
  EXPECT_EQ(Model({"pool-destroyed"}, 256 * kMiB), "ok pool-destroyed");
}

// Item 6: eight threads retaining the primary context at once charge it once.
TEST_F(MemLimitTest, ConcurrentPrimaryRetainsChargeOnce) {
  EXPECT_EQ(Model({"retain-race"}, 256 * kMiB), "ok retain-race");
}

// Item 6: exec keeps pid and start time; the image before exec held a context and 8 MiB, which
// the driver freed with it: the new image is charged its own context only.
TEST_F(MemLimitTest, ExecReleasesTheEarlierImagesCharges) {
  MakeRegion(64 * kMiB);
  const CommandOutput out =
      Probe({"init", "alloc", "alloc", std::to_string(8 * kMiB), "exec", "init", "info"});
  EXPECT_EQ(U(Line(out.out, "info"), "cu_free"), 64 * kMiB - context_) << out.out;
}

// ---- issue 36 -----------------------------------------------------------------------------------

// Item 1: cuInit and cuMemAlloc_v2 looked up with dlsym(RTLD_DEFAULT) (our own exports) and a
// tenant library's no-op cuMemFree_v2 looked up first: the table still holds the driver's.
TEST_F(MemLimitTest, TheDriversFunctionsComeFromTheDriverWhoeverAsksFirst) {
  EXPECT_EQ(Model({"driver-first"}, 64 * kMiB,
                  {{"MODEL_POISON", BuildDir() + "/testlib/libmemlimit_poison.so"}}),
            "ok driver-first");
}

// Item 1, as an honest program: cuInit and cuMemAlloc_v2 found in the global scope work (on
// d05f651 cuInit called itself until killed, and the allocation was refused).
TEST_F(MemLimitTest, AProgramThatFindsTheDriverInTheGlobalScopeWorks) {
  MakeRegion(64 * kMiB);
  const CommandOutput out = Probe({"init", "rtlddefault", "1048576"});
  EXPECT_EQ(Line(out.out, "rtlddefault")["init_rc"], "0") << out.out;
  EXPECT_EQ(Line(out.out, "rtlddefault")["alloc_rc"], "0") << out.out;
  EXPECT_EQ(Usage().used, context_ + kMiB);
}

// Item 2: no context current: refused with the driver's answer, never passed uncounted.
TEST_F(MemLimitTest, WithoutAContextNothingPassesUncounted) {
  EXPECT_EQ(Model({"library-no-context"}, 64 * kMiB), "ok library-no-context");
}

// Item 3: neither GPULET_CUDA_DRIVER_LIBRARY in the process environment nor an LD_LIBRARY_PATH
// that puts a copy of libcuda.so.1 first (the program itself then links the copy) picks the
// driver the library calls: the limits file's driver does the work and holds what is charged.
TEST_F(MemLimitTest, TheTenantDoesNotPickTheDriver) {
  const std::string tenant = root_ + "/tenant";
  std::filesystem::create_directories(tenant);
  std::filesystem::copy_file(Driver(), tenant + "/libcuda.so.1");
  const std::map<std::string, std::string> ways[] = {
      {{"GPULET_CUDA_DRIVER_LIBRARY", tenant + "/libcuda.so.1"}},
      {{"LD_LIBRARY_PATH", tenant + ":" + BuildDir() + "/sim"}}};
  for (const auto& env : ways) {
    SCOPED_TRACE(env.begin()->first);
    MakeRegion(64 * kMiB);
    const CommandOutput out = Probe({"init", "alloc", "alloc", "1048576", "drivers"}, env);
    auto drivers = Line(out.out, "drivers");
    // The node's driver did the work (it holds the context at least) and holds exactly what the
    // region charges; the copy, where the program loaded it, holds nothing.
    EXPECT_GE(U(drivers, Driver()), context_) << out.out;
    EXPECT_EQ(Usage().used, U(drivers, Driver())) << out.out;
    if (drivers.count(tenant + "/libcuda.so.1") != 0) {
      EXPECT_EQ(drivers[tenant + "/libcuda.so.1"], "0") << out.out;
    }
    if (env.count("GPULET_CUDA_DRIVER_LIBRARY") != 0) {
      // An honest program with the variable set works as without it.
      EXPECT_EQ(Line(out.out, "alloc")["rc"], "0") << out.out << out.err;
      EXPECT_EQ(Usage().used, context_ + kMiB);
    }
    // (With the copy linked, the calls the library does not wrap, cuCtxSetCurrent among them, go
    // to the copy, which was never initialized: such a program fails, it does not escape.)
  }
}

// Item 5: the device malloc heap, printf FIFO and stack that cuCtxSetLimit reserves.
TEST_F(MemLimitTest, ContextLimitReservationsAreCharged) {
  EXPECT_EQ(Model({"ctx-limits"}, 128 * kMiB), "ok ctx-limits");
}

// Item 6: memory exported as a POSIX descriptor stays charged until the descriptor is closed.
TEST_F(MemLimitTest, VmmMemoryIsChargedWhileItsExportedDescriptorIsOpen) {
  EXPECT_EQ(Model({"vmm-exported"}, 256 * kMiB), "ok vmm-exported");
}

// The differential run: 100,000 random steps (allocations, frees, pools, VMM, arrays, modules,
// graph capture and launch, threads, fork). The seed is printed (and in any failure).
TEST_F(MemLimitTest, DifferentialAgainstTheDriverModel) {
  const char* fixed = std::getenv("GPULET_MODEL_SEED");
  const uint64_t seed = fixed != nullptr ? std::strtoull(fixed, nullptr, 10)
                                         : static_cast<uint64_t>(::time(nullptr)) ^ ::getpid();
  std::printf("differential seed=%llu (GPULET_MODEL_SEED to repeat)\n",
              static_cast<unsigned long long>(seed));
  EXPECT_EQ(Model({"diff", std::to_string(seed), "100000"}, 512 * kMiB),
            "ok diff seed=" + std::to_string(seed) + " steps=100000");
}

// The simulated driver as a container sees it (GPULET_SIM_DEVICE_NODES: the container's /dev, as
// the real-cluster tier's stand-in CDI spec sets it): only the GPUs whose device node is there,
// renumbered from 0, as the real driver enumerates only the GPUs a container was given.
TEST_F(MemLimitTest, TheSimulatedDriverSeesOnlyTheGpusWhoseDeviceNodesExist) {
  MakeRegion(64 * kMiB);
  const std::string dev = root_ + "/dev";
  std::filesystem::create_directories(dev);
  std::ofstream(dev + "/nvidia0") << "";
  const std::map<std::string, std::string> env = {{"GPULET_SIM_DEVICE_NODES", dev}};
  // The driver alone (the library would refuse device 1 first: it has no limit for that GPU).
  std::map<std::string, std::string> bare = env;
  bare["LD_PRELOAD"] = "";
  EXPECT_EQ(Line(Probe({"--device", "1", "init"}, {{"LD_PRELOAD", ""}}).out, "init")["rc"], "0");
  EXPECT_EQ(Line(Probe({"--device", "1", "init"}, bare).out, "init")["rc"], "101");  // INVALID_DEVICE
  const CommandOutput out = Probe({"--device", "0", "init", "fill", "alloc", "1048576"}, env);
  EXPECT_EQ(Line(out.out, "init")["rc"], "0");
  EXPECT_EQ(U(Line(out.out, "fill"), "admitted"), 60 * kMiB);  // its GPU 0 is the fixture's GPU 0
}

}  // namespace
}  // namespace gpulet::cudashim
