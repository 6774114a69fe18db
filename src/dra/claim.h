// A ResourceClaim as the kubelet plugin needs it: identity, the allocation's results for this
// driver, the opaque configs that apply to them, and reservedFor. Parsed (claim.cc) from the
// resource.k8s.io/v1 object the plugin GETs from the API server; a claim is tenant-written input:
// parsing bounds every list and string and never trusts a field it does not check.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>
#include <string_view>

#include "common/status.h"

namespace gpulet::dra {

struct ClaimRef {
  std::string namespace_;
  std::string name;
  std::string uid;
};

struct OpaqueConfig {
  std::vector<std::string> requests;  // empty: applies to every request
  std::string driver;                 // only kDriverName's configs reach a Preparer
  std::string parameters_json;        // the RawExtension, at most 10 KiB, as written
  bool from_class = false;            // source FromClass (lower precedence than FromClaim)
  std::string where;                  // "ResourceClaim ns/name: status.allocation.devices.config[2]"
};

struct AllocatedDevice {
  std::string request;  // may carry "/subrequest"
  std::string driver;
  std::string pool;
  std::string device;
  std::string share_id;                          // set for allowMultipleAllocations devices
  std::map<std::string, int64_t> consumed;       // consumedCapacity, in bytes / units
  bool admin_access = false;
};

struct Claim {
  ClaimRef ref;
  bool allocated = false;
  std::vector<AllocatedDevice> devices;  // this driver's results only, in allocation order
  std::vector<OpaqueConfig> configs;     // this driver's configs, class ones first
  std::vector<std::string> reserved_for_uids;  // status.reservedFor[].uid
  bool deleting = false;                 // metadata.deletionTimestamp set
  // status.allocation.nodeSelector: the node names its matchFields terms allow (metadata.name
  // In [...]); empty when the selector names none (label terms only, or no selector).
  std::vector<std::string> node_names;
};

// Parses a resource.k8s.io/v1 ResourceClaim object (claim.cc). Every list and string is bounded by
// the API's own limits; only kDriverName's results and configs are kept. Errors are kInvalidInput
// naming the claim and the field ("ResourceClaim ns/name: status.allocation.devices.results[3].
// device: ...").
Result<Claim> ParseClaim(const nlohmann::json& object);
// The same from the JSON text (at most kMaxClaimBytes).
inline constexpr size_t kMaxClaimBytes = 3u << 20;
Result<Claim> ParseClaimJson(std::string_view text);

}  // namespace gpulet::dra
