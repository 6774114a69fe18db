// Small hand-built clusters for the placement tests.
#pragma once

#include <initializer_list>
#include <string>

#include "placement/cluster.h"

namespace gpulet::placement::testing {

inline Node MakeNode(std::string name, int model, int64_t cpu_free,
                     std::initializer_list<int32_t> gpu_free) {
  Node n;
  n.name = std::move(name);
  n.model = gpu_free.size() > 0 ? model : -1;
  n.cpu_milli = n.cpu_free = cpu_free;
  n.memory_mib = n.memory_free = 1 << 20;
  n.gpu_free.assign(gpu_free);
  return n;
}

inline Pod MakePod(int64_t cpu_milli, int32_t num_gpu, int32_t gpu_milli) {
  Pod p;
  p.name = "pod";
  p.cpu_milli = cpu_milli;
  p.memory_mib = 1024;
  p.num_gpu = num_gpu;
  p.gpu_milli = num_gpu > 0 ? gpu_milli : 0;
  return p;
}

}  // namespace gpulet::placement::testing
