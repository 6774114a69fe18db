#include "gpu/inventory.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <sstream>

#include "gpu/nvml.h"

namespace gpulet::gpu {
namespace {

// Reads a string attribute through an NVML getter that fills a caller buffer.
template <typename Fn>
nvmlReturn_t ReadString(Fn fn, nvmlDevice_t dev, std::string* out, unsigned size) {
  std::string buf(size, '\0');
  nvmlReturn_t rc = fn(dev, buf.data(), size);
  if (rc == NVML_SUCCESS) *out = buf.c_str();
  return rc;
}

std::string Trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

// NVML reports "00000000:18:00.0"; sysfs names the device "0000:18:00.0" in lower case.
std::string SysfsPciName(const std::string& nvml_bus_id) {
  std::string id = nvml_bus_id;
  size_t colon = id.find(':');
  if (colon != std::string::npos && colon > 4) id = id.substr(colon - 4);
  std::transform(id.begin(), id.end(), id.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return id;
}

std::optional<std::string> ReadFileLine(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string line;
  std::getline(in, line);
  return Trim(line);
}

std::string ArchitectureName(nvmlDeviceArchitecture_t arch) {
  switch (arch) {
    case NVML_DEVICE_ARCH_KEPLER: return "kepler";
    case NVML_DEVICE_ARCH_MAXWELL: return "maxwell";
    case NVML_DEVICE_ARCH_PASCAL: return "pascal";
    case NVML_DEVICE_ARCH_VOLTA: return "volta";
    case NVML_DEVICE_ARCH_TURING: return "turing";
    case NVML_DEVICE_ARCH_AMPERE: return "ampere";
    case NVML_DEVICE_ARCH_ADA: return "ada";
    case NVML_DEVICE_ARCH_HOPPER: return "hopper";
    case NVML_DEVICE_ARCH_BLACKWELL: return "blackwell";
    default: return "unknown";
  }
}

// Architecture from compute capability, for drivers without nvmlDeviceGetArchitecture.
std::string ArchitectureFromCc(int major, int minor) {
  if (major >= 10) return "blackwell";
  if (major == 9) return "hopper";
  if (major == 8) return minor >= 9 ? "ada" : "ampere";
  if (major == 7) return minor >= 5 ? "turing" : "volta";
  if (major == 6) return "pascal";
  return "unknown";
}

// MIG profile name from slice counts and memory, the way NVIDIA names them ("3g.20gb",
// "1c.3g.20gb" when a compute instance uses fewer slices than its GPU instance).
std::string MigProfileName(const nvmlDeviceAttributes_t& a) {
  unsigned long long gb = (a.memorySizeMB + 1023) / 1024;
  std::string name = std::to_string(a.gpuInstanceSliceCount) + "g." + std::to_string(gb) + "gb";
  if (a.computeInstanceSliceCount != 0 && a.computeInstanceSliceCount != a.gpuInstanceSliceCount) {
    name = std::to_string(a.computeInstanceSliceCount) + "c." + name;
  }
  return name;
}

// /proc/driver/nvidia-caps/mig-minors: "gpu0/gi1/access 12" and "gpu0/gi1/ci0/access 13".
std::map<std::string, unsigned> ReadMigMinors(const std::string& procfs_root) {
  std::map<std::string, unsigned> minors;
  std::ifstream in(procfs_root + "/driver/nvidia-caps/mig-minors");
  std::string key;
  unsigned minor = 0;
  while (in >> key >> minor) minors[key] = minor;
  return minors;
}

PcieRelation RelationFromLevel(nvmlGpuTopologyLevel_t level) {
  switch (level) {
    case NVML_TOPOLOGY_INTERNAL:
    case NVML_TOPOLOGY_SINGLE: return PcieRelation::kSameBoard;
    case NVML_TOPOLOGY_MULTIPLE: return PcieRelation::kSameSwitch;
    case NVML_TOPOLOGY_HOSTBRIDGE: return PcieRelation::kHostBridge;
    case NVML_TOPOLOGY_NODE: return PcieRelation::kSameCpu;
    case NVML_TOPOLOGY_SYSTEM: return PcieRelation::kCrossCpu;
  }
  return PcieRelation::kUnknown;
}

class Discoverer {
 public:
  Discoverer(const Nvml& nvml, const DiscoverOptions& options)
      : nvml_(nvml), f_(nvml.fn()), options_(options) {}

  Result<Inventory> Run() {
    Inventory inv;
    inv.nvml_library = nvml_.library_path();
    std::string version;
    nvmlReturn_t rc = f_.nvmlSystemGetDriverVersion(
        version.assign(NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE, '\0').data(),
        NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE);
    if (rc != NVML_SUCCESS) return Fail(rc, "nvmlSystemGetDriverVersion", "");
    inv.driver_version = version.c_str();
    int cuda = 0;
    if (f_.nvmlSystemGetCudaDriverVersion_v2 != nullptr &&
        f_.nvmlSystemGetCudaDriverVersion_v2(&cuda) == NVML_SUCCESS) {
      inv.cuda_version = std::to_string(cuda / 1000) + "." + std::to_string((cuda % 1000) / 10);
    }

    unsigned count = 0;
    rc = f_.nvmlDeviceGetCount_v2(&count);
    if (rc != NVML_SUCCESS) return Fail(rc, "nvmlDeviceGetCount_v2", "");
    mig_minors_ = ReadMigMinors(options_.procfs_root);
    std::vector<nvmlDevice_t> handles;
    for (unsigned i = 0; i < count; ++i) {
      nvmlDevice_t dev = nullptr;
      rc = f_.nvmlDeviceGetHandleByIndex_v2(i, &dev);
      if (rc != NVML_SUCCESS) return Fail(rc, "nvmlDeviceGetHandleByIndex_v2", Which(i));
      Result<Gpu> gpu = ReadGpu(i, dev);
      if (!gpu.ok()) return gpu.status();
      inv.gpus.push_back(std::move(gpu).value());
      handles.push_back(dev);
    }
    Status links = ReadLinks(handles, &inv);
    if (!links.ok()) return links;
    return inv;
  }

 private:
  static std::string Which(unsigned index) { return "GPU " + std::to_string(index); }

  Status Fail(nvmlReturn_t rc, const std::string& call, const std::string& which) const {
    ErrorCode code = rc == NVML_ERROR_GPU_IS_LOST ? ErrorCode::kGpuLost : ErrorCode::kNvmlError;
    std::string msg = "discovery failed";
    if (!which.empty()) msg += " on " + which;
    msg += ": " + call + ": " + nvml_.ErrorText(rc);
    if (code == ErrorCode::kGpuLost) msg += "; inventory incomplete, refusing to report it";
    return Status(code, msg);
  }

  Result<Gpu> ReadGpu(unsigned index, nvmlDevice_t dev) {
    Gpu g;
    g.index = index;
    const std::string who = Which(index);
    nvmlReturn_t rc = ReadString(f_.nvmlDeviceGetUUID, dev, &g.uuid, NVML_DEVICE_UUID_V2_BUFFER_SIZE);
    if (rc != NVML_SUCCESS) return Fail(rc, "nvmlDeviceGetUUID", who);
    rc = ReadString(f_.nvmlDeviceGetName, dev, &g.name, NVML_DEVICE_NAME_V2_BUFFER_SIZE);
    if (rc != NVML_SUCCESS) return Fail(rc, "nvmlDeviceGetName", who + " " + g.uuid);
    nvmlMemory_t mem{};
    rc = f_.nvmlDeviceGetMemoryInfo(dev, &mem);
    if (rc != NVML_SUCCESS) return Fail(rc, "nvmlDeviceGetMemoryInfo", who + " " + g.uuid);
    g.memory_mib = mem.total / (1024ULL * 1024ULL);
    nvmlPciInfo_t pci{};
    rc = f_.nvmlDeviceGetPciInfo_v3(dev, &pci);
    if (rc != NVML_SUCCESS) return Fail(rc, "nvmlDeviceGetPciInfo_v3", who + " " + g.uuid);
    g.pci_bus_id = pci.busId;
    g.pci_device_id = pci.pciDeviceId;
    rc = f_.nvmlDeviceGetMinorNumber(dev, &g.minor);
    if (rc != NVML_SUCCESS) return Fail(rc, "nvmlDeviceGetMinorNumber", who + " " + g.uuid);
    rc = f_.nvmlDeviceGetCudaComputeCapability(dev, &g.cc_major, &g.cc_minor);
    if (rc != NVML_SUCCESS) return Fail(rc, "nvmlDeviceGetCudaComputeCapability", who + " " + g.uuid);
    nvmlDeviceArchitecture_t arch = 0;
    if (f_.nvmlDeviceGetArchitecture != nullptr &&
        f_.nvmlDeviceGetArchitecture(dev, &arch) == NVML_SUCCESS) {
      g.architecture = ArchitectureName(arch);
    } else {
      g.architecture = ArchitectureFromCc(g.cc_major, g.cc_minor);
    }

    const std::string sysdir = options_.sysfs_root + "/bus/pci/devices/" + SysfsPciName(g.pci_bus_id);
    if (auto numa = ReadFileLine(sysdir + "/numa_node")) {
      try {
        int node = std::stoi(*numa);
        if (node >= 0) g.numa_node = node;
      } catch (const std::exception&) {
        // Unparseable: the NUMA node stays unknown, as the contract allows.
      }
    }
    if (auto cpus = ReadFileLine(sysdir + "/local_cpulist")) g.cpu_affinity = *cpus;
    if (auto cls = ReadFileLine(sysdir + "/class")) {
      try {
        g.pci_class = static_cast<uint32_t>(std::stoul(*cls, nullptr, 16));
      } catch (const std::exception&) {
        // Unparseable: the class stays unknown.
      }
    }

    if (f_.nvmlDeviceGetMigMode != nullptr) {
      unsigned current = 0, pending = 0;
      rc = f_.nvmlDeviceGetMigMode(dev, &current, &pending);
      if (rc == NVML_SUCCESS) {
        g.mig_capable = true;
        g.mig_enabled = current == NVML_DEVICE_MIG_ENABLE;
      } else if (rc == NVML_ERROR_GPU_IS_LOST) {
        return Fail(rc, "nvmlDeviceGetMigMode", who + " " + g.uuid);
      }
    }
    if (g.mig_enabled) {
      Status s = ReadMigDevices(dev, &g);
      if (!s.ok()) return s;
    }
    return g;
  }

  Status ReadMigDevices(nvmlDevice_t dev, Gpu* g) {
    const std::string who = Which(g->index) + " " + g->uuid;
    if (f_.nvmlDeviceGetMaxMigDeviceCount == nullptr ||
        f_.nvmlDeviceGetMigDeviceHandleByIndex == nullptr || f_.nvmlDeviceGetGpuInstanceId == nullptr ||
        f_.nvmlDeviceGetComputeInstanceId == nullptr || f_.nvmlDeviceGetAttributes_v2 == nullptr) {
      return Status(ErrorCode::kNvmlSymbolMissing,
                    who + " is in MIG mode but the NVML library lacks the MIG device functions");
    }
    unsigned max = 0;
    nvmlReturn_t rc = f_.nvmlDeviceGetMaxMigDeviceCount(dev, &max);
    if (rc != NVML_SUCCESS) return Fail(rc, "nvmlDeviceGetMaxMigDeviceCount", who);
    for (unsigned i = 0; i < max; ++i) {
      nvmlDevice_t mig = nullptr;
      rc = f_.nvmlDeviceGetMigDeviceHandleByIndex(dev, i, &mig);
      if (rc == NVML_ERROR_NOT_FOUND) continue;  // an empty slot
      if (rc != NVML_SUCCESS) return Fail(rc, "nvmlDeviceGetMigDeviceHandleByIndex", who);
      MigDevice m;
      m.parent_index = g->index;
      m.mig_index = static_cast<unsigned>(g->mig_devices.size());
      rc = ReadString(f_.nvmlDeviceGetUUID, mig, &m.uuid, NVML_DEVICE_UUID_V2_BUFFER_SIZE);
      if (rc != NVML_SUCCESS) return Fail(rc, "nvmlDeviceGetUUID(MIG)", who);
      rc = f_.nvmlDeviceGetGpuInstanceId(mig, &m.gpu_instance_id);
      if (rc != NVML_SUCCESS) return Fail(rc, "nvmlDeviceGetGpuInstanceId", who + " " + m.uuid);
      rc = f_.nvmlDeviceGetComputeInstanceId(mig, &m.compute_instance_id);
      if (rc != NVML_SUCCESS) return Fail(rc, "nvmlDeviceGetComputeInstanceId", who + " " + m.uuid);
      nvmlDeviceAttributes_t attrs{};
      rc = f_.nvmlDeviceGetAttributes_v2(mig, &attrs);
      if (rc != NVML_SUCCESS) return Fail(rc, "nvmlDeviceGetAttributes_v2", who + " " + m.uuid);
      m.profile = MigProfileName(attrs);
      m.memory_mib = attrs.memorySizeMB;
      m.sm_count = attrs.multiprocessorCount;
      m.gi_slices = attrs.gpuInstanceSliceCount;
      m.ci_slices = attrs.computeInstanceSliceCount;
      m.copy_engines = attrs.sharedCopyEngineCount;
      m.decoders = attrs.sharedDecoderCount;
      m.encoders = attrs.sharedEncoderCount;
      m.jpeg_decoders = attrs.sharedJpegCount;
      m.ofa_engines = attrs.sharedOfaCount;
      const std::string gi_key =
          "gpu" + std::to_string(g->minor) + "/gi" + std::to_string(m.gpu_instance_id);
      const std::string ci_key = gi_key + "/ci" + std::to_string(m.compute_instance_id);
      if (auto it = mig_minors_.find(gi_key + "/access"); it != mig_minors_.end()) {
        m.gi_cap_path = "/dev/nvidia-caps/nvidia-cap" + std::to_string(it->second);
      }
      if (auto it = mig_minors_.find(ci_key + "/access"); it != mig_minors_.end()) {
        m.ci_cap_path = "/dev/nvidia-caps/nvidia-cap" + std::to_string(it->second);
      }
      g->mig_devices.push_back(std::move(m));
    }
    return Status::Ok();
  }

  // The link matrix is read once here; consumers use the cached value.
  Status ReadLinks(const std::vector<nvmlDevice_t>& handles, Inventory* inv) {
    const size_t n = handles.size();
    inv->links.assign(n, std::vector<Link>(n));
    std::map<std::string, unsigned> by_bus;
    for (const Gpu& g : inv->gpus) by_bus[SysfsPciName(g.pci_bus_id)] = g.index;
    // Links whose far end is an NVSwitch join the GPU to the fabric: every pair of fabric GPUs
    // talks over min(links of each), which is what nvidia-smi topo -m shows as NV<n>.
    std::vector<unsigned> switch_links(n, 0);
    if (f_.nvmlDeviceGetNvLinkState != nullptr && f_.nvmlDeviceGetNvLinkRemotePciInfo_v2 != nullptr) {
      for (size_t i = 0; i < n; ++i) {
        for (unsigned link = 0; link < NVML_NVLINK_MAX_LINKS; ++link) {
          nvmlEnableState_t active = NVML_FEATURE_DISABLED;
          nvmlReturn_t rc = f_.nvmlDeviceGetNvLinkState(handles[i], link, &active);
          if (rc == NVML_ERROR_GPU_IS_LOST) return Fail(rc, "nvmlDeviceGetNvLinkState", Which(i));
          if (rc != NVML_SUCCESS || active != NVML_FEATURE_ENABLED) continue;
          nvmlPciInfo_t remote{};
          rc = f_.nvmlDeviceGetNvLinkRemotePciInfo_v2(handles[i], link, &remote);
          if (rc == NVML_ERROR_GPU_IS_LOST) {
            return Fail(rc, "nvmlDeviceGetNvLinkRemotePciInfo_v2", Which(i));
          }
          if (rc != NVML_SUCCESS) continue;
          nvmlIntNvLinkDeviceType_t type = NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
          if (f_.nvmlDeviceGetNvLinkRemoteDeviceType != nullptr &&
              f_.nvmlDeviceGetNvLinkRemoteDeviceType(handles[i], link, &type) == NVML_SUCCESS &&
              type == NVML_NVLINK_DEVICE_TYPE_SWITCH) {
            switch_links[i]++;
            continue;
          }
          auto peer = by_bus.find(SysfsPciName(remote.busId));
          // A link to something that is not one of our GPUs (an NPU, another node) has no pair.
          if (peer != by_bus.end() && peer->second != i) inv->links[i][peer->second].nvlinks++;
        }
      }
      for (size_t i = 0; i < n; ++i) {
        for (size_t j = 0; j < n; ++j) {
          if (i != j) inv->links[i][j].nvlinks += std::min(switch_links[i], switch_links[j]);
        }
      }
    }
    if (f_.nvmlDeviceGetTopologyCommonAncestor != nullptr) {
      for (size_t i = 0; i < n; ++i) {
        for (size_t j = i + 1; j < n; ++j) {
          nvmlGpuTopologyLevel_t level = NVML_TOPOLOGY_SYSTEM;
          nvmlReturn_t rc = f_.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j], &level);
          if (rc == NVML_ERROR_GPU_IS_LOST) {
            return Fail(rc, "nvmlDeviceGetTopologyCommonAncestor", Which(i) + "/" + Which(j));
          }
          PcieRelation rel = rc == NVML_SUCCESS ? RelationFromLevel(level) : PcieRelation::kUnknown;
          inv->links[i][j].pcie = inv->links[j][i].pcie = rel;
        }
      }
    }
    return Status::Ok();
  }

