#include "labels/labels.h"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
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
    const std::string rev = p.size() > 2 ? p[2] : "0";
    l[kPrefix + name + ".revision"] = rev;
    l[kPrefix + legacy + ".rev"] = rev;
  }
}

void AddMigShape(Labels& l, const std::string& key_prefix, const gpu::MigDevice& m) {
  l[key_prefix + ".memory"] = std::to_string(m.memory_mib);
  l[key_prefix + ".multiprocessors"] = std::to_string(m.sm_count);
  l[key_prefix + ".slices.gi"] = std::to_string(m.gi_slices);
  l[key_prefix + ".slices.ci"] = std::to_string(m.ci_slices);
}

const char* SharingStrategyName(sharing::SharingKind k) {
  switch (k) {
    case sharing::SharingKind::kTimeSlicing:
      return "time-slicing";
    case sharing::SharingKind::kMps:
      return "mps";
    case sharing::SharingKind::kNone:
      break;
  }
  return "none";
}

}  // namespace

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

  std::string product = SanitizeValue(first->name);
  uint64_t memory = first->memory_mib;
  size_t count = inventory.gpus.size();

  bool mig_capable = false;
  for (const gpu::Gpu& g : inventory.gpus) mig_capable = mig_capable || g.mig_capable;
  l[std::string(kPrefix) + "mig.capable"] = mig_capable ? "true" : "false";
  if (mig_capable) {
    l[std::string(kPrefix) + "mig.strategy"] = config::MigStrategyName(options.mig_strategy);
  }

  if (options.mig_strategy == config::MigStrategy::kSingle && inventory.MigDeviceCount() > 0) {
    // Single: nvidia.com/gpu is a MIG device; the labels describe it (the plan guarantees one
    // profile on the node).
    const gpu::MigDevice* mig = nullptr;
    for (const gpu::Gpu& g : inventory.gpus) {
      if (mig == nullptr && !g.mig_devices.empty()) mig = &g.mig_devices.front();
    }
    product = SanitizeValue(product + "-MIG-" + mig->profile);
    memory = mig->memory_mib;
    count = inventory.MigDeviceCount();
    AddMigShape(l, std::string(kPrefix) + "gpu", *mig);
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
      const std::string key = kPrefix + MigLabelPrefix(profile);
      l[key + ".count"] = std::to_string(e.first);
      AddMigShape(l, key, *e.second);
    }
  }

  // Sharing: replicas of nvidia.com/gpu itself, and the strategy of whatever the node shares.
  int replicas = 1;
  sharing::SharingKind strategy = sharing::SharingKind::kNone;
  bool plain_resource_shared = false;
  for (const sharing::Resource& r : plan.resources) {
    if (r.sharing == sharing::SharingKind::kNone) continue;
    strategy = r.sharing;
    if (r.name == "nvidia.com/gpu") {
      replicas = r.replicas;
      plain_resource_shared = true;
    }
  }
  if (plain_resource_shared && replicas > 1) product = SanitizeValue(product + "-SHARED");
  l[std::string(kPrefix) + "gpu.sharing-strategy"] = SharingStrategyName(strategy);
  l[std::string(kPrefix) + "mps.capable"] =
      strategy == sharing::SharingKind::kMps ? "true" : "false";
  l[std::string(kPrefix) + "gpu.replicas"] = std::to_string(replicas);

  l[std::string(kPrefix) + "gpu.present"] = "true";
  l[std::string(kPrefix) + "gpu.product"] = product;
  l[std::string(kPrefix) + "gpu.memory"] = std::to_string(memory);
  l[std::string(kPrefix) + "gpu.count"] = std::to_string(count);
  l[std::string(kPrefix) + "gpu.mode"] = "compute";
  l[std::string(kPrefix) + "gpu.compute.major"] = std::to_string(first->cc_major);
  l[std::string(kPrefix) + "gpu.compute.minor"] = std::to_string(first->cc_minor);
  if (!first->architecture.empty() && first->architecture != "unknown") {
    l[std::string(kPrefix) + "gpu.family"] = SanitizeValue(first->architecture);
  }
  if (!options.machine.empty()) {
    const std::string machine = SanitizeValue(options.machine);
    if (!machine.empty()) l[std::string(kPrefix) + "gpu.machine"] = machine;
  }
  AddVersion(l, "cuda.driver-version", "cuda.driver", inventory.driver_version, true);
  AddVersion(l, "cuda.runtime-version", "cuda.runtime", inventory.cuda_version, false);
  if (options.timestamp) {
    l[std::string(kPrefix) + "gfd.timestamp"] = std::to_string(*options.timestamp);
  }
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
