#include "kubelet/kubelet_harness.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <sstream>

namespace gpulet::testing {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxEvents = 100000;

// gRPC deadlines take system_clock time points.
std::chrono::system_clock::time_point After(std::chrono::milliseconds d) {
  return std::chrono::system_clock::now() + d;
}
constexpr char kVersion[] = "v1beta1";

bool IsAlnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

// DNS-1123 subdomain: lowercase labels of [a-z0-9-], alphanumeric at both ends, <= 253 chars.
bool IsDnsSubdomain(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  size_t start = 0;
  while (start <= s.size()) {
    size_t dot = s.find('.', start);
    std::string_view label = s.substr(start, dot == std::string_view::npos ? s.npos : dot - start);
    if (label.empty() || label.size() > 63) return false;
    for (char c : label) {
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
    }
    if (label.front() == '-' || label.back() == '-') return false;
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return true;
}

// The kubelet accepts extended resource names only: "<domain>/<name>" outside kubernetes.io.
std::string ResourceNameProblem(const std::string& name) {
  const size_t slash = name.find('/');
  if (slash == std::string::npos || name.find('/', slash + 1) != std::string::npos) {
    return "must be <domain>/<name>";
  }
  const std::string_view domain = std::string_view(name).substr(0, slash);
  const std::string_view base = std::string_view(name).substr(slash + 1);
  if (!IsDnsSubdomain(domain)) return "domain is not a DNS subdomain";
  if (domain == "kubernetes.io" || (domain.size() > 14 && domain.ends_with(".kubernetes.io"))) {
    return "the kubernetes.io domain is reserved for native resources";
  }
  if (base.empty() || base.size() > 63 || !IsAlnum(base.front()) || !IsAlnum(base.back()) ||
      !std::all_of(base.begin(), base.end(),
                   [](char c) { return IsAlnum(c) || c == '-' || c == '_' || c == '.'; })) {
    return "name must be 1-63 of [A-Za-z0-9-_.], alphanumeric at both ends";
  }
  return "";
}

std::vector<HarnessDevice> FromProto(const v1beta1::ListAndWatchResponse& msg) {
  std::vector<HarnessDevice> out;
  out.reserve(msg.devices_size());
  for (const auto& d : msg.devices()) {
    HarnessDevice dev;
    dev.id = d.id();
    dev.health = d.health();
    for (const auto& n : d.topology().nodes()) dev.numa_nodes.push_back(n.id());
    out.push_back(std::move(dev));
  }
  return out;
}

std::string GrpcError(const std::string& what, const grpc::Status& st) {
  return what + " failed: code=" + std::to_string(static_cast<int>(st.error_code())) +
         " message=\"" + st.error_message() + "\"";
}

std::shared_ptr<grpc::Channel> DialUnix(const std::string& path) {
  grpc::ChannelArguments args;
  // Our own subchannel: a channel to a restarted plugin must not reuse a dead connection.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel("unix:" + path, grpc::InsecureChannelCredentials(), args);
}

using StubResult = Result<std::shared_ptr<v1beta1::DevicePlugin::Stub>>;

// One unary call on a plugin: kUnavailable carrying the gRPC error when it fails.
template <typename Method, typename Request, typename Response>
Status Unary(const StubResult& stub, Method method, const char* what, const Request& request,
             Response* response, std::chrono::milliseconds timeout) {
  if (!stub.ok()) return stub.status();
  grpc::ClientContext ctx;
  ctx.set_deadline(After(timeout));
  grpc::Status st = ((**stub).*method)(&ctx, request, response);
  if (!st.ok()) return Status(ErrorCode::kUnavailable, GrpcError(what, st));
  return Status::Ok();
}

}  // namespace

size_t ResourceState::HealthyCount() const {
  return static_cast<size_t>(
      std::count_if(devices.begin(), devices.end(), [](const auto& d) { return d.healthy(); }));
}

const char* HarnessEventKindName(HarnessEvent::Kind kind) {
  switch (kind) {
    case HarnessEvent::Kind::kRegistered:
      return "registered";
    case HarnessEvent::Kind::kRejected:
      return "rejected";
    case HarnessEvent::Kind::kDevices:
      return "devices";
    case HarnessEvent::Kind::kStreamEnded:
      return "stream-ended";
    case HarnessEvent::Kind::kRemoved:
      return "removed";
    case HarnessEvent::Kind::kRestarted:
      return "restarted";
  }
  return "?";
}

std::string FormatEvent(const HarnessEvent& e) {
  std::ostringstream out;
  out << "event=" << HarnessEventKindName(e.kind);
  if (!e.resource.empty()) out << " resource=" << e.resource;
  if (e.kind == HarnessEvent::Kind::kDevices || e.kind == HarnessEvent::Kind::kStreamEnded) {
    const auto healthy = std::count_if(e.devices.begin(), e.devices.end(),
                                       [](const auto& d) { return d.healthy(); });
    out << " total=" << e.devices.size() << " healthy=" << healthy << " devices=";
    for (size_t i = 0; i < e.devices.size(); ++i) {
      const auto& d = e.devices[i];
      if (i) out << ",";
      out << d.id << ":" << d.health << ":numa=";
      if (d.numa_nodes.empty()) out << "-";
      for (size_t j = 0; j < d.numa_nodes.size(); ++j) out << (j ? "+" : "") << d.numa_nodes[j];
    }
  }
  if (!e.detail.empty()) out << " " << e.detail;
  return out.str();
}

// Everything about one resource name; lives in resources_ (never erased) under mu_.
struct KubeletHarness::Resource {
  ResourceState state;
  // Bumped by every Register and restart; a stream thread whose generation is stale leaves the
  // state alone.
  uint64_t generation = 0;
  std::shared_ptr<v1beta1::DevicePlugin::Stub> stub;
  std::shared_ptr<grpc::ClientContext> stream_context;
  std::thread stream_thread;
  // Generations whose stream the harness itself cancelled: their end disconnects nothing.
  std::set<uint64_t> cancelled_by_harness;
};

class KubeletHarness::RegistrationService final : public v1beta1::Registration::Service {
 public:
  explicit RegistrationService(KubeletHarness* harness) : harness_(harness) {}
  grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest* request,
                        v1beta1::Empty*) override {
    return harness_->HandleRegister(*request);
  }

