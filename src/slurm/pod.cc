#include "slurm/pod.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <sstream>

#include "common/files.h"
#include "dra/names.h"

namespace gpulet::slurm {
namespace {

namespace fs = std::filesystem;

std::string Join(const std::vector<std::string>& v, const char* sep = ",") {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

bool IsIndexEntry(const std::string& e) {
  return !e.empty() &&
         std::all_of(e.begin(), e.end(), [](char c) { return (c >= '0' && c <= '9') || c == ':'; });
}

// A non-negative decimal integer (the whole of `s` after trimming).
std::optional<uint64_t> ParseCount(const std::string& s) {
  const std::string v = Trim(s);
  uint64_t n = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size()) return std::nullopt;
  return n;
}

// Configuration files are small; a cgroup file is one line.
constexpr size_t kConfFileMaxBytes = 16u << 20;
constexpr size_t kCgroupFileMaxBytes = 4096;

bool ValidFeature(const std::string& f) {
  return !f.empty() && std::all_of(f.begin(), f.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
  });
}

}  // namespace

Result<std::vector<std::string>> ParseAllocatedDevices(const std::string& value) {
  const std::string v = Trim(value);
  if (v.empty() || v == "all" || v == "none" || v == "void") {
    return Status(ErrorCode::kInvalidInput,
                  "NVIDIA_VISIBLE_DEVICES=\"" + v +
                      "\": no device list from a device plugin's Allocate (request GPUs in the "
                      "pod spec: nvidia.com/gpu, a MIG or a shared resource)");
  }
  std::vector<std::string> out;
  std::stringstream in(v);
  for (std::string item; std::getline(in, item, ',');) {
    item = Trim(item);
    if (item.empty()) continue;
    if (std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
  }
  if (out.empty()) {
    return Status(ErrorCode::kInvalidInput, "NVIDIA_VISIBLE_DEVICES=\"" + v + "\": no devices");
  }
  return out;
}

Result<std::vector<std::string>> ParseDraDevices(const std::string& value) {
  const std::string v = Trim(value);
  const std::string var = std::string(kDraDevicesEnv);
  std::vector<std::string> out;
  std::stringstream in(v);
  for (std::string item; std::getline(in, item, ',');) {
    item = Trim(item);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string name = Trim(item.substr(0, eq));
    const std::string uuid = eq == std::string::npos ? "" : Trim(item.substr(eq + 1));
    const std::optional<dra::DeviceName> parsed = dra::ParseDeviceName(name);
    if (!parsed) {
      return Status(ErrorCode::kInvalidInput,
                    var + "=\"" + v + "\": \"" + name + "\" is not a device of " +
                        dra::kDriverName + " (gpu-N, gpu-N-mem, gpu-N-mig-<profile>-<start>)");
    }
    const bool mig = parsed->kind == dra::DeviceKind::kMig;
    std::string id;
    if (eq == std::string::npos) {
      // By count only, as an index entry.
      id = std::to_string(parsed->gpu_index) +
           (mig ? ":" + std::to_string(parsed->mig_start) : std::string());
    } else if (uuid.rfind(mig ? "MIG-" : "GPU-", 0) == 0 && uuid.size() > 4) {
      id = uuid;
    } else {
      return Status(ErrorCode::kInvalidInput,
                    var + "=\"" + v + "\": " + name + "=" + uuid + ": " +
                        (mig ? "a MIG device's UUID (MIG-…)" : "a GPU's UUID (GPU-…)") +
                        " expected");
    }
    if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  }
  if (out.empty()) {
    return Status(ErrorCode::kInvalidInput,
                  var + "=\"" + v + "\": no devices (the pod's claims prepared none of " +
                      dra::kDriverName + ")");
  }
  return out;
}

Result<PodDevices> MatchAllocation(const gpu::Inventory& seen,
                                   const std::vector<std::string>& allocated,
                                   const std::string& source) {
  PodDevices d;
  std::vector<std::string> seen_ids;  // what NVML shows, as Allocate would name it
  for (const gpu::Gpu& g : seen.gpus) {
    if (g.mig_devices.empty()) {
      d.gpus.push_back(g.uuid);
      seen_ids.push_back(g.uuid);
    }
    for (const gpu::MigDevice& m : g.mig_devices) {
      d.migs.push_back(m.uuid);
      seen_ids.push_back(m.uuid);
    }
  }
  std::vector<std::string> missing, extra;  // allocated not seen; seen not allocated
  size_t index_gpus = 0, index_migs = 0;
  std::set<std::string> covered;
  for (const std::string& a : allocated) {
    if (IsIndexEntry(a)) {
      (a.find(':') == std::string::npos ? index_gpus : index_migs)++;
      continue;
    }
    bool found = false;
    for (const gpu::Gpu& g : seen.gpus) {
      if (g.uuid == a) {  // a whole GPU; in MIG mode, all of its MIG devices
        found = true;
        if (g.mig_devices.empty()) covered.insert(g.uuid);
        for (const gpu::MigDevice& m : g.mig_devices) covered.insert(m.uuid);
      }
      for (const gpu::MigDevice& m : g.mig_devices) {
        if (m.uuid == a) found = true, covered.insert(m.uuid);
      }
    }
    if (!found) missing.push_back(a);
  }
  size_t uncovered_gpus = 0, uncovered_migs = 0;
  for (const std::string& id : seen_ids) {
    if (covered.count(id)) continue;
    (id.rfind("MIG-", 0) == 0 ? uncovered_migs : uncovered_gpus)++;
  }
  // Index entries stand for the devices no UUID named, by kind and count.
  const bool counts_match = uncovered_gpus == index_gpus && uncovered_migs == index_migs;
  if (missing.empty() && counts_match) return d;
  if (!counts_match) {
    for (const std::string& id : seen_ids) {
      if (!covered.count(id)) extra.push_back(id);
    }
  }
  std::string msg = source + " names " + Join(allocated) +
                    " but NVML in this container sees " +
                    (seen_ids.empty() ? std::string("no GPU") : Join(seen_ids)) + " (";
  std::vector<std::string> parts;
  if (!missing.empty()) parts.push_back("allocated, not seen: " + Join(missing));
  if (!extra.empty()) {
    if (index_gpus + index_migs > 0) {
      parts.push_back("index entries: " + std::to_string(index_gpus) + " GPU(s) and " +
                      std::to_string(index_migs) + " MIG device(s) for " + Join(extra));
    } else {
      parts.push_back("seen, not allocated: " + Join(extra));
    }
  }
  msg += Join(parts, "; ") +
         "): the pod's GRES would not match its devices; refusing to register the node";
  return Status(ErrorCode::kInvalidInput, msg);
}

std::map<std::string, std::string> ParsePodLabels(const std::string& text) {
  std::map<std::string, std::string> out;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);) {
    size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string key = Trim(line.substr(0, eq));
    std::string value = Trim(line.substr(eq + 1));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
      std::string unq;
      for (size_t i = 1; i + 1 < value.size(); ++i) {
        if (value[i] == '\\' && i + 2 < value.size()) ++i;
        unq += value[i];
      }
      value = unq;
    }
    if (!key.empty()) out[key] = value;
  }
  return out;
}

