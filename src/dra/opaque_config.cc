#include "dra/opaque_config.h"

#include <spdlog/spdlog.h>

#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "dra/names.h"
#include "k8s/quantity.h"

namespace gpulet::dra {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxParametersBytes = 10 * 1024;
constexpr int64_t kMaxPinnedBytes = int64_t{1} << 50;  // 1 PiB

void WarnUnknownOnce(const std::string& kind, const std::string& field, const std::string& where) {
  static std::mutex mu;
  static std::set<std::string> seen;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!seen.insert(kind + "/" + field).second) return;
  }
  spdlog::warn("event=dra_config_field_ignored where=\"{}\" field={} kind={} "
               "detail=\"unknown field, ignored (warned once)\"",
               where, field, kind);
}

Status Invalid(const OpaqueConfig& c, const std::string& field, const std::string& problem) {
  return Status(ErrorCode::kInvalidInput, c.where + ": parameters." + field + ": " + problem);
}

std::string Shown(const json& v) {
  std::string s = v.dump();
  if (s.size() > 64) s = s.substr(0, 64) + "…";
  return s;
}

void WarnUnknownKeys(const json& object, const std::set<std::string>& known, const std::string& kind,
                     const std::string& prefix, const std::string& where) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (!known.contains(it.key())) WarnUnknownOnce(kind, prefix + it.key(), where);
  }
}

}  // namespace

const char* SharingStrategyName(SharingStrategy s) {
  return s == SharingStrategy::kMps ? "MPS" : "TimeSlicing";
}

Result<DeviceConfig> ParseDeviceConfig(const OpaqueConfig& c) {
  if (c.parameters_json.size() > kMaxParametersBytes) {
    return Invalid(c, "", "larger than 10 KiB");
  }
  json p = json::parse(c.parameters_json, nullptr, /*allow_exceptions=*/false);
  if (p.is_discarded() || !p.is_object()) {
    return Status(ErrorCode::kInvalidInput, c.where + ": parameters: not a JSON object");
  }
  DeviceConfig out;
  out.where = c.where;
  const json* api = p.contains("apiVersion") ? &p["apiVersion"] : nullptr;
  if (api == nullptr || !api->is_string() || api->get<std::string>() != kConfigApiVersion) {
    return Invalid(c, "apiVersion",
                   std::string("must be ") + kConfigApiVersion + ", got " +
                       (api ? Shown(*api) : std::string("nothing")));
  }
  const json* kind = p.contains("kind") ? &p["kind"] : nullptr;
  if (kind == nullptr || !kind->is_string()) {
    return Invalid(c, "kind", "must be GpuConfig or MigDeviceConfig, got " +
                                  (kind ? Shown(*kind) : std::string("nothing")));
  }
  const std::string kind_name = kind->get<std::string>();
  if (kind_name == "GpuConfig") {
    out.kind = ConfigKind::kGpu;
  } else if (kind_name == "MigDeviceConfig") {
    out.kind = ConfigKind::kMigDevice;
  } else {
    return Invalid(c, "kind", "must be GpuConfig or MigDeviceConfig, got " + Shown(*kind));
  }
  WarnUnknownKeys(p, {"apiVersion", "kind", "sharing"}, kind_name, "", c.where);
  if (!p.contains("sharing")) return out;
  const json& sharing = p["sharing"];
  if (!sharing.is_object()) return Invalid(c, "sharing", "must be an object, got " + Shown(sharing));
  WarnUnknownKeys(sharing, {"strategy", "timeSlicing", "mps"}, kind_name, "sharing.", c.where);
  if (sharing.contains("strategy")) {
    const json& s = sharing["strategy"];
    if (s == "TimeSlicing") {
      out.strategy = SharingStrategy::kTimeSlicing;
    } else if (s == "MPS") {
      out.strategy = SharingStrategy::kMps;
    } else {
      return Invalid(c, "sharing.strategy", "must be TimeSlicing or MPS, got " + Shown(s));
    }
  }
  if (sharing.contains("timeSlicing")) {
    const json& t = sharing["timeSlicing"];
    if (!t.is_object()) {
      return Invalid(c, "sharing.timeSlicing", "must be an object, got " + Shown(t));
    }
    if (out.strategy != SharingStrategy::kTimeSlicing) {
      return Invalid(c, "sharing.timeSlicing", "given with strategy MPS");
    }
    WarnUnknownKeys(t, {"interval"}, kind_name, "sharing.timeSlicing.", c.where);
    if (t.contains("interval")) {
      const json& i = t["interval"];
      if (i != "Default" && i != "Short" && i != "Medium" && i != "Long") {
        return Invalid(c, "sharing.timeSlicing.interval",
                       "must be Default, Short, Medium or Long, got " + Shown(i));
      }
      out.interval = i.get<std::string>();
      if (out.interval != "Default") {
        WarnUnknownOnce(kind_name, "sharing.timeSlicing.interval=" + out.interval, c.where);
      }
    }
  }
  if (sharing.contains("mps")) {
    const json& m = sharing["mps"];
    if (!m.is_object()) return Invalid(c, "sharing.mps", "must be an object, got " + Shown(m));
    if (out.strategy != SharingStrategy::kMps) {
      return Invalid(c, "sharing.mps", "given with strategy TimeSlicing (set strategy: MPS)");
    }
    WarnUnknownKeys(m, {"defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit"},
                    kind_name, "sharing.mps.", c.where);
    if (m.contains("defaultActiveThreadPercentage")) {
      const json& v = m["defaultActiveThreadPercentage"];
      if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 100) {
        return Invalid(c, "sharing.mps.defaultActiveThreadPercentage",
                       "must be an integer 1..100, got " + Shown(v));
      }
      out.mps.active_thread_percentage = v.get<int>();
    }
    if (m.contains("defaultPinnedDeviceMemoryLimit")) {
      const json& v = m["defaultPinnedDeviceMemoryLimit"];
      Result<int64_t> bytes = Status(ErrorCode::kInvalidInput, "must be a quantity string");
      if (v.is_string()) bytes = k8s::ParseWholeQuantity(v.get<std::string>(), kMaxPinnedBytes);
      if (!bytes.ok() || *bytes <= 0) {
        return Invalid(c, "sharing.mps.defaultPinnedDeviceMemoryLimit",
                       "must be a quantity like 10Gi, above 0 and at most 1Pi, got " + Shown(v) +
                           (bytes.ok() ? std::string() : " (" + bytes.status().message() + ")"));
      }
      out.mps.pinned_memory_bytes = static_cast<uint64_t>(*bytes);
    }
  }
  return out;
}

Result<std::optional<DeviceConfig>> ConfigFor(const std::vector<OpaqueConfig>& configs,
                                              const std::string& request, ConfigKind kind) {
  const std::string base = request.substr(0, request.find('/'));
  std::optional<DeviceConfig> chosen;
  // Class configs first, then the claim's: a later one wins.
  for (bool from_class : {true, false}) {
    for (const OpaqueConfig& c : configs) {
      if (c.from_class != from_class) continue;
      if (!c.requests.empty()) {
        bool named = false;
        for (const std::string& r : c.requests) named = named || r == request || r == base;
        if (!named) continue;
      }
      Result<DeviceConfig> parsed = ParseDeviceConfig(c);
      if (!parsed.ok()) return parsed.status();
      if (parsed->kind == kind) chosen = std::move(parsed).value();
    }
  }
  return chosen;
}

}  // namespace gpulet::dra
