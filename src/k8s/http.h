// HTTP/1.1 over TCP, with TLS from OpenSSL (loaded when the first https request is made,
// common/openssl_library.h): the transport under k8s::Client. It speaks only what the Kubernetes
// API server needs: one request at a time per connection, bodies with Content-Length, chunked
// answers (watch streams) and answers delimited by the connection's close; keep-alive; a bound on
// every header and body; deadlines on connect, on the whole exchange, and on a silent stream.
//
// It replaced libcurl (docs/benchmarks.md, "DRA kubelet plugin"): Debian's libcurl loads its whole
// dependency tree (GnuTLS, Kerberos, LDAP, SSH, RTMP, ...), 4.5 MiB resident in `gpulet dra`,
// for the one protocol gpulet uses.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "k8s/access.h"

namespace gpulet::k8s::http {

using Clock = std::chrono::steady_clock;

// The server URL of a ClusterAccess, taken apart: "https://[fd00::1]:6443/prefix".
struct Endpoint {
  bool tls = true;
  std::string host;  // without brackets
  std::string port;  // "443" when the URL names none
  std::string path_prefix;  // "" or "/prefix", put in front of every request path
  std::string host_header;  // "host[:port]" as the Host header carries it
  bool host_is_ip = false;
  // Where to connect when it is not `host` (tests, as curl's --connect-to): the certificate is
  // still checked against `host`, and the TLS session cache is still keyed by host and port.
  std::string dial_host;
};
Result<Endpoint> ParseServerUrl(const std::string& server);

// What the TLS side of a connection checks and presents: the CA (or the system's when none is
// given), the client certificate and key, insecure-skip-tls-verify. Built once per Client and
// rebuilt when a CA, certificate or key file changes on disk (service-account CAs rotate).
class TlsConfig;

// Builds the TLS configuration of `access`, or says which file or field is wrong.
Result<std::shared_ptr<TlsConfig>> MakeTlsConfig(const ClusterAccess& access);
// True when a CA, certificate or key file `config` was built from has changed since.
bool TlsConfigIsStale(const TlsConfig& config);

// How a connection notices a peer that is gone without a word (a node powered off, a NAT entry
// dropped): TCP keepalive, first probe after `keepalive_idle` of silence, then every
// `keepalive_interval`, `keepalive_count` unanswered probes and the kernel fails the socket; the
// same total (TCP_USER_TIMEOUT) bounds data the peer never acknowledges. The defaults notice in
// 30 + 3 x 5 = 45 s, what client-go's HTTP/2 health check gives (30 s read idle + 15 s ping).
struct Liveness {
  std::chrono::seconds keepalive_idle{30};
  std::chrono::seconds keepalive_interval{5};
  int keepalive_count = 3;
};

// What Exchange reads from and writes to: a Connection, or a test's or fuzzer's bytes.
class Stream {
 public:
  virtual ~Stream() = default;
  virtual Status WriteAll(std::string_view data, Clock::time_point deadline) = 0;
  // Reads what is available (waits for it until `deadline`, waking at least once a second to check
  // *stop when given): the bytes read, 0 at the end of the stream, or an error (also when *stop
  // became true).
  virtual Result<size_t> ReadSome(char* buf, size_t cap, Clock::time_point deadline,
                                  const std::atomic<bool>* stop) = 0;
};

// One connection (TCP, maybe TLS) to the endpoint.
class Connection final : public Stream {
 public:
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Connects within `connect_timeout` (and before `deadline`), then completes the TLS handshake
  // when the endpoint is https.
  // The connection keeps `tls` alive (a Client may rebuild its configuration meanwhile).
  // The TLS session of an earlier connection to the same host and port is offered for resumption
  // (a resumed session was verified for that host when it was made).
  static Result<std::unique_ptr<Connection>> Open(const Endpoint& endpoint,
                                                  std::shared_ptr<TlsConfig> tls,
                                                  std::chrono::milliseconds connect_timeout,
                                                  Clock::time_point deadline,
                                                  const Liveness& liveness = {});

