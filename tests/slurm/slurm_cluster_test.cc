// Integration tests on a real Slurm 22.05 (slurmctld + two slurmd on loopback) configured with
// the gres.conf and NodeName lines that `gpulet slurm gres` generated for two simulated nodes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <regex>
#include <set>

#include "tests/slurm/slurm_test_support.h"

namespace gpulet::slurm_testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class SlurmCluster : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = ClusterUnavailableReason(); !why.empty()) GPULET_SKIP_OR_FAIL_IN_CI(why);
    std::string err = cluster_.Start();
    ASSERT_EQ(err, "") << "cluster did not start";
  }
  // gpulet on simulated node gpua (its state dir is the one the cluster's gres.conf came from).
  std::string GpuletA() const {
    return GpuletBinary() + " --simulate " + FixturePath("slurm-h100") + " --sim-state " +
           cluster_.dir() + "/sim-gpua";
  }
  Cluster cluster_;
};

std::string EnvValue(const std::string& output, const std::string& name) {
  std::smatch m;
  std::regex re("(^|\n)" + name + "=([^\n]*)");
  return std::regex_search(output, m, re) ? m[2].str() : "<unset>";
}

TEST_F(SlurmCluster, JobsGetTheDevicesOfGpuletsGresConf) {
  // The node registered what gpulet described.
  EXPECT_THAT(cluster_.NodeLine("gpua"), HasSubstr("Gres=gpu:h100:4"));
  EXPECT_THAT(cluster_.NodeLine("gpub"), HasSubstr("Gres=gpu:l4:2"));

  const std::string show = "env | grep -E \"^(CUDA_|SLURM_SHARDS|SLURM_JOB_GPUS)\"; true";
  std::string err;
  std::string gpu = cluster_.Submit("-w gpua --gres=gpu:h100:2", show, &err);
  ASSERT_NE(gpu, "") << err;
  std::string shard = cluster_.Submit("-w gpua --gres=shard:2", show, &err);
  ASSERT_NE(shard, "") << err;
  std::string mps = cluster_.Submit("-w gpub --gres=mps:50", show, &err);
  ASSERT_NE(mps, "") << err;

  std::string out = cluster_.WaitOutput(gpu);
  std::string devices = EnvValue(out, "CUDA_VISIBLE_DEVICES");
  EXPECT_EQ(std::count(devices.begin(), devices.end(), ',') + 1, 2) << out;
  EXPECT_THAT(devices, ::testing::MatchesRegex("[0-9]+,[0-9]+")) << out;

  out = cluster_.WaitOutput(shard);
  EXPECT_EQ(EnvValue(out, "SLURM_SHARDS_ON_NODE"), "2") << out;

  out = cluster_.WaitOutput(mps);
  EXPECT_EQ(EnvValue(out, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "50") << out;

  // The same generator, in --check mode, accepts the file Slurm runs with.
  CommandResult check =
      RunCommand(GpuletA() + " slurm gres --node-name gpua --dev-root " + cluster_.dir() +
                 "/gpua --shards 4 --check " + cluster_.dir() + "/gres.conf");
  EXPECT_EQ(check.exit_code, 0) << check.output;
  EXPECT_THAT(check.output, HasSubstr("matches the hardware of node gpua"));
  // ... and names what differs when the node asks for something else (MPS instead of shards).
  check = RunCommand(GpuletA() + " slurm gres --node-name gpua --dev-root " + cluster_.dir() +
                     "/gpua --mps --check " + cluster_.dir() + "/gres.conf");
  EXPECT_EQ(check.exit_code, 3) << check.output;
  EXPECT_THAT(check.output,
              HasSubstr("missing: Name=mps File=" + cluster_.dir() + "/gpua/dev/nvidia0"));
  EXPECT_THAT(check.output,
              HasSubstr("Name=shard File=" + cluster_.dir() + "/gpua/dev/nvidia3: not expected"));
}

TEST_F(SlurmCluster, RunningJobMapsToItsGpus) {
  std::string err;
  std::string job = cluster_.Submit("-w gpua --gres=gpu:h100:2", "sleep 120", &err);
  ASSERT_NE(job, "") << err;
  ASSERT_TRUE(cluster_.WaitJobState(job, "RUNNING")) << cluster_.JobState(job);
  // Slurm's own view of which indexes the job holds.
  std::string detail = cluster_.Sh("scontrol show job -d -o " + job).output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(detail, m, std::regex(R"(GRES=gpu:h100:2\(IDX:([0-9,-]+)\))")))
      << detail;
  std::string idx = m[1].str();  // "0-1" or "0,2", …

  CommandResult r = cluster_.Sh(GpuletA() + " slurm jobs --node-name gpua");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  int held = 0;
  for (unsigned gpu = 0; gpu < 4; ++gpu) {
    std::smatch line;
    ASSERT_TRUE(std::regex_search(
        r.output, line, std::regex("GPU " + std::to_string(gpu) + " GPU-[^ ]+ job=([^\n]+)")))
        << r.output;
    if (line[1].str() == job)
      ++held;
    else
      EXPECT_EQ(line[1].str(), "-") << r.output;
  }
  EXPECT_EQ(held, 2) << "Slurm says IDX:" << idx << "\n" << r.output;
  // Node gpub has no jobs.
  CommandResult b =
      cluster_.Sh(GpuletBinary() + " --simulate " + FixturePath("slurm-l4") + " --sim-state " +
                  cluster_.dir() + "/sim-gpub slurm jobs --node-name gpub");
  EXPECT_EQ(b.exit_code, 0) << b.output;
  EXPECT_THAT(b.output, Not(HasSubstr("job=" + job)));
  cluster_.Sh("scancel " + job);
}

