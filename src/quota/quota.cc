#include "quota/quota.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <ostream>
#include <regex>
#include <set>
#include <sstream>

namespace gpulet::quota {
namespace {

int LineOf(const YAML::Node& n) { return n.IsDefined() ? n.Mark().line + 1 : 0; }

Status InvalidAt(const std::string& file, int line, const std::string& field,
                 const std::string& problem) {
  return {ErrorCode::kInvalidInput,
          file + ":" + std::to_string(line) + ": " + field + ": " + problem};
}

Result<int> Count(const YAML::Node& n, const std::string& file, const std::string& field) {
  if (!n.IsScalar() || n.Tag() == "!") {
    return InvalidAt(file, LineOf(n), field, "must be an integer >= 0");
  }
  const std::string& s = n.Scalar();
  if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos) {
    return InvalidAt(file, LineOf(n), field, "must be an integer >= 0, got \"" + s + "\"");
  }
  return std::stoi(s);
}

Result<std::string> ReadAll(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status(ErrorCode::kNotFound, path + ": not found or unreadable");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const std::regex kDnsLabel("[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?");
const std::regex kMigProfile("([0-9]+c\\.)?[0-9]+g\\.[0-9]+gb(\\+me)?");

}  // namespace

Result<int64_t> MemoryUnitBytes(const std::string& resource) {
  static const std::regex name("gpulet\\.io/gpu-memory-([0-9]{1,6})(ki|mi|gi)");
  std::smatch m;
  if (!std::regex_match(resource, m, name) || std::stoll(m[1].str()) == 0) {
    return Status(ErrorCode::kInvalidInput,
                  "\"" + resource +
                      "\" is not a GPU memory resource (gpulet.io/gpu-memory-<n><ki|mi|gi>, "
                      "like gpulet.io/gpu-memory-1gi)");
  }
  const int shift = m[2] == "ki" ? 10 : m[2] == "mi" ? 20 : 30;
  return std::stoll(m[1].str()) << shift;
}

std::string MigResourceName(const std::string& profile) {
  std::string p = profile;
  const size_t plus = p.find('+');
  if (plus != std::string::npos) p[plus] = '.';
  return "nvidia.com/mig-" + p;
}

Result<TenantsFile> ParseTenants(const std::string& text, const std::string& path) {
  TenantsFile out;
  out.path = path;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return InvalidAt(path, e.mark.line + 1, "(document)", e.msg);
  }
  if (!root.IsMap())
    return InvalidAt(path, LineOf(root), "(document)", "must be a mapping with tenants:");
  for (const auto& kv : root) {
    if (kv.first.Scalar() == "memoryResource") {
      if (!kv.second.IsScalar()) {
        return InvalidAt(path, LineOf(kv.second), "memoryResource", "must be a resource name");
      }
      Result<int64_t> unit = MemoryUnitBytes(kv.second.Scalar());
      if (!unit.ok()) {
        return InvalidAt(path, LineOf(kv.second), "memoryResource", unit.status().message());
      }
      out.memory_resource = kv.second.Scalar();
      out.memory_unit_bytes = *unit;
    } else if (kv.first.Scalar() != "tenants") {
      return InvalidAt(path, LineOf(kv.first), kv.first.Scalar(),
                       "unknown key (want tenants, memoryResource)");
    }
  }
  const YAML::Node list = root["tenants"];
  if (!list || !list.IsSequence() || list.size() == 0) {
    return InvalidAt(path, LineOf(list ? list : root), "tenants", "must be a non-empty list");
  }
  out.tenants_line = LineOf(list);
  std::set<std::string> seen;
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node e = list[i];
    const std::string base = "tenants[" + std::to_string(i) + "]";
    if (!e.IsMap()) return InvalidAt(path, LineOf(e), base, "must be a mapping");
    Tenant t;
    t.line = LineOf(e);
    for (const auto& kv : e) {
      const std::string key = kv.first.Scalar();
      const std::string field = base + "." + key;
      t.field_lines[key] = LineOf(kv.second);
      if (key == "namespace") {
        if (!kv.second.IsScalar())
          return InvalidAt(path, LineOf(kv.second), field, "must be a string");
        t.namespace_name = kv.second.Scalar();
        if (!std::regex_match(t.namespace_name, kDnsLabel)) {
          return InvalidAt(
              path, LineOf(kv.second), field,
              "\"" + t.namespace_name + "\" is not a valid namespace name (DNS-1123 label)");
        }
      } else if (key == "gpus" || key == "sharedGpus" || key == "maxPerContainer" ||
                 key == "gpuMemory") {
        Result<int> n = Count(kv.second, path, field);
        if (!n.ok()) return n.status();
        (key == "gpus"         ? t.gpus
         : key == "sharedGpus" ? t.shared_gpus
         : key == "gpuMemory"  ? t.gpu_memory
                               : t.max_per_container) = *n;
      } else if (key == "mig") {
        if (!kv.second.IsMap()) {
          return InvalidAt(path, LineOf(kv.second), field, "must map MIG profiles to counts");
        }
        for (const auto& m : kv.second) {
          const std::string profile = m.first.Scalar();
          const std::string mfield = field + "." + profile;
          if (!std::regex_match(profile, kMigProfile)) {
            return InvalidAt(path, LineOf(m.first), mfield,
                             "not a MIG profile (like 1g.10gb, 3g.40gb, 1g.10gb+me)");
          }
          Result<int> n = Count(m.second, path, mfield);
          if (!n.ok()) return n.status();
          t.mig[profile] = *n;
          t.field_lines["mig." + profile] = LineOf(m.second);
        }
      } else {
        return InvalidAt(path, LineOf(kv.first), field,
                         "unknown key (want namespace, gpus, sharedGpus, mig, gpuMemory, "
                         "maxPerContainer)");
      }
    }
    if (t.namespace_name.empty()) return InvalidAt(path, t.line, base + ".namespace", "missing");
    if (!seen.insert(t.namespace_name).second) {
      return InvalidAt(path, t.field_lines["namespace"], base + ".namespace",
                       "\"" + t.namespace_name + "\" is listed twice");
    }
    out.tenants.push_back(std::move(t));
  }
  return out;
}

