#include <cstdio>

#include "cli/commands.h"

#ifndef GPULET_VERSION
#define GPULET_VERSION "0.0.0"
#endif

namespace gpulet::cli {

void RegisterVersion(CLI::App& app, GlobalOptions&, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("version", "Print gpulet's version");
  cmd->callback([&exit_code] {
    std::printf("gpulet %s\n", GPULET_VERSION);
    exit_code = 0;
  });
}

}  // namespace gpulet::cli
