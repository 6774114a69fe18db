// BuildSlices and its pieces: the objects' shape (pool, owner, node, layout by kind), the device
// attributes and counters, taints, and the device order that follows the placement policy.
#include "dra/slices.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <map>

#include "dra/names.h"
#include "mig/driver.h"
#include "sim/sim_node.h"

namespace gpulet::dra {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;

TEST(DraSlices, VersionsAndBusIdsInTheApisForms) {
  EXPECT_EQ(SemverOf("550.54.15"), "550.54.15");
  EXPECT_EQ(SemverOf("535.104.05"), "535.104.5");
  EXPECT_EQ(SemverOf("12.4"), "12.4.0");
  EXPECT_EQ(SemverOf("9.0"), "9.0.0");
  EXPECT_EQ(SemverOf("1.2.3.4"), std::nullopt);
  EXPECT_EQ(SemverOf("5x"), std::nullopt);
  EXPECT_EQ(PciBusId("00000000:18:00.0"), "0000:18:00.0");
  EXPECT_EQ(PciBusId("0000:AB:00.0"), "0000:ab:00.0");
  EXPECT_EQ(PciBusId("0001:1f:1e.7"), "0001:1f:1e.7");
}

// Only upstream's extended BDF form (deviceattribute's verifyPCIBDFFormat) becomes a pciBusID.
TEST(DraSlices, ABusIdOutsideTheStandardFormIsNone) {
  for (const char* bad : {"", "18:00.0", "00010000:18:00.0", "0000:18:00", "0000:18:00.0.1",
                          "000:18:00.0", "0000:18-00.0", "0000:g8:00.0", "0000:18:00.10",
                          "00000000:18:00.0 ", "pci0000:00"}) {
    EXPECT_EQ(PciBusId(bad), std::nullopt) << bad;
  }
}

TEST(DraSlices, QuantitiesInTheApisForm) {
  EXPECT_EQ(BytesQuantity(int64_t{81920} << 20), "80Gi");
  EXPECT_EQ(BytesQuantity(int64_t{81559} << 20), "81559Mi");
  EXPECT_EQ(BytesQuantity(1500), "1500");
  EXPECT_EQ(BytesQuantity(int64_t{1} << 30), "1Gi");
}

TEST(DraSlices, PcieRootComesFromTheSysfsLink) {
  std::string tmpl = ::testing::TempDir() + "gpulet-dra-sysfs-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  namespace fs = std::filesystem;
  fs::create_directories(tmpl + "/devices/pci0000:17/0000:17:01.0/0000:18:00.0");
  fs::create_directories(tmpl + "/bus/pci/devices");
  fs::create_directory_symlink("../../../devices/pci0000:17/0000:17:01.0/0000:18:00.0",
                               tmpl + "/bus/pci/devices/0000:18:00.0");
  EXPECT_EQ(PcieRoot(tmpl, "0000:18:00.0"), "pci0000:17");
  EXPECT_EQ(PcieRoot(tmpl, "0000:19:00.0"), std::nullopt);  // no link
  // What upstream's resolvePCIeRoot refuses, refused too: a link that does not end at the device,
  // one outside devices/pci…, an absolute one, one climbing above sysfs, a directory (no link),
  // and a bus id not in the standard form.
  const std::map<std::string, std::string> refused = {
      {"0000:20:00.0", "../../../devices/pci0000:17/0000:17:01.0/0000:21:00.0"},
      {"0000:22:00.0", "../../../devices/platform/0000:22:00.0"},
      {"0000:23:00.0", "/sys/devices/pci0000:17/0000:23:00.0"},
      {"0000:24:00.0", "../../../../../devices/pci0000:17/0000:24:00.0"},
  };
  for (const auto& [bus, target] : refused) {
    fs::create_directory_symlink(target, tmpl + "/bus/pci/devices/" + bus);
    EXPECT_EQ(PcieRoot(tmpl, bus), std::nullopt) << target;
  }
  fs::create_directories(tmpl + "/bus/pci/devices/0000:25:00.0");
  EXPECT_EQ(PcieRoot(tmpl, "0000:25:00.0"), std::nullopt);
  EXPECT_EQ(PcieRoot(tmpl, "0000:18:00.0/../0000:18:00.0"), std::nullopt);
  // A device right under the root bridge, and a second domain.
  fs::create_directory_symlink("../../../devices/pci0001:00/0001:00:02.0",
                               tmpl + "/bus/pci/devices/0001:00:02.0");
  EXPECT_EQ(PcieRoot(tmpl, "0001:00:02.0"), "pci0001:00");
  fs::remove_all(tmpl);
}

TEST(DraSlices, NvlinkDomainsAreConnectedGroups) {
  gpu::Inventory inv;
  for (unsigned i = 0; i < 5; ++i) inv.gpus.push_back(gpu::Gpu{.index = i});
  inv.links.assign(5, std::vector<gpu::Link>(5));
  auto link = [&](unsigned a, unsigned b) { inv.links[a][b].nvlinks = inv.links[b][a].nvlinks = 2; };
  link(1, 3);
  link(3, 4);
  std::vector<std::optional<int64_t>> d = NvlinkDomains(inv);
  EXPECT_THAT(d, ElementsAre(std::nullopt, 1, std::nullopt, 1, 1));
}

TEST(DraSlices, TheBestFitOrderPutsTheFullestGpuThatFitsFirstForShares) {
  gpu::Inventory inv;
  for (unsigned i = 0; i < 4; ++i) inv.gpus.push_back(gpu::Gpu{.index = i});
  inv.links.assign(4, std::vector<gpu::Link>(4));
  Result<std::vector<unsigned>> empty = PolicyGpuOrder(inv, {}, "bestfit", false);
  ASSERT_TRUE(empty.ok());
  EXPECT_THAT(*empty, ElementsAre(0, 1, 2, 3));
  // GPU 2 is 70 % used, GPU 1 30 %, GPU 3 full: shares go to 2, then 1, then the empty ones;
  // the full GPU last.
  Result<std::vector<unsigned>> used = PolicyGpuOrder(inv, {0, 300, 700, 1000}, "bestfit", false);
  ASSERT_TRUE(used.ok());
  EXPECT_THAT(*used, ElementsAre(2, 1, 0, 3));
  // Whole GPUs: only free ones fit (GPU 0), the rest follow in index order.
  Result<std::vector<unsigned>> whole = PolicyGpuOrder(inv, {0, 300, 700, 1000}, "bestfit", true);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->front(), 0u);
  EXPECT_FALSE(PolicyGpuOrder(inv, {}, "no-such-policy", true).ok());
  for (const char* p : {"fgd", "fgd-bestfit", "gpupacking", "dotprod"}) {
    Result<std::vector<unsigned>> o = PolicyGpuOrder(inv, {0, 300, 700, 1000}, p, false);
    ASSERT_TRUE(o.ok()) << p;
    EXPECT_EQ(o->size(), 4u) << p;
  }
}

