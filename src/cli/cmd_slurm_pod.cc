// gpulet slurm pod: the entrypoint of a slurmd pod (Slurm on Kubernetes). It checks that the GPUs
// NVML shows in this container are the ones the device plugin allocated, writes gres.conf for
// exactly those, registers the pod as a Slurm dynamic node (`slurmd -Z`, Slurm 22.05+) and runs
// slurmd in the foreground; it drains the node while a GPU is unhealthy, labels the pod busy/idle
// for the PodDisruptionBudget, and on SIGTERM drains, waits for the jobs, deletes the node and
// exits 0. The decisions live in slurm/pod.h; this file is the wiring. See
// docs/slurm-pod-entrypoint.md.
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "cli/commands.h"
#include "common/process.h"
#include "common/signals.h"
#include "deviceplugin/allocate.h"
#include "gpu/health.h"
#include "k8s/access.h"
#include "k8s/client.h"
#include "slurm/drain.h"
#include "slurm/gres.h"
#include "slurm/id_list.h"
#include "slurm/pod.h"

namespace gpulet::cli {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

struct PodFlags {
  slurm::GresOptions opts;
  std::string pod_labels_file = "/etc/podinfo/labels";
  std::string pod_annotations_file = "/etc/podinfo/annotations";
  std::string partition;
  std::string slurm_conf;
  std::string conf_dir = "/run/gpulet-slurm";
  std::string cgroup_root = "/sys/fs/cgroup";
  unsigned cpus = 0;
  uint64_t real_memory = 0;
  std::string slurmd = "slurmd";
  std::string scontrol = "scontrol";
  std::vector<std::string> slurmd_args;
  std::string slurmd_log = "/dev/stderr";
  std::string poll = "2s";
  std::string register_timeout = "60s";
  std::string drain_timeout = "0";
  std::string kubeconfig;
  double probe_s = 1;
  double recovery_after_s = -1;
};

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// The CPUs this process may run on (the container's cpuset).
std::set<unsigned> AllowedCpus() {
  std::set<unsigned> out;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (unsigned c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.insert(c);
  }
  return out;
}

uint64_t MemTotalKib(const std::string& meminfo) {
  std::ifstream in(meminfo);
  std::string key;
  uint64_t kb = 0;
  while (in >> key) {
    if (key == "MemTotal:" && (in >> kb)) return kb;
    in.ignore(1 << 16, '\n');
  }
  return 0;
}

// Where this container's allocation is read from: GPULET_DRA_DEVICES when gpulet's DRA driver
// prepared its devices (its claims' CDI edits set it; NVIDIA_VISIBLE_DEVICES may then be a CUDA
// image's "all"), else the device plugin's NVIDIA_VISIBLE_DEVICES.
std::string AllocationSource() {
  return Env(slurm::kDraDevicesEnv).empty() ? "NVIDIA_VISIBLE_DEVICES" : slurm::kDraDevicesEnv;
}

// GPULET_DRA_DEVICES; NVIDIA_VISIBLE_DEVICES, or the device list the volume-mounts strategy
// encodes in mount names.
Result<std::vector<std::string>> AllocatedDevices() {
  if (AllocationSource() == slurm::kDraDevicesEnv) {
    return slurm::ParseDraDevices(Env(slurm::kDraDevicesEnv));
  }
  const std::string v = Env("NVIDIA_VISIBLE_DEVICES");
  if (v == deviceplugin::kVolumeMountsRoot) {
    std::vector<std::string> ids;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(v, ec)) ids.push_back(e.path().filename());
    std::sort(ids.begin(), ids.end());
    std::string joined;
    for (const std::string& id : ids) joined += (joined.empty() ? "" : ",") + id;
    return slurm::ParseAllocatedDevices(joined);
  }
  return slurm::ParseAllocatedDevices(v);
}

