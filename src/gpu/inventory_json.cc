#include "gpu/inventory_json.h"

namespace gpulet::gpu {

nlohmann::json ToJson(const Inventory& inv) {
  nlohmann::json gpus = nlohmann::json::array();
  for (const Gpu& g : inv.gpus) {
    nlohmann::json mig = nlohmann::json::array();
    for (const MigDevice& m : g.mig_devices) {
      mig.push_back({{"index", m.mig_index},
                     {"uuid", m.uuid},
                     {"profile", m.profile},
                     {"gpu_instance_id", m.gpu_instance_id},
                     {"compute_instance_id", m.compute_instance_id},
                     {"memory_mib", m.memory_mib},
                     {"sm_count", m.sm_count},
                     {"gi_cap_path", m.gi_cap_path},
                     {"ci_cap_path", m.ci_cap_path}});
    }
    nlohmann::json links = nlohmann::json::array();
    for (size_t j = 0; j < inv.gpus.size(); ++j) {
      if (j == g.index) continue;
      const Link& l = inv.links[g.index][j];
      links.push_back({{"peer", j}, {"nvlinks", l.nvlinks}, {"pcie", PcieRelationName(l.pcie)}});
    }
    nlohmann::json jg = {{"index", g.index},
                         {"uuid", g.uuid},
                         {"name", g.name},
                         {"memory_mib", g.memory_mib},
                         {"pci_bus_id", g.pci_bus_id},
                         {"minor", g.minor},
                         {"device", g.device_path()},
                         {"compute_capability", g.compute_capability()},
                         {"architecture", g.architecture},
                         {"numa_node", nullptr},
                         {"cpu_affinity", g.cpu_affinity},
                         {"mig_capable", g.mig_capable},
                         {"mig_enabled", g.mig_enabled},
                         {"mig_devices", mig},
                         {"links", links}};
    if (g.numa_node) jg["numa_node"] = *g.numa_node;
    gpus.push_back(std::move(jg));
  }
  nlohmann::json matrix = nlohmann::json::array();
  for (size_t i = 0; i < inv.gpus.size(); ++i) {
    nlohmann::json row = nlohmann::json::array();
    for (size_t j = 0; j < inv.gpus.size(); ++j) row.push_back(i == j ? 0U : inv.links[i][j].nvlinks);
    matrix.push_back(std::move(row));
  }
  return {{"driver_version", inv.driver_version},
          {"cuda_version", inv.cuda_version},
          {"nvml_library", inv.nvml_library},
          {"gpu_count", inv.gpus.size()},
          {"mig_device_count", inv.MigDeviceCount()},
          {"gpus", gpus},
          {"nvlink_matrix", matrix}};
}

}  // namespace gpulet::gpu
