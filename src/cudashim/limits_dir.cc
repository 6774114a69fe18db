#include "cudashim/limits_dir.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "common/files.h"

namespace gpulet::cudashim {

namespace fs = std::filesystem;

Result<LimitsEdits> CreateLimitsDir(const std::string& state_dir, const std::string& name,
                                    const std::string& library, const std::vector<GpuLimit>& gpus,
                                    bool passthrough) {
  const std::string dir = state_dir + "/" + name;
  const std::string tenant = dir + "/" + kTenantDirName;
  std::error_code ec;
  fs::create_directories(tenant, ec);
  if (ec) return Status(ErrorCode::kInternal, tenant + ": create: " + ec.message());
  // Every user of the container reaches the region through these directories.
  for (const std::string& d : {dir, tenant}) {
    if (::chmod(d.c_str(), 0755) != 0) {
      return Status(ErrorCode::kInternal, d + ": chmod 0755: " + std::strerror(errno));
    }
  }
  const std::string limits = dir + "/" + kLimitsFileName;
  const char* driver = std::getenv(kNodeDriverEnv);  // the agent's environment: the node's choice
  if (std::string err = WriteLimitsFile(limits, gpus, passthrough, driver != nullptr ? driver : "");
      !err.empty()) {
    return Status(ErrorCode::kInternal, err);
  }
  if (std::string err = CreateRegion(tenant, gpus, /*replace=*/true); !err.empty()) {
    return Status(ErrorCode::kInternal, err);
  }
  const std::string preload = state_dir + "/ld.so.preload";
  if (Status s = WriteFileAtomic(preload, std::string(kContainerLibraryPath) + "\n", 0644);
      !s.ok()) {
    return s;
  }
  LimitsEdits out;
  out.mounts = {{kContainerLibraryPath, library, true},
                {kContainerLimitsFile, limits, true},
                {kContainerAccountingDir, tenant, false},
                {kContainerPreloadFile, preload, true}};
  out.env = {{kAccountingDirEnv, kContainerAccountingDir}};
  return out;
}

}  // namespace gpulet::cudashim
