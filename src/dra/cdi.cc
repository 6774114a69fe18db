#include "dra/cdi.h"

#include <sys/stat.h>
#include <glob.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <sstream>

#include "common/files.h"

namespace gpulet::dra {

namespace fs = std::filesystem;

namespace {

// The user-space driver libraries a CUDA, NVML or video container uses (nvidia-ctk's compute,
// utility and video sets), by their unversioned name.
constexpr std::array<std::string_view, 14> kLibraries = {
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-gpucomp.so",
    "libnvidia-opencl.so",
    "libnvidia-allocator.so",
    "libnvidia-cfg.so",
    "libnvidia-pkcs11.so",
    "libnvidia-pkcs11-openssl3.so",
    "libnvcuvid.so",
    "libnvidia-encode.so",
    "libnvidia-opticalflow.so",
};
constexpr std::array<std::string_view, 2> kRequiredLibraries = {"libcuda.so", "libnvidia-ml.so"};

constexpr std::array<std::string_view, 6> kBinaries = {
    "nvidia-smi",           "nvidia-debugdump",         "nvidia-persistenced",
    "nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "nvidia-cdi-hook",
};

constexpr std::array<std::string_view, 6> kLibraryDirs = {
    "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
    "/lib/x86_64-linux-gnu",     "/lib64",                     "/usr/lib",
};
// /usr/local/nvidia is where a driver container or a cloud image puts the driver (GKE, the
// NVIDIA driver container, the device check's H200 machine: libraries in lib64, tools in bin).
constexpr std::array<std::string_view, 4> kBinaryDirs = {"/usr/bin", "/usr/local/bin", "/bin",
                                                         "/usr/local/nvidia/bin"};
constexpr size_t kMaxLdConfFiles = 64;
constexpr size_t kMaxLdConfDirs = 64;

constexpr std::array<std::string_view, 4> kControlNodes = {
    "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"};

bool VersionSuffix(std::string_view s) {
  if (s.empty() || s.front() == '.' || s.back() == '.') return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || c == '.'; });
}

// "/a/b" + "/c" without doubling the slash when root is "/".
std::string Under(const std::string& root, std::string_view path) {
  std::string r = root;
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  if (r == "/") return std::string(path);
  return r + std::string(path);
}

bool Exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

bool IsRegularFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

void AppendUnique(std::vector<std::string>& v, const std::string& s) {
  if (std::find(v.begin(), v.end(), s) == v.end()) v.push_back(s);
}

// The library directories the root's dynamic linker is configured with: <root>/etc/ld.so.conf and
// the files it includes (glob patterns, relative ones under /etc), absolute directories only,
// bounded. nvidia-ctk finds the driver through the root's ld cache; the configuration it is made
// from names the same directories (e.g. /usr/local/nvidia/lib64 on a driver-container host).
void LdConfDirs(const std::string& root, const std::string& file, size_t* files,
                std::vector<std::string>& out) {
  if (++*files > kMaxLdConfFiles) return;
  Result<std::string> text = ReadFileBounded(Under(root, file), 64 * 1024);
  if (!text.ok()) return;
  std::string line;
  std::istringstream in(*text);
  while (std::getline(in, line) && out.size() < kMaxLdConfDirs) {
    if (size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    line = line.substr(first, line.find_last_not_of(" \t\r") - first + 1);
    if (line.starts_with("include") && line.size() > 7 && (line[7] == ' ' || line[7] == '\t')) {
      std::string pattern = line.substr(line.find_first_not_of(" \t", 7));
      if (!pattern.starts_with("/")) pattern = "/etc/" + pattern;
      glob_t g{};
      if (::glob(Under(root, pattern).c_str(), 0, nullptr, &g) == 0) {
        const std::string prefix = Under(root, "/");
        for (size_t i = 0; i < g.gl_pathc; ++i) {
          std::string path = g.gl_pathv[i];
          if (prefix != "/" && path.starts_with(prefix)) path = path.substr(prefix.size());
          if (!path.starts_with("/")) path = "/" + path;
          LdConfDirs(root, path, files, out);
        }
      }
      ::globfree(&g);
      continue;
    }
    if (line.starts_with("/") && line.find("..") == std::string::npos) {
      while (line.size() > 1 && line.back() == '/') line.pop_back();
      AppendUnique(out, line);
    }
  }
}

}  // namespace

