// Stop and reload signals, received synchronously (sigtimedwait) instead of in handlers. The one
// place gpulet blocks and waits for SIGINT, SIGTERM and SIGHUP.
//
// Contract: call BlockStopSignals() before any thread starts, so every thread inherits the mask
// and the signals reach only the waiter. Children never inherit it (common/process.h resets it).
#pragma once

#include <signal.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

namespace gpulet {

enum class SignalEvent { kNone, kStop, kReload };

class StopSignals {
 public:
  // Blocks SIGINT, SIGTERM and SIGHUP in the calling thread (and the threads it starts after).
  static StopSignals Block();

  // Waits up to `timeout`: kStop for SIGINT/SIGTERM, kReload for SIGHUP, kNone otherwise.
  SignalEvent Wait(std::chrono::milliseconds timeout) const;
  // The last signal Wait received (0 before any).
  int last() const { return last_; }

 private:
  sigset_t set_{};
  mutable int last_ = 0;
};

// Runs on the calling thread until SIGINT/SIGTERM: `on_reload` (may be empty) on SIGHUP, `on_tick`
// (may be empty) each time `tick` passes without a signal. Returns the stop signal's number.
int RunUntilStopped(const StopSignals& signals, std::chrono::milliseconds tick,
                    const std::function<void()>& on_reload, const std::function<void()>& on_tick);

// Waits for the signals on a thread of its own until destroyed: SIGHUP → on_reload, SIGINT or
// SIGTERM → on_stop (each may be called more than once).
class SignalThread {
 public:
  SignalThread(StopSignals signals, std::function<void()> on_reload, std::function<void()> on_stop);
  ~SignalThread();
  SignalThread(const SignalThread&) = delete;
  SignalThread& operator=(const SignalThread&) = delete;

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace gpulet
