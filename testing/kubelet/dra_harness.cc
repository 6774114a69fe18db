// The kubelet's DRA side for tests (dra_harness.h).
#include "kubelet/dra_harness.h"

#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "dra_health_v1.grpc.pb.h"
#include "dra_health_v1alpha1.grpc.pb.h"
#include "dra_v1.grpc.pb.h"
#include "dra_v1beta1.grpc.pb.h"
#include "pluginregistration_v1.grpc.pb.h"

namespace gpulet::testing {

namespace drav1 = ::k8s::io::kubelet::pkg::apis::dra::v1;
namespace drav1beta1 = ::k8s::io::kubelet::pkg::apis::dra::v1beta1;

namespace {

// The DRAPlugin services this kubelet speaks (servicesSupportedByKubelet).
const std::vector<std::string> kKubeletServices = {"v1.DRAPlugin", "v1beta1.DRAPlugin"};
constexpr char kHealthV1[] = "v1.DRAResourceHealth";
constexpr char kHealthV1alpha1[] = "v1alpha1.DRAResourceHealth";

bool Contains(const std::vector<std::string>& list, const std::string& s) {
  return std::find(list.begin(), list.end(), s) != list.end();
}

bool IsDnsSubdomain(const std::string& s) {
  if (s.empty() || s.size() > 63) return false;  // the kubelet's tighter bound for drivers
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (!alnum && c != '-' && c != '.') return false;
    if ((i == 0 || i + 1 == s.size()) && !alnum) return false;
  }
  return true;
}

bool IsSocket(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

std::chrono::system_clock::time_point Deadline(std::chrono::milliseconds d) {
  return std::chrono::system_clock::now() + d;
}

template <typename Request, typename Claims>
void FillClaims(Request* req, const Claims& claims) {
  for (const DraClaimRef& c : claims) {
    auto* m = req->add_claims();
    m->set_namespace_(c.namespace_);
    m->set_name(c.name);
    m->set_uid(c.uid);
  }
}

template <typename DeviceMsg>
DraDevice ToDevice(const DeviceMsg& d) {
  DraDevice out;
  out.request_names.assign(d.request_names().begin(), d.request_names().end());
  out.pool = d.pool_name();
  out.device = d.device_name();
  out.cdi_device_ids.assign(d.cdi_device_ids().begin(), d.cdi_device_ids().end());
  if constexpr (requires { d.share_id(); }) out.share_id = d.share_id();
  return out;
}

// One NodePrepareResources call on either DRAPlugin version (their messages have the same
// shape): each claim's answer goes to `answer`.
template <typename Service, typename Request, typename Response>
grpc::Status CallPrepare(const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* ctx,
                         const std::vector<DraClaimRef>& claims,
                         std::map<std::string, DraPrepared>* answer) {
  Request req;
  FillClaims(&req, claims);
  Response resp;
  grpc::Status s = Service::NewStub(channel)->NodePrepareResources(ctx, req, &resp);
  for (const auto& [uid, r] : resp.claims()) {
    DraPrepared p;
    p.error = r.error();
    for (const auto& d : r.devices()) p.devices.push_back(ToDevice(d));
    (*answer)[uid] = std::move(p);
  }
  return s;
}

// The same for NodeUnprepareResources: each claim's error ("" when unprepared).
template <typename Service, typename Request, typename Response>
grpc::Status CallUnprepare(const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* ctx,
                           const std::vector<DraClaimRef>& claims,
                           std::map<std::string, std::string>* answer) {
  Request req;
  FillClaims(&req, claims);
  Response resp;
  grpc::Status s = Service::NewStub(channel)->NodeUnprepareResources(ctx, req, &resp);
  for (const auto& [uid, r] : resp.claims()) (*answer)[uid] = r.error();
  return s;
}

// HealthStatus by its wire number (the same in v1 and v1alpha1), as the kubelet names it.
const char* HealthName(int wire_number) {
  switch (wire_number) {
    case 1: return "Healthy";
    case 2: return "Unhealthy";
    default: return "Unknown";
  }
}

// Reads one DRAResourceHealth version's stream (`Api`: ::v1 or ::v1alpha1) until it ends,
// handing each complete list to `on_list`.
template <typename Api, typename Response>
void ReadHealthStream(const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* ctx,
                      const std::function<void(std::vector<DraDeviceHealth>)>& on_list) {
  auto stub = Api::NewStub(channel);
  auto reader = stub->NodeWatchResources(ctx, {});
  Response msg;
  while (reader->Read(&msg)) {
    std::vector<DraDeviceHealth> list;
    for (const auto& d : msg.devices()) {
      list.push_back({d.device().pool_name(), d.device().device_name(),
                      HealthName(static_cast<int>(d.health())), d.message(),
                      d.health_check_timeout_seconds()});
    }
    on_list(std::move(list));
  }
  (void)reader->Finish();
}

}  // namespace

struct DraKubeletHarness::Registration {
  DraRegistration info;
  uint64_t sequence = 0;
  std::shared_ptr<grpc::Channel> channel;
  std::shared_ptr<grpc::ClientContext> health_ctx;
};

DraKubeletHarness::DraKubeletHarness(DraHarnessOptions options) : options_(std::move(options)) {}

DraKubeletHarness::~DraKubeletHarness() { Stop(); }

Status DraKubeletHarness::Start() {
  std::error_code ec;
  std::filesystem::create_directories(options_.registry_dir, ec);
  if (ec) {
    return Status(ErrorCode::kInternal, "dra harness: cannot create " + options_.registry_dir +
                                            ": " + ec.message());
  }
  // No driver has registered yet: the node's slices go (manager.go, at kubelet start).
  if (options_.wipe_slices) options_.wipe_slices("");
  {
    std::lock_guard<std::mutex> lk(mu_);
    wipes_.push_back("");
    stopping_ = false;
  }
  inotify_fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (inotify_fd_ < 0 ||
      ::inotify_add_watch(inotify_fd_, options_.registry_dir.c_str(),
                          IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM) < 0) {
    return Status(ErrorCode::kInternal, "dra harness: cannot watch " + options_.registry_dir);
  }
  for (const auto& e : std::filesystem::directory_iterator(options_.registry_dir, ec)) {
    if (IsSocket(e.path().string())) OnSocketAdded(e.path().string());
  }
  watcher_ = std::thread([this] { WatchLoop(); });
  return Status::Ok();
}

void DraKubeletHarness::Stop() {
  std::vector<std::shared_ptr<Registration>> regs;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_ && inotify_fd_ < 0) return;
    stopping_ = true;
    for (auto& [path, reg] : by_socket_) regs.push_back(reg);
  }
  cv_.notify_all();
  for (auto& reg : regs) {
    if (reg->health_ctx) reg->health_ctx->TryCancel();
  }
  if (watcher_.joinable()) watcher_.join();
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lk(mu_);
    threads.swap(threads_);
  }
  for (std::thread& t : threads) {
    if (t.joinable()) t.join();
  }
  if (inotify_fd_ >= 0) ::close(inotify_fd_);
  inotify_fd_ = -1;
}