void CdiEdits::Merge(const CdiEdits& other) {
  for (const std::string& e : other.env) AppendUnique(env, e);
  for (const CdiDeviceNode& n : other.device_nodes) {
    if (std::none_of(device_nodes.begin(), device_nodes.end(),
                     [&](const CdiDeviceNode& x) { return x.path == n.path; })) {
      device_nodes.push_back(n);
    }
  }
  for (const CdiMount& m : other.mounts) {
    if (std::none_of(mounts.begin(), mounts.end(), [&](const CdiMount& x) {
          return x.container_path == m.container_path;
        })) {
      mounts.push_back(m);
    }
  }
  for (const CdiHook& h : other.hooks) {
    if (std::find(hooks.begin(), hooks.end(), h) == hooks.end()) hooks.push_back(h);
  }
}

std::string MinimumCdiVersion(const CdiSpec& spec) {
  bool v050 = false;
  bool v060 = false;
  auto edits_need_050 = [](const CdiEdits& e) {
    return std::any_of(e.device_nodes.begin(), e.device_nodes.end(),
                       [](const CdiDeviceNode& n) { return !n.host_path.empty(); });
  };
  for (const CdiDevice& d : spec.devices) {
    if (!d.name.empty() && d.name[0] >= '0' && d.name[0] <= '9') v050 = true;
    if (edits_need_050(d.edits)) v050 = true;
  }
  if (edits_need_050(spec.edits)) v050 = true;
  if (const size_t slash = spec.kind.find('/');
      slash != std::string::npos && spec.kind.find('.', slash) != std::string::npos) {
    v060 = true;
  }
  // We write no mount type (0.4.0), annotations (0.6.0), intelRdt/additionalGids (0.7.0) or
  // netDevices (1.1.0).
  if (v060) return "0.6.0";
  if (v050) return "0.5.0";
  return "0.3.0";
}

namespace {

nlohmann::json EditsToJson(const CdiEdits& e) {
  nlohmann::json j = nlohmann::json::object();
  if (!e.env.empty()) j["env"] = e.env;
  if (!e.device_nodes.empty()) {
    nlohmann::json nodes = nlohmann::json::array();
    for (const CdiDeviceNode& n : e.device_nodes) {
      nlohmann::json o = {{"path", n.path}};
      if (!n.host_path.empty()) o["hostPath"] = n.host_path;
      nodes.push_back(std::move(o));
    }
    j["deviceNodes"] = std::move(nodes);
  }
  if (!e.mounts.empty()) {
    nlohmann::json mounts = nlohmann::json::array();
    for (const CdiMount& m : e.mounts) {
      nlohmann::json o = {{"hostPath", m.host_path}, {"containerPath", m.container_path}};
      if (!m.options.empty()) o["options"] = m.options;
      mounts.push_back(std::move(o));
    }
    j["mounts"] = std::move(mounts);
  }
  if (!e.hooks.empty()) {
    nlohmann::json hooks = nlohmann::json::array();
    for (const CdiHook& h : e.hooks) {
      nlohmann::json o = {{"hookName", h.hook_name}, {"path", h.path}};
      if (!h.args.empty()) o["args"] = h.args;
      hooks.push_back(std::move(o));
    }
    j["hooks"] = std::move(hooks);
  }
  return j;
}

}  // namespace

