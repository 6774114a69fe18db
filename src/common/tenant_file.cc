#include "common/tenant_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace gpulet {
namespace {

bool ValidName(std::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos &&
         name.find('\0') == std::string_view::npos;
}

Status SysError(const std::string& path, const char* step, int err) {
  ErrorCode code = ErrorCode::kInternal;
  if (err == ENOENT) code = ErrorCode::kNotFound;
  if (err == ELOOP || err == ENOTDIR) code = ErrorCode::kInvalidInput;
  std::string cause = std::strerror(err);
  if (err == ELOOP) cause = "a symbolic link (not followed)";
  return Status(code, path + ": " + step + ": " + cause);
}

const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

}  // namespace

Result<TenantDir> TenantDir::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return SysError(path, "open directory", errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return SysError(path, "stat", err);
  }
  return TenantDir(fd, path, st.st_dev);
}

TenantDir::~TenantDir() {
  if (fd_ >= 0) ::close(fd_);
}

TenantDir::TenantDir(TenantDir&& other) noexcept
    : fd_(other.fd_), path_(std::move(other.path_)), dev_(other.dev_) {
  other.fd_ = -1;
}

TenantDir& TenantDir::operator=(TenantDir&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    dev_ = other.dev_;
    other.fd_ = -1;
  }
  return *this;
}

std::string TenantDir::PathOf(std::string_view name) const {
  return path_ + "/" + std::string(name);
}

