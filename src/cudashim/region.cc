#include "cudashim/region.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

namespace gpulet::cudashim {
namespace {

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared counters must be lock-free");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared counters must be lock-free");

std::string Errno(const std::string& path, const char* step, int err) {
  return path + ": " + step + ": " + std::strerror(err);
}

// Reads /proc/PID/stat: field 3 (state) and field 22 (starttime). The command name (field 2) may
// hold spaces and parentheses, so parsing starts after the last ')'.
const char* g_proc_root = "/proc";

bool ReadStat(pid_t pid, char* state, uint64_t* start_time) {
  char path[512];
  std::snprintf(path, sizeof path, "%s/%d/stat", g_proc_root, static_cast<int>(pid));
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr || p[1] != ' ') return false;
  p += 2;
  *state = *p;
  // After ')' come fields 3, 4, …; starttime is field 22, the 20th from here.
  for (int field = 3; field < 22; ++field) {
    p = std::strchr(p, ' ');
    if (p == nullptr) return false;
    ++p;
  }
  *start_time = std::strtoull(p, nullptr, 10);
  return true;
}

// Writes a file beside `path` and puts it in place whole: a temporary `path.XXXXXX` with `mode`,
// filled by `fill(fd)` (nullptr, or the step that failed with errno set), fsynced, then renamed
// over `path` (`replace`) or linked to it (an existing `path` is kept). A reader never sees a
// partial file; a failure leaves no temporary behind. (Not src/common's AtomicWrite: this file
// links into the LD_PRELOAD library, which carries no gpulet dependency.)
template <typename Fill>
std::string PlaceFile(const std::string& path, mode_t mode, bool replace, Fill fill) {
  std::string tmp = path + ".XXXXXX";
  std::vector<char> name(tmp.begin(), tmp.end());
  name.push_back('\0');
  const int fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) return Errno(tmp, "create", errno);
  tmp = name.data();
  auto fail = [&](const char* step) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return Errno(tmp, step, err);
  };
  // fchmod: the mode is exact, whatever the umask.
  if (::fchmod(fd, mode) != 0) return fail("chmod");
  if (const char* step = fill(fd); step != nullptr) return fail(step);
  if (::fsync(fd) != 0) return fail("fsync");
  ::close(fd);
  if (replace ? ::rename(tmp.c_str(), path.c_str()) != 0
              : ::link(tmp.c_str(), path.c_str()) != 0 && errno != EEXIST) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return Errno(path, "rename into place", err);
  }
  ::unlink(tmp.c_str());  // after rename: gone already (ENOENT, ignored)
  return "";
}

}  // namespace

void SetProcRootForTesting(const char* root) { g_proc_root = root; }

uint64_t ProcessStartTime(pid_t pid, bool* zombie) {
  char state = 0;
  uint64_t start = 0;
  if (!ReadStat(pid, &state, &start)) return 0;
  if (zombie != nullptr) *zombie = state == 'Z' || state == 'X';
  return start;
}

namespace {
// Whether `match(dir_fd, entry_name, fd)` holds for one of this process's descriptors (from
// /proc/self/fd; the directory's own descriptor left out); `unreadable` when it cannot be read.
template <typename Match>
bool AnyOwnDescriptor(bool unreadable, Match&& match) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return unreadable;
  const int own = ::dirfd(dir);
  bool found = false;
  while (const dirent* e = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == own) continue;
    if (match(own, e->d_name, static_cast<int>(fd))) {
      found = true;
      break;
    }
  }
  ::closedir(dir);
  return found;
}
}  // namespace

bool DescriptorsOpenUnder(const char* prefix) {
  const size_t n = std::strlen(prefix);
  return AnyOwnDescriptor(false, [&](int dir, const char* name, int) {
    char target[256];
    const ssize_t len = ::readlinkat(dir, name, target, sizeof target - 1);
    if (len <= 0) return false;
    target[len] = '\0';
    return std::strncmp(target, prefix, n) == 0;
  });
}

