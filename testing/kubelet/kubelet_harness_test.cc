#include "kubelet/kubelet_harness.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "support/wait_until.h"

namespace gpulet::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

constexpr milliseconds kWait{20000};  // generous bound; tests normally finish in milliseconds
constexpr char kGpu[] = "nvidia.com/gpu";

struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/gpulet-kh-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string path;
};

v1beta1::Device MakeDevice(const std::string& id, bool healthy, int numa) {
  v1beta1::Device d;
  d.set_id(id);
  d.set_health(healthy ? kHealthy : kUnhealthy);
  if (numa >= 0) d.mutable_topology()->add_nodes()->set_id(numa);
  return d;
}

// A tiny device plugin: serves DevicePlugin on <dir>/<endpoint>, streams the device list it is
// given, and can misbehave the ways the kubelet harness must survive.
class FakePlugin final : public v1beta1::DevicePlugin::Service {
 public:
  FakePlugin(std::string dir, std::string endpoint)
      : dir_(std::move(dir)), endpoint_(std::move(endpoint)) {}
  ~FakePlugin() override { Shutdown(); }

  void Serve() {
    grpc::ServerBuilder b;
    b.AddListeningPort("unix:" + socket(), grpc::InsecureServerCredentials());
    b.RegisterService(this);
    server_ = b.BuildAndStart();
    ASSERT_TRUE(server_) << socket();
  }
  void Shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      cv_.notify_all();
    }
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_.reset();
  }
  std::string socket() const { return dir_ + "/" + endpoint_; }

  grpc::Status Register(const std::string& kubelet_socket, const std::string& resource,
                        const std::string& version = "v1beta1") {
    auto stub = v1beta1::Registration::NewStub(
        grpc::CreateChannel("unix:" + kubelet_socket, grpc::InsecureChannelCredentials()));
    v1beta1::RegisterRequest req;
    req.set_version(version);
    req.set_endpoint(endpoint_);
    req.set_resource_name(resource);
    {
      std::lock_guard<std::mutex> lock(mu_);
      req.mutable_options()->set_get_preferred_allocation_available(preferred_available_);
    }
    v1beta1::Empty resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    grpc::Status st = stub->Register(&ctx, req, &resp);
    std::lock_guard<std::mutex> lock(mu_);
    register_returned_ = true;
    cv_.notify_all();
    return st;
  }

  void SetDevices(std::vector<v1beta1::Device> devices) {
    std::lock_guard<std::mutex> lock(mu_);
    devices_ = std::move(devices);
    ++version_;
    cv_.notify_all();
  }
  // Makes the open ListAndWatch return (the plugin ends the stream).
  void EndStreams() {
    std::lock_guard<std::mutex> lock(mu_);
    end_streams_ = true;
    cv_.notify_all();
  }
  void BlockOptionsUntilRegisterReturns() {
    std::lock_guard<std::mutex> lock(mu_);
    block_options_ = true;
  }
  int streams_opened() {
    std::lock_guard<std::mutex> lock(mu_);
    return streams_opened_;
  }
  int streams_cancelled() {
    std::lock_guard<std::mutex> lock(mu_);
    return streams_cancelled_;
  }

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* out) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (block_options_) {
      // A plugin that handles its own Register synchronously cannot answer here. Bounded so that
      // a broken harness fails the test instead of hanging it.
      cv_.wait_for(lock, std::chrono::seconds(30), [&] { return register_returned_ || stopping_; });
    }
    out->set_get_preferred_allocation_available(preferred_available_);
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++streams_opened_;
    uint64_t sent = 0;
    while (!stopping_ && !end_streams_) {
      if (sent != version_) {
        v1beta1::ListAndWatchResponse resp;
        for (const auto& d : devices_) *resp.add_devices() = d;
        sent = version_;
        lock.unlock();
        const bool ok = writer->Write(resp);
        lock.lock();
        if (!ok) break;
        continue;
      }
      // The sync API has no cancellation callback: look at the context between waits.
      if (ctx->IsCancelled()) break;
      cv_.wait_for(lock, milliseconds(20));
    }
    if (ctx->IsCancelled()) ++streams_cancelled_;
    return grpc::Status::OK;
  }

  // How GetPreferredAllocation misbehaves, and what it was last asked.
  void SetPreferred(bool available, std::string answer_first = "", bool fail = false) {
    std::lock_guard<std::mutex> lock(mu_);
    preferred_available_ = available;
    preferred_first_ = std::move(answer_first);
    preferred_fail_ = fail;
  }
  int preferred_calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return preferred_calls_;
  }
  v1beta1::ContainerPreferredAllocationRequest last_preferred() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_preferred_;
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*,
                                      const v1beta1::PreferredAllocationRequest* req,
                                      v1beta1::PreferredAllocationResponse* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++preferred_calls_;
    if (req->container_requests_size() > 0) last_preferred_ = req->container_requests(0);
    if (preferred_fail_) return grpc::Status(grpc::StatusCode::INTERNAL, "no good placement");
    for (const auto& c : req->container_requests()) {
      auto* r = out->add_container_responses();
      if (!preferred_first_.empty()) r->add_deviceids(preferred_first_);
      for (const auto& id : c.must_include_deviceids()) r->add_deviceids(id);
      // Prefer from the end, so tests see the plugin's choice, not the first IDs.
      for (int i = c.available_deviceids_size() - 1;
           i >= 0 && r->deviceids_size() < c.allocation_size(); --i) {
        const auto& id = c.available_deviceids(i);
        if (std::find(r->deviceids().begin(), r->deviceids().end(), id) == r->deviceids().end()) {
          r->add_deviceids(id);
        }
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* req,
                        v1beta1::AllocateResponse* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& c : req->container_requests()) {
      std::string visible;
      for (const auto& id : c.devices_ids()) {
        bool known = std::any_of(devices_.begin(), devices_.end(),
                                 [&](const auto& d) { return d.id() == id; });
        if (!known) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "unknown device " + id);
        visible += (visible.empty() ? "" : ",") + id;
      }
      (*out->add_container_responses()->mutable_envs())["NVIDIA_VISIBLE_DEVICES"] = visible;
    }
    return grpc::Status::OK;
  }

 private:
  std::string dir_, endpoint_;
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1beta1::Device> devices_;
  uint64_t version_ = 0;
  bool stopping_ = false;
  bool end_streams_ = false;
  bool block_options_ = false;
  bool register_returned_ = false;
  int streams_opened_ = 0;
  int streams_cancelled_ = 0;
  bool preferred_available_ = true;
  std::string preferred_first_;
  bool preferred_fail_ = false;
  int preferred_calls_ = 0;
  v1beta1::ContainerPreferredAllocationRequest last_preferred_;
};

