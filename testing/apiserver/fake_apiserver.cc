#include "apiserver/fake_apiserver.h"

#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

namespace gpulet::testing {

namespace {

Status RunOpenssl(const std::string& args) {
  const std::string cmd = "openssl " + args + " >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    return {ErrorCode::kInternal, "openssl failed: " + cmd};
  }
  return {};
}

// A Failure Status; an empty reason is left out, as Go's omitempty does (the eviction's "more
// than one PodDisruptionBudget" has none).
nlohmann::json StatusBody(int code, const std::string& reason, const std::string& message) {
  nlohmann::json body = {{"kind", "Status"},    {"apiVersion", "v1"},
                         {"metadata", nlohmann::json::object()},
                         {"status", "Failure"}, {"message", message}};
  if (!reason.empty()) body["reason"] = reason;
  body["code"] = code;
  return body;
}

// A Success Status: what a binding or an eviction answers (code 201), and a DELETE of an object
// whose registry does not return it (no code, the object named in details).
nlohmann::json SuccessBody(std::optional<int> code, std::optional<nlohmann::json> details = {}) {
  nlohmann::json body = {{"kind", "Status"},
                         {"apiVersion", "v1"},
                         {"metadata", nlohmann::json::object()},
                         {"status", "Success"}};
  if (code) body["code"] = *code;
  if (details) body["details"] = std::move(*details);
  return body;
}

void Fail(httplib::Response& res, int code, const std::string& reason, const std::string& message,
          std::optional<nlohmann::json> details = std::nullopt) {
  res.status = code;
  nlohmann::json body = StatusBody(code, reason, message);
  if (details) body["details"] = std::move(*details);
  res.set_content(body.dump(), "application/json");
}

std::vector<std::string> Segments(const std::string& path) {
  std::vector<std::string> out;
  std::stringstream ss(path);
  std::string seg;
  while (std::getline(ss, seg, '/')) {
    if (!seg.empty()) out.push_back(seg);
  }
  return out;
}

// What an object path names: /api/v1/[namespaces/NS/]RES/NAME, /apis/G/V/[namespaces/NS/]RES/NAME
// (a trailing /status is the object's). The API server's errors name an object by `resource`
// (with `.group` outside the core group) and carry the same in the Status details
// (staging/src/k8s.io/apimachinery/pkg/api/errors/errors.go, NewNotFound, NewAlreadyExists,
// NewConflict).
struct ObjectName {
  std::string group, version, resource, ns, name;
  std::string Qualified() const { return group.empty() ? resource : resource + "." + group; }
  nlohmann::json Details(const std::string& kind = "") const {
    nlohmann::json d = {{"name", name}, {"kind", kind.empty() ? resource : kind}};
    if (!group.empty()) d["group"] = group;
    return d;
  }
};

ObjectName NameOf(const std::string& path) {
  std::vector<std::string> s = Segments(path);
  ObjectName n;
  if (s.size() >= 2 && s.back() == "status") s.pop_back();
  size_t at = 0;
  if (!s.empty() && s[0] == "api" && s.size() >= 2) {
    n.version = s[1];
    at = 2;
  } else if (!s.empty() && s[0] == "apis" && s.size() >= 3) {
    n.group = s[1];
    n.version = s[2];
    at = 3;
  }
  if (s.size() > at + 2 && s[at] == "namespaces") {
    n.ns = s[at + 1];
    at += 2;
  }
  if (s.size() > at) n.resource = s[at];
  if (s.size() > at + 1) n.name = s[at + 1];
  return n;
}

void NotFound(httplib::Response& res, const ObjectName& n) {
  Fail(res, 404, "NotFound", n.Qualified() + " \"" + n.name + "\" not found", n.Details());
}

void Conflict(httplib::Response& res, const ObjectName& n) {
  Fail(res, 409, "Conflict",
       "Operation cannot be fulfilled on " + n.Qualified() + " \"" + n.name +
           "\": the object has been modified; please apply your changes to the latest version "
           "and try again",
       n.Details());
}

// A 422 Invalid naming the object by its kind and the field in `bad` ("field: Reason: …"), as
// validation errors are (errors.go, NewInvalid): "<Kind>[.<group>] \"NAME\" is invalid: <bad>",
// with the field and its cause's reason in the details.
void Invalid(httplib::Response& res, const std::string& kind, const ObjectName& n,
             const std::string& bad) {
  const size_t colon = bad.find(": ");
  const std::string field = bad.substr(0, colon);
  const std::string rest = colon == std::string::npos ? "" : bad.substr(colon + 2);
  std::string reason = "FieldValueInvalid";
  for (const auto& [words, r] : std::vector<std::pair<std::string, std::string>>{
           {"Required value", "FieldValueRequired"}, {"Too many", "FieldValueTooMany"},
           {"Duplicate value", "FieldValueDuplicate"}, {"Too long", "FieldValueTooLong"}}) {
    if (rest.rfind(words, 0) == 0) reason = r;
  }
  nlohmann::json details = n.Details(kind);
  if (n.name.empty()) details.erase("name");
  details["causes"] =
      nlohmann::json::array({{{"reason", reason}, {"message", rest}, {"field", field}}});
  Fail(res, 422, "Invalid",
       (n.group.empty() ? kind : kind + "." + n.group) + " \"" + n.name + "\" is invalid: " + bad,
       std::move(details));
}

// The kind of a resource ("configmaps" → "ConfigMap") for the resources the tests use; "" for
// another.
std::string KindOfResource(const std::string& resource) {
  static const std::map<std::string, std::string> kinds = {
      {"pods", "Pod"},
      {"nodes", "Node"},
      {"namespaces", "Namespace"},
      {"configmaps", "ConfigMap"},
      {"leases", "Lease"},
      {"statefulsets", "StatefulSet"},
      {"deployments", "Deployment"},
      {"poddisruptionbudgets", "PodDisruptionBudget"},
      {"resourceslices", "ResourceSlice"},
      {"resourceclaims", "ResourceClaim"},
      {"deviceclasses", "DeviceClass"}};
  auto it = kinds.find(resource);
  return it == kinds.end() ? "" : it->second;
}

// Resources whose objects carry metadata.generation, moved on by every change of their spec
// (the registries' PrepareForCreate/PrepareForUpdate); a ConfigMap, Lease, Node or Namespace has
// none.
bool HasGeneration(const std::string& resource) {
  static const std::set<std::string> with = {"pods",           "statefulsets",
                                             "deployments",    "poddisruptionbudgets",
                                             "resourceslices", "resourceclaims",
                                             "deviceclasses"};
  return with.count(resource) > 0;
}

// Resources served with a status subresource: a write through the main path keeps the stored
// status (their strategies' PrepareForUpdate), only /status changes it.
bool HasStatusSubresource(const std::string& resource) {
  static const std::set<std::string> with = {"pods",         "nodes",       "namespaces",
                                             "statefulsets", "deployments", "poddisruptionbudgets",
                                             "resourceclaims"};
  return with.count(resource) > 0;
}

// Resources whose DELETE answers with the object's last state; every other answers a Success
// Status naming it (registry/store.go, ReturnDeletedObject: seen on kube-apiserver 1.37 for pods,
// namespaces, resourceclaims and resourceslices; not for configmaps, leases, nodes, PDBs,
// statefulsets).
bool DeleteReturnsObject(const std::string& resource) {
  return resource == "pods" || resource == "namespaces" || resource == "resourceclaims" ||
         resource == "resourceslices";
}

// The field selectors a resource supports (its registry's GetAttrs / field label conversion);
// every resource has metadata.name and metadata.namespace. Returns the 400 message for the first
// field it does not support, empty when all are.
std::string UnsupportedField(const ObjectName& n, const std::string& selector) {
  static const std::map<std::string, std::set<std::string>> extra = {
      {"pods",
       {"spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
        "spec.hostNetwork", "status.phase", "status.podIP", "status.podIPs",
        "status.nominatedNodeName"}},
      {"nodes", {"spec.unschedulable"}},
      {"namespaces", {"status.phase"}},
      {"resourceslices", {"spec.nodeName", "spec.driver", "spec.pool.name"}}};
  std::stringstream ss(selector);
  std::string term;
  while (std::getline(ss, term, ',')) {
    const std::string field = term.substr(0, term.find_first_of("!="));
    if (field.empty() || field == "metadata.name" || field == "metadata.namespace") continue;
    auto it = extra.find(n.resource);
    if (it != extra.end() && it->second.count(field)) continue;
    if (it == extra.end()) {
      return "\"" + field + "\" is not a known field selector: only \"metadata.name\", "
             "\"metadata.namespace\"";
    }
    if (n.resource == "resourceslices") {
      return "field label not supported for " + n.group + "/" + n.version +
             ", Kind=ResourceSlice: " + field;
    }
    return "field label not supported: " + field;
  }
  return "";
}

// A DNS subdomain (RFC 1123): what an object's name must be.
bool IsDnsSubdomain(const std::string& v) {
  if (v.empty() || v.size() > 253) return false;
  std::stringstream ss(v);
  std::string label;
  size_t labels = 0;
  while (std::getline(ss, label, '.')) {
    ++labels;
    if (label.empty()) return false;
    for (char c : label) {
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
    }
    if (label.front() == '-' || label.back() == '-') return false;
  }
  return labels > 0 && v.back() != '.';
}

// A collection path: /api/v1/RES, /api/v1/namespaces/NS/RES, /apis/G/V/RES,
// /apis/G/V/namespaces/NS/RES.
bool IsCollection(const std::string& path) {
  const std::vector<std::string> s = Segments(path);
  if (s.size() >= 2 && s[0] == "api") return s.size() == 3 || (s.size() == 5 && s[2] == "namespaces");
  if (s.size() >= 3 && s[0] == "apis") return s.size() == 4 || (s.size() == 6 && s[3] == "namespaces");
  return false;
}

// Whether `object_path` is an item of `collection` (cluster-wide lists of namespaced resources
// span every namespace).
bool InCollection(const std::string& collection, const std::string& object_path) {
  const std::vector<std::string> c = Segments(collection), o = Segments(object_path);
  if (o.size() == c.size() + 1) {
    return std::equal(c.begin(), c.end(), o.begin());
  }
  const size_t group = c[0] == "api" ? 2 : 3;  // segments before the resource
  if (c.size() == group + 1 && o.size() == group + 4 && o[group] == "namespaces") {
    return std::equal(c.begin(), c.begin() + group, o.begin()) && o[group + 2] == c[group];
  }
  return false;
}

// The value at a dotted path ("spec.nodeName") as a string; "" when absent.
std::string FieldValue(const nlohmann::json& obj, const std::string& dotted) {
  const nlohmann::json* cur = &obj;
  std::stringstream ss(dotted);
  std::string key;
  while (std::getline(ss, key, '.')) {
    if (!cur->is_object() || !cur->contains(key)) return "";
    cur = &(*cur)[key];
  }
  if (cur->is_string()) return cur->get<std::string>();
  if (cur->is_boolean()) return cur->get<bool>() ? "true" : "false";
  if (cur->is_number()) return cur->dump();
  return "";
}

// "a=b,c!=d,e" against a getter; `exists` decides bare keys (label selectors only).
bool Selects(const std::string& selector,
             const std::function<std::optional<std::string>(const std::string&)>& get) {
  std::stringstream ss(selector);
  std::string term;
  while (std::getline(ss, term, ',')) {
    if (term.empty()) continue;
    const size_t ne = term.find("!=");
    const size_t eq = term.find('=');
    if (ne != std::string::npos) {
      auto v = get(term.substr(0, ne));
      if (v && *v == term.substr(ne + 2)) return false;
    } else if (eq != std::string::npos) {
      const size_t vstart = term.compare(eq, 2, "==") == 0 ? eq + 2 : eq + 1;
      auto v = get(term.substr(0, eq));
      if (!v || *v != term.substr(vstart)) return false;
    } else if (!get(term)) {
      return false;
    }
  }
  return true;
}

bool Matches(const nlohmann::json& obj, const std::string& field_selector,
             const std::string& label_selector) {
  const bool fields = Selects(field_selector, [&](const std::string& k) -> std::optional<std::string> {
    return FieldValue(obj, k);
  });
  if (!fields) return false;
  return Selects(label_selector, [&](const std::string& k) -> std::optional<std::string> {
    const nlohmann::json labels =
        obj.contains("metadata") ? obj["metadata"].value("labels", nlohmann::json::object())
                                 : nlohmann::json::object();
    if (!labels.contains(k) || !labels[k].is_string()) return std::nullopt;
    return labels[k].get<std::string>();
  });
}

std::string Rfc3339(std::chrono::system_clock::time_point t) {
  const std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// A label selector object (matchLabels and matchExpressions) against `labels`. A selector that
// is absent selects nothing and an empty one selects everything
// (staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/helpers.go, LabelSelectorAsSelector).
bool SelectorMatches(const nlohmann::json* selector, const nlohmann::json& labels) {
  if (selector == nullptr || selector->is_null()) return false;
  auto label = [&](const std::string& k) -> std::optional<std::string> {
    if (!labels.is_object() || !labels.contains(k) || !labels[k].is_string()) return std::nullopt;
    return labels[k].get<std::string>();
  };
  static const nlohmann::json kNone = nlohmann::json::object();
  const nlohmann::json& match_labels =
      selector->contains("matchLabels") ? (*selector)["matchLabels"] : kNone;
  if (match_labels.is_object()) {
    for (auto it = match_labels.begin(); it != match_labels.end(); ++it) {
      if (!it->is_string() || label(it.key()) != it->get<std::string>()) return false;
    }
  }
  const nlohmann::json& expressions =
      selector->contains("matchExpressions") ? (*selector)["matchExpressions"] : kNone;
  for (size_t x = 0; expressions.is_array() && x < expressions.size(); ++x) {
    const nlohmann::json& e = expressions[x];
    const std::optional<std::string> have = label(e.value("key", ""));
    const std::string op = e.value("operator", "");
    bool in = false;
    const nlohmann::json values = e.contains("values") ? e["values"] : nlohmann::json::array();
    for (size_t i = 0; values.is_array() && i < values.size(); ++i) {
      if (have && values[i].is_string() && values[i].get<std::string>() == *have) in = true;
    }
    if ((op == "In" && !in) || (op == "NotIn" && in) || (op == "Exists" && !have) ||
        (op == "DoesNotExist" && have)) {
      return false;
    }
  }
  return true;
}

// Whether a strategic-merge patch holds anything where strategic merge and JSON merge differ:
// a list (merged by its patchMergeKey, not replaced) or a $-directive. The stand-in refuses those
// rather than guess (staging/src/k8s.io/apimachinery/pkg/util/strategicpatch/patch.go).
bool NeedsStrategicMerge(const nlohmann::json& patch) {
  if (patch.is_array()) return true;
  if (!patch.is_object()) return false;
  for (const auto& [k, v] : patch.items()) {
    if (!k.empty() && k[0] == '$') return true;
    if (NeedsStrategicMerge(v)) return true;
  }
  return false;
}

std::string PodPhase(const nlohmann::json& pod) {
  return pod.contains("status") && pod["status"].is_object() ? pod["status"].value("phase", "")
                                                             : "";
}

bool HasDeletionTimestamp(const nlohmann::json& obj) {
  return obj.contains("metadata") && obj["metadata"].contains("deletionTimestamp") &&
         !obj["metadata"]["deletionTimestamp"].is_null();
}

// Sets condition `type` in status.conditions (replacing one of the same type).
void SetCondition(nlohmann::json& pod, nlohmann::json condition) {
  nlohmann::json& conds = pod["status"]["conditions"];
  if (!conds.is_array()) conds = nlohmann::json::array();
  for (nlohmann::json& c : conds) {
    if (c.value("type", "") == condition.value("type", "")) {
      c = std::move(condition);
      return;
    }
  }
  conds.push_back(std::move(condition));
}

// resource.k8s.io/v1 resourceclaims: the one resource here served with a status subresource
// whose main-object writes keep the stored status (pkg/registry/resource/resourceclaim/
// strategy.go: PrepareForCreate clears status, PrepareForUpdate keeps the old one; the
// scheduler writes status.allocation through /status).
bool IsResourceClaim(const std::string& path) {
  const std::vector<std::string> s = Segments(path);
  return s.size() == 7 && s[0] == "apis" && s[1] == "resource.k8s.io" && s[5] == "resourceclaims";
}

bool IsResourceSlice(const std::string& path) {
  const std::vector<std::string> s = Segments(path);
  return s.size() == 5 && s[0] == "apis" && s[1] == "resource.k8s.io" && s[3] == "resourceslices";
}

// A DNS label (RFC 1123): what a device name must be.
bool IsDnsLabel(const std::string& v) {
  if (v.empty() || v.size() > 63) return false;
  for (char c : v) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return v.front() != '-' && v.back() != '-';
}

// A qualified attribute or capacity name: "<domain>/<id>" or "<id>"; the domain at most 63
// characters, the id a C identifier of at most 32.
bool IsQualifiedName(const std::string& v) {
  const size_t slash = v.find('/');
  const std::string id = slash == std::string::npos ? v : v.substr(slash + 1);
  if (slash != std::string::npos && (slash == 0 || slash > 63)) return false;
  if (id.empty() || id.size() > 32) return false;
  if (!std::isalpha(static_cast<unsigned char>(id[0]))) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

// The validation of a resource.k8s.io/v1 ResourceSlice that gpulet's publisher could trip
// (pkg/apis/resource/validation/validation.go, validateResourceSliceSpec and
// validateDevice; limits from staging/src/k8s.io/api/resource/v1/types.go): driver and pool
// required, exactly one node selection, devices or sharedCounters but not both (1.35+), at most
// 128 devices (64 when any uses taints or counters), 8 counter sets of 32 counters, per device a
// DNS-label name, 32 attributes+capacities, 2 consumesCounters of 32 counters, 16 taints and
// string values of at most 64 characters; on update the driver and nodeName are immutable.
// Returns the first error as "field: reason", empty when valid.
std::string ValidateResourceSlice(const nlohmann::json& slice, const nlohmann::json* old) {
  if (!slice.contains("spec") || !slice["spec"].is_object()) return "spec: Required value";
  const nlohmann::json& spec = slice["spec"];
  if (!spec.contains("driver") || !spec["driver"].is_string() ||
      spec["driver"].get<std::string>().empty() || spec["driver"].get<std::string>().size() > 63) {
    return "spec.driver: Required value (a DNS subdomain of at most 63 characters)";
  }
  if (!spec.contains("pool") || !spec["pool"].is_object() ||
      spec["pool"].value("name", "").empty()) {
    return "spec.pool.name: Required value";
  }
  if (!spec["pool"].contains("resourceSliceCount") ||
      !spec["pool"]["resourceSliceCount"].is_number_integer() ||
      spec["pool"]["resourceSliceCount"].get<int64_t>() < 1) {
    return "spec.pool.resourceSliceCount: must be greater than zero";
  }
  if (spec["pool"].contains("generation") &&
      (!spec["pool"]["generation"].is_number_integer() ||
       spec["pool"]["generation"].get<int64_t>() < 0)) {
    return "spec.pool.generation: must be a non-negative integer";
  }
  int selections = 0;
  if (spec.contains("nodeName") && spec["nodeName"].is_string() &&
      !spec["nodeName"].get<std::string>().empty()) {
    ++selections;
  }
  if (spec.contains("nodeSelector") && !spec["nodeSelector"].is_null()) ++selections;
  if (spec.value("allNodes", false)) ++selections;
  if (spec.value("perDeviceNodeSelection", false)) ++selections;
  if (selections != 1) {
    return "spec: Invalid value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
           "`perDeviceNodeSelection` is required";
  }
  const nlohmann::json devices = spec.value("devices", nlohmann::json::array());
  const nlohmann::json counters = spec.value("sharedCounters", nlohmann::json::array());
  if (!devices.is_array()) return "spec.devices: must be a list";
  if (!counters.is_array()) return "spec.sharedCounters: must be a list";
  if (!devices.empty() && !counters.empty()) {
    return "spec: Invalid value: only one of `devices` or `sharedCounters` may be set";
  }
  if (counters.size() > 8) return "spec.sharedCounters: Too many: must have at most 8 items";
  std::set<std::string> set_names;
  for (size_t i = 0; i < counters.size(); ++i) {
    const std::string f = "spec.sharedCounters[" + std::to_string(i) + "]";
    const std::string name = counters[i].value("name", "");
    if (!IsDnsLabel(name)) return f + ".name: Invalid value: must be a DNS label";
    if (!set_names.insert(name).second) return f + ".name: Duplicate value: \"" + name + "\"";
    const nlohmann::json c = counters[i].value("counters", nlohmann::json::object());
    if (!c.is_object() || c.empty()) return f + ".counters: Required value";
    if (c.size() > 32) return f + ".counters: Too many: must have at most 32 items";
  }
  bool advanced = false;
  for (const nlohmann::json& d : devices) {
    if (d.contains("taints") || d.contains("consumesCounters")) advanced = true;
  }
  const size_t max_devices = advanced ? 64 : 128;
  if (devices.size() > max_devices) {
    return "spec.devices: Too many: must have at most " + std::to_string(max_devices) + " items";
  }
  std::set<std::string> device_names;
  for (size_t i = 0; i < devices.size(); ++i) {
    const nlohmann::json& d = devices[i];
    const std::string f = "spec.devices[" + std::to_string(i) + "]";
    const std::string name = d.value("name", "");
    if (!IsDnsLabel(name)) return f + ".name: Invalid value: must be a DNS label";
    if (!device_names.insert(name).second) return f + ".name: Duplicate value: \"" + name + "\"";
    const nlohmann::json attrs = d.value("attributes", nlohmann::json::object());
    const nlohmann::json caps = d.value("capacity", nlohmann::json::object());
    if (attrs.size() + caps.size() > 32) {
      return f + ": Too many: attributes and capacities must have at most 32 items";
    }
    for (auto it = attrs.begin(); it != attrs.end(); ++it) {
      if (!IsQualifiedName(it.key())) return f + ".attributes: Invalid name \"" + it.key() + "\"";
      if (!it->is_object() || it->size() != 1) {
        return f + ".attributes[" + it.key() + "]: exactly one value must be specified";
      }
      if (it->contains("string") && (*it)["string"].is_string() &&
          (*it)["string"].get<std::string>().size() > 64) {
        return f + ".attributes[" + it.key() + "].string: Too long: may not be more than 64";
      }
    }
    for (auto it = caps.begin(); it != caps.end(); ++it) {
      if (!IsQualifiedName(it.key())) return f + ".capacity: Invalid name \"" + it.key() + "\"";
      if (!it->is_object() || !it->contains("value")) {
        return f + ".capacity[" + it.key() + "].value: Required value";
      }
    }
    const nlohmann::json consumes = d.value("consumesCounters", nlohmann::json::array());
    if (consumes.size() > 2) return f + ".consumesCounters: Too many: must have at most 2 items";
    for (const nlohmann::json& c : consumes) {
      if (c.value("counterSet", "").empty()) return f + ".consumesCounters.counterSet: Required";
      if (c.value("counters", nlohmann::json::object()).size() > 32) {
        return f + ".consumesCounters.counters: Too many: must have at most 32 items";
      }
    }
    if (d.value("taints", nlohmann::json::array()).size() > 16) {
      return f + ".taints: Too many: must have at most 16 items";
    }
  }
  if (old != nullptr && old->contains("spec")) {
    const nlohmann::json& was = (*old)["spec"];
    if (was.value("driver", "") != spec.value("driver", "")) {
      return "spec.driver: Invalid value: field is immutable";
    }
    if (was.value("nodeName", "") != spec.value("nodeName", "")) {
      return "spec.nodeName: Invalid value: field is immutable";
    }
  }
  return "";
}

}  // namespace

Result<TestPki> MakeTestPki(const std::string& dir, const ServerCertNames& names) {
  TestPki p;
  p.ca_cert = dir + "/ca.crt";
  const std::string ca_key = dir + "/ca.key";
  p.server_cert = dir + "/server.crt";
  p.server_key = dir + "/server.key";
  p.client_cert = dir + "/client.crt";
  p.client_key = dir + "/client.key";
  const std::string ext = dir + "/server.ext";
  std::ofstream(ext) << (names.subject_alt_names.empty()
                             ? std::string()
                             : "subjectAltName=" + names.subject_alt_names + "\n")
                      << "extendedKeyUsage=serverAuth\n";
  const std::string client_ext = dir + "/client.ext";
  std::ofstream(client_ext) << "extendedKeyUsage=clientAuth\n";
  for (const std::string& args : {
           "req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=gpulet-test-ca -keyout " + ca_key +
               " -out " + p.ca_cert,
           "req -newkey rsa:2048 -nodes -subj /CN=" + names.common_name + " -keyout " +
               p.server_key + " -out " +
               dir + "/server.csr",
           "x509 -req -days 2 -in " + dir + "/server.csr -CA " + p.ca_cert + " -CAkey " + ca_key +
               " -CAcreateserial -extfile " + ext + " -out " + p.server_cert,
           "req -newkey rsa:2048 -nodes -subj /CN=system:node:gpu-node-1/O=system:nodes -keyout " +
               p.client_key + " -out " + dir + "/client.csr",
           "x509 -req -days 2 -in " + dir + "/client.csr -CA " + p.ca_cert + " -CAkey " + ca_key +
               " -CAcreateserial -extfile " + client_ext + " -out " + p.client_cert,
       }) {
    Status s = RunOpenssl(args);
    if (!s.ok()) return s;
  }
  return p;
}

Result<nlohmann::json> LoadRecorded(const std::string& name) {
  const std::string path = std::string(GPULET_APISERVER_TESTDATA) + "/" + name;
  std::ifstream in(path);
  if (!in) return Status(ErrorCode::kNotFound, "recorded response " + path + " not found");
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded()) return Status(ErrorCode::kInvalidInput, path + ": not JSON");
  return j;
}

struct FakeApiServer::State {
  Options options;
  std::unique_ptr<httplib::SSLServer> server;
  std::thread thread;
  int port = 0;