// The exporter's hpc_job label on a real Slurm: the same JobMapper, through `gpulet exporter
// --slurm-node`.
TEST_F(SlurmCluster, ExporterLabelsSeriesWithTheJobHoldingTheGpu) {
  if (RunCommand(GpuletBinary() + " exporter --help").output.find("--slurm-node") ==
      std::string::npos) {
    FAIL() << "gpulet exporter --help lists no --slurm-node: the job-label feature is gone";
  }
  std::string err;
  std::string job = cluster_.Submit("-w gpua --gres=gpu:h100:2", "sleep 120", &err);
  ASSERT_NE(job, "") << err;
  ASSERT_TRUE(cluster_.WaitJobState(job, "RUNNING")) << cluster_.JobState(job);
  // The exporter binds 127.0.0.1:0 and logs the port it got (a port chosen here and closed
  // again could be taken before it binds).
  const std::string log = cluster_.dir() + "/exporter.log";
  CommandResult started =
      cluster_.Sh(GpuletA() + " exporter -a 127.0.0.1:0" +
                  " --slurm-node gpua --slurm-refresh-interval 200 >" + log + " 2>&1 & echo $!");
  int pid = std::atoi(started.output.c_str());
  ASSERT_GT(pid, 0) << started.output;
  std::smatch listening;
  std::string log_text;
  if (!WaitFor([&] {
        log_text = ReadFile(log);
        return std::regex_search(log_text, listening,
                                 std::regex("event=listening [^\\n]* port=([0-9]+)"));
      })) {
    kill(pid, SIGTERM);
    FAIL() << "the exporter did not say where it listens:\n" << log_text;
  }
  const std::string port = listening[1].str();
  const std::string get =
      "python3 -c 'import urllib.request,sys; "
      "sys.stdout.write(urllib.request.urlopen(\"http://127.0.0.1:" +
      port + "/metrics\", timeout=5).read().decode())'";
  const std::string want = "hpc_job=\"" + job + "\"";
  std::string metrics;
  bool labelled = WaitFor([&] {
    metrics = RunCommand(get).output;
    return metrics.find(want) != std::string::npos;
  });
  kill(pid, SIGTERM);
  WaitFor([&] { return kill(pid, 0) != 0; }, std::chrono::seconds(20));
  ASSERT_TRUE(labelled) << metrics.substr(0, 2000) << ReadFile(log);
  // Exactly the job's two GPUs carry the label, on every per-GPU series (one checked here).
  std::set<std::string> gpus;
  std::stringstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("DCGM_FI_DEV_GPU_UTIL{", 0) != 0 || line.find(want) == std::string::npos) {
      continue;
    }
    std::smatch m;
    if (std::regex_search(line, m, std::regex("gpu=\"([0-9]+)\""))) gpus.insert(m[1].str());
  }
  EXPECT_EQ(gpus.size(), 2u) << metrics.substr(0, 3000);
  cluster_.Sh("scancel " + job);
}

