// A stand-in for kube-scheduler's structured-parameters DRA allocator (staging/src/k8s.io/
// dynamic-resource-allocation/structured), for tests that must show what published
// ResourceSlices admit. It follows the allocator's rules where gpulet's slices depend on them:
//   - pools: per (driver, pool name) only the slices of the highest generation count, and a pool
//     is used only when all resourceSliceCount of them are there;
//   - search: slices in name order, devices in slice order, first fit, with backtracking over the
//     claim's requests (a later request or constraint that fails undoes earlier choices);
//   - shared counters (KEP-4815): a device's consumesCounters are deducted from the pool's
//     counter sets; a device whose counters do not fit is skipped; a multi-allocatable device
//     deducts them once, while it holds any allocation;
//   - consumable capacity (KEP-5075): on a device with allowMultipleAllocations each request's
//     capacity is rounded by the capacity's requestPolicy (below min → min; off-step → min +
//     ceil((r-min)/step)*step; above max → no fit; validValues → the smallest covering value; no
//     request → default; no policy → the request as is, or all of it) and the shares must fit in
//     the device's capacity; each share gets a shareID. An exclusive device fits a capacity
//     request when its capacity is at least the request;
//   - constraints: matchAttribute (every chosen device has the attribute, all equal) and
//     distinctAttribute (all different), over the named requests or all;
//   - taints: a device with a NoSchedule or NoExecute taint the request does not tolerate is
//     never chosen.
// Selectors: no CEL engine. A DeviceClass or request selector may be a conjunction (&&) of
// `device.driver == "X"` and `device.attributes["DOMAIN"].NAME == VALUE` (a string in either
// quote style, an integer or true/false); anything else is refused with the expression named,
// never treated as a match.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"

namespace gpulet::testing::dra {

// One equality a selector holds: the driver ("" attribute) or a qualified attribute.
struct Equality {
  std::string attribute;  // "" for device.driver; else "<domain>/<name>"
  nlohmann::json value;   // string, integer or boolean
};
using Selector = std::vector<Equality>;  // all must hold

// Parses the CEL subset above. Errors: kInvalidInput naming the expression.
Result<Selector> ParseSelector(const std::string& cel);

struct DeviceClass {
  std::string name;
  std::vector<Selector> selectors;
};
// From a resource.k8s.io/v1 DeviceClass object (spec.selectors[].cel.expression).
Result<DeviceClass> ParseDeviceClass(const nlohmann::json& object);

struct Toleration {
  std::string key;
  std::string op = "Equal";  // "Equal" or "Exists"
  std::string value;
  std::string effect;  // "" tolerates every effect
};

struct Request {
  std::string name;
  std::string device_class;
  std::vector<Selector> selectors;
  int count = 1;
  std::map<std::string, int64_t> capacity;  // capacity.requests, qualified or not, in base units
  std::vector<Toleration> tolerations;
};

struct Constraint {
  std::vector<std::string> requests;  // empty: all
  std::string match_attribute;        // fully qualified
  std::string distinct_attribute;
};

struct ClaimSpec {
  std::vector<Request> requests;
  std::vector<Constraint> constraints;
};
// From a ResourceClaim's spec (spec.devices.requests[].exactly, constraints). Errors name the
// field. firstAvailable and allocationMode All are refused (not needed here).
Result<ClaimSpec> ParseClaimSpec(const nlohmann::json& spec);

struct DeviceResult {
  std::string request;
  std::string driver;
  std::string pool;
  std::string device;
  std::string share_id;                     // multi-allocatable devices only
  std::map<std::string, int64_t> consumed;  // consumedCapacity, multi-allocatable devices only
};

class Allocator {
 public:
  Allocator(std::vector<nlohmann::json> slices, std::vector<DeviceClass> classes);
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // The first fit for the whole claim, recorded as allocated; kUnavailable when none exists;
  // kInvalidInput for an unknown class.
  Result<std::vector<DeviceResult>> Allocate(const ClaimSpec& claim);
  // Gives back what Allocate returned.
  void Release(const std::vector<DeviceResult>& results);

  // status.allocation for a claim, as the scheduler writes it: devices.results (with shareID and
  // consumedCapacity as quantities) and a nodeSelector naming `node`.
  static nlohmann::json AllocationJson(const std::vector<DeviceResult>& results,
                                       const std::string& node);

  // Errors met while reading the slices (a quantity that does not parse, a device that consumes
  // an unknown counter set): a correct publisher produces none.
  const std::vector<std::string>& slice_errors() const { return slice_errors_; }

 private:
  struct Device;
  struct Pool;
  struct State;
  struct Search;
  bool Fits(const Device& d, const Request& r, const Search& s, std::map<std::string, int64_t>* consumed) const;
  bool Place(Search& s, size_t slot) const;

  std::vector<Pool> pools_;
  std::map<std::string, DeviceClass> classes_;
  std::vector<std::string> slice_errors_;
  std::unique_ptr<State> state_;  // what earlier claims hold
  uint64_t next_share_ = 0;
};

}  // namespace gpulet::testing::dra
