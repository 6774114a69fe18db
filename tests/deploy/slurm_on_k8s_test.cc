// deploy/overlays/slurm-on-k8s: renders with `kubectl kustomize` and checks what the
// Slurm-on-Kubernetes contract (docs/slurm-on-kubernetes.md) needs from the manifests: the
// PodDisruptionBudget on busy pods, the long grace period, the downward API the entrypoint reads,
// least-privilege RBAC and the admission policy that narrows it, and GPU requests that name a
// resource the device plugin advertises.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "../cli/run_command.h"
#include "kustomize.h"

namespace gpulet::testing {
namespace {

namespace fs = std::filesystem;
const std::string kSource = GPULET_SOURCE_DIR;
const std::string kOverlay = "deploy/overlays/slurm-on-k8s";

std::vector<YAML::Node> Render(const std::string& dir) { return RenderKustomization(dir); }

std::string S(const YAML::Node& n) {
  return n.IsDefined() && n.IsScalar() ? n.as<std::string>() : "";
}

std::vector<YAML::Node> OfKind(const std::vector<YAML::Node>& docs, const std::string& kind) {
  std::vector<YAML::Node> out;
  for (const YAML::Node& d : docs) {
    if (S(d["kind"]) == kind) out.push_back(d);
  }
  return out;
}

YAML::Node Find(const std::vector<YAML::Node>& docs, const std::string& kind,
                const std::string& name) {
  for (const YAML::Node& d : OfKind(docs, kind)) {
    if (S(d["metadata"]["name"]) == name) return d;
  }
  return YAML::Node();
}

YAML::Node Named(const YAML::Node& list, const std::string& name) {
  for (const YAML::Node& item : list) {
    if (S(item["name"]) == name) return item;
  }
  return YAML::Node();
}

std::set<std::string> Strings(const YAML::Node& list) {
  std::set<std::string> out;
  for (const YAML::Node& s : list) out.insert(s.as<std::string>());
  return out;
}

// The slurmd StatefulSets: those whose pods run `gpulet slurm pod`.
std::vector<YAML::Node> SlurmdPools(const std::vector<YAML::Node>& docs) {
  std::vector<YAML::Node> out;
  for (const YAML::Node& sts : OfKind(docs, "StatefulSet")) {
    for (const YAML::Node& c : sts["spec"]["template"]["spec"]["containers"]) {
      const YAML::Node args = c["args"];
      if (S(c["command"][0]) == "gpulet" && args.size() >= 2 && S(args[0]) == "slurm" &&
          S(args[1]) == "pod") {
        out.push_back(sts);
      }
    }
  }
  return out;
}

YAML::Node SlurmdContainer(const YAML::Node& sts) {
  for (const YAML::Node& c : sts["spec"]["template"]["spec"]["containers"]) {
    if (S(c["command"][0]) == "gpulet") return c;
  }
  return YAML::Node();
}

// (resource, verb) granted to ServiceAccount ns/sa by Roles and ClusterRoles bound to it, with
// the kinds of the granting roles.
std::set<std::pair<std::string, std::string>> Grants(const std::vector<YAML::Node>& docs,
                                                     const std::string& ns, const std::string& sa,
                                                     std::set<std::string>* role_kinds) {
  std::set<std::pair<std::string, std::string>> roles;
  for (const YAML::Node& d : docs) {
    const std::string kind = S(d["kind"]);
    if (kind != "RoleBinding" && kind != "ClusterRoleBinding") continue;
    for (const YAML::Node& s : d["subjects"]) {
      if (S(s["kind"]) == "ServiceAccount" && S(s["name"]) == sa && S(s["namespace"]) == ns) {
        roles.insert({S(d["roleRef"]["kind"]), S(d["roleRef"]["name"])});
      }
    }
  }
  std::set<std::pair<std::string, std::string>> out;
  for (const YAML::Node& d : docs) {
    if (!roles.count({S(d["kind"]), S(d["metadata"]["name"])})) continue;
    role_kinds->insert(S(d["kind"]));
    for (const YAML::Node& rule : d["rules"]) {
      for (const YAML::Node& r : rule["resources"]) {
        for (const YAML::Node& v : rule["verbs"])
          out.insert({r.as<std::string>(), v.as<std::string>()});
      }
    }
  }
  return out;
}

std::string ReadSource(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Non-test .cc files under `dir` whose name starts with `prefix`, concatenated.
std::string Sources(const std::string& dir, const std::string& prefix) {
  std::string all;
  for (const auto& e : fs::directory_iterator(kSource + "/" + dir)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".cc" || name.rfind(prefix, 0) != 0 ||
        name.find("_test") != std::string::npos) {
      continue;
    }
    all += ReadSource(e.path());
  }
  return all;
}

class SlurmOnK8s : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { docs_ = new std::vector<YAML::Node>(Render(kOverlay)); }
  static void TearDownTestSuite() {
    delete docs_;
    docs_ = nullptr;
  }
  static std::vector<YAML::Node>* docs_;
};
std::vector<YAML::Node>* SlurmOnK8s::docs_ = nullptr;

TEST_F(SlurmOnK8s, PdbKeepsBusySlurmdPodsAndSelectsOnlyThem) {
  const std::vector<YAML::Node>& docs = *docs_;
  ASSERT_FALSE(docs.empty());
  const std::vector<YAML::Node> pdbs = OfKind(docs, "PodDisruptionBudget");
  ASSERT_EQ(pdbs.size(), 1u);
  const YAML::Node spec = pdbs[0]["spec"];
  EXPECT_EQ(S(spec["maxUnavailable"]), "0");
  EXPECT_FALSE(spec["minAvailable"].IsDefined()) << "maxUnavailable 0 alone, as the contract says";
  const YAML::Node match = spec["selector"]["matchLabels"];
  EXPECT_EQ(S(match["slurm.gpulet.io/busy"]), "true");
  const std::vector<YAML::Node> pools = SlurmdPools(docs);
  ASSERT_FALSE(pools.empty());
  for (const YAML::Node& sts : pools) {
    SCOPED_TRACE(S(sts["metadata"]["name"]));
    EXPECT_EQ(S(sts["metadata"]["namespace"]), S(pdbs[0]["metadata"]["namespace"]));
    const YAML::Node labels = sts["spec"]["template"]["metadata"]["labels"];
    // Every selector label but busy is on the pod, so a busy pod is selected.
    for (const auto& kv : match) {
      const std::string key = kv.first.as<std::string>();
      if (key == "slurm.gpulet.io/busy") continue;
      EXPECT_EQ(S(labels[key]), kv.second.as<std::string>()) << key;
    }
    // Pods start idle; the entrypoint sets busy while jobs run.
    EXPECT_EQ(S(labels["slurm.gpulet.io/busy"]), "false");
  }
}

TEST_F(SlurmOnK8s, SlurmdPodsWaitForJobsAndSeeTheirNameNamespaceAndLabels) {
  const std::vector<YAML::Node> pools = SlurmdPools(*docs_);
  ASSERT_FALSE(pools.empty());
  for (const YAML::Node& sts : pools) {
    SCOPED_TRACE(S(sts["metadata"]["name"]));
    const YAML::Node pod = sts["spec"]["template"]["spec"];
    // Long enough for jobs to finish after SIGTERM (at least an hour; the example says a day).
    EXPECT_GE(pod["terminationGracePeriodSeconds"].as<long>(), 3600);
    EXPECT_EQ(S(sts["spec"]["serviceName"]), "slurmd");
    const YAML::Node labels = sts["spec"]["template"]["metadata"]["labels"];
    EXPECT_FALSE(S(labels["slurm.gpulet.io/partition"]).empty());
    // Label values cannot hold commas: one feature per pool in the manifests.
    EXPECT_TRUE(std::regex_match(S(labels["slurm.gpulet.io/features"]),
                                 std::regex(R"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)")));

    const YAML::Node c = SlurmdContainer(sts);
    ASSERT_TRUE(c);
    EXPECT_EQ(S(Named(c["env"], "POD_NAME")["valueFrom"]["fieldRef"]["fieldPath"]),
              "metadata.name");
    EXPECT_EQ(S(Named(c["env"], "POD_NAMESPACE")["valueFrom"]["fieldRef"]["fieldPath"]),
              "metadata.namespace");
    // The labels file at the entrypoint's default path, from the downward API.
    std::string podinfo_volume;
    for (const YAML::Node& m : c["volumeMounts"]) {
      if (S(m["mountPath"]) == "/etc/podinfo") podinfo_volume = S(m["name"]);
    }
    ASSERT_FALSE(podinfo_volume.empty()) << "nothing mounted at /etc/podinfo";
    const YAML::Node items = Named(pod["volumes"], podinfo_volume)["downwardAPI"]["items"];
    ASSERT_TRUE(items.IsSequence());
    bool labels_file = false;
    bool annotations_file = false;  // a features list: label values cannot hold commas
    for (const YAML::Node& i : items) {
      if (S(i["path"]) == "labels" && S(i["fieldRef"]["fieldPath"]) == "metadata.labels") {
        labels_file = true;
      }
      if (S(i["path"]) == "annotations" &&
          S(i["fieldRef"]["fieldPath"]) == "metadata.annotations") {
        annotations_file = true;
      }
    }
    EXPECT_TRUE(labels_file);
    EXPECT_TRUE(annotations_file);
    for (const std::string& a : Strings(c["args"])) {
      if (a.rfind("--pod-labels-file=", 0) == 0) {
        EXPECT_EQ(a, "--pod-labels-file=/etc/podinfo/labels");
      }
    }
    // munge: the Secret is referenced, never shipped.
    EXPECT_EQ(S(Named(pod["volumes"], "munge-key")["secret"]["secretName"]), "slurm-munge-key");
  }
  EXPECT_TRUE(OfKind(*docs_, "Secret").empty()) << "a munge key must never be in the repository";
}

// The GPU resources the device plugin advertises: nvidia.com/gpu, one nvidia.com/mig-<profile>
// per MIG profile (mixed strategy), and every `rename:` of a shared resource in the node agent's
// config ConfigMap.
std::set<std::string> RenamedResources() {
  std::set<std::string> out;
  const std::string text = ReadSource(kSource + "/deploy/base/configmap.yaml");
  const std::regex rename(R"(rename:\s*([A-Za-z0-9./_-]+))");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), rename);
       it != std::sregex_iterator(); ++it) {
    out.insert((*it)[1].str());
  }
  return out;
}

