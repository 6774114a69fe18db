// deploy/overlays/dra and deploy/examples/dra (issue 22 items 5 and 7): the overlay renders with
// `kubectl kustomize`; the DRA DaemonSet has the kubelet's plugin directories and CDI at the host's
// paths; the device plugin and the DRA driver never run on the same node (one node must not serve
// an extended resource from both); the driver's RBAC is exactly what it asks for; the admission
// policy holds each agent to its own node's slices; every DeviceClass selects gpulet's devices and
// every example claim names a class the overlay ships.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <map>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kustomize.h"

namespace gpulet::testing {
namespace {

const std::string kSource = GPULET_SOURCE_DIR;
constexpr char kDriver[] = "gpu.gpulet.io";

// The node-label requirement each nodeSelectorTerm puts on `key`: operator and values.
std::vector<std::pair<std::string, std::set<std::string>>> Requirements(const YAML::Node& pod,
                                                                        const std::string& key) {
  std::vector<std::pair<std::string, std::set<std::string>>> out;
  const YAML::Node terms =
      pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
         ["nodeSelectorTerms"];
  for (const YAML::Node& term : terms) {
    std::pair<std::string, std::set<std::string>> req{"absent", {}};
    for (const YAML::Node& e : term["matchExpressions"]) {
      if (e["key"].as<std::string>() == key) {
        req = {e["operator"].as<std::string>(), Strings(e["values"])};
      }
    }
    out.push_back(req);
  }
  return out;
}

class DraOverlay : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { docs_ = new std::vector<YAML::Node>(Render()); }
  static void TearDownTestSuite() {
    delete docs_;
    docs_ = nullptr;
  }
  static std::vector<YAML::Node> Render() {
    return RenderKustomization("deploy/overlays/dra");
  }
  static const std::vector<YAML::Node>& docs() { return *docs_; }
  static std::vector<YAML::Node>* docs_;
};
std::vector<YAML::Node>* DraOverlay::docs_ = nullptr;

TEST_F(DraOverlay, TheDriverDaemonSetHasThePluginDirectoriesAndCdiAtTheHostsPaths) {
  ASSERT_FALSE(docs().empty());
  const YAML::Node ds = Find(docs(), "DaemonSet", "gpulet-dra");
  ASSERT_TRUE(ds) << "no DaemonSet gpulet-dra";
  EXPECT_EQ(ds["metadata"]["namespace"].as<std::string>(), "gpulet-system");
  const YAML::Node pod = ds["spec"]["template"]["spec"];
  EXPECT_EQ(pod["serviceAccountName"].as<std::string>(), "gpulet-dra");
  const YAML::Node dra = Named(pod["containers"], "gpulet");
  ASSERT_TRUE(dra);
  EXPECT_EQ(dra["image"].as<std::string>(), "ghcr.io/gpulet/gpulet:0.1.0");
  EXPECT_EQ(dra["args"][0].as<std::string>(), "dra");
  const std::set<std::string> args = Strings(dra["args"]);
  EXPECT_TRUE(args.count("--node-name=$(NODE_NAME)"));

  // host path -> (mountPath, read only)
  std::map<std::string, std::pair<std::string, bool>> mounted = MountedHostPaths(pod, dra);
  // The kubelet and the runtime read what the driver writes there: same path, writable.
  for (const char* p : {"/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins",
                        "/var/run/cdi", "/run/gpulet/dra", "/run/nvidia/mps"}) {
    EXPECT_EQ(mounted[p], std::make_pair(std::string(p), false)) << p;
  }
  // The driver root, read only, where --driver-root says; the host's view in --host-driver-root.
  ASSERT_TRUE(mounted.count("/")) << "the driver root is not mounted";
  EXPECT_TRUE(mounted["/"].second);
  EXPECT_TRUE(args.count("--driver-root=" + mounted["/"].first));
  EXPECT_TRUE(args.count("--host-driver-root=/"));
  EXPECT_TRUE(args.count("--cdi-root=/var/run/cdi"));
  EXPECT_TRUE(args.count("--state-dir=/run/gpulet/dra"));
  // Read only, for the refusal to start beside a device plugin serving the mapped resources.
  EXPECT_EQ(mounted["/var/lib/kubelet/device-plugins"],
            std::make_pair(std::string("/var/lib/kubelet/device-plugins"), true));
  EXPECT_TRUE(args.count("--device-plugin-path=/var/lib/kubelet/device-plugins"));
  EXPECT_TRUE(args.count("--mps-root=/run/nvidia/mps"));
  EXPECT_TRUE(mounted["/usr/lib/gpulet"].second);
  EXPECT_TRUE(args.count("--cuda-library=" + mounted["/usr/lib/gpulet"].first +
                         "/libgpulet-cuda.so"));

  // Every container: no escalation, all capabilities dropped, read-only root, requests and
  // limits; only the driver adds one capability (MIG create/destroy, MPS compute mode).
  std::vector<YAML::Node> all;
  for (const YAML::Node& c : pod["containers"]) all.push_back(c);
  for (const YAML::Node& c : pod["initContainers"]) all.push_back(c);
  ASSERT_EQ(all.size(), 3u);
  for (const YAML::Node& c : all) {
    const std::string name = c["name"].as<std::string>();
    const YAML::Node sc = c["securityContext"];
    EXPECT_FALSE(sc["allowPrivilegeEscalation"].as<bool>()) << name;
    EXPECT_TRUE(sc["readOnlyRootFilesystem"].as<bool>()) << name;
    EXPECT_FALSE(sc["privileged"].IsDefined() && sc["privileged"].as<bool>()) << name;
    EXPECT_EQ(Strings(sc["capabilities"]["drop"]), std::set<std::string>{"ALL"}) << name;
    for (const char* kind : {"requests", "limits"}) {
      EXPECT_TRUE(c["resources"][kind]["cpu"].IsDefined()) << name << " " << kind;
      EXPECT_TRUE(c["resources"][kind]["memory"].IsDefined()) << name << " " << kind;
    }
    if (name == "gpulet") {
      EXPECT_EQ(Strings(sc["capabilities"]["add"]), std::set<std::string>{"SYS_ADMIN"});
    } else {
      EXPECT_FALSE(sc["capabilities"]["add"].IsDefined()) << name;
    }
  }

  // The exporter beside it attributes DRA devices from pod-resources, scraped like the others.
  const YAML::Node exporter = Named(pod["containers"], "exporter");
  ASSERT_TRUE(exporter);
  EXPECT_EQ(exporter["args"][0].as<std::string>(), "exporter");
  EXPECT_TRUE(Strings(exporter["args"]).count("--kubernetes"));
  const YAML::Node svc = Find(docs(), "Service", "gpulet-dra-metrics");
  ASSERT_TRUE(svc);
  const YAML::Node pod_labels = ds["spec"]["template"]["metadata"]["labels"];
  for (const auto& kv : svc["spec"]["selector"]) {
    EXPECT_EQ(pod_labels[kv.first.as<std::string>()].as<std::string>(),
              kv.second.as<std::string>());
  }
  const YAML::Node sm = Find(docs(), "ServiceMonitor", "gpulet");
  ASSERT_TRUE(sm);
  for (const auto& kv : sm["spec"]["selector"]["matchLabels"]) {
    EXPECT_EQ(svc["metadata"]["labels"][kv.first.as<std::string>()].as<std::string>(),
              kv.second.as<std::string>());
  }
  EXPECT_EQ(svc["metadata"]["labels"]["gpulet.io/scrape-job"].as<std::string>(),
            "gpulet-exporter");
}

// One node never serves nvidia.com/gpu from both: the device plugin's terms all exclude the DRA
// label, the driver's terms all require it.
TEST_F(DraOverlay, TheDevicePluginAndTheDriverRunOnDisjointNodes) {
  ASSERT_FALSE(docs().empty());
  const YAML::Node plugin = Find(docs(), "DaemonSet", "gpulet");
  const YAML::Node dra = Find(docs(), "DaemonSet", "gpulet-dra");
  ASSERT_TRUE(plugin && dra);
  EXPECT_EQ(Named(plugin["spec"]["template"]["spec"]["containers"], "gpulet")["args"][0]
                .as<std::string>(),
            "node");
  const auto p = Requirements(plugin["spec"]["template"]["spec"], "gpulet.io/dra");
  const auto d = Requirements(dra["spec"]["template"]["spec"], "gpulet.io/dra");
  ASSERT_EQ(p.size(), 2u);
  ASSERT_EQ(d.size(), 2u);
  for (const auto& r : p) EXPECT_EQ(r, std::make_pair(std::string("NotIn"), std::set<std::string>{"true"}));
  for (const auto& r : d) EXPECT_EQ(r, std::make_pair(std::string("In"), std::set<std::string>{"true"}));
  // Both still only on GPU nodes.
  for (const YAML::Node& ds : {plugin, dra}) {
    std::set<std::string> gpu_keys;
    for (const YAML::Node& term : ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
                                      ["requiredDuringSchedulingIgnoredDuringExecution"]
                                      ["nodeSelectorTerms"]) {
      for (const YAML::Node& e : term["matchExpressions"]) {
        if (e["key"].as<std::string>() != "gpulet.io/dra") gpu_keys.insert(e["key"].as<std::string>());
      }
    }
    EXPECT_EQ(gpu_keys, (std::set<std::string>{"nvidia.com/gpu.present",
                                               "feature.node.kubernetes.io/pci-10de.present"}));
  }
}

TEST_F(DraOverlay, TheDriverIsGrantedExactlyWhatItAsksFor) {
  ASSERT_FALSE(docs().empty());
  const YAML::Node crb = Find(docs(), "ClusterRoleBinding", "gpulet-dra");
  ASSERT_TRUE(crb);
  EXPECT_EQ(crb["subjects"][0]["name"].as<std::string>(), "gpulet-dra");
  EXPECT_EQ(crb["subjects"][0]["namespace"].as<std::string>(), "gpulet-system");
  const YAML::Node cr = Find(docs(), "ClusterRole", crb["roleRef"]["name"].as<std::string>());
  ASSERT_TRUE(cr);
  std::set<std::string> grants;  // "group/resource:verb"
  for (const YAML::Node& rule : cr["rules"]) {
    for (const YAML::Node& g : rule["apiGroups"]) {
      for (const YAML::Node& r : rule["resources"]) {
        for (const YAML::Node& v : rule["verbs"]) {
          grants.insert(g.as<std::string>() + "/" + r.as<std::string>() + ":" + v.as<std::string>());
        }
      }
    }
    if (rule["resourceNames"]) {
      EXPECT_EQ(Strings(rule["resourceNames"]), std::set<std::string>{kDriver});
    }
  }
  EXPECT_EQ(grants, (std::set<std::string>{
                        "resource.k8s.io/resourceslices:create",
                        "resource.k8s.io/resourceslices:update",
                        "resource.k8s.io/resourceslices:patch",
                        "resource.k8s.io/resourceslices:delete",
                        "resource.k8s.io/resourceslices:list",
                        "resource.k8s.io/resourceslices:watch",
                        "resource.k8s.io/resourceclaims:get",
                        "resource.k8s.io/resourceclaims:list",
                        "resource.k8s.io/resourceclaims:watch",
                        "resource.k8s.io/resourceclaims/status:update",
                        "resource.k8s.io/resourceclaims/status:patch",
                        "resource.k8s.io/resourceclaims/driver:associated-node:update",
                        "resource.k8s.io/resourceclaims/driver:associated-node:patch",
                        "/nodes:get",
                    }));
  // The device plugin's ServiceAccount gains nothing of resource.k8s.io.
  for (const YAML::Node& b : OfKind(docs(), "ClusterRoleBinding")) {
    if (b["subjects"][0]["name"].as<std::string>() != "gpulet") continue;
    const YAML::Node role = Find(docs(), "ClusterRole", b["roleRef"]["name"].as<std::string>());
    for (const YAML::Node& rule : role["rules"]) {
      EXPECT_FALSE(Strings(rule["apiGroups"]).count("resource.k8s.io"));
    }
  }
}

TEST_F(DraOverlay, TheAdmissionPolicyHoldsEachAgentToItsOwnNodesSlices) {
  ASSERT_FALSE(docs().empty());
  const YAML::Node vap = Find(docs(), "ValidatingAdmissionPolicy", "gpulet-dra-own-node-slices");
  ASSERT_TRUE(vap);
  const YAML::Node rule = vap["spec"]["matchConstraints"]["resourceRules"][0];
  EXPECT_EQ(Strings(rule["resources"]), std::set<std::string>{"resourceslices"});
  EXPECT_EQ(Strings(rule["apiGroups"]), std::set<std::string>{"resource.k8s.io"});
  EXPECT_EQ(Strings(rule["operations"]), (std::set<std::string>{"CREATE", "UPDATE", "DELETE"}));
  EXPECT_EQ(vap["spec"]["failurePolicy"].as<std::string>(), "Fail");
  std::string policy = vap["spec"]["matchConditions"][0]["expression"].as<std::string>();
  EXPECT_NE(policy.find("system:serviceaccount:gpulet-system:gpulet-dra'"), std::string::npos);
  for (const YAML::Node& v : vap["spec"]["variables"])
    policy += "\n" + v["expression"].as<std::string>();
  for (const YAML::Node& v : vap["spec"]["validations"])
    policy += "\n" + v["expression"].as<std::string>();
  EXPECT_NE(policy.find("request.userInfo.extra['authentication.kubernetes.io/node-name']"),
            std::string::npos)
      << policy;
  EXPECT_NE(policy.find("spec.nodeName == variables.node"), std::string::npos) << policy;
  EXPECT_NE(policy.find("oldObject"), std::string::npos) << "a DELETE has only oldObject";
  const YAML::Node binding =
      Find(docs(), "ValidatingAdmissionPolicyBinding", "gpulet-dra-own-node-slices");
  ASSERT_TRUE(binding);
  EXPECT_EQ(binding["spec"]["policyName"].as<std::string>(), "gpulet-dra-own-node-slices");
  EXPECT_EQ(Strings(binding["spec"]["validationActions"]), std::set<std::string>{"Deny"});
}

// Every class selects this driver's devices by their type attribute (src/dra/slices.cc); whole GPUs carry nvidia.com/gpu, MIG classes
// their profile's nvidia.com/mig-<profile>; no extended resource name is claimed twice.
TEST_F(DraOverlay, DeviceClassesSelectGpuletDevicesByKind) {
  ASSERT_FALSE(docs().empty());
  const std::vector<YAML::Node> classes = OfKind(docs(), "DeviceClass");
  ASSERT_GE(classes.size(), 4u);
  const std::regex dns_subdomain(R"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)");
  const std::regex profile_rx(R"re(\.profile == "([^"]+)")re");
  std::set<std::string> extended;
  std::set<std::string> kinds;
  for (const YAML::Node& c : classes) {
    const std::string name = c["metadata"]["name"].as<std::string>();
    EXPECT_EQ(c["apiVersion"].as<std::string>(), "resource.k8s.io/v1") << name;
    EXPECT_FALSE(c["metadata"]["namespace"].IsDefined()) << name << ": cluster-scoped";
    EXPECT_TRUE(std::regex_match(name, dns_subdomain)) << name;
    EXPECT_LE(name.size(), 253u) << name;
    ASSERT_EQ(c["spec"]["selectors"].size(), 1u) << name;
    const std::string cel = c["spec"]["selectors"][0]["cel"]["expression"].as<std::string>();
    EXPECT_EQ(cel.find("device.driver == \"gpu.gpulet.io\" &&"), 0u) << name << ": " << cel;
    std::smatch kind;
    ASSERT_TRUE(std::regex_search(cel, kind, std::regex(R"re(\.type == "([a-z-]+)")re"))) << cel;
    kinds.insert(kind[1]);
    const std::string ext =
        c["spec"]["extendedResourceName"] ? c["spec"]["extendedResourceName"].as<std::string>() : "";
    if (!ext.empty()) {
      EXPECT_TRUE(extended.insert(ext).second) << ext << " claimed twice";
    }
    std::smatch profile;
    if (kind[1] == "mig" && std::regex_search(cel, profile, profile_rx)) {
      const std::string p = profile[1];
      std::string slug = p;
      for (char& ch : slug) {
        if (ch == '+') ch = '-';
      }
      EXPECT_EQ(name, "mig-" + slug + ".gpulet.io");
      // '+' is not allowed in an extended resource name: such profiles have none.
      EXPECT_EQ(ext, p.find('+') == std::string::npos ? "nvidia.com/mig-" + p : "") << name;
    }
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"gpu", "memory-share", "mig"}));
  const YAML::Node gpu = Find(docs(), "DeviceClass", "gpu.gpulet.io");
  ASSERT_TRUE(gpu);
  EXPECT_EQ(gpu["spec"]["extendedResourceName"].as<std::string>(), "nvidia.com/gpu");
  EXPECT_NE(gpu["spec"]["selectors"][0]["cel"]["expression"].as<std::string>().find(
                "type == \"gpu\""),
            std::string::npos);
  EXPECT_TRUE(Find(docs(), "DeviceClass", "gpu-memory.gpulet.io"));
  EXPECT_TRUE(Find(docs(), "DeviceClass", "mig-1g.10gb.gpulet.io"));
}

// The example claims name classes the overlay ships; each pod's claims come from its templates.
TEST_F(DraOverlay, ExampleClaimsUseTheShippedClasses) {
  ASSERT_FALSE(docs().empty());
  std::set<std::string> classes;
  for (const YAML::Node& c : OfKind(docs(), "DeviceClass"))
    classes.insert(c["metadata"]["name"].as<std::string>());
  std::map<std::string, YAML::Node> requests;  // example file -> its first template's spec
  for (const char* file : {"one-gpu", "mig-1g", "memory-share-20gi", "two-gpus-nvlink",
                           "extended-resource"}) {
    SCOPED_TRACE(file);
    const std::vector<YAML::Node> ex =
        YAML::LoadAllFromFile(kSource + "/deploy/examples/dra/" + std::string(file) + ".yaml");
    ASSERT_FALSE(ex.empty());
    std::set<std::string> templates;
    for (const YAML::Node& t : OfKind(ex, "ResourceClaimTemplate")) {
      EXPECT_EQ(t["apiVersion"].as<std::string>(), "resource.k8s.io/v1");
      templates.insert(t["metadata"]["name"].as<std::string>());
      for (const YAML::Node& r : t["spec"]["spec"]["devices"]["requests"]) {
        EXPECT_TRUE(classes.count(r["exactly"]["deviceClassName"].as<std::string>()))
            << r["exactly"]["deviceClassName"].as<std::string>();
      }
      requests[file] = t["spec"]["spec"]["devices"];
    }
    const std::vector<YAML::Node> pods = OfKind(ex, "Pod");
    ASSERT_EQ(pods.size(), 1u);
    const YAML::Node spec = pods[0]["spec"];
    std::set<std::string> pod_claims;
    for (const YAML::Node& rc : spec["resourceClaims"]) {
      EXPECT_TRUE(templates.count(rc["resourceClaimTemplateName"].as<std::string>()));
      pod_claims.insert(rc["name"].as<std::string>());
    }
    for (const YAML::Node& c : spec["containers"]) {
      for (const YAML::Node& cl : c["resources"]["claims"]) {
        EXPECT_TRUE(pod_claims.count(cl["name"].as<std::string>()));
      }
    }
  }
  // A 20 GiB share of the memory class; two GPUs of one NVLink domain; the extended resource.
  const YAML::Node share = requests["memory-share-20gi"]["requests"][0]["exactly"];
  EXPECT_EQ(share["deviceClassName"].as<std::string>(), "gpu-memory.gpulet.io");
  EXPECT_EQ(share["capacity"]["requests"]["memory"].as<std::string>(), "20Gi");
  const YAML::Node pair = requests["two-gpus-nvlink"];
  EXPECT_EQ(pair["requests"][0]["exactly"]["count"].as<int>(), 2);
  EXPECT_EQ(pair["constraints"][0]["matchAttribute"].as<std::string>().rfind("gpu.gpulet.io/", 0),
            0u);
  EXPECT_EQ(requests["mig-1g"]["requests"][0]["exactly"]["deviceClassName"].as<std::string>(),
            "mig-1g.10gb.gpulet.io");
  const YAML::Node ext = YAML::LoadFile(kSource + "/deploy/examples/dra/extended-resource.yaml");
  EXPECT_EQ(ext["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"].as<int>(), 1);
}

}  // namespace
}  // namespace gpulet::testing
