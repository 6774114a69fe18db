// Per GPU of the memory pool (sharing.memory, docs/sharing.md "Memory pool"): the units the
// device plugin has allocated and the units the GPU has, as two gauges
//
//   gpulet_memory_pool_allocated_units{gpu, UUID, resource}
//   gpulet_memory_pool_units{gpu, UUID, resource}
//
// The values come from the document the plugin's publisher writes (memory.json): `gpulet node`
// hands each published document to a MemoryPoolGauges that its exporter renders, so the gauges
// and the extender's view agree.
#pragma once

#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace gpulet::metrics {

struct MemoryPoolGpu {
  std::string resource;
  std::string uuid;
  unsigned index = 0;
  int total = 0;
  int allocated = 0;
  bool operator==(const MemoryPoolGpu&) const = default;
};

// The GPUs of a memory.json document (allocated = totalUnits − freeUnits); malformed entries
// are skipped.
std::vector<MemoryPoolGpu> MemoryPoolFromDocument(const nlohmann::json& document);

// The two gauges in the text format (0.0.4); empty when there are no GPUs.
std::string RenderMemoryPool(const std::vector<MemoryPoolGpu>& gpus);

// The latest values, shared between the plugin (writer) and the exporter (reader). Thread-safe.
class MemoryPoolGauges {
 public:
  void Set(std::vector<MemoryPoolGpu> gpus);
  std::string Text() const;

 private:
  mutable std::mutex mu_;
  std::string text_;
};

}  // namespace gpulet::metrics
