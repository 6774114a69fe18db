// Allocation, preferred allocation and health of shared and MIG resources, on plans built by
// sharing::BuildPlan from real config text.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "deviceplugin/allocate.h"
#include "deviceplugin/preferred.h"
#include "deviceplugin/resource_server.h"
#include "sharing/test_inventories.h"

namespace gpulet::deviceplugin {
namespace {

sharing::Plan PlanFor(const gpu::Inventory& inv, const std::string& yaml) {
  Result<config::Config> cfg = config::ParseConfig(yaml, "cfg.yaml");
  EXPECT_TRUE(cfg.ok()) << cfg.status().message();
  Result<sharing::Plan> plan = sharing::BuildPlan(inv, cfg.ok() ? *cfg : config::Config{});
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return plan.ok() ? *plan : sharing::Plan{};
}

std::vector<std::string> AllIds(const sharing::Resource& r) {
  std::vector<std::string> out;
  for (const auto& d : r.devices) out.push_back(d.id);
  return out;
}

// Replicas per backing UUID in `ids`.
std::map<std::string, int> PerDevice(const std::vector<std::string>& ids) {
  std::map<std::string, int> out;
  for (const std::string& id : ids) ++out[sharing::BaseDeviceId(id)];
  return out;
}

class TimeSlicedTest : public ::testing::Test {
 protected:
  gpu::Inventory inv_ = sharing::testing::WholeGpus(8);
  sharing::Plan plan_ = PlanFor(inv_,
                                "sharing:\n  timeSlicing:\n    resources:\n"
                                "    - {name: gpu, replicas: 4}\n");
  const sharing::Resource& r_ = plan_.resources.at(0);
};

TEST_F(TimeSlicedTest, AllocateStripsReplicaSuffixAndDeduplicates) {
  Result<v1beta1::ContainerAllocateResponse> a =
      BuildContainerAllocateResponse(r_, inv_, {}, {"GPU-3::1", "GPU-3::2", "GPU-5::0"}, "u");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->envs().at("NVIDIA_VISIBLE_DEVICES"), "GPU-3,GPU-5");
  AllocateOptions idx;
  idx.device_id_strategy = config::DeviceIdStrategy::kIndex;
  idx.pass_device_specs = true;
  a = BuildContainerAllocateResponse(r_, inv_, idx, {"GPU-3::1", "GPU-3::2"}, "u");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->envs().at("NVIDIA_VISIBLE_DEVICES"), "3");
  int nvidia3 = 0;
  for (const auto& d : a->devices()) nvidia3 += d.container_path() == "/dev/nvidia3";
  EXPECT_EQ(nvidia3, 1);

  Result<v1beta1::ContainerAllocateResponse> bad =
      BuildContainerAllocateResponse(r_, inv_, {}, {"GPU-3::9"}, "u");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown device ID \"GPU-3::9\""), std::string::npos);
  bad = BuildContainerAllocateResponse(r_, inv_, {}, {"GPU-3"}, "u");  // the bare GPU is not ours
  EXPECT_FALSE(bad.ok());
}

TEST_F(TimeSlicedTest, FailRequestsGreaterThanOneNamesResourceAndCount) {
  sharing::Plan p = PlanFor(inv_,
                            "sharing:\n  timeSlicing:\n    renameByDefault: true\n"
                            "    failRequestsGreaterThanOne: true\n    resources:\n"
                            "    - {name: gpu, replicas: 4}\n");
  const sharing::Resource& r = p.resources.at(0);
  Result<v1beta1::ContainerAllocateResponse> a =
      BuildContainerAllocateResponse(r, inv_, {}, {"GPU-0::0", "GPU-1::0", "GPU-2::0"}, "u");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), ErrorCode::kInvalidInput);
  EXPECT_NE(a.status().message().find("resource nvidia.com/gpu.shared is shared"),
            std::string::npos)
      << a.status().message();
  EXPECT_NE(a.status().message().find("got a request for 3"), std::string::npos);
  EXPECT_TRUE(BuildContainerAllocateResponse(r, inv_, {}, {"GPU-1::3"}, "u").ok());
}

