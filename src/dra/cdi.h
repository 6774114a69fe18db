// CDI (Container Device Interface) specs as the DRA driver writes them, and the edits that make an
// NVIDIA GPU usable in a container under a runtime with CDI on and no NVIDIA runtime, the way
// `nvidia-ctk cdi generate` does: device nodes, the driver's user-space libraries and binaries as
// read-only bind mounts, and an ldconfig createContainer hook.
//
// cdiVersion: the lowest version that covers the fields used (the CDI spec's loading rule: a spec
// is refused when its version is below what its fields need). From the CDI spec package's
// version checks: 0.3.0 is the base; 0.4.0 for a mount's `type`; 0.5.0 for a device node's
// `hostPath` or a device name starting with a digit; 0.6.0 for annotations or a '.' in the class;
// 0.7.0 for intelRdt / additionalGids; 1.1.0 for netDevices. We never write the last three.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace gpulet::dra {

inline constexpr char kCdiVendor[] = "gpu.gpulet.io";
inline constexpr char kCdiClass[] = "claim";
inline constexpr char kCdiKind[] = "gpu.gpulet.io/claim";
// nvidia-ctk's kind, whose devices we refer to instead of generating edits.
inline constexpr char kNvidiaCdiKind[] = "nvidia.com/gpu";

struct CdiDeviceNode {
  std::string path;       // in the container
  std::string host_path;  // empty: the same as path
  bool operator==(const CdiDeviceNode&) const = default;
};
struct CdiMount {
  std::string host_path;
  std::string container_path;
  std::vector<std::string> options;
  bool operator==(const CdiMount&) const = default;
};
struct CdiHook {
  std::string hook_name;  // createContainer, …
  std::string path;
  std::vector<std::string> args;
  bool operator==(const CdiHook&) const = default;
};
struct CdiEdits {
  std::vector<std::string> env;  // "K=V"
  std::vector<CdiDeviceNode> device_nodes;
  std::vector<CdiMount> mounts;
  std::vector<CdiHook> hooks;
  bool empty() const {
    return env.empty() && device_nodes.empty() && mounts.empty() && hooks.empty();
  }
  // Appends what `other` has that this lacks (same node path, mount target, env entry or hook
  // is not repeated).
  void Merge(const CdiEdits& other);
};
struct CdiDevice {
  std::string name;
  CdiEdits edits;
};
struct CdiSpec {
  std::string kind = kCdiKind;
  std::vector<CdiDevice> devices;
  CdiEdits edits;  // spec-level: applied when any device is
};

// "0.3.0", "0.5.0", … (see the top of this file).
std::string MinimumCdiVersion(const CdiSpec& spec);
// The spec as JSON, with cdiVersion = MinimumCdiVersion; empty fields are left out.
nlohmann::json CdiSpecToJson(const CdiSpec& spec);
// "<vendor>-<class>_<id>" (the CDI convention for transient specs), e.g.
// gpu.gpulet.io-claim_<uid>; the file is that plus ".json".
std::string TransientSpecName(std::string_view id);
// "vendor/class=name".
std::string QualifiedDeviceName(std::string_view kind, std::string_view name);

// Read-only bind mount options nvidia-ctk uses for driver files.
std::vector<std::string> ReadOnlyMountOptions();
// Read-write bind mount options (a tenant's directory).
std::vector<std::string> ReadWriteMountOptions();

// The driver's files found under a root.
struct DriverFiles {
  // Paths relative to the root, "/"-prefixed: where they appear in the container too.
  std::vector<std::string> control_nodes;  // /dev/nvidiactl, /dev/nvidia-uvm, …, that exist
  struct Library {
    std::string path;                   // "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
    std::vector<std::string> sonames;   // sibling symlinks to it: "/usr/lib/…/libcuda.so.1"
  };
  std::vector<Library> libraries;
  std::vector<std::string> binaries;    // "/usr/bin/nvidia-smi"
  std::vector<std::string> library_dirs;  // the directories the libraries are in
  std::string cdi_hook;                 // "/usr/bin/nvidia-cdi-hook" when present
};

// Looks up the driver's compute/utility/video libraries (<name>.so.<driver_version>; any
// version when driver_version is empty) in the usual library directories and then those the
// root's /etc/ld.so.conf names (its includes followed, e.g. /usr/local/nvidia/lib64), its
// binaries (also /usr/local/nvidia/bin) and the control device nodes under `driver_root`. kNotFound naming the root when libcuda or libnvidia-ml is missing, or
// /dev/nvidiactl.
Result<DriverFiles> FindDriverFiles(const std::string& driver_root,
                                    const std::string& driver_version);

// The edits every GPU needs (control nodes, libraries at their path and their sonames, binaries,
// the ldcache hook), with host paths under `host_root`. `hook_binary` (a host path; empty: the
// driver's nvidia-cdi-hook when found, else no hook) runs `update-ldcache --folder <dir>…`.
CdiEdits CommonDriverEdits(const DriverFiles& files, const std::string& host_root,
                           const std::string& hook_binary);
// One device node under the driver root, checked to exist there: kNotFound naming it.
Result<CdiDeviceNode> DeviceNodeEdit(const std::string& driver_root, const std::string& host_root,
                                     const std::string& path);

// nvidia-ctk's devices on this host: the names of kind nvidia.com/gpu found in the .json/.yaml
// files of `dirs` (bounded reads; files that do not parse are skipped).
struct NvidiaCdiDevices {
  std::vector<std::string> names;
  bool Has(std::string_view name) const;
};
NvidiaCdiDevices FindNvidiaCdiDevices(const std::vector<std::string>& dirs);

}  // namespace gpulet::dra