  mutable std::mutex mu;
  mutable std::condition_variable cv;
  std::map<std::string, nlohmann::json> objects;  // path → object
  struct Event {
    uint64_t version;
    std::string type;
    std::string path;
    nlohmann::json object;
    // The object before this change (MODIFIED, DELETED): a watch with a selector compares both
    // to turn a MODIFIED into ADDED or DELETED, as the watch cache does
    // (staging/src/k8s.io/apiserver/pkg/storage/cacher/cache_watcher.go, convertToWatchEvent).
    std::optional<nlohmann::json> prev;
  };
  std::vector<Event> history;
  uint64_t version = 100;
  uint64_t expired_before = 0;
  bool gone_as_http = false;
  uint64_t break_generation = 0;
  uint64_t close_generation = 0;  // CloseWatches()
  bool stopping = false;
  size_t open_watches = 0;
  std::vector<RecordedRequest> requests;
  uint64_t uid_counter = 0;
  std::vector<WriteFault> faults;
  std::function<void(const RecordedRequest&)> before_write;
  uint64_t bookmark_generation = 0;  // SendBookmarks()
  uint64_t gone_generation = 0;      // ExpireWatches(): 410 in the middle of open streams
  uint64_t error_generation = 0;     // SendWatchError()
  nlohmann::json watch_error;        // the Status of the last SendWatchError()
  // Pods being deleted gracefully: path → when the stand-in kubelet has stopped them.
  std::map<std::string, std::chrono::steady_clock::time_point> deleting;
  std::thread reaper;

