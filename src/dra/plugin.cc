// The kubelet plugin of gpulet's DRA driver (plugin.h).
#include "dra/plugin.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <type_traits>

#include "common/fnv.h"
#include "dra/names.h"
#include "dra_health_v1.grpc.pb.h"
#include "dra_health_v1alpha1.grpc.pb.h"
#include "dra_v1.grpc.pb.h"
#include "dra_v1beta1.grpc.pb.h"
#include "k8s/client.h"
#include "pluginregistration_v1.grpc.pb.h"

namespace gpulet::dra {

namespace drav1 = ::k8s::io::kubelet::pkg::apis::dra::v1;
namespace drav1beta1 = ::k8s::io::kubelet::pkg::apis::dra::v1beta1;

namespace {

constexpr size_t kMaxSocketPath = 107;  // sockaddr_un.sun_path less the NUL
constexpr size_t kMaxClaimsPerCall = 1024;
constexpr size_t kMaxHealthMessage = 1024;
constexpr size_t kMaxQueuedStatus = 1024;


bool ValidInstance(const std::string& s) {
  if (s.size() > 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
  });
}

// A namespace (DNS label) or a name (DNS subdomain) the kubelet sent, before it goes into a URL.
bool ValidObjectName(const std::string& s, size_t max, bool dots) {
  if (s.empty() || s.size() > max) return false;
  return std::all_of(s.begin(), s.end(), [dots](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || (dots && c == '.');
  });
}

bool ValidUid(const std::string& s) {
  if (s.empty() || s.size() > 128) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
  });
}

std::string ClaimPath(const ClaimRef& ref) {
  return "/apis/resource.k8s.io/v1/namespaces/" + ref.namespace_ + "/resourceclaims/" + ref.name;
}

std::string Describe(const ClaimRef& ref) { return ref.namespace_ + "/" + ref.name; }

// An exclusive flock on `path`, held while this lives (released by close).
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd_ < 0) {
      error_ = "cannot open " + path + ": " + std::strerror(errno);
      return;
    }
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      error_ = "cannot lock " + path + ": " + std::strerror(errno);
      ::close(fd_);
      fd_ = -1;
      return;
    }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  const std::string& error() const { return error_; }

 private:
  int fd_ = -1;
  std::string error_;
};

