#include "doctor/doctor.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "common/files.h"
#include "dra/names.h"
#include "k8s/client.h"

namespace gpulet::doctor {
namespace fs = std::filesystem;

namespace {

Check Make(const std::string& id, Verdict v, std::string detail, std::string fix = "") {
  return {id, v, std::move(detail), std::move(fix)};
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Join(const std::vector<std::string>& items, const std::string& sep = ", ") {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : sep) + s;
  return out;
}

bool IsSocket(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}



constexpr const char* kDraDriver = dra::kDriverName;

// The DRA checks run here: forced by DoctorOptions::dra, else when the driver's registration
// socket is in the kubelet's plugin registry. `why` says which.
bool DraActive(const DoctorOptions& o, std::string* why) {
  if (o.dra.has_value()) {
    *why = *o.dra ? "--dra" : "DRA checks turned off";
    return *o.dra;
  }
  std::error_code ec;
  if (fs::is_directory(o.plugins_registry, ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator(o.plugins_registry, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(std::string(kDraDriver) + "-", 0) == 0 && name.size() > 5 &&
          name.substr(name.size() - 5) == ".sock" && IsSocket(e.path().string())) {
        *why = "registration socket " + e.path().string();
        return true;
      }
    }
  }
  *why = "gpulet's DRA driver is not registered on this node (no " + std::string(kDraDriver) +
         "-*.sock in " + o.plugins_registry + "); pass --dra to check before deploying it";
  return false;
}

// The subset of TOML that runtime configs use: [tables], key = value with strings, booleans,
// numbers and (possibly multi-line) arrays, # comments. Keys are flattened to
// "table.key" with quotes dropped: [plugins."io.containerd.grpc.v1.cri"] enable_cdi = true →
// "plugins.io.containerd.grpc.v1.cri.enable_cdi" → "true". Lines it cannot read are skipped.
std::string StripTomlComment(const std::string& line) {
  bool in_string = false;
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_string) {
      if (c == '\\' && quote == '"') ++i;
      else if (c == quote) in_string = false;
    } else if (c == '"' || c == '\'') {
      in_string = true;
      quote = c;
    } else if (c == '#') {
      return line.substr(0, i);
    }
  }
  return line;
}

std::string TrimSpace(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

std::string FlattenTomlKey(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '"' || c == '\'' || c == ' ' || c == '\t') continue;
    out += c;
  }
  return out;
}

std::map<std::string, std::string> ReadToml(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string table, line;
  while (std::getline(in, line)) {
    line = TrimSpace(StripTomlComment(line));
    if (line.empty()) continue;
    if (line.front() == '[') {
      std::string name = line.substr(line.rfind('[') == 1 ? 2 : 1);
      name = name.substr(0, name.find(']'));
      table = FlattenTomlKey(name);
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = FlattenTomlKey(line.substr(0, eq));
    std::string value = TrimSpace(line.substr(eq + 1));
    if (!value.empty() && value.front() == '[') {
      // A multi-line array: read until the brackets balance (bounded).
      for (int extra = 0; extra < 256 && std::count(value.begin(), value.end(), '[') >
                                             std::count(value.begin(), value.end(), ']');
           ++extra) {
        if (!std::getline(in, line)) break;
        value += " " + TrimSpace(StripTomlComment(line));
      }
    }
    out[table.empty() ? key : table + "." + key] = value;
  }
  return out;
}

// The quoted strings of a TOML array value.
std::vector<std::string> TomlStrings(const std::string& value) {
  std::vector<std::string> out;
  for (size_t i = 0; i < value.size(); ++i) {
    if (value[i] != '"' && value[i] != '\'') continue;
    const size_t end = value.find(value[i], i + 1);
    if (end == std::string::npos) break;
    out.push_back(value.substr(i + 1, end - i - 1));
    i = end;
  }
  return out;
}

// /var/run is /run on every distribution the kubelet runs on.
std::string CanonicalRunPath(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  if (p.rfind("/var/run/", 0) == 0 || p == "/var/run") p = p.substr(4);
  return p;
}

bool ListsDir(const std::vector<std::string>& dirs, const std::string& dir) {
  for (const std::string& d : dirs) {
    if (CanonicalRunPath(d) == CanonicalRunPath(dir)) return true;
  }
  return false;
}

// A runtime config: a file, or a directory of drop-ins (*.conf, read in name order, later keys
// win, as CRI-O reads crio.conf.d).
struct RuntimeConfig {
  std::string path;
  std::map<std::string, std::string> keys;
};

std::optional<RuntimeConfig> ReadRuntimeConfig(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    std::vector<std::string> files;
    for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
      if (e.path().extension() == ".conf" || e.path().extension() == ".toml")
        files.push_back(e.path().string());
    }
    if (files.empty()) return std::nullopt;
    std::sort(files.begin(), files.end());
    RuntimeConfig c{path, {}};
    for (const std::string& f : files) {
      for (auto& [k, v] : ReadToml(ReadAll(f))) c.keys[k] = v;
    }
    return c;
  }
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  return RuntimeConfig{path, ReadToml(ReadAll(path))};
}

}  // namespace

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kPass:
      return "PASS";
    case Verdict::kWarn:
      return "WARN";
    case Verdict::kFail:
      return "FAIL";
    case Verdict::kSkip:
      return "SKIP";
  }
  return "?";
}

