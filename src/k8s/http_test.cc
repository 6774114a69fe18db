// The HTTP/1.1 transport under k8s::Client against a raw TCP server that answers with scripted
// bytes: framing (Content-Length, chunked, close-delimited, 1xx), the bounds on headers and
// bodies, cut answers, Retry-After, stop, and which requests are sent again on a new connection
// (a GET whose kept connection died unanswered; never a write). TLS is covered by client_test.cc
// against the fake API server.
#include "k8s/http.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "apiserver/fake_apiserver.h"
#include "k8s/client.h"
#include "k8s/watch.h"
#include "support/wait_until.h"

namespace gpulet::k8s::http {
namespace {

using namespace std::chrono_literals;

// Accepts connections on 127.0.0.1 and runs `serve(fd, index)` for each, one thread each.
class RawServer {
 public:
  explicit RawServer(std::function<void(int fd, int index)> serve) : serve_(std::move(serve)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(fd_, 16), 0);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    accept_ = std::thread([this] {
      for (int i = 0;; ++i) {
        const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) return;
        connections_.fetch_add(1);
        std::lock_guard<std::mutex> lock(mu_);
        workers_.emplace_back([this, c, i] {
          serve_(c, i);
          ::close(c);
        });
      }
    });
  }
  ~RawServer() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    accept_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& t : workers_) t.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int connections() const { return connections_.load(); }

 private:
  std::function<void(int, int)> serve_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<int> connections_{0};
  std::thread accept_;
  std::mutex mu_;
  std::vector<std::thread> workers_;
};

// Reads one request head (and a Content-Length body) from fd; empty at EOF.
std::string ReadRequest(int fd) {
  std::string in;
  char buf[4096];
  for (;;) {
    const size_t end = in.find("\r\n\r\n");
    if (end != std::string::npos) {
      size_t body = 0;
      if (const size_t cl = in.find("Content-Length: "); cl != std::string::npos && cl < end) {
        body = std::stoul(in.substr(cl + 16));
      }
      if (in.size() >= end + 4 + body) return in;
    }
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return "";
    in.append(buf, static_cast<size_t>(n));
  }
}

void Send(int fd, const std::string& bytes) {
  ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
}

struct Got {
  ResponseHead head;
  std::string body;
  std::optional<ExchangeError> error;
};

Got Fetch(const std::string& url, const std::string& method = "GET",
          ExchangeOptions options = ExchangeOptions{}) {
  Got g;
  Result<Endpoint> e = ParseServerUrl(url);
  EXPECT_TRUE(e.ok());
  if (options.deadline == Clock::time_point::max()) options.deadline = Clock::now() + 10s;
  Result<std::unique_ptr<Connection>> c = Connection::Open(*e, nullptr, 5000ms, options.deadline);
  if (!c.ok()) {
    g.error = ExchangeError{c.status(), true};
    return g;
  }
  Request r;
  r.method = method;
  r.target = "/api/v1/nodes/n1";
  g.error = Exchange(**c, *e, r, options, g.head, [&](const ResponseHead&, std::string_view b) {
    g.body.append(b);
    return true;
  });
  return g;
}

TEST(ParseServerUrl, TakesTheUrlApart) {
  Result<Endpoint> a = ParseServerUrl("https://10.96.0.1:443");
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->tls);
  EXPECT_EQ(a->host, "10.96.0.1");
  EXPECT_EQ(a->port, "443");
  EXPECT_TRUE(a->host_is_ip);
  EXPECT_EQ(a->host_header, "10.96.0.1:443");
  Result<Endpoint> b = ParseServerUrl("https://[fd00::1]:6443/k8s/clusters/c-1/");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "fd00::1");
  EXPECT_EQ(b->port, "6443");
  EXPECT_EQ(b->path_prefix, "/k8s/clusters/c-1");
  EXPECT_EQ(b->host_header, "[fd00::1]:6443");
  Result<Endpoint> c = ParseServerUrl("https://api.example.com");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->port, "443");
  EXPECT_FALSE(c->host_is_ip);
  EXPECT_EQ(c->host_header, "api.example.com");
  Result<Endpoint> d = ParseServerUrl("http://localhost:8080");
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->tls);
  for (const char* bad : {"ftp://x", "https://", "https://h:0", "https://h:99999", "https://h:x1",
                          "https://[::1"}) {
    Result<Endpoint> r = ParseServerUrl(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status().message();
    }
  }
}

