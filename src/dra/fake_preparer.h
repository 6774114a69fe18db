// A Preparer for the plugin's tests and benchmark (not the product): it records every call, keeps
// which claim holds which device, answers CDI IDs named after the claim UID, and can be told to
// fail a Prepare half-way (it then rolls back what it did, as the interface requires) or to fail
// Unprepares. Thread-safe.
#pragma once

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "dra/preparer.h"

namespace gpulet::dra {

class FakePreparer : public Preparer {
 public:
  struct Call {
    std::string op;  // "prepare", "unprepare"
    std::string uid;
    std::string record;  // unprepare: the record it was given
  };

  Result<PrepareResult> Prepare(const Claim& claim) override;
  Status Unprepare(const ClaimRef& claim, const std::string& record_json) override;

  // The next `times` Prepares fail after setting up `after_devices` devices (rolled back before
  // they return).
  void FailPrepare(size_t after_devices, std::string message, int times = 1);
  void FailUnprepare(std::string message, int times = 1);

  std::vector<Call> calls() const;
  size_t prepare_calls() const;
  // "uid/device[/shareID]" for every device currently set up.
  std::set<std::string> live() const;

 private:
  mutable std::mutex mu_;
  std::vector<Call> calls_;
  std::set<std::string> live_;
  size_t fail_after_ = 0;
  int fail_prepare_times_ = 0, fail_unprepare_times_ = 0;
  std::string fail_prepare_message_, fail_unprepare_message_;
};

}  // namespace gpulet::dra