  // A control call for the open watch streams (SendBookmarks, ExpireWatches, …): under mu, `set`
  // writes what the streams read with it and `generation` moves on; then every stream wakes.
  template <typename Set>
  void Signal(uint64_t& generation, Set set) {
    std::lock_guard<std::mutex> lock(mu);
    set();
    ++generation;
    cv.notify_all();
  }
  void Signal(uint64_t& generation) {
    Signal(generation, [] {});
  }

  // Caller holds mu.
  uint64_t Record(const std::string& type, const std::string& path, nlohmann::json object) {
    const uint64_t v = ++version;
    std::optional<nlohmann::json> prev;
    if (auto it = objects.find(path); it != objects.end()) prev = it->second;
    if (type != "DELETED") DefaultMetadata(object, prev);
    object["metadata"]["resourceVersion"] = std::to_string(v);
    if (type == "DELETED") {
      objects.erase(path);
      deleting.erase(path);
    } else {
      objects[path] = object;
    }
    history.push_back({v, type, path, std::move(object), std::move(prev)});
    cv.notify_all();
    return v;
  }

  // What the API server fills in on create and keeps on update
  // (staging/src/k8s.io/apiserver/pkg/registry/rest/create.go, FillObjectMetaSystemFields):
  // metadata.uid and creationTimestamp; an update cannot change either.
  void DefaultMetadata(nlohmann::json& object, const std::optional<nlohmann::json>& prev) {
    nlohmann::json& meta = object["metadata"];
    if (prev && prev->contains("metadata")) {
      const nlohmann::json& old = (*prev)["metadata"];
      for (const char* k : {"uid", "creationTimestamp"}) {
        if (old.contains(k) && (!meta.contains(k) || meta[k].is_null())) meta[k] = old[k];
      }
      return;
    }
    if (!meta.contains("uid") || !meta["uid"].is_string() || meta["uid"].get<std::string>().empty()) {
      meta["uid"] = NewUid();
    }
    if (!meta.contains("creationTimestamp") || meta["creationTimestamp"].is_null()) {
      meta["creationTimestamp"] = Rfc3339(std::chrono::system_clock::now());
    }
  }

