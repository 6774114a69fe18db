#include "sharing/plan.h"

#include <algorithm>

namespace gpulet::sharing {

const AdvertisedDevice* Resource::Find(const std::string& id) const {
  for (const AdvertisedDevice& d : devices) {
    if (d.id == id) return &d;
  }
  return nullptr;
}

const Resource* Plan::Find(const std::string& name) const {
  for (const Resource& r : resources) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

std::string SocketNameFor(const std::string& resource_name) {
  // "<domain>/<name>": the domain's first label names the vendor, the name keeps its dots.
  const size_t slash = resource_name.find('/');
  if (slash == std::string::npos) return resource_name + ".sock";
  const std::string domain = resource_name.substr(0, slash);
  return domain.substr(0, domain.find('.')) + "-" + resource_name.substr(slash + 1) + ".sock";
}

namespace {

AdvertisedDevice WholeGpu(const gpu::Gpu& g) {
  AdvertisedDevice d;
  d.id = g.uuid;
  d.gpu_index = g.index;
  d.uuid = g.uuid;
  d.index = std::to_string(g.index);
  d.numa_node = g.numa_node;
  return d;
}

}  // namespace

Result<Plan> BuildPlan(const gpu::Inventory& inventory, const config::Config& config) {
  const config::MigStrategy mig = config.flags.mig_strategy.value_or(config::MigStrategy::kNone);
  if (mig != config::MigStrategy::kNone) {
    return Status(ErrorCode::kInvalidInput,
                  config.source + ": flags.migStrategy: \"" + config::MigStrategyName(mig) +
                      "\" is not supported by this version yet (use none)");
  }
  if (config.sharing.time_slicing) {
    return config::InvalidAt(config.sharing.time_slicing->where,
                             "time-slicing is not supported by this version yet");
  }
  if (config.sharing.mps) {
    return config::InvalidAt(config.sharing.mps->where, "MPS is not supported by this version yet");
  }

  Plan plan;
  Resource gpus;
  gpus.name = "nvidia.com/gpu";
  gpus.socket_name = SocketNameFor(gpus.name);
  std::vector<const gpu::Gpu*> ordered;
  for (const gpu::Gpu& g : inventory.gpus) ordered.push_back(&g);
  std::sort(ordered.begin(), ordered.end(),
            [](const gpu::Gpu* a, const gpu::Gpu* b) { return a->index < b->index; });
  for (const gpu::Gpu* g : ordered) gpus.devices.push_back(WholeGpu(*g));
  // A node without GPUs advertises nothing rather than an empty resource.
  if (!gpus.devices.empty()) plan.resources.push_back(std::move(gpus));
  return plan;
}

}  // namespace gpulet::sharing
