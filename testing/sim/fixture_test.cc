#include "sim/fixture.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "gpu/nvml_api.h"
#include "sim/simulation.h"

namespace gpulet::sim {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

Fixture MustLoad(const std::string& name) {
  Result<std::string> path = ResolveFixture(name);
  EXPECT_TRUE(path.ok()) << path.status().message();
  Result<Fixture> f = LoadFixture(path.ok() ? *path : name);
  EXPECT_TRUE(f.ok()) << f.status().message();
  return f.ok() ? *f : Fixture{};
}

TEST(FixtureTest, EveryBuiltinFixtureLoads) {
  std::vector<std::string> names = BuiltinFixtureNames();
  EXPECT_THAT(names, ::testing::IsSupersetOf(
                         {"dgx-a100", "dgx-h100", "hgx-h200", "l4-pcie", "synthetic-64"}));
  for (const auto& name : names) {
    Fixture f = MustLoad(name);
    EXPECT_FALSE(f.gpus.empty()) << name;
    EXPECT_EQ(f.driver_version, "550.54.15") << name;
    EXPECT_EQ(f.CudaVersionString(), "12.4") << name;
  }
}

TEST(FixtureTest, DgxH100HasEightHoppersWithNv18BetweenEveryPair) {
  Fixture f = MustLoad("dgx-h100");
  ASSERT_EQ(f.gpus.size(), 8u);
  for (const auto& g : f.gpus) {
    EXPECT_EQ(g.name, "NVIDIA H100 80GB HBM3");
    EXPECT_EQ(g.memory_mib, 81559u);
    EXPECT_EQ(g.cc_major, 9);
    EXPECT_EQ(g.architecture, "hopper");
    EXPECT_EQ(g.sm_count, 132u);
    EXPECT_EQ(g.numa, g.index < 4 ? 0 : 1);
    EXPECT_EQ(g.minor, g.index);
    for (const auto& peer : f.gpus) {
      EXPECT_EQ(f.nvlinks[g.index][peer.index], g.index == peer.index ? 0u : 18u);
    }
    EXPECT_TRUE(f.NvlinkPeers(g.index).empty()) << "links go to NVSwitches, not to peers";
  }
  EXPECT_EQ(f.nvswitch_links, 18u);
  EXPECT_EQ(f.gpus[0].NvmlBusId(), "00000000:18:00.0");
  EXPECT_EQ(f.gpus[7].NvmlBusId(), "00000000:DB:00.0");
  EXPECT_EQ(f.gpus[7].SysfsBusId(), "0000:db:00.0");
  EXPECT_EQ(f.numa_cpus.at(1), "56-111,168-223");
}

TEST(FixtureTest, DgxA100MigGeometryUsesRealProfileFacts) {
  Fixture f = MustLoad("dgx-a100");
  ASSERT_EQ(f.gpus.size(), 8u);
  const auto& g0 = f.gpus[0];
  ASSERT_EQ(g0.mig.size(), 4u);
  EXPECT_EQ(g0.mig[0].profile, "3g.20gb");
  EXPECT_EQ(g0.mig[0].gi, 2u);
  EXPECT_EQ(g0.mig[0].facts.slices, 3u);
  EXPECT_EQ(g0.mig[0].facts.memory_mb, 19968u);
  EXPECT_EQ(g0.mig[0].facts.sms, 42u);
  EXPECT_EQ(g0.mig[3].facts.memory_mb, 4864u);
  ASSERT_EQ(f.gpus[1].mig.size(), 7u);
  for (unsigned i = 0; i < 7; ++i) EXPECT_EQ(f.gpus[1].mig[i].gi, 7 + i);
  EXPECT_FALSE(f.gpus[2].mig_enabled());
  EXPECT_TRUE(f.gpus[2].mig_capable);
  EXPECT_EQ(f.nvlinks[0][5], 12u);
  EXPECT_EQ(f.gpus[0].pcie_switch, f.gpus[1].pcie_switch);
  EXPECT_NE(f.gpus[1].pcie_switch, f.gpus[2].pcie_switch);
}

TEST(FixtureTest, L4HasNoNvlinkAndTwoGpusPerSwitch) {
  Fixture f = MustLoad("l4-pcie");
  ASSERT_EQ(f.gpus.size(), 4u);
  for (const auto& g : f.gpus) {
    EXPECT_TRUE(f.NvlinkPeers(g.index).empty());
    EXPECT_FALSE(g.mig_capable);
    EXPECT_EQ(g.memory_mib, 23034u);
    EXPECT_EQ(g.pcie_switch, static_cast<int>(g.index / 2));
  }
}

TEST(FixtureTest, DirectNvlinkPairsAreSymmetricAndLinkOrdered) {
  Result<Fixture> f = ParseFixture(
      "driver_version: 1\ncuda_version: 12040\n"
      "defaults: {name: X, memory_mib: 1, compute_capability: \"8.0\", architecture: ampere}\n"
      "gpus: [{bus_id: \"0000:01:00.0\"}, {bus_id: \"0000:02:00.0\"}, {bus_id: \"0000:03:00.0\"}]\n"
      "nvlink: {pairs: [[0, 1, 4], [2, 0, 2]]}\n",
      "pairs.yaml");
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->nvlinks[1][0], 4u);
  EXPECT_EQ(f->nvlinks[0][2], 2u);
  EXPECT_EQ(f->nvlinks[1][2], 0u);
  EXPECT_EQ(f->NvlinkPeers(0), (std::vector<unsigned>{1, 1, 1, 1, 2, 2}));
  EXPECT_EQ(f->NvlinkPeers(1), (std::vector<unsigned>{0, 0, 0, 0}));
}

