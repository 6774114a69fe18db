// `gpulet exporter` as a process on simulated nodes: exposition structure per fixture (golden),
// the upstream counters file, XID injection, GPU loss, counters reload, bad input.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "process.h"
#include "support/require.h"

namespace gpulet::testing {
namespace {

std::string SourceDir() { return GPULET_SOURCE_DIR; }

// Sample values replaced by "V": telemetry moves, structure and labels must not.
std::string MaskValues(const std::string& text) {
  std::string out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] != '#') {
      const size_t sp = line.rfind(' ');
      if (sp != std::string::npos) line = line.substr(0, sp) + " V";
    }
    out += line + "\n";
  }
  return out;
}

class ExporterProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("gpulet-exporter-test");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override {
    exporter_.Stop();
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  std::vector<std::string> Global(const std::string& fixture) const {
    return {Gpulet(), "--simulate", fixture, "--sim-state", dir_ + "/sim-" + fixture};
  }
  std::string Sim(const std::string& fixture, const std::string& verb) const {
    return Gpulet() + " --simulate " + fixture + " --sim-state " + dir_ + "/sim-" + fixture +
           " sim " + verb;
  }
  // Starts the exporter and waits until /health answers 200.
  void StartExporter(const std::string& fixture, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = Global(fixture);
    for (const char* a : {"exporter", "--hostname", "node-a", "-c", "200", "-a", "127.0.0.1:0"}) {
      argv.push_back(a);
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    ASSERT_TRUE(exporter_.Start(argv, dir_ + "/exporter.log"));
    ASSERT_NE(WaitServing(exporter_), 0) << exporter_.log();
  }
  // Where the exporter listens now: it binds 127.0.0.1:0 again when it restarts (a new inventory).
  int Port() { return ListeningPort(exporter_.pid()); }
  std::string Metrics() { return HttpGet(Port(), "/metrics"); }

  std::string dir_;
  Child exporter_;
};

class GoldenTest : public ExporterProcess, public ::testing::WithParamInterface<const char*> {};

TEST_P(GoldenTest, ExpositionMatchesGolden) {
  const std::string fixture = GetParam();
  StartExporter(fixture);
  const std::string got = MaskValues(Metrics());
  const std::string golden = SourceDir() + "/tests/metrics/golden/" + fixture + ".prom";
  if (getenv("GPULET_UPDATE_GOLDEN") != nullptr) {
    std::ofstream(golden) << got;
    GTEST_SKIP() << "golden written: " << golden;
  }
  EXPECT_EQ(got, ReadFile(golden)) << "regenerate with GPULET_UPDATE_GOLDEN=1 after reviewing";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest,
                         ::testing::Values("dgx-h100", "dgx-a100", "hgx-h200", "l4-pcie"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// Structure rules every fixture's exposition must follow (independently of the goldens).
TEST_F(ExporterProcess, ExpositionStructureOnDgxH100) {
  StartExporter("dgx-h100");
  const std::string text = Metrics();
  std::istringstream in(text);
  std::string line, family;
  std::set<std::string> helped, typed;
  const std::regex sample(
      R"re(^([A-Za-z_:][A-Za-z0-9_:]*)\{gpu="(\d+)",UUID="GPU-[^"]+",pci_bus_id="[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-9]",device="nvidia\d+",modelName="[^"]+",Hostname="node-a"(,DCGM_FI_DRIVER_VERSION="[^"]+")?(,err_code="\d+",err_msg="[^"]+")?\} (-?[0-9.]+)$)re");
  std::map<std::string, std::set<std::string>> gpus_per_family;
  while (std::getline(in, line)) {
    if (line.rfind("# HELP ", 0) == 0) {
      family = line.substr(7, line.find(' ', 7) - 7);
      helped.insert(family);
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      typed.insert(line.substr(7, line.find(' ', 7) - 7));
      continue;
    }
    if (line.rfind("gpulet_simulated_driver", 0) == 0) {
      // The node-wide marker: no GPU labels, 1 on the simulated driver.
      EXPECT_EQ(line, "gpulet_simulated_driver{Hostname=\"node-a\"} 1");
      continue;
    }
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, sample)) << line;
    EXPECT_EQ(m[1].str(), family) << "sample outside its family: " << line;
    EXPECT_TRUE(helped.count(m[1].str()) && typed.count(m[1].str()));
    gpus_per_family[m[1].str()].insert(m[2].str());
  }
  EXPECT_EQ(helped, typed);
  for (const char* f : {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL",
                        "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_XID_ERRORS", "gpulet_gpu_up"}) {
    EXPECT_EQ(gpus_per_family[f].size(), 8u) << f;
  }
  EXPECT_NE(text.find("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"), std::string::npos);
  // OpenMetrics on request.
  int status = 0;
  const std::string om = HttpGet(Port(), "/metrics", &status,
                                 {{"Accept", "application/openmetrics-text; version=1.0.0"}});
  EXPECT_EQ(status, 200);
  EXPECT_EQ(om.substr(om.size() - 6), "# EOF\n");
}

TEST_F(ExporterProcess, UpstreamCountersFileLoadsUnchanged) {
  const std::string csv = SourceDir() + "/../shared/upstream/dcgm-exporter/default-counters.csv";
  GPULET_REQUIRE_SHARED(csv);
  StartExporter("dgx-h100", {"-f", csv});
  const std::string text = Metrics();
  for (const char* f :
       {"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
        "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED"}) {
    EXPECT_NE(text.find(std::string("\n") + f + "{gpu=\"7\""), std::string::npos) << f;
  }
  EXPECT_NE(text.find(",DCGM_FI_DRIVER_VERSION=\""), std::string::npos);
  // Rows gpulet cannot read were skipped, one log line each, naming file:line.
  EXPECT_NE(exporter_.log().find("default-counters.csv:69: DCGM_FI_DEV_VGPU_LICENSE_STATUS"),
            std::string::npos)
      << exporter_.log();
  // What dcgm-exporter reads beyond the basic queries is there too: memory temperature (field
  // values), reserved framebuffer (memory info v2), and on Hopper the GPM profiling ratios, from
  // the second collection on.
  for (const char* f : {"DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_FB_RESERVED",
                        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                        "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES"}) {
    const std::string series = std::string("\n") + f + "{gpu=\"0\"";
    EXPECT_TRUE(WaitFor([&] { return Metrics().find(series) != std::string::npos; })) << f;
  }
}

TEST_F(ExporterProcess, InjectedXidShowsUp) {
  StartExporter("dgx-h100");
  EXPECT_NE(Metrics().find("DCGM_FI_DEV_XID_ERRORS{gpu=\"3\""), std::string::npos);
  std::string out;
  ASSERT_EQ(RunShell(Sim("dgx-h100", "xid --gpu 3 --code 79"), &out), 0) << out;
  std::string text;
  ASSERT_TRUE(WaitFor([&] {
    text = Metrics();
    return text.find("err_code=\"79\",err_msg=\"GPU has fallen off the bus\"} 79\n") !=
           std::string::npos;
  })) << text
      << exporter_.log();
  const size_t at = text.find("err_code=\"79\"");
  const size_t line = text.rfind('\n', at);
  EXPECT_EQ(text.substr(line + 1, 33), "DCGM_FI_DEV_XID_ERRORS{gpu=\"3\",UU");
  // Other GPUs still report no XID.
  EXPECT_NE(text.find("device=\"nvidia2\",modelName"), std::string::npos);
}

// A standalone exporter re-discovers the node as the plugin does: after a MIG re-layout (GPU 1
// of dgx-a100 from 7 x 1g.5gb to 2 x 3g.20gb) its series follow the new devices without a restart.
TEST_F(ExporterProcess, FollowsAMigRelayoutWithoutRestart) {
  StartExporter("dgx-a100", {"--rescan-interval", "200ms"});
  const std::regex small("\nDCGM_FI_DEV_FB_USED\\{gpu=\"1\",[^\\n]*GPU_I_PROFILE=\"1g\\.5gb\"");
  const std::regex big("\nDCGM_FI_DEV_FB_USED\\{gpu=\"1\",[^\\n]*GPU_I_PROFILE=\"3g\\.20gb\"");
  auto count = [&](const std::regex& re) {
    const std::string m = Metrics();
    return std::distance(std::sregex_iterator(m.begin(), m.end(), re), std::sregex_iterator());
  };
  ASSERT_EQ(count(small), 7) << Metrics();
  const std::string mig = dir_ + "/mig.yaml";
  std::ofstream(mig) << "version: v1\nmig-configs:\n  two-big:\n    - devices: [1]\n"
                        "      mig-enabled: true\n      mig-devices: {\"3g.20gb\": 2}\n";
  std::string apply;
  for (const std::string& a : Global("dgx-a100")) apply += a + " ";
  std::string out;
  ASSERT_EQ(RunShell(apply + "mig apply -f " + mig + " -c two-big", &out), 0) << out;
  EXPECT_TRUE(
      WaitFor([&] { return count(big) == 2 && count(small) == 0; }, std::chrono::seconds(60)))
      << Metrics() << exporter_.log();
}

TEST_F(ExporterProcess, LostGpuIsMarkedOthersStayAndItComesBack) {
  StartExporter("dgx-h100");
  std::string out;
  ASSERT_EQ(RunShell(Sim("dgx-h100", "lose --gpu 2"), &out), 0) << out;
  std::string text;
  ASSERT_TRUE(WaitFor([&] {
    text = Metrics();
    return text.find(
               "device=\"nvidia2\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-a\"} 0\n") !=
           std::string::npos;
  })) << text;
  EXPECT_EQ(text.find("DCGM_FI_DEV_GPU_TEMP{gpu=\"2\""), std::string::npos);
  for (int g : {0, 1, 3, 4, 5, 6, 7}) {
    EXPECT_NE(text.find("DCGM_FI_DEV_GPU_TEMP{gpu=\"" + std::to_string(g) + "\""),
              std::string::npos)
        << g;
  }
  ASSERT_EQ(RunShell(Sim("dgx-h100", "restore --gpu 2"), &out), 0) << out;
  ASSERT_TRUE(WaitFor(
      [&] { return Metrics().find("DCGM_FI_DEV_GPU_TEMP{gpu=\"2\"") != std::string::npos; }));
  EXPECT_NE(exporter_.log().find("event=gpu_lost gpu=2"), std::string::npos);
}

TEST_F(ExporterProcess, CountersReloadOnChangeAndSighupWithoutGap) {
  const std::string csv = dir_ + "/counters.csv";
  std::ofstream(csv) << "DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n";
  StartExporter("l4-pcie", {"-f", csv});
  EXPECT_EQ(Metrics().find("DCGM_FI_DEV_POWER_USAGE"), std::string::npos);

  // Rewritten file: picked up by the change watch. Every scrape meanwhile is complete.
  std::ofstream(csv + ".new") << "DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n"
                                 "DCGM_FI_DEV_POWER_USAGE, gauge, Power draw (in W).\n";
  std::filesystem::rename(csv + ".new", csv);
  bool gap = false;
  ASSERT_TRUE(WaitFor([&] {
    int status = 0;
    const std::string t = HttpGet(Port(), "/metrics", &status);
    if (status != 200 || t.find("DCGM_FI_DEV_GPU_TEMP{") == std::string::npos) gap = true;
    return t.find("DCGM_FI_DEV_POWER_USAGE{") != std::string::npos;
  })) << exporter_.log();
  EXPECT_FALSE(gap);

  // A broken file is refused; the previous counters stay. (A DCGM field gpulet does not collect
  // is only skipped with a warning, as dcgm-exporter's newer fields are; a bad type is an error.)
  std::ofstream(csv + ".new") << "DCGM_FI_DEV_GPU_TEMP, gaugee, typo\n";
  std::filesystem::rename(csv + ".new", csv);
  ASSERT_TRUE(
      WaitFor([&] { return exporter_.log().find("counters_reload_failed") != std::string::npos; }));
  EXPECT_NE(exporter_.log().find("counters.csv:1: DCGM_FI_DEV_GPU_TEMP: unknown type"),
            std::string::npos)
      << exporter_.log();
  EXPECT_NE(Metrics().find("DCGM_FI_DEV_POWER_USAGE{"), std::string::npos);

  // SIGHUP re-reads even when the file looks unchanged to the watch.
  std::ofstream(csv) << "DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).\n";
  exporter_.Signal(SIGHUP);
  ASSERT_TRUE(WaitFor([&] {
    const std::string t = Metrics();
    return t.find("DCGM_FI_DEV_FB_USED{") != std::string::npos &&
           t.find("DCGM_FI_DEV_GPU_TEMP{") == std::string::npos;
  })) << exporter_.log();
}

TEST_F(ExporterProcess, SlurmJobsLabelTheirGpus) {
  // A stand-in for scontrol: `scontrol show job -d -o` as Slurm 22.05 prints it.
  const std::string scontrol = dir_ + "/scontrol";
  std::ofstream(scontrol)
      << "#!/bin/sh\n"
      << "echo 'JobId=41 JobName=train JobState=RUNNING NodeList=node-a NumNodes=1 "
         "JOB_GRES=gpu:2   Nodes=node-a CPU_IDs=0-3 Mem=100 GRES=gpu:2(IDX:0-1) MinCPUsNode=1 '\n"
      << "echo 'JobId=42 JobState=COMPLETED NodeList=node-a JOB_GRES=gpu:1   Nodes=node-a "
         "CPU_IDs=0 Mem=100 GRES=gpu:1(IDX:3) '\n";
  std::filesystem::permissions(scontrol, std::filesystem::perms::owner_all);
  StartExporter("dgx-h100", {"--slurm-node", "node-a", "--scontrol", scontrol,
                             "--slurm-refresh-interval", "200"});
  std::string text;
  ASSERT_TRUE(WaitFor([&] {
    text = Metrics();
    return text.find("DCGM_FI_DEV_GPU_TEMP{gpu=\"1\"") != std::string::npos &&
           text.find("hpc_job=\"41\"} ") != std::string::npos;
  })) << text
      << exporter_.log();
  for (const char* g : {"0", "1"}) {
    const size_t at = text.find(std::string("DCGM_FI_DEV_GPU_TEMP{gpu=\"") + g + "\"");
    ASSERT_NE(at, std::string::npos);
    const std::string line = text.substr(at, text.find('\n', at) - at);
    EXPECT_NE(line.find(",hpc_job=\"41\"} "), std::string::npos) << line;
  }
  const size_t at3 = text.find("DCGM_FI_DEV_GPU_TEMP{gpu=\"3\"");
  EXPECT_EQ(text.substr(at3, text.find('\n', at3) - at3).find("hpc_job"), std::string::npos);
}

TEST_F(ExporterProcess, BadCountersFileFailsNamingTheLine) {
  const std::string csv = dir_ + "/bad.csv";
  std::ofstream(csv) << "# header\nDCGM_FI_DEV_GPU_TEMP, gauge\n";
  std::string out;
  std::vector<std::string> g = Global("l4-pcie");
  std::string cmd;
  for (const auto& a : g) cmd += a + " ";
  const int rc = RunShell(cmd + "exporter -a 127.0.0.1:0 -f " + csv, &out);
  EXPECT_EQ(rc, 3) << out;
  EXPECT_NE(out.find("bad.csv:2: malformed row"), std::string::npos) << out;
}

}  // namespace
}  // namespace gpulet::testing
