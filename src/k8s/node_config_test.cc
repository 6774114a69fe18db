// Per-node config selection through the fake API server: the node label picks a named config
// from the ConfigMap, changes to the label or the ConfigMap switch the file, a broken watch
// recovers, and choices that cannot be honoured leave the file as it is.
#include "k8s/node_config.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "apiserver/fake_apiserver.h"
#include "apiserver/rbac_check.h"
#include "support/wait_until.h"

namespace gpulet::k8s {
namespace {

using gpulet::testing::FakeApiServer;
using namespace std::chrono_literals;

const std::string kNodePath = "/api/v1/nodes/gpu-node-1";
const std::string kCmPath = "/api/v1/namespaces/gpulet-system/configmaps/gpulet-config";

std::string TempDir() {
  std::string tmpl = ::testing::TempDir() + "gpulet-nodecfg-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

NodeConfigOptions Options(const std::string& output) {
  NodeConfigOptions o;
  o.node_name = "gpu-node-1";
  o.configmap_namespace = "gpulet-system";
  o.configmap_name = "gpulet-config";
  o.output_path = output;
  return o;
}

nlohmann::json Recorded(const std::string& name) {
  Result<nlohmann::json> j = gpulet::testing::LoadRecorded(name);
  EXPECT_TRUE(j.ok()) << j.status().message();
  return j.ok() ? *j : nlohmann::json();
}

nlohmann::json NodeWithLabel(const std::string& value) {
  nlohmann::json n = Recorded("node.json");
  n["metadata"]["labels"][kConfigLabel] = value;
  return n;
}

TEST(SelectConfig, LabelPicksTheNamedConfigElseTheDefault) {
  const nlohmann::json cm = Recorded("configmap.json");
  Result<ConfigChoice> c = SelectConfig(NodeWithLabel("mps"), cm, Options("/unused"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->name, "mps");
  EXPECT_TRUE(c->from_label);
  EXPECT_EQ(c->content, cm["data"]["mps"]);
  c = SelectConfig(Recorded("node.json"), cm, Options("/unused"));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->name, "default");
  EXPECT_FALSE(c->from_label);
  NodeConfigOptions o = Options("/unused");
  o.default_config = "time-slicing";
  EXPECT_EQ(SelectConfig(std::nullopt, cm, o)->name, "time-slicing");
}

TEST(SelectConfig, UnknownNameListsTheAvailableConfigs) {
  Result<ConfigChoice> c =
      SelectConfig(NodeWithLabel("nope"), Recorded("configmap.json"), Options("/unused"));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(c.status().message().find("no config \"nope\""), std::string::npos);
  EXPECT_NE(c.status().message().find("label nvidia.com/device-plugin.config=nope"),
            std::string::npos);
  EXPECT_NE(c.status().message().find("available: default, mps, time-slicing"), std::string::npos)
      << c.status().message();
  EXPECT_EQ(SelectConfig(NodeWithLabel("mps"), std::nullopt, Options("/x")).status().code(),
            ErrorCode::kNotFound);
}

TEST(SelectConfig, InvalidConfigNamesTheConfigMapKeyLineAndField) {
  nlohmann::json cm = Recorded("configmap.json");
  cm["data"]["bad"] =
      "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
      "      - name: nvidia.com/gpu\n        replicas: 1\n";
  Result<ConfigChoice> c = SelectConfig(NodeWithLabel("bad"), cm, Options("/unused"));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), ErrorCode::kInvalidInput);
  EXPECT_NE(c.status().message().find("configmap gpulet-system/gpulet-config[bad]:6:"),
            std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find("replicas"), std::string::npos);
}

TEST(WriteFileIfChanged, WritesAtomicallyAndOnlyOnChange) {
  const std::string path = TempDir() + "/config.yaml";
  EXPECT_TRUE(*WriteFileIfChanged(path, "a: 1\n"));
  struct stat first {};
  ASSERT_EQ(stat(path.c_str(), &first), 0);
  EXPECT_FALSE(*WriteFileIfChanged(path, "a: 1\n"));
  struct stat same {};
  ASSERT_EQ(stat(path.c_str(), &same), 0);
  EXPECT_EQ(first.st_ino, same.st_ino);  // untouched
  EXPECT_TRUE(*WriteFileIfChanged(path, "a: 2\n"));
  EXPECT_EQ(Slurp(path), "a: 2\n");
  EXPECT_FALSE(WriteFileIfChanged("/nonexistent-dir/x/config.yaml", "a").ok());
}

class SyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    Result<gpulet::testing::TestPki> pki = gpulet::testing::MakeTestPki(dir_);
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    Result<std::unique_ptr<FakeApiServer>> s = FakeApiServer::Start(*pki, {});
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(s).value();
    server_->Put(kNodePath, Recorded("node.json"));
    server_->Put(kCmPath, Recorded("configmap.json"));
    ClusterAccess a = server_->Access(*pki);
    client_ = std::make_unique<Client>(a);
    output_ = dir_ + "/config.yaml";
  }
  void StartSync() {
    WatcherOptions wo;
    wo.initial_backoff = 50ms;
    wo.max_backoff = 200ms;
    sync_ = std::make_unique<NodeConfigSync>(*client_, Options(output_), wo);
    thread_ = std::thread([this] { sync_->Run(stop_); });
    ASSERT_TRUE(server_->WaitForOpenWatches(2, 20s));
  }
  void TearDown() override {
    stop_.Stop();
    if (thread_.joinable()) thread_.join();
    // The node agent's reads and watches of its Node and its ConfigMap are granted by its roles.
    if (!server_) return;
    for (const std::string& v :
         gpulet::testing::RbacVerbsNotGranted(server_->requests(), {"deploy/base/rbac.yaml"})) {
      ADD_FAILURE() << "deploy/base/rbac.yaml does not grant " << v;
    }
  }
  // Bounded wait for the output file to hold `content`.
  bool WaitForFile(const std::string& content) {
    for (int i = 0; i < 400; ++i) {
      if (Slurp(output_) == content) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }
  void SetLabel(const std::string& value) {
    nlohmann::json n = *server_->Object(kNodePath);
    n["metadata"]["labels"][kConfigLabel] = value;
    server_->Put(kNodePath, n);
  }
  void SetConfig(const std::string& key, const std::string& content) {
    nlohmann::json cm = *server_->Object(kCmPath);
    cm["data"][key] = content;
    server_->Put(kCmPath, cm);
  }
  std::string Config(const std::string& key) {
    return (*server_->Object(kCmPath))["data"][key].get<std::string>();
  }

  std::string dir_, output_;
  std::unique_ptr<FakeApiServer> server_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<NodeConfigSync> sync_;
  StopSignal stop_;
  std::thread thread_;
};

