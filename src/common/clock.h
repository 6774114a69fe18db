// Time as a seam (Envoy's TimeSource). Components take a `Clock&` and wait through it, so a test
// hands them a FakeClock and advances time instead of sleeping. Waiting is always interruptible:
// every wait names a StopSignal, and Stop() wakes it at once, on the real clock and the fake one.
//
//   Clock& clock = RealClock();                // production wiring
//   StopSignal stop;
//   while (clock.SleepFor(interval, stop)) { … one cycle … }   // returns false once stopped
//
// A test:
//   FakeClock clock;  Component c(clock);  c.Start();
//   clock.WaitForSleepers(1);      // the component is now idle inside SleepFor
//   clock.Advance(interval);       // exactly one more cycle runs
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <set>

namespace gpulet {

// A one-way "stop now" flag that wakes every wait naming it. Thread-safe; Stop() is idempotent.
class StopSignal {
 public:
  void Stop();
  bool stopped() const { return stopped_.load(std::memory_order_acquire); }

 private:
  friend class RealClockImpl;
  friend class FakeClock;
  std::atomic<bool> stopped_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
};

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using Duration = std::chrono::steady_clock::duration;
  using WallTime = std::chrono::system_clock::time_point;
  virtual ~Clock() = default;

  // Monotonic time: for deadlines, intervals and timeouts.
  virtual TimePoint Now() const = 0;
  // Wall-clock time: for timestamps that leave the process (logs, journals, leases).
  virtual WallTime WallNow() const = 0;
  // Blocks until Now() >= deadline or `stop` is signalled. Returns false when stopped (also when
  // it was stopped before the call), true when the deadline passed.
  virtual bool SleepUntil(TimePoint deadline, StopSignal& stop) = 0;

  bool SleepFor(Duration d, StopSignal& stop) { return SleepUntil(Now() + d, stop); }
  // Milliseconds since the Unix epoch on the wall clock.
  int64_t WallMillis() const;
};

// The process's real clock (steady_clock and system_clock). Lives for the whole program.
Clock& RealClock();

// A clock that moves only when told. Now() starts at an arbitrary fixed point; WallNow() starts at
// `wall_start` and moves with it. Sleepers wake when Advance/Set passes their deadline.
class FakeClock : public Clock {
 public:
  explicit FakeClock(WallTime wall_start = WallTime(std::chrono::seconds(1'700'000'000)));

  TimePoint Now() const override;
  WallTime WallNow() const override;
  bool SleepUntil(TimePoint deadline, StopSignal& stop) override;

  // Moves time forward by `d` and wakes the sleepers whose deadline passed.
  void Advance(Duration d);
  // Blocks (in real time, up to `real_timeout`) until at least `n` threads sleep in SleepUntil.
  // Returns false on timeout: a test asserts it, so a component that never waits fails clearly.
  bool WaitForSleepers(size_t n,
                       std::chrono::milliseconds real_timeout = std::chrono::seconds(30)) const;
  // Number of threads currently inside SleepUntil.
  size_t sleepers() const;

 private:
  void Wake();

  std::atomic<Duration::rep> offset_{0};  // time advanced so far
  const TimePoint start_;
  const WallTime wall_start_;
  mutable std::mutex mu_;
  mutable std::condition_variable sleepers_cv_;
  std::multiset<StopSignal*> sleeping_;  // the signals current sleepers wait on
};

}  // namespace gpulet
