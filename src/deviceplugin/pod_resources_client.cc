#include "deviceplugin/pod_resources_client.h"

#include <grpcpp/grpcpp.h>

namespace gpulet::deviceplugin {

std::unique_ptr<v1::PodResourcesLister::Stub> PodResourcesStub(const std::string& socket) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 16 * 1024 * 1024);
  return v1::PodResourcesLister::NewStub(
      grpc::CreateCustomChannel("unix://" + socket, grpc::InsecureChannelCredentials(), args));
}

Result<v1::ListPodResourcesResponse> ListPodResources(v1::PodResourcesLister::StubInterface& stub,
                                                      const std::string& socket,
                                                      std::chrono::milliseconds timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  v1::ListPodResourcesRequest req;
  v1::ListPodResourcesResponse resp;
  grpc::Status s = stub.List(&ctx, req, &resp);
  if (!s.ok()) {
    return Status(ErrorCode::kUnavailable,
                  "pod-resources List on " + socket + ": " + s.error_message());
  }
  return resp;
}

}  // namespace gpulet::deviceplugin