Check CheckDriver(const DriverState& d) {
  const std::string id = "driver";
  if (!d.load.ok()) {
    std::string fix;
    switch (d.load.code()) {
      case ErrorCode::kNvmlLibraryMissing:
        fix =
            "install the NVIDIA driver on the node; in a pod, run with the NVIDIA container "
            "runtime (NVIDIA_VISIBLE_DEVICES=all, NVIDIA_DRIVER_CAPABILITIES=utility) so "
            "libnvidia-ml.so.1 is mounted, or pass --nvml-library";
        break;
      case ErrorCode::kNvmlSymbolMissing:
        fix = "the driver is too old for gpulet or the library is not NVML: upgrade the driver";
        break;
      case ErrorCode::kNvmlInitFailed:
        fix =
            "the kernel module is not loaded or does not match the library: `nvidia-smi` on the "
            "host shows which; reboot after a driver upgrade or `modprobe nvidia`";
        break;
      default:
        fix = "check the driver with `nvidia-smi` on the host";
    }
    return Make(id, Verdict::kFail, d.load.message(), fix);
  }
  if (d.inventory) {
    const gpu::Inventory& inv = *d.inventory;
    return Make(id, Verdict::kPass,
                "NVIDIA driver " + inv.driver_version + " (CUDA " +
                    (inv.cuda_version.empty() ? "?" : inv.cuda_version) + ") through " +
                    inv.nvml_library + ": " + std::to_string(inv.gpus.size()) + " GPUs, " +
                    std::to_string(inv.MigDeviceCount()) + " MIG devices");
  }
  return Make(id, Verdict::kPass,
              "NVML loaded from " + (d.nvml ? d.nvml->library_path() : std::string("?")) +
                  " (discovery failed: see gpu-health)");
}

Check CheckDeviceNodes(const DriverState& d, const std::string& dev_root) {
  std::vector<std::string> wanted = {dev_root + "/nvidiactl", dev_root + "/nvidia-uvm"};
  if (d.inventory) {
    for (const gpu::Gpu& g : d.inventory->gpus)
      wanted.push_back(dev_root + "/nvidia" + std::to_string(g.minor));
  } else if (d.nvml) {
    unsigned count = 0;
    if (d.nvml->fn().nvmlDeviceGetCount_v2(&count) == NVML_SUCCESS) {
      for (unsigned i = 0; i < count; ++i)
        wanted.push_back(dev_root + "/nvidia" + std::to_string(i));
    }
  }
  std::vector<std::string> missing;
  for (const std::string& p : wanted) {
    if (!fs::exists(p)) missing.push_back(p);
  }
  if (missing.empty()) {
    return Make("device-nodes", Verdict::kPass,
                std::to_string(wanted.size()) + " device nodes present under " + dev_root);
  }
  return Make("device-nodes", Verdict::kFail, "missing: " + Join(missing),
              "create them with `nvidia-modprobe -u -c=0` (nvidia-uvm) or `nvidia-smi` on the host "
              "(nvidiactl, nvidiaN); in a pod, mount the host's /dev (--dev-root)");
}

