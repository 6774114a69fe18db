// `gpulet slurm pod` on a real Slurm 22.05 with dynamic nodes: slurmctld from
// slurm_pod_cluster.sh, and "pods" that are processes in network namespaces of their own (as pods
// have their own address) running the entrypoint with the simulated driver restricted to the
// devices the pod was given (GPULET_SIM_VISIBLE_DEVICES, as the container runtime restricts NVML)
// and NVIDIA_VISIBLE_DEVICES as the device plugin's Allocate sets it. The pods of one test share
// one simulated node (one state directory), so an XID on a GPU reaches only the pod holding it.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <regex>
#include <vector>

#include "apiserver/fake_apiserver.h"
#include "apiserver/rbac_check.h"
#include "sim/fixture.h"
#include "sim/simulation.h"
#include "tests/slurm/slurm_test_support.h"

namespace gpulet::slurm_testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

sim::Fixture Load(const std::string& name) {
  Result<std::string> path = sim::ResolveFixture(name);
  EXPECT_TRUE(path.ok()) << path.status().message();
  Result<sim::Fixture> f = sim::LoadFixture(path.ok() ? *path : name);
  EXPECT_TRUE(f.ok()) << f.status().message();
  return f.ok() ? *f : sim::Fixture{};
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : ",") + s;
  return out;
}

// One `gpulet slurm pod` process in a network namespace.
class Pod {
 public:
  struct Spec {
    std::string name;
    std::string fixture;                          // the node's fixture
    std::string allocated;                        // NVIDIA_VISIBLE_DEVICES
    std::string visible;                          // GPULET_SIM_VISIBLE_DEVICES (what NVML shows)
    std::vector<std::string> extra;               // more `slurm pod` flags
    std::map<std::string, std::string> env = {};  // more environment
  };

