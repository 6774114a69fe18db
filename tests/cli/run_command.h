// Runs a command line through /bin/sh and captures its output and exit status (integration tests):
// stdout and stderr together, unless the command redirects its stderr itself.
#pragma once

#include <stdio.h>
#include <sys/wait.h>

#include <array>
#include <string>

namespace gpulet::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

inline CommandResult RunCommand(const std::string& command) {
  CommandResult r;
  // Grouped, so a command that sends its own stderr elsewhere (`… 2>/dev/null`) keeps that.
  FILE* pipe = popen(("{ " + command + "\n} 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline std::string GpuletBinary() { return std::string(GPULET_BUILD_DIR) + "/gpulet"; }

}  // namespace gpulet::testing
