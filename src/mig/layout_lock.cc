#include "mig/layout_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace gpulet::mig {
namespace {

int OpenLockFile(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  return ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
}

}  // namespace

std::string LayoutLockPath(const std::string& sim_state_dir) {
  const char* env = std::getenv("GPULET_MIG_LOCK_FILE");
  if (env != nullptr && *env != '\0') return env;
  if (!sim_state_dir.empty()) return sim_state_dir + "/mig-layout.lock";
  return kDefaultLayoutLockFile;
}

Result<LayoutLock> LayoutLock::Exclusive(const std::string& path,
                                         const std::function<void()>& on_wait) {
  const int fd = OpenLockFile(path);
  if (fd < 0) {
    return Status(ErrorCode::kUnavailable,
                  "MIG layout lock " + path + ": cannot open: " + std::strerror(errno));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return LayoutLock(fd);
  if (on_wait) on_wait();
  int rc;
  do {
    rc = ::flock(fd, LOCK_EX);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    ::close(fd);
    return Status(ErrorCode::kUnavailable,
                  "MIG layout lock " + path + ": flock: " + std::strerror(err));
  }
  return LayoutLock(fd);
}

std::optional<LayoutLock> LayoutLock::TryShared(const std::string& path) {
  const int fd = OpenLockFile(path);
  if (fd < 0) return LayoutLock(-1);
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
    ::close(fd);
    return std::nullopt;
  }
  return LayoutLock(fd);
}

LayoutLock& LayoutLock::operator=(LayoutLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

LayoutLock::~LayoutLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

}  // namespace gpulet::mig
