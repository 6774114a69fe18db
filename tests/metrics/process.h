// Helpers for tests that run gpulet (and Prometheus) as child processes: spawn with output to a
// log file, stop by pid, find the port a child listens on, fetch over HTTP, wait with a deadline.
//
// Ports: a child binds 127.0.0.1:0 and the test asks the kernel which port it got
// (ListeningPort). Choosing a free port in the test, closing it and handing it to the child
// races with every other process on the machine that binds between the two.
#pragma once

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/wait_until.h"

extern char** environ;

namespace gpulet::testing {

inline std::string Gpulet() { return std::string(GPULET_BUILD_DIR) + "/gpulet"; }

inline std::string MakeTempDir(const char* prefix) {
  std::string tmpl = std::string("/tmp/") + prefix + "-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) return "";
  return tmpl;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Polls `ready` every 50 ms until it returns true or `deadline` passes.
inline bool WaitFor(const std::function<bool()>& ready,
                    std::chrono::milliseconds deadline = std::chrono::seconds(30)) {
  return WaitUntil(ready, deadline, std::chrono::milliseconds(50));
}

class Child {
 public:
  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() { Stop(); }

  // Starts argv[0] with stdout+stderr appended to `log`.
  bool Start(const std::vector<std::string>& argv, const std::string& log) {
    log_ = log;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    int rc = posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) pid_ = -1;
    return pid_ > 0;
  }
  bool running() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_status_ = status;
      pid_ = -1;
      return false;
    }
    return true;
  }
  // SIGTERM, then SIGKILL after 10 s. Returns the wait status.
  int Stop() {
    if (pid_ <= 0) return exit_status_;
    kill(pid_, SIGTERM);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > end) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    pid_ = -1;
    exit_status_ = status;
    return status;
  }
  void Signal(int sig) {
    if (pid_ > 0) kill(pid_, sig);
  }
  pid_t pid() const { return pid_; }
  std::string log() const { return ReadFile(log_); }

 private:
  pid_t pid_ = -1;
  int exit_status_ = -1;
  std::string log_;
};

inline std::string HttpGet(int port, const std::string& path, int* status = nullptr,
                           const httplib::Headers& headers = {}) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_connection_timeout(2, 0);
  cli.set_read_timeout(10, 0);
  auto r = cli.Get(path.c_str(), headers);
  if (status != nullptr) *status = r ? r->status : -1;
  return r ? r->body : std::string();
}

// The TCP port process `pid` listens on, from the kernel: a socket in LISTEN state in
// /proc/<pid>/net/tcp or tcp6 whose inode is one of the process's descriptors. 0 while it
// listens on none; the lowest port when it listens on several.
inline int ListeningPort(pid_t pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  std::set<std::string> inodes;  // "socket:[12345]" → "12345"
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(proc + "/fd", ec)) {
    std::error_code link_ec;
    const std::string target = std::filesystem::read_symlink(e.path(), link_ec).string();
    if (!link_ec && target.rfind("socket:[", 0) == 0 && target.back() == ']') {
      inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  int port = 0;
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream in(proc + table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
      std::istringstream f(line);
      std::string sl, local, remote, state, skip, inode;
      f >> sl >> local >> remote >> state >> skip >> skip >> skip >> skip >> skip >> inode;
      if (state != "0A" || !inodes.count(inode)) continue;  // 0A: TCP_LISTEN
      const int p = static_cast<int>(std::stoul(local.substr(local.rfind(':') + 1), nullptr, 16));
      if (port == 0 || p < port) port = p;
    }
  }
  return port;
}

// Waits until the child listens; its port, or 0 when it exited or the deadline passed first.
inline int WaitListening(Child& child,
                         std::chrono::milliseconds deadline = std::chrono::seconds(30)) {
  int port = 0;
  WaitFor(
      [&] {
        if (!child.running()) return true;
        port = ListeningPort(child.pid());
        return port != 0;
      },
      deadline);
  return child.running() ? port : 0;
}

// Waits until the child listens and answers 200 on /health; its port, or 0 when it exited or the
// deadline passed first.
inline int WaitServing(Child& child) {
  const int port = WaitListening(child);
  int status = 0;
  if (port != 0) {
    WaitFor([&] {
      HttpGet(port, "/health", &status);
      return status == 200 || !child.running();
    });
  }
  return status == 200 ? port : 0;
}

// Runs a command through the shell; returns its exit code, output appended to *out.
inline int RunShell(const std::string& cmd, std::string* out = nullptr) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) {
    if (out != nullptr) out->append(buf, n);
  }
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace gpulet::testing
