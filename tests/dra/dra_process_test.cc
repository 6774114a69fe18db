// The real `gpulet dra --simulate dgx-h100` against the kubelet's DRA side (testing/kubelet/
// dra_harness.h) and the fake API server: registration, a claim prepared (its CDI spec on disk
// before the answer) and unprepared; faults: the process SIGKILLed between Prepare and Unprepare
// (the restarted one unprepares from its checkpoint, the claim deleted meanwhile), a corrupted
// checkpoint (named in the log, kept aside, rebuilt from the API server), the API server
// unreachable during Prepare (a per-claim error, nothing left behind).
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "apiserver/fake_apiserver.h"
#include "common/files.h"
#include "dra/test_claims.h"
#include "kubelet/dra_harness.h"
#include "tests/deviceplugin/plugin_process.h"
#include "support/wait_until.h"

namespace gpulet::testing {
namespace {

namespace fs = std::filesystem;
using dra::testing::ClaimObjectPath;
using dra::testing::MakeClaimObject;
using dra::testing::TestClaim;
using dra::testing::TestResult;
using std::chrono::milliseconds;

constexpr char kNode[] = "node-1";
constexpr char kDriver[] = "gpu.gpulet.io";

void Touch(const std::string& path) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << "";
}

class DraProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.path();
    fs::create_directories(dir_ + "/pki");
    Result<TestPki> pki = MakeTestPki(dir_ + "/pki");
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    pki_ = *pki;
    StartApi();
    ASSERT_TRUE(WriteFileAtomic(dir_ + "/boot_id", "boot-a\n").ok());
    // A driver root as the node preparer looks for it (dgx-h100's driver 550.54.15).
    const std::string root = dir_ + "/driver";
    Touch(root + "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15");
    Touch(root + "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15");
    Touch(root + "/usr/bin/nvidia-smi");
    for (const char* n : {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}) Touch(root + "/dev/" + n);
    for (int i = 0; i < 8; ++i) Touch(root + "/dev/nvidia" + std::to_string(i));
    DraHarnessOptions o;
    o.registry_dir = dir_ + "/reg";
    harness_ = std::make_unique<DraKubeletHarness>(o);
    ASSERT_TRUE(harness_->Start().ok());
  }
  void TearDown() override {
    if (process_) process_->Stop(SIGTERM);
    if (harness_) harness_->Stop();
  }

  void StartApi() {
    FakeApiServer::Options o;
    Result<std::unique_ptr<FakeApiServer>> s = FakeApiServer::Start(pki_, o);
    ASSERT_TRUE(s.ok()) << s.status().message();
    api_ = std::move(s).value();
    std::ofstream(dir_ + "/kubeconfig")
        << "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: "
        << api_->url() << "\n    certificate-authority: " << pki_.ca_cert
        << "\nusers:\n- name: u\n  user:\n    token: test-token\n"
           "contexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n";
  }

  void StartDra() {
    if (process_) process_.reset();
    process_ = std::make_unique<GpuletProcess>(
        std::vector<std::string>{"dra", "--simulate", "dgx-h100", "--sim-state", dir_ + "/sim",
                                 "--node-name", kNode, "--kubeconfig", dir_ + "/kubeconfig",
                                 "--plugins-registry", dir_ + "/reg", "--plugin-dir",
                                 dir_ + "/plugins", "--cdi-root", dir_ + "/cdi", "--driver-root",
                                 dir_ + "/driver", "--state-dir", dir_ + "/state",
                                 "--boot-id-file", dir_ + "/boot_id"},
        dir_ + "/dra-" + std::to_string(++starts_) + ".log");
    ASSERT_TRUE(process_->Start());
    ASSERT_TRUE(process_->WaitForLog("event=dra_serving", milliseconds(30000)))
        << process_->Log();
    ASSERT_TRUE(harness_->WaitForDriver(kDriver, milliseconds(10000)));
  }

  DraClaimRef PutClaim(const std::string& name, std::vector<TestResult> results) {
    TestClaim c;
    c.name = name;
    char uid[40];
    std::snprintf(uid, sizeof(uid), "6f1c2e3a-0000-4000-8000-%012d", ++claims_);  // a UUID
    c.uid = uid;
    c.node = kNode;
    c.results = std::move(results);
    api_->Put(ClaimObjectPath(c.namespace_, c.name), MakeClaimObject(c));
    return DraClaimRef{c.namespace_, c.name, c.uid, kDriver};
  }

  size_t CdiSpecs() const {
    size_t n = 0;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir_ + "/cdi", ec)) {
      n += e.path().extension() == ".json";
    }
    return n;
  }

  TempDir tmp_;
  std::string dir_;
  TestPki pki_;
  std::unique_ptr<FakeApiServer> api_;
  std::unique_ptr<DraKubeletHarness> harness_;
  std::unique_ptr<GpuletProcess> process_;
  int starts_ = 0;
  int claims_ = 0;
};