 private:
  KubeletHarness* harness_;
};

class KubeletHarness::PodResourcesService final : public v1::PodResourcesLister::Service {
 public:
  explicit PodResourcesService(KubeletHarness* harness) : harness_(harness) {}
  grpc::Status List(grpc::ServerContext*, const v1::ListPodResourcesRequest*,
                    v1::ListPodResourcesResponse* response) override {
    if (!harness_->TakePodResourcesToken()) return RateLimited();
    *response = harness_->PodResourcesResponse();
    return grpc::Status::OK;
  }
  // pkg/kubelet/apis/podresources/server_v1.go, Get: the pod from the same source as List; an
  // unknown pod is an error.
  grpc::Status Get(grpc::ServerContext*, const v1::GetPodResourcesRequest* request,
                   v1::GetPodResourcesResponse* response) override {
    if (!harness_->TakePodResourcesToken()) return RateLimited();
    const v1::ListPodResourcesResponse all = harness_->PodResourcesResponse();
    for (const v1::PodResources& p : all.pod_resources()) {
      if (p.name() == request->pod_name() && p.namespace_() == request->pod_namespace()) {
        *response->mutable_pod_resources() = p;
        return grpc::Status::OK;
      }
    }
    return grpc::Status(grpc::StatusCode::UNKNOWN, "pod " + request->pod_name() +
                                                       " in namespace " +
                                                       request->pod_namespace() + " not found");
  }
  // GetAllocatableResources: every device of every registered resource, healthy or not.
  grpc::Status GetAllocatableResources(grpc::ServerContext*,
                                       const v1::AllocatableResourcesRequest*,
                                       v1::AllocatableResourcesResponse* response) override {
    if (!harness_->TakePodResourcesToken()) return RateLimited();
    for (const std::string& name : harness_->Resources()) {
      for (const HarnessDevice& d : harness_->Devices(name)) {
        v1::ContainerDevices* out = response->add_devices();
        out->set_resource_name(name);
        out->add_device_ids(d.id);
        for (int64_t numa : d.numa_nodes) out->mutable_topology()->add_nodes()->set_id(numa);
      }
    }
    return grpc::Status::OK;
  }

 private:
  static grpc::Status RateLimited() {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "rejected by rate limit");
  }

 public:

 private:
  KubeletHarness* harness_;
};

KubeletHarness::KubeletHarness(HarnessOptions options) : options_(std::move(options)) {}

KubeletHarness::~KubeletHarness() { Stop(); }

