// deploy/: renders each overlay with `kubectl kustomize` and checks the DaemonSet, RBAC, metrics
// objects and named configs. The image definition is checked by image_test.cc.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "../cli/run_command.h"
#include "kustomize.h"
#include "config/config.h"
#include "config/memory_limits.h"

namespace gpulet::testing {
namespace {

const std::string kSource = GPULET_SOURCE_DIR;

std::vector<YAML::Node> Render(const std::string& overlay) {
  return RenderKustomization("deploy/overlays/" + overlay);
}

class OverlayTest : public ::testing::TestWithParam<std::string> {};

TEST_P(OverlayTest, RendersALeastPrivilegeDaemonSetOnGpuNodesOnly) {
  const std::vector<YAML::Node> docs = Render(GetParam());
  ASSERT_FALSE(docs.empty());
  YAML::Node ds = Find(docs, "DaemonSet", "gpulet");
  ASSERT_TRUE(ds) << "no DaemonSet gpulet";
  EXPECT_EQ(ds["metadata"]["namespace"].as<std::string>(), "gpulet-system");
  const YAML::Node pod = ds["spec"]["template"]["spec"];
  EXPECT_EQ(pod["serviceAccountName"].as<std::string>(), "gpulet");
  EXPECT_FALSE(pod["hostNetwork"].IsDefined() && pod["hostNetwork"].as<bool>());

  // GPU nodes only.
  const YAML::Node terms =
      pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
         ["nodeSelectorTerms"];
  ASSERT_TRUE(terms.IsSequence());
  EXPECT_EQ(terms[0]["matchExpressions"][0]["key"].as<std::string>(), "nvidia.com/gpu.present");

  const YAML::Node node = Named(pod["containers"], "gpulet");
  ASSERT_TRUE(node);
  EXPECT_EQ(node["image"].as<std::string>(), "ghcr.io/gpulet/gpulet:0.1.0");
  EXPECT_EQ(node["args"][0].as<std::string>(), "node");
  const std::set<std::string> args = Strings(node["args"]);
  EXPECT_TRUE(args.count("--config=/run/gpulet/config/config.yaml"));

  // Every container and init container: no escalation, all capabilities dropped, read-only root,
  // requests and limits.
  std::vector<YAML::Node> all;
  for (const YAML::Node& c : pod["containers"]) all.push_back(c);
  for (const YAML::Node& c : pod["initContainers"]) all.push_back(c);
  // memory-limits adds the init container that installs libgpulet-cuda.so on the host.
  const bool memory_limits = GetParam() == "memory-limits";
  ASSERT_EQ(all.size(), memory_limits ? 4u : 3u);
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
    if (name != "gpulet" && name != "install-cuda-library") {
      EXPECT_TRUE(sc["runAsNonRoot"].as<bool>()) << name;
      EXPECT_FALSE(sc["capabilities"]["add"].IsDefined()) << name;
    }
  }
  // Only MPS needs a capability (compute mode), and only that one.
  const YAML::Node added = node["securityContext"]["capabilities"]["add"];
  if (GetParam() == "mps") {
    EXPECT_EQ(Strings(added), std::set<std::string>{"SYS_ADMIN"});
  } else {
    EXPECT_FALSE(added.IsDefined()) << GetParam();
  }

  // Probes on /health at the metrics port.
  for (const char* probe : {"livenessProbe", "readinessProbe"}) {
    EXPECT_EQ(node[probe]["httpGet"]["path"].as<std::string>(), "/health") << probe;
    EXPECT_EQ(node[probe]["httpGet"]["port"].as<std::string>(), "metrics") << probe;
  }
  EXPECT_EQ(Named(node["ports"], "metrics")["containerPort"].as<int>(), 9400);

