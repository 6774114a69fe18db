// gpulet info: the node's inventory, as nvidia-smi -L + nvidia-smi topo -m would show it.
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "gpu/inventory_json.h"

namespace gpulet::cli {
namespace {

std::string LinkCell(const gpu::Inventory& inv, size_t i, size_t j) {
  if (i == j) return "X";
  const gpu::Link& l = inv.links[i][j];
  if (l.nvlinks > 0) return "NV" + std::to_string(l.nvlinks);
  return gpu::PcieRelationName(l.pcie);
}

void PrintTable(const gpu::Inventory& inv) {
  std::printf("Driver %s, CUDA %s, NVML %s\n", inv.driver_version.c_str(),
              inv.cuda_version.empty() ? "?" : inv.cuda_version.c_str(), inv.nvml_library.c_str());
  for (const gpu::Gpu& g : inv.gpus) {
    std::printf("GPU %u: %s (UUID: %s)\n", g.index, g.name.c_str(), g.uuid.c_str());
    std::printf("  memory %llu MiB, bus %s, %s, cc %s (%s), NUMA %s, CPUs %s, MIG %s\n",
                static_cast<unsigned long long>(g.memory_mib), g.pci_bus_id.c_str(),
                g.device_path().c_str(), g.compute_capability().c_str(), g.architecture.c_str(),
                g.numa_node ? std::to_string(*g.numa_node).c_str() : "N/A",
                g.cpu_affinity.empty() ? "N/A" : g.cpu_affinity.c_str(),
                !g.mig_capable ? "not supported" : (g.mig_enabled ? "enabled" : "disabled"));
    for (const gpu::MigDevice& m : g.mig_devices) {
      std::printf("  MIG %-10s Device %u: (UUID: %s) GI %u CI %u, %llu MiB, %u SMs, caps %s %s\n",
                  m.profile.c_str(), m.mig_index, m.uuid.c_str(), m.gpu_instance_id,
                  m.compute_instance_id, static_cast<unsigned long long>(m.memory_mib),
                  m.sm_count, m.gi_cap_path.empty() ? "-" : m.gi_cap_path.c_str(),
                  m.ci_cap_path.empty() ? "-" : m.ci_cap_path.c_str());
    }
  }
  if (inv.gpus.empty()) return;
  std::printf("\nTopology (NV# = NVLinks, PIX/PXB/PHB/NODE/SYS = PCIe path):\n%-6s", "");
  for (size_t j = 0; j < inv.gpus.size(); ++j) std::printf("%-6s", ("GPU" + std::to_string(j)).c_str());
  std::printf("%-10s\n", "NUMA");
  for (size_t i = 0; i < inv.gpus.size(); ++i) {
    std::printf("%-6s", ("GPU" + std::to_string(i)).c_str());
    for (size_t j = 0; j < inv.gpus.size(); ++j) std::printf("%-6s", LinkCell(inv, i, j).c_str());
    const auto& numa = inv.gpus[i].numa_node;
    std::printf("%-10s\n", numa ? std::to_string(*numa).c_str() : "N/A");
  }
}

}  // namespace

void RegisterInfo(CLI::App& app, GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "info", "Discover the node's GPUs, MIG devices and link matrix, and print them");
  auto output = std::make_shared<std::string>("table");
  cmd->add_option("-o,--output", *output, "table|json")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  cmd->callback([&global, &exit_code, output] {
    Result<DiscoveredNode> node = DiscoverNode(global);
    if (!node.ok()) {
      exit_code = ReportError(node.status());
      return;
    }
    if (*output == "json") {
      std::printf("%s\n", gpu::ToJson(node->inventory).dump(2).c_str());
    } else {
      PrintTable(node->inventory);
    }
    exit_code = 0;
  });
}

}  // namespace gpulet::cli