TEST(FixtureTest, CountGeneratesDistinctGpus) {
  Fixture f = MustLoad("synthetic-64");
  ASSERT_EQ(f.gpus.size(), 64u);
  std::set<std::string> buses, uuids;
  for (const auto& g : f.gpus) {
    buses.insert(g.NvmlBusId());
    uuids.insert(g.uuid);
  }
  EXPECT_EQ(buses.size(), 64u);
  EXPECT_EQ(uuids.size(), 64u);
  EXPECT_EQ(f.gpus[63].numa, 3);
}

TEST(FixtureTest, GeneratedUuidsAreStableAndWellFormed) {
  Fixture a = MustLoad("dgx-a100");
  Fixture b = MustLoad("dgx-a100");
  const std::regex gpu_re("GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}");
  const std::regex mig_re("MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}");
  std::set<std::string> all;
  for (size_t i = 0; i < a.gpus.size(); ++i) {
    EXPECT_EQ(a.gpus[i].uuid, b.gpus[i].uuid);
    EXPECT_TRUE(std::regex_match(a.gpus[i].uuid, gpu_re)) << a.gpus[i].uuid;
    all.insert(a.gpus[i].uuid);
    for (size_t m = 0; m < a.gpus[i].mig.size(); ++m) {
      EXPECT_EQ(a.gpus[i].mig[m].uuid, b.gpus[i].mig[m].uuid);
      EXPECT_TRUE(std::regex_match(a.gpus[i].mig[m].uuid, mig_re)) << a.gpus[i].mig[m].uuid;
      all.insert(a.gpus[i].mig[m].uuid);
    }
  }
  EXPECT_EQ(all.size(), 8u + 11u);
  // Another fixture name gives other UUIDs.
  EXPECT_NE(MustLoad("dgx-h100").gpus[0].uuid, a.gpus[0].uuid);
}

TEST(FixtureTest, InitErrorAcceptsDriverNames) {
  Result<Fixture> f = ParseFixture(
      "driver_version: 1\ncuda_version: 12040\ninit_error: NVML_ERROR_DRIVER_NOT_LOADED\n"
      "gpus: []\n",
      "inline.yaml");
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->init_error, NVML_ERROR_DRIVER_NOT_LOADED);
}

// Each file in testdata/bad starts with "# expect: <message>"; the error must contain it.
TEST(FixtureTest, BadFixturesNameFileLineAndField) {
  const fs::path dir = fs::path(GPULET_SOURCE_DIR) / "testing/sim/testdata/bad";
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::ifstream in(entry.path());
    std::string first;
    std::getline(in, first);
    const std::string marker = "# expect: ";
    ASSERT_EQ(first.rfind(marker, 0), 0u) << entry.path() << " lacks an expect line";
    const std::string expected = first.substr(marker.size());
    Result<Fixture> f = LoadFixture(entry.path().string());
    ASSERT_FALSE(f.ok()) << entry.path() << " loaded";
    EXPECT_EQ(f.status().code(), ErrorCode::kInvalidInput) << entry.path();
    EXPECT_THAT(f.status().message(), HasSubstr(expected)) << entry.path();
    EXPECT_THAT(f.status().message(), HasSubstr(entry.path().string())) << "names the file";
    ++checked;
  }
  EXPECT_GE(checked, 15);
}

