// ParseClaim: what the plugin keeps from a resource.k8s.io/v1 ResourceClaim, and hostile claims
// refused with the field named.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "dra/claim.h"
#include "dra/test_claims.h"

namespace gpulet::dra {
namespace {

using testing::MakeClaimObject;
using testing::TestClaim;
using testing::TestResult;

TestClaim Basic() {
  TestClaim c;
  c.name = "gpu-claim";
  c.uid = "uid-1";
  c.node = "node-1";
  c.results = {TestResult{"gpu", "gpu-0"}, TestResult{"share/small", "gpu-1-mem", "share-7", "20Gi"},
               TestResult{"nic", "eth0", "", "", "net.example.com"}};
  return c;
}

TEST(ParseClaim, KeepsThisDriversResultsConfigsAndConsumers) {
  TestClaim c = Basic();
  c.config = nlohmann::json::array(
      {{{"source", "FromClaim"},
        {"requests", {"gpu"}},
        {"opaque", {{"driver", kDriverName}, {"parameters", {{"sharing", "timeSlicing"}}}}}},
       {{"source", "FromClass"},
        {"opaque", {{"driver", kDriverName}, {"parameters", {{"a", 1}}}}}},
       {{"source", "FromClaim"},
        {"opaque", {{"driver", "net.example.com"}, {"parameters", {{"b", 2}}}}}}});
  Result<Claim> claim = ParseClaim(MakeClaimObject(c));
  ASSERT_TRUE(claim.ok()) << claim.status().message();
  EXPECT_EQ(claim->ref.namespace_, "default");
  EXPECT_EQ(claim->ref.name, "gpu-claim");
  EXPECT_EQ(claim->ref.uid, "uid-1");
  EXPECT_TRUE(claim->allocated);
  EXPECT_FALSE(claim->deleting);
  ASSERT_EQ(claim->devices.size(), 2u);  // the NIC is another driver's
  EXPECT_EQ(claim->devices[0].device, "gpu-0");
  EXPECT_EQ(claim->devices[0].pool, "node-1");
  EXPECT_EQ(claim->devices[1].request, "share/small");
  EXPECT_EQ(claim->devices[1].share_id, "share-7");
  EXPECT_EQ(claim->devices[1].consumed.at("memory"), 20LL << 30);
  ASSERT_EQ(claim->configs.size(), 2u);
  EXPECT_TRUE(claim->configs[0].from_class);  // class configs first
  EXPECT_EQ(claim->configs[0].parameters_json, R"({"a":1})");
  EXPECT_FALSE(claim->configs[1].from_class);
  EXPECT_EQ(claim->configs[1].requests, std::vector<std::string>{"gpu"});
  EXPECT_NE(claim->configs[1].where.find("status.allocation.devices.config[0]"), std::string::npos);
  EXPECT_EQ(claim->reserved_for_uids, std::vector<std::string>{"pod-uid-1"});
  EXPECT_EQ(claim->node_names, std::vector<std::string>{"node-1"});
}

TEST(ParseClaim, UnallocatedAndDeleting) {
  TestClaim c = Basic();
  c.allocated = false;
  c.reserved_for.clear();
  nlohmann::json obj = MakeClaimObject(c);
  obj["metadata"]["deletionTimestamp"] = "2026-12-04T10:00:00Z";
  Result<Claim> claim = ParseClaim(obj);
  ASSERT_TRUE(claim.ok()) << claim.status().message();
  EXPECT_FALSE(claim->allocated);
  EXPECT_TRUE(claim->deleting);
  EXPECT_TRUE(claim->devices.empty());
  EXPECT_TRUE(claim->reserved_for_uids.empty());
}

// Each hostile edit is refused, the error naming the claim and the field.
TEST(ParseClaim, HostileClaimsNameTheField) {
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    const char* field;
  };
  const std::vector<Case> cases = {
      {"no uid", [](nlohmann::json& o) { o["metadata"].erase("uid"); }, "metadata.uid: missing"},
      {"name not a string", [](nlohmann::json& o) { o["metadata"]["name"] = 5; },
       "metadata.name: not a string"},
      {"long namespace", [](nlohmann::json& o) { o["metadata"]["namespace"] = std::string(64, 'a'); },
       "metadata.namespace: longer than 63"},
      {"results not a list",
       [](nlohmann::json& o) { o["status"]["allocation"]["devices"]["results"] = "x"; },
       "status.allocation.devices.results: not a list"},
      {"33 results",
       [](nlohmann::json& o) {
         auto& r = o["status"]["allocation"]["devices"]["results"];
         const nlohmann::json first = r[0];
         while (r.size() < 33) r.push_back(first);
       },
       "status.allocation.devices.results: 33 entries, more than the API's 32"},
      {"device too long",
       [](nlohmann::json& o) {
         o["status"]["allocation"]["devices"]["results"][0]["device"] = std::string(64, 'g');
       },
       "status.allocation.devices.results[0].device: longer than 63"},
      {"bad request name",
       [](nlohmann::json& o) {
         o["status"]["allocation"]["devices"]["results"][1]["request"] = "a/b/c";
       },
       "status.allocation.devices.results[1].request: \"a/b/c\" is not a request name"},
      {"negative capacity",
       [](nlohmann::json& o) {
         o["status"]["allocation"]["devices"]["results"][1]["consumedCapacity"]["memory"] = "-1Gi";
       },
       "status.allocation.devices.results[1].consumedCapacity[memory]"},
      {"fractional capacity",
       [](nlohmann::json& o) {
         o["status"]["allocation"]["devices"]["results"][1]["consumedCapacity"]["memory"] = "1500m";
       },
       "consumedCapacity[memory]"},
      {"adminAccess not a boolean",
       [](nlohmann::json& o) {
         o["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = "yes";
       },
       "results[0].adminAccess: not a boolean"},
      {"257 consumers",
       [](nlohmann::json& o) {
         auto& r = o["status"]["reservedFor"];
         const nlohmann::json first = r[0];
         while (r.size() < 257) r.push_back(first);
       },
       "status.reservedFor: 257 entries, more than the API's 256"},
      {"consumer without uid",
       [](nlohmann::json& o) { o["status"]["reservedFor"][0].erase("uid"); },
       "status.reservedFor[0].uid: missing"},
      {"opaque parameters over 10 KiB",
       [](nlohmann::json& o) {
         o["status"]["allocation"]["devices"]["config"] = nlohmann::json::array(
             {{{"source", "FromClaim"},
               {"opaque", {{"driver", kDriverName}, {"parameters", {{"x", std::string(10240, 'x')}}}}}}});
       },
       "status.allocation.devices.config[0].opaque.parameters: larger than 10 KiB"},
      {"bad config source",
       [](nlohmann::json& o) {
         o["status"]["allocation"]["devices"]["config"] = nlohmann::json::array(
             {{{"source", "FromNowhere"}, {"opaque", {{"driver", kDriverName}, {"parameters", {}}}}}});
       },
       "config[0].source: \"FromNowhere\" is neither FromClass nor FromClaim"},
      {"node selector values not names",
       [](nlohmann::json& o) {
         o["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]
          ["values"] = {1};
       },
       "nodeSelectorTerms[0].matchFields[0].values: not a node name"},
      {"allocation not an object", [](nlohmann::json& o) { o["status"]["allocation"] = 1; },
       "status.allocation: not an object"},
      {"kind", [](nlohmann::json& o) { o["kind"] = "Pod"; }, "kind: \"Pod\", not ResourceClaim"},
  };
  for (const Case& c : cases) {
    nlohmann::json obj = MakeClaimObject(Basic());
    c.edit(obj);
    Result<Claim> claim = ParseClaim(obj);
    ASSERT_FALSE(claim.ok()) << c.what;
    EXPECT_EQ(claim.status().code(), ErrorCode::kInvalidInput) << c.what;
    EXPECT_NE(claim.status().message().find(c.field), std::string::npos)
        << c.what << ": " << claim.status().message();
    if (std::string(c.what) != "no uid" && std::string(c.what) != "name not a string" &&
        std::string(c.what) != "long namespace" && std::string(c.what) != "kind") {
      EXPECT_NE(claim.status().message().find("ResourceClaim default/gpu-claim"), std::string::npos)
          << claim.status().message();
    }
  }
}

TEST(ParseClaimJson, BoundsTheText) {
  EXPECT_EQ(ParseClaimJson("{not json").status().code(), ErrorCode::kInvalidInput);
  EXPECT_NE(ParseClaimJson(std::string(kMaxClaimBytes + 1, ' ')).status().message().find("more than"),
            std::string::npos);
  std::string deep(100000, '[');
  EXPECT_NE(ParseClaimJson(deep).status().message().find("deeper than 64"), std::string::npos);
  Result<Claim> ok = ParseClaimJson(MakeClaimObject(Basic()).dump());
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->devices.size(), 2u);
}

}  // namespace
}  // namespace gpulet::dra