Result<std::vector<std::string>> NodeFeatures(const std::map<std::string, std::string>& labels,
                                              const std::string& partition_override) {
  std::vector<std::string> out;
  auto add = [&](const std::string& f, const std::string& from) -> Status {
    if (f.empty()) return Status::Ok();
    if (!ValidFeature(f)) {
      return Status(ErrorCode::kInvalidInput,
                    from + ": \"" + f + "\" is not a valid Slurm feature ([A-Za-z0-9_.-])");
    }
    if (std::find(out.begin(), out.end(), f) == out.end()) out.push_back(f);
    return Status::Ok();
  };
  std::string partition = partition_override;
  if (partition.empty()) {
    if (auto it = labels.find(kPodPartitionLabel); it != labels.end()) partition = Trim(it->second);
  }
  if (Status s = add(partition, std::string("label ") + kPodPartitionLabel); !s.ok()) return s;
  if (auto it = labels.find(kPodFeaturesLabel); it != labels.end()) {
    std::stringstream in(it->second);
    for (std::string f; std::getline(in, f, ',');) {
      if (Status s = add(Trim(f), std::string("label ") + kPodFeaturesLabel); !s.ok()) return s;
    }
  }
  return out;
}

std::map<unsigned, unsigned> ContainerCoreIndex(const std::set<unsigned>& allowed,
                                                const std::map<unsigned, unsigned>& topology) {
  std::map<unsigned, unsigned> out;
  if (topology.empty()) {
    unsigned i = 0;
    for (unsigned cpu : allowed) out[cpu] = i++;
    return out;
  }
  std::map<unsigned, unsigned> renumber;  // machine core index → container core index
  for (unsigned cpu : allowed) {
    if (auto it = topology.find(cpu); it != topology.end()) renumber[it->second] = 0;
  }
  unsigned i = 0;
  for (auto& [core, idx] : renumber) idx = i++;
  for (unsigned cpu : allowed) {
    if (auto it = topology.find(cpu); it != topology.end()) out[cpu] = renumber[it->second];
  }
  return out;
}

