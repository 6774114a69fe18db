#include "extender/view.h"

#include <algorithm>
#include <cmath>
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

int64_t PodRequest::total() const {
  int64_t t = 0;
  for (const ContainerUnits& c : containers) t += c.units;
  return t;
}

Result<int64_t> ParseUnits(const json& q) {
  if (q.is_number_unsigned() || q.is_number_integer()) {
    const int64_t v = q.get<int64_t>();
    if (v >= 0) return v;
  } else if (q.is_string()) {
    const std::string s = q.get<std::string>();
    if (!s.empty() && s.size() <= 15 && std::all_of(s.begin(), s.end(), ::isdigit)) {
      return static_cast<int64_t>(std::stoll(s));
    }
  }
  return Status(ErrorCode::kInvalidInput, "must be a whole number of units, got " + Describe(q));
}

Result<PodRequest> ParsePodRequest(const json& pod) {
  if (!pod.is_object()) return Status(ErrorCode::kInvalidInput, "Pod: must be an object");
  PodRequest r;
  const json meta = pod.value("metadata", json::object());
  if (meta.is_object()) {
    r.ns = meta.value("namespace", "");
    r.name = meta.value("name", "");
    r.uid = meta.value("uid", "");
  }
  if (r.ns.empty()) r.ns = "default";
  const json spec = pod.value("spec", json::object());
  for (const char* list : {"initContainers", "containers"}) {
    if (!spec.is_object() || !spec.contains(list) || !spec[list].is_array()) continue;
    const json& containers = spec[list];
    for (size_t i = 0; i < containers.size(); ++i) {
      const json& c = containers[i];
      if (!c.is_object()) continue;
      const std::string cname = c.value("name", "");
      const std::string where =
          std::string("spec.") + list + "[" + std::to_string(i) + "] (" + cname + ")";
      const json res = c.value("resources", json::object());
      if (!res.is_object()) continue;
      // Extended resources: requests equal limits; a limit alone sets the request.
      std::map<std::string, std::pair<json, std::string>> asked;
      for (const char* field : {"limits", "requests"}) {
        if (!res.contains(field) || !res[field].is_object()) continue;
        for (const auto& [name, q] : res[field].items()) {
          if (name.rfind(kMemoryResourcePrefix, 0) == 0) asked[name] = {q, field};
        }
      }
      for (const auto& [name, q] : asked) {
        auto units = ParseUnits(q.first);
        if (!units.ok()) {
          return Status(ErrorCode::kInvalidInput, where + ": resources." + q.second + "[\"" + name +
                                                      "\"]: " + units.status().message());
        }
        if (*units == 0) continue;
        if (!r.resource.empty() && r.resource != name) {
          return Status(ErrorCode::kInvalidInput, where + ": asks for both " + r.resource +
                                                      " and " + name +
                                                      "; a pod may use one memory resource");
        }
        r.resource = name;
        (std::string(list) == "containers" ? r.containers : r.init_containers)
            .push_back({cname, *units});
      }
    }
  }
  return r;
}

Result<Policy> ParsePolicy(const std::string& name) {
  if (name == "bestfit" || name == "best-fit") return Policy::kBestFit;
  if (name == "spread") return Policy::kSpread;
  return Status(ErrorCode::kUsage, "--policy: must be bestfit or spread, got \"" + name + "\"");
}

ClusterView::ClusterView(const Clock& clock, ViewOptions options)
    : clock_(clock), options_(std::move(options)) {}

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
  ++version_;  // invalidates the filter memos
  Entry& e = objects_[node];
  if (e.resource_version != rv || e.object_name != name) e.changed_at = clock_.Now();
  e.object_name = name;
  e.resource_version = rv;
  e.memory = std::move(memory);
  e.error = std::move(error);
  e.largest_free = 0;
  e.healthy_total = 0;
  std::vector<Entry::Units> units;
  if (e.memory) {
    e.stale_after = options_.stale_after.count() > 0
                        ? options_.stale_after
                        : Clock::Duration(std::chrono::seconds(3 * e.memory->heartbeat_seconds));
    auto r = std::find(resources_.begin(), resources_.end(), e.memory->resource);
    if (r == resources_.end()) r = resources_.insert(r, e.memory->resource);
    e.resource = static_cast<size_t>(r - resources_.begin());
    units.reserve(e.memory->gpus.size());
    for (const GpuMemory& g : e.memory->gpus) {
      units.push_back({g.healthy ? g.free_units : 0, g.total_units});
      if (g.healthy) e.largest_free = std::max(e.largest_free, g.free_units);
      if (g.healthy) e.healthy_total += g.total_units;
    }
  }
  e.units.Assign(units);
  object_nodes_[name] = node;
  if (e.memory) DropListedReservations(node, *e.memory);
  PurgeExpiredLocked();
}

