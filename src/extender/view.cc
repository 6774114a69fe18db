#include "extender/view.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>

#include "common/duration.h"

namespace gpulet::extender {
namespace {

using nlohmann::json;

std::string Describe(const json& v) { return v.dump().substr(0, 60); }

// Reads an integer field in [lo, hi]; `path` names it in the error.
Result<int64_t> IntField(const json& obj, const char* key, const std::string& path, int64_t lo,
                         int64_t hi, std::optional<int64_t> fallback = std::nullopt) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    if (fallback) return *fallback;
    return Status(ErrorCode::kInvalidInput, path + key + ": required");
  }
  if (!it->is_number_integer() && !it->is_number_unsigned()) {
    return Status(ErrorCode::kInvalidInput,
                  path + key + ": must be an integer, got " + Describe(*it));
  }
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) {
    return Status(ErrorCode::kInvalidInput, path + key + ": must be between " + std::to_string(lo) +
                                                " and " + std::to_string(hi) + ", got " +
                                                std::to_string(v));
  }
  return v;
}

Result<std::string> StringField(const json& obj, const char* key, const std::string& path,
                                bool required) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    if (required) return Status(ErrorCode::kInvalidInput, path + key + ": required");
    return std::string();
  }
  if (!it->is_string()) {
    return Status(ErrorCode::kInvalidInput,
                  path + key + ": must be a string, got " + Describe(*it));
  }
  return it->get<std::string>();
}

constexpr int64_t kMaxUnits = int64_t{1} << 40;

// The node an object speaks for: its gpulet.io/node label, else the name after the prefix.
std::string ObjectNode(const json& cm) {
  const json& meta =
      cm.contains("metadata") && cm["metadata"].is_object() ? cm["metadata"] : json::object();
  if (meta.contains("labels") && meta["labels"].is_object()) {
    auto it = meta["labels"].find(kNodeLabel);
    if (it != meta["labels"].end() && it->is_string() && !it->get<std::string>().empty()) {
      return it->get<std::string>();
    }
  }
  const std::string name = meta.value("name", "");
  if (name.rfind(kObjectPrefix, 0) == 0 && name.size() > std::string(kObjectPrefix).size()) {
    return name.substr(std::string(kObjectPrefix).size());
  }
  return "";
}

std::string Units(int64_t n) { return std::to_string(n) + (n == 1 ? " unit" : " units"); }

// A pod's class (placement::Pod::PodClass) from the units it holds per GPU, against each GPU's
// total: a share of one GPU is a sharing pod (0); n GPUs held whole, an n-GPU pod.
int ClassOf(const std::map<size_t, int64_t>& units_per_gpu,
            const std::function<int64_t(size_t)>& total) {
  if (units_per_gpu.empty()) return -1;
  if (units_per_gpu.size() == 1) {
    const auto& [g, u] = *units_per_gpu.begin();
    if (u < total(g)) return 0;
  }
  return std::min(static_cast<int>(units_per_gpu.size()), placement::kPodClasses - 1);
}

}  // namespace

