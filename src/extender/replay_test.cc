#include "extender/replay.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "placement/trace.h"

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
  EXPECT_EQ(MemoryRequestUnits(p, c, o.gpu_memory_gib), 16);  // half of 32 GiB
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
  EXPECT_EQ(r->with_extender.refused_by_kubelet, 0);
  EXPECT_EQ(r->with_extender.admitted, 2);
  EXPECT_EQ(r->with_extender.unschedulable, 1);
  // 10 + 10 on one GPU each; the third asks 10 of the 12 the node still has in total.
  EXPECT_EQ(r->node_totals_only.admitted, 3);
  EXPECT_EQ(r->node_totals_only.refused_by_kubelet, 1);
}

// The Alibaba openb trace (../shared/traces/alibaba-openb): the numbers in docs/memory-requests.md.
TEST(Replay, OpenbTraceWithTheExtenderNothingIsRefusedByTheKubelet) {
  const std::string dir = std::string(GPULET_SOURCE_DIR) + "/../shared/traces/alibaba-openb";
  if (!std::filesystem::exists(placement::GpuNodeListPath(dir))) {
    GTEST_SKIP() << "Alibaba openb trace not found at " << dir;
  }
  auto cluster = placement::LoadNodes(placement::GpuNodeListPath(dir));
  ASSERT_TRUE(cluster.ok()) << cluster.status().message();
  auto pods = placement::LoadPods(placement::TraceVariantPath(dir, "default"), *cluster);
  ASSERT_TRUE(pods.ok()) << pods.status().message();
  auto r = ReplayMemoryRequests(*cluster, *pods, {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  std::printf("openb default: %lld nodes, %lld GPUs, %lld units, %lld sharing pods\n"
              "  with extender: offered %lld admitted %lld refused-by-kubelet %lld "
              "unschedulable %lld\n"
              "  node totals:   offered %lld admitted %lld refused-by-kubelet %lld "
              "unschedulable %lld\n",
              static_cast<long long>(r->nodes), static_cast<long long>(r->gpus),
              static_cast<long long>(r->fleet_units), static_cast<long long>(r->sharing_pods),
              static_cast<long long>(r->with_extender.offered),
              static_cast<long long>(r->with_extender.admitted),
              static_cast<long long>(r->with_extender.refused_by_kubelet),
              static_cast<long long>(r->with_extender.unschedulable),
              static_cast<long long>(r->node_totals_only.offered),
              static_cast<long long>(r->node_totals_only.admitted),
              static_cast<long long>(r->node_totals_only.refused_by_kubelet),
              static_cast<long long>(r->node_totals_only.unschedulable));
  EXPECT_EQ(r->with_extender.refused_by_kubelet, 0);
  EXPECT_GT(r->with_extender.admitted, 0);
  EXPECT_GT(r->node_totals_only.refused_by_kubelet, 0);
}

}  // namespace
}  // namespace gpulet::extender
