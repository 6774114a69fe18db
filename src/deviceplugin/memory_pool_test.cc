// The memory pool on the plugin side: GetPreferredAllocation keeps a container on one GPU (best
// fit, spread, must-include), Allocate refuses units of two GPUs with a message naming them and
// tells the container its limit, and gpulet.memoryLimits enforces units × unit.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>

#include "cudashim/region.h"
#include "deviceplugin/allocate.h"
#include "deviceplugin/memory_limits.h"
#include "deviceplugin/preferred.h"
#include "sharing/test_inventories.h"

namespace gpulet::deviceplugin {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr char kMem[] = "gpulet.io/gpu-memory-1gi";

class MemoryPoolTest : public ::testing::Test {
 protected:
  void Build(const std::string& yaml) {
    auto cfg = config::ParseConfig(yaml, "cfg.yaml");
    ASSERT_TRUE(cfg.ok()) << cfg.status().message();
    cfg_ = *cfg;
    auto plan = sharing::BuildPlan(inv_, cfg_);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    plan_ = *plan;
    ASSERT_NE(plan_.Find(kMem), nullptr);
  }
  void SetUp() override {
    Build("sharing:\n  memory:\n    resources:\n    - {name: gpu, devices: [0, 1, 2, 3, 4]}\n");
  }
  const sharing::Resource& Mem() const { return *plan_.Find(kMem); }

  // Every unit not in `held`.
  std::vector<std::string> FreeExcept(const std::set<std::string>& held) const {
    std::vector<std::string> out;
    for (const auto& d : Mem().devices) {
      if (!held.count(d.id)) out.push_back(d.id);
    }
    return out;
  }
  // `n` units of GPU `gpu`, from unit `from`.
  static std::set<std::string> Units(unsigned gpu, int from, int n) {
    std::set<std::string> out;
    for (int k = from; k < from + n; ++k) {
      out.insert(sharing::MemoryUnitId("GPU-" + std::to_string(gpu), k));
    }
    return out;
  }
  static std::set<unsigned> GpusOf(const std::vector<std::string>& ids) {
    std::set<unsigned> out;
    for (const std::string& id : ids) out.insert(std::stoi(id.substr(4, id.find("::") - 4)));
    return out;
  }

  gpu::Inventory inv_ = sharing::testing::WholeGpus(8);  // 81559 MiB: 79 units each
  config::Config cfg_;
  sharing::Plan plan_;
};

TEST_F(MemoryPoolTest, PreferredIsBestFitOnOneGpu) {
  // GPU 0: 60 held (19 free), GPU 1: 70 held (9 free), GPU 2: 39 held (40 free), 3 and 4 empty.
  std::set<std::string> held = Units(0, 0, 60);
  for (const auto& s : {Units(1, 0, 70), Units(2, 10, 39)}) held.insert(s.begin(), s.end());
  struct Case {
    int size;
    unsigned want_gpu;
  } cases[] = {{9, 1}, {5, 1}, {10, 0}, {19, 0}, {20, 2}, {40, 2}, {41, 3}, {79, 3}};
  for (const Case& c : cases) {
    auto ids = PreferredAllocation(Mem(), inv_, FreeExcept(held), {}, c.size);
    ASSERT_TRUE(ids.ok()) << c.size << ": " << ids.status().message();
    ASSERT_EQ(ids->size(), static_cast<size_t>(c.size));
    EXPECT_EQ(GpusOf(*ids), std::set<unsigned>{c.want_gpu}) << "size " << c.size;
    for (const std::string& id : *ids) EXPECT_FALSE(held.count(id)) << id;
  }
  // GPU 2's free units are 0-9 and 49-78: the lowest numbers first.
  auto ids = PreferredAllocation(Mem(), inv_, FreeExcept(held), {}, 20);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ((*ids)[0], "GPU-2::mem-0");
  EXPECT_EQ(ids->back(), "GPU-2::mem-58");
}

TEST_F(MemoryPoolTest, SpreadTakesTheEmptiestGpu) {
  std::set<std::string> held = Units(0, 0, 60);
  auto ids = PreferredAllocation(Mem(), inv_, FreeExcept(held), {}, 5, ReplicaPolicy::kDistributed,
                                 config::MemoryPlacement::kSpread);
  ASSERT_TRUE(ids.ok()) << ids.status().message();
  EXPECT_EQ(GpusOf(*ids), std::set<unsigned>{1});  // 1-4 tie at 79 free: plan order
}

TEST_F(MemoryPoolTest, MustIncludePinsTheGpu) {
  const std::set<std::string> must = Units(3, 5, 2);
  auto ids = PreferredAllocation(Mem(), inv_, FreeExcept({}),
                                 std::vector<std::string>(must.begin(), must.end()), 10);
  ASSERT_TRUE(ids.ok()) << ids.status().message();
  EXPECT_EQ(GpusOf(*ids), std::set<unsigned>{3});
  for (const std::string& m : must) EXPECT_NE(std::find(ids->begin(), ids->end(), m), ids->end());

  auto spans =
      PreferredAllocation(Mem(), inv_, FreeExcept({}), {"GPU-0::mem-0", "GPU-1::mem-0"}, 4);
  ASSERT_FALSE(spans.ok());
  EXPECT_NE(spans.status().message().find("on GPU 0 and GPU 1"), std::string::npos)
      << spans.status().message();
}

TEST_F(MemoryPoolTest, NoGpuLargeEnoughNamesTheLargestHole) {
  // 5 × 79 = 395 units free in total, but a container takes one GPU: 80 cannot be placed.
  auto ids = PreferredAllocation(Mem(), inv_, FreeExcept({}), {}, 80);
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().code(), ErrorCode::kInvalidInput);
  EXPECT_NE(ids.status().message().find("no GPU of gpulet.io/gpu-memory-1gi has 80 free units "
                                        "for one container (the largest free block is 79 on "
                                        "GPU 0)"),
            std::string::npos)
      << ids.status().message();
}

