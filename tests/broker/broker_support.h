// The broker's integration harness: a real Slurm 22.05 (tests/slurm/slurm_cluster.sh: gpua with
// 4 x H100, gpub with 2 x L4) and the fake Kubernetes API server holding the two Nodes (cordoned,
// with the Slurm-pool taint) and whatever pods and PDBs a test puts there.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "apiserver/fake_apiserver.h"
#include "broker/broker.h"
#include "broker/journal.h"
#include "k8s/client.h"
#include "slurm/command.h"
#include "tests/slurm/slurm_test_support.h"

namespace gpulet::broker_testing {

using namespace gpulet::broker;  // NOLINT(google-build-using-namespace): test harness
using gpulet::testing::CommandResult;
using gpulet::testing::GpuletBinary;
using gpulet::testing::RunCommand;
using nlohmann::json;
using slurm_testing::Cluster;
using slurm_testing::TempDir;
using slurm_testing::WaitFor;

// Runs commands for real; before the first command whose line contains `trigger` it calls
// `hook` once (to make something happen between the broker's read and its action).
class HookRunner : public slurm::CommandRunner {
 public:
  Result<slurm::CommandOutput> Run(const std::vector<std::string>& argv,
                                   std::chrono::milliseconds timeout) const override {
    std::string line;
    for (const auto& a : argv) line += a + " ";
    if (hook && !trigger.empty() && line.find(trigger) != std::string::npos) {
      auto h = std::move(hook);
      hook = nullptr;
      h();
    }
    return real_.Run(argv, timeout);
  }
  std::string trigger;
  mutable std::function<void()> hook;

 private:
  slurm::ProcessRunner real_;
};

inline json Node(const std::string& name) {
  return {{"apiVersion", "v1"},
          {"kind", "Node"},
          {"metadata", {{"name", name}, {"labels", {{"kubernetes.io/hostname", name}}}}},
          {"spec",
           {{"unschedulable", true},
            {"taints", json::array({{{"key", "gpulet.io/pool"},
                                     {"value", "slurm"},
                                     {"effect", "NoSchedule"}}})}}}};
}

inline json PendingGpuPod(const std::string& ns, const std::string& name) {
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", ns}}},
          {"spec",
           {{"containers", json::array({{{"name", "server"},
                                         {"resources",
                                          {{"limits", {{"nvidia.com/gpu", "1"}}}}}}})}}},
          {"status",
           {{"phase", "Pending"},
            {"conditions", json::array({{{"type", "PodScheduled"},
                                         {"status", "False"},
                                         {"reason", "Unschedulable"}}})}}}};
}

inline json RunningPod(const std::string& ns, const std::string& name, const std::string& node,
                       bool daemonset = false) {
  json p = {{"apiVersion", "v1"},
            {"kind", "Pod"},
            {"metadata", {{"name", name}, {"namespace", ns}, {"labels", {{"app", name}}}}},
            {"spec", {{"nodeName", node}, {"containers", json::array({{{"name", "c"}}})}}},
            {"status", {{"phase", "Running"}}}};
  if (daemonset) {
    p["metadata"]["ownerReferences"] = json::array({{{"kind", "DaemonSet"}, {"name", "ds"}}});
  }
  return p;
}

inline json Pdb(const std::string& ns, const std::string& name, const std::string& app,
                int allowed) {
  return {{"apiVersion", "policy/v1"},
          {"kind", "PodDisruptionBudget"},
          {"metadata", {{"name", name}, {"namespace", ns}}},
          {"spec", {{"selector", {{"matchLabels", {{"app", app}}}}}}},
          {"status", {{"disruptionsAllowed", allowed}}}};
}

