#include "tests/deviceplugin/plugin_process.h"

#include <regex>

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "support/wait_until.h"

namespace gpulet::testing {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

TempDir::TempDir() {
  char tmpl[] = "/tmp/gpulet-dp-XXXXXX";
  if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string GpuletBinary() {
  const char* dir = std::getenv("GPULET_BUILD_DIR");
  return std::string(dir && *dir ? dir : GPULET_BUILD_DIR) + "/gpulet";
}

namespace {

pid_t Spawn(const std::vector<std::string>& args, const std::string& log_path,
            const std::map<std::string, std::string>& env) {
  std::vector<std::string> argv_s = {GpuletBinary()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  pid_t pid = fork();
  if (pid != 0) return pid;
  // Child: own process group so a stray signal to the test does not reach it twice.
  setpgid(0, 0);
  int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    dup2(fd, 1);
    dup2(fd, 2);
    close(fd);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  std::vector<char*> argv;
  for (std::string& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  execv(argv[0], argv.data());
  _exit(127);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int ExitCode(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

}  // namespace

RunResult RunGpulet(const std::vector<std::string>& args, std::chrono::seconds timeout,
                    const std::map<std::string, std::string>& env) {
  TempDir tmp;
  std::string log = tmp.path() + "/out.log";
  pid_t pid = Spawn(args, log, env);
  RunResult r;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (true) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) {
      r.exit_code = ExitCode(status);
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(10ms);
  }
  r.output = ReadFile(log);
  return r;
}

GpuletProcess::GpuletProcess(std::vector<std::string> args, std::string log_path,
                             std::map<std::string, std::string> env)
    : args_(std::move(args)), log_path_(std::move(log_path)), env_(std::move(env)) {}

GpuletProcess::~GpuletProcess() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &status_, 0);
  }
}

bool GpuletProcess::Start() {
  pid_ = Spawn(args_, log_path_, env_);
  reaped_ = false;
  return pid_ > 0;
}

void GpuletProcess::Signal(int sig) const {
  if (pid_ > 0) kill(pid_, sig);
}

bool GpuletProcess::Running() {
  if (pid_ <= 0 || reaped_) return false;
  pid_t w = waitpid(pid_, &status_, WNOHANG);
  if (w == pid_) reaped_ = true;
  return !reaped_;
}

int GpuletProcess::Stop(int sig, std::chrono::seconds timeout) {
  if (pid_ <= 0) return -1;
  if (!reaped_) {
    kill(pid_, sig);
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!reaped_) {
      if (waitpid(pid_, &status_, WNOHANG) == pid_) {
        reaped_ = true;
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status_, 0);
        reaped_ = true;
        return -1;
      }
      std::this_thread::sleep_for(10ms);
    }
  }
  return ExitCode(status_);
}

std::string GpuletProcess::Log() const { return ReadFile(log_path_); }

int GpuletProcess::CountInLog(const std::string& text) const {
  std::string log = Log();
  int n = 0;
  for (size_t pos = log.find(text); pos != std::string::npos; pos = log.find(text, pos + 1)) ++n;
  return n;
}

bool GpuletProcess::WaitForLog(const std::string& text, std::chrono::milliseconds timeout,
                               int times) const {
  return Eventually([&] { return CountInLog(text) >= times; }, timeout);
}

int ListeningPort(const GpuletProcess& node, std::chrono::milliseconds timeout) {
  if (!node.WaitForLog("event=listening", timeout)) return -1;
  std::smatch m;
  const std::string log = node.Log();
  if (!std::regex_search(log, m, std::regex("event=listening [^\\n]* port=([0-9]+)"))) return -1;
  return std::stoi(m[1]);
}

bool Eventually(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  return WaitUntil(pred, timeout, 20ms);
}

}  // namespace gpulet::testing