bool DescriptorOpenOn(dev_t dev, ino_t ino) {
  return AnyOwnDescriptor(true, [&](int, const char*, int fd) {
    struct stat st {};
    return ::fstat(fd, &st) == 0 && st.st_ino == ino && st.st_dev == dev;
  });
}

bool OwnerAlive(int32_t pid, uint64_t start_time) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;  // EPERM: alive, another user's
  char state = 0;
  uint64_t start = 0;
  if (!ReadStat(pid, &state, &start)) return true;  // exists, /proc hidden: keep (never over-free)
  if (state == 'Z' || state == 'X') return false;   // exited: the driver freed its memory
  return start == start_time;                       // another start time: a reused pid
}

std::string CreateRegion(const std::string& dir, const std::vector<GpuLimit>& gpus, bool replace) {
  const std::string path = dir + "/" + kRegionFileName;
  if (gpus.size() > kMaxGpus) {
    return path + ": " + std::to_string(gpus.size()) + " GPUs, at most " + std::to_string(kMaxGpus);
  }
  for (const GpuLimit& g : gpus) {
    if (g.uuid.empty() || g.uuid.size() >= kUuidBytes)
      return path + ": bad GPU UUID \"" + g.uuid + "\"";
  }
  if (!replace && ::access(path.c_str(), F_OK) == 0) return "";
  // Every process of the container, whichever user it runs as, maps the file read-write.
  return PlaceFile(path, 0666, replace, [&](int fd) -> const char* {
    if (::ftruncate(fd, sizeof(RegionLayout)) != 0) return "resize";
    void* p = ::mmap(nullptr, sizeof(RegionLayout), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return "mmap";
    auto* layout = static_cast<RegionLayout*>(p);  // a fresh file reads as zeros
    RegionHeader& h = layout->header;
    h.version = kRegionVersion;
    h.header_bytes = sizeof(RegionHeader);
    h.max_gpus = kMaxGpus;
    h.max_processes = kMaxProcesses;
    h.gpu_count = static_cast<uint32_t>(gpus.size());
    h.file_bytes = sizeof(RegionLayout);
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&h.mutex, &attr);
    pthread_mutexattr_destroy(&attr);
    for (size_t i = 0; i < gpus.size(); ++i) {
      GpuSlot& g = layout->gpus[i];
      std::memcpy(g.uuid, gpus[i].uuid.data(), gpus[i].uuid.size());
      g.context_bytes.store(gpus[i].context_bytes);
    }
    std::memcpy(h.magic, kRegionMagic, sizeof h.magic);  // last: a torn file never has the magic
    const int sync_rc = ::msync(p, sizeof(RegionLayout), MS_SYNC);
    const int sync_err = errno;
    ::munmap(p, sizeof(RegionLayout));
    errno = sync_err;
    return sync_rc != 0 ? "msync" : nullptr;
  });
}

Region::~Region() {
  if (layout_ != nullptr) ::munmap(layout_, mapped_);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

namespace {

struct flock SlotLockRange(int slot, short type) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = static_cast<off_t>(offsetof(RegionLayout, processes) +
                                  static_cast<size_t>(slot) * sizeof(ProcessSlot));
  fl.l_len = 1;
  return fl;
}

}  // namespace

bool Region::SlotLockHeld(int slot) const {
  if (slot < 0 || static_cast<uint32_t>(slot) >= kMaxProcesses || path_.empty()) return false;
  // Locks of our own open file description never conflict with a query through it: ask through a
  // fresh one, so our own slot reads as held too.
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return false;
  struct flock fl = SlotLockRange(slot, F_WRLCK);
  const bool asked = ::fcntl(fd, F_OFD_GETLK, &fl) == 0;
  ::close(fd);
  return asked && fl.l_type != F_UNLCK;
}