// Labels this pod busy/idle; inert (one warning) outside a cluster.
class BusyLabeler {
 public:
  explicit BusyLabeler(const std::string& kubeconfig) {
    namespace_ = Env("POD_NAMESPACE");
    pod_ = Env("POD_NAME");
    Result<k8s::ClusterAccess> access = k8s::ResolveClusterAccess(kubeconfig);
    if (!access.ok() || namespace_.empty() || pod_.empty()) {
      spdlog::warn("event=slurm_pod_label_skipped msg=\"not labelling the pod {}: {}\"", kPodBusy(),
                   !access.ok() ? access.status().message() : "POD_NAMESPACE/POD_NAME not set");
      return;
    }
    client_ = std::make_unique<k8s::Client>(*access);
  }
  static const char* kPodBusy() { return slurm::kPodBusyLabel; }
  // Patches when `busy` differs from the last value written (retries on the next call after a
  // failure).
  void Set(bool busy) {
    if (!client_ || (known_ && busy == last_)) return;
    const std::string path = "/api/v1/namespaces/" + namespace_ + "/pods/" + pod_;
    auto r = client_->Patch(path, nlohmann::json::parse(slurm::BusyLabelPatch(busy)),
                            k8s::PatchType::kMerge);
    if (!r.ok()) {
      spdlog::warn("event=slurm_pod_label_failed busy={} error=\"{}\"", busy, r.status().message());
      known_ = false;
      return;
    }
    known_ = true;
    last_ = busy;
    spdlog::info("event=slurm_pod_labelled pod={}/{} {}={}", namespace_, pod_, kPodBusy(), busy);
  }

 private:
  std::unique_ptr<k8s::Client> client_;
  std::string namespace_, pod_;
  bool known_ = false, last_ = false;
};

// Reaps children that ended (as PID 1 of a pod this process also inherits slurmstepd's orphans).
// True when `slurmd` was among them; *status then holds its wait status.
bool ReapChildren(pid_t slurmd, int* status) {
  bool slurmd_done = false;
  while (true) {
    int st = 0;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p <= 0) break;
    if (p == slurmd) slurmd_done = true, *status = st;
  }
  return slurmd_done;
}