bool Advertised(const std::string& resource) {
  if (resource == "nvidia.com/gpu") return true;
  if (std::regex_match(resource, std::regex(R"(nvidia\.com/mig-\d+g\.\d+gb(\+me)?)"))) return true;
  return RenamedResources().count(resource) > 0;
}

TEST_F(SlurmOnK8s, SlurmdRequestsGpusTheDevicePluginAdvertises) {
  EXPECT_TRUE(RenamedResources().count("nvidia.com/gpu.shared")) << "the base config changed";
  EXPECT_FALSE(Advertised("nvidia.com/gpu-h100"));
  for (const YAML::Node& sts : SlurmdPools(*docs_)) {
    SCOPED_TRACE(S(sts["metadata"]["name"]));
    const YAML::Node res = SlurmdContainer(sts)["resources"];
    int gpu_resources = 0;
    for (const auto& kv : res["limits"]) {
      const std::string name = kv.first.as<std::string>();
      if (name.rfind("nvidia.com/", 0) != 0) continue;
      ++gpu_resources;
      EXPECT_TRUE(Advertised(name))
          << name << " is not a resource gpulet's device plugin advertises";
      EXPECT_GE(kv.second.as<int>(), 1) << name;
      // Extended resources: request = limit (Kubernetes rejects anything else).
      EXPECT_EQ(S(res["requests"][name]), kv.second.as<std::string>()) << name;
    }
    EXPECT_EQ(gpu_resources, 1) << "one GPU resource per pool (its GRES come from it)";
    // Guaranteed QoS, so the CPUs and memory the entrypoint reports are the pod's.
    for (const char* r : {"cpu", "memory"}) {
      EXPECT_EQ(S(res["requests"][r]), S(res["limits"][r])) << r;
    }
  }
  // The example pool of the issue: H100 pods of 4 GPUs each.
  const YAML::Node h100 = Find(*docs_, "StatefulSet", "slurmd-h100");
  ASSERT_TRUE(h100);
  EXPECT_EQ(SlurmdContainer(h100)["resources"]["limits"]["nvidia.com/gpu"].as<int>(), 4);
}