std::string Region::Open(const std::string& dir, bool read_only) {
  path_ = dir + "/" + kRegionFileName;
  read_only_ = read_only;
  int fd =
      ::open(path_.c_str(), (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0)
    return Errno(path_, read_only ? "open for reading" : "open for reading and writing", errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Errno(path_, "stat", err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return path_ + ": not a regular file";
  }
  if (static_cast<size_t>(st.st_size) < sizeof(RegionHeader)) {
    ::close(fd);
    return path_ + ": " + std::to_string(st.st_size) +
           " bytes, too short for a gpulet accounting region";
  }
  RegionHeader h{};
  if (::pread(fd, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h)) {
    const int err = errno;
    ::close(fd);
    return Errno(path_, "read header", err);
  }
  if (std::memcmp(h.magic, kRegionMagic, sizeof h.magic) != 0) {
    ::close(fd);
    return path_ + ": not a gpulet accounting region (bad magic)";
  }
  if (h.version != kRegionVersion) {
    ::close(fd);
    return path_ + ": accounting region layout version " + std::to_string(h.version) +
           ", this library reads version " + std::to_string(kRegionVersion) +
           " (library and device plugin of different gpulet releases); refusing to use it";
  }
  if (h.header_bytes != sizeof(RegionHeader) || h.max_gpus != kMaxGpus ||
      h.max_processes != kMaxProcesses || h.file_bytes != sizeof(RegionLayout) ||
      static_cast<size_t>(st.st_size) != sizeof(RegionLayout)) {
    ::close(fd);
    return path_ + ": accounting region of version " + std::to_string(kRegionVersion) +
           " but another size (" + std::to_string(st.st_size) + " bytes, expected " +
           std::to_string(sizeof(RegionLayout)) + "); refusing to use it";
  }
  void* p = ::mmap(nullptr, sizeof(RegionLayout), read_only ? PROT_READ : PROT_READ | PROT_WRITE,
                   MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) return Errno(path_, "mmap", err);
  layout_ = static_cast<RegionLayout*>(p);
  mapped_ = sizeof(RegionLayout);
  return "";
}

std::string Region::LoadLimits(const std::string& path) {
  has_limits_ = false;
  std::string err = ReadLimitsFile(path, &limits_, &driver_);
  if (!err.empty()) return err;
  has_limits_ = true;
  return "";
}

uint32_t Region::gpu_count() const {
  if (has_limits_) return limits_.gpu_count;  // checked <= kMaxGpus on load
  if (layout_ == nullptr) return 0;
  // Without limits (tools, tests): the region's own count, which anyone may have written.
  const uint32_t n = layout_->header.gpu_count;
  return n <= kMaxGpus ? n : kMaxGpus;
}

uint64_t Region::limit(int slot) const {
  if (!has_limits_ || slot < 0 || static_cast<uint32_t>(slot) >= limits_.gpu_count) return 0;
  return limits_.gpus[slot].limit;
}

int Region::FindGpu(const char* uuid) const {
  for (uint32_t i = 0; i < gpu_count(); ++i) {
    const char* mine = has_limits_          ? limits_.gpus[i].uuid
                       : layout_ != nullptr ? layout_->gpus[i].uuid
                                            : nullptr;
    if (mine != nullptr && std::strncmp(mine, uuid, kUuidBytes) == 0) return static_cast<int>(i);
  }
  return -1;
}

std::string WriteLimitsFile(const std::string& path, const std::vector<GpuLimit>& gpus,
                            bool passthrough, const std::string& driver_path) {
  if (gpus.size() > kMaxGpus) {
    return path + ": " + std::to_string(gpus.size()) + " GPUs, at most " + std::to_string(kMaxGpus);
  }
  if (!driver_path.empty() && (driver_path[0] != '/' || driver_path.size() >= kDriverPathBytes ||
                               driver_path.find('\0') != std::string::npos)) {
    return path + ": driver_path \"" + driver_path + "\": must be absolute, shorter than " +
           std::to_string(kDriverPathBytes) + " bytes";
  }
  struct {
    LimitsFile f;
    LimitsDriver driver;
  } file{};
  static_assert(sizeof file == kLimitsFileV2Bytes);
  LimitsFile& f = file.f;
  std::memcpy(f.magic, kLimitsMagic, sizeof f.magic);
  const size_t bytes = driver_path.empty() ? sizeof(LimitsFile) : kLimitsFileV2Bytes;
  f.version = driver_path.empty() ? kLimitsVersionNoDriver : kLimitsVersion;
  f.file_bytes = static_cast<uint32_t>(bytes);
  std::memcpy(file.driver.path, driver_path.data(), driver_path.size());
  f.gpu_count = static_cast<uint32_t>(gpus.size());
  f.flags = passthrough ? kLimitsPassthrough : 0;
  for (size_t i = 0; i < gpus.size(); ++i) {
    if (gpus[i].uuid.empty() || gpus[i].uuid.size() >= kUuidBytes)
      return path + ": bad GPU UUID \"" + gpus[i].uuid + "\"";
    std::memcpy(f.gpus[i].uuid, gpus[i].uuid.data(), gpus[i].uuid.size());
    f.gpus[i].limit = gpus[i].limit;
  }
  return PlaceFile(path, 0644, /*replace=*/true, [&](int fd) -> const char* {
    const auto* p = reinterpret_cast<const char*>(&file);
    for (size_t done = 0; done < bytes;) {
      const ssize_t n = ::write(fd, p + done, bytes - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return "write";
      done += static_cast<size_t>(n);
    }
    return nullptr;
  });
}

std::string CheckLimits(const LimitsFile& f, const std::string& path) {
  if (std::memcmp(f.magic, kLimitsMagic, sizeof f.magic) != 0)
    return path + ": magic: not a gpulet limits file";
  if (f.version != kLimitsVersion && f.version != kLimitsVersionNoDriver) {
    return path + ": version: " + std::to_string(f.version) + ", this library reads " +
           std::to_string(kLimitsVersionNoDriver) + " and " + std::to_string(kLimitsVersion);
  }
  const size_t want = f.version == kLimitsVersionNoDriver ? sizeof(LimitsFile) : kLimitsFileV2Bytes;
  if (f.file_bytes != want) return path + ": file_bytes: wrong size";
  if (f.gpu_count > kMaxGpus) {
    return path + ": gpu_count: " + std::to_string(f.gpu_count) + ", at most " +
           std::to_string(kMaxGpus);
  }
  for (uint32_t i = 0; i < f.gpu_count; ++i) {
    const char* u = f.gpus[i].uuid;
    if (u[0] == '\0' || std::memchr(u, '\0', kUuidBytes) == nullptr)
      return path + ": gpus[" + std::to_string(i) + "].uuid: empty or not NUL-terminated";
  }
  return "";
}

std::string ReadLimitsFile(const std::string& path, LimitsFile* out, LimitsDriver* driver) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return Errno(path, "open the GPU memory limits", errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Errno(path, "stat", err);
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (!S_ISREG(st.st_mode) || (size != sizeof(LimitsFile) && size != kLimitsFileV2Bytes)) {
    ::close(fd);
    return path + ": not a gpulet limits file (" + std::to_string(st.st_size) +
           " bytes, expected " + std::to_string(sizeof(LimitsFile)) + " or " +
           std::to_string(kLimitsFileV2Bytes) + ")";
  }
  struct {
    LimitsFile f;
    LimitsDriver driver;
  } file{};  // a version 1 file leaves the driver path empty
  const ssize_t n = ::pread(fd, &file, size, 0);
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(size)) return Errno(path, "read", n < 0 ? err : EIO);
  if (std::string err = CheckLimits(file.f, path); !err.empty()) return err;
  if (file.f.file_bytes != size) return path + ": file_bytes: not the file's size";
  if (file.f.version == kLimitsVersion) {
    const char* d = file.driver.path;
    if (d[0] != '/' || std::memchr(d, '\0', kDriverPathBytes) == nullptr)
      return path + ": driver_path: not an absolute path or not NUL-terminated";
  }
  *out = file.f;
  if (driver != nullptr) *driver = file.driver;
  return "";
}

std::string LimitsFileBesideLibrary() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<const void*>(&LimitsFileBesideLibrary), &info) == 0 ||
      info.dli_fname == nullptr) {
    return "";
  }
  const std::string self = info.dli_fname;
  const size_t slash = self.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : self.substr(0, slash);
  return dir + "/" + kLimitsFileName;
}