  // `netns`: "" runs without one (for a pod that must refuse before talking to Slurm).
  Pod(const std::string& dir, const std::string& netns, Spec spec)
      : spec_(std::move(spec)), dir_(dir + "/" + spec_.name) {
    std::filesystem::create_directories(dir_ + "/etc");
    std::vector<std::string> argv;
    if (!netns.empty()) argv = {"/usr/bin/nsenter", "--net=/run/netns/" + netns};
    std::vector<std::string> rest = {GpuletBinary(),
                                     "--simulate",
                                     spec_.fixture,
                                     "--sim-state",
                                     dir + "/sim",
                                     "slurm",
                                     "pod",
                                     "--node-name",
                                     spec_.name,
                                     "--slurm-conf",
                                     dir + "/slurm.conf",
                                     "--conf-dir",
                                     dir_ + "/etc",
                                     "--dev-root",
                                     dir_,
                                     "--pod-labels-file",
                                     dir_ + "/labels",
                                     "--pod-annotations-file",
                                     dir_ + "/annotations",
                                     "--poll-interval",
                                     "300ms",
                                     "--probe-interval",
                                     "0.3",
                                     "--slurmd-log",
                                     dir_ + "/slurmd.out"};
    argv.insert(argv.end(), rest.begin(), rest.end());
    argv.insert(argv.end(), spec_.extra.begin(), spec_.extra.end());
    // As the downward API writes them: one feature in the label (a label value cannot hold a
    // comma), a list in the annotation of the same name.
    WriteFile(dir_ + "/labels",
              "app.kubernetes.io/name=\"slurmd\"\nslurm.gpulet.io/partition=\"gpu\"\n"
              "slurm.gpulet.io/features=\"pod\"\n");
    WriteFile(dir_ + "/annotations", "slurm.gpulet.io/features=\"sim,pod\"\n");
    pid_ = fork();
    if (pid_ == 0) {
      int fd = open((dir_ + "/pod.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      setenv("NVIDIA_VISIBLE_DEVICES", spec_.allocated.c_str(), 1);
      setenv("GPULET_SIM_VISIBLE_DEVICES", spec_.visible.c_str(), 1);
      unsetenv("POD_NAME");
      unsetenv("KUBERNETES_SERVICE_HOST");
      for (const auto& [k, v] : spec_.env) setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> args;
      for (std::string& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
  }
  ~Pod() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  void Terminate() const { kill(pid_, SIGTERM); }
  // Waits (bounded) for the process to exit; its exit code, or -1 if it did not exit.
  int WaitExit(std::chrono::seconds limit = std::chrono::seconds(60)) {
    WaitFor(
        [&] {
          int st = 0;
          if (!exited_ && waitpid(pid_, &st, WNOHANG) == pid_) {
            exited_ = true;
            code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
          }
          return exited_;
        },
        limit);
    return exited_ ? code_ : -1;
  }
  std::string Log() const { return ReadFile(dir_ + "/pod.log"); }
  std::string GresConf() const { return ReadFile(dir_ + "/etc/gres.conf"); }
  const std::string& name() const { return spec_.name; }

 private:
  Spec spec_;
  std::string dir_;
  pid_t pid_ = -1;
  bool exited_ = false;
  int code_ = -1;
};

class SlurmPods : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = ClusterUnavailableReason(); !why.empty()) GPULET_SKIP_OR_FAIL_IN_CI(why);
    const bool have_ip = access("/usr/sbin/ip", X_OK) == 0 || access("/usr/bin/ip", X_OK) == 0;
    if (access("/usr/bin/nsenter", X_OK) != 0 || !have_ip) {
      GPULET_SKIP_OR_FAIL_IN_CI("nsenter and ip (util-linux, iproute2) are needed");
    }
    std::string err = cluster_.Start();
    ASSERT_EQ(err, "") << "cluster did not start";
  }

  // A pod in a namespace of its own.
  std::unique_ptr<Pod> Start(Pod::Spec spec) {
    CommandResult ns = RunCommand(SourceDir() + "/tests/slurm/slurm_pod_cluster.sh pod " +
                                  cluster_.dir() + " " + spec.name);
    EXPECT_EQ(ns.exit_code, 0) << ns.output;
    std::string name = ns.output.substr(0, ns.output.find('\n'));
    return std::make_unique<Pod>(cluster_.dir(), name, std::move(spec));
  }

  bool NodeExists(const std::string& node) const {
    return cluster_.Sh("scontrol show node -o " + node + " >/dev/null 2>&1").exit_code == 0;
  }
  bool WaitIdle(const Pod& pod) const {
    return WaitFor([&] {
      std::string line = cluster_.NodeLine(pod.name());
      return line.find("State=IDLE") != std::string::npos &&
             line.find("DRAIN") == std::string::npos;
    });
  }
  // "Gres=…" of the node as slurmctld reports it, without the socket binding ("(S:0-1)": present
  // only when the GPU's CPUs are in the pod's cpuset).
  std::string NodeGres(const std::string& node) const {
    std::string line = cluster_.NodeLine(node);
    size_t at = line.find(" Gres=");
    if (at == std::string::npos) return "";
    std::string gres = line.substr(at + 6, line.find(' ', at + 1) - at - 6);
    return std::regex_replace(gres, std::regex("\\(S:[^)]*\\)"), "");
  }

  Cluster cluster_{"slurm_pod_cluster.sh"};
};

std::string DeviceFiles(const std::string& gres_conf) {
  std::string files;
  std::stringstream in(gres_conf);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#' || line.find("Name=gpu") == std::string::npos) continue;
    size_t at = line.find("File=");
    files += line.substr(at + 5, line.find(' ', at) - at - 5) + "\n";
  }
  return files;
}

