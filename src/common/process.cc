#include "common/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

extern char** environ;

namespace gpulet {
namespace {

using std::chrono::milliseconds;

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Reset(); }
  void Reset() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

std::string Errno(int err) { return std::strerror(err); }

std::vector<char*> CStrings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  out.reserve(v.size() + 1);
  for (const std::string& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// Spawn attributes for a clean child: default dispositions for every signal and an empty mask.
struct CleanAttr {
  posix_spawnattr_t attr;
  CleanAttr() {
    posix_spawnattr_init(&attr);
    sigset_t all, none;
    sigfillset(&all);
    sigemptyset(&none);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  }
  ~CleanAttr() { posix_spawnattr_destroy(&attr); }
};

struct Actions {
  posix_spawn_file_actions_t a;
  Actions() { posix_spawn_file_actions_init(&a); }
  ~Actions() { posix_spawn_file_actions_destroy(&a); }
};

Result<pid_t> Spawn(const std::vector<std::string>& argv,
                    const std::optional<std::vector<std::string>>& env, Actions& actions) {
  if (argv.empty()) return Status(ErrorCode::kInternal, "empty command line");
  posix_spawn_file_actions_addclosefrom_np(&actions.a, 3);
  CleanAttr attr;
  std::vector<char*> args = CStrings(argv);
  std::vector<char*> envp;
  if (env) envp = CStrings(*env);
  char** e = env ? envp.data() : environ;
  pid_t pid = -1;
  const int rc = argv[0].find('/') == std::string::npos
                     ? posix_spawnp(&pid, argv[0].c_str(), &actions.a, &attr.attr, args.data(), e)
                     : posix_spawn(&pid, argv[0].c_str(), &actions.a, &attr.attr, args.data(), e);
  if (rc == ENOENT) {
    return Status(ErrorCode::kNotFound,
                  argv[0] + ": command not found (is it installed and on PATH?)");
  }
  if (rc != 0) return Status(ErrorCode::kInternal, argv[0] + ": cannot start: " + Errno(rc));
  return pid;
}

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

void KillAndReap(pid_t pid) {
  ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
}

class RealRunner final : public ProcessRunner {
 public:
  Result<CommandOutput> Run(const CommandSpec& spec) const override { return RunCommand(spec); }
};

}  // namespace

Result<CommandOutput> RunCommand(const CommandSpec& spec) {
  if (spec.argv.empty()) return Status(ErrorCode::kInternal, "empty command line");
  const std::string& name = spec.argv[0];
  // stdin from a memfd holding all of it: nothing to write while reading, so no deadlock, no
  // SIGPIPE.
  Fd input(::memfd_create("gpulet-stdin", MFD_CLOEXEC));
  if (input.fd < 0) return Status(ErrorCode::kInternal, "memfd_create: " + Errno(errno));
  if (!spec.stdin_data.empty()) {
    size_t done = 0;
    while (done < spec.stdin_data.size()) {
      const ssize_t n =
          ::write(input.fd, spec.stdin_data.data() + done, spec.stdin_data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Status(ErrorCode::kInternal, "memfd write: " + Errno(errno));
      done += static_cast<size_t>(n);
    }
    ::lseek(input.fd, 0, SEEK_SET);
  }
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return Status(ErrorCode::kInternal, "pipe: " + Errno(errno));
  Fd out_r(p[0]), out_w(p[1]);
  if (::pipe2(p, O_CLOEXEC) != 0) return Status(ErrorCode::kInternal, "pipe: " + Errno(errno));
  Fd err_r(p[0]), err_w(p[1]);

  Actions actions;
  posix_spawn_file_actions_adddup2(&actions.a, input.fd, 0);
  posix_spawn_file_actions_adddup2(&actions.a, out_w.fd, 1);
  posix_spawn_file_actions_adddup2(&actions.a, spec.merge_stderr ? out_w.fd : err_w.fd, 2);
  Result<pid_t> spawned = Spawn(spec.argv, spec.env, actions);
  if (!spawned.ok()) return spawned.status();
  const pid_t pid = *spawned;
  out_w.Reset();
  err_w.Reset();
  input.Reset();

  CommandOutput result;
  auto take = [&](std::string& into, const char* buf, size_t n) {
    const size_t room = spec.max_output > into.size() ? spec.max_output - into.size() : 0;
    into.append(buf, std::min(room, n));
    if (n > room) result.truncated = true;
  };
  const auto deadline = std::chrono::steady_clock::now() + spec.timeout;
  int status = 0;
  bool exited = false;
  for (;;) {
    if (!exited) {
      const pid_t w = ::waitpid(pid, &status, WNOHANG);
      if (w == pid) exited = true;
    }
    const bool streams_open = out_r.fd >= 0 || err_r.fd >= 0;
    if (exited && (!streams_open || !spec.wait_for_eof)) {
      // Drain what is already buffered, without waiting for a grandchild to close the pipe.
      if (!spec.wait_for_eof) {
        for (Fd* f : {&out_r, &err_r}) {
          if (f->fd < 0) continue;
          ::fcntl(f->fd, F_SETFL, O_NONBLOCK);
          char buf[4096];
          ssize_t n;
          while ((n = ::read(f->fd, buf, sizeof buf)) > 0) {
            take(f == &out_r ? result.out : result.err, buf, static_cast<size_t>(n));
          }
        }
      }
      break;
    }
    const auto left =
        std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      if (!exited) KillAndReap(pid);
      return Status(ErrorCode::kUnavailable,
                    name + ": no answer within " + std::to_string(spec.timeout.count()) + " ms");
    }
    pollfd fds[2] = {{out_r.fd, POLLIN, 0}, {err_r.fd, POLLIN, 0}};
    // Without open streams, or when only the exit matters, poll briefly and re-check the child.
    const int wait_ms = static_cast<int>(std::min<int64_t>(
        left.count(), (!streams_open || !spec.wait_for_eof || exited) ? 10 : 200));
    const int n = ::poll(fds, 2, wait_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      if (!exited) KillAndReap(pid);
      return Status(ErrorCode::kInternal, name + ": reading its output failed: " + Errno(err));
    }
    for (int i = 0; i < 2; ++i) {
      Fd& f = i == 0 ? out_r : err_r;
      if (f.fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL))) continue;
      char buf[4096];
      const ssize_t got = ::read(f.fd, buf, sizeof buf);
      if (got > 0) {
        take(i == 0 ? result.out : result.err, buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        f.Reset();
      }
    }
  }
  result.exit_code = ExitCodeOf(status);
  return result;
}

