#include "mig/config.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <set>
#include <sstream>

namespace gpulet::mig {
namespace {

struct ParseError {
  std::string message;
};

[[noreturn]] void Fail(const std::string& file, const YAML::Node& at, const std::string& field,
                       const std::string& problem) {
  const int line = at.Mark().line >= 0 ? at.Mark().line + 1 : 0;
  throw ParseError{file + ":" + std::to_string(line) + ": " + field + ": " + problem};
}

unsigned Unsigned(const std::string& file, const YAML::Node& n, const std::string& field,
                  unsigned max) {
  if (!n.IsScalar()) Fail(file, n, field, "expected a number");
  const std::string& s = n.Scalar();
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 9) {
    Fail(file, n, field, "expected a non-negative integer, got \"" + s + "\"");
  }
  const unsigned long v = std::stoul(s);
  if (v > max) Fail(file, n, field, "must be <= " + std::to_string(max) + ", got " + s);
  return static_cast<unsigned>(v);
}

bool Bool(const std::string& file, const YAML::Node& n, const std::string& field) {
  if (n.IsScalar() && (n.Scalar() == "true" || n.Scalar() == "false")) return n.Scalar() == "true";
  Fail(file, n, field, "expected true or false");
}

// "3g.20gb": <slices>g.<memory>gb.
bool IsGpuInstanceProfileName(const std::string& s) {
  const size_t g = s.find("g.");
  if (g == std::string::npos || g == 0 || !s.ends_with("gb") || s.size() < g + 5) return false;
  const std::string slices = s.substr(0, g);
  const std::string mem = s.substr(g + 2, s.size() - g - 4);
  auto digits = [](const std::string& d) {
    return !d.empty() && d.find_first_not_of("0123456789") == std::string::npos;
  };
  return digits(slices) && digits(mem);
}

MigConfigEntry ParseEntry(const std::string& file, const YAML::Node& n, const std::string& field) {
  if (!n.IsMap()) Fail(file, n, field, "expected a mapping with devices, mig-enabled, mig-devices");
  MigConfigEntry e;
  e.line = n.Mark().line + 1;
  e.mig_devices_line = e.line;
  e.field = field;
  bool have_devices = false, have_enabled = false;
  for (auto it = n.begin(); it != n.end(); ++it) {
    const std::string key = it->first.Scalar();
    YAML::Node v = it->second;  // a copy: GCC 12 -O2 flags const operator[] on yaml-cpp temporaries
    const std::string f = field + "." + key;
    if (key == "devices") {
      have_devices = true;
      if (v.IsScalar() && v.Scalar() == "all") continue;
      if (!v.IsSequence()) Fail(file, v, f, "expected \"all\" or a list of GPU indexes");
      std::vector<unsigned> list;
      std::set<unsigned> seen;
      for (size_t i = 0; i < v.size(); ++i) {
        const std::string fi = f + "[" + std::to_string(i) + "]";
        unsigned d = Unsigned(file, v[i], fi, 1023);
        if (!seen.insert(d).second)
          Fail(file, v[i], fi, "GPU " + std::to_string(d) + " listed twice");
        list.push_back(d);
      }
      if (list.empty()) Fail(file, v, f, "empty list (use \"all\" or name GPU indexes)");
      e.devices = std::move(list);
    } else if (key == "mig-enabled") {
      have_enabled = true;
      e.mig_enabled = Bool(file, v, f);
    } else if (key == "mig-devices") {
      e.mig_devices_line = it->first.Mark().line + 1;
      if (v.IsNull()) continue;
      if (!v.IsMap())
        Fail(file, v, f, "expected a mapping of profile to count, e.g. {\"1g.5gb\": 7}");
      for (auto d = v.begin(); d != v.end(); ++d) {
        const std::string profile = d->first.Scalar();
        const std::string fp = f + "." + profile;
        if (profile.find("c.") != std::string::npos) {
          Fail(file, d->first, fp,
               "compute-instance profiles (\"1c.3g.20gb\") are not supported; name GPU instance "
               "profiles (\"3g.20gb\")");
        }
        if (!IsGpuInstanceProfileName(profile)) {
          Fail(file, d->first, fp, "expected a MIG profile name like \"3g.20gb\"");
        }
        const unsigned count = Unsigned(file, d->second, fp, 7);
        if (count > 0) e.mig_devices.emplace_back(profile, count);
      }
    } else {
      Fail(file, it->first, f, "unknown key (known: devices, mig-enabled, mig-devices)");
    }
  }
  if (!have_devices) Fail(file, n, field + ".devices", "required");
  if (!have_enabled) Fail(file, n, field + ".mig-enabled", "required");
  if (!e.mig_enabled && !e.mig_devices.empty()) {
    Fail(file, n, field + ".mig-devices", "given with mig-enabled: false");
  }
  return e;
}

}  // namespace

