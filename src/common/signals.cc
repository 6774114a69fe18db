#include "common/signals.h"

#include <pthread.h>
#include <spdlog/spdlog.h>

#include <cerrno>

namespace gpulet {

StopSignals StopSignals::Block() {
  StopSignals s;
  sigemptyset(&s.set_);
  sigaddset(&s.set_, SIGINT);
  sigaddset(&s.set_, SIGTERM);
  sigaddset(&s.set_, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &s.set_, nullptr);
  return s;
}

SignalEvent StopSignals::Wait(std::chrono::milliseconds timeout) const {
  const auto ms = timeout.count() < 0 ? 0 : timeout.count();
  timespec ts{static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1'000'000L};
  const int sig = sigtimedwait(&set_, nullptr, &ts);
  if (sig <= 0) return SignalEvent::kNone;
  last_ = sig;
  if (sig == SIGHUP) {
    spdlog::info("event=signal signal=SIGHUP action=reload");
    return SignalEvent::kReload;
  }
  spdlog::info("event=signal signal={} action=stop", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  return SignalEvent::kStop;
}

int RunUntilStopped(const StopSignals& signals, std::chrono::milliseconds tick,
                    const std::function<void()>& on_reload, const std::function<void()>& on_tick) {
  for (;;) {
    switch (signals.Wait(tick)) {
      case SignalEvent::kStop:
        return signals.last();
      case SignalEvent::kReload:
        if (on_reload) on_reload();
        break;
      case SignalEvent::kNone:
        if (on_tick) on_tick();
        break;
    }
  }
}

SignalThread::SignalThread(StopSignals signals, std::function<void()> on_reload,
                           std::function<void()> on_stop)
    : thread_([this, signals, on_reload = std::move(on_reload), on_stop = std::move(on_stop)] {
        while (!done_.load()) {
          const SignalEvent e = signals.Wait(std::chrono::milliseconds(200));
          if (e == SignalEvent::kReload && on_reload) on_reload();
          if (e == SignalEvent::kStop && on_stop) on_stop();
        }
      }) {}

SignalThread::~SignalThread() {
  done_ = true;
  thread_.join();
}

}  // namespace gpulet