Result<NodeMemory> ParseMemoryJson(const std::string& text, const std::string& where) {
  const std::string p = where + ": memory.json: ";
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return Status(ErrorCode::kInvalidInput, p + "not valid JSON");
  if (!j.is_object()) return Status(ErrorCode::kInvalidInput, p + "must be a JSON object");
  NodeMemory m;
  auto version = IntField(j, "version", p, 1, 1);
  if (!version.ok()) return version.status();
  auto node = StringField(j, "node", p, true);
  if (!node.ok()) return node.status();
  m.node = *node;
  auto generation = IntField(j, "generation", p, 0, INT64_MAX);
  if (!generation.ok()) return generation.status();
  m.generation = *generation;
  auto resource = StringField(j, "resource", p, true);
  if (!resource.ok()) return resource.status();
  m.resource = *resource;
  if (m.resource.empty()) return Status(ErrorCode::kInvalidInput, p + "resource: empty");
  auto unit = IntField(j, "unitBytes", p, 1, INT64_MAX);
  if (!unit.ok()) return unit.status();
  m.unit_bytes = *unit;
  auto heartbeat = IntField(j, "heartbeatSeconds", p, 1, 86400, 30);
  if (!heartbeat.ok()) return heartbeat.status();
  m.heartbeat_seconds = static_cast<int>(*heartbeat);
  if (!j.contains("gpus") || !j["gpus"].is_array()) {
    return Status(ErrorCode::kInvalidInput, p + "gpus: required, a list");
  }
  std::set<std::string> uuids;
  for (size_t i = 0; i < j["gpus"].size(); ++i) {
    const json& g = j["gpus"][i];
    const std::string gp = p + "gpus[" + std::to_string(i) + "].";
    if (!g.is_object())
      return Status(ErrorCode::kInvalidInput, gp.substr(0, gp.size() - 1) + ": must be an object");
    GpuMemory gpu;
    auto uuid = StringField(g, "uuid", gp, true);
    if (!uuid.ok()) return uuid.status();
    gpu.uuid = *uuid;
    if (gpu.uuid.empty() || !uuids.insert(gpu.uuid).second) {
      return Status(ErrorCode::kInvalidInput, gp + "uuid: empty or repeated: \"" + gpu.uuid + "\"");
    }
    auto index = IntField(g, "index", gp, 0, 1 << 16, static_cast<int64_t>(i));
    if (!index.ok()) return index.status();
    gpu.index = static_cast<int>(*index);
    auto model = StringField(g, "model", gp, false);
    if (!model.ok()) return model.status();
    gpu.model = *model;
    auto numa = IntField(g, "numaNode", gp, -1, 1 << 16, -1);
    if (!numa.ok()) return numa.status();
    gpu.numa_node = static_cast<int>(*numa);
    if (g.contains("healthy") && !g["healthy"].is_null()) {
      if (!g["healthy"].is_boolean()) {
        return Status(ErrorCode::kInvalidInput,
                      gp + "healthy: must be true or false, got " + Describe(g["healthy"]));
      }
      gpu.healthy = g["healthy"].get<bool>();
    }
    auto total = IntField(g, "totalUnits", gp, 0, kMaxUnits);
    if (!total.ok()) return total.status();
    gpu.total_units = *total;
    auto free = IntField(g, "freeUnits", gp, 0, gpu.total_units);
    if (!free.ok()) return free.status();
    gpu.free_units = *free;
    m.gpus.push_back(std::move(gpu));
  }
  if (j.contains("pods") && !j["pods"].is_null()) {
    if (!j["pods"].is_array()) return Status(ErrorCode::kInvalidInput, p + "pods: must be a list");
    for (size_t i = 0; i < j["pods"].size(); ++i) {
      const json& e = j["pods"][i];
      const std::string pp = p + "pods[" + std::to_string(i) + "].";
      if (!e.is_object())
        return Status(ErrorCode::kInvalidInput,
                      pp.substr(0, pp.size() - 1) + ": must be an object");
      PlacedUnits u;
      auto ns = StringField(e, "namespace", pp, true);
      if (!ns.ok()) return ns.status();
      auto name = StringField(e, "name", pp, true);
      if (!name.ok()) return name.status();
      auto container = StringField(e, "container", pp, false);
      if (!container.ok()) return container.status();
      auto gpu = StringField(e, "gpu", pp, false);
      if (!gpu.ok()) return gpu.status();
      auto units = IntField(e, "units", pp, 0, kMaxUnits, 0);
      if (!units.ok()) return units.status();
      u.ns = *ns;
      u.name = *name;
      u.container = *container;
      u.gpu = *gpu;
      u.units = *units;
      m.pods.push_back(std::move(u));
    }
  }
  return m;
}

Result<Policy> ParsePolicy(const std::string& name) {
  if (name == "bestfit" || name == "best-fit") return Policy::kBestFit;
  if (name == "spread") return Policy::kSpread;
  return Status(ErrorCode::kUsage, "--policy: must be bestfit or spread, got \"" + name + "\"");
}

ClusterView::ClusterView(const Clock& clock, ViewOptions options)
    : clock_(clock), options_(std::move(options)) {
  if (options_.placement) models_.models = options_.placement->models();
}

void ClusterView::UpsertObject(const json& cm) {
  const std::string node = ObjectNode(cm);
  if (node.empty()) return;
  const json meta = cm.value("metadata", json::object());
  const std::string name = meta.value("name", "");
  const std::string rv = meta.value("resourceVersion", "");
  const std::string where = "configmaps/" + meta.value("namespace", options_.ns) + "/" + name;
  std::optional<NodeMemory> memory;
  std::string error;
  const json data = cm.value("data", json::object());
  if (!data.is_object() || !data.contains("memory.json") || !data["memory.json"].is_string()) {
    error = where + ": data[\"memory.json\"]: missing";
  } else {
    auto parsed = ParseMemoryJson(data["memory.json"].get<std::string>(), where);
    if (parsed.ok()) {
      if (parsed->node != node) {
        error = where + ": memory.json: node: \"" + parsed->node +
                "\" is not the object's node \"" + node + "\"";
      } else {
        memory = std::move(parsed).value();
      }
    } else {
      error = parsed.status().message();
    }
  }
  std::unique_lock l(mu_);
  const uint32_t slot = MakeSlotLocked(node);
  Slot& e = slots_[slot];
  SlotInfo& info = info_[slot];
  if (info.resource_version != rv || info.object_name != name) e.changed_at = clock_.Now();
  info.object_name = name;
  info.resource_version = rv;
  info.memory = std::move(memory);
  info.error = std::move(error);
  e.ok = info.memory.has_value();
  e.largest_free = 0;
  e.healthy_total = 0;
  std::vector<GpuUnits> units;
  if (info.memory) {
    e.stale_after = options_.stale_after.count() > 0
                        ? options_.stale_after
                        : Clock::Duration(std::chrono::seconds(3 * info.memory->heartbeat_seconds));
    auto r = std::find(resources_.begin(), resources_.end(), info.memory->resource);
    if (r == resources_.end()) r = resources_.insert(r, info.memory->resource);
    e.resource = static_cast<uint32_t>(r - resources_.begin());
    units.reserve(info.memory->gpus.size());
    for (const GpuMemory& g : info.memory->gpus) {
      units.push_back({g.healthy ? g.free_units : 0, g.total_units});
      if (g.healthy) e.largest_free = std::max(e.largest_free, g.free_units);
      if (g.healthy) e.healthy_total += g.total_units;
    }
  }
  e.units.Assign(units);
  e.model = -1;
  e.classes = {};
  if (info.memory && options_.placement) {
    const NodeMemory& m = *info.memory;
    if (!m.gpus.empty()) {
      const std::string& model = m.gpus.front().model;
      e.model = models_.FindModel(model);
      if (e.model < 0) {  // beyond 64 models, the last index stands for the rest
        e.model = models_.models.size() < 64 ? models_.InternModel(model) : 63;
      }
    }
    std::map<std::string, std::map<size_t, int64_t>> listed;  // pod → units per GPU
    for (const PlacedUnits& p : m.pods) {
      for (size_t g = 0; g < m.gpus.size(); ++g) {
        if (m.gpus[g].uuid == p.gpu) listed[p.ns + "/" + p.name][g] += p.units;
      }
    }
    for (const auto& [pod, per_gpu] : listed) {
      const int c = ClassOf(per_gpu, [&](size_t g) { return m.gpus[g].total_units; });
      if (c >= 0) ++e.classes[static_cast<size_t>(c)];
    }
  }
  object_nodes_[name] = node;
  if (info.memory) DropListedReservations(node, *info.memory);
  PurgeExpiredLocked();
}

