// The nvidia-cuda-mps-control stand-in for tests; kHelp below is its description (it is what
// `-h` prints). Plain C and libc, linked statically, so that it runs in any image: the real-cluster
// tier copies it into gpulet's container image, which has no Python (the stand-in was Python).
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char** environ;

static const char kHelp[] =
    "A stand-in for NVIDIA's nvidia-cuda-mps-control, for tests. No GPU, no MPS server.\n"
    "\n"
    "It behaves like the real control program on the parts gpulet uses:\n"
    "\n"
    "  nvidia-cuda-mps-control -d   start the control daemon in the background and return once it\n"
    "                               answers: control fifo, lock and pid file in\n"
    "                               $CUDA_MPS_PIPE_DIRECTORY, control.log in "
    "$CUDA_MPS_LOG_DIRECTORY.\n"
    "                               Exits 1 when a daemon already runs on that pipe directory.\n"
    "  nvidia-cuda-mps-control      client: sends each line of stdin to the daemon, prints each "
    "reply.\n"
    "                               Exits 1 when no daemon is running.\n"
    "\n"
    "Protocol (ours; the real one is private): the daemon reads requests from the fifo\n"
    "<pipe>/control, each one line \"<reply fifo path> <command>\" written in one write() (so\n"
    "concurrent clients never interleave: a write of at most PIPE_BUF bytes to a fifo is atomic).\n"
    "The client creates the reply fifo and holds it open for reading before sending; the daemon\n"
    "opens it with O_NONBLOCK (a client that died is skipped, not waited for), writes the reply and\n"
    "closes it, which is the client's end-of-reply.\n"
    "\n"
    "What tests read: control.log holds one line per event:\n"
    "  START pid=<pid> CUDA_VISIBLE_DEVICES=<value> ENV=<sorted names of the daemon's environment>\n"
    "  CMD <command>                       (every command received, in order)\n"
    "  QUIT\n"
    "  TERM                                (SIGTERM received; the daemon exits)\n"
    "The test-only command `debug_hang` makes the daemon stop answering while it stays alive and\n"
    "still honours SIGTERM (a hung daemon that a polite stop can end).\n"
    "Tests simulate a crash with SIGKILL on the pid in nvidia-cuda-mps-control.pid and a hung "
    "daemon\n"
    "with SIGSTOP (clients then wait for an answer that never comes, as with the real one).\n";

static const char kProgram[] = "nvidia-cuda-mps-control";
enum { kPipeBuf = 4096 };
// A request longer than this is dropped unread by the daemon: clients write at most kPipeBuf.
enum { kMaxRequest = 64 * 1024 };
enum { kReadChunk = 64 * 1024 };

// A byte string that may hold NULs (a request is bytes from whoever can write the fifo).
typedef struct {
  const char* data;
  size_t size;
} Bytes;

typedef struct {
  char* control;   // <pipe>/control: the request fifo
  char* lock;      // <pipe>/control_lock: flock'ed by the daemon for its whole life
  char* pid_file;  // <pipe>/nvidia-cuda-mps-control.pid
  char* log_file;  // <log>/control.log
  const char* pipe_dir;
  const char* log_dir;
} Paths;

static void* Allocate(size_t n) {
  void* p = malloc(n == 0 ? 1 : n);
  if (p == NULL) {
    fprintf(stderr, "%s: out of memory\n", kProgram);
    exit(1);
  }
  return p;
}

static char* CopyString(const char* s, size_t n) {
  char* out = Allocate(n + 1);
  memcpy(out, s, n);
  out[n] = '\0';
  return out;
}

// dir + "/" + name, without doubling a trailing slash of dir.
static char* Join(const char* dir, const char* name) {
  const size_t d = strlen(dir);
  const size_t n = strlen(name);
  const bool slash = d > 0 && dir[d - 1] != '/';
  char* out = Allocate(d + slash + n + 1);
  memcpy(out, dir, d);
  if (slash) out[d] = '/';
  memcpy(out + d + slash, name, n + 1);
  return out;
}

