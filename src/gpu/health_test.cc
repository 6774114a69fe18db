#include "gpu/health.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>

namespace gpulet::gpu {
namespace {

using namespace std::chrono_literals;
using Event = HealthTracker::EventKind;
using Probe = HealthTracker::ProbeResult;

Inventory TwoGpusOneMig() {
  Inventory inv;
  for (unsigned i = 0; i < 2; ++i) {
    Gpu g;
    g.index = i;
    g.uuid = "GPU-" + std::to_string(i);
    inv.gpus.push_back(g);
  }
  MigDevice m;
  m.parent_index = 1;
  m.uuid = "MIG-1-0";
  m.gpu_instance_id = 2;
  m.compute_instance_id = 0;
  inv.gpus[1].mig_enabled = true;
  inv.gpus[1].mig_devices.push_back(m);
  inv.links.assign(2, std::vector<Link>(2));
  return inv;
}

HealthPolicy Policy(std::chrono::milliseconds quiet = 10s) {
  Result<HealthPolicy> p = ParseHealthPolicy("", "");
  EXPECT_TRUE(p.ok());
  HealthPolicy policy = *p;
  policy.quiet_period = quiet;
  return policy;
}

TEST(HealthPolicyTest, DefaultsIgnoreApplicationXids) {
  Result<HealthPolicy> p = ParseHealthPolicy("", "");
  ASSERT_TRUE(p.ok());
  for (uint64_t xid : {13, 31, 43, 45, 68, 109}) EXPECT_FALSE(p->XidCounts(xid)) << xid;
  EXPECT_TRUE(p->XidCounts(79));
  EXPECT_TRUE(p->XidCounts(48));
  EXPECT_FALSE(p->all_disabled);
}

TEST(HealthPolicyTest, DisableAllXidsAndLists) {
  Result<HealthPolicy> all = ParseHealthPolicy("all", "");
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->all_disabled);
  Result<HealthPolicy> xids = ParseHealthPolicy("xids", "");
  ASSERT_TRUE(xids.ok());
  EXPECT_FALSE(xids->all_disabled);
  EXPECT_FALSE(xids->XidCounts(79));
  Result<HealthPolicy> list = ParseHealthPolicy("79, 48", "");
  ASSERT_TRUE(list.ok());
  EXPECT_FALSE(list->XidCounts(79));
  EXPECT_FALSE(list->XidCounts(48));
  EXPECT_FALSE(list->XidCounts(13));
  EXPECT_TRUE(list->XidCounts(94));
}

TEST(HealthPolicyTest, EnableOverridesDefaultsAndDisabled) {
  Result<HealthPolicy> p = ParseHealthPolicy("79", "13,79");
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->XidCounts(13));
  EXPECT_TRUE(p->XidCounts(79));
  EXPECT_FALSE(p->XidCounts(31));
  Result<HealthPolicy> all = ParseHealthPolicy("", "all");
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->XidCounts(13));
}

TEST(HealthPolicyTest, BadEntryNamesVariable) {
  Result<HealthPolicy> p = ParseHealthPolicy("13,abc", "");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), ErrorCode::kInvalidInput);
  EXPECT_NE(p.status().message().find("DP_DISABLE_HEALTHCHECKS"), std::string::npos);
  EXPECT_NE(p.status().message().find("abc"), std::string::npos);
  EXPECT_FALSE(ParseHealthPolicy("", "x1").ok());
}

TEST(HealthTrackerTest, CriticalXidMarksOnlyThatGpu) {
  Inventory inv = TwoGpusOneMig();
  FakeClock clock;
  HealthBoard board;
  HealthTracker tracker(inv, Policy(), clock, board);
  uint64_t v0 = board.Current().version;
  tracker.OnEvent(0, Event::kXid, 79);
  HealthSnapshot s = board.Current();
  EXPECT_GT(s.version, v0);
  EXPECT_FALSE(s.Get("GPU-0").healthy);
  EXPECT_EQ(s.Get("GPU-0").reason, "XID 79");
  EXPECT_TRUE(s.Get("GPU-1").healthy);
  EXPECT_TRUE(s.Get("MIG-1-0").healthy);
}