nlohmann::json CdiSpecToJson(const CdiSpec& spec) {
  nlohmann::json j = {{"cdiVersion", MinimumCdiVersion(spec)}, {"kind", spec.kind}};
  nlohmann::json devices = nlohmann::json::array();
  for (const CdiDevice& d : spec.devices) {
    devices.push_back({{"name", d.name}, {"containerEdits", EditsToJson(d.edits)}});
  }
  j["devices"] = std::move(devices);
  if (!spec.edits.empty()) j["containerEdits"] = EditsToJson(spec.edits);
  return j;
}

std::string TransientSpecName(std::string_view id) {
  return std::string(kCdiVendor) + "-" + kCdiClass + "_" + std::string(id);
}

std::string QualifiedDeviceName(std::string_view kind, std::string_view name) {
  return std::string(kind) + "=" + std::string(name);
}

std::vector<std::string> ReadOnlyMountOptions() {
  return {"ro", "nosuid", "nodev", "rbind", "rprivate"};
}
std::vector<std::string> ReadWriteMountOptions() {
  return {"rw", "nosuid", "nodev", "rbind", "rprivate"};
}

Result<DriverFiles> FindDriverFiles(const std::string& driver_root,
                                    const std::string& driver_version) {
  DriverFiles out;
  for (std::string_view node : kControlNodes) {
    if (Exists(Under(driver_root, node))) out.control_nodes.emplace_back(node);
  }
  if (std::find(out.control_nodes.begin(), out.control_nodes.end(), "/dev/nvidiactl") ==
      out.control_nodes.end()) {
    return Status(ErrorCode::kNotFound,
                  Under(driver_root, "/dev/nvidiactl") + ": missing (is the driver loaded?)");
  }
  std::vector<std::string> library_dirs(kLibraryDirs.begin(), kLibraryDirs.end());
  size_t conf_files = 0;
  LdConfDirs(driver_root, "/etc/ld.so.conf", &conf_files, library_dirs);
  std::vector<std::string_view> found_names;
  for (const std::string& dir : library_dirs) {
    const std::string host_dir = Under(driver_root, dir);
    std::error_code ec;
    if (!fs::is_directory(host_dir, ec)) continue;
    std::vector<std::string> entries;
    for (fs::directory_iterator it(host_dir, ec), end; !ec && it != end; it.increment(ec)) {
      entries.push_back(it->path().filename().string());
    }
    std::sort(entries.begin(), entries.end());
    for (std::string_view lib : kLibraries) {
      if (std::find(found_names.begin(), found_names.end(), lib) != found_names.end()) continue;
      for (const std::string& e : entries) {
        if (!e.starts_with(std::string(lib) + ".")) continue;
        const std::string_view version = std::string_view(e).substr(lib.size() + 1);
        if (driver_version.empty() ? !VersionSuffix(version) || version.find('.') == std::string::npos
                                   : version != driver_version) {
          continue;
        }
        const std::string real = host_dir + "/" + e;
        if (!IsRegularFile(real) || fs::is_symlink(real, ec)) continue;
        DriverFiles::Library l;
        l.path = std::string(dir) + "/" + e;
        // Sibling symlinks naming this file (libcuda.so.1 -> libcuda.so.550.54.15): the sonames.
        for (const std::string& s : entries) {
          if (s == e || !s.starts_with(std::string(lib) + ".")) continue;
          const std::string link = host_dir + "/" + s;
          if (!fs::is_symlink(link, ec)) continue;
          const fs::path target = fs::read_symlink(link, ec);
          if (!ec && target == e) l.sonames.push_back(std::string(dir) + "/" + s);
        }
        out.libraries.push_back(std::move(l));
        found_names.push_back(lib);
        AppendUnique(out.library_dirs, std::string(dir));
        break;
      }
    }
  }
  for (std::string_view lib : kRequiredLibraries) {
    if (std::find(found_names.begin(), found_names.end(), lib) == found_names.end()) {
      return Status(ErrorCode::kNotFound,
                    driver_root + ": no " + std::string(lib) + "." +
                        (driver_version.empty() ? std::string("<version>") : driver_version) +
                        " in its library directories (is --driver-root right?)");
    }
  }
  for (std::string_view bin : kBinaries) {
    for (std::string_view dir : kBinaryDirs) {
      const std::string rel = std::string(dir) + "/" + std::string(bin);
      if (!IsRegularFile(Under(driver_root, rel))) continue;
      if (bin == "nvidia-cdi-hook") {
        out.cdi_hook = rel;
      } else {
        out.binaries.push_back(rel);
      }
      break;
    }
  }
  return out;
}

