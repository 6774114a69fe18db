#include "node/inventory_watch.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "mig/layout_lock.h"

namespace gpulet::node {
namespace {

gpu::Inventory Node(const std::string& mig_uuid) {
  gpu::Inventory inv;
  gpu::Gpu g;
  g.index = 0;
  g.uuid = "GPU-0";
  g.mig_enabled = true;
  gpu::MigDevice m;
  m.uuid = mig_uuid;
  m.gpu_instance_id = 1;
  g.mig_devices.push_back(m);
  inv.gpus.push_back(g);
  inv.links.assign(1, std::vector<gpu::Link>(1));
  return inv;
}

std::string LockPath() {
  std::string dir = ::testing::TempDir() + "gpulet-watch-XXXXXX";
  EXPECT_NE(mkdtemp(dir.data()), nullptr);
  return dir + "/mig-layout.lock";
}

TEST(InventoryWatch, ChangedDevicesMakeANewGeneration) {
  gpu::Inventory next = Node("MIG-a");
  InventoryWatch w(
      std::make_shared<const gpu::Inventory>(Node("MIG-a")),
      [&]() -> Result<gpu::Inventory> { return next; }, LockPath());
  EXPECT_EQ(w.Rescan(), RescanOutcome::kUnchanged);
  next = Node("MIG-b");
  EXPECT_EQ(w.Rescan(), RescanOutcome::kChanged);
  uint64_t generation = 0;
  EXPECT_EQ(w.Current(&generation)->gpus[0].mig_devices[0].uuid, "MIG-b");
  EXPECT_EQ(generation, 1u);
}

TEST(InventoryWatch, FailedDiscoveryKeepsTheCurrentInventory) {
  InventoryWatch w(
      std::make_shared<const gpu::Inventory>(Node("MIG-a")),
      []() -> Result<gpu::Inventory> { return Status(ErrorCode::kUnavailable, "driver gone"); },
      "");
  EXPECT_EQ(w.Rescan(), RescanOutcome::kFailed);
  EXPECT_EQ(w.Current()->gpus[0].mig_devices[0].uuid, "MIG-a");
}

// While `gpulet mig apply` holds the layout lock, a rescan neither discovers nor publishes: the
// layout may be half-way through the apply.
TEST(InventoryWatch, DefersWhileAnApplyHoldsTheLayoutLock) {
  const std::string lock = LockPath();
  int discoveries = 0;
  InventoryWatch w(
      std::make_shared<const gpu::Inventory>(Node("MIG-a")),
      [&]() -> Result<gpu::Inventory> {
        ++discoveries;
        return Node("MIG-half-way");
      },
      lock);
  {
    Result<mig::LayoutLock> apply = mig::LayoutLock::Exclusive(lock);
    ASSERT_TRUE(apply.ok()) << apply.status().message();
    EXPECT_EQ(w.Rescan(), RescanOutcome::kDeferred);
    EXPECT_EQ(w.Rescan(), RescanOutcome::kDeferred);
    EXPECT_EQ(discoveries, 0);
    EXPECT_EQ(w.Current()->gpus[0].mig_devices[0].uuid, "MIG-a");
  }
  EXPECT_EQ(w.Rescan(), RescanOutcome::kChanged);
  EXPECT_EQ(discoveries, 1);
}

}  // namespace
}  // namespace gpulet::node