  // Host paths, each mounted into the node container where gpulet expects it.
  // host path -> (mountPath, read only)
  std::map<std::string, std::pair<std::string, bool>> mounted = MountedHostPaths(pod, node);
  EXPECT_EQ(mounted["/var/lib/kubelet/device-plugins"],
            std::make_pair(std::string("/var/lib/kubelet/device-plugins"), false));
  EXPECT_EQ(mounted["/var/lib/kubelet/pod-resources"],
            std::make_pair(std::string("/var/lib/kubelet/pod-resources"), true));
  EXPECT_EQ(mounted["/run/nvidia/mps"].first, "/run/nvidia/mps");
  EXPECT_EQ(mounted["/dev"], std::make_pair(std::string("/host/dev"), true));
  EXPECT_EQ(mounted["/etc/cdi"], std::make_pair(std::string("/host/etc/cdi"), true));
  if (GetParam() == "mig-mixed") {
    EXPECT_TRUE(mounted["/proc/driver/nvidia/capabilities"].second);
  }
  if (GetParam() == "mps") {
    EXPECT_EQ(mounted["/run/nvidia/mps/shm"].first, "/dev/shm");
  }
  if (memory_limits) {
    // The plugin hands the kubelet host paths under stateDir: gpulet must see them at the same path.
    EXPECT_EQ(mounted["/run/gpulet/memory"], std::make_pair(std::string("/run/gpulet/memory"), false));
    const YAML::Node install = Named(pod["initContainers"], "install-cuda-library");
    ASSERT_TRUE(install);
    EXPECT_FALSE(install["securityContext"]["capabilities"]["add"].IsDefined());
    const std::string install_mount = MountedHostPaths(pod, install)["/usr/lib/gpulet"].first;
    ASSERT_FALSE(install_mount.empty()) << "the host's /usr/lib/gpulet is not mounted";
    // Copies the image's library there under a temporary name and renames it into place.
    const std::string script = install["args"][0].as<std::string>();
    EXPECT_NE(script.find("/opt/gpulet/lib/libgpulet-cuda.so"), std::string::npos) << script;
    EXPECT_NE(script.find("mv -f " + install_mount + "/.libgpulet-cuda.so.new " + install_mount +
                          "/libgpulet-cuda.so"),
              std::string::npos)
        << script;
  }

  // The config label and the overlay's default config, in both config-sync containers.
  for (const YAML::Node& c : all) {
    if (c["name"].as<std::string>() == "gpulet") continue;
    if (c["name"].as<std::string>() == "install-cuda-library") continue;
    EXPECT_EQ(c["args"][0].as<std::string>(), "config-sync");
    EXPECT_TRUE(Strings(c["args"]).count("--label=nvidia.com/device-plugin.config"));
    EXPECT_TRUE(Strings(c["args"]).count("--output=/run/gpulet/config/config.yaml"));
    EXPECT_EQ(Named(c["env"], "GPULET_DEFAULT_CONFIG")["value"].as<std::string>(), GetParam());
  }
  EXPECT_TRUE(Strings(Named(pod["initContainers"], "config-init")["args"]).count("--once"));