// The health daemon in the background; stopped (SIGTERM, then SIGKILL) by pid.
class HealthDaemon {
 public:
  HealthDaemon(const Cluster& c, const std::string& gpulet, const std::string& args)
      : log_(c.dir() + "/health.log") {
    CommandResult r = c.Sh(gpulet + " slurm health " + args + " >" + log_ + " 2>&1 & echo $!");
    pid_ = std::atoi(r.output.c_str());
  }
  ~HealthDaemon() { Stop(); }
  int Stop() {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    bool gone = WaitFor([&] { return kill(pid_, 0) != 0; }, std::chrono::seconds(20));
    if (!gone) kill(pid_, SIGKILL);
    pid_ = -1;
    return gone ? 0 : -1;
  }
  std::string log() const { return ReadFile(log_); }
  size_t Count(const std::string& what) const {
    std::string l = log();
    size_t n = 0;
    for (size_t at = l.find(what); at != std::string::npos; at = l.find(what, at + 1)) ++n;
    return n;
  }

 private:
  std::string log_;
  int pid_ = -1;
};

TEST_F(SlurmCluster, HealthDrainsOnXidAndResumesOnlyItsOwnDrain) {
  HealthDaemon daemon(
      cluster_, GpuletA(),
      "--node-name gpua --recovery-after 3 --resync-interval 1 --probe-interval 0.2");
  ASSERT_TRUE(WaitFor([&] { return daemon.Count("action=none") > 0; })) << daemon.log();

  CommandResult inject = RunCommand(GpuletA() + " sim xid --gpu 3 --code 79");
  ASSERT_EQ(inject.exit_code, 0) << inject.output;
  ASSERT_TRUE(WaitFor([&] {
    return cluster_.NodeLine("gpua").find("+DRAIN") != std::string::npos;
  })) << cluster_.NodeLine("gpua")
      << daemon.log();
  std::string line = cluster_.NodeLine("gpua");
  EXPECT_THAT(line, ::testing::ContainsRegex("Reason=gpulet: GPU GPU-[^ ]+ XID 79"));

  // After the quiet period the GPU is healthy again and the node is resumed.
  ASSERT_TRUE(WaitFor([&] { return cluster_.NodeLine("gpua").find("DRAIN") == std::string::npos; }))
      << cluster_.NodeLine("gpua") << daemon.log();
  // The daemon logs the resume once scontrol has returned, which may be after the node shows it.
  EXPECT_TRUE(WaitFor([&] { return daemon.Count("action=resumed") > 0; })) << daemon.log();

  // An admin drain is never undone, and never overwritten by ours.
  ASSERT_EQ(cluster_.Sh("scontrol update NodeName=gpua State=DRAIN Reason=\"fan swap ticket 42\"")
                .exit_code,
            0);
  size_t healthy_before = daemon.Count("unhealthy=0 action=left_admin_drain");
  inject = RunCommand(GpuletA() + " sim xid --gpu 1 --code 79");
  ASSERT_EQ(inject.exit_code, 0) << inject.output;
  ASSERT_TRUE(WaitFor([&] { return daemon.Count("unhealthy=1 action=left_admin_drain") > 0; }))
      << daemon.log();
  // Wait until the GPU has recovered and the daemon has looked at the node again.
  ASSERT_TRUE(WaitFor([&] {
    return daemon.Count("unhealthy=0 action=left_admin_drain") > healthy_before;
  })) << daemon.log();
  line = cluster_.NodeLine("gpua");
  EXPECT_THAT(line, HasSubstr("+DRAIN"));
  EXPECT_THAT(line, HasSubstr("Reason=fan swap ticket 42"));
  EXPECT_EQ(daemon.Stop(), 0) << daemon.log();
  cluster_.Sh("scontrol update NodeName=gpua State=RESUME");
}

