// Bounded polling for tests: waits for a positive condition that another thread or process brings
// about and that has no event to wait on (a watch that updated a cache, a daemon that wrote a log
// line). The limit is a bound, not a timing claim; never use it to show that something does not
// happen (wait on an event or a FakeClock for that).
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace gpulet::testing {

// Calls `done` every `every` until it returns true (true) or `limit` has passed (its last answer).
inline bool WaitUntil(const std::function<bool()>& done,
                      std::chrono::milliseconds limit = std::chrono::seconds(30),
                      std::chrono::milliseconds every = std::chrono::milliseconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(every);
  }
  return done();
}

}  // namespace gpulet::testing
