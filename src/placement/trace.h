// Reading a cluster and a workload in the Alibaba GPU trace "openb" format
// (cluster-trace-gpu-v2023, the FGD paper's data; ../shared/traces/alibaba-openb/README.md in this
// workspace):
//   nodes: sn,cpu_milli,memory_mib,gpu,model
//   pods:  name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]  (gpu_spec: "A|B", empty =
//   any)
// Columns are found by their header name, so extra columns (qos, times) and the five-column
// multigpu files both load. Errors name file:line:column.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "placement/cluster.h"

namespace gpulet::placement {

struct NodeListOptions {
  bool gpu_nodes_only = true;  // the paper's experiments replay the GPU nodes only
};

Result<Cluster> LoadNodes(const std::string& path, const NodeListOptions& options = {});

// Pods of a trace; GPU models in gpu_spec are looked up in `cluster` (a model the cluster lacks
// allows nothing, so a pod that names only absent models fits nowhere).
Result<std::vector<Pod>> LoadPods(const std::string& path, const Cluster& cluster);

// The trace variants of the openb data set, by name (default, cpu050, gpushare40, gpuspec10,
// multigpu20, ...): "<dir>/openb_pod_list_<name>.csv".
std::string TraceVariantPath(const std::string& dir, const std::string& variant);
std::string GpuNodeListPath(const std::string& dir);

}  // namespace gpulet::placement
