#include "slurm/node_cpus.h"

#include <unistd.h>

#include <fstream>
#include <set>

#include "slurm/id_list.h"

namespace gpulet::slurm {

CpuCount CountCpus(const std::string& sysfs_root, bool simulated,
                   const std::vector<std::string>& gpu_cpu_lists) {
  CpuCount c;
  const std::string online = sysfs_root + "/devices/system/cpu/online";
  std::ifstream in(online);
  std::string line;
  if (in && std::getline(in, line)) {
    if (auto ids = ParseIdList(line); ids && !ids->empty()) {
      c.cpus = static_cast<unsigned>(ids->size());
      c.source = "sysfs";
      return c;
    }
  }
  if (simulated) {
    std::set<unsigned> all;
    for (const std::string& list : gpu_cpu_lists) {
      if (auto ids = ParseIdList(list)) all.insert(ids->begin(), ids->end());
    }
    c.cpus = static_cast<unsigned>(all.size());
    c.source = "fixture";
    return c;
  }
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  c.cpus = n > 0 ? static_cast<unsigned>(n) : 1;
  c.source = "sysconf";
  c.warning =
      online + " unreadable: CPUs=" + std::to_string(c.cpus) +
      " is the count of online CPUs from sysconf; check it against slurmd -C or pass --cpus";
  return c;
}

}  // namespace gpulet::slurm