uint32_t ClusterView::SlotOf(std::string_view node) const {
  auto it = slot_of_.find(node);
  return it == slot_of_.end() ? kNoSlot : it->second;
}

uint32_t ClusterView::MakeSlotLocked(const std::string& node) {
  if (const uint32_t s = SlotOf(node); s != kNoSlot) return s;
  uint32_t s;
  if (!free_slots_.empty()) {
    s = free_slots_.back();
    free_slots_.pop_back();
  } else {
    s = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
    info_.emplace_back();
  }
  slots_[s] = Slot{};
  slots_[s].reserved = reservations_.count(node) > 0;
  info_[s] = SlotInfo{};
  info_[s].node = node;
  slot_of_.emplace(node, s);
  ++layout_;
  return s;
}

void ClusterView::FreeSlotLocked(uint32_t slot) {
  slot_of_.erase(info_[slot].node);
  slots_[slot] = Slot{};
  info_[slot] = SlotInfo{};
  free_slots_.push_back(slot);
  ++layout_;
}

void ClusterView::SyncReservedLocked(const std::string& node) {
  if (const uint32_t s = SlotOf(node); s != kNoSlot) {
    slots_[s].reserved = reservations_.count(node) > 0;
  }
}

void ClusterView::RemoveObject(const std::string& configmap_name) {
  std::unique_lock l(mu_);
  auto it = object_nodes_.find(configmap_name);
  if (it == object_nodes_.end()) return;
  const uint32_t slot = SlotOf(it->second);
  if (slot != kNoSlot && info_[slot].object_name == configmap_name) FreeSlotLocked(slot);
  object_nodes_.erase(it);
}

void ClusterView::ReplaceObjects(const std::vector<json>& configmaps) {
  std::set<std::string> names;
  for (const json& cm : configmaps) {
    UpsertObject(cm);
    if (cm.contains("metadata")) names.insert(cm["metadata"].value("name", ""));
  }
  std::vector<std::string> gone;
  {
    std::shared_lock l(mu_);
    for (const auto& [name, node] : object_nodes_) {
      if (!names.count(name)) gone.push_back(name);
    }
  }
  for (const std::string& name : gone) RemoveObject(name);
}

void ClusterView::UpsertNode(const json& node) {
  const json meta = node.value("metadata", json::object());
  const std::string name = meta.value("name", "");
  if (name.empty()) return;
  NodeInfo info;
  const json labels = meta.value("labels", json::object());
  info.pool_label = labels.is_object() && labels.value(kNodePoolLabel, "") == "true";
  std::unique_lock l(mu_);
  nodes_known_ = true;
  nodes_[name] = info;
}

void ClusterView::RemoveNode(const std::string& name) {
  std::unique_lock l(mu_);
  nodes_.erase(name);
  reservations_.erase(name);
  SyncReservedLocked(name);
}

void ClusterView::ReplaceNodes(const std::vector<json>& nodes) {
  std::set<std::string> names;
  for (const json& n : nodes) {
    UpsertNode(n);
    if (n.contains("metadata")) names.insert(n["metadata"].value("name", ""));
  }
  std::unique_lock l(mu_);
  nodes_known_ = true;
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    if (names.count(it->first)) {
      ++it;
    } else {
      reservations_.erase(it->first);
      SyncReservedLocked(it->first);
      it = nodes_.erase(it);
    }
  }
}

