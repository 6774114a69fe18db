#include "common/files.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace gpulet {
namespace {

std::string Errno() { return std::strerror(errno); }

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

Status WriteFileAtomic(const std::string& path, std::string_view content, mode_t mode) {
  static std::atomic<unsigned> sequence{0};
  const std::string tmp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(sequence.fetch_add(1));
  auto fail = [&](const std::string& step, int err) {
    ::unlink(tmp.c_str());
    const ErrorCode code = err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kInternal;
    return Status(code, path + ": cannot write (" + step + "): " + std::strerror(err));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    return Status(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kInternal,
                  path + ": cannot write (create " + tmp + "): " + std::strerror(err));
  }
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      return fail("write", err);
    }
    done += static_cast<size_t>(n);
  }
  if (::fchmod(fd, mode) != 0 || ::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    return fail("fsync", err);
  }
  if (::close(fd) != 0) return fail("close", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("rename", errno);
  const int dir = ::open(DirOf(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    // The rename is durable only once the directory is synced; a failure here leaves the new
    // content in place, so it is reported but the file is not rolled back.
    const int rc = ::fsync(dir);
    const int err = errno;
    ::close(dir);
    if (rc != 0 && err != EINVAL) {
      return Status(ErrorCode::kInternal,
                    path + ": written, but syncing its directory failed: " + std::strerror(err));
    }
  }
  return Status::Ok();
}

Result<std::string> ReadFileBounded(const std::string& path, size_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Status(errno == ENOENT ? ErrorCode::kNotFound : ErrorCode::kInternal,
                  path + ": cannot read: " + Errno());
  }
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string err = Errno();
      ::close(fd);
      return Status(ErrorCode::kInternal, path + ": cannot read: " + err);
    }
    if (n == 0) break;
    if (out.size() + static_cast<size_t>(n) > max_bytes) {
      ::close(fd);
      return Status(ErrorCode::kInvalidInput,
                    path + ": larger than " + std::to_string(max_bytes) + " bytes");
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

bool UnixSocketAccepts(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool ok = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

}  // namespace gpulet