std::string KubeletHarness::kubelet_socket() const { return dir_ + "/kubelet.sock"; }
std::string KubeletHarness::pod_resources_socket() const { return pod_socket_; }

Status KubeletHarness::Start(const std::string& dir) {
  std::lock_guard<std::mutex> serve(serve_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (serving_) return Status(ErrorCode::kUsage, "kubelet harness already started");
  }
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return Status(ErrorCode::kNotFound, "device plugin directory " + dir + " does not exist");
  }
  dir_ = fs::absolute(dir, ec).lexically_normal().string();
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  pod_socket_ = options_.pod_resources_socket.empty() ? dir_ + "/pod-resources/kubelet.sock"
                                                      : options_.pod_resources_socket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = false;
  }
  return StartServing();
}

Status KubeletHarness::StartServing() {
  std::error_code ec;
  fs::create_directories(fs::path(pod_socket_).parent_path(), ec);
  auto registration = std::make_unique<RegistrationService>(this);
  auto pods = std::make_unique<PodResourcesService>(this);

  grpc::ServerBuilder rb;
  rb.AddListeningPort("unix:" + kubelet_socket(), grpc::InsecureServerCredentials());
  rb.RegisterService(registration.get());
  std::unique_ptr<grpc::Server> rserver = rb.BuildAndStart();
  if (!rserver) {
    return Status(ErrorCode::kUnavailable, "cannot serve Registration on " + kubelet_socket());
  }
  grpc::ServerBuilder pb;
  pb.AddListeningPort("unix:" + pod_socket_, grpc::InsecureServerCredentials());
  pb.RegisterService(pods.get());
  std::unique_ptr<grpc::Server> pserver = pb.BuildAndStart();
  if (!pserver) {
    rserver->Shutdown(After(std::chrono::milliseconds(0)));
    ::unlink(kubelet_socket().c_str());
    return Status(ErrorCode::kUnavailable, "cannot serve PodResourcesLister on " + pod_socket_);
  }
  registration_service_ = std::move(registration);
  pod_service_ = std::move(pods);
  registration_server_ = std::move(rserver);
  pod_server_ = std::move(pserver);
  std::lock_guard<std::mutex> lock(mu_);
  serving_ = true;
  return Status::Ok();
}

// serve_mu_ held. In-flight Register handlers finish (they are bounded by dial_timeout) before
// Shutdown returns; their streams are then ended by StopStreams.
void KubeletHarness::StopServing() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    serving_ = false;
  }
  const auto deadline = After(std::chrono::seconds(2));
  if (registration_server_) registration_server_->Shutdown(deadline);
  if (pod_server_) pod_server_->Shutdown(deadline);
  registration_server_.reset();
  pod_server_.reset();
  registration_service_.reset();
  pod_service_.reset();
}

void KubeletHarness::StopStreams(bool forget_registrations) {
  std::vector<std::shared_ptr<grpc::ClientContext>> contexts;
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (RetiredStream& old : retired_streams_) {
      if (old.context) contexts.push_back(std::move(old.context));
      if (old.thread.joinable()) threads.push_back(std::move(old.thread));
    }
    retired_streams_.clear();
    for (auto& [name, r] : resources_) {
      r->cancelled_by_harness.insert(r->generation);
      ++r->generation;
      if (r->stream_context) contexts.push_back(std::move(r->stream_context));
      if (r->stream_thread.joinable()) threads.push_back(std::move(r->stream_thread));
      r->state.streaming = false;
      if (forget_registrations) {
        r->state.registered = false;
        r->state.stream_ended = false;
        r->state.removed = false;
        r->state.devices.clear();
        r->state.updates = 0;
        r->stub.reset();
      }
    }
    cv_.notify_all();
  }
  for (auto& c : contexts) c->TryCancel();
  for (auto& t : threads) t.join();
}

void KubeletHarness::Stop() {
  std::lock_guard<std::mutex> serve(serve_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !serving_) return;
    stopping_ = true;
    cv_.notify_all();
  }
  StopServing();
  StopStreams(/*forget_registrations=*/false);
  if (!dir_.empty()) {
    ::unlink(kubelet_socket().c_str());
    ::unlink(pod_socket_.c_str());
  }
}