std::vector<v1beta1::Device> TwoGpus() {
  return {MakeDevice("GPU-a", true, 0), MakeDevice("GPU-b", true, 1)};
}

// `h.WaitFor(kGpu, pred)` as a gtest assertion that shows the harness's state on failure.
::testing::AssertionResult Eventually(KubeletHarness& h,
                                      const std::function<bool(const ResourceState&)>& pred) {
  Status st = h.WaitFor(kGpu, pred, kWait);
  if (st.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << st.message();
}

::testing::AssertionResult HealthyCountIs(KubeletHarness& h, size_t n) {
  return Eventually(h, [n](const ResourceState& s) { return s.HealthyCount() == n; });
}

::testing::AssertionResult WaitUntilCancelled(FakePlugin& plugin) {
  if (WaitUntil([&] { return plugin.streams_cancelled() >= 1; }, kWait)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "the plugin's stream was never cancelled";
}

// Serves `plugin` with `devices` and registers it for nvidia.com/gpu.
::testing::AssertionResult ServeAndRegister(FakePlugin& plugin, KubeletHarness& h,
                                            std::vector<v1beta1::Device> devices) {
  plugin.SetDevices(std::move(devices));
  plugin.Serve();
  grpc::Status st = plugin.Register(h.kubelet_socket(), kGpu);
  if (st.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "Register: " << st.error_message();
}

TEST(KubeletHarness, RegistersWithDialBackAndStreamsCompleteLists) {
  TempDir dir;
  KubeletHarness h;
  ASSERT_TRUE(h.Start(dir.path).ok());
  EXPECT_TRUE(fs::is_socket(dir.path + "/kubelet.sock"));
  FakePlugin plugin(dir.path, "nvidia-gpu.sock");
  ASSERT_TRUE(ServeAndRegister(plugin, h, TwoGpus()));
  ASSERT_TRUE(h.WaitForRegistration(kGpu, kWait).ok());
  ASSERT_TRUE(Eventually(h, [](const ResourceState& s) { return s.devices.size() == 2; }));

  auto devices = h.Devices(kGpu);
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].id, "GPU-a");
  EXPECT_TRUE(devices[0].healthy());
  EXPECT_EQ(devices[0].numa_nodes, std::vector<int64_t>{0});
  EXPECT_EQ(devices[1].numa_nodes, std::vector<int64_t>{1});
  EXPECT_EQ(h.RegistrationCount(kGpu), 1);
  auto state = h.State(kGpu);
  ASSERT_TRUE(state);
  EXPECT_EQ(state->endpoint, "nvidia-gpu.sock");
  EXPECT_TRUE(state->options.get_preferred_allocation_available());
  EXPECT_EQ(plugin.streams_opened(), 1);

  // Every message is the complete list: a health change, then a shorter list.
  plugin.SetDevices({MakeDevice("GPU-a", true, 0), MakeDevice("GPU-b", false, 1)});
  ASSERT_TRUE(Eventually(
      h, [](const ResourceState& s) { return s.devices.size() == 2 && s.HealthyCount() == 1; }));
  plugin.SetDevices({MakeDevice("GPU-b", true, 1)});
  ASSERT_TRUE(Eventually(h, [](const ResourceState& s) {
    return s.devices.size() == 1 && s.devices[0].id == "GPU-b" && s.HealthyCount() == 1;
  }));

  auto options = h.GetDevicePluginOptions(kGpu);
  ASSERT_TRUE(options.ok()) << options.status().message();
  EXPECT_TRUE(options->get_preferred_allocation_available());

  // The event history tells the same story, in order.
  auto first = h.NextEvent(0, kWait);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->kind, HarnessEvent::Kind::kRegistered);
  EXPECT_NE(
      FormatEvent(*first).find("event=registered resource=nvidia.com/gpu endpoint=nvidia-gpu.sock"),
      std::string::npos)
      << FormatEvent(*first);
  auto second = h.NextEvent(first->seq, kWait);
  ASSERT_TRUE(second);
  EXPECT_EQ(FormatEvent(*second),
            "event=devices resource=nvidia.com/gpu total=2 healthy=2 "
            "devices=GPU-a:Healthy:numa=0,GPU-b:Healthy:numa=1");
}

