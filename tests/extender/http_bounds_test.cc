// Issue 23: the extender's HTTP side under abuse. 64 clients sending bodies of the largest
// accepted size leave the process under the Deployment's memory limit and the scheduler
// answered; a connection flood never evicts a request whose handler is running (a bind).
// Memory is measured, not time: the peak RSS of this process (the extender runs in it), read
// from /proc/self/status after resetting it through /proc/self/clear_refs.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <future>
#include <thread>

#include "apiserver/fake_apiserver.h"
#include "extender/service.h"
#include "extender/test_objects.h"
#include "metrics/collector.h"
#include "metrics/http_server.h"
#include "support/wait_until.h"

namespace gpulet::extender {
namespace {

using gpulet::testing::FakeApiServer;
using nlohmann::json;
using namespace testobjects;

constexpr int64_t kDeployMemoryLimit = int64_t{512} << 20;  // deploy/extender/deployment.yaml

// Peak resident set since the last reset, in bytes.
int64_t PeakRss() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}
void ResetPeakRss() { std::ofstream("/proc/self/clear_refs") << "5"; }

// A blocking POST on its own TCP connection, the body sent from the caller's buffer (no copy);
// `declared`: the Content-Length sent (the body's size when negative). Returns the status code,
// 0 when the connection failed.
int RawPost(int port, const std::string& path, const std::string& body, long declared = -1) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  timeval tv{120, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int status = 0;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string head =
        "POST " + path +
        " HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\n"
        "Content-Length: " +
        std::to_string(declared < 0 ? body.size() : static_cast<size_t>(declared)) +
        "\r\nConnection: close\r\n\r\n";
    bool ok =
        ::send(fd, head.data(), head.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(head.size());
    for (size_t sent = 0; ok && sent < body.size();) {
      const ssize_t n = ::send(fd, body.data() + sent, body.size() - sent, MSG_NOSIGNAL);
      ok = n > 0;
      if (ok) sent += static_cast<size_t>(n);
    }
    std::string reply;
    char buf[4096];
    for (ssize_t n; ok && (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) {
      reply.append(buf, static_cast<size_t>(n));
      if (reply.size() > 12) break;
    }
    if (reply.rfind("HTTP/1.1 ", 0) == 0) status = std::atoi(reply.c_str() + 9);
  }
  ::close(fd);
  return status;
}

// ExtenderArgs of exactly `size` bytes: a real pod, node-cache mode, and the rest of the bytes in
// a Pod field the extender does not read (a 2-byte-per-element array: the costliest shape for a
// DOM, some 16 bytes per element).
std::string MaximalArgs(size_t size) {
  json pod = MemoryPod("flood", {10});
  const std::string prefix = "{\"Pod\":" + pod.dump().substr(0, pod.dump().size() - 1) + ",\"x\":[";
  const std::string suffix = "0]},\"Nodes\":null,\"NodeNames\":[\"n1\"]}";
  std::string body = prefix;
  body.reserve(size);
  while (body.size() + 2 + suffix.size() <= size) body += "0,";
  body += suffix;
  body.insert(prefix.size() - 1, size - body.size(), ' ');  // exact size: pad before the array
  return body;
}

TEST(ExtenderBounds, SixtyFourClientsWithMaximalBodiesStayUnderTheMemoryLimit) {
  std::string tmpl = ::testing::TempDir() + "gpulet-bounds-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  auto pki = gpulet::testing::MakeTestPki(tmpl);
  ASSERT_TRUE(pki.ok()) << pki.status().message();
  auto api = FakeApiServer::Start(*pki, {});
  ASSERT_TRUE(api.ok()) << api.status().message();
  k8s::Client client((*api)->Access(*pki));
  (*api)->Put("/api/v1/nodes/n1", {{"metadata", {{"name", "n1"}}}});
  (*api)->Put("/api/v1/namespaces/gpulet-system/configmaps/gpulet-memory-n1",
              MemoryConfigMap("n1", MemoryJson("n1", {{80, 80}}).dump()));
  FakeClock clock;
  ServiceOptions o;  // the deployed bounds
  o.address = "127.0.0.1:0";
  Service service(client, clock, o);
  ASSERT_TRUE(service.Start().ok());
  const int port = service.port();

  const std::string body = MaximalArgs(o.max_body_bytes);
  ASSERT_EQ(body.size(), kMaxBodyBytes);
  ASSERT_EQ(json::parse(body)["NodeNames"], json::array({"n1"}));  // a well-formed request
  // One byte more is refused on its headers, unread.
  EXPECT_EQ(RawPost(port, "/filter", "", static_cast<long>(kMaxBodyBytes) + 1), 413);

  ResetPeakRss();
  std::atomic<int> answered{0}, other{0};
  std::vector<std::thread> flood;
  for (int i = 0; i < 64; ++i) {
    flood.emplace_back([&] {
      for (int round = 0; round < 2; ++round) {
        (RawPost(port, round == 0 ? "/filter" : "/prioritize", body) == 200 ? answered : other)++;
      }
    });
  }
  // The scheduler, meanwhile: answered.
  httplib::Client scheduler("127.0.0.1", port);
  scheduler.set_read_timeout(120, 0);
  for (int i = 0; i < 3; ++i) {
    auto r =
        scheduler.Post("/filter", CacheModeArgs(MemoryPod("p", {20}), {"n1"}), "application/json");
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(json::parse(r->body)["NodeNames"], json::array({"n1"}));
  }
  for (auto& t : flood) t.join();
  const int64_t peak = PeakRss();
  EXPECT_EQ(answered.load(), 128);  // every flood request answered too, in turn
  EXPECT_EQ(other.load(), 0);
  EXPECT_GT(peak, 0);
  EXPECT_LT(peak, kDeployMemoryLimit) << "peak RSS " << (peak >> 20) << " MiB";
  RecordProperty("peak_rss_mib", std::to_string(peak >> 20));
  std::printf("peak RSS with 64 clients x %zu-byte bodies: %lld MiB\n", body.size(),
              static_cast<long long>(peak >> 20));
  auto h = scheduler.Get("/healthz");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

// A flood of new connections while a bind's handler runs: the bind's connection is not the one
// closed to make room (its client is quiet because it waits for the answer).
TEST(ExtenderBounds, AConnectionFloodDoesNotEvictAnInFlightBind) {
  metrics::Publisher publisher;
  metrics::HttpOptions o;
  o.address = "127.0.0.1:0";
  o.max_connections = 4;
  o.threads = 1;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> entered{false};
  o.post_routes["/bind"] = [&](const std::string&) {
    entered = true;
    released.wait();
    return metrics::HttpOptions::PostReply{200, "application/json", "{\"Error\":\"\"}"};
  };
  metrics::MetricsServer server(publisher, o);
  ASSERT_TRUE(server.Start().ok());
  std::promise<int> bind_status;
  std::thread bind([&] {
    httplib::Client c("127.0.0.1", server.port());
    c.set_read_timeout(60, 0);
    auto r = c.Post("/bind", "{}", "application/json");
    bind_status.set_value(r ? r->status : 0);
  });
  ASSERT_TRUE(gpulet::testing::WaitUntil([&] { return entered.load(); }, std::chrono::seconds(15)));
  std::vector<int> fds;
  for (int i = 0; i < 16; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(server.port()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    fds.push_back(fd);
  }
  // Every one of them accepted (and the server made room for each), then the bind returns.
  ASSERT_TRUE(gpulet::testing::WaitUntil([&] { return server.stats().accepted >= 17; },
                                         std::chrono::seconds(15)));
  EXPECT_GE(server.stats().evicted + server.stats().refused, 13u);
  release.set_value();
  EXPECT_EQ(bind_status.get_future().get(), 200);
  bind.join();
  for (int fd : fds) ::close(fd);
}

}  // namespace
}  // namespace gpulet::extender
