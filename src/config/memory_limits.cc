#include "config/memory_limits.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>

namespace gpulet::config {
namespace {

struct ParseError {
  SourceLocation where;
  std::string problem;
};

class Parser {
 public:
  explicit Parser(std::string file) : file_(std::move(file)) {}

  std::optional<MemoryLimits> Parse(const YAML::Node& root) {
    if (!root.IsMap()) return std::nullopt;  // config.cc reports what is wrong with the file
    const YAML::Node gpulet = root["gpulet"];
    if (!gpulet.IsDefined() || gpulet.IsNull()) return std::nullopt;
    Keys(gpulet, "gpulet", {"memoryLimits"});
    const YAML::Node section = gpulet["memoryLimits"];
    if (!section.IsDefined() || section.IsNull()) return std::nullopt;
    const std::string path = "gpulet.memoryLimits";
    Keys(section, path, {"resources", "library", "stateDir"});
    MemoryLimits out;
    out.where = Loc(section, path);
    if (const YAML::Node lib = section["library"]; lib.IsDefined()) {
      out.library = AbsolutePath(lib, path + ".library");
    }
    if (const YAML::Node dir = section["stateDir"]; dir.IsDefined()) {
      out.state_dir = AbsolutePath(dir, path + ".stateDir");
    }
    const YAML::Node list = section["resources"];
    const std::string lpath = path + ".resources";
    if (!list.IsDefined() || !list.IsSequence() || list.size() == 0) {
      throw ParseError{Loc(list.IsDefined() ? list : section, lpath),
                       "must be a non-empty list of {name, perReplica}"};
    }
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string epath = lpath + "[" + std::to_string(i) + "]";
      const YAML::Node e = list[i];
      Keys(e, epath, {"name", "perReplica", "passThrough"});
      MemoryLimitResource r;
      r.where = Loc(e, epath);
      const YAML::Node name = e["name"];
      if (!name.IsDefined() || !name.IsScalar() || name.Scalar().empty()) {
        throw ParseError{Loc(name.IsDefined() ? name : e, epath + ".name"), "required string"};
      }
      r.name = name.Scalar().find('/') == std::string::npos ? "nvidia.com/" + name.Scalar()
                                                            : name.Scalar();
      for (const MemoryLimitResource& other : out.resources) {
        if (other.name == r.name) {
          throw ParseError{Loc(name, epath + ".name"),
                           r.name + " already named at " + other.where.ToString()};
        }
      }
      if (const YAML::Node per = e["perReplica"]; per.IsDefined() && !per.IsNull()) {
        if (!per.IsScalar())
          throw ParseError{Loc(per, epath + ".perReplica"), "must be auto or a size"};
        if (per.Scalar() != "auto") {
          r.per_replica = ParseByteSize(per.Scalar());
          if (!r.per_replica) {
            throw ParseError{
                Loc(per, epath + ".perReplica"),
                "must be auto or a size like 16Gi, 512Mi or bytes, got \"" + per.Scalar() + "\""};
          }
        }
      }
      if (const YAML::Node pt = e["passThrough"]; pt.IsDefined() && !pt.IsNull()) {
        bool value = false;
        if (!pt.IsScalar() || !YAML::convert<bool>::decode(pt, value)) {
          throw ParseError{Loc(pt, epath + ".passThrough"), "must be true or false"};
        }
        r.pass_through = value;
      }
      // A MIG instance is already a hardware partition; a time-sliced MIG resource's Allocate
      // has no whole GPU to write a region for, so every Allocate would fail.
      if (r.name.rfind("nvidia.com/mig-", 0) == 0 ||
          (r.name == "nvidia.com/gpu" && MigStrategy(root) == "single")) {
        throw ParseError{Loc(name, epath + ".name"),
                         r.name + " is a MIG resource" +
                             (r.name == "nvidia.com/gpu" ? " (flags.migStrategy: single)" : "") +
                             ": memory limits share whole GPUs; a MIG instance is already a "
                             "partition with its own memory, and every Allocate would fail"};
      }
      out.resources.push_back(std::move(r));
    }
    // Each limited resource's Allocate mounts its own accounting directory at /run/gpulet/cuda and
    // its own /etc/ld.so.preload: a container given two of them would get two mounts at each path.
    if (out.resources.size() > 1) {
      throw ParseError{out.resources[1].where,
                       out.resources[1].name + ": only one resource may have memory limits (" +
                           out.resources[0].name + " at " + out.resources[0].where.ToString() +
                           "): a container given both would get two accounting directories "
                           "mounted at /run/gpulet/cuda and two /etc/ld.so.preload"};
    }
    return out;
  }

