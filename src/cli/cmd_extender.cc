// gpulet extender: the kube-scheduler HTTP extender for GPU memory requests
// (gpulet.io/gpu-memory-<unit>): filter, prioritize and bind verbs on the per-node GPU memory
// objects the node agents publish. See docs/memory-requests.md.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/clock.h"
#include "common/duration.h"
#include "common/signals.h"
#include "extender/replay.h"
#include "extender/service.h"
#include "k8s/access.h"
#include "placement/trace.h"

namespace gpulet::cli {
namespace {

struct ExtenderFlags {
  std::string listen = "127.0.0.1:8888";
  std::string web_config_file;
  std::string kubeconfig;
  std::string ns = "gpulet-system";
  std::string policy = "bestfit";
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
  auto policy = extender::ParsePolicy(f.policy);
  if (!policy.ok()) return ReportError(policy.status());
  o.view.policy = *policy;
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
};

int RunReplay(const ReplayFlags& f) {
  auto cluster = placement::LoadNodes(placement::GpuNodeListPath(f.trace_dir));
  if (!cluster.ok()) return ReportError(cluster.status());
  auto pods = placement::LoadPods(placement::TraceVariantPath(f.trace_dir, f.trace), *cluster);
  if (!pods.ok()) return ReportError(pods.status());
  extender::ReplayOptions o;
  o.offered_load = f.load;
  o.publish_every = f.publish_every;
  auto r = extender::ReplayMemoryRequests(*cluster, *pods, o);
  if (!r.ok()) return ReportError(r.status());
  std::printf(
      "trace %s: %lld GPU nodes, %lld GPUs, %lld GiB units, %lld GPU-sharing pods "
      "(offered until %.0f%% of the units)\n",
      f.trace.c_str(), static_cast<long long>(r->nodes), static_cast<long long>(r->gpus),
      static_cast<long long>(r->fleet_units), static_cast<long long>(r->sharing_pods),
      f.load * 100);
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
                  "plain HTTP only on loopback")
      ->envname("GPULET_EXTENDER_LISTEN")
      ->capture_default_str();
  cmd->add_option("--web-config-file", f->web_config_file,
                  "TLS certificate and key (tls_server_config), as the exporter's web config")
      ->envname("GPULET_EXTENDER_WEB_CONFIG_FILE");
  cmd->add_option("--kubeconfig", f->kubeconfig, "kubeconfig (default: in-cluster)")
      ->envname("KUBECONFIG");
  cmd->add_option("--namespace", f->ns, "Namespace of the per-node gpulet-memory-<node> objects")
      ->envname("POD_NAMESPACE")
      ->capture_default_str();
  cmd->add_option("--policy", f->policy, "Prioritize: bestfit (least leftover) or spread")
      ->envname("GPULET_EXTENDER_POLICY")
      ->capture_default_str();
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
  replay->callback([rf, &exit_code] { exit_code = RunReplay(*rf); });
  cmd->callback([f, cmd, replay, &exit_code] {
    if (cmd->got_subcommand(replay)) return;
    exit_code = RunExtender(*f);
  });
}

}  // namespace gpulet::cli
