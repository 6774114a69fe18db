// gpulet labels: GPU Feature Discovery's node labels as a Node Feature Discovery feature file.
// Same flags and environment variables as NVIDIA's gpu-feature-discovery, so its DaemonSet
// settings carry over.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>

#include "cli/commands.h"
#include "config/config.h"
#include "labels/labels.h"
#include "sharing/plan.h"

namespace gpulet::cli {
namespace {

struct LabelsFlags {
  std::string output_file = "/etc/kubernetes/node-feature-discovery/features.d/gfd";
  std::string config_file;
  std::string mig_strategy;
  std::string machine_type_file = "/sys/class/dmi/id/product_name";
  bool oneshot = false;
  bool no_timestamp = false;
  std::string sleep_interval = "60s";
};

// One labelling pass: discover, plan, label, write (or print with "-").
Status LabelOnce(const GlobalOptions& global, const LabelsFlags& f) {
  config::Config cfg;
  if (!f.config_file.empty()) {
    Result<config::Config> loaded = config::LoadConfigFile(f.config_file);
    if (!loaded.ok()) return loaded.status();
    cfg = *loaded;
    config::LogWarnings(cfg);
  }
  if (!f.mig_strategy.empty()) {
    Result<config::MigStrategy> s = config::ParseMigStrategy(f.mig_strategy);
    if (!s.ok()) return Status(ErrorCode::kUsage, "--mig-strategy: " + s.status().message());
    cfg.flags.mig_strategy = *s;
  }
  Result<DiscoveredNode> node = DiscoverNode(global);
  if (!node.ok()) return node.status();
  Result<sharing::Plan> plan = sharing::BuildPlan(node->inventory, cfg);
  if (!plan.ok()) return plan.status();

  labels::LabelOptions o;
  o.mig_strategy = cfg.flags.mig_strategy.value_or(config::MigStrategy::kNone);
  o.machine = labels::ReadMachineType(f.machine_type_file);
  o.sharing = &cfg.sharing;
  if (!f.no_timestamp) o.timestamp = static_cast<int64_t>(std::time(nullptr));
  const labels::Labels l = labels::NodeLabels(node->inventory, *plan, o);
  if (f.output_file == "-") {
    std::fputs(labels::FeatureFile(l).c_str(), stdout);
    std::fflush(stdout);
    return Status();
  }
  Status s = labels::WriteFeatureFile(f.output_file, l);
  if (s.ok()) spdlog::info("event=labels_written path={} labels={}", f.output_file, l.size());
  return s;
}

int RunLabels(const GlobalOptions& global, const LabelsFlags& f) {
  Result<std::chrono::milliseconds> duration = ParseDuration("--sleep-interval", f.sleep_interval);
  if (!duration.ok()) return ReportError(duration.status());
  if (duration->count() <= 0) {
    return ReportError(Status(ErrorCode::kUsage, "--sleep-interval: must be positive"));
  }
  const long long interval_ms = duration->count();
  if (f.oneshot) {
    Status s = LabelOnce(global, f);
    return s.ok() ? 0 : ReportError(s);
  }
  // Loop until SIGTERM/SIGINT, waiting for them synchronously between passes.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  for (;;) {
    Status s = LabelOnce(global, f);
    // A failed pass keeps the previous file: the node's labels stay as they were.
    if (!s.ok()) spdlog::error("event=labels_failed error=\"{}\"", s.message());
    timespec wait{static_cast<time_t>(interval_ms / 1000),
                  static_cast<long>(interval_ms % 1000) * 1'000'000L};
    if (sigtimedwait(&stop, nullptr, &wait) > 0) return 0;
  }
}

}  // namespace

void RegisterLabels(CLI::App& app, GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "labels",
      "Write GPU Feature Discovery's node labels (nvidia.com/gpu.product, …) as a Node Feature "
      "Discovery feature file");
  auto f = std::make_shared<LabelsFlags>();
  cmd->add_option("-o,--output-file,--output", f->output_file,
                  "Feature file to write; - prints the labels")
      ->envname("GFD_OUTPUT_FILE")
      ->capture_default_str();
  cmd->add_option("--config-file", f->config_file,
                  "Device plugin config (NVIDIA v1 format): sharing and migStrategy")
      ->envname("CONFIG_FILE");
  cmd->add_option("--mig-strategy", f->mig_strategy, "none|single|mixed (overrides the file)")
      ->envname("GFD_MIG_STRATEGY");
  cmd->add_option("--machine-type-file", f->machine_type_file,
                  "File holding the machine type (nvidia.com/gpu.machine)")
      ->envname("GFD_MACHINE_TYPE_FILE")
      ->capture_default_str();
  cmd->add_flag("--oneshot", f->oneshot, "Label once and exit")->envname("GFD_ONESHOT");
  cmd->add_flag("--no-timestamp", f->no_timestamp, "Leave out nvidia.com/gfd.timestamp")
      ->envname("GFD_NO_TIMESTAMP");
  cmd->add_option("--sleep-interval", f->sleep_interval, "Time between labelling passes (30s, 5m)")
      ->envname("GFD_SLEEP_INTERVAL")
      ->capture_default_str();
  cmd->callback([&global, f, &exit_code] { exit_code = RunLabels(global, *f); });
}

}  // namespace gpulet::cli