TEST_F(TimeSlicedTest, DistributedSpreadsOverGpus) {
  Result<std::vector<std::string>> ids = PreferredAllocation(r_, inv_, AllIds(r_), {}, 8);
  ASSERT_TRUE(ids.ok()) << ids.status().message();
  std::map<std::string, int> per = PerDevice(*ids);
  EXPECT_EQ(per.size(), 8u);  // one replica on each GPU
  // GPUs 0-5 half used by other pods: the next replica goes to the idle GPU 6.
  std::vector<std::string> avail;
  for (const auto& d : r_.devices) {
    if (d.gpu_index >= 6 || d.replica >= 2) avail.push_back(d.id);
  }
  ids = PreferredAllocation(r_, inv_, avail, {}, 1);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, std::vector<std::string>{"GPU-6::0"});
  ids = PreferredAllocation(r_, inv_, avail, {}, 3);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<std::string>{"GPU-6::0", "GPU-6::1", "GPU-7::0"}));
}

TEST_F(TimeSlicedTest, PackedFillsOneGpuFirst) {
  const ReplicaPolicy packed = ReplicaPolicy::kPacked;
  Result<std::vector<std::string>> ids = PreferredAllocation(r_, inv_, AllIds(r_), {}, 6, packed);
  ASSERT_TRUE(ids.ok()) << ids.status().message();
  EXPECT_EQ(*ids, (std::vector<std::string>{"GPU-0::0", "GPU-0::1", "GPU-0::2", "GPU-0::3",
                                            "GPU-1::0", "GPU-1::1"}));
  // GPU 5 is the busiest with a free replica left: it is filled first.
  std::vector<std::string> avail;
  for (const auto& d : r_.devices) {
    if (d.gpu_index != 5 || d.replica == 3) avail.push_back(d.id);
  }
  ids = PreferredAllocation(r_, inv_, avail, {}, 2, packed);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<std::string>{"GPU-0::0", "GPU-5::3"}));
}

TEST_F(TimeSlicedTest, MustIncludeAndDeterminism) {
  for (ReplicaPolicy p : {ReplicaPolicy::kDistributed, ReplicaPolicy::kPacked}) {
    Result<std::vector<std::string>> a =
        PreferredAllocation(r_, inv_, AllIds(r_), {"GPU-7::2"}, 3, p);
    Result<std::vector<std::string>> b =
        PreferredAllocation(r_, inv_, AllIds(r_), {"GPU-7::2"}, 3, p);
    ASSERT_TRUE(a.ok()) << a.status().message();
    EXPECT_EQ(*a, *b);
    ASSERT_EQ(a->size(), 3u);
    EXPECT_NE(std::find(a->begin(), a->end(), "GPU-7::2"), a->end());
    EXPECT_EQ(std::set<std::string>(a->begin(), a->end()).size(), 3u);
    EXPECT_TRUE(std::is_sorted(a->begin(), a->end(), [&](const auto& x, const auto& y) {
      return r_.Find(x) < r_.Find(y);
    }));
  }
  // distributed: the must-included GPU already holds one of ours, so the rest go elsewhere.
  Result<std::vector<std::string>> d = PreferredAllocation(r_, inv_, AllIds(r_), {"GPU-7::2"}, 3);
  EXPECT_EQ(*d, (std::vector<std::string>{"GPU-0::0", "GPU-1::0", "GPU-7::2"}));
  Result<std::vector<std::string>> k =
      PreferredAllocation(r_, inv_, AllIds(r_), {"GPU-7::2"}, 3, ReplicaPolicy::kPacked);
  EXPECT_EQ(*k, (std::vector<std::string>{"GPU-7::0", "GPU-7::1", "GPU-7::2"}));
}

TEST(ReplicaPolicyTest, Parse) {
  EXPECT_EQ(*ParseReplicaPolicy("packed"), ReplicaPolicy::kPacked);
  EXPECT_EQ(*ParseReplicaPolicy("distributed"), ReplicaPolicy::kDistributed);
  Result<ReplicaPolicy> bad = ParseReplicaPolicy("spread");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("distributed|packed"), std::string::npos);
  EXPECT_STREQ(ReplicaPolicyName(ReplicaPolicy::kPacked), "packed");
}

