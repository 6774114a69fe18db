#include "metrics/http_server.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

namespace gpulet::metrics {
namespace {

constexpr char kHash[] = "$2y$04$MiDM8uS.jofjwf1Go9KEoeCzCbjf0ak.3PVmsjmmOOk8OYgDL7V8O";  // "s3cret"

std::shared_ptr<const Snapshot> OneGpu() {
  auto s = std::make_shared<Snapshot>();
  auto set = ParseCounters("DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n"
                           "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, Energy (in mJ).\n", "t.csv");
  s->counters = std::make_shared<const CounterSet>(std::move(set).value());
  EntitySample e;
  e.gpu = {0, "GPU-0", "00000000:10:00.0", "H100"};
  e.values = {Value::Int(42), Value::Int(7)};
  s->entities.push_back(e);
  s->gpus.push_back({e.gpu, true, ""});
  return s;
}

TEST(ListenAddress, Parses) {
  EXPECT_EQ(*ParseListenAddress(":9400"), std::make_pair(std::string("0.0.0.0"), 9400));
  EXPECT_EQ(*ParseListenAddress("127.0.0.1:0"), std::make_pair(std::string("127.0.0.1"), 0));
  EXPECT_EQ(*ParseListenAddress("[::1]:9400"), std::make_pair(std::string("::1"), 9400));
  EXPECT_EQ(ParseListenAddress("9400").status().code(), ErrorCode::kUsage);
  EXPECT_EQ(ParseListenAddress(":http").status().code(), ErrorCode::kUsage);
  EXPECT_EQ(ParseListenAddress(":70000").status().code(), ErrorCode::kUsage);
}

TEST(MetricsServer, ServesTextOpenMetricsAndHealth) {
  Publisher pub;
  HttpOptions opts;
  opts.address = "127.0.0.1:0";
  MetricsServer server(pub, opts);
  ASSERT_TRUE(server.Start().ok());
  httplib::Client cli("127.0.0.1", server.port());
  auto r = cli.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);  // nothing collected yet
  EXPECT_EQ(cli.Get("/health")->status, 503);

  pub.SetSnapshot(OneGpu());
  r = cli.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), kText004ContentType);
  EXPECT_NE(r->body.find("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"), std::string::npos);
  EXPECT_NE(r->body.find("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\"GPU-0\""), std::string::npos);
  EXPECT_EQ(r->body, pub.Current()->text);

  r = cli.Get("/metrics", {{"Accept", "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->get_header_value("Content-Type"), kOpenMetricsContentType);
  EXPECT_EQ(r->body, pub.Current()->openmetrics);
  EXPECT_NE(r->body.find("# EOF\n"), std::string::npos);

  r = cli.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(pub.Current()->series, 3u);  // two DCGM series + gpulet_gpu_up
  server.Stop();
}

TEST(MetricsServer, BusyPortIsUnavailable) {
  Publisher pub;
  MetricsServer first(pub, {"127.0.0.1:0"});
  ASSERT_TRUE(first.Start().ok());
  MetricsServer second(pub, {"127.0.0.1:" + std::to_string(first.port())});
  EXPECT_EQ(second.Start().code(), ErrorCode::kUnavailable);
}

class TlsAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpulet-tls-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(TlsAuthTest, BasicAuthOverPlainHttp) {
  std::ofstream(dir_ + "/web.yml") << "basic_auth_users:\n  alice: " << kHash << "\n";
  Publisher pub;
  pub.SetSnapshot(OneGpu());
  MetricsServer server(pub, {"127.0.0.1:0", dir_ + "/web.yml"});
  ASSERT_TRUE(server.Start().ok());
  httplib::Client cli("127.0.0.1", server.port());
  auto r = cli.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(r->get_header_value("WWW-Authenticate"), "Basic");
  cli.set_basic_auth("alice", "wrong");
  EXPECT_EQ(cli.Get("/metrics")->status, 401);
  cli.set_basic_auth("alice", "s3cret");
  r = cli.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, pub.Current()->text);
}

TEST_F(TlsAuthTest, TlsWithSelfSignedCertificate) {
  const std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
                          "-keyout " + dir_ + "/s.key -out " + dir_ + "/s.crt >/dev/null 2>&1";
  // openssl is one of the packages `make test` installs: its absence is a broken setup, not a skip.
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "openssl CLI failed: " << cmd;
  std::ofstream(dir_ + "/web.yml") << "tls_server_config:\n  cert_file: s.crt\n  key_file: s.key\n"
                                      "  min_version: TLS12\n";
  Publisher pub;
  pub.SetSnapshot(OneGpu());
  MetricsServer server(pub, {"127.0.0.1:0", dir_ + "/web.yml"});
  ASSERT_TRUE(server.Start().ok());
  EXPECT_TRUE(server.tls());
  httplib::SSLClient tls("127.0.0.1", server.port());
  tls.set_ca_cert_path((dir_ + "/s.crt").c_str());
  tls.enable_server_certificate_verification(false);  // CN is localhost, we dial an IP
  auto r = tls.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, pub.Current()->text);
  // Plain HTTP against the TLS port gets no metrics.
  httplib::Client plain("127.0.0.1", server.port());
  auto p = plain.Get("/metrics");
  EXPECT_TRUE(!p || p->status != 200);
}

TEST_F(TlsAuthTest, BadCertificateIsInvalidInput) {
  std::ofstream(dir_ + "/web.yml") << "tls_server_config:\n  cert_file: none.crt\n  key_file: none.key\n";
  Publisher pub;
  MetricsServer server(pub, {"127.0.0.1:0", dir_ + "/web.yml"});
  EXPECT_EQ(server.Start().code(), ErrorCode::kInvalidInput);
}

}  // namespace
}  // namespace gpulet::metrics