  std::string NewUid() {
    char buf[40];
    const uint64_t n = ++uid_counter;
    std::snprintf(buf, sizeof buf, "fa4e0000-0000-4000-8000-%012llx",
                  static_cast<unsigned long long>(n));
    return buf;
  }

  bool Authorized(const httplib::Request& req, httplib::Response& res) {
    {
      std::lock_guard<std::mutex> lock(mu);
      requests.push_back({req.method, req.path,
                          req.target.find('?') == std::string::npos
                              ? ""
                              : req.target.substr(req.target.find('?') + 1),
                          req.get_header_value("Content-Type"), req.remote_port});
    }
    if (req.get_header_value("Authorization") == "Bearer " + options.token) return true;
    Fail(res, 401, "Unauthorized", "Unauthorized");
    return false;
  }

  void HandleGet(const httplib::Request& req, httplib::Response& res,
                 const std::shared_ptr<State>& self) {
    if (!Authorized(req, res)) return;
    const std::string watch = req.get_param_value("watch");
    if (watch == "1" || watch == "true") {
      HandleWatch(req, res, self);
      return;
    }
    std::lock_guard<std::mutex> lock(mu);
    auto it = objects.find(req.path);
    if (it == objects.end() && IsCollection(req.path)) {
      HandleList(req, res);
      return;
    }
    if (it == objects.end()) {
      if (auto parent = StatusParent(req.path)) it = objects.find(*parent);
    }
    if (it == objects.end()) {
      NotFound(res, NameOf(req.path));
      return;
    }
    res.set_content(it->second.dump(), "application/json");
  }

  // LIST (caller holds mu), as the registry's List answers (registry/store.go, ListPredicate):
  // a <Kind>List of the group's version whose items carry no kind or apiVersion; a field the
  // resource cannot select on is 400; `limit` pages in key order, with an opaque `continue` for
  // the next page (a token of an earlier page's last key here) and remainingItemCount when no
  // selector narrowed the list.
  void HandleList(const httplib::Request& req, httplib::Response& res) const {
    const ObjectName n = NameOf(req.path + "/-");
    const std::string fields = req.get_param_value("fieldSelector");
    const std::string labels = req.get_param_value("labelSelector");
    if (std::string bad = UnsupportedField(n, fields); !bad.empty()) {
      Fail(res, 400, "BadRequest", bad);
      return;
    }
    const std::string limit_text = req.get_param_value("limit");
    const size_t limit = limit_text.empty() ? 0 : std::strtoull(limit_text.c_str(), nullptr, 10);
    const std::string after = req.get_param_value("continue");
    if (!after.empty() && after.rfind("fake:", 0) != 0) {
      Fail(res, 400, "BadRequest",
           "continue key is not valid: incorrect encoded start resourceVersion (version "
           "meta.k8s.io/v1)");
      return;
    }
    nlohmann::json items = nlohmann::json::array();
    size_t remaining = 0;
    std::string last;
    for (auto o = after.empty() ? objects.begin() : objects.upper_bound(after.substr(5));
         o != objects.end(); ++o) {
      if (!InCollection(req.path, o->first) || !Matches(o->second, fields, labels)) continue;
      if (limit > 0 && items.size() == limit) {
        ++remaining;
        continue;
      }
      nlohmann::json item = o->second;
      item.erase("kind");
      item.erase("apiVersion");
      items.push_back(std::move(item));
      last = o->first;
    }
    nlohmann::json meta = {{"resourceVersion", std::to_string(version)}};
    if (remaining > 0) {
      meta["continue"] = "fake:" + last;
      if (fields.empty() && labels.empty()) meta["remainingItemCount"] = remaining;
    }
    const std::string kind = KindOfResource(n.resource);
    res.set_content(nlohmann::json{{"kind", kind.empty() ? "List" : kind + "List"},
                                   {"apiVersion", n.group.empty() ? n.version
                                                                  : n.group + "/" + n.version},
                                   {"metadata", std::move(meta)},
                                   {"items", std::move(items)}}
                        .dump(),
                    "application/json");
  }