TEST(SharedHealthTest, EveryReplicaFollowsItsGpuAndRecovers) {
  gpu::Inventory inv = sharing::testing::WholeGpus(2);
  sharing::Plan p =
      PlanFor(inv, "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 3}\n");
  const sharing::Resource& r = p.resources.at(0);
  gpu::HealthSnapshot snap;
  snap.devices["GPU-1"] = gpu::DeviceHealth{false, "XID 79"};
  v1beta1::ListAndWatchResponse list = DeviceList(r, snap);
  ASSERT_EQ(list.devices_size(), 6);
  for (const auto& d : list.devices()) {
    EXPECT_EQ(d.health(), d.id().rfind("GPU-1::", 0) == 0 ? kUnhealthy : kHealthy) << d.id();
    ASSERT_EQ(d.topology().nodes_size(), 1);
  }
  snap.devices["GPU-1"] = gpu::DeviceHealth{};
  const v1beta1::ListAndWatchResponse list1 = DeviceList(r, snap);
  for (const auto& d : list1.devices()) EXPECT_EQ(d.health(), kHealthy);
}

TEST(SharedHealthTest, MpsDaemonDownMarksItsResourceOnly) {
  gpu::Inventory inv = sharing::testing::WholeGpus(4);
  sharing::Plan p = PlanFor(inv,
                            "sharing:\n  mps:\n    resources:\n"
                            "    - {name: gpu, rename: gpu.mps, devices: [0, 1], replicas: 2}\n");
  gpu::HealthSnapshot snap;
  snap.devices[MpsHealthKey("nvidia.com/gpu.mps")] = gpu::DeviceHealth{false, "MPS daemon down"};
  const v1beta1::ListAndWatchResponse list2 = DeviceList(*p.Find("nvidia.com/gpu.mps"), snap);
  for (const auto& d : list2.devices()) {
    EXPECT_EQ(d.health(), kUnhealthy);
  }
  const v1beta1::ListAndWatchResponse list3 = DeviceList(*p.Find("nvidia.com/gpu"), snap);
  for (const auto& d : list3.devices()) {
    EXPECT_EQ(d.health(), kHealthy);
  }
}

TEST(MigAllocateTest, MigUuidsAndCapabilityNodes) {
  gpu::Inventory inv = sharing::testing::A100Mixed();
  sharing::Plan p = PlanFor(inv, "flags: {migStrategy: mixed}\n");
  const sharing::Resource* small = p.Find("nvidia.com/mig-1g.5gb");
  ASSERT_NE(small, nullptr);
  AllocateOptions o;
  o.pass_device_specs = true;
  o.nvidia_dev_root = "/run/nvidia/driver";
  Result<v1beta1::ContainerAllocateResponse> a =
      BuildContainerAllocateResponse(*small, inv, o, {"MIG-1-3"}, "u");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->envs().at("NVIDIA_VISIBLE_DEVICES"), "MIG-1-3");
  std::map<std::string, std::string> specs;
  for (const auto& d : a->devices()) specs[d.container_path()] = d.host_path();
  EXPECT_EQ(specs.at("/dev/nvidia1"), "/run/nvidia/driver/dev/nvidia1");
  EXPECT_EQ(specs.at("/dev/nvidia-caps/nvidia-cap107"),
            "/run/nvidia/driver/dev/nvidia-caps/nvidia-cap107");
  EXPECT_EQ(specs.count("/dev/nvidia-caps/nvidia-cap108"), 1u);
  EXPECT_EQ(specs.count("/dev/nvidia0"), 0u);
  EXPECT_EQ(specs.count("/dev/nvidiactl"), 1u);

  AllocateOptions idx;
  idx.device_id_strategy = config::DeviceIdStrategy::kIndex;
  a = BuildContainerAllocateResponse(*small, inv, idx, {"MIG-0-3", "MIG-1-0"}, "u");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->envs().at("NVIDIA_VISIBLE_DEVICES"), "0:3,1:0");
}

