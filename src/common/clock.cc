#include "common/clock.h"

namespace gpulet {

void StopSignal::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

int64_t Clock::WallMillis() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(WallNow().time_since_epoch())
      .count();
}

class RealClockImpl final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  WallTime WallNow() const override { return std::chrono::system_clock::now(); }
  bool SleepUntil(TimePoint deadline, StopSignal& stop) override {
    std::unique_lock<std::mutex> lock(stop.mu_);
    stop.cv_.wait_until(lock, deadline, [&] { return stop.stopped(); });
    return !stop.stopped();
  }
};

Clock& RealClock() {
  static RealClockImpl* clock = new RealClockImpl();  // never destroyed: threads may outlive main
  return *clock;
}

FakeClock::FakeClock(WallTime wall_start)
    : start_(TimePoint(std::chrono::hours(1000))), wall_start_(wall_start) {}

Clock::TimePoint FakeClock::Now() const {
  return start_ + Duration(offset_.load(std::memory_order_acquire));
}

Clock::WallTime FakeClock::WallNow() const {
  return wall_start_ + std::chrono::duration_cast<WallTime::duration>(
                           Duration(offset_.load(std::memory_order_acquire)));
}

bool FakeClock::SleepUntil(TimePoint deadline, StopSignal& stop) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    sleeping_.insert(&stop);
  }
  sleepers_cv_.notify_all();
  {
    // Advance() stores the new time before it takes stop.mu_ to notify, so a sleeper either sees
    // the new time in the predicate or is already waiting when the notification comes.
    std::unique_lock<std::mutex> lock(stop.mu_);
    stop.cv_.wait(lock, [&] { return stop.stopped() || Now() >= deadline; });
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    sleeping_.erase(sleeping_.find(&stop));
  }
  sleepers_cv_.notify_all();
  return !stop.stopped();
}

void FakeClock::Advance(Duration d) {
  offset_.fetch_add(d.count(), std::memory_order_acq_rel);
  Wake();
}

void FakeClock::Wake() {
  // mu_ is held throughout: a sleeper erases itself under mu_ before it returns (and before its
  // StopSignal can be destroyed), and never holds stop.mu_ while taking mu_, so this order is safe.
  std::lock_guard<std::mutex> lock(mu_);
  for (StopSignal* s : sleeping_) {
    std::lock_guard<std::mutex> stop_lock(s->mu_);
    s->cv_.notify_all();
  }
}

bool FakeClock::WaitForSleepers(size_t n, std::chrono::milliseconds real_timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return sleepers_cv_.wait_for(lock, real_timeout, [&] { return sleeping_.size() >= n; });
}

size_t FakeClock::sleepers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sleeping_.size();
}

}  // namespace gpulet
