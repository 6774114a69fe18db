// The fake API server checks no RBAC, so a verb missing from a shipped Role or ClusterRole would
// only show on a cluster (it did: deploy/overlays/dra had no "patch" for what the DRA driver
// patches). These turn what a component sent the fake API server into the RBAC grants it needs,
// and check them against the manifests that ship its roles.
//
// A request's verb follows the API server's request-info resolver
// (staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go): GET of an object is get, of
// a collection list (watch=1 or watch=true: watch); POST create, PUT update, PATCH patch; DELETE of
// an object delete, of a collection deletecollection. Subresources name themselves
// ("pods/binding"). A write of a ResourceClaim's status also needs, from Kubernetes 1.36, the
// synthetic resourceclaims/driver subresource with the node-aware verb (DRAResourceClaimGranular
// StatusAuthorization; ../shared/references/dra.md).
//
// Grants are "group/resource:verb" (the core group is ""). Namespaces are not compared: a Role
// grants here as if cluster-wide, so a grant in the wrong namespace is not caught.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "apiserver/fake_apiserver.h"

namespace gpulet::testing {

std::set<std::string> RbacVerbsNeeded(const std::vector<RecordedRequest>& requests);

// Every rule of every Role and ClusterRole in the files (paths under the source tree, e.g.
// "deploy/broker/rbac.yaml"). Resource names (resourceNames) are not narrowed.
std::set<std::string> RbacVerbsGranted(const std::vector<std::string>& manifest_files);

// What `requests` need that `manifest_files` do not grant, sorted; empty when all is granted.
std::vector<std::string> RbacVerbsNotGranted(const std::vector<RecordedRequest>& requests,
                                             const std::vector<std::string>& manifest_files);

}  // namespace gpulet::testing