class BrokerWorld {
 public:
  // Starts the cluster and the API server. Returns "" or why it could not.
  std::string Start() {
    if (std::string why = slurm_testing::ClusterUnavailableReason(); !why.empty()) return why;
    if (std::string err = cluster_.Start(); !err.empty()) return "cluster: " + err;
    setenv("SLURM_CONF", cluster_.conf().c_str(), 1);
    Result<testing::TestPki> pki = testing::MakeTestPki(dir_.path());
    if (!pki.ok()) return pki.status().message();
    pki_ = *pki;
    auto api = testing::FakeApiServer::Start(pki_, {});
    if (!api.ok()) return api.status().message();
    api_ = std::move(*api);
    api_->Put("/api/v1/nodes/gpua", Node("gpua"));
    api_->Put("/api/v1/nodes/gpub", Node("gpub"));
    k8s::ClusterAccess access = api_->Access(pki_);
    client_ = std::make_unique<k8s::Client>(access);
    config_.nodes = {"gpua", "gpub"};
    config_.namespaces = {"inference"};
    config_.slurm_min_nodes = 0;
    config_.k8s_max_nodes = 2;
    config_.idle_time = 0;
    config_.reservation_lookahead = 3600 * 1000;
    config_.demand_evaluations = 2;
    config_.min_residence = 0;
    config_.cooldown = 0;
    config_.return_after_idle = 0;
    config_.eviction_timeout = 3600 * 1000;
    config_.interval = 200;
    config_.command_timeout = 10 * 1000;
    config_.journal_path = dir_.path() + "/journal.json";
    return "";
  }

  // A fresh broker (as after a restart) on the current config and journal file.
  Broker& NewBroker() {
    broker_.reset();
    kube_ = std::make_unique<KubeSide>(*client_, config_);
    slurm_ = std::make_unique<SlurmSide>(runner_, config_);
    broker_ = std::make_unique<Broker>(config_, *slurm_, *kube_, BrokerOptions{});
    EXPECT_TRUE(broker_->Start().ok());
    return *broker_;
  }

  // Ticks until `done` (bounded); returns the decisions seen.
  std::vector<Decision> TickUntil(const std::function<bool(const Decision&)>& done,
                                  int max_ticks = 100) {
    std::vector<Decision> seen;
    for (int i = 0; i < max_ticks; ++i) {
      seen.push_back(broker_->Tick(NowMs()));
      if (done(seen.back())) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return seen;
  }

  json K8sNode(const std::string& name) const {
    return api_->Object("/api/v1/nodes/" + name).value_or(json());
  }
  bool Admitted(const std::string& name) const {
    json n = K8sNode(name);
    bool tainted = false;
    for (const json& t : n["spec"].value("taints", json::array())) {
      if (t.value("key", "") == "gpulet.io/pool") tainted = true;
    }
    return !n["spec"].value("unschedulable", false) && !tainted &&
           n["metadata"]["labels"].value("gpulet.io/pool", "") == "inference";
  }
  bool CordonedAndTainted(const std::string& name) const {
    json n = K8sNode(name);
    bool tainted = false;
    for (const json& t : n["spec"].value("taints", json::array())) {
      if (t.value("key", "") == "gpulet.io/pool") tainted = true;
    }
    return n["spec"].value("unschedulable", false) && tainted;
  }
  std::string SlurmLine(const std::string& node) const { return cluster_.NodeLine(node); }
  bool SlurmDrainedByBroker(const std::string& node) const {
    std::string l = SlurmLine(node);
    return l.find("DRAIN") != std::string::npos &&
           l.find("Reason=gpulet-broker:") != std::string::npos;
  }
  Journal DiskJournal() const {
    Result<Journal> j = LoadJournal(config_.journal_path);
    return j.ok() ? *j : Journal{};
  }
  void Demand(int pods) {
    for (int i = 0; i < 8; ++i) {
      const std::string path = "/api/v1/namespaces/inference/pods/web-" + std::to_string(i);
      if (i < pods) {
        api_->Put(path, PendingGpuPod("inference", "web-" + std::to_string(i)));
      } else {
        api_->Delete(path);
      }
    }
  }
  // Lends `node` (the only managed node) and waits until Kubernetes has it.
  void LendOnly(const std::string& node) {
    config_.nodes = {node};
    NewBroker();
    Demand(1);
    TickUntil([&](const Decision&) { return Admitted(node); });
    ASSERT_TRUE(Admitted(node)) << SlurmLine(node);
    Demand(0);
  }

  Cluster cluster_;
  TempDir dir_;
  testing::TestPki pki_;
  std::unique_ptr<testing::FakeApiServer> api_;
  std::unique_ptr<k8s::Client> client_;
  BrokerConfig config_;
  std::shared_ptr<HookRunner> runner_ = std::make_shared<HookRunner>();
  std::unique_ptr<KubeSide> kube_;
  std::unique_ptr<SlurmSide> slurm_;
  std::unique_ptr<Broker> broker_;
};

}  // namespace gpulet::broker_testing
