// gpulet: GPU node agent for Kubernetes and Slurm. Subcommands live in cmd_<name>.cc.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/log.h"

namespace {

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The first word that is not a global option (or its value): the subcommand as typed. Empty when
// there is none, or when help or version is asked for first.
std::string TypedSubcommand(const CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") return "";
    if (arg.rfind("-", 0) == 0) {
      if (arg.find('=') != std::string::npos) continue;
      const CLI::Option* opt = app.get_option_no_throw(arg);
      if (opt != nullptr && opt->get_type_size() > 0) ++i;  // skip the option's value
      continue;
    }
    return arg;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gpulet::cli;
  GlobalOptions global;
  // Freed before a long-running agent starts (GlobalOptions::agent).
  auto parser = std::make_unique<CLI::App>(
      "gpulet: makes GPUs schedulable, shareable and observable for Kubernetes and Slurm");
  CLI::App& app = *parser;
  app.require_subcommand(1);
  // Global flags are accepted after the subcommand too (`gpulet info --simulate dgx-h100`).
  app.fallthrough();
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  app.add_option("--simulate", global.simulate,
                 "Use the simulated NVML driver with this fixture (name such as dgx-h100, or a path)")
      ->envname("GPULET_SIMULATE");
  app.add_option("--sim-state", global.sim_state,
                 "State directory of the simulated node (default /tmp/gpulet-sim/<fixture>)")
      ->envname("GPULET_SIM_STATE");
  app.add_option("--nvml-library", global.nvml_library,
                 "Path of the NVML library to load (default libnvidia-ml.so.1)")
      ->envname("GPULET_NVML_LIBRARY");
  app.add_option("--log-level", global.log_level, "trace|debug|info|warn|error|off")
      ->envname("GPULET_LOG_LEVEL")
      ->capture_default_str();
  app.add_option("--log-format", global.log_format, "text|json")
      ->envname("GPULET_LOG_FORMAT")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  app.parse_complete_callback([&global] {
    gpulet::Status s = gpulet::ConfigureLogging(global.log_level, global.log_format);
    if (!s.ok()) throw CLI::ValidationError(s.message());
  });

  int exit_code = 0;
  RegisterVersion(app, global, exit_code);
  RegisterInfo(app, global, exit_code);
  RegisterSim(app, global, exit_code);
  RegisterExporter(app, global, exit_code);
  RegisterNode(app, global, exit_code);
  RegisterPlugin(app, global, exit_code);
  RegisterSlurm(app, global, exit_code);
  RegisterConfigSync(app, global, exit_code);
  RegisterQuota(app, global, exit_code);
  RegisterDoctor(app, global, exit_code);
  RegisterMig(app, global, exit_code);
  RegisterBroker(app, global, exit_code);
  RegisterLabels(app, global, exit_code);
  RegisterReplay(app, global, exit_code);
  RegisterExtender(app, global, exit_code);
  RegisterDra(app, global, exit_code);

  // An unknown subcommand is named, with the closest known one (CLI11 would only say that a
  // subcommand is required, or print the top-level help for `gpulet nosuchcmd --help`).
  if (const std::string typed = TypedSubcommand(app, argc, argv); !typed.empty()) {
    bool known = false;
    std::string closest;
    size_t best = std::string::npos;
    for (const CLI::App* sub : app.get_subcommands({})) {
      if (sub->check_name(typed)) known = true;
      const size_t d = EditDistance(typed, sub->get_name());
      if (d < best) {
        best = d;
        closest = sub->get_name();
      }
    }
    if (!known) {
      std::string message = "gpulet: error: unknown command \"" + typed + "\"";
      if (best <= std::max<size_t>(2, typed.size() / 3)) {
        message += "; did you mean \"" + closest + "\"?";
      }
      std::fprintf(stderr, "%s (see gpulet --help)\n", message.c_str());
      return static_cast<int>(gpulet::ErrorCode::kUsage);
    }
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : static_cast<int>(gpulet::ErrorCode::kUsage);
  }
  if (global.agent) {
    std::function<int()> agent = std::move(global.agent);
    parser.reset();
    return agent();
  }
  return exit_code;
}