Status KubeletHarness::Restart(std::chrono::milliseconds downtime) {
  std::lock_guard<std::mutex> serve(serve_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!serving_) return Status(ErrorCode::kUsage, "kubelet harness is not serving");
    PushEvent(HarnessEvent::Kind::kRestarted, "", "dir=" + dir_);
  }
  // The old process ends: its streams first (a plugin sees ListAndWatch end before anything
  // else; the real kubelet's SIGTERM does not close its listener first), then its listener.
  StopStreams(/*forget_registrations=*/true);
  // Nor does it remove kubelet.sock: while it is down the file stays and nothing answers a
  // Register (here: UNAVAILABLE), until the new kubelet deletes the sockets and serves again.
  if (downtime.count() > 0) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      down_ = true;
    }
    std::this_thread::sleep_for(downtime);
  }
  StopServing();
  {
    std::lock_guard<std::mutex> lock(mu_);
    partial_lists_left_ = partial_lists_after_restart_;
  }
  // The new kubelet deletes every socket in the directory on start, and nothing else.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    std::error_code sec;
    if (entry.symlink_status(sec).type() == fs::file_type::socket) fs::remove(entry.path(), sec);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    down_ = false;
  }
  return StartServing();
}

grpc::Status KubeletHarness::HandleRegister(const v1beta1::RegisterRequest& request) {
  const std::string& name = request.resource_name();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (down_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "kubelet restarting");
  }
  auto reject = [&](grpc::StatusCode code, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& r = resources_[name];
    if (!r) {
      r = std::make_unique<Resource>();
      r->state.name = name;
    }
    ++r->state.rejected;
    r->state.last_error = why;
    PushEvent(HarnessEvent::Kind::kRejected, name,
              "endpoint=" + request.endpoint() + " error=\"" + why + "\"");
    return grpc::Status(code, why);
  };
  if (request.version() != kVersion) {
    return reject(grpc::StatusCode::INVALID_ARGUMENT, "unsupported device plugin API version \"" +
                                                          request.version() + "\" (want v1beta1)");
  }
  if (auto problem = ResourceNameProblem(name); !problem.empty()) {
    return reject(grpc::StatusCode::INVALID_ARGUMENT,
                  "invalid resource name \"" + name + "\": " + problem);
  }
  const std::string& endpoint = request.endpoint();
  if (endpoint.empty() || endpoint.find('/') != std::string::npos || endpoint == "." ||
      endpoint == "..") {
    return reject(grpc::StatusCode::INVALID_ARGUMENT,
                  "endpoint \"" + endpoint + "\" must be a socket file name in " + dir_);
  }
  const std::string path = dir_ + "/" + endpoint;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) {
    return reject(grpc::StatusCode::INVALID_ARGUMENT, "endpoint " + path + " is not a socket");
  }

  // Dial back before replying, as the kubelet does.
  auto stub =
      std::shared_ptr<v1beta1::DevicePlugin::Stub>(v1beta1::DevicePlugin::NewStub(DialUnix(path)));
  v1beta1::DevicePluginOptions plugin_options;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(After(options_.dial_timeout));
    grpc::Status st = stub->GetDevicePluginOptions(&ctx, v1beta1::Empty(), &plugin_options);
    if (!st.ok()) {
      return reject(st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                        ? grpc::StatusCode::DEADLINE_EXCEEDED
                        : grpc::StatusCode::UNAVAILABLE,
                    GrpcError("dial-back GetDevicePluginOptions on " + path +
                                  " (the plugin must answer while its Register is outstanding)",
                              st));
    }
  }

  std::shared_ptr<grpc::ClientContext> old_context;
  std::thread old_thread;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || !serving_) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "kubelet harness is stopping");
    }
    auto& r = resources_[name];
    if (!r) {
      r = std::make_unique<Resource>();
      r->state.name = name;
    }
    old_context = std::move(r->stream_context);
    old_thread = std::move(r->stream_thread);
    if (options_.client_key == HarnessOptions::ClientKey::kResourceName) {
      // The kubelet registers the new client beside the old one and leaves the old stream to end
      // on its own (handler.go, connectClient → registerClient).
      retired_streams_.push_back({std::move(old_context), std::move(old_thread)});
    } else {
      r->cancelled_by_harness.insert(r->generation);
    }
    const uint64_t generation = ++r->generation;
    r->stub = stub;
    r->state.endpoint = endpoint;
    r->state.registered = true;
    r->state.streaming = true;
    r->state.stream_ended = false;
    r->state.removed = false;
    r->state.updates = 0;
    r->state.options = plugin_options;
    r->state.last_error.clear();
    ++r->state.registrations;
    auto context = std::make_shared<grpc::ClientContext>();
    r->stream_context = context;
    r->stream_thread =
        std::thread(&KubeletHarness::StreamLoop, this, name, generation, stub, context);
    PushEvent(HarnessEvent::Kind::kRegistered, name,
              "endpoint=" + endpoint + " registrations=" + std::to_string(r->state.registrations) +
                  " preferred_allocation=" +
                  (plugin_options.get_preferred_allocation_available() ? "true" : "false") +
                  " pre_start=" + (plugin_options.pre_start_required() ? "true" : "false"));
    cv_.notify_all();
  }
  // The replaced stream ends promptly once cancelled and leaves the state alone (its generation
  // is stale). Stop/Restart cannot race this: they wait for in-flight handlers first.
  if (old_context) old_context->TryCancel();
  if (old_thread.joinable()) old_thread.join();
  return grpc::Status::OK;
}

