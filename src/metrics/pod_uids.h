// Pod UIDs from the Kubernetes API server: GET /api/v1/pods?fieldSelector=spec.nodeName=<node>
// (RBAC: `list` on pods), as dcgm-exporter's pod informer does. Needed by
// --kubernetes-virtual-gpus (a process's cgroup names its pod by UID) and
// --kubernetes-enable-pod-uid (the pod_uid label).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "k8s/client.h"
#include "metrics/pod_resources.h"

namespace gpulet::metrics {

// (namespace, name) → metadata.uid of every item of a PodList; items without one are skipped.
PodUidMap PodUidsFromList(const nlohmann::json& pod_list);

// The UIDs of the pods bound to `node_name` (every pod when empty).
Result<PodUidMap> ListPodUids(const k8s::Client& client, const std::string& node_name);

}  // namespace gpulet::metrics