static const char* EnvOr(const char* name, const char* fallback) {
  const char* v = getenv(name);
  return v != NULL && *v != '\0' ? v : fallback;
}

static Paths PathsFromEnvironment(void) {
  Paths p;
  p.pipe_dir = EnvOr("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps");
  p.log_dir = EnvOr("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps");
  p.control = Join(p.pipe_dir, "control");
  p.lock = Join(p.pipe_dir, "control_lock");
  p.pid_file = Join(p.pipe_dir, "nvidia-cuda-mps-control.pid");
  p.log_file = Join(p.log_dir, "control.log");
  return p;
}

static bool WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= (size_t)n;
  }
  return true;
}

// Appends "[<unix time>] <text>\n" to control.log. O_APPEND and one write per line: lines from
// concurrent writers never interleave.
static bool LogLine(const Paths* p, const char* text, size_t size) {
  const int fd = open(p->log_file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  const int64_t ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
  char stamp[64];
  const int s = snprintf(stamp, sizeof stamp, "[%.3f] ", (double)ns / 1e9);
  char* line = Allocate((size_t)s + size + 1);
  memcpy(line, stamp, (size_t)s);
  memcpy(line + s, text, size);
  line[(size_t)s + size] = '\n';
  const ssize_t n = write(fd, line, (size_t)s + size + 1);
  free(line);
  close(fd);
  return n >= 0;
}

static bool LogText(const Paths* p, const char* text) { return LogLine(p, text, strlen(text)); }

// Python's str.strip()/split() whitespace, ASCII part.
static bool IsSpace(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f');
}

static Bytes Strip(Bytes b) {
  while (b.size > 0 && IsSpace(b.data[0])) ++b.data, --b.size;
  while (b.size > 0 && IsSpace(b.data[b.size - 1])) --b.size;
  return b;
}

static bool SameBytes(Bytes a, Bytes b) {
  return a.size == b.size && memcmp(a.data, b.data, a.size) == 0;
}

static bool Equals(Bytes b, const char* s) { return SameBytes(b, (Bytes){s, strlen(s)}); }

static Bytes Copy(Bytes b) { return (Bytes){CopyString(b.data, b.size), b.size}; }

// prefix + rest, in *size bytes (not NUL-terminated).
static char* Concat(const char* prefix, Bytes rest, size_t* size) {
  const size_t n = strlen(prefix);
  char* out = Allocate(n + rest.size);
  memcpy(out, prefix, n);
  memcpy(out + n, rest.data, rest.size);
  *size = n + rest.size;
  return out;
}

// ---------------------------------------------------------------------------------------------
// The daemon.

typedef struct {
  Bytes device;  // both owned (CopyString)
  Bytes limit;
} PinnedLimit;

typedef struct {
  char thread_percentage[32];
  PinnedLimit* pinned;  // device index (as given) -> limit (as given)
  size_t pinned_count;
  size_t pinned_capacity;
  bool running;
} DaemonState;

// Python's float() grammar (decimal, '_' between digits, inf/nan), no hexadecimal.
static bool ParseFloat(Bytes s, double* out) {
  char* clean = Allocate(s.size + 1);
  size_t n = 0;
  size_t i = 0;
  bool ok = true;
  if (i < s.size && (s.data[i] == '+' || s.data[i] == '-')) clean[n++] = s.data[i++];
  const char* word = s.data + i;
  const size_t word_size = s.size - i;
  if ((word_size == 3 && (strncasecmp(word, "inf", 3) == 0 || strncasecmp(word, "nan", 3) == 0)) ||
      (word_size == 8 && strncasecmp(word, "infinity", 8) == 0)) {
    memcpy(clean + n, word, word_size);
    n += word_size;
    i = s.size;
  } else {
    // digits ("_"? digit)* for the integer part, the fraction and the exponent.
    size_t digits = 0;
    bool after_digit = false;
    int part = 0;  // 0: integer, 1: fraction, 2: exponent
    size_t exponent_digits = 0;
    for (; i < s.size && ok; ++i) {
      const char c = s.data[i];
      if (c >= '0' && c <= '9') {
        clean[n++] = c;
        after_digit = true;
        if (part == 2) {
          ++exponent_digits;
        } else {
          ++digits;
        }
      } else if (c == '_') {
        ok = after_digit && i + 1 < s.size && s.data[i + 1] >= '0' && s.data[i + 1] <= '9';
      } else if (c == '.' && part == 0) {
        part = 1;
        after_digit = false;
        clean[n++] = c;
      } else if ((c == 'e' || c == 'E') && part < 2 && digits > 0) {
        part = 2;
        after_digit = false;
        clean[n++] = c;
        if (i + 1 < s.size && (s.data[i + 1] == '+' || s.data[i + 1] == '-')) {
          clean[n++] = s.data[++i];
        }
      } else {
        ok = false;
      }
    }
    ok = ok && digits > 0 && (part < 2 || exponent_digits > 0);
  }
  clean[n] = '\0';
  if (ok) {
    char* end = NULL;
    *out = strtod(clean, &end);
    ok = end == clean + n;
  }
  free(clean);
  return ok;
}

static const Bytes* PinnedGet(const DaemonState* st, Bytes device) {
  for (size_t i = 0; i < st->pinned_count; ++i) {
    if (SameBytes(device, st->pinned[i].device)) return &st->pinned[i].limit;
  }
  return NULL;
}

static void PinnedSet(DaemonState* st, Bytes device, Bytes limit) {
  for (size_t i = 0; i < st->pinned_count; ++i) {
    if (SameBytes(device, st->pinned[i].device)) {
      free((char*)st->pinned[i].limit.data);
      st->pinned[i].limit = Copy(limit);
      return;
    }
  }
  if (st->pinned_count == st->pinned_capacity) {
    st->pinned_capacity = st->pinned_capacity == 0 ? 8 : st->pinned_capacity * 2;
    PinnedLimit* grown = realloc(st->pinned, st->pinned_capacity * sizeof *grown);
    if (grown == NULL) exit(1);
    st->pinned = grown;
  }
  st->pinned[st->pinned_count].device = Copy(device);
  st->pinned[st->pinned_count].limit = Copy(limit);
  ++st->pinned_count;
}

enum { kMaxWords = 4 };  // no command takes more than 2 arguments; more is "unrecognized"

// The answer to one (stripped) command, without its newline; "" for none. Returns a malloc'ed
// string of *size bytes.
static char* Handle(DaemonState* st, Bytes command, size_t* size) {
  Bytes words[kMaxWords];
  size_t count = 0;
  for (size_t i = 0; i < command.size;) {
    while (i < command.size && IsSpace(command.data[i])) ++i;
    if (i == command.size) break;
    const size_t start = i;
    while (i < command.size && !IsSpace(command.data[i])) ++i;
    if (count < kMaxWords) words[count] = (Bytes){command.data + start, i - start};
    ++count;
  }
  Bytes answer = {"", 0};  // the answer of a blank command, a setter, get_server_list and quit
  if (count == 0) {
  } else if (Equals(words[0], "set_default_active_thread_percentage") && count == 2) {
    double value = 0;
    if (!ParseFloat(words[1], &value) || !(value > 0 && value <= 100)) {
      return Concat("Invalid thread percentage: ", words[1], size);
    }
    snprintf(st->thread_percentage, sizeof st->thread_percentage, "%.1f", value);
    answer = (Bytes){st->thread_percentage, strlen(st->thread_percentage)};
  } else if (Equals(words[0], "get_default_active_thread_percentage") && count == 1) {
    answer = (Bytes){st->thread_percentage, strlen(st->thread_percentage)};
  } else if (Equals(words[0], "set_default_device_pinned_mem_limit") && count == 3) {
    PinnedSet(st, words[1], words[2]);
  } else if (Equals(words[0], "get_default_device_pinned_mem_limit") && count == 2) {
    const Bytes* limit = PinnedGet(st, words[1]);
    answer = limit != NULL ? *limit : (Bytes){"0", 1};
  } else if (Equals(words[0], "get_server_list") && count == 1) {
  } else if (Equals(words[0], "quit") && count == 1) {
    st->running = false;
  } else {
    return Concat("Unrecognized command: ", command, size);
  }
  *size = answer.size;
  return CopyString(answer.data, answer.size);
}

// Writes the answer (and its newline, when there is one) to the client's reply fifo and closes
// it. A client that is gone (ENXIO: no reader; ENOENT: fifo removed) is skipped; anything but a
// fifo (a path in a request is whatever its writer chose) is never written to.
static void Reply(Bytes path, const char* text, size_t size) {
  if (memchr(path.data, '\0', path.size) != NULL) return;
  char* p = CopyString(path.data, path.size);
  const int fd = open(p, O_WRONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  free(p);
  if (fd < 0) return;
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode) && size > 0) {
    const int flags = fcntl(fd, F_GETFL);
    if (flags >= 0 && fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == 0) {
      char* data = Allocate(size + 1);
      memcpy(data, text, size);
      data[size] = '\n';
      (void)WriteAll(fd, data, size + 1);  // EPIPE: the client went away mid-reply
      free(data);
    }
  }
  close(fd);
}

