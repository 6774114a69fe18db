#include "sharing/plan.h"

#include <gtest/gtest.h>

#include <functional>

#include "sharing/test_inventories.h"

namespace gpulet::sharing {
namespace {

using testing::A100Mixed;
using testing::MigEverywhere;
using testing::WholeGpus;

gpu::Inventory ThreeGpus() {
  gpu::Inventory inv;
  for (unsigned i : {2u, 0u, 1u}) {  // discovery order need not be index order
    gpu::Gpu g;
    g.index = i;
    g.uuid = "GPU-" + std::to_string(i);
    if (i != 1) g.numa_node = static_cast<int>(i / 2);
    inv.gpus.push_back(g);
  }
  inv.links.assign(3, std::vector<gpu::Link>(3));
  return inv;
}

config::Config Parse(const std::string& yaml) {
  Result<config::Config> c = config::ParseConfig(yaml, "cfg.yaml");
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? *c : config::Config{};
}

// "name=devices[/replicas][:kind]" per resource, space-separated: a compact view of a plan.
std::string Summary(const Plan& p) {
  std::string out;
  for (const Resource& r : p.resources) {
    if (!out.empty()) out += " ";
    out += r.name + "=" + std::to_string(r.devices.size());
    if (r.replicas > 1) out += "/" + std::to_string(r.replicas);
    if (r.sharing != SharingKind::kNone) out += std::string(":") + SharingKindName(r.sharing);
  }
  return out;
}

TEST(SocketNameTest, Names) {
  EXPECT_EQ(SocketNameFor("nvidia.com/gpu"), "nvidia-gpu.sock");
  EXPECT_EQ(SocketNameFor("nvidia.com/gpu.shared"), "nvidia-gpu.shared.sock");
  EXPECT_EQ(SocketNameFor("nvidia.com/mig-1g.10gb"), "nvidia-mig-1g.10gb.sock");
  EXPECT_EQ(MigResourceName("1g.10gb+me"), "nvidia.com/mig-1g.10gb.me");
  EXPECT_EQ(MigResourceName("1c.3g.20gb"), "nvidia.com/mig-1c.3g.20gb");
  EXPECT_EQ(BaseDeviceId("GPU-a::12"), "GPU-a");
  EXPECT_EQ(BaseDeviceId("MIG-b"), "MIG-b");
  EXPECT_EQ(MpsClientLimit(7, 0), 16);
  EXPECT_EQ(MpsClientLimit(7, 5), 48);
  EXPECT_EQ(MpsClientLimit(9, 0), 48);
}

TEST(BuildPlanTest, WholeGpusByDefault) {
  config::Config cfg;
  Result<Plan> plan = BuildPlan(ThreeGpus(), cfg);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_EQ(plan->resources.size(), 1u);
  const Resource& r = plan->resources[0];
  EXPECT_EQ(r.name, "nvidia.com/gpu");
  EXPECT_EQ(r.socket_name, "nvidia-gpu.sock");
  EXPECT_EQ(r.replicas, 1);
  ASSERT_EQ(r.devices.size(), 3u);
  for (unsigned i = 0; i < 3; ++i) {
    const AdvertisedDevice& d = r.devices[i];
    EXPECT_EQ(d.id, "GPU-" + std::to_string(i));
    EXPECT_EQ(d.uuid, d.id);
    EXPECT_EQ(d.index, std::to_string(i));
    EXPECT_EQ(d.gpu_index, i);
    EXPECT_EQ(d.replica, -1);
    EXPECT_FALSE(d.mig_index.has_value());
  }
  EXPECT_EQ(r.devices[0].numa_node, 0);
  EXPECT_FALSE(r.devices[1].numa_node.has_value());
  EXPECT_EQ(r.devices[2].numa_node, 1);
  EXPECT_EQ(plan->Find("nvidia.com/gpu"), &plan->resources[0]);
  EXPECT_EQ(r.Find("GPU-2"), &r.devices[2]);
  EXPECT_EQ(r.Find("GPU-9"), nullptr);
}

TEST(BuildPlanTest, IdStrategyDoesNotChangeAdvertisedIds) {
  config::Config uuid_cfg, index_cfg;
  index_cfg.flags.plugin.device_id_strategy = config::DeviceIdStrategy::kIndex;
  Result<Plan> a = BuildPlan(ThreeGpus(), uuid_cfg);
  Result<Plan> b = BuildPlan(ThreeGpus(), index_cfg);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->resources, b->resources);
}

TEST(BuildPlanTest, NoGpusNoResources) {
  Result<Plan> plan = BuildPlan(gpu::Inventory{}, config::Config{});
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->resources.empty());
}

