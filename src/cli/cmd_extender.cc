// gpulet extender: the kube-scheduler HTTP extender for GPU memory requests
// (gpulet.io/gpu-memory-<unit>): filter, prioritize and bind verbs on the per-node GPU memory
// objects the node agents publish. See docs/memory-requests.md.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/clock.h"
#include "common/duration.h"
#include "common/files.h"
#include "common/signals.h"
#include "extender/equivalence.h"
#include "extender/replay.h"
#include "extender/scoring.h"
#include "extender/service.h"
#include "k8s/access.h"
#include "placement/policy.h"
#include "placement/trace.h"

namespace gpulet::cli {
namespace {

struct ExtenderFlags {
  std::string listen = "127.0.0.1:8888";
  std::string web_config_file;
  std::string kubeconfig;
  std::string ns = "gpulet-system";
  std::string policy = "fgd";
  std::string workload;
  std::string stale_after = "0";
  std::string reservation_timeout = "10m";
  std::vector<std::string> memory_resources;
  int threads = 8;
};

int RunExtender(const ExtenderFlags& f) {
  const StopSignals signals = StopSignals::Block();
  extender::ServiceOptions o;
  o.address = f.listen;
  o.web_config_file = f.web_config_file;
  o.threads = f.threads;
  o.view.ns = f.ns;
  auto placement = extender::PolicyFromFlags(f.policy, f.workload);
  if (!placement.ok()) return ReportError(placement.status());
  o.view.placement = *placement;
  if (!*placement) o.view.policy = extender::Policy::kSpread;
  auto stale = ParseDuration("--stale-after", f.stale_after);
  if (!stale.ok()) return ReportError(stale.status());
  o.view.stale_after = *stale;
  auto timeout = ParseDuration("--reservation-timeout", f.reservation_timeout);
  if (!timeout.ok()) return ReportError(timeout.status());
  if (timeout->count() <= 0) {
    return ReportError(Status(ErrorCode::kUsage, "--reservation-timeout: must be > 0"));
  }
  o.view.reservation_timeout = *timeout;
  o.view.memory_resources = f.memory_resources;
  auto access = k8s::ResolveClusterAccess(f.kubeconfig);
  if (!access.ok()) return ReportError(access.status());
  k8s::Client client(*access);
  extender::Service service(client, RealClock(), o);
  if (Status s = service.Start(); !s.ok()) return ReportError(s);
  const int sig = RunUntilStopped(signals, std::chrono::seconds(1), nullptr, nullptr);
  spdlog::info("event=extender_stopping signal={}", sig);
  service.Stop();
  return 0;
}

struct ReplayFlags {
  std::string trace_dir = "../shared/traces/alibaba-openb";
  std::string trace = "default";
  double load = 1.0;
  int publish_every = 16;
  bool compare = false;  // --compare-placements
  std::string policy = "fgd";
  bool policy_given = false;
  uint64_t seed = 42;
  size_t nodes = 0, pods = 0;
  std::string export_path;  // --export
};

// Live path = replay: the trace's one-GPU arrivals through the extender's verbs (in process: the
// same request and answer bodies, the pod store and the Binding in memory) and through the
// artifact replay; placements compared pod by pod (extender/equivalence.h).
int RunCompare(const ReplayFlags& f, const placement::Cluster& cluster,
               const std::vector<placement::Pod>& pods) {
  extender::EquivalenceOptions eo;
  eo.policy = f.policy;
  eo.seed = f.seed;
  eo.load = f.load;
  eo.max_nodes = f.nodes;
  eo.max_pods = f.pods;
  auto setup = extender::PrepareEquivalence(cluster, pods, eo);
  if (!setup.ok()) return ReportError(setup.status());
  auto r = extender::RunEquivalenceInProcess(*setup, eo);
  if (!r.ok()) return ReportError(r.status());
  std::printf(
      "trace %s, policy %s, seed %llu, load %.0f%%: %zu GPU nodes, %lld one-GPU arrivals\n"
      "pods compared %lld, identical placements %lld (placed %lld, not placed %lld)\n"
      "wall time: live path %.1f s, replay %.2f s\n",
      f.trace.c_str(), f.policy.c_str(), static_cast<unsigned long long>(f.seed), f.load * 100,
      setup->cluster.nodes.size(), static_cast<long long>(r->pods),
      static_cast<long long>(r->pods), static_cast<long long>(r->identical),
      static_cast<long long>(r->placed), static_cast<long long>(r->failed), r->live_seconds,
      r->replay_seconds);
  for (const std::string& d : r->differences) std::printf("  differs: %s\n", d.c_str());
  if (!f.export_path.empty()) {
    Status s = WriteFileAtomic(f.export_path, extender::EquivalenceExport(*setup, *r).dump());
    if (!s.ok()) return ReportError(s);
  }
  return r->identical == r->pods ? 0 : 1;
}

int RunReplay(const ReplayFlags& f) {
  auto cluster = placement::LoadNodes(placement::GpuNodeListPath(f.trace_dir));
  if (!cluster.ok()) return ReportError(cluster.status());
  auto pods = placement::LoadPods(placement::TraceVariantPath(f.trace_dir, f.trace), *cluster);
  if (!pods.ok()) return ReportError(pods.status());
  if (f.compare) return RunCompare(f, *cluster, *pods);
  extender::ReplayOptions o;
  o.offered_load = f.load;
  o.publish_every = f.publish_every;
  if (f.policy_given) {  // the trace itself is the workload FGD measures against
    auto scorer = extender::PolicyFromFlags(
        f.policy, placement::TraceVariantPath(f.trace_dir, f.trace));
    if (!scorer.ok()) return ReportError(scorer.status());
    o.placement = *scorer;
  }
  auto r = extender::ReplayMemoryRequests(*cluster, *pods, o);
  if (!r.ok()) return ReportError(r.status());
  std::printf(
      "trace %s: %lld GPU nodes, %lld GPUs, %lld GiB units, %lld GPU-sharing pods "
      "(offered until %.0f%% of the units)\n",
      f.trace.c_str(), static_cast<long long>(r->nodes), static_cast<long long>(r->gpus),
      static_cast<long long>(r->fleet_units), static_cast<long long>(r->sharing_pods),
      f.load * 100);
  std::printf("extender prioritize: %s\n",
              o.placement ? f.policy.c_str() : "its own best fit (no --policy)");
  std::printf("%-22s %9s %9s %19s %14s %13s\n", "scheduler", "offered", "admitted",
              "refused-by-kubelet", "unschedulable", "placed-units");
  for (const auto& [name, c] : {std::pair{"with extender", r->with_extender},
                                std::pair{"node totals only", r->node_totals_only}}) {
    std::printf("%-22s %9lld %9lld %19lld %14lld %13lld\n", name, static_cast<long long>(c.offered),
                static_cast<long long>(c.admitted), static_cast<long long>(c.refused_by_kubelet),
                static_cast<long long>(c.unschedulable), static_cast<long long>(c.placed_units));
  }
  return 0;
}

}  // namespace

void RegisterExtender(CLI::App& app, GlobalOptions& /*global*/, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "extender",
      "kube-scheduler extender for GPU memory requests: filter, prioritize, bind "
      "(docs/memory-requests.md)");
  auto f = std::make_shared<ExtenderFlags>();
  cmd->add_option("--listen", f->listen,
                  "[host]:port to serve POST /filter /prioritize /bind, GET /healthz /metrics; "
                  "plain HTTP, or TLS without client certificates, only on loopback")
      ->envname("GPULET_EXTENDER_LISTEN")
      ->capture_default_str();
  cmd->add_option("--web-config-file", f->web_config_file,
                  "TLS certificate and key (tls_server_config), as the exporter's web config; off "
                  "loopback it must require client certificates (RequireAndVerifyClientCert)")
      ->envname("GPULET_EXTENDER_WEB_CONFIG_FILE");
  cmd->add_option("--kubeconfig", f->kubeconfig, "kubeconfig (default: in-cluster)")
      ->envname("KUBECONFIG");
  cmd->add_option("--namespace", f->ns, "Namespace of the per-node gpulet-memory-<node> objects")
      ->envname("POD_NAMESPACE")
      ->capture_default_str();
  cmd->add_option("--policy", f->policy,
                  "Prioritize: a placement policy as `gpulet replay --policy` names it (random, "
                  "dotprod, gpuclustering, gpupacking, bestfit, fgd, fgd-bestfit), or spread "
                  "(docs/placement.md)")
      ->envname("GPULET_EXTENDER_POLICY")
      ->capture_default_str();
  cmd->add_option("--workload", f->workload,
                  "Pod list (openb CSV columns) whose typical pods fgd and fgd-bestfit measure "
                  "fragmentation against; required by those two")
      ->envname("GPULET_EXTENDER_WORKLOAD");
  cmd->add_option("--stale-after", f->stale_after,
                  "A node's object unchanged this long is stale (0: 3 x its heartbeatSeconds)")
      ->envname("GPULET_EXTENDER_STALE_AFTER")
      ->capture_default_str();
  cmd->add_option("--reservation-timeout", f->reservation_timeout,
                  "Last resort: how long units reserved at bind are held if neither the node "
                  "lists the pod nor the API server shows it gone")
      ->envname("GPULET_EXTENDER_RESERVATION_TIMEOUT")
      ->capture_default_str();
  cmd->add_option("--memory-resource", f->memory_resources,
                  "A renamed memory pool's resource (sharing.memory rename:), recognised before "
                  "any node publishes it; repeatable")
      ->envname("GPULET_EXTENDER_MEMORY_RESOURCES")
      ->delimiter(',');
  cmd->add_option("--threads", f->threads, "Worker threads for the verbs")
      ->envname("GPULET_EXTENDER_THREADS")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  auto rf = std::make_shared<ReplayFlags>();
  CLI::App* replay = cmd->add_subcommand(
      "replay",
      "Replay a trace's GPU-sharing pods as memory requests: pods the kubelet would refuse, with "
      "and without the extender's per-GPU filter");
  replay->add_option("--trace-dir", rf->trace_dir, "Directory of the Alibaba openb trace")
      ->capture_default_str();
  replay->add_option("--trace", rf->trace, "Pod list variant (openb_pod_list_<name>.csv)")
      ->capture_default_str();
  replay->add_option("--load", rf->load, "Stop arrivals once this share of the units was asked")
      ->check(CLI::Range(0.01, 10.0))
      ->capture_default_str();
  replay
      ->add_option("--publish-every", rf->publish_every,
                   "Binds between two publications of the node objects")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  replay->add_flag("--compare-placements", rf->compare,
                   "Live path = replay: the one-GPU arrivals of the artifact protocol through the "
                   "extender's verbs and through `gpulet replay`'s code, placements compared pod "
                   "by pod (exit 1 if any differs); --load defaults to 1.3 here");
  replay
      ->add_option("--policy", rf->policy,
                   "The extender's placement policy (with --compare-placements: fgd if not "
                   "given; without: the extender's own best fit if not given, and the trace is "
                   "FGD's workload)")
      ->capture_default_str();
  replay->add_option("--seed", rf->seed, "With --compare-placements: the arrivals' seed")
      ->capture_default_str();
  replay->add_option("--nodes", rf->nodes,
                     "With --compare-placements: the first N GPU nodes only (0: all)")
      ->capture_default_str();
  replay->add_option("--pods", rf->pods,
                     "With --compare-placements: the first N arrivals only (0: all)")
      ->capture_default_str();
  replay->add_option("--export", rf->export_path,
                     "With --compare-placements: write the nodes, their memory objects, the "
                     "arrivals and the replay's placements as JSON to this file (for a live side "
                     "outside the process: the real kube-scheduler, bench/fleet)");
  replay->callback([rf, replay, &exit_code] {
    if (rf->compare && replay->count("--load") == 0) rf->load = 1.3;
    rf->policy_given = replay->count("--policy") > 0;
    exit_code = RunReplay(*rf);
  });
  cmd->callback([f, cmd, replay, &exit_code] {
    if (cmd->got_subcommand(replay)) return;
    exit_code = RunExtender(*f);
  });
}

}  // namespace gpulet::cli
