#include "labels/labels.h"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <vector>

namespace gpulet::labels {
namespace {

constexpr const char* kPrefix = "nvidia.com/";

bool IsAlnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }

// "550.54.15" → {"550", "54", "15"}; missing parts are empty.
std::vector<std::string> SplitVersion(const std::string& v) {
  std::vector<std::string> parts;
  std::stringstream in(v);
  std::string p;
  while (std::getline(in, p, '.')) parts.push_back(p);
  return parts;
}

void AddVersion(Labels& l, const std::string& name, const std::string& legacy,
                const std::string& version, bool with_revision) {
  const std::vector<std::string> p = SplitVersion(version);
  if (p.empty() || p[0].empty()) return;
  const std::string minor = p.size() > 1 ? p[1] : "0";
  l[kPrefix + name + ".full"] = SanitizeValue(version);
  l[kPrefix + name + ".major"] = p[0];
  l[kPrefix + name + ".minor"] = minor;
  l[kPrefix + legacy + ".major"] = p[0];
  l[kPrefix + legacy + ".minor"] = minor;
  if (with_revision) {
    const std::string rev = p.size() > 2 ? p[2] : "";
    l[kPrefix + name + ".revision"] = rev;
    l[kPrefix + legacy + ".rev"] = rev;
  }
}

// GFD's labels of one MIG device type: shape and engines.
void AddMigShape(Labels& l, const std::string& key_prefix, const gpu::MigDevice& m) {
  l[key_prefix + ".memory"] = std::to_string(m.memory_mib);
  l[key_prefix + ".multiprocessors"] = std::to_string(m.sm_count);
  l[key_prefix + ".slices.gi"] = std::to_string(m.gi_slices);
  l[key_prefix + ".slices.ci"] = std::to_string(m.ci_slices);
  l[key_prefix + ".engines.copy"] = std::to_string(m.copy_engines);
  l[key_prefix + ".engines.decoder"] = std::to_string(m.decoders);
  l[key_prefix + ".engines.encoder"] = std::to_string(m.encoders);
  l[key_prefix + ".engines.jpeg"] = std::to_string(m.jpeg_decoders);
  l[key_prefix + ".engines.ofa"] = std::to_string(m.ofa_engines);
}

// How a resource is shared, read as GFD reads it: from the sharing config's entry with the
// resource's original name.
struct Replication {
  int replicas = 1;
  bool renamed = false;
  sharing::SharingKind kind = sharing::SharingKind::kNone;  // of the active strategy
};

Replication ReplicationOf(const std::string& resource, const sharing::Plan& plan,
                          const LabelOptions& o) {
  Replication out;
  if (o.sharing != nullptr) {
    // Upstream: when mps is configured it is the strategy.
    const config::ReplicaSharing* active = nullptr;
    if (o.sharing->mps) {
      active = &*o.sharing->mps;
      out.kind = sharing::SharingKind::kMps;
    } else if (o.sharing->time_slicing) {
      active = &*o.sharing->time_slicing;
      out.kind = sharing::SharingKind::kTimeSlicing;
    }
    if (active == nullptr) return out;
    for (const config::ReplicatedResource& r : active->resources) {
      if (r.name != resource) continue;
      out.replicas = r.replicas;
      out.renamed = r.advertised_name != r.name;
      return out;
    }
    return out;
  }
  if (const sharing::Resource* r = plan.Find(resource)) {
    out.replicas = r->replicas;
    out.kind = r->sharing;
  }
  return out;
}

const char* StrategyLabel(const Replication& r) {
  if (r.replicas <= 1) return "none";
  return r.kind == sharing::SharingKind::kMps ? "mps" : "time-slicing";
}

// GFD's baseLabeler: product, count, replicas and sharing-strategy under `key_prefix`.
// `with_sharing` false: a MIG-enabled GPU's whole-GPU labels (replicas 0, never shared).
void AddResource(Labels& l, const std::string& key_prefix, const Replication& rep,
                 bool with_sharing, size_t count, std::initializer_list<std::string> parts) {
  std::string product;
  for (const std::string& p : parts) {
    const std::string s = SanitizeProduct(p);
    if (s.empty()) continue;
    product += (product.empty() ? "" : "-") + s;
  }
  if (with_sharing && rep.replicas > 1 && !rep.renamed && !product.empty()) product += "-SHARED";
  l[key_prefix + ".product"] = SanitizeValue(product);
  l[key_prefix + ".count"] = std::to_string(count);
  l[key_prefix + ".replicas"] = std::to_string(with_sharing ? rep.replicas : 0);
  l[key_prefix + ".sharing-strategy"] = with_sharing ? StrategyLabel(rep) : "none";
}

}  // namespace

