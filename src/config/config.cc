#include "config/config.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <set>
#include <sstream>

#include "config/memory_limits.h"

namespace gpulet::config {
namespace {

constexpr size_t kMaxConfigBytes = 1 << 20;
constexpr std::string_view kResourcePrefix = "nvidia.com/";

// Thrown inside this file only; ParseConfig turns it into a Status.
struct ParseError {
  Status status;
};

[[noreturn]] void Fail(const SourceLocation& where, const std::string& problem) {
  throw ParseError{InvalidAt(where, problem)};
}

std::string Join(std::initializer_list<std::string_view> names, std::string_view sep) {
  std::string out;
  for (auto n : names) {
    if (!out.empty()) out += sep;
    out += n;
  }
  return out;
}

std::string Quote(const std::string& s) {
  constexpr size_t kMax = 40;
  std::string shown = s.size() > kMax ? s.substr(0, kMax) + "..." : s;
  return "\"" + shown + "\"";
}

// What a node is, for "got …" in messages.
std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return Quote(node.Scalar());
    case YAML::NodeType::Null:
      return "null";
    default:
      return "nothing";
  }
}

// A quoted scalar carries the non-specific tag "!"; a plain one "?".
bool IsPlainScalar(const YAML::Node& node) { return node.IsScalar() && node.Tag() != "!"; }

std::optional<long long> ParseInteger(std::string_view s) {
  long long v = 0;
  const char* begin = s.data();
  const char* end = s.data() + s.size();
  if (begin != end && *begin == '+') ++begin;
  auto [ptr, ec] = std::from_chars(begin, end, v);
  if (ec != std::errc() || ptr != end || begin == end) return std::nullopt;
  return v;
}

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Upstream's rule for the <name> in nvidia.com/<name>: a DNS subdomain (RFC 1123): dot-separated
// labels of lowercase letters, digits and '-', each starting and ending with a letter or digit.
bool IsDnsSubdomain(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  size_t start = 0;
  while (true) {
    const size_t dot = s.find('.', start);
    const std::string_view label =
        s.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    if (label.empty() || !alnum(label.front()) || !alnum(label.back())) return false;
    if (!std::all_of(label.begin(), label.end(), [&](char c) { return alnum(c) || c == '-'; })) {
      return false;
    }
    if (dot == std::string_view::npos) return true;
    start = dot + 1;
  }
}

// Upstream's limit on the fully qualified name, nvidia.com/<name> included.
constexpr size_t kMaxResourceNameLength = 63;

// 1-based line of `node`, or `fallback` when yaml-cpp has no mark for it.
int NodeLine(const YAML::Node& node, int fallback) {
  const YAML::Mark mark = node.Mark();
  return mark.is_null() || mark.line < 0 ? fallback : mark.line + 1;
}

// Sees whether a document has anything but a null root, and where it starts.
class DocumentProbe : public YAML::EventHandler {
 public:
  bool has_content = false;
  int line = 1;

