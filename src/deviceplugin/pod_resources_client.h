// The kubelet's pod-resources API v1 (PodResourcesLister/List on its unix socket), as a client:
// the one place that dials it and makes the call. The exporter's pod attribution keeps a
// connection open across refreshes; the memory-limit janitor lists once per cycle.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"
#include "podresources_v1.grpc.pb.h"

namespace gpulet::deviceplugin {

inline constexpr const char* kPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock";

// A stub on `socket` (messages up to 16 MiB: a node with many pods lists many devices).
std::unique_ptr<v1::PodResourcesLister::Stub> PodResourcesStub(const std::string& socket);

// One List call with `timeout`. kUnavailable (naming the socket) when it fails.
Result<v1::ListPodResourcesResponse> ListPodResources(v1::PodResourcesLister::StubInterface& stub,
                                                      const std::string& socket,
                                                      std::chrono::milliseconds timeout);

}  // namespace gpulet::deviceplugin
