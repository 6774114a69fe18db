// The DRA preparer against the real driver (scripts/device-check.sh, step dra-prepare): no API
// server and no kubelet, only what a claim's allocation means on this node's GPUs.
//
//   dra_device_check prepare   --state DIR --cdi DIR --library PATH [--share-mib N]
//       prepares claim A (gpu-0, the whole GPU) and checks its CDI spec against the host: every
//       device node a character device, every mounted host path present, the GPU's minor number;
//       unprepares A and checks that its spec is gone. Then prepares claim B (a share of gpu-0's
//       memory, N MiB) and leaves it prepared: the script applies B's spec in a private mount
//       namespace and runs a CUDA program under it. Prints B's spec path as `spec=PATH`.
//   dra_device_check unprepare --state DIR --cdi DIR --library PATH
//       unprepares B from its record alone (as after a restart) and checks nothing is left.
//
// Prints PASS/FAIL lines; exit status 0 all passed, 1 a check failed, 2 not runnable.
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "dra/names.h"
#include "dra/node_preparer.h"
#include "gpu/nvml.h"

namespace {

using gpulet::dra::AllocatedDevice;
using gpulet::dra::Claim;
using gpulet::Status;
namespace fs = std::filesystem;

constexpr char kNode[] = "device-check";
constexpr char kUidGpu[] = "d0c0a000-0000-4000-8000-000000000001";
constexpr char kUidShare[] = "d0c0a000-0000-4000-8000-000000000002";

int failures = 0;

void Check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
  if (!ok) ++failures;
}

Claim MakeClaim(const std::string& uid, const std::string& device, int64_t memory) {
  Claim c;
  c.ref = {"device-check", "claim-" + uid.substr(uid.size() - 1), uid};
  c.allocated = true;
  AllocatedDevice d;
  d.request = "gpu";
  d.driver = gpulet::dra::kDriverName;
  d.pool = kNode;
  d.device = device;
  if (memory > 0) {
    d.consumed["memory"] = memory;
    d.share_id = "d0c0a000-0000-4000-8000-0000000000ff";
  }
  c.devices = {d};
  c.reserved_for_uids = {"device-check-pod"};
  return c;
}

std::string SpecPath(const std::string& cdi, const std::string& uid) {
  return cdi + "/gpu.gpulet.io-claim_" + uid + ".json";
}