// ---- Table: every config case against an inventory ----

struct Case {
  const char* name;
  std::function<gpu::Inventory()> inventory;
  const char* yaml;
  const char* want;  // Summary() on success, or a substring of the error (starting "ERR ")
};

const char kTs[] = "version: v1\nsharing:\n  timeSlicing:\n";

class PlanTable : public ::testing::TestWithParam<Case> {};

TEST_P(PlanTable, Builds) {
  const Case& c = GetParam();
  config::Config cfg = Parse(c.yaml);
  Result<Plan> p = BuildPlan(c.inventory(), cfg);
  const std::string want = c.want;
  if (want.rfind("ERR ", 0) == 0) {
    ASSERT_FALSE(p.ok()) << "plan: " << Summary(*p);
    EXPECT_EQ(p.status().code(), ErrorCode::kInvalidInput);
    EXPECT_NE(p.status().message().find(want.substr(4)), std::string::npos) << p.status().message();
  } else {
    ASSERT_TRUE(p.ok()) << p.status().message();
    EXPECT_EQ(Summary(*p), want);
  }
}

gpu::Inventory H100x8() { return WholeGpus(8); }
gpu::Inventory V100x4() { return WholeGpus(4, 7, 0, 32768); }
gpu::Inventory T4x2() { return WholeGpus(2, 7, 5, 15360); }

