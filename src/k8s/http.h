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

// One connection (TCP, maybe TLS) to the endpoint.
class Connection {
 public:
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Connects within `connect_timeout` (and before `deadline`), then completes the TLS handshake
  // when the endpoint is https.
  // The connection keeps `tls` alive (a Client may rebuild its configuration meanwhile).
  static Result<std::unique_ptr<Connection>> Open(const Endpoint& endpoint,
                                                  std::shared_ptr<TlsConfig> tls,
                                                  std::chrono::milliseconds connect_timeout,
                                                  Clock::time_point deadline);

  // True when the idle connection is still usable: nothing to read, no EOF or error pending.
  bool LooksAlive() const;

  // Offers this connection's TLS session for the next new connection to resume (call it after an
  // answer was read: a TLS 1.3 server sends its session ticket after the handshake).
  void KeepTlsSession();
  // True when the TLS handshake resumed an earlier session (no key exchange, no certificates).
  bool ResumedTls() const;

  Status WriteAll(std::string_view data, Clock::time_point deadline);
  // Reads what is available (waits for it until `deadline`, waking at least once a second to check
  // *stop when given): the bytes read, 0 at the end of the stream, or an error (also when *stop
  // became true).
  Result<size_t> ReadSome(char* buf, size_t cap, Clock::time_point deadline,
                          const std::atomic<bool>* stop);

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
};

// Bounds on what a server may send.
inline constexpr size_t kMaxHeaderBytes = 64 * 1024;
inline constexpr size_t kMaxBodyBytes = size_t{1} << 30;

struct ExchangeOptions {
  Clock::time_point deadline = Clock::time_point::max();  // the whole exchange
  std::chrono::seconds idle_timeout{0};  // a body silent this long is broken (0: no bound)
  const std::atomic<bool>* stop = nullptr;
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
// delivered whole.
std::optional<ExchangeError> Exchange(Connection& connection, const Endpoint& endpoint,
                                      const Request& request, const ExchangeOptions& options,
                                      ResponseHead& head,
                                      const BodySink& on_body);

}  // namespace gpulet::k8s::http