Result<TenantDir> TenantDir::OpenDir(std::string_view name) const {
  const std::string path = PathOf(name);
  if (!ValidName(name)) return Status(ErrorCode::kInvalidInput, path + ": not a single name");
  const int fd =
      ::openat(fd_, std::string(name).c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return SysError(path, "open directory", errno);
  Fd owned(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return SysError(path, "stat", errno);
  if (st.st_dev != dev_) {
    return Status(ErrorCode::kInvalidInput, path + ": on another filesystem than " + path_ +
                                                " (a mount point); refusing to enter it");
  }
  return TenantDir(owned.release(), path, st.st_dev);
}

namespace {

// Opens regular file `name` beneath `dirfd` without following a symlink and without opening
// anything else: an O_PATH descriptor is checked first, and only a regular file is reopened for
// reading (through /proc/self/fd, which reopens that very inode).
Result<int> OpenRegular(int dirfd, const std::string& name, const std::string& path,
                        struct stat* st) {
  const int pfd = ::openat(dirfd, name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (pfd < 0) return SysError(path, "open", errno);
  Fd owned(pfd);
  if (::fstat(pfd, st) != 0) return SysError(path, "stat", errno);
  if (!S_ISREG(st->st_mode)) {
    return Status(ErrorCode::kInvalidInput,
                  path + ": " + KindOf(st->st_mode) + ", expected a regular file");
  }
  char proc[64];
  std::snprintf(proc, sizeof proc, "/proc/self/fd/%d", pfd);
  int fd = ::open(proc, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    // No /proc: open by name, still without following or blocking, and check again.
    fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  }
  if (fd < 0) return SysError(path, "open for reading", errno);
  Fd reading(fd);
  if (::fstat(fd, st) != 0) return SysError(path, "stat", errno);
  if (!S_ISREG(st->st_mode)) {
    return Status(ErrorCode::kInvalidInput,
                  path + ": " + KindOf(st->st_mode) + ", expected a regular file");
  }
  return reading.release();
}

}  // namespace

Result<std::string> TenantDir::ReadFile(std::string_view name, size_t max_bytes) const {
  const std::string path = PathOf(name);
  if (!ValidName(name)) return Status(ErrorCode::kInvalidInput, path + ": not a single name");
  struct stat st {};
  Result<int> fd = OpenRegular(fd_, std::string(name), path, &st);
  if (!fd.ok()) return fd.status();
  Fd owned(*fd);
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return Status(ErrorCode::kInvalidInput, path + ": " + std::to_string(st.st_size) +
                                                " bytes, more than the " +
                                                std::to_string(max_bytes) + " allowed");
  }
  // The file may grow while it is read: read at most one byte past the bound to tell.
  std::string out(static_cast<size_t>(st.st_size) + 1, '\0');
  size_t done = 0;
  while (true) {
    if (done == out.size()) {
      if (out.size() > max_bytes) break;
      out.resize(std::min(out.size() * 2 + 64, max_bytes + 1));
    }
    const ssize_t n = ::pread(*fd, out.data() + done, out.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return SysError(path, "read", errno);
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  if (done > max_bytes) {
    return Status(ErrorCode::kInvalidInput,
                  path + ": grew past the " + std::to_string(max_bytes) + " bytes allowed");
  }
  out.resize(done);
  return out;
}

Status TenantDir::ReadPrefix(std::string_view name, void* out, size_t bytes,
                             uint64_t file_bytes) const {
  const std::string path = PathOf(name);
  if (!ValidName(name)) return Status(ErrorCode::kInvalidInput, path + ": not a single name");
  struct stat st {};
  Result<int> fd = OpenRegular(fd_, std::string(name), path, &st);
  if (!fd.ok()) return fd.status();
  Fd owned(*fd);
  if (static_cast<uint64_t>(st.st_size) != file_bytes) {
    return Status(ErrorCode::kInvalidInput, path + ": " + std::to_string(st.st_size) +
                                                " bytes, expected " + std::to_string(file_bytes));
  }
  size_t done = 0;
  auto* dst = static_cast<char*>(out);
  while (done < bytes) {
    const ssize_t n = ::pread(*fd, dst + done, bytes - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return SysError(path, "read", errno);
    if (n == 0) {
      return Status(ErrorCode::kInvalidInput,
                    path + ": shortened to " + std::to_string(done) + " bytes while read");
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Result<std::vector<TenantDir::Entry>> TenantDir::List(size_t max_entries) const {
  const int fd = ::openat(fd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return SysError(path_, "open directory", errno);
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    const int err = errno;
    ::close(fd);
    return SysError(path_, "read directory", err);
  }
  std::vector<Entry> out;
  Status error;
  while (true) {
    errno = 0;
    const struct dirent* e = ::readdir(d);
    if (e == nullptr) {
      if (errno != 0) error = SysError(path_, "read directory", errno);
      break;
    }
    const std::string_view name = e->d_name;
    if (name == "." || name == "..") continue;
    if (out.size() == max_entries) {
      error = Status(ErrorCode::kInvalidInput,
                     path_ + ": more than " + std::to_string(max_entries) + " entries");
      break;
    }
    bool directory = false;
    if (e->d_type == DT_DIR) {
      directory = true;
    } else if (e->d_type == DT_UNKNOWN) {
      struct stat st {};
      directory = ::fstatat(fd_, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
    }
    out.push_back(Entry{std::string(name), directory});
  }
  ::closedir(d);
  if (!error.ok()) return error;
  return out;
}

Status TenantDir::RemoveTree(std::string_view name, int max_depth) const {
  const std::string path = PathOf(name);
  if (!ValidName(name)) return Status(ErrorCode::kInvalidInput, path + ": not a single name");
  const std::string n(name);
  struct stat st {};
  if (::fstatat(fd_, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return errno == ENOENT ? Status::Ok() : SysError(path, "stat", errno);
  }
  if (S_ISDIR(st.st_mode)) {
    if (max_depth <= 0) {
      return Status(ErrorCode::kInvalidInput, path + ": nested too deep; not removed");
    }
    Result<TenantDir> sub = OpenDir(name);
    if (!sub.ok() && sub.status().code() != ErrorCode::kInvalidInput) return sub.status();
    if (sub.ok()) {
      Result<std::vector<Entry>> entries = sub->List();
      if (!entries.ok()) return entries.status();
      for (const Entry& e : *entries) {
        if (Status s = sub->RemoveTree(e.name, max_depth - 1); !s.ok()) return s;
      }
      if (::unlinkat(fd_, n.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
        return SysError(path, "remove directory", errno);
      }
      return Status::Ok();
    }
    if (st.st_dev != dev_) return sub.status();  // a mount point: left alone
    // Replaced by a symlink (or another file) since the stat: unlink the name below.
  }
  if (::unlinkat(fd_, n.c_str(), 0) != 0 && errno != ENOENT) {
    if (errno == EISDIR) return Status(ErrorCode::kInternal, path + ": changed while removed");
    return SysError(path, "remove", errno);
  }
  return Status::Ok();
}

}  // namespace gpulet
