// The rescan loop: calls `rescan` every `interval` and whenever Kick()ed (SIGHUP), on its own
// thread, waiting through the injected Clock (a test advances a FakeClock instead of sleeping).
// A deferred rescan (a MIG apply holds the layout lock) is retried after `retry`, not a whole
// interval later, so the new layout is picked up soon after the apply ends.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "common/clock.h"
#include "node/inventory_watch.h"

namespace gpulet::node {

struct RescanOptions {
  std::chrono::milliseconds interval{30000};  // 0: only when kicked
  std::chrono::milliseconds retry{250};       // after a deferred rescan
};

class Rescanner {
 public:
  // `after(outcome, kicked)` runs on the rescan thread after every rescan; `kicked` says whether
  // a Kick() asked for it. Starts the thread.
  Rescanner(Clock& clock, RescanOptions options, std::function<RescanOutcome()> rescan,
            std::function<void(RescanOutcome, bool kicked)> after);
  ~Rescanner();  // stops promptly (wakes the wait) and joins
  Rescanner(const Rescanner&) = delete;
  Rescanner& operator=(const Rescanner&) = delete;

  // Rescan now. Thread-safe; async-signal-unsafe (call it from a signal thread, not a handler).
  void Kick();

 private:
  void Loop();

  Clock& clock_;
  const RescanOptions options_;
  std::function<RescanOutcome()> rescan_;
  std::function<void(RescanOutcome, bool)> after_;
  std::mutex mu_;
  bool stopping_ = false;
  bool kicked_ = false;
  std::shared_ptr<StopSignal> wake_;  // the current wait's signal: Kick/stop end it
  std::thread thread_;                // last: starts after the fields above are ready
};

}  // namespace gpulet::node
