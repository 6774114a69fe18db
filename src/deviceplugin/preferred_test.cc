#include "deviceplugin/preferred.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "deviceplugin/test_inventories.h"

namespace gpulet::deviceplugin {
namespace {

using testing::DgxH100Like;
using testing::GpuResource;
using testing::L4PcieLike;
using testing::PartialNvlink;
using testing::Synthetic;

std::vector<std::string> Ids(const sharing::Resource& r, std::vector<unsigned> gpus) {
  std::vector<std::string> out;
  for (unsigned g : gpus) out.push_back(r.devices.at(g).id);
  return out;
}

std::vector<std::string> All(const sharing::Resource& r) {
  std::vector<std::string> out;
  for (const auto& d : r.devices) out.push_back(d.id);
  return out;
}

struct Case {
  const char* name;
  gpu::Inventory (*inventory)();
  std::vector<unsigned> available;  // empty = all
  std::vector<unsigned> must;
  int size;
  std::vector<unsigned> want;
};

class PreferredTable : public ::testing::TestWithParam<Case> {};

TEST_P(PreferredTable, PicksExpectedSet) {
  const Case& c = GetParam();
  gpu::Inventory inv = c.inventory();
  sharing::Resource r = GpuResource(inv);
  std::vector<std::string> available = c.available.empty() ? All(r) : Ids(r, c.available);
  Result<std::vector<std::string>> got =
      PreferredAllocation(r, inv, available, Ids(r, c.must), c.size);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(*got, Ids(r, c.want));
}

INSTANTIATE_TEST_SUITE_P(
    Topologies, PreferredTable,
    ::testing::Values(
        // NVSwitch: every pair NV18, so the same CPU decides; lowest indices win ties.
        Case{"dgx_pair", DgxH100Like, {}, {}, 2, {0, 1}},
        Case{"dgx_four_same_numa", DgxH100Like, {}, {}, 4, {0, 1, 2, 3}},
        Case{"dgx_must_include_follows_numa", DgxH100Like, {}, {5}, 2, {4, 5}},
        Case{"dgx_must_include_two_sockets", DgxH100Like, {}, {0, 7}, 3, {0, 1, 7}},
        // NVIDIA #2038: GPU 3 unhealthy (not available) must not fail or be picked.
        Case{"dgx_unhealthy_gpu_skipped", DgxH100Like, {0, 1, 2, 4, 5, 6, 7}, {}, 4, {4, 5, 6, 7}},
        Case{"dgx_all_eight", DgxH100Like, {}, {}, 8, {0, 1, 2, 3, 4, 5, 6, 7}},
        // PCIe only: the shared switch wins.
        Case{"l4_same_switch", L4PcieLike, {0, 2, 3}, {}, 2, {2, 3}},
        Case{"l4_must_include", L4PcieLike, {0, 1, 2, 3}, {2}, 2, {2, 3}},
        Case{"l4_must_cross", L4PcieLike, {0, 2, 3}, {0}, 2, {0, 2}},
        // NVLink count beats a shared PCIe switch.
        Case{"nvlink_beats_switch", PartialNvlink, {}, {}, 2, {0, 2}},
        Case{"nvlink_beats_switch_subset", PartialNvlink, {0, 1, 3}, {}, 2, {1, 3}},
        Case{"nvlink_must_include", PartialNvlink, {}, {3}, 2, {1, 3}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(PreferredAllocationTest, UnknownAvailableIdsAreSkipped) {
  gpu::Inventory inv = L4PcieLike();
  sharing::Resource r = GpuResource(inv);
  std::vector<std::string> available = {"GPU-gone", r.devices[2].id, r.devices[3].id};
  Result<std::vector<std::string>> got = PreferredAllocation(r, inv, available, {}, 2);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(*got, Ids(r, {2, 3}));
}

TEST(PreferredAllocationTest, ErrorsNameTheProblem) {
  gpu::Inventory inv = L4PcieLike();
  sharing::Resource r = GpuResource(inv);
  Result<std::vector<std::string>> unknown = PreferredAllocation(r, inv, All(r), {"GPU-x"}, 2);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), ErrorCode::kInvalidInput);
  EXPECT_NE(unknown.status().message().find("GPU-x"), std::string::npos);

  Result<std::vector<std::string>> dup =
      PreferredAllocation(r, inv, All(r), {r.devices[0].id, r.devices[0].id}, 2);
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("twice"), std::string::npos);

  Result<std::vector<std::string>> too_many = PreferredAllocation(r, inv, Ids(r, {0, 1}), {}, 3);
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("exceeds"), std::string::npos);

  EXPECT_FALSE(PreferredAllocation(r, inv, All(r), Ids(r, {0, 1}), 1).ok());
}

TEST(PreferredAllocationTest, Synthetic64StaysOnOneNumaNodeAndIsDeterministic) {
  gpu::Inventory inv = Synthetic(64);
  sharing::Resource r = GpuResource(inv);
  for (int size : {2, 8, 16, 40, 64}) {
    Result<std::vector<std::string>> a = PreferredAllocation(r, inv, All(r), {}, size);
    Result<std::vector<std::string>> b = PreferredAllocation(r, inv, All(r), {}, size);
    ASSERT_TRUE(a.ok()) << a.status().message();
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(*a, *b);
    ASSERT_EQ(a->size(), static_cast<size_t>(size));
    std::set<std::string> unique(a->begin(), a->end());
    EXPECT_EQ(unique.size(), a->size());
    if (size <= 16) {
      std::set<int> nodes;
      for (const std::string& id : *a) nodes.insert(*r.Find(id)->numa_node);
      EXPECT_EQ(nodes.size(), 1u) << "size " << size;
    }
  }
  // must_include on another node pulls the rest of the set next to it.
  Result<std::vector<std::string>> m = PreferredAllocation(r, inv, All(r), Ids(r, {50}), 4);
  ASSERT_TRUE(m.ok());
  for (const std::string& id : *m) EXPECT_EQ(*r.Find(id)->numa_node, 3);
  EXPECT_NE(std::find(m->begin(), m->end(), r.devices[50].id), m->end());
  EXPECT_NE(std::find(m->begin(), m->end(), r.devices[51].id), m->end());  // its switch peer
}

}  // namespace
}  // namespace gpulet::deviceplugin