class DraSlicesOnFixture : public ::testing::Test {
 protected:
  void Load(const std::string& fixture) {
    Result<gpu::testing::SimNode> sim = gpu::testing::OpenSimNode(fixture);
    ASSERT_TRUE(sim.ok()) << sim.status().message();
    Result<gpu::Inventory> inv = gpu::Discover(*sim->nvml, sim->options);
    ASSERT_TRUE(inv.ok()) << inv.status().message();
    inventory_ = *inv;
    Result<std::vector<mig::GpuState>> mig = mig::ReadMigState(*sim->nvml);
    ASSERT_TRUE(mig.ok()) << mig.status().message();
    mig_ = *mig;
    sysfs_ = sim->options.sysfs_root;
  }
  std::vector<json> Build(std::map<std::string, GpuTaint> taints = {}, int64_t gen = 3) {
    SliceInputs in;
    in.inventory = &inventory_;
    in.mig = mig_;
    in.taints = std::move(taints);
    SliceOptions o;
    o.node_name = "node-a";
    o.node_uid = "uid-1";
    o.sysfs_root = sysfs_;
    Result<std::vector<json>> s = BuildSlices(in, o, gen);
    EXPECT_TRUE(s.ok()) << s.status().message();
    return s.ok() ? *s : std::vector<json>{};
  }
  static const json* Find(const std::vector<json>& slices, const std::string& device) {
    for (const json& s : slices) {
      if (!s["spec"].contains("devices")) continue;
      for (const json& d : s["spec"]["devices"]) {
        if (d["name"] == device) return &d;
      }
    }
    return nullptr;
  }
  gpu::Inventory inventory_;
  std::vector<mig::GpuState> mig_;
  std::string sysfs_;
};