TEST_F(SlurmOnK8s, SlurmdRbacIsPatchOnPodsInItsNamespaceOnly) {
  const std::vector<YAML::Node> pools = SlurmdPools(*docs_);
  ASSERT_FALSE(pools.empty());
  const std::string ns = S(pools[0]["metadata"]["namespace"]);
  const std::string sa = S(pools[0]["spec"]["template"]["spec"]["serviceAccountName"]);
  ASSERT_FALSE(sa.empty());
  EXPECT_NE(sa, "default");
  std::set<std::string> kinds;
  const auto grants = Grants(*docs_, ns, sa, &kinds);
  EXPECT_EQ(grants, (std::set<std::pair<std::string, std::string>>{{"pods", "patch"}}));
  EXPECT_EQ(kinds, std::set<std::string>{"Role"}) << "namespaced, never a ClusterRole";
}

// The grants against the entrypoint's code (`gpulet slurm pod`: src/slurm/pod*.cc and
// src/cli/cmd_slurm_pod.cc): the verbs it is granted on pods are exactly the requests it makes.
TEST_F(SlurmOnK8s, SlurmdGrantsAreExactlyTheEntrypointsRequests) {
  const std::string code = Sources("src/slurm", "pod") + Sources("src/cli", "cmd_slurm_pod");
  ASSERT_FALSE(code.empty())
      << "the entrypoint (src/slurm/pod*.cc, src/cli/cmd_slurm_pod.cc) is missing";
  ASSERT_NE(code.find("/pods/"), std::string::npos) << "the entrypoint names no pod path";
  // Requests through the k8s::Client (held in a variable named client…); other objects' methods
  // (a Slurm node's Delete) are not API calls.
  const std::map<std::string, std::string> call = {{"get", "Get"},
                                                   {"patch", "Patch"},
                                                   {"update", "Put"},
                                                   {"create", "Post"},
                                                   {"delete", "Delete"}};
  std::set<std::pair<std::string, std::string>> used;
  for (const auto& [verb, method] : call) {
    if (std::regex_search(code, std::regex(R"(client\w*\s*(\.|->)\s*)" + method + R"(\()"))) {
      used.insert({"pods", verb});
    }
  }
  const std::vector<YAML::Node> pools = SlurmdPools(*docs_);
  ASSERT_FALSE(pools.empty());
  std::set<std::string> kinds;
  EXPECT_EQ(Grants(*docs_, S(pools[0]["metadata"]["namespace"]),
                   S(pools[0]["spec"]["template"]["spec"]["serviceAccountName"]), &kinds),
            used)
      << "slurmd-rbac.yaml must grant exactly the API requests `gpulet slurm pod` makes";
}