TEST_F(DraProcessTest, PreparesAndUnpreparesAClaim) {
  StartDra();
  DraClaimRef a = PutClaim("a", {TestResult{"gpu", "gpu-0"}});
  auto out = harness_->PreparePod({a});
  ASSERT_EQ(out.at(a.uid).error, "") << process_->Log();
  ASSERT_EQ(out.at(a.uid).devices.size(), 1u);
  EXPECT_EQ(out.at(a.uid).devices[0].device, "gpu-0");
  EXPECT_EQ(out.at(a.uid).devices[0].pool, kNode);
  EXPECT_FALSE(out.at(a.uid).devices[0].cdi_device_ids.empty());
  EXPECT_EQ(CdiSpecs(), 1u);  // written before the answer
  // status.devices written back to the claim (by a worker, after the answer: bounded wait).
  std::optional<nlohmann::json> claim;
  testing::WaitUntil(
      [&] {
        claim = api_->Object(ClaimObjectPath("default", "a"));
        return claim && (*claim)["status"].contains("devices");
      },
      milliseconds(5000));
  ASSERT_TRUE(claim.has_value());
  ASSERT_TRUE((*claim)["status"].contains("devices")) << claim->dump();
  EXPECT_EQ((*claim)["status"]["devices"][0]["device"], "gpu-0");
  EXPECT_EQ(harness_->UnpreparePod({a}).at(a.uid), "");
  EXPECT_EQ(CdiSpecs(), 0u);
}

TEST_F(DraProcessTest, KilledBetweenPrepareAndUnprepare) {
  StartDra();
  DraClaimRef a = PutClaim("a", {TestResult{"gpu", "gpu-1"}});
  ASSERT_EQ(harness_->PreparePod({a}).at(a.uid).error, "") << process_->Log();
  process_->Signal(SIGKILL);
  process_->Stop(SIGKILL);
  api_->Delete(ClaimObjectPath("default", "a"));  // the pod and its claim are gone meanwhile
  // The killed process left its sockets; the restarted one replaces them.
  StartDra();
  EXPECT_EQ(harness_->UnpreparePod({a}, 3, milliseconds(200)).at(a.uid), "") << process_->Log();
  EXPECT_EQ(CdiSpecs(), 0u);
}

TEST_F(DraProcessTest, CorruptedCheckpointIsReportedAndRebuilt) {
  StartDra();
  DraClaimRef a = PutClaim("a", {TestResult{"gpu", "gpu-2"}});
  ASSERT_EQ(harness_->PreparePod({a}).at(a.uid).error, "") << process_->Log();
  process_->Stop(SIGTERM);
  const std::string checkpoint = dir_ + "/plugins/gpu.gpulet.io/checkpoint.json";
  ASSERT_TRUE(fs::exists(checkpoint));
  ASSERT_TRUE(WriteFileAtomic(checkpoint, "{\"version\":1,\"claims\":", 0600).ok());
  StartDra();  // no crash loop
  EXPECT_TRUE(process_->WaitForLog("event=dra_checkpoint_corrupt path=" + checkpoint,
                                   milliseconds(1000)))
      << process_->Log();
  EXPECT_TRUE(process_->WaitForLog("event=dra_checkpoint_rebuilt", milliseconds(1000)));
  bool kept = false;
  for (const auto& e : fs::directory_iterator(dir_ + "/plugins/gpu.gpulet.io")) {
    kept |= e.path().filename().string().rfind("checkpoint.json.corrupt-", 0) == 0;
  }
  EXPECT_TRUE(kept);
  EXPECT_EQ(harness_->UnpreparePod({a}).at(a.uid), "") << process_->Log();
  EXPECT_EQ(CdiSpecs(), 0u);
}

TEST_F(DraProcessTest, ApiServerDownDuringPrepare) {
  StartDra();
  DraClaimRef a = PutClaim("a", {TestResult{"gpu", "gpu-3"}});
  api_.reset();
  auto out = harness_->PreparePod({a});
  EXPECT_NE(out.at(a.uid).error.find("cannot read it from the API server"), std::string::npos)
      << out.at(a.uid).error;
  EXPECT_EQ(CdiSpecs(), 0u);
  EXPECT_TRUE(process_->Running());
}

}  // namespace
}  // namespace gpulet::testing
