#include "metrics/http_server.h"
#include "metrics/http_test_socket.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace gpulet::metrics {
namespace {

constexpr char kHash[] =
    "$2y$04$MiDM8uS.jofjwf1Go9KEoeCzCbjf0ak.3PVmsjmmOOk8OYgDL7V8O";  // "s3cret"

std::shared_ptr<const Snapshot> OneGpu() {
  auto s = std::make_shared<Snapshot>();
  auto set = ParseCounters(
      "DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n"
      "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, Energy (in mJ).\n",
      "t.csv");
  s->counters = std::make_shared<const CounterSet>(std::move(set).value());
  EntitySample e;
  e.gpu = {0, "GPU-0", "00000000:10:00.0", "H100"};
  e.values = {Value::Int(42), Value::Int(7)};
  s->entities.push_back(e);
  s->gpus.push_back({e.gpu, true, ""});
  return s;
}

using testing::Dial;
using testing::Send;

// Reads one response's headers and Content-Length body ("" when the server closed instead).
// One response. Bytes that arrive past it (a pipelined next response in the same segment) go to
// `*rest` when given, and the next call starts from them; without `rest` they are dropped.
std::string ReadResponse(int fd, std::string* rest = nullptr) {
  std::string in;
  if (rest != nullptr) in.swap(*rest);
  char buf[4096];
  for (;;) {
    const size_t end = in.find("\r\n\r\n");
    if (end != std::string::npos) {
      const size_t cl = in.find("Content-Length: ");
      const size_t len = cl == std::string::npos || cl > end ? 0 : std::stoul(in.substr(cl + 16));
      if (in.size() >= end + 4 + len) {
        if (rest != nullptr) *rest = in.substr(end + 4 + len);
        return in.substr(0, end + 4 + len);
      }
    }
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return in;
    in.append(buf, static_cast<size_t>(n));
  }
}

std::string Request(int fd, const std::string& path, const std::string& extra = "") {
  Send(fd, "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + extra + "\r\n");
  return ReadResponse(fd);
}

// True when the server closed the connection (EOF, not a timeout).
bool ClosedByServer(int fd) {
  char c;
  return ::recv(fd, &c, 1, 0) == 0;
}

// Defect: four workers and a 30 s keep-alive; four idle keep-alive clients held every worker and
// /health (the liveness probe) went unanswered.
TEST(MetricsServer, IdleKeepAliveClientsDoNotBlockHealth) {
  Publisher pub;
  pub.SetSnapshot(OneGpu());
  HttpOptions opts;
  opts.address = "127.0.0.1:0";
  MetricsServer server(pub, opts);
  ASSERT_TRUE(server.Start().ok());
  std::vector<int> idle;
  for (int i = 0; i < 16; ++i) {
    idle.push_back(Dial(server.port()));
    ASSERT_NE(Request(idle.back(), "/health").find("200 OK"), std::string::npos);
  }
  const int probe = Dial(server.port());
  const std::string r = Request(probe, "/health");
  EXPECT_NE(r.find("HTTP/1.1 200 OK"), std::string::npos) << r;
  EXPECT_NE(r.find("\r\n\r\nOK\n"), std::string::npos) << r;
  ::close(probe);
  for (int fd : idle) ::close(fd);
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
  EXPECT_NE(r->body.find("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"),
            std::string::npos);
  EXPECT_NE(r->body.find("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\"GPU-0\""), std::string::npos);
  EXPECT_EQ(r->body, pub.Current()->text);

  r = cli.Get("/metrics",
              {{"Accept", "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->get_header_value("Content-Type"), kOpenMetricsContentType);
  EXPECT_EQ(r->body, pub.Current()->openmetrics);
  EXPECT_NE(r->body.find("# EOF\n"), std::string::npos);

  r = cli.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(pub.Current()->series, 4u);  // two DCGM series, gpulet_gpu_up, gpulet_simulated_driver
  server.Stop();
}

TEST(MetricsServer, HugeHeadersAreRefusedAndTheConnectionClosed) {
  Publisher pub;
  pub.SetSnapshot(OneGpu());
  HttpOptions opts;
  opts.address = "127.0.0.1:0";
  MetricsServer server(pub, opts);
  ASSERT_TRUE(server.Start().ok());
  const int fd = Dial(server.port());
  std::string huge = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
  while (huge.size() < (1u << 20)) huge += "X-Filler: " + std::string(100, 'f') + "\r\n";
  Send(fd, huge + "\r\n");
  const std::string r = ReadResponse(fd);
  EXPECT_NE(r.find("HTTP/1.1 431 "), std::string::npos) << r.substr(0, 200);
  ::close(fd);
  EXPECT_EQ(server.stats().too_large, 1u);
  // Served as before.
  const int ok = Dial(server.port());
  EXPECT_NE(Request(ok, "/health").find("200 OK"), std::string::npos);
  ::close(ok);
}

TEST(MetricsServer, SlowHeadersAreCutAtTheRequestTimeout) {
  Publisher pub;
  pub.SetSnapshot(OneGpu());
  HttpOptions opts;
  opts.address = "127.0.0.1:0";
  opts.request_timeout = std::chrono::milliseconds(300);
  MetricsServer server(pub, opts);
  ASSERT_TRUE(server.Start().ok());
  const int slow = Dial(server.port());
  Send(slow, "GET /metrics HTTP/1.1\r\nX-Slow: a");
  // Whatever it sends later, the headers never complete: the server hangs up.
  EXPECT_TRUE(ClosedByServer(slow));
  ::close(slow);
  EXPECT_GE(server.stats().timed_out, 1u);
}

TEST(MetricsServer, ConnectionsBeyondTheLimitEvictTheQuietest) {
  Publisher pub;
  pub.SetSnapshot(OneGpu());
  HttpOptions opts;
  opts.address = "127.0.0.1:0";
  opts.max_connections = 4;
  MetricsServer server(pub, opts);
  ASSERT_TRUE(server.Start().ok());
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) {
    idle.push_back(Dial(server.port()));
    ASSERT_NE(Request(idle.back(), "/health").find("200 OK"), std::string::npos);
  }
  const int fresh = Dial(server.port());
  EXPECT_NE(Request(fresh, "/metrics").find("200 OK"), std::string::npos);
  EXPECT_TRUE(ClosedByServer(idle.front()));  // the one quiet the longest made room
  EXPECT_EQ(server.stats().evicted, 1u);
  ::close(fresh);
  for (int fd : idle) ::close(fd);
}

TEST(MetricsServer, BodiesAndOtherMethodsAreRefused) {
  Publisher pub;
  pub.SetSnapshot(OneGpu());
  MetricsServer server(pub, {"127.0.0.1:0"});
  ASSERT_TRUE(server.Start().ok());
  int fd = Dial(server.port());
  Send(fd, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
  EXPECT_NE(ReadResponse(fd).find(" 413 "), std::string::npos);
  ::close(fd);
  fd = Dial(server.port());
  EXPECT_NE(Request(fd, "/nope").find(" 404 "), std::string::npos);
  // Pipelined requests on one connection are answered in order.
  Send(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string both;
  char buf[4096];
  while (both.find("</html>") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    both.append(buf, static_cast<size_t>(n));
  }
  const size_t ok = both.find("\r\n\r\nOK\n");
  EXPECT_NE(ok, std::string::npos) << both;
  EXPECT_GT(both.find("gpulet exporter"), ok) << both;
  ::close(fd);
}

// POST routes (the scheduler extender's verbs): the body arrives whole, in pieces or pipelined,
// the handler runs off the event thread, and only the named paths take a body.
TEST(MetricsServer, PostRoutesReceiveTheirBody) {
  Publisher pub;
  HttpOptions opts;
  opts.address = "127.0.0.1:0";
  opts.max_body_bytes = 64;
  opts.post_routes["/echo"] = [](const std::string& body) {
    return HttpOptions::PostReply{200, "application/json", "[" + body + "]"};
  };
  opts.post_routes["/teapot"] = [](const std::string&) {
    return HttpOptions::PostReply{400, "text/plain", "no\n"};
  };
  MetricsServer server(pub, opts);
  ASSERT_TRUE(server.Start().ok());
  int fd = Dial(server.port());
  Send(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhello");
  Send(fd, " world");
  std::string r = ReadResponse(fd);
  EXPECT_NE(r.find("200 OK"), std::string::npos) << r;
  EXPECT_NE(r.find("\r\n\r\n[hello world]"), std::string::npos) << r;
  // Two pipelined POSTs on the kept-alive connection, answered in order (both answers may come
  // in one segment: the reader keeps the second).
  Send(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\naPOST /teapot HTTP/1.1\r\n"
           "Host: x\r\nContent-Length: 1\r\n\r\nb");
  std::string rest;
  r = ReadResponse(fd, &rest);
  EXPECT_NE(r.find("\r\n\r\n[a]"), std::string::npos) << r;
  r = ReadResponse(fd, &rest);
  EXPECT_NE(r.find(" 400 "), std::string::npos) << r;
  ::close(fd);
  // Too large, chunked, a POST elsewhere, a GET of a POST route.
  fd = Dial(server.port());
  Send(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 65\r\n\r\n");
  EXPECT_NE(ReadResponse(fd).find(" 413 "), std::string::npos);
  ::close(fd);
  fd = Dial(server.port());
  Send(fd,
       "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n");
  EXPECT_NE(ReadResponse(fd).find(" 411 "), std::string::npos);
  ::close(fd);
  fd = Dial(server.port());
  Send(fd, "POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
  EXPECT_NE(ReadResponse(fd).find(" 405 "), std::string::npos);
  ::close(fd);
  fd = Dial(server.port());
  EXPECT_NE(Request(fd, "/echo").find(" 404 "), std::string::npos);
  ::close(fd);
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
  const std::string cmd =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
      "-keyout " +
      dir_ + "/s.key -out " + dir_ + "/s.crt >/dev/null 2>&1";
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

// A TLS client that sends a request and resets the connection before its answer: the server's
// SSL_write then meets a reset socket, whose SIGPIPE (default action: end the process) ended
// `gpulet extender` under the real kube-scheduler (issue 34). The test process surviving, and the
// server answering afterwards, is the check.
TEST_F(TlsAuthTest, ClientsResettingBeforeTheirAnswerDoNotEndTheProcess) {
  const std::string cmd =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost -keyout " + dir_ +
      "/s.key -out " + dir_ + "/s.crt >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "openssl CLI failed: " << cmd;
  std::ofstream(dir_ + "/web.yml") << "tls_server_config:\n  cert_file: s.crt\n  key_file: s.key\n";
  Publisher pub;
  pub.SetSnapshot(OneGpu());
  MetricsServer server(pub, {"127.0.0.1:0", dir_ + "/web.yml"});
  ASSERT_TRUE(server.Start().ok());
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  ASSERT_NE(ctx, nullptr);
  for (int i = 0; i < 50; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(server.port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    ASSERT_EQ(SSL_connect(ssl), 1);
    const std::string req = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    const int n = static_cast<int>(req.size());
    ASSERT_EQ(SSL_write(ssl, req.data(), n), n);
    const linger reset{1, 0};  // close() sends RST, not FIN
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    SSL_free(ssl);
    ::close(fd);
  }
  SSL_CTX_free(ctx);
  httplib::SSLClient tls("127.0.0.1", server.port());
  tls.enable_server_certificate_verification(false);
  auto r = tls.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST_F(TlsAuthTest, BadCertificateIsInvalidInput) {
  std::ofstream(dir_ + "/web.yml")
      << "tls_server_config:\n  cert_file: none.crt\n  key_file: none.key\n";
  Publisher pub;
  MetricsServer server(pub, {"127.0.0.1:0", dir_ + "/web.yml"});
  EXPECT_EQ(server.Start().code(), ErrorCode::kInvalidInput);
}

// A wrong password is checked (bcrypt) once; retrying it is answered from the cache.
TEST_F(TlsAuthTest, FailedPasswordsAreCheckedOnce) {
  std::ofstream(dir_ + "/web.yml") << "basic_auth_users:\n  alice: " << kHash << "\n";
  Publisher pub;
  pub.SetSnapshot(OneGpu());
  MetricsServer server(pub, {"127.0.0.1:0", dir_ + "/web.yml"});
  ASSERT_TRUE(server.Start().ok());
  httplib::Client cli("127.0.0.1", server.port());
  cli.set_basic_auth("alice", "wrong");
  for (int i = 0; i < 20; ++i) EXPECT_EQ(cli.Get("/metrics")->status, 401);
  EXPECT_EQ(server.stats().auth_checks, 1u);
  cli.set_basic_auth("alice", "s3cret");
  for (int i = 0; i < 5; ++i) EXPECT_EQ(cli.Get("/health")->status, 200);
  EXPECT_EQ(server.stats().auth_checks, 2u);
}

}  // namespace
}  // namespace gpulet::metrics