ino_t InodeOf(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

void RemoveIfOurs(const std::string& path, ino_t inode) {
  struct stat st {};
  if (inode != 0 && ::stat(path.c_str(), &st) == 0 && st.st_ino == inode) ::unlink(path.c_str());
}

// Whether two devices of one pool may not be prepared for two claims at once.
bool Clash(const CheckpointDevice& a, const CheckpointDevice& b) {
  if (a.admin_access || b.admin_access || a.pool != b.pool) return false;
  if (a.device == b.device) {
    // Two shares of one allowMultipleAllocations device, each with its own shareID.
    return a.share_id.empty() || b.share_id.empty() || a.share_id == b.share_id;
  }
  // A whole GPU holds everything of that GPU: its MIG placements and its memory shares.
  std::optional<DeviceName> na = ParseDeviceName(a.device), nb = ParseDeviceName(b.device);
  return na && nb && na->gpu_index == nb->gpu_index &&
         (na->kind == DeviceKind::kGpu || nb->kind == DeviceKind::kGpu);
}

std::vector<std::string> StripSubrequests(const std::vector<std::string>& requests) {
  std::vector<std::string> out;
  for (const std::string& r : requests) {
    std::string base = r.substr(0, r.find('/'));
    if (std::find(out.begin(), out.end(), base) == out.end()) out.push_back(std::move(base));
  }
  return out;
}

template <typename DeviceMsg>
void FillDevice(const CheckpointDevice& d, DeviceMsg* out) {
  for (const std::string& r : d.requests) out->add_request_names(r);
  out->set_pool_name(d.pool);
  out->set_device_name(d.device);
  for (const std::string& id : d.cdi_device_ids) out->add_cdi_device_ids(id);
  if constexpr (requires { out->set_share_id(std::string()); }) {
    if (!d.share_id.empty()) out->set_share_id(d.share_id);
  }
}

template <typename Request>
Result<std::vector<ClaimRef>> Refs(const Request& req) {
  if (static_cast<size_t>(req.claims_size()) > kMaxClaimsPerCall) {
    return Status(ErrorCode::kInvalidInput, std::to_string(req.claims_size()) +
                                                " claims in one call, more than " +
                                                std::to_string(kMaxClaimsPerCall));
  }
  std::vector<ClaimRef> refs;
  for (const auto& c : req.claims()) refs.push_back(ClaimRef{c.namespace_(), c.name(), c.uid()});
  return refs;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// gRPC services

struct DraPlugin::HealthState {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<DeviceHealthReport> devices;
  uint64_t version = 0;
  bool stopping = false;
};

namespace {

class RegistrationService final : public ::pluginregistration::Registration::Service {
 public:
  explicit RegistrationService(DraPlugin& plugin) : plugin_(plugin) {}
  grpc::Status GetInfo(grpc::ServerContext*, const ::pluginregistration::InfoRequest*,
                       ::pluginregistration::PluginInfo* info) override {
    info->set_type("DRAPlugin");
    info->set_name(kDriverName);
    info->set_endpoint(plugin_.dra_socket());
    for (const std::string& v : plugin_.SupportedVersions()) info->add_supported_versions(v);
    return grpc::Status::OK;
  }
  grpc::Status NotifyRegistrationStatus(grpc::ServerContext*,
                                        const ::pluginregistration::RegistrationStatus* status,
                                        ::pluginregistration::RegistrationStatusResponse*) override {
    plugin_.OnRegistrationStatus(status->plugin_registered(), status->error());
    return grpc::Status::OK;
  }

 private:
  DraPlugin& plugin_;
};

template <typename Base, typename PrepReq, typename PrepResp, typename UnprepReq,
          typename UnprepResp>
class DraService final : public Base {
 public:
  explicit DraService(DraPlugin& plugin) : plugin_(plugin) {}
  grpc::Status NodePrepareResources(grpc::ServerContext*, const PrepReq* req,
                                    PrepResp* resp) override {
    Result<std::vector<ClaimRef>> refs = Refs(*req);
    if (!refs.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, refs.status().message());
    for (auto& [uid, outcome] : plugin_.Prepare(*refs)) {
      auto& entry = (*resp->mutable_claims())[uid];
      if (!outcome.error.empty()) {
        entry.set_error(outcome.error);
        continue;
      }
      for (const CheckpointDevice& d : outcome.devices) FillDevice(d, entry.add_devices());
    }
    return grpc::Status::OK;
  }
  grpc::Status NodeUnprepareResources(grpc::ServerContext*, const UnprepReq* req,
                                      UnprepResp* resp) override {
    Result<std::vector<ClaimRef>> refs = Refs(*req);
    if (!refs.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, refs.status().message());
    for (auto& [uid, error] : plugin_.Unprepare(*refs)) {
      (*resp->mutable_claims())[uid].set_error(error);
    }
    return grpc::Status::OK;
  }

 private:
  DraPlugin& plugin_;
};

using DraV1Service =
    DraService<drav1::DRAPlugin::Service, drav1::NodePrepareResourcesRequest,
               drav1::NodePrepareResourcesResponse, drav1::NodeUnprepareResourcesRequest,
               drav1::NodeUnprepareResourcesResponse>;
using DraV1beta1Service =
    DraService<drav1beta1::DRAPlugin::Service, drav1beta1::NodePrepareResourcesRequest,
               drav1beta1::NodePrepareResourcesResponse, drav1beta1::NodeUnprepareResourcesRequest,
               drav1beta1::NodeUnprepareResourcesResponse>;

// HealthStatus as numbered on the wire (UNKNOWN 0, HEALTHY 1, UNHEALTHY 2; the same in v1 and
// v1alpha1).
int HealthWireNumber(DeviceHealthReport::Health h) {
  switch (h) {
    case DeviceHealthReport::Health::kHealthy: return 1;
    case DeviceHealthReport::Health::kUnhealthy: return 2;
    default: return 0;
  }
}

// NodeWatchResources of one DRAResourceHealth version (`Api`: ::v1::DRAResourceHealth or
// ::v1alpha1::DRAResourceHealth; their messages are the same field for field): the complete list
// at once, then again after every change and at least every `resend` (the kubelet reads a device
// it has not heard of for its timeout, 30 s by default, as Unknown), until the kubelet goes away
// or the plugin stops.
template <typename Api, typename Request, typename Response>
class HealthService final : public Api::Service {
  using DeviceHealth = std::remove_pointer_t<decltype(std::declval<Response&>().add_devices())>;
  using HealthStatus = std::remove_cvref_t<decltype(std::declval<const DeviceHealth&>().health())>;

 public:
  HealthService(const char* service, DraPlugin::HealthState& state, std::string pool,
                std::chrono::milliseconds resend)
      : service_(service), state_(state), pool_(std::move(pool)), resend_(resend) {}
  grpc::Status NodeWatchResources(grpc::ServerContext* ctx, const Request*,
                                  grpc::ServerWriter<Response>* writer) override {
    // Which version the kubelet chose shows here (it opens one stream per registration).
    spdlog::info("event=dra_health_stream_opened service={}", service_);
    uint64_t sent = UINT64_MAX;
    while (true) {
      Response resp;
      {
        std::unique_lock<std::mutex> lk(state_.mu);
        const auto resend_at = std::chrono::steady_clock::now() + resend_;
        while (!state_.stopping && !ctx->IsCancelled() && state_.version == sent) {
          const auto now = std::chrono::steady_clock::now();
          if (now >= resend_at) break;
          // Woken by a change or the plugin stopping; a second at most, to see a cancellation.
          state_.cv.wait_for(lk, std::min<std::chrono::steady_clock::duration>(
                                     resend_at - now, std::chrono::seconds(1)));
        }
        if (state_.stopping || ctx->IsCancelled()) return grpc::Status::OK;
        sent = state_.version;
        const int64_t now = static_cast<int64_t>(std::time(nullptr));
        for (const DeviceHealthReport& d : state_.devices) {
          DeviceHealth* h = resp.add_devices();
          h->mutable_device()->set_pool_name(pool_);
          h->mutable_device()->set_device_name(d.device);
          h->set_health(static_cast<HealthStatus>(HealthWireNumber(d.health)));
          h->set_last_updated_time(now);
          h->set_health_check_timeout_seconds(d.timeout_seconds);
          h->set_message(d.message.size() > kMaxHealthMessage
                             ? d.message.substr(0, kMaxHealthMessage - 3) + "..."
                             : d.message);
        }
      }
      if (!writer->Write(resp)) return grpc::Status::OK;
    }
  }

 private:
  const char* service_;
  DraPlugin::HealthState& state_;
  std::string pool_;
  std::chrono::milliseconds resend_;
};

using HealthV1Service = HealthService<::v1::DRAResourceHealth, ::v1::NodeWatchResourcesRequest,
                                      ::v1::NodeWatchResourcesResponse>;
using HealthV1alpha1Service =
    HealthService<::v1alpha1::DRAResourceHealth, ::v1alpha1::NodeWatchResourcesRequest,
                  ::v1alpha1::NodeWatchResourcesResponse>;

}  // namespace

struct DraPlugin::Services {
  explicit Services(DraPlugin& p)
      : registration(p),
        v1(p),
        v1beta1(p),
        health_v1(kServiceHealthV1, p.health_state(), p.options_.node_name,
                  p.options_.health_resend),
        health_v1alpha1(kServiceHealthV1alpha1, p.health_state(), p.options_.node_name,
                        p.options_.health_resend) {}
  RegistrationService registration;
  DraV1Service v1;
  DraV1beta1Service v1beta1;
  HealthV1Service health_v1;
  HealthV1alpha1Service health_v1alpha1;
};

// ---------------------------------------------------------------------------------------------

DraPlugin::DraPlugin(PluginOptions options, const k8s::Client* client, Preparer* preparer)
    : options_(std::move(options)),
      client_(client),
      preparer_(preparer),
      health_(std::make_unique<HealthState>()) {}

DraPlugin::~DraPlugin() { Stop(); }

std::vector<std::string> DraPlugin::SupportedVersions() const {
  // The kubelet takes the first DRAPlugin service of this list that it speaks (so v1 where it
  // can), and the newest health service both sides know in its own order (v1, then v1alpha1).
  std::vector<std::string> v = {kServiceV1, kServiceV1beta1};
  if (options_.serve_health) {
    v.push_back(kServiceHealthV1);
    v.push_back(kServiceHealthV1alpha1);
  }
  return v;
}

void DraPlugin::OnRegistrationStatus(bool registered, const std::string& error) {
  registration_state_ = registered ? 1 : -1;
  if (registered) {
    spdlog::info("event=dra_registered driver={} socket={}", kDriverName, registration_socket_);
  } else {
    spdlog::error("event=dra_registration_refused driver={} socket={} error=\"{}\"", kDriverName,
                  registration_socket_, error);
  }
}

void DraPlugin::SetDeviceHealth(std::vector<DeviceHealthReport> devices) {
  {
    std::lock_guard<std::mutex> lk(health_->mu);
    health_->devices = std::move(devices);
    ++health_->version;
  }
  health_->cv.notify_all();
}

Status DraPlugin::Start() {
  if (options_.node_name.empty()) return Status(ErrorCode::kUsage, "dra: the node name is required");
  if (!ValidInstance(options_.instance)) {
    return Status(ErrorCode::kUsage, "dra: instance \"" + options_.instance.substr(0, 80) +
                                         "\": only letters, digits and '-', at most 64");
  }
  if (preparer_ == nullptr) return Status(ErrorCode::kInternal, "dra: no device preparer");
  const std::string plugin_dir = options_.plugins_dir + "/" + kDriverName;
  state_dir_ = options_.state_dir.empty() ? plugin_dir : options_.state_dir;
  for (const std::string& dir : {options_.registry_dir, plugin_dir, state_dir_}) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return Status(ErrorCode::kInternal, "dra: cannot create " + dir + ": " + ec.message());
  }
  lock_path_ = state_dir_ + "/serialize.lock";
  dra_socket_ = plugin_dir + "/" +
                (options_.instance.empty() ? std::string("dra.sock")
                                           : "dra-" + options_.instance + ".sock");
  registration_socket_ =
      options_.registry_dir + "/" + kDriverName +
      (options_.instance.empty() ? std::string() : "-" + options_.instance) + "-reg.sock";
  if (registration_socket_.size() > kMaxSocketPath) {
    registration_socket_ = options_.registry_dir + "/" + kDriverName + "-" +
                           Fnv64Hex(options_.instance) + "-reg.sock";
  }
  for (const std::string& s : {dra_socket_, registration_socket_}) {
    if (s.size() > kMaxSocketPath) {
      return Status(ErrorCode::kUsage, "dra: socket path " + s + " is longer than " +
                                           std::to_string(kMaxSocketPath) + " bytes");
    }
  }
  Result<std::string> boot = ReadBootId(options_.boot_id_path);
  if (!boot.ok()) return boot.status();
  boot_id_ = *boot;
  {
    std::lock_guard<std::mutex> lk(mu_);
    FileLock lock(lock_path_);
    if (!lock.error().empty()) return Status(ErrorCode::kInternal, "dra: " + lock.error());
    Result<Checkpoint> cp = LoadLocked();
    if (!cp.ok()) return cp.status();
    spdlog::info("event=dra_checkpoint_loaded path={} claims={} rebuild_pending={}",
                 checkpoint_path(), cp->claims.size(), cp->rebuild_pending);
  }
  {
    std::lock_guard<std::mutex> lk(health_->mu);
    health_->stopping = false;
  }
  if (options_.write_device_status && client_ != nullptr && !status_thread_.joinable()) {
    status_stop_ = false;
    status_thread_ = std::thread([this] { StatusLoop(); });
  }
  services_ = std::make_unique<Services>(*this);
  auto serve = [](const std::string& path, std::vector<grpc::Service*> services,
                  std::unique_ptr<grpc::Server>* out, int max_pollers) -> Status {
    ::unlink(path.c_str());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, max_pollers);
    for (grpc::Service* s : services) builder.RegisterService(s);
    *out = builder.BuildAndStart();
    if (!*out) return Status(ErrorCode::kUnavailable, "dra: cannot serve on " + path);
    return Status::Ok();
  };
  std::vector<grpc::Service*> dra = {&services_->v1, &services_->v1beta1};
  if (options_.serve_health) {
    dra.push_back(&services_->health_v1);
    dra.push_back(&services_->health_v1alpha1);
  }
  // gRPC's default (at most 2 idle threads waiting for requests) for the DRA services; one for
  // the registration service, which the kubelet calls twice per registration.
  Status s = serve(dra_socket_, dra, &dra_server_, 2);
  if (!s.ok()) return s;
  dra_inode_ = InodeOf(dra_socket_);
  s = serve(registration_socket_, {&services_->registration}, &registration_server_, 1);
  if (!s.ok()) {
    Stop();
    return s;
  }
  registration_inode_ = InodeOf(registration_socket_);
  spdlog::info("event=dra_serving driver={} registration={} endpoint={} node={}", kDriverName,
               registration_socket_, dra_socket_, options_.node_name);
  return Status::Ok();
}

