// The mig-parted configuration format, as `gpulet mig apply|plan -f FILE -c NAME` reads it:
//
//   version: v1
//   mig-configs:
//     all-1g.5gb:
//       - devices: all            # or a list of GPU indexes: [0, 1]
//         mig-enabled: true
//         mig-devices: {"1g.5gb": 7}
//
// A named config is a list of entries; each applies to its devices. Entries of one config must
// name disjoint devices ("all" only alone). Only whole-GPU-instance device names ("3g.20gb") are
// accepted; compute-instance names ("1c.3g.20gb") are rejected with a clear error.
#pragma once

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
};

struct MigConfig {
  std::string file;
  std::string name;
  std::vector<MigConfigEntry> entries;
};

// Errors: kInvalidInput "FILE:LINE: field.path: problem"; kNotFound when `name` is not among
// mig-configs (the message lists the names that are).
Result<MigConfig> ParseMigConfig(const std::string& text, const std::string& file,
                                 const std::string& name);
// Reads `path`, then ParseMigConfig. kNotFound when the file cannot be read.
Result<MigConfig> LoadMigConfig(const std::string& path, const std::string& name);

}  // namespace gpulet::mig