std::string ParseRegionCopy(const unsigned char* bytes, size_t n, uint64_t file_bytes,
                            std::vector<GpuUsage>* out) {
  out->clear();
  if (n < kRegionPrefixBytes) return "copy too short";
  RegionHeader h;
  std::memcpy(static_cast<void*>(&h), bytes, sizeof h);
  if (std::memcmp(h.magic, kRegionMagic, sizeof h.magic) != 0) return "bad magic";
  if (h.version != kRegionVersion) return "layout version " + std::to_string(h.version);
  if (h.header_bytes != sizeof(RegionHeader) || h.max_gpus != kMaxGpus ||
      h.max_processes != kMaxProcesses || h.file_bytes != sizeof(RegionLayout) ||
      file_bytes != sizeof(RegionLayout)) {
    return "sizes do not match layout version " + std::to_string(kRegionVersion);
  }
  if (h.gpu_count > kMaxGpus) return "gpu_count " + std::to_string(h.gpu_count);
  for (uint32_t i = 0; i < h.gpu_count; ++i) {
    const unsigned char* slot = bytes + offsetof(RegionLayout, gpus) + i * sizeof(GpuSlot);
    if (std::memchr(slot, '\0', kUuidBytes) == nullptr)
      return "gpus[" + std::to_string(i) + "].uuid not NUL-terminated";
    GpuUsage u;
    u.uuid.assign(reinterpret_cast<const char*>(slot));
    auto field = [&](size_t offset) {
      uint64_t v = 0;
      std::memcpy(&v, slot + offset, sizeof v);
      return v;
    };
    u.used = field(offsetof(GpuSlot, used));
    u.peak = field(offsetof(GpuSlot, peak));
    u.context_bytes = field(offsetof(GpuSlot, context_bytes));
    out->push_back(std::move(u));
  }
  return "";
}