Check CheckContainerRuntime(const DoctorOptions& o) {
  std::vector<std::string> found;
  for (const std::string& dir : o.cdi_dirs) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
      const std::string ext = e.path().extension().string();
      if (ext != ".yaml" && ext != ".json") continue;
      if (ReadAll(e.path().string()).find("nvidia.com/gpu") != std::string::npos) {
        found.push_back("CDI spec " + e.path().string());
      }
    }
  }
  for (const std::string& cfg : o.runtime_configs) {
    if (ReadAll(cfg).find("nvidia-container-runtime") != std::string::npos) {
      found.push_back("nvidia runtime in " + cfg);
    }
  }
  if (!found.empty()) return Make("container-runtime", Verdict::kPass, Join(found));
  return Make("container-runtime", Verdict::kFail,
              "no NVIDIA CDI spec in " + Join(o.cdi_dirs) + " and no nvidia runtime in " +
                  Join(o.runtime_configs),
              "install the NVIDIA Container Toolkit, then `nvidia-ctk runtime configure "
              "--runtime=containerd --set-as-default && systemctl restart containerd`, or "
              "generate CDI specs: `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`");
}

Check CheckKubelet(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return Make("kubelet", Verdict::kFail, dir + " does not exist",
                "the kubelet is not installed or uses another root dir; pass "
                "--device-plugin-path, and mount it into the gpulet pod");
  }
  const std::string sock = dir + "/kubelet.sock";
  if (!IsSocket(sock)) {
    return Make("kubelet", Verdict::kFail, sock + " is missing",
                "start the kubelet (`systemctl status kubelet`); it creates kubelet.sock when "
                "the DevicePlugins feature is on (default)");
  }
  if (!UnixSocketAccepts(sock)) {
    return Make("kubelet", Verdict::kFail, sock + " exists but nothing accepts connections",
                "the kubelet is down or restarting: `systemctl status kubelet`, "
                "`journalctl -u kubelet`");
  }
  return Make("kubelet", Verdict::kPass, sock + " accepts connections");
}

Check CheckPluginRegistration(const std::string& dir, const std::string& checkpoint_path) {
  const std::string id = "plugin-registration";
  std::vector<std::string> sockets;
  std::error_code ec;
  if (fs::is_directory(dir, ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (dra::DevicePluginSocketResource(name) && IsSocket(e.path().string())) {
        sockets.push_back(name);
      }
    }
  }
  std::sort(sockets.begin(), sockets.end());
  if (sockets.empty()) {
    return Make(id, Verdict::kFail, "no gpulet resource socket (nvidia-*.sock) in " + dir,
                "gpulet node is not running on this node: `kubectl -n gpulet-system get pods "
                "-o wide` and its log; check the DaemonSet's node affinity matches this node");
  }
  const std::string cp =
      checkpoint_path.empty() ? dir + "/kubelet_internal_checkpoint" : checkpoint_path;
  const std::string text = ReadAll(cp);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (text.empty() || j.is_discarded() || !j.is_object()) {
    return Make(id, Verdict::kWarn,
                "sockets " + Join(sockets) + " present, but the kubelet checkpoint " + cp +
                    " is missing or unreadable, so registration cannot be confirmed",
                "wait for the kubelet to write it (it does after the first registration); if it "
                "stays missing, the kubelet never accepted a Register call: see gpulet's log");
  }
  const nlohmann::json registered =
      j.contains("Data") && j["Data"].is_object()
          ? j["Data"].value("RegisteredDevices", nlohmann::json::object())
          : nlohmann::json::object();
  std::vector<std::string> ok, missing, stale;
  std::set<std::string> socket_resources;
  for (const std::string& s : sockets) {
    const std::string r = dra::DevicePluginSocketResource(s).value_or(s);
    socket_resources.insert(r);
    if (registered.is_object() && registered.contains(r) && registered[r].is_array()) {
      ok.push_back(r + " (" + std::to_string(registered[r].size()) + " devices)");
    } else {
      missing.push_back(r + " (" + s + ")");
    }
  }
  if (registered.is_object()) {
    for (auto it = registered.begin(); it != registered.end(); ++it) {
      if (it.key().rfind("nvidia.com/", 0) == 0 && !socket_resources.count(it.key())) {
        stale.push_back(it.key());
      }
    }
  }
  if (!missing.empty()) {
    return Make(id, Verdict::kFail,
                "not registered with the kubelet: " + Join(missing) +
                    (ok.empty() ? "" : "; registered: " + Join(ok)),
                "gpulet serves the socket but the kubelet has not accepted it: check gpulet's log "
                "for event=register errors and the kubelet's for \"device plugin\"; restarting the "
                "gpulet pod re-registers");
  }
  if (!stale.empty()) {
    return Make(id, Verdict::kWarn,
                "registered: " + Join(ok) + "; the kubelet also remembers " + Join(stale) +
                    " with no socket",
                "a resource gpulet no longer serves (old config or NVIDIA's plugin): the kubelet "
                "drops it after its grace period; remove NVIDIA's device plugin if it still runs");
  }
  return Make(id, Verdict::kPass, "registered: " + Join(ok));
}