void ClusterView::DropListedReservations(const std::string& node, const NodeMemory& memory) {
  auto it = reservations_.find(node);
  if (it == reservations_.end()) return;
  std::set<std::string> listed;
  for (const PlacedUnits& p : memory.pods) listed.insert(p.ns + "/" + p.name);
  auto& list = it->second;
  list.erase(std::remove_if(list.begin(), list.end(),
                            [&](Reservation& r) {
                              const bool named = listed.count(r.pod_key) > 0;
                              if (!named) {
                                r.name_listed_before = false;  // the earlier pod is gone
                                return false;
                              }
                              return !r.name_listed_before;  // evidence for this pod
                            }),
             list.end());
  if (list.empty()) {
    reservations_.erase(it);
    SyncReservedLocked(node);
  }
}

void ClusterView::EndReservation(const std::string& uid) {
  std::unique_lock l(mu_);
  for (auto it = reservations_.begin(); it != reservations_.end();) {
    auto& list = it->second;
    list.erase(std::remove_if(list.begin(), list.end(),
                              [&](const Reservation& r) { return r.uid == uid; }),
               list.end());
    if (list.empty()) {
      const std::string node = it->first;
      it = reservations_.erase(it);
      SyncReservedLocked(node);
    } else {
      ++it;
    }
  }
}

std::vector<ClusterView::HeldPod> ClusterView::Reservations() const {
  std::shared_lock l(mu_);
  const Clock::TimePoint now = clock_.Now();
  std::vector<HeldPod> out;
  for (const auto& [node, list] : reservations_) {
    for (const Reservation& r : list) {
      if (r.expires <= now) continue;
      const size_t slash = r.pod_key.find('/');
      out.push_back(
          {r.uid, r.pod_key.substr(0, slash), r.pod_key.substr(slash + 1), node, now - r.made});
    }
  }
  return out;
}

std::optional<std::vector<Assignment>> ClusterView::ReservationOf(const std::string& uid,
                                                                  const std::string& node) const {
  std::shared_lock l(mu_);
  auto it = reservations_.find(node);
  if (it == reservations_.end()) return std::nullopt;
  for (const Reservation& r : it->second) {
    if (r.uid == uid) return r.assignments;
  }
  return std::nullopt;
}

bool ClusterView::IsMemoryResource(std::string_view name) const {
  if (DefaultMemoryResource(name)) return true;
  for (const std::string& r : options_.memory_resources) {
    if (r == name) return true;
  }
  std::shared_lock l(mu_);
  return std::find(resources_.begin(), resources_.end(), name) != resources_.end();
}

void ClusterView::PurgeExpiredLocked() {
  const Clock::TimePoint now = clock_.Now();
  for (auto it = reservations_.begin(); it != reservations_.end();) {
    auto& list = it->second;
    list.erase(std::remove_if(list.begin(), list.end(),
                              [&](const Reservation& r) { return r.expires <= now; }),
               list.end());
    if (list.empty()) {
      const std::string node = it->first;
      it = reservations_.erase(it);
      SyncReservedLocked(node);
    } else {
      ++it;
    }
  }
}

ClusterView::EvalContext ClusterView::Context(const PodRequest& pod, bool assignments,
                                              bool score) const {
  EvalContext ctx;
  ctx.now = clock_.Now();
  ctx.pod_key = pod.key();
  ctx.pod_uid = pod.uid;
  ctx.assignments = assignments;
  ctx.score = score;
  return ctx;
}

NodeVerdict ClusterView::Evaluate(const PodRequest& pod, const std::string& node) const {
  const EvalContext ctx = Context(pod, true, true);
  std::shared_lock l(mu_);
  return EvaluateLocked(pod, SlotOf(node), node, ctx);
}

