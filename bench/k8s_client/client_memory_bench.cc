// Peak memory of k8s::Client answering a large LIST: a plain-HTTP server in this process answers
// one GET with a List of `items` ConfigMap-like objects (Content-Length); the figure is the growth
// of the process's peak RSS (VmHWM) over the GET, against the body's size. Run one measurement per
// process (the peak only grows): `client_memory_bench ITEMS get|list`.
//   get:  Client::Get, the decoded tree kept until the peak is read.
//   list: the same GET, then the items handed on as CollectionWatcher's LIST hands them.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "k8s/client.h"
#include "k8s/watch.h"

namespace {

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

int main(int argc, char** argv) {
  const int items = argc > 1 ? std::atoi(argv[1]) : 50000;
  const std::string mode = argc > 2 ? argv[2] : "get";
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
