// gpulet mig plan|apply: partition GPUs with MIG from a mig-parted config file.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "mig/config.h"
#include "mig/driver.h"
#include "mig/layout_lock.h"
#include "mig/plan.h"

namespace gpulet::cli {
namespace {

struct MigOptions {
  std::string file;
  std::string config;
  std::string output = "table";
};

void AddOptions(CLI::App* cmd, MigOptions& o) {
  cmd->add_option("-f,--file", o.file, "mig-parted config file (version: v1, mig-configs: …)")
      ->required()
      ->envname("GPULET_MIG_CONFIG_FILE");
  cmd->add_option("-c,--config", o.config, "Name of the config under mig-configs to apply")
      ->required()
      ->envname("GPULET_MIG_CONFIG");
  cmd->add_option("-o,--output", o.output, "table|json")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
}

struct Planned {
  NodeContext node;
  mig::Plan plan;
};

// Reads the config, opens the driver, reads every GPU's MIG state and computes the plan.
Result<Planned> MakePlan(const GlobalOptions& global, const MigOptions& o) {
  Result<mig::MigConfig> config = mig::LoadMigConfig(o.file, o.config);
  if (!config.ok()) return config.status();
  Result<NodeContext> node = OpenNode(global);
  if (!node.ok()) return node.status();
  Result<std::vector<mig::GpuState>> state = mig::ReadMigState(*node->nvml);
  if (!state.ok()) return state.status();
  Result<mig::Plan> plan = mig::ComputePlan(*config, *state);
  if (!plan.ok()) return plan.status();
  return Planned{std::move(node).value(), std::move(plan).value()};
}

void PrintPlan(const mig::Plan& plan, const std::string& output) {
  if (output == "json") {
    std::printf("%s\n", mig::PlanToJson(plan).dump(2).c_str());
  } else {
    std::fputs(mig::PlanToText(plan).c_str(), stdout);
  }
}

}  // namespace

void RegisterMig(CLI::App& app, GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "mig", "Partition GPUs with MIG from a mig-parted config (plan shows, apply changes)");
  cmd->require_subcommand(1);

  auto plan_opts = std::make_shared<MigOptions>();
  CLI::App* plan = cmd->add_subcommand(
      "plan", "Print what `mig apply` would change (MIG mode, instances destroyed and created)");
  AddOptions(plan, *plan_opts);
  plan->callback([&global, &exit_code, plan_opts] {
    Result<Planned> p = MakePlan(global, *plan_opts);
    if (!p.ok()) {
      exit_code = ReportError(p.status());
      return;
    }
    PrintPlan(p->plan, plan_opts->output);
    exit_code = 0;
  });

  auto apply_opts = std::make_shared<MigOptions>();
  CLI::App* apply = cmd->add_subcommand(
      "apply",
      "Check the geometry on every GPU, then enable MIG and create/destroy GPU and compute "
      "instances; a GPU whose change fails is rolled back");
  AddOptions(apply, *apply_opts);
  apply->callback([&global, &exit_code, apply_opts] {
    Result<Planned> p = MakePlan(global, *apply_opts);
    if (!p.ok()) {
      exit_code = ReportError(p.status());
      return;
    }
    // Rescans (plugin, exporter) defer while we hold the layout lock (mig/layout_lock.h).
    const std::string lock_path = mig::LayoutLockPath(p->node.sim_state_dir);
    Result<mig::LayoutLock> lock = mig::LayoutLock::Exclusive(lock_path, [&lock_path] {
      std::fprintf(stderr, "gpulet: waiting for the MIG layout lock %s (a rescan or another apply)\n",
                   lock_path.c_str());
    });
    if (!lock.ok()) {
      exit_code = ReportError(lock.status());
      return;
    }
    const bool json = apply_opts->output == "json";
    Status st = mig::ApplyPlan(*p->node.nvml, p->plan, [json](const std::string& line) {
      std::fprintf(json ? stderr : stdout, "%s\n", line.c_str());
    });
    if (json) {
      nlohmann::json out = mig::PlanToJson(p->plan);
      out["applied"] = st.ok();
      if (!st.ok()) out["error"] = st.message();
      std::printf("%s\n", out.dump(2).c_str());
    } else if (st.ok()) {
      std::printf("MIG config \"%s\" applied: %s\n", p->plan.config.c_str(),
                  p->plan.changes() ? "done" : "nothing to change");
    }
    exit_code = st.ok() ? 0 : ReportError(st);
  });
}

}  // namespace gpulet::cli
