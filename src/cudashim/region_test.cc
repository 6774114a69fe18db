#include "cudashim/region.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace gpulet::cudashim {
namespace {

class RegionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpulet-region-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (int fd : {go_[0], go_[1], ready_[0], ready_[1]}) {
      if (fd >= 0) ::close(fd);
    }
    std::filesystem::remove_all(dir_);
  }
  // Forks another process of the container: it attaches, admits `bytes` on GPU 0, runs `then`
  // (a step of its own), reports its slot and waits for LetGo. Returns its pid; its slot in *slot.
  pid_t StartHolder(uint64_t bytes, int* slot = nullptr, const std::function<void()>& then = {}) {
    if (go_[0] < 0 && (::pipe(go_) != 0 || ::pipe(ready_) != 0)) ADD_FAILURE() << "pipe";
    const pid_t child = ::fork();
    if (child == 0) {
      Region r;
      if (!r.Open(dir_).empty() || !r.LoadLimits(limits()).empty()) ::_exit(1);
      const int p = r.Attach();
      const int reported = p >= 0 && r.Admit(p, 0, bytes) ? p : -1;
      if (then) then();
      if (::write(ready_[1], &reported, sizeof reported) != sizeof reported) ::_exit(1);
      char c;
      while (::read(go_[0], &c, 1) < 0) {
      }
      ::_exit(0);
    }
    int reported = -1;
    EXPECT_EQ(::read(ready_[0], &reported, sizeof reported),
              static_cast<ssize_t>(sizeof reported));
    EXPECT_GE(reported, 0);
    if (slot != nullptr) *slot = reported;
    return child;
  }
  // Lets one holder exit.
  void LetGo() { EXPECT_EQ(::write(go_[1], "g", 1), 1); }
  // The region and, beside it, the limits file the plugin writes.
  void Make(const std::vector<GpuLimit>& gpus) {
    ASSERT_EQ(CreateRegion(dir_, gpus), "");
    ASSERT_EQ(WriteLimitsFile(limits(), gpus), "");
  }
  std::string limits() const { return dir_ + "/" + kLimitsFileName; }
  void OpenWithLimits(Region& r) {
    ASSERT_EQ(r.Open(dir_), "");
    ASSERT_EQ(r.LoadLimits(limits()), "");
  }
  std::string dir_;
  int go_[2] = {-1, -1}, ready_[2] = {-1, -1};
};