bool Region::Lock() {
  int rc = pthread_mutex_lock(&layout_->header.mutex);
  if (rc == EOWNERDEAD) {
    // The previous holder died inside the critical section: its slot's counters may be half
    // updated. The process slots are the truth; rebuild the GPU totals from them.
    ReapLocked();
    RebuildLocked();
    pthread_mutex_consistent(&layout_->header.mutex);
    return true;
  }
  return rc == 0;
}

void Region::Unlock() { pthread_mutex_unlock(&layout_->header.mutex); }

void Region::RebuildLocked() {
  for (uint32_t g = 0; g < gpu_count(); ++g) {
    uint64_t sum = 0;
    for (ProcessSlot& p : layout_->processes) {
      if (p.state.load(std::memory_order_relaxed) != kSlotFree)
        sum += p.used[g].load(std::memory_order_relaxed);
    }
    layout_->gpus[g].used.store(sum, std::memory_order_relaxed);
  }
}

int Region::ReapLocked() {
  int reaped = 0;
  for (ProcessSlot& p : layout_->processes) {
    const uint32_t state = p.state.load(std::memory_order_acquire);
    if (state == kSlotFree) continue;
    // A slot left half claimed (its process died before finishing Attach) holds nothing once its
    // owner is gone; a live claimer finishes within a few instructions.
    const int index = static_cast<int>(&p - layout_->processes);
    if (p.locked.load(std::memory_order_acquire) != 0) {
      // The lock is the evidence: held means alive, even where /proc cannot be read or the pid
      // belongs to another PID namespace; free means the owner's descriptor is gone.
      if (index == locked_slot_ || SlotLockHeld(index)) continue;
      // Gone, but /proc (where it can tell) says the owner lives: it closed its own descriptor
      // (close_range, a daemon closing everything), and may still hold driver memory. Kept until
      // it exits (issue 36 item 7). An image before exec is released by the next image
      // (ReleaseEarlierImages), not here.
      char stat_state = 0;
      uint64_t stat_start = 0;
      if (p.pid > 0 && ReadStat(p.pid, &stat_state, &stat_start) && stat_state != 'Z' &&
          stat_state != 'X' && stat_start == p.start_time) {
        continue;  // /proc confirms it (where /proc is hidden, the lock alone decided: dead)
      }
    } else {
      if (OwnerAlive(p.pid, p.start_time)) continue;
      if (state == kSlotClaiming && p.pid == 0) continue;
    }
    for (uint32_t g = 0; g < kMaxGpus; ++g) {
      const uint64_t held = p.used[g].exchange(0, std::memory_order_relaxed);
      if (g < gpu_count() && held != 0)
        layout_->gpus[g].used.fetch_sub(held, std::memory_order_relaxed);
    }
    p.pid = 0;
    p.start_time = 0;
    p.locked.store(0, std::memory_order_relaxed);
    p.state.store(kSlotFree, std::memory_order_release);
    ++reaped;
  }
  return reaped;
}