TEST_F(MemoryPoolTest, AllocateTellsTheLimitAndRefusesTwoGpus) {
  AllocateOptions o;
  auto r = BuildContainerAllocateResponse(Mem(), inv_, o, {"GPU-4::mem-7", "GPU-4::mem-8"}, "u");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->envs().at("NVIDIA_VISIBLE_DEVICES"), "GPU-4");
  EXPECT_EQ(r->envs().at(kMemoryLimitEnv), std::to_string(2 * kGiB));
  EXPECT_EQ(r->envs().at(kMemoryUnitsEnv), "2");
  EXPECT_EQ(r->envs().count("GPULET_CUDA_DIR"), 0u);  // accounted only: no library configured

  auto bad = BuildContainerAllocateResponse(
      Mem(), inv_, o,
      {"GPU-0::mem-0", "GPU-0::mem-1", "GPU-2::mem-3", "GPU-0::mem-2", "GPU-0::mem-5"}, "u");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidInput);
  EXPECT_EQ(bad.status().message(),
            "gpulet.io/gpu-memory-1gi: a container's memory units must all be on one GPU, got 4 "
            "on GPU 0 (GPU-0: GPU-0::mem-0, GPU-0::mem-1, GPU-0::mem-2, …); 1 on GPU 2 (GPU-2: "
            "GPU-2::mem-3) (the kubelet did not follow GetPreferredAllocation; see "
            "docs/sharing.md, Memory pool)");
}

TEST_F(MemoryPoolTest, MemoryLimitsEnforceUnitsTimesUnit) {
  const std::string yaml =
      "sharing:\n  memory:\n    resources:\n    - {name: gpu, devices: [0, 1]}\n"
      "gpulet:\n  memoryLimits:\n    resources:\n    - name: gpulet.io/gpu-memory-1gi\n";
  Build(yaml);
  auto limits = config::ParseMemoryLimits(yaml, "cfg.yaml");
  ASSERT_TRUE(limits.ok() && limits->has_value()) << limits.status().message();
  auto settings = ResolveMemoryLimits(**limits, cfg_, plan_);
  ASSERT_TRUE(settings.ok()) << settings.status().message();
  ASSERT_EQ(settings->count(kMem), 1u);
  EXPECT_EQ(settings->at(kMem).per_replica, kGiB);
  auto gpus = ContainerMemoryLimits(Mem(), inv_, settings->at(kMem),
                                    {"GPU-1::mem-0", "GPU-1::mem-1", "GPU-1::mem-2"});
  ASSERT_TRUE(gpus.ok()) << gpus.status().message();
  ASSERT_EQ(gpus->size(), 1u);
  EXPECT_EQ((*gpus)[0].uuid, "GPU-1");
  EXPECT_EQ((*gpus)[0].limit, 3 * kGiB);

  // perReplica means nothing for a pool.
  const std::string with_per =
      "sharing:\n  memory:\n    resources:\n    - {name: gpu, devices: [0]}\n"
      "gpulet:\n  memoryLimits:\n    resources:\n    - {name: gpulet.io/gpu-memory-1gi, "
      "perReplica: 2Gi}\n";
  Build(with_per);
  auto per = config::ParseMemoryLimits(with_per, "cfg.yaml");
  ASSERT_TRUE(per.ok() && per->has_value());
  auto refused = ResolveMemoryLimits(**per, cfg_, plan_);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("cfg.yaml:8: gpulet.memoryLimits.resources[0]"),
            std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace gpulet::deviceplugin
