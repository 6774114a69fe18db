// A directory a tenant can write, as the node agent must read it: the one place that opens a
// path inside a container's directory (STYLE.md, "Trust boundaries"). A container that is root in
// its directory can put anything where a file is expected: a FIFO (an open or read blocks
// forever), a symlink to /dev/zero (a read never ends) or to a file outside (the agent would read
// or delete the node's files), a file that grows or shrinks while it is read.
//
// Contract:
//   - every name is one path component ("a", never "a/b", "." or ".."), opened with openat()
//     beneath the directory handle and O_NOFOLLOW: a symlink is never followed, at any level;
//   - files are opened O_NONBLOCK (a FIFO does not block the open) and checked with fstat() to be
//     regular files no larger than the caller's bound before a byte is read; reads are bounded
//     by that size, whatever the file does meanwhile;
//   - directories are opened O_DIRECTORY | O_NOFOLLOW, and a directory on another filesystem
//     than its parent is refused (a mount is not the tenant's to hand us);
//   - RemoveTree unlinks symlinks as names (never their targets) and never leaves the tree.
// Errors name the path and the cause: kNotFound (missing), kInvalidInput (not a regular file or
// directory, too large, a symlink), kInternal (other system errors).
//
// Thread-safety: a TenantDir is an open descriptor; const methods may be called concurrently.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace gpulet {

class TenantDir {
 public:
  // Opens the directory `path` (the agent's own configured path: symlinks in it are the admin's
  // and are followed; only what lies beneath is the tenant's).
  static Result<TenantDir> Open(const std::string& path);

  TenantDir() = default;
  ~TenantDir();
  TenantDir(TenantDir&& other) noexcept;
  TenantDir& operator=(TenantDir&& other) noexcept;
  TenantDir(const TenantDir&) = delete;
  TenantDir& operator=(const TenantDir&) = delete;

  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }

  // The subdirectory `name` (not a symlink, same filesystem).
  Result<TenantDir> OpenDir(std::string_view name) const;

  // The whole content of regular file `name`, at most `max_bytes` (a larger file: kInvalidInput).
  Result<std::string> ReadFile(std::string_view name, size_t max_bytes) const;

  // The first `bytes` bytes of regular file `name` into `out`, which must be exactly
  // `file_bytes` long (another size: kInvalidInput, naming both). A file shortened during the
  // read is an error, never a signal: the bytes are copied with pread, nothing is mapped.
  Status ReadPrefix(std::string_view name, void* out, size_t bytes, uint64_t file_bytes) const;

  struct Entry {
    std::string name;
    bool directory = false;  // by lstat: a symlink to a directory is not one
  };
  // The entries ("." and ".." left out), at most `max_entries` (more: kInvalidInput).
  Result<std::vector<Entry>> List(size_t max_entries = 100000) const;

  // Removes `name` and, when it is a directory, everything beneath it: symlinks, FIFOs and
  // sockets are unlinked as names, subdirectories on another filesystem are left (an error),
  // at most `max_depth` levels. OK when `name` does not exist.
  Status RemoveTree(std::string_view name, int max_depth = 16) const;

 private:
  TenantDir(int fd, std::string path, dev_t dev) : fd_(fd), path_(std::move(path)), dev_(dev) {}
  std::string PathOf(std::string_view name) const;

  int fd_ = -1;
  std::string path_;
  dev_t dev_ = 0;
};

}  // namespace gpulet