void DraPlugin::Stop() {
  {
    std::lock_guard<std::mutex> lk(health_->mu);
    health_->stopping = true;
  }
  health_->cv.notify_all();
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(2);
  // Registration first: the kubelet's watcher sees the driver leave before its endpoint does.
  if (registration_server_) {
    registration_server_->Shutdown(deadline);
    registration_server_->Wait();
    registration_server_.reset();
    RemoveIfOurs(registration_socket_, registration_inode_);
  }
  if (dra_server_) {
    dra_server_->Shutdown(deadline);
    dra_server_->Wait();
    dra_server_.reset();
    RemoveIfOurs(dra_socket_, dra_inode_);
    spdlog::info("event=dra_stopped driver={} endpoint={}", kDriverName, dra_socket_);
  }
  services_.reset();
  if (status_thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lk(status_mu_);
      status_stop_ = true;
    }
    status_cv_.notify_all();
    status_thread_.join();
  }
}

// Writes queued status.devices until Stop(); what is queued then is still written.
void DraPlugin::StatusLoop() {
  std::unique_lock<std::mutex> lk(status_mu_);
  while (true) {
    status_cv_.wait(lk, [this] { return status_stop_ || !status_queue_.empty(); });
    if (status_queue_.empty()) return;
    auto next = std::move(status_queue_.front());
    status_queue_.pop_front();
    lk.unlock();
    WriteDeviceStatus(next.first, next.second);
    lk.lock();
  }
}

