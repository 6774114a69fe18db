// The Alibaba openb trace (../shared/traces/alibaba-openb): the numbers in docs/memory-requests.md.
// Its own binary (label integration): about 20 s of CPU, too long for the sanitizer builds.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "extender/replay.h"
#include "placement/trace.h"
#include "support/require.h"

namespace gpulet::extender {
namespace {

TEST(Replay, OpenbTraceWithTheExtenderNothingIsRefusedByTheKubelet) {
  const std::string dir = std::string(GPULET_SOURCE_DIR) + "/../shared/traces/alibaba-openb";
  GPULET_REQUIRE_SHARED(placement::GpuNodeListPath(dir));
  auto cluster = placement::LoadNodes(placement::GpuNodeListPath(dir));
  ASSERT_TRUE(cluster.ok()) << cluster.status().message();
  auto pods = placement::LoadPods(placement::TraceVariantPath(dir, "default"), *cluster);
  ASSERT_TRUE(pods.ok()) << pods.status().message();
  auto r = ReplayMemoryRequests(*cluster, *pods, {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  std::printf(
      "openb default: %lld nodes, %lld GPUs, %lld units, %lld sharing pods\n"
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