NodeVerdict ClusterView::EvaluateLocked(const PodRequest& pod, uint32_t slot, std::string_view node,
                                        const EvalContext& ctx) const {
  const bool assignments = ctx.assignments;
  NodeVerdict v;
  if (!pod.asks()) {
    v.fits = true;  // not ours to judge
    v.score = 0;
    return v;
  }
  auto unresolvable = [&](std::string reason) {
    v.unresolvable = true;
    v.reason = std::move(reason);
    return v;
  };
  if (slot == kNoSlot) {
    if (nodes_known_) {
      auto n = nodes_.find(node);
      if (n != nodes_.end() && !n->second.pool_label) {
        return unresolvable("node has no gpulet GPU memory pool (no " +
                            std::string(kNodePoolLabel) + "=true label, no " + kObjectPrefix +
                            std::string(node) + " object)");
      }
    }
    return unresolvable("no GPU memory object configmaps/" + options_.ns + "/" + kObjectPrefix +
                        std::string(node) +
                        " (is gpulet's node agent running there with a memory pool?)");
  }
  const Slot& e = slots_[slot];
  const SlotInfo& info = info_[slot];
  if (!e.ok) return unresolvable("GPU memory object is malformed: " + info.error);
  const Clock::Duration stale_after = e.stale_after;
  const Clock::Duration age = ctx.now - e.changed_at;
  if (age > stale_after) {
    return unresolvable(
        "GPU memory object is stale: configmaps/" + options_.ns + "/" + info.object_name +
        " unchanged for " +
        FormatDuration(std::chrono::duration_cast<std::chrono::milliseconds>(age)) +
        " (stale after " +
        FormatDuration(std::chrono::duration_cast<std::chrono::milliseconds>(stale_after)) +
        "; is gpulet's node agent running?)");
  }
  if (!ctx.resource) {
    auto r = std::find(resources_.begin(), resources_.end(), pod.resource);
    ctx.resource = static_cast<size_t>(r - resources_.begin());  // size(): no object's
  }
  if (e.resource != *ctx.resource) {
    return unresolvable("node's GPU memory pool is " + info.memory->resource +
                        ", the pod asks for " + pod.resource);
  }
  // Fast path (filter, no pending bind on the node): one container asks.
  if (!e.reserved && !ctx.score && !assignments && pod.steps.size() == 1) {
    v.fits = e.largest_free >= pod.steps[0].container.units;
    if (v.fits) return v;
  }
  // Free units per GPU after reservations (expired ones no longer count).
  // Scratch reused by this thread: filter evaluates thousands of nodes per request.
  const size_t n = e.units.n;
  thread_local std::vector<int64_t> free;
  thread_local std::vector<size_t> used;
  free.resize(n);
  used.clear();
  for (size_t i = 0; i < n; ++i) free[i] = e.units[i].free;
  if (e.reserved) {
    if (auto r = reservations_.find(info.node); r != reservations_.end()) {
      const NodeMemory& m = *info.memory;
      for (const Reservation& res : r->second) {
        if (res.expires <= ctx.now || (!ctx.pod_uid.empty() && res.uid == ctx.pod_uid)) continue;
        for (const Assignment& a : res.assignments) {
          for (size_t g = 0; g < n; ++g) {
            if (m.gpus[g].uuid == a.gpu) free[g] = std::max<int64_t>(0, free[g] - a.units);
          }
        }
      }
    }
  }
  auto pick = [&](int64_t need) -> std::optional<size_t> {
    std::optional<size_t> best;
    for (size_t i = 0; i < n; ++i) {
      if (free[i] < need) continue;
      if (!best) {
        best = i;
      } else if (options_.policy == Policy::kBestFit ? free[i] < free[*best]
                                                     : free[i] > free[*best]) {
        best = i;
      }
    }
    return best;
  };
  auto largest = [&]() {
    size_t best = 0;
    for (size_t i = 1; i < n; ++i) {
      if (free[i] > free[best]) best = i;
    }
    return best;
  };
  auto no_fit = [&](const ContainerUnits& c, bool after_earlier, std::string_view kind) {
    const NodeMemory& m = *info.memory;
    v.fits = false;
    v.reason = std::string(kind) + " \"" + c.name + "\" needs " + Units(c.units) + " of " +
               pod.resource + " on one GPU; ";
    if (m.gpus.empty()) {
      v.reason += "the node publishes no GPUs";
      v.unresolvable = true;
      return v;
    }
    const size_t g = largest();
    v.reason += "the largest free GPU has " + Units(free[g]) + " (GPU " +
                std::to_string(m.gpus[g].index) + ", " + std::to_string(m.gpus[g].total_units) +
                " total" + (m.gpus[g].healthy ? "" : ", unhealthy") + ")";
    if (after_earlier) v.reason += " after this pod's earlier containers";
    // What preemption could free: the units of the pods the node lists, per healthy GPU (binds
    // not yet listed are not victims). Where no GPU would then hold the container, the node is
    // unresolvable, so the scheduler evicts nobody there for this pod.
    thread_local std::vector<int64_t> could;
    could.assign(free.begin(), free.begin() + static_cast<std::ptrdiff_t>(n));
    for (const PlacedUnits& p : m.pods) {
      for (size_t i = 0; i < n; ++i) {
        if (m.gpus[i].uuid == p.gpu && m.gpus[i].healthy) {
          could[i] = std::min(could[i] + p.units, m.gpus[i].total_units);
        }
      }
    }
    size_t best = 0;
    for (size_t i = 1; i < n; ++i) {
      if (could[i] > could[best]) best = i;
    }
    if (could[best] < c.units) {
      v.unresolvable = true;
      v.reason += "; preemption cannot help: evicting every pod the node lists frees at most " +
                  Units(could[best]) + " on one GPU";
    } else {
      v.reason += "; preemption could free " + Units(could[best]) + " on GPU " +
                  std::to_string(m.gpus[best].index) + ", by evicting pods placed on that GPU";
    }
    return v;
  };
  // A one-container pod under a placement policy (scoring.h): the policy scores the node and, at
  // bind, picks the GPU, on the free units after reservations.
  std::optional<size_t> policy_gpu;
  if (options_.placement && pod.steps.size() == 1 && n > 0 && n <= placement::kMaxGpusPerNode &&
      (ctx.score || assignments)) {
    const placement::ArtifactPolicy& policy = options_.placement->policy();
    const int64_t want = pod.steps[0].container.units;
    placement::Node pn;
    pn.model = e.model;
    pn.gpu_free.resize(n);
    int64_t scale = 0;
    for (size_t i = 0; i < n; ++i) {
      const int64_t total = e.units[i].total;
      scale = std::max(scale, total);
      pn.gpu_free[i] = total > 0 ? static_cast<int32_t>(std::clamp<int64_t>(free[i], 0, total) *
                                                        placement::kMilliPerGpu / total)
                                 : 0;
    }
    pn.pods_by_class = e.classes;
    if (e.reserved) {
      if (auto r = reservations_.find(info.node); r != reservations_.end()) {
        const NodeMemory& m = *info.memory;
        for (const Reservation& res : r->second) {
          if (res.expires <= ctx.now || (!ctx.pod_uid.empty() && res.uid == ctx.pod_uid)) continue;
          std::map<size_t, int64_t> per_gpu;
          for (const Assignment& a : res.assignments) {
            for (size_t g = 0; g < n; ++g) {
              if (m.gpus[g].uuid == a.gpu) per_gpu[g] += a.units;
            }
          }
          const int c = ClassOf(per_gpu, [&](size_t g) { return e.units[g].total; });
          if (c >= 0) ++pn.pods_by_class[static_cast<size_t>(c)];
        }
      }
    }
    placement::Pod pp;
    pp.name = pod.name;
    pp.num_gpu = 1;
    pp.gpu_milli = ShareOf(want, scale);
    if (placement::Fits(pn, pp)) {
      if (ctx.score) v.policy_score = policy.Score(pn, pp);
      if (assignments) {
        placement::Rng rng(std::hash<std::string>{}(pod.uid));
        const placement::GpuSet gpus = policy.Gpus(pn, pp, rng);
        for (size_t i = 0; i < n; ++i) {
          if ((gpus >> i & 1U) && free[i] >= want) {
            policy_gpu = i;
            break;
          }
        }
      }
    }
  }
  // The containers in the kubelet's order (init containers, then the app's). An ordinary init
  // container's units go back to the pod when it ends (`reuse`), and the next container takes
  // them first, then the rest on the same GPU (the device plugin keeps a container on one GPU);
  // a sidecar's and an app container's units stay held.
  thread_local std::vector<int64_t> reuse;
  reuse.assign(n, 0);
  bool any_reuse = false;
  for (size_t k = 0; k < pod.steps.size(); ++k) {
    const PodRequest::Step& s = pod.steps[k];
    const ContainerUnits& c = s.container;
    const char* kind = s.kind == PodRequest::Step::kInit      ? "init container"
                       : s.kind == PodRequest::Step::kSidecar ? "sidecar"
                                                              : "container";
    std::optional<size_t> g;
    int64_t taken = 0;  // of the reused units
    if (any_reuse) {
      // The kubelet hands out reused units in the order of their device IDs (by GPU UUID).
      const NodeMemory& m = *info.memory;
      size_t holders = 0;
      for (size_t i = 0; i < n; ++i) {
        if (reuse[i] == 0) continue;
        ++holders;
        if (!g || m.gpus[i].uuid < m.gpus[*g].uuid) g = i;
      }
      if (g) {
        taken = std::min(c.units, reuse[*g]);
        if (c.units > taken && holders > 1) {
          v.fits = false;
          v.reason = std::string(kind) + " \"" + c.name + "\" would be given units an init " +
                     "container released on two GPUs (the device plugin refuses that)";
          return v;
        }
        if (free[*g] < c.units - taken) {
          v.fits = false;
          v.reason = std::string(kind) + " \"" + c.name + "\" needs " + Units(c.units) + " of " +
                     pod.resource + " on one GPU; it reuses " + Units(taken) +
                     " an init container released on GPU " + std::to_string(m.gpus[*g].index) +
                     " and stays there, which has " + Units(free[*g]) + " free";
          return v;
        }
      }
    }
    if (!g) {
      g = policy_gpu ? policy_gpu : pick(c.units);
      if (!g) return no_fit(c, k > 0, kind);
    }
    const int64_t from_free = c.units - taken;
    free[*g] -= from_free;
    if (s.kind == PodRequest::Step::kInit) {
      reuse[*g] += from_free;
      any_reuse = true;
    } else {
      reuse[*g] -= taken;
    }
    if (std::find(used.begin(), used.end(), *g) == used.end()) used.push_back(*g);
    if (assignments && from_free > 0) {
      v.assignments.push_back({c.name, info.memory->gpus[*g].uuid, from_free});
    }
  }
  v.fits = true;
  if (!ctx.score) return v;
  // Score: the leftover share on the GPUs used (weight 0.8), then on the node (0.2). Best fit
  // prefers little leftover, spread much.
  double gpu_left = 0;
  for (size_t g : used) {
    gpu_left += e.units[g].total > 0
                    ? static_cast<double>(free[g]) / static_cast<double>(e.units[g].total)
                    : 0;
  }
  if (!used.empty()) gpu_left /= static_cast<double>(used.size());
  int64_t node_free = 0;
  for (size_t i = 0; i < n; ++i) node_free += free[i];
  const int64_t node_total = e.healthy_total;
  const double node_left =
      node_total > 0 ? static_cast<double>(node_free) / static_cast<double>(node_total) : 0;
  const double left = 0.8 * gpu_left + 0.2 * node_left;
  const double s = options_.policy == Policy::kBestFit ? 1.0 - left : left;
  v.score =
      std::clamp(static_cast<int>(std::lround(s * kMaxExtenderPriority)), 0, kMaxExtenderPriority);
  return v;
}

