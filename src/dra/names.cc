#include "dra/names.h"

#include <charconv>

namespace gpulet::dra {
namespace {

bool ParseUnsigned(std::string_view s, unsigned* out) {
  if (s.empty() || s.size() > 9 || (s.size() > 1 && s[0] == '0')) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

bool IsSlug(std::string_view s) {
  if (s.empty() || s.front() == '-' || s.back() == '-') return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return true;
}

}  // namespace

std::string ProfileSlug(std::string_view profile) {
  std::string out;
  out.reserve(profile.size());
  for (char c : profile) {
    if (c == '.' || c == '+') {
      out += '-';
    } else if (c >= 'A' && c <= 'Z') {
      out += static_cast<char>(c - 'A' + 'a');
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatDeviceName(const DeviceName& name) {
  std::string out = "gpu-" + std::to_string(name.gpu_index);
  switch (name.kind) {
    case DeviceKind::kGpu:
      break;
    case DeviceKind::kMemoryShare:
      out += "-mem";
      break;
    case DeviceKind::kMig:
      out += "-mig-" + ProfileSlug(name.mig_profile) + "-" + std::to_string(name.mig_start);
      break;
  }
  return out;
}

std::optional<DeviceName> ParseDeviceName(std::string_view name) {
  if (name.size() > 63 || !name.starts_with("gpu-")) return std::nullopt;
  std::string_view rest = name.substr(4);
  size_t dash = rest.find('-');
  DeviceName out;
  if (!ParseUnsigned(rest.substr(0, dash), &out.gpu_index)) return std::nullopt;
  if (dash == std::string_view::npos) return out;
  rest = rest.substr(dash + 1);
  if (rest == "mem") {
    out.kind = DeviceKind::kMemoryShare;
    return out;
  }
  if (!rest.starts_with("mig-")) return std::nullopt;
  rest = rest.substr(4);
  size_t last = rest.rfind('-');
  if (last == std::string_view::npos) return std::nullopt;
  std::string_view slug = rest.substr(0, last);
  if (!IsSlug(slug) || !ParseUnsigned(rest.substr(last + 1), &out.mig_start)) return std::nullopt;
  out.kind = DeviceKind::kMig;
  out.mig_profile = std::string(slug);
  return out;
}

std::optional<std::string> DevicePluginSocketResource(std::string_view file_name) {
  constexpr std::string_view kPrefix = "nvidia-", kSuffix = ".sock";
  if (file_name.size() <= kPrefix.size() + kSuffix.size() || !file_name.starts_with(kPrefix) ||
      !file_name.ends_with(kSuffix)) {
    return std::nullopt;
  }
  file_name.remove_prefix(kPrefix.size());
  file_name.remove_suffix(kSuffix.size());
  return "nvidia.com/" + std::string(file_name);
}

bool MappedByShippedDeviceClasses(std::string_view extended_resource) {
  return extended_resource == "nvidia.com/gpu" || extended_resource.starts_with("nvidia.com/mig-");
}

}  // namespace gpulet::dra