std::string ArchFamily(int cc_major, int cc_minor) {
  switch (cc_major) {
    case 1:
      return "tesla";
    case 2:
      return "fermi";
    case 3:
      return "kepler";
    case 5:
      return "maxwell";
    case 6:
      return "pascal";
    case 7:
      return cc_minor < 5 ? "volta" : "turing";
    case 8:
      return cc_minor < 9 ? "ampere" : "ada-lovelace";
    case 9:
      return "hopper";
    case 10:
    case 12:
      return "blackwell";
    default:
      return "undefined";
  }
}

std::string SanitizeProduct(const std::string& raw) {
  std::string out, word;
  auto flush = [&] {
    if (word.empty()) return;
    out += (out.empty() ? "" : "-") + word;
    word.clear();
  };
  for (char c : raw) {
    if (c == ' ') {
      flush();
    } else if (IsAlnum(c) || c == '-' || c == '_' || c == '.') {
      word.push_back(c);
    }
  }
  flush();
  return out;
}

std::string SanitizeValue(const std::string& raw) {
  std::string v;
  v.reserve(raw.size());
  for (char c : raw) v.push_back(IsAlnum(c) || c == '.' || c == '_' || c == '-' ? c : '-');
  size_t b = 0;
  while (b < v.size() && !IsAlnum(v[b])) ++b;
  v.erase(0, b);
  if (v.size() > 63) v.resize(63);
  while (!v.empty() && !IsAlnum(v.back())) v.pop_back();
  return v;
}

std::string MigLabelPrefix(const std::string& profile) {
  std::string p = profile;
  for (char& c : p) {
    if (c == '+') c = '.';
  }
  return "mig-" + p;
}