 private:
  static std::string MigStrategy(const YAML::Node& root) {
    const YAML::Node flags = root["flags"];
    if (!flags.IsDefined() || !flags.IsMap()) return "";
    const YAML::Node strategy = flags["migStrategy"];
    return strategy.IsDefined() && strategy.IsScalar() ? strategy.Scalar() : "";
  }

  SourceLocation Loc(const YAML::Node& n, const std::string& path) const {
    const int line = n.IsDefined() && n.Mark().line >= 0 ? n.Mark().line + 1 : 0;
    return SourceLocation{file_, line, path};
  }

  void Keys(const YAML::Node& map, const std::string& path,
            std::initializer_list<std::string_view> allowed) const {
    if (!map.IsMap()) throw ParseError{Loc(map, path), "must be a mapping"};
    for (const auto& kv : map) {
      const std::string key = kv.first.Scalar();
      bool known = false;
      for (std::string_view a : allowed) known = known || a == key;
      if (!known) {
        std::string list;
        for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
        throw ParseError{Loc(kv.first, path + "." + key), "unknown key (known: " + list + ")"};
      }
    }
  }

  std::string AbsolutePath(const YAML::Node& n, const std::string& path) const {
    if (!n.IsScalar() || n.Scalar().empty() || n.Scalar()[0] != '/') {
      throw ParseError{Loc(n, path), "must be an absolute path"};
    }
    return n.Scalar();
  }

  std::string file_;
};

}  // namespace

std::optional<uint64_t> ParseByteSize(std::string_view text) {
  if (text.empty()) return std::nullopt;
  uint64_t value = 0;
  size_t i = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    if (__builtin_mul_overflow(value, 10, &value) ||
        __builtin_add_overflow(value, static_cast<uint64_t>(text[i] - '0'), &value)) {
      return std::nullopt;
    }
  }
  if (i == 0) return std::nullopt;
  const std::string_view suffix = text.substr(i);
  int shift = 0;
  if (suffix == "Ki")
    shift = 10;
  else if (suffix == "Mi")
    shift = 20;
  else if (suffix == "Gi")
    shift = 30;
  else if (suffix == "Ti")
    shift = 40;
  else if (!suffix.empty())
    return std::nullopt;
  if (value == 0 || (shift != 0 && value > (UINT64_MAX >> shift))) return std::nullopt;
  return value << shift;
}

const MemoryLimitResource* MemoryLimits::Find(const Config& config,
                                              const std::string& advertised) const {
  for (const MemoryLimitResource& r : resources) {
    if (r.name == advertised) return &r;
    if (config.sharing.time_slicing) {
      for (const ReplicatedResource& t : config.sharing.time_slicing->resources) {
        if (t.name == r.name && t.advertised_name == advertised) return &r;
      }
    }
  }
  return nullptr;
}

Result<std::optional<MemoryLimits>> ParseMemoryLimits(std::string_view yaml_text,
                                                      const std::string& filename) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception&) {
    return std::optional<MemoryLimits>();  // malformed YAML: config.cc reports it
  }
  try {
    return Parser(filename).Parse(root);
  } catch (const ParseError& e) {
    return InvalidAt(e.where, e.problem);
  } catch (const YAML::Exception& e) {
    return InvalidAt(SourceLocation{filename, e.mark.line + 1, "gpulet"}, e.msg);
  }
}

Result<std::optional<MemoryLimits>> LoadMemoryLimits(const std::string& path) {
  std::ifstream f(path);
  if (!f) return Status(ErrorCode::kNotFound, path + ": cannot read");
  std::stringstream ss;
  ss << f.rdbuf();
  return ParseMemoryLimits(ss.str(), path);
}

}  // namespace gpulet::config
