// A simulated node as gpulet sees it: the simulated libnvidia-ml.so.1, the fixture it reads, the
// state directory it shares with `gpulet sim`, and fake /sys and /proc trees for discovery.
//
// How the pieces meet: PrepareSimulation() validates the fixture, writes the state directory and
// exports GPULET_SIM_FIXTURE / GPULET_SIM_STATE; the simulated library reads those at
// nvmlInit_v2. Any other process that prepares the same fixture and state directory (e.g.
// `gpulet sim lose --gpu 3`) changes the node through ControlFile, and every library instance
// using that directory sees the change on its next call.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "sim/control.h"
#include "sim/fixture.h"

namespace gpulet::sim {

// A built-in name ("dgx-h100") or a path. Built-ins are searched in $GPULET_FIXTURES_DIR, then
// in the compiled-in source dir testing/fixtures. Unknown name: kNotFound listing known names.
Result<std::string> ResolveFixture(const std::string& name_or_path);

// The built-in fixture names (stems of *.yaml in the fixture directories), sorted.
std::vector<std::string> BuiltinFixtureNames();

struct SimulatedNode {
  std::string library_path;
  std::string fixture_path;
  std::string state_dir;
  std::string sysfs_root;
  std::string procfs_root;
};

// Validates the fixture (kInvalidInput "file:line: field: problem"), creates the state dir
// (`state_dir` if non-empty, else $GPULET_SIM_STATE, else /tmp/gpulet-sim/<fixture-stem>), writes
// the fake sysfs/procfs trees under it, keeps any existing control state (other processes may be
// using it), and setenv()s GPULET_SIM_FIXTURE and GPULET_SIM_STATE for the library this process
// will load. library_path: $GPULET_SIM_LIBRARY, else <dir of /proc/self/exe>/sim/… or ../sim/…
// (first that exists). Fixture names are looked up in $GPULET_FIXTURES_DIR, then fixtures/ beside
// the executable or one level up (the build copies testing/fixtures there).
Result<SimulatedNode> PrepareSimulation(const std::string& fixture, const std::string& state_dir);

// /tmp/gpulet-sim/<stem of fixture_path>.
std::string DefaultStateDir(const std::string& fixture_path);

// Writes <state_dir>/sysfs/bus/pci/devices/<bdf>/{numa_node,local_cpulist} and
// <state_dir>/proc/driver/nvidia-caps/mig-minors for `fixture`.
Status WriteFakeSystemTree(const Fixture& fixture, const std::string& state_dir);

// A GPU, or one MIG device of it, named on the `gpulet sim` command line.
struct DeviceRef {
  unsigned gpu = 0;
  std::optional<unsigned> mig;  // index among the GPU's MIG devices
};
// `gpu`: an index, a "GPU-…" UUID or a "MIG-…" UUID; `mig`: a MIG index on that GPU.
Result<DeviceRef> FindDevice(const Fixture& fixture, const std::string& gpu,
                             std::optional<unsigned> mig);

// The changes `gpulet sim` makes. Each is one atomic update of the control file.
Status InjectXid(const ControlFile& control, const Fixture& fixture, const DeviceRef& device,
                 uint64_t xid);
// Raises the ECC counters and queues one ECC event per kind raised.
Status InjectEcc(const ControlFile& control, const Fixture& fixture, const DeviceRef& device,
                 uint64_t single_bit, uint64_t double_bit);
// Sets the telemetry overrides present in `set` (absent ones are kept).
Status SetOverrides(const ControlFile& control, unsigned gpu, const GpuOverrides& set);
Status SetLost(const ControlFile& control, unsigned gpu, bool lost);
// Clears overrides, lost flags, ECC additions and MIG layout changes (one GPU, or all when `gpu`
// is empty) and, for all, the event queue and the MIG fault hook. Sequence numbers keep increasing so open event sets stay consistent.
Status ResetState(const ControlFile& control, std::optional<unsigned> gpu);

}  // namespace gpulet::sim
