#include "sim/simulation.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "gpu/nvml_api.h"
#include "sim/fixture_json.h"

namespace gpulet::sim {
namespace fs = std::filesystem;
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// The directory of the running executable; the build and the image put sim/ and fixtures/ beside
// the binary (build/gpulet, /opt/gpulet/gpulet) or one level up (build/bin/*_test). No build path
// is compiled in: the product must not depend on, or reveal, where it was built.
fs::path ExecutableDir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

std::vector<std::string> FixtureDirs() {
  std::vector<std::string> dirs;
  if (std::string d = Env("GPULET_FIXTURES_DIR"); !d.empty()) dirs.push_back(d);
  const fs::path exe_dir = ExecutableDir();
  if (!exe_dir.empty()) {
    dirs.push_back((exe_dir / "fixtures").string());
    dirs.push_back((exe_dir.parent_path() / "fixtures").string());
  }
  return dirs;
}

bool LooksLikePath(const std::string& s) {
  return s.find('/') != std::string::npos || s.ends_with(".yaml") || s.ends_with(".yml") ||
         s.ends_with(".json");
}

Status WriteFileAtomic(const fs::path& path, const std::string& content) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) return Status(ErrorCode::kInternal, path.parent_path().string() + ": " + ec.message());
  const fs::path tmp = path.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << content;
    if (!out) return Status(ErrorCode::kInternal, tmp.string() + ": cannot write");
  }
  fs::rename(tmp, path, ec);
  if (ec) return Status(ErrorCode::kInternal, path.string() + ": " + ec.message());
  return Status::Ok();
}

std::string FindLibrary() {
  if (std::string lib = Env("GPULET_SIM_LIBRARY"); !lib.empty()) return lib;
  const fs::path exe_dir = ExecutableDir();
  std::error_code ec;
  for (const fs::path& candidate : {exe_dir / "sim" / "libnvidia-ml.so.1",
                                    exe_dir.parent_path() / "sim" / "libnvidia-ml.so.1"}) {
    if (!exe_dir.empty() && fs::exists(candidate, ec)) {
      return fs::weakly_canonical(candidate, ec).string();
    }
  }
  // Not found: the loader's error will name this path.
  return (exe_dir / "sim" / "libnvidia-ml.so.1").string();
}

Status CheckGpu(const Fixture& fixture, unsigned gpu) {
  if (gpu >= fixture.gpus.size()) {
    return Status(ErrorCode::kNotFound, "GPU " + std::to_string(gpu) + " not in " + fixture.path +
                                            " (" + std::to_string(fixture.gpus.size()) + " GPUs)");
  }
  return Status::Ok();
}

Status Apply(const ControlFile& control, const std::function<void(ControlState&)>& change) {
  return control.Update(change).status();
}

}  // namespace

std::vector<std::string> BuiltinFixtureNames() {
  std::set<std::string> names;
  for (const auto& dir : FixtureDirs()) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      if (entry.is_regular_file(ec) && entry.path().extension() == ".yaml") {
        names.insert(entry.path().stem().string());
      }
    }
  }
  return {names.begin(), names.end()};
}

Result<std::string> ResolveFixture(const std::string& name_or_path) {
  std::error_code ec;
  if (name_or_path.empty()) return Status(ErrorCode::kUsage, "no fixture named");
  if (LooksLikePath(name_or_path)) {
    if (!fs::is_regular_file(name_or_path, ec)) {
      return Status(ErrorCode::kNotFound, name_or_path + ": fixture file not found");
    }
    return fs::absolute(name_or_path, ec).lexically_normal().string();
  }
  for (const auto& dir : FixtureDirs()) {
    fs::path p = fs::path(dir) / (name_or_path + ".yaml");
    if (fs::is_regular_file(p, ec)) return fs::absolute(p, ec).lexically_normal().string();
  }
  std::string known;
  for (const auto& n : BuiltinFixtureNames()) known += (known.empty() ? "" : ", ") + n;
  return Status(ErrorCode::kNotFound, "unknown fixture \"" + name_or_path + "\" (built-in: " +
                                          (known.empty() ? "none" : known) + ")");
}

