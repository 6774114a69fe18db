// Least privilege, checked against the code: every verb a gpulet ServiceAccount is granted must
// be used by the code that runs under it. The manifests are rendered with `kubectl kustomize`;
// "used" means a source file of that component makes the request: the HTTP method that the verb
// maps to (get/list → GET, watch → a watch request, patch → PATCH, create → POST, update → PUT,
// delete → DELETE) next to the resource's API path. A grant without such a request fails; so does
// a component that gets no role at all for a request it makes.
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
#include "broker/config.h"
#include "kustomize.h"

namespace gpulet::testing {
namespace {

namespace fs = std::filesystem;
const std::string kSource = GPULET_SOURCE_DIR;

std::vector<YAML::Node> Render(const std::string& dir) { return RenderKustomization(dir); }

// The non-test sources of a component, concatenated per file.
std::map<std::string, std::string> Sources(const std::vector<std::string>& paths) {
  std::map<std::string, std::string> out;
  for (const std::string& rel : paths) {
    const fs::path p = kSource + "/" + rel;
    std::vector<fs::path> files;
    if (fs::is_directory(p)) {
      for (const auto& e : fs::directory_iterator(p)) files.push_back(e.path());
    } else {
      files.push_back(p);
    }
    for (const fs::path& f : files) {
      const std::string name = f.filename().string();
      if (f.extension() != ".cc" || name.find("_test") != std::string::npos) continue;
      std::ifstream in(f);
      std::stringstream ss;
      ss << in.rdbuf();
      out[rel + "/" + name] = ss.str();
    }
  }
  return out;
}

// How code names each resource's API path, and how it makes each verb's request.
const std::map<std::string, std::string> kResourcePath = {
    {"nodes", R"(/api/v1/nodes|NodeRef\()"},
    {"configmaps", R"(/configmaps|ConfigMapRef\()"},
    {"pods", R"(/pods\?|/pods/")"},
    {"pods/binding", R"(/binding")"},
    {"pods/eviction", R"(/eviction)"},
    {"leases", R"(/leases)"},
};
const std::map<std::string, std::string> kVerbCall = {
    {"get", R"(\.Get\()"},
    {"list", R"(\.Get\(\s*"[^"]*\?|CollectionWatcher>\()"},
    {"watch", R"(\.Watch\(|ObjectWatcher|CollectionWatcher>\()"},
    {"patch", R"(\.Patch\()"},
    {"create", R"(\.Post\()"},
    {"update", R"(\.Put\()"},
    {"delete", R"(\.Delete\()"},
};

struct Grant {
  std::string resource, verb, role;
};

// Every (resource, verb) granted to ServiceAccount `sa` through any binding in `docs`.
std::vector<Grant> GrantsTo(const std::vector<YAML::Node>& docs, const std::string& sa) {
  std::set<std::pair<std::string, std::string>> roles;  // (kind, name)
  for (const YAML::Node& d : docs) {
    const std::string kind = d["kind"].as<std::string>();
    if (kind != "RoleBinding" && kind != "ClusterRoleBinding") continue;
    for (const YAML::Node& s : d["subjects"]) {
      if (s["kind"].as<std::string>() == "ServiceAccount" && s["name"].as<std::string>() == sa) {
        roles.insert(
            {d["roleRef"]["kind"].as<std::string>(), d["roleRef"]["name"].as<std::string>()});
      }
    }
  }
  std::vector<Grant> out;
  for (const YAML::Node& d : docs) {
    const std::string kind = d["kind"].as<std::string>();
    const std::string name = d["metadata"]["name"].as<std::string>();
    if (!roles.count({kind, name})) continue;
    for (const YAML::Node& rule : d["rules"]) {
      for (const YAML::Node& r : rule["resources"]) {
        for (const YAML::Node& v : rule["verbs"]) {
          out.push_back({r.as<std::string>(), v.as<std::string>(), kind + "/" + name});
        }
      }
    }
  }
  return out;
}

// A source file that makes the request, or "" when none does.
std::string UsedBy(const std::map<std::string, std::string>& sources, const Grant& g) {
  if (!kResourcePath.count(g.resource) || !kVerbCall.count(g.verb)) return "";
  const std::regex path(kResourcePath.at(g.resource));
  const std::regex call(kVerbCall.at(g.verb));
  for (const auto& [file, text] : sources) {
    if (std::regex_search(text, path) && std::regex_search(text, call)) return file;
  }
  return "";
}

void ExpectEveryGrantUsed(const std::vector<YAML::Node>& docs, const std::string& sa,
                          const std::map<std::string, std::string>& sources, size_t min_grants) {
  const std::vector<Grant> grants = GrantsTo(docs, sa);
  EXPECT_GE(grants.size(), min_grants) << "ServiceAccount " << sa;
  for (const Grant& g : grants) {
    EXPECT_NE(g.resource, "*") << g.role;
    EXPECT_NE(g.verb, "*") << g.role;
    EXPECT_FALSE(UsedBy(sources, g).empty())
        << g.role << " grants " << sa << " `" << g.verb << "` on " << g.resource
        << ", but no code of that component makes such a request";
  }
}

TEST(Rbac, NodeAgentGrantsAreEachUsedByItsCode) {
  const auto sources =
      Sources({"src/k8s", "src/cli/cmd_config_sync.cc", "src/deviceplugin/memory_publisher.cc"});
  ASSERT_FALSE(sources.empty());
  for (const char* overlay : {"time-slicing", "mig-mixed", "mps", "memory-limits"}) {
    SCOPED_TRACE(overlay);
    const std::vector<YAML::Node> docs = Render(std::string("deploy/overlays/") + overlay);
    ASSERT_FALSE(docs.empty());
    ExpectEveryGrantUsed(docs, "gpulet", sources, 4);
    for (const Grant& g : GrantsTo(docs, "gpulet")) {
      if (g.resource != "nodes") continue;
      EXPECT_NE(g.verb, "patch") << "a node agent must not change any Node (" << g.role << ")";
    }
    // Writes only in its own namespace: the memory pool's ConfigMap, through a Role.
    for (const Grant& g : GrantsTo(docs, "gpulet")) {
      if (g.verb != "create" && g.verb != "patch") continue;
      EXPECT_EQ(g.resource, "configmaps") << g.role;
      EXPECT_EQ(g.role, "Role/gpulet-memory-pool");
    }
  }
}

TEST(Rbac, BrokerHasItsOwnServiceAccountAndUsesEachGrant) {
  const std::vector<YAML::Node> docs = Render("deploy/broker");
  ASSERT_FALSE(docs.empty());
  ExpectEveryGrantUsed(docs, "gpulet-broker", Sources({"src/broker"}), 7);
  EXPECT_TRUE(GrantsTo(docs, "gpulet").empty()) << "deploy/broker grants the node agent nothing";
  bool deployment = false;
  for (const YAML::Node& d : docs) {
    if (d["kind"].as<std::string>() != "Deployment") continue;
    deployment = true;
    EXPECT_EQ(d["spec"]["template"]["spec"]["serviceAccountName"].as<std::string>(),
              "gpulet-broker");
  }
  EXPECT_TRUE(deployment);
}

// The broker's default Lease namespace is the one deploy/broker's Role grants Leases in: with the
// shipped RBAC, kube-apiserver refuses a Lease anywhere else (403) and no replica ever acts. (The
// fake API server's RBAC check reads every grant as cluster-wide, so only this test and the real
// cluster's cluster_broker see the namespace.)
TEST(Rbac, BrokerLeaseDefaultsToTheNamespaceOfTheShippedLeaseRole) {
  std::set<std::string> granted;
  for (const YAML::Node& d : Render("deploy/broker")) {
    if (d["kind"].as<std::string>() != "Role") continue;
    for (const YAML::Node& rule : d["rules"]) {
      for (const YAML::Node& res : rule["resources"]) {
        if (res.as<std::string>() == "leases") {
          granted.insert(d["metadata"]["namespace"].as<std::string>());
        }
      }
    }
  }
  EXPECT_EQ(granted, std::set<std::string>{broker::kDefaultLeaseNamespace});
  Result<broker::BrokerConfig> c = broker::ParseBrokerConfig(
      "slurm: {nodes: [gpua]}\nkubernetes: {namespaces: [inference]}\nlease: {name: b}\n",
      "broker.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->lease_namespace, broker::kDefaultLeaseNamespace);
}

TEST(Rbac, ExtenderHasItsOwnServiceAccountAndUsesEachGrant) {
  const std::vector<YAML::Node> docs = Render("deploy/extender");
  ASSERT_FALSE(docs.empty());
  ExpectEveryGrantUsed(docs, "gpulet-extender", Sources({"src/extender"}), 6);
  EXPECT_TRUE(GrantsTo(docs, "gpulet").empty()) << "deploy/extender grants the node agent nothing";
  for (const Grant& g : GrantsTo(docs, "gpulet-extender")) {
    EXPECT_FALSE(g.resource == "configmaps" && g.verb != "list" && g.verb != "watch")
        << "the extender only reads the node agents' objects (" << g.role << ")";
  }
  bool deployment = false;
  for (const YAML::Node& d : docs) {
    if (d["kind"].as<std::string>() != "Deployment") continue;
    deployment = true;
    EXPECT_EQ(d["spec"]["template"]["spec"]["serviceAccountName"].as<std::string>(),
              "gpulet-extender");
  }
  EXPECT_TRUE(deployment);
}

// The checker itself: a grant nothing uses is caught.
TEST(Rbac, AnUnusedGrantIsReported) {
  const auto sources = Sources({"src/k8s", "src/cli/cmd_config_sync.cc"});
  EXPECT_TRUE(UsedBy(sources, {"nodes", "patch", "ClusterRole/x"}).empty());
  EXPECT_TRUE(UsedBy(sources, {"secrets", "get", "ClusterRole/x"}).empty());
  EXPECT_FALSE(UsedBy(sources, {"nodes", "get", "ClusterRole/x"}).empty());
}

// The optional admission policy holds each agent to its own node's memory object, by the
// node-name claim of its service-account token.
TEST(Rbac, MemoryPoolAdmissionPolicyNamesTheNodeClaim) {
  const std::vector<YAML::Node> docs =
      YAML::LoadAllFromFile(kSource + "/deploy/examples/memory-pool-admission-policy.yaml");
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0]["kind"].as<std::string>(), "ValidatingAdmissionPolicy");
  EXPECT_EQ(docs[1]["kind"].as<std::string>(), "ValidatingAdmissionPolicyBinding");
  EXPECT_EQ(docs[1]["spec"]["policyName"].as<std::string>(),
            docs[0]["metadata"]["name"].as<std::string>());
  // The CEL expressions, as the API server reads them.
  std::string policy = docs[0]["spec"]["matchConditions"][0]["expression"].as<std::string>();
  for (const YAML::Node& v : docs[0]["spec"]["variables"])
    policy += "\n" + v["expression"].as<std::string>();
  for (const YAML::Node& v : docs[0]["spec"]["validations"])
    policy += "\n" + v["expression"].as<std::string>();
  EXPECT_NE(policy.find("request.userInfo.extra['authentication.kubernetes.io/node-name']"),
            std::string::npos)
      << policy;
  EXPECT_NE(policy.find("'gpulet-memory-' +"), std::string::npos) << policy;
  EXPECT_NE(policy.find("system:serviceaccount:gpulet-system:gpulet"), std::string::npos);
}

}  // namespace
}  // namespace gpulet::testing