static void Cleanup(const Paths* p) {
  unlink(p->pid_file);
  unlink(p->control);
}

// SIGTERM: log it (tests tell a polite stop from a SIGKILL by this line), clean up, exit.
static _Noreturn void Terminate(const Paths* p) {
  const bool logged = LogText(p, "TERM");
  Cleanup(p);
  _exit(logged ? 0 : 1);
}

static _Noreturn void WaitForTerm(int signal_fd, const Paths* p) {
  for (;;) {
    struct signalfd_siginfo info;
    ssize_t n = read(signal_fd, &info, sizeof info);
    if (n == (ssize_t)sizeof info && info.ssi_signo == SIGTERM) Terminate(p);
  }
}

// Handles complete lines of buf[0, *size); keeps the incomplete rest. False once `quit` came
// (the lines after it are dropped).
static bool ServeLines(DaemonState* st, const Paths* p, int signal_fd, char* buf, size_t* size) {
  size_t start = 0;
  while (st->running) {
    char* nl = memchr(buf + start, '\n', *size - start);
    if (nl == NULL) break;
    Bytes line = {buf + start, (size_t)(nl - (buf + start))};
    start = (size_t)(nl - buf) + 1;
    const char* space = memchr(line.data, ' ', line.size);
    Bytes reply_path = line;
    Bytes command = {line.data + line.size, 0};
    if (space != NULL) {
      reply_path.size = (size_t)(space - line.data);
      command = (Bytes){space + 1, line.size - reply_path.size - 1};
    }
    command = Strip(command);
    size_t logged_size = 0;
    char* logged = Concat("CMD ", command, &logged_size);
    const bool ok = LogLine(p, logged, logged_size);
    free(logged);
    if (!ok) {
      Cleanup(p);
      _exit(1);
    }
    if (Equals(command, "debug_hang")) WaitForTerm(signal_fd, p);  // alive, answering nothing
    size_t answer_size = 0;
    char* answer = Handle(st, command, &answer_size);
    Reply(reply_path, answer, answer_size);
    free(answer);
  }
  memmove(buf, buf + start, *size - start);
  *size -= start;
  return st->running;
}