// Caller holds mu_ and the file lock.
Result<Checkpoint> DraPlugin::LoadLocked() {
  Result<LoadedCheckpoint> loaded = LoadCheckpoint(checkpoint_path(), options_.node_name, boot_id_);
  if (!loaded.ok()) return loaded.status();
  Checkpoint cp = std::move(loaded->checkpoint);
  if (loaded->outcome == LoadedCheckpoint::Outcome::kCorrupt ||
      loaded->outcome == LoadedCheckpoint::Outcome::kForeign) {
    // Durable before anything else: the other instance, or this one after a restart, must know
    // that unknown claims may still hold devices until the rebuild has happened.
    Status w = WriteCheckpoint(checkpoint_path(), cp);
    if (!w.ok()) spdlog::error("event=dra_checkpoint_write_failed error=\"{}\"", w.message());
  }
  if (cp.rebuild_pending) {
    Status r = RebuildLocked(cp);
    if (r.ok()) {
      cp.rebuild_pending = false;
      Status w = WriteCheckpoint(checkpoint_path(), cp);
      if (!w.ok()) return w;
      spdlog::info("event=dra_checkpoint_rebuilt path={} claims={}", checkpoint_path(),
                   cp.claims.size());
    } else {
      spdlog::warn("event=dra_checkpoint_rebuild_deferred path={} error=\"{}\"", checkpoint_path(),
                   r.message());
    }
  }
  rebuild_pending_ = cp.rebuild_pending;
  return cp;
}

