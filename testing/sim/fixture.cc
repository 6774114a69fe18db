#include "sim/fixture.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>

#include "common/fnv.h"
#include "gpu/nvml_api.h"

namespace gpulet::sim {
namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

// A UUID-shaped string derived from `key`: stable across runs and machines.
std::string DerivedUuid(const std::string& prefix, const std::string& key) {
  uint64_t a = SplitMix(Fnv1a64(key));
  uint64_t b = SplitMix(a ^ 0x5851F42D4C957F2DULL);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%08x-%04x-%04x-%04x-%012llx", static_cast<unsigned>(a >> 32),
                static_cast<unsigned>((a >> 16) & 0xFFFF), static_cast<unsigned>(a & 0xFFFF),
                static_cast<unsigned>(b >> 48),
                static_cast<unsigned long long>(b & 0xFFFFFFFFFFFFULL));
  return prefix + buf;
}


std::string GpuSpec::NvmlBusId() const {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%08X:%02X:%02X.%X", domain, bus, device, function);
  return buf;
}

std::string GpuSpec::SysfsBusId() const {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", domain, bus, device, function);
  return buf;
}

std::vector<unsigned> Fixture::NvlinkPeers(unsigned gpu) const {
  std::vector<unsigned> peers;
  if (gpu >= nvlinks.size() || nvswitch_links > 0) return peers;
  for (unsigned p = 0; p < nvlinks.size(); ++p) {
    for (unsigned l = 0; l < nvlinks[gpu][p]; ++l) peers.push_back(p);
  }
  return peers;
}

std::string Fixture::CudaVersionString() const {
  return std::to_string(cuda_version / 1000) + "." + std::to_string((cuda_version % 1000) / 10);
}

std::optional<int> NvmlReturnFromName(const std::string& name_in) {
  std::string name = name_in;
  if (name.rfind("NVML_ERROR_", 0) == 0) name = name.substr(11);
  static const std::map<std::string, int> kCodes = {
      {"UNINITIALIZED", NVML_ERROR_UNINITIALIZED},
      {"INVALID_ARGUMENT", NVML_ERROR_INVALID_ARGUMENT},
      {"NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED},
      {"NO_PERMISSION", NVML_ERROR_NO_PERMISSION},
      {"NOT_FOUND", NVML_ERROR_NOT_FOUND},
      {"INSUFFICIENT_POWER", NVML_ERROR_INSUFFICIENT_POWER},
      {"DRIVER_NOT_LOADED", NVML_ERROR_DRIVER_NOT_LOADED},
      {"TIMEOUT", NVML_ERROR_TIMEOUT},
      {"IRQ_ISSUE", NVML_ERROR_IRQ_ISSUE},
      {"LIBRARY_NOT_FOUND", NVML_ERROR_LIBRARY_NOT_FOUND},
      {"CORRUPTED_INFOROM", NVML_ERROR_CORRUPTED_INFOROM},
      {"GPU_IS_LOST", NVML_ERROR_GPU_IS_LOST},
      {"RESET_REQUIRED", NVML_ERROR_RESET_REQUIRED},
      {"OPERATING_SYSTEM", NVML_ERROR_OPERATING_SYSTEM},
      {"LIB_RM_VERSION_MISMATCH", NVML_ERROR_LIB_RM_VERSION_MISMATCH},
      {"IN_USE", NVML_ERROR_IN_USE},
      {"MEMORY", NVML_ERROR_MEMORY},
      {"NO_DATA", NVML_ERROR_NO_DATA},
      {"INSUFFICIENT_RESOURCES", NVML_ERROR_INSUFFICIENT_RESOURCES},
      {"NOT_READY", NVML_ERROR_NOT_READY},
      {"GPU_NOT_FOUND", NVML_ERROR_GPU_NOT_FOUND},
      {"INVALID_STATE", NVML_ERROR_INVALID_STATE},
      {"UNKNOWN", NVML_ERROR_UNKNOWN},
  };
  auto it = kCodes.find(name);
  if (it == kCodes.end()) return std::nullopt;
  return it->second;
}

void FillMigProfileDefaults(MigProfile& p, bool have_id) {
  struct Default {
    unsigned slices, id, size;
    std::vector<unsigned> starts;
  };
  static const Default kDefaults[] = {
      {1, NVML_GPU_INSTANCE_PROFILE_1_SLICE, 1, {0, 1, 2, 3, 4, 5, 6}},
      {2, NVML_GPU_INSTANCE_PROFILE_2_SLICE, 2, {0, 2, 4}},
      {3, NVML_GPU_INSTANCE_PROFILE_3_SLICE, 4, {0, 4}},
      {4, NVML_GPU_INSTANCE_PROFILE_4_SLICE, 4, {0}},
      {6, NVML_GPU_INSTANCE_PROFILE_6_SLICE, 8, {0}},
      {7, NVML_GPU_INSTANCE_PROFILE_7_SLICE, 8, {0}},
  };
  for (const Default& d : kDefaults) {
    if (d.slices != p.slices) continue;
    if (!have_id) p.id = d.id;
    if (p.placements.empty()) p.placements = d.starts;
    if (p.placement_size == 0) p.placement_size = d.size;
    return;
  }
  if (p.placement_size == 0) p.placement_size = p.slices;
  if (p.placements.empty()) p.placements = {0};
}

std::optional<std::string> ReadFixtureText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return ss.str();
}