void KubeletHarness::StreamLoop(std::string name, uint64_t generation,
                                std::shared_ptr<v1beta1::DevicePlugin::Stub> stub,
                                std::shared_ptr<grpc::ClientContext> context) {
  auto reader = stub->ListAndWatch(context.get(), v1beta1::Empty());
  v1beta1::ListAndWatchResponse msg;
  bool stale = false;
  while (!stale && reader->Read(&msg)) {
    std::lock_guard<std::mutex> lock(mu_);
    Resource& r = *resources_.at(name);
    if (r.generation != generation) {
      stale = true;
      break;
    }
    r.state.devices = FromProto(msg);
    ++r.state.updates;
    PushEvent(HarnessEvent::Kind::kDevices, name, "", r.state.devices);
    cv_.notify_all();
  }
  if (stale) context->TryCancel();
  const grpc::Status status = reader->Finish();

  std::unique_lock<std::mutex> lock(mu_);
  Resource& r = *resources_.at(name);
  if (r.cancelled_by_harness.erase(generation) > 0) return;
  if (options_.disconnect_delay.count() > 0) {
    cv_.wait_for(lock, options_.disconnect_delay, [&] { return stopping_; });
  }
  if (stopping_) return;
  if (r.generation != generation) {
    // An older stream ended after the resource registered again.
    if (options_.client_key == HarnessOptions::ClientKey::kSocketPath || !r.state.registered) {
      return;
    }
    // runClient → getClient(name) → disconnectClient: the CURRENT client goes (handler.go).
    const uint64_t current = r.generation++;
    r.cancelled_by_harness.insert(current);
    std::shared_ptr<grpc::ClientContext> current_context = r.stream_context;
    retired_streams_.push_back({std::move(r.stream_context), std::move(r.stream_thread)});
    r.state.registered = false;
    r.state.streaming = false;
    r.state.stream_ended = true;
    ++r.state.disconnects;
    r.state.last_error = "client disconnected: an older ListAndWatch stream of " + name +
                         " ended after it registered again (clients keyed by resource name)";
    for (auto& d : r.state.devices) d.health = kUnhealthy;
    PushEvent(HarnessEvent::Kind::kStreamEnded, name, "error=\"" + r.state.last_error + "\"",
              r.state.devices);
    cv_.notify_all();
    lock.unlock();
    if (current_context) current_context->TryCancel();
    return;
  }
  r.state.streaming = false;
  r.state.stream_ended = true;
  r.state.last_error = GrpcError("ListAndWatch stream", status);
  for (auto& d : r.state.devices) d.health = kUnhealthy;
  PushEvent(HarnessEvent::Kind::kStreamEnded, name, "error=\"" + r.state.last_error + "\"",
            r.state.devices);
  cv_.notify_all();
  const bool superseded = cv_.wait_for(lock, options_.removal_grace,
                                       [&] { return stopping_ || r.generation != generation; });
  if (superseded) return;
  r.state.devices.clear();
  r.state.removed = true;
  PushEvent(HarnessEvent::Kind::kRemoved, name, "");
  cv_.notify_all();
}

void KubeletHarness::PushEvent(HarnessEvent::Kind kind, const std::string& resource,
                               std::string detail, std::vector<HarnessDevice> devices) {
  HarnessEvent e;
  e.seq = next_seq_++;
  e.kind = kind;
  e.resource = resource;
  e.detail = std::move(detail);
  e.devices = std::move(devices);
  events_.push_back(std::move(e));
  if (events_.size() > kMaxEvents) events_.pop_front();
  cv_.notify_all();
}

