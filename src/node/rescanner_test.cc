#include "node/rescanner.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <vector>

namespace gpulet::node {
namespace {

using namespace std::chrono_literals;

// Records each rescan (outcome, kicked) and lets the test wait for the n-th one.
class Recorder {
 public:
  void Add(RescanOutcome o, bool kicked) {
    {
      std::lock_guard<std::mutex> l(mu_);
      calls_.push_back({o, kicked});
    }
    cv_.notify_all();
  }
  // Waits (real time, generously) for `n` calls; false if they never come.
  bool WaitFor(size_t n) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, 30s, [&] { return calls_.size() >= n; });
  }
  std::vector<std::pair<RescanOutcome, bool>> calls() {
    std::lock_guard<std::mutex> l(mu_);
    return calls_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<RescanOutcome, bool>> calls_;
};

TEST(Rescanner, RescansEveryIntervalOnTheClock) {
  FakeClock clock;
  Recorder rec;
  Rescanner r(
      clock, {10s, 250ms}, [] { return RescanOutcome::kUnchanged; },
      [&](RescanOutcome o, bool k) { rec.Add(o, k); });
  ASSERT_TRUE(clock.WaitForSleepers(1));
  clock.Advance(10s);
  ASSERT_TRUE(rec.WaitFor(1));
  ASSERT_TRUE(clock.WaitForSleepers(1));
  // Not a whole interval yet: a kick shows that no timed rescan ran in between.
  clock.Advance(9s);
  r.Kick();
  ASSERT_TRUE(rec.WaitFor(2));
  auto calls = rec.calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_FALSE(calls[0].second);
  EXPECT_TRUE(calls[1].second);
}

TEST(Rescanner, DeferredRescanRetriesSoonNotAfterAWholeInterval) {
  FakeClock clock;
  Recorder rec;
  std::atomic<int> n{0};
  Rescanner r(
      clock, {10s, 250ms},
      [&] { return n++ == 0 ? RescanOutcome::kDeferred : RescanOutcome::kChanged; },
      [&](RescanOutcome o, bool k) { rec.Add(o, k); });
  ASSERT_TRUE(clock.WaitForSleepers(1));
  clock.Advance(10s);
  ASSERT_TRUE(rec.WaitFor(1));
  ASSERT_TRUE(clock.WaitForSleepers(1));
  clock.Advance(250ms);  // the retry, not another 10 s
  ASSERT_TRUE(rec.WaitFor(2));
  auto calls = rec.calls();
  EXPECT_EQ(calls[0].first, RescanOutcome::kDeferred);
  EXPECT_EQ(calls[1].first, RescanOutcome::kChanged);
}

TEST(Rescanner, ZeroIntervalRescansOnlyWhenKicked) {
  FakeClock clock;
  Recorder rec;
  Rescanner r(
      clock, {0ms, 250ms}, [] { return RescanOutcome::kUnchanged; },
      [&](RescanOutcome o, bool k) { rec.Add(o, k); });
  ASSERT_TRUE(clock.WaitForSleepers(1));
  clock.Advance(std::chrono::hours(24 * 300));
  r.Kick();
  ASSERT_TRUE(rec.WaitFor(1));
  auto calls = rec.calls();
  ASSERT_EQ(calls.size(), 1u);  // the day-long advance ran nothing: the one call is the kick
  EXPECT_TRUE(calls[0].second);
}

TEST(Rescanner, DestructionEndsTheWaitAtOnce) {
  FakeClock clock;
  int calls = 0;
  {
    Rescanner r(
        clock, {std::chrono::hours(1), 250ms}, [] { return RescanOutcome::kUnchanged; },
        [&](RescanOutcome, bool) { ++calls; });
    ASSERT_TRUE(clock.WaitForSleepers(1));
  }  // joins without the clock moving
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(clock.sleepers(), 0u);
}

}  // namespace
}  // namespace gpulet::node