// Every claim allocated to this node (this driver's devices in its pool) and reserved is prepared
// again; the Preparer is idempotent. Caller holds the locks.
Status DraPlugin::RebuildLocked(Checkpoint& cp) {
  if (client_ == nullptr) return Status(ErrorCode::kUnavailable, "no API server configured");
  k8s::ApiResult<nlohmann::json> list = client_->Get("/apis/resource.k8s.io/v1/resourceclaims");
  if (!list.ok()) return list.status();
  auto items = list->find("items");
  if (items == list->end() || !items->is_array()) {
    return Status(ErrorCode::kUnavailable, "the ResourceClaim list has no items");
  }
  for (const nlohmann::json& item : *items) {
    Result<Claim> claim = ParseClaim(item);
    if (!claim.ok()) {
      spdlog::warn("event=dra_rebuild_skipped error=\"{}\"", claim.status().message());
      continue;
    }
    if (!claim->allocated || claim->reserved_for_uids.empty() || claim->devices.empty()) continue;
    if (!claim->node_names.empty() &&
        std::find(claim->node_names.begin(), claim->node_names.end(), options_.node_name) ==
            claim->node_names.end()) {
      continue;
    }
    bool ours = std::all_of(claim->devices.begin(), claim->devices.end(),
                            [&](const AllocatedDevice& d) { return d.pool == options_.node_name; });
    if (!ours || cp.claims.count(claim->ref.uid) != 0) continue;
    Result<PrepareResult> prepared = preparer_->Prepare(*claim);
    if (!prepared.ok()) {
      spdlog::error("event=dra_rebuild_prepare_failed claim={} uid={} error=\"{}\"",
                    Describe(claim->ref), claim->ref.uid, prepared.status().message());
      continue;
    }
    CheckpointEntry e;
    e.ref = claim->ref;
    e.state = CheckpointEntry::State::kPrepared;
    e.record_json = prepared->record_json;
    for (const PreparedDevice& d : prepared->devices) {
      CheckpointDevice cd;
      static_cast<PreparedDevice&>(cd) = d;
      cd.requests = StripSubrequests(d.requests);
      for (const AllocatedDevice& a : claim->devices) {
        if (a.device == d.device && a.pool == d.pool && a.share_id == d.share_id) {
          cd.admin_access = a.admin_access;
        }
      }
      e.devices.push_back(std::move(cd));
    }
    spdlog::info("event=dra_rebuild_claim claim={} uid={} devices={}", Describe(claim->ref),
                 claim->ref.uid, e.devices.size());
    cp.claims[claim->ref.uid] = std::move(e);
  }
  return Status::Ok();
}

namespace {

// What a Prepare batch carries between its phases.
struct Pending {
  ClaimRef ref;
  Claim claim;
  nlohmann::json object;
  std::string error;
  bool done = false;  // answered (from the checkpoint or with an error)
};

}  // namespace

