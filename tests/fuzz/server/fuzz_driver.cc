// A deterministic mutation driver for LLVMFuzzerTestOneInput (fuzz_request.cc), for builds
// without libFuzzer (GCC). Usage:
//   fuzz_http_server [--execs N] [--server M] [--seed S]
// runs N mutated inputs through the parser target, then sends M of them (each on its own
// connection) to a live MetricsServer with a POST route and checks that /health still answers.
// Prints executions, seconds and executions per second.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "metrics/http_server.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern size_t fuzz_heads_complete;

namespace {

const char* const kSeeds[] = {
    "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text\r\n\r\n",
    "GET /health HTTP/1.0\r\n\r\n",
    "HEAD / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
    "GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length : 35\r\n\r\n"
    "GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    "GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: Basic YWxpY2U6czNjcmV0\r\n\r\n",
    "GET /health HTTP/1.1\r\nHost: x\r\nX: a\r\n folded\r\n\r\n",
    "GET /?a=b HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
};
const char* const kTokens[] = {"\r\n", ":", " ", "\t", "Content-Length: ", "Transfer-Encoding: ",
                               "chunked", "Host: x\r\n", "HTTP/1.1", "HTTP/1.0", "\r\n\r\n",
                               "4294967296", "18446744073709551615", "+0", "-1", "POST /echo "};

struct Rng {
  uint64_t s;
  uint64_t Next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  size_t Below(size_t n) { return n ? static_cast<size_t>(Next() % n) : 0; }
};

std::string Mutate(Rng& rng, const std::vector<std::string>& corpus) {
  std::string s = corpus[rng.Below(corpus.size())];
  const int steps = 1 + static_cast<int>(rng.Below(4));
  for (int i = 0; i < steps; ++i) {
    switch (rng.Below(6)) {
      case 0:  // flip a bit
        if (!s.empty()) s[rng.Below(s.size())] ^= static_cast<char>(1u << rng.Below(8));
        break;
      case 1:  // insert a byte
        s.insert(s.begin() + static_cast<std::ptrdiff_t>(rng.Below(s.size() + 1)),
                 static_cast<char>(rng.Below(256)));
        break;
      case 2:  // erase a run
        if (!s.empty()) {
          const size_t at = rng.Below(s.size());
          s.erase(at, 1 + rng.Below(std::min<size_t>(16, s.size() - at)));
        }
        break;
      case 3:  // a token
        s.insert(rng.Below(s.size() + 1), kTokens[rng.Below(std::size(kTokens))]);
        break;
      case 4: {  // splice another input's tail
        const std::string& o = corpus[rng.Below(corpus.size())];
        s = s.substr(0, rng.Below(s.size() + 1)) + o.substr(rng.Below(o.size() + 1));
        break;
      }
      default:  // duplicate a run
        if (!s.empty()) {
          const size_t at = rng.Below(s.size());
          s.insert(at, s.substr(at, 1 + rng.Below(32)));
        }
    }
  }
  if (s.size() > 16384) s.resize(16384);
  return s;
}

int Dial(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// Sends `s`, half-closes, reads until the server closes (or 10 s). False: the read timed out.
bool Exchange(int port, const std::string& s, std::string* answer) {
  const int fd = Dial(port);
  if (fd < 0) return false;
  ::send(fd, s.data(), s.size(), MSG_NOSIGNAL);
  ::shutdown(fd, SHUT_WR);
  char buf[4096];
  ssize_t n;
  bool ok = true;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) != 0) {
    if (n < 0) {
      ok = errno == ECONNRESET;
      break;
    }
    if (answer) answer->append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  long execs = 200000, server_execs = 200;
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--execs")) execs = std::atol(argv[i + 1]);
    if (!std::strcmp(argv[i], "--server")) server_execs = std::atol(argv[i + 1]);
    if (!std::strcmp(argv[i], "--seed")) seed = std::strtoull(argv[i + 1], nullptr, 0);
  }
  std::vector<std::string> corpus(std::begin(kSeeds), std::end(kSeeds));
  Rng rng{seed};
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < execs; ++i) {
    const std::string in = Mutate(rng, corpus);
    const size_t heads_before = fuzz_heads_complete;
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(in.data()), in.size());
    // Mutants that still parse are kept as parents (a bounded corpus, the seeds never
    // replaced), so mutations compound past the grammar instead of only failing it.
    if (fuzz_heads_complete > heads_before) {
      if (corpus.size() < 512) {
        corpus.push_back(in);
      } else {
        corpus[std::size(kSeeds) + rng.Below(corpus.size() - std::size(kSeeds))] = in;
      }
    }
  }
  const double parse_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("parser: execs=%ld seconds=%.2f execs_per_s=%.0f heads_parsed=%zu\n", execs,
              parse_s, parse_s > 0 ? execs / parse_s : 0.0, fuzz_heads_complete);

  gpulet::metrics::Publisher pub;
  pub.SetSnapshot(std::make_shared<gpulet::metrics::Snapshot>());
  gpulet::metrics::HttpOptions opts;
  opts.address = "127.0.0.1:0";
  opts.request_timeout = std::chrono::milliseconds(2000);
  opts.max_body_bytes = 4096;
  opts.post_routes["/echo"] = [](const std::string& body) {
    return gpulet::metrics::HttpOptions::PostReply{200, "text/plain", body};
  };
  gpulet::metrics::MetricsServer server(pub, opts);
  if (!server.Start().ok()) {
    std::fprintf(stderr, "cannot start the server\n");
    return 2;
  }
  const auto t1 = std::chrono::steady_clock::now();
  long hung = 0;
  for (long i = 0; i < server_execs; ++i) {
    if (!Exchange(server.port(), Mutate(rng, corpus), nullptr)) ++hung;
  }
  const double server_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  std::string health;
  Exchange(server.port(), "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &health);
  const bool healthy = health.rfind("HTTP/1.1 200 ", 0) == 0;
  std::printf("server: execs=%ld seconds=%.2f execs_per_s=%.0f unanswered=%ld health=%s\n",
              server_execs, server_s, server_s > 0 ? server_execs / server_s : 0.0, hung,
              healthy ? "ok" : "FAILED");
  return healthy && hung == 0 ? 0 : 1;
}
