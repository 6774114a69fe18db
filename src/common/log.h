// Structured logging on spdlog: one line per event, key=value pairs in text mode, one JSON object
// per line in json mode. Configured once by main before any command runs.
#pragma once

#include <string>

#include "common/status.h"

namespace gpulet {

// level: trace|debug|info|warn|error|off; format: text|json. Logs go to stderr.
Status ConfigureLogging(const std::string& level, const std::string& format);

}  // namespace gpulet