TEST(SlurmFaults, ControllerDownIsAClearErrorAndDrainsNothing) {
  if (access("/usr/bin/scontrol", X_OK) != 0) GPULET_SKIP_OR_FAIL_IN_CI("scontrol missing");
  TempDir dir;
  // A cluster whose controller port has no listener.
  CommandResult port = RunCommand(
      "python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\",0)); "
      "print(s.getsockname()[1])'");
  ASSERT_EQ(port.exit_code, 0);
  WriteFile(dir.path() + "/slurm.conf",
            "ClusterName=down\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=" +
                port.output.substr(0, port.output.find('\n')) +
                "\nAuthType=auth/none\nCredType=cred/none\nMessageTimeout=2\n"
                "NodeName=gpua CPUs=2\nPartitionName=p Nodes=gpua\n");
  CommandResult r = RunCommand("SLURM_CONF=" + dir.path() + "/slurm.conf " + GpuletBinary() +
                               " --simulate " + FixturePath("slurm-h100") + " --sim-state " +
                               dir.path() + "/sim slurm health --node-name gpua");
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_THAT(r.output, HasSubstr("slurmctld not reachable"));
}

// A cluster that cannot start (seen on a Debian 12 whose cgroup mounts slurmd rejects) must say
// why: the helper shows the daemon's own log lines, not a bare "did not come up".
TEST(SlurmClusterScript, AClusterThatCannotStartShowsTheDaemonsLog) {
  if (geteuid() != 0)
    GPULET_SKIP_OR_FAIL_IN_CI("needs root (the helper makes device nodes with mknod)");
  TempDir bin, cluster;
  // Stand-ins on PATH: a slurmctld that logs its reason and exits at once, and the clients.
  WriteFile(bin.path() + "/slurmctld",
            "#!/bin/sh\n"
            "log=$(sed -n 's/^SlurmctldLogFile=//p' \"$4\")\n"
            "echo 'error: stand-in: cgroup namespace mount refused' >>\"$log\"\n"
            "echo 'fatal: stand-in slurmctld gives up' >&2\n"
            "exit 1\n");
  for (const char* client : {"slurmd", "scontrol", "sbatch", "sinfo", "squeue", "scancel"}) {
    WriteFile(bin.path() + "/" + client,
              "#!/bin/sh\necho \"$0: stand-in: no controller\" >&2\nexit 1\n");
  }
  ASSERT_EQ(RunCommand("chmod +x " + bin.path() + "/*").exit_code, 0);

  CommandResult r =
      RunCommand("PATH=" + bin.path() + ":$PATH " + SourceDir() +
                 "/tests/slurm/slurm_cluster.sh start " + cluster.path() + " " + GpuletBinary());
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("error: stand-in: cgroup namespace mount refused"));
  EXPECT_THAT(r.output, HasSubstr("fatal: stand-in slurmctld gives up"));
  EXPECT_THAT(r.output, HasSubstr("slurmctld exited at start"));
  EXPECT_THAT(r.output, Not(HasSubstr("invalid context")));
  RunCommand(SourceDir() + "/tests/slurm/slurm_cluster.sh stop " + cluster.path());
}

}  // namespace
}  // namespace gpulet::slurm_testing