uint64_t ContainerMemoryMib(const std::string& memory_limit, uint64_t mem_total_kib) {
  const uint64_t total_mib = mem_total_kib / 1024;
  const std::optional<uint64_t> bytes = ParseCount(memory_limit);
  if (!bytes) return total_mib;  // "max", or no file
  // cgroup v1's "no limit" is a page-rounded LONG_MAX: MemTotal caps it.
  const uint64_t limit_mib = *bytes / (1024 * 1024);
  return total_mib == 0 ? limit_mib : std::min(limit_mib, total_mib);
}

std::optional<double> CpuQuotaFromCpuMax(const std::string& cpu_max) {
  std::stringstream in(cpu_max);
  std::string quota, period;
  in >> quota >> period;
  if (quota == "max") return std::nullopt;
  return CpuQuotaFromCfs(quota, period.empty() ? "100000" : period);
}

std::optional<double> CpuQuotaFromCfs(const std::string& quota_us, const std::string& period_us) {
  const std::optional<uint64_t> quota = ParseCount(quota_us);  // "-1": no quota
  const std::optional<uint64_t> period = ParseCount(period_us);
  if (!quota || !period || *quota == 0 || *period == 0) return std::nullopt;
  return static_cast<double>(*quota) / static_cast<double>(*period);
}

CgroupLimits ReadCgroupLimits(const std::string& cgroup_root) {
  CgroupLimits out;
  const fs::path root(cgroup_root);
  auto read = [](const fs::path& p) -> std::optional<std::string> {
    Result<std::string> text = ReadFileBounded(p.string(), kCgroupFileMaxBytes);
    if (!text.ok()) return std::nullopt;
    return *text;
  };
  if (std::optional<std::string> v2 = read(root / "cpu.max")) {
    out.cpu_quota = CpuQuotaFromCpuMax(*v2);
    out.cpu_source = (root / "cpu.max").string();
  } else {
    for (const char* dir : {"cpu,cpuacct", "cpu", "cpuacct,cpu", "."}) {
      const fs::path d = root / dir;
      std::optional<std::string> quota = read(d / "cpu.cfs_quota_us");
      std::optional<std::string> period = read(d / "cpu.cfs_period_us");
      if (!quota || !period) continue;
      out.cpu_quota = CpuQuotaFromCfs(*quota, *period);
      out.cpu_source = (d / "cpu.cfs_quota_us").lexically_normal().string();
      break;
    }
  }
  for (const fs::path& p : {root / "memory.max", root / "memory" / "memory.limit_in_bytes",
                            root / "memory.limit_in_bytes"}) {
    if (std::optional<std::string> v = read(p)) {
      out.memory_limit = Trim(*v);
      out.memory_source = p.string();
      break;
    }
  }
  return out;
}

unsigned ContainerCpus(size_t cpuset_cpus, std::optional<double> cpu_quota) {
  uint64_t cpus = cpuset_cpus;
  if (cpu_quota && *cpu_quota > 0) {
    cpus = std::min<uint64_t>(cpus, static_cast<uint64_t>(std::ceil(*cpu_quota)));
  }
  return static_cast<unsigned>(std::max<uint64_t>(cpus, 1));
}

Result<std::string> PrepareConfDir(const std::string& slurm_conf, const std::string& conf_dir,
                                   const std::string& gres_text) {
  std::error_code ec;
  fs::create_directories(conf_dir, ec);
  if (ec) return Status(ErrorCode::kInternal, conf_dir + ": " + ec.message());
  const fs::path src = fs::path(slurm_conf).parent_path();
  if (!fs::exists(slurm_conf)) {
    return Status(ErrorCode::kNotFound, slurm_conf + ": no slurm.conf (--slurm-conf, SLURM_CONF)");
  }
  if (fs::weakly_canonical(src, ec) != fs::weakly_canonical(conf_dir, ec)) {
    for (const auto& e : fs::directory_iterator(src, ec)) {
      const std::string name = e.path().filename();
      if (name == "gres.conf" || name.empty() || name[0] == '.' || !e.is_regular_file(ec)) continue;
      struct stat st {};
      if (::stat(e.path().c_str(), &st) != 0) {
        return Status(ErrorCode::kInternal, e.path().string() + ": stat: " + std::strerror(errno));
      }
      Result<std::string> text = ReadFileBounded(e.path().string(), kConfFileMaxBytes);
      if (!text.ok()) return text.status();
      const std::string dst = (fs::path(conf_dir) / name).string();
      // The copy is ours (root's) with the source's mode until the chown: never wider than the
      // source's permissions.
      if (Status s = WriteFileAtomic(dst, *text, st.st_mode & 0777); !s.ok()) return s;
      if (::chown(dst.c_str(), st.st_uid, st.st_gid) != 0) {
        return Status(ErrorCode::kInternal, dst + ": chown to " + std::to_string(st.st_uid) + ":" +
                                                std::to_string(st.st_gid) + " (the owner of " +
                                                e.path().string() + "): " + std::strerror(errno));
      }
    }
    if (ec) return Status(ErrorCode::kInternal, src.string() + ": " + ec.message());
  }
  const std::string copy = (fs::path(conf_dir) / fs::path(slurm_conf).filename()).string();
  if (Status s = WriteFileAtomic((fs::path(conf_dir) / "gres.conf").string(), gres_text); !s.ok()) {
    return s;
  }
  return copy;
}