std::optional<HarnessEvent> KubeletHarness::NextEvent(uint64_t after,
                                                      std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  const bool ready = cv_.wait_for(
      lock, timeout, [&] { return stopping_ || (!events_.empty() && events_.back().seq > after); });
  if (!ready || events_.empty() || events_.back().seq <= after) return std::nullopt;
  auto it = std::upper_bound(events_.begin(), events_.end(), after,
                             [](uint64_t v, const HarnessEvent& e) { return v < e.seq; });
  return *it;
}

Status KubeletHarness::WaitFor(const std::string& resource,
                               const std::function<bool(const ResourceState&)>& pred,
                               std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  ResourceState unknown;
  unknown.name = resource;
  auto current = [&]() -> const ResourceState& {
    auto it = resources_.find(resource);
    return it == resources_.end() ? unknown : it->second->state;
  };
  if (cv_.wait_for(lock, timeout, [&] { return pred(current()); })) return Status::Ok();
  const ResourceState& s = current();
  std::ostringstream why;
  why << "timed out after " << timeout.count() << " ms waiting on " << resource
      << ": registered=" << s.registered << " streaming=" << s.streaming
      << " registrations=" << s.registrations << " rejected=" << s.rejected
      << " devices=" << s.devices.size() << " healthy=" << s.HealthyCount();
  if (!s.last_error.empty()) why << " last_error=" << s.last_error;
  return Status(ErrorCode::kUnavailable, why.str());
}

Status KubeletHarness::WaitForRegistration(const std::string& resource,
                                           std::chrono::milliseconds timeout) {
  return WaitFor(
      resource, [](const ResourceState& s) { return s.registered; }, timeout);
}

std::vector<HarnessDevice> KubeletHarness::Devices(const std::string& resource) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = resources_.find(resource);
  return it == resources_.end() ? std::vector<HarnessDevice>{} : it->second->state.devices;
}

std::optional<ResourceState> KubeletHarness::State(const std::string& resource) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = resources_.find(resource);
  if (it == resources_.end()) return std::nullopt;
  return it->second->state;
}

int KubeletHarness::RegistrationCount(const std::string& resource) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = resources_.find(resource);
  return it == resources_.end() ? 0 : it->second->state.registrations;
}

std::vector<std::string> KubeletHarness::Resources() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [name, r] : resources_) out.push_back(name);
  return out;
}

Result<std::shared_ptr<v1beta1::DevicePlugin::Stub>> KubeletHarness::StubFor(
    const std::string& resource) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = resources_.find(resource);
  if (it != resources_.end() && it->second->state.stream_ended) {
    // The kubelet refuses calls on an endpoint whose stream ended (endpoint.go, errEndpointStopped).
    return Status(ErrorCode::kUnavailable,
                  "endpoint " + it->second->state.endpoint + " of " + resource + " has been stopped");
  }
  if (it == resources_.end() || !it->second->state.registered || !it->second->stub) {
    return Status(ErrorCode::kNotFound, "resource " + resource + " is not registered");
  }
  return it->second->stub;
}

Result<std::vector<std::string>> KubeletHarness::GetPreferredAllocation(
    const std::string& resource, const std::vector<std::string>& available,
    const std::vector<std::string>& must_include, int size) {
  v1beta1::PreferredAllocationRequest request;
  auto* c = request.add_container_requests();
  for (const auto& id : available) c->add_available_deviceids(id);
  for (const auto& id : must_include) c->add_must_include_deviceids(id);
  c->set_allocation_size(size);
  v1beta1::PreferredAllocationResponse response;
  Status st = Unary(StubFor(resource), &v1beta1::DevicePlugin::Stub::GetPreferredAllocation,
                    "GetPreferredAllocation", request, &response, options_.rpc_timeout);
  if (!st.ok()) return st;
  if (response.container_responses_size() == 0) {
    return Status(ErrorCode::kUnavailable, "GetPreferredAllocation returned no container response");
  }
  const auto& ids = response.container_responses(0).deviceids();
  return std::vector<std::string>(ids.begin(), ids.end());
}

Result<v1beta1::ContainerAllocateResponse> KubeletHarness::Allocate(
    const std::string& resource, const std::vector<std::string>& ids) {
  v1beta1::AllocateRequest request;
  auto* c = request.add_container_requests();
  for (const auto& id : ids) c->add_devices_ids(id);
  v1beta1::AllocateResponse response;
  Status st = Unary(StubFor(resource), &v1beta1::DevicePlugin::Stub::Allocate, "Allocate", request,
                    &response, options_.rpc_timeout);
  if (!st.ok()) return st;
  if (response.container_responses_size() == 0) {
    return Status(ErrorCode::kUnavailable, "Allocate returned no container response");
  }
  return response.container_responses(0);
}