std::map<std::string, ClaimPrepareOutcome> DraPlugin::Prepare(const std::vector<ClaimRef>& claims) {
  std::map<std::string, ClaimPrepareOutcome> out;
  std::vector<std::pair<nlohmann::json, std::vector<CheckpointDevice>>> status_writes;
  {
    std::lock_guard<std::mutex> lk(mu_);
    FileLock lock(lock_path_);
    Result<Checkpoint> loaded =
        lock.error().empty() ? LoadLocked()
                             : Result<Checkpoint>(Status(ErrorCode::kInternal, lock.error()));
    if (!loaded.ok()) {
      for (const ClaimRef& ref : claims) {
        out[ref.uid].error = "gpulet dra: cannot read its checkpoint: " + loaded.status().message();
      }
      return out;
    }
    Checkpoint& cp = *loaded;
    // Phase 1: answer what is known, read and check the rest.
    std::vector<Pending> batch;
    for (const ClaimRef& ref : claims) {
      Pending p;
      p.ref = ref;
      auto known = cp.claims.find(ref.uid);
      if (known != cp.claims.end() && known->second.state == CheckpointEntry::State::kPrepared) {
        out[ref.uid].devices = known->second.devices;
        continue;
      }
      if (!ValidObjectName(ref.namespace_, 63, false) || !ValidObjectName(ref.name, 253, true) ||
          !ValidUid(ref.uid)) {
        out[ref.uid].error = "claim reference \"" + ref.namespace_.substr(0, 64) + "/" +
                             ref.name.substr(0, 253) + "\" (uid \"" + ref.uid.substr(0, 128) +
                             "\") is not a valid namespace, name and UID";
        continue;
      }
      if (client_ == nullptr) {
        out[ref.uid].error = "ResourceClaim " + Describe(ref) +
                             ": gpulet dra has no API server access (--kubeconfig or in-cluster)";
        continue;
      }
      k8s::ApiResult<nlohmann::json> got = client_->Get(ClaimPath(ref));
      if (!got.ok()) {
        out[ref.uid].error =
            got.status().code() == ErrorCode::kNotFound
                ? "ResourceClaim " + Describe(ref) + " not found in the API server (deleted?)"
                : "ResourceClaim " + Describe(ref) +
                      ": cannot read it from the API server (nothing was prepared; the kubelet "
                      "retries): " + got.status().message();
        continue;
      }
      Result<Claim> claim = ParseClaim(*got);
      if (!claim.ok()) {
        out[ref.uid].error = claim.status().message();
        continue;
      }
      std::string error;
      if (claim->ref.uid != ref.uid) {
        error = "ResourceClaim " + Describe(ref) + " has UID " + claim->ref.uid + ", not " +
                ref.uid + ": it was deleted and created again";
      } else if (!claim->allocated) {
        error = "ResourceClaim " + Describe(ref) + " is not allocated (status.allocation is missing)";
      } else if (!claim->node_names.empty() &&
                 std::find(claim->node_names.begin(), claim->node_names.end(),
                           options_.node_name) == claim->node_names.end()) {
        error = "ResourceClaim " + Describe(ref) + ": status.allocation.nodeSelector names node " +
                claim->node_names.front() + ", not this node " + options_.node_name;
      } else if (claim->reserved_for_uids.empty()) {
        error = "ResourceClaim " + Describe(ref) +
                " is not reserved for any pod (status.reservedFor is empty)";
      }
      for (size_t i = 0; error.empty() && i < claim->devices.size(); ++i) {
        const AllocatedDevice& d = claim->devices[i];
        if (d.pool != options_.node_name) {
          error = "ResourceClaim " + Describe(ref) + ": device " + d.device + " is in pool " +
                  d.pool + ", not this node's pool " + options_.node_name;
        }
      }
      // The last line of defence: no device another prepared claim holds.
      for (size_t i = 0; error.empty() && i < claim->devices.size(); ++i) {
        CheckpointDevice mine;
        mine.pool = claim->devices[i].pool;
        mine.device = claim->devices[i].device;
        mine.share_id = claim->devices[i].share_id;
        mine.admin_access = claim->devices[i].admin_access;
        for (const auto& [uid, e] : cp.claims) {
          if (uid == ref.uid || !error.empty()) continue;
          for (const CheckpointDevice& theirs : e.devices) {
            if (Clash(mine, theirs)) {
              error = "ResourceClaim " + Describe(ref) + ": device " + mine.device +
                      " conflicts with " + theirs.device + ", prepared for ResourceClaim " +
                      Describe(e.ref) + " (uid " + uid + ")";
              break;
            }
          }
        }
      }
      if (!error.empty()) {
        out[ref.uid].error = error;
        continue;
      }
      CheckpointEntry intent;
      intent.ref = ref;
      intent.state = CheckpointEntry::State::kPreparing;
      for (const AllocatedDevice& d : claim->devices) {
        CheckpointDevice cd;
        cd.requests = StripSubrequests({d.request});
        cd.pool = d.pool;
        cd.device = d.device;
        cd.share_id = d.share_id;
        cd.admin_access = d.admin_access;
        intent.devices.push_back(std::move(cd));
      }
      cp.claims[ref.uid] = std::move(intent);
      p.claim = std::move(claim).value();
      p.object = std::move(got).value();
      batch.push_back(std::move(p));
    }
    if (batch.empty()) return out;
    // The intent stays in memory (the conflict checks of this batch see it): a Prepare killed
    // half-way leaves no entry, and the Unprepare of a claim without one still asks the Preparer
    // to remove what the claim's fixed names may hold (Unprepare below). One fsync per call.
    // Phase 2: the Preparer, claim by claim (each all-or-nothing).
    std::vector<Pending*> prepared;
    for (Pending& p : batch) {
      Result<PrepareResult> r = preparer_->Prepare(p.claim);
      if (!r.ok()) {
        out[p.ref.uid].error = r.status().message();
        cp.claims.erase(p.ref.uid);
        continue;
      }
      CheckpointEntry& e = cp.claims[p.ref.uid];
      std::vector<CheckpointDevice> devices;
      for (const PreparedDevice& d : r->devices) {
        CheckpointDevice cd;
        static_cast<PreparedDevice&>(cd) = d;
        cd.requests = StripSubrequests(d.requests);
        for (const CheckpointDevice& a : e.devices) {
          if (a.device == d.device && a.pool == d.pool && a.share_id == d.share_id) {
            cd.admin_access = a.admin_access;
          }
        }
        devices.push_back(std::move(cd));
      }
      e.devices = std::move(devices);
      e.record_json = r->record_json;
      e.state = CheckpointEntry::State::kPrepared;
      prepared.push_back(&p);
    }
    // Phase 3: the outcome on disk; when it cannot be written, nothing stays prepared.
    Status w = WriteCheckpoint(checkpoint_path(), cp);
    for (Pending* p : prepared) {
      const CheckpointEntry& e = cp.claims[p->ref.uid];
      if (!w.ok()) {
        Status undo = preparer_->Unprepare(e.ref, e.record_json);
        out[p->ref.uid].error = "gpulet dra: cannot write its checkpoint (the claim was rolled "
                                "back" + std::string(undo.ok() ? "" : ", which failed: " +
                                                                         undo.message()) +
                                "): " + w.message();
        continue;
      }
      out[p->ref.uid].devices = e.devices;
      spdlog::info("event=dra_prepared claim={} uid={} devices={}", Describe(p->ref), p->ref.uid,
                   e.devices.size());
      if (options_.write_device_status) status_writes.emplace_back(p->object, e.devices);
    }
  }
  if (!status_writes.empty()) {
    // Off the kubelet's path: a worker writes them (best effort, in order).
    {
      std::lock_guard<std::mutex> lk(status_mu_);
      for (auto& w : status_writes) {
        if (status_queue_.size() >= kMaxQueuedStatus) {
          spdlog::warn("event=dra_device_status_dropped reason=queue_full");
          status_queue_.pop_front();
        }
        status_queue_.push_back(std::move(w));
      }
    }
    status_cv_.notify_one();
  }
  return out;
}

