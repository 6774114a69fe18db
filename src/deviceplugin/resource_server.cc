#include "deviceplugin/resource_server.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <random>

#include "deviceplugin/preferred.h"

namespace gpulet::deviceplugin {

std::string MpsHealthKey(const std::string& resource_name) { return "mps:" + resource_name; }

v1beta1::ListAndWatchResponse DeviceList(const sharing::Resource& resource,
                                         const gpu::HealthSnapshot& health) {
  v1beta1::ListAndWatchResponse resp;
  const bool daemon_ok = resource.sharing != sharing::SharingKind::kMps ||
                         health.Get(MpsHealthKey(resource.name)).healthy;
  for (const sharing::AdvertisedDevice& d : resource.devices) {
    v1beta1::Device* dev = resp.add_devices();
    dev->set_id(d.id);
    bool healthy = daemon_ok && health.Get(d.uuid).healthy &&
                   (d.parent_uuid.empty() || health.Get(d.parent_uuid).healthy);
    dev->set_health(healthy ? kHealthy : kUnhealthy);
    if (d.numa_node) dev->mutable_topology()->add_nodes()->set_id(*d.numa_node);
  }
  return resp;
}

namespace {

uint64_t RandomTag() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

grpc::Status ToGrpc(const Status& s) {
  return grpc::Status(s.code() == ErrorCode::kInvalidInput ? grpc::StatusCode::INVALID_ARGUMENT
                                                           : grpc::StatusCode::INTERNAL,
                      s.message());
}

}  // namespace

ResourceServer::ResourceServer(sharing::Resource resource,
                               std::shared_ptr<const gpu::Inventory> inventory,
                               AllocateOptions options, const gpu::HealthBoard& health,
                               std::string socket_path)
    : resource_(std::move(resource)),
      inventory_(std::move(inventory)),
      options_(std::move(options)),
      health_(health),
      socket_path_(std::move(socket_path)),
      instance_tag_(RandomTag()) {}

ResourceServer::~ResourceServer() { Stop(); }

Status ResourceServer::Start() {
  ::unlink(socket_path_.c_str());
  stopping_ = false;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket_path_, grpc::InsecureServerCredentials());
  builder.RegisterService(this);
  server_ = builder.BuildAndStart();
  if (!server_) {
    return Status(ErrorCode::kUnavailable,
                  "cannot serve " + resource_.name + " on " + socket_path_);
  }
  struct stat st {};
  socket_inode_ = ::stat(socket_path_.c_str(), &st) == 0 ? st.st_ino : 0;
  spdlog::info("event=plugin_serving resource={} socket={} devices={}", resource_.name,
               socket_path_, resource_.devices.size());
  return Status::Ok();
}

void ResourceServer::Stop() {
  if (!server_) return;
  stopping_ = true;
  health_.Wake();
  // Streams see stopping_ and return; anything still running after the deadline is cancelled.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_->Wait();
  server_.reset();
  struct stat st {};
  if (::stat(socket_path_.c_str(), &st) == 0 && st.st_ino == socket_inode_) {
    ::unlink(socket_path_.c_str());
  }
  spdlog::info("event=plugin_stopped resource={} socket={}", resource_.name, socket_path_);
}

bool ResourceServer::SocketPresent() const {
  struct stat st {};
  if (::stat(socket_path_.c_str(), &st) != 0) return false;
  return S_ISSOCK(st.st_mode) && st.st_ino == socket_inode_;
}

grpc::Status ResourceServer::GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                                    v1beta1::DevicePluginOptions* resp) {
  resp->set_pre_start_required(false);
  resp->set_get_preferred_allocation_available(true);
  return grpc::Status::OK;
}

