#include "slurm/command.h"

namespace gpulet::slurm {

Result<CommandOutput> ProcessRunner::Run(const std::vector<std::string>& argv,
                                         std::chrono::milliseconds timeout) const {
  CommandSpec spec;
  spec.argv = argv;
  spec.timeout = timeout;
  spec.max_output = kMaxOutput;
  return RunCommand(spec);
}

}  // namespace gpulet::slurm