Result<TenantsFile> LoadTenants(const std::string& path) {
  Result<std::string> text = ReadAll(path);
  if (!text.ok()) return text.status();
  return ParseTenants(*text, path);
}

Status AddInventory(FleetCapacity& fleet, const std::string& text, const std::string& path) {
  // JSON is YAML: parsing it with yaml-cpp keeps line numbers for the errors.
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return InvalidAt(path, e.mark.line + 1, "(document)", e.msg);
  }
  const YAML::Node gpus = root.IsMap() ? root["gpus"] : YAML::Node();
  if (!gpus || !gpus.IsSequence()) {
    return InvalidAt(path, LineOf(root), "gpus",
                     "missing: not a `gpulet info --output json` inventory");
  }
  for (size_t i = 0; i < gpus.size(); ++i) {
    const YAML::Node g = gpus[i];
    const std::string base = "gpus[" + std::to_string(i) + "]";
    const YAML::Node enabled = g["mig_enabled"];
    if (!enabled || !enabled.IsScalar() ||
        (enabled.Scalar() != "true" && enabled.Scalar() != "false")) {
      return InvalidAt(path, LineOf(enabled ? enabled : g), base + ".mig_enabled",
                       "missing or not a boolean");
    }
    if (enabled.Scalar() == "false") {
      ++fleet.whole_gpus;
      const YAML::Node mib = g["memory_mib"];
      int64_t memory = 0;
      if (mib && mib.IsScalar() && !mib.Scalar().empty() &&
          mib.Scalar().find_first_not_of("0123456789") == std::string::npos &&
          mib.Scalar().size() <= 12) {
        memory = std::stoll(mib.Scalar());
      } else if (mib) {
        return InvalidAt(path, LineOf(mib), base + ".memory_mib", "must be an integer >= 0");
      }
      fleet.whole_gpu_memory_mib.push_back(memory);
      continue;
    }
    const YAML::Node migs = g["mig_devices"];
    if (!migs || !migs.IsSequence()) {
      return InvalidAt(path, LineOf(migs ? migs : g), base + ".mig_devices",
                       "missing or not a list");
    }
    for (size_t j = 0; j < migs.size(); ++j) {
      const YAML::Node p = migs[j]["profile"];
      const std::string field = base + ".mig_devices[" + std::to_string(j) + "].profile";
      if (!p || !p.IsScalar() || p.Scalar().empty()) {
        return InvalidAt(path, LineOf(p ? p : migs[j]), field, "missing");
      }
      ++fleet.mig[p.Scalar()];
    }
  }
  fleet.sources.push_back(path);
  return {};
}

