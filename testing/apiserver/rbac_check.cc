#include "apiserver/rbac_check.h"

#include <yaml-cpp/yaml.h>

#include <sstream>

namespace gpulet::testing {

std::set<std::string> RbacVerbsNeeded(const std::vector<RecordedRequest>& requests) {
  std::set<std::string> out;
  for (const RecordedRequest& r : requests) {
    std::vector<std::string> parts;
    std::stringstream ss(r.path);
    for (std::string p; std::getline(ss, p, '/');) {
      if (!p.empty()) parts.push_back(p);
    }
    // /api/v1/... or /apis/<group>/<version>/...; then namespaces/<ns>/ when namespaced.
    size_t i = 0;
    std::string group;
    if (parts.size() >= 3 && parts[0] == "api") {
      i = 2;
    } else if (parts.size() >= 4 && parts[0] == "apis") {
      group = parts[1];
      i = 3;
    } else {
      continue;  // discovery and the like
    }
    // "namespaces/<ns>/<resource>…" is namespaced; "namespaces/<ns>" alone is the Namespace.
    if (parts.size() > i + 2 && parts[i] == "namespaces") i += 2;
    std::string resource = parts[i];
    const bool named = parts.size() > i + 1;
    if (parts.size() > i + 2) resource += "/" + parts[i + 2];
    std::string verb;
    if (r.method == "GET") {
      const bool watch = r.query.find("watch=1") != std::string::npos ||
                         r.query.find("watch=true") != std::string::npos;
      verb = named ? "get" : (watch ? "watch" : "list");
    } else if (r.method == "POST") {
      verb = "create";
    } else if (r.method == "PUT") {
      verb = "update";
    } else if (r.method == "PATCH") {
      verb = "patch";
    } else if (r.method == "DELETE") {
      verb = named ? "delete" : "deletecollection";
    } else {
      continue;
    }
    out.insert(group + "/" + resource + ":" + verb);
    if (group == "resource.k8s.io" && resource == "resourceclaims/status" &&
        (verb == "update" || verb == "patch")) {
      out.insert(group + "/resourceclaims/driver:associated-node:" + verb);
    }
  }
  return out;
}

std::set<std::string> RbacVerbsGranted(const std::vector<std::string>& manifest_files) {
  std::set<std::string> out;
  for (const std::string& file : manifest_files) {
    for (const YAML::Node& doc :
         YAML::LoadAllFromFile(std::string(GPULET_RBAC_SOURCE_DIR) + "/" + file)) {
      if (!doc.IsMap() || !doc["kind"]) continue;
      const std::string kind = doc["kind"].as<std::string>();
      if (kind != "ClusterRole" && kind != "Role") continue;
      for (const YAML::Node& rule : doc["rules"]) {
        for (const YAML::Node& g : rule["apiGroups"]) {
          for (const YAML::Node& res : rule["resources"]) {
            for (const YAML::Node& v : rule["verbs"]) {
              out.insert(g.as<std::string>() + "/" + res.as<std::string>() + ":" +
                         v.as<std::string>());
            }
          }
        }
      }
    }
  }
  return out;
}

std::vector<std::string> RbacVerbsNotGranted(const std::vector<RecordedRequest>& requests,
                                             const std::vector<std::string>& manifest_files) {
  const std::set<std::string> granted = RbacVerbsGranted(manifest_files);
  std::vector<std::string> out;
  for (const std::string& v : RbacVerbsNeeded(requests)) {
    if (!granted.count(v)) out.push_back(v);
  }
  return out;
}

}  // namespace gpulet::testing