std::map<std::string, std::string> DraPlugin::Unprepare(const std::vector<ClaimRef>& claims) {
  std::map<std::string, std::string> out;
  std::lock_guard<std::mutex> lk(mu_);
  FileLock lock(lock_path_);
  Result<Checkpoint> loaded =
      lock.error().empty() ? LoadLocked()
                           : Result<Checkpoint>(Status(ErrorCode::kInternal, lock.error()));
  if (!loaded.ok()) {
    for (const ClaimRef& ref : claims) {
      out[ref.uid] = "gpulet dra: cannot read its checkpoint: " + loaded.status().message();
    }
    return out;
  }
  Checkpoint& cp = *loaded;
  bool changed = false;
  for (const ClaimRef& ref : claims) {
    auto it = cp.claims.find(ref.uid);
    if (it == cp.claims.end()) {
      if (cp.rebuild_pending) {
        out[ref.uid] = "ResourceClaim " + Describe(ref) +
                       ": gpulet dra is rebuilding its checkpoint from the API server, which it "
                       "cannot reach yet; retry";
        continue;
      }
      // Never prepared here, or a Prepare killed before its outcome was written: the Preparer
      // removes whatever the claim's fixed names hold (nothing, usually) and succeeds.
      Status s = preparer_->Unprepare(ref, "");
      out[ref.uid] = s.ok() ? "" : s.message();
      continue;
    }
    Status s = preparer_->Unprepare(it->second.ref, it->second.record_json);
    if (!s.ok()) {
      out[ref.uid] = s.message();
      continue;
    }
    spdlog::info("event=dra_unprepared claim={} uid={}", Describe(it->second.ref), ref.uid);
    cp.claims.erase(it);
    out[ref.uid] = "";
    changed = true;
  }
  if (changed) {
    if (Status w = WriteCheckpoint(checkpoint_path(), cp); !w.ok()) {
      // The devices are released; the entries stay on disk and the next Unprepare (idempotent)
      // removes them.
      for (auto& [uid, error] : out) {
        if (error.empty()) error = "gpulet dra: cannot write its checkpoint: " + w.message();
      }
    }
  }
  return out;
}