TEST(KubeletHarness, PluginThatCannotAnswerDuringRegisterGetsAnErrorNotAHang) {
  TempDir dir;
  HarnessOptions options;
  // Long enough for a well-behaved plugin to answer on a loaded machine (or under sanitizers),
  // short enough to keep the test quick.
  options.dial_timeout = milliseconds(3000);
  KubeletHarness h(options);
  ASSERT_TRUE(h.Start(dir.path).ok());
  FakePlugin plugin(dir.path, "nvidia-gpu.sock");
  plugin.SetDevices(TwoGpus());
  plugin.BlockOptionsUntilRegisterReturns();
  plugin.Serve();
  grpc::Status st = plugin.Register(h.kubelet_socket(), kGpu);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << st.error_message();
  EXPECT_NE(st.error_message().find("GetDevicePluginOptions"), std::string::npos);
  auto state = h.State(kGpu);
  ASSERT_TRUE(state);
  EXPECT_FALSE(state->registered);
  EXPECT_EQ(state->rejected, 1);
  EXPECT_EQ(h.RegistrationCount(kGpu), 0);
  EXPECT_EQ(plugin.streams_opened(), 0);

  // The harness keeps working: a well-behaved plugin registers afterwards.
  FakePlugin good(dir.path, "good.sock");
  ASSERT_TRUE(ServeAndRegister(good, h, TwoGpus()));
  EXPECT_TRUE(HealthyCountIs(h, 2));
}