TEST_F(SyncTest, OnceWritesTheLabelledConfig) {
  SetLabel("time-slicing");
  NodeConfigSync sync(*client_, Options(output_));
  Result<ConfigChoice> c = sync.SyncOnce();
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->name, "time-slicing");
  EXPECT_EQ(Slurp(output_), Config("time-slicing"));
}

TEST_F(SyncTest, OnceFailsOnAnUnknownConfigAndWritesNothing) {
  SetLabel("nope");
  NodeConfigSync sync(*client_, Options(output_));
  EXPECT_EQ(sync.SyncOnce().status().code(), ErrorCode::kNotFound);
  EXPECT_FALSE(std::ifstream(output_).good());
}

TEST_F(SyncTest, LabelChangeSwitchesTheFile) {
  StartSync();
  ASSERT_TRUE(WaitForFile(Config("default")));
  SetLabel("mps");
  ASSERT_TRUE(WaitForFile(Config("mps")));
  SetLabel("time-slicing");
  ASSERT_TRUE(WaitForFile(Config("time-slicing")));
  // The count moves just after the file is renamed into place: wait for it, then check it.
  testing::WaitUntil([&] { return sync_->writes() >= 3u; }, std::chrono::seconds(10));
  EXPECT_EQ(sync_->writes(), 3u);
}

TEST_F(SyncTest, ConfigMapChangeSwitchesTheFile) {
  SetLabel("mps");
  StartSync();
  ASSERT_TRUE(WaitForFile(Config("mps")));
  const std::string updated =
      "version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        "
      "replicas: 8\n";
  SetConfig("mps", updated);
  ASSERT_TRUE(WaitForFile(updated));
  // A change to another config does not rewrite this node's file.
  testing::WaitUntil([&] { return sync_->writes() >= 2u; }, std::chrono::seconds(10));
  const uint64_t writes = sync_->writes();
  SetConfig("default", "version: v1\nflags:\n  migStrategy: single\n");
  SetConfig("mps", updated + "# touched\n");
  ASSERT_TRUE(WaitForFile(updated + "# touched\n"));
  testing::WaitUntil([&] { return sync_->writes() >= writes + 1; }, std::chrono::seconds(10));
  EXPECT_EQ(sync_->writes(), writes + 1);
}

TEST_F(SyncTest, BrokenWatchRecoversAndCatchesTheChangeMadeMeanwhile) {
  StartSync();
  ASSERT_TRUE(WaitForFile(Config("default")));
  server_->BreakWatches();
  SetLabel("time-slicing");
  ASSERT_TRUE(WaitForFile(Config("time-slicing")));
  server_->ExpireVersionsBefore(server_->current_version() + 1);
  server_->BreakWatches();
  SetLabel("mps");
  ASSERT_TRUE(WaitForFile(Config("mps")));
  EXPECT_GE(
      sync_->node_watcher().stats().reconnects.load() + sync_->node_watcher().stats().gone.load(),
      2u);
}

TEST_F(SyncTest, UnknownOrInvalidChoiceKeepsTheCurrentFile) {
  SetLabel("mps");
  StartSync();
  ASSERT_TRUE(WaitForFile(Config("mps")));
  SetLabel("missing");
  SetConfig("broken", "version: v2\n");
  for (int i = 0; i < 400 && sync_->rejected() < 1; ++i) std::this_thread::sleep_for(50ms);
  EXPECT_GE(sync_->rejected(), 1u);
  SetLabel("broken");
  for (int i = 0; i < 400 && sync_->rejected() < 2; ++i) std::this_thread::sleep_for(50ms);
  EXPECT_GE(sync_->rejected(), 2u);
  EXPECT_EQ(Slurp(output_), Config("mps"));
  // Fixing the config applies it.
  SetConfig("broken", "version: v1\nflags:\n  migStrategy: mixed\n");
  ASSERT_TRUE(WaitForFile("version: v1\nflags:\n  migStrategy: mixed\n"));
}

}  // namespace
}  // namespace gpulet::k8s
