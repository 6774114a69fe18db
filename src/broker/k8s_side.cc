#include "broker/k8s_side.h"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <ctime>

namespace gpulet::broker {
namespace {

using nlohmann::json;

bool RequestsGpu(const json& containers) {
  if (!containers.is_array()) return false;
  for (const json& c : containers) {
    const json* res = c.contains("resources") ? &c["resources"] : nullptr;
    if (res == nullptr || !res->is_object()) continue;
    for (const char* kind : {"requests", "limits"}) {
      if (!res->contains(kind) || !(*res)[kind].is_object()) continue;
      for (const auto& [key, v] : (*res)[kind].items()) {
        if (key.rfind("nvidia.com/", 0) == 0) return true;
      }
    }
  }
  return false;
}

bool OwnedByDaemonSet(const json& pod) {
  const json& refs = pod["metadata"].value("ownerReferences", json::array());
  for (const json& r : refs) {
    if (r.value("kind", "") == "DaemonSet") return true;
  }
  return false;
}

// The API's copy of a static pod (kubelet --pod-manifest-path / staticPodPath: kube-proxy or a
// node-local proxy on many distributions). Evicting it deletes only the copy: the static pod
// keeps running and the kubelet creates the copy again, so a return that waited for it to leave
// would evict it every evaluation until evictionTimeout aborted the return. kubectl drain skips
// them too. The kubelet marks them with this annotation.
bool MirrorPod(const json& pod) {
  const json meta = pod.value("metadata", json::object());
  const json annotations = meta.is_object() ? meta.value("annotations", json::object()) : json();
  return annotations.is_object() && annotations.contains("kubernetes.io/config.mirror");
}

bool Terminated(const json& pod) {
  const std::string phase = pod.contains("status") ? pod["status"].value("phase", "") : "";
  return phase == "Succeeded" || phase == "Failed";
}

}  // namespace

bool IsUnschedulableGpuPod(const json& pod) {
  if (!pod.is_object() || !pod.contains("status") || !pod.contains("spec")) return false;
  if (pod["status"].value("phase", "") != "Pending") return false;
  if (pod["spec"].contains("nodeName") && !pod["spec"]["nodeName"].get<std::string>().empty()) {
    return false;
  }
  bool unschedulable = false;
  for (const json& c : pod["status"].value("conditions", json::array())) {
    if (c.value("type", "") == "PodScheduled" && c.value("status", "") == "False" &&
        c.value("reason", "") == "Unschedulable") {
      unschedulable = true;
    }
  }
  return unschedulable && (RequestsGpu(pod["spec"].value("containers", json::array())) ||
                           RequestsGpu(pod["spec"].value("initContainers", json::array())));
}

bool IsBoundGpuPod(const json& pod) {
  if (!pod.is_object() || !pod.contains("spec") || Terminated(pod)) return false;
  const json& spec = pod["spec"];
  if (!spec.contains("nodeName") || !spec["nodeName"].is_string() ||
      spec["nodeName"].get<std::string>().empty()) {
    return false;
  }
  return RequestsGpu(spec.value("containers", json::array())) ||
         RequestsGpu(spec.value("initContainers", json::array()));
}

namespace {

std::string StatefulSetPath(const std::string& ns, const std::string& name) {
  return "/apis/apps/v1/namespaces/" + ns + "/statefulsets/" + name;
}

}  // namespace

KubeSide::KubeSide(const k8s::Client& client, const BrokerConfig& config)
    : client_(client), config_(config) {}

KubeView KubeSide::Observe() const {
  KubeView v;
  auto fail = [&](const Status& s) {
    v.ok = false;
    v.error = s.message();
    v.nodes.clear();
    return v;
  };
  try {
    if (config_.SlurmOnKubernetes()) {
      for (const std::string& ns : config_.namespaces) {
        Result<json> pods = client_.Get("/api/v1/namespaces/" + ns + "/pods?fieldSelector=" +
                                        k8s::EscapeQueryValue("status.phase!=Succeeded"));
        if (!pods.ok()) return fail(pods.status());
        if (!(*pods).contains("items") || !(*pods)["items"].is_array()) {
          return fail(Status(ErrorCode::kUnavailable, "pods of " + ns + ": no items"));
        }
        for (const json& p : (*pods)["items"]) {
          if (IsUnschedulableGpuPod(p)) ++v.unschedulable_gpu_pods;
          if (IsBoundGpuPod(p)) ++v.inference_gpu_pods;
        }
      }
      for (const ScaledPool& pool : config_.pools) {
        k8s::ApiResult<json> sts =
            client_.Get(StatefulSetPath(config_.slurm_namespace, pool.stateful_set));
        if (!sts.ok()) {
          if (sts.http_status() == 404) continue;
          return fail(sts.status());
        }
        StatefulSetState s;
        s.name = pool.stateful_set;
        const json& spec = (*sts).value("spec", json::object());
        if (!spec.contains("replicas") || !spec["replicas"].is_number_integer()) {
          return fail(Status(ErrorCode::kUnavailable,
                             "statefulset " + pool.stateful_set + ": no spec.replicas"));
        }
        s.replicas = spec["replicas"].get<int>();
        s.ready_replicas = (*sts).value("status", json::object()).value("readyReplicas", 0);
        s.resource_version = (*sts)["metadata"].value("resourceVersion", "");
        v.stateful_sets[s.name] = s;
      }
      v.ok = true;
      return v;
    }
    for (const std::string& ns : config_.namespaces) {
      Result<json> pods = client_.Get("/api/v1/namespaces/" + ns + "/pods?fieldSelector=" +
                                      k8s::EscapeQueryValue("status.phase=Pending"));
      if (!pods.ok()) return fail(pods.status());
      if (!(*pods).contains("items") || !(*pods)["items"].is_array()) {
        return fail(Status(ErrorCode::kUnavailable, "pods of " + ns + ": no items"));
      }
      for (const json& p : (*pods)["items"]) {
        if (IsUnschedulableGpuPod(p)) ++v.unschedulable_gpu_pods;
      }
    }
    for (const std::string& name : config_.nodes) {
      k8s::ApiResult<json> node = client_.Get("/api/v1/nodes/" + name);
      if (!node.ok()) {
        if (node.http_status() == 404) continue;
        return fail(node.status());
      }
      KubeNode k;
      k.name = name;
      const json& spec = (*node).value("spec", json::object());
      k.unschedulable = spec.value("unschedulable", false);
      for (const json& t : spec.value("taints", json::array())) {
        if (t.value("key", "") == config_.taint_key &&
            t.value("effect", "") == config_.taint_effect) {
          k.slurm_taint = true;
        }
      }
      const json labels = (*node)["metadata"].value("labels", json::object());
      k.pool_label = labels.value(config_.pool_label_key, "") == config_.pool_label_value;
      Result<json> pods = client_.Get("/api/v1/pods?fieldSelector=" +
                                      k8s::EscapeQueryValue("spec.nodeName=" + name));
      if (!pods.ok()) return fail(pods.status());
      for (const json& p : (*pods).value("items", json::array())) {
        if (OwnedByDaemonSet(p) || MirrorPod(p) || Terminated(p)) continue;
        ++k.non_daemonset_pods;
        const std::string ns = p["metadata"].value("namespace", "");
        for (const std::string& inf : config_.namespaces) {
          if (ns == inf) ++k.inference_pods;
        }
        k.evictable.push_back(ns + "/" + p["metadata"].value("name", ""));
      }
      v.nodes[name] = std::move(k);
    }
  } catch (const json::exception& e) {
    return fail(Status(ErrorCode::kUnavailable, std::string("unexpected API object: ") + e.what()));
  }
  v.ok = true;
  return v;
}

// Rewrites the node's taint list from a read of it. spec.taints is a list, so a merge patch
// replaces it whole: the patch carries the read's resourceVersion, so a taint another controller
// added in between (a NoExecute from the node lifecycle controller, say) makes it fail with 409
// instead of being lost, and the read and rewrite are tried again.
Status KubeSide::RewriteTaints(const std::string& name, bool add_ours, bool unschedulable,
                               const json& pool_label) const {
  const std::string path = "/api/v1/nodes/" + name;
  constexpr int kAttempts = 5;
  Status last;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    k8s::ApiResult<json> node = client_.Get(path);
    if (!node.ok()) return node.status();
    json taints = json::array();
    const json spec = (*node).value("spec", json::object());
    for (const json& t : spec.value("taints", json::array())) {
      if (t.value("key", "") != config_.taint_key) taints.push_back(t);
    }
    if (add_ours) {
      taints.push_back({{"key", config_.taint_key},
                        {"value", config_.taint_value},
                        {"effect", config_.taint_effect}});
    }
    const std::string rv = (*node)["metadata"].value("resourceVersion", "");
    json patch = {{"spec", {{"unschedulable", unschedulable}, {"taints", taints}}},
                  {"metadata",
                   {{"resourceVersion", rv},
                    {"labels", {{config_.pool_label_key, pool_label}}}}}};
    k8s::ApiResult<json> r = client_.Patch(path, patch, k8s::PatchType::kMerge);
    if (r.ok()) return {};
    if (r.http_status() != 409) return r.status();
    last = r.status();
    spdlog::info("event=broker_taint_conflict node={} attempt={}", name, attempt + 1);
  }
  return last;
}