Check CheckGpuHealth(const DriverState& d) {
  const std::string id = "gpu-health";
  if (!d.load.ok()) return Make(id, Verdict::kSkip, "no driver");
  if (!d.discover.ok()) {
    return Make(id, Verdict::kFail, d.discover.message(),
                d.discover.code() == ErrorCode::kGpuLost
                    ? "a GPU fell off the bus (XID 79): drain the node, reset the GPU "
                      "(`nvidia-smi -r -i N`) or reboot; replace it if it recurs"
                    : "check `nvidia-smi -q` on the host and the kernel log (`dmesg | grep NVRM`)");
  }
  const gpu::NvmlFunctions& fn = d.nvml->fn();
  std::vector<std::string> failed, warned;
  for (const gpu::Gpu& g : d.inventory->gpus) {
    const std::string name = "GPU " + std::to_string(g.index) + " (" + g.uuid + ")";
    nvmlDevice_t dev{};
    nvmlReturn_t rc = fn.nvmlDeviceGetHandleByIndex_v2(g.index, &dev);
    nvmlMemory_t mem{};
    if (rc == NVML_SUCCESS) rc = fn.nvmlDeviceGetMemoryInfo(dev, &mem);
    if (rc == NVML_ERROR_GPU_IS_LOST) {
      failed.push_back(name + " is lost");
      continue;
    }
    if (rc != NVML_SUCCESS) {
      failed.push_back(name + ": " + d.nvml->ErrorText(rc));
      continue;
    }
    unsigned long long dbe = 0;
    if (fn.nvmlDeviceGetTotalEccErrors != nullptr &&
        fn.nvmlDeviceGetTotalEccErrors(dev, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC,
                                       &dbe) == NVML_SUCCESS &&
        dbe > 0) {
      failed.push_back(name + ": " + std::to_string(dbe) + " uncorrectable ECC errors since boot");
    }
    unsigned corr = 0, unc = 0, pending = 0, failure = 0;
    if (fn.nvmlDeviceGetRemappedRows != nullptr &&
        fn.nvmlDeviceGetRemappedRows(dev, &corr, &unc, &pending, &failure) == NVML_SUCCESS) {
      if (failure)
        failed.push_back(name + ": row remapping failed");
      else if (pending)
        warned.push_back(name + ": row remapping pending");
    }
  }
  if (!failed.empty()) {
    return Make(id, Verdict::kFail, Join(failed, "; "),
                "gpulet advertises these as Unhealthy; drain the node, reset the GPU "
                "(`nvidia-smi -r -i N`) or reboot, and replace hardware with recurring errors");
  }
  if (!warned.empty()) {
    return Make(id, Verdict::kWarn, Join(warned, "; "),
                "reset the GPU when idle (`nvidia-smi -r -i N`) to apply the remapping");
  }
  return Make(id, Verdict::kPass,
              std::to_string(d.inventory->gpus.size()) +
                  " GPUs respond, no "
                  "uncorrectable ECC errors");
}