  // The object path of a status subresource ("<object>/status") whose object exists; nullopt for
  // any other path (caller holds mu).
  std::optional<std::string> StatusParent(const std::string& path) const {
    static const std::string kSuffix = "/status";
    if (path.size() <= kSuffix.size() ||
        path.compare(path.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0) {
      return std::nullopt;
    }
    std::string parent = path.substr(0, path.size() - kSuffix.size());
    if (objects.count(parent) == 0 || IsCollection(parent)) return std::nullopt;
    return parent;
  }

  // What a write of `updated` to `path` stores (caller holds mu; `path` exists): through the
  // status subresource only the status changes (ResetObjectMetaForStatus, spec kept); a
  // resourceclaim written through the main path keeps its status. Returns an error for a
  // ResourceSlice the real server would refuse (ValidateResourceSlice), empty when fine.
  std::string Settle(const std::string& path, bool status_write, nlohmann::json& updated) const {
    const nlohmann::json& old = objects.at(path);
    if (status_write) {
      nlohmann::json kept = old;
      if (updated.contains("status")) {
        kept["status"] = updated["status"];
      } else {
        kept.erase("status");
      }
      updated = std::move(kept);
    } else if (HasStatusSubresource(NameOf(path).resource)) {
      if (old.contains("status")) {
        updated["status"] = old["status"];
      } else {
        updated.erase("status");
      }
    }
    if (IsResourceSlice(path)) return ValidateResourceSlice(updated, &old);
    return "";
  }

  // Every write goes through here: authorisation, then the first injected fault that matches
  // (InjectWriteFault), then `apply` (called with mu held).
  void HandleWrite(const httplib::Request& req, httplib::Response& res,
                   const std::function<void(const nlohmann::json& body)>& apply) {
    if (!Authorized(req, res)) return;
    std::optional<WriteFault> fault;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto it = faults.begin(); it != faults.end(); ++it) {
        if ((!it->method.empty() && it->method != req.method) ||
            req.path.rfind(it->path_prefix, 0) != 0) {
          continue;
        }
        fault = *it;
        if (--it->times <= 0) faults.erase(it);
        break;
      }
    }
    if (fault && fault->kind == WriteFault::Kind::kServerError) {
      Fail(res, fault->code, fault->code == 503 ? "ServiceUnavailable" : "InternalError",
           "injected fault");
      return;
    }
    if (fault && fault->kind == WriteFault::Kind::kTooManyRequests) {
      // API priority and fairness answers 429 with Retry-After
      // (staging/src/k8s.io/apiserver/pkg/server/filters/maxinflight.go, tooManyRequests).
      Fail(res, 429, "TooManyRequests", "Too many requests, please try again later.");
      res.set_header("Retry-After", std::to_string(fault->retry_after_seconds));
      return;
    }
    if (fault && fault->kind == WriteFault::Kind::kTimeout) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, fault->delay, [&] { return stopping; });
      lock.unlock();
      // The request timeout filter's answer (staging/src/k8s.io/apiserver/pkg/server/filters/
      // timeout.go): 504 with a Timeout Status; this stand-in writes nothing.
      Fail(res, 504, "Timeout", "the request did not complete within the allowed duration");
      return;
    }
    std::function<void(const RecordedRequest&)> hook;
    {
      std::lock_guard<std::mutex> lock(mu);
      hook = before_write;
    }
    if (hook) {
      hook(RecordedRequest{req.method, req.path, "", req.get_header_value("Content-Type"),
                           req.remote_port});
    }
    nlohmann::json body = nlohmann::json::object();
    if (!req.body.empty()) {
      body = nlohmann::json::parse(req.body, nullptr, false);
      if (body.is_discarded()) {
        Fail(res, 400, "BadRequest", "body is not JSON");
        return;
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      apply(body);
    }
    if (fault && fault->kind == WriteFault::Kind::kLostAnswer && res.status < 300) {
      // The write happened; the answer never arrives: headers, then the connection is cut.
      const size_t length = res.body.size() + 1;
      res.body.clear();
      res.set_content_provider(length, "application/json",
                               [](size_t, size_t, httplib::DataSink&) { return false; });
    }
  }

  void HandlePost(const httplib::Request& req, httplib::Response& res) {
    HandleWrite(req, res, [&](const nlohmann::json& body) {
      if (!body.is_object()) {
        Fail(res, 400, "BadRequest", "body is not a JSON object");
        return;
      }
      const std::vector<std::string> seg = Segments(req.path);
      if (seg.size() >= 3 && seg.back() == "eviction" && seg[seg.size() - 3] == "pods") {
        HandleEviction(req.path, body, res);
        return;
      }
      if (seg.size() >= 3 && seg.back() == "binding" && seg[seg.size() - 3] == "pods") {
        HandleBinding(req.path, body, res);
        return;
      }
      if (!IsCollection(req.path)) {
        Fail(res, 405, "MethodNotAllowed", "POST " + req.path + ": not a collection");
        return;
      }
      // As the create handler and the registry do (handlers/create.go, rest/create.go
      // BeforeCreate, ValidateObjectMeta): the namespace comes from the URL and must exist
      // (Options::require_namespaces), the name must be a DNS subdomain; uid, creationTimestamp
      // and (for resources with a spec) generation 1 are the server's.
      const ObjectName coll = NameOf(req.path + "/-");
      const std::string kind = body.contains("kind") && body["kind"].is_string()
                                   ? body["kind"].get<std::string>()
                                   : KindOfResource(coll.resource);
      const nlohmann::json meta =
          body.contains("metadata") && body["metadata"].is_object() ? body["metadata"]
                                                                   : nlohmann::json::object();
      const std::string name = meta.value("name", "");
      if (!coll.ns.empty() && !meta.value("namespace", "").empty() &&
          meta.value("namespace", "") != coll.ns) {
        Fail(res, 400, "BadRequest",
             "the namespace of the provided object does not match the namespace sent on the "
             "request");
        return;
      }
      if (!coll.ns.empty() && options.require_namespaces &&
          objects.count("/api/v1/namespaces/" + coll.ns) == 0) {
        NotFound(res, ObjectName{"", "v1", "namespaces", "", coll.ns});
        return;
      }
      ObjectName named = coll;
      named.name = name;
      if (name.empty()) {
        Invalid(res, kind, named,
                "metadata.name: Required value: name or generateName is required");
        return;
      }
      if (!IsDnsSubdomain(name)) {
        Invalid(res, kind, named,
                "metadata.name: Invalid value: \"" + name +
                    "\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                    "characters, '-' or '.', and must start and end with an alphanumeric "
                    "character");
        return;
      }
      const std::string path = req.path + "/" + name;
      if (objects.count(path)) {
        Fail(res, 409, "AlreadyExists", coll.Qualified() + " \"" + name + "\" already exists",
             named.Details());
        return;
      }
      nlohmann::json created = body;
      created["kind"] = kind;
      created["apiVersion"] = coll.group.empty() ? coll.version : coll.group + "/" + coll.version;
      created["metadata"].erase("uid");  // the server assigns it
      if (!coll.ns.empty()) created["metadata"]["namespace"] = coll.ns;
      if (HasGeneration(coll.resource)) created["metadata"]["generation"] = 1;
      if (IsResourceClaim(path)) created.erase("status");
      if (HasStatusSubresource(coll.resource)) {
        // Go serializes a struct field even when empty: such an object always has both.
        for (const char* k : {"spec", "status"}) {
          if (!created.contains(k) || !created[k].is_object()) {
            created[k] = nlohmann::json::object();
          }
        }
      }
      if (coll.resource == "pods") {
        // pkg/registry/core/pod/strategy.go, PrepareForCreate: the status is the server's.
        created["status"] = {{"phase", "Pending"}};
      }
      if (coll.resource == "nodes") {
        // The TaintNodesByCondition admission plugin: a new node is not ready until its kubelet
        // says so (plugin/pkg/admission/nodetaint/admission.go).
        nlohmann::json& taints = created["spec"]["taints"];
        if (!taints.is_array()) taints = nlohmann::json::array();
        const bool has = std::any_of(taints.begin(), taints.end(), [](const nlohmann::json& t) {
          return t.value("key", "") == "node.kubernetes.io/not-ready";
        });
        if (!has) {
          taints.push_back({{"key", "node.kubernetes.io/not-ready"}, {"effect", "NoSchedule"}});
        }
      }
      if (coll.resource == "namespaces") {
        // pkg/registry/core/namespace/strategy.go: the name label, phase Active.
        created["metadata"]["labels"]["kubernetes.io/metadata.name"] = name;
        created["status"] = {{"phase", "Active"}};
        created["spec"]["finalizers"] = nlohmann::json::array({"kubernetes"});
      }
      if (IsResourceSlice(path)) {
        if (std::string bad = ValidateResourceSlice(created, nullptr); !bad.empty()) {
          Invalid(res, kind, named, bad);
          return;
        }
      }
      Record("ADDED", path, created);
      res.status = 201;
      res.set_content(objects[path].dump(), "application/json");
    });
  }

  // POST .../pods/NAME/eviction (caller holds mu), after pkg/registry/core/pod/storage/
  // eviction.go: a pod that is not running (Succeeded, Failed, Pending) or already terminating
  // is deleted without looking at budgets; otherwise every PodDisruptionBudget of its namespace
  // whose selector matches it is found: more than one is a Failure Status with code 500 (sent
  // with HTTP 201, as the create handler writes a returned Status), one with no disruption left is
  // 429, and the pod is then deleted gracefully (Terminating, with a DisruptionTarget condition).
  void HandleEviction(const std::string& path, const nlohmann::json& body, httplib::Response& res) {
    const std::string pod_path = path.substr(0, path.rfind('/'));
    const std::string name = pod_path.substr(pod_path.rfind('/') + 1);
    auto pod = objects.find(pod_path);
    if (pod == objects.end()) {
      NotFound(res, NameOf(pod_path));
      return;
    }
    if (body.contains("metadata") && body["metadata"].is_object() &&
        body["metadata"].value("name", name) != name) {
      Fail(res, 400, "BadRequest", "name in URL does not match name in Eviction object");
      return;
    }
    const nlohmann::json delete_options = body.value("deleteOptions", nlohmann::json::object());
    const std::string phase = PodPhase(pod->second);
    const bool ignore_budgets = phase == "Succeeded" || phase == "Failed" || phase == "Pending" ||
                                HasDeletionTimestamp(pod->second);
    if (!ignore_budgets) {
      const std::string ns = pod->second["metadata"].value("namespace", "");
      const nlohmann::json labels =
          pod->second["metadata"].value("labels", nlohmann::json::object());
      const std::string pdbs = "/apis/policy/v1/namespaces/" + ns + "/poddisruptionbudgets";
      std::vector<std::string> matching;
      for (auto& [p, pdb] : objects) {
        if (!InCollection(pdbs, p)) continue;
        const nlohmann::json* selector = pdb.contains("spec") && pdb["spec"].contains("selector")
                                             ? &pdb["spec"]["selector"]
                                             : nullptr;
        if (SelectorMatches(selector, labels)) matching.push_back(p);
      }
      if (matching.size() > 1) {
        res.status = 201;
        res.set_content(StatusBody(500, "",
                                   "This pod has more than one PodDisruptionBudget, which the "
                                   "eviction subresource does not support.")
                            .dump(),
                        "application/json");
        return;
      }
      if (matching.size() == 1) {
        nlohmann::json pdb = objects[matching[0]];
        const int allowed =
            pdb.contains("status") ? pdb["status"].value("disruptionsAllowed", 0) : 0;
        if (allowed < 1) {
          // eviction.go, checkAndDecrement: the budget's name in a DisruptionBudget cause.
          const std::string budget = matching[0].substr(matching[0].rfind('/') + 1);
          Fail(res, 429, "TooManyRequests",
               "Cannot evict pod as it would violate the pod's disruption budget.",
               nlohmann::json{{"causes", nlohmann::json::array({{
                   {"reason", "DisruptionBudget"},
                   {"message", "The disruption budget " + budget +
                                   " needs " + std::to_string(
                                       pdb.contains("status")
                                           ? pdb["status"].value("desiredHealthy", 0) : 0) +
                                   " healthy pods and has " + std::to_string(
                                       pdb.contains("status")
                                           ? pdb["status"].value("currentHealthy", 0) : 0) +
                                   " currently"}}})}});
          return;
        }
        pdb["status"]["disruptionsAllowed"] = allowed - 1;
        Record("MODIFIED", matching[0], pdb);
      }
    }
    nlohmann::json updated = pod->second;
    SetCondition(updated, {{"type", "DisruptionTarget"},
                           {"status", "True"},
                           {"reason", "EvictionByEvictionAPI"},
                           {"message", "Eviction API: evicting"}});
    if (!HasDeletionTimestamp(pod->second)) Record("MODIFIED", pod_path, updated);
    DeleteObject(pod_path, delete_options);
    res.status = 201;
    res.set_content(SuccessBody(201).dump(), "application/json");
  }

  // Deletes `path` (caller holds mu). A pod bound to a node that has not finished is deleted
  // gracefully, as its kubelet would: deletionTimestamp and deletionGracePeriodSeconds are set
  // (MODIFIED) and the object goes (DELETED) once the stand-in kubelet has stopped it, after
  // min(grace period, Options::pod_termination) (pkg/registry/core/pod/strategy.go,
  // CheckGracefulDelete: an unbound or terminal pod goes at once). Returns the object's state.
  nlohmann::json DeleteObject(const std::string& path, const nlohmann::json& options) {
    nlohmann::json obj = objects.at(path);
    const bool pod = InCollection("/api/v1/pods", path);
    const nlohmann::json spec = obj.value("spec", nlohmann::json::object());
    const std::string phase = PodPhase(obj);
    const bool graceful = pod && !spec.value("nodeName", "").empty() && phase != "Succeeded" &&
                          phase != "Failed";
    int64_t grace = spec.value("terminationGracePeriodSeconds", int64_t{30});
    if (options.contains("gracePeriodSeconds") && options["gracePeriodSeconds"].is_number()) {
      grace = options["gracePeriodSeconds"].get<int64_t>();
    }
    if (!graceful || grace <= 0) {
      Record("DELETED", path, obj);
      return obj;
    }
    const auto now = std::chrono::steady_clock::now();
    const auto due = now + std::min<std::chrono::milliseconds>(std::chrono::seconds(grace),
                                                               options_pod_termination());
    if (!HasDeletionTimestamp(obj)) {
      obj["metadata"]["deletionTimestamp"] =
          Rfc3339(std::chrono::system_clock::now() + std::chrono::seconds(grace));
      obj["metadata"]["deletionGracePeriodSeconds"] = grace;
      Record("MODIFIED", path, obj);
      deleting[path] = due;
    } else if (due < deleting[path]) {
      deleting[path] = due;  // a shorter grace period shortens a deletion in progress
    }
    cv.notify_all();
    return objects.at(path);
  }

  std::chrono::milliseconds options_pod_termination() const { return options.pod_termination; }

  // The stand-in kubelet: removes gracefully deleted pods when their time is up.
  void ReapDeletions() {
    std::unique_lock<std::mutex> lock(mu);
    while (!stopping) {
      const auto now = std::chrono::steady_clock::now();
      auto next = now + std::chrono::seconds(1);
      for (auto it = deleting.begin(); it != deleting.end();) {
        if (it->second <= now) {
          const std::string path = it->first;
          it = deleting.erase(it);
          if (auto o = objects.find(path); o != objects.end()) {
            nlohmann::json last = o->second;
            last["status"]["phase"] = "Failed";  // its containers were stopped
            Record("DELETED", path, last);
          }
        } else {
          next = std::min(next, it->second);
          ++it;
        }
      }
      const uint64_t seen = version;
      cv.wait_until(lock, next, [&] { return stopping || version != seen; });
    }
  }

  // POST .../pods/NAME/binding (caller holds mu), after pkg/registry/core/pod/storage/storage.go
  // (BindingREST, setPodHostAndAnnotations): 404 without the pod; 409 when metadata.uid is given
  // and differs, when the pod is being deleted, has scheduling gates or is already bound; then
  // spec.nodeName is set, the binding's annotations merged and PodScheduled set to True.
  void HandleBinding(const std::string& path, const nlohmann::json& body, httplib::Response& res) {
    const std::string pod_path = path.substr(0, path.rfind('/'));
    const std::string name = pod_path.substr(pod_path.rfind('/') + 1);
    auto pod = objects.find(pod_path);
    if (pod == objects.end()) {
      NotFound(res, NameOf(pod_path));
      return;
    }
    const std::string node = body.contains("target") && body["target"].is_object()
                                 ? body["target"].value("name", "")
                                 : "";
    if (node.empty()) {
      Fail(res, 422, "Invalid", "target.name: Required value");
      return;
    }
    auto conflict = [&](const std::string& why) {
      Fail(res, 409, "Conflict",
           "Operation cannot be fulfilled on pods/binding \"" + name + "\": " + why,
           nlohmann::json{{"name", name}, {"kind", "pods/binding"}});
    };
    const nlohmann::json meta =
        body.contains("metadata") && body["metadata"].is_object() ? body["metadata"]
                                                                  : nlohmann::json::object();
    const std::string uid = meta.value("uid", "");
    if (!uid.empty() && uid != pod->second["metadata"].value("uid", "")) {
      conflict("the UID in the binding does not match the pod");
      return;
    }
    if (HasDeletionTimestamp(pod->second)) {
      conflict("pod " + name + " is being deleted, cannot be assigned to a host");
      return;
    }
    const nlohmann::json spec = pod->second.value("spec", nlohmann::json::object());
    if (spec.contains("schedulingGates") && spec["schedulingGates"].is_array() &&
        !spec["schedulingGates"].empty()) {
      conflict("pod " + name + " has non-empty .spec.schedulingGates");
      return;
    }
    if (!spec.value("nodeName", "").empty()) {
      conflict("pod " + name + " is already assigned to node \"" + spec.value("nodeName", "") +
               "\"");
      return;
    }
    nlohmann::json updated = pod->second;
    updated["spec"]["nodeName"] = node;
    if (meta.contains("annotations") && meta["annotations"].is_object()) {
      const nlohmann::json& annotations = meta["annotations"];
      for (auto it = annotations.begin(); it != annotations.end(); ++it) {
        updated["metadata"]["annotations"][it.key()] = *it;
      }
    }
    SetCondition(updated, {{"type", "PodScheduled"}, {"status", "True"}});
    Record("MODIFIED", pod_path, updated);
    res.status = 201;
    res.set_content(SuccessBody(201).dump(), "application/json");
  }

  // PATCH (caller holds mu): merge, JSON patch, and strategic merge where it equals a JSON merge
  // patch (maps only; lists and $-directives are refused, see NeedsStrategicMerge). A stale
  // metadata.resourceVersion in the patch is 409; a patch that changes nothing writes nothing:
  // no new resourceVersion, no event (staging/src/k8s.io/apiserver/pkg/storage/etcd3/store.go,
  // GuaranteedUpdate skips an unchanged object).
  void HandlePatch(const httplib::Request& req, httplib::Response& res) {
    HandleWrite(req, res, [&](const nlohmann::json& patch) {
      const std::string ct = req.get_header_value("Content-Type");
      const std::optional<std::string> parent = StatusParent(req.path);
      const std::string path = parent ? *parent : req.path;
      auto it = objects.find(path);
      if (it == objects.end()) {
        NotFound(res, NameOf(req.path));
        return;
      }
      if (patch.is_object() && patch.contains("metadata") && patch["metadata"].is_object() &&
          patch["metadata"].contains("resourceVersion") &&
          patch["metadata"]["resourceVersion"] !=
              it->second["metadata"].value("resourceVersion", "")) {
        Conflict(res, NameOf(path));
        return;
      }
      nlohmann::json updated = it->second;
      if (ct == "application/merge-patch+json") {
        updated.merge_patch(patch);
      } else if (ct == "application/strategic-merge-patch+json") {
        if (NeedsStrategicMerge(patch)) {
          Fail(res, 422, "Invalid",
               "fake API server: this strategic merge patch holds a list or a $-directive, "
               "which the stand-in does not implement; use a merge or JSON patch");
          return;
        }
        updated.merge_patch(patch);
      } else if (ct == "application/json-patch+json") {
        try {
          updated = updated.patch(patch);
        } catch (const nlohmann::json::exception&) {
          // A JSON patch that does not apply (a failed test, a missing path) is 422 with this
          // fixed message and empty details (handlers/patch.go, jsonPatcher).
          Fail(res, 422, "Invalid",
               "the server rejected our request due to an error in our request",
               nlohmann::json::object());
          return;
        }
      } else {
        Fail(res, 415, "UnsupportedMediaType", "unsupported patch type " + ct);
        return;
      }
      if (std::string bad = Settle(path, parent.has_value(), updated); !bad.empty()) {
        Invalid(res, it->second.value("kind", ""), NameOf(path), bad);
        return;
      }
      Update(path, std::move(updated), res);
    });
  }

  // Stores `updated` as the new state of `path` (caller holds mu) and answers it. An update cannot
  // change the server's fields (rest/update.go: FillObjectMetaSystemFields runs on create only);
  // one that changes nothing else writes nothing (no version, no event).
  void Update(const std::string& path, nlohmann::json updated, httplib::Response& res) {
    const nlohmann::json& old = objects.at(path)["metadata"];
    for (const char* k : {"resourceVersion", "uid", "creationTimestamp", "generation"}) {
      if (old.contains(k)) updated["metadata"][k] = old[k];
    }
    if (HasGeneration(NameOf(path).resource)) {
      // A change of anything but metadata and status moves the generation on.
      nlohmann::json a = objects.at(path), b = updated;
      for (nlohmann::json* o : {&a, &b}) {
        o->erase("metadata");
        o->erase("status");
      }
      if (a != b) updated["metadata"]["generation"] = old.value("generation", int64_t{0}) + 1;
    }
    if (updated != objects.at(path)) Record("MODIFIED", path, updated);
    res.set_content(objects[path].dump(), "application/json");
  }

  // PUT <object path> (caller holds mu): replaces the object; 404 when absent, 400 when the
  // body names another object, 409 when its metadata.resourceVersion is stale; an unchanged
  // object writes nothing.
  void HandlePut(const httplib::Request& req, httplib::Response& res) {
    HandleWrite(req, res, [&](const nlohmann::json& body) {
      const std::optional<std::string> parent = StatusParent(req.path);
      const std::string path = parent ? *parent : req.path;
      auto it = objects.find(path);
      if (it == objects.end()) {
        NotFound(res, NameOf(req.path));
        return;
      }
      if (!body.is_object() || !body.contains("metadata") || !body["metadata"].is_object()) {
        Fail(res, 400, "BadRequest", "body is not an object with metadata");
        return;
      }
      const std::string name = path.substr(path.rfind('/') + 1);
      if (body["metadata"].value("name", "") != name) {
        Fail(res, 400, "BadRequest", "the name of the object does not match the name on the URL");
        return;
      }
      const std::string current = it->second["metadata"].value("resourceVersion", "");
      const std::string given = body["metadata"].value("resourceVersion", "");
      if (!given.empty() && given != current) {
        Conflict(res, NameOf(path));
        return;
      }
      nlohmann::json updated = body;
      if (std::string bad = Settle(path, parent.has_value(), updated); !bad.empty()) {
        Invalid(res, it->second.value("kind", ""), NameOf(path), bad);
        return;
      }
      Update(path, std::move(updated), res);
    });
  }

  // DELETE <object path> (caller holds mu), with optional DeleteOptions: preconditions.uid and
  // preconditions.resourceVersion (409 when they differ), gracePeriodSeconds. Pods are deleted
  // gracefully as DeleteObject describes; the answer is the object's state.
  void HandleDelete(const httplib::Request& req, httplib::Response& res) {
    HandleWrite(req, res, [&](const nlohmann::json& options) {
      auto it = objects.find(req.path);
      const std::string name = req.path.substr(req.path.rfind('/') + 1);
      if (it == objects.end() && IsCollection(req.path)) {
        // deletecollection (staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go,
        // DeleteCollection): every item the selectors match, answered as the list of them.
        const std::string fields = req.get_param_value("fieldSelector");
        const std::string labels = req.get_param_value("labelSelector");
        std::vector<std::string> doomed;
        for (const auto& [path, obj] : objects) {
          if (InCollection(req.path, path) && Matches(obj, fields, labels)) doomed.push_back(path);
        }
        nlohmann::json items = nlohmann::json::array();
        for (const std::string& path : doomed) {
          if (objects.count(path) == 0) continue;
          items.push_back(DeleteObject(path, options.is_object() ? options
                                                                 : nlohmann::json::object()));
        }
        res.set_content(nlohmann::json{{"kind", "List"},
                                       {"apiVersion", "v1"},
                                       {"metadata", {{"resourceVersion", std::to_string(version)}}},
                                       {"items", items}}
                            .dump(),
                        "application/json");
        return;
      }
      if (it == objects.end()) {
        NotFound(res, NameOf(req.path));
        return;
      }
      const nlohmann::json pre = options.is_object()
                                     ? options.value("preconditions", nlohmann::json::object())
                                     : nlohmann::json::object();
      for (const char* k : {"uid", "resourceVersion"}) {
        if (pre.contains(k) && pre[k].is_string() &&
            pre[k].get<std::string>() != it->second["metadata"].value(k, "")) {
          Fail(res, 409, "Conflict",
               std::string("Precondition failed: ") + k + " in precondition does not match");
          return;
        }
      }
      const ObjectName n = NameOf(req.path);
      nlohmann::json details = n.Details();
      details["uid"] = it->second["metadata"].value("uid", "");
      nlohmann::json last =
          DeleteObject(req.path, options.is_object() ? options : nlohmann::json::object());
      res.set_content(
          (DeleteReturnsObject(n.resource) ? last : SuccessBody(std::nullopt, details)).dump(),
          "application/json");
    });
  }

  void HandleWatch(const httplib::Request& req, httplib::Response& res,
                   const std::shared_ptr<State>& self) {
    // Every watch is a watch of a collection filtered by its field and label selectors; a
    // metadata.name field selector is one field like the others.
    const std::string collection = req.path;
    const std::string field_selector = req.get_param_value("fieldSelector");
    const std::string label_selector = req.get_param_value("labelSelector");
    auto selected = [collection, field_selector, label_selector](const std::string& path,
                                                                 const nlohmann::json& obj) {
      return InCollection(collection, path) && Matches(obj, field_selector, label_selector);
    };
    const std::string bookmarks = req.get_param_value("allowWatchBookmarks");
    const bool want_bookmarks = bookmarks == "true" || bookmarks == "1";
    const std::string timeout_text = req.get_param_value("timeoutSeconds");
    std::optional<std::chrono::steady_clock::time_point> deadline;
    if (!timeout_text.empty()) {
      deadline = std::chrono::steady_clock::now() +
                 std::chrono::seconds(std::strtoll(timeout_text.c_str(), nullptr, 10));
    }
    const std::string rv_text = req.get_param_value("resourceVersion");
    uint64_t from = 0;
    bool initial_added = rv_text.empty() || rv_text == "0";
    if (!initial_added) from = std::strtoull(rv_text.c_str(), nullptr, 10);
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!initial_added && from < expired_before && gone_as_http) {
        Fail(res, 410, "Expired", "too old resource version: " + rv_text);
        return;
      }
      ++open_watches;
      cv.notify_all();
    }
    struct Stream {
      uint64_t cursor;
      uint64_t break_generation, close_generation, bookmark_generation, gone_generation,
          error_generation;
      bool started = false;
      bool initial_added;
      bool gone;
    };
    auto stream = std::make_shared<Stream>();
    {
      std::lock_guard<std::mutex> lock(mu);
      stream->cursor = initial_added ? version : from;
      stream->break_generation = break_generation;
      stream->close_generation = close_generation;
      stream->bookmark_generation = bookmark_generation;
      stream->gone_generation = gone_generation;
      stream->error_generation = error_generation;
      stream->initial_added = initial_added;
      stream->gone = !initial_added && from < expired_before;
    }
    const std::string kind_hint = KindOf(collection);
    res.set_chunked_content_provider(
        "application/json",
        [self, stream, selected, want_bookmarks, deadline, kind_hint](size_t,
                                                                       httplib::DataSink& sink) {
          auto error_event = [](const nlohmann::json& status) {
            return nlohmann::json{{"type", "ERROR"}, {"object", status}}.dump() + "\n";
          };
          std::unique_lock<std::mutex> lock(self->mu);
          if (!stream->started) {
            stream->started = true;
            if (stream->gone) {
              const std::string line =
                  error_event(StatusBody(410, "Expired", "too old resource version"));
              lock.unlock();
              sink.write(line.data(), line.size());
              sink.done();
              return true;
            }
            if (stream->initial_added) {
              std::string out;
              for (const auto& [path, obj] : self->objects) {
                if (selected(path, obj)) {
                  out += nlohmann::json{{"type", "ADDED"}, {"object", obj}}.dump() + "\n";
                }
              }
              lock.unlock();
              if (out.empty()) return true;
              return sink.write(out.data(), out.size());
            }
          }
          auto wait_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
          if (deadline && *deadline < wait_until) wait_until = *deadline;
          self->cv.wait_until(lock, wait_until, [&] {
            return self->stopping || self->break_generation != stream->break_generation ||
                   self->close_generation != stream->close_generation ||
                   self->gone_generation != stream->gone_generation ||
                   self->error_generation != stream->error_generation ||
                   (want_bookmarks && self->bookmark_generation != stream->bookmark_generation) ||
                   (!self->history.empty() && self->history.back().version > stream->cursor);
          });
          if (self->stopping || self->close_generation != stream->close_generation ||
              (deadline && std::chrono::steady_clock::now() >= *deadline)) {
            // timeoutSeconds: the server ends the stream cleanly
            // (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/watch.go, serveWatch).
            lock.unlock();
            sink.done();
            return true;
          }
          if (self->break_generation != stream->break_generation) {
            // Half an event, then the connection drops without the terminating chunk.
            const std::string half = "{\"type\":\"MODIFIED\",\"object\":{\"kind\":";
            lock.unlock();
            sink.write(half.data(), half.size());
            return false;
          }
          std::string out;
          for (const Event& e : self->history) {
            if (e.version <= stream->cursor) continue;
            stream->cursor = e.version;
            if (auto ev = Converted(e, selected)) out += ev->dump() + "\n";
          }
          // An ERROR event ends the stream: the server sends it and closes the watch
          // (staging/src/k8s.io/apiserver/pkg/storage/cacher/cache_watcher.go).
          std::optional<nlohmann::json> error;
          if (self->gone_generation != stream->gone_generation) {
            error = StatusBody(410, "Expired", "The resourceVersion for the provided watch is "
                                               "too old.");
          } else if (self->error_generation != stream->error_generation) {
            error = self->watch_error;
          }
          if (error) {
            out += error_event(*error);
            lock.unlock();
            sink.write(out.data(), out.size());
            sink.done();
            return true;
          }
          if (want_bookmarks && self->bookmark_generation != stream->bookmark_generation) {
            // A BOOKMARK carries only the kind and the resourceVersion the stream has reached
            // (staging/src/k8s.io/apimachinery/pkg/watch/watch.go, Bookmark).
            stream->bookmark_generation = self->bookmark_generation;
            out += nlohmann::json{{"type", "BOOKMARK"},
                                  {"object",
                                   {{"kind", kind_hint},
                                    {"apiVersion", "v1"},
                                    {"metadata",
                                     {{"resourceVersion", std::to_string(stream->cursor)}}}}}}
                       .dump() +
                   "\n";
          }
          lock.unlock();
          if (!out.empty()) return sink.write(out.data(), out.size());
          return true;
        },
        [self](bool) {
          std::lock_guard<std::mutex> lock(self->mu);
          --self->open_watches;
          self->cv.notify_all();
        });
  }

  // The event a selector-filtered watch sends for `e`, or nullopt. A MODIFIED whose object
  // starts matching is an ADDED, one that stops matching is a DELETED of the last matching state
  // at the event's resourceVersion (cache_watcher.go, convertToWatchEvent).
  template <typename Selected>
  static std::optional<nlohmann::json> Converted(const Event& e, const Selected& selected) {
    const bool now = e.type != "DELETED" && selected(e.path, e.object);
    const bool before = e.type == "DELETED" ? selected(e.path, e.object)
                        : e.prev            ? selected(e.path, *e.prev)
                                            : false;
    std::string type;
    nlohmann::json object = e.object;
    if (now && before) {
      type = "MODIFIED";
    } else if (now) {
      type = "ADDED";
    } else if (before) {
      type = "DELETED";
      if (e.type != "DELETED") {
        object = *e.prev;
        object["metadata"]["resourceVersion"] = std::to_string(e.version);
      }
    } else {
      return std::nullopt;
    }
    return nlohmann::json{{"type", type}, {"object", object}};
  }

  // "Pod" for /api/v1/pods, "ConfigMap" for …/configmaps: the kind a BOOKMARK names.
  static std::string KindOf(const std::string& collection) {
    static const std::map<std::string, std::string> kinds = {
        {"pods", "Pod"},         {"nodes", "Node"},     {"configmaps", "ConfigMap"},
        {"leases", "Lease"},     {"statefulsets", "StatefulSet"},
        {"resourceslices", "ResourceSlice"}, {"resourceclaims", "ResourceClaim"},
        {"deviceclasses", "DeviceClass"}};
    const std::vector<std::string> seg = Segments(collection);
    if (seg.empty()) return "";
    auto it = kinds.find(seg.back());
    return it == kinds.end() ? "" : it->second;
  }
};