Status KubeSide::Admit(const std::string& name) const {
  return RewriteTaints(name, /*add_ours=*/false, /*unschedulable=*/false,
                       config_.pool_label_value);
}

Status KubeSide::StartReturn(const std::string& name) const {
  return RewriteTaints(name, /*add_ours=*/true, /*unschedulable=*/true, nullptr);
}

Result<EvictionResult> KubeSide::Evict(const std::vector<std::string>& pods) const {
  EvictionResult out;
  for (const std::string& p : pods) {
    const size_t slash = p.find('/');
    if (slash == std::string::npos) continue;
    const std::string ns = p.substr(0, slash), name = p.substr(slash + 1);
    json body = {{"apiVersion", "policy/v1"},
                 {"kind", "Eviction"},
                 {"metadata", {{"name", name}, {"namespace", ns}}}};
    k8s::ApiResult<json> r =
        client_.Post("/api/v1/namespaces/" + ns + "/pods/" + name + "/eviction", body);
    if (r.ok() || r.http_status() == 404) {
      ++out.evicted;
    } else if (r.http_status() == 429) {
      ++out.blocked;
    } else if (r.http_status() == 500 &&
               r.status().message().find("more than one PodDisruptionBudget") !=
                   std::string::npos) {
      // A pod under two budgets can never be evicted (the eviction subresource refuses it, a
      // Failure Status in a 201). It blocks like a budget with no room, and says why.
      spdlog::warn("event=broker_evict_refused pod={} error=\"{}\"", p, r.status().message());
      ++out.blocked;
    } else {
      return r.status();
    }
  }
  return out;
}

