// Renders a Snapshot in the Prometheus text format 0.0.4 or OpenMetrics 1.0, with dcgm-exporter's
// names and label order:
//   gpu, UUID, pci_bus_id, device, modelName, [GPU_I_PROFILE, GPU_I_ID], Hostname,
//   <label rows of the counters file, by name>, <attributes, by name: container, err_code,
//   err_msg, namespace, pod>
// (dcgm-exporter's template writes its label map and then its attribute map, each in key order;
// the pod labels and XID err_code/err_msg are attributes.)
//
// Besides the counters file's families, every rendering carries gpulet_gpu_up (1/0 per physical
// GPU): a lost GPU's DCGM series disappear, the other GPUs' stay, and gpulet_gpu_up says which.
//
// OpenMetrics requires counter samples to end in _total, which would rename DCGM's counters
// (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION → …_total) and break existing queries; so in OpenMetrics
// those families are typed `unknown`, which keeps every series name identical in both formats.
#pragma once

#include <string>
#include <string_view>

#include "metrics/snapshot.h"

namespace gpulet::metrics {

enum class Format { kText004, kOpenMetrics };

inline constexpr std::string_view kText004ContentType = "text/plain; version=0.0.4; charset=utf-8";
inline constexpr std::string_view kOpenMetricsContentType =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

struct RenderOptions {
  Format format = Format::kText004;
  // With several pods on one GPU: true = one series per pod (default), false = one series whose
  // container/namespace/pod values are the pods' values joined by ",".
  bool series_per_pod = true;
  // dcgm-exporter's --kubernetes-enable-pod-uid: pod-labelled series also carry pod_uid (when
  // known). The per-pod process series of --kubernetes-virtual-gpus always carry it.
  bool pod_uid_label = false;
};

// GPU index → Slurm job id(s) ("12" or "12,15"), rendered as the `hpc_job` attribute (the label
// dcgm-exporter's HPC job mapping uses).
using JobMap = std::map<unsigned, std::string>;

// With series_per_pod, a GPU (or MIG instance) several pods share gets one series per pod and
// replica (labels container, namespace, pod, [pod_uid], vgpu) carrying the device's value; except
// DCGM_FI_DEV_GPU_UTIL and DCGM_FI_DEV_FB_USED when the snapshot carries the entity's processes
// (as dcgm-exporter 4.6+): then the device-wide series stays, without pod labels, and each
// holder whose UID is known gets a series with its pod's own value (metrics/processes.h: the
// sum over its processes, 0 when none runs).
std::string Render(const Snapshot& snapshot, const PodMap& pods, const RenderOptions& options,
                   const JobMap* jobs = nullptr);

// Label value escaping (both formats): backslash, double quote, line feed; bytes that are not
// UTF-8 become U+FFFD (the formats require UTF-8).
std::string EscapeLabelValue(std::string_view v);
// HELP text escaping: backslash and line feed (0.0.4), plus double quote in OpenMetrics.
std::string EscapeHelp(std::string_view v, Format format);
// "%f" for doubles (as dcgm-exporter), decimal integers otherwise.
std::string FormatValue(const Value& v);
// The description NVIDIA's XID catalogue gives an XID code ("Unknown Error" when not listed).
std::string_view XidMessage(int64_t code);

}  // namespace gpulet::metrics