// devices/system/cpu: online, and per CPU its socket, core and hyperthread siblings.
static Status WriteCpuTopology(const Fixture::CpuTopology& t, const fs::path& cpu_dir) {
  const unsigned per_thread = t.sockets * t.cores_per_socket;  // CPUs in one thread rank
  const unsigned total = per_thread * t.threads_per_core;
  auto place = [&](unsigned cpu, unsigned* socket, unsigned* core) {
    const unsigned rem = cpu % per_thread;
    *socket = t.alternating ? rem % t.sockets : rem / t.cores_per_socket;
    *core = t.alternating ? rem / t.sockets : rem % t.cores_per_socket;
  };
  if (Status s = WriteFileAtomic(cpu_dir / "online", "0-" + std::to_string(total - 1) + "\n");
      !s.ok()) {
    return s;
  }
  for (unsigned cpu = 0; cpu < total; ++cpu) {
    unsigned socket = 0, core = 0;
    place(cpu, &socket, &core);
    std::string siblings;
    for (unsigned other = 0; other < total; ++other) {
      unsigned os = 0, oc = 0;
      place(other, &os, &oc);
      if (os == socket && oc == core) {
        siblings += (siblings.empty() ? "" : ",") + std::to_string(other);
      }
    }
    const fs::path topo = cpu_dir / ("cpu" + std::to_string(cpu)) / "topology";
    for (const auto& [file, value] : {std::pair{"physical_package_id", std::to_string(socket)},
                                      std::pair{"core_id", std::to_string(core)},
                                      std::pair{"thread_siblings_list", siblings}}) {
      if (Status s = WriteFileAtomic(topo / file, value + "\n"); !s.ok()) return s;
    }
  }
  return Status::Ok();
}

Status WriteFakeSystemTree(const Fixture& fixture, const std::string& state_dir) {
  if (fixture.cpu_topology) {
    const fs::path cpu_dir = fs::path(state_dir) / "sysfs" / "devices" / "system" / "cpu";
    if (Status s = WriteCpuTopology(*fixture.cpu_topology, cpu_dir); !s.ok()) return s;
  }
  const fs::path devices = fs::path(state_dir) / "sysfs" / "bus" / "pci" / "devices";
  std::string mig_minors = "config 1\nmonitor 2\n";
  for (const auto& g : fixture.gpus) {
    const fs::path dev = devices / g.SysfsBusId();
    std::string cpus = g.numa >= 0 ? fixture.numa_cpus[static_cast<size_t>(g.numa)] : "";
    if (Status s = WriteFileAtomic(dev / "numa_node", std::to_string(g.numa) + "\n"); !s.ok()) {
      return s;
    }
    if (Status s = WriteFileAtomic(dev / "local_cpulist", cpus + "\n"); !s.ok()) return s;
    // A 3D controller, as data-center GPUs are (GFD's gpu.mode=compute).
    if (Status s = WriteFileAtomic(dev / "class", "0x030200\n"); !s.ok()) return s;
    if (!g.mig_capable) continue;
    // The driver numbers capability minors per GPU minor: 15 GPU instances, each with an
    // access node followed by 8 compute-instance access nodes.
    for (unsigned gi = 0; gi < 15; ++gi) {
      const unsigned base = 3 + g.minor * 135 + gi * 9;
      const std::string prefix = "gpu" + std::to_string(g.minor) + "/gi" + std::to_string(gi);
      mig_minors += prefix + "/access " + std::to_string(base) + "\n";
      for (unsigned ci = 0; ci < 8; ++ci) {
        mig_minors +=
            prefix + "/ci" + std::to_string(ci) + "/access " + std::to_string(base + 1 + ci) + "\n";
      }
    }
  }
  return WriteFileAtomic(fs::path(state_dir) / "proc" / "driver" / "nvidia-caps" / "mig-minors",
                         mig_minors);
}

Result<SimulatedNode> PrepareSimulation(const std::string& fixture_name,
                                        const std::string& state_dir) {
  Result<std::string> path = ResolveFixture(fixture_name);
  if (!path.ok()) return path.status();
  // Read once: the parsed copy below records the very text that was parsed.
  const std::optional<std::string> text = ReadFixtureText(*path);
  if (!text) return Status(ErrorCode::kNotFound, *path + ": cannot read fixture");
  Result<Fixture> fixture = ParseFixture(*text, *path);
  if (!fixture.ok()) return fixture.status();

  SimulatedNode node;
  node.fixture_path = *path;
  node.state_dir = state_dir;
  if (node.state_dir.empty()) node.state_dir = Env("GPULET_SIM_STATE");
  if (node.state_dir.empty()) node.state_dir = DefaultStateDir(*path);
  std::error_code ec;
  fs::create_directories(node.state_dir, ec);
  if (ec) return Status(ErrorCode::kInternal, node.state_dir + ": " + ec.message());
  node.state_dir = fs::absolute(node.state_dir, ec).lexically_normal().string();
  if (Status s = WriteFakeSystemTree(*fixture, node.state_dir); !s.ok()) return s;
  // The simulated driver library reads this parsed copy rather than the YAML (fixture_json.h).
  if (Status s = WriteParsedFixture(*fixture, *path, *text, node.state_dir); !s.ok()) return s;
  node.sysfs_root = node.state_dir + "/sysfs";
  node.procfs_root = node.state_dir + "/proc";
  node.library_path = FindLibrary();
  ::setenv("GPULET_SIM_FIXTURE", node.fixture_path.c_str(), 1);
  ::setenv("GPULET_SIM_STATE", node.state_dir.c_str(), 1);
  return node;
}