CdiEdits CommonDriverEdits(const DriverFiles& files, const std::string& host_root,
                           const std::string& hook_binary) {
  CdiEdits e;
  for (const std::string& n : files.control_nodes) {
    CdiDeviceNode node{n, ""};
    if (const std::string host = Under(host_root, n); host != n) node.host_path = host;
    e.device_nodes.push_back(std::move(node));
  }
  for (const DriverFiles::Library& l : files.libraries) {
    e.mounts.push_back({Under(host_root, l.path), l.path, ReadOnlyMountOptions()});
    for (const std::string& s : l.sonames) {
      e.mounts.push_back({Under(host_root, l.path), s, ReadOnlyMountOptions()});
    }
  }
  for (const std::string& b : files.binaries) {
    e.mounts.push_back({Under(host_root, b), b, ReadOnlyMountOptions()});
  }
  std::string hook = hook_binary;
  if (hook.empty() && !files.cdi_hook.empty()) hook = Under(host_root, files.cdi_hook);
  if (!hook.empty() && !files.library_dirs.empty()) {
    CdiHook h{"createContainer", hook, {"nvidia-cdi-hook", "update-ldcache"}};
    for (const std::string& d : files.library_dirs) {
      h.args.push_back("--folder");
      h.args.push_back(d);
    }
    e.hooks.push_back(std::move(h));
  }
  return e;
}

Result<CdiDeviceNode> DeviceNodeEdit(const std::string& driver_root, const std::string& host_root,
                                     const std::string& path) {
  if (!Exists(Under(driver_root, path))) {
    return Status(ErrorCode::kNotFound, Under(driver_root, path) + ": device node missing");
  }
  CdiDeviceNode node{path, ""};
  if (const std::string host = Under(host_root, path); host != path) node.host_path = host;
  return node;
}

bool NvidiaCdiDevices::Has(std::string_view name) const {
  return std::find(names.begin(), names.end(), name) != names.end();
}

NvidiaCdiDevices FindNvidiaCdiDevices(const std::vector<std::string>& dirs) {
  constexpr size_t kMaxSpecBytes = 4u << 20;
  NvidiaCdiDevices out;
  for (const std::string& dir : dirs) {
    std::error_code ec;
    std::vector<fs::path> files;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string ext = it->path().extension().string();
      if (ext == ".json" || ext == ".yaml" || ext == ".yml") files.push_back(it->path());
    }
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      // Our own transient specs are never nvidia-ctk's.
      if (f.filename().string().starts_with(std::string(kCdiVendor) + "-")) continue;
      Result<std::string> text = ReadFileBounded(f.string(), kMaxSpecBytes);
      if (!text.ok()) continue;
      try {
        const YAML::Node spec = YAML::Load(*text);
        if (!spec.IsMap() || !spec["kind"] || spec["kind"].as<std::string>() != kNvidiaCdiKind) {
          continue;
        }
        const YAML::Node devices = spec["devices"];
        if (!devices.IsSequence()) continue;
        for (const YAML::Node& d : devices) {
          if (d.IsMap() && d["name"] && d["name"].IsScalar()) {
            AppendUnique(out.names, d["name"].as<std::string>());
          }
        }
      } catch (const YAML::Exception&) {
        continue;  // not a spec we can read: the runtime will say so, we generate our own edits
      }
    }
  }
  return out;
}

}  // namespace gpulet::dra