Status KubeSide::ScaleStatefulSet(const std::string& name, int from, int to) const {
  const std::string path = StatefulSetPath(config_.slurm_namespace, name);
  Result<json> sts = client_.Get(path);
  if (!sts.ok()) return sts.status();
  const int now_replicas = (*sts).value("spec", json::object()).value("replicas", -1);
  if (now_replicas == to) return {};  // done already (a re-issue after a crash)
  if (now_replicas != from) {
    return Status(ErrorCode::kUnavailable, "statefulset " + name + " has " +
                                               std::to_string(now_replicas) + " replicas, not " +
                                               std::to_string(from) + ": not scaled");
  }
  json patch = {
      {"metadata", {{"resourceVersion", (*sts)["metadata"].value("resourceVersion", "")}}},
      {"spec", {{"replicas", to}}}};
  return client_.Patch(path, patch, k8s::PatchType::kMerge).status();
}

std::string FormatMicroTime(TimeMs t) {
  const std::time_t secs = static_cast<std::time_t>(t / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(t % 1000) * 1000);
  return buf;
}

bool ParseMicroTime(const std::string& text, TimeMs* out) {
  std::tm tm{};
  int micros = 0;
  int n = std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%6dZ", &tm.tm_year, &tm.tm_mon,
                      &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &micros);
  if (n < 6) return false;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  *out = static_cast<TimeMs>(timegm(&tm)) * 1000 + micros / 1000;
  return true;
}

}  // namespace gpulet::broker
