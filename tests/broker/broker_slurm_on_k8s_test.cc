// The broker's Slurm-on-Kubernetes mode through the real binary (`gpulet broker run --once`, one
// evaluation per run, the journal on disk between runs): the fake API server holds a slurmd
// StatefulSet and the inference pods; Slurm's commands are scripts that answer from files the
// test writes and log what they were asked, and the test plays the StatefulSet controller and
// the pods' entrypoint (a scaled-down pod's node leaves Slurm, a new pod's node registers).
// Needs neither root nor Slurm.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <string>

#include "apiserver/fake_apiserver.h"
#include "apiserver/rbac_check.h"
#include "apiserver/test_objects.h"
#include "tests/slurm/slurm_test_support.h"

namespace gpulet::broker_testing {
namespace {

using gpulet::testing::CommandResult;
using gpulet::testing::GpuletBinary;
using gpulet::testing::RunCommand;
using nlohmann::json;
using slurm_testing::ReadFile;
using slurm_testing::TempDir;
using slurm_testing::WriteFile;
using ::testing::HasSubstr;

const std::string kSts = "/apis/apps/v1/namespaces/slurm/statefulsets/slurmd-h100";

json GpuPod(const std::string& name, bool bound) {
  return gpulet::testing::GpuPodObject(name, "inference", 4, bound ? "k8s-gpu-7" : "");
}

class SlurmOnK8sBroker : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string d = dir_.path();
    Result<gpulet::testing::TestPki> pki = gpulet::testing::MakeTestPki(d);
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    auto api = gpulet::testing::FakeApiServer::Start(*pki, {});
    ASSERT_TRUE(api.ok()) << api.status().message();
    api_ = std::move(*api);
    api_->Put(kSts, {{"apiVersion", "apps/v1"},
                     {"kind", "StatefulSet"},
                     {"metadata", {{"name", "slurmd-h100"}, {"namespace", "slurm"}}},
                     {"spec", {{"replicas", 2}, {"serviceName", "slurmd"}}}});
    WriteFile(d + "/kubeconfig",
              "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n"
              "  cluster:\n    server: " +
                  api_->url() + "\n    certificate-authority: " + pki->ca_cert +
                  "\nusers:\n- name: u\n  user:\n    token: test-token\n"
                  "contexts:\n- name: x\n  context: {cluster: c, user: u}\n"
                  "current-context: x\n");
    // Slurm's commands: answers from files, every call logged.
    Script("sinfo",
           "cat " + d + "/sinfo.json; exit $(cat " + d + "/sinfo.rc 2>/dev/null || echo 0)");
    Script("squeue", "echo '{\"jobs\":[],\"errors\":[]}'");
    Script("scontrol",
           "case \"$*\" in 'show reservation -o') echo 'No reservations in the system';; esac");
    WriteFile(d + "/broker.yaml",
              "slurm:\n  idleTime: 0s\n  sinfo: " + d + "/sinfo\n  squeue: " + d +
                  "/squeue\n  scontrol: " + d +
                  "/scontrol\nkubernetes:\n  namespaces: [inference]\n  maxNodes: 1\n"
                  "  kubeconfig: " +
                  d +
                  "/kubeconfig\nslurmOnKubernetes:\n  namespace: slurm\n  pools:\n"
                  "    - {statefulSet: slurmd-h100, replicas: 2, gpus: 4, gpuType: h100}\n"
                  "rules:\n  demandEvaluations: 1\n  minResidence: 0s\n  cooldown: 0s\n"
                  "  returnAfterIdle: 0s\n  evictionTimeout: 1h\n"
                  "journal: " +
                  d + "/journal.json\n");
    Nodes({{"slurmd-h100-0", ""}, {"slurmd-h100-1", ""}});
  }

  void Script(const std::string& name, const std::string& body) {
    const std::string path = dir_.path() + "/" + name;
    WriteFile(path, "#!/bin/bash\necho \"" + name + " $*\" >> " + dir_.path() + "/calls.log\n" +
                        body + "\n");
    ASSERT_EQ(chmod(path.c_str(), 0755), 0);
  }
  // What sinfo --json reports (22.05 shape): each node idle, drained with `reason` when given.
  void Nodes(const std::vector<std::pair<std::string, std::string>>& nodes) {
    json out = {{"nodes", json::array()}, {"errors", json::array()}};
    for (const auto& [name, reason] : nodes) {
      json flags = json::array({"DYNAMIC"});
      if (!reason.empty()) flags.push_back("DRAIN");
      out["nodes"].push_back({{"name", name},
                              {"state", "idle"},
                              {"state_flags", flags},
                              {"reason", reason},
                              {"gres", "gpu:h100:4"},
                              {"gres_used", "gpu:h100:0(IDX:N/A)"},
                              {"alloc_cpus", 0},
                              {"last_busy", 1000}});
    }
    WriteFile(dir_.path() + "/sinfo.json", out.dump());
  }
  CommandResult Once() {
    return RunCommand(GpuletBinary() + " broker run --once --config " + dir_.path() +
                      "/broker.yaml 2>/dev/null");
  }
  int Replicas() const { return api_->Object(kSts).value_or(json())["spec"].value("replicas", -1); }
  std::string Calls() const { return ReadFile(dir_.path() + "/calls.log"); }