Result<DeviceRef> FindDevice(const Fixture& fixture, const std::string& gpu,
                             std::optional<unsigned> mig) {
  DeviceRef ref;
  bool found = false;
  if (!gpu.empty() &&
      std::all_of(gpu.begin(), gpu.end(), [](unsigned char c) { return std::isdigit(c) != 0; })) {
    ref.gpu = static_cast<unsigned>(std::stoul(gpu));
    if (Status s = CheckGpu(fixture, ref.gpu); !s.ok()) return s;
    found = true;
  } else {
    for (const auto& g : fixture.gpus) {
      if (g.uuid == gpu) {
        ref.gpu = g.index;
        found = true;
      }
      for (size_t m = 0; m < g.mig.size(); ++m) {
        if (g.mig[m].uuid == gpu) {
          if (mig) return Status(ErrorCode::kUsage, "--mig cannot be combined with a MIG UUID");
          ref.gpu = g.index;
          mig = static_cast<unsigned>(m);
          found = true;
        }
      }
    }
  }
  if (!found) {
    return Status(ErrorCode::kNotFound, "no GPU \"" + gpu + "\" in " + fixture.path +
                                            " (give an index or a GPU-/MIG- UUID)");
  }
  if (mig) {
    const auto& g = fixture.gpus[ref.gpu];
    if (*mig >= g.mig.size()) {
      return Status(ErrorCode::kNotFound, "GPU " + std::to_string(ref.gpu) + " has " +
                                              std::to_string(g.mig.size()) +
                                              " MIG devices, no index " + std::to_string(*mig));
    }
    ref.mig = mig;
  }
  return ref;
}

namespace {
SimEvent EventFor(const Fixture& fixture, const DeviceRef& device, uint64_t type, uint64_t data) {
  SimEvent e;
  e.gpu = device.gpu;
  e.type = type;
  e.data = data;
  if (device.mig) {
    const auto& m = fixture.gpus[device.gpu].mig[*device.mig];
    e.gpu_instance = m.gi;
    e.compute_instance = m.ci;
  }
  return e;
}
}  // namespace

Status InjectXid(const ControlFile& control, const Fixture& fixture, const DeviceRef& device,
                 uint64_t xid) {
  if (Status s = CheckGpu(fixture, device.gpu); !s.ok()) return s;
  return Apply(control, [&](ControlState& st) {
    st.Queue(EventFor(fixture, device, nvmlEventTypeXidCriticalError, xid));
  });
}

Status InjectEcc(const ControlFile& control, const Fixture& fixture, const DeviceRef& device,
                 uint64_t single_bit, uint64_t double_bit) {
  if (Status s = CheckGpu(fixture, device.gpu); !s.ok()) return s;
  if (single_bit == 0 && double_bit == 0) {
    return Status(ErrorCode::kUsage, "give --single-bit N and/or --double-bit N (N > 0)");
  }
  return Apply(control, [&](ControlState& st) {
    GpuOverrides& o = st.gpus[device.gpu];
    o.ecc_single_bit += single_bit;
    o.ecc_double_bit += double_bit;
    if (single_bit > 0) {
      st.Queue(EventFor(fixture, device, nvmlEventTypeSingleBitEccError, 0));
    }
    if (double_bit > 0) {
      st.Queue(EventFor(fixture, device, nvmlEventTypeDoubleBitEccError, 0));
    }
  });
}

Status SetLost(const ControlFile& control, unsigned gpu, bool lost) {
  return Apply(control, [&](ControlState& st) { st.gpus[gpu].lost = lost; });
}

Status ResetState(const ControlFile& control, std::optional<unsigned> gpu) {
  return Apply(control, [&](ControlState& st) {
    if (gpu) {
      st.gpus.erase(*gpu);
      st.mig.erase(*gpu);
      return;
    }
    st.gpus.clear();
    st.events.clear();
    st.mig.clear();
    st.mig_create_fail_countdown = 0;
  });
}

}  // namespace gpulet::sim