void ClusterView::RemoveObject(const std::string& configmap_name) {
  std::unique_lock l(mu_);
  ++version_;  // invalidates the filter memos
  auto it = object_nodes_.find(configmap_name);
  if (it == object_nodes_.end()) return;
  auto obj = objects_.find(it->second);
  if (obj != objects_.end() && obj->second.object_name == configmap_name) objects_.erase(obj);
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
  ++version_;  // invalidates the filter memos
  nodes_known_ = true;
  nodes_[name] = info;
}

void ClusterView::RemoveNode(const std::string& name) {
  std::unique_lock l(mu_);
  ++version_;  // invalidates the filter memos
  nodes_.erase(name);
  reservations_.erase(name);
}

void ClusterView::ReplaceNodes(const std::vector<json>& nodes) {
  std::set<std::string> names;
  for (const json& n : nodes) {
    UpsertNode(n);
    if (n.contains("metadata")) names.insert(n["metadata"].value("name", ""));
  }
  std::unique_lock l(mu_);
  ++version_;  // invalidates the filter memos
  nodes_known_ = true;
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    if (names.count(it->first)) {
      ++it;
    } else {
      reservations_.erase(it->first);
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
                            [&](const Reservation& r) { return listed.count(r.pod_key) > 0; }),
             list.end());
  if (list.empty()) reservations_.erase(it);
}

void ClusterView::PurgeExpiredLocked() {
  const Clock::TimePoint now = clock_.Now();
  for (auto it = reservations_.begin(); it != reservations_.end();) {
    auto& list = it->second;
    list.erase(std::remove_if(list.begin(), list.end(),
                              [&](const Reservation& r) { return r.expires <= now; }),
               list.end());
    it = list.empty() ? reservations_.erase(it) : std::next(it);
  }
}

ClusterView::EvalContext ClusterView::Context(const PodRequest& pod, bool assignments,
                                              bool score) const {
  EvalContext ctx;
  ctx.now = clock_.Now();
  ctx.pod_key = pod.key();
  ctx.assignments = assignments;
  ctx.score = score;
  return ctx;
}

NodeVerdict ClusterView::Evaluate(const PodRequest& pod, const std::string& node) const {
  const EvalContext ctx = Context(pod, true, true);
  std::shared_lock l(mu_);
  return EvaluateLocked(pod, node, ctx);
}