// Every device node of the spec is a character device on this host, every mount's host path
// exists; returns the spec's JSON (null when it cannot be read).
nlohmann::json CheckSpecAgainstHost(const std::string& path, unsigned minor) {
  std::ifstream in(path);
  if (!in) {
    Check(false, "CDI spec written: " + path);
    return nullptr;
  }
  nlohmann::json spec = nlohmann::json::parse(in, nullptr, false);
  Check(!spec.is_discarded(), "CDI spec parses: " + path);
  if (spec.is_discarded()) return nullptr;
  std::printf("spec %s cdiVersion=%s kind=%s devices=%zu\n", path.c_str(),
              spec.value("cdiVersion", "").c_str(), spec.value("kind", "").c_str(),
              spec["devices"].size());
  std::vector<nlohmann::json> edits;
  if (spec.contains("containerEdits")) edits.push_back(spec["containerEdits"]);
  for (const auto& d : spec["devices"]) {
    if (d.contains("containerEdits")) edits.push_back(d["containerEdits"]);
  }
  size_t nodes = 0, mounts = 0, missing = 0;
  bool gpu_node = false;
  for (const auto& e : edits) {
    for (const auto& n : e.value("deviceNodes", nlohmann::json::array())) {
      const std::string host = n.value("hostPath", n.value("path", ""));
      struct stat st {};
      const bool ok = ::stat(host.c_str(), &st) == 0 && S_ISCHR(st.st_mode);
      if (!ok) {
        std::printf("mismatch: device node %s is not a character device here\n", host.c_str());
        ++missing;
      }
      if (n.value("path", "") == "/dev/nvidia" + std::to_string(minor)) gpu_node = true;
      ++nodes;
    }
    for (const auto& m : e.value("mounts", nlohmann::json::array())) {
      const std::string host = m.value("hostPath", "");
      std::error_code ec;
      if (!fs::exists(host, ec)) {
        std::printf("mismatch: mount source %s does not exist\n", host.c_str());
        ++missing;
      }
      ++mounts;
    }
  }
  std::printf("spec device_nodes=%zu mounts=%zu missing=%zu\n", nodes, mounts, missing);
  Check(nodes > 0 && missing == 0, "every device node and mount source of the spec exists here");
  Check(gpu_node, "the spec carries /dev/nvidia" + std::to_string(minor));
  return spec;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  std::string state, cdi, library;
  int64_t share_mib = 8192;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--state") state = value;
    else if (flag == "--cdi") cdi = value;
    else if (flag == "--library") library = value;
    else if (flag == "--share-mib") share_mib = std::stoll(value);
  }
  if ((mode != "prepare" && mode != "unprepare") || state.empty() || cdi.empty() ||
      library.empty()) {
    std::fprintf(stderr,
                 "usage: dra_device_check prepare|unprepare --state DIR --cdi DIR --library PATH "
                 "[--share-mib N]\n");
    return 2;
  }
  auto nvml = gpulet::gpu::Nvml::Load(gpulet::gpu::DefaultNvmlLibraryPath());
  if (!nvml.ok()) {
    std::printf("not runnable: %s\n", nvml.status().message().c_str());
    return 2;
  }
  gpulet::gpu::DiscoverOptions discover;
  auto inventory = gpulet::gpu::Discover(**nvml, discover);
  if (!inventory.ok() || inventory->gpus.empty()) {
    std::printf("not runnable: discovery: %s\n",
                inventory.ok() ? "no GPU" : inventory.status().message().c_str());
    return 2;
  }
  const unsigned minor = inventory->gpus[0].minor;
  gpulet::dra::NodePreparerOptions options;
  options.node_name = kNode;
  options.inventory = *inventory;
  options.nvml = *nvml;
  options.discover = discover;
  options.cdi_root = cdi;
  options.driver_root = "/";
  options.state_dir = state;
  options.cuda_library = library;
  auto preparer = gpulet::dra::MakeNodePreparer(options);
  if (!preparer.ok()) {
    std::printf("FAIL preparer: %s\n", preparer.status().message().c_str());
    return 1;
  }
  gpulet::dra::Preparer& p = **preparer;

  if (mode == "prepare") {
    auto a = p.Prepare(MakeClaim(kUidGpu, "gpu-0", 0));
    Check(a.ok(), "prepare gpu-0" + (a.ok() ? std::string() : ": " + a.status().message()));
    if (a.ok()) {
      for (const auto& d : a->devices) {
        for (const auto& id : d.cdi_device_ids) std::printf("cdi_device %s\n", id.c_str());
      }
      CheckSpecAgainstHost(SpecPath(cdi, kUidGpu), minor);
      Status s = p.Unprepare(MakeClaim(kUidGpu, "gpu-0", 0).ref, a->record_json);
      Check(s.ok(), "unprepare gpu-0" + (s.ok() ? std::string() : ": " + s.message()));
      Check(!fs::exists(SpecPath(cdi, kUidGpu)), "gpu-0's CDI spec removed at unprepare");
    }
    auto b = p.Prepare(MakeClaim(kUidShare, "gpu-0-mem", share_mib << 20));
    Check(b.ok(), "prepare a " + std::to_string(share_mib) + " MiB share of gpu-0" +
                      (b.ok() ? std::string() : ": " + b.status().message()));
    if (b.ok()) {
      CheckSpecAgainstHost(SpecPath(cdi, kUidShare), minor);
      std::printf("spec=%s\n", SpecPath(cdi, kUidShare).c_str());
    }
  } else {
    std::ifstream in(state + "/claims/" + kUidShare + ".json");
    std::stringstream record;
    record << in.rdbuf();
    Check(!record.str().empty(), "the share's record is on disk");
    Status s = p.Unprepare(MakeClaim(kUidShare, "gpu-0-mem", 0).ref, record.str());
    Check(s.ok(), "unprepare the share from its record" + (s.ok() ? std::string() : ": " + s.message()));
    Check(!fs::exists(SpecPath(cdi, kUidShare)), "the share's CDI spec removed");
    Check(!fs::exists(state + "/limits/" + kUidShare), "the share's limits directory removed");
  }
  return failures == 0 ? 0 : 1;
}
