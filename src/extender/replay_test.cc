#include "extender/replay.h"

#include <gtest/gtest.h>

namespace gpulet::extender {
namespace {

placement::Node GpuNode(placement::Cluster& c, const std::string& name, const std::string& model,
                        int gpus) {
  placement::Node n;
  n.name = name;
  n.model = c.InternModel(model);
  n.cpu_milli = n.cpu_free = 64000;
  n.memory_mib = n.memory_free = 262144;
  n.gpu_free.assign(static_cast<size_t>(gpus), placement::kMilliPerGpu);
  return n;
}

placement::Pod Sharing(const std::string& name, int milli) {
  placement::Pod p;
  p.name = name;
  p.num_gpu = 1;
  p.gpu_milli = milli;
  return p;
}

TEST(Replay, RequestIsTheShareOfTheSmallestAllowedGpu) {
  placement::Cluster c;
  c.nodes.push_back(GpuNode(c, "a", "T4", 2));
  c.nodes.push_back(GpuNode(c, "b", "V100M32", 2));
  const ReplayOptions o;
  placement::Pod p = Sharing("p", 500);
  EXPECT_EQ(MemoryRequestUnits(p, c, o.gpu_memory_gib), 8);  // half of 16 GiB
  p.model_constrained = true;
  p.model_mask = uint64_t{1} << c.FindModel("V100M32");
  EXPECT_EQ(MemoryRequestUnits(p, c, o.gpu_memory_gib), 16);                  // half of 32 GiB
  EXPECT_EQ(MemoryRequestUnits(Sharing("tiny", 1), c, o.gpu_memory_gib), 1);  // rounded up
  p.model_mask = 0;
  EXPECT_EQ(MemoryRequestUnits(p, c, o.gpu_memory_gib), 0);  // fits nowhere
}

// A hand-made fleet where node totals mislead: 2 GPUs of 16 GiB, pods of 10 GiB.
TEST(Replay, NodeTotalsAdmitWhatNoGpuHolds) {
  placement::Cluster c;
  c.nodes.push_back(GpuNode(c, "n", "T4", 2));
  std::vector<placement::Pod> pods = {Sharing("a", 625), Sharing("b", 625), Sharing("c", 625)};
  ReplayOptions o;
  o.publish_every = 100;  // nothing republished during the replay: reservations carry it
  auto r = ReplayMemoryRequests(c, pods, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->fleet_units, 32);
  // Arrivals until 32 units were asked: a, b, c, a again.
  EXPECT_EQ(r->with_extender.offered, 4);
  EXPECT_EQ(r->with_extender.refused_by_kubelet, 0);
  EXPECT_EQ(r->with_extender.admitted, 2);
  EXPECT_EQ(r->with_extender.unschedulable, 2);
  // 10 + 10 on one GPU each; the next ones ask 10 of the 12 the node still has in total, and no
  // GPU has more than 6.
  EXPECT_EQ(r->node_totals_only.admitted, 4);
  EXPECT_EQ(r->node_totals_only.refused_by_kubelet, 2);
}

}  // namespace
}  // namespace gpulet::extender
