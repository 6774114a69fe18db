// The mig-parted configuration format, as `gpulet mig apply|plan -f FILE -c NAME` reads it:
//
//   version: v1
//   mig-configs:
//     all-1g.5gb:
//       - device-filter: ["0x20B010DE"]   # optional: PCI device ids (one string or a list)
//         devices: all                    # or a list of GPU indexes: [0, 1]
//         mig-enabled: true
//         mig-devices: {"1g.5gb": 7}
//
// A named config is a list of entries; each applies to its devices that match its device-filter
// (when it has one). Entries with the same filter must name disjoint devices ("all" only alone);
// entries with different filters may both say `devices: all` (mig-parted's config-default.yaml
// does): that one GPU is not claimed by two entries is checked by the planner. Device names are
// GPU instance profiles ("3g.20gb"), with mig-parted's suffixes ("1g.10gb+me", "1g.24gb+gfx",
// "1g.24gb+me.all", "1g.24gb-me"), or compute-instance profiles ("1c.3g.20gb": a 3g.20gb GPU
// instance holding one 1-slice compute instance, per device). `mig-enabled: true` needs a
// `mig-devices` key (an empty mapping is fine), as mig-parted requires. Unknown keys are ignored
// with a warning, as mig-parted ignores them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace gpulet::mig {

struct MigConfigEntry {
  std::optional<std::vector<unsigned>> devices;  // nullopt: all GPUs
  bool mig_enabled = false;
  std::vector<std::pair<std::string, unsigned>> mig_devices;  // profile → count, in file order
  int line = 0;                                               // 1-based, for errors
  int mig_devices_line = 0;  // line of the mig-devices key (the entry's line when absent)
  std::string field;         // "mig-configs.NAME[0]"
  // PCI device ids ("0x233010DE" → 0x233010DE) the entry is limited to; empty: any GPU.
  std::vector<uint32_t> device_filter;
};

struct MigConfig {
  std::string file;
  std::string name;
  std::vector<MigConfigEntry> entries;
  std::vector<std::string> warnings;  // "FILE:LINE: field: what is ignored"
};

// "1c.3g.20gb" → "3g.20gb"; a GPU instance profile name is returned unchanged.
std::string GpuInstanceProfileOf(const std::string& device_name);
// "1c.3g.20gb" → 1; 0 for a GPU instance profile name (one compute instance spanning it).
unsigned ComputeSlicesOf(const std::string& device_name);

// Errors: kInvalidInput "FILE:LINE: field.path: problem"; kNotFound when `name` is not among
// mig-configs (the message lists the names that are).
Result<MigConfig> ParseMigConfig(const std::string& text, const std::string& file,
                                 const std::string& name);
// Reads `path`, then ParseMigConfig. kNotFound when the file cannot be read.
Result<MigConfig> LoadMigConfig(const std::string& path, const std::string& name);

}  // namespace gpulet::mig