namespace {

// cpp-httplib (Debian's compiled libcpp-httplib) listens with a backlog of 5: a client opening a
// few connections at once (the slice publisher's parallel writes) has its SYNs dropped and retried
// a second later. A Go API server listens with the kernel's somaxconn. listen() again on the
// listening socket (found by its port) raises the backlog; nothing else changes.
void RaiseListenBacklog(int port) {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return;
  while (dirent* e = ::readdir(d)) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2 || fd == ::dirfd(d)) continue;
    int listening = 0;
    socklen_t len = sizeof(listening);
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_in addr{};
    socklen_t alen = sizeof(addr);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0 ||
        addr.sin_family != AF_INET || ntohs(addr.sin_port) != port) {
      continue;
    }
    ::listen(fd, SOMAXCONN);
  }
  ::closedir(d);
}

}  // namespace

Result<std::unique_ptr<FakeApiServer>> FakeApiServer::Start(const TestPki& pki, Options options) {
  // A client that hangs up mid-stream must not kill the test process.
  signal(SIGPIPE, SIG_IGN);
  auto state = std::make_shared<State>();
  state->options = std::move(options);
  state->server = std::make_unique<httplib::SSLServer>(
      pki.server_cert.c_str(), pki.server_key.c_str(),
      state->options.require_client_cert ? pki.ca_cert.c_str() : nullptr);
  if (!state->server->is_valid()) {
    return Status(ErrorCode::kInternal, "fake API server: TLS setup failed for " + pki.server_cert);
  }
  // Every open connection holds one of these threads (watches for their whole life, a client's
  // kept-alive connection until it has idled for keep_alive_timeout): enough for the tests' many
  // watchers and pooled clients at once.
  state->server->new_task_queue = [] { return new httplib::ThreadPool(64); };
  // A Go API server keeps a connection for any number of requests; httplib's default closes it
  // after 5, which would put a TLS handshake on every fifth call of a kept-alive client.
  state->server->set_keep_alive_max_count(1000000);
  // As a real API server (Go sets TCP_NODELAY): without it, a response written as headers then
  // body waits for the client's delayed ACK (40 ms) on every call.
  state->server->set_tcp_nodelay(true);
  std::weak_ptr<State> weak = state;
  state->server->Get(".*", [weak](const httplib::Request& req, httplib::Response& res) {
    if (auto s = weak.lock()) s->HandleGet(req, res, s);
  });
  state->server->Post(".*", [weak](const httplib::Request& req, httplib::Response& res) {
    if (auto s = weak.lock()) s->HandlePost(req, res);
  });
  state->server->Patch(".*", [weak](const httplib::Request& req, httplib::Response& res) {
    if (auto s = weak.lock()) s->HandlePatch(req, res);
  });
  state->server->Put(".*", [weak](const httplib::Request& req, httplib::Response& res) {
    if (auto s = weak.lock()) s->HandlePut(req, res);
  });
  state->server->Delete(".*", [weak](const httplib::Request& req, httplib::Response& res) {
    if (auto s = weak.lock()) s->HandleDelete(req, res);
  });

  state->port = state->server->bind_to_any_port("127.0.0.1");
  if (state->port <= 0) return Status(ErrorCode::kInternal, "fake API server: bind failed");
  RaiseListenBacklog(state->port);
  httplib::SSLServer* srv = state->server.get();
  state->thread = std::thread([srv] { srv->listen_after_bind(); });
  state->reaper = std::thread([raw = state.get()] { raw->ReapDeletions(); });
  // stop() is a no-op until the accept loop runs: wait for it so the destructor cannot hang.
  for (int i = 0; i < 2000 && !srv->is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::unique_ptr<FakeApiServer> f(new FakeApiServer());
  f->state_ = state;
  return f;
}

FakeApiServer::~FakeApiServer() {
  if (!state_) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stopping = true;
  }
  state_->cv.notify_all();
  state_->server->stop();
  if (state_->thread.joinable()) state_->thread.join();
  if (state_->reaper.joinable()) state_->reaper.join();
}

