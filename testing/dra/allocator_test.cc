// What gpulet's published ResourceSlices admit, checked with the allocator stand-in on the
// simulated fixtures (issue 22, Proof): memory shares bounded by the GPU's memory, a GPU never
// together with a MIG device or a share of it, MIG placements that respect memory slices,
// tainted GPUs never chosen, 16 GPUs within the API limits, matchAttribute on the NVLink domain.
#include "dra/allocator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>

#include "dra/slices.h"
#include "gpu/inventory.h"
#include "mig/driver.h"
#include "sim/sim_node.h"

namespace gpulet::testing::dra {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
namespace gd = gpulet::dra;

constexpr int64_t kGi = int64_t{1} << 30;

struct Node {
  gpu::Inventory inventory;
  std::vector<mig::GpuState> mig;
};

Node Load(const std::string& fixture) {
  Node n;
  Result<gpu::testing::SimNode> sim = gpu::testing::OpenSimNode(fixture);
  EXPECT_TRUE(sim.ok()) << sim.status().message();
  if (!sim.ok()) return n;
  Result<gpu::Inventory> inv = gpu::Discover(*sim->nvml, sim->options);
  EXPECT_TRUE(inv.ok()) << inv.status().message();
  if (inv.ok()) n.inventory = std::move(*inv);
  Result<std::vector<mig::GpuState>> state = mig::ReadMigState(*sim->nvml);
  EXPECT_TRUE(state.ok()) << state.status().message();
  if (state.ok()) n.mig = std::move(*state);
  return n;
}

std::vector<json> Slices(const Node& n, std::map<std::string, gd::GpuTaint> taints = {}) {
  gd::SliceInputs in;
  in.inventory = &n.inventory;
  in.mig = n.mig;
  in.taints = std::move(taints);
  gd::SliceOptions o;
  o.node_name = "node-a";
  o.node_uid = "uid-a";
  Result<std::vector<json>> s = gd::BuildSlices(in, o, 1);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? *s : std::vector<json>{};
}

std::vector<DeviceClass> Classes() {
  std::vector<DeviceClass> out;
  for (const char* type : {"gpu", "mig", "memory-share"}) {
    json cls = {{"metadata", {{"name", type}}},
                {"spec",
                 {{"selectors",
                   json::array({{{"cel",
                                  {{"expression",
                                    std::string("device.driver == 'gpu.gpulet.io' && "
                                                "device.attributes['gpu.gpulet.io'].type == '") +
                                        type + "'"}}}}})}}}};
    Result<DeviceClass> c = ParseDeviceClass(cls);
    EXPECT_TRUE(c.ok()) << c.status().message();
    out.push_back(*c);
  }
  return out;
}

Request Req(const std::string& cls, const std::string& attr = "", const json& value = nullptr) {
  Request r;
  r.name = "r";
  r.device_class = cls;
  if (!attr.empty()) r.selectors.push_back({{std::string("gpu.gpulet.io/") + attr, value}});
  return r;
}

ClaimSpec One(Request r) {
  ClaimSpec c;
  c.requests.push_back(std::move(r));
  return c;
}

std::string DeviceOf(const Result<std::vector<DeviceResult>>& r) {
  return r.ok() && r->size() == 1 ? (*r)[0].device : "";
}

Request Share(const std::string& uuid, int64_t bytes) {
  Request r = Req("memory-share", "uuid", uuid);
  r.capacity["memory"] = bytes;
  return r;
}

Request Mig(const std::string& parent, const std::string& profile) {
  Request r = Req("mig", "parentUUID", parent);
  r.selectors[0].push_back({"gpu.gpulet.io/profile", profile});
  return r;
}

TEST(DraAllocator, FourTwentyGiBSharesOfAn80GBGpuAndNotAFifth) {
  Node n = Load("dgx-a100");
  // The A100-SXM4-80GB: 81920 MiB, the same board with twice the memory.
  for (gpu::Gpu& g : n.inventory.gpus) {
    g.memory_mib = 81920;
    g.name = "NVIDIA A100-SXM4-80GB";
  }
  Allocator alloc(Slices(n), Classes());
  ASSERT_THAT(alloc.slice_errors(), ::testing::IsEmpty());
  const std::string uuid = n.inventory.gpus[2].uuid;
  std::set<std::string> share_ids;
  for (int i = 0; i < 4; ++i) {
    Result<std::vector<DeviceResult>> r = alloc.Allocate(One(Share(uuid, 20 * kGi)));
    ASSERT_TRUE(r.ok()) << "share " << i << ": " << r.status().message();
    EXPECT_EQ((*r)[0].device, "gpu-2-mem");
    EXPECT_EQ((*r)[0].consumed.at("gpu.gpulet.io/memory"), 20 * kGi);
    share_ids.insert((*r)[0].share_id);
  }
  EXPECT_EQ(share_ids.size(), 4u);
  EXPECT_FALSE(alloc.Allocate(One(Share(uuid, 20 * kGi))).ok());
  EXPECT_FALSE(alloc.Allocate(One(Share(uuid, 1))).ok());  // rounded up to 1 Gi: none left
}

TEST(DraAllocator, SharesRoundUpToTheUnitAndStopAtTheGpusMemory) {
  Node n = Load("dgx-h100");  // 81559 MiB: 79 whole GiB
  Allocator alloc(Slices(n), Classes());
  const std::string uuid = n.inventory.gpus[0].uuid;
  Result<std::vector<DeviceResult>> odd = alloc.Allocate(One(Share(uuid, 10 * kGi + 1)));
  ASSERT_TRUE(odd.ok()) << odd.status().message();
  EXPECT_EQ((*odd)[0].consumed.at("gpu.gpulet.io/memory"), 11 * kGi);  // min + ceil(step)
  Request none = Req("memory-share", "uuid", uuid);  // no amount: the default, one unit
  Result<std::vector<DeviceResult>> dflt = alloc.Allocate(One(none));
  ASSERT_TRUE(dflt.ok());
  EXPECT_EQ((*dflt)[0].consumed.at("gpu.gpulet.io/memory"), kGi);
  // 79 - 12 = 67 GiB left: three 20 GiB shares, not a fourth.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(alloc.Allocate(One(Share(uuid, 20 * kGi))).ok());
  EXPECT_FALSE(alloc.Allocate(One(Share(uuid, 20 * kGi))).ok());
  EXPECT_TRUE(alloc.Allocate(One(Share(uuid, 7 * kGi))).ok());
  EXPECT_FALSE(alloc.Allocate(One(Share(uuid, 1))).ok());
}

TEST(DraAllocator, NeverAWholeGpuTogetherWithAMigDeviceOrAShareOfItInEitherOrder) {
  Node n = Load("dgx-h100");
  Allocator alloc(Slices(n), Classes());
  const std::string uuid = n.inventory.gpus[3].uuid;
  // Whole GPU first: no MIG device and no share of it.
  Result<std::vector<DeviceResult>> whole = alloc.Allocate(One(Req("gpu", "uuid", uuid)));
  ASSERT_EQ(DeviceOf(whole), "gpu-3");
  for (const char* profile : {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb",
                              "4g.40gb", "7g.80gb"}) {
    EXPECT_FALSE(alloc.Allocate(One(Mig(uuid, profile))).ok()) << profile;
  }
  EXPECT_FALSE(alloc.Allocate(One(Share(uuid, kGi))).ok());
  alloc.Release(*whole);
  // A MIG device first: no whole GPU, no share; another placement still fits.
  Result<std::vector<DeviceResult>> small = alloc.Allocate(One(Mig(uuid, "1g.10gb")));
  ASSERT_EQ(DeviceOf(small), "gpu-3-mig-1g-10gb-0");
  EXPECT_FALSE(alloc.Allocate(One(Req("gpu", "uuid", uuid))).ok());
  EXPECT_FALSE(alloc.Allocate(One(Share(uuid, kGi))).ok());
  EXPECT_EQ(DeviceOf(alloc.Allocate(One(Mig(uuid, "1g.10gb")))), "gpu-3-mig-1g-10gb-1");
  // A share first: no whole GPU, no MIG device; more shares still fit.
  const std::string other = n.inventory.gpus[4].uuid;
  ASSERT_EQ(DeviceOf(alloc.Allocate(One(Share(other, 10 * kGi)))), "gpu-4-mem");
  EXPECT_FALSE(alloc.Allocate(One(Req("gpu", "uuid", other))).ok());
  EXPECT_FALSE(alloc.Allocate(One(Mig(other, "1g.10gb"))).ok());
  EXPECT_EQ(DeviceOf(alloc.Allocate(One(Share(other, 10 * kGi)))), "gpu-4-mem");
}

TEST(DraAllocator, EveryGpuTakenWholeLeavesNoMigDeviceAndEveryGpuWithAMigDeviceNoWholeGpu) {
  Node n = Load("hgx-h200");
  {
    Allocator alloc(Slices(n), Classes());
    for (size_t i = 0; i < n.inventory.gpus.size(); ++i) {
      ASSERT_TRUE(alloc.Allocate(One(Req("gpu"))).ok()) << i;
    }
    EXPECT_FALSE(alloc.Allocate(One(Req("gpu"))).ok());
    EXPECT_FALSE(alloc.Allocate(One(Req("mig"))).ok());
    EXPECT_FALSE(alloc.Allocate(One(Req("memory-share"))).ok());
  }
  {
    Allocator alloc(Slices(n), Classes());
    for (const gpu::Gpu& g : n.inventory.gpus) {
      Request r = Req("mig", "parentUUID", g.uuid);
      ASSERT_TRUE(alloc.Allocate(One(r)).ok()) << g.index;
    }
    EXPECT_FALSE(alloc.Allocate(One(Req("gpu"))).ok());
  }
}

TEST(DraAllocator, MigPlacementsRespectMemorySlices) {
  Node n = Load("dgx-a100");  // A100 40GB
  Allocator alloc(Slices(n), Classes());
  const std::string uuid = n.inventory.gpus[2].uuid;
  for (unsigned i = 0; i < 7; ++i) {
    Result<std::vector<DeviceResult>> r = alloc.Allocate(One(Mig(uuid, "1g.5gb")));
    ASSERT_EQ(DeviceOf(r), "gpu-2-mig-1g-5gb-" + std::to_string(i));
  }
  EXPECT_FALSE(alloc.Allocate(One(Mig(uuid, "1g.5gb"))).ok());  // 7 compute slices used
  EXPECT_FALSE(alloc.Allocate(One(Mig(uuid, "2g.10gb"))).ok());
  EXPECT_FALSE(alloc.Allocate(One(Mig(uuid, "1g.10gb"))).ok());

  // 4g at 0 and 3g at 4 fill the GPU; 1g.10gb (two memory slices) then fits nowhere.
  const std::string g3 = n.inventory.gpus[3].uuid;
  EXPECT_EQ(DeviceOf(alloc.Allocate(One(Mig(g3, "4g.20gb")))), "gpu-3-mig-4g-20gb-0");
  EXPECT_EQ(DeviceOf(alloc.Allocate(One(Mig(g3, "3g.20gb")))), "gpu-3-mig-3g-20gb-4");
  EXPECT_FALSE(alloc.Allocate(One(Mig(g3, "1g.5gb"))).ok());

  // Three 1g.10gb take slices 0-5; a 2g.10gb needs an even start whose two slices are free: none
  // (0, 2, 4 taken), though compute slices remain.
  const std::string g4 = n.inventory.gpus[4].uuid;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(alloc.Allocate(One(Mig(g4, "1g.10gb"))).ok());
  EXPECT_FALSE(alloc.Allocate(One(Mig(g4, "2g.10gb"))).ok());
  EXPECT_EQ(DeviceOf(alloc.Allocate(One(Mig(g4, "1g.5gb")))), "gpu-4-mig-1g-5gb-6");

  // One "+me" instance per GPU: the media engines are a counter of one.
  const std::string g5 = n.inventory.gpus[5].uuid;
  EXPECT_TRUE(alloc.Allocate(One(Mig(g5, "1g.5gb+me"))).ok());
  EXPECT_FALSE(alloc.Allocate(One(Mig(g5, "1g.5gb+me"))).ok());
  EXPECT_TRUE(alloc.Allocate(One(Mig(g5, "1g.5gb"))).ok());
}

TEST(DraAllocator, GpusWithAStaticMigLayoutOfferOnlyFreePlacementsAndNonMigGpusNone) {
  Node a100 = Load("dgx-a100");  // GPUs 0 and 1 hold instances on every memory slice
  Allocator alloc(Slices(a100), Classes());
  for (unsigned g : {0u, 1u}) {
    const std::string uuid = a100.inventory.gpus[g].uuid;
    EXPECT_FALSE(alloc.Allocate(One(Req("gpu", "uuid", uuid))).ok());
    EXPECT_FALSE(alloc.Allocate(One(Req("mig", "parentUUID", uuid))).ok());
    EXPECT_FALSE(alloc.Allocate(One(Share(uuid, kGi))).ok());
  }
  Node l4 = Load("l4-pcie");
  std::vector<json> slices = Slices(l4);
  for (const json& s : slices) {
    for (const json& d : s["spec"].value("devices", json::array())) {
      EXPECT_THAT(d["name"].get<std::string>(), ::testing::Not(HasSubstr("-mig-")));
    }
  }
  Allocator l4alloc(slices, Classes());
  EXPECT_FALSE(l4alloc.Allocate(One(Req("mig"))).ok());
  EXPECT_TRUE(l4alloc.Allocate(One(Req("gpu"))).ok());
}

TEST(DraAllocator, ATaintedGpuIsNeverChosenUnlessTolerated) {
  Node n = Load("dgx-h100");
  std::map<std::string, gd::GpuTaint> taints;
  taints[n.inventory.gpus[0].uuid] = {"XID 79", std::chrono::system_clock::now()};
  Allocator alloc(Slices(n, taints), Classes());
  const std::string uuid = n.inventory.gpus[0].uuid;
  EXPECT_FALSE(alloc.Allocate(One(Req("gpu", "uuid", uuid))).ok());
  EXPECT_FALSE(alloc.Allocate(One(Share(uuid, kGi))).ok());
  EXPECT_FALSE(alloc.Allocate(One(Mig(uuid, "1g.10gb"))).ok());
  // Eight whole GPUs asked one by one: seven, none of them GPU 0.
  std::vector<std::vector<DeviceResult>> held;
  for (int i = 0; i < 7; ++i) {
    Result<std::vector<DeviceResult>> r = alloc.Allocate(One(Req("gpu")));
    ASSERT_TRUE(r.ok());
    EXPECT_NE((*r)[0].device, "gpu-0");
    held.push_back(*r);
  }
  EXPECT_FALSE(alloc.Allocate(One(Req("gpu"))).ok());
  Request tolerant = Req("gpu");
  tolerant.tolerations.push_back({"gpu.gpulet.io/unhealthy", "Exists", "", "NoSchedule"});
  EXPECT_EQ(DeviceOf(alloc.Allocate(One(tolerant))), "gpu-0");
}

// Sixteen H100s with their MIG profiles: every slice within the API's limits, and every GPU
// allocatable.
TEST(DraAllocator, SixteenGpusFitTheApiLimits) {
  Node h = Load("dgx-h100");
  Node n = h;
  const size_t base = h.inventory.gpus.size();
  for (size_t i = 0; i < base; ++i) {
    gpu::Gpu g = h.inventory.gpus[i];
    g.index = static_cast<unsigned>(base + i);
    g.uuid += "-b";
    g.pci_bus_id = "00000001" + g.pci_bus_id.substr(8);
    n.inventory.gpus.push_back(g);
    mig::GpuState s = h.mig[i];
    s.index = g.index;
    n.mig.push_back(s);
  }
  n.inventory.links.assign(16, std::vector<gpu::Link>(16));
  std::vector<json> slices = Slices(n);
  size_t devices = 0, sets = 0;
  for (const json& s : slices) {
    const json& spec = s["spec"];
    EXPECT_EQ(spec["pool"]["resourceSliceCount"], slices.size());
    const json d = spec.value("devices", json::array());
    const json c = spec.value("sharedCounters", json::array());
    EXPECT_TRUE(d.empty() || c.empty()) << s["metadata"]["name"];
    EXPECT_LE(d.size(), 64u);
    EXPECT_LE(c.size(), 8u);
    for (const json& set : c) EXPECT_LE(set["counters"].size(), 32u);
    for (const json& dev : d) {
      EXPECT_LE(dev.value("attributes", json::object()).size() +
                    dev.value("capacity", json::object()).size(),
                32u)
          << dev["name"];
      EXPECT_LE(dev.value("consumesCounters", json::array()).size(), 2u);
    }
    devices += d.size();
    sets += c.size();
  }
  EXPECT_EQ(sets, 16u);
  EXPECT_GT(devices, 16u * 20u);  // whole, share and every MIG placement of each GPU
  Allocator alloc(slices, Classes());
  ASSERT_THAT(alloc.slice_errors(), ::testing::IsEmpty());
  for (int i = 0; i < 16; ++i) ASSERT_TRUE(alloc.Allocate(One(Req("gpu"))).ok()) << i;
  EXPECT_FALSE(alloc.Allocate(One(Req("gpu"))).ok());
}

TEST(DraAllocator, TwoGpusInOneNvlinkDomainByMatchAttribute) {
  Node n = Load("dgx-h100");
  // Two NVLink islands: {0, 2} and {1, 3}; GPUs 4-7 without NVLink.
  n.inventory.links.assign(8, std::vector<gpu::Link>(8));
  n.inventory.links[0][2].nvlinks = n.inventory.links[2][0].nvlinks = 4;
  n.inventory.links[1][3].nvlinks = n.inventory.links[3][1].nvlinks = 4;
  Allocator alloc(Slices(n), Classes());
  ClaimSpec pair;
  Request two = Req("gpu");
  two.count = 2;
  pair.requests.push_back(two);
  pair.constraints.push_back({{}, "gpu.gpulet.io/nvlinkDomain", ""});
  Result<std::vector<DeviceResult>> first = alloc.Allocate(pair);
  ASSERT_TRUE(first.ok()) << first.status().message();
  std::set<std::string> got = {(*first)[0].device, (*first)[1].device};
  // First fit in device order would take gpu-0 and gpu-1; the constraint backtracks to gpu-2.
  EXPECT_EQ(got, (std::set<std::string>{"gpu-0", "gpu-2"}));
  Result<std::vector<DeviceResult>> second = alloc.Allocate(pair);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ((std::set<std::string>{(*second)[0].device, (*second)[1].device}),
            (std::set<std::string>{"gpu-1", "gpu-3"}));
  // GPUs without NVLink carry no domain: no third pair, though four GPUs are free.
  EXPECT_FALSE(alloc.Allocate(pair).ok());
  Request free_two = Req("gpu");
  free_two.count = 2;
  EXPECT_TRUE(alloc.Allocate(One(free_two)).ok());
}

TEST(DraAllocator, DistinctAttributeKeepsTwoSharesOffOneGpu) {
  Node n = Load("dgx-h100");
  Allocator alloc(Slices(n), Classes());
  ClaimSpec c;
  Request two = Req("memory-share");
  two.count = 2;
  two.capacity["memory"] = kGi;
  c.requests.push_back(two);
  Result<std::vector<DeviceResult>> same = alloc.Allocate(c);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ((*same)[0].device, (*same)[1].device);  // one multi-allocatable device, twice
  c.constraints.push_back({{}, "", "gpu.gpulet.io/uuid"});
  Result<std::vector<DeviceResult>> apart = alloc.Allocate(c);
  ASSERT_TRUE(apart.ok());
  EXPECT_NE((*apart)[0].device, (*apart)[1].device);
}

TEST(DraAllocator, ClaimsAndClassesParseFromTheirObjects) {
  Result<ClaimSpec> spec = ParseClaimSpec(json::parse(R"({
    "devices": {
      "requests": [{"name": "mem", "exactly": {"deviceClassName": "memory-share", "count": 1,
                    "capacity": {"requests": {"memory": "20Gi"}},
                    "selectors": [{"cel": {"expression":
                      "device.attributes[\"gpu.gpulet.io\"].productName == \"NVIDIA H100 80GB HBM3\""}}],
                    "tolerations": [{"key": "k", "operator": "Exists"}]}}],
      "constraints": [{"requests": ["mem"], "distinctAttribute": "gpu.gpulet.io/uuid"}]
    }})"));
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  ASSERT_EQ(spec->requests.size(), 1u);
  EXPECT_EQ(spec->requests[0].capacity.at("memory"), 20 * kGi);
  EXPECT_EQ(spec->requests[0].tolerations[0].op, "Exists");
  EXPECT_EQ(spec->constraints[0].distinct_attribute, "gpu.gpulet.io/uuid");
  Node n = Load("dgx-h100");
  Allocator alloc(Slices(n), Classes());
  Result<std::vector<DeviceResult>> r = alloc.Allocate(*spec);
  ASSERT_TRUE(r.ok()) << r.status().message();
  json status = Allocator::AllocationJson(*r, "node-a");
  EXPECT_EQ(status["devices"]["results"][0]["consumedCapacity"]["memory"], std::to_string(20 * kGi));
  EXPECT_EQ(status["devices"]["results"][0]["pool"], "node-a");
  // Outside the CEL subset: refused, never a silent match.
  EXPECT_FALSE(ParseSelector("device.attributes['gpu.gpulet.io'].memory > 1").ok());
  EXPECT_FALSE(ParseSelector("true").ok());
  EXPECT_FALSE(alloc.Allocate(One(Req("no-such-class"))).ok());
}

}  // namespace
}  // namespace gpulet::testing::dra