Result<v1beta1::DevicePluginOptions> KubeletHarness::GetDevicePluginOptions(
    const std::string& resource) {
  v1beta1::DevicePluginOptions response;
  Status st = Unary(StubFor(resource), &v1beta1::DevicePlugin::Stub::GetDevicePluginOptions,
                    "GetDevicePluginOptions", v1beta1::Empty(), &response, options_.rpc_timeout);
  if (!st.ok()) return st;
  return response;
}

Status KubeletHarness::PreStartContainer(const std::string& resource,
                                         const std::vector<std::string>& ids) {
  v1beta1::PreStartContainerRequest request;
  for (const auto& id : ids) request.add_devices_ids(id);
  v1beta1::PreStartContainerResponse response;
  return Unary(StubFor(resource), &v1beta1::DevicePlugin::Stub::PreStartContainer,
               "PreStartContainer", request, &response, options_.rpc_timeout);
}

Result<KubeletHarness::Admitted> KubeletHarness::Admit(const std::string& resource,
                                                       const ContainerAdmission& container,
                                                       int needed) {
  const auto key = std::make_pair(container.pod_uid, container.container);
  std::vector<std::string> allocated, available;
  bool preferred_available = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto rit = resources_.find(resource);
    if (rit == resources_.end() || !rit->second->state.registered) {
      return Status(ErrorCode::kNotFound, "resource " + resource + " is not registered");
    }
    preferred_available = rit->second->state.options.get_preferred_allocation_available();
    if (auto done = allocated_[resource].find(key); done != allocated_[resource].end()) {
      Admitted again;  // a restarted container keeps its devices
      again.ids = done->second;
      return again;
    }
    std::set<std::string> in_use;
    for (const auto& [who, ids] : allocated_[resource]) in_use.insert(ids.begin(), ids.end());
    // Reused devices first (manager.go: "Allocates from reusableDevices list first").
    std::vector<std::string>& reuse = reusable_[container.pod_uid][resource];
    std::sort(reuse.begin(), reuse.end());
    for (const std::string& id : reuse) {
      if (static_cast<int>(allocated.size()) < needed) allocated.push_back(id);
    }
    for (const HarnessDevice& d : rit->second->state.devices) {
      if (d.healthy() && !in_use.count(d.id)) available.push_back(d.id);
    }
    std::sort(available.begin(), available.end());
    const int missing = needed - static_cast<int>(allocated.size());
    if (static_cast<int>(available.size()) < missing) {
      return Status(ErrorCode::kUnavailable,
                    "Requested number of devices unavailable for " + resource + ". Requested: " +
                        std::to_string(needed) + ", Available: " +
                        std::to_string(available.size() + allocated.size()));
    }
  }
  Admitted out;
  if (static_cast<int>(allocated.size()) < needed && preferred_available) {
    std::vector<std::string> offered = available;
    offered.insert(offered.end(), allocated.begin(), allocated.end());
    std::sort(offered.begin(), offered.end());
    Result<std::vector<std::string>> preferred =
        GetPreferredAllocation(resource, offered, allocated, needed);
    out.preferred_called = true;
    if (!preferred.ok()) {
      return Status(ErrorCode::kUnavailable,
                    "device plugin GetPreferredAllocation rpc failed with err: " +
                        preferred.status().message());
    }
    // Only what is available (and not taken yet) counts: preferred ∩ available.
    for (const std::string& id : *preferred) {
      if (static_cast<int>(allocated.size()) >= needed) break;
      if (std::binary_search(available.begin(), available.end(), id) &&
          std::find(allocated.begin(), allocated.end(), id) == allocated.end()) {
        allocated.push_back(id);
      }
    }
  }
  for (const std::string& id : available) {
    if (static_cast<int>(allocated.size()) >= needed) break;
    if (std::find(allocated.begin(), allocated.end(), id) == allocated.end()) {
      allocated.push_back(id);
    }
  }
  Result<v1beta1::ContainerAllocateResponse> response = Allocate(resource, allocated);
  if (!response.ok()) return response.status();
  out.ids = allocated;
  out.response = std::move(*response);
  std::lock_guard<std::mutex> lock(mu_);
  allocated_[resource][key] = allocated;
  std::vector<std::string>& reuse = reusable_[container.pod_uid][resource];
  if (container.kind == ContainerAdmission::Kind::kInit) {
    for (const std::string& id : allocated) {
      if (std::find(reuse.begin(), reuse.end(), id) == reuse.end()) reuse.push_back(id);
    }
  } else {
    // An app container or sidecar holds its devices: they are no longer offered for reuse.
    std::erase_if(reuse, [&](const std::string& id) {
      return std::find(allocated.begin(), allocated.end(), id) != allocated.end();
    });
  }
  return out;
}

