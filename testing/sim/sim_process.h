// A compute process running on a simulated GPU, as nvmlDeviceGetComputeRunningProcesses_v3 and
// nvmlDeviceGetProcessUtilization report it. A fixture lists a GPU's processes (`processes:`);
// the control state (`gpulet sim` writers, tests) may replace one GPU's list while the node runs.
#pragma once

#include <cstdint>

namespace gpulet::sim {

struct SimProcess {
  unsigned pid = 0;
  uint64_t memory_mib = 0;  // usedGpuMemory, in MiB
  unsigned sm_util = 0;     // percent
  unsigned mem_util = 0;    // percent
  // The MIG GPU instance the process runs in (a GPU with MIG enabled); all ones otherwise.
  unsigned gi = 0xFFFFFFFFu;
  unsigned ci = 0xFFFFFFFFu;
  bool operator==(const SimProcess&) const = default;
};

}  // namespace gpulet::sim
