// The health stream's contents from the NVML health board, and the feeder following the board.
#include "dra/health_stream.h"

#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <filesystem>

#include "common/files.h"
#include "dra/fake_preparer.h"
#include "dra_health_v1alpha1.grpc.pb.h"

namespace gpulet::dra {
namespace {

gpu::Inventory TwoGpus() {
  gpu::Inventory inv;
  gpu::Gpu a;
  a.index = 0;
  a.uuid = "GPU-a";
  gpu::Gpu b;
  b.index = 1;
  b.uuid = "GPU-b";
  b.mig_enabled = true;
  gpu::MigDevice m;
  m.parent_index = 1;
  m.uuid = "MIG-b1";
  b.mig_devices = {m};
  inv.gpus = {a, b};
  return inv;
}

TEST(HealthReports, EveryGpuAndItsSharesWithReasons) {
  gpu::HealthSnapshot snap;
  auto list = HealthReports(TwoGpus(), snap);
  ASSERT_EQ(list.size(), 4u);
  EXPECT_EQ(list[0].device, "gpu-0");
  EXPECT_EQ(list[1].device, "gpu-0-mem");
  EXPECT_EQ(list[2].device, "gpu-1");
  for (const auto& r : list) EXPECT_EQ(r.health, DeviceHealthReport::Health::kHealthy);
  snap.devices["GPU-a"] = gpu::DeviceHealth{false, "XID 79"};
  snap.devices["MIG-b1"] = gpu::DeviceHealth{false, "XID 94"};
  list = HealthReports(TwoGpus(), snap);
  EXPECT_EQ(list[0].health, DeviceHealthReport::Health::kUnhealthy);
  EXPECT_EQ(list[1].message, "XID 79");
  EXPECT_EQ(list[3].health, DeviceHealthReport::Health::kUnhealthy);
  EXPECT_EQ(list[3].message, "MIG-b1: XID 94");
}

// An XID on the board reaches a stream reader as Unhealthy, and recovery as Healthy again.
TEST(HealthFeeder, FollowsTheBoard) {
  char tmpl[] = "/tmp/gdhs-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  ASSERT_TRUE(WriteFileAtomic(dir + "/boot_id", "b\n").ok());
  PluginOptions o;
  o.node_name = "n1";
  o.registry_dir = dir + "/reg";
  o.plugins_dir = dir + "/plugins";
  o.boot_id_path = dir + "/boot_id";
  FakePreparer preparer;
  DraPlugin plugin(o, nullptr, &preparer);
  ASSERT_TRUE(plugin.Start().ok());
  gpu::HealthBoard board;
  HealthFeeder feeder(plugin, board, std::make_shared<const gpu::Inventory>(TwoGpus()));
  feeder.Start();
  auto ch = grpc::CreateChannel("unix:" + plugin.dra_socket(), grpc::InsecureChannelCredentials());
  auto stub = ::v1alpha1::DRAResourceHealth::NewStub(ch);
  grpc::ClientContext ctx;
  auto reader = stub->NodeWatchResources(&ctx, {});
  ::v1alpha1::NodeWatchResourcesResponse msg;
  auto read_until = [&](::v1alpha1::HealthStatus want) {
    while (reader->Read(&msg)) {
      if (msg.devices_size() == 4 && msg.devices(0).health() == want) return true;
    }
    return false;
  };
  ASSERT_TRUE(read_until(::v1alpha1::HEALTHY));
  board.Update({{"GPU-a", gpu::DeviceHealth{false, "XID 79"}}});
  ASSERT_TRUE(read_until(::v1alpha1::UNHEALTHY));
  EXPECT_EQ(msg.devices(0).message(), "XID 79");
  EXPECT_EQ(msg.devices(2).health(), ::v1alpha1::HEALTHY);
  board.Update({{"GPU-a", gpu::DeviceHealth{true, ""}}});
  ASSERT_TRUE(read_until(::v1alpha1::HEALTHY));
  ctx.TryCancel();
  feeder.Stop();
  plugin.Stop();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace gpulet::dra