TEST(HealthTrackerTest, IgnoredXidAndSingleBitEccChangeNothing) {
  Inventory inv = TwoGpusOneMig();
  FakeClock clock;
  HealthBoard board;
  HealthTracker tracker(inv, Policy(), clock, board);
  uint64_t v0 = board.Current().version;
  tracker.OnEvent(0, Event::kXid, 13);
  tracker.OnEvent(1, Event::kSingleBitEcc, 0);
  EXPECT_EQ(board.Current().version, v0);
  EXPECT_TRUE(board.Current().Get("GPU-0").healthy);
}

TEST(HealthTrackerTest, DoubleBitEccAndMigEvent) {
  Inventory inv = TwoGpusOneMig();
  FakeClock clock;
  HealthBoard board;
  HealthTracker tracker(inv, Policy(), clock, board);
  tracker.OnEvent(1, Event::kXid, 94, 2u, 0u);
  EXPECT_FALSE(board.Current().Get("MIG-1-0").healthy);
  EXPECT_TRUE(board.Current().Get("GPU-1").healthy);
  tracker.OnEvent(0, Event::kDoubleBitEcc, 0);
  EXPECT_EQ(board.Current().Get("GPU-0").reason, "double-bit ECC error");
}

TEST(HealthTrackerTest, RecoversAfterQuietPeriodWithSuccessfulProbe) {
  Inventory inv = TwoGpusOneMig();
  FakeClock clock;
  HealthBoard board;
  HealthTracker tracker(inv, Policy(10s), clock, board);
  tracker.OnEvent(0, Event::kXid, 79);
  clock.Advance(9s);
  tracker.OnProbe({Probe::kOk, Probe::kOk});
  EXPECT_FALSE(board.Current().Get("GPU-0").healthy);
  // A new event restarts the quiet period.
  tracker.OnEvent(0, Event::kXid, 48);
  clock.Advance(9s);
  tracker.OnProbe({Probe::kOk, Probe::kOk});
  EXPECT_FALSE(board.Current().Get("GPU-0").healthy);
  clock.Advance(1s);
  uint64_t before = board.Current().version;
  tracker.OnProbe({Probe::kOk, Probe::kOk});
  EXPECT_TRUE(board.Current().Get("GPU-0").healthy);
  EXPECT_GT(board.Current().version, before);
}

TEST(HealthTrackerTest, LostGpuStaysUnhealthyWhileLostThenRecovers) {
  Inventory inv = TwoGpusOneMig();
  FakeClock clock;
  HealthBoard board;
  HealthTracker tracker(inv, Policy(5s), clock, board);
  tracker.OnProbe({Probe::kOk, Probe::kLost});
  EXPECT_EQ(board.Current().Get("GPU-1").reason, "GPU is lost");
  for (int i = 0; i < 10; ++i) {
    clock.Advance(1s);
    tracker.OnProbe({Probe::kOk, Probe::kLost});
  }
  EXPECT_FALSE(board.Current().Get("GPU-1").healthy);
  clock.Advance(1s);
  tracker.OnProbe({Probe::kOk, Probe::kOk});  // restored, but quiet period counts from last loss
  EXPECT_FALSE(board.Current().Get("GPU-1").healthy);
  clock.Advance(5s);
  tracker.OnProbe({Probe::kOk, Probe::kOtherError});  // other errors do not count as recovery
  EXPECT_FALSE(board.Current().Get("GPU-1").healthy);
  tracker.OnProbe({Probe::kOk, Probe::kOk});
  EXPECT_TRUE(board.Current().Get("GPU-1").healthy);
}

TEST(HealthTrackerTest, ZeroQuietPeriodNeverRecovers) {
  Inventory inv = TwoGpusOneMig();
  FakeClock clock;
  HealthBoard board;
  HealthTracker tracker(inv, Policy(0ms), clock, board);
  tracker.OnEvent(0, Event::kXid, 79);
  clock.Advance(std::chrono::hours(24));
  tracker.OnProbe({Probe::kOk, Probe::kOk});
  EXPECT_FALSE(board.Current().Get("GPU-0").healthy);
}

