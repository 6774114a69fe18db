// The one duration grammar, Go's time.ParseDuration (what NVIDIA's tools and Kubernetes use):
// a sequence of decimal numbers with units, e.g. "500ms", "1.5s", "2h45m", "0". Units: ns, us
// (or µs), ms, s, m, h, plus d (days) as gpulet's extension for long windows. A bare number other
// than 0 needs a unit, unless the caller names one for bare numbers (config keys documented as
// "seconds" accept `30`). The result is rounded down to milliseconds; negative values are refused.
#pragma once

#include <chrono>
#include <optional>
#include <string_view>

#include "common/status.h"

namespace gpulet {

// Errors are kInvalidInput with a message naming the text and the grammar; callers prefix the
// flag or file:line:field.
Result<std::chrono::milliseconds> ParseDuration(
    std::string_view text, std::optional<std::chrono::milliseconds> bare_unit = std::nullopt);

// "1h30m", "45s", "250ms", "0s": the shortest text ParseDuration reads back to the same value.
std::string FormatDuration(std::chrono::milliseconds d);

}  // namespace gpulet