Check CheckMigStrategy(const std::optional<gpu::Inventory>& inv,
                       const std::optional<config::Config>& cfg) {
  const std::string id = "mig-strategy";
  if (!inv) return Make(id, Verdict::kSkip, "no inventory");
  const config::MigStrategy strategy =
      cfg && cfg->flags.mig_strategy ? *cfg->flags.mig_strategy : config::MigStrategy::kNone;
  const std::string sname = std::string("migStrategy ") + config::MigStrategyName(strategy) +
                            (cfg ? "" : " (no --config: the default)");
  std::vector<std::string> mig_gpus, whole_gpus;
  std::set<std::string> profiles;
  for (const gpu::Gpu& g : inv->gpus) {
    (g.mig_enabled ? mig_gpus : whole_gpus).push_back(std::to_string(g.index));
    for (const gpu::MigDevice& m : g.mig_devices) profiles.insert(m.profile);
  }
  switch (strategy) {
    case config::MigStrategy::kNone:
      if (!mig_gpus.empty()) {
        return Make(id, Verdict::kWarn,
                    "MIG is enabled on GPU " + Join(mig_gpus) + " but " + sname +
                        ": those GPUs are advertised whole and their MIG devices are not",
                    "set flags.migStrategy: mixed (label the node "
                    "nvidia.com/device-plugin.config=mig-mixed), or disable MIG");
      }
      break;
    case config::MigStrategy::kSingle:
      if (profiles.size() > 1) {
        return Make(id, Verdict::kFail,
                    sname + " needs one MIG profile on the node, found " +
                        Join(std::vector<std::string>(profiles.begin(), profiles.end())),
                    "use migStrategy: mixed, or repartition every GPU alike (`gpulet mig apply`)");
      }
      if (!whole_gpus.empty()) {
        return Make(id, Verdict::kFail, sname + " but MIG is disabled on GPU " + Join(whole_gpus),
                    "enable MIG on every GPU, or use migStrategy: mixed");
      }
      break;
    case config::MigStrategy::kMixed:
      if (mig_gpus.empty()) {
        return Make(
            id, Verdict::kWarn, sname + " but no GPU has MIG enabled: no mig-* resources",
            "partition the GPUs (`gpulet mig apply -f FILE -c NAME`) or use migStrategy: none");
      }
      break;
  }
  return Make(
      id, Verdict::kPass,
      sname + ", " + std::to_string(mig_gpus.size()) + " MIG-enabled GPUs" +
          (profiles.empty()
               ? std::string()
               : " (" + Join(std::vector<std::string>(profiles.begin(), profiles.end())) + ")"));
}

Check CheckMps(const std::optional<config::Config>& cfg, const std::string& mps_root) {
  const std::string id = "mps";
  if (!cfg || !cfg->sharing.mps) return Make(id, Verdict::kSkip, "MPS not configured");
  std::vector<std::string> pipes;
  std::error_code ec;
  if (fs::is_directory(mps_root, ec)) {
    for (auto it = fs::recursive_directory_iterator(mps_root, ec);
         it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) break;
      if (it.depth() > 4) it.disable_recursion_pending();
      struct stat st {};
      if (it->path().filename() == "control" && ::stat(it->path().c_str(), &st) == 0 &&
          S_ISFIFO(st.st_mode)) {
        pipes.push_back(it->path().string());
      }
    }
  }
  if (pipes.empty()) {
    return Make(id, Verdict::kFail,
                "sharing.mps is configured but no MPS control daemon pipe under " + mps_root,
                "gpulet starts nvidia-cuda-mps-control for the shared GPUs: check gpulet's log for "
                "event=mps_*, that the binary exists in the driver root, and that " +
                    mps_root + " is mounted into the pod");
  }
  std::sort(pipes.begin(), pipes.end());
  // A pipe outlives a daemon that was killed: the daemon is up only when the pid it wrote next
  // to its pipe is a live process.
  std::vector<std::string> running, dead;
  for (const std::string& pipe : pipes) {
    const std::string dir = fs::path(pipe).parent_path().string();
    const std::string pid_text = ReadAll(dir + "/nvidia-cuda-mps-control.pid");
    long pid = 0;
    try {
      pid = std::stol(pid_text);
    } catch (...) {
      pid = 0;
    }
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) == 0) {
      running.push_back(dir + " (pid " + std::to_string(pid) + ")");
    } else {
      dead.push_back(dir + (pid > 0 ? " (pid " + std::to_string(pid) + " gone)" : " (no pid file)"));
    }
  }
  if (!dead.empty()) {
    return Make(id, Verdict::kFail, "MPS control daemon not running for " + Join(dead),
                "gpulet restarts a dead daemon with backoff and marks its replicas Unhealthy "
                "meanwhile: check gpulet's log for event=mps_* (binary missing, compute mode "
                "refused) and that gpulet itself is running");
  }
  return Make(id, Verdict::kPass, "MPS control daemon running: " + Join(running));
}