int RunPod(const GlobalOptions& global, PodFlags& f) {
  std::string& name = f.opts.node_name;
  if (name.empty()) name = Env("POD_NAME");
  if (name.empty()) {
    char buf[256] = {};
    if (gethostname(buf, sizeof buf - 1) == 0) name = buf;
  }
  if (!slurm::IsValidNodeName(name)) {
    return ReportError(
        Status(ErrorCode::kUsage, "--node-name \"" + name + "\": not a valid Slurm hostname"));
  }
  Result<milliseconds> poll = ParseDuration("--poll-interval", f.poll);
  Result<milliseconds> reg_timeout = ParseDuration("--register-timeout", f.register_timeout);
  Result<milliseconds> drain_timeout = ParseDuration("--drain-timeout", f.drain_timeout);
  for (const Status& s : {poll.status(), reg_timeout.status(), drain_timeout.status()}) {
    if (!s.ok()) return ReportError(s);
  }
  std::map<std::string, std::string> labels =
      slurm::ParsePodLabels(ReadText(f.pod_labels_file));  // absent file: no labels
  // A label value cannot hold a comma, so a list of features comes from the annotation of the
  // same name (same file format), added to the label's one.
  const std::map<std::string, std::string> annotations =
      slurm::ParsePodLabels(ReadText(f.pod_annotations_file));
  if (auto it = annotations.find(slurm::kPodFeaturesLabel); it != annotations.end()) {
    std::string& list = labels[slurm::kPodFeaturesLabel];
    list = list.empty() ? it->second : list + "," + it->second;
  }
  Result<std::vector<std::string>> features = slurm::NodeFeatures(labels, f.partition);
  if (!features.ok()) return ReportError(features.status());

  // The two views of this container's GPUs must agree before Slurm hears of any.
  Result<std::vector<std::string>> allocated = AllocatedDevices();
  if (!allocated.ok()) return ReportError(allocated.status());
  Result<DiscoveredNode> node = DiscoverNode(global);
  if (!node.ok()) return ReportError(node.status());
  const gpu::Inventory& inv = node->inventory;
  Result<slurm::PodDevices> devices = slurm::MatchAllocation(inv, *allocated, AllocationSource());
  if (!devices.ok()) return ReportError(devices.status());

  const std::set<unsigned> allowed = AllowedCpus();
  std::map<unsigned, unsigned> topology;
  if (auto t = slurm::ReadCoreIndex(node->context.discover.sysfs_root); t.ok()) topology = *t;
  f.opts.core_index = slurm::ContainerCoreIndex(allowed, topology);
  const slurm::CgroupLimits limits = slurm::ReadCgroupLimits(f.cgroup_root);
  f.opts.cpus = f.cpus ? f.cpus : slurm::ContainerCpus(allowed.size(), limits.cpu_quota);
  f.opts.real_memory_mib =
      f.real_memory ? f.real_memory
                    : slurm::ContainerMemoryMib(limits.memory_limit, MemTotalKib("/proc/meminfo"));
  spdlog::info(
      "event=slurm_pod_resources node={} cpus={} cpuset_cpus={} cpu_quota={} cpu_source=\"{}\" "
      "real_memory_mib={} memory_limit=\"{}\" memory_source=\"{}\"",
      name, f.opts.cpus, allowed.size(),
      limits.cpu_quota ? std::to_string(*limits.cpu_quota) : std::string("none"), limits.cpu_source,
      f.opts.real_memory_mib, limits.memory_limit, limits.memory_source);
  // Fewer CPUs than the cpuset holds (a CFS quota): the container runs on any of them, so no
  // core of the node stands for a particular CPU, and gres.conf binds no GPU to cores.
  gpu::Inventory unbound;
  const gpu::Inventory* for_gres = &inv;
  if (f.opts.cpus < allowed.size()) {
    unbound = inv;
    for (gpu::Gpu& g : unbound.gpus) g.cpu_affinity.clear();
    for_gres = &unbound;
  }
  f.opts.generator = std::string("gpulet ") + GPULET_VERSION + " slurm pod";
  f.opts.source = "driver " + inv.driver_version + " in this container (" + AllocationSource() +
                  "=" + Env(AllocationSource().c_str()) + ")";
  Result<slurm::NodeGres> gres = slurm::PlanNodeGres(*for_gres, f.opts);
  if (!gres.ok()) return ReportError(gres.status());
  for (const std::string& w : gres->warnings) {
    spdlog::warn("event=slurm_gres_warning node={} warning=\"{}\"", name, w);
  }
  if (f.slurm_conf.empty()) f.slurm_conf = "/etc/slurm/slurm.conf";
  Result<std::string> conf = slurm::PrepareConfDir(f.slurm_conf, f.conf_dir,
                                                   slurm::RenderGresConf(*for_gres, *gres, f.opts));
  if (!conf.ok()) return ReportError(conf.status());
  setenv("SLURM_CONF", conf->c_str(), 1);  // for scontrol, and slurmd's children
  // SlurmdStartTime as RegisteredSince reads it, whatever the pod's environment asked for.
  setenv("SLURM_TIME_FORMAT", "standard", 1);
  const std::string dynamic_conf =
      slurm::DynamicNodeConf(*gres, f.opts.cpus, f.opts.real_memory_mib, *features);

  const char* dis = std::getenv("DP_DISABLE_HEALTHCHECKS");
  const char* en = std::getenv("DP_ENABLE_HEALTHCHECKS");
  Result<gpu::HealthPolicy> policy = gpu::ParseHealthPolicy(dis ? dis : "", en ? en : "");
  if (!policy.ok()) return ReportError(policy.status());
  if (f.recovery_after_s >= 0) {
    policy->quiet_period = milliseconds(static_cast<long>(f.recovery_after_s * 1000));
  }

  const StopSignals signals = StopSignals::Block();  // before any thread starts: they inherit it
  const auto slurmd_started = std::chrono::system_clock::now();
  std::vector<std::string> argv = {f.slurmd, "-D",  "-Z",     "-N",        name,
                                   "-f",     *conf, "--conf", dynamic_conf};
  argv.insert(argv.end(), f.slurmd_args.begin(), f.slurmd_args.end());
  Result<pid_t> slurmd = SpawnProcess(argv, std::nullopt, f.slurmd_log);
  if (!slurmd.ok()) return ReportError(slurmd.status());
  spdlog::info(
      "event=slurm_pod_started node={} gpus={} mig_devices={} conf=\"{}\" slurm_conf={} "
      "slurmd_pid={}",
      name, devices->gpus.size(), devices->migs.size(), dynamic_conf, *conf, *slurmd);

  auto runner = std::make_shared<slurm::ProcessRunner>();
  slurm::PodNode pod(runner, name, f.scontrol);
  slurm::NodeDrainer drainer(pod.client(), name);
  BusyLabeler labeler(f.kubeconfig);
  Clock& clock = RealClock();
  gpu::HealthBoard board;
  gpu::HealthMonitorOptions mo;
  mo.policy = *policy;
  mo.probe_interval = milliseconds(static_cast<long>(f.probe_s * 1000));
  gpu::HealthMonitor monitor(node->context.nvml, inv, mo, clock, board);
  if (Status s = monitor.Start(); !s.ok()) {
    StopProcess(*slurmd, std::chrono::seconds(10));
    return ReportError(s);
  }

  int slurmd_status = 0;
  bool slurmd_exited = false;
  auto slurmd_gone = [&] {
    if (!slurmd_exited) slurmd_exited = ReapChildren(*slurmd, &slurmd_status);
    return slurmd_exited;
  };
  auto fail_slurmd = [&] {
    monitor.Stop();
    return ReportError(Status(ErrorCode::kUnavailable,
                              "slurmd exited (wait status " + std::to_string(slurmd_status) +
                                  "); see its log (--slurmd-log " + f.slurmd_log + ")"));
  };

  // Registered once slurmctld holds the node as registered by the slurmd started above: a record
  // of an earlier pod of the same name (slurmctld keeps it until deleted) does not count.
  bool stop = false, registered = false;
  const auto reg_deadline = clock.Now() + *reg_timeout;
  std::string last_seen = "no record";
  while (!registered && !stop) {
    if (slurmd_gone()) return fail_slurmd();
    Result<slurm::NodeStatus> seen = pod.client().ShowNode(name);
    if (seen.ok() && slurm::RegisteredSince(*seen, slurmd_started)) {
      registered = true;
      break;
    }
    if (seen.ok()) {
      last_seen = "a record with State=" + seen->state + " SlurmdStartTime=" +
                  (seen->slurmd_start_time.empty() ? "<none>" : seen->slurmd_start_time) +
                  ", from before this pod's slurmd started";
    }
    if (clock.Now() > reg_deadline) {
      StopProcess(*slurmd, std::chrono::seconds(10));
      monitor.Stop();
      return ReportError(Status(ErrorCode::kUnavailable,
                                "node " + name + " did not register with slurmctld within " +
                                    f.register_timeout + " (slurmctld has " + last_seen + ")"));
    }
    stop = signals.Wait(milliseconds(200)) == SignalEvent::kStop;
  }
  if (registered) spdlog::info("event=slurm_pod_registered node={}", name);

  // Running: health → drain, jobs → busy label.
  uint64_t health_seen = 0;
  bool health_drained = false;
  auto next_check = clock.Now();
  while (!stop) {
    if (slurmd_gone()) return fail_slurmd();
    if (clock.Now() >= next_check) {
      next_check = clock.Now() + *poll;
      Result<slurm::NodeStatus> st = pod.client().ShowNode(name);
      if (st.ok()) labeler.Set(slurm::NodeBusy(*st));
      gpu::HealthSnapshot snap = board.Current();
      const bool unhealthy = !slurm::DrainReason(snap).empty();
      // Touch only a drain this pod made for health: an admin's drain, or another "gpulet:"
      // drain (the broker scaling the pool down), keeps jobs off already and is not ours to
      // reword or undo.
      const bool ours = st.ok() && st->reason.rfind("gpulet: GPU ", 0) == 0;
      const bool others = st.ok() && st->drained() && !ours;
      if (st.ok() && !others && (unhealthy || (health_drained && ours))) {
        Result<slurm::DrainAction> a = drainer.Reconcile(snap);
        if (a.ok() && (snap.version != health_seen || *a != slurm::DrainAction::kNone)) {
          spdlog::info("event=slurm_pod_health node={} health_version={} action={} reason=\"{}\"",
                       name, snap.version, slurm::DrainActionName(*a), slurm::DrainReason(snap));
        }
        if (!a.ok()) {
          spdlog::error("event=slurm_pod_health_failed node={} error=\"{}\"", name,
                        a.status().message());
        } else {
          health_drained = unhealthy;
          health_seen = snap.version;
        }
      }
    }
    stop = signals.Wait(std::min(*poll, milliseconds(200))) == SignalEvent::kStop;
  }

  // SIGTERM: drain, let every job finish, then leave Slurm. A job is never killed here.
  spdlog::info("event=slurm_pod_terminating node={} signal={}", name, signals.last());
  monitor.Stop();
  const auto drain_deadline = clock.Now() + *drain_timeout;
  auto keep_waiting = [&](milliseconds d) {
    if (drain_timeout->count() > 0 && clock.Now() > drain_deadline) return false;
    if (signals.Wait(d) == SignalEvent::kStop) {
      spdlog::info("event=slurm_pod_still_draining node={} msg=\"jobs are still running\"", name);
    }
    return !slurmd_gone();
  };
  while (true) {
    Result<slurm::PodNode::DrainOutcome> d = pod.DrainForTermination();
    if (d.ok()) {
      spdlog::info("event=slurm_pod_drained node={} outcome={}", name,
                   *d == slurm::PodNode::DrainOutcome::kDrained ? "drained" : "admin_drain_kept");
      break;
    }
    if (d.status().code() == ErrorCode::kNotFound) break;  // never registered, or already gone
    spdlog::warn("event=slurm_pod_drain_failed node={} error=\"{}\"", name, d.status().message());
    if (!keep_waiting(*poll)) break;
  }
  bool deleted = false;
  while (true) {
    Result<slurm::NodeStatus> idle = pod.WaitIdle(*poll, keep_waiting);
    if (!idle.ok() && idle.status().code() != ErrorCode::kNotFound) {
      spdlog::error("event=slurm_pod_wait_failed node={} error=\"{}\"", name,
                    idle.status().message());
      break;
    }
    Status s = pod.Delete();
    if (s.ok()) {
      deleted = true;
      break;
    }
    spdlog::warn("event=slurm_pod_delete_failed node={} error=\"{}\"", name, s.message());
    if (!keep_waiting(*poll)) break;
  }
  if (deleted) {
    labeler.Set(false);
    spdlog::info("event=slurm_pod_deleted node={}", name);
  }
  if (!slurmd_gone()) StopProcess(*slurmd, std::chrono::seconds(10));
  if (!deleted) {
    return ReportError(Status(ErrorCode::kUnavailable,
                              "node " + name + " was not deleted from Slurm (see above)"));
  }
  return 0;
}

}  // namespace

