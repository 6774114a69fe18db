// CPUs= for a node's slurm.conf line. Slurm rejects a node whose slurmd finds fewer CPUs than the
// line claims, so the count must be the machine's, never a guess shaped like a simulation.
#pragma once

#include <string>
#include <vector>

namespace gpulet::slurm {

struct CpuCount {
  unsigned cpus = 0;
  std::string source;   // "sysfs", "fixture" or "sysconf"
  std::string warning;  // set when the count did not come from sysfs on a real node
};

// From <sysfs_root>/devices/system/cpu/online. When that file cannot be read: on a simulated
// node, the union of the fixture's GPU CPU lists (its fake tree has no CPU files); on a real node,
// the CPUs online according to sysconf(_SC_NPROCESSORS_ONLN), with a warning naming the file.
CpuCount CountCpus(const std::string& sysfs_root, bool simulated,
                   const std::vector<std::string>& gpu_cpu_lists);

}  // namespace gpulet::slurm