Check CheckKubernetes(const k8s::Client* api, const std::string& node_name) {
  const std::string id = "kubernetes";
  if (api == nullptr || node_name.empty()) {
    return Make(id, Verdict::kSkip,
                "no API access (pass --node-name and --kubeconfig, or run in the gpulet pod)");
  }
  Result<nlohmann::json> node = api->Get("/api/v1/nodes/" + node_name);
  if (!node.ok()) {
    return Make(id, Verdict::kFail, node.status().message(),
                node.status().code() == ErrorCode::kNotFound
                    ? "the node name must be the Kubernetes node name (`kubectl get nodes`)"
                    : "check the API address and credentials, and that gpulet's RBAC allows "
                      "get on nodes");
  }
  const nlohmann::json status = node->value("status", nlohmann::json::object());
  const nlohmann::json cap = status.value("capacity", nlohmann::json::object());
  const nlohmann::json alloc = status.value("allocatable", nlohmann::json::object());
  std::vector<std::string> lines;
  long long total = 0;
  bool short_alloc = false;
  for (auto it = cap.begin(); it != cap.end(); ++it) {
    if (it.key().rfind("nvidia.com/", 0) != 0 || !it->is_string()) continue;
    const long long c = std::atoll(it->get<std::string>().c_str());
    const long long a = alloc.contains(it.key()) && alloc[it.key()].is_string()
                            ? std::atoll(alloc[it.key()].get<std::string>().c_str())
                            : 0;
    total += c;
    if (a < c) short_alloc = true;
    lines.push_back(it.key() + " capacity " + std::to_string(c) + ", allocatable " +
                    std::to_string(a));
  }
  if (total == 0) {
    return Make(id, Verdict::kFail,
                "GPUs invisible to Kubernetes: no device plugin registered (node " + node_name +
                    " has no nvidia.com/* capacity; `kubectl describe node " + node_name +
                    " | grep nvidia.com/gpu` shows nothing)",
                "fix the checks above (plugin-registration first), then the kubelet reports "
                "capacity within seconds");
  }
  if (short_alloc) {
    return Make(id, Verdict::kWarn, Join(lines, "; "),
                "allocatable below capacity: some devices are Unhealthy (see gpu-health and "
                "gpulet's log for event=health)");
  }
  return Make(id, Verdict::kPass, Join(lines, "; "));
}

Check CheckDraApi(const DoctorOptions& o) {
  const std::string id = "dra-api";
  std::string why;
  if (!DraActive(o, &why)) return Make(id, Verdict::kSkip, why);
  if (o.api == nullptr) {
    return Make(id, Verdict::kSkip,
                "no API access (pass --node-name and --kubeconfig, or run in the gpulet pod)");
  }
  // API group discovery (GET /apis/<group>): the versions the server serves.
  Result<nlohmann::json> group = o.api->Get("/apis/resource.k8s.io");
  if (!group.ok()) {
    if (group.status().code() == ErrorCode::kNotFound) {
      return Make(id, Verdict::kFail,
                  "the API server does not serve the group resource.k8s.io",
                  "Dynamic Resource Allocation needs Kubernetes 1.34+ (resource.k8s.io/v1, GA); "
                  "upgrade the control plane, or keep this node on the device plugin");
    }
    return Make(id, Verdict::kFail, "discovery of resource.k8s.io: " + group.status().message(),
                "check the API address and credentials");
  }
  std::vector<std::string> versions;
  bool v1 = false;
  if (group->contains("versions") && (*group)["versions"].is_array()) {
    for (const nlohmann::json& v : (*group)["versions"]) {
      if (!v.is_object() || !v.contains("version") || !v["version"].is_string()) continue;
      versions.push_back(v["version"].get<std::string>());
      if (versions.back() == "v1") v1 = true;
    }
  }
  if (!v1) {
    return Make(id, Verdict::kFail,
                "resource.k8s.io is served without v1 (versions: " +
                    (versions.empty() ? std::string("none") : Join(versions)) + ")",
                "gpulet's DRA driver speaks resource.k8s.io/v1: Kubernetes 1.34+ serves it; on "
                "an older cluster keep the device plugin");
  }
  return Make(id, Verdict::kPass, "resource.k8s.io/v1 served (versions: " + Join(versions) + ")");
}