bool RegisteredSince(const NodeStatus& status, std::chrono::system_clock::time_point started) {
  std::tm tm{};
  char tail = 0;
  if (std::sscanf(status.slurmd_start_time.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%c", &tm.tm_year,
                  &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &tail) != 6) {
    return false;  // "None", empty, or another format
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  tm.tm_isdst = -1;
  const std::time_t slurmd_start = std::mktime(&tm);
  if (slurmd_start == static_cast<std::time_t>(-1)) return false;
  return slurmd_start >=
         std::chrono::system_clock::to_time_t(std::chrono::floor<std::chrono::seconds>(started));
}

std::string DynamicNodeConf(const NodeGres& gres, unsigned cpus, uint64_t real_memory_mib,
                            const std::vector<std::string>& features) {
  std::string conf;
  auto add = [&](const std::string& kv) { conf += (conf.empty() ? "" : " ") + kv; };
  if (cpus > 0) add("CPUs=" + std::to_string(cpus));
  if (real_memory_mib > 0) add("RealMemory=" + std::to_string(real_memory_mib));
  if (std::string g = NodeGresValue(gres); !g.empty()) add("Gres=" + g);
  if (!features.empty()) add("Feature=" + Join(features));
  return conf;
}

bool NodeBusy(const NodeStatus& status) {
  std::stringstream in(status.state);
  for (std::string flag; std::getline(in, flag, '+');) {
    if (flag == "ALLOCATED" || flag == "ALLOC" || flag == "MIXED" || flag == "COMPLETING") {
      return true;
    }
  }
  return false;
}

std::string BusyLabelPatch(bool busy) {
  return std::string(R"({"metadata":{"labels":{")") + kPodBusyLabel + R"(":")" +
         (busy ? "true" : "false") + R"("}}})";
}

PodNode::PodNode(std::shared_ptr<const CommandRunner> runner, std::string node_name,
                 std::string scontrol, std::chrono::milliseconds timeout)
    : runner_(runner),
      client_(runner, scontrol, timeout),
      node_(std::move(node_name)),
      scontrol_(std::move(scontrol)),
      timeout_(timeout) {}

Result<PodNode::DrainOutcome> PodNode::DrainForTermination() const {
  Result<NodeStatus> now = client_.ShowNode(node_);
  if (!now.ok()) return now.status();
  if (now->drained() && !now->ours()) return DrainOutcome::kAdminDrainKept;
  if (Status s = client_.Drain(node_, kPodTerminatingReason); !s.ok()) return s;
  return DrainOutcome::kDrained;
}

Result<NodeStatus> PodNode::WaitIdle(
    std::chrono::milliseconds poll,
    const std::function<bool(std::chrono::milliseconds)>& wait) const {
  Status last = Status(ErrorCode::kUnavailable, "node " + node_ + ": not polled yet");
  while (true) {
    Result<NodeStatus> now = client_.ShowNode(node_);
    if (now.ok() && !NodeBusy(*now)) return now;
    if (!now.ok()) last = now.status();
    if (now.ok()) {
      last =
          Status(ErrorCode::kUnavailable, "node " + node_ + " still has jobs (" + now->state + ")");
    }
    if (!wait(poll)) return last;
  }
}

Status PodNode::Delete() const {
  Result<CommandOutput> r = runner_->Run({scontrol_, "delete", "nodename=" + node_}, timeout_);
  if (!r.ok()) return r.status();
  if (r->exit_code == 0) return Status::Ok();
  const std::string msg = Trim(r->err.empty() ? r->out : r->err);
  if (msg.find("not found") != std::string::npos ||
      msg.find("Invalid node name") != std::string::npos) {
    return Status::Ok();  // already gone
  }
  return Status(ErrorCode::kUnavailable, "scontrol delete nodename=" + node_ + ": exit " +
                                             std::to_string(r->exit_code) + ": " + msg);
}

}  // namespace gpulet::slurm