const ProcessRunner& ProcessRunner::Real() {
  static const RealRunner* runner = new RealRunner();
  return *runner;
}

Result<pid_t> SpawnProcess(const std::vector<std::string>& argv,
                           const std::optional<std::vector<std::string>>& env,
                           const std::string& log_path) {
  Actions actions;
  posix_spawn_file_actions_addopen(&actions.a, 0, "/dev/null", O_RDONLY, 0);
  const std::string out = log_path.empty() ? "/dev/null" : log_path;
  posix_spawn_file_actions_addopen(&actions.a, 1, out.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0640);
  posix_spawn_file_actions_adddup2(&actions.a, 1, 2);
  return Spawn(argv, env, actions);
}

bool ProcessAlive(pid_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos || paren + 2 >= text.size()) return ::kill(pid, 0) == 0;
  const char state = text[paren + 2];
  return state != 'Z' && state != 'X' && state != 'x';
}

bool StopProcess(pid_t pid, milliseconds grace, Clock& clock) {
  if (pid <= 0) return true;
  auto gone = [pid] {
    int status = 0;
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) return true;                                // our child, reaped
    if (w < 0 && errno == ECHILD) return !ProcessAlive(pid);  // not our child
    return false;
  };
  auto wait_gone = [&] {
    StopSignal never;
    const auto deadline = clock.Now() + grace;
    milliseconds step{1};
    while (!gone()) {
      if (clock.Now() >= deadline) return false;
      clock.SleepFor(step, never);
      step = std::min(step * 2, milliseconds(50));
    }
    return true;
  };
  if (gone()) return true;
  ::kill(pid, SIGTERM);
  if (wait_gone()) return true;
  ::kill(pid, SIGKILL);
  return wait_gone();
}

}  // namespace gpulet