Status LoadInventory(FleetCapacity& fleet, const std::string& path) {
  Result<std::string> text = ReadAll(path);
  if (!text.ok()) return text.status();
  return AddInventory(fleet, *text, path);
}

Result<CheckReport> CheckAgainstFleet(const TenantsFile& tf, const FleetCapacity& fleet,
                                      const CheckOptions& options) {
  CheckReport report;
  auto over = [&](int line, const std::string& field, const std::string& problem) -> Status {
    if (options.allow_overcommit) {
      report.warnings.push_back(tf.path + ":" + std::to_string(line) + ": " + field + ": " +
                                problem);
      return {};
    }
    return InvalidAt(tf.path, line, field, problem + " (--allow-overcommit to accept)");
  };
  int gpus = 0, shared = 0;
  std::map<std::string, int> mig;
  std::map<std::string, int> mig_first_line;
  for (size_t i = 0; i < tf.tenants.size(); ++i) {
    const Tenant& t = tf.tenants[i];
    gpus += t.gpus;
    shared += t.shared_gpus;
    for (const auto& [profile, n] : t.mig) {
      mig[profile] += n;
      const auto line_it = t.field_lines.find("mig." + profile);
      const int line = line_it == t.field_lines.end() ? t.line : line_it->second;
      if (!fleet.mig.count(profile)) {
        std::string available;
        for (const auto& [p, c] : fleet.mig) available += (available.empty() ? "" : ", ") + p;
        return InvalidAt(tf.path, line, "tenants[" + std::to_string(i) + "].mig." + profile,
                         "no MIG device with this profile in the fleet (has: " +
                             (available.empty() ? "none" : available) + ")");
      }
      if (!mig_first_line.count(profile)) mig_first_line[profile] = line;
    }
  }
  const std::string whole = std::to_string(fleet.whole_gpus) + " whole GPUs";
  int needed = gpus;
  std::string what = "requests.nvidia.com/gpu sums to " + std::to_string(gpus);
  if (options.shared_replicas > 0 && shared > 0) {
    const int shared_gpus = (shared + options.shared_replicas - 1) / options.shared_replicas;
    needed += shared_gpus;
    what += " and requests.nvidia.com/gpu.shared to " + std::to_string(shared) + " (" +
            std::to_string(shared_gpus) + " GPUs at " + std::to_string(options.shared_replicas) +
            " replicas)";
  } else if (shared > 0) {
    report.warnings.push_back(tf.path + ":" + std::to_string(tf.tenants_line) +
                              ": tenants: sharedGpus not checked against the fleet "
                              "(pass --shared-replicas N)");
  }
  if (needed > fleet.whole_gpus) {
    Status s = over(tf.tenants_line, "tenants", what + ", the fleet has " + whole);
    if (!s.ok()) return s;
  }
  // Memory units: a GPU is in one pool, so the memory budget must fit on the GPUs the whole and
  // shared budgets leave. Those take the GPUs with the least memory first (the plan that leaves
  // the most units; placement is the operator's config, so this is the bound a plan must meet).
  int64_t memory = 0;
  int memory_line = tf.tenants_line;
  for (const Tenant& t : tf.tenants) {
    if (t.gpu_memory > 0 && memory == 0) {
      const auto it = t.field_lines.find("gpuMemory");
      memory_line = it == t.field_lines.end() ? t.line : it->second;
    }
    memory += t.gpu_memory;
  }
  if (memory > 0) {
    std::vector<int64_t> units;
    for (int64_t mib : fleet.whole_gpu_memory_mib) {
      units.push_back((mib << 20) / tf.memory_unit_bytes);
    }
    std::sort(units.begin(), units.end());
    const size_t taken = std::min(units.size(), static_cast<size_t>(std::max(needed, 0)));
    int64_t capacity = 0;
    for (size_t i = taken; i < units.size(); ++i) capacity += units[i];
    if (memory > capacity) {
      Status s = over(memory_line, "tenants[*].gpuMemory",
                      "requests." + tf.memory_resource + " sums to " + std::to_string(memory) +
                          " units, the " + std::to_string(units.size() - taken) +
                          " GPUs left after the whole and shared budgets hold " +
                          std::to_string(capacity));
      if (!s.ok()) return s;
    }
  }
  for (const auto& [profile, n] : mig) {
    if (n > fleet.mig.at(profile)) {
      Status s = over(mig_first_line[profile], "tenants[*].mig." + profile,
                      "requests." + MigResourceName(profile) + " sums to " + std::to_string(n) +
                          ", the fleet has " + std::to_string(fleet.mig.at(profile)));
      if (!s.ok()) return s;
    }
  }
  return report;
}

