#include "metrics/pod_uids.h"

namespace gpulet::metrics {

PodUidMap PodUidsFromList(const nlohmann::json& pod_list) {
  PodUidMap out;
  if (!pod_list.is_object() || !pod_list.contains("items") || !pod_list["items"].is_array()) {
    return out;
  }
  for (const nlohmann::json& pod : pod_list["items"]) {
    const nlohmann::json meta = pod.value("metadata", nlohmann::json::object());
    if (!meta.is_object()) continue;
    const std::string ns = meta.value("namespace", "");
    const std::string name = meta.value("name", "");
    const std::string uid = meta.value("uid", "");
    if (name.empty() || uid.empty()) continue;
    out[{ns, name}] = uid;
  }
  return out;
}

Result<PodUidMap> ListPodUids(const k8s::Client& client, const std::string& node_name) {
  std::string path = "/api/v1/pods";
  if (!node_name.empty()) {
    path += "?fieldSelector=" + k8s::EscapeQueryValue("spec.nodeName=" + node_name);
  }
  k8s::ApiResult<nlohmann::json> list = client.Get(path);
  if (!list.ok()) return list.status();
  return PodUidsFromList(*list);
}

}  // namespace gpulet::metrics
