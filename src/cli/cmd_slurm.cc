// gpulet slurm: describe this node to Slurm from the same discovery that feeds Kubernetes
// (gres), keep the node's drain state in line with GPU health (health), and show which job holds
// which GPU (jobs).
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "cli/commands.h"
#include "common/files.h"
#include "common/signals.h"
#include "gpu/health.h"
#include "slurm/drain.h"
#include "slurm/gres.h"
#include "slurm/id_list.h"
#include "slurm/jobs.h"
#include "slurm/node_cpus.h"

namespace gpulet::cli {
namespace {

namespace fs = std::filesystem;

std::string ShortHostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "";
  std::string h = buf;
  return h.substr(0, h.find('.'));
}

std::optional<std::string> ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

// CPUs, threads per core and memory for the slurm.conf line. Read from the discovery roots
// (sysfs devices/system/cpu, procfs meminfo); see slurm::CountCpus for a tree without CPU files
// (a simulated node's, or an unreadable one). A simulated node's memory is the host's.
void FillNodeFacts(const NodeContext& node, const gpu::Inventory& inv, slurm::GresOptions& o,
                   bool cpus_given, bool tpc_given, bool mem_given) {
  const std::string sys = node.discover.sysfs_root, proc = node.discover.procfs_root;
  if (!cpus_given) {
    std::vector<std::string> affinity;
    for (const gpu::Gpu& g : inv.gpus) affinity.push_back(g.cpu_affinity);
    const slurm::CpuCount c = slurm::CountCpus(sys, node.simulated, affinity);
    o.cpus = c.cpus;
    if (!c.warning.empty()) spdlog::warn("event=slurm_cpus_fallback msg=\"{}\"", c.warning);
  }
  // Cores= as Slurm's logical core indices, from the CPU topology (absent in a simulated tree:
  // then the CPU-id rule applies).
  if (Result<std::map<unsigned, unsigned>> index = slurm::ReadCoreIndex(sys); index.ok()) {
    o.core_index = std::move(index).value();
  }
  if (!tpc_given) {
    if (auto sib = ReadFirstLine(sys + "/devices/system/cpu/cpu0/topology/thread_siblings_list")) {
      if (auto ids = slurm::ParseIdList(*sib); ids && !ids->empty()) {
        o.threads_per_core = static_cast<unsigned>(ids->size());
      }
    }
  }
  if (!mem_given) {
    for (const std::string& meminfo : {proc + "/meminfo", std::string("/proc/meminfo")}) {
      std::ifstream in(meminfo);
      std::string key;
      uint64_t kb = 0;
      while (in >> key) {
        if (key == "MemTotal:" && (in >> kb)) break;
        in.ignore(1 << 16, '\n');
      }
      if (kb > 0) {
        o.real_memory_mib = kb / 1024;
        break;
      }
    }
  }
}

struct GresFlags {
  slurm::GresOptions opts;
  std::string print = "all";
  std::string output;
  std::string check;
  unsigned cpus = 0, threads_per_core = 0;
  uint64_t real_memory = 0;
};

int RunGres(const GlobalOptions& global, GresFlags& f) {
  if (f.opts.node_name.empty()) f.opts.node_name = ShortHostname();
  if (!slurm::IsValidNodeName(f.opts.node_name)) {  // before touching the driver
    return ReportError(Status(
        ErrorCode::kUsage, "--node-name \"" + f.opts.node_name + "\": not a valid Slurm hostname"));
  }
  Result<NodeContext> node = OpenNode(global);
  if (!node.ok()) return ReportError(node.status());
  Result<gpu::Inventory> inv = gpu::Discover(*node->nvml, node->discover);
  if (!inv.ok()) return ReportError(inv.status());
  if (f.cpus) f.opts.cpus = f.cpus;
  if (f.threads_per_core) f.opts.threads_per_core = f.threads_per_core;
  if (f.real_memory) f.opts.real_memory_mib = f.real_memory;
  FillNodeFacts(*node, *inv, f.opts, f.cpus != 0, f.threads_per_core != 0, f.real_memory != 0);
#ifdef GPULET_VERSION
  f.opts.generator = std::string("gpulet ") + GPULET_VERSION;
#else
  f.opts.generator = "gpulet";
#endif
  f.opts.source =
      "driver " + inv->driver_version + " (" +
      (node->simulated ? "simulated, fixture " + node->fixture_path : inv->nvml_library) + ")";
  Result<slurm::NodeGres> gres = slurm::PlanNodeGres(*inv, f.opts);
  if (!gres.ok()) return ReportError(gres.status());
  for (const std::string& w : gres->warnings) {
    spdlog::warn("event=slurm_gres_warning node={} warning=\"{}\"", f.opts.node_name, w);
  }

  if (!f.check.empty()) {
    std::ifstream in(f.check);
    if (!in) return ReportError(Status(ErrorCode::kNotFound, f.check + ": cannot read"));
    std::stringstream text;
    text << in.rdbuf();
    Result<slurm::ParsedGresConf> parsed =
        slurm::ParseGresConf(text.str(), f.check, f.opts.node_name);
    if (!parsed.ok()) return ReportError(parsed.status());
    std::vector<std::string> problems = slurm::CompareGres(*gres, *parsed, f.check);
    for (const std::string& p : problems) std::printf("%s\n", p.c_str());
    if (!problems.empty()) {
      return ReportError(Status(ErrorCode::kInvalidInput,
                                f.check + ": " + std::to_string(problems.size()) +
                                    " mismatch(es) with the hardware of node " + f.opts.node_name +
                                    " (slurmd would mark the node invalid or bind badly)"));
    }
    std::printf("%s: matches the hardware of node %s (%zu GRES records)\n", f.check.c_str(),
                f.opts.node_name.c_str(), gres->records.size());
    return 0;
  }

  std::string gres_conf = slurm::RenderGresConf(*inv, *gres, f.opts);
  std::string slurm_conf = slurm::RenderSlurmConf(*gres, f.opts);
  std::string text;
  if (f.print == "gres") {
    text = gres_conf;
  } else if (f.print == "slurm") {
    text = slurm_conf;
  } else {
    std::string commented;
    std::stringstream in(slurm_conf);
    for (std::string l; std::getline(in, l);) commented += "# slurm.conf: " + l + "\n";
    text = gres_conf + "#\n# Add to slurm.conf (GresTypes must list every GRES of the cluster):\n" +
           commented;
  }
  if (f.output.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  if (Status s = WriteFileAtomic(f.output, text); !s.ok()) return ReportError(s);
  spdlog::info("event=slurm_gres_written node={} path={} records={}", f.opts.node_name, f.output,
               gres->records.size());
  return 0;
}

struct HealthFlags {
  std::string node_name;
  std::string scontrol = "scontrol";
  double recovery_after_s = -1;  // <0: the policy's default
  double resync_s = 30;
  double probe_s = 1;
};

int RunHealth(const GlobalOptions& global, HealthFlags& f) {
  if (f.node_name.empty()) f.node_name = ShortHostname();
  if (!slurm::IsValidNodeName(f.node_name)) {
    return ReportError(Status(ErrorCode::kUsage,
                              "--node-name \"" + f.node_name + "\": not a valid Slurm hostname"));
  }
  const char* dis = std::getenv("DP_DISABLE_HEALTHCHECKS");
  const char* en = std::getenv("DP_ENABLE_HEALTHCHECKS");
  Result<gpu::HealthPolicy> policy = gpu::ParseHealthPolicy(dis ? dis : "", en ? en : "");
  if (!policy.ok()) return ReportError(policy.status());
  if (f.recovery_after_s >= 0) {
    policy->quiet_period = std::chrono::milliseconds(static_cast<long>(f.recovery_after_s * 1000));
  }
  // Slurm first: with scontrol missing or slurmctld down there is nothing to keep in line.
  auto runner = std::make_shared<slurm::ProcessRunner>();
  slurm::SlurmClient client(runner, f.scontrol);
  Result<slurm::NodeStatus> first = client.ShowNode(f.node_name);
  if (!first.ok()) return ReportError(first.status());

  Result<NodeContext> node = OpenNode(global);
  if (!node.ok()) return ReportError(node.status());
  Result<gpu::Inventory> inv = gpu::Discover(*node->nvml, node->discover);
  if (!inv.ok()) return ReportError(inv.status());

  const StopSignals signals = StopSignals::Block();  // before any thread starts: they inherit it

  gpu::HealthBoard board;
  Clock& clock = RealClock();
  gpu::HealthMonitorOptions mo;
  mo.policy = *policy;
  mo.probe_interval = std::chrono::milliseconds(static_cast<long>(f.probe_s * 1000));
  gpu::HealthMonitor monitor(node->nvml, *inv, mo, clock, board);
  if (Status s = monitor.Start(); !s.ok()) return ReportError(s);
  slurm::NodeDrainer drainer(client, f.node_name);
  spdlog::info("event=slurm_health_started node={} gpus={} state={} reason=\"{}\"", f.node_name,
               inv->gpus.size(), first->state, first->reason);

  const auto resync = std::chrono::milliseconds(static_cast<long>(f.resync_s * 1000));
  // The first decision waits for two probes, so a GPU that is still lost after a restart is seen
  // before a drain of ours gets resumed.
  auto next = clock.Now() + 2 * mo.probe_interval;
  uint64_t seen = 0;
  bool pending = true;
  std::string last_outcome;
  while (true) {
    if (signals.Wait(std::chrono::milliseconds(200)) == SignalEvent::kStop) break;
    gpu::HealthSnapshot snap = board.Current();
    if (snap.version != seen) pending = true;
    if (clock.Now() < next || (!pending && clock.Now() < next + resync)) continue;
    Result<slurm::DrainAction> a = drainer.Reconcile(snap);
    std::string outcome = a.ok() ? slurm::DrainActionName(*a) : a.status().message();
    if (a.ok() && (snap.version != seen || outcome != last_outcome)) {
      size_t unhealthy = 0;
      for (const auto& [uuid, h] : snap.devices) unhealthy += h.healthy ? 0 : 1;
      spdlog::info("event=slurm_reconciled node={} health_version={} unhealthy={} action={}",
                   f.node_name, snap.version, unhealthy, outcome);
    }
    if (!a.ok() && outcome != last_outcome) {
      spdlog::error("event=slurm_reconcile_failed node={} error=\"{}\"", f.node_name, outcome);
    } else if (a.ok() && *a == slurm::DrainAction::kLeftAdminDrain && outcome != last_outcome) {
      spdlog::warn("event=slurm_admin_drain_kept node={} unhealthy_reason=\"{}\"", f.node_name,
                   slurm::DrainReason(snap));
    }
    last_outcome = outcome;
    seen = snap.version;
    pending = !a.ok();
    next = clock.Now();
    if (!a.ok()) next += std::min(resync, std::chrono::milliseconds(5000));
  }
  monitor.Stop();
  return 0;
}

}  // namespace

void RegisterSlurmPod(CLI::App* slurm, GlobalOptions& global, int& exit_code);  // cmd_slurm_pod.cc

void RegisterSlurm(CLI::App& app, GlobalOptions& global, int& exit_code) {
  CLI::App* slurm = app.add_subcommand("slurm",
                                       "Describe this node to Slurm (gres.conf, slurm.conf), drain "
                                       "it on GPU faults, map jobs to GPUs");
  slurm->require_subcommand(1);

  auto gf = std::make_shared<GresFlags>();
  CLI::App* gres = slurm->add_subcommand(
      "gres",
      "Print this node's gres.conf lines and slurm.conf NodeName line, or --check a gres.conf");
  gres->add_option("--node-name", gf->opts.node_name, "Slurm node name (default: short hostname)")
      ->envname("GPULET_SLURM_NODE_NAME");
  gres->add_option("--dev-root", gf->opts.dev_root,
                   "Prefix for device paths (File=<dev-root>/dev/nvidia<N>); for tests and chroots")
      ->envname("GPULET_SLURM_DEV_ROOT");
  gres->add_option("--shards", gf->opts.shards,
                   "Shards per whole GPU (Name=shard Count=N); 0 = none")
      ->envname("GPULET_SLURM_SHARDS");
  gres->add_flag("--mps", gf->opts.mps, "Add Name=mps Count=100 per whole GPU")
      ->envname("GPULET_SLURM_MPS");
  gres->add_option("--type-override", gf->opts.type_override,
                   "GPU type to use instead of the one derived from the product name")
      ->envname("GPULET_SLURM_TYPE");
  gres->add_option("--cpus", gf->cpus, "CPUs= for the NodeName line (default: detected)");
  gres->add_option("--threads-per-core", gf->threads_per_core,
                   "ThreadsPerCore (default: detected); CPU ids become core ids for Cores=");
  gres->add_option("--real-memory", gf->real_memory, "RealMemory= in MiB (default: MemTotal)");
  gres->add_option("--print", gf->print,
                   "all: gres.conf plus the slurm.conf lines as comments; gres: gres.conf only; "
                   "slurm: GresTypes and NodeName lines only")
      ->check(CLI::IsMember({"all", "gres", "slurm"}))
      ->capture_default_str();
  gres->add_option("-o,--output", gf->output, "Write to FILE atomically instead of stdout");
  gres->add_option("--check", gf->check,
                   "Compare an existing gres.conf with the hardware; print each mismatch, exit 3 "
                   "on any");
  gres->callback([&global, &exit_code, gf] { exit_code = RunGres(global, *gf); });

  auto hf = std::make_shared<HealthFlags>();
  CLI::App* health = slurm->add_subcommand(
      "health",
      "Drain this Slurm node (reason \"gpulet: …\") while a GPU is unhealthy; resume it when "
      "healthy again, only if the drain is still ours");
  health->add_option("--node-name", hf->node_name, "Slurm node name (default: short hostname)")
      ->envname("GPULET_SLURM_NODE_NAME");
  health->add_option("--scontrol", hf->scontrol, "scontrol program")
      ->envname("GPULET_SCONTROL")
      ->capture_default_str();
  health
      ->add_option("--recovery-after", hf->recovery_after_s,
                   "Seconds without a new fault before a GPU counts as healthy again (0: never; "
                   "default 60)")
      ->envname("GPULET_HEALTH_RECOVERY_AFTER");
  health
      ->add_option("--resync-interval", hf->resync_s,
                   "Seconds between checks of the node's Slurm state when nothing changes")
      ->capture_default_str();
  health->add_option("--probe-interval", hf->probe_s, "Seconds between GPU probes")
      ->capture_default_str();
  health->callback([&global, &exit_code, hf] { exit_code = RunHealth(global, *hf); });

  auto jf = std::make_shared<slurm::JobMapperOptions>();
  CLI::App* jobs = slurm->add_subcommand(
      "jobs",
      "Show which Slurm job holds each GPU of this node (what the exporter's hpc_job label uses)");
  jobs->add_option("--node-name", jf->node_name, "Slurm node name (default: short hostname)")
      ->envname("GPULET_SLURM_NODE_NAME");
  jobs->add_option("--scontrol", jf->scontrol, "scontrol program")->envname("GPULET_SCONTROL");
  jobs->callback([&global, &exit_code, jf] {
    if (jf->node_name.empty()) jf->node_name = ShortHostname();
    Result<DiscoveredNode> node = DiscoverNode(global);
    if (!node.ok()) {
      exit_code = ReportError(node.status());
      return;
    }
    const gpu::Inventory* inv = &node->inventory;
    std::unique_ptr<slurm::JobMapper> mapper = slurm::JobMapper::ForNode(*inv, *jf);
    if (Status s = mapper->Refresh(); !s.ok()) {
      exit_code = ReportError(s);
      return;
    }
    slurm::JobsByGpuMap jobs_by_gpu = mapper->JobsByGpu();
    for (const gpu::Gpu& g : inv->gpus) {
      auto it = jobs_by_gpu.find(g.index);
      std::printf("GPU %u %s job=%s\n", g.index, g.uuid.c_str(),
                  it == jobs_by_gpu.end() ? "-" : it->second.c_str());
    }
    exit_code = 0;
  });

  RegisterSlurmPod(slurm, global, exit_code);
}

}  // namespace gpulet::cli
