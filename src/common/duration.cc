#include "common/duration.h"

#include <cmath>
#include <string>
#include <utility>

namespace gpulet {
namespace {

Status Invalid(std::string_view text, const std::string& why) {
  return Status(ErrorCode::kInvalidInput, "invalid duration \"" + std::string(text) + "\": " + why +
                                              " (want e.g. 500ms, 30s, 1m30s, 2h, 0)");
}

// Nanoseconds per unit.
std::optional<double> UnitScale(std::string_view unit) {
  static const std::pair<std::string_view, double> kUnits[] = {
      {"ns", 1.0}, {"us", 1e3}, {"\xC2\xB5s", 1e3}, {"\xCE\xBCs", 1e3}, {"ms", 1e6},
      {"s", 1e9},  {"m", 60e9}, {"h", 3600e9},      {"d", 86400e9},
  };
  for (const auto& [name, scale] : kUnits) {
    if (unit == name) return scale;
  }
  return std::nullopt;
}

}  // namespace

Result<std::chrono::milliseconds> ParseDuration(
    std::string_view text, std::optional<std::chrono::milliseconds> bare_unit) {
  if (text.empty()) return Invalid(text, "empty");
  if (text.front() == '-') return Invalid(text, "negative");
  std::string_view rest = text;
  if (rest.front() == '+') rest.remove_prefix(1);
  if (rest == "0") return std::chrono::milliseconds(0);
  double total_ns = 0;
  bool any = false;
  while (!rest.empty()) {
    size_t i = 0;
    bool digits = false, dot = false;
    while (i < rest.size() && ((rest[i] >= '0' && rest[i] <= '9') || (rest[i] == '.' && !dot))) {
      if (rest[i] == '.') {
        dot = true;
      } else {
        digits = true;
      }
      ++i;
    }
    if (!digits) return Invalid(text, "expected a number");
    const double value = std::stod(std::string(rest.substr(0, i)));
    rest.remove_prefix(i);
    size_t u = 0;
    while (u < rest.size() && !(rest[u] >= '0' && rest[u] <= '9') && rest[u] != '.') ++u;
    const std::string_view unit = rest.substr(0, u);
    rest.remove_prefix(u);
    if (unit.empty()) {
      if (!any && rest.empty() && bare_unit) {
        total_ns = value * static_cast<double>(bare_unit->count()) * 1e6;
        any = true;
        break;
      }
      return Invalid(text, "missing unit");
    }
    const std::optional<double> scale = UnitScale(unit);
    if (!scale) return Invalid(text, "unknown unit \"" + std::string(unit) + "\"");
    total_ns += value * *scale;
    any = true;
  }
  if (!any) return Invalid(text, "expected a number");
  // Go's limit is about 290 years; anything near it is a typo.
  if (!std::isfinite(total_ns) || total_ns > 9.2e18) return Invalid(text, "out of range");
  return std::chrono::milliseconds(static_cast<int64_t>(total_ns / 1e6));
}

std::string FormatDuration(std::chrono::milliseconds d) {
  int64_t ms = d.count();
  if (ms == 0) return "0s";
  std::string out;
  if (ms < 0) {
    out = "-";
    ms = -ms;
  }
  const int64_t h = ms / 3'600'000;
  const int64_t m = ms / 60'000 % 60;
  const int64_t s = ms / 1000 % 60;
  const int64_t rest = ms % 1000;
  if (h) out += std::to_string(h) + "h";
  if (m) out += std::to_string(m) + "m";
  if (s) out += std::to_string(s) + "s";
  if (rest) out += std::to_string(rest) + "ms";
  return out;
}

}  // namespace gpulet
