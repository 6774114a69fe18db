// The MIG layout lock: `gpulet mig apply` holds it exclusively while it destroys and creates GPU
// and compute instances; a re-discovery (the plugin's and the exporter's rescan) holds it shared
// while it reads the node, and defers when an apply holds it. So no rescan advertises a layout
// half-way through an apply (MIG devices about to be destroyed, or not all created yet).
//
// The lock is flock(2) on a well-known file, so any tool can take part: /run/gpulet/mig-layout.lock
// on a real node (GPULET_MIG_LOCK_FILE overrides it), <sim-state>/mig-layout.lock on a simulated
// one. flock locks belong to the open file, so they are released when the holder exits or
// crashes; a stale file never blocks anyone.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "common/status.h"

namespace gpulet::mig {

inline constexpr char kDefaultLayoutLockFile[] = "/run/gpulet/mig-layout.lock";

// The lock file for a node: $GPULET_MIG_LOCK_FILE when set, else <sim_state_dir>/mig-layout.lock
// for a simulated node (non-empty `sim_state_dir`), else kDefaultLayoutLockFile.
std::string LayoutLockPath(const std::string& sim_state_dir);

// A held lock; released on destruction. Movable, not copyable.
class LayoutLock {
 public:
  // Blocks until the exclusive lock is held (an apply); `on_wait` (may be empty) runs first when
  // someone else holds it. Creates the file and its directory. Errors (kUnavailable) name the path.
  static Result<LayoutLock> Exclusive(const std::string& path,
                                      const std::function<void()>& on_wait = {});
  // Tries the shared lock without waiting (a rescan): nullopt while an apply holds it. A lock file
  // that cannot be created (no /run/gpulet and no permission) yields an unlocked LayoutLock with
  // held() false: nothing can apply without it either, so the rescan goes ahead.
  static std::optional<LayoutLock> TryShared(const std::string& path);

  LayoutLock(LayoutLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  LayoutLock& operator=(LayoutLock&& other) noexcept;
  LayoutLock(const LayoutLock&) = delete;
  LayoutLock& operator=(const LayoutLock&) = delete;
  ~LayoutLock();

  bool held() const { return fd_ >= 0; }

 private:
  explicit LayoutLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace gpulet::mig
