#include "dra/slices.h"

#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <ctime>
#include <functional>
#include <memory>
#include <numeric>
#include <set>

#include "common/fnv.h"
#include "dra/names.h"
#include "placement/cluster.h"
#include "placement/fragmentation.h"
#include "placement/policy.h"

namespace gpulet::dra {

namespace {

using nlohmann::json;

constexpr char kStdDomain[] = "resource.kubernetes.io";
// Upstream's bound on a numaNode value (Linux's MAX_NUMNODES at most 1 << 10).
constexpr int kMaxNumaNodes = 1024;
constexpr size_t kMaxStringAttribute = 64;  // the API's limit on a string attribute value

bool IsLowerHex(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
}

json StringAttr(const std::string& v) { return json{{"string", v.substr(0, 64)}}; }
json IntAttr(int64_t v) { return json{{"int", v}}; }

std::string Rfc3339(std::chrono::system_clock::time_point t) {
  const std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// A taint value is a label value: at most 63 of [A-Za-z0-9_.-], alphanumeric at both ends.
std::string TaintValue(const std::string& reason) {
  std::string v;
  for (char c : reason) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (std::isalnum(u)) {
      v += static_cast<char>(std::tolower(u));
    } else if (!v.empty() && v.back() != '-') {
      v += '-';
    }
    if (v.size() >= 63) break;
  }
  while (!v.empty() && !std::isalnum(static_cast<unsigned char>(v.back()))) v.pop_back();
  return v.empty() ? "unhealthy" : v;
}

// A short stable hash for shortened names: the first 10 hex digits of FNV-1a.
std::string ShortHash(const std::string& s) { return Fnv64Hex(s).substr(0, 10); }

// "<node>-gpu.gpulet.io", kept short enough for "-dNN" within 253 characters.
std::string SlicePrefix(const std::string& node) {
  std::string prefix = node + "-" + kDriverName;
  if (prefix.size() <= 240) return prefix;
  return node.substr(0, 200) + "-" + ShortHash(node) + "-" + kDriverName;
}

std::string Numbered(const std::string& prefix, char kind, size_t n) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%02zu", n);
  return prefix + "-" + kind + buf;
}

// The counters of GPU `g`'s set, and what the GPU's geometry is.
struct Geometry {
  unsigned memory_slices = 0;   // 0: not MIG-capable (no memory-slice counters)
  unsigned compute_slices = 1;
  bool media = false;           // a "+me" profile exists
  const mig::GpuState* mig = nullptr;
};

Geometry GeometryOf(const gpu::Gpu& g, const SliceInputs& in) {
  Geometry geo;
  if (!g.mig_capable) return geo;
  for (const mig::GpuState& s : in.mig) {
    if (s.index == g.index && !s.profiles.empty()) geo.mig = &s;
  }
  if (geo.mig == nullptr) return geo;
  for (const mig::ProfileSpec& p : geo.mig->profiles) {
    geo.compute_slices = std::max(geo.compute_slices, p.slices);
    for (unsigned start : p.starts) {
      geo.memory_slices = std::max(geo.memory_slices, start + p.size);
    }
    if (p.name.find("+me") != std::string::npos) geo.media = true;
  }
  geo.memory_slices = std::min(geo.memory_slices, 32u - 2u);  // 32 counters per set
  return geo;
}

std::string CounterSetName(unsigned index) { return "gpu-" + std::to_string(index) + "-counters"; }

json AllCounters(const Geometry& geo) {
  json c = json::object();
  for (unsigned i = 0; i < geo.memory_slices; ++i) {
    c["memory-slice-" + std::to_string(i)] = {{"value", "1"}};
  }
  c["compute-slices"] = {{"value", std::to_string(geo.compute_slices)}};
  if (geo.media) c["media-engines"] = {{"value", "1"}};
  return c;
}

json Consumes(unsigned index, json counters) {
  return json::array({{{"counterSet", CounterSetName(index)}, {"counters", std::move(counters)}}});
}

// Whether placement [start, start+size) overlaps an instance held outside DRA.
bool Reserved(const mig::GpuState& s, const mig::ProfileSpec& p, unsigned start) {
  for (const mig::GpuInstance& inst : s.instances) {
    unsigned size = 0;
    for (const mig::ProfileSpec& q : s.profiles) {
      // "1c.3g.20gb" names a compute instance inside a 3g.20gb.
      const std::string& name = inst.profile;
      const size_t dot = name.find('.');
      const bool ci = dot != std::string::npos && name.substr(0, dot).find('c') != std::string::npos;
      if (q.name == (ci ? name.substr(dot + 1) : name)) size = q.size;
    }
    if (size == 0) size = 1;
    if (start < inst.start + size && inst.start < start + p.size) return true;
  }
  return false;
}

json Taints(const gpu::Gpu& g, const SliceInputs& in) {
  auto it = in.taints.find(g.uuid);
  if (it == in.taints.end()) return nullptr;
  return json::array({{{"key", kUnhealthyTaintKey},
                       {"value", TaintValue(it->second.reason)},
                       {"effect", "NoSchedule"},
                       {"timeAdded", Rfc3339(it->second.since)}}});
}

// The attributes every device of GPU `g` carries.
json GpuAttributes(const gpu::Gpu& g, const gpu::Inventory& inv, const SliceOptions& o,
                   const std::optional<int64_t>& domain) {
  json a = json::object();
  a["uuid"] = StringAttr(g.uuid);
  a["productName"] = StringAttr(g.name);
  a["architecture"] = StringAttr(g.architecture);
  if (auto v = SemverOf(g.compute_capability())) a["cudaComputeCapability"] = {{"version", *v}};
  if (auto v = SemverOf(inv.driver_version)) a["driverVersion"] = {{"version", *v}};
  // The standard attributes (k8s.io/dynamic-resource-allocation/deviceattribute), each only in
  // the form upstream's helpers produce and otherwise left out.
  if (std::optional<std::string> bus = PciBusId(g.pci_bus_id)) {
    a[std::string(kStdDomain) + "/pciBusID"] = StringAttr(*bus);
    if (auto root = PcieRoot(o.sysfs_root, *bus)) {
      a[std::string(kStdDomain) + "/pcieRoot"] = StringAttr(*root);
    }
  }
  if (g.numa_node && *g.numa_node >= 0 && *g.numa_node < kMaxNumaNodes) {
    a[std::string(kStdDomain) + "/numaNode"] = IntAttr(*g.numa_node);
  }
  if (domain) a["nvlinkDomain"] = IntAttr(*domain);
  return a;
}

struct DeviceLists {
  std::vector<json> whole, shares, mig;
  std::vector<json> counter_sets;
};

}  // namespace

