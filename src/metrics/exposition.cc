#include "metrics/exposition.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <utility>

#include "common/utf8.h"
#include "metrics/processes.h"

namespace gpulet::metrics {
namespace {

struct XidText {
  int code;
  std::string_view text;
};

// Descriptions from NVIDIA's public XID error catalogue (docs.nvidia.com/deploy/xid-errors).
constexpr XidText kXidTexts[] = {
    {0, "No Error"},
    {8, "GPU stopped processing"},
    {13, "Graphics Engine Exception"},
    {31, "GPU memory page fault"},
    {32, "Invalid or corrupted push buffer stream"},
    {38, "Driver firmware error"},
    {43, "GPU stopped processing"},
    {45, "Preemptive cleanup, due to previous errors"},
    {48, "Double Bit ECC Error"},
    {54, "Auxiliary power is not connected to the GPU board"},
    {56, "Display Engine error"},
    {57, "Error programming video memory interface"},
    {58, "Unstable video memory interface detected"},
    {61, "Internal micro-controller breakpoint/warning"},
    {62, "Internal micro-controller halt"},
    {63, "ECC page retirement or row remapping recording event"},
    {64, "ECC page retirement or row remapper recording failure"},
    {68, "NVDEC0 Exception"},
    {69, "Graphics Engine class error"},
    {74, "NVLINK Error"},
    {79, "GPU has fallen off the bus"},
    {80, "Corrupted data sent to GPU"},
    {81, "VGA Subsystem Error"},
    {92, "High single-bit ECC error rate"},
    {94, "Contained ECC error"},
    {95, "Uncontained ECC error"},
    {109, "Context Switch Timeout Error"},
    {119, "GSP RPC Timeout"},
    {120, "GSP Error"},
    {121, "C2C Link Error"},
    {140, "Unrecovered ECC Error"},
    {143, "GPU Initialization Failure"},
};

void AppendLabel(std::string& out, std::string_view name, std::string_view value, bool& first) {
  if (!first) out += ',';
  first = false;
  out += name;
  out += "=\"";
  out += EscapeLabelValue(value);
  out += '"';
}

// gpu, UUID, pci_bus_id, device, modelName, [GPU_I_PROFILE, GPU_I_ID], Hostname.
void AppendIdentity(std::string& out, const GpuIdentity& gpu, const std::string& mig_profile,
                    int gpu_instance_id, const std::string& hostname, bool& first) {
  AppendLabel(out, "gpu", std::to_string(gpu.index), first);
  AppendLabel(out, "UUID", gpu.uuid, first);
  AppendLabel(out, "pci_bus_id", gpu.pci_bus_id, first);
  AppendLabel(out, "device", "nvidia" + std::to_string(gpu.index), first);
  AppendLabel(out, "modelName", gpu.model, first);
  if (!mig_profile.empty()) {
    AppendLabel(out, "GPU_I_PROFILE", mig_profile, first);
    AppendLabel(out, "GPU_I_ID", std::to_string(gpu_instance_id), first);
  }
  if (!hostname.empty()) AppendLabel(out, "Hostname", hostname, first);
}

std::string Join(const std::vector<PodRef>& pods, std::string PodRef::*member) {
  std::string s;
  for (size_t i = 0; i < pods.size(); ++i) {
    if (i != 0) s += ',';
    s += pods[i].*member;
  }
  return s;
}

// One entry per container (replicas of the same container folded), for the joined labels.
std::vector<PodRef> Containers(const std::vector<PodRef>& pods) {
  std::vector<PodRef> out;
  for (const PodRef& p : pods) {
    const bool seen = std::any_of(out.begin(), out.end(), [&](const PodRef& o) {
      return o.namespace_ == p.namespace_ && o.pod == p.pod && o.container == p.container;
    });
    if (!seen) out.push_back(p);
  }
  return out;
}

// The fields dcgm-exporter splits per process (its isPerProcessMetric).
enum class PerProcess { kNo, kGpuUtil, kFbUsed };
PerProcess PerProcessField(std::string_view field) {
  if (field == "DCGM_FI_DEV_GPU_UTIL") return PerProcess::kGpuUtil;
  if (field == "DCGM_FI_DEV_FB_USED") return PerProcess::kFbUsed;
  return PerProcess::kNo;
}

}  // namespace

std::string EscapeLabelValue(std::string_view raw) {
  // Prometheus refuses a whole scrape for one label value that is not UTF-8; a job or pod name
  // may carry anything, so invalid bytes become U+FFFD.
  std::string valid;
  std::string_view v = raw;
  if (!IsValidUtf8(raw)) {
    valid = ToValidUtf8(raw);
    v = valid;
  }
  if (v.find_first_of("\\\"\n") == std::string_view::npos) return std::string(v);
  std::string out;
  out.reserve(v.size() + 8);
  for (char c : v) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string EscapeHelp(std::string_view v, Format format) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && format == Format::kOpenMetrics) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatValue(const Value& v) {
  char buf[64];
  if (v.is_double) {
    std::snprintf(buf, sizeof buf, "%f", v.d);
  } else {
    std::snprintf(buf, sizeof buf, "%" PRId64, v.i);
  }
  return buf;
}

std::string_view XidMessage(int64_t code) {
  for (const XidText& x : kXidTexts) {
    if (x.code == code) return x.text;
  }
  return "Unknown Error";
}

std::string Render(const Snapshot& snapshot, const PodMap& pods, const RenderOptions& options,
                   const JobMap* jobs) {
  std::string out;
  if (!snapshot.counters) return out;
  const CounterSet& cs = *snapshot.counters;
  const bool om = options.format == Format::kOpenMetrics;

  // Label rows in key order, as dcgm-exporter's template ranges over its label map.
  std::vector<size_t> label_order(cs.labels.size());
  for (size_t i = 0; i < label_order.size(); ++i) label_order[i] = i;
  std::sort(label_order.begin(), label_order.end(),
            [&](size_t a, size_t b) { return cs.labels[a].field < cs.labels[b].field; });

  // Per entity: the label text up to (not including) the attributes, and its pods.
  std::vector<std::string> bases(snapshot.entities.size());
  std::vector<const std::vector<PodRef>*> entity_pods(snapshot.entities.size(), nullptr);
  std::vector<const std::string*> entity_job(snapshot.entities.size(), nullptr);
  std::vector<std::vector<PodRef>> entity_containers(snapshot.entities.size());
  std::vector<std::map<std::string, PodUse>> entity_use(snapshot.entities.size());
  for (size_t e = 0; e < snapshot.entities.size(); ++e) {
    const EntitySample& ent = snapshot.entities[e];
    bool first = true;
    AppendIdentity(bases[e], ent.gpu, ent.mig_profile, ent.key.gpu_instance_id, snapshot.hostname,
                   first);
    for (size_t li : label_order) {
      if (li < ent.labels.size()) AppendLabel(bases[e], cs.labels[li].field, ent.labels[li], first);
    }
    auto it = pods.find(ent.key);
    if (it != pods.end() && !it->second.empty()) {
      entity_pods[e] = &it->second;
      if (!options.series_per_pod) entity_containers[e] = Containers(it->second);
      if (ent.processes_read) entity_use[e] = SumByPod(ent.processes);
    }
    if (jobs != nullptr) {
      auto j = jobs->find(ent.key.gpu);
      if (j != jobs->end() && !j->second.empty()) entity_job[e] = &j->second;
    }
  }
  out.reserve(snapshot.entities.size() * cs.metrics.size() *
                  (bases.empty() ? 0 : bases[0].size() + 64) +
              cs.metrics.size() * 128 + 1024);

  std::vector<std::pair<std::string_view, std::string>> attrs;
  for (size_t m = 0; m < cs.metrics.size(); ++m) {
    const Counter& c = cs.metrics[m];
    bool header = false;
    const bool is_xid = c.info != nullptr && c.info->source == Source::kXid;
    const bool is_xid_count = c.info != nullptr && c.info->source == Source::kXidCount;
    for (size_t e = 0; e < snapshot.entities.size(); ++e) {
      const EntitySample& ent = snapshot.entities[e];
      if (m >= ent.values.size() || !ent.values[m]) continue;
      if (!header) {
        header = true;
        out += "# HELP ";
        out += c.field;
        out += ' ';
        out += EscapeHelp(c.help, options.format);
        out += "\n# TYPE ";
        out += c.field;
        out += ' ';
        out += (c.type == PromType::kCounter) ? (om ? "unknown" : "counter") : "gauge";
        out += '\n';
      }
      // DCGM_EXP_XID_ERRORS_COUNT: one series per XID code (label xid), its count as value.
      std::vector<std::pair<std::string, std::string>> variants;  // (xid label, value)
      if (is_xid_count) {
        for (const auto& [code, n] : ent.xid_counts) {
          variants.emplace_back(std::to_string(code), std::to_string(n));
        }
      } else {
        variants.emplace_back("", FormatValue(*ent.values[m]));
      }
      // One series per pod holding the entity (or one series with joined pods, or no pods).
      // Per-process fields: the device-wide series (s == -1), then one per holder with a UID.
      const std::vector<PodRef>* holders = entity_pods[e];
      const PerProcess per_process = PerProcessField(c.field);
      const bool per_pod_values = holders != nullptr && options.series_per_pod &&
                                  per_process != PerProcess::kNo && ent.processes_read;
      long first_series = 0;
      long n_series = 1;
      if (holders != nullptr && options.series_per_pod)
        n_series = static_cast<long>(holders->size());
      if (per_pod_values) first_series = -1;
      for (const auto& [xid_label, value] : variants) {
        for (long s = first_series; s < n_series; ++s) {
          const PodRef* holder = (holders != nullptr && options.series_per_pod && s >= 0)
                                     ? &(*holders)[static_cast<size_t>(s)]
                                     : nullptr;
          std::string series_value = value;
          if (per_pod_values && holder != nullptr) {
            if (holder->uid.empty()) continue;  // its processes cannot be told apart
            auto use = entity_use[e].find(holder->uid);
            int64_t v = 0;
            if (use != entity_use[e].end()) {
              v = per_process == PerProcess::kGpuUtil ? use->second.sm_util
                                                      : use->second.fb_used_mib;
            }
            series_value = std::to_string(v);
          }
          attrs.clear();
          if (is_xid_count) attrs.emplace_back("xid", xid_label);
          if (is_xid) {
            const int64_t code = ent.values[m]->i;
            attrs.emplace_back("err_code", std::to_string(code));
            attrs.emplace_back("err_msg", std::string(XidMessage(code)));
          }
          if (entity_job[e] != nullptr) attrs.emplace_back("hpc_job", *entity_job[e]);
          if (holder != nullptr) {
            attrs.emplace_back("container", holder->container);
            attrs.emplace_back("namespace", holder->namespace_);
            attrs.emplace_back("pod", holder->pod);
            if (!holder->uid.empty() && (per_pod_values || options.pod_uid_label)) {
              attrs.emplace_back("pod_uid", holder->uid);
            }
            if (!holder->vgpu.empty()) attrs.emplace_back("vgpu", holder->vgpu);
            if (!holder->dra_claim_name.empty()) {
              attrs.emplace_back("dra_claim_name", holder->dra_claim_name);
              attrs.emplace_back("dra_claim_namespace", holder->dra_claim_namespace);
              attrs.emplace_back("dra_driver_name", holder->dra_driver_name);
              attrs.emplace_back("dra_pool_name", holder->dra_pool_name);
              attrs.emplace_back("dra_device_name", holder->dra_device_name);
            }
          } else if (holders != nullptr && !options.series_per_pod) {
            const std::vector<PodRef>& cs_ = entity_containers[e];
            attrs.emplace_back("container", Join(cs_, &PodRef::container));
            attrs.emplace_back("namespace", Join(cs_, &PodRef::namespace_));
            attrs.emplace_back("pod", Join(cs_, &PodRef::pod));
            if (options.pod_uid_label) attrs.emplace_back("pod_uid", Join(cs_, &PodRef::uid));
            if (std::any_of(cs_.begin(), cs_.end(),
                            [](const PodRef& p) { return !p.dra_claim_name.empty(); })) {
              attrs.emplace_back("dra_claim_name", Join(cs_, &PodRef::dra_claim_name));
              attrs.emplace_back("dra_claim_namespace", Join(cs_, &PodRef::dra_claim_namespace));
              attrs.emplace_back("dra_driver_name", Join(cs_, &PodRef::dra_driver_name));
              attrs.emplace_back("dra_pool_name", Join(cs_, &PodRef::dra_pool_name));
              attrs.emplace_back("dra_device_name", Join(cs_, &PodRef::dra_device_name));
            }
          }
          std::sort(attrs.begin(), attrs.end(),
                    [](const auto& a, const auto& b) { return a.first < b.first; });
          out += c.field;
          out += '{';
          out += bases[e];
          bool first = bases[e].empty();
          for (const auto& [k, v] : attrs) AppendLabel(out, k, v, first);
          out += "} ";
          out += series_value;
          out += '\n';
        }
      }
    }
  }

  if (!snapshot.gpus.empty()) {
    out +=
        "# HELP gpulet_gpu_up 1 when gpulet read the GPU in the last collection, 0 when NVML "
        "reports it lost (its DCGM series are left out until it returns).\n"
        "# TYPE gpulet_gpu_up gauge\n";
    for (const GpuHealth& g : snapshot.gpus) {
      out += "gpulet_gpu_up{";
      bool first = true;
      AppendIdentity(out, g.gpu, "", -1, snapshot.hostname, first);
      out += g.up ? "} 1\n" : "} 0\n";
    }
  }
  // Always present, so an alert can require 0 on production nodes: 1 means the GPUs come from a
  // fixture through gpulet's simulated driver, not from the hardware.
  out +=
      "# HELP gpulet_simulated_driver 1 when the GPUs are simulated from a fixture (gpulet's "
      "simulated NVML), 0 on the real driver.\n"
      "# TYPE gpulet_simulated_driver gauge\n"
      "gpulet_simulated_driver";
  if (!snapshot.hostname.empty()) {
    out += "{Hostname=\"";
    out += EscapeLabelValue(snapshot.hostname);
    out += "\"}";
  }
  out += snapshot.simulated ? " 1\n" : " 0\n";
  if (om) out += "# EOF\n";
  return out;
}

}  // namespace gpulet::metrics