TEST_F(SlurmOnK8s, AdmissionPolicyLimitsTheServiceAccountToItsOwnBusyLabel) {
  const std::vector<YAML::Node> pools = SlurmdPools(*docs_);
  ASSERT_FALSE(pools.empty());
  const std::string ns = S(pools[0]["metadata"]["namespace"]);
  const std::string sa = S(pools[0]["spec"]["template"]["spec"]["serviceAccountName"]);
  const std::vector<YAML::Node> policies = OfKind(*docs_, "ValidatingAdmissionPolicy");
  ASSERT_EQ(policies.size(), 1u);
  const YAML::Node p = policies[0];
  EXPECT_FALSE(p["metadata"]["namespace"].IsDefined()) << "cluster-scoped";
  EXPECT_EQ(S(p["spec"]["failurePolicy"]), "Fail");
  const YAML::Node rule = p["spec"]["matchConstraints"]["resourceRules"][0];
  EXPECT_EQ(Strings(rule["resources"]), std::set<std::string>{"pods"});
  EXPECT_TRUE(Strings(rule["operations"]).count("UPDATE"));
  // Applies to exactly the slurmd ServiceAccount.
  const std::string who = "'system:serviceaccount:" + ns + ":" + sa + "'";
  EXPECT_NE(S(p["spec"]["matchConditions"][0]["expression"]).find(who), std::string::npos)
      << "matchConditions must name " << who;
  std::string cel;
  for (const YAML::Node& v : p["spec"]["variables"]) cel += S(v["expression"]) + "\n";
  for (const YAML::Node& v : p["spec"]["validations"]) cel += S(v["expression"]) + "\n";
  EXPECT_NE(cel.find("request.userInfo.extra['authentication.kubernetes.io/pod-name']"),
            std::string::npos);
  EXPECT_NE(cel.find("object.metadata.name"), std::string::npos);
  EXPECT_NE(cel.find("'slurm.gpulet.io/busy'"), std::string::npos);
  EXPECT_NE(cel.find("oldObject.metadata.labels"), std::string::npos);
  const std::vector<YAML::Node> bindings = OfKind(*docs_, "ValidatingAdmissionPolicyBinding");
  ASSERT_EQ(bindings.size(), 1u);
  EXPECT_EQ(S(bindings[0]["spec"]["policyName"]), S(p["metadata"]["name"]));
  EXPECT_EQ(Strings(bindings[0]["spec"]["validationActions"]), std::set<std::string>{"Deny"});
}