const Case kCases[] = {
    // --- MIG strategies ---
    {"none_on_a100", A100Mixed, "version: v1\n", "nvidia.com/gpu=8"},
    {"none_explicit_on_a100", A100Mixed, "flags: {migStrategy: none}\n", "nvidia.com/gpu=8"},
    {"mixed_on_a100", A100Mixed, "flags: {migStrategy: mixed}\n",
     "nvidia.com/gpu=6 nvidia.com/mig-1g.5gb=9 nvidia.com/mig-2g.10gb=1 "
     "nvidia.com/mig-3g.20gb=1"},
    {"single_on_a100_mixed_profiles", A100Mixed, "flags: {migStrategy: single}\n",
     "ERR cfg.yaml: flags.migStrategy: single needs MIG enabled on every GPU or on none; enabled "
     "on GPU 0,1, disabled on GPU 2,3,4,5,6,7"},
    {"single_profiles_differ",
     [] {
       return MigEverywhere(2, {"3g.40gb", "1g.10gb"});
     },
     "flags: {migStrategy: single}\n",
     "ERR single needs every MIG device to have the same profile, found 1g.10gb (GPU 0,1), "
     "3g.40gb (GPU 0,1)"},
    {"single_uniform", [] { return MigEverywhere(8, std::vector<std::string>(7, "1g.10gb")); },
     "flags: {migStrategy: single}\n", "nvidia.com/gpu=56"},
    {"single_without_mig_is_none", H100x8, "flags: {migStrategy: single}\n", "nvidia.com/gpu=8"},
    {"mixed_without_mig", H100x8, "flags: {migStrategy: mixed}\n", "nvidia.com/gpu=8"},
    {"mixed_media_extensions",
     [] {
       return MigEverywhere(1, {"1g.10gb+me", "1g.10gb"});
     },
     "flags: {migStrategy: mixed}\n", "nvidia.com/mig-1g.10gb=1 nvidia.com/mig-1g.10gb.me=1"},

    // --- time-slicing: replicas and renames ---
    {"ts_all", H100x8, "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 4}\n",
     "nvidia.com/gpu=32/4:time-slicing"},
    {"ts_rename_by_default", H100x8,
     "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
     "    - {name: gpu, replicas: 2}\n",
     "nvidia.com/gpu.shared=16/2:time-slicing"},
    {"ts_rename", H100x8,
     "sharing:\n  timeSlicing:\n    resources:\n"
     "    - {name: gpu, rename: gpu.dev, replicas: 3}\n",
     "nvidia.com/gpu.dev=24/3:time-slicing"},
    {"ts_count_renamed_keeps_rest_plain", H100x8,
     "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
     "    - {name: gpu, devices: 2, replicas: 4}\n",
     "nvidia.com/gpu=6 nvidia.com/gpu.shared=8/4:time-slicing"},
    {"ts_per_gpu_side_by_side", H100x8,
     "sharing:\n  timeSlicing:\n    resources:\n"
     "    - {name: gpu, rename: gpu.shared, devices: [0, 1], replicas: 4}\n"
     "    - {name: gpu, rename: gpu.shared, devices: [\"7\"], replicas: 8}\n",
     "nvidia.com/gpu=5 nvidia.com/gpu.shared=16/8:time-slicing"},
    {"ts_two_shared_resources", H100x8,
     "sharing:\n  timeSlicing:\n    resources:\n"
     "    - {name: gpu, rename: gpu.small, devices: [0], replicas: 8}\n"
     "    - {name: gpu, rename: gpu.large, devices: [GPU-1, GPU-2], replicas: 2}\n",
     "nvidia.com/gpu=5 nvidia.com/gpu.large=4/2:time-slicing "
     "nvidia.com/gpu.small=8/8:time-slicing"},
    {"ts_on_mig_devices", A100Mixed,
     "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n"
     "    - {name: mig-1g.5gb, replicas: 2}\n",
     "nvidia.com/gpu=6 nvidia.com/mig-1g.5gb=18/2:time-slicing nvidia.com/mig-2g.10gb=1 "
     "nvidia.com/mig-3g.20gb=1"},
    {"ts_mig_by_index_and_uuid_renamed", A100Mixed,
     "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n"
     "    - {name: mig-1g.5gb, rename: small-mig, devices: [\"0:2\", MIG-1-6], replicas: 3}\n",
     "nvidia.com/gpu=6 nvidia.com/mig-1g.5gb=7 nvidia.com/mig-2g.10gb=1 "
     "nvidia.com/mig-3g.20gb=1 nvidia.com/small-mig=6/3:time-slicing"},
    {"ts_gpu_index_selects_its_mig_devices", A100Mixed,
     "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n"
     "    - {name: mig-1g.5gb, rename: small-mig, devices: [1], replicas: 2}\n",
     "nvidia.com/gpu=6 nvidia.com/mig-1g.5gb=2 nvidia.com/mig-2g.10gb=1 "
     "nvidia.com/mig-3g.20gb=1 nvidia.com/small-mig=14/2:time-slicing"},
    {"ts_single_mig_shared",
     [] {
       return MigEverywhere(2, {"3g.40gb", "3g.40gb"});
     },
     "flags: {migStrategy: single}\nsharing:\n  timeSlicing:\n    resources:\n"
     "    - {name: gpu, replicas: 2}\n",
     "nvidia.com/gpu=8/2:time-slicing"},
    {"ts_missing_mig_profile_with_all_is_skipped", A100Mixed,
     "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n"
     "    - {name: mig-7g.40gb, replicas: 2}\n",
     "nvidia.com/gpu=6 nvidia.com/mig-1g.5gb=9 nvidia.com/mig-2g.10gb=1 "
     "nvidia.com/mig-3g.20gb=1"},

    // --- time-slicing: errors ---
    {"ts_missing_mig_profile_with_list", A100Mixed,
     "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n"
     "    - {name: mig-7g.40gb, devices: [\"0:0\"], replicas: 2}\n",
     "ERR cfg.yaml:5: sharing.timeSlicing.resources[0].devices: nvidia.com/mig-7g.40gb has no "
     "devices on this node"},
    {"ts_unknown_index", H100x8,
     "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
     "    - name: gpu\n      devices: [0, 9]\n      replicas: 2\n",
     "ERR cfg.yaml:6: sharing.timeSlicing.resources[0].devices[1]: unknown device \"9\": this "
     "node has 8 GPUs"},
    {"ts_unknown_uuid", H100x8,
     "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
     "    - {name: gpu, devices: [GPU-nope], replicas: 2}\n",
     "ERR sharing.timeSlicing.resources[0].devices[0]: unknown device \"GPU-nope\""},
    {"ts_unknown_mig", A100Mixed,
     "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n"
     "    - {name: mig-1g.5gb, rename: x, devices: [\"5:0\"], replicas: 2}\n",
     "ERR sharing.timeSlicing.resources[0].devices[0]: unknown MIG device \"5:0\""},
    {"ts_mig_of_other_profile", A100Mixed,
     "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n"
     "    - {name: mig-1g.5gb, rename: x, devices: [\"0:0\"], replicas: 2}\n",
     "ERR MIG device \"0:0\" (profile 3g.20gb) is not a device of nvidia.com/mig-1g.5gb"},
    {"ts_mig_ids_under_none", A100Mixed,
     "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
     "    - {name: gpu, devices: [\"0:1\"], replicas: 2}\n",
     "ERR cfg.yaml:5: sharing.timeSlicing.resources[0].devices[0]: MIG device \"0:1\" needs "
     "flags.migStrategy single or mixed"},
    {"ts_mig_name_under_none", A100Mixed,
     "sharing:\n  timeSlicing:\n    resources:\n    - {name: mig-1g.5gb, replicas: 2}\n",
     "ERR cfg.yaml:4: sharing.timeSlicing.resources[0].name: \"nvidia.com/mig-1g.5gb\" is a MIG "
     "resource, advertised only with flags.migStrategy mixed (it is none)"},
    {"ts_unknown_resource_name", H100x8,
     "sharing:\n  timeSlicing:\n    resources:\n    - {name: tpu, replicas: 2}\n",
     "ERR cfg.yaml:4: sharing.timeSlicing.resources[0].name: unknown resource "
     "\"nvidia.com/tpu\""},
    {"ts_same_gpu_by_index_and_uuid", H100x8,
     "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
     "    - {name: gpu, devices: [3, GPU-3], replicas: 2}\n",
     "ERR sharing.timeSlicing.resources[0].devices[1]: device \"GPU-3\" selects GPU-3 again "
     "(already selected by sharing.timeSlicing.resources[0].devices[0])"},
    {"ts_gpu_in_two_resources", H100x8,
     "sharing:\n  timeSlicing:\n    resources:\n"
     "    - {name: gpu, rename: a, devices: [2], replicas: 2}\n"
     "    - {name: gpu, rename: b, devices: [GPU-2], replicas: 2}\n",
     "ERR cfg.yaml:5: sharing.timeSlicing.resources[1].devices: device GPU-2 (GPU 2) is already "
     "shared by sharing.timeSlicing.resources[0]"},
    {"ts_partial_without_rename", H100x8,
     "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, devices: [0, 1], replicas: 2}\n",
     "ERR cfg.yaml:4: sharing.timeSlicing.resources[0].devices: shares 2 of the 8 devices of "
     "nvidia.com/gpu without renaming them"},
    {"ts_count_too_large", H100x8,
     "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
     "    - {name: gpu, devices: 9, replicas: 2}\n",
     "ERR sharing.timeSlicing.resources[0].devices: asks for 9 devices, but nvidia.com/gpu has "
     "only 8 on this node"},
    {"ts_mig_enabled_gpu_as_whole_gpu", A100Mixed,
     "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    renameByDefault: true\n"
     "    resources:\n    - {name: gpu, devices: [0], replicas: 2}\n",
     "ERR GPU 0 has no devices in nvidia.com/gpu (MIG is enabled on it"},

    // --- MPS ---
    {"mps_all", H100x8, "sharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 10}\n",
     "nvidia.com/gpu=80/10:mps"},
    {"mps_48_on_hopper", H100x8,
     "sharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 48}\n",
     "nvidia.com/gpu=384/48:mps"},
    {"mps_49_on_hopper", H100x8,
     "sharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 49}\n",
     "ERR cfg.yaml:4: sharing.mps.resources[0].replicas: MPS serves at most 48 clients per GPU, "
     "got 49"},
    {"mps_16_on_volta", V100x4,
     "sharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 16}\n",
     "nvidia.com/gpu=64/16:mps"},
    {"mps_17_on_volta", V100x4,
     "sharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 17}\n",
     "ERR sharing.mps.resources[0].replicas: MPS serves at most 16 clients per GPU before compute "
     "capability 7.5 (GPU 0 is 7.0), got 17"},
    {"mps_48_on_turing", T4x2,
     "sharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 48}\n",
     "nvidia.com/gpu=96/48:mps"},
    {"mps_per_gpu_renamed", H100x8,
     "sharing:\n  mps:\n    resources:\n    - {name: gpu, rename: gpu.mps, devices: [4, 5], "
     "replicas: 4}\n",
     "nvidia.com/gpu=6 nvidia.com/gpu.mps=8/4:mps"},
    {"mps_entries_disagree", H100x8,
     "sharing:\n  mps:\n    resources:\n"
     "    - {name: gpu, rename: gpu.mps, devices: [0], replicas: 4}\n"
     "    - {name: gpu, rename: gpu.mps, devices: [1], replicas: 2}\n",
     "ERR cfg.yaml:5: sharing.mps.resources[1].replicas: MPS entries of nvidia.com/gpu.mps must "
     "give the same replicas"},
    {"mps_on_mig", A100Mixed,
     "flags: {migStrategy: mixed}\nsharing:\n  mps:\n    resources:\n"
     "    - {name: mig-1g.5gb, replicas: 2}\n",
     "ERR cfg.yaml:5: sharing.mps.resources[0].name: MPS on MIG devices is not supported"},
    // --- memory pool ---
    {"mem_all_h100", H100x8, "sharing:\n  memory:\n    resources:\n    - name: gpu\n",
     "gpulet.io/gpu-memory-1gi=632/79:memory"},
    {"mem_two_gpus_rest_whole", H100x8,
     "sharing:\n  memory:\n    resources:\n    - {name: gpu, devices: [0, GPU-1]}\n",
     "gpulet.io/gpu-memory-1gi=158/79:memory nvidia.com/gpu=6"},
    {"mem_and_time_slicing_on_other_gpus", H100x8,
     "sharing:\n  timeSlicing:\n    resources:\n"
     "    - {name: gpu, devices: [2, 3, 4, 5, 6, 7], replicas: 2}\n"
     "  memory:\n    resources:\n    - {name: gpu, devices: 2}\n",
     "gpulet.io/gpu-memory-1gi=158/79:memory nvidia.com/gpu=12/2:time-slicing"},
    {"mem_512mi_unit", H100x8,
     "sharing:\n  memory:\n    unit: 512Mi\n    resources:\n    - {name: gpu, devices: [0]}\n",
     "gpulet.io/gpu-memory-512mi=159/159:memory nvidia.com/gpu=7"},
    {"mem_renamed", H100x8,
     "sharing:\n  memory:\n    rename: example.com/vram\n    resources:\n"
     "    - {name: gpu, devices: [7]}\n",
     "example.com/vram=79/79:memory nvidia.com/gpu=7"},
    {"mem_mixed_a100_takes_whole_gpus", A100Mixed,
     "flags: {migStrategy: mixed}\nsharing:\n  memory:\n    resources:\n    - name: gpu\n",
     "gpulet.io/gpu-memory-1gi=240/40:memory nvidia.com/mig-1g.5gb=9 nvidia.com/mig-2g.10gb=1 "
     "nvidia.com/mig-3g.20gb=1"},
    {"mem_gpu_also_time_sliced", H100x8,
     "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 2}\n"
     "  memory:\n    resources:\n    - {name: gpu, devices: [0]}\n",
     "ERR cfg.yaml:4: sharing.timeSlicing.resources[0].devices: GPU 0 (GPU-0) is in the memory "
     "pool (sharing.memory.resources[0]); a GPU is in exactly one pool"},
    {"mem_gpu_also_mps", H100x8,
     "sharing:\n  mps:\n    resources:\n"
     "    - {name: gpu, rename: gpu.mps, devices: [3, 1], replicas: 4}\n"
     "  memory:\n    resources:\n    - {name: gpu, devices: [1]}\n",
     "ERR cfg.yaml:4: sharing.mps.resources[0].devices: GPU 1 (GPU-1) is in the memory pool "
     "(sharing.memory.resources[0])"},
    {"mem_unit_larger_than_gpu", H100x8,
     "sharing:\n  memory:\n    unit: 128Gi\n    resources:\n    - name: gpu\n",
     "ERR cfg.yaml:3: sharing.memory.unit: unit 128Gi is larger than GPU 0's memory (81559 MiB)"},
    {"mem_unit_too_small", H100x8,
     "sharing:\n  memory:\n    unit: 1Mi\n    resources:\n    - name: gpu\n",
     "ERR cfg.yaml:3: sharing.memory.unit: unit 1Mi splits GPU 0 into 81559 devices, more than "
     "4096"},
    {"mem_on_mig_single",
     [] {
       return MigEverywhere(2, {"3g.40gb", "3g.40gb"});
     },
     "flags: {migStrategy: single}\nsharing:\n  memory:\n    resources:\n    - name: gpu\n",
     "ERR cfg.yaml:5: sharing.memory.resources[0].devices: the memory pool takes whole GPUs, and "
     "MIG-0-0 is a MIG device"},
    {"mem_gpu_twice", H100x8,
     "sharing:\n  memory:\n    resources:\n    - {name: gpu, devices: [0]}\n"
     "    - {name: gpu, devices: [GPU-0]}\n",
     "ERR cfg.yaml:5: sharing.memory.resources[1].devices: GPU 0 (GPU-0) is already in the memory "
     "pool (sharing.memory.resources[0])"},
    {"mem_unknown_device", H100x8,
     "sharing:\n  memory:\n    resources:\n    - {name: gpu, devices: [9]}\n",
     "ERR cfg.yaml:4: sharing.memory.resources[0].devices[0]: unknown device \"9\""},
    {"mem_name_clashes_with_time_slicing", H100x8,
     "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
     "    - {name: gpu, devices: [1], replicas: 2}\n"
     "  memory:\n    rename: nvidia.com/gpu.shared\n    resources:\n"
     "    - {name: gpu, devices: [0]}\n",
     "ERR cfg.yaml:7: sharing.memory.rename: advertised name \"nvidia.com/gpu.shared\" clashes"},
};

