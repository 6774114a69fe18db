// One kubelet device plugin (v1beta1 DevicePlugin service) for one resource, served on its own
// unix socket. Immutable once built: a plan change replaces the whole server (see manager.h), so
// the handlers need no locks. Health comes from the shared gpu::HealthBoard.
//
// ListAndWatch sends the full list when the stream opens and again whenever the advertised
// health changes (a device is unhealthy when its backing GPU/MIG UUID or its parent GPU is), and
// returns cleanly on Stop() or when the kubelet goes away.
#pragma once

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "deviceplugin/allocate.h"
#include "deviceplugin_v1beta1.grpc.pb.h"
#include "gpu/health.h"
#include "gpu/inventory.h"
#include "sharing/plan.h"

namespace gpulet::deviceplugin {

inline constexpr const char* kHealthy = "Healthy";
inline constexpr const char* kUnhealthy = "Unhealthy";
inline constexpr const char* kApiVersion = "v1beta1";

// The HealthBoard key of an MPS resource's daemon: while it is unhealthy, every replica of the
// resource is advertised Unhealthy.
std::string MpsHealthKey(const std::string& resource_name);

// The complete device list the kubelet should see under `health`. A replica carries the health
// of its backing device (all replicas of a GPU go Unhealthy together, and recover together).
v1beta1::ListAndWatchResponse DeviceList(const sharing::Resource& resource,
                                         const gpu::HealthSnapshot& health);

class ResourceServer final : public v1beta1::DevicePlugin::Service {
 public:
  ResourceServer(sharing::Resource resource, std::shared_ptr<const gpu::Inventory> inventory,
                 AllocateOptions options, const gpu::HealthBoard& health, std::string socket_path);
  ~ResourceServer() override;  // Stop()s
  ResourceServer(const ResourceServer&) = delete;
  ResourceServer& operator=(const ResourceServer&) = delete;

  // Removes whatever is at the socket path, then listens and serves. kUnavailable on failure.
  Status Start();
  // Ends the streams, shuts the server down and removes the socket (if it is still ours).
  void Stop();
  // True while the socket file we created is still in place (a restarting kubelet deletes it).
  bool SocketPresent() const;

  const sharing::Resource& resource() const { return resource_; }
  const AllocateOptions& options() const { return options_; }
  const std::string& socket_path() const { return socket_path_; }
  int open_streams() const { return open_streams_.load(); }
  // ListAndWatch streams the kubelet ended while this server was serving (not Stop()): a kubelet
  // that restarted, or one that dropped this endpoint when an older stream of the same resource
  // ended (it keys its clients by resource name). The manager registers again on a change.
  uint64_t streams_lost() const { return streams_lost_.load(); }
  // Called (from a gRPC thread) after a stream was lost; set before Start().
  void OnStreamLost(std::function<void()> callback) { on_stream_lost_ = std::move(callback); }

  grpc::Status GetDevicePluginOptions(grpc::ServerContext* ctx, const v1beta1::Empty* req,
                                      v1beta1::DevicePluginOptions* resp) override;
  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty* req,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override;
  grpc::Status GetPreferredAllocation(grpc::ServerContext* ctx,
                                      const v1beta1::PreferredAllocationRequest* req,
                                      v1beta1::PreferredAllocationResponse* resp) override;
  grpc::Status Allocate(grpc::ServerContext* ctx, const v1beta1::AllocateRequest* req,
                        v1beta1::AllocateResponse* resp) override;
  grpc::Status PreStartContainer(grpc::ServerContext* ctx,
                                 const v1beta1::PreStartContainerRequest* req,
                                 v1beta1::PreStartContainerResponse* resp) override;

 private:
  const sharing::Resource resource_;
  const std::shared_ptr<const gpu::Inventory> inventory_;
  const AllocateOptions options_;
  const gpu::HealthBoard& health_;
  const std::string socket_path_;
  std::unique_ptr<grpc::Server> server_;
  ino_t socket_inode_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> open_streams_{0};
  std::atomic<uint64_t> streams_lost_{0};
  std::function<void()> on_stream_lost_;
  std::atomic<uint64_t> allocations_{0};
  const uint64_t instance_tag_;  // makes CDI annotation keys unique across restarts
};

}  // namespace gpulet::deviceplugin
