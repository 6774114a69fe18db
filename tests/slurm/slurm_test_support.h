// Helpers for the Slurm tests: temp dirs, the simulated nodes' fixtures, the loopback cluster.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>

#include "support/require.h"  // GPULET_SKIP_OR_FAIL_IN_CI
#include "support/wait_until.h"
#include "tests/cli/run_command.h"

namespace gpulet::slurm_testing {

using gpulet::testing::CommandResult;
using gpulet::testing::GpuletBinary;
using gpulet::testing::RunCommand;

inline std::string SourceDir() { return GPULET_SOURCE_DIR; }
inline std::string FixturePath(const std::string& name) {
  return SourceDir() + "/tests/slurm/fixtures/" + name + ".yaml";
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = "/tmp/gpulet-slurm-XXXXXX";
    if (mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

// Polls `done` every 100 ms until it returns true or `limit` passes (a bound, not a timing claim).
inline bool WaitFor(const std::function<bool()>& done,
                    std::chrono::seconds limit = std::chrono::seconds(60)) {
  return testing::WaitUntil(done, limit, std::chrono::milliseconds(100));
}

// Why the real cluster cannot run here, or "" when it can.
inline std::string ClusterUnavailableReason() {
  if (geteuid() != 0) return "needs root (slurmd, mknod)";
  for (const char* b : {"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/sbatch"}) {
    if (access(b, X_OK) != 0) return std::string(b) + " missing (make deps installs it)";
  }
  return "";
}

// slurmctld + two slurmd (gpua: 4 x H100 with shards, gpub: 2 x L4 with MPS) in a temp dir.
class Cluster {
 public:
  // `script` in tests/slurm: "slurm_cluster.sh" (two static nodes) or "slurm_pod_cluster.sh"
  // (slurmctld for dynamic nodes; pods added by the test).
  explicit Cluster(std::string script = "slurm_cluster.sh") : script_(std::move(script)) {}
  ~Cluster() { Stop(); }

  // Returns the script's output on failure, "" on success.
  std::string Start() {
    CommandResult r = RunCommand(Script() + " start " + dir_.path() + " " + GpuletBinary());
    started_ = true;
    return r.exit_code == 0 ? "" : "exit " + std::to_string(r.exit_code) + ": " + r.output;
  }
  void Stop() {
    if (started_) RunCommand(Script() + " stop " + dir_.path());
    started_ = false;
  }
  const std::string& dir() const { return dir_.path(); }
  std::string conf() const { return dir_.path() + "/slurm.conf"; }

  // Runs a shell command with SLURM_CONF pointing at this cluster.
  CommandResult Sh(const std::string& command) const {
    return RunCommand("export SLURM_CONF=" + conf() + "; " + command);
  }
  // sbatch --parsable; returns the job id ("" on failure, with the output in *error).
  std::string Submit(const std::string& args, const std::string& script,
                     std::string* error = nullptr) const {
    CommandResult r =
        Sh("sbatch --parsable -o " + dir() + "/out/%j.out " + args + " --wrap '" + script + "'");
    std::string id = r.output.substr(0, r.output.find_first_of(";\n"));
    if (r.exit_code != 0 || id.empty()) {
      if (error) *error = r.output;
      return "";
    }
    return id;
  }
  std::string JobState(const std::string& id) const {
    std::string out = Sh("scontrol show job -o " + id).output;
    size_t at = out.find("JobState=");
    if (at == std::string::npos) return "";
    return out.substr(at + 9, out.find(' ', at) - at - 9);
  }
  bool WaitJobState(const std::string& id, const std::string& state) const {
    return WaitFor([&] { return JobState(id) == state; });
  }
  // Waits for the job to end and returns its output file.
  std::string WaitOutput(const std::string& id) const {
    WaitFor([&] {
      std::string s = JobState(id);
      return s == "COMPLETED" || s == "FAILED" || s == "CANCELLED" || s == "TIMEOUT" ||
             s == "NODE_FAIL" || s == "OUT_OF_MEMORY";
    });
    return ReadFile(dir() + "/out/" + id + ".out");
  }
  // "State=… Reason=…" of a node, one line.
  std::string NodeLine(const std::string& node) const {
    return Sh("scontrol show node -o " + node).output;
  }

 private:
  std::string Script() const { return SourceDir() + "/tests/slurm/" + script_; }
  std::string script_;
  TempDir dir_;
  bool started_ = false;
};

}  // namespace gpulet::slurm_testing