TEST_F(DraSlicesOnFixture, OnePoolPerNodeOwnedByTheNodeCountersApartFromDevices) {
  Load("dgx-h100");
  std::vector<json> slices = Build();
  ASSERT_GE(slices.size(), 2u);
  std::vector<std::string> names;
  for (const json& s : slices) {
    names.push_back(s["metadata"]["name"]);
    EXPECT_EQ(s["apiVersion"], "resource.k8s.io/v1");
    EXPECT_EQ(s["kind"], "ResourceSlice");
    EXPECT_EQ(s["spec"]["driver"], kDriverName);
    EXPECT_EQ(s["spec"]["nodeName"], "node-a");
    EXPECT_EQ(s["spec"]["pool"]["name"], "node-a");
    EXPECT_EQ(s["spec"]["pool"]["generation"], 3);
    EXPECT_EQ(s["spec"]["pool"]["resourceSliceCount"], slices.size());
    const json& owner = s["metadata"]["ownerReferences"][0];
    EXPECT_EQ(owner["kind"], "Node");
    EXPECT_EQ(owner["name"], "node-a");
    EXPECT_EQ(owner["uid"], "uid-1");
    EXPECT_NE(s["spec"].contains("devices"), s["spec"].contains("sharedCounters"));
  }
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_EQ(names.front(), "node-a-gpu.gpulet.io-c00");
  EXPECT_EQ(names[1], "node-a-gpu.gpulet.io-d00");
  // The first device slice holds the whole GPUs in policy order (index order on an empty node).
  const json& whole = slices[1]["spec"]["devices"];
  ASSERT_EQ(whole.size(), 8u);
  for (unsigned i = 0; i < 8; ++i) EXPECT_EQ(whole[i]["name"], "gpu-" + std::to_string(i));
  EXPECT_EQ(slices[2]["spec"]["devices"][0]["name"], "gpu-0-mem");
}

// The order follows the policy and the GPUs' use (issue 25 item 5): with bestfit, shares and MIG
// placements of the fullest GPU that still has room come first; whole GPUs stay in index order
// among the free ones.
TEST_F(DraSlicesOnFixture, TheDeviceOrderFollowsThePlacementPolicyAndTheGpusUse) {
  Load("dgx-h100");
  SliceInputs in;
  in.inventory = &inventory_;
  in.mig = mig_;
  in.gpu_used_milli = {0, 0, 0, 0, 0, 600, 250, 0};
  SliceOptions o;
  o.node_name = "node-a";
  Result<std::vector<json>> s = BuildSlices(in, o, 1);
  ASSERT_TRUE(s.ok()) << s.status().message();
  const json& whole = (*s)[1]["spec"]["devices"];
  const json& shares = (*s)[2]["spec"]["devices"];
  EXPECT_EQ(whole[0]["name"], "gpu-0");
  EXPECT_EQ(shares[0]["name"], "gpu-5-mem");
  EXPECT_EQ(shares[1]["name"], "gpu-6-mem");
  EXPECT_EQ(shares[2]["name"], "gpu-0-mem");
  EXPECT_THAT((*s)[3]["spec"]["devices"][0]["name"].get<std::string>(),
              ::testing::StartsWith("gpu-5-mig-"));
}