NodeVerdict ClusterView::EvaluateLocked(const PodRequest& pod, const std::string& node,
                                        const EvalContext& ctx, const Objects::value_type* hint,
                                        const Objects::value_type** found) const {
  const bool assignments = ctx.assignments;
  NodeVerdict v;
  if (pod.resource.empty() || (pod.containers.empty() && pod.init_containers.empty())) {
    v.fits = true;  // not ours to judge
    v.score = 0;
    return v;
  }
  auto unresolvable = [&](std::string reason) {
    v.unresolvable = true;
    v.reason = std::move(reason);
    return v;
  };
  const Objects::value_type* obj = hint;
  if (obj == nullptr) {
    auto it = objects_.find(node);
    if (it != objects_.end()) obj = &*it;
  }
  if (found) *found = obj;
  if (obj == nullptr) {
    if (nodes_known_) {
      auto n = nodes_.find(node);
      if (n != nodes_.end() && !n->second.pool_label) {
        return unresolvable("node has no gpulet GPU memory pool (no " +
                            std::string(kNodePoolLabel) + "=true label, no " + kObjectPrefix +
                            node + " object)");
      }
    }
    return unresolvable("no GPU memory object configmaps/" + options_.ns + "/" + kObjectPrefix +
                        node + " (is gpulet's node agent running there with a memory pool?)");
  }
  const Entry& e = obj->second;
  if (!e.memory) return unresolvable("GPU memory object is malformed: " + e.error);
  const NodeMemory& m = *e.memory;
  const Clock::Duration stale_after = e.stale_after;
  const Clock::Duration age = ctx.now - e.changed_at;
  if (age > stale_after) {
    return unresolvable(
        "GPU memory object is stale: configmaps/" + options_.ns + "/" + e.object_name +
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
    return unresolvable("node's GPU memory pool is " + m.resource + ", the pod asks for " +
                        pod.resource);
  }
  // Free units per GPU after reservations (expired ones no longer count).
  // Scratch reused by this thread: filter evaluates thousands of nodes per request.
  thread_local std::vector<int64_t> free;
  thread_local std::vector<size_t> used;
  free.assign(m.gpus.size(), 0);
  used.clear();
  for (size_t i = 0; i < m.gpus.size(); ++i) free[i] = e.units[i].free;
  const Clock::TimePoint now = ctx.now;
  if (reservations_.empty()) {
    // Fast path (filter on a fleet without pending binds): one container, no init containers.
    if (!ctx.score && !assignments && pod.init_containers.empty() && pod.containers.size() == 1 &&
        e.largest_free >= pod.containers[0].units) {
      v.fits = true;
      return v;
    }
  } else if (auto r = reservations_.find(node); r != reservations_.end()) {
    for (const Reservation& res : r->second) {
      if (res.expires <= now || res.pod_key == ctx.pod_key) continue;
      for (const Assignment& a : res.assignments) {
        for (size_t g = 0; g < m.gpus.size(); ++g) {
          if (m.gpus[g].uuid == a.gpu) free[g] = std::max<int64_t>(0, free[g] - a.units);
        }
      }
    }
  }
  auto pick = [&](int64_t need) -> std::optional<size_t> {
    std::optional<size_t> best;
    for (size_t i = 0; i < free.size(); ++i) {
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
    for (size_t i = 1; i < free.size(); ++i) {
      if (free[i] > free[best]) best = i;
    }
    return best;
  };
  auto no_fit = [&](const ContainerUnits& c, bool after_earlier, const char* kind) {
    v.reason = std::string(kind) + " \"" + c.name + "\" needs " + Units(c.units) + " of " +
               pod.resource + " on one GPU; ";
    if (m.gpus.empty()) {
      v.reason += "the node publishes no GPUs";
      return v;
    }
    const size_t g = largest();
    v.reason += "the largest free GPU has " + Units(free[g]) + " (GPU " +
                std::to_string(m.gpus[g].index) + ", " + std::to_string(m.gpus[g].total_units) +
                " total" + (m.gpus[g].healthy ? "" : ", unhealthy") + ")";
    if (after_earlier) v.reason += " after this pod's earlier containers";
    return v;
  };
  // Init containers run one at a time before the app containers, and their units are reused by
  // them: each must fit on its own.
  for (const ContainerUnits& c : pod.init_containers) {
    if (!pick(c.units)) return no_fit(c, false, "init container");
  }
  for (size_t k = 0; k < pod.containers.size(); ++k) {
    const ContainerUnits& c = pod.containers[k];
    auto g = pick(c.units);
    if (!g) return no_fit(c, k > 0, "container");
    free[*g] -= c.units;
    if (std::find(used.begin(), used.end(), *g) == used.end()) used.push_back(*g);
    if (assignments) v.assignments.push_back({c.name, m.gpus[*g].uuid, c.units});
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
  for (size_t i = 0; i < free.size(); ++i) node_free += free[i];
  const int64_t node_total = e.healthy_total;
  const double node_left =
      node_total > 0 ? static_cast<double>(node_free) / static_cast<double>(node_total) : 0;
  const double left = 0.8 * gpu_left + 0.2 * node_left;
  const double s = options_.policy == Policy::kBestFit ? 1.0 - left : left;
  v.score =
      std::clamp(static_cast<int>(std::lround(s * kMaxExtenderPriority)), 0, kMaxExtenderPriority);
  return v;
}

FilterOutcome ClusterView::Filter(const PodRequest& pod, const std::vector<std::string>& nodes,
                                  std::vector<size_t>* passed_index) const {
  FilterOutcome out;
  if (passed_index) {
    passed_index->clear();
    passed_index->reserve(nodes.size());
  } else {
    out.passed.reserve(nodes.size());
  }
  const EvalContext ctx = Context(pod, /*assignments=*/false, /*score=*/false);
  // What prioritize can reuse: the objects of the nodes that passed, found once here.
  const bool memo = !pod.uid.empty() && !pod.resource.empty();
  std::vector<const Objects::value_type*> found_objects;
  if (memo) found_objects.reserve(nodes.size());
  std::shared_lock l(mu_);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::string& n = nodes[i];
    const Objects::value_type* found = nullptr;
    NodeVerdict v = EvaluateLocked(pod, n, ctx, nullptr, &found);
    if (v.fits) {
      if (memo) found_objects.push_back(found);
      if (passed_index) {
        passed_index->push_back(i);
      } else {
        out.passed.push_back(n);
      }
    } else if (v.unresolvable) {
      out.unresolvable.emplace(n, std::move(v.reason));
    } else {
      out.failed.emplace(n, std::move(v.reason));
    }
  }
  if (memo) {
    FilterMemo m;
    m.uid = pod.uid;
    m.pod_key = ctx.pod_key;
    m.resource = pod.resource;
    for (const ContainerUnits& c : pod.containers) m.units.push_back(c.units);
    m.units.push_back(-1);
    for (const ContainerUnits& c : pod.init_containers) m.units.push_back(c.units);
    m.version = version_;
    m.passed = std::move(found_objects);
    std::lock_guard ml(memo_mu_);
    for (auto it = memos_.begin(); it != memos_.end(); ++it) {
      if (it->uid == m.uid) {
        memos_.erase(it);
        break;
      }
    }
    memos_.push_back(std::move(m));
    if (memos_.size() > kFilterMemos) memos_.pop_front();
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
  std::vector<int> out;
  out.reserve(nodes.size());
  const EvalContext ctx = Context(pod, /*assignments=*/false, /*score=*/true);
  std::shared_lock l(mu_);
  // The filter's lookups, when the view has not changed since: the scheduler sends the nodes that
  // passed, in order. The evaluation itself is redone, at this call's time.
  std::vector<const Objects::value_type*> passed;
  if (!pod.uid.empty() && !pod.resource.empty()) {
    std::lock_guard ml(memo_mu_);
    for (FilterMemo& m : memos_) {
      if (m.uid != pod.uid || m.version != version_ || m.pod_key != ctx.pod_key ||
          m.resource != pod.resource)
        continue;
      std::vector<int64_t> units;
      for (const ContainerUnits& c : pod.containers) units.push_back(c.units);
      units.push_back(-1);
      for (const ContainerUnits& c : pod.init_containers) units.push_back(c.units);
      if (units == m.units) passed = m.passed;
      break;
    }
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::string& n = nodes[i];
    const Objects::value_type* hint =
        i < passed.size() && passed[i] != nullptr && passed[i]->first == n ? passed[i] : nullptr;
    NodeVerdict v = EvaluateLocked(pod, n, ctx, hint);
    out.push_back(v.fits ? v.score : 0);
  }
  return out;
}

Result<std::vector<Assignment>> ClusterView::Reserve(const PodRequest& pod, const std::string& node,
                                                     bool* already) {
  std::unique_lock l(mu_);
  ++version_;  // invalidates the filter memos
  PurgeExpiredLocked();
  if (already) *already = false;
  if (auto it = reservations_.find(node); it != reservations_.end()) {
    for (const Reservation& r : it->second) {
      if (r.pod_key != pod.key()) continue;
      if (already) *already = true;
      return r.assignments;
    }
  }
  NodeVerdict v = EvaluateLocked(pod, node, Context(pod, true, true));
  if (!v.fits) {
    return Status(ErrorCode::kUnavailable,
                  "pod " + pod.key() + " no longer fits on node " + node + ": " + v.reason);
  }
  if (v.assignments.empty()) return v.assignments;  // nothing of ours to hold
  reservations_[node].push_back(
      {pod.key(), v.assignments, clock_.Now() + options_.reservation_timeout});
  return v.assignments;
}

void ClusterView::Unreserve(const std::string& pod_key, const std::string& node) {
  std::unique_lock l(mu_);
  ++version_;  // invalidates the filter memos
  auto it = reservations_.find(node);
  if (it == reservations_.end()) return;
  auto& list = it->second;
  list.erase(std::remove_if(list.begin(), list.end(),
                            [&](const Reservation& r) { return r.pod_key == pod_key; }),
             list.end());
  if (list.empty()) reservations_.erase(it);
}

ViewStats ClusterView::stats() const {
  std::shared_lock l(mu_);
  ViewStats s;
  const Clock::TimePoint now = clock_.Now();
  s.objects = objects_.size();
  for (const auto& [node, e] : objects_) {
    if (!e.memory) {
      ++s.malformed;
      continue;
    }
    const Clock::Duration stale_after = options_.stale_after.count() > 0
                                            ? options_.stale_after
                                            : std::chrono::seconds(3 * e.memory->heartbeat_seconds);
    if (now - e.changed_at > stale_after) ++s.stale;
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

}  // namespace gpulet::extender

namespace gpulet::extender {

std::string ClusterView::ObjectVersion(const std::string& node) const {
  std::shared_lock l(mu_);
  auto it = objects_.find(node);
  return it == objects_.end() ? "" : it->second.resource_version;
}

}  // namespace gpulet::extender