TEST(FixtureTest, ProcessesPerGpu) {
  Result<Fixture> f = ParseFixture(
      "driver_version: 550.54.15\ncuda_version: 12040\n"
      "defaults: {name: NVIDIA L4, memory_mib: 23034, compute_capability: \"8.9\", "
      "architecture: ada}\n"
      "gpus:\n"
      "  - bus_id: \"0000:18:00.0\"\n"
      "    processes: [{pid: 4242, memory_mib: 2048, sm_util: 30, mem_util: 10}, {pid: 7}]\n"
      "  - {bus_id: \"0000:19:00.0\"}\n",
      "procs.yaml");
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_EQ(f->gpus[0].processes.size(), 2u);
  EXPECT_EQ(f->gpus[0].processes[0], (SimProcess{4242, 2048, 30, 10, 0xFFFFFFFFu, 0xFFFFFFFFu}));
  EXPECT_EQ(f->gpus[0].processes[1].pid, 7u);
  EXPECT_TRUE(f->gpus[1].processes.empty());
  Result<Fixture> bad = ParseFixture(
      "driver_version: 550.54.15\ncuda_version: 12040\n"
      "defaults: {name: NVIDIA L4, memory_mib: 23034, compute_capability: \"8.9\", "
      "architecture: ada}\n"
      "gpus:\n  - {bus_id: \"0000:18:00.0\", processes: [{pid: 1, sm_util: 101}]}\n",
      "procs.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("procs.yaml:5: gpus[0].processes[0].sm_util"));
}

TEST(FixtureTest, MissingFileIsNotFound) {
  Result<Fixture> f = LoadFixture("/nonexistent/gpulet/fixture.yaml");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), ErrorCode::kNotFound);
}

TEST(FixtureTest, UnknownBuiltinNameListsKnownNames) {
  Result<std::string> p = ResolveFixture("dgx-z900");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), ErrorCode::kNotFound);
  EXPECT_THAT(p.status().message(), HasSubstr("dgx-z900"));
  EXPECT_THAT(p.status().message(), HasSubstr("dgx-h100"));
  EXPECT_THAT(p.status().message(), HasSubstr("l4-pcie"));
}

TEST(VisibleDevicesTest, UnsetOrAllMeansEverything) {
  Fixture f = MustLoad("dgx-a100");
  for (const char* spec : {"", "all"}) {
    Result<std::optional<VisibleDevices>> v = ParseVisibleDevices(f, spec);
    ASSERT_TRUE(v.ok()) << v.status().message();
    EXPECT_FALSE(v->has_value()) << spec;
  }
  Result<std::optional<VisibleDevices>> none = ParseVisibleDevices(f, "none");
  ASSERT_TRUE(none.ok() && none->has_value());
  EXPECT_TRUE((*none)->gpus.empty());
}

TEST(VisibleDevicesTest, IndexesUuidsAndMigDevicesInPciOrder) {
  Fixture f = MustLoad("dgx-a100");
  Result<std::optional<VisibleDevices>> v =
      ParseVisibleDevices(f, "5," + f.gpus[3].uuid + "," + f.gpus[0].mig[2].uuid + ",1:6");
  ASSERT_TRUE(v.ok()) << v.status().message();
  ASSERT_TRUE(v->has_value());
  const VisibleDevices& d = **v;
  EXPECT_EQ(d.gpus, (std::vector<unsigned>{0, 1, 3, 5}));
  EXPECT_TRUE(d.MigVisible(0, f.gpus[0].mig[2].uuid));
  EXPECT_FALSE(d.MigVisible(0, f.gpus[0].mig[0].uuid));
  EXPECT_TRUE(d.MigVisible(1, f.gpus[1].mig[6].uuid));
  EXPECT_FALSE(d.MigVisible(1, f.gpus[1].mig[0].uuid));
}

TEST(VisibleDevicesTest, WholeGpuShowsAllOfItsMigDevices) {
  Fixture f = MustLoad("dgx-a100");
  Result<std::optional<VisibleDevices>> v = ParseVisibleDevices(f, f.gpus[0].mig[1].uuid + ",0");
  ASSERT_TRUE(v.ok() && v->has_value());
  EXPECT_TRUE((*v)->MigVisible(0, f.gpus[0].mig[3].uuid));
}

TEST(VisibleDevicesTest, UnknownEntryIsNamed) {
  Fixture f = MustLoad("dgx-a100");
  for (const char* bad : {"8", "GPU-nope", "MIG-nope", "2:0", "x"}) {
    Result<std::optional<VisibleDevices>> v = ParseVisibleDevices(f, std::string("0,") + bad);
    ASSERT_FALSE(v.ok()) << bad;
    EXPECT_THAT(v.status().message(), HasSubstr(std::string("\"") + bad + "\"")) << bad;
  }
}

}  // namespace
}  // namespace gpulet::sim
