// The device side of NodePrepareResources: what one claim's allocation means on this node.
// The plugin (plugin.cc) reads the claim, checks it is allocated to this node and reserved, holds
// the checkpoint; a Preparer makes the devices usable (CDI spec, MIG placement, memory-share
// limit, time-slicing/MPS config) and undoes that exactly. Prepare is all-or-nothing: on failure
// it rolls back whatever it did before returning the error.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "dra/claim.h"

namespace gpulet::dra {

struct PreparedDevice {
  std::vector<std::string> requests;  // request names (without "/subrequest")
  std::string pool;
  std::string device;
  std::string share_id;
  std::vector<std::string> cdi_device_ids;  // "vendor/class=name"
  // A JSON object the plugin writes to the claim's status.devices[].data (what the device is on
  // this node: GPU and MIG UUIDs, memory limit, sharing); empty: none. Not checkpointed.
  std::string status_data;
};

// What Unprepare needs to undo a Prepare after a restart, with the claim gone from the API
// server: stored in the checkpoint as `record_json` (the Preparer's own format, versioned).
struct PrepareResult {
  std::vector<PreparedDevice> devices;
  std::string record_json;
};

class Preparer {
 public:
  virtual ~Preparer() = default;
  // Idempotent: preparing the same claim UID again returns the same devices.
  virtual Result<PrepareResult> Prepare(const Claim& claim) = 0;
  // Undoes a Prepare from its record; succeeds when nothing is left (also when already undone).
  virtual Status Unprepare(const ClaimRef& claim, const std::string& record_json) = 0;
};

}  // namespace gpulet::dra
