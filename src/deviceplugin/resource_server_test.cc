#include "deviceplugin/resource_server.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>

#include "deviceplugin/test_inventories.h"

namespace gpulet::deviceplugin {
namespace {

using namespace std::chrono_literals;

TEST(DeviceListTest, HealthAndTopology) {
  gpu::Inventory inv = testing::DgxH100Like();
  sharing::Resource r = testing::GpuResource(inv);
  gpu::HealthSnapshot snap;
  snap.devices[inv.gpus[3].uuid] = gpu::DeviceHealth{false, "XID 79"};
  v1beta1::ListAndWatchResponse list = DeviceList(r, snap);
  ASSERT_EQ(list.devices_size(), 8);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(list.devices(i).id(), inv.gpus[i].uuid);
    EXPECT_EQ(list.devices(i).health(), i == 3 ? "Unhealthy" : "Healthy");
    ASSERT_EQ(list.devices(i).topology().nodes_size(), 1);
    EXPECT_EQ(list.devices(i).topology().nodes(0).id(), i < 4 ? 0 : 1);
  }
}

TEST(DeviceListTest, MigDeviceFollowsParent) {
  sharing::Resource r;
  r.name = "nvidia.com/mig-1g.10gb";
  sharing::AdvertisedDevice d;
  d.id = d.uuid = "MIG-a";
  d.parent_uuid = "GPU-p";
  r.devices.push_back(d);
  gpu::HealthSnapshot snap;
  EXPECT_EQ(DeviceList(r, snap).devices(0).health(), "Healthy");
  EXPECT_FALSE(DeviceList(r, snap).devices(0).has_topology());
  snap.devices["GPU-p"] = gpu::DeviceHealth{false, "GPU is lost"};
  EXPECT_EQ(DeviceList(r, snap).devices(0).health(), "Unhealthy");
}

class ResourceServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpulet-rs-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    socket_ = dir_ + "/nvidia-gpu.sock";
    inv_ = std::make_shared<gpu::Inventory>(testing::DgxH100Like());
    for (const auto& g : inv_->gpus) board_.Update({{g.uuid, gpu::DeviceHealth{}}});
    server_ = std::make_unique<ResourceServer>(testing::GpuResource(*inv_), inv_, AllocateOptions{},
                                               board_, socket_);
    ASSERT_TRUE(server_->Start().ok());
    stub_ = v1beta1::DevicePlugin::NewStub(
        grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::string dir_, socket_;
  std::shared_ptr<gpu::Inventory> inv_;
  gpu::HealthBoard board_;
  std::unique_ptr<ResourceServer> server_;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub_;
};

TEST_F(ResourceServerTest, OptionsAllocateAndErrors) {
  grpc::ClientContext c1;
  v1beta1::DevicePluginOptions opts;
  ASSERT_TRUE(stub_->GetDevicePluginOptions(&c1, v1beta1::Empty(), &opts).ok());
  EXPECT_TRUE(opts.get_preferred_allocation_available());
  EXPECT_FALSE(opts.pre_start_required());

  grpc::ClientContext c2;
  v1beta1::AllocateRequest req;
  req.add_container_requests()->add_devices_ids(inv_->gpus[2].uuid);
  v1beta1::AllocateResponse resp;
  ASSERT_TRUE(stub_->Allocate(&c2, req, &resp).ok());
  ASSERT_EQ(resp.container_responses_size(), 1);
  EXPECT_EQ(resp.container_responses(0).envs().at("NVIDIA_VISIBLE_DEVICES"), inv_->gpus[2].uuid);

  grpc::ClientContext c3;
  v1beta1::AllocateRequest bad;
  bad.add_container_requests()->add_devices_ids("GPU-unknown");
  grpc::Status st = stub_->Allocate(&c3, bad, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("GPU-unknown"), std::string::npos);

  grpc::ClientContext c4;
  v1beta1::PreferredAllocationRequest preq;
  auto* cr = preq.add_container_requests();
  for (const auto& g : inv_->gpus) cr->add_available_deviceids(g.uuid);
  cr->add_must_include_deviceids(inv_->gpus[6].uuid);
  cr->set_allocation_size(2);
  v1beta1::PreferredAllocationResponse presp;
  ASSERT_TRUE(stub_->GetPreferredAllocation(&c4, preq, &presp).ok());
  ASSERT_EQ(presp.container_responses_size(), 1);
  ASSERT_EQ(presp.container_responses(0).deviceids_size(), 2);
  EXPECT_EQ(presp.container_responses(0).deviceids(0), inv_->gpus[4].uuid);
  EXPECT_EQ(presp.container_responses(0).deviceids(1), inv_->gpus[6].uuid);
}

TEST_F(ResourceServerTest, ListAndWatchFollowsHealthAndEndsOnStop) {
  grpc::ClientContext ctx;
  auto reader = stub_->ListAndWatch(&ctx, v1beta1::Empty());
  v1beta1::ListAndWatchResponse list;
  ASSERT_TRUE(reader->Read(&list));
  ASSERT_EQ(list.devices_size(), 8);
  for (const auto& d : list.devices()) EXPECT_EQ(d.health(), "Healthy");

  board_.Update({{inv_->gpus[5].uuid, gpu::DeviceHealth{false, "XID 79"}}});
  ASSERT_TRUE(reader->Read(&list));
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(list.devices(i).health(), i == 5 ? "Unhealthy" : "Healthy") << i;
  }
  // A change to a device this resource does not advertise sends nothing; recovery does.
  board_.Update({{"GPU-other", gpu::DeviceHealth{false, "x"}}});
  board_.Update({{inv_->gpus[5].uuid, gpu::DeviceHealth{}}});
  ASSERT_TRUE(reader->Read(&list));
  EXPECT_EQ(list.devices(5).health(), "Healthy");

  EXPECT_TRUE(std::filesystem::exists(socket_));
  server_->Stop();
  EXPECT_FALSE(reader->Read(&list));
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_FALSE(std::filesystem::exists(socket_));
}

TEST_F(ResourceServerTest, NoticesDeletedSocket) {
  EXPECT_TRUE(server_->SocketPresent());
  std::filesystem::remove(socket_);
  EXPECT_FALSE(server_->SocketPresent());
  server_->Stop();
  ASSERT_TRUE(server_->Start().ok());
  EXPECT_TRUE(server_->SocketPresent());
}

}  // namespace
}  // namespace gpulet::deviceplugin