Labels NodeLabels(const gpu::Inventory& inventory, const sharing::Plan& plan,
                  const LabelOptions& options) {
  Labels l;
  if (inventory.gpus.empty()) return l;
  const gpu::Gpu* first = &inventory.gpus.front();
  for (const gpu::Gpu& g : inventory.gpus) {
    if (g.index < first->index) first = &g;
  }
  const std::string p = kPrefix;
  const std::string model = first->name;

  // Whole GPUs. MIG-enabled GPUs are labelled without sharing; whole GPUs, when there are any,
  // with the sharing of nvidia.com/gpu (GFD lets them override).
  bool any_mig_enabled = false, any_whole = false, mig_capable = false;
  for (const gpu::Gpu& g : inventory.gpus) {
    any_mig_enabled = any_mig_enabled || g.mig_enabled;
    any_whole = any_whole || !g.mig_enabled;
    mig_capable = mig_capable || g.mig_capable;
  }
  const Replication gpu_rep = ReplicationOf("nvidia.com/gpu", plan, options);
  AddResource(l, p + "gpu", gpu_rep, any_whole, inventory.gpus.size(), {model});
  if (first->memory_mib != 0) l[p + "gpu.memory"] = std::to_string(first->memory_mib);
  if (first->cc_major != 0) {
    l[p + "gpu.family"] = ArchFamily(first->cc_major, first->cc_minor);
    l[p + "gpu.compute.major"] = std::to_string(first->cc_major);
    l[p + "gpu.compute.minor"] = std::to_string(first->cc_minor);
  }

  l[p + "mig.capable"] = mig_capable ? "true" : "false";
  if (options.mig_strategy != config::MigStrategy::kNone) {
    l[p + "mig.strategy"] = config::MigStrategyName(options.mig_strategy);
  }

  if (options.mig_strategy == config::MigStrategy::kSingle && any_mig_enabled) {
    std::map<std::string, std::pair<size_t, const gpu::MigDevice*>> by_profile;
    bool empty_mig_gpu = false;
    for (const gpu::Gpu& g : inventory.gpus) {
      if (g.mig_enabled && g.mig_devices.empty()) empty_mig_gpu = true;
      for (const gpu::MigDevice& m : g.mig_devices) {
        auto& e = by_profile[m.profile];
        if (e.second == nullptr) e.second = &m;
        ++e.first;
      }
    }
    if (empty_mig_gpu || any_whole || by_profile.size() != 1) {
      // GFD's labels for an invalid mig-strategy=single node.
      l[p + "gpu.product"] = SanitizeValue(SanitizeProduct(model) + "-MIG-INVALID");
      l[p + "gpu.count"] = "0";
      l[p + "gpu.replicas"] = "0";
      l[p + "gpu.memory"] = "0";
    } else {
      const auto& [profile, e] = *by_profile.begin();
      AddResource(l, p + "gpu", gpu_rep, true, e.first, {model, "MIG", profile});
      AddMigShape(l, p + "gpu", *e.second);
    }
  } else if (options.mig_strategy == config::MigStrategy::kMixed) {
    std::map<std::string, std::pair<size_t, const gpu::MigDevice*>> by_profile;
    for (const gpu::Gpu& g : inventory.gpus) {
      for (const gpu::MigDevice& m : g.mig_devices) {
        auto& e = by_profile[m.profile];
        if (e.second == nullptr) e.second = &m;
        ++e.first;
      }
    }
    for (const auto& [profile, e] : by_profile) {
      const std::string key = p + MigLabelPrefix(profile);
      const Replication rep = ReplicationOf(sharing::MigResourceName(profile), plan, options);
      AddResource(l, key, rep, true, e.first, {model, "MIG", profile});
      AddMigShape(l, key, *e.second);
    }
  }

  // MPS: the strategy is MPS and no GPU is in MIG mode (GFD's isMPSCapable).
  bool mps = false;
  if (options.sharing != nullptr) {
    mps = options.sharing->mps.has_value();
  } else {
    for (const sharing::Resource& r : plan.resources)
      mps = mps || r.sharing == sharing::SharingKind::kMps;
  }
  l[p + "mps.capable"] = mps && !any_mig_enabled ? "true" : "false";

  // gpu.mode from the PCI class, "unknown" unless every GPU has the same known class.
  std::string mode = "unknown";
  if (first->pci_class) {
    bool same = true;
    for (const gpu::Gpu& g : inventory.gpus) same = same && g.pci_class == first->pci_class;
    if (same && *first->pci_class == 0x030000) mode = "graphics";
    if (same && *first->pci_class == 0x030200) mode = "compute";
  }
  l[p + "gpu.mode"] = mode;
  l[p + "gpu.present"] = "true";
  const std::string machine = SanitizeValue(options.machine);
  l[p + "gpu.machine"] = machine.empty() ? "unknown" : machine;
  AddVersion(l, "cuda.driver-version", "cuda.driver", inventory.driver_version, true);
  AddVersion(l, "cuda.runtime-version", "cuda.runtime", inventory.cuda_version, false);
  for (const sharing::Resource& r : plan.resources) {
    if (r.sharing != sharing::SharingKind::kMemory) continue;
    l[kMemoryPoolLabel] = "true";
    l[kMemoryUnitLabel] = config::UnitQuantity(r.unit_bytes);
    break;
  }
  if (options.timestamp) l[p + "gfd.timestamp"] = std::to_string(*options.timestamp);
  return l;
}

std::string FeatureFile(const Labels& labels) {
  std::string out;
  for (const auto& [k, v] : labels) out += k + "=" + v + "\n";
  return out;
}

Status WriteFeatureFile(const std::string& path, const Labels& labels) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  if (access(dir.c_str(), F_OK) != 0) {
    return Status(ErrorCode::kNotFound, "feature file directory " + dir + " does not exist");
  }
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  auto fail = [&](const std::string& what) {
    const int err = errno;
    unlink(tmp.c_str());
    return Status(ErrorCode::kUnavailable, what + " " + path + ": " + std::strerror(err));
  };
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail("cannot create");
  const std::string body = FeatureFile(labels);
  size_t done = 0;
  while (done < body.size()) {
    const ssize_t n = write(fd, body.data() + done, body.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      close(fd);
      return fail("cannot write");
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    close(fd);
    return fail("cannot sync");
  }
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) return fail("cannot replace");
  return Status();
}

std::string ReadMachineType(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  return SanitizeValue(line);
}

}  // namespace gpulet::labels