  // True when the idle connection is still usable: nothing to read, no EOF or error pending.
  bool LooksAlive() const;

  // Offers this connection's TLS session for the next new connection to the same host and port to
  // resume (call it after an answer was read: a TLS 1.3 server sends its session ticket after the
  // handshake).
  void KeepTlsSession();
  // True when the TLS handshake resumed an earlier session (no key exchange, no certificates).
  bool ResumedTls() const;

  Status WriteAll(std::string_view data, Clock::time_point deadline) override;
  Result<size_t> ReadSome(char* buf, size_t cap, Clock::time_point deadline,
                          const std::atomic<bool>* stop) override;

  // The socket, for inspecting its options (tests); never read or written around this class.
  int native_handle() const;

 private:
  struct Impl;
  explicit Connection(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct Request {
  std::string method;  // GET, PATCH, POST, DELETE
  std::string target;  // path and query
  std::vector<std::pair<std::string, std::string>> headers;  // besides Host and Content-Length
  std::string body;    // sent with Content-Length when not empty, or when the method is not GET
};

struct ResponseHead {
  long status = 0;
  long retry_after = 0;     // Retry-After in seconds (bounded to an hour), 0 when absent
  bool reusable = false;    // the connection may carry another request after this body
  long content_length = -1;  // the announced body size (within ExchangeOptions::max_body_bytes)
};

// Bounds on what a server may send.
inline constexpr size_t kMaxHeaderBytes = 64 * 1024;
inline constexpr size_t kMaxBodyBytes = size_t{1} << 30;

struct ExchangeOptions {
  Clock::time_point deadline = Clock::time_point::max();  // the whole exchange
  std::chrono::milliseconds idle_timeout{0};  // a body silent this long is broken (0: no bound)
  const std::atomic<bool>* stop = nullptr;
  // The body's bound: an announced Content-Length over it fails before any byte of the body is
  // read, a chunked or close-delimited body as soon as it grows past it. 0: no bound (a stream
  // whose consumer bounds what it keeps, as a watch bounds each line).
  size_t max_body_bytes = kMaxBodyBytes;
};

// How an exchange failed, for the caller's retry decision.
struct ExchangeError {
  Status status;
  bool nothing_received = false;  // no byte of an answer came: a reused connection had died
  bool stopped = false;           // *stop or on_body ended it
};

// The body of an answer as it arrives, with the answer's head (its status is known before any of
// the body); returning false stops the exchange.
using BodySink = std::function<bool(const ResponseHead& head, std::string_view bytes)>;

// Sends `request` and reads the answer into `head` and on_body. On success the body has been
// delivered whole. The answer's bytes are read once each: framing costs time linear in its size.
std::optional<ExchangeError> Exchange(Stream& connection, const Endpoint& endpoint,
                                      const Request& request, const ExchangeOptions& options,
                                      ResponseHead& head,
                                      const BodySink& on_body);

// Splits a byte stream into newline-terminated lines (a watch: one JSON event per line) in time
// linear in its size, keeping at most `max_line` bytes of an unfinished line.
class LineSplitter {
 public:
  explicit LineSplitter(size_t max_line) : max_line_(max_line) {}
  // Calls on_line for each complete line (without its "\n" or "\r\n") in `bytes` and what came
  // before; false when a line outgrew max_line (the stream is then unusable) or on_line returned
  // false.
  bool Feed(std::string_view bytes, const std::function<bool(std::string_view line)>& on_line);
  bool overflowed() const { return overflowed_; }
  // What is left after the last newline (a stream that ended without one).
  std::string_view rest() const { return pending_; }

 private:
  size_t max_line_;
  std::string pending_;
  bool overflowed_ = false;
};

}  // namespace gpulet::k8s::http