// status.devices: this driver's entries replaced, other drivers' kept, with optimistic
// concurrency on the claim's resourceVersion. Off the kubelet's path and best effort, but retried:
// a 5xx, 429, timeout or lost answer is tried again after 0.2, 0.4, … 3.2 s (or the server's
// Retry-After, up to 10 s, when longer); a 409 (the claim
// changed, or our own write landed and its answer was lost) re-reads the claim and merges again,
// and stops when the claim is gone, replaced (another UID) or already says what we would write.
// Stopping the plugin ends the retries. A write that never lands is logged (once as a warning).
void DraPlugin::WriteDeviceStatus(const nlohmann::json& claim,
                                  const std::vector<CheckpointDevice>& devices) {
  if (client_ == nullptr) return;
  char now[32];
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  std::strftime(now, sizeof(now), "%Y-%m-%dT%H:%M:%SZ", &tm);
  nlohmann::json ours = nlohmann::json::array();
  for (const CheckpointDevice& d : devices) {
    nlohmann::json e = {{"driver", kDriverName},
                        {"pool", d.pool},
                        {"device", d.device},
                        {"conditions",
                         nlohmann::json::array({{{"type", "Ready"},
                                                 {"status", "True"},
                                                 {"reason", "Prepared"},
                                                 {"message", "prepared by gpulet dra"},
                                                 {"lastTransitionTime", now}}})}};
    if (!d.share_id.empty()) e["shareID"] = d.share_id;
    if (!d.status_data.empty()) {
      nlohmann::json data = nlohmann::json::parse(d.status_data, nullptr, false);
      if (data.is_object()) e["data"] = std::move(data);
    }
    ours.push_back(std::move(e));
  }
  // Our entries as a claim already holds them (conditions' times aside): nothing to write.
  auto holds_ours = [&](const nlohmann::json& obj) {
    auto st = obj.find("status");
    if (st == obj.end() || !st->is_object()) return false;
    auto d = st->find("devices");
    if (d == st->end() || !d->is_array()) return false;
    size_t found = 0;
    for (const nlohmann::json& e : *d) {
      if (!e.is_object() || e.value("driver", "") != kDriverName) continue;
      for (const nlohmann::json& o : ours) {
        if (e.value("pool", "") == o.value("pool", "") &&
            e.value("device", "") == o.value("device", "") &&
            e.value("shareID", "") == o.value("shareID", "") &&
            e.value("data", nlohmann::json()) == o.value("data", nlohmann::json())) {
          ++found;
          break;
        }
      }
    }
    return found == ours.size();
  };
  nlohmann::json current = claim;
  const nlohmann::json& meta = claim["metadata"];
  const ClaimRef ref{meta.value("namespace", ""), meta.value("name", ""), meta.value("uid", "")};
  k8s::ApiResult<nlohmann::json> r = Status(ErrorCode::kUnavailable, "not written");
  std::chrono::milliseconds backoff(200);
  constexpr int kAttempts = 6;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    nlohmann::json list = nlohmann::json::array();
    if (auto st = current.find("status"); st != current.end() && st->is_object()) {
      if (auto d = st->find("devices"); d != st->end() && d->is_array()) {
        for (const nlohmann::json& e : *d) {
          if (e.is_object() && e.value("driver", "") != kDriverName) list.push_back(e);
        }
      }
    }
    for (const nlohmann::json& e : ours) list.push_back(e);
    nlohmann::json patch = {
        {"metadata", {{"resourceVersion", current["metadata"].value("resourceVersion", "")}}},
        {"status", {{"devices", std::move(list)}}}};
    r = client_->Patch(ClaimPath(ref) + "/status", patch, k8s::PatchType::kMerge);
    if (r.ok()) {
      if (attempt > 0) {
        spdlog::info("event=dra_device_status_written claim={} attempts={}", Describe(ref),
                     attempt + 1);
      }
      return;
    }
    const long code = r.http_status();
    const bool conflict = code == 409;
    const bool transient = code == 0 || code == 429 || code >= 500;
    if (!conflict && !transient) break;  // 403 (RBAC), 404 (gone), 422: trying again cannot help
    {
      std::unique_lock<std::mutex> lk(status_mu_);
      // The backoff, or the server's Retry-After when longer (bounded: a status is not worth
      // holding the worker for a minute).
      const std::chrono::milliseconds wait =
          conflict ? std::chrono::milliseconds(0)
                   : std::max<std::chrono::milliseconds>(
                         backoff, std::min(r.retry_after(), std::chrono::seconds(10)));
      if (status_cv_.wait_for(lk, wait, [this] { return status_stop_; })) {
        return;
      }
    }
    backoff = std::min(backoff * 2, std::chrono::milliseconds(3200));
    // Read it back: after a conflict, and after a lost answer (the write may have landed).
    k8s::ApiResult<nlohmann::json> fresh = client_->Get(ClaimPath(ref));
    if (!fresh.ok()) {
      if (fresh.http_status() == 404) return;  // deleted: nothing to say
      continue;                                // retry with what we had
    }
    if (!fresh->is_object() || (*fresh)["metadata"].value("uid", "") != ref.uid) return;
    if (holds_ours(*fresh)) return;
    current = std::move(*fresh);
  }
  if (!status_warned_.exchange(true)) {
    spdlog::warn("event=dra_device_status_failed claim={} error=\"{}\" (needs resourceclaims/status "
                 "patch; logged once, then at debug level)",
                 Describe(ref), r.status().message());
  } else {
    spdlog::debug("event=dra_device_status_failed claim={} error=\"{}\"", Describe(ref),
                  r.status().message());
  }
}

}  // namespace gpulet::dra
