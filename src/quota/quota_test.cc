// gpulet quota: tenants file parsing (file:line:field errors), fleet inventory reading, sum checks
// and the rendered ResourceQuota/LimitRange, including the shipped examples.
#include "quota/quota.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <map>

namespace gpulet::quota {
namespace {

const std::string kExamples = std::string(GPULET_SOURCE_DIR) + "/deploy/examples/";

FleetCapacity ExampleFleet() {
  FleetCapacity fleet;
  EXPECT_TRUE(LoadInventory(fleet, kExamples + "inventory-h100-node.json").ok());
  EXPECT_TRUE(LoadInventory(fleet, kExamples + "inventory-a100-mig-node.json").ok());
  return fleet;
}

TEST(Inventory, CountsWholeGpusAndMigDevicesPerProfile) {
  FleetCapacity fleet = ExampleFleet();
  EXPECT_EQ(fleet.whole_gpus, 10);
  EXPECT_EQ(fleet.mig.at("1g.5gb"), 28);
  EXPECT_EQ(fleet.mig.at("3g.20gb"), 4);
  EXPECT_EQ(fleet.sources.size(), 2u);
}

TEST(Inventory, ErrorsNameFileLineAndField) {
  FleetCapacity fleet;
  Status s = AddInventory(fleet,
                          "{\n  \"gpus\": [\n    {\"mig_enabled\": true,\n     \"mig_devices\": [\n"
                          "       {\"uuid\": \"MIG-1\"}\n     ]}\n  ]\n}\n",
                          "node.json");
  EXPECT_EQ(s.code(), ErrorCode::kInvalidInput);
  EXPECT_EQ(s.message(), "node.json:5: gpus[0].mig_devices[0].profile: missing");
  s = AddInventory(fleet, "{\"driver_version\": \"550\"}", "other.json");
  EXPECT_NE(s.message().find("other.json:1: gpus: missing"), std::string::npos) << s.message();
  EXPECT_EQ(LoadInventory(fleet, "/nonexistent.json").code(), ErrorCode::kNotFound);
}

TEST(Tenants, ParsesBudgetsAndKeepsLines) {
  Result<TenantsFile> tf = LoadTenants(kExamples + "tenants.yaml");
  ASSERT_TRUE(tf.ok()) << tf.status().message();
  ASSERT_EQ(tf->tenants.size(), 4u);
  EXPECT_EQ(tf->tenants[0].namespace_name, "ml-training");
  EXPECT_EQ(tf->tenants[0].gpus, 6);
  EXPECT_EQ(tf->tenants[1].mig.at("1g.5gb"), 14);
  EXPECT_EQ(tf->tenants[3].shared_gpus, 16);
}

struct BadTenants {
  const char* yaml;
  const char* error;  // expected substring
};

class BadTenantsTest : public ::testing::TestWithParam<BadTenants> {};

TEST_P(BadTenantsTest, IsRejectedWithFileLineField) {
  Result<TenantsFile> tf = ParseTenants(GetParam().yaml, "t.yaml");
  ASSERT_FALSE(tf.ok());
  EXPECT_EQ(tf.status().code(), ErrorCode::kInvalidInput);
  EXPECT_NE(tf.status().message().find(GetParam().error), std::string::npos)
      << tf.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadTenantsTest,
    ::testing::Values(BadTenants{"tenants: []\n", "t.yaml:1: tenants: must be a non-empty list"},
                      BadTenants{"tenant:\n  - namespace: a\n", "t.yaml:1: tenant: unknown key"},
                      BadTenants{"tenants:\n  - namespace: a\n    gpus: -1\n",
                                 "t.yaml:3: tenants[0].gpus: must be an integer >= 0"},
                      BadTenants{"tenants:\n  - namespace: a\n    gpus: \"2\"\n",
                                 "t.yaml:3: tenants[0].gpus: must be an integer"},
                      BadTenants{"tenants:\n  - namespace: Team_A\n",
                                 "t.yaml:2: tenants[0].namespace: \"Team_A\" is not a valid"},
                      BadTenants{"tenants:\n  - gpus: 1\n",
                                 "t.yaml:2: tenants[0].namespace: missing"},
                      BadTenants{"tenants:\n  - namespace: a\n  - namespace: a\n",
                                 "t.yaml:3: tenants[1].namespace: \"a\" is listed twice"},
                      BadTenants{"tenants:\n  - namespace: a\n    mig:\n      big: 1\n",
                                 "t.yaml:4: tenants[0].mig.big: not a MIG profile"},
                      BadTenants{"tenants:\n  - namespace: a\n    gpu: 1\n",
                                 "t.yaml:3: tenants[0].gpu: unknown key"},
                      BadTenants{"tenants:\n  - namespace: a\n    gpus: [1\n", "t.yaml:"}));

TEST(Check, ExampleFitsTheExampleFleetExactly) {
  Result<TenantsFile> tf = LoadTenants(kExamples + "tenants.yaml");
  ASSERT_TRUE(tf.ok());
  CheckOptions o;
  o.shared_replicas = 4;
  Result<CheckReport> r = CheckAgainstFleet(*tf, ExampleFleet(), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->warnings.empty());
}

TEST(Check, OverSubscribedWholeGpusNameTheSumsAndTheFleet) {
  Result<TenantsFile> tf = ParseTenants(
      "tenants:\n  - namespace: a\n    gpus: 8\n  - namespace: b\n    gpus: 2\n"
      "    sharedGpus: 5\n",
      "t.yaml");
  ASSERT_TRUE(tf.ok());
  CheckOptions o;
  o.shared_replicas = 4;
  Result<CheckReport> r = CheckAgainstFleet(*tf, ExampleFleet(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("t.yaml:2: tenants: requests.nvidia.com/gpu sums to 10 and "
                                      "requests.nvidia.com/gpu.shared to 5 (2 GPUs at 4 replicas), "
                                      "the fleet has 10 whole GPUs"),
            std::string::npos)
      << r.status().message();
  o.allow_overcommit = true;
  r = CheckAgainstFleet(*tf, ExampleFleet(), o);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->warnings.size(), 1u);
}

TEST(Check, MigProfilesAreCheckedPerProfile) {
  Result<TenantsFile> tf = ParseTenants(
      "tenants:\n  - namespace: a\n    mig:\n      1g.5gb: 20\n  - namespace: b\n    mig:\n"
      "      1g.5gb: 9\n",
      "t.yaml");
  ASSERT_TRUE(tf.ok());
  Result<CheckReport> r = CheckAgainstFleet(*tf, ExampleFleet(), {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(
      r.status().message().find("t.yaml:4: tenants[*].mig.1g.5gb: requests.nvidia.com/mig-1g.5gb "
                                "sums to 29, the fleet has 28"),
      std::string::npos)
      << r.status().message();
  tf = ParseTenants("tenants:\n  - namespace: a\n    mig:\n      7g.80gb: 1\n", "t.yaml");
  r = CheckAgainstFleet(*tf, ExampleFleet(), {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("t.yaml:4: tenants[0].mig.7g.80gb: no MIG device with this "
                                      "profile in the fleet (has: 1g.5gb, 3g.20gb)"),
            std::string::npos)
      << r.status().message();
}

TEST(Check, SharedGpusWithoutReplicasAreAWarningNotASilentPass) {
  Result<TenantsFile> tf =
      ParseTenants("tenants:\n  - namespace: a\n    sharedGpus: 100\n", "t.yaml");
  Result<CheckReport> r = CheckAgainstFleet(*tf, ExampleFleet(), {});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->warnings.size(), 1u);
  EXPECT_NE(r->warnings[0].find("--shared-replicas"), std::string::npos);
}

TEST(Render, QuotaPerTenantAndAdmissionPolicyForTheCap) {
  Result<TenantsFile> tf = LoadTenants(kExamples + "tenants.yaml");
  ASSERT_TRUE(tf.ok());
  std::vector<YAML::Node> docs = YAML::LoadAll(RenderManifests(*tf));
  ASSERT_EQ(docs.size(), 12u);  // per tenant: ResourceQuota, policy, binding
  EXPECT_EQ(docs[0]["kind"].as<std::string>(), "ResourceQuota");
  const YAML::Node vap = docs[1];
  EXPECT_EQ(vap["kind"].as<std::string>(), "ValidatingAdmissionPolicy");
  EXPECT_EQ(vap["apiVersion"].as<std::string>(), "admissionregistration.k8s.io/v1");
  ASSERT_EQ(vap["spec"]["validations"].size(), 2u);  // nvidia.com/gpu: containers, initContainers
  const std::string expr = vap["spec"]["validations"][0]["expression"].as<std::string>();
  EXPECT_EQ(expr.rfind("!has(object.spec.containers) || object.spec.containers.all(c, ", 0), 0u)
      << expr;
  EXPECT_NE(expr.find("'nvidia.com/gpu' in c.resources.limits"), std::string::npos) << expr;
  EXPECT_NE(expr.find(": 0)) <= 4)"), std::string::npos) << expr;  // none asked: passes
  const YAML::Node binding = docs[2];
  EXPECT_EQ(binding["kind"].as<std::string>(), "ValidatingAdmissionPolicyBinding");
  EXPECT_EQ(binding["spec"]["policyName"].as<std::string>(),
            vap["metadata"]["name"].as<std::string>());
  EXPECT_EQ(binding["spec"]["validationActions"][0].as<std::string>(), "Deny");
  EXPECT_EQ(binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"]
                   ["kubernetes.io/metadata.name"]
                       .as<std::string>(),
            docs[0]["metadata"]["namespace"].as<std::string>());
  const YAML::Node q = docs[3];  // inference-a
  EXPECT_EQ(q["kind"].as<std::string>(), "ResourceQuota");
  EXPECT_EQ(q["metadata"]["namespace"].as<std::string>(), "inference-a");
  EXPECT_EQ(q["spec"]["hard"]["requests.nvidia.com/gpu"].as<std::string>(), "0");
  EXPECT_EQ(q["spec"]["hard"]["requests.nvidia.com/gpu.shared"].as<std::string>(), "0");
  EXPECT_EQ(q["spec"]["hard"]["requests.nvidia.com/mig-1g.5gb"].as<std::string>(), "14");
  EXPECT_EQ(q["spec"]["hard"]["requests.nvidia.com/mig-3g.20gb"].as<std::string>(), "2");
}

// Kubernetes' LimitRanger, as published: for a LimitRange item of type Container with a `max`
// for resource R, every container must set limits[R] (a missing limit is rejected) no larger
// than max; `min` likewise needs a request. Ordinary pods of every tenant, including a CPU-only
// sidecar and a container asking for another MIG profile, must pass whatever is rendered.
struct Container {
  std::map<std::string, int> limits;
};

std::string LimitRangerRejects(const std::vector<YAML::Node>& docs, const std::string& ns,
                               const std::vector<Container>& pod) {
  for (const YAML::Node& d : docs) {
    if (d["kind"].as<std::string>() != "LimitRange") continue;
    if (d["metadata"]["namespace"].as<std::string>() != ns) continue;
    for (const YAML::Node& item : d["spec"]["limits"]) {
      if (item["type"].as<std::string>() != "Container") continue;
      for (const char* bound : {"max", "min"}) {
        if (!item[bound]) continue;
        for (const auto& kv : item[bound]) {
          const std::string r = kv.first.as<std::string>();
          for (const Container& c : pod) {
            auto it = c.limits.find(r);
            if (it == c.limits.end()) return std::string(bound) + " " + r + ": no limit set";
            if (std::string(bound) == "max" && it->second > kv.second.as<int>()) {
              return "max " + r + " exceeded";
            }
          }
        }
      }
    }
  }
  return "";
}

TEST(Render, OrdinaryPodsPassTheLimitRanger) {
  Result<TenantsFile> tf = LoadTenants(kExamples + "tenants.yaml");
  ASSERT_TRUE(tf.ok());
  const std::vector<YAML::Node> docs = YAML::LoadAll(RenderManifests(*tf));
  const std::vector<std::vector<Container>> pods = {
      {{{{"nvidia.com/gpu", 2}}}, {}},  // a GPU container and a CPU sidecar
      {{}},                             // CPU only
      {{{{"nvidia.com/mig-1g.5gb", 1}}}, {{{"nvidia.com/mig-3g.20gb", 1}}}},  // two profiles
      {{{{"nvidia.com/gpu.shared", 1}}}},
  };
  for (const Tenant& t : tf->tenants) {
    for (size_t i = 0; i < pods.size(); ++i) {
      EXPECT_EQ(LimitRangerRejects(docs, t.namespace_name, pods[i]), "")
          << t.namespace_name << " pod " << i;
    }
  }
  // The model itself rejects what the LimitRanger rejects.
  const std::vector<YAML::Node> lr = YAML::LoadAll(
      "kind: LimitRange\nmetadata: {namespace: x}\nspec:\n  limits:\n"
      "    - type: Container\n      max: {nvidia.com/gpu: \"4\"}\n");
  EXPECT_NE(LimitRangerRejects(lr, "x", {{{{"nvidia.com/gpu", 1}}}, {}}), "");
}

TEST(Render, MeProfilesBecomeDotMeResourceNames) {
  EXPECT_EQ(MigResourceName("1g.10gb+me"), "nvidia.com/mig-1g.10gb.me");
  EXPECT_EQ(MigResourceName("3g.40gb"), "nvidia.com/mig-3g.40gb");
}

}  // namespace
}  // namespace gpulet::quota

namespace gpulet::quota {
namespace {

// Four whole 80 GiB GPUs.
FleetCapacity FourGpus() {
  FleetCapacity fleet;
  std::string gpus;
  for (int i = 0; i < 4; ++i) {
    gpus += std::string(i ? "," : "") + "{\"mig_enabled\": false, \"memory_mib\": 81920}";
  }
  EXPECT_TRUE(AddInventory(fleet, "{\"gpus\": [" + gpus + "]}", "fleet.json").ok());
  return fleet;
}

TEST(Memory, BudgetsAreUnitsOfThePoolsResource) {
  auto tf = ParseTenants(
      "memoryResource: gpulet.io/gpu-memory-512mi\ntenants:\n  - namespace: a\n    gpuMemory: 40\n",
      "t.yaml");
  ASSERT_TRUE(tf.ok()) << tf.status().message();
  EXPECT_EQ(tf->memory_resource, "gpulet.io/gpu-memory-512mi");
  EXPECT_EQ(tf->memory_unit_bytes, int64_t{512} << 20);
  EXPECT_EQ(tf->tenants[0].gpu_memory, 40);
  EXPECT_EQ(*MemoryUnitBytes("gpulet.io/gpu-memory-2gi"), int64_t{2} << 30);
  auto bad = ParseTenants("memoryResource: nvidia.com/gpu\ntenants:\n  - namespace: a\n", "t.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("t.yaml:1: memoryResource: \"nvidia.com/gpu\" is not a GPU "
                                        "memory resource"),
            std::string::npos)
      << bad.status().message();
  bad = ParseTenants("tenants:\n  - namespace: a\n    gpuMemory: 1.5\n", "t.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("t.yaml:3: tenants[0].gpuMemory: must be an integer"),
            std::string::npos)
      << bad.status().message();
}

TEST(Memory, CheckedAgainstTheGpusTheOtherBudgetsLeave) {
  FleetCapacity fleet = FourGpus();
  ASSERT_EQ(fleet.whole_gpu_memory_mib.size(), 4u);
  const char* text =
      "tenants:\n  - namespace: a\n    gpus: 1\n  - namespace: b\n    gpuMemory: %d\n";
  char buf[256];
  std::snprintf(buf, sizeof buf, text, 240);  // 3 GPUs × 80 GiB left
  auto tf = ParseTenants(buf, "t.yaml");
  ASSERT_TRUE(tf.ok());
  EXPECT_TRUE(CheckAgainstFleet(*tf, fleet, {}).ok());
  std::snprintf(buf, sizeof buf, text, 241);
  tf = ParseTenants(buf, "t.yaml");
  auto r = CheckAgainstFleet(*tf, fleet, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(
                "t.yaml:5: tenants[*].gpuMemory: requests.gpulet.io/gpu-memory-1gi sums to 241 "
                "units, the 3 GPUs left after the whole and shared budgets hold 240"),
            std::string::npos)
      << r.status().message();
  CheckOptions o;
  o.allow_overcommit = true;
  r = CheckAgainstFleet(*tf, fleet, o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->warnings.size(), 1u);
  // A smaller unit: twice the units on the same GPUs.
  tf = ParseTenants(
      "memoryResource: gpulet.io/gpu-memory-512mi\ntenants:\n  - namespace: b\n    gpuMemory: "
      "640\n",
      "t.yaml");
  EXPECT_TRUE(CheckAgainstFleet(*tf, fleet, {}).ok());
}

TEST(Memory, RenderedNextToTheGpuAndMigLines) {
  auto tf = ParseTenants(
      "tenants:\n  - namespace: a\n    gpus: 1\n    maxPerContainer: 1\n"
      "  - namespace: b\n    gpuMemory: 160\n",
      "t.yaml");
  ASSERT_TRUE(tf.ok());
  std::vector<YAML::Node> docs = YAML::LoadAll(RenderManifests(*tf));
  std::map<std::string, YAML::Node> quotas;
  for (const YAML::Node& d : docs) {
    if (d["kind"].as<std::string>() == "ResourceQuota") {
      quotas[d["metadata"]["namespace"].as<std::string>()] = d;
    }
  }
  ASSERT_EQ(quotas.size(), 2u);
  EXPECT_EQ(quotas["a"]["spec"]["hard"]["requests.gpulet.io/gpu-memory-1gi"].as<std::string>(),
            "0");
  EXPECT_EQ(quotas["b"]["spec"]["hard"]["requests.gpulet.io/gpu-memory-1gi"].as<std::string>(),
            "160");
  EXPECT_EQ(quotas["b"]["spec"]["hard"]["requests.nvidia.com/gpu"].as<std::string>(), "0");
}

}  // namespace
}  // namespace gpulet::quota