TEST_F(SlurmOnK8s, SlurmctldKeepsItsStateOnAVolumeAndSlurmConfUsesDynamicNodes) {
  const YAML::Node ctld = Find(*docs_, "StatefulSet", "slurmctld");
  ASSERT_TRUE(ctld);
  EXPECT_EQ(ctld["spec"]["replicas"].as<int>(), 1);
  const YAML::Node svc = Find(*docs_, "Service", S(ctld["spec"]["serviceName"]));
  ASSERT_TRUE(svc);
  EXPECT_EQ(S(svc["spec"]["clusterIP"]), "None");
  const YAML::Node claim = ctld["spec"]["volumeClaimTemplates"][0];
  ASSERT_TRUE(claim);
  std::string state_mount;
  for (const YAML::Node& m :
       Named(ctld["spec"]["template"]["spec"]["containers"], "slurmctld")["volumeMounts"]) {
    if (S(m["name"]) == S(claim["metadata"]["name"])) state_mount = S(m["mountPath"]);
  }
  const YAML::Node conf = Find(*docs_, "ConfigMap", "slurm-conf");
  ASSERT_TRUE(conf);
  const std::string slurm_conf = S(conf["data"]["slurm.conf"]);
  EXPECT_NE(slurm_conf.find("StateSaveLocation=" + state_mount + "\n"), std::string::npos)
      << "StateSaveLocation must be the volume (" << state_mount << ")";
  EXPECT_NE(slurm_conf.find("SlurmctldHost=slurmctld-0("), std::string::npos);
  EXPECT_NE(slurm_conf.find("AuthType=auth/munge"), std::string::npos);
  EXPECT_TRUE(std::regex_search(slurm_conf, std::regex(R"((^|\n)MaxNodeCount=\d+)")))
      << "22.05 dynamic nodes need MaxNodeCount";
  EXPECT_TRUE(std::regex_search(slurm_conf, std::regex(R"((^|\n)GresTypes=gpu)")));
  EXPECT_FALSE(std::regex_search(slurm_conf, std::regex(R"((^|\n)NodeName=)")))
      << "the slurmd pods register themselves (slurmd -Z); no static nodes";
  // Each pool's feature selects a NodeSet, so its pods land in a partition.
  for (const YAML::Node& sts : SlurmdPools(*docs_)) {
    const std::string feature =
        S(sts["spec"]["template"]["metadata"]["labels"]["slurm.gpulet.io/features"]);
    EXPECT_TRUE(
        std::regex_search(slurm_conf, std::regex("(^|\\n)NodeSet=\\S+ Feature=" + feature + "\\n")))
        << feature;
  }
}

TEST_F(SlurmOnK8s, BrokerMayScaleTheSlurmdStatefulSetsAndNothingElseHere) {
  std::set<std::string> kinds;
  const auto grants = Grants(*docs_, "gpulet-system", "gpulet-broker", &kinds);
  EXPECT_EQ(grants, (std::set<std::pair<std::string, std::string>>{{"statefulsets", "get"},
                                                                   {"statefulsets", "patch"}}));
  EXPECT_EQ(kinds, std::set<std::string>{"Role"});
  // Both used by the broker's code.
  const std::string code = Sources("src/broker", "");
  EXPECT_NE(code.find("/statefulsets/"), std::string::npos);
  EXPECT_TRUE(std::regex_search(code, std::regex(R"(\.Get\()")));
  EXPECT_TRUE(std::regex_search(code, std::regex(R"(\.Patch\()")));
}

}  // namespace
}  // namespace gpulet::testing
