// The API client under large answers, against a plain-HTTP server in this process.
// Peak memory of a large LIST: the server answers one GET with a List of ITEMS ConfigMap-like
// objects (Content-Length); the figure is the growth of the process's peak RSS (VmHWM) over the
// GET, against the body's size. One measurement per process (the peak only grows):
//   client_bench ITEMS get    Client::Get, the decoded tree kept until the peak is read
//   client_bench ITEMS list   the same GET, then the items handed on as CollectionWatcher's LIST
// Watch framing: the server streams one watch as 16 KiB chunks:
//   client_bench MIB frame    MIB MiB of 1 KiB events, then a 15 MiB event, then a 256 MiB line
//                             (refused at the 16 MiB line bound): the time of each part
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "k8s/client.h"
#include "k8s/watch.h"

namespace {

// CPU time of the calling thread (the client's side of the watch), in ms.
double ThreadCpuMs() {
  rusage u{};
  ::getrusage(RUSAGE_THREAD, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}

long HighWaterKiB() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

std::string ListBody(int items) {
  std::string body = R"({"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[)";
  for (int i = 0; i < items; ++i) {
    if (i > 0) body += ',';
    const std::string n = std::to_string(i);
    body += R"({"metadata":{"name":"node-)" + n + R"(","namespace":"gpulet","uid":"6b1f0d5e-1c2a-4e3b-9f00-)" +
            std::string(12 - std::min<size_t>(12, n.size()), '0') + n +
            R"(","resourceVersion":")" + n + R"(","labels":{"gpulet.io/node":"node-)" + n +
            R"(","app":"gpulet"}},"data":{"gpus":"8","model":"NVIDIA H100 80GB HBM3","mig":"false",)"
            R"("replicas":"4","memory":"81559","uuid":"GPU-)" + n + R"(-a1b2c3d4e5f6"}})";
  }
  body += "]}";
  return body;
}

}  // namespace

std::string Chunk(std::string_view bytes) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", bytes.size());
  return size + std::string(bytes) + "\r\n";
}

void SendAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

// Streams `stream` as 16 KiB chunks to the first connection's watch.
int Frame(int mib) {
  const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(lfd, 4) != 0) return 2;
  socklen_t len = sizeof a;
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  // Part 1: events; part 2: one 15 MiB event; part 3: a 256 MiB line never ended.
  const std::string small = R"({"type":"MODIFIED","object":{"metadata":{"name":"n","resourceVersion":"1"},"data":{"d":")" +
                            std::string(1024 - 90, 'x') + "\"}}}\n";
  const std::string big = R"({"type":"MODIFIED","object":{"metadata":{"name":"big"},"data":{"d":")" +
                          std::string(size_t{15} << 20, 'y') + "\"}}}\n";
  std::thread server([&] {
    for (int part = 1; part <= 3; ++part) {
      const int c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;
      char buf[4096];
      (void)::recv(c, buf, sizeof buf, 0);
      SendAll(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
      std::string piece;
      auto flush = [&] {
        SendAll(c, Chunk(piece));
        piece.clear();
      };
      auto stream = [&](std::string_view bytes) {
        while (!bytes.empty()) {
          const size_t take = std::min(bytes.size(), size_t{16384} - piece.size());
          piece.append(bytes.substr(0, take));
          bytes.remove_prefix(take);
          if (piece.size() == 16384) flush();
        }
      };
      if (part == 1) {
        for (long sent = 0; sent < (long{mib} << 20); sent += static_cast<long>(small.size())) stream(small);
      } else if (part == 2) {
        stream(big);
      } else {
        const std::string mb(1 << 20, 'z');
        stream("{\"type\":\"ADDED\",\"object\":{\"d\":\"");
        for (int i = 0; i < 256; ++i) stream(mb);
      }
      if (!piece.empty()) flush();
      SendAll(c, "0\r\n\r\n");
      ::close(c);
    }
  });
  gpulet::k8s::ClusterAccess access;
  access.server = "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  gpulet::k8s::Client client(access);
  const char* names[] = {"", "events", "one 15 MiB event", "a 256 MiB line"};
  for (int part = 1; part <= 3; ++part) {
    size_t events = 0;
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = ThreadCpuMs();
    gpulet::k8s::WatchResult r = client.Watch("/api/v1/configmaps?watch=1",
                                              [&](const gpulet::k8s::WatchEvent&) {
                                                ++events;
                                                return true;
                                              }, nullptr);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::printf("part=\"%s\" events=%zu wall_ms=%.0f client_cpu_ms=%.0f end=%s%s\n", names[part],
                events, ms, ThreadCpuMs() - cpu_start,
                r.end == gpulet::k8s::WatchEnd::kClosed ? "closed" : "broken",
                r.error.ok() ? "" : (" error=\"" + r.error.message().substr(r.error.message().rfind(": ") + 2) + "\"").c_str());
  }
  server.join();
  ::close(lfd);
  return 0;
}

int main(int argc, char** argv) {
  const int items = argc > 1 ? std::atoi(argv[1]) : 50000;
  const std::string mode = argc > 2 ? argv[2] : "get";
  if (mode == "frame") return Frame(items);
  std::string answer;
  {
    const std::string body = ListBody(items);
    answer = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
             std::to_string(body.size()) + "\r\n\r\n" + body;
  }
  const size_t body_bytes = answer.size() - answer.find("\r\n\r\n") - 4;
  const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(lfd, 4) != 0) return 2;
  socklen_t len = sizeof a;
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  std::thread server([&] {
    const int c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    char buf[4096];
    std::string req;
    while (req.find("\r\n\r\n") == std::string::npos) {
      const ssize_t n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0) break;
      req.append(buf, static_cast<size_t>(n));
    }
    for (size_t off = 0; off < answer.size();) {
      const ssize_t n = ::send(c, answer.data() + off, answer.size() - off, MSG_NOSIGNAL);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    ::close(c);
  });
  gpulet::k8s::ClusterAccess access;
  access.server = "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  gpulet::k8s::Client client(access);
  const long before = HighWaterKiB();
  size_t count = 0;
  {
    gpulet::k8s::ApiResult<nlohmann::json> got = client.Get("/api/v1/namespaces/gpulet/configmaps");
    if (!got.ok()) {
      std::fprintf(stderr, "GET failed: %s\n", got.status().message().c_str());
      return 1;
    }
    if (mode == "list") {
      std::vector<nlohmann::json> handed = gpulet::k8s::ItemsOf(std::move(*got));
      count = handed.size();
    } else {
      count = (*got)["items"].size();
    }
  }
  const long after = HighWaterKiB();
  server.join();
  ::close(lfd);
  std::printf("mode=%s items=%zu body_mib=%.1f peak_growth_mib=%.1f ratio=%.1f\n", mode.c_str(), count,
              body_bytes / 1048576.0, (after - before) / 1024.0,
              (after - before) * 1024.0 / static_cast<double>(body_bytes));
  return 0;
}