std::string DerivedMigUuid(const std::string& gpu_uuid, unsigned gi, unsigned ci) {
  return DerivedUuid("MIG-", gpu_uuid + "/" + std::to_string(gi) + "/" + std::to_string(ci));
}

bool VisibleDevices::MigVisible(unsigned gpu, const std::string& mig_uuid) const {
  auto it = migs.find(gpu);
  if (it == migs.end()) return true;
  return std::find(it->second.begin(), it->second.end(), mig_uuid) != it->second.end();
}

Result<std::optional<VisibleDevices>> ParseVisibleDevices(const Fixture& fixture,
                                                          const std::string& spec) {
  if (spec.empty() || spec == "all") return std::optional<VisibleDevices>();
  VisibleDevices v;
  if (spec == "none" || spec == "void") return std::optional<VisibleDevices>(v);
  std::set<unsigned> gpus, whole;
  std::stringstream in(spec);
  for (std::string entry; std::getline(in, entry, ',');) {
    const std::string what = "GPULET_SIM_VISIBLE_DEVICES entry \"" + entry + "\"";
    auto index_of = [&](const std::string& text) -> std::optional<unsigned> {
      unsigned n = 0;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
      if (ec != std::errc() || end != text.data() + text.size() || n >= fixture.gpus.size()) {
        return std::nullopt;
      }
      return n;
    };
    std::optional<unsigned> gpu;
    std::string mig_uuid;
    if (entry.rfind("MIG-", 0) == 0) {
      for (const GpuSpec& g : fixture.gpus) {
        for (const MigDeviceSpec& m : g.mig) {
          if (m.uuid == entry) gpu = g.index, mig_uuid = m.uuid;
        }
      }
    } else if (entry.rfind("GPU-", 0) == 0) {
      for (const GpuSpec& g : fixture.gpus) {
        if (g.uuid == entry) gpu = g.index;
      }
    } else if (size_t colon = entry.find(':'); colon != std::string::npos) {
      gpu = index_of(entry.substr(0, colon));
      std::optional<unsigned> m;
      if (gpu) {
        const std::string mi = entry.substr(colon + 1);
        unsigned n = 0;
        auto [end, ec] = std::from_chars(mi.data(), mi.data() + mi.size(), n);
        if (ec == std::errc() && end == mi.data() + mi.size() &&
            n < fixture.gpus[*gpu].mig.size()) {
          mig_uuid = fixture.gpus[*gpu].mig[n].uuid;
        } else {
          gpu.reset();
        }
      }
    } else {
      gpu = index_of(entry);
    }
    if (!gpu) {
      return Status(ErrorCode::kInvalidInput,
                    fixture.path + ": " + what + ": no such GPU or MIG device in the fixture");
    }
    gpus.insert(*gpu);
    if (mig_uuid.empty()) {
      whole.insert(*gpu);
    } else {
      v.migs[*gpu].push_back(mig_uuid);
    }
  }
  for (unsigned g : whole) v.migs.erase(g);  // a whole GPU shows every MIG device of it
  v.gpus.assign(gpus.begin(), gpus.end());
  return std::optional<VisibleDevices>(std::move(v));
}

}  // namespace gpulet::sim