int Region::Reap() {
  if (layout_ == nullptr || read_only_ || !Lock()) return 0;
  const int reaped = ReapLocked();
  RebuildLocked();
  Unlock();
  return reaped;
}

int Region::ReleaseEarlierImages() {
  if (layout_ == nullptr || read_only_) return 0;
  const pid_t pid = ::getpid();
  const uint64_t start = ProcessStartTime(pid);
  if (start == 0 || !Lock()) return 0;  // without a start time an earlier image cannot be told
  int freed = 0;
  for (ProcessSlot& p : layout_->processes) {
    if (p.state.load(std::memory_order_acquire) != kSlotLive || p.pid != pid ||
        p.start_time != start) {
      continue;
    }
    // Held: a live process (a sibling PID namespace's), not an earlier image of this one, whose
    // O_CLOEXEC lock went at exec. Asked of the kernel, not of the tenant-written `locked` field.
    const int index = static_cast<int>(&p - layout_->processes);
    if (SlotLockHeld(index)) continue;
    for (auto& u : p.used) u.store(0, std::memory_order_relaxed);
    p.pid = 0;
    p.start_time = 0;
    p.locked.store(0, std::memory_order_relaxed);
    p.state.store(kSlotFree, std::memory_order_release);
    ++freed;
  }
  RebuildLocked();
  Unlock();
  return freed;
}

