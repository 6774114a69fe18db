// The real `gpulet dra --simulate dgx-h100` against the kubelet's DRA side (testing/kubelet/
// dra_harness.h) and the fake API server: registration, a claim prepared (its CDI spec on disk
// before the answer) and unprepared; faults: the process SIGKILLed between Prepare and Unprepare
// (the restarted one unprepares from its checkpoint, the claim deleted meanwhile), a corrupted
// checkpoint (named in the log, kept aside, rebuilt from the API server), the API server
// unreachable during Prepare (a per-claim error, nothing left behind).
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "apiserver/fake_apiserver.h"
#include "apiserver/rbac_check.h"
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
                                 "--boot-id-file", dir_ + "/boot_id", "--device-plugin-path",
                                 dir_ + "/dp"},
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
  // status.devices[].data: what the device is on this node (the simulated GPU 0's UUID).
  const nlohmann::json& data = (*claim)["status"]["devices"][0]["data"];
  ASSERT_TRUE(data.is_object()) << claim->dump();
  EXPECT_EQ(data.value("uuid", "").rfind("GPU-", 0), 0u) << data.dump();
  EXPECT_EQ(harness_->UnpreparePod({a}).at(a.uid), "");
  EXPECT_EQ(CdiSpecs(), 0u);
}

// `gpulet node --dra`: the DRA driver inside the node agent, beside the exporter on the same
// NVML session; the device plugin does not start (one node must not serve the GPUs both ways).
TEST_F(DraProcessTest, NodeWithDraServesClaimsBesideTheExporter) {
  process_ = std::make_unique<GpuletProcess>(
      std::vector<std::string>{"--simulate", "dgx-h100", "--sim-state", dir_ + "/sim", "node",
                               "--dra", "--node-name", kNode, "--kubeconfig",
                               dir_ + "/kubeconfig", "--device-plugin-path", dir_ + "/dp",
                               "-a", "127.0.0.1:0", "-c", "500", "--dra-plugins-registry",
                               dir_ + "/reg", "--dra-plugin-dir", dir_ + "/plugins",
                               "--dra-cdi-root", dir_ + "/cdi", "--dra-driver-root",
                               dir_ + "/driver", "--dra-state-dir", dir_ + "/state",
                               "--dra-boot-id-file", dir_ + "/boot_id"},
      dir_ + "/node.log");
  ASSERT_TRUE(process_->Start());
  ASSERT_TRUE(process_->WaitForLog("event=dra_serving", milliseconds(30000))) << process_->Log();
  ASSERT_TRUE(harness_->WaitForDriver(kDriver, milliseconds(10000))) << process_->Log();
  DraClaimRef a = PutClaim("a", {TestResult{"gpu", "gpu-3"}});
  auto out = harness_->PreparePod({a});
  ASSERT_EQ(out.at(a.uid).error, "") << process_->Log();
  ASSERT_EQ(out.at(a.uid).devices.size(), 1u);
  EXPECT_EQ(CdiSpecs(), 1u);
  // The exporter serves the node's GPUs.
  const int port = ListeningPort(*process_, milliseconds(30000));
  ASSERT_GT(port, 0) << process_->Log();
  httplib::Client http("127.0.0.1", port);
  http.set_read_timeout(10, 0);
  httplib::Result metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics) << process_->Log();
  EXPECT_EQ(metrics->status, 200);
  EXPECT_NE(metrics->body.find("DCGM_FI_DEV_FB_USED"), std::string::npos);
  // No device-plugin socket: the device plugin did not start.
  size_t sockets = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_ + "/dp", ec)) sockets += e.is_socket();
  EXPECT_EQ(sockets, 0u);
  EXPECT_NE(process_->Log().find("event=node_dra"), std::string::npos);
  EXPECT_EQ(harness_->UnpreparePod({a}).at(a.uid), "");
  EXPECT_EQ(CdiSpecs(), 0u);
}

// Every request `gpulet dra` sends the API server, through a prepare, a status write, an
// unprepare, the slices wiped and put back and a restart, is one the overlay's ClusterRole grants:
// the fake API server checks no RBAC, so without this a missing verb shows only on a cluster (it
// did: the slices' JSON patches and the status merge patches had no "patch" verb).
TEST_F(DraProcessTest, EveryRequestIsGrantedByTheOverlaysRole) {
  StartDra();
  DraClaimRef a = PutClaim("a", {TestResult{"gpu", "gpu-2"}});
  ASSERT_EQ(harness_->PreparePod({a}).at(a.uid).error, "") << process_->Log();
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        std::optional<nlohmann::json> c = api_->Object(ClaimObjectPath("default", "a"));
        return c && (*c)["status"].contains("devices");
      },
      milliseconds(5000)));
  EXPECT_EQ(harness_->UnpreparePod({a}).at(a.uid), "");
  process_->Stop(SIGTERM);
  StartDra();  // the slices are there: the publisher reconciles them
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        size_t lists = 0;  // one by each instance's publisher
        for (const RecordedRequest& r : api_->requests()) {
          lists += r.method == "GET" && r.path == "/apis/resource.k8s.io/v1/resourceslices";
        }
        return lists >= 2;
      },
      milliseconds(10000)));
  EXPECT_TRUE(RbacVerbsNeeded(api_->requests()).count("resource.k8s.io/resourceclaims/status:patch"))
      << "no status write seen";
  for (const std::string& v :
       RbacVerbsNotGranted(api_->requests(), {"deploy/overlays/dra/rbac.yaml"})) {
    ADD_FAILURE() << "not granted: " << v;
  }
}

// A device plugin serving nvidia.com/gpu on the node (a live nvidia-gpu.sock): `gpulet dra`
// refuses to start and names the socket (the shipped DeviceClasses map nvidia.com/gpu to it); once
// that plugin is gone (its socket left behind, refusing connections) it starts.
TEST_F(DraProcessTest, RefusesToStartBesideALiveDevicePlugin) {
  fs::create_directories(dir_ + "/dp");
  const std::string sock = dir_ + "/dp/nvidia-gpu.sock";
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", sock.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  RunResult r = RunGpulet({"dra", "--simulate", "dgx-h100", "--sim-state", dir_ + "/sim",
                           "--node-name", kNode, "--kubeconfig", dir_ + "/kubeconfig",
                           "--plugins-registry", dir_ + "/reg", "--plugin-dir", dir_ + "/plugins",
                           "--device-plugin-path", dir_ + "/dp"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find(sock), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("must not serve them both ways"), std::string::npos) << r.output;
  ::close(fd);  // the plugin is gone; its socket file stays
  ASSERT_TRUE(fs::exists(sock));
  StartDra();
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