TEST_F(SlurmPods, TwoPodsRegisterRunJobsDrainOnXidAndLeaveOnSigterm) {
  sim::Fixture h100 = Load("dgx-h100");
  ASSERT_EQ(h100.gpus.size(), 8u);
  std::vector<std::string> a_gpus, b_gpus;
  for (unsigned i = 0; i < 4; ++i) a_gpus.push_back(h100.gpus[i].uuid);
  for (unsigned i = 4; i < 8; ++i) b_gpus.push_back(h100.gpus[i].uuid);
  auto a = Start({"slurmd-0", "dgx-h100", Join(a_gpus), Join(a_gpus), {}});
  auto b = Start({"slurmd-1", "dgx-h100", Join(b_gpus), Join(b_gpus), {}});
  ASSERT_TRUE(WaitIdle(*a)) << a->Log() << cluster_.NodeLine(a->name());
  ASSERT_TRUE(WaitIdle(*b)) << b->Log() << cluster_.NodeLine(b->name());

  // What Slurm believes each node has is what the pod was given: 4 H100, its own device files.
  EXPECT_EQ(NodeGres("slurmd-0"), "gpu:h100:4");
  EXPECT_EQ(NodeGres("slurmd-1"), "gpu:h100:4");
  const std::string dev0 = cluster_.dir() + "/slurmd-0/dev/nvidia";
  const std::string dev1 = cluster_.dir() + "/slurmd-1/dev/nvidia";
  EXPECT_EQ(DeviceFiles(a->GresConf()), dev0 + "0\n" + dev0 + "1\n" + dev0 + "2\n" + dev0 + "3\n");
  EXPECT_EQ(DeviceFiles(b->GresConf()), dev1 + "4\n" + dev1 + "5\n" + dev1 + "6\n" + dev1 + "7\n");
  EXPECT_THAT(cluster_.NodeLine("slurmd-0"), HasSubstr("AvailableFeatures=gpu,pod,sim"));

  // A two-GPU job runs on one pod and sees two devices.
  std::string err;
  std::string job =
      cluster_.Submit("-w slurmd-0 --gres=gpu:h100:2", "echo CVD=$CUDA_VISIBLE_DEVICES", &err);
  ASSERT_NE(job, "") << err;
  std::string out = cluster_.WaitOutput(job);
  EXPECT_EQ(cluster_.JobState(job), "COMPLETED");
  EXPECT_THAT(out, HasSubstr("CVD=0,1")) << out;

  // An XID on one of pod 1's GPUs drains pod 1 with gpulet's reason; pod 0 never heard of it.
  CommandResult inject =
      RunCommand(GpuletBinary() + " --log-level warn --simulate dgx-h100 --sim-state " +
                 cluster_.dir() + "/sim sim xid --gpu " + h100.gpus[5].uuid + " --code 79");
  ASSERT_EQ(inject.exit_code, 0) << inject.output;
  ASSERT_TRUE(WaitFor([&] {
    return cluster_.NodeLine("slurmd-1").find("Reason=gpulet: GPU " + h100.gpus[5].uuid) !=
           std::string::npos;
  })) << cluster_.NodeLine("slurmd-1")
      << b->Log();
  EXPECT_THAT(cluster_.NodeLine("slurmd-1"), HasSubstr("DRAIN"));
  EXPECT_THAT(cluster_.NodeLine("slurmd-0"), Not(HasSubstr("DRAIN")));
  EXPECT_THAT(a->Log(), Not(HasSubstr("event=slurm_pod_health")));

  // SIGTERM while a job runs: drained, the job finishes, the node is deleted, exit 0.
  const std::string marker = cluster_.dir() + "/release";
  job = cluster_.Submit("-w slurmd-0 --gres=gpu:h100:1",
                        "while [ ! -e " + marker + " ]; do sleep 0.1; done; echo finished", &err);
  ASSERT_NE(job, "") << err;
  ASSERT_TRUE(cluster_.WaitJobState(job, "RUNNING"));
  a->Terminate();
  ASSERT_TRUE(WaitFor([&] {
    return cluster_.NodeLine("slurmd-0").find("Reason=gpulet: pod terminating") !=
           std::string::npos;
  })) << cluster_.NodeLine("slurmd-0")
      << a->Log();
  EXPECT_THAT(cluster_.NodeLine("slurmd-0"), HasSubstr("DRAIN"));
  EXPECT_TRUE(NodeExists("slurmd-0"));  // held by its running job
  EXPECT_EQ(cluster_.JobState(job), "RUNNING");
  WriteFile(marker, "");
  EXPECT_EQ(a->WaitExit(), 0) << a->Log();
  EXPECT_EQ(cluster_.JobState(job), "COMPLETED");
  EXPECT_THAT(ReadFile(cluster_.dir() + "/out/" + job + ".out"), HasSubstr("finished"));
  EXPECT_FALSE(NodeExists("slurmd-0"));
  EXPECT_THAT(a->Log(), HasSubstr("event=slurm_pod_deleted node=slurmd-0"));

  // SIGTERM on an idle pod: gone within seconds (the bound here is generous, not a claim).
  const auto t0 = std::chrono::steady_clock::now();
  b->Terminate();
  EXPECT_EQ(b->WaitExit(std::chrono::seconds(20)), 0) << b->Log();
  EXPECT_FALSE(NodeExists("slurmd-1"));
  std::printf("idle pod left Slurm in %.2f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

TEST_F(SlurmPods, MigDevicesAndSharedReplicasGetTheirGres) {
  sim::Fixture a100 = Load("dgx-a100");
  sim::Fixture h100 = Load("dgx-h100");
  // Two 1g.5gb MIG devices of GPU 1 (the mixed strategy's MIG UUIDs).
  const std::string migs = a100.gpus[1].mig[2].uuid + "," + a100.gpus[1].mig[5].uuid;
  auto mig = Start({"slurmd-mig", "dgx-a100", migs, migs, {}});
  // Two replicas of a time-sliced GPU: Allocate names the GPU once; the pod spec says 2 shards.
  const std::string shared = h100.gpus[6].uuid;
  auto rep = Start({"slurmd-shared", "dgx-h100", shared, shared, {"--shards", "2"}});
  ASSERT_TRUE(WaitIdle(*mig)) << mig->Log() << cluster_.NodeLine("slurmd-mig");
  ASSERT_TRUE(WaitIdle(*rep)) << rep->Log() << cluster_.NodeLine("slurmd-shared");

  EXPECT_EQ(NodeGres("slurmd-mig"), "gpu:a100_1g.5gb:2");
  EXPECT_THAT(mig->GresConf(),
              HasSubstr("MultipleFiles=" + cluster_.dir() + "/slurmd-mig/dev/nvidia1," +
                        cluster_.dir() + "/slurmd-mig/dev/nvidia-caps/nvidia-cap"));
  // Slurm reports the shards with the GPU's type.
  EXPECT_EQ(NodeGres("slurmd-shared"), "gpu:h100:1,shard:h100:2");
  EXPECT_EQ(DeviceFiles(rep->GresConf()), cluster_.dir() + "/slurmd-shared/dev/nvidia6\n");

  std::string err;
  std::string job = cluster_.Submit("-w slurmd-mig --gres=gpu:a100_1g.5gb:2",
                                    "echo CVD=$CUDA_VISIBLE_DEVICES", &err);
  ASSERT_NE(job, "") << err;
  EXPECT_THAT(cluster_.WaitOutput(job), HasSubstr("CVD=0,1"));

  mig->Terminate();
  rep->Terminate();
  EXPECT_EQ(mig->WaitExit(), 0) << mig->Log();
  EXPECT_EQ(rep->WaitExit(), 0) << rep->Log();
  EXPECT_FALSE(NodeExists("slurmd-mig"));
  EXPECT_FALSE(NodeExists("slurmd-shared"));
}

// The PodDisruptionBudget's input: the pod labels itself busy while its node runs a job and idle
// otherwise (a merge PATCH on its own pod through the API server).
TEST_F(SlurmPods, LabelsItsPodBusyWhileAJobRuns) {
  Result<gpulet::testing::TestPki> pki = gpulet::testing::MakeTestPki(cluster_.dir());
  ASSERT_TRUE(pki.ok()) << pki.status().message();
  Result<std::unique_ptr<gpulet::testing::FakeApiServer>> api =
      gpulet::testing::FakeApiServer::Start(*pki, {});
  ASSERT_TRUE(api.ok()) << api.status().message();
  const std::string pod_path = "/api/v1/namespaces/slurm/pods/slurmd-lbl";
  (*api)->Put(pod_path, nlohmann::json::parse(
                            R"({"apiVersion":"v1","kind":"Pod","metadata":{"name":"slurmd-lbl",
                               "namespace":"slurm","labels":{"app":"slurmd"}}})"));
  const std::string port = (*api)->url().substr((*api)->url().rfind(':') + 1);
  CommandResult fwd = RunCommand(SourceDir() + "/tests/slurm/slurm_pod_cluster.sh forward " +
                                 cluster_.dir() + " " + port);
  ASSERT_EQ(fwd.exit_code, 0) << fwd.output;
  const std::string server = fwd.output.substr(0, fwd.output.find('\n'));
  // The forwarder's address is not in the test certificate: TLS verification is skipped here.
  WriteFile(cluster_.dir() + "/kubeconfig",
            "apiVersion: v1\nkind: Config\ncurrent-context: t\nclusters:\n- name: t\n  cluster:\n"
            "    server: https://" +
                server +
                "\n    insecure-skip-tls-verify: true\n"
                "users:\n- name: t\n  user:\n    token: test-token\n"
                "contexts:\n- name: t\n  context: {cluster: t, user: t}\n");
  // issue 26 item 7: the first label writes meet a 503, a 429 and a lost answer; the pod retries
  // on its next poll and the label still ends up right.
  using gpulet::testing::WriteFault;
  (*api)->InjectWriteFault({.method = "PATCH", .path_prefix = pod_path, .code = 503});
  (*api)->InjectWriteFault({.method = "PATCH",
                            .path_prefix = pod_path,
                            .kind = WriteFault::Kind::kTooManyRequests});
  (*api)->InjectWriteFault(
      {.method = "PATCH", .path_prefix = pod_path, .kind = WriteFault::Kind::kLostAnswer});
  sim::Fixture h100 = Load("dgx-h100");
  auto pod = Start({"slurmd-lbl",
                    "dgx-h100",
                    h100.gpus[2].uuid,
                    h100.gpus[2].uuid,
                    {"--kubeconfig", cluster_.dir() + "/kubeconfig"},
                    {{"POD_NAME", "slurmd-lbl"}, {"POD_NAMESPACE", "slurm"}}});
  auto label = [&] {
    std::optional<nlohmann::json> p = (*api)->Object(pod_path);
    if (!p) return std::string("<no pod>");
    return p->value("/metadata/labels/slurm.gpulet.io~1busy"_json_pointer, std::string("<unset>"));
  };
  ASSERT_TRUE(WaitIdle(*pod)) << pod->Log();
  ASSERT_TRUE(WaitFor([&] { return label() == "false"; })) << label() << pod->Log();
  EXPECT_NE(pod->Log().find("event=slurm_pod_label_failed"), std::string::npos) << pod->Log();

  const std::string marker = cluster_.dir() + "/release-lbl";
  std::string err;
  std::string job = cluster_.Submit("-w slurmd-lbl --gres=gpu:h100:1",
                                    "while [ ! -e " + marker + " ]; do sleep 0.1; done", &err);
  ASSERT_NE(job, "") << err;
  ASSERT_TRUE(WaitFor([&] { return label() == "true"; })) << label() << pod->Log();
  EXPECT_EQ(cluster_.JobState(job), "RUNNING");
  WriteFile(marker, "");
  ASSERT_TRUE(WaitFor([&] { return label() == "false"; })) << label() << pod->Log();
  EXPECT_EQ(cluster_.JobState(job), "COMPLETED");
  EXPECT_EQ((*api)->Object(pod_path)->value("/metadata/labels/app"_json_pointer, std::string()),
            "slurmd");  // a merge patch: the other labels stay
  pod->Terminate();
  EXPECT_EQ(pod->WaitExit(), 0) << pod->Log();
  // Every request the pod's agent sent is one the slurmd ServiceAccount's Role grants.
  for (const std::string& v : gpulet::testing::RbacVerbsNotGranted(
           (*api)->requests(), {"deploy/overlays/slurm-on-k8s/slurmd-rbac.yaml"})) {
    ADD_FAILURE() << "slurmd-rbac.yaml does not grant " << v;
  }
}

// No Slurm needed: the pod refuses before it writes gres.conf or starts slurmd.
TEST(SlurmPodRefusal, EnvironmentAndNvmlThatDisagreeRefuseToStart) {
  sim::Fixture h100 = Load("dgx-h100");
  TempDir dir;
  WriteFile(dir.path() + "/slurm.conf", "ClusterName=x\n");
  // Allocate named GPUs 0-3; the container runtime exposed 0-2 and 7.
  const std::string allocated =
      Join({h100.gpus[0].uuid, h100.gpus[1].uuid, h100.gpus[2].uuid, h100.gpus[3].uuid});
  const std::string visible =
      Join({h100.gpus[0].uuid, h100.gpus[1].uuid, h100.gpus[2].uuid, h100.gpus[7].uuid});
  Pod pod(dir.path(), "",
          {"slurmd-bad", "dgx-h100", allocated, visible, {"--slurmd", "/bin/false"}});
  EXPECT_NE(pod.WaitExit(), 0);
  const std::string log = pod.Log();
  EXPECT_THAT(log, HasSubstr("NVIDIA_VISIBLE_DEVICES names " + allocated));
  EXPECT_THAT(log, HasSubstr("allocated, not seen: " + h100.gpus[3].uuid));
  EXPECT_THAT(log, HasSubstr("seen, not allocated: " + h100.gpus[7].uuid));
  EXPECT_THAT(log, Not(HasSubstr("slurm_pod_started")));
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/slurmd-bad/etc/gres.conf"));
}

// `gpulet slurm pod` against stand-ins for slurmd (records its arguments, never registers) and
// scontrol (answers `show node` with the record given, accepts the rest): what the entrypoint
// decides before and around Slurm, without a cluster.
class SlurmPodStandIns : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    std::filesystem::create_directories(dir_.path() + "/bin");
    WriteFile(dir_.path() + "/slurm.conf", "ClusterName=x\n");
  }
  // The scontrol stand-in prints `record` (a shell word list; $4 is the node name) for `show`.
  Pod::Spec Spec(const std::string& name, const std::string& record,
                 std::vector<std::string> extra = {}) {
    const std::string bin = dir_.path() + "/bin";
    Script(bin + "/slurmd", "for a in \"$@\"; do printf '%s\\n' \"$a\"; done > " + dir_.path() +
                                "/" + name + ".slurmd-args\nexec sleep 600\n");
    Script(bin + "/scontrol", "case \"$1\" in show) echo " + record + ";; *) exit 0;; esac\n");
    sim::Fixture h100 = Load("dgx-h100");
    std::vector<std::string> flags = {"--slurmd",        bin + "/slurmd",      "--scontrol",
                                      bin + "/scontrol", "--register-timeout", "3s"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    return {name, "dgx-h100", h100.gpus[0].uuid, h100.gpus[0].uuid, flags};
  }
  // A record of this pod's own slurmd: started just now.
  static std::string FreshRecord() {
    return "\"NodeName=$4 State=IDLE SlurmdStartTime=$(date +%FT%T)\"";
  }
  std::string SlurmdArgs(const std::string& name) const {
    return ReadFile(dir_.path() + "/" + name + ".slurmd-args");
  }
  static void Script(const std::string& path, const std::string& body) {
    WriteFile(path, "#!/bin/sh\n" + body);
    ::chmod(path.c_str(), 0755);
  }
  // Runs the pod until it registers, then SIGTERM; it must leave cleanly.
  void RunToRegistration(Pod& pod) {
    ASSERT_TRUE(
        WaitFor([&] { return pod.Log().find("event=slurm_pod_registered") != std::string::npos; },
                std::chrono::seconds(60)))
        << pod.Log();
    pod.Terminate();
    EXPECT_EQ(pod.WaitExit(), 0) << pod.Log();
  }

  TempDir dir_;
};