std::shared_ptr<const ClusterView::Resolved> ClusterView::ResolveLocked(
    const NameList& list) const {
  if (Rememberable(list.text)) {
    std::lock_guard g(resolved_mu_);
    for (auto it = resolved_.begin(); it != resolved_.end(); ++it) {
      const Resolved& r = **it;
      if (r.layout != layout_ || r.slots.size() != list.names.size() ||
          r.text.size() != list.text.size() ||
          std::memcmp(r.text.data(), list.text.data(), r.text.size()) != 0)
        continue;
      std::shared_ptr<const Resolved> hit = *it;
      if (it != resolved_.begin()) {
        resolved_.erase(it);
        resolved_.push_front(hit);
      }
      return hit;
    }
  }
  auto r = std::make_shared<Resolved>();
  r->layout = layout_;
  r->slots.reserve(list.names.size());
  for (std::string_view name : list.names) r->slots.push_back(SlotOf(name));
  if (Rememberable(list.text)) {
    r->text.assign(list.text);
    RememberLocked(r);
  }
  return r;
}

void ClusterView::RememberLocked(std::shared_ptr<const Resolved> r) const {
  std::lock_guard g(resolved_mu_);
  // Lists of an older layout can never match again.
  resolved_.erase(std::remove_if(resolved_.begin(), resolved_.end(),
                                 [&](const auto& old) {
                                   return old->layout != layout_ || old->text == r->text;
                                 }),
                  resolved_.end());
  resolved_.push_front(std::move(r));
  size_t bytes = 0, kept = 0;
  for (const auto& old : resolved_) {
    bytes += old->text.size() + old->slots.size() * sizeof(uint32_t);
    if (kept > 0 && (kept >= kRememberedLists || bytes > options_.remembered_bytes)) break;
    ++kept;
  }
  resolved_.resize(kept);
}

