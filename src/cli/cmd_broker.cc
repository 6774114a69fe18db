// gpulet broker: placeholder registration; the real command replaces this file.
#include "cli/commands.h"

namespace gpulet::cli {

void RegisterBroker(CLI::App& app, GlobalOptions& /*global*/, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("broker", "(in progress)");
  cmd->callback([&exit_code] { exit_code = 2; });
}

}  // namespace gpulet::cli