TEST_F(DraSlicesOnFixture, AWholeGpuCarriesItsAttributesAndConsumesItsWholeCounterSet) {
  Load("dgx-h100");
  std::vector<json> slices = Build();
  const json* g = Find(slices, "gpu-1");
  ASSERT_NE(g, nullptr);
  const json& a = (*g)["attributes"];
  const gpu::Gpu& gpu1 = inventory_.gpus[1];
  EXPECT_EQ(a["type"]["string"], "gpu");
  EXPECT_EQ(a["uuid"]["string"], gpu1.uuid);
  EXPECT_EQ(a["productName"]["string"], "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(a["architecture"]["string"], gpu1.architecture);
  EXPECT_EQ(a["cudaComputeCapability"]["version"], "9.0.0");
  EXPECT_EQ(a["driverVersion"]["version"], SemverOf(inventory_.driver_version).value());
  EXPECT_EQ(a["resource.kubernetes.io/pciBusID"]["string"], PciBusId(gpu1.pci_bus_id).value());
  if (gpu1.numa_node) {
    EXPECT_EQ(a["resource.kubernetes.io/numaNode"]["int"], *gpu1.numa_node);
  }
  EXPECT_EQ(a["nvlinkDomain"]["int"], 0);  // NVSwitch: one domain
  EXPECT_EQ((*g)["capacity"]["memory"]["value"], "81559Mi");
  const json& consumes = (*g)["consumesCounters"][0];
  EXPECT_EQ(consumes["counterSet"], "gpu-1-counters");
  EXPECT_EQ(consumes["counters"].size(), 10u);  // 8 memory slices, compute, media
  EXPECT_EQ(consumes["counters"]["compute-slices"]["value"], "7");
  const json& sets = slices[0]["spec"]["sharedCounters"];
  EXPECT_EQ(sets.size(), 8u);
  EXPECT_EQ(sets[1]["name"], "gpu-1-counters");
  EXPECT_EQ(sets[1]["counters"], consumes["counters"]);

  const json* mem = Find(slices, "gpu-1-mem");
  ASSERT_NE(mem, nullptr);
  EXPECT_TRUE((*mem)["allowMultipleAllocations"].get<bool>());
  EXPECT_EQ((*mem)["capacity"]["memory"]["value"], "79Gi");  // whole units
  EXPECT_EQ((*mem)["capacity"]["memory"]["requestPolicy"],
            json::parse(R"({"default":"1Gi","validRange":{"min":"1Gi","step":"1Gi"}})"));
  EXPECT_EQ((*mem)["consumesCounters"], (*g)["consumesCounters"]);

  const json* mig = Find(slices, "gpu-1-mig-1g-20gb-2");
  ASSERT_NE(mig, nullptr);
  EXPECT_EQ((*mig)["attributes"]["profile"]["string"], "1g.20gb");
  EXPECT_EQ((*mig)["attributes"]["parentUUID"]["string"], gpu1.uuid);
  EXPECT_EQ((*mig)["consumesCounters"][0]["counters"],
            json::parse(R"({"memory-slice-2":{"value":"1"},"memory-slice-3":{"value":"1"},
                            "compute-slices":{"value":"1"}})"));
  const json* me = Find(slices, "gpu-1-mig-1g-10gb-me-6");
  ASSERT_NE(me, nullptr);
  EXPECT_EQ((*me)["consumesCounters"][0]["counters"]["media-engines"]["value"], "1");
  ASSERT_TRUE(ParseDeviceName("gpu-1-mig-1g-10gb-me-6").has_value());
  EXPECT_EQ(Find(slices, "gpu-1-mig-7g-80gb-1"), nullptr);  // 7g starts at 0 only
}

TEST_F(DraSlicesOnFixture, AnUnhealthyGpuTaintsEveryDeviceOfItAndOnlyThose) {
  Load("dgx-h100");
  const auto since = std::chrono::system_clock::from_time_t(1764806400);  // 2025-12-04T00:00:00Z
  std::map<std::string, GpuTaint> taints;
  taints[inventory_.gpus[2].uuid] = {"XID 79", since};
  std::vector<json> slices = Build(taints);
  size_t tainted = 0;
  for (const json& s : slices) {
    for (const json& d : s["spec"].value("devices", json::array())) {
      const std::optional<DeviceName> n = ParseDeviceName(d["name"].get<std::string>());
      ASSERT_TRUE(n.has_value()) << d["name"];
      if (n->gpu_index != 2) {
        EXPECT_FALSE(d.contains("taints")) << d["name"];
        continue;
      }
      ++tainted;
      ASSERT_TRUE(d.contains("taints")) << d["name"];
      EXPECT_EQ(d["taints"], json::parse(R"([{"key":"gpu.gpulet.io/unhealthy","value":"xid-79",
                                              "effect":"NoSchedule",
                                              "timeAdded":"2025-12-04T00:00:00Z"}])"));
    }
  }
  EXPECT_GT(tainted, 2u);
}

TEST_F(DraSlicesOnFixture, PcieRootAndNumaFromTheSimulatedSysfs) {
  Load("dgx-a100");
  std::vector<json> slices = Build();
  const json* g = Find(slices, "gpu-3");
  ASSERT_NE(g, nullptr);
  const json& a = (*g)["attributes"];
  // The simulated sysfs has device directories, not links into devices/pci…: no root to name.
  EXPECT_FALSE(a.contains("resource.kubernetes.io/pcieRoot"));
  ASSERT_TRUE(inventory_.gpus[3].numa_node.has_value());
  EXPECT_EQ(a["resource.kubernetes.io/numaNode"]["int"], *inventory_.gpus[3].numa_node);
  // GPUs 0 and 1 hold a static MIG layout on every memory slice: no device of theirs.
  EXPECT_EQ(Find(slices, "gpu-0"), nullptr);
  EXPECT_EQ(Find(slices, "gpu-1-mem"), nullptr);
  EXPECT_EQ(Find(slices, "gpu-0-mig-1g-5gb-0"), nullptr);
  EXPECT_NE(Find(slices, "gpu-2-mig-1g-5gb-0"), nullptr);
}