std::optional<std::string> SemverOf(const std::string& version) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : version) {
    if (c == '.') {
      parts.push_back(cur);
      cur.clear();
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      cur += c;
    } else {
      return std::nullopt;
    }
  }
  parts.push_back(cur);
  if (parts.empty() || parts.size() > 3) return std::nullopt;
  std::string out;
  for (size_t i = 0; i < 3; ++i) {
    std::string p = i < parts.size() ? parts[i] : "0";
    if (p.empty() || p.size() > 9) return std::nullopt;
    p.erase(0, std::min(p.find_first_not_of('0'), p.size() - 1));  // no leading zeros
    out += (i ? "." : "") + p;
  }
  return out;
}

std::optional<std::string> PciBusId(const std::string& nvml_bus_id) {
  std::string s = nvml_bus_id;
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // NVML writes the domain with 8 digits; the standard form has 4, so the upper 4 must be zero.
  const size_t colon = s.find(':');
  if (colon == std::string::npos || colon < 4) return std::nullopt;
  if (colon > 4) {
    if (s.find_first_not_of('0') < colon - 4) return std::nullopt;
    s.erase(0, colon - 4);
  }
  // dddd:bb:dd.f (deviceattribute's verifyPCIBDFFormat).
  if (s.size() != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.') return std::nullopt;
  if (!IsLowerHex(s.substr(0, 4)) || !IsLowerHex(s.substr(5, 2)) || !IsLowerHex(s.substr(8, 2)) ||
      !IsLowerHex(s.substr(11, 1))) {
    return std::nullopt;
  }
  return s;
}

std::optional<std::string> PcieRoot(const std::string& sysfs_root, const std::string& bus_id) {
  if (!PciBusId(bus_id) || *PciBusId(bus_id) != bus_id) return std::nullopt;
  const std::string link = sysfs_root + "/bus/pci/devices/" + bus_id;
  char buf[PATH_MAX];
  const ssize_t n = readlink(link.c_str(), buf, sizeof buf - 1);
  if (n <= 0) return std::nullopt;
  const std::string target(buf, static_cast<size_t>(n));
  // As upstream resolves it: a relative link, taken from bus/pci/devices, that lands on
  // devices/pci<root>/.../<bus id> (the kernel's "../../../devices/pci0000:17/0000:17:01.0/
  // 0000:18:00.0"); the root is the first component under devices/. An absolute link is refused.
  if (target.front() == '/') return std::nullopt;
  std::vector<std::string> parts = {"bus", "pci", "devices"};
  size_t begin = 0;
  while (begin <= target.size()) {
    size_t end = target.find('/', begin);
    if (end == std::string::npos) end = target.size();
    const std::string part = target.substr(begin, end - begin);
    if (part == "..") {
      if (parts.empty()) return std::nullopt;  // above the sysfs root
      parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    begin = end + 1;
  }
  if (parts.size() < 3 || parts[0] != "devices" || parts[1].rfind("pci", 0) != 0 ||
      parts.back() != bus_id || parts[1].size() > kMaxStringAttribute) {
    return std::nullopt;
  }
  return parts[1];
}

std::string BytesQuantity(int64_t bytes) {
  static const char* kSuffix[] = {"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};
  if (bytes <= 0) return "0";
  int k = 0;
  int64_t v = bytes;
  while (k < 6 && v % 1024 == 0) {
    v /= 1024;
    ++k;
  }
  return std::to_string(v) + kSuffix[k];
}

std::vector<std::optional<int64_t>> NvlinkDomains(const gpu::Inventory& inventory) {
  const size_t n = inventory.gpus.size();
  std::vector<size_t> parent(n);
  std::iota(parent.begin(), parent.end(), 0);
  std::function<size_t(size_t)> find = [&](size_t x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  };
  std::vector<bool> linked(n, false);
  for (size_t a = 0; a < n && a < inventory.links.size(); ++a) {
    for (size_t b = 0; b < n && b < inventory.links[a].size(); ++b) {
      if (a == b || inventory.links[a][b].nvlinks == 0) continue;
      linked[a] = linked[b] = true;
      const size_t ra = find(a), rb = find(b);
      parent[std::max(ra, rb)] = std::min(ra, rb);
    }
  }
  std::vector<std::optional<int64_t>> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (linked[i]) out[i] = static_cast<int64_t>(inventory.gpus[find(i)].index);
  }
  return out;
}

Result<std::vector<unsigned>> PolicyGpuOrder(const gpu::Inventory& inventory,
                                             const std::vector<int32_t>& used_milli,
                                             const std::string& policy_name, bool whole) {
  const size_t n = inventory.gpus.size();
  if (n > static_cast<size_t>(placement::kMaxGpusPerNode)) {
    // More GPUs than a placement node holds: index order.
    std::vector<unsigned> order(n);
    std::iota(order.begin(), order.end(), 0u);
    return order;
  }
  // FGD-based policies need typical pods: one whole GPU and one small share, equally likely.
  placement::TypicalPods typical = placement::TypicalPods::FromList(
      {{0, 1, placement::kMilliPerGpu, false, 0, 0.5}, {0, 1, 100, false, 0, 0.5}});
  std::unique_ptr<placement::Policy> policy = placement::MakePolicy(policy_name, typical);
  if (!policy) {
    return Status(ErrorCode::kInvalidInput, "placement policy \"" + policy_name +
                                                "\": unknown (known: bestfit, fgd, …)");
  }
  placement::Node node;
  node.name = "self";
  node.model = 0;
  node.cpu_milli = node.cpu_free = int64_t{1} << 40;
  node.memory_mib = node.memory_free = int64_t{1} << 40;
  node.gpu_free.assign(n, placement::kMilliPerGpu);
  for (size_t i = 0; i < n && i < used_milli.size(); ++i) {
    node.gpu_free[i] =
        placement::kMilliPerGpu - std::clamp(used_milli[i], 0, placement::kMilliPerGpu);
  }
  placement::Pod pod;
  pod.name = whole ? "whole" : "share";
  pod.num_gpu = 1;
  pod.gpu_milli = whole ? placement::kMilliPerGpu : 1;
  std::vector<unsigned> order;
  std::vector<bool> taken(n, false);
  for (size_t round = 0; round < n; ++round) {
    std::optional<placement::NodeScore> s = policy->Score(node, pod);
    if (!s || s->gpus == 0) break;
    const unsigned g = static_cast<unsigned>(__builtin_ctz(s->gpus));
    if (g >= n || taken[g]) break;
    taken[g] = true;
    order.push_back(g);
    node.gpu_free[g] = 0;  // chosen: the next pod goes elsewhere
  }
  // GPUs the policy never picked (full ones, or a policy that stops) follow in index order.
  for (unsigned g = 0; g < n; ++g) {
    if (!taken[g]) order.push_back(g);
  }
  return order;
}

Result<std::vector<nlohmann::json>> BuildSlices(const SliceInputs& in, const SliceOptions& o,
                                                int64_t generation) {
  if (o.node_name.empty()) return Status(ErrorCode::kInvalidInput, "slices: node name is empty");
  if (in.inventory == nullptr) return Status(ErrorCode::kInvalidInput, "slices: no inventory");
  if (o.memory_unit_bytes <= 0) {
    return Status(ErrorCode::kInvalidInput, "slices: memory unit must be positive, got " +
                                                std::to_string(o.memory_unit_bytes));
  }
  const gpu::Inventory& inv = *in.inventory;
  Result<std::vector<unsigned>> whole_order =
      PolicyGpuOrder(inv, in.gpu_used_milli, o.placement_policy, true);
  if (!whole_order.ok()) return whole_order.status();
  Result<std::vector<unsigned>> share_order =
      PolicyGpuOrder(inv, in.gpu_used_milli, o.placement_policy, false);
  if (!share_order.ok()) return share_order.status();
  const std::vector<std::optional<int64_t>> domains = NvlinkDomains(inv);

  DeviceLists lists;
  std::map<unsigned, std::vector<json>> mig_by_gpu;
  std::map<unsigned, json> whole_by_gpu, share_by_gpu;
  for (size_t pos = 0; pos < inv.gpus.size(); ++pos) {
    const gpu::Gpu& g = inv.gpus[pos];
    const Geometry geo = GeometryOf(g, in);
    const bool static_mig = geo.mig != nullptr && !geo.mig->instances.empty();
    lists.counter_sets.push_back({{"name", CounterSetName(g.index)}, {"counters", AllCounters(geo)}});
    const json base = GpuAttributes(g, inv, o, domains[pos]);
    const json taints = Taints(g, in);
    const int64_t memory = static_cast<int64_t>(g.memory_mib) << 20;
    auto finish = [&](json d) {
      if (!taints.is_null()) d["taints"] = taints;
      return d;
    };
    if (!static_mig) {
      json d = {{"name", FormatDeviceName({DeviceKind::kGpu, g.index, "", 0})},
                {"attributes", base},
                {"capacity", {{"memory", {{"value", BytesQuantity(memory)}}}}},
                {"consumesCounters", Consumes(g.index, AllCounters(geo))}};
      d["attributes"]["type"] = StringAttr("gpu");
      whole_by_gpu[g.index] = finish(std::move(d));
      const int64_t units = memory / o.memory_unit_bytes;
      if (o.publish_memory_shares && units > 0) {
        const std::string unit = BytesQuantity(o.memory_unit_bytes);
        json m = {{"name", FormatDeviceName({DeviceKind::kMemoryShare, g.index, "", 0})},
                  {"attributes", base},
                  {"allowMultipleAllocations", true},
                  {"capacity",
                   {{"memory",
                     {{"value", BytesQuantity(units * o.memory_unit_bytes)},
                      {"requestPolicy",
                       {{"default", unit}, {"validRange", {{"min", unit}, {"step", unit}}}}}}}}},
                  {"consumesCounters", Consumes(g.index, AllCounters(geo))}};
        m["attributes"]["type"] = StringAttr("memory-share");
        share_by_gpu[g.index] = finish(std::move(m));
      }
    }
    if (o.publish_mig && geo.mig != nullptr) {
      std::vector<json>& out = mig_by_gpu[g.index];
      for (const mig::ProfileSpec& p : geo.mig->profiles) {
        std::vector<unsigned> starts = p.starts;
        std::sort(starts.begin(), starts.end());
        for (unsigned start : starts) {
          if (start + p.size > geo.memory_slices) continue;
          if (static_mig && Reserved(*geo.mig, p, start)) continue;
          json counters = json::object();
          for (unsigned i = start; i < start + p.size; ++i) {
            counters["memory-slice-" + std::to_string(i)] = {{"value", "1"}};
          }
          counters["compute-slices"] = {{"value", std::to_string(p.slices)}};
          if (p.name.find("+me") != std::string::npos) counters["media-engines"] = {{"value", "1"}};
          json a = base;
          a["type"] = StringAttr("mig");
          a["profile"] = StringAttr(p.name);
          a["parentUUID"] = StringAttr(g.uuid);
          a.erase("uuid");  // the MIG device has its own UUID only once created
          a["memorySliceStart"] = IntAttr(start);
          a["memorySlices"] = IntAttr(p.size);
          json d = {{"name", FormatDeviceName({DeviceKind::kMig, g.index, p.name, start})},
                    {"attributes", std::move(a)},
                    {"capacity",
                     {{"memory", {{"value", BytesQuantity(static_cast<int64_t>(p.memory_mb) << 20)}}},
                      {"computeSlices", {{"value", std::to_string(p.slices)}}}}},
                    {"consumesCounters", Consumes(g.index, std::move(counters))}};
          out.push_back(finish(std::move(d)));
        }
      }
    }
  }
  for (unsigned g : *whole_order) {
    if (auto it = whole_by_gpu.find(inv.gpus[g].index); it != whole_by_gpu.end()) {
      lists.whole.push_back(it->second);
    }
  }
  for (unsigned g : *share_order) {
    const unsigned index = inv.gpus[g].index;
    if (auto it = share_by_gpu.find(index); it != share_by_gpu.end()) {
      lists.shares.push_back(it->second);
    }
    if (auto it = mig_by_gpu.find(index); it != mig_by_gpu.end()) {
      for (json& d : it->second) lists.mig.push_back(std::move(d));
    }
  }

  // Slices: counters first in name order "c", devices "d"; each device kind starts a slice.
  const std::string prefix = SlicePrefix(o.node_name);
  std::vector<std::pair<std::string, json>> specs;  // name → spec (without pool)
  for (size_t i = 0; i < lists.counter_sets.size(); i += kMaxCounterSetsPerSlice) {
    json sets = json::array();
    for (size_t j = i; j < std::min(i + kMaxCounterSetsPerSlice, lists.counter_sets.size()); ++j) {
      sets.push_back(lists.counter_sets[j]);
    }
    specs.push_back({Numbered(prefix, 'c', i / kMaxCounterSetsPerSlice),
                     {{"sharedCounters", std::move(sets)}}});
  }
  size_t device_slices = 0;
  for (const std::vector<json>* kind : {&lists.whole, &lists.shares, &lists.mig}) {
    for (size_t i = 0; i < kind->size(); i += kMaxDevicesPerSlice) {
      json devices = json::array();
      for (size_t j = i; j < std::min(i + kMaxDevicesPerSlice, kind->size()); ++j) {
        devices.push_back((*kind)[j]);
      }
      specs.push_back({Numbered(prefix, 'd', device_slices++), {{"devices", std::move(devices)}}});
    }
  }
  if (specs.empty()) {
    // A driver that is up publishes an empty slice rather than none (dra.md 1.6).
    specs.push_back({Numbered(prefix, 'd', 0), {{"devices", json::array()}}});
  }
  std::vector<json> out;
  for (auto& [name, body] : specs) {
    json spec = {{"driver", kDriverName},
                 {"nodeName", o.node_name},
                 {"pool",
                  {{"name", o.node_name},
                   {"generation", generation},
                   {"resourceSliceCount", static_cast<int64_t>(specs.size())}}}};
    spec.update(body);
    json meta = {{"name", name}};
    if (!o.node_uid.empty()) {
      meta["ownerReferences"] = json::array({{{"apiVersion", "v1"},
                                              {"kind", "Node"},
                                              {"name", o.node_name},
                                              {"uid", o.node_uid},
                                              {"controller", true}}});
    }
    out.push_back({{"apiVersion", "resource.k8s.io/v1"},
                   {"kind", "ResourceSlice"},
                   {"metadata", std::move(meta)},
                   {"spec", std::move(spec)}});
  }
  return out;
}

}  // namespace gpulet::dra