int Region::Attach() {
  if (layout_ == nullptr || read_only_ || !Lock()) return -1;
  ReapLocked();
  RebuildLocked();
  const pid_t pid = ::getpid();
  const uint64_t start = ProcessStartTime(pid);
  int slot = -1;
  for (uint32_t i = 0; i < kMaxProcesses; ++i) {
    ProcessSlot& p = layout_->processes[i];
    if (p.state.load(std::memory_order_relaxed) != kSlotFree) continue;
    p.state.store(kSlotClaiming, std::memory_order_relaxed);
    p.pid = pid;
    p.start_time = start;
    for (auto& u : p.used) u.store(0, std::memory_order_relaxed);
    p.locked.store(0, std::memory_order_relaxed);
    p.state.store(kSlotLive, std::memory_order_release);
    slot = static_cast<int>(i);
    break;
  }
  if (slot >= 0) {
    // A new open file description for this slot's lock. After fork the child shares the parent's
    // description (and its lock): closing the child's copy leaves the parent's lock in place.
    if (lock_fd_ >= 0) ::close(lock_fd_);
    lock_fd_ = ::open(path_.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    locked_slot_ = -1;
    struct flock fl = SlotLockRange(slot, F_WRLCK);
    if (lock_fd_ >= 0 && ::fcntl(lock_fd_, F_OFD_SETLK, &fl) == 0) {
      layout_->processes[slot].locked.store(1, std::memory_order_release);
      locked_slot_ = slot;
    } else if (lock_fd_ >= 0) {
      ::close(lock_fd_);  // no lock (a filesystem without them): the pid and /proc decide
      lock_fd_ = -1;
    }
  }
  Unlock();
  return slot;
}

bool Region::Admit(int proc, int gpu, uint64_t bytes, bool force) {
  if (layout_ == nullptr || read_only_ || proc < 0 || gpu < 0) return false;
  if (static_cast<uint32_t>(proc) >= kMaxProcesses || static_cast<uint32_t>(gpu) >= gpu_count())
    return false;
  const uint64_t lim = limit(gpu);
  GpuSlot& g = layout_->gpus[gpu];
  ProcessSlot& p = layout_->processes[proc];
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!Lock()) return false;
    const uint64_t used = g.used.load(std::memory_order_relaxed);
    if (force || (bytes <= lim && used <= lim - bytes)) {
      p.used[gpu].fetch_add(bytes, std::memory_order_relaxed);  // the process share first: see Lock
      const uint64_t now = used + bytes;
      g.used.store(now, std::memory_order_relaxed);
      if (now > g.peak.load(std::memory_order_relaxed))
        g.peak.store(now, std::memory_order_relaxed);
      Unlock();
      return true;
    }
    // Over the limit: memory of a process that died may still be counted. Reap once and retry.
    const bool reaped = ReapLocked() > 0;
    if (reaped) RebuildLocked();
    Unlock();
    if (!reaped) return false;
  }
  return false;
}

void Region::Release(int proc, int gpu, uint64_t bytes) {
  if (layout_ == nullptr || read_only_ || proc < 0 || gpu < 0 || bytes == 0) return;
  if (static_cast<uint32_t>(proc) >= kMaxProcesses || static_cast<uint32_t>(gpu) >= kMaxGpus)
    return;
  if (!Lock()) return;
  ProcessSlot& p = layout_->processes[proc];
  GpuSlot& g = layout_->gpus[gpu];
  const uint64_t held = p.used[gpu].load(std::memory_order_relaxed);
  const uint64_t n = bytes < held ? bytes : held;
  p.used[gpu].store(held - n, std::memory_order_relaxed);
  const uint64_t used = g.used.load(std::memory_order_relaxed);
  g.used.store(used >= n ? used - n : 0, std::memory_order_relaxed);
  Unlock();
}

void Region::ReleaseAll(int proc, int gpu) {
  if (layout_ == nullptr || proc < 0 || gpu < 0) return;
  if (static_cast<uint32_t>(proc) >= kMaxProcesses || static_cast<uint32_t>(gpu) >= kMaxGpus)
    return;
  Release(proc, gpu, layout_->processes[proc].used[gpu].load(std::memory_order_relaxed));
}

std::vector<GpuUsage> Region::Usage() const {
  std::vector<GpuUsage> out;
  for (uint32_t i = 0; i < gpu_count(); ++i) {
    const GpuSlot& g = layout_->gpus[i];
    GpuUsage u;
    u.uuid =
        has_limits_ ? limits_.gpus[i].uuid : std::string(g.uuid, ::strnlen(g.uuid, kUuidBytes));
    u.limit = limit(static_cast<int>(i));
    u.used = g.used.load(std::memory_order_relaxed);
    u.peak = g.peak.load(std::memory_order_relaxed);
    u.context_bytes = g.context_bytes.load(std::memory_order_relaxed);
    out.push_back(std::move(u));
  }
  return out;
}

}  // namespace gpulet::cudashim