// The standard attributes of 1.37 on every kind of device of a GPU (whole, memory share, MIG
// placement), in upstream's names, types and forms, from a sysfs whose links name the roots.
TEST_F(DraSlicesOnFixture, EveryDeviceOfAGpuCarriesTheStandardAttributes) {
  Load("dgx-h100");
  std::string root = ::testing::TempDir() + "gpulet-dra-roots-XXXXXX";
  ASSERT_NE(mkdtemp(root.data()), nullptr);
  namespace fs = std::filesystem;
  fs::create_directories(root + "/bus/pci/devices");
  std::map<unsigned, std::string> want_root;
  for (const gpu::Gpu& g : inventory_.gpus) {
    const std::optional<std::string> bus = PciBusId(g.pci_bus_id);
    ASSERT_TRUE(bus.has_value()) << g.pci_bus_id;
    // Two GPUs per root complex, as on an HGX board.
    want_root[g.index] = "pci0000:" + std::string(1, "0123456789abcdef"[g.index / 2 % 16]) + "0";
    fs::create_directory_symlink("../../../devices/" + want_root[g.index] + "/0000:00:01.0/" + *bus,
                                 root + "/bus/pci/devices/" + *bus);
  }
  SliceInputs in;
  in.inventory = &inventory_;
  in.mig = mig_;
  SliceOptions o;
  o.node_name = "node-a";
  o.sysfs_root = root;
  Result<std::vector<json>> s = BuildSlices(in, o, 1);
  ASSERT_TRUE(s.ok()) << s.status().message();
  size_t seen = 0;
  for (const json& sl : *s) {
    for (const json& d : sl["spec"].value("devices", json::array())) {
      const std::optional<DeviceName> n = ParseDeviceName(d["name"].get<std::string>());
      ASSERT_TRUE(n.has_value()) << d["name"];
      const gpu::Gpu& g = inventory_.gpus[n->gpu_index];
      const json& a = d["attributes"];
      EXPECT_EQ(a["resource.kubernetes.io/pciBusID"], json({{"string", *PciBusId(g.pci_bus_id)}}))
          << d["name"];
      EXPECT_EQ(a["resource.kubernetes.io/pcieRoot"], json({{"string", want_root[g.index]}}))
          << d["name"];
      ASSERT_TRUE(g.numa_node.has_value());
      EXPECT_EQ(a["resource.kubernetes.io/numaNode"], json({{"int", *g.numa_node}})) << d["name"];
      for (const auto& [key, value] : a.items()) {
        if (key.rfind("resource.kubernetes.io/", 0) != 0) continue;
        EXPECT_TRUE(key == "resource.kubernetes.io/pciBusID" ||
                    key == "resource.kubernetes.io/pcieRoot" ||
                    key == "resource.kubernetes.io/numaNode")
            << key;  // nothing upstream does not define
      }
      ++seen;
    }
  }
  EXPECT_GT(seen, 16u);
  // Without NUMA affinity, or with a bus id outside the standard form, the attribute is left out.
  inventory_.gpus[0].numa_node = std::nullopt;
  inventory_.gpus[1].numa_node = 1024;
  inventory_.gpus[2].pci_bus_id = "00010000:18:00.0";
  s = BuildSlices(in, o, 2);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_FALSE((*Find(*s, "gpu-0"))["attributes"].contains("resource.kubernetes.io/numaNode"));
  EXPECT_FALSE((*Find(*s, "gpu-1"))["attributes"].contains("resource.kubernetes.io/numaNode"));
  EXPECT_FALSE((*Find(*s, "gpu-2"))["attributes"].contains("resource.kubernetes.io/pciBusID"));
  EXPECT_FALSE((*Find(*s, "gpu-2"))["attributes"].contains("resource.kubernetes.io/pcieRoot"));
  fs::remove_all(root);
}

TEST_F(DraSlicesOnFixture, BadOptionsAreRefused) {
  Load("l4-pcie");
  SliceInputs in;
  in.inventory = &inventory_;
  SliceOptions o;
  EXPECT_FALSE(BuildSlices(in, o, 1).ok());  // no node name
  o.node_name = "n";
  o.memory_unit_bytes = 0;
  EXPECT_FALSE(BuildSlices(in, o, 1).ok());
  o.memory_unit_bytes = 1 << 30;
  o.placement_policy = "nope";
  EXPECT_FALSE(BuildSlices(in, o, 1).ok());
  in.inventory = nullptr;
  o.placement_policy = "bestfit";
  EXPECT_FALSE(BuildSlices(in, o, 1).ok());
  // A node name long enough to push slice names past 253 characters is shortened with a hash.
  in.inventory = &inventory_;
  o.node_name = std::string(250, 'n');
  Result<std::vector<json>> s = BuildSlices(in, o, 1);
  ASSERT_TRUE(s.ok());
  for (const json& sl : *s) EXPECT_LE(sl["metadata"]["name"].get<std::string>().size(), 253u);
}

}  // namespace
}  // namespace gpulet::dra