// Dynamic Resource Allocation (issue 22 item 6): the claim's devices come from
// GPULET_DRA_DEVICES, which gpulet dra's CDI edits set; NVIDIA_VISIBLE_DEVICES is a CUDA image's
// "all" there. A whole GPU and a memory share of another give a node with two GPUs.
TEST_F(SlurmPodStandIns, GresComesFromTheDraAllocation) {
  sim::Fixture h100 = Load("dgx-h100");
  Pod::Spec spec = Spec("slurmd-dra", FreshRecord());
  spec.allocated = "all";
  spec.visible = Join({h100.gpus[2].uuid, h100.gpus[5].uuid});
  spec.env["GPULET_DRA_DEVICES"] =
      "gpu-2=" + h100.gpus[2].uuid + ",gpu-5-mem=" + h100.gpus[5].uuid;
  Pod pod(dir_.path(), "", spec);
  RunToRegistration(pod);
  EXPECT_THAT(SlurmdArgs("slurmd-dra"), HasSubstr("Gres=gpu:h100:2 ")) << pod.Log();
  const std::string gres = ReadFile(dir_.path() + "/slurmd-dra/etc/gres.conf");
  EXPECT_THAT(gres, HasSubstr("GPULET_DRA_DEVICES=gpu-2=" + h100.gpus[2].uuid)) << gres;
  EXPECT_THAT(pod.Log(), Not(HasSubstr("NVIDIA_VISIBLE_DEVICES=\"all\"")));

  // The claim names GPU 2, the container's NVML sees GPU 3: refused, naming both sides.
  Pod::Spec wrong = Spec("slurmd-dra-bad", FreshRecord());
  wrong.allocated = "all";
  wrong.visible = h100.gpus[3].uuid;
  wrong.env["GPULET_DRA_DEVICES"] = "gpu-2=" + h100.gpus[2].uuid;
  Pod bad(dir_.path(), "", wrong);
  EXPECT_NE(bad.WaitExit(), 0);
  EXPECT_THAT(bad.Log(), HasSubstr("GPULET_DRA_DEVICES names " + h100.gpus[2].uuid));
  EXPECT_THAT(bad.Log(), HasSubstr("seen, not allocated: " + h100.gpus[3].uuid));
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/slurmd-dra-bad/etc/gres.conf"));
}