TEST_F(RegionTest, CreatedWorldWritableWhateverTheUmask) {
  const mode_t old = ::umask(077);
  const std::string err = CreateRegion(dir_, {{"GPU-a", 1000, 0}});
  ::umask(old);
  ASSERT_EQ(err, "");
  struct stat st {};
  ASSERT_EQ(::stat((dir_ + "/memory.region").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u);
}

TEST_F(RegionTest, AdmitsUpToTheLimitExactly) {
  Make({{"GPU-a", 1000, 0}, {"GPU-b", 50, 0}});
  Region r;
  OpenWithLimits(r);
  EXPECT_EQ(r.FindGpu("GPU-b"), 1);
  EXPECT_EQ(r.FindGpu("GPU-c"), -1);
  const int p = r.Attach();
  ASSERT_GE(p, 0);
  EXPECT_TRUE(r.Admit(p, 0, 600));
  EXPECT_TRUE(r.Admit(p, 0, 400));
  EXPECT_FALSE(r.Admit(p, 0, 1));
  EXPECT_FALSE(r.Admit(p, 1, UINT64_MAX));  // no overflow past the limit
  r.Release(p, 0, 400);
  EXPECT_EQ(r.Usage()[0].used, 600u);
  EXPECT_EQ(r.Usage()[0].peak, 1000u);
  r.Release(p, 0, 10'000);  // never more than the process holds
  EXPECT_EQ(r.Usage()[0].used, 0u);
  EXPECT_TRUE(r.Admit(p, 1, 70, /*force=*/true));
  EXPECT_EQ(r.Usage()[1].used, 70u);
}

TEST_F(RegionTest, RefusesAnotherLayoutVersionAndLeavesItAlone) {
  ASSERT_EQ(CreateRegion(dir_, {{"GPU-a", 1000, 0}}), "");
  const std::string path = dir_ + "/memory.region";
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    const uint32_t v1 = 1;
    f.seekp(8);
    f.write(reinterpret_cast<const char*>(&v1), sizeof v1);
  }
  Region r;
  const std::string err = r.Open(dir_);
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_NE(err.find("layout version 1"), std::string::npos) << err;
  EXPECT_FALSE(r.is_open());
}

TEST_F(RegionTest, MissingAndForeignFilesNameTheFileAndCause) {
  Region r;
  std::string err = r.Open(dir_);
  EXPECT_NE(err.find(dir_ + "/memory.region: open"), std::string::npos) << err;
  EXPECT_NE(err.find("No such file"), std::string::npos) << err;
  std::ofstream(dir_ + "/memory.region") << std::string(8192, 'x');
  err = r.Open(dir_);
  EXPECT_NE(err.find("bad magic"), std::string::npos) << err;
}

TEST_F(RegionTest, DeadProcessesShareIsReaped) {
  Make({{"GPU-a", 1000, 0}});
  const pid_t child = ::fork();
  if (child == 0) {
    Region r;
    if (!r.Open(dir_).empty() || !r.LoadLimits(limits()).empty()) ::_exit(1);
    const int p = r.Attach();
    ::_exit(p >= 0 && r.Admit(p, 0, 900) ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  Region r;
  OpenWithLimits(r);
  EXPECT_EQ(r.Usage()[0].used, 900u);  // still counted: nobody reaped yet
  const int p = r.Attach();            // attaching reaps
  EXPECT_EQ(r.Usage()[0].used, 0u);
  EXPECT_TRUE(r.Admit(p, 0, 1000));
}

// Issue 24 item 6: where /proc cannot be read (nested PID namespaces, Apptainer) the pid and start
// time say nothing, so a dead owner's slot was kept until all 1,024 were taken. Each owner holds a
// lock on its slot that the kernel drops with its last descriptor: a killed owner (a zombie here:
// kill(pid, 0) still succeeds) is reaped, a live one is kept, with /proc hidden.
TEST_F(RegionTest, WithProcUnreadableTheSlotLockTellsLiveFromDead) {
  Make({{"GPU-a", 1000, 0}});
  const pid_t killed = StartHolder(300);
  const pid_t alive = StartHolder(200);
  ASSERT_EQ(::kill(killed, SIGKILL), 0);
  // Its descriptors are closed by the time it is a zombie; wait for that without reaping it.
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(killed), &info, WEXITED | WNOWAIT), 0);

  const std::string hidden = dir_ + "/no-proc";
  std::filesystem::create_directories(hidden);
  SetProcRootForTesting(hidden.c_str());
  Region r;
  OpenWithLimits(r);
  EXPECT_EQ(r.Usage()[0].used, 500u);
  EXPECT_EQ(r.Reap(), 1);  // the killed owner's 300 bytes go; the live one's 200 stay
  EXPECT_EQ(r.Usage()[0].used, 200u);
  const int p = r.Attach();
  ASSERT_GE(p, 0);
  EXPECT_EQ(r.Reap(), 0);  // our own slot and the live child's: both locked, both kept
  EXPECT_EQ(r.Usage()[0].used, 200u);
  SetProcRootForTesting("/proc");

  LetGo();
  int status = 0;
  EXPECT_EQ(::waitpid(alive, &status, 0), alive);
  EXPECT_EQ(::waitpid(killed, &status, 0), killed);
}

TEST_F(RegionTest, AReusedPidIsNotTheOwner) {
  Make({{"GPU-a", 1000, 0}});
  Region r;
  OpenWithLimits(r);
  const int p = r.Attach();
  ASSERT_TRUE(r.Admit(p, 0, 500));
  const uint64_t start = ProcessStartTime(::getpid());
  EXPECT_TRUE(OwnerAlive(::getpid(), start));
  EXPECT_FALSE(OwnerAlive(::getpid(), start + 1));
  // A slot holding 300 bytes under our own pid with another start time: what a slot looks like
  // after its owner died and the pid went to a new process (us). Written into the file directly.
  {
    std::fstream f(dir_ + "/memory.region", std::ios::in | std::ios::out | std::ios::binary);
    const int q = p == 0 ? 1 : 0;
    const auto slot =
        static_cast<std::streamoff>(offsetof(RegionLayout, processes) + q * sizeof(ProcessSlot));
    const uint32_t live = kSlotLive;
    const int32_t pid = ::getpid();
    const uint64_t other_start = start + 1, held = 300;
    f.seekp(slot + static_cast<std::streamoff>(offsetof(ProcessSlot, state)));
    f.write(reinterpret_cast<const char*>(&live), sizeof live);
    f.seekp(slot + static_cast<std::streamoff>(offsetof(ProcessSlot, pid)));
    f.write(reinterpret_cast<const char*>(&pid), sizeof pid);
    f.seekp(slot + static_cast<std::streamoff>(offsetof(ProcessSlot, start_time)));
    f.write(reinterpret_cast<const char*>(&other_start), sizeof other_start);
    f.seekp(slot + static_cast<std::streamoff>(offsetof(ProcessSlot, used)));
    f.write(reinterpret_cast<const char*>(&held), sizeof held);
  }
  // The reused pid's slot is reaped (its 300 bytes go), ours (the pid's real owner) stays.
  EXPECT_EQ(r.Reap(), 1);
  EXPECT_EQ(r.Usage().at(0).used, 500u);
  EXPECT_TRUE(r.Admit(p, 0, 500));
  EXPECT_EQ(r.Reap(), 0);
}

// Issue 24 item 6: exec keeps pid and start time, so the slot of the image before exec looks
// alive; the new image frees it before it attaches.
TEST_F(RegionTest, AnEarlierImageOfThisProcessIsReleased) {
  Make({{"GPU-a", 1000, 0}});
  int slot = -1;
  {
    Region before_exec;
    OpenWithLimits(before_exec);
    slot = before_exec.Attach();
    ASSERT_TRUE(before_exec.Admit(slot, 0, 700));
  }  // exec closes the image's descriptors (O_CLOEXEC), its slot lock with them
  {
    // A filesystem without OFD locks: the slot never had one, so only pid and start time speak.
    std::fstream f(dir_ + "/memory.region", std::ios::in | std::ios::out | std::ios::binary);
    const uint32_t zero = 0;
    f.seekp(static_cast<std::streamoff>(offsetof(RegionLayout, processes) +
                                        static_cast<size_t>(slot) * sizeof(ProcessSlot) +
                                        offsetof(ProcessSlot, locked)));
    f.write(reinterpret_cast<const char*>(&zero), sizeof zero);
  }
  Region after_exec;
  OpenWithLimits(after_exec);
  EXPECT_EQ(after_exec.Reap(), 0);  // same pid, same start time: alive as far as /proc can tell
  EXPECT_EQ(after_exec.ReleaseEarlierImages(), 1);
  EXPECT_EQ(after_exec.Usage().at(0).used, 0u);
  EXPECT_TRUE(after_exec.Admit(after_exec.Attach(), 0, 1000));
}

// Issue 36 item 4: two processes in sibling PID namespaces can both be pid 1 with the same start
// tick. The step that releases an earlier image's slot must leave a slot whose lock is held: a
// slot is live while its lock is held, whatever its numbers say. (Here the other process's slot
// is given this process's pid and start time, which is what a sibling namespace looks like.)
TEST_F(RegionTest, ASlotWhoseLockIsHeldIsNeverTakenForAnEarlierImage) {
  Make({{"GPU-a", 1000, 0}});
  int slot = -1;
  const pid_t child = StartHolder(600, &slot);
  ASSERT_GE(slot, 0);
  {
    // The sibling's numbers: this process's pid and start time.
    std::fstream f(dir_ + "/memory.region", std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(offsetof(RegionLayout, processes) +
                                                static_cast<size_t>(slot) * sizeof(ProcessSlot));
    const int32_t pid = ::getpid();
    const uint64_t start = ProcessStartTime(::getpid());
    f.seekp(at + static_cast<std::streamoff>(offsetof(ProcessSlot, pid)));
    f.write(reinterpret_cast<const char*>(&pid), sizeof pid);
    f.seekp(at + static_cast<std::streamoff>(offsetof(ProcessSlot, start_time)));
    f.write(reinterpret_cast<const char*>(&start), sizeof start);
    // Even with the tenant-written `locked` hint cleared, the kernel's lock decides.
    const uint32_t zero = 0;
    f.seekp(at + static_cast<std::streamoff>(offsetof(ProcessSlot, locked)));
    f.write(reinterpret_cast<const char*>(&zero), sizeof zero);
  }
  Region r;
  OpenWithLimits(r);
  EXPECT_EQ(r.ReleaseEarlierImages(), 0);
  EXPECT_EQ(r.Usage().at(0).used, 600u);
  const int p = r.Attach();
  ASSERT_GE(p, 0);
  EXPECT_FALSE(r.Admit(p, 0, 401));  // the sibling's 600 still count
  EXPECT_TRUE(r.Admit(p, 0, 400));
  LetGo();
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// Issue 36 item 7: a process that closes its own region descriptors (its slot lock among them)
// is still alive and may still hold driver memory: its share stays until it exits.
TEST_F(RegionTest, AProcessThatClosedItsSlotLockStaysChargedWhileItLives) {
  Make({{"GPU-a", 1000, 0}});
  const pid_t child = StartHolder(600, nullptr, [this] {
    for (int fd = 3; fd < 1024; ++fd) {  // everything but the two pipe ends it still uses
      if (fd != go_[0] && fd != ready_[1]) ::close(fd);
    }
  });
  Region r;
  OpenWithLimits(r);
  const int p = r.Attach();  // attaching reaps
  ASSERT_GE(p, 0);
  EXPECT_EQ(r.Usage().at(0).used, 600u);
  EXPECT_FALSE(r.Admit(p, 0, 401));
  LetGo();
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(r.Reap(), 1);  // gone now
  EXPECT_TRUE(r.Admit(p, 0, 1000));
}

// Issue 36 item 7: the driver's device files left open across exec are found by their path.
TEST_F(RegionTest, DescriptorsOpenUnderAPrefixAreFound) {
  const std::string devices = dir_ + "/dev-nvidia";
  std::ofstream(devices + "0") << "x";
  EXPECT_FALSE(DescriptorsOpenUnder(devices.c_str()));
  const int fd = ::open((devices + "0").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(DescriptorsOpenUnder(devices.c_str()));
  ::close(fd);
  EXPECT_FALSE(DescriptorsOpenUnder(devices.c_str()));
}

// Issue 36 item 3: which driver library the interposer calls is the node's decision, carried in
// the agent's limits file (version 2). Without one the file is version 1, byte for byte as before.
TEST_F(RegionTest, TheLimitsFileCarriesTheNodesDriverPath) {
  ASSERT_EQ(WriteLimitsFile(limits(), {{"GPU-a", 5, 0}}), "");
  EXPECT_EQ(std::filesystem::file_size(limits()), sizeof(LimitsFile));
  LimitsFile f{};
  LimitsDriver d{};
  ASSERT_EQ(ReadLimitsFile(limits(), &f, &d), "");
  EXPECT_EQ(f.version, kLimitsVersionNoDriver);
  EXPECT_STREQ(d.path, "");

  ASSERT_EQ(WriteLimitsFile(limits(), {{"GPU-a", 5, 0}}, false, "/opt/nvidia/libcuda.so.1"), "");
  EXPECT_EQ(std::filesystem::file_size(limits()), kLimitsFileV2Bytes);
  ASSERT_EQ(ReadLimitsFile(limits(), &f, &d), "");
  EXPECT_EQ(f.version, kLimitsVersion);
  EXPECT_STREQ(d.path, "/opt/nvidia/libcuda.so.1");
  Region r;
  ASSERT_EQ(r.LoadLimits(limits()), "");
  EXPECT_STREQ(r.driver_path(), "/opt/nvidia/libcuda.so.1");

  // A relative path would be searched (LD_LIBRARY_PATH): refused by the writer and the reader.
  EXPECT_NE(WriteLimitsFile(limits(), {{"GPU-a", 5, 0}}, false, "libcuda.so.1"), "");
  {
    std::fstream file(limits(), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(sizeof(LimitsFile)));
    file.write("libcuda.so.1", 13);
  }
  EXPECT_NE(ReadLimitsFile(limits(), &f, &d).find("driver_path"), std::string::npos);
}

// Issue 23 item 6: the limit is not the tenant's. A tenant that rewrites its writable region —
// the version-1 limit field, the UUIDs, gpu_count — changes no limit of a process that loaded the
// limits file, and a process that starts afterwards still gets the file's limit.
TEST_F(RegionTest, TheLimitSurvivesATenantRewritingItsRegion) {
  Make({{"GPU-a", 1000, 0}});
  Region r;
  OpenWithLimits(r);
  const int p = r.Attach();
  ASSERT_TRUE(r.Admit(p, 0, 900));
  {
    std::fstream f(dir_ + "/memory.region", std::ios::in | std::ios::out | std::ios::binary);
    const uint64_t huge = UINT64_MAX / 2;
    f.seekp(static_cast<std::streamoff>(offsetof(RegionLayout, gpus) +
                                        offsetof(GpuSlot, unused_limit)));
    f.write(reinterpret_cast<const char*>(&huge), sizeof huge);
    const uint32_t many = 0xFFFFFFFF;  // gpu_count: every index past the slots
    f.seekp(static_cast<std::streamoff>(offsetof(RegionHeader, gpu_count)));
    f.write(reinterpret_cast<const char*>(&many), sizeof many);
    f.seekp(static_cast<std::streamoff>(offsetof(RegionLayout, gpus) + sizeof(GpuSlot)));
    f.write("GPU-evil", 9);  // a second "GPU" of its own
  }
  EXPECT_FALSE(r.Admit(p, 0, 200));
  EXPECT_EQ(r.limit(0), 1000u);
  EXPECT_EQ(r.gpu_count(), 1u);
  EXPECT_EQ(r.FindGpu("GPU-evil"), -1);
  EXPECT_FALSE(r.Admit(p, 1, 1));
  EXPECT_FALSE(r.Admit(p, 7, 1));
  Region later;
  OpenWithLimits(later);
  const int q = later.Attach();
  EXPECT_FALSE(later.Admit(q, 0, 200));
  EXPECT_TRUE(later.Admit(q, 0, 100));
  EXPECT_FALSE(later.passthrough());
  // Without the limits file nothing at all is admitted (the region's own fields count for nothing).
  Region bare;
  ASSERT_EQ(bare.Open(dir_), "");
  EXPECT_FALSE(bare.Admit(bare.Attach(), 0, 1));
}

TEST_F(RegionTest, LimitsFileIsCheckedAndNeverFollowedOrWaitedOn) {
  ASSERT_EQ(WriteLimitsFile(limits(), {{"GPU-a", 5, 0}}, /*passthrough=*/true), "");
  struct stat st {};
  ASSERT_EQ(::stat(limits().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  LimitsFile f{};
  ASSERT_EQ(ReadLimitsFile(limits(), &f), "");
  EXPECT_EQ(f.gpu_count, 1u);
  EXPECT_EQ(f.flags & kLimitsPassthrough, kLimitsPassthrough);
  std::filesystem::rename(limits(), dir_ + "/real");
  std::filesystem::create_symlink(dir_ + "/real", limits());
  EXPECT_NE(ReadLimitsFile(limits(), &f), "");
  std::filesystem::remove(limits());
  ASSERT_EQ(::mkfifo(limits().c_str(), 0644), 0);
  const std::string err = ReadLimitsFile(limits(), &f);
  EXPECT_NE(err.find("not a gpulet limits file"), std::string::npos) << err;
  std::filesystem::remove(limits());
  {
    LimitsFile bad{};
    std::memcpy(bad.magic, kLimitsMagic, sizeof bad.magic);
    bad.version = kLimitsVersionNoDriver;
    bad.file_bytes = sizeof bad;
    bad.gpu_count = kMaxGpus + 1;
    std::ofstream(limits(), std::ios::binary)
        .write(reinterpret_cast<const char*>(&bad), sizeof bad);
  }
  EXPECT_NE(ReadLimitsFile(limits(), &f).find("gpu_count"), std::string::npos);
}

// Issue 23 item 5: a reader validates a copy; a gpu_count past the slots, a UUID without its NUL
// or a wrong size is an error, and nothing is read past the copy.
TEST_F(RegionTest, ParseRegionCopyValidatesEveryField) {
  ASSERT_EQ(CreateRegion(dir_, {{"GPU-a", 1000, 0}, {"GPU-b", 50, 0}}), "");
  std::vector<unsigned char> bytes(kRegionPrefixBytes);
  {
    std::ifstream in(dir_ + "/memory.region", std::ios::binary);
    in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  std::vector<GpuUsage> out;
  ASSERT_EQ(ParseRegionCopy(bytes.data(), bytes.size(), sizeof(RegionLayout), &out), "");
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].uuid, "GPU-b");
  EXPECT_NE(ParseRegionCopy(bytes.data(), bytes.size(), 100, &out), "");
  EXPECT_TRUE(out.empty());
  auto with = [&](size_t offset, const void* v, size_t n) {
    std::vector<unsigned char> b = bytes;
    std::memcpy(b.data() + offset, v, n);
    return ParseRegionCopy(b.data(), b.size(), sizeof(RegionLayout), &out);
  };
  const uint32_t many = kMaxGpus + 1;
  EXPECT_NE(with(offsetof(RegionHeader, gpu_count), &many, sizeof many).find("gpu_count"),
            std::string::npos);
  const std::string no_nul(kUuidBytes, '\xff');
  EXPECT_NE(with(offsetof(RegionLayout, gpus), no_nul.data(), no_nul.size()).find("uuid"),
            std::string::npos);
  EXPECT_NE(ParseRegionCopy(bytes.data(), 10, sizeof(RegionLayout), &out), "");
}

TEST(RegionLiveness, ZombiesAndMissingProcessesAreDead) {
  EXPECT_FALSE(OwnerAlive(0, 0));
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  // Wait for its exit without reaping it (WNOWAIT): it stays a zombie, its /proc entry says Z.
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT), 0);
  bool zombie = false;
  ProcessStartTime(child, &zombie);
  ASSERT_TRUE(zombie);
  EXPECT_FALSE(OwnerAlive(child, ProcessStartTime(child)));
  ::waitpid(child, nullptr, 0);
  EXPECT_FALSE(OwnerAlive(child, 0));
}

}  // namespace
}  // namespace gpulet::cudashim