bool ClusterView::Rememberable(std::string_view text) const {
  return !text.empty() && text.size() <= options_.remembered_bytes / 2;
}

size_t ClusterView::remembered_lists() const {
  std::lock_guard g(resolved_mu_);
  return resolved_.size();
}

namespace {

NameList ViewsOf(const std::vector<std::string>& nodes) {
  NameList list;
  list.names.assign(nodes.begin(), nodes.end());
  return list;
}

// The JSON array body of plain names, as the scheduler would send them back.
std::string JoinPlain(const std::vector<std::string_view>& names) {
  size_t bytes = 0;
  for (std::string_view n : names) bytes += n.size() + 3;
  std::string out;
  out.reserve(bytes);
  for (std::string_view n : names) {
    if (!out.empty()) out += ',';
    out += '"';
    out += n;
    out += '"';
  }
  return out;
}

}  // namespace

FilterOutcome ClusterView::Filter(const PodRequest& pod, const std::vector<std::string>& nodes,
                                  std::vector<size_t>* passed_index) const {
  return Filter(pod, ViewsOf(nodes), passed_index);
}

FilterOutcome ClusterView::Filter(const PodRequest& pod, const NameList& nodes,
                                  std::vector<size_t>* passed_index) const {
  FilterOutcome out;
  std::vector<size_t> own_index;
  std::vector<size_t>& passed = passed_index ? *passed_index : own_index;
  passed.clear();
  passed.reserve(nodes.names.size());
  const EvalContext ctx = Context(pod, /*assignments=*/false, /*score=*/false);
  std::shared_lock l(mu_);
  const std::shared_ptr<const Resolved> resolved = ResolveLocked(nodes);
  for (size_t i = 0; i < nodes.names.size(); ++i) {
    const std::string_view n = nodes.names[i];
    NodeVerdict v = EvaluateLocked(pod, resolved->slots[i], n, ctx);
    if (v.fits) {
      passed.push_back(i);
    } else if (v.unresolvable) {
      out.unresolvable.emplace(n, std::move(v.reason));
    } else {
      out.failed.emplace(n, std::move(v.reason));
    }
  }
  // Prioritize gets the nodes that passed: remember that list too (when some failed; else it is
  // the list just resolved).
  if (Rememberable(nodes.text) && !passed.empty() && passed.size() < nodes.names.size()) {
    std::vector<std::string_view> names;
    auto r = std::make_shared<Resolved>();
    r->layout = layout_;
    names.reserve(passed.size());
    r->slots.reserve(passed.size());
    for (size_t i : passed) {
      names.push_back(nodes.names[i]);
      r->slots.push_back(resolved->slots[i]);
    }
    r->text = JoinPlain(names);
    RememberLocked(std::move(r));
  }
  if (!passed_index) {
    out.passed.reserve(passed.size());
    for (size_t i : passed) out.passed.emplace_back(nodes.names[i]);
  }
  return out;
}