// A Secret mounted beside slurm.conf (a JWT key, slurmdbd.conf) stays readable by its owner only
// in the pod's copy of the configuration, which every job user can list.
TEST_F(SlurmPodStandIns, ConfigurationCopiesKeepEachFilesModeAndOwner) {
  const std::string key = dir_.path() + "/jwt_hs256.key";
  WriteFile(key, "not-a-real-key\n");
  ASSERT_EQ(::chmod(key.c_str(), 0600), 0);
  WriteFile(dir_.path() + "/slurmdbd.conf", "StoragePass=x\n");
  ASSERT_EQ(::chmod((dir_.path() + "/slurmdbd.conf").c_str(), 0600), 0);
  const uid_t uid = ::geteuid() == 0 ? 64030 : ::geteuid();  // only root may give files away
  const gid_t gid = ::geteuid() == 0 ? 64031 : ::getegid();
  ASSERT_EQ(::chown(key.c_str(), uid, gid), 0);
  Pod pod(dir_.path(), "", Spec("slurmd-modes", FreshRecord()));
  RunToRegistration(pod);
  const std::string etc = dir_.path() + "/slurmd-modes/etc";
  struct stat st {};
  ASSERT_EQ(::stat((etc + "/jwt_hs256.key").c_str(), &st), 0) << pod.Log();
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_uid, uid);
  EXPECT_EQ(st.st_gid, gid);
  ASSERT_EQ(::stat((etc + "/slurmdbd.conf").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  ASSERT_EQ(::stat((etc + "/slurm.conf").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
}

// A pod limited by a CFS quota, under cgroup v1: CPUs= is the quota (half a CPU: 1), not the
// cpuset, and RealMemory= is memory.limit_in_bytes (512 MiB), not the host's MemTotal.
TEST_F(SlurmPodStandIns, CpusFollowTheCfsQuotaAndMemoryTheCgroupV1Limit) {
  const std::string cg = dir_.path() + "/cgroup";
  std::filesystem::create_directories(cg + "/cpu,cpuacct");
  std::filesystem::create_directories(cg + "/memory");
  WriteFile(cg + "/cpu,cpuacct/cpu.cfs_quota_us", "50000\n");
  WriteFile(cg + "/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  WriteFile(cg + "/memory/memory.limit_in_bytes", "536870912\n");
  Pod pod(dir_.path(), "", Spec("slurmd-cg", FreshRecord(), {"--cgroup-root", cg}));
  RunToRegistration(pod);
  EXPECT_THAT(SlurmdArgs("slurmd-cg"),
              HasSubstr("--conf\nCPUs=1 RealMemory=512 Gres=gpu:h100:1 Feature=gpu,pod,sim\n"))
      << pod.Log();
  // The GPU is not bound to cores of a node whose CPUs the container does not hold one by one.
  EXPECT_THAT(ReadFile(dir_.path() + "/slurmd-cg/etc/gres.conf"), Not(HasSubstr("Cores=")));
}

// slurmctld still holds the record an earlier pod of the same name left (a StatefulSet pod
// recreated): that is not this pod's registration. Its slurmd never registers, so the pod
// gives up at --register-timeout, naming what it saw.
TEST_F(SlurmPodStandIns, AStaleRecordOfAnEarlierPodIsNotRegistration) {
  Pod pod(dir_.path(), "",
          Spec("slurmd-stale",
               "\"NodeName=$4 State=IDLE+DYNAMIC_NORM SlurmdStartTime=2020-01-02T03:04:05\""));
  const int code = pod.WaitExit(std::chrono::seconds(30));
  if (code == -1) pod.Terminate();
  EXPECT_NE(code, 0) << pod.Log();
  EXPECT_NE(code, -1) << "still running: took the stale record for a registration\n" << pod.Log();
  EXPECT_THAT(pod.Log(), Not(HasSubstr("event=slurm_pod_registered")));
  EXPECT_THAT(pod.Log(), HasSubstr("did not register with slurmctld within 3s"));
  EXPECT_THAT(pod.Log(), HasSubstr("SlurmdStartTime=2020-01-02T03:04:05"));
}

}  // namespace
}  // namespace gpulet::slurm_testing