TEST(Exchange, ReadsContentLengthChunkedAndCloseDelimitedBodies) {
  RawServer server([](int fd, int i) {
    const std::string req = ReadRequest(fd);
    if (req.empty()) return;
    if (i == 0) Send(fd, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
    if (i == 1) {
      Send(fd, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               "3;ext=1\r\nabc\r\n");
      Send(fd, "A\r\n0123456789\r\n0\r\nX-Trailer: y\r\n\r\n");
    }
    if (i == 2) Send(fd, "HTTP/1.0 200 OK\r\n\r\nuntil the end");
  });
  Got a = Fetch(server.url());
  ASSERT_FALSE(a.error) << a.error->status.message();
  EXPECT_EQ(a.head.status, 200);
  EXPECT_EQ(a.body, "hello");
  EXPECT_TRUE(a.head.reusable);
  Got b = Fetch(server.url());
  ASSERT_FALSE(b.error) << b.error->status.message();
  EXPECT_EQ(b.body, "abc0123456789");
  EXPECT_TRUE(b.head.reusable);
  Got c = Fetch(server.url());
  ASSERT_FALSE(c.error) << c.error->status.message();
  EXPECT_EQ(c.body, "until the end");
  EXPECT_FALSE(c.head.reusable);
}

TEST(Exchange, CutAnswersAndOversizedHeadersAreErrors) {
  RawServer server([](int fd, int i) {
    if (ReadRequest(fd).empty()) return;
    if (i == 0) Send(fd, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort");
    if (i == 1) Send(fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab");
    if (i == 2) Send(fd, "HTTP/1.1 200 OK\r\nX-Big: " + std::string(kMaxHeaderBytes + 10, 'x'));
    if (i == 3) Send(fd, "SSH-2.0-OpenSSH\r\n\r\n");
    if (i == 4) Send(fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
  });
  Got a = Fetch(server.url());
  ASSERT_TRUE(a.error);
  EXPECT_NE(a.error->status.message().find("mid-body"), std::string::npos) << a.error->status.message();
  EXPECT_FALSE(a.error->nothing_received);
  Got b = Fetch(server.url());
  ASSERT_TRUE(b.error);
  EXPECT_NE(b.error->status.message().find("mid-body"), std::string::npos) << b.error->status.message();
  Got c = Fetch(server.url());
  ASSERT_TRUE(c.error);
  EXPECT_NE(c.error->status.message().find("longer than"), std::string::npos) << c.error->status.message();
  Got d = Fetch(server.url());
  ASSERT_TRUE(d.error);
  EXPECT_NE(d.error->status.message().find("not HTTP/1.x"), std::string::npos) << d.error->status.message();
  Got e = Fetch(server.url());
  ASSERT_TRUE(e.error);
  EXPECT_NE(e.error->status.message().find("chunk size"), std::string::npos) << e.error->status.message();
}

TEST(Exchange, RetryAfterAndTheConnectionHeaderAreRead) {
  RawServer server([](int fd, int) {
    if (ReadRequest(fd).empty()) return;
    Send(fd, "HTTP/1.1 429 Too Many Requests\r\nretry-after:  12\r\nConnection: close\r\n"
             "Content-Length: 2\r\n\r\n{}");
  });
  Got g = Fetch(server.url());
  ASSERT_FALSE(g.error);
  EXPECT_EQ(g.head.status, 429);
  EXPECT_EQ(g.head.retry_after, 12);
  EXPECT_FALSE(g.head.reusable);
}

TEST(Exchange, StopEndsASilentStreamAndSoDoesItsIdleTimeout) {
  // The server sends the head of a chunked stream, then nothing until the test releases it.
  std::promise<void> head_sent, release;
  std::shared_future<void> released = release.get_future().share();
  RawServer server([&](int fd, int index) {
    if (ReadRequest(fd).empty()) return;
    Send(fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
    if (index == 0) head_sent.set_value();
    released.wait();
  });
  // Stop is raised once the stream is open and silent.
  std::atomic<bool> stop{false};
  std::thread stopper([&] {
    head_sent.get_future().wait();
    stop = true;
  });
  ExchangeOptions o;
  o.stop = &stop;
  Got g = Fetch(server.url(), "GET", o);
  stopper.join();
  ASSERT_TRUE(g.error);
  EXPECT_TRUE(g.error->stopped);
  ExchangeOptions idle;
  idle.idle_timeout = 1s;
  Got h = Fetch(server.url(), "GET", idle);
  release.set_value();
  ASSERT_TRUE(h.error);
  EXPECT_FALSE(h.error->stopped);
  EXPECT_NE(h.error->status.message().find("timed out"), std::string::npos) << h.error->status.message();
}

// Through the Client: a GET sent on a kept connection that the server then closes without an
// answer is sent again on a new connection and succeeds; a kept connection the server has already
// closed is not used; a PATCH whose connection dies unanswered fails and is not sent twice.
TEST(ClientOverRawServer, AGetOnADeadKeptConnectionIsResentAWriteNever) {
  std::atomic<int> gets{0}, patches{0};
  RawServer server([&](int fd, int index) {
    for (int n = 0;; ++n) {
      const std::string req = ReadRequest(fd);
      if (req.empty()) return;
      if (req.rfind("PATCH", 0) == 0) {
        ++patches;  // read, and the connection closed without an answer
        return;
      }
      ++gets;
      if (index == 0 && n == 1) return;  // the second GET on the first connection: no answer
      Send(fd, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}");
      if (index == 1) {
        ::shutdown(fd, SHUT_RDWR);  // answered, then closed while the client keeps it
        return;
      }
    }
  });
  ClusterAccess a;
  a.server = server.url();
  Client client(a);
  for (int i = 0; i < 3; ++i) {
    ApiResult<nlohmann::json> r = client.Get("/api/v1/nodes/n1");
    ASSERT_TRUE(r.ok()) << i << ": " << r.status().message();
  }
  // GET 1 on connection 0; GET 2 on connection 0 (unanswered), again on connection 1, which then
  // closes; GET 3 finds it closed and opens connection 2.
  EXPECT_EQ(gets.load(), 4);
  EXPECT_EQ(server.connections(), 3);
  ApiResult<nlohmann::json> p =
      client.Patch("/api/v1/nodes/n1", {{"metadata", nlohmann::json::object()}}, PatchType::kMerge);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.http_status(), 0);
  EXPECT_NE(p.status().message().find("PATCH " + a.server), std::string::npos) << p.status().message();
  EXPECT_EQ(patches.load(), 1);
}

// Answer::kNothing: the answer is checked but not returned. A created object comes back as null, a
// Failure Status inside a 2xx is the error it names (as with kObject), and an answer that is not
// JSON is an error.
TEST(ClientOverRawServer, AWriteThatKeepsNoAnswerStillChecksIt) {
  const std::vector<std::string> answers = {
      R"({"kind":"ResourceSlice","metadata":{"name":"s","labels":{"kind":"Status"}},)"
      R"("spec":{"devices":[{"name":"gpu-0","status":"Failure"}]}})",
      R"({"kind":"Status","apiVersion":"v1","status":"Failure","message":"too many","code":429})",
      R"({"kind":"Status","status":"Failure","message":"no code"})",
      R"(<html>not json</html>)",
      R"({"kind":"ResourceSlice")",
  };
  // Each write opens its own connection (writes are not pooled): connection i gets answer i.
  RawServer server([&](int fd, int index) {
    if (ReadRequest(fd).empty() || index >= static_cast<int>(answers.size())) return;
    Send(fd, "HTTP/1.1 201 Created\r\nContent-Length: " + std::to_string(answers[index].size()) +
                 "\r\n\r\n" + answers[index]);
  });
  ClusterAccess a;
  a.server = server.url();
  Client client(a);
  const nlohmann::json body = {{"kind", "ResourceSlice"}};
  // Nested "kind"/"status" keys are not the top-level Status.
  ApiResult<nlohmann::json> created = client.Post("/apis/x", body, Answer::kNothing);
  ASSERT_TRUE(created.ok()) << created.status().message();
  EXPECT_TRUE(created->is_null());
  ApiResult<nlohmann::json> refused =
      client.Patch("/apis/x/s", nlohmann::json::array(), PatchType::kJsonPatch, Answer::kNothing);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.http_status(), 429);
  ApiResult<nlohmann::json> no_code = client.Post("/apis/x", body, Answer::kNothing);
  ASSERT_FALSE(no_code.ok());
  EXPECT_EQ(no_code.http_status(), 500);
  for (int i = 0; i < 2; ++i) {
    ApiResult<nlohmann::json> garbage = client.Post("/apis/x", body, Answer::kNothing);
    ASSERT_FALSE(garbage.ok()) << i;
    EXPECT_NE(garbage.status().message().find("not JSON"), std::string::npos)
        << garbage.status().message();
  }
}

TEST(ClientOverRawServer, AnUnreachableServerIsAClearError) {
  ClusterAccess a;
  {
    RawServer gone([](int, int) {});
    a.server = gone.url();
  }  // closed: nothing listens on the port now
  ApiResult<nlohmann::json> r = Client(a).Get("/api/v1/nodes/n1");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kUnavailable);
  EXPECT_NE(r.status().message().find("connect to 127.0.0.1"), std::string::npos) << r.status().message();
}

// Sends what it can, ignoring a peer that stopped reading (the client refused the answer).
void SendSome(int fd, const std::string& bytes) {
  for (size_t off = 0; off < bytes.size();) {
    const ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

// Blocks until the client closes its side.
void WaitForClose(int fd) {
  char buf[4096];
  while (::recv(fd, buf, sizeof buf, 0) > 0) {
  }
}

std::string Chunk(const std::string& bytes) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", bytes.size());
  return size + bytes + "\r\n";
}

const char kChunkedHead[] = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";

// Each kind of answer has its bound: a write's answer (one object) over kMaxObjectAnswerBytes
// fails, announced by Content-Length or grown chunk by chunk, and the client stops reading it; a
// GET (which may be a List) of the same size is read.
TEST(ClientOverRawServer, AnAnswerOverItsKindsBoundFails) {
  const std::string big =
      R"({"kind":"ConfigMap","data":{"a":")" + std::string(kMaxObjectAnswerBytes, 'x') + R"("}})";
  RawServer server([&](int fd, int index) {
    if (ReadRequest(fd).empty()) return;
    if (index == 1) {  // chunked, no Content-Length
      SendSome(fd, kChunkedHead);
      for (size_t off = 0; off < big.size(); off += 1 << 20) {
        SendSome(fd, Chunk(big.substr(off, 1 << 20)));
      }
      SendSome(fd, "0\r\n\r\n");
      return;
    }
    SendSome(fd, "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(big.size()) +
                     "\r\n\r\n" + big);
  });
  ClusterAccess a;
  a.server = server.url();
  Client client(a);
  const nlohmann::json body = {{"kind", "ConfigMap"}};
  for (int i = 0; i < 2; ++i) {
    ApiResult<nlohmann::json> r = client.Post("/api/v1/namespaces/ns/configmaps", body);
    ASSERT_FALSE(r.ok()) << i;
    const std::string bound = "exceeds the limit of " + std::to_string(kMaxObjectAnswerBytes);
    EXPECT_NE(r.status().message().find(bound), std::string::npos)
        << r.status().message();
  }
  ApiResult<nlohmann::json> got = client.Get("/api/v1/namespaces/ns/configmaps/big");
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ((*got)["data"]["a"].get<std::string>().size(), kMaxObjectAnswerBytes);
}

// Watch lines are framed whatever the chunking: split across chunks and reads, several in one
// chunk, a CRLF ending, and a last line without a newline when the stream ends.
TEST(ClientOverRawServer, WatchLinesAreFramedWhateverTheChunking) {
  RawServer server([&](int fd, int) {
    if (ReadRequest(fd).empty()) return;
    const std::string events =
        R"({"type":"ADDED","object":{"metadata":{"name":"a"}}})" "\n"
        R"({"type":"MODIFIED","object":{"metadata":{"name":"b"}}})" "\r\n"
        R"({"type":"DELETED","object":{"metadata":{"name":"c"}}})";
    SendSome(fd, kChunkedHead);
    for (size_t off = 0, step = 1; off < events.size(); off += step, step = step % 7 + 1) {
      SendSome(fd, Chunk(events.substr(off, step)));
    }
    SendSome(fd, "0\r\n\r\n");
  });
  ClusterAccess a;
  a.server = server.url();
  std::vector<std::string> seen;
  WatchResult r = Client(a).Watch("/api/v1/configmaps?watch=1", [&](const WatchEvent& ev) {
    seen.push_back(ev.type + " " + ev.object["metadata"]["name"].get<std::string>());
    return true;
  }, nullptr);
  EXPECT_EQ(r.end, WatchEnd::kClosed) << r.error.message();
  EXPECT_EQ(seen, (std::vector<std::string>{"ADDED a", "MODIFIED b", "DELETED c"}));
}

// A watch line over kMaxWatchLineBytes breaks that watch (not the process, and without keeping
// the line): the watch loop backs off and watches again, and the next stream's events arrive.
TEST(ClientOverRawServer, AnOverlongWatchLineBreaksTheWatchAndTheLoopWatchesAgain) {
  std::atomic<int> watches{0};
  RawServer server([&](int fd, int) {
    const std::string req = ReadRequest(fd);
    if (req.empty()) return;
    if (req.find("watch=1") == std::string::npos) {
      const std::string list =
          R"({"kind":"ConfigMapList","metadata":{"resourceVersion":"5"},"items":[]})";
      SendSome(fd, "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(list.size()) +
                       "\r\n\r\n" + list);
      WaitForClose(fd);
      return;
    }
    SendSome(fd, kChunkedHead);
    if (watches.fetch_add(1) == 0) {  // one line, never ended: 1 MiB chunks past the bound
      const std::string mib(1 << 20, 'x');
      SendSome(fd, Chunk(R"({"type":"ADDED","object":{"data":")"));
      for (size_t sent = 0; sent <= kMaxWatchLineBytes; sent += mib.size()) {
        SendSome(fd, Chunk(mib));
      }
    } else {
      SendSome(fd, Chunk(R"({"type":"ADDED",)"
                         R"("object":{"metadata":{"name":"after","resourceVersion":"6"}}})" "\n"));
    }
    WaitForClose(fd);
  });
  ClusterAccess a;
  a.server = server.url();
  Client client(a);
  WatcherOptions options;
  options.initial_backoff = 10ms;
  CollectionWatcher watcher(client, "/api/v1/configmaps", "", options);
  StopSignal stop;
  std::mutex mu;
  std::vector<std::string> names;
  std::thread run([&] {
    watcher.Run(stop, [](const std::vector<nlohmann::json>&) {},
                [&](const std::string&, const nlohmann::json& object) {
                  std::lock_guard<std::mutex> lock(mu);
                  names.push_back(object["metadata"].value("name", ""));
                });
  });
  const bool arrived = gpulet::testing::WaitUntil([&] {
    std::lock_guard<std::mutex> lock(mu);
    return !names.empty();
  }, 60s);
  stop.Stop();
  run.join();
  ASSERT_TRUE(arrived);
  EXPECT_EQ(names, std::vector<std::string>{"after"});
  EXPECT_EQ(watcher.stats().reconnects.load(), 1u);
  EXPECT_EQ(watcher.resource_version(), "6");
}

// A watch that receives nothing for ClientOptions::watch_silence is broken (a server process that
// hangs while its host still answers TCP keepalives).
TEST(ClientOverRawServer, AWatchSilentPastItsBoundIsBroken) {
  RawServer server([&](int fd, int) {
    if (ReadRequest(fd).empty()) return;
    SendSome(fd, kChunkedHead);
    WaitForClose(fd);
  });
  ClusterAccess a;
  a.server = server.url();
  ClientOptions options;
  options.watch_silence = 300ms;
  std::atomic<bool> stop{false};
  std::future<WatchResult> watch = std::async(std::launch::async, [&] {
    return Client(a, options).Watch("/api/v1/configmaps?watch=1",
                                    [](const WatchEvent&) { return true; }, &stop);
  });
  const bool ended = watch.wait_for(60s) == std::future_status::ready;
  stop = true;
  const WatchResult r = watch.get();
  ASSERT_TRUE(ended);
  EXPECT_EQ(r.end, WatchEnd::kBroken);
  EXPECT_NE(r.error.message().find("silent for 300 ms"), std::string::npos) << r.error.message();
}

// Every connection carries TCP keepalive (and the matching TCP_USER_TIMEOUT), as configured: a
// peer that vanished is noticed in idle + interval x count (45 s by default), not never.
TEST(Connection, EverySocketCarriesTcpKeepalive) {
  RawServer server([&](int fd, int) { WaitForClose(fd); });
  Result<Endpoint> e = ParseServerUrl(server.url());
  ASSERT_TRUE(e.ok());
  auto option = [](int fd, int level, int name) {
    int v = -1;
    socklen_t len = sizeof v;
    EXPECT_EQ(::getsockopt(fd, level, name, &v, &len), 0);
    return v;
  };
  Liveness liveness;
  liveness.keepalive_idle = 7s;
  liveness.keepalive_interval = 2s;
  liveness.keepalive_count = 4;
  auto c = Connection::Open(*e, nullptr, 5000ms, Clock::now() + 10s, liveness);
  ASSERT_TRUE(c.ok()) << c.status().message();
  const int fd = (*c)->native_handle();
  EXPECT_EQ(option(fd, SOL_SOCKET, SO_KEEPALIVE), 1);
  EXPECT_EQ(option(fd, IPPROTO_TCP, TCP_KEEPIDLE), 7);
  EXPECT_EQ(option(fd, IPPROTO_TCP, TCP_KEEPINTVL), 2);
  EXPECT_EQ(option(fd, IPPROTO_TCP, TCP_KEEPCNT), 4);
  EXPECT_EQ(option(fd, IPPROTO_TCP, TCP_USER_TIMEOUT), 15000);
  auto d = Connection::Open(*e, nullptr, 5000ms, Clock::now() + 10s);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(option((*d)->native_handle(), IPPROTO_TCP, TCP_KEEPIDLE), 30);
  EXPECT_EQ(option((*d)->native_handle(), IPPROTO_TCP, TCP_KEEPINTVL), 5);
  EXPECT_EQ(option((*d)->native_handle(), IPPROTO_TCP, TCP_KEEPCNT), 3);
  c->reset();
  d->reset();
}

// The line splitter under a watch: linear in what it is fed, whatever the pieces, and bounded.
TEST(LineSplitter, FramesLinesFromAnyPiecesAndRefusesAnOverlongOne) {
  LineSplitter lines(8);
  std::vector<std::string> got;
  auto keep = [&](std::string_view l) {
    got.emplace_back(l);
    return true;
  };
  EXPECT_TRUE(lines.Feed("ab", keep));
  EXPECT_TRUE(lines.Feed("c\nde\r\n\nf", keep));
  EXPECT_TRUE(lines.Feed("ghijklm\n", keep));  // 8 bytes: at the bound
  EXPECT_EQ(got, (std::vector<std::string>{"abc", "de", "", "fghijklm"}));
  EXPECT_TRUE(lines.Feed("123456", keep));
  EXPECT_FALSE(lines.Feed("789", keep));  // 9 bytes and no newline yet
  EXPECT_TRUE(lines.overflowed());
  EXPECT_FALSE(lines.Feed("\n", keep));
  EXPECT_EQ(got.size(), 4u);
  LineSplitter one(4);
  EXPECT_FALSE(one.Feed("12345\n", keep));  // an overlong line in one piece
}

// Against the fake API server over TLS: a new connection resumes the session the last one kept
// (a write, which opens its own connection, pays no key exchange), and still checks the server:
// a configuration with another CA fails the handshake.
TEST(Tls, ANewConnectionResumesTheKeptSessionAndAForeignCaFails) {
  std::string dir = ::testing::TempDir() + "gpulet-http-XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  std::filesystem::create_directories(dir + "/a");
  std::filesystem::create_directories(dir + "/b");
  Result<gpulet::testing::TestPki> pki = gpulet::testing::MakeTestPki(dir + "/a");
  ASSERT_TRUE(pki.ok()) << pki.status().message();
  auto server = gpulet::testing::FakeApiServer::Start(*pki, {});
  ASSERT_TRUE(server.ok()) << server.status().message();
  const ClusterAccess access = (*server)->Access(*pki);
  Result<Endpoint> e = ParseServerUrl(access.server);
  ASSERT_TRUE(e.ok());
  Result<std::shared_ptr<TlsConfig>> tls = MakeTlsConfig(access);
  ASSERT_TRUE(tls.ok()) << tls.status().message();
  auto get = [&](Connection& c) {
    Request r;
    r.method = "GET";
    r.target = "/api/v1/namespaces";
    r.headers.emplace_back("Authorization", "Bearer " + access.token);
    ResponseHead head;
    ExchangeOptions o;
    o.deadline = Clock::now() + 10s;
    auto error = Exchange(c, *e, r, o, head, [](const ResponseHead&, std::string_view) { return true; });
    EXPECT_FALSE(error) << error->status.message();
    return head.status;
  };
  auto first = Connection::Open(*e, *tls, 5000ms, Clock::now() + 10s);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_FALSE((*first)->ResumedTls());
  EXPECT_NE(get(**first), 0);
  (*first)->KeepTlsSession();
  auto second = Connection::Open(*e, *tls, 5000ms, Clock::now() + 10s);
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_TRUE((*second)->ResumedTls());
  EXPECT_NE(get(**second), 0);

  Result<gpulet::testing::TestPki> other = gpulet::testing::MakeTestPki(dir + "/b");
  ASSERT_TRUE(other.ok());
  ClusterAccess foreign = access;
  foreign.ca_file = other->ca_cert;
  foreign.ca_data.clear();
  Result<std::shared_ptr<TlsConfig>> foreign_tls = MakeTlsConfig(foreign);
  ASSERT_TRUE(foreign_tls.ok()) << foreign_tls.status().message();
  auto refused = Connection::Open(*e, *foreign_tls, 5000ms, Clock::now() + 10s);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("not trusted"), std::string::npos)
      << refused.status().message();
  std::filesystem::remove_all(dir);
}

// A fake API server whose certificate carries `names`, in a fresh directory.
struct NamedServer {
  std::string dir;
  gpulet::testing::TestPki pki;
  std::unique_ptr<gpulet::testing::FakeApiServer> server;
  std::string port;
};
NamedServer StartNamed(const gpulet::testing::ServerCertNames& names) {
  NamedServer n;
  n.dir = ::testing::TempDir() + "gpulet-names-XXXXXX";
  EXPECT_NE(mkdtemp(n.dir.data()), nullptr);
  Result<gpulet::testing::TestPki> pki = gpulet::testing::MakeTestPki(n.dir, names);
  EXPECT_TRUE(pki.ok()) << pki.status().message();
  if (!pki.ok()) return n;
  n.pki = *pki;
  auto server = gpulet::testing::FakeApiServer::Start(n.pki, {});
  EXPECT_TRUE(server.ok()) << server.status().message();
  if (!server.ok()) return n;
  n.server = std::move(server).value();
  n.port = n.server->url().substr(n.server->url().rfind(':') + 1);
  return n;
}

// Opens https://HOST:PORT (connecting to 127.0.0.1) with `tls`: "" on success, else the error.
std::string OpenAs(const std::string& host, const std::string& port,
                   const std::shared_ptr<TlsConfig>& tls, bool keep_session = false,
                   bool* resumed = nullptr) {
  Result<Endpoint> e = ParseServerUrl("https://" + host + ":" + port);
  EXPECT_TRUE(e.ok());
  e->dial_host = "127.0.0.1";
  auto c = Connection::Open(*e, tls, 5000ms, Clock::now() + 10s);
  if (!c.ok()) return c.status().message();
  if (resumed != nullptr) *resumed = (*c)->ResumedTls();
  if (keep_session) {
    Request r;
    r.method = "GET";
    r.target = "/api/v1/namespaces";
    ResponseHead head;
    ExchangeOptions o;
    o.deadline = Clock::now() + 10s;
    auto error =
        Exchange(**c, *e, r, o, head, [](const ResponseHead&, std::string_view) { return true; });
    EXPECT_FALSE(error) << error->status.message();
    (*c)->KeepTlsSession();
  }
  return "";
}

std::shared_ptr<TlsConfig> TlsFor(const gpulet::testing::TestPki& pki) {
  ClusterAccess a;
  a.ca_file = pki.ca_cert;
  Result<std::shared_ptr<TlsConfig>> tls = MakeTlsConfig(a);
  EXPECT_TRUE(tls.ok()) << tls.status().message();
  return tls.ok() ? *tls : nullptr;
}

// Hostnames are checked as Go's crypto/x509 checks them (client-go): a certificate with no
// subjectAltName is refused even when its CN names the host (Go ignores the CN since 1.15).
TEST(Tls, ACertificateThatNamesTheHostOnlyInItsCommonNameIsRefused) {
  NamedServer n = StartNamed({.common_name = "localhost", .subject_alt_names = ""});
  ASSERT_NE(n.server, nullptr);
  const std::string error = OpenAs("localhost", n.port, TlsFor(n.pki));
  EXPECT_NE(error.find("not trusted"), std::string::npos) << "accepted: \"" << error << "\"";
  std::filesystem::remove_all(n.dir);
}

// A wildcard counts only as the whole left-most label: "*.example.test" covers
// foo.example.test (not a.b.example.test); "f*.example.test" covers nothing.
TEST(Tls, AWildcardCountsOnlyAsTheWholeLeftMostLabel) {
  NamedServer partial =
      StartNamed({.common_name = "x", .subject_alt_names = "DNS:f*.example.test"});
  ASSERT_NE(partial.server, nullptr);
  const std::string refused = OpenAs("foo.example.test", partial.port, TlsFor(partial.pki));
  EXPECT_NE(refused.find("not trusted"), std::string::npos) << "accepted: \"" << refused << "\"";

  NamedServer whole = StartNamed({.common_name = "x", .subject_alt_names = "DNS:*.example.test"});
  ASSERT_NE(whole.server, nullptr);
  std::shared_ptr<TlsConfig> tls = TlsFor(whole.pki);
  EXPECT_EQ(OpenAs("foo.example.test", whole.port, tls), "");
  EXPECT_NE(OpenAs("a.b.example.test", whole.port, tls).find("not trusted"), std::string::npos);
  std::filesystem::remove_all(partial.dir);
  std::filesystem::remove_all(whole.dir);
}

// TLS sessions are kept per host and port: a session verified for localhost is resumed for
// localhost only, and a connection to 127.0.0.1 (which this certificate does not name) makes a
// full handshake, whose host check fails.
TEST(Tls, ASessionIsResumedOnlyForTheHostAndPortItWasVerifiedFor) {
  NamedServer n = StartNamed({.common_name = "localhost", .subject_alt_names = "DNS:localhost"});
  ASSERT_NE(n.server, nullptr);
  std::shared_ptr<TlsConfig> tls = TlsFor(n.pki);
  ASSERT_EQ(OpenAs("localhost", n.port, tls, /*keep_session=*/true), "");
  bool resumed = false;
  ASSERT_EQ(OpenAs("localhost", n.port, tls, false, &resumed), "");
  EXPECT_TRUE(resumed);
  const std::string other = OpenAs("127.0.0.1", n.port, tls);
  EXPECT_NE(other.find("not trusted"), std::string::npos) << "accepted: \"" << other << "\"";
  std::filesystem::remove_all(n.dir);
}

// insecure-skip-tls-verify with a CA is refused, with client-go's words, rather than
// verification silently off.
TEST(Tls, SkipVerifyTogetherWithACaIsRefused) {
  ClusterAccess a;
  a.server = "https://127.0.0.1:6443";
  a.insecure_skip_tls_verify = true;
  a.ca_data = "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n";
  Result<std::shared_ptr<TlsConfig>> tls = MakeTlsConfig(a);
  ASSERT_FALSE(tls.ok());
  EXPECT_NE(tls.status().message().find(
                "specifying a root certificates file with the insecure flag is not allowed"),
            std::string::npos)
      << tls.status().message();
  a.ca_data.clear();
  EXPECT_TRUE(MakeTlsConfig(a).ok());  // skip-verify alone is what it says
}

}  // namespace
}  // namespace gpulet::k8s::http