void DraKubeletHarness::WatchLoop() {
  alignas(struct inotify_event) char buf[8192];
  while (true) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stopping_) return;
    }
    struct pollfd pfd = {inotify_fd_, POLLIN, 0};
    if (::poll(&pfd, 1, 100) <= 0) continue;
    const ssize_t n = ::read(inotify_fd_, buf, sizeof(buf));
    for (ssize_t off = 0; n > 0 && off < n;) {
      const auto* ev = reinterpret_cast<const struct inotify_event*>(buf + off);
      off += static_cast<ssize_t>(sizeof(struct inotify_event) + ev->len);
      if (ev->len == 0) continue;
      const std::string path = options_.registry_dir + "/" + ev->name;
      if (ev->mask & (IN_CREATE | IN_MOVED_TO)) {
        if (IsSocket(path)) OnSocketAdded(path);
      } else if (ev->mask & (IN_DELETE | IN_MOVED_FROM)) {
        OnSocketRemoved(path);
      }
    }
  }
}

void DraKubeletHarness::OnSocketAdded(const std::string& path) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (by_socket_.count(path) != 0) return;
  }
  auto channel = grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials());
  auto stub = ::pluginregistration::Registration::NewStub(channel);
  ::pluginregistration::PluginInfo info;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(options_.dial_timeout));
    ctx.set_wait_for_ready(true);
    grpc::Status s = stub->GetInfo(&ctx, {}, &info);
    if (!s.ok()) {
      std::lock_guard<std::mutex> lk(mu_);
      refused_.push_back(path + ": GetInfo: " + s.error_message());
      cv_.notify_all();
      return;
    }
  }
  std::string error;
  std::string service;
  const std::vector<std::string> versions(info.supported_versions().begin(),
                                          info.supported_versions().end());
  for (const std::string& s : versions) {  // the plugin's order decides
    if (service.empty() && Contains(kKubeletServices, s)) service = s;
  }
  std::string health_service;
  for (const std::string& s : options_.health_services) {  // the kubelet's order decides
    if (health_service.empty() && Contains(versions, s)) health_service = s;
  }
  const std::string& endpoint = info.endpoint();
  if (info.type() != "DRAPlugin") {
    error = "plugin type \"" + info.type() + "\" is not DRAPlugin";
  } else if (!IsDnsSubdomain(info.name())) {
    error = "driver name \"" + info.name() + "\" is not a DNS subdomain of at most 63 characters";
  } else if (endpoint.empty() || endpoint[0] != '/' || endpoint.size() > 108) {
    error = "endpoint \"" + endpoint + "\" is not an absolute path of at most 108 bytes";
  } else if (!options_.kubelet_root.empty() && endpoint.rfind(options_.kubelet_root + "/", 0) != 0) {
    error = "endpoint " + endpoint + " is outside " + options_.kubelet_root;
  } else if (service.empty()) {
    error = "none of the supported versions is a DRAPlugin service this kubelet speaks";
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(options_.dial_timeout));
    ::pluginregistration::RegistrationStatus st;
    st.set_plugin_registered(error.empty());
    st.set_error(error);
    ::pluginregistration::RegistrationStatusResponse resp;
    (void)stub->NotifyRegistrationStatus(&ctx, st, &resp);
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (!error.empty()) {
    refused_.push_back(path + ": " + error);
    cv_.notify_all();
    return;
  }
  auto reg = std::make_shared<Registration>();
  reg->info.socket = path;
  reg->info.driver = info.name();
  reg->info.endpoint = endpoint;
  reg->info.service = service;
  reg->info.health_service = health_service;
  reg->sequence = ++sequence_;
  reg->channel = grpc::CreateChannel("unix:" + endpoint, grpc::InsecureChannelCredentials());
  by_socket_[path] = reg;
  ++generation_[reg->info.driver];
  if (!reg->info.health_service.empty() && !stopping_) {
    reg->health_ctx = std::make_shared<grpc::ClientContext>();
    threads_.emplace_back([this, reg] { HealthLoop(reg); });
  }
  cv_.notify_all();
}