Check CheckCdi(const DoctorOptions& o) {
  const std::string id = "cdi";
  std::string why;
  if (!DraActive(o, &why)) return Make(id, Verdict::kSkip, why);
  std::vector<std::string> good, unsure, bad, read;
  for (const std::string& path : o.runtime_configs) {
    const std::string name = fs::path(path).filename().string();
    const bool containerd = path.find("containerd") != std::string::npos;
    const bool crio = path.find("crio") != std::string::npos;
    if (!containerd && !crio) continue;  // docker's daemon.json: not a CRI runtime
    std::optional<RuntimeConfig> c = ReadRuntimeConfig(path);
    if (!c) continue;
    read.push_back(path);
    if (crio) {
      // CRI-O has CDI on (1.23+); its spec directories default to /etc/cdi, /var/run/cdi.
      auto it = c->keys.find("crio.runtime.cdi_spec_dirs");
      if (it != c->keys.end() && !ListsDir(TomlStrings(it->second), o.cdi_root)) {
        bad.push_back(path + ": crio.runtime.cdi_spec_dirs = " + it->second + " leaves out " +
                      o.cdi_root);
      } else {
        good.push_back(path + ": CRI-O reads CDI specs from " + o.cdi_root);
      }
      continue;
    }
    // containerd: the CRI plugin's table moved in config version 3 (containerd 2.0).
    long version = 1;
    if (auto v = c->keys.find("version"); v != c->keys.end()) version = std::atol(v->second.c_str());
    const std::string table = version >= 3   ? "plugins.io.containerd.cri.v1.runtime"
                              : version == 2 ? "plugins.io.containerd.grpc.v1.cri"
                                             : "plugins.cri";
    auto enable = c->keys.find(table + ".enable_cdi");
    auto dirs = c->keys.find(table + ".cdi_spec_dirs");
    const std::string where = path + " (version " + std::to_string(version) + ")";
    if (enable != c->keys.end() && enable->second == "false") {
      bad.push_back(where + ": " + table + ".enable_cdi = false");
    } else if (dirs != c->keys.end() && !ListsDir(TomlStrings(dirs->second), o.cdi_root)) {
      bad.push_back(where + ": " + table + ".cdi_spec_dirs = " + dirs->second + " leaves out " +
                    o.cdi_root);
    } else if (enable != c->keys.end() && enable->second == "true") {
      good.push_back(where + ": enable_cdi = true");
    } else if (version >= 3) {
      good.push_back(where + ": CDI on by default (containerd 2.0+)");
    } else {
      unsure.push_back(where + ": no enable_cdi: off in containerd 1.7, on from 2.0");
    }
  }
  const std::string fix =
      "containerd 1.7: set enable_cdi = true (and cdi_spec_dirs including " + o.cdi_root +
      ", or leave it unset) under [plugins.\"io.containerd.grpc.v1.cri\"], then `systemctl "
      "restart containerd`; containerd 2.0+ and CRI-O have CDI on unless turned off; "
      "CRI-O's crio.runtime.cdi_spec_dirs must include " + o.cdi_root;
  if (!bad.empty()) return Make(id, Verdict::kFail, Join(bad, "; "), fix);
  if (read.empty()) {
    return Make(id, Verdict::kWarn,
                "no containerd or CRI-O config readable among " + Join(o.runtime_configs) +
                    ": cannot tell whether the runtime applies the driver's CDI specs",
                "mount the runtime's config into the pod (--runtime-config), or check it by "
                "hand: " + fix);
  }
  if (!unsure.empty()) return Make(id, Verdict::kWarn, Join(unsure, "; "), fix);
  return Make(id, Verdict::kPass, Join(good, "; "));
}