void KubeletHarness::ReleasePod(const std::string& pod_uid) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [resource, by_container] : allocated_) {
    std::erase_if(by_container, [&](const auto& e) { return e.first.first == pod_uid; });
  }
  reusable_.erase(pod_uid);
}

void KubeletHarness::SetPodResources(std::vector<PodAssignment> assignments) {
  std::lock_guard<std::mutex> lock(mu_);
  pod_assignments_ = std::move(assignments);
}

void KubeletHarness::SetPodResourcesAfterRestart(std::vector<PodAssignment> partial, int lists) {
  std::lock_guard<std::mutex> lock(mu_);
  partial_after_restart_ = std::move(partial);
  partial_lists_after_restart_ = lists;
}

int KubeletHarness::pod_resources_calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pod_resources_calls_;
}

int KubeletHarness::pod_resources_rate_limited() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pod_resources_rate_limited_;
}

bool KubeletHarness::TakePodResourcesToken() {
  std::lock_guard<std::mutex> lock(mu_);
  ++pod_resources_calls_;
  if (options_.pod_resources_qps <= 0) return true;
  const Clock::time_point now = Clock::now();
  if (tokens_at_ == Clock::time_point{}) {
    tokens_ = options_.pod_resources_burst;
  } else {
    const double elapsed = std::chrono::duration<double>(now - tokens_at_).count();
    tokens_ = std::min<double>(options_.pod_resources_burst,
                               tokens_ + elapsed * options_.pod_resources_qps);
  }
  tokens_at_ = now;
  if (tokens_ < 1) {
    ++pod_resources_rate_limited_;
    return false;
  }
  tokens_ -= 1;
  return true;
}

// Groups assignments by pod, then container, in the order first seen.
v1::ListPodResourcesResponse KubeletHarness::PodResourcesResponse() {
  std::lock_guard<std::mutex> lock(mu_);
  const std::vector<PodAssignment>* source = &pod_assignments_;
  if (partial_lists_left_ > 0) {
    --partial_lists_left_;
    source = &partial_after_restart_;
  }
  v1::ListPodResourcesResponse response;
  for (const auto& a : *source) {
    v1::PodResources* pod = nullptr;
    for (auto& p : *response.mutable_pod_resources()) {
      if (p.name() == a.pod && p.namespace_() == a.namespace_name) pod = &p;
    }
    if (!pod) {
      pod = response.add_pod_resources();
      pod->set_name(a.pod);
      pod->set_namespace_(a.namespace_name);
    }
    v1::ContainerResources* container = nullptr;
    for (auto& c : *pod->mutable_containers()) {
      if (c.name() == a.container) container = &c;
    }
    if (!container) {
      container = pod->add_containers();
      container->set_name(a.container);
    }
    for (const ClaimDevice& d : a.claims) {
      v1::DynamicResource* claim = nullptr;
      for (auto& r : *container->mutable_dynamic_resources()) {
        if (r.claim_name() == d.claim_name && r.claim_namespace() == d.claim_namespace) claim = &r;
      }
      if (!claim) {
        claim = container->add_dynamic_resources();
        claim->set_claim_name(d.claim_name);
        claim->set_claim_namespace(d.claim_namespace);
      }
      v1::ClaimResource* device = claim->add_claim_resources();
      device->set_driver_name(d.driver);
      device->set_pool_name(d.pool);
      device->set_device_name(d.device);
      for (const std::string& cdi : d.cdi_devices) device->add_cdi_devices()->set_name(cdi);
      if (d.share_id) device->set_share_id(*d.share_id);
    }
    if (a.resource.empty()) continue;  // a container without device-plugin devices
    auto* devices = container->add_devices();
    devices->set_resource_name(a.resource);
    for (const auto& id : a.device_ids) devices->add_device_ids(id);
  }
  return response;
}

}  // namespace gpulet::testing
