// gpulet broker: lends whole GPU nodes between Slurm (training) and Kubernetes (inference).
//   gpulet broker run --config FILE [--dry-run] [--once]
//   gpulet broker status --config FILE
// See docs/broker.md for the pools, the rules and running it next to cluster-autoscaler.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <thread>

#include "broker/broker.h"
#include "broker/journal.h"
#include "cli/commands.h"
#include "common/clock.h"
#include "common/signals.h"
#include "k8s/access.h"
#include "slurm/command.h"

namespace gpulet::cli {
namespace {

struct BrokerFlags {
  std::string config;
  std::string journal;  // overrides the config's journal path
  std::string metrics;  // overrides metrics.address
  bool dry_run = false;
  bool once = false;
};

int RunBroker(const BrokerFlags& f) {
  // Before any thread starts, so the signals reach only the waiter below.
  const StopSignals signals = StopSignals::Block();
  Result<broker::BrokerConfig> config = broker::LoadBrokerConfig(f.config);
  if (!config.ok()) return ReportError(config.status());
  if (!f.journal.empty()) config->journal_path = f.journal;
  if (!f.metrics.empty()) config->metrics_address = f.metrics;
  Result<k8s::ClusterAccess> access = k8s::ResolveClusterAccess(config->kubeconfig);
  if (!access.ok()) return ReportError(access.status());
  k8s::Client client(*access);
  auto runner = std::make_shared<slurm::ProcessRunner>();
  broker::SlurmSide slurm_side(runner, *config);
  broker::KubeSide kube_side(client, *config);
  broker::BrokerOptions options;
  options.dry_run = f.dry_run;
  broker::Broker b(*config, slurm_side, kube_side, options);
  if (Status s = b.Start(); !s.ok()) return ReportError(s);
  if (f.once) {
    broker::Decision d = b.Tick(broker::NowMs());
    std::printf("%s %s %s: %s\n", broker::ActionName(d.action),
                d.node.empty() ? "-" : d.node.c_str(), d.code.c_str(), d.reason.c_str());
    return 0;
  }
  broker::BrokerHttp http(b.metrics());
  if (Status s = http.Start(config->metrics_address); !s.ok()) return ReportError(s);
  spdlog::info("event=broker_started config={} journal={} metrics_port={} dry_run={}", f.config,
               config->journal_path, http.port(), f.dry_run);
  StopSignal stop;
  std::thread loop([&] { b.Run(stop); });
  const int sig = RunUntilStopped(signals, std::chrono::seconds(1), nullptr, nullptr);
  spdlog::info("event=broker_stopping signal={}", sig);
  stop.Stop();
  loop.join();
  return 0;
}

int RunStatus(const BrokerFlags& f) {
  Result<broker::BrokerConfig> config = broker::LoadBrokerConfig(f.config);
  if (!config.ok()) return ReportError(config.status());
  const std::string path = f.journal.empty() ? config->journal_path : f.journal;
  Result<broker::Journal> j = broker::LoadJournal(path);
  if (!j.ok()) return ReportError(j.status());
  std::fputs(broker::FormatStatus(*j, *config, broker::NowMs()).c_str(), stdout);
  return 0;
}

}  // namespace

void RegisterBroker(CLI::App& app, GlobalOptions& /*global*/, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "broker", "Lend whole GPU nodes between Slurm and Kubernetes on demand (docs/broker.md)");
  cmd->require_subcommand(1);
  auto f = std::make_shared<BrokerFlags>();
  CLI::App* run = cmd->add_subcommand("run", "Run the broker (one evaluation per interval)");
  run->add_option("--config", f->config, "Broker config (YAML)")
      ->envname("GPULET_BROKER_CONFIG")
      ->required();
  run->add_option("--journal", f->journal, "Journal file (default: the config's journal)")
      ->envname("GPULET_BROKER_JOURNAL");
  run->add_option("--metrics-address", f->metrics, "[host]:port for /metrics and /status")
      ->envname("GPULET_BROKER_METRICS_ADDRESS");
  run->add_flag("--dry-run", f->dry_run, "Log decisions without acting or writing the journal")
      ->envname("GPULET_BROKER_DRY_RUN");
  run->add_flag("--once", f->once, "One evaluation, print the decision, exit");
  run->callback([f, &exit_code] { exit_code = RunBroker(*f); });

  CLI::App* status = cmd->add_subcommand("status", "Print the pools and the nodes in transit");
  status->add_option("--config", f->config, "Broker config (YAML)")
      ->envname("GPULET_BROKER_CONFIG")
      ->required();
  status->add_option("--journal", f->journal, "Journal file (default: the config's journal)")
      ->envname("GPULET_BROKER_JOURNAL");
  status->callback([f, &exit_code] { exit_code = RunStatus(*f); });
}

}  // namespace gpulet::cli