Check CheckDraResources(const DoctorOptions& o) {
  const std::string id = "dra-resources";
  std::string why;
  if (!DraActive(o, &why)) return Make(id, Verdict::kSkip, why);
  // Served by the device plugin here: its sockets, and what the config advertises.
  std::set<std::string> plugin;
  std::error_code ec;
  if (fs::is_directory(o.device_plugin_path, ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator(o.device_plugin_path, ec)) {
      const std::optional<std::string> r =
          dra::DevicePluginSocketResource(e.path().filename().string());
      if (r && IsSocket(e.path().string())) plugin.insert(*r);
    }
  }
  if (o.config) {
    for (const auto* sharing : {&o.config->sharing.time_slicing, &o.config->sharing.mps}) {
      if (!sharing->has_value()) continue;
      for (const config::ReplicatedResource& r : (*sharing)->resources)
        plugin.insert(r.advertised_name);
    }
    if (o.config->sharing.memory) plugin.insert(o.config->sharing.memory->advertised_name);
  }
  // Mapped by a DeviceClass of this driver.
  std::map<std::string, std::string> dra;  // extended resource → DeviceClass
  std::string source;
  bool from_api = false;
  if (o.api != nullptr) {
    Result<nlohmann::json> list = o.api->Get("/apis/resource.k8s.io/v1/deviceclasses");
    if (list.ok()) {
      from_api = true;
      source = "DeviceClasses from the API server";
      for (const nlohmann::json& c : list->value("items", nlohmann::json::array())) {
        if (!c.is_object()) continue;
        const nlohmann::json spec = c.value("spec", nlohmann::json::object());
        const nlohmann::json ext = spec.is_object() ? spec.value("extendedResourceName",
                                                                 nlohmann::json())
                                                    : nlohmann::json();
        if (!ext.is_string()) continue;
        // A class of this driver: one of its CEL selectors names the driver.
        bool ours = false;
        for (const nlohmann::json& sel : spec.value("selectors", nlohmann::json::array())) {
          if (sel.is_object() && sel.contains("cel") && sel["cel"].is_object() &&
              sel["cel"].value("expression", "").find(kDraDriver) != std::string::npos) {
            ours = true;
          }
        }
        if (ours) {
          const nlohmann::json meta = c.value("metadata", nlohmann::json::object());
          dra[ext.get<std::string>()] = meta.is_object() ? meta.value("name", "?") : "?";
        }
      }
    }
  }
  std::vector<std::string> both;
  for (const std::string& r : plugin) {
    if (from_api ? dra.count(r) > 0 : dra::MappedByShippedDeviceClasses(r)) {
      both.push_back(r + (from_api ? " (DeviceClass " + dra[r] + ")" : ""));
    }
  }
  if (!from_api) {
    source = "no DeviceClasses read (" +
             std::string(o.api == nullptr ? "no API access" : "the API refused the list") +
             "): assuming deploy/overlays/dra's, nvidia.com/gpu and nvidia.com/mig-*";
  }
  if (!both.empty()) {
    return Make(id, Verdict::kFail,
                "served here by both the device plugin and DRA (" + why + "): " + Join(both) +
                    "; " + source,
                "one node must serve an extended resource from one of the two: keep `gpulet "
                "node` off this node (deploy/overlays/dra runs it only where gpulet.io/dra is "
                "not true) or drop extendedResourceName from the class (docs/dra-migration.md)");
  }
  return Make(id, Verdict::kPass,
              "no extended resource from both the device plugin (" +
                  (plugin.empty() ? std::string("none here")
                                  : Join(std::vector<std::string>(plugin.begin(), plugin.end()))) +
                  ") and DRA; " + source);
}

std::vector<Check> RunChecks(const DriverState& driver, const DoctorOptions& o) {
  std::vector<Check> out;
  out.push_back(CheckDriver(driver));
  out.push_back(CheckDeviceNodes(driver, o.dev_root));
  out.push_back(CheckContainerRuntime(o));
  out.push_back(CheckKubelet(o.device_plugin_path));
  out.push_back(CheckPluginRegistration(o.device_plugin_path, o.kubelet_checkpoint));
  out.push_back(CheckGpuHealth(driver));
  out.push_back(CheckMigStrategy(driver.inventory, o.config));
  out.push_back(CheckMps(o.config, o.mps_root));
  out.push_back(CheckKubernetes(o.api, o.node_name));
  out.push_back(CheckDraApi(o));
  out.push_back(CheckCdi(o));
  out.push_back(CheckDraResources(o));
  return out;
}

bool AnyFailed(const std::vector<Check>& checks) {
  for (const Check& c : checks) {
    if (c.verdict == Verdict::kFail) return true;
  }
  return false;
}

std::string FormatText(const std::vector<Check>& checks) {
  std::ostringstream out;
  std::map<Verdict, int> counts;
  for (const Check& c : checks) {
    ++counts[c.verdict];
    char head[64];
    std::snprintf(head, sizeof(head), "[%s] %-20s ", VerdictName(c.verdict), c.id.c_str());
    out << head << c.detail << "\n";
    if (!c.fix.empty()) out << "       fix: " << c.fix << "\n";
  }
  out << "\n"
      << counts[Verdict::kPass] << " passed, " << counts[Verdict::kWarn] << " warnings, "
      << counts[Verdict::kFail] << " failed, " << counts[Verdict::kSkip] << " skipped\n";
  return out.str();
}

nlohmann::json ToJson(const std::vector<Check>& checks) {
  nlohmann::json list = nlohmann::json::array();
  std::map<std::string, int> counts = {{"pass", 0}, {"warn", 0}, {"fail", 0}, {"skip", 0}};
  for (const Check& c : checks) {
    std::string v = VerdictName(c.verdict);
    list.push_back({{"id", c.id}, {"status", v}, {"detail", c.detail}, {"fix", c.fix}});
    for (char& ch : v) ch = static_cast<char>(std::tolower(ch));
    ++counts[v];
  }
  return {{"ok", !AnyFailed(checks)}, {"summary", counts}, {"checks", list}};
}

}  // namespace gpulet::doctor