void DraKubeletHarness::OnSocketRemoved(const std::string& path) {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = by_socket_.find(path);
  if (it == by_socket_.end()) return;
  std::shared_ptr<Registration> reg = it->second;
  by_socket_.erase(it);
  const std::string driver = reg->info.driver;
  const uint64_t generation = ++generation_[driver];
  if (reg->health_ctx) reg->health_ctx->TryCancel();
  cv_.notify_all();
  for (const auto& [p, r] : by_socket_) {
    if (r->info.driver == driver) return;  // another instance still serves the driver
  }
  // The driver's slices go after the wiping delay unless it registers again in time.
  threads_.emplace_back([this, driver, generation] {
    std::unique_lock<std::mutex> l(mu_);
    const bool back = cv_.wait_for(l, options_.wiping_delay, [&] {
      return stopping_ || generation_[driver] != generation;
    });
    if (back) return;
    wipes_.push_back(driver);
    l.unlock();
    if (options_.wipe_slices) options_.wipe_slices(driver);
    cv_.notify_all();
  });
}

void DraKubeletHarness::HealthLoop(std::shared_ptr<Registration> reg) {
  auto on_list = [this, &reg](std::vector<DraDeviceHealth> list) {
    std::lock_guard<std::mutex> lk(mu_);
    health_[reg->info.driver] = std::move(list);
    cv_.notify_all();
  };
  if (reg->info.health_service == kHealthV1) {
    ReadHealthStream<::v1::DRAResourceHealth, ::v1::NodeWatchResourcesResponse>(
        reg->channel, reg->health_ctx.get(), on_list);
  } else if (reg->info.health_service == kHealthV1alpha1) {
    ReadHealthStream<::v1alpha1::DRAResourceHealth, ::v1alpha1::NodeWatchResourcesResponse>(
        reg->channel, reg->health_ctx.get(), on_list);
  }
}