// Re-discovery (a MIG re-layout on another GPU) builds a new tracker over the same board: a GPU
// that hit XID 79 stays unhealthy, keyed by UUID (the event fired once and will not fire again).
TEST(HealthTrackerTest, HealthSurvivesANewTrackerAfterReDiscovery) {
  Inventory inv = TwoGpusOneMig();
  FakeClock clock;
  HealthBoard board;
  auto first = std::make_unique<HealthTracker>(inv, Policy(0ms), clock, board);
  first->OnEvent(0, Event::kXid, 79);
  first->OnEvent(1, Event::kXid, 94, 2u, 0u);  // the MIG device that the re-layout destroys
  ASSERT_FALSE(board.Current().Get("GPU-0").healthy);
  first.reset();

  Inventory relaid = TwoGpusOneMig();
  relaid.gpus[1].mig_devices[0].uuid = "MIG-1-new";
  HealthTracker second(relaid, Policy(0ms), clock, board);
  EXPECT_FALSE(board.Current().Get("GPU-0").healthy);
  EXPECT_EQ(board.Current().Get("GPU-0").reason, "XID 79");
  EXPECT_TRUE(board.Current().Get("MIG-1-new").healthy);
  EXPECT_TRUE(board.Current().Get("GPU-1").healthy);
  clock.Advance(std::chrono::hours(24));
  second.OnProbe({Probe::kOk, Probe::kOk});  // "never recover" still holds
  EXPECT_FALSE(board.Current().Get("GPU-0").healthy);
}

// With recovery on, an inherited unhealthy GPU recovers after a full quiet period counted from
// the re-discovery (the tracker that saw the event is gone, so it counts conservatively).
TEST(HealthTrackerTest, InheritedUnhealthyRecoversAfterAQuietPeriod) {
  Inventory inv = TwoGpusOneMig();
  FakeClock clock;
  HealthBoard board;
  {
    HealthTracker first(inv, Policy(10s), clock, board);
    first.OnEvent(0, Event::kXid, 79);
  }
  clock.Advance(9s);
  HealthTracker second(inv, Policy(10s), clock, board);
  second.OnProbe({Probe::kOk, Probe::kOk});
  EXPECT_FALSE(board.Current().Get("GPU-0").healthy);
  clock.Advance(9s);
  second.OnProbe({Probe::kOk, Probe::kOk});
  EXPECT_FALSE(board.Current().Get("GPU-0").healthy);
  clock.Advance(1s);
  second.OnProbe({Probe::kOk, Probe::kOk});
  EXPECT_TRUE(board.Current().Get("GPU-0").healthy);
}

TEST(HealthTrackerTest, AllDisabledIgnoresEverything) {
  Inventory inv = TwoGpusOneMig();
  FakeClock clock;
  HealthBoard board;
  Result<HealthPolicy> p = ParseHealthPolicy("all", "");
  ASSERT_TRUE(p.ok());
  HealthTracker tracker(inv, *p, clock, board);
  tracker.OnEvent(0, Event::kXid, 79);
  tracker.OnProbe({Probe::kLost, Probe::kLost});
  EXPECT_TRUE(board.Current().Get("GPU-0").healthy);
  EXPECT_TRUE(board.Current().Get("GPU-1").healthy);
}

TEST(HealthBoardTest, WaitNewerWakesOnUpdateAndOnStop) {
  HealthBoard board;
  uint64_t v = board.Current().version;
  std::thread writer([&] { board.Update({{"GPU-0", DeviceHealth{false, "XID 79"}}}); });
  HealthSnapshot s = board.WaitNewer(v, 60s);
  writer.join();
  EXPECT_GT(s.version, v);
  EXPECT_FALSE(board.Update({{"GPU-0", DeviceHealth{false, "XID 79"}}}));  // no change, no bump

  std::atomic<bool> stop{false};
  std::thread stopper([&] {
    stop = true;
    board.Wake();
  });
  HealthSnapshot same = board.WaitNewer(s.version, 60s, [&] { return stop.load(); });
  stopper.join();
  EXPECT_EQ(same.version, s.version);
}

}  // namespace
}  // namespace gpulet::gpu