std::vector<std::pair<std::string, int>> ClusterView::Prioritize(
    const PodRequest& pod, const std::vector<std::string>& nodes) const {
  const std::vector<int> scores = Scores(pod, nodes);
  std::vector<std::pair<std::string, int>> out;
  out.reserve(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) out.emplace_back(nodes[i], scores[i]);
  return out;
}

std::vector<int> ClusterView::Scores(const PodRequest& pod,
                                     const std::vector<std::string>& nodes) const {
  return Scores(pod, ViewsOf(nodes));
}

std::vector<int> ClusterView::Scores(const PodRequest& pod, const NameList& nodes) const {
  std::vector<int> out;
  out.reserve(nodes.names.size());
  const EvalContext ctx = Context(pod, /*assignments=*/false, /*score=*/true);
  // Under a placement policy, its scores of the nodes, then the scheduler's pick (scoring.h).
  const bool by_policy = options_.placement && pod.asks() && pod.steps.size() == 1;
  std::vector<std::optional<double>> policy_scores(by_policy ? nodes.names.size() : 0);
  std::shared_lock l(mu_);
  const std::shared_ptr<const Resolved> resolved = ResolveLocked(nodes);
  for (size_t i = 0; i < nodes.names.size(); ++i) {
    NodeVerdict v = EvaluateLocked(pod, resolved->slots[i], nodes.names[i], ctx);
    out.push_back(v.fits ? v.score : 0);
    if (by_policy && v.fits) policy_scores[i] = v.policy_score;
  }
  if (by_policy) return PickScores(options_.placement->policy(), policy_scores, nodes.names);
  return out;
}

Result<std::vector<Assignment>> ClusterView::Reserve(const PodRequest& pod, const std::string& node,
                                                     bool* already) {
  if (already) *already = false;
  if (pod.uid.empty()) {
    return Status(ErrorCode::kInvalidInput, "pod " + pod.key() + ": no UID to reserve under");
  }
  std::unique_lock l(mu_);
  PurgeExpiredLocked();
  if (auto it = reservations_.find(node); it != reservations_.end()) {
    for (const Reservation& r : it->second) {
      if (r.uid != pod.uid) continue;
      if (already) *already = true;
      return r.assignments;
    }
  }
  NodeVerdict v = EvaluateLocked(pod, SlotOf(node), node, Context(pod, true, true));
  if (!v.fits) {
    return Status(ErrorCode::kUnavailable,
                  "pod " + pod.key() + " no longer fits on node " + node + ": " + v.reason);
  }
  if (v.assignments.empty()) return v.assignments;  // nothing of ours to hold
  Reservation r;
  r.uid = pod.uid;
  r.pod_key = pod.key();
  r.assignments = v.assignments;
  r.made = clock_.Now();
  r.expires = r.made + options_.reservation_timeout;
  if (const uint32_t slot = SlotOf(node); slot != kNoSlot && info_[slot].memory) {
    for (const PlacedUnits& p : info_[slot].memory->pods) {
      if (p.ns == pod.ns && p.name == pod.name) r.name_listed_before = true;
    }
  }
  reservations_[node].push_back(std::move(r));
  SyncReservedLocked(node);
  return v.assignments;
}

void ClusterView::Unreserve(const std::string& uid, const std::string& node) {
  std::unique_lock l(mu_);
  auto it = reservations_.find(node);
  if (it == reservations_.end()) return;
  auto& list = it->second;
  list.erase(
      std::remove_if(list.begin(), list.end(), [&](const Reservation& r) { return r.uid == uid; }),
      list.end());
  if (list.empty()) {
    reservations_.erase(it);
    SyncReservedLocked(node);
  }
}

ViewStats ClusterView::stats() const {
  std::shared_lock l(mu_);
  ViewStats s;
  const Clock::TimePoint now = clock_.Now();
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& e = slots_[i];
    if (info_[i].node.empty()) continue;  // free
    ++s.objects;
    if (!e.ok) {
      ++s.malformed;
      continue;
    }
    if (now - e.changed_at > e.stale_after) ++s.stale;
  }
  for (const auto& [node, list] : reservations_) {
    for (const Reservation& r : list) {
      if (r.expires <= now) continue;
      ++s.reservations;
      for (const Assignment& a : r.assignments) s.reserved_units += a.units;
    }
  }
  return s;
}

std::string ClusterView::ObjectVersion(const std::string& node) const {
  std::shared_lock l(mu_);
  const uint32_t slot = SlotOf(node);
  return slot == kNoSlot ? "" : info_[slot].resource_version;
}

}  // namespace gpulet::extender
