// `gpulet node` under HTTP abuse on its metrics port: 10,000 connections, slowloris senders,
// 1 MiB headers and idle keep-alive clients at once, while the kubelet harness keeps allocating
// and a liveness-style probe keeps asking /health on a fresh connection. Before the server was
// bounded, four idle keep-alive clients held its four workers and /health went unanswered.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "testing/kubelet/kubelet_harness.h"
#include "tests/deviceplugin/plugin_process.h"

namespace gpulet::testing {
namespace {

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

int Connect(int port, bool blocking) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (blocking ? 0 : SOCK_NONBLOCK), 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// One request on a fresh connection; the whole response (the server closes: Connection: close).
std::string Get(int port, const std::string& path) {
  const int fd = Connect(port, true);
  if (fd < 0) return "";
  timeval tv{30, 0};  // a hang fails the probe instead of the test run
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string out;
  if (SendAll(fd, "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")) {
    char buf[65536];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

// The descriptors this test may hold at once: the soft RLIMIT_NOFILE raised to the hard limit
// (Debian's default soft limit is 1,024; `ulimit -n` may have lowered both).
rlim_t RaiseOpenFileLimit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return 1024;
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  return lim.rlim_cur;
}

// Held at once besides the flood: 64 idle clients, 200 slowloris senders, one huge-header client,
// the probes, the kubelet harness's sockets and the test's own files.
constexpr size_t kIdleClients = 64, kSlowClients = 200, kOtherDescriptors = 160;
constexpr size_t kMaxWave = 2000;

TEST(MetricsHttpAbuse, HealthAndKubeletKeepWorkingUnderConnectionFloodSlowlorisAndHugeHeaders) {
  // 10,000 connections in waves of up to 2,000 open at once: the wave is sized from the
  // descriptors this process may hold, so the test runs at a soft limit of 1,024 too (a wave of
  // 600 and the other clients still exceed the server's 512 connections).
  const rlim_t limit = RaiseOpenFileLimit();
  const size_t reserved = kIdleClients + kSlowClients + kOtherDescriptors;
  ASSERT_GT(limit, reserved + 100) << "RLIMIT_NOFILE " << limit << " is too low for this test";
  const size_t wave_size = std::min<size_t>(kMaxWave, static_cast<size_t>(limit) - reserved);
  std::printf("abuse: RLIMIT_NOFILE=%llu wave=%zu\n", static_cast<unsigned long long>(limit),
              wave_size);
  TempDir tmp;
  const std::string dp = tmp.path() + "/plugins";
  std::filesystem::create_directories(dp);
  HarnessOptions ho;
  ho.dial_timeout = 10s;
  KubeletHarness harness(ho);
  ASSERT_TRUE(harness.Start(dp).ok());
  GpuletProcess node({"--simulate", "dgx-h100", "--sim-state", tmp.path() + "/sim", "node",
                      "--device-plugin-path", dp, "-a", "127.0.0.1:0", "-c", "500"},
                     tmp.path() + "/node.log");
  ASSERT_TRUE(node.Start());
  ASSERT_TRUE(harness
                  .WaitFor(
                      "nvidia.com/gpu",
                      [](const ResourceState& s) {
                        return s.registered && s.streaming && s.devices.size() == 8;
                      },
                      60s)
                  .ok())
      << node.Log();
  const int port = ListeningPort(node, 30s);
  ASSERT_GT(port, 0) << node.Log();
  ASSERT_NE(Get(port, "/health").find("200 OK"), std::string::npos) << node.Log();
  std::vector<std::string> ids;
  for (const HarnessDevice& d : harness.Devices("nvidia.com/gpu")) ids.push_back(d.id);
  ASSERT_EQ(ids.size(), 8u);

  std::atomic<bool> done{false};
  std::vector<std::thread> abusers;
  // Idle keep-alive clients: one request each, then silence (what used to hold every worker).
  std::vector<int> idle;
  for (size_t i = 0; i < kIdleClients; ++i) {
    const int fd = Connect(port, true);
    if (fd >= 0 && SendAll(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")) idle.push_back(fd);
  }
  // Slowloris: headers that never end, one byte every 200 ms.
  abusers.emplace_back([&] {
    std::vector<int> slow;
    for (size_t i = 0; i < kSlowClients; ++i) {
      const int fd = Connect(port, true);
      if (fd >= 0 && SendAll(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: "))
        slow.push_back(fd);
    }
    while (!done) {
      for (int fd : slow) (void)::send(fd, "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      std::this_thread::sleep_for(200ms);  // pacing the abuse, not a check
    }
    for (int fd : slow) ::close(fd);
  });
  // 1 MiB of headers, 32 times.
  std::atomic<int> huge_refused{0};
  abusers.emplace_back([&] {
    std::string huge = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
    while (huge.size() < (1u << 20)) huge += "X-Filler: " + std::string(100, 'f') + "\r\n";
    huge += "\r\n";
    for (int i = 0; i < 32 && !done; ++i) {
      const int fd = Connect(port, true);
      if (fd < 0) continue;
      timeval tv{30, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
      (void)SendAll(fd, huge);  // the server stops reading and closes: a send error is expected
      char buf[256] = {};
      const ssize_t n = ::recv(fd, buf, sizeof buf - 1, 0);
      if (n <= 0 || std::string(buf).find(" 431 ") != std::string::npos) ++huge_refused;
      ::close(fd);
    }
  });
  // 10,000 connections, opened in waves (2,000 where the limit allows) that stay open until the
  // next wave.
  std::atomic<int> opened{0};
  abusers.emplace_back([&] {
    std::vector<int> wave;
    for (int i = 0; i < 10000 && !done; ++i) {
      const int fd = Connect(port, false);
      if (fd >= 0) {
        ++opened;
        wave.push_back(fd);
      }
      if (wave.size() == wave_size) {
        for (int w : wave) ::close(w);
        wave.clear();
      }
    }
    for (int w : wave) ::close(w);
  });

  // Meanwhile: the liveness probe and the kubelet.
  std::vector<double> health_ms;
  int health_ok = 0, allocations_ok = 0, scrapes_ok = 0;
  for (int i = 0; i < 40; ++i) {
    const auto t0 = Steady::now();
    const std::string r = Get(port, "/health");
    health_ms.push_back(std::chrono::duration<double, std::milli>(Steady::now() - t0).count());
    if (r.find("200 OK") != std::string::npos && r.find("\r\n\r\nOK") != std::string::npos) {
      ++health_ok;
    }
    if (harness.Allocate("nvidia.com/gpu", {ids[static_cast<size_t>(i) % 8]}).ok()) {
      ++allocations_ok;
    }
    if (i % 8 == 0 && Get(port, "/metrics").find("DCGM_FI_DEV_GPU_TEMP{") != std::string::npos) {
      ++scrapes_ok;
    }
    std::this_thread::sleep_for(50ms);  // probe pacing, not a check
  }
  // Let the flood finish, then the others.
  abusers[2].join();
  done = true;
  abusers[0].join();
  abusers[1].join();
  for (int fd : idle) ::close(fd);

  std::sort(health_ms.begin(), health_ms.end());
  std::printf(
      "abuse: connections_opened=%d huge_refused=%d health_ok=%d/40 "
      "health_ms_median=%.2f health_ms_p95=%.2f health_ms_max=%.2f allocations_ok=%d/40 "
      "scrapes_ok=%d/5\n",
      opened.load(), huge_refused.load(), health_ok, health_ms[health_ms.size() / 2],
      health_ms[health_ms.size() * 95 / 100], health_ms.back(), allocations_ok, scrapes_ok);
  EXPECT_EQ(health_ok, 40);
  EXPECT_EQ(allocations_ok, 40);
  EXPECT_EQ(scrapes_ok, 5);
  EXPECT_EQ(opened.load(), 10000);
  EXPECT_EQ(huge_refused.load(), 32);
  EXPECT_TRUE(harness.State("nvidia.com/gpu")->streaming);
  // Still answering after the abuse ends.
  EXPECT_NE(Get(port, "/health").find("200 OK"), std::string::npos);
  EXPECT_EQ(node.Stop(SIGTERM), 0);
  const std::string final_log = node.Log();
  std::smatch stats;
  if (std::regex_search(final_log, stats, std::regex("event=http_stopped [^\\n]*"))) {
    std::printf("server: %s\n", stats[0].str().c_str());
  }
  harness.Stop();
}

}  // namespace
}  // namespace gpulet::testing
