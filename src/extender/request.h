// Reading the scheduler's requests without a DOM: the fields the extender uses are taken from a
// SAX pass over the body, so the memory a request costs is its body plus the names and
// quantities kept, whatever else the body holds (a Pod with 4 MiB of annotations, a 1,000,000-
// element array, 100,000 levels of nesting cost no more than the bytes themselves).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "extender/view.h"

namespace gpulet::extender {

// The most node names (or node objects) one request may carry: three times the 5,000 nodes a
// cluster is supported at. Each name costs an entry in the answer (a reason when it fails), so
// the bound on the body alone would let a request of short names cost tens of MiB.
inline constexpr size_t kMaxNodeNames = 15000;

// ExtenderArgs {Pod, Nodes, NodeNames}, field names matched as Go's encoding/json does
// (case-insensitively; the last of repeated keys counts).
struct ExtenderArgsFields {
  bool has_pod = false;      // Pod was an object
  PodRequest pod;            // when has_pod and pod_error is empty
  std::string pod_error;     // the pod's own spec is wrong (names the container and field)
  bool names_given = false;  // NodeNames was a list (else null or absent)
  std::vector<std::string> names;
  bool nodes_given = false;             // Nodes was an object (full-node mode)
  std::vector<std::string> node_items;  // Nodes.items[].metadata.name
};

// kInvalidInput naming the field: not JSON, not an object, a field of the wrong type.
Result<ExtenderArgsFields> ReadExtenderArgs(std::string_view body,
                                            const MemoryResourceTest& is_memory);

}  // namespace gpulet::extender