TEST(MigAllocateTest, TimeSlicedMigReplicas) {
  gpu::Inventory inv = sharing::testing::A100Mixed();
  sharing::Plan p = PlanFor(inv,
                            "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n"
                            "    resources:\n    - {name: mig-3g.20gb, replicas: 2}\n");
  const sharing::Resource* big = p.Find("nvidia.com/mig-3g.20gb");
  ASSERT_NE(big, nullptr);
  ASSERT_EQ(AllIds(*big), (std::vector<std::string>{"MIG-0-0::0", "MIG-0-0::1"}));
  Result<v1beta1::ContainerAllocateResponse> a =
      BuildContainerAllocateResponse(*big, inv, {}, {"MIG-0-0::1"}, "u");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->envs().at("NVIDIA_VISIBLE_DEVICES"), "MIG-0-0");
  gpu::HealthSnapshot snap;
  snap.devices["GPU-0"] = gpu::DeviceHealth{false, "XID 48"};  // the parent
  const v1beta1::ListAndWatchResponse list4 = DeviceList(*big, snap);
  for (const auto& d : list4.devices()) EXPECT_EQ(d.health(), kUnhealthy);
}

class MpsAllocateTest : public ::testing::Test {
 protected:
  gpu::Inventory inv_ = sharing::testing::WholeGpus(4, 9, 0, 81920);
  sharing::Plan plan_ = PlanFor(inv_,
                                "sharing:\n  mps:\n    failRequestsGreaterThanOne: false\n"
                                "    resources:\n    - {name: gpu, replicas: 4}\n");
  const sharing::Resource& r_ = plan_.resources.at(0);
  AllocateOptions Options() const {
    AllocateOptions o;
    o.mps["nvidia.com/gpu"] =
        MpsMount{"/run/nvidia/mps/nvidia.com_gpu/pipe", "/run/nvidia/mps/shm"};
    return o;
  }
};

TEST_F(MpsAllocateTest, PipeShmAndPerContainerLimits) {
  Result<v1beta1::ContainerAllocateResponse> a =
      BuildContainerAllocateResponse(r_, inv_, Options(), {"GPU-2::1"}, "u");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->envs().at("NVIDIA_VISIBLE_DEVICES"), "GPU-2");
  EXPECT_EQ(a->envs().at("CUDA_MPS_PIPE_DIRECTORY"), "/mps/nvidia.com_gpu/pipe");
  EXPECT_EQ(a->envs().at("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "25");
  EXPECT_EQ(a->envs().at("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "0=20480M");
  std::map<std::string, std::string> mounts;
  for (const auto& m : a->mounts()) mounts[m.container_path()] = m.host_path();
  EXPECT_EQ(mounts.at("/mps/nvidia.com_gpu/pipe"), "/run/nvidia/mps/nvidia.com_gpu/pipe");
  EXPECT_EQ(mounts.at("/dev/shm"), "/run/nvidia/mps/shm");
}

TEST_F(MpsAllocateTest, SeveralReplicasAddUpPerGpu) {
  Result<v1beta1::ContainerAllocateResponse> a = BuildContainerAllocateResponse(
      r_, inv_, Options(), {"GPU-3::0", "GPU-1::0", "GPU-3::2"}, "u");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->envs().at("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "50");
  // Ordinal 0 is GPU 1 (one replica), ordinal 1 is GPU 3 (two replicas).
  EXPECT_EQ(a->envs().at("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "0=20480M,1=40960M");
}

TEST_F(MpsAllocateTest, DefaultRejectsMoreThanOneAndMissingDaemon) {
  sharing::Plan p =
      PlanFor(inv_, "sharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 4}\n");
  Result<v1beta1::ContainerAllocateResponse> a = BuildContainerAllocateResponse(
      p.resources.at(0), inv_, Options(), {"GPU-0::0", "GPU-0::1"}, "u");
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("got a request for 2"), std::string::npos);
  a = BuildContainerAllocateResponse(p.resources.at(0), inv_, {}, {"GPU-0::0"}, "u");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), ErrorCode::kUnavailable);
  EXPECT_NE(a.status().message().find("no MPS daemon serves nvidia.com/gpu"), std::string::npos);
}

}  // namespace
}  // namespace gpulet::deviceplugin