  const Nvml& nvml_;
  const NvmlFunctions& f_;
  const DiscoverOptions& options_;
  std::map<std::string, unsigned> mig_minors_;
};

}  // namespace

const char* PcieRelationName(PcieRelation r) {
  switch (r) {
    case PcieRelation::kSameBoard: return "PIX";
    case PcieRelation::kSameSwitch: return "PXB";
    case PcieRelation::kHostBridge: return "PHB";
    case PcieRelation::kSameCpu: return "NODE";
    case PcieRelation::kCrossCpu: return "SYS";
    case PcieRelation::kUnknown: break;
  }
  return "?";
}

const Gpu* Inventory::FindByUuid(const std::string& uuid) const {
  for (const Gpu& g : gpus) {
    if (g.uuid == uuid) return &g;
  }
  return nullptr;
}

const MigDevice* Inventory::FindMigByUuid(const std::string& uuid) const {
  for (const Gpu& g : gpus) {
    for (const MigDevice& m : g.mig_devices) {
      if (m.uuid == uuid) return &m;
    }
  }
  return nullptr;
}

size_t Inventory::MigDeviceCount() const {
  size_t n = 0;
  for (const Gpu& g : gpus) n += g.mig_devices.size();
  return n;
}

Result<Inventory> Discover(const Nvml& nvml, const DiscoverOptions& options) {
  return Discoverer(nvml, options).Run();
}

}  // namespace gpulet::gpu