std::shared_ptr<DraKubeletHarness::Registration> DraKubeletHarness::Newest(
    const std::string& driver) const {
  std::shared_ptr<Registration> best;
  for (const auto& [path, reg] : by_socket_) {
    if (reg->info.driver == driver && (!best || reg->sequence > best->sequence)) best = reg;
  }
  return best;
}

std::optional<DraRegistration> DraKubeletHarness::Driver(const std::string& driver) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto reg = Newest(driver);
  if (!reg) return std::nullopt;
  return reg->info;
}

bool DraKubeletHarness::WaitForDriver(const std::string& driver,
                                      std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lk(mu_);
  return cv_.wait_for(lk, timeout, [&] { return Newest(driver) != nullptr; });
}

bool DraKubeletHarness::WaitForDriverGone(const std::string& driver,
                                          std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lk(mu_);
  return cv_.wait_for(lk, timeout, [&] { return Newest(driver) == nullptr; });
}

std::vector<std::string> DraKubeletHarness::refused() const {
  std::lock_guard<std::mutex> lk(mu_);
  return refused_;
}

std::map<std::string, DraPrepared> DraKubeletHarness::PreparePod(
    const std::vector<DraClaimRef>& claims, int attempts, std::chrono::milliseconds backoff) {
  std::map<std::string, DraPrepared> out;
  std::map<std::string, std::vector<DraClaimRef>> by_driver;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const DraClaimRef& c : claims) {
      auto known = prepared_.find(c.uid);
      if (known != prepared_.end() && known->second.error.empty()) {
        out[c.uid] = known->second;  // shared by another pod: not prepared again
      } else {
        by_driver[c.driver].push_back(c);
      }
    }
  }
  for (auto& [driver, pending] : by_driver) {
    for (int attempt = 0; attempt < attempts && !pending.empty(); ++attempt) {
      if (attempt > 0) std::this_thread::sleep_for(backoff);
      std::shared_ptr<Registration> reg;
      {
        std::lock_guard<std::mutex> lk(mu_);
        reg = Newest(driver);
        ++prepare_calls_;
      }
      std::map<std::string, DraPrepared> answer;
      std::string call_error;
      if (!reg) {
        call_error = "DRA driver " + driver + " is not registered";
      } else {
        grpc::ClientContext ctx;
        ctx.set_deadline(Deadline(options_.call_timeout));
        grpc::Status s;
        if (reg->info.service == "v1.DRAPlugin") {
          s = CallPrepare<drav1::DRAPlugin, drav1::NodePrepareResourcesRequest,
                          drav1::NodePrepareResourcesResponse>(reg->channel, &ctx, pending,
                                                               &answer);
        } else {
          s = CallPrepare<drav1beta1::DRAPlugin, drav1beta1::NodePrepareResourcesRequest,
                          drav1beta1::NodePrepareResourcesResponse>(reg->channel, &ctx, pending,
                                                                    &answer);
        }
        // A gRPC error makes the kubelet ignore the whole response.
        if (!s.ok()) {
          call_error = "NodePrepareResources: " + s.error_message();
          answer.clear();
        }
      }
      std::vector<DraClaimRef> again;
      for (const DraClaimRef& c : pending) {
        auto it = answer.find(c.uid);
        DraPrepared p;
        if (!call_error.empty()) {
          p.error = call_error;
        } else if (it == answer.end()) {
          p.error = "the driver's answer has no entry for claim " + c.uid;
        } else {
          p = it->second;
        }
        if (!p.error.empty()) again.push_back(c);
        out[c.uid] = p;
        if (p.error.empty()) {
          std::lock_guard<std::mutex> lk(mu_);
          prepared_[c.uid] = p;
        }
      }
      pending = std::move(again);
    }
  }
  return out;
}