static void Serve(const Paths* p, int control_fd, int signal_fd) {
  DaemonState st;
  memset(&st, 0, sizeof st);
  strcpy(st.thread_percentage, "100.0");
  st.running = true;
  char* buf = Allocate(kMaxRequest + kReadChunk);
  size_t size = 0;
  bool discarding = false;  // inside a request longer than kMaxRequest: dropped to its newline
  for (;;) {
    struct pollfd fds[2] = {{.fd = signal_fd, .events = POLLIN},
                            {.fd = control_fd, .events = POLLIN}};
    if (poll(fds, 2, -1) < 0) continue;  // EINTR
    if (fds[0].revents != 0) {
      struct signalfd_siginfo info;
      if (read(signal_fd, &info, sizeof info) == (ssize_t)sizeof info &&
          info.ssi_signo == SIGTERM) {
        Terminate(p);
      }
    }
    if (fds[1].revents == 0) continue;
    // Never sees EOF: the daemon holds the fifo open for writing too.
    ssize_t n = read(control_fd, buf + size, kReadChunk);
    if (n <= 0) continue;
    size += (size_t)n;
    if (discarding) {
      char* nl = memchr(buf, '\n', size);
      if (nl == NULL) {
        size = 0;
        continue;
      }
      discarding = false;
      size -= (size_t)(nl + 1 - buf);
      memmove(buf, nl + 1, size);
    }
    if (!ServeLines(&st, p, signal_fd, buf, &size)) break;
    if (size >= kMaxRequest) {
      size = 0;
      discarding = true;
    }
  }
  free(buf);
}