TEST(KubeletHarness, RejectsInvalidRegistrations) {
  TempDir dir;
  KubeletHarness h;
  ASSERT_TRUE(h.Start(dir.path).ok());
  FakePlugin plugin(dir.path, "p.sock");
  plugin.Serve();
  struct Case {
    std::string resource, version;
  };
  for (const auto& c : std::vector<Case>{{kGpu, "v1alpha"},
                                         {"gpu", "v1beta1"},
                                         {"kubernetes.io/gpu", "v1beta1"},
                                         {"nvidia.com/", "v1beta1"},
                                         {"Nvidia.com/gpu", "v1beta1"},
                                         {"nvidia.com/gpu/x", "v1beta1"}}) {
    grpc::Status st = plugin.Register(h.kubelet_socket(), c.resource, c.version);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.resource << " " << c.version;
  }
  // An endpoint that is not a socket in the directory.
  FakePlugin missing(dir.path, "absent.sock");
  EXPECT_EQ(missing.Register(h.kubelet_socket(), kGpu).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  FakePlugin escaping(dir.path, "../p.sock");
  EXPECT_EQ(escaping.Register(h.kubelet_socket(), kGpu).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(h.RegistrationCount(kGpu), 0);
  EXPECT_GE(h.State(kGpu)->rejected, 3);
}

TEST(KubeletHarness, StreamEndMarksDevicesUnhealthyThenRemovesThem) {
  TempDir dir;
  HarnessOptions options;
  options.removal_grace = milliseconds(200);
  KubeletHarness h(options);
  ASSERT_TRUE(h.Start(dir.path).ok());
  FakePlugin plugin(dir.path, "nvidia-gpu.sock");
  ASSERT_TRUE(ServeAndRegister(plugin, h, TwoGpus()));
  ASSERT_TRUE(HealthyCountIs(h, 2));

  plugin.EndStreams();
  ASSERT_TRUE(Eventually(h, [](const ResourceState& s) { return s.removed && s.devices.empty(); }));
  // The grace may pass before a waiter looks, so read the Unhealthy step from the history.
  std::vector<HarnessEvent::Kind> kinds;
  for (auto e = h.NextEvent(0, kWait); e; e = h.NextEvent(e->seq, milliseconds(0))) {
    kinds.push_back(e->kind);
    if (e->kind == HarnessEvent::Kind::kStreamEnded) {
      ASSERT_EQ(e->devices.size(), 2u);
      for (const auto& d : e->devices) EXPECT_EQ(d.health, kUnhealthy) << d.id;
    }
  }
  EXPECT_EQ(kinds, (std::vector{HarnessEvent::Kind::kRegistered, HarnessEvent::Kind::kDevices,
                                HarnessEvent::Kind::kStreamEnded, HarnessEvent::Kind::kRemoved}));
  // Still registered as far as the kubelet is concerned; the count did not move.
  EXPECT_EQ(h.RegistrationCount(kGpu), 1);
}

TEST(KubeletHarness, PluginDeathMarksDevicesUnhealthy) {
  TempDir dir;
  KubeletHarness h;  // default 5-minute grace: devices stay, Unhealthy
  ASSERT_TRUE(h.Start(dir.path).ok());
  auto plugin = std::make_unique<FakePlugin>(dir.path, "nvidia-gpu.sock");
  ASSERT_TRUE(ServeAndRegister(*plugin, h, TwoGpus()));
  ASSERT_TRUE(HealthyCountIs(h, 2));
  plugin.reset();
  ASSERT_TRUE(Eventually(h, [](const ResourceState& s) {
    return s.stream_ended && !s.streaming && s.devices.size() == 2 && s.HealthyCount() == 0;
  }));
  EXPECT_FALSE(h.State(kGpu)->removed);
  h.Stop();  // ends the grace wait promptly
}

// Kubelets that key clients by socket path: a new Register ends the old stream, whose end then
// touches nothing.
TEST(KubeletHarness, ReRegistrationReplacesEndpointAndStream) {
  TempDir dir;
  HarnessOptions options;
  options.client_key = HarnessOptions::ClientKey::kSocketPath;
  KubeletHarness h(options);
  ASSERT_TRUE(h.Start(dir.path).ok());
  FakePlugin a(dir.path, "a.sock");
  ASSERT_TRUE(ServeAndRegister(a, h, TwoGpus()));
  ASSERT_TRUE(Eventually(h, [](const ResourceState& s) { return s.devices.size() == 2; }));

  FakePlugin b(dir.path, "b.sock");
  ASSERT_TRUE(ServeAndRegister(b, h, {MakeDevice("GPU-c", true, 0)}));
  ASSERT_TRUE(Eventually(h, [](const ResourceState& s) {
    return s.endpoint == "b.sock" && s.devices.size() == 1 && s.devices[0].id == "GPU-c";
  }));
  EXPECT_EQ(h.RegistrationCount(kGpu), 2);
  // The old stream was cancelled by the harness, and its end did not mark anything unhealthy.
  a.EndStreams();
  auto st = h.State(kGpu);
  EXPECT_TRUE(st->streaming);
  EXPECT_FALSE(st->stream_ended);
  EXPECT_EQ(st->HealthyCount(), 1u);
  auto alloc = h.Allocate(kGpu, {"GPU-c"});
  ASSERT_TRUE(alloc.ok()) << alloc.status().message();
  EXPECT_EQ(alloc->envs().at("NVIDIA_VISIBLE_DEVICES"), "GPU-c");
}

// issue 26 item 1: kubelets that key clients by resource name (handler.go, runClient →
// getClient(name)) leave the old stream open on a new Register; when it ends later, the NEW
// client is disconnected: its stream cancelled, devices Unhealthy, Allocate refused. The old
// harness cancelled the old stream itself, so a plugin that re-registered before ending its old
// stream could not see this.
TEST(KubeletHarness, ByResourceNameAnOldStreamEndingDisconnectsTheNewClient) {
  TempDir dir;
  KubeletHarness h;  // ClientKey::kResourceName is the default
  ASSERT_TRUE(h.Start(dir.path).ok());
  FakePlugin a(dir.path, "a.sock");
  ASSERT_TRUE(ServeAndRegister(a, h, TwoGpus()));
  ASSERT_TRUE(Eventually(h, [](const ResourceState& s) { return s.devices.size() == 2; }));
  FakePlugin b(dir.path, "b.sock");
  ASSERT_TRUE(ServeAndRegister(b, h, {MakeDevice("GPU-c", true, 0)}));
  ASSERT_TRUE(Eventually(h, [](const ResourceState& s) {
    return s.endpoint == "b.sock" && s.devices.size() == 1 && s.HealthyCount() == 1;
  }));
  EXPECT_EQ(a.streams_cancelled(), 0);  // the new Register left the old stream open
  ASSERT_TRUE(h.Allocate(kGpu, {"GPU-c"}).ok());

  a.EndStreams();
  ASSERT_TRUE(Eventually(h, [](const ResourceState& s) {
    return s.disconnects == 1 && !s.registered && s.HealthyCount() == 0;
  }));
  Result<v1beta1::ContainerAllocateResponse> refused = h.Allocate(kGpu, {"GPU-c"});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("has been stopped"), std::string::npos)
      << refused.status().message();
  // b's stream was cancelled by the kubelet; b must register again to be served.
  ASSERT_TRUE(WaitUntilCancelled(b));
  ASSERT_TRUE(b.Register(h.kubelet_socket(), kGpu).ok());
  ASSERT_TRUE(Eventually(h, [](const ResourceState& s) {
    return s.registered && s.streaming && s.HealthyCount() == 1;
  }));
  EXPECT_TRUE(h.Allocate(kGpu, {"GPU-c"}).ok());
  EXPECT_EQ(h.RegistrationCount(kGpu), 3);
}

// issue 26 item 2: once a stream ended, the kubelet refuses Allocate and GetPreferredAllocation on
// that endpoint (errEndpointStopped); the old harness still served them.
TEST(KubeletHarness, CallsOnAStoppedEndpointAreRefused) {
  TempDir dir;
  KubeletHarness h;
  ASSERT_TRUE(h.Start(dir.path).ok());
  FakePlugin plugin(dir.path, "nvidia-gpu.sock");
  ASSERT_TRUE(ServeAndRegister(plugin, h, TwoGpus()));
  ASSERT_TRUE(HealthyCountIs(h, 2));
  ASSERT_TRUE(h.Allocate(kGpu, {"GPU-a"}).ok());
  plugin.EndStreams();
  ASSERT_TRUE(Eventually(h, [](const ResourceState& s) { return s.stream_ended; }));
  EXPECT_FALSE(h.Allocate(kGpu, {"GPU-a"}).ok());
  EXPECT_FALSE(h.GetPreferredAllocation(kGpu, {"GPU-a", "GPU-b"}, {}, 1).ok());
  h.Stop();
}

TEST(KubeletHarness, RestartDeletesSocketsOnlyAndServesAgain) {
  TempDir dir;
  KubeletHarness h;
  ASSERT_TRUE(h.Start(dir.path).ok());
  const std::string keep = dir.path + "/DEPRECATION";
  std::ofstream(keep) << "not a socket\n";
  fs::create_directory(dir.path + "/subdir");
  auto plugin = std::make_unique<FakePlugin>(dir.path, "nvidia-gpu.sock");
  ASSERT_TRUE(ServeAndRegister(*plugin, h, TwoGpus()));
  ASSERT_TRUE(HealthyCountIs(h, 2));
  ASSERT_TRUE(fs::is_socket(plugin->socket()));

  ASSERT_TRUE(h.Restart().ok());
  EXPECT_FALSE(fs::exists(plugin->socket())) << "plugin socket must be deleted";
  EXPECT_TRUE(fs::is_regular_file(keep));
  EXPECT_TRUE(fs::is_directory(dir.path + "/subdir"));
  EXPECT_TRUE(fs::is_socket(h.kubelet_socket()));
  EXPECT_TRUE(fs::is_socket(h.pod_resources_socket()));
  auto state = h.State(kGpu);
  EXPECT_FALSE(state->registered);
  EXPECT_TRUE(state->devices.empty());
  EXPECT_EQ(h.Allocate(kGpu, {"GPU-a"}).status().code(), ErrorCode::kNotFound);

  // The plugin notices, serves a new socket and registers again.
  plugin = std::make_unique<FakePlugin>(dir.path, "nvidia-gpu.sock");
  ASSERT_TRUE(ServeAndRegister(*plugin, h, TwoGpus()));
  ASSERT_TRUE(Eventually(h, [](const ResourceState& s) {
    return s.registered && s.registrations == 2 && s.HealthyCount() == 2;
  }));
}

TEST(KubeletHarness, PreferredAllocationAndAllocate) {
  TempDir dir;
  KubeletHarness h;
  ASSERT_TRUE(h.Start(dir.path).ok());
  FakePlugin plugin(dir.path, "nvidia-gpu.sock");
  plugin.SetDevices({MakeDevice("GPU-a", true, 0), MakeDevice("GPU-b", true, 0),
                     MakeDevice("GPU-c", true, 1), MakeDevice("GPU-d", true, 1)});
  plugin.Serve();
  ASSERT_TRUE(plugin.Register(h.kubelet_socket(), kGpu).ok());
  ASSERT_TRUE(HealthyCountIs(h, 4));

  auto preferred =
      h.GetPreferredAllocation(kGpu, {"GPU-a", "GPU-b", "GPU-c", "GPU-d"}, {"GPU-a"}, 2);
  ASSERT_TRUE(preferred.ok()) << preferred.status().message();
  EXPECT_EQ(*preferred, (std::vector<std::string>{"GPU-a", "GPU-d"}));
  auto alloc = h.Allocate(kGpu, *preferred);
  ASSERT_TRUE(alloc.ok()) << alloc.status().message();
  EXPECT_EQ(alloc->envs().at("NVIDIA_VISIBLE_DEVICES"), "GPU-a,GPU-d");

  auto bad = h.Allocate(kGpu, {"GPU-zzz"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kUnavailable);
  EXPECT_NE(bad.status().message().find("unknown device GPU-zzz"), std::string::npos)
      << bad.status().message();
  EXPECT_TRUE(h.PreStartContainer(kGpu, {"GPU-a"}).code() == ErrorCode::kUnavailable)
      << "the fake does not implement PreStartContainer: the error must surface";
  EXPECT_EQ(h.Allocate("nvidia.com/other", {"x"}).status().code(), ErrorCode::kNotFound);
}

TEST(KubeletHarness, PodResourcesListReturnsAssignments) {
  TempDir dir;
  HarnessOptions options;
  options.pod_resources_socket = dir.path + "/pods/kubelet.sock";
  KubeletHarness h(options);
  ASSERT_TRUE(h.Start(dir.path).ok());
  EXPECT_EQ(h.pod_resources_socket(), dir.path + "/pods/kubelet.sock");
  h.SetPodResources({{"default", "train-0", "main", kGpu, {"GPU-a", "GPU-b"}},
                     {"default", "train-0", "sidecar", kGpu, {"GPU-c"}},
                     {"ml", "infer-1", "server", "nvidia.com/mig-1g.10gb", {"MIG-x"}}});
  auto stub = v1::PodResourcesLister::NewStub(
      grpc::CreateChannel("unix:" + h.pod_resources_socket(), grpc::InsecureChannelCredentials()));
  v1::ListPodResourcesResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  ASSERT_TRUE(stub->List(&ctx, v1::ListPodResourcesRequest(), &resp).ok());
  ASSERT_EQ(resp.pod_resources_size(), 2);
  const auto& train = resp.pod_resources(0);
  EXPECT_EQ(train.name(), "train-0");
  EXPECT_EQ(train.namespace_(), "default");
  ASSERT_EQ(train.containers_size(), 2);
  EXPECT_EQ(train.containers(0).name(), "main");
  ASSERT_EQ(train.containers(0).devices_size(), 1);
  EXPECT_EQ(train.containers(0).devices(0).resource_name(), kGpu);
  EXPECT_EQ(train.containers(0).devices(0).device_ids_size(), 2);
  EXPECT_EQ(train.containers(1).devices(0).device_ids(0), "GPU-c");
  EXPECT_EQ(resp.pod_resources(1).namespace_(), "ml");
  EXPECT_EQ(resp.pod_resources(1).containers(0).devices(0).device_ids(0), "MIG-x");
}

// issue 26 item 4: pod-resources v1 as the kubelet serves it: Get and GetAllocatableResources
// beside List, containers without devices listed, an empty or partial list right after a kubelet
// restart, and the rate limit (RESOURCE_EXHAUSTED past the burst).
TEST(KubeletHarness, PodResourcesGetAllocatableRestartAndRateLimit) {
  TempDir dir;
  HarnessOptions options;
  options.pod_resources_qps = 0.5;  // one token every 2 s after the burst: refusals are certain
  options.pod_resources_burst = 6;
  KubeletHarness h(options);
  ASSERT_TRUE(h.Start(dir.path).ok());
  FakePlugin plugin(dir.path, "nvidia-gpu.sock");
  ASSERT_TRUE(ServeAndRegister(plugin, h, TwoGpus()));
  ASSERT_TRUE(HealthyCountIs(h, 2));
  h.SetPodResources({{"default", "train-0", "main", kGpu, {"GPU-a"}},
                     {"default", "train-0", "logger", "", {}},
                     {"default", "done-0", "main", kGpu, {"GPU-b"}},     // terminated, still listed
                     {"default", "train-1", "main", kGpu, {"GPU-b"}}});  // same ID, live
  h.SetPodResourcesAfterRestart({}, 1);
  auto stub = [&] {
    return v1::PodResourcesLister::NewStub(grpc::CreateChannel(
        "unix:" + h.pod_resources_socket(), grpc::InsecureChannelCredentials()));
  };
  auto context = [](grpc::ClientContext& ctx) {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  };
  {  // 1: List
    v1::ListPodResourcesResponse resp;
    grpc::ClientContext ctx;
    context(ctx);
    ASSERT_TRUE(stub()->List(&ctx, v1::ListPodResourcesRequest(), &resp).ok());
    ASSERT_EQ(resp.pod_resources_size(), 3);
    ASSERT_EQ(resp.pod_resources(0).containers_size(), 2);
    EXPECT_EQ(resp.pod_resources(0).containers(1).name(), "logger");
    EXPECT_EQ(resp.pod_resources(0).containers(1).devices_size(), 0);
  }
  {  // 2, 3: Get, known and unknown
    v1::GetPodResourcesRequest req;
    req.set_pod_name("train-1");
    req.set_pod_namespace("default");
    v1::GetPodResourcesResponse resp;
    grpc::ClientContext ctx;
    context(ctx);
    ASSERT_TRUE(stub()->Get(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.pod_resources().containers(0).devices(0).device_ids(0), "GPU-b");
    req.set_pod_name("nope");
    grpc::ClientContext ctx2;
    context(ctx2);
    EXPECT_FALSE(stub()->Get(&ctx2, req, &resp).ok());
  }
  {  // 4: GetAllocatableResources
    v1::AllocatableResourcesResponse resp;
    grpc::ClientContext ctx;
    context(ctx);
    ASSERT_TRUE(
        stub()->GetAllocatableResources(&ctx, v1::AllocatableResourcesRequest(), &resp).ok());
    ASSERT_EQ(resp.devices_size(), 2);
    EXPECT_EQ(resp.devices(0).resource_name(), kGpu);
    EXPECT_EQ(resp.devices(1).topology().nodes(0).id(), 1);
  }
  ASSERT_TRUE(h.Restart().ok());
  {  // 5: the first List after the restart is empty, 6: the next is whole again
    v1::ListPodResourcesResponse resp;
    grpc::ClientContext ctx;
    context(ctx);
    ASSERT_TRUE(stub()->List(&ctx, v1::ListPodResourcesRequest(), &resp).ok());
    EXPECT_EQ(resp.pod_resources_size(), 0);
    grpc::ClientContext ctx2;
    context(ctx2);
    ASSERT_TRUE(stub()->List(&ctx2, v1::ListPodResourcesRequest(), &resp).ok());
    EXPECT_EQ(resp.pod_resources_size(), 3);
  }
  // Past the burst of 6: refused.
  int refused = 0;
  for (int i = 0; i < 4; ++i) {
    v1::ListPodResourcesResponse resp;
    grpc::ClientContext ctx;
    context(ctx);
    grpc::Status st = stub()->List(&ctx, v1::ListPodResourcesRequest(), &resp);
    if (!st.ok()) {
      EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
      ++refused;
    }
  }
  EXPECT_GE(refused, 1);
  EXPECT_EQ(h.pod_resources_rate_limited(), refused);
  h.Stop();
}

std::vector<v1beta1::Device> FourGpus() {
  return {MakeDevice("GPU-a", true, 0), MakeDevice("GPU-b", true, 0), MakeDevice("GPU-c", true, 1),
          MakeDevice("GPU-d", true, 1)};
}

std::vector<std::string> Strings(const google::protobuf::RepeatedPtrField<std::string>& f) {
  return std::vector<std::string>(f.begin(), f.end());
}

// issue 26 item 3: the kubelet offers only free devices (plus the reused ones), passes reused
// init-container devices as mustInclude, uses only what the answer has in common with what it
// offered, fails admission on an error, and does not call at all when the plugin did not ask.
TEST(KubeletHarness, AdmissionCallsPreferredAllocationAsTheKubeletDoes) {
  using Kind = KubeletHarness::ContainerAdmission::Kind;
  TempDir dir;
  KubeletHarness h;
  ASSERT_TRUE(h.Start(dir.path).ok());
  FakePlugin plugin(dir.path, "nvidia-gpu.sock");
  ASSERT_TRUE(ServeAndRegister(plugin, h, FourGpus()));
  ASSERT_TRUE(HealthyCountIs(h, 4));

  auto one = h.Admit(kGpu, {"pod-1", "main"}, 1);
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_TRUE(one->preferred_called);
  EXPECT_EQ(one->ids, (std::vector<std::string>{"GPU-d"}));  // the plugin prefers from the end
  auto two = h.Admit(kGpu, {"pod-2", "main"}, 2);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(Strings(plugin.last_preferred().available_deviceids()),
            (std::vector<std::string>{"GPU-a", "GPU-b", "GPU-c"}));  // GPU-d is taken
  EXPECT_EQ(two->ids, (std::vector<std::string>{"GPU-c", "GPU-b"}));

  // An answer naming a device that was not offered is not used.
  plugin.SetPreferred(true, "GPU-d");
  auto three = h.Admit(kGpu, {"pod-3", "main"}, 1);
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(three->ids, (std::vector<std::string>{"GPU-a"}));
  // An error fails admission; nothing is allocated.
  h.ReleasePod("pod-3");
  plugin.SetPreferred(true, "", /*fail=*/true);
  EXPECT_FALSE(h.Admit(kGpu, {"pod-4", "main"}, 1).ok());
  plugin.SetPreferred(true);
  auto four = h.Admit(kGpu, {"pod-4", "main"}, 1);
  ASSERT_TRUE(four.ok());
  EXPECT_EQ(four->ids, (std::vector<std::string>{"GPU-a"}));
  EXPECT_FALSE(h.Admit(kGpu, {"pod-5", "main"}, 1).ok());  // none left

  // An init container's devices are reused by the app container as mustInclude; a sidecar's
  // are not.
  h.ReleasePod("pod-1");
  h.ReleasePod("pod-2");
  h.ReleasePod("pod-4");
  auto init = h.Admit(kGpu, {"pod-6", "init", Kind::kInit}, 1);
  ASSERT_TRUE(init.ok());
  EXPECT_EQ(init->ids, (std::vector<std::string>{"GPU-d"}));
  auto app = h.Admit(kGpu, {"pod-6", "main"}, 2);
  ASSERT_TRUE(app.ok());
  EXPECT_EQ(Strings(plugin.last_preferred().must_include_deviceids()),
            (std::vector<std::string>{"GPU-d"}));
  EXPECT_EQ(Strings(plugin.last_preferred().available_deviceids()),
            (std::vector<std::string>{"GPU-a", "GPU-b", "GPU-c", "GPU-d"}));
  EXPECT_EQ(app->ids, (std::vector<std::string>{"GPU-d", "GPU-c"}));
  auto sidecar = h.Admit(kGpu, {"pod-7", "proxy", Kind::kSidecar}, 1);
  ASSERT_TRUE(sidecar.ok());
  auto after = h.Admit(kGpu, {"pod-7", "main"}, 1);
  ASSERT_TRUE(after.ok());
  EXPECT_NE(after->ids, sidecar->ids);
  EXPECT_TRUE(plugin.last_preferred().must_include_deviceids().empty());

  // A plugin that did not set GetPreferredAllocationAvailable is never asked.
  h.ReleasePod("pod-6");
  h.ReleasePod("pod-7");
  plugin.SetPreferred(false);
  ASSERT_TRUE(plugin.Register(h.kubelet_socket(), kGpu).ok());
  ASSERT_TRUE(Eventually(h, [](const ResourceState& s) {
    return s.registered && s.streaming && s.HealthyCount() == 4 &&
           !s.options.get_preferred_allocation_available();
  }));
  const int calls = plugin.preferred_calls();
  auto plain = h.Admit(kGpu, {"pod-8", "main"}, 2);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_FALSE(plain->preferred_called);
  EXPECT_EQ(plugin.preferred_calls(), calls);
  EXPECT_EQ(plain->ids, (std::vector<std::string>{"GPU-a", "GPU-b"}));
}

TEST(KubeletHarness, WaitForTimesOutWithState) {
  TempDir dir;
  KubeletHarness h;
  ASSERT_TRUE(h.Start(dir.path).ok());
  Status st = h.WaitForRegistration(kGpu, milliseconds(50));
  EXPECT_EQ(st.code(), ErrorCode::kUnavailable);
  EXPECT_NE(st.message().find("registered=0"), std::string::npos) << st.message();
  EXPECT_EQ(h.Start(dir.path).code(), ErrorCode::kUsage);
  h.Stop();
  EXPECT_FALSE(fs::exists(dir.path + "/kubelet.sock"));
  h.Stop();  // idempotent
  EXPECT_EQ(KubeletHarness().Start(dir.path + "/nope").code(), ErrorCode::kNotFound);
}

// The binary, end to end: it serves, a plugin registers, it checks the device count, allocates
// and exits 0.
TEST(KubeletHarnessBinary, ExpectAndAllocate) {
  TempDir dir;
  const std::string bin = std::string(GPULET_BUILD_DIR) + "/bin/gpulet-kubelet-harness";
  ASSERT_TRUE(fs::exists(bin)) << bin;
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::close(out[0]);
    ::close(out[1]);
    ::execl(bin.c_str(), bin.c_str(), "--dir", dir.path.c_str(), "--expect", "2", "--allocate", "1",
            "--timeout", "20", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(out[1]);
  FILE* f = ::fdopen(out[0], "r");
  std::string output;
  char line[4096];
  FakePlugin plugin(dir.path, "nvidia-gpu.sock");
  plugin.SetDevices(TwoGpus());
  bool registered = false;
  while (std::fgets(line, sizeof line, f)) {
    output += line;
    if (!registered && std::string(line).rfind("event=serving", 0) == 0) {
      plugin.Serve();
      EXPECT_TRUE(plugin.Register(dir.path + "/kubelet.sock", kGpu).ok());
      registered = true;
    }
  }
  std::fclose(f);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << output;
  EXPECT_NE(output.find("event=registered resource=nvidia.com/gpu endpoint=nvidia-gpu.sock"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("event=preferred resource=nvidia.com/gpu size=1 ids=GPU-b"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("event=allocated resource=nvidia.com/gpu ids=GPU-b "
                        "envs=\"NVIDIA_VISIBLE_DEVICES=GPU-b\""),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("result=ok"), std::string::npos) << output;
}

TEST(KubeletHarnessBinary, FailsWhenNobodyRegisters) {
  TempDir dir;
  const std::string bin = std::string(GPULET_BUILD_DIR) + "/bin/gpulet-kubelet-harness";
  const std::string cmd = bin + " --dir " + dir.path + " --timeout 0.2 >/dev/null";
  int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 1);
  rc = std::system((bin + " --bogus >/dev/null 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 2);
  rc = std::system((bin + " --help >/dev/null").c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 0);
}

}  // namespace
}  // namespace gpulet::testing
