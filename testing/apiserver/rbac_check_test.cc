#include "apiserver/rbac_check.h"

#include <gtest/gtest.h>

namespace gpulet::testing {
namespace {

RecordedRequest Req(const std::string& method, const std::string& path,
                    const std::string& query = "") {
  return RecordedRequest{method, path, query, "", 0};
}

TEST(RbacCheck, RequestsMapToTheVerbsTheApiServerChecks) {
  EXPECT_EQ(RbacVerbsNeeded({
                Req("GET", "/api/v1/nodes/n1"),
                Req("GET", "/api/v1/nodes", "fieldSelector=metadata.name%3Dn1"),
                Req("GET", "/api/v1/nodes", "watch=1&resourceVersion=3"),
                Req("POST", "/api/v1/namespaces/ns/pods/p/binding"),
                Req("POST", "/api/v1/namespaces/ns/pods/p/eviction"),
                Req("PATCH", "/apis/apps/v1/namespaces/slurm/statefulsets/s"),
                Req("PUT", "/apis/coordination.k8s.io/v1/namespaces/x/leases/l"),
                Req("DELETE", "/apis/resource.k8s.io/v1/resourceslices/s-1"),
                Req("GET", "/api/v1/namespaces/ns"),
                Req("GET", "/version"),
            }),
            (std::set<std::string>{
                "/nodes:get",
                "/nodes:list",
                "/nodes:watch",
                "/pods/binding:create",
                "/pods/eviction:create",
                "apps/statefulsets:patch",
                "coordination.k8s.io/leases:update",
                "resource.k8s.io/resourceslices:delete",
                "/namespaces:get",
            }));
  // A claim's status write also needs the driver subresource's node-aware verb (1.36).
  EXPECT_EQ(RbacVerbsNeeded({Req("PATCH",
                                 "/apis/resource.k8s.io/v1/namespaces/d/resourceclaims/c/status")}),
            (std::set<std::string>{"resource.k8s.io/resourceclaims/status:patch",
                                   "resource.k8s.io/resourceclaims/driver:associated-node:patch"}));
}

TEST(RbacCheck, GrantsAreReadFromTheShippedRoles) {
  const std::set<std::string> extender = RbacVerbsGranted({"deploy/extender/rbac.yaml"});
  EXPECT_TRUE(extender.count("/pods/binding:create"));
  EXPECT_FALSE(extender.count("/pods:delete"));
  EXPECT_EQ(RbacVerbsNotGranted({Req("POST", "/api/v1/namespaces/ns/pods/p/binding"),
                                 Req("DELETE", "/api/v1/namespaces/ns/pods/p")},
                                {"deploy/extender/rbac.yaml"}),
            std::vector<std::string>{"/pods:delete"});
}

}  // namespace
}  // namespace gpulet::testing