  // The default config exists in the ConfigMap.
  YAML::Node cm = Find(docs, "ConfigMap", "gpulet-config");
  ASSERT_TRUE(cm);
  EXPECT_TRUE(cm["data"][GetParam()].IsDefined()) << GetParam();
}

TEST_P(OverlayTest, RbacGrantsOnlyWhatGpuletReadsAndWrites) {
  const std::vector<YAML::Node> docs = Render(GetParam());
  ASSERT_FALSE(docs.empty());
  YAML::Node cr = Find(docs, "ClusterRole", "gpulet-node");
  ASSERT_TRUE(cr);
  ASSERT_EQ(cr["rules"].size(), 1u);
  EXPECT_EQ(Strings(cr["rules"][0]["resources"]), std::set<std::string>{"nodes"});
  // Regression (hardening issue, defect 5): every node agent had cluster-wide patch on Nodes.
  EXPECT_EQ(Strings(cr["rules"][0]["verbs"]), (std::set<std::string>{"get", "watch"}));
  YAML::Node role = Find(docs, "Role", "gpulet-config");
  ASSERT_TRUE(role);
  EXPECT_EQ(role["metadata"]["namespace"].as<std::string>(), "gpulet-system");
  ASSERT_EQ(role["rules"].size(), 1u);
  EXPECT_EQ(Strings(role["rules"][0]["resources"]), std::set<std::string>{"configmaps"});
  EXPECT_EQ(Strings(role["rules"][0]["verbs"]), (std::set<std::string>{"get", "watch"}));
  for (const YAML::Node& d : docs) {
    if (d["roleRef"]) {
      EXPECT_EQ(d["roleRef"]["name"].as<std::string>().rfind("gpulet-", 0), 0u);
    }
  }
  YAML::Node crb = Find(docs, "ClusterRoleBinding", "gpulet-node");
  ASSERT_TRUE(crb);
  EXPECT_EQ(crb["subjects"][0]["name"].as<std::string>(), "gpulet");
  EXPECT_EQ(crb["subjects"][0]["namespace"].as<std::string>(), "gpulet-system");
}

TEST_P(OverlayTest, MetricsServiceMonitorAndRulesSelectTheDaemonSet) {
  const std::vector<YAML::Node> docs = Render(GetParam());
  ASSERT_FALSE(docs.empty());
  YAML::Node svc = Find(docs, "Service", "gpulet-metrics");
  YAML::Node sm = Find(docs, "ServiceMonitor", "gpulet");
  YAML::Node ds = Find(docs, "DaemonSet", "gpulet");
  ASSERT_TRUE(svc && sm && ds);
  const YAML::Node pod_labels = ds["spec"]["template"]["metadata"]["labels"];
  for (const auto& kv : svc["spec"]["selector"]) {
    EXPECT_EQ(pod_labels[kv.first.as<std::string>()].as<std::string>(),
              kv.second.as<std::string>());
  }
  EXPECT_EQ(Named(svc["spec"]["ports"], "metrics")["port"].as<int>(), 9400);
  for (const auto& kv : sm["spec"]["selector"]["matchLabels"]) {
    EXPECT_EQ(svc["metadata"]["labels"][kv.first.as<std::string>()].as<std::string>(),
              kv.second.as<std::string>());
  }
  EXPECT_EQ(sm["spec"]["endpoints"][0]["port"].as<std::string>(), "metrics");
  // The alert rules' ExporterDown expects this job name.
  const std::string job_label = sm["spec"]["jobLabel"].as<std::string>();
  EXPECT_EQ(svc["metadata"]["labels"][job_label].as<std::string>(), "gpulet-exporter");
  EXPECT_TRUE(Find(docs, "PrometheusRule", "gpulet"));
  EXPECT_TRUE(Find(docs, "Namespace", "gpulet-system"));
}

INSTANTIATE_TEST_SUITE_P(Overlays, OverlayTest,
                         ::testing::Values("time-slicing", "mig-mixed", "mps", "memory-limits"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string n = p.param;
                           for (char& c : n) {
                             if (c == '-') c = '_';
                           }
                           return n;
                         });

TEST(ConfigMap, EveryNamedConfigParsesAsANvidiaV1Config) {
  YAML::Node cm = YAML::LoadFile(kSource + "/deploy/base/configmap.yaml");
  ASSERT_GE(cm["data"].size(), 4u);
  for (const auto& kv : cm["data"]) {
    const std::string name = kv.first.as<std::string>();
    Result<config::Config> c =
        config::ParseConfig(kv.second.as<std::string>(), "configmap:" + name);
    EXPECT_TRUE(c.ok()) << name << ": " << c.status().message();
  }
}

// The memory-limits overlay's config parses, and its host paths are the ones the overlay mounts.
TEST(MemoryLimitsOverlay, ConfigPathsAreTheMountedHostPaths) {
  const std::vector<YAML::Node> docs = Render("memory-limits");
  ASSERT_FALSE(docs.empty());
  YAML::Node cm = Find(docs, "ConfigMap", "gpulet-config");
  ASSERT_TRUE(cm && cm["data"]["memory-limits"]);
  const std::string text = cm["data"]["memory-limits"].as<std::string>();
  Result<config::Config> c = config::ParseConfig(text, "configmap:memory-limits");
  ASSERT_TRUE(c.ok()) << c.status().message();
  Result<std::optional<config::MemoryLimits>> limits =
      config::ParseMemoryLimits(text, "configmap:memory-limits");
  ASSERT_TRUE(limits.ok()) << limits.status().message();
  ASSERT_TRUE(limits->has_value());
  std::set<std::string> host_paths;
  for (const YAML::Node& v : Find(docs, "DaemonSet", "gpulet")["spec"]["template"]["spec"]["volumes"]) {
    if (v["hostPath"]) host_paths.insert(v["hostPath"]["path"].as<std::string>());
  }
  EXPECT_TRUE(host_paths.count((*limits)->state_dir)) << (*limits)->state_dir;
  EXPECT_TRUE(host_paths.count(std::filesystem::path((*limits)->library).parent_path().string()))
      << (*limits)->library;
  EXPECT_EQ(std::filesystem::path((*limits)->library).filename(), "libgpulet-cuda.so");
}

TEST(PrometheusRule, GroupsEqualTheExportersRuleFile) {
  const std::string rules_path = kSource + "/deploy/prometheus/gpulet-rules.yaml";
  ASSERT_TRUE(std::filesystem::exists(rules_path)) << rules_path;
  YAML::Node rules = YAML::LoadFile(rules_path);
  YAML::Node wrapped = YAML::LoadFile(kSource + "/deploy/base/prometheusrule.yaml");
  ASSERT_GT(rules["groups"].size(), 0u);
  // Compare through the canonical emitter so formatting differences do not matter.
  YAML::Emitter a, b;
  a << rules["groups"];
  b << wrapped["spec"]["groups"];
  EXPECT_EQ(std::string(a.c_str()), std::string(b.c_str()))
      << "deploy/base/prometheusrule.yaml spec.groups differs from " << rules_path;
}

}  // namespace
}  // namespace gpulet::testing