INSTANTIATE_TEST_SUITE_P(Cases, PlanTable, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// ---- Details the summary does not show ----

TEST(BuildPlanTest, ReplicaIdsCarryTheirParent) {
  config::Config cfg = Parse(
      "sharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: true\n    resources:\n"
      "    - {name: gpu, rename: gpu.shared, devices: [1, 6], replicas: 3}\n");
  gpu::Inventory inv = WholeGpus(8);
  Result<Plan> p = BuildPlan(inv, cfg);
  ASSERT_TRUE(p.ok()) << p.status().message();
  const Resource* shared = p->Find("nvidia.com/gpu.shared");
  ASSERT_NE(shared, nullptr);
  EXPECT_EQ(shared->socket_name, "nvidia-gpu.shared.sock");
  EXPECT_TRUE(shared->fail_requests_greater_than_one);
  ASSERT_EQ(shared->devices.size(), 6u);
  const char* want[] = {"GPU-1::0", "GPU-1::1", "GPU-1::2", "GPU-6::0", "GPU-6::1", "GPU-6::2"};
  for (size_t i = 0; i < 6; ++i) {
    const AdvertisedDevice& d = shared->devices[i];
    EXPECT_EQ(d.id, want[i]);
    EXPECT_EQ(d.replica, static_cast<int>(i % 3));
    EXPECT_EQ(d.replicas, 3);
    EXPECT_EQ(d.uuid, BaseDeviceId(d.id));
    EXPECT_EQ(d.index, i < 3 ? "1" : "6");
    EXPECT_EQ(d.numa_node, i < 3 ? 0 : 1);
  }
  const Resource* plain = p->Find("nvidia.com/gpu");
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(plain->sharing, SharingKind::kNone);
  EXPECT_EQ(plain->Find("GPU-1"), nullptr);
  EXPECT_NE(plain->Find("GPU-0"), nullptr);
}

TEST(BuildPlanTest, PerGpuReplicaCountsInOneResource) {
  config::Config cfg = Parse(
      "sharing:\n  timeSlicing:\n    resources:\n"
      "    - {name: gpu, rename: gpu.shared, devices: [0], replicas: 2}\n"
      "    - {name: gpu, rename: gpu.shared, devices: [1], replicas: 5}\n");
  Result<Plan> p = BuildPlan(WholeGpus(2), cfg);
  ASSERT_TRUE(p.ok()) << p.status().message();
  ASSERT_EQ(p->resources.size(), 1u);  // nothing left on nvidia.com/gpu
  const Resource& r = p->resources[0];
  EXPECT_EQ(r.replicas, 5);
  EXPECT_FALSE(r.fail_requests_greater_than_one);  // time-slicing default
  ASSERT_EQ(r.devices.size(), 7u);
  EXPECT_EQ(r.devices[1].id, "GPU-0::1");
  EXPECT_EQ(r.devices[1].replicas, 2);
  EXPECT_EQ(r.devices[6].id, "GPU-1::4");
  EXPECT_EQ(r.devices[6].replicas, 5);
}

TEST(BuildPlanTest, MixedMigDevicesKnowTheirParent) {
  Result<Plan> p = BuildPlan(A100Mixed(), Parse("flags: {migStrategy: mixed}\n"));
  ASSERT_TRUE(p.ok()) << p.status().message();
  const Resource* small = p->Find("nvidia.com/mig-1g.5gb");
  ASSERT_NE(small, nullptr);
  ASSERT_EQ(small->devices.size(), 9u);
  const AdvertisedDevice& d = small->devices[0];
  EXPECT_EQ(d.id, "MIG-0-2");
  EXPECT_EQ(d.uuid, "MIG-0-2");
  EXPECT_EQ(d.parent_uuid, "GPU-0");
  EXPECT_EQ(d.index, "0:2");
  EXPECT_EQ(d.mig_index, 2u);
  EXPECT_EQ(small->devices[2].id, "MIG-1-0");
  EXPECT_EQ(p->Find("nvidia.com/mig-3g.20gb")->socket_name, "nvidia-mig-3g.20gb.sock");
  const Resource* whole = p->Find("nvidia.com/gpu");
  ASSERT_NE(whole, nullptr);
  EXPECT_EQ(whole->devices.front().id, "GPU-2");
}

TEST(BuildPlanTest, MpsDefaultsToFailRequestsGreaterThanOne) {
  Result<Plan> p = BuildPlan(WholeGpus(2), Parse("sharing:\n  mps:\n    resources:\n"
                                                 "    - {name: gpu, replicas: 2}\n"));
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_TRUE(p->resources[0].fail_requests_greater_than_one);
  Result<Plan> q =
      BuildPlan(WholeGpus(2), Parse("sharing:\n  mps:\n    failRequestsGreaterThanOne: false\n"
                                    "    resources:\n    - {name: gpu, replicas: 2}\n"));
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_FALSE(q->resources[0].fail_requests_greater_than_one);
}

TEST(BuildPlanTest, SkippedEntriesAreNoted) {
  Result<Plan> p = BuildPlan(A100Mixed(), Parse("flags: {migStrategy: mixed}\nsharing:\n"
                                                "  timeSlicing:\n    resources:\n"
                                                "    - {name: mig-7g.40gb, replicas: 2}\n"));
  ASSERT_TRUE(p.ok()) << p.status().message();
  ASSERT_EQ(p->notes.size(), 1u);
  EXPECT_NE(p->notes[0].find("cfg.yaml:5: sharing.timeSlicing.resources[0]: "
                             "nvidia.com/mig-7g.40gb has no devices on this node"),
            std::string::npos)
      << p->notes[0];
}

TEST(BuildPlanTest, MigStrategyErrorWithoutFile) {
  config::Config cfg;
  cfg.flags.mig_strategy = config::MigStrategy::kSingle;
  Result<Plan> p = BuildPlan(A100Mixed(), cfg);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message().rfind("flags.migStrategy: single", 0), 0u) << p.status().message();
}

