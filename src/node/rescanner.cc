#include "node/rescanner.h"

namespace gpulet::node {

Rescanner::Rescanner(Clock& clock, RescanOptions options, std::function<RescanOutcome()> rescan,
                     std::function<void(RescanOutcome, bool)> after)
    : clock_(clock),
      options_(options),
      rescan_(std::move(rescan)),
      after_(std::move(after)),
      thread_([this] { Loop(); }) {}

Rescanner::~Rescanner() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
    if (wake_) wake_->Stop();
  }
  thread_.join();
}

void Rescanner::Kick() {
  std::lock_guard<std::mutex> l(mu_);
  kicked_ = true;
  if (wake_) wake_->Stop();
}

void Rescanner::Loop() {
  std::chrono::milliseconds wait = options_.interval;
  for (;;) {
    std::shared_ptr<StopSignal> wake;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stopping_) return;
      if (!kicked_) wake = wake_ = std::make_shared<StopSignal>();
    }
    if (wake) {
      // A zero interval waits for a kick only (a year stands in for "forever").
      const auto d =
          wait.count() > 0 ? Clock::Duration(wait) : Clock::Duration(std::chrono::hours(24 * 365));
      clock_.SleepFor(d, *wake);
    }
    bool kicked = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      wake_.reset();
      if (stopping_) return;
      kicked = kicked_;
      kicked_ = false;
    }
    const RescanOutcome outcome = rescan_();
    if (after_) after_(outcome, kicked);
    wait = outcome == RescanOutcome::kDeferred && options_.retry.count() > 0 ? options_.retry
                                                                             : options_.interval;
  }
}

}  // namespace gpulet::node