std::string FakeApiServer::url() const {
  return "https://127.0.0.1:" + std::to_string(state_->port);
}

k8s::ClusterAccess FakeApiServer::Access(const TestPki& pki) const {
  k8s::ClusterAccess a;
  a.server = url();
  a.ca_file = pki.ca_cert;
  a.token = state_->options.token;
  return a;
}

uint64_t FakeApiServer::Put(const std::string& object_path, nlohmann::json object) {
  std::lock_guard<std::mutex> lock(state_->mu);
  const bool exists = state_->objects.count(object_path) > 0;
  return state_->Record(exists ? "MODIFIED" : "ADDED", object_path, std::move(object));
}

void FakeApiServer::Delete(const std::string& object_path) {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->objects.find(object_path);
  if (it == state_->objects.end()) return;
  state_->Record("DELETED", object_path, it->second);
}

std::optional<nlohmann::json> FakeApiServer::Object(const std::string& object_path) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->objects.find(object_path);
  if (it == state_->objects.end()) return std::nullopt;
  return it->second;
}

uint64_t FakeApiServer::current_version() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->version;
}

void FakeApiServer::InjectWriteFault(WriteFault fault) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->faults.push_back(std::move(fault));
}

void FakeApiServer::BeforeEachWrite(std::function<void(const RecordedRequest&)> hook) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->before_write = std::move(hook);
}

void FakeApiServer::SendBookmarks() { state_->Signal(state_->bookmark_generation); }

void FakeApiServer::ExpireWatches() { state_->Signal(state_->gone_generation); }

void FakeApiServer::SendWatchError(int code, const std::string& reason,
                                   const std::string& message) {
  state_->Signal(state_->error_generation,
                 [&] { state_->watch_error = StatusBody(code, reason, message); });
}

void FakeApiServer::BreakWatches() { state_->Signal(state_->break_generation); }

void FakeApiServer::CloseWatches() { state_->Signal(state_->close_generation); }

void FakeApiServer::ExpireVersionsBefore(uint64_t version) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->expired_before = version;
}

void FakeApiServer::SetGoneAsHttpStatus(bool on) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->gone_as_http = on;
}

size_t FakeApiServer::open_watches() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->open_watches;
}

bool FakeApiServer::WaitForOpenWatches(size_t n, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(state_->mu);
  return state_->cv.wait_for(lock, timeout, [&] { return state_->open_watches >= n; });
}

std::vector<RecordedRequest> FakeApiServer::requests() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->requests;
}

}  // namespace gpulet::testing