  void OnDocumentStart(const YAML::Mark& mark) override { Note(mark, false); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { Note(mark, false); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { Note(mark, true); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    Note(mark, true);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    Note(mark, true);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    Note(mark, true);
  }
  void OnMapEnd() override {}

 private:
  void Note(const YAML::Mark& mark, bool content) {
    if (content && !has_content) {
      has_content = true;
      line = mark.line >= 0 ? mark.line + 1 : 1;
    }
  }
};

class Parser {
 public:
  explicit Parser(std::string file) : file_(std::move(file)) {}

  Config Parse(const YAML::Node& root) {
    Config config;
    config.source = file_;
    warnings_.clear();
    if (root.IsNull() || !root.IsDefined()) {
      Fail(Loc(root, "", 1), "empty config: expected a mapping with version: v1");
    }
    if (!root.IsMap()) Fail(Loc(root, "", 1), "must be a mapping, got " + Describe(root));
    const int root_line = Line(root, 1);
    ForEachKey(
        // "gpulet": our own extension, parsed by memory_limits.cc (NVIDIA's plugin ignores it).
        root, "", root_line, {"version", "flags", "sharing", "resources", "imex", "gpulet"},
        [&](const std::string& key, const YAML::Node& value, const std::string& path, int line) {
          if (key == "version") {
            auto v = String(value, path, line);
            if (v && *v != "v1") {
              Fail(Loc(value, path, line), "unsupported version " + Quote(*v) + " (want v1)");
            }
          } else if (key == "flags") {
            ParseFlags(value, path, line, config.flags);
          } else if (key == "sharing") {
            ParseSharing(value, path, line, config.sharing);
          } else if (key == "resources") {
            // Upstream reads it and drops it too (with a warning).
            if (!IsEmpty(value)) {
              Warn(Loc(value, path, line),
                   "ignored: gpulet names its resources itself (nvidia.com/gpu, "
                   "nvidia.com/mig-<profile>; renames go in sharing.*.resources[].rename)");
            }
          } else if (key == "imex") {
            if (!IsEmpty(value)) {
              if (!value.IsMap()) {
                Fail(Loc(value, path, line), "must be a mapping, got " + Describe(value));
              }
              Warn(Loc(value, path, line),
                   "ignored: gpulet does not inject IMEX channels into containers");
            }
          }
        });
    config.warnings = std::move(warnings_);
    return config;
  }

 private:
  using KeyFn = std::function<void(const std::string& key, const YAML::Node& value,
                                   const std::string& path, int line)>;

  static int Line(const YAML::Node& node, int fallback) { return NodeLine(node, fallback); }

  SourceLocation Loc(const YAML::Node& node, const std::string& path, int fallback_line) const {
    return SourceLocation{file_, Line(node, fallback_line), path};
  }

  static std::string Child(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

  // Null, "", an empty mapping or an empty list.
  static bool IsEmpty(const YAML::Node& node) {
    return node.IsNull() || (node.IsScalar() && node.Scalar().empty()) ||
           ((node.IsMap() || node.IsSequence()) && node.size() == 0);
  }

  void Warn(const SourceLocation& where, const std::string& problem) {
    warnings_.push_back(where.ToString() + ": " + problem);
  }

  // Iterates a mapping, rejecting non-scalar and duplicate keys; an unknown key is skipped with a
  // warning (NVIDIA's parser ignores it). `fn` receives the value, its dotted path and the best
  // line for it (the value's, else the key's).
  void ForEachKey(const YAML::Node& map, const std::string& path, int line,
                  std::initializer_list<std::string_view> allowed, const KeyFn& fn) {
    if (!map.IsMap()) Fail(Loc(map, path, line), "must be a mapping, got " + Describe(map));
    std::set<std::string> seen;
    // Range-for keeps each yielded key/value pair alive; `it->first` would dangle.
    for (const auto& kv : map) {
      const YAML::Node& key = kv.first;
      const int key_line = Line(key, line);
      if (!key.IsScalar()) {
        Fail(SourceLocation{file_, key_line, path.empty() ? "<root>" : path},
             "keys must be strings, got " + Describe(key));
      }
      const std::string name = key.Scalar();
      const std::string child = Child(path, name);
      if (!seen.insert(name).second) Fail(SourceLocation{file_, key_line, child}, "duplicate key");
      if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
        Warn(SourceLocation{file_, key_line, child},
             "unknown key, ignored (known: " + Join(allowed, ", ") + ")");
        continue;
      }
      fn(name, kv.second, child, Line(kv.second, key_line));
    }
  }

  std::optional<bool> Bool(const YAML::Node& node, const std::string& path, int line) {
    if (node.IsNull()) return std::nullopt;
    bool value = false;
    if (!IsPlainScalar(node) || !YAML::convert<bool>::decode(node, value)) {
      Fail(Loc(node, path, line), "must be true or false, got " + Describe(node));
    }
    return value;
  }

  std::optional<std::string> String(const YAML::Node& node, const std::string& path, int line) {
    if (node.IsNull()) return std::nullopt;
    if (!node.IsScalar()) Fail(Loc(node, path, line), "must be a string, got " + Describe(node));
    return node.Scalar();
  }

  std::optional<long long> Integer(const YAML::Node& node, const std::string& path, int line) {
    if (node.IsNull()) return std::nullopt;
    std::optional<long long> v;
    if (IsPlainScalar(node)) v = ParseInteger(node.Scalar());
    if (!v) Fail(Loc(node, path, line), "must be an integer, got " + Describe(node));
    return v;
  }

  void ParseFlags(const YAML::Node& node, const std::string& path, int line, Flags& flags) {
    if (node.IsNull()) return;
    std::optional<std::string> mps_root;
    ForEachKey(
        node, path, line,
        {"migStrategy", "failOnInitError", "mpsRoot", "nvidiaDriverRoot", "nvidiaDevRoot", "plugin",
         "gfd", "gdsEnabled", "mofedEnabled", "gdrcopyEnabled", "useNodeFeatureAPI",
         "deviceDiscoveryStrategy", "restartOnDeviceUnhealthy"},
        [&](const std::string& key, const YAML::Node& value, const std::string& child, int l) {
          if (key == "mpsRoot") {
            mps_root = String(value, child, l);
          } else if (key == "gdsEnabled" || key == "mofedEnabled" || key == "gdrcopyEnabled") {
            if (Bool(value, child, l).value_or(false)) {
              Warn(Loc(value, child, l),
                   "ignored: gpulet does not set NVIDIA_" +
                       std::string(key == "gdsEnabled"     ? "GDS"
                                   : key == "mofedEnabled" ? "MOFED"
                                                           : "GDRCOPY") +
                       "=enabled in containers (the container toolkit's config can)");
            }
          } else if (key == "useNodeFeatureAPI") {
            if (Bool(value, child, l).value_or(false)) {
              Warn(Loc(value, child, l),
                   "ignored: gpulet writes node labels to an NFD feature file (--labels-file), "
                   "not a NodeFeature object");
            }
          } else if (key == "restartOnDeviceUnhealthy") {
            if (Bool(value, child, l).value_or(false)) {
              Warn(Loc(value, child, l),
                   "ignored: gpulet advertises an unhealthy device as Unhealthy and recovers it "
                   "(--health-quiet-period) instead of restarting");
            }
          } else if (key == "deviceDiscoveryStrategy") {
            auto s = String(value, child, l);
            if (s && *s != "auto" && *s != "nvml") {
              Warn(Loc(value, child, l),
                   "ignored: gpulet discovers devices through NVML only (got " + Quote(*s) + ")");
            }
          } else if (key == "migStrategy") {
            if (auto s = String(value, child, l)) {
              auto parsed = ParseMigStrategy(*s);
              if (!parsed.ok()) Fail(Loc(value, child, l), parsed.status().message());
              flags.mig_strategy = *parsed;
            }
          } else if (key == "failOnInitError") {
            flags.fail_on_init_error = Bool(value, child, l);
          } else if (key == "nvidiaDriverRoot") {
            flags.nvidia_driver_root = String(value, child, l);
          } else if (key == "nvidiaDevRoot") {
            flags.nvidia_dev_root = String(value, child, l);
          } else if (key == "plugin") {
            ParsePluginFlags(value, child, l, flags.plugin);
          } else if (key == "gfd") {
            ParseGfd(value, child, l);
            flags.has_gfd_section = true;
          }
        });
    if (mps_root) flags.plugin.mps_root = mps_root;
  }

  void ParseGfd(const YAML::Node& node, const std::string& path, int line) {
    if (node.IsNull()) return;
    ForEachKey(
        node, path, line,
        {"oneshot", "noTimestamp", "sleepInterval", "outputFile", "machineTypeFile"},
        [&](const std::string& key, const YAML::Node& value, const std::string& child, int l) {
          if (key == "oneshot" || key == "noTimestamp") {
            Bool(value, child, l);
          } else {
            String(value, child, l);
          }
        });
  }

  void ParsePluginFlags(const YAML::Node& node, const std::string& path, int line,
                        PluginFlags& plugin) {
    if (node.IsNull()) return;
    ForEachKey(
        node, path, line,
        {"passDeviceSpecs", "deviceListStrategy", "deviceIDStrategy", "containerDriverRoot",
         "mpsRoot", "cdiAnnotationPrefix", "nvidiaCTKPath", "kubeletSocket", "cdiFeatureFlags",
         "sharedDevicesAllocationPolicy"},
        [&](const std::string& key, const YAML::Node& value, const std::string& child, int l) {
          if (key == "passDeviceSpecs") {
            plugin.pass_device_specs = Bool(value, child, l);
          } else if (key == "deviceListStrategy") {
            plugin.device_list_strategy = DeviceListStrategies(value, child, l);
          } else if (key == "deviceIDStrategy") {
            if (auto s = String(value, child, l)) {
              auto parsed = ParseDeviceIdStrategy(*s);
              if (!parsed.ok()) Fail(Loc(value, child, l), parsed.status().message());
              plugin.device_id_strategy = *parsed;
            }
          } else if (key == "containerDriverRoot") {
            plugin.container_driver_root = String(value, child, l);
          } else if (key == "mpsRoot") {
            // gpulet's earlier place for it; flags.mpsRoot (upstream's) wins over it.
            if (auto s = String(value, child, l); s && !plugin.mps_root) plugin.mps_root = s;
          } else if (key == "kubeletSocket") {
            plugin.kubelet_socket = String(value, child, l);
          } else if (key == "cdiFeatureFlags") {
            if (!IsEmpty(value)) {
              Warn(Loc(value, child, l),
                   "ignored: gpulet does not generate CDI specs (it passes CDI annotations and "
                   "device names)");
            }
          } else if (key == "sharedDevicesAllocationPolicy") {
            if (auto s = String(value, child, l)) {
              auto parsed = ParseSharedDevicesAllocationPolicy(*s);
              if (!parsed.ok()) Fail(Loc(value, child, l), parsed.status().message());
              plugin.shared_devices_allocation_policy = *parsed;
            }
          } else if (key == "cdiAnnotationPrefix") {
            plugin.cdi_annotation_prefix = String(value, child, l);
          } else if (key == "nvidiaCTKPath") {
            plugin.nvidia_ctk_path = String(value, child, l);
          }
        });
  }

  // A single name, or a list of names (each element reported at its own line).
  std::optional<std::vector<DeviceListStrategy>> DeviceListStrategies(const YAML::Node& node,
                                                                      const std::string& path,
                                                                      int line) {
    if (node.IsNull()) return std::nullopt;
    if (node.IsScalar()) {
      auto parsed = ParseDeviceListStrategies(node.Scalar());
      if (!parsed.ok()) Fail(Loc(node, path, line), parsed.status().message());
      return *parsed;
    }
    if (!node.IsSequence()) {
      Fail(Loc(node, path, line),
           "must be a strategy name or a list of them, got " + Describe(node));
    }
    if (node.size() == 0) Fail(Loc(node, path, line), "must not be empty");
    std::vector<DeviceListStrategy> out;
    for (size_t i = 0; i < node.size(); ++i) {
      const YAML::Node item = node[i];
      const std::string child = path + "[" + std::to_string(i) + "]";
      auto s = String(item, child, Line(node, line));
      if (!s) Fail(Loc(item, child, Line(node, line)), "must be a strategy name, got null");
      auto parsed = ParseDeviceListStrategies(*s);
      if (!parsed.ok()) Fail(Loc(item, child, Line(node, line)), parsed.status().message());
      for (auto strategy : *parsed) {
        if (std::find(out.begin(), out.end(), strategy) != out.end()) {
          // Upstream keeps a set: a repeated entry counts once.
          Warn(Loc(item, child, Line(node, line)), std::string("repeated strategy ") +
                                                       Quote(DeviceListStrategyName(strategy)) +
                                                       ", counted once");
          continue;
        }
        out.push_back(strategy);
      }
    }
    return out;
  }

  void ParseSharing(const YAML::Node& node, const std::string& path, int line, Sharing& sharing) {
    if (node.IsNull()) return;
    ForEachKey(
        node, path, line, {"timeSlicing", "mps", "memory"},
        [&](const std::string& key, const YAML::Node& value, const std::string& child, int l) {
          if (value.IsNull()) return;
          if (key == "memory") {
            sharing.memory = ParseMemoryPool(value, child, l);
            return;
          }
          auto& slot = key == "timeSlicing" ? sharing.time_slicing : sharing.mps;
          slot = ParseReplicaSharing(value, child, l);
        });
    if (sharing.time_slicing && sharing.mps) {
      // Upstream: when mps is configured it is the sharing strategy.
      Warn(sharing.time_slicing->where,
           "ignored: mps is configured too, and MPS wins (as in NVIDIA's plugin)");
      sharing.time_slicing.reset();
    }
  }

  MemoryPool ParseMemoryPool(const YAML::Node& node, const std::string& path, int line) {
    MemoryPool out;
    out.where = Loc(node, path, line);
    out.unit_where = SourceLocation{file_, out.where.line, Child(path, "unit")};
    YAML::Node resources;
    std::string resources_path = Child(path, "resources");
    int resources_line = out.where.line;
    ForEachKey(
        node, path, line, {"unit", "placement", "rename", "resources"},
        [&](const std::string& key, const YAML::Node& value, const std::string& child, int l) {
          if (key == "unit") {
            out.unit_where = Loc(value, child, l);
            auto s = String(value, child, l);
            if (!s) return;
            std::optional<uint64_t> bytes = ParseByteSize(*s);
            constexpr uint64_t kMi = uint64_t{1} << 20;
            if (!bytes || *bytes % kMi != 0) {
              Fail(out.unit_where,
                   "must be a multiple of 1Mi such as 1Gi, 512Mi or 2Gi, got " + Quote(*s));
            }
            out.unit_bytes = *bytes;
          } else if (key == "placement") {
            auto s = String(value, child, l);
            if (!s) return;
            if (*s == "best-fit") {
              out.placement = MemoryPlacement::kBestFit;
            } else if (*s == "spread") {
              out.placement = MemoryPlacement::kSpread;
            } else {
              Fail(Loc(value, child, l), "invalid value " + Quote(*s) + " (want best-fit|spread)");
            }
          } else if (key == "rename") {
            auto s = String(value, child, l);
            if (!s) return;
            out.rename_where = Loc(value, child, l);
            out.advertised_name = ExtendedResourceName(*s, out.rename_where);
          } else {
            resources = value;
            resources_path = child;
            resources_line = l;
          }
        });
    if (out.advertised_name.empty())
      out.advertised_name = DefaultMemoryResourceName(out.unit_bytes);
    if (!resources.IsDefined() || resources.IsNull()) {
      Fail(SourceLocation{file_, resources_line, resources_path},
           "at least one resource is required");
    }
    if (!resources.IsSequence() || resources.size() == 0) {
      Fail(Loc(resources, resources_path, resources_line),
           "must be a non-empty list, got " + Describe(resources));
    }
    for (size_t i = 0; i < resources.size(); ++i) {
      const std::string epath = resources_path + "[" + std::to_string(i) + "]";
      MemoryPoolResource r;
      r.where = Loc(resources[i], epath, Line(resources, resources_line));
      if (!resources[i].IsMap()) Fail(r.where, "must be a mapping, got " + Describe(resources[i]));
      bool have_name = false;
      ForEachKey(
          resources[i], epath, r.where.line, {"name", "devices"},
          [&](const std::string& key, const YAML::Node& value, const std::string& child, int l) {
            if (key == "name") {
              r.name = ResourceName(value, child, l);
              have_name = true;
              if (r.name != "nvidia.com/gpu") {
                Fail(Loc(value, child, l),
                     "the memory pool takes whole GPUs: name must be "
                     "nvidia.com/gpu, got " +
                         Quote(r.name));
              }
            } else {
              r.devices = Devices(value, child, l);
            }
          });
      if (!have_name) Fail(SourceLocation{file_, r.where.line, epath + ".name"}, "required");
      for (const MemoryPoolResource& prev : out.resources) {
        using K = DeviceSelection::Kind;
        if (prev.devices.kind != K::kList || r.devices.kind != K::kList) {
          Fail(r.devices.where.line > 0 ? r.devices.where
                                        : SourceLocation{file_, r.where.line, epath + ".devices"},
               "overlaps the devices of " + prev.where.field + " (list disjoint devices)");
        }
      }
      out.resources.push_back(std::move(r));
    }
    return out;
  }

  // "<domain>/<name>" as the kubelet accepts extended resources: both parts DNS-style, the name
  // at most 63 characters, and not one of the names gpulet advertises for whole GPUs or MIG.
  std::string ExtendedResourceName(const std::string& s, const SourceLocation& where) {
    const size_t slash = s.find('/');
    if (slash == std::string::npos || slash == 0 || s.find('/', slash + 1) != std::string::npos) {
      Fail(where, "invalid resource name " + Quote(s) + ": must be <domain>/<name>");
    }
    const std::string domain = s.substr(0, slash);
    const std::string name = s.substr(slash + 1);
    if (!IsDnsSubdomain(domain) || !IsDnsSubdomain(name) || name.size() > 63) {
      Fail(where, "invalid resource name " + Quote(s) +
                      ": domain and name must be DNS subdomains (lowercase letters, digits, '-' "
                      "and '.'), the name at most 63 characters");
    }
    if (IsStandardName(s)) {
      Fail(where, Quote(s) + " clashes with a resource gpulet advertises itself");
    }
    return s;
  }

  ReplicaSharing ParseReplicaSharing(const YAML::Node& node, const std::string& path, int line) {
    ReplicaSharing out;
    out.where = Loc(node, path, line);
    bool have_resources = false;
    YAML::Node resources;
    std::string resources_path;
    int resources_line = line;
    ForEachKey(
        node, path, line, {"renameByDefault", "failRequestsGreaterThanOne", "resources"},
        [&](const std::string& key, const YAML::Node& value, const std::string& child, int l) {
          if (key == "renameByDefault") {
            out.rename_by_default = Bool(value, child, l).value_or(false);
          } else if (key == "failRequestsGreaterThanOne") {
            out.fail_requests_greater_than_one = Bool(value, child, l);
          } else {
            have_resources = true;
            resources = value;
            resources_path = child;
            resources_line = l;
          }
        });
    const std::string rpath = have_resources ? resources_path : Child(path, "resources");
    if (!have_resources || resources.IsNull()) {
      Fail(SourceLocation{file_, resources_line, rpath}, "at least one resource is required");
    }
    if (!resources.IsSequence()) {
      Fail(Loc(resources, rpath, resources_line), "must be a list, got " + Describe(resources));
    }
    if (resources.size() == 0) {
      Fail(Loc(resources, rpath, resources_line), "at least one resource is required");
    }
    for (size_t i = 0; i < resources.size(); ++i) {
      out.resources.push_back(ParseResource(resources[i], rpath + "[" + std::to_string(i) + "]",
                                            Line(resources, resources_line),
                                            out.rename_by_default));
    }
    CheckClashes(out.resources);
    return out;
  }

  // "gpu" or "nvidia.com/gpu" → "nvidia.com/gpu"; anything else is an error. Upstream's rules:
  // <name> is a DNS subdomain, and nvidia.com/<name> is at most 63 characters.
  std::string ResourceName(const YAML::Node& node, const std::string& path, int line) {
    auto s = String(node, path, line);
    if (!s) Fail(Loc(node, path, line), "must be a resource name, got null");
    std::string_view name = *s;
    if (name.find('/') != std::string_view::npos) {
      if (name.substr(0, kResourcePrefix.size()) != kResourcePrefix) {
        Fail(Loc(node, path, line),
             "invalid resource name " + Quote(*s) + ": must be nvidia.com/<name>");
      }
      name.remove_prefix(kResourcePrefix.size());
    }
    std::string full = std::string(kResourcePrefix) + std::string(name);
    if (full.size() > kMaxResourceNameLength) {
      Fail(Loc(node, path, line), "invalid resource name " + Quote(*s) + ": " + Quote(full) +
                                      " is " + std::to_string(full.size()) +
                                      " characters, at most 63 are allowed");
    }
    if (!IsDnsSubdomain(name)) {
      Fail(Loc(node, path, line),
           "invalid resource name " + Quote(*s) +
               ": <name> in nvidia.com/<name> must be a DNS subdomain (lowercase letters, digits, "
               "'-' and '.', each dot-separated part starting and ending with a letter or digit)");
    }
    return full;
  }

  ReplicatedResource ParseResource(const YAML::Node& node, const std::string& path, int line,
                                   bool rename_by_default) {
    ReplicatedResource r;
    r.where = Loc(node, path, line);
    if (!node.IsMap()) Fail(r.where, "must be a mapping, got " + Describe(node));
    bool have_name = false, have_replicas = false;
    ForEachKey(
        node, path, r.where.line, {"name", "rename", "devices", "replicas"},
        [&](const std::string& key, const YAML::Node& value, const std::string& child, int l) {
          if (key == "name") {
            r.name = ResourceName(value, child, l);
            have_name = true;
          } else if (key == "rename") {
            if (!value.IsNull()) {
              r.rename = ResourceName(value, child, l);
              r.rename_where = Loc(value, child, l);
            }
          } else if (key == "devices") {
            r.devices = Devices(value, child, l);
          } else if (key == "replicas") {
            auto n = Integer(value, child, l);
            if (!n) Fail(Loc(value, child, l), "must be an integer >= 2, got null");
            if (*n < 2 || *n > 1'000'000) {
              Fail(Loc(value, child, l),
                   (*n < 2 ? "must be >= 2, got " : "must be <= 1000000, got ") +
                       std::to_string(*n));
            }
            r.replicas = static_cast<int>(*n);
            have_replicas = true;
          }
        });
    if (!have_name) Fail(SourceLocation{file_, r.where.line, path + ".name"}, "required");
    if (!have_replicas) Fail(SourceLocation{file_, r.where.line, path + ".replicas"}, "required");
    if (!r.rename.empty()) {
      r.advertised_name = r.rename;
    } else if (rename_by_default) {
      r.advertised_name = r.name + ".shared";
    } else {
      r.advertised_name = r.name;
    }
    return r;
  }

  DeviceRef DeviceEntry(const YAML::Node& node, const std::string& path, int line) {
    DeviceRef ref;
    ref.where = Loc(node, path, line);
    if (!node.IsScalar()) {
      Fail(ref.where, "must be a GPU index or UUID, got " + Describe(node));
    }
    const std::string& s = node.Scalar();
    if (IsPlainScalar(node) && ParseInteger(s)) {
      const long long v = *ParseInteger(s);
      if (v < 0) Fail(ref.where, "GPU index must be >= 0, got " + std::to_string(v));
      ref.kind = DeviceRef::Kind::kIndex;
      ref.id = std::to_string(v);
      return ref;
    }
    const size_t colon = s.find(':');
    if (AllDigits(s)) {
      ref.kind = DeviceRef::Kind::kIndex;
    } else if (colon != std::string::npos && AllDigits(std::string_view(s).substr(0, colon)) &&
               AllDigits(std::string_view(s).substr(colon + 1))) {
      ref.kind = DeviceRef::Kind::kMigIndex;
    } else if (s.size() > 4 && s.compare(0, 4, "GPU-") == 0) {
      ref.kind = DeviceRef::Kind::kGpuUuid;
    } else if (s.size() > 4 && s.compare(0, 4, "MIG-") == 0) {
      ref.kind = DeviceRef::Kind::kMigUuid;
    } else {
      Fail(ref.where,
           "must be a GPU index, a MIG index \"<gpu>:<mig>\", a GPU-… UUID or a "
           "MIG-… UUID, got " +
               Quote(s));
    }
    ref.id = s;
    return ref;
  }

  DeviceSelection Devices(const YAML::Node& node, const std::string& path, int line) {
    DeviceSelection sel;
    sel.where = Loc(node, path, line);
    if (node.IsNull()) return sel;
    if (node.IsScalar()) {
      if (node.Scalar() == "all") return sel;
      std::optional<long long> n;
      if (IsPlainScalar(node)) n = ParseInteger(node.Scalar());
      if (!n) {
        Fail(Loc(node, path, line),
             "must be \"all\", a count or a list of devices, got " + Describe(node));
      }
      if (*n < 1 || *n > 1'000'000) {
        Fail(Loc(node, path, line), "device count must be >= 1, got " + std::to_string(*n));
      }
      sel.kind = DeviceSelection::Kind::kCount;
      sel.count = static_cast<int>(*n);
      return sel;
    }
    if (!node.IsSequence()) {
      Fail(Loc(node, path, line),
           "must be \"all\", a count or a list of devices, got " + Describe(node));
    }
    if (node.size() == 0) Fail(Loc(node, path, line), "device list must not be empty");
    sel.kind = DeviceSelection::Kind::kList;
    const int list_line = Line(node, line);
    for (size_t i = 0; i < node.size(); ++i) {
      DeviceRef ref = DeviceEntry(node[i], path + "[" + std::to_string(i) + "]", list_line);
      for (const auto& prev : sel.list) {
        if (prev.id == ref.id) {
          Fail(ref.where, "duplicate device " + Quote(ref.id) + " (also " + prev.where.field + ")");
        }
      }
      sel.list.push_back(std::move(ref));
    }
    return sel;
  }

  static bool IsStandardName(const std::string& name) {
    return name == "nvidia.com/gpu" || name.rfind("nvidia.com/mig-", 0) == 0;
  }

  // Names that would be advertised twice for different things, and selections that certainly
  // overlap. (Overlaps that need the inventory, such as index 0 and its UUID, are the planner's.)
  void CheckClashes(const std::vector<ReplicatedResource>& rs) {
    for (size_t i = 0; i < rs.size(); ++i) {
      const ReplicatedResource& a = rs[i];
      // A clash from renameByDefault has no rename line: name the entry's.
      const SourceLocation rename_loc =
          a.rename.empty() ? SourceLocation{file_, a.where.line, a.where.field + ".name"}
                           : a.rename_where;
      if (!a.rename.empty() && a.rename != a.name) {
        if (IsStandardName(a.rename)) {
          Fail(rename_loc, Quote(a.rename) + " clashes with a resource gpulet advertises itself");
        }
      }
      for (size_t j = 0; j < i; ++j) {
        const ReplicatedResource& b = rs[j];
        if (a.advertised_name == b.advertised_name && a.name != b.name) {
          Fail(rename_loc, "advertised name " + Quote(a.advertised_name) + " clashes with " +
                               b.where.field + " (" + Quote(b.name) + ")");
        }
        if (a.advertised_name != a.name && a.advertised_name == b.name) {
          Fail(rename_loc, "advertised name " + Quote(a.advertised_name) +
                               " clashes with the resource of " + b.where.field);
        }
        if (b.advertised_name != b.name && b.advertised_name == a.name) {
          Fail(SourceLocation{file_, a.where.line, a.where.field + ".name"},
               Quote(a.name) + " clashes with the advertised name of " + b.where.field);
        }
        if (a.name == b.name) CheckOverlap(a, b);
      }
    }
  }

  void CheckOverlap(const ReplicatedResource& a, const ReplicatedResource& b) {
    using K = DeviceSelection::Kind;
    const SourceLocation devices_loc =
        a.devices.where.line > 0 ? a.devices.where
                                 : SourceLocation{file_, a.where.line, a.where.field + ".devices"};
    if (a.devices.kind != K::kList || b.devices.kind != K::kList) {
      Fail(devices_loc, "overlaps the devices of " + b.where.field + " (same resource " +
                            Quote(a.name) + "; list disjoint devices)");
    }
    for (const auto& x : a.devices.list) {
      for (const auto& y : b.devices.list) {
        if (x.id == y.id) {
          Fail(x.where, "device " + Quote(x.id) + " is also in " + y.where.field);
        }
      }
    }
  }

  std::string file_;
  std::vector<std::string> warnings_;
};

template <typename E, size_t N>
Result<E> ParseEnum(std::string_view text, const std::pair<const char*, E> (&table)[N]) {
  std::string want;
  for (const auto& [name, value] : table) {
    if (text == name) return value;
    if (!want.empty()) want += "|";
    want += name;
  }
  return Result<E>(ErrorCode::kInvalidInput,
                   "invalid value " + Quote(std::string(text)) + " (want " + want + ")");
}

constexpr std::pair<const char*, MigStrategy> kMigStrategies[] = {
    {"none", MigStrategy::kNone}, {"single", MigStrategy::kSingle}, {"mixed", MigStrategy::kMixed}};
constexpr std::pair<const char*, DeviceIdStrategy> kDeviceIdStrategies[] = {
    {"uuid", DeviceIdStrategy::kUuid}, {"index", DeviceIdStrategy::kIndex}};
constexpr std::pair<const char*, DeviceListStrategy> kDeviceListStrategies[] = {
    {"envvar", DeviceListStrategy::kEnvvar},
    {"volume-mounts", DeviceListStrategy::kVolumeMounts},
    {"cdi-annotations", DeviceListStrategy::kCdiAnnotations},
    {"cdi-cri", DeviceListStrategy::kCdiCri}};

template <typename E, size_t N>
const char* EnumName(E value, const std::pair<const char*, E> (&table)[N]) {
  for (const auto& [name, v] : table) {
    if (v == value) return name;
  }
  return "?";
}

template <typename T>
void Take(std::optional<T>& base, const std::optional<T>& over) {
  if (over) base = over;
}

}  // namespace

const char* MemoryPlacementName(MemoryPlacement p) {
  return p == MemoryPlacement::kSpread ? "spread" : "best-fit";
}

std::string UnitQuantity(uint64_t bytes) {
  static constexpr std::pair<int, const char*> kUnits[] = {{40, "Ti"}, {30, "Gi"}, {20, "Mi"}};
  for (const auto& [shift, suffix] : kUnits) {
    const uint64_t unit = uint64_t{1} << shift;
    if (bytes >= unit && bytes % unit == 0) return std::to_string(bytes / unit) + suffix;
  }
  return std::to_string(bytes);
}

std::string DefaultMemoryResourceName(uint64_t unit_bytes) {
  std::string q = UnitQuantity(unit_bytes);
  std::transform(q.begin(), q.end(), q.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return "gpulet.io/gpu-memory-" + q;
}

std::string SourceLocation::ToString() const {
  std::string out = file + ":" + std::to_string(line);
  if (!field.empty()) out += ": " + field;
  return out;
}

Status InvalidAt(const SourceLocation& where, const std::string& problem) {
  return Status(ErrorCode::kInvalidInput, where.ToString() + ": " + problem);
}

const char* MigStrategyName(MigStrategy s) { return EnumName(s, kMigStrategies); }
const char* DeviceListStrategyName(DeviceListStrategy s) {
  return EnumName(s, kDeviceListStrategies);
}
const char* DeviceIdStrategyName(DeviceIdStrategy s) { return EnumName(s, kDeviceIdStrategies); }

Result<MigStrategy> ParseMigStrategy(std::string_view text) {
  return ParseEnum(text, kMigStrategies);
}

Result<DeviceIdStrategy> ParseDeviceIdStrategy(std::string_view text) {
  return ParseEnum(text, kDeviceIdStrategies);
}

Result<std::vector<DeviceListStrategy>> ParseDeviceListStrategies(std::string_view text) {
  std::vector<DeviceListStrategy> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    std::string_view item = text.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    auto parsed = ParseEnum(item, kDeviceListStrategies);
    if (!parsed.ok()) return parsed.status();
    if (std::find(out.begin(), out.end(), *parsed) == out.end()) out.push_back(*parsed);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

Result<std::string> ParseSharedDevicesAllocationPolicy(std::string_view text) {
  if (text == "distributed" || text == "packed") return std::string(text);
  return Status(ErrorCode::kInvalidInput,
                "invalid value " + Quote(std::string(text)) + " (want distributed|packed)");
}

Result<bool> ParseGoBool(std::string_view text) {
  static constexpr std::string_view kTrue[] = {"1", "t", "T", "TRUE", "true", "True"};
  static constexpr std::string_view kFalse[] = {"0", "f", "F", "FALSE", "false", "False"};
  for (auto t : kTrue) {
    if (text == t) return true;
  }
  for (auto f : kFalse) {
    if (text == f) return false;
  }
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "yes" || lower == "on") return true;
  if (lower == "no" || lower == "off") return false;
  return Status(ErrorCode::kInvalidInput,
                "invalid value " + Quote(std::string(text)) + " (want true|false)");
}

Flags Overlay(Flags base, const Flags& over) {
  Take(base.mig_strategy, over.mig_strategy);
  Take(base.fail_on_init_error, over.fail_on_init_error);
  Take(base.nvidia_driver_root, over.nvidia_driver_root);
  Take(base.nvidia_dev_root, over.nvidia_dev_root);
  Take(base.plugin.pass_device_specs, over.plugin.pass_device_specs);
  Take(base.plugin.device_list_strategy, over.plugin.device_list_strategy);
  Take(base.plugin.device_id_strategy, over.plugin.device_id_strategy);
  Take(base.plugin.container_driver_root, over.plugin.container_driver_root);
  Take(base.plugin.mps_root, over.plugin.mps_root);
  Take(base.plugin.cdi_annotation_prefix, over.plugin.cdi_annotation_prefix);
  Take(base.plugin.nvidia_ctk_path, over.plugin.nvidia_ctk_path);
  Take(base.plugin.kubelet_socket, over.plugin.kubelet_socket);
  Take(base.plugin.shared_devices_allocation_policy, over.plugin.shared_devices_allocation_policy);
  base.has_gfd_section = base.has_gfd_section || over.has_gfd_section;
  return base;
}

Result<Config> ParseConfig(std::string_view yaml_text, const std::string& filename) {
  if (yaml_text.size() > kMaxConfigBytes) {
    return Status(ErrorCode::kInvalidInput, filename + ":1: config is larger than 1 MiB (" +
                                                std::to_string(yaml_text.size()) + " bytes)");
  }
  try {
    // YAML::Load, not LoadAll: LoadAll in yaml-cpp 0.7 loops forever on inputs such as ","
    // (yaml-cpp #1040). A second, bounded pass detects a second document.
    const std::string text(yaml_text);
    const YAML::Node root = YAML::Load(text);
    std::istringstream in(text);
    YAML::Parser parser(in);
    DocumentProbe probe;
    parser.HandleNextDocument(probe);
    probe = DocumentProbe();
    if (parser.HandleNextDocument(probe) && probe.has_content) {
      return InvalidAt(SourceLocation{filename, probe.line, ""}, "more than one YAML document");
    }
    return Parser(filename).Parse(root);
  } catch (const ParseError& e) {
    return e.status;
  } catch (const YAML::DeepRecursion& e) {
    const int line = e.mark.is_null() || e.mark.line < 0 ? 1 : e.mark.line + 1;
    return Status(ErrorCode::kInvalidInput, filename + ":" + std::to_string(line) +
                                                ": invalid YAML: nested more than " +
                                                std::to_string(e.depth()) + " levels deep");
  } catch (const YAML::Exception& e) {
    const int line = e.mark.is_null() || e.mark.line < 0 ? 1 : e.mark.line + 1;
    std::string msg = e.msg;
    if (!e.mark.is_null() && e.mark.column >= 0) {
      msg += " (column " + std::to_string(e.mark.column + 1) + ")";
    }
    return Status(ErrorCode::kInvalidInput,
                  filename + ":" + std::to_string(line) + ": invalid YAML: " + msg);
  } catch (const std::exception& e) {
    return Status(ErrorCode::kInvalidInput, filename + ":1: invalid YAML: " + e.what());
  }
}

Result<Config> LoadConfigFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status(ErrorCode::kNotFound,
                  "cannot read config file " + path + ": " + std::strerror(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return Status(ErrorCode::kNotFound, "cannot read config file " + path);
  }
  return ParseConfig(text.str(), path);
}

}  // namespace gpulet::config