std::map<std::string, std::string> DraKubeletHarness::UnpreparePod(
    const std::vector<DraClaimRef>& claims, int attempts, std::chrono::milliseconds backoff) {
  std::map<std::string, std::string> out;
  std::map<std::string, std::vector<DraClaimRef>> by_driver;
  for (const DraClaimRef& c : claims) by_driver[c.driver].push_back(c);
  for (auto& [driver, pending] : by_driver) {
    for (int attempt = 0; attempt < attempts && !pending.empty(); ++attempt) {
      if (attempt > 0) std::this_thread::sleep_for(backoff);
      std::shared_ptr<Registration> reg;
      {
        std::lock_guard<std::mutex> lk(mu_);
        reg = Newest(driver);
        ++unprepare_calls_;
      }
      std::map<std::string, std::string> answer;
      std::string call_error;
      if (!reg) {
        call_error = "DRA driver " + driver + " is not registered";
      } else {
        grpc::ClientContext ctx;
        ctx.set_deadline(Deadline(options_.call_timeout));
        grpc::Status s;
        if (reg->info.service == "v1.DRAPlugin") {
          s = CallUnprepare<drav1::DRAPlugin, drav1::NodeUnprepareResourcesRequest,
                            drav1::NodeUnprepareResourcesResponse>(reg->channel, &ctx, pending,
                                                                   &answer);
        } else {
          s = CallUnprepare<drav1beta1::DRAPlugin, drav1beta1::NodeUnprepareResourcesRequest,
                            drav1beta1::NodeUnprepareResourcesResponse>(reg->channel, &ctx,
                                                                         pending, &answer);
        }
        if (!s.ok()) {
          call_error = "NodeUnprepareResources: " + s.error_message();
          answer.clear();
        }
      }
      std::vector<DraClaimRef> again;
      for (const DraClaimRef& c : pending) {
        auto it = answer.find(c.uid);
        std::string error = !call_error.empty() ? call_error
                            : it == answer.end()
                                ? "the driver's answer has no entry for claim " + c.uid
                                : it->second;
        if (error.empty()) {
          std::lock_guard<std::mutex> lk(mu_);
          prepared_.erase(c.uid);
        } else {
          again.push_back(c);
        }
        out[c.uid] = error;
      }
      pending = std::move(again);
    }
  }
  return out;
}

size_t DraKubeletHarness::prepare_calls() const {
  std::lock_guard<std::mutex> lk(mu_);
  return prepare_calls_;
}

size_t DraKubeletHarness::unprepare_calls() const {
  std::lock_guard<std::mutex> lk(mu_);
  return unprepare_calls_;
}

std::vector<DraDeviceHealth> DraKubeletHarness::Health(const std::string& driver) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = health_.find(driver);
  return it == health_.end() ? std::vector<DraDeviceHealth>{} : it->second;
}

bool DraKubeletHarness::WaitForHealth(
    const std::string& driver, const std::function<bool(const std::vector<DraDeviceHealth>&)>& pred,
    std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lk(mu_);
  return cv_.wait_for(lk, timeout, [&] {
    auto it = health_.find(driver);
    return pred(it == health_.end() ? std::vector<DraDeviceHealth>{} : it->second);
  });
}

std::vector<std::string> DraKubeletHarness::wipes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return wipes_;
}

}  // namespace gpulet::testing