// mkdir -p: missing parents with mode 0777 (less the umask), the directory itself with `mode`;
// an existing directory is fine.
static bool MakeDirs(const char* path, mode_t mode) {
  char* copy = CopyString(path, strlen(path));
  size_t len = strlen(copy);
  while (len > 1 && copy[len - 1] == '/') copy[--len] = '\0';
  for (char* s = strchr(copy + 1, '/'); s != NULL; s = strchr(s + 1, '/')) {
    *s = '\0';
    struct stat st;
    if (stat(copy, &st) != 0 && mkdir(copy, 0777) != 0 && errno != EEXIST) {
      *s = '/';
      break;  // the final mkdir reports it
    }
    *s = '/';
  }
  bool ok = mkdir(copy, mode) == 0;
  if (!ok && errno == EEXIST) {
    struct stat st;
    ok = stat(copy, &st) == 0 && S_ISDIR(st.st_mode);
    if (!ok) errno = EEXIST;
  }
  if (!ok) fprintf(stderr, "%s: cannot create directory %s: %s\n", kProgram, path, strerror(errno));
  free(copy);
  return ok;
}

static int CompareNames(const void* a, const void* b) {
  return strcmp(*(const char* const*)a, *(const char* const*)b);
}

// "START pid=… CUDA_VISIBLE_DEVICES=… ENV=<sorted names>": the environment the daemon was
// executed with (nothing here changes it).
static bool LogStart(const Paths* p) {
  size_t count = 0;
  for (char** e = environ; *e != NULL; ++e) ++count;
  char** names = Allocate(count * sizeof *names);
  size_t total = 0;
  for (size_t i = 0; i < count; ++i) {
    const char* eq = strchr(environ[i], '=');
    names[i] = CopyString(environ[i], eq != NULL ? (size_t)(eq - environ[i]) : strlen(environ[i]));
    total += strlen(names[i]) + 1;
  }
  qsort(names, count, sizeof *names, CompareNames);
  const char* visible = getenv("CUDA_VISIBLE_DEVICES");
  if (visible == NULL) visible = "<unset>";
  char head[64];
  const int h = snprintf(head, sizeof head, "START pid=%d CUDA_VISIBLE_DEVICES=", (int)getpid());
  const size_t cap = (size_t)h + strlen(visible) + 5 + total + 1;
  char* line = Allocate(cap);
  size_t n = (size_t)snprintf(line, cap, "%s%s ENV=", head, visible);
  for (size_t i = 0; i < count; ++i) {
    n += (size_t)snprintf(line + n, cap - n, "%s%s", i == 0 ? "" : ",", names[i]);
    free(names[i]);
  }
  free(names);
  const bool ok = LogLine(p, line, n);
  free(line);
  return ok;
}