  // What `gpulet broker` sent in Slurm-on-Kubernetes mode (StatefulSet reads and scale patches
  // beside its node and pod calls) is granted by deploy/broker and the overlay's scaler Role.
  void TearDown() override {
    if (!api_) return;
    for (const std::string& v : gpulet::testing::RbacVerbsNotGranted(
             api_->requests(),
             {"deploy/broker/rbac.yaml", "deploy/overlays/slurm-on-k8s/broker-rbac.yaml"})) {
      ADD_FAILURE() << "the broker's roles do not grant " << v;
    }
  }
  TempDir dir_;
  std::unique_ptr<gpulet::testing::FakeApiServer> api_;
};

TEST_F(SlurmOnK8sBroker, LendsByDrainingThenScalingDownAndReturnsByScalingUp) {
  api_->Put("/api/v1/namespaces/inference/pods/llm", GpuPod("llm", false));
  CommandResult r = Once();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("drain slurmd-h100-1 k8s_demand"));
  EXPECT_THAT(Calls(), HasSubstr("scontrol update NodeName=slurmd-h100-1 State=DRAIN "
                                 "Reason=gpulet: broker scale-down of slurmd-h100"));
  EXPECT_EQ(Replicas(), 2);

  // Still draining in Slurm's view: nothing is scaled.
  r = Once();
  EXPECT_THAT(r.output, HasSubstr("drain slurmd-h100-1 drain_pending")) << "re-issued, idempotent";
  EXPECT_EQ(Replicas(), 2);

  // Drained and idle: 2 → 1.
  Nodes({{"slurmd-h100-0", ""}, {"slurmd-h100-1", "gpulet: broker scale-down of slurmd-h100"}});
  r = Once();
  EXPECT_THAT(r.output, HasSubstr("scale-down slurmd-h100-1 drained"));
  EXPECT_EQ(Replicas(), 1);

  // The pod terminates, its entrypoint deletes the node; the inference pod gets the GPUs.
  Nodes({{"slurmd-h100-0", ""}});
  api_->Put("/api/v1/namespaces/inference/pods/llm", GpuPod("llm", true));
  r = Once();
  EXPECT_THAT(r.output, HasSubstr("none - no_demand"));
  CommandResult status =
      RunCommand(GpuletBinary() + " broker status --config " + dir_.path() + "/broker.yaml");
  EXPECT_THAT(status.output, HasSubstr("slurmd-h100-1\tkubernetes\tadmitted"));

  // Inference is gone: the pool grows back to its size and the new pod's node registers.
  api_->Delete("/api/v1/namespaces/inference/pods/llm");
  r = Once();
  EXPECT_THAT(r.output, HasSubstr("scale-up slurmd-h100-1 k8s_idle"));
  EXPECT_EQ(Replicas(), 2);
  Nodes({{"slurmd-h100-0", ""}, {"slurmd-h100-1", ""}});
  r = Once();
  EXPECT_THAT(r.output, HasSubstr("release slurmd-h100-1 returned"));
  status = RunCommand(GpuletBinary() + " broker status --config " + dir_.path() + "/broker.yaml");
  EXPECT_THAT(status.output, HasSubstr("lent=0 in-transit=0"));
}

TEST_F(SlurmOnK8sBroker, AnUnreadableSlurmChangesNothingAndSaysWhy) {
  api_->Put("/api/v1/namespaces/inference/pods/llm", GpuPod("llm", false));
  WriteFile(dir_.path() + "/sinfo.rc", "1");
  CommandResult r = Once();
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("none - unknown_slurm"));
  EXPECT_THAT(Calls(), ::testing::Not(HasSubstr("scontrol update")));
  EXPECT_EQ(Replicas(), 2);
}

TEST_F(SlurmOnK8sBroker, AnAdminDrainOnTheHighestOrdinalIsNeverTouched) {
  api_->Put("/api/v1/namespaces/inference/pods/llm", GpuPod("llm", false));
  Nodes({{"slurmd-h100-0", ""}, {"slurmd-h100-1", "memory errors, ticket 42"}});
  CommandResult r = Once();
  EXPECT_THAT(r.output, HasSubstr("none - no_candidate"));
  EXPECT_THAT(Calls(), ::testing::Not(HasSubstr("scontrol update")));
  EXPECT_EQ(Replicas(), 2);
}

}  // namespace
}  // namespace gpulet::broker_testing