void RegisterSlurmPod(CLI::App* slurm, GlobalOptions& global, int& exit_code) {
  auto f = std::make_shared<PodFlags>();
  CLI::App* pod = slurm->add_subcommand(
      "pod",
      "Entrypoint of a slurmd pod: check the container's GPUs against the device plugin's "
      "allocation, write gres.conf for them, register as a Slurm dynamic node (slurmd -Z) and "
      "drain, wait for jobs and delete the node on SIGTERM");
  pod->add_option("--node-name", f->opts.node_name,
                  "Slurm node name (default: $POD_NAME, else the hostname)")
      ->envname("GPULET_SLURM_NODE_NAME");
  pod->add_option("--pod-labels-file", f->pod_labels_file,
                  "Downward-API labels file (slurm.gpulet.io/partition, slurm.gpulet.io/features); "
                  "absent = no partition or features")
      ->capture_default_str();
  pod->add_option("--pod-annotations-file", f->pod_annotations_file,
                  "Downward-API annotations file: the annotation slurm.gpulet.io/features holds a "
                  "comma list of features (a label value cannot); absent = none")
      ->capture_default_str();
  pod->add_option("--partition", f->partition,
                  "Partition feature (overrides the slurm.gpulet.io/partition label)")
      ->envname("GPULET_SLURM_PARTITION");
  pod->add_option("--slurm-conf", f->slurm_conf,
                  "slurm.conf to run with (default /etc/slurm/slurm.conf)")
      ->envname("SLURM_CONF");
  pod->add_option("--conf-dir", f->conf_dir,
                  "Writable directory for this pod's copy of the Slurm configuration and its "
                  "gres.conf")
      ->envname("GPULET_SLURM_CONF_DIR")
      ->capture_default_str();
  pod->add_option("--dev-root", f->opts.dev_root,
                  "Prefix for device paths in gres.conf (File=<dev-root>/dev/nvidia<N>); for tests")
      ->envname("GPULET_SLURM_DEV_ROOT");
  pod->add_option("--shards", f->opts.shards,
                  "Shards per GPU (Name=shard Count=N), e.g. the replicas of a shared GPU the pod "
                  "holds; 0 = none")
      ->envname("GPULET_SLURM_SHARDS");
  pod->add_flag("--mps", f->opts.mps, "Add Name=mps Count=100 per whole GPU")
      ->envname("GPULET_SLURM_MPS");
  pod->add_option("--type-override", f->opts.type_override,
                  "GPU type to use instead of the one derived from the product name")
      ->envname("GPULET_SLURM_TYPE");
  pod->add_option("--cpus", f->cpus,
                  "CPUs= (default: the CPUs of this container's cpuset, at most ceil(CFS quota / "
                  "period))");
  pod->add_option("--real-memory", f->real_memory,
                  "RealMemory= in MiB (default: the cgroup v2 or v1 memory limit, capped by "
                  "MemTotal)");
  pod->add_option("--cgroup-root", f->cgroup_root, "Where this container's cgroup is mounted")
      ->capture_default_str();
  pod->add_option("--slurmd", f->slurmd, "slurmd program")
      ->envname("GPULET_SLURMD")
      ->capture_default_str();
  pod->add_option("--scontrol", f->scontrol, "scontrol program")
      ->envname("GPULET_SCONTROL")
      ->capture_default_str();
  pod->add_option("--slurmd-arg", f->slurmd_args, "Extra slurmd argument (repeatable)");
  pod->add_option("--slurmd-log", f->slurmd_log, "Where slurmd's stdout/stderr go")
      ->capture_default_str();
  pod->add_option("--poll-interval", f->poll,
                  "How often the node's Slurm state is read (busy label, health, drain wait)")
      ->capture_default_str();
  pod->add_option("--register-timeout", f->register_timeout,
                  "How long slurmd may take to register the node")
      ->capture_default_str();
  pod->add_option("--drain-timeout", f->drain_timeout,
                  "Give up waiting for jobs after this long on SIGTERM (0 = wait until killed; "
                  "the pod's terminationGracePeriodSeconds bounds it)")
      ->capture_default_str();
  pod->add_option("--kubeconfig", f->kubeconfig,
                  "Kubeconfig for labelling the pod (default: in-cluster service account)")
      ->envname("KUBECONFIG");
  pod->add_option("--probe-interval", f->probe_s, "Seconds between GPU health probes")
      ->capture_default_str();
  pod->add_option("--recovery-after", f->recovery_after_s,
                  "Seconds without a new fault before a GPU counts as healthy again (0: never)")
      ->envname("GPULET_HEALTH_RECOVERY_AFTER");
  pod->callback([&global, &exit_code, f] { exit_code = RunPod(global, *f); });
}

}  // namespace gpulet::cli
