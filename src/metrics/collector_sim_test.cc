// The collector's timing on a FakeClock: one collection per interval, Wake() collects at once,
// and nothing runs before the interval is up (shown without sleeping: Stop() joins the thread).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>

#include "metrics/collector.h"
#include "metrics/counters.h"
#include "metrics/sampler.h"
#include "sim/sim_node.h"

namespace gpulet::metrics {
namespace {

using namespace std::chrono_literals;

// Waits (real time, bounded) for the collector to reach `n` collections: a positive wait.
bool WaitForCollections(const Collector& c, uint64_t n) {
  for (int i = 0; i < 30000 && c.collections() < n; ++i) std::this_thread::sleep_for(1ms);
  return c.collections() >= n;
}

TEST(Collector, CollectsEveryIntervalOnTheClockAndWhenWoken) {
  Result<gpu::testing::SimNode> sim = gpu::testing::OpenSimNode("l4-pcie");
  ASSERT_TRUE(sim.ok()) << sim.status().message();
  Result<gpu::Inventory> inv = gpu::Discover(*sim->nvml, sim->options);
  ASSERT_TRUE(inv.ok()) << inv.status().message();
  Sampler sampler(sim->nvml->fn(), *inv, "node-a", nullptr);
  Result<CounterSet> set = ParseCounters("DCGM_FI_DEV_GPU_TEMP, gauge, temp\n", "t.csv");
  ASSERT_TRUE(set.ok());
  Publisher publisher;
  FakeClock clock;
  Collector collector(sampler, std::make_shared<const CounterSet>(*set), 10s, publisher, clock);
  collector.Start();
  EXPECT_EQ(collector.collections(), 1u);  // the first one runs on the caller's thread
  ASSERT_NE(publisher.Current(), nullptr);

  ASSERT_TRUE(clock.WaitForSleepers(1));
  clock.Advance(10s);
  ASSERT_TRUE(WaitForCollections(collector, 2));

  collector.Wake();  // an XID: collect now, not at the next tick
  ASSERT_TRUE(WaitForCollections(collector, 3));

  ASSERT_TRUE(clock.WaitForSleepers(1));
  clock.Advance(9s);  // the next tick is 30 s after the start (20 s + the woken one): not yet
  collector.Stop();   // joins: a collection the advance started would be counted by now
  EXPECT_EQ(collector.collections(), 3u);
}

}  // namespace
}  // namespace gpulet::metrics