// The daemon proper (the grandchild): never returns. Tells the launcher "ok" on ready_w once it
// answers; dies without a word (the launcher then reads EOF) when it cannot start.
static _Noreturn void RunDaemon(const Paths* p, int ready_w) {
  const int devnull = open("/dev/null", O_RDWR);
  if (devnull >= 0) {
    for (int fd = 0; fd <= 2; ++fd) dup2(devnull, fd);
    if (devnull > 2) close(devnull);
  }
  if (chdir("/") != 0) _exit(1);
  if (unlink(p->control) != 0 && errno != ENOENT) _exit(1);  // left by a daemon that was killed
  if (mkfifo(p->control, 0622) != 0 || chmod(p->control, 0622) != 0) _exit(1);
  const int control_fd = open(p->control, O_RDWR | O_CLOEXEC);  // never blocks, never sees EOF
  if (control_fd < 0) _exit(1);
  char* tmp_path = Allocate(strlen(p->pid_file) + 5);
  sprintf(tmp_path, "%s.tmp", p->pid_file);
  const int pid_fd = open(tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  char pid_text[32];
  const int pid_len = snprintf(pid_text, sizeof pid_text, "%d\n", (int)getpid());
  if (pid_fd < 0 || !WriteAll(pid_fd, pid_text, (size_t)pid_len) || close(pid_fd) != 0 ||
      rename(tmp_path, p->pid_file) != 0) {
    _exit(1);
  }
  free(tmp_path);
  if (!LogStart(p)) _exit(1);
  // SIGTERM from here on is read from a signalfd, between requests (and during debug_hang).
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  sigprocmask(SIG_BLOCK, &term, NULL);
  const int signal_fd = signalfd(-1, &term, SFD_CLOEXEC);
  if (signal_fd < 0) _exit(1);
  (void)WriteAll(ready_w, "ok", 2);
  close(ready_w);
  Serve(p, control_fd, signal_fd);
  const bool logged = LogText(p, "QUIT");
  Cleanup(p);
  _exit(logged ? 0 : 1);
}

static int StartDaemon(const Paths* p) {
  if (!MakeDirs(p->pipe_dir, 0755) || !MakeDirs(p->log_dir, 0755)) return 1;
  const int lock_fd = open(p->lock, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (lock_fd < 0) {
    fprintf(stderr, "%s: %s: %s\n", kProgram, p->lock, strerror(errno));
    return 1;
  }
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    fprintf(stderr, "An instance of this daemon is already running\n");
    return 1;
  }
  int ready[2];
  if (pipe2(ready, O_CLOEXEC) != 0) {
    fprintf(stderr, "%s: pipe: %s\n", kProgram, strerror(errno));
    return 1;
  }
  fflush(NULL);
  const pid_t middle = fork();
  if (middle < 0) {
    fprintf(stderr, "%s: fork: %s\n", kProgram, strerror(errno));
    return 1;
  }
  if (middle != 0) {
    // The launcher: wait for the daemon to say it is ready (or to die), then return.
    close(ready[1]);
    close(lock_fd);
    while (waitpid(middle, NULL, 0) < 0 && errno == EINTR) {
    }
    char status[16];
    ssize_t n;
    do {
      n = read(ready[0], status, sizeof status);
    } while (n < 0 && errno == EINTR);
    return n == 2 && memcmp(status, "ok", 2) == 0 ? 0 : 1;
  }
  close(ready[0]);
  setsid();
  const pid_t daemon = fork();
  if (daemon != 0) _exit(daemon < 0 ? 1 : 0);  // the daemon is re-parented: nobody's to reap
  RunDaemon(p, ready[1]);  // keeps lock_fd (the flock) for its whole life
}

// ---------------------------------------------------------------------------------------------
// The client.

// One request; its reply goes to stdout as it comes. 0: answered; 1: no daemon is running;
// -1: failed (said on stderr).
static int Send(const Paths* p, Bytes command) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  char name[96];
  snprintf(name, sizeof name, "reply.%d.%lld", (int)getpid(),
           (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
  char* reply_path = Join(p->pipe_dir, name);
  int result = -1;
  if (mkfifo(reply_path, 0600) != 0) {
    fprintf(stderr, "%s: %s: %s\n", kProgram, reply_path, strerror(errno));
    free(reply_path);
    return -1;
  }
  const int reply_fd = open(reply_path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  int control_fd = -1;
  if (reply_fd < 0) {
    fprintf(stderr, "%s: %s: %s\n", kProgram, reply_path, strerror(errno));
    goto done;
  }
  control_fd = open(p->control, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (control_fd < 0) {
    if (errno == ENXIO || errno == ENOENT) {
      result = 1;  // no fifo, or nobody reading it: the daemon is dead
    } else {
      fprintf(stderr, "%s: %s: %s\n", kProgram, p->control, strerror(errno));
    }
    goto done;
  }
  const size_t path_size = strlen(reply_path);
  const size_t request_size = path_size + 1 + command.size + 1;
  if (request_size > kPipeBuf) {
    fprintf(stderr, "command too long\n");
    goto done;
  }
  char request[kPipeBuf];
  memcpy(request, reply_path, path_size);
  request[path_size] = ' ';
  memcpy(request + path_size + 1, command.data, command.size);
  request[request_size - 1] = '\n';
  const int flags = fcntl(control_fd, F_GETFL);
  ssize_t written = -1;
  if (flags >= 0 && fcntl(control_fd, F_SETFL, flags & ~O_NONBLOCK) == 0) {
    do {
      written = write(control_fd, request, request_size);  // atomic: at most PIPE_BUF
    } while (written < 0 && errno == EINTR);
  }
  if (written < 0) {
    fprintf(stderr, "%s: %s: %s\n", kProgram, p->control, strerror(errno));
    goto done;
  }
  close(control_fd);
  control_fd = -1;
  // poll() reports POLLHUP on a fifo only after a writer has come and gone since we opened it,
  // so this waits for the daemon; a hung daemon means waiting forever, as with the real client
  // (callers apply their own timeout).
  char* chunk = Allocate(kReadChunk);
  for (;;) {
    struct pollfd pfd = {.fd = reply_fd, .events = POLLIN};
    if (poll(&pfd, 1, -1) < 0) {
      if (errno == EINTR) continue;
      fprintf(stderr, "%s: poll: %s\n", kProgram, strerror(errno));
      break;
    }
    const ssize_t n = read(reply_fd, chunk, kReadChunk);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n < 0) {
      fprintf(stderr, "%s: %s: %s\n", kProgram, reply_path, strerror(errno));
      break;
    }
    if (n == 0) {
      result = 0;
      break;
    }
    if (!WriteAll(STDOUT_FILENO, chunk, (size_t)n)) {
      fprintf(stderr, "%s: stdout: %s\n", kProgram, strerror(errno));
      break;
    }
  }
  free(chunk);
done:
  if (control_fd >= 0) close(control_fd);
  if (reply_fd >= 0) close(reply_fd);
  unlink(reply_path);
  free(reply_path);
  return result;
}

static int Client(const Paths* p) {
  char* line = NULL;
  size_t capacity = 0;
  ssize_t n;
  int rc = 0;
  while (rc == 0 && (n = getline(&line, &capacity, stdin)) >= 0) {
    const Bytes command = Strip((Bytes){line, (size_t)n});  // blank lines are skipped
    if (command.size == 0) continue;
    const int sent = Send(p, command);
    if (sent == 1) fprintf(stderr, "Cannot find MPS control daemon process\n");
    if (sent != 0) rc = 1;
  }
  if (rc == 0 && ferror(stdin)) {
    fprintf(stderr, "%s: stdin: %s\n", kProgram, strerror(errno));
    rc = 1;
  }
  free(line);
  return rc;
}

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);  // a reader that went away is an EPIPE, not a death
  if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
    fputs(kHelp, stdout);
    return 0;
  }
  if (argc > 2 || (argc == 2 && strcmp(argv[1], "-d") != 0)) {
    fprintf(stderr, "usage: %s [-d | -h]\n", kProgram);
    return 2;
  }
  Paths paths = PathsFromEnvironment();
  const int rc = argc == 2 ? StartDaemon(&paths) : Client(&paths);
  free(paths.control);
  free(paths.lock);
  free(paths.pid_file);
  free(paths.log_file);
  return rc;
}