namespace {

// The GPUs a container asks for of `resource`, as CEL: its limit, else its request, else 0
// (extended resources have requests == limits when both are given).
std::string CelAmount(const std::string& resource) {
  const std::string key = "'" + resource + "'";
  return "(has(c.resources) && has(c.resources.limits) && " + key +
         " in c.resources.limits ? int(c.resources.limits[" + key +
         "]) : (has(c.resources) && has(c.resources.requests) && " + key +
         " in c.resources.requests ? int(c.resources.requests[" + key + "]) : 0))";
}

// maxPerContainer as a ValidatingAdmissionPolicy (GA in Kubernetes 1.30) and its binding to the
// tenant's namespace. Not a LimitRange: a LimitRange `max` makes the LimitRanger reject every
// container without a limit for that resource (CPU-only sidecars, a container asking for another
// MIG profile). The policy checks only what containers ask for; one asking for none passes.
void RenderContainerCap(std::ostream& out, const Tenant& t,
                        const std::vector<std::pair<std::string, int>>& resources) {
  const std::string name = "gpulet-gpu-cap-" + t.namespace_name;
  out << "---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\n"
      << "metadata:\n  name: " << name
      << "\n  labels:\n    app.kubernetes.io/managed-by: gpulet\nspec:\n  failurePolicy: Fail\n"
      << "  matchConstraints:\n    resourceRules:\n      - apiGroups: [\"\"]\n"
      << "        apiVersions: [\"v1\"]\n        operations: [\"CREATE\", \"UPDATE\"]\n"
      << "        resources: [\"pods\"]\n  validations:\n";
  for (const auto& [resource, n] : resources) {
    if (n <= 0) continue;
    const int cap = std::min(n, t.max_per_container);
    for (const char* list : {"containers", "initContainers"}) {
      out << "    - expression: >-\n        !has(object.spec." << list << ") || object.spec."
          << list << ".all(c, " << CelAmount(resource) << " <= " << cap << ")\n"
          << "      message: \"at most " << cap << " " << resource << " per container in "
          << t.namespace_name << " (gpulet quota maxPerContainer)\"\n";
    }
  }
  out << "---\napiVersion: admissionregistration.k8s.io/v1\n"
      << "kind: ValidatingAdmissionPolicyBinding\nmetadata:\n  name: " << name
      << "\n  labels:\n    app.kubernetes.io/managed-by: gpulet\nspec:\n  policyName: " << name
      << "\n  validationActions: [\"Deny\"]\n  matchResources:\n    namespaceSelector:\n"
      << "      matchLabels:\n        kubernetes.io/metadata.name: " << t.namespace_name << "\n";
}

}  // namespace

std::string RenderManifests(const TenantsFile& tf) {
  std::ostringstream out;
  out << "# Rendered by `gpulet quota --tenants " << tf.path
      << "`. Quota first: a namespace\n"
         "# without a quota line for a GPU resource may request any number of it.\n";
  for (const Tenant& t : tf.tenants) {
    std::vector<std::pair<std::string, int>> resources = {{"nvidia.com/gpu", t.gpus},
                                                          {"nvidia.com/gpu.shared", t.shared_gpus}};
    for (const auto& [profile, n] : t.mig) resources.emplace_back(MigResourceName(profile), n);
    out << "---\napiVersion: v1\nkind: ResourceQuota\nmetadata:\n  name: gpu-quota\n"
        << "  namespace: " << t.namespace_name
        << "\n  labels:\n    app.kubernetes.io/managed-by: gpulet\n"
        << "spec:\n  hard:\n";
    // Extended resources are quota'd on requests only; a 0 line forbids the resource.
    for (const auto& [name, n] : resources) out << "    requests." << name << ": \"" << n << "\"\n";
    // GPU memory in units of the pool's resource (not capped by maxPerContainer, a GPU count).
    out << "    requests." << tf.memory_resource << ": \"" << t.gpu_memory << "\"\n";
    if (t.max_per_container > 0) RenderContainerCap(out, t, resources);
  }
  return out.str();
}

}  // namespace gpulet::quota
