// Files as a seam: the one implementation of "replace a file so a reader never sees half of it"
// and of a bounded read. Every component that writes state or configuration calls these.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "common/status.h"

namespace gpulet {

// Replaces `path` with `content` atomically and durably: writes a temporary file in the same
// directory, fsyncs it, renames it over `path`, then fsyncs the directory. A reader sees the old
// content or the new, never a mix; after a crash, the file holds one of the two. `mode` is applied
// to the new file (not subject to the umask). Errors (kInternal, kNotFound when the directory does
// not exist) name the path and the step that failed; the temporary file is removed on failure.
Status WriteFileAtomic(const std::string& path, std::string_view content, mode_t mode = 0644);

// Reads at most `max_bytes` of `path`. kNotFound when it does not exist, kInvalidInput when it is
// larger than `max_bytes` (the message says so), kInternal on other errors; each names the path.
Result<std::string> ReadFileBounded(const std::string& path, size_t max_bytes = 16u << 20);

// True when something accepts a connection on the Unix socket at `path` (a server that died
// leaves its socket file behind, and connecting to it is refused).
bool UnixSocketAccepts(const std::string& path);

}  // namespace gpulet
