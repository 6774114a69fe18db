// ResourceClaims as the API server returns them once the scheduler allocated and reserved them
// (resource.k8s.io/v1), for the plugin's tests, the kubelet harness tests and the benchmark.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dra/names.h"

namespace gpulet::dra::testing {

struct TestResult {
  std::string request;
  std::string device;
  std::string share_id;      // set for a share of an allowMultipleAllocations device
  std::string memory;        // consumedCapacity "memory" when set ("20Gi")
  std::string driver = kDriverName;
  std::string pool;          // empty: the node's
  bool admin_access = false;
};

struct TestClaim {
  std::string namespace_ = "default";
  std::string name;
  std::string uid;
  std::string node;  // nodeSelector matchFields metadata.name, and the default pool
  std::vector<TestResult> results;
  std::vector<std::string> reserved_for = {"pod-uid-1"};  // pod UIDs
  bool allocated = true;
  nlohmann::json config = nlohmann::json::array();
};

inline std::string ClaimObjectPath(const std::string& ns, const std::string& name) {
  return "/apis/resource.k8s.io/v1/namespaces/" + ns + "/resourceclaims/" + name;
}

inline nlohmann::json MakeClaimObject(const TestClaim& c) {
  nlohmann::json obj = {
      {"apiVersion", "resource.k8s.io/v1"},
      {"kind", "ResourceClaim"},
      {"metadata", {{"namespace", c.namespace_}, {"name", c.name}, {"uid", c.uid}}},
      {"spec", {{"devices", {{"requests", nlohmann::json::array()}}}}},
      {"status", nlohmann::json::object()}};
  if (c.allocated) {
    nlohmann::json results = nlohmann::json::array();
    for (const TestResult& r : c.results) {
      nlohmann::json j = {{"request", r.request},
                          {"driver", r.driver},
                          {"pool", r.pool.empty() ? c.node : r.pool},
                          {"device", r.device}};
      if (!r.share_id.empty()) j["shareID"] = r.share_id;
      if (!r.memory.empty()) j["consumedCapacity"] = {{"memory", r.memory}};
      if (r.admin_access) j["adminAccess"] = true;
      results.push_back(std::move(j));
    }
    obj["status"]["allocation"] = {
        {"devices", {{"results", std::move(results)}, {"config", c.config}}},
        {"nodeSelector",
         {{"nodeSelectorTerms",
           nlohmann::json::array(
               {{{"matchFields", nlohmann::json::array({{{"key", "metadata.name"},
                                                          {"operator", "In"},
                                                          {"values", {c.node}}}})}}})}}}};
  }
  nlohmann::json reserved = nlohmann::json::array();
  for (const std::string& pod : c.reserved_for) {
    reserved.push_back({{"resource", "pods"}, {"name", "pod-" + pod}, {"uid", pod}});
  }
  if (!reserved.empty()) obj["status"]["reservedFor"] = std::move(reserved);
  return obj;
}

}  // namespace gpulet::dra::testing