grpc::Status ResourceServer::ListAndWatch(
    grpc::ServerContext* ctx, const v1beta1::Empty*,
    grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) {
  ++open_streams_;
  // On the way out: the stream count first, then (when the kubelet, not Stop(), ended it) the
  // lost count and the manager's wake-up, so the manager never sees a loss with the stream open.
  bool client_gone = false;
  struct Closer {
    ResourceServer& self;
    const bool& client_gone;
    ~Closer() {
      --self.open_streams_;
      if (client_gone && !self.stopping_.load()) {
        ++self.streams_lost_;
        if (self.on_stream_lost_) self.on_stream_lost_();
      }
    }
  } closer{*this, client_gone};
  gpu::HealthSnapshot snap = health_.Current();
  v1beta1::ListAndWatchResponse list = DeviceList(resource_, snap);
  std::string sent = list.SerializeAsString();
  spdlog::info("event=list_and_watch_open resource={} devices={}", resource_.name,
               list.devices_size());
  if (!writer->Write(list)) {
    client_gone = !stopping_.load();
    return grpc::Status::OK;
  }
  uint64_t seen = snap.version;
  auto done = [&] { return stopping_.load() || ctx->IsCancelled(); };
  while (!done()) {
    snap = health_.WaitNewer(seen, std::chrono::seconds(1), done);
    if (done()) break;
    if (snap.version == seen) continue;
    seen = snap.version;
    list = DeviceList(resource_, snap);
    std::string now = list.SerializeAsString();
    if (now == sent) continue;  // a change on a device this resource does not advertise
    sent = std::move(now);
    int unhealthy = 0;
    for (const v1beta1::Device& d : list.devices()) unhealthy += d.health() != kHealthy;
    spdlog::info("event=list_and_watch_update resource={} devices={} unhealthy={}", resource_.name,
                 list.devices_size(), unhealthy);
    if (!writer->Write(list)) break;
  }
  client_gone = !stopping_.load();
  spdlog::info("event=list_and_watch_closed resource={} reason={}", resource_.name,
               client_gone ? "client_gone" : "shutdown");
  return grpc::Status::OK;
}

grpc::Status ResourceServer::GetPreferredAllocation(grpc::ServerContext*,
                                                    const v1beta1::PreferredAllocationRequest* req,
                                                    v1beta1::PreferredAllocationResponse* resp) {
  for (const v1beta1::ContainerPreferredAllocationRequest& c : req->container_requests()) {
    std::vector<std::string> available(c.available_deviceids().begin(),
                                       c.available_deviceids().end());
    std::vector<std::string> must(c.must_include_deviceids().begin(),
                                  c.must_include_deviceids().end());
    Result<std::vector<std::string>> ids =
        PreferredAllocation(resource_, *inventory_, available, must, c.allocation_size(),
                            options_.replica_policy, options_.memory_placement);
    if (!ids.ok()) {
      spdlog::warn("event=preferred_allocation_failed resource={} error=\"{}\"", resource_.name,
                   ids.status().message());
      return ToGrpc(ids.status());
    }
    auto* out = resp->add_container_responses();
    for (const std::string& id : *ids) out->add_deviceids(id);
  }
  return grpc::Status::OK;
}

grpc::Status ResourceServer::Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* req,
                                      v1beta1::AllocateResponse* resp) {
  for (const v1beta1::ContainerAllocateRequest& c : req->container_requests()) {
    std::vector<std::string> ids(c.devices_ids().begin(), c.devices_ids().end());
    char unique[40];
    std::snprintf(unique, sizeof(unique), "%016llx%llu",
                  static_cast<unsigned long long>(instance_tag_),
                  static_cast<unsigned long long>(++allocations_));
    Result<v1beta1::ContainerAllocateResponse> r =
        BuildContainerAllocateResponse(resource_, *inventory_, options_, ids, unique);
    if (!r.ok()) {
      spdlog::warn("event=allocate_rejected resource={} error=\"{}\"", resource_.name,
                   r.status().message());
      return ToGrpc(r.status());
    }
    if (Status s = ApplyMemoryLimits(options_.memory_limits, resource_, *inventory_, ids, unique,
                                     &r.value());
        !s.ok()) {
      spdlog::warn("event=allocate_memory_limits_failed resource={} error=\"{}\"", resource_.name,
                   s.message());
      return ToGrpc(s);
    }
    spdlog::info("event=allocate resource={} devices={}", resource_.name, ids.size());
    if (options_.allocation_listener) options_.allocation_listener->OnAllocate(resource_, ids);
    *resp->add_container_responses() = std::move(r).value();
  }
  return grpc::Status::OK;
}

grpc::Status ResourceServer::PreStartContainer(grpc::ServerContext*,
                                               const v1beta1::PreStartContainerRequest*,
                                               v1beta1::PreStartContainerResponse*) {
  return grpc::Status::OK;
}

}  // namespace gpulet::deviceplugin