TEST(SameDevicesTest, SeesMigChanges) {
  gpu::Inventory a = A100Mixed();
  gpu::Inventory b = A100Mixed();
  EXPECT_TRUE(SameDevices(a, b));
  b.gpus[1].mig_devices.pop_back();
  EXPECT_FALSE(SameDevices(a, b));
  b = A100Mixed();
  b.gpus[0].mig_devices[1].profile = "2g.20gb";
  EXPECT_FALSE(SameDevices(a, b));
  b = A100Mixed();
  b.gpus[2].mig_enabled = true;
  EXPECT_FALSE(SameDevices(a, b));
  b = A100Mixed();
  b.gpus[3].memory_mib = 1;  // not a device change
  EXPECT_TRUE(SameDevices(a, b));
}

}  // namespace
}  // namespace gpulet::sharing

namespace gpulet::sharing {
namespace {

TEST(MemoryPoolPlanTest, UnitIdsNameTheGpuAndKeepItsNumaNode) {
  Result<config::Config> c = config::ParseConfig(
      "sharing:\n  memory:\n    resources:\n    - {name: gpu, devices: [4]}\n", "cfg.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  Result<Plan> p = BuildPlan(testing::WholeGpus(8), *c);
  ASSERT_TRUE(p.ok()) << p.status().message();
  const Resource* r = p->Find("gpulet.io/gpu-memory-1gi");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->socket_name, "gpulet-gpu-memory-1gi.sock");
  EXPECT_EQ(r->unit_bytes, uint64_t{1} << 30);
  ASSERT_EQ(r->devices.size(), 79u);
  for (size_t k = 0; k < r->devices.size(); ++k) {
    const AdvertisedDevice& d = r->devices[k];
    EXPECT_EQ(d.id, "GPU-4::mem-" + std::to_string(k));
    EXPECT_EQ(d.uuid, "GPU-4");
    EXPECT_EQ(d.gpu_index, 4u);
    EXPECT_EQ(d.replica, static_cast<int>(k));
    EXPECT_EQ(d.replicas, 79);
    EXPECT_EQ(d.numa_node, 1);
    EXPECT_EQ(BaseDeviceId(d.id), "GPU-4");
  }
  EXPECT_EQ(MemoryUnitId("GPU-x", 3), "GPU-x::mem-3");
  EXPECT_EQ(p->Find("nvidia.com/gpu")->devices.size(), 7u);
}

}  // namespace
}  // namespace gpulet::sharing
