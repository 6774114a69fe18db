#include "common/clock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace gpulet {
namespace {

using namespace std::chrono_literals;

TEST(FakeClock, MovesOnlyWhenAdvanced) {
  FakeClock clock;
  const auto t0 = clock.Now();
  const auto w0 = clock.WallNow();
  EXPECT_EQ(clock.Now(), t0);
  clock.Advance(1500ms);
  EXPECT_EQ(clock.Now() - t0, 1500ms);
  EXPECT_EQ(clock.WallNow() - w0, 1500ms);
  EXPECT_EQ(clock.WallMillis(), 1'700'000'001'500);
}

TEST(FakeClock, SleeperWakesExactlyWhenItsDeadlinePasses) {
  FakeClock clock;
  StopSignal stop;
  std::atomic<int> woke{0};
  std::thread sleeper([&] {
    EXPECT_TRUE(clock.SleepFor(10s, stop));
    woke = 1;
  });
  ASSERT_TRUE(clock.WaitForSleepers(1));
  clock.Advance(9s);
  // Still asleep: the sleeper is registered again only while it waits, so wait for that state.
  ASSERT_TRUE(clock.WaitForSleepers(1));
  EXPECT_EQ(woke.load(), 0);
  clock.Advance(1s);
  sleeper.join();
  EXPECT_EQ(woke.load(), 1);
  EXPECT_EQ(clock.sleepers(), 0u);
}

TEST(FakeClock, StopWakesASleeperWithoutAdvancing) {
  FakeClock clock;
  StopSignal stop;
  std::thread sleeper([&] { EXPECT_FALSE(clock.SleepFor(1h, stop)); });
  ASSERT_TRUE(clock.WaitForSleepers(1));
  stop.Stop();
  sleeper.join();
  EXPECT_TRUE(stop.stopped());
}

TEST(FakeClock, SleepAfterStopReturnsAtOnce) {
  FakeClock clock;
  StopSignal stop;
  stop.Stop();
  EXPECT_FALSE(clock.SleepFor(1h, stop));
  EXPECT_FALSE(RealClock().SleepFor(1h, stop));
}

TEST(FakeClock, ManySleepersWakeInDeadlineOrder) {
  FakeClock clock;
  StopSignal stop;
  std::mutex mu;
  std::condition_variable woke;
  int awake = 0;
  std::vector<std::thread> threads;
  for (int i = 1; i <= 4; ++i) {
    threads.emplace_back([&, i] {
      clock.SleepFor(std::chrono::seconds(i), stop);
      std::lock_guard<std::mutex> lock(mu);
      ++awake;
      woke.notify_all();
    });
  }
  ASSERT_TRUE(clock.WaitForSleepers(4));
  clock.Advance(2s);
  {
    // The two with deadlines at +1s and +2s leave; the other two stay asleep.
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(woke.wait_for(lock, 30s, [&] { return awake >= 2; }));
  }
  EXPECT_EQ(clock.sleepers(), 2u);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(awake, 2);
  }
  clock.Advance(2s);
  for (auto& t : threads) t.join();
  EXPECT_EQ(awake, 4);
}

TEST(FakeClock, WaitForSleepersTimesOutWhenNobodySleeps) {
  FakeClock clock;
  EXPECT_FALSE(clock.WaitForSleepers(1, 10ms));
}

TEST(RealClock, StopInterruptsALongSleep) {
  StopSignal stop;
  // Passes in either order: Stop before the sleep starts makes it return at once, Stop during it
  // wakes it. The short delay only makes the second (interesting) order the likely one.
  std::thread stopper([&] {
    std::this_thread::sleep_for(20ms);
    stop.Stop();
  });
  // Would block for an hour if Stop did not wake it; ctest's timeout turns that into a failure.
  EXPECT_FALSE(RealClock().SleepFor(1h, stop));
  stopper.join();
}

TEST(RealClock, ShortSleepReturnsTrue) {
  StopSignal stop;
  const auto t0 = RealClock().Now();
  EXPECT_TRUE(RealClock().SleepFor(2ms, stop));
  EXPECT_GE(RealClock().Now() - t0, 2ms);
}

}  // namespace
}  // namespace gpulet
