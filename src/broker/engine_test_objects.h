// Slurm state for the broker engines' unit tests (engine_test.cc, scaled_engine_test.cc): one
// fixed "now", and the nodes and jobs both engines are fed. Header-only; for tests.
#pragma once

#include <string>

#include "broker/model.h"

namespace gpulet::broker::testobjects {

inline constexpr TimeMs kMin = 60 * 1000;
inline constexpr TimeMs kNow = 1'000'000'000'000;

// An idle node, last busy `idle_for` before kNow; with `type`, all its GPUs are of that type.
inline SlurmNode Idle(const std::string& name, TimeMs idle_for, int gpus = 4,
                      const std::string& type = "") {
  SlurmNode n;
  n.name = name;
  n.state = "idle";
  n.gpus = gpus;
  if (!type.empty()) n.gpu_types = {{type, gpus}};
  n.last_busy = kNow - idle_for;
  return n;
}

// A job pending for resources: `nodes` nodes with `per_node` GPUs of `type` ("" = any) each.
inline SlurmJob PendingJob(const std::string& id, const std::string& type, int per_node,
                           int nodes) {
  SlurmJob j;
  j.id = id;
  j.state = "PENDING";
  j.reason = "Resources";
  j.gpu_type = type;
  j.gpus_per_node = per_node;
  j.node_count = nodes;
  return j;
}

}  // namespace gpulet::broker::testobjects
