// gpulet: GPU node agent for Kubernetes and Slurm. Subcommands live in cmd_<name>.cc.
#include <CLI/CLI.hpp>

#include <cstdlib>

#include "cli/commands.h"
#include "common/log.h"

int main(int argc, char** argv) {
  using namespace gpulet::cli;
  CLI::App app{"gpulet: makes GPUs schedulable, shareable and observable for Kubernetes and Slurm"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  GlobalOptions global;
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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : static_cast<int>(gpulet::ErrorCode::kUsage);
  }
  return exit_code;
}