Result<MigConfig> ParseMigConfig(const std::string& text, const std::string& file,
                                 const std::string& name) {
  MigConfig config;
  config.file = file;
  config.name = name;
  try {
    YAML::Node root = YAML::Load(text);
    if (!root.IsMap())
      Fail(file, root, "(top level)", "expected a mapping with version and mig-configs");
    const YAML::Node version = root["version"];
    if (!version) Fail(file, root, "version", "required (v1)");
    if (!version.IsScalar() || version.Scalar() != "v1") {
      Fail(file, version, "version", "unsupported, expected v1");
    }
    for (auto it = root.begin(); it != root.end(); ++it) {
      const std::string key = it->first.Scalar();
      if (key != "version" && key != "mig-configs") {
        Fail(file, it->first, key, "unknown key (known: version, mig-configs)");
      }
    }
    const YAML::Node configs = root["mig-configs"];
    if (!configs) Fail(file, root, "mig-configs", "required");
    if (!configs.IsMap()) Fail(file, configs, "mig-configs", "expected a mapping of config names");
    const YAML::Node chosen = configs[name];
    if (!chosen) {
      std::string known;
      for (auto it = configs.begin(); it != configs.end(); ++it) {
        known += (known.empty() ? "" : ", ") + it->first.Scalar();
      }
      return Status(ErrorCode::kNotFound, file + ": mig-configs: no config \"" + name +
                                              "\" (configs: " + (known.empty() ? "none" : known) +
                                              ")");
    }
    const std::string field = "mig-configs." + name;
    if (!chosen.IsSequence() || chosen.size() == 0) {
      Fail(file, chosen, field, "expected a non-empty list of entries");
    }
    std::set<unsigned> claimed;
    bool all = false;
    for (size_t i = 0; i < chosen.size(); ++i) {
      const std::string f = field + "[" + std::to_string(i) + "]";
      MigConfigEntry e = ParseEntry(file, chosen[i], f);
      if (all || (!e.devices && i > 0)) {
        Fail(file, chosen[i], f + ".devices", "\"all\" overlaps another entry's devices");
      }
      if (!e.devices) all = true;
      for (unsigned d : e.devices.value_or(std::vector<unsigned>{})) {
        if (!claimed.insert(d).second) {
          Fail(file, chosen[i], f + ".devices",
               "GPU " + std::to_string(d) + " is already configured by an earlier entry");
        }
      }
      config.entries.push_back(std::move(e));
    }
  } catch (const ParseError& e) {
    return Status(ErrorCode::kInvalidInput, e.message);
  } catch (const YAML::Exception& e) {
    return Status(ErrorCode::kInvalidInput,
                  file + ":" + std::to_string(e.mark.line + 1) + ": (document): " + e.msg);
  }
  return config;
}

Result<MigConfig> LoadMigConfig(const std::string& path, const std::string& name) {
  std::ifstream in(path);
  if (!in) return Status(ErrorCode::kNotFound, path + ": cannot read the MIG config file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseMigConfig(ss.str(), path, name);
}

}  // namespace gpulet::mig
