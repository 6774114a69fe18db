#include "mig/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
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

bool Digits(const std::string& d) {
  return !d.empty() && d.size() <= 6 && d.find_first_not_of("0123456789") == std::string::npos;
}

// mig-parted's profile suffixes: media extensions, graphics, all media engines, no media engines.
constexpr const char* kProfileSuffixes[] = {"+me.all", "+me", "+gfx", "-me"};

// "3g.20gb", optionally with a suffix ("1g.10gb+me").
bool IsGpuInstanceProfileName(std::string s) {
  for (const char* suffix : kProfileSuffixes) {
    if (s.ends_with(suffix)) {
      s.resize(s.size() - std::string(suffix).size());
      break;
    }
  }
  const size_t g = s.find("g.");
  if (g == std::string::npos || g == 0 || !s.ends_with("gb") || s.size() < g + 5) return false;
  return Digits(s.substr(0, g)) && Digits(s.substr(g + 2, s.size() - g - 4));
}

// "1c.3g.20gb" (a compute-instance profile) or a GPU instance profile name.
bool IsDeviceName(const std::string& s) {
  const size_t c = s.find("c.");
  if (c != std::string::npos && c > 0 && Digits(s.substr(0, c))) {
    return IsGpuInstanceProfileName(s.substr(c + 2));
  }
  return IsGpuInstanceProfileName(s);
}

// "0x233010DE" (any case, 0x optional) → 0x233010DE.
std::optional<uint32_t> ParsePciDeviceId(std::string s) {
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s = s.substr(2);
  if (s.empty() || s.size() > 8 ||
      s.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
    return std::nullopt;
  }
  return static_cast<uint32_t>(std::stoul(s, nullptr, 16));
}

MigConfigEntry ParseEntry(const std::string& file, const YAML::Node& n, const std::string& field,
                          std::vector<std::string>& warnings) {
  if (!n.IsMap()) Fail(file, n, field, "expected a mapping with devices, mig-enabled, mig-devices");
  MigConfigEntry e;
  e.line = n.Mark().line + 1;
  e.mig_devices_line = e.line;
  e.field = field;
  bool have_devices = false, have_enabled = false, have_mig_devices = false;
  for (auto it = n.begin(); it != n.end(); ++it) {
    const std::string key = it->first.Scalar();
    YAML::Node v = it->second;  // a copy: GCC 12 -O2 flags const operator[] on yaml-cpp temporaries
    const std::string f = field + "." + key;
    if (key == "device-filter") {
      std::vector<YAML::Node> items;
      if (v.IsScalar()) {
        items.push_back(v);
      } else if (v.IsSequence()) {
        for (size_t i = 0; i < v.size(); ++i) items.push_back(v[i]);
      } else {
        Fail(file, v, f, "expected a PCI device id (\"0x20B010DE\") or a list of them");
      }
      for (const YAML::Node& item : items) {
        std::optional<uint32_t> id =
            item.IsScalar() ? ParsePciDeviceId(item.Scalar()) : std::nullopt;
        if (!id) {
          Fail(file, item, f,
               "expected a PCI device id like \"0x20B010DE\", got \"" +
                   (item.IsScalar() ? item.Scalar() : std::string("a collection")) + "\"");
        }
        e.device_filter.push_back(*id);
      }
      std::sort(e.device_filter.begin(), e.device_filter.end());
    } else if (key == "devices") {
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
      have_mig_devices = true;
      e.mig_devices_line = it->first.Mark().line + 1;
      if (v.IsNull()) continue;
      if (!v.IsMap())
        Fail(file, v, f, "expected a mapping of profile to count, e.g. {\"1g.5gb\": 7}");
      for (auto d = v.begin(); d != v.end(); ++d) {
        const std::string profile = d->first.Scalar();
        const std::string fp = f + "." + profile;
        if (!IsDeviceName(profile)) {
          Fail(file, d->first, fp,
               "expected a MIG profile name like \"3g.20gb\", \"1g.10gb+me\" or \"1c.3g.20gb\"");
        }
        const unsigned count = Unsigned(file, d->second, fp, 7);
        if (count > 0) e.mig_devices.emplace_back(profile, count);
      }
    } else {
      warnings.push_back(file + ":" + std::to_string(it->first.Mark().line + 1) + ": " + f +
                         ": unknown key, ignored (known: device-filter, devices, mig-enabled, "
                         "mig-devices)");
    }
  }
  if (!have_devices) Fail(file, n, field + ".devices", "required");
  if (!have_enabled) Fail(file, n, field + ".mig-enabled", "required");
  if (e.mig_enabled && !have_mig_devices) {
    Fail(file, n, field + ".mig-devices",
         "required with mig-enabled: true (use mig-devices: {} for MIG mode without devices)");
  }
  if (!e.mig_enabled && !e.mig_devices.empty()) {
    Fail(file, n, field + ".mig-devices", "given with mig-enabled: false");
  }
  return e;
}

}  // namespace

std::string GpuInstanceProfileOf(const std::string& device_name) {
  const size_t c = device_name.find("c.");
  if (c != std::string::npos && c > 0 && Digits(device_name.substr(0, c))) {
    return device_name.substr(c + 2);
  }
  return device_name;
}

unsigned ComputeSlicesOf(const std::string& device_name) {
  const size_t c = device_name.find("c.");
  if (c != std::string::npos && c > 0 && Digits(device_name.substr(0, c))) {
    return static_cast<unsigned>(std::stoul(device_name.substr(0, c)));
  }
  return 0;
}

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
        config.warnings.push_back(file + ":" + std::to_string(it->first.Mark().line + 1) + ": " +
                                  key + ": unknown key, ignored (known: version, mig-configs)");
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
    // Overlaps among entries with the same device-filter; across filters the planner checks.
    struct Claims {
      std::set<unsigned> devices;
      bool all = false;
      size_t entries = 0;
    };
    std::map<std::vector<uint32_t>, Claims> claims;
    for (size_t i = 0; i < chosen.size(); ++i) {
      const std::string f = field + "[" + std::to_string(i) + "]";
      MigConfigEntry e = ParseEntry(file, chosen[i], f, config.warnings);
      Claims& c = claims[e.device_filter];
      if (c.all || (!e.devices && c.entries > 0)) {
        Fail(file, chosen[i], f + ".devices", "\"all\" overlaps another entry's devices");
      }
      if (!e.devices) c.all = true;
      ++c.entries;
      for (unsigned d : e.devices.value_or(std::vector<unsigned>{})) {
        if (!c.devices.insert(d).second) {
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
