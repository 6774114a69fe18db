// The simulated driver, part 4: compute processes and their utilisation samples.
//
// A GPU's processes come from the control state when `gpulet sim` (or a test) set them, else
// from the fixture's `processes:`. On a GPU with MIG enabled, the physical GPU's handle lists
// every process with its GPU and compute instance ids, and a MIG device's handle lists the
// processes of its GPU instance; per-process utilisation is not reported for MIG devices
// (NVML_ERROR_NOT_SUPPORTED), as on the driver. Each call samples every process "now", so a
// caller that passes the previous call's newest timeStamp gets NVML_ERROR_NOT_FOUND only when
// called again within the same microsecond.
#include "sim/nvml_sim_driver.h"

namespace gpulet::sim {
namespace {

const std::vector<SimProcess>& ProcessesOf(const Session& s, const GpuSpec& g) {
  auto it = s.d.state.processes.find(g.index);
  return it != s.d.state.processes.end() ? it->second : g.processes;
}

// The processes a handle reports: all of the GPU's, or those of one MIG GPU instance.
std::vector<SimProcess> Visible(const Session& s, const Target& t) {
  std::vector<SimProcess> out;
  for (const SimProcess& p : ProcessesOf(s, *t.gpu)) {
    if (t.mig != nullptr && p.gi != t.mig->gi) continue;
    out.push_back(p);
  }
  return out;
}

}  // namespace
}  // namespace gpulet::sim

SIM_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                                 unsigned int* infoCount,
                                                                 nvmlProcessInfo_t* infos) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    Target t;
    if (nvmlReturn_t rc = Resolve(s, device, infoCount != nullptr, &t); rc != NVML_SUCCESS) {
      return rc;
    }
    const std::vector<gpulet::sim::SimProcess> procs = gpulet::sim::Visible(s, t);
    const unsigned capacity = infos != nullptr ? *infoCount : 0;
    *infoCount = static_cast<unsigned>(procs.size());
    if (capacity < procs.size()) return NVML_ERROR_INSUFFICIENT_SIZE;
    constexpr unsigned long long kMiB = 1024ULL * 1024ULL;
    const bool mig = t.gpu->mig_enabled();
    for (size_t i = 0; i < procs.size(); ++i) {
      infos[i].pid = procs[i].pid;
      infos[i].usedGpuMemory = procs[i].memory_mib * kMiB;
      infos[i].gpuInstanceId = mig ? procs[i].gi : gpulet::sim::kNoInstance;
      infos[i].computeInstanceId = mig ? procs[i].ci : gpulet::sim::kNoInstance;
    }
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                        nvmlProcessUtilizationSample_t* utilization,
                                                        unsigned int* processSamplesCount,
                                                        unsigned long long lastSeenTimeStamp) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    Target t;
    if (nvmlReturn_t rc = Resolve(s, device, processSamplesCount != nullptr, &t);
        rc != NVML_SUCCESS) {
      return rc;
    }
    if (t.mig != nullptr) return NVML_ERROR_NOT_SUPPORTED;
    const unsigned long long now_us =
        static_cast<unsigned long long>(gpulet::sim::WallClockMs()) * 1000ULL;
    const std::vector<gpulet::sim::SimProcess> procs = gpulet::sim::Visible(s, t);
    if (procs.empty() || now_us <= lastSeenTimeStamp) {
      *processSamplesCount = 0;
      return NVML_ERROR_NOT_FOUND;
    }
    const unsigned capacity = utilization != nullptr ? *processSamplesCount : 0;
    *processSamplesCount = static_cast<unsigned>(procs.size());
    if (capacity < procs.size()) return NVML_ERROR_INSUFFICIENT_SIZE;
    for (size_t i = 0; i < procs.size(); ++i) {
      utilization[i] = {};
      utilization[i].pid = procs[i].pid;
      utilization[i].timeStamp = now_us;
      utilization[i].smUtil = procs[i].sm_util;
      utilization[i].memUtil = procs[i].mem_util;
    }
    return NVML_SUCCESS;
  });
}
