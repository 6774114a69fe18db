// Kept apart from config.cc so the parser (and its fuzz target) does not depend on the logger.
#include <spdlog/spdlog.h>

#include "config/config.h"

namespace gpulet::config {

void LogWarnings(const Config& config) {
  for (const std::string& w : config.warnings) {
    spdlog::warn("event=config_ignored source=\"{}\" detail=\"{}\"", config.source, w);
  }
}

}  // namespace gpulet::config
