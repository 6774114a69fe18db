// The exporter's HTTP endpoint: /metrics (text 0.0.4, or OpenMetrics when the Accept header asks
// for application/openmetrics-text), /health, and a small index page at /.
//
// Bounded under abuse (a scrape port is reachable by every pod on the node):
// - One event thread (epoll) holds every connection, so an idle keep-alive client or a slow
//   sender costs a file descriptor, never a worker: /health and /metrics stay answerable.
// - At most `max_connections` are open; a new connection beyond that closes the one that has
//   been quiet the longest (a flood of idle connections cannot lock scrapers out), never one
//   whose request is being worked on (a password check, a POST handler); when every connection
//   is, the new one is closed instead.
// - A request's headers must arrive within `request_timeout` (else the connection is closed) and
//   fit in `max_header_bytes` (else 431 and close); a keep-alive connection is closed after
//   `idle_timeout`; a response the client does not read within `write_timeout` is abandoned.
//   Request bodies are refused (413). Requests are parsed with Boost.Beast's HTTP/1.1 parser (the
//   grammar: a space before a colon, a line without one, a repeated or signed Content-Length,
//   an unknown version are 400), plus what Go's net/http adds (HTTP/1.1 needs exactly one Host);
//   connections, timeouts and budgets stay ours.
// - Responses are the collector's immutable renderings, written as they are (no per-scrape copy).
// - Basic auth: checked on the headers, before a byte of the body is read or a body budget is
//   granted. A checked Authorization value (good or bad) is remembered, so neither Prometheus
//   nor a client retrying a wrong password pays a bcrypt each time. Unknown values are checked
//   on `password_check_threads` worker(s) (one by default: unauthenticated clients get one core
//   at most), one at a time per connection (a connection waiting for its check reads nothing),
//   at most `max_pending_auth` queued; beyond that the answer is 429 at once.
// - TLS (web config) is OpenSSL on the same non-blocking sockets, handshake inside the request
//   timeout. The certificate, key and client CA files are looked at (stat) on every new
//   connection, as exporter-toolkit re-reads them per handshake: changed files are loaded for
//   the connections that follow; files that do not load keep the previous ones (logged). OpenSSL
//   is loaded (dlopen, common/openssl_library.h) only when the web config asks for it: libcrypto
//   for basic auth or TLS, libssl for TLS.
// - A client that shuts down its sending side (FIN) is taken as gone for a POST not yet started:
//   the job is dropped and the connection closed, as Go cancels a request's context at EOF. A
//   handler already running (a bind) runs to its end and its answer is written to the
//   half-closed connection before it is closed.
// - Out of descriptors (EMFILE/ENFILE) with no idle connection to shed, accepting pauses 5 ms,
//   doubling to 1 s, as Go's http.Server does, instead of spinning.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "common/status.h"
#include "metrics/collector.h"
#include "metrics/web_config.h"

namespace gpulet::metrics {

struct HttpOptions {
  std::string address = ":9400";  // [host]:port; ":9400" = every interface; port 0 = any free port
  std::string web_config_file;    // optional, see web_config.h
  int threads = 4;                // POST handler workers; serving is one event thread
  int password_check_threads = 1;  // bcrypt workers for credentials not seen before
  int write_timeout_s = 10;
  // /health fails when the last collection is older than this (0 = never).
  std::chrono::milliseconds stale_after{0};
  size_t max_connections = 512;
  size_t max_header_bytes = 8192;
  std::chrono::milliseconds request_timeout{5000};  // accept (or last response) → full headers
  std::chrono::milliseconds idle_timeout{5000};     // keep-alive with no request
  int max_requests_per_connection = 1000;
  size_t max_pending_auth = 64;
  // Extra GET paths (path → {content type, body}), answered before the built-in ones, under the
  // same bounds and authentication. Handlers run on the event thread: they must be quick (render
  // from state kept elsewhere). The broker serves its /metrics and /status this way.
  std::map<std::string, std::function<std::pair<std::string, std::string>()>> routes;
  // Extra POST paths (path → handler of the request body). Only these accept a body: its
  // Content-Length at most max_body_bytes (else 413; chunked bodies get 411). Handlers run on
  // `threads` worker thread(s), not on the event thread, so they may block (the scheduler
  // extender's bind calls the API server); at most max_pending_posts wait, beyond that 503.
  struct PostReply {
    int status = 200;
    std::string content_type = "application/json";
    std::string body;
  };
  std::map<std::string, std::function<PostReply(const std::string& body)>> post_routes;
  size_t max_body_bytes = 16 << 20;
  // POST bodies held at once (received, queued or being handled), in bytes; a body that does not
  // fit waits, unread, until earlier ones are done (arrival order, within post_timeout). One
  // body is always let through. 0: no bound beyond max_connections × max_body_bytes.
  size_t max_body_bytes_in_flight = 0;
  size_t max_pending_posts = 1024;
  std::chrono::milliseconds post_timeout{30000};  // body complete → handler's answer written
};

// Counters, for tests and the log line at Stop().
struct HttpStats {
  uint64_t accepted = 0;
  uint64_t evicted = 0;    // closed to make room for a new connection
  uint64_t refused = 0;    // new connections closed: every open one had a request in flight
  uint64_t timed_out = 0;  // request, idle or write timeout
  uint64_t too_large = 0;  // headers over max_header_bytes
  uint64_t responses = 0;
  uint64_t auth_checks = 0;     // passwords actually checked (bcrypt)
  uint64_t auth_throttled = 0;  // 429: too many unknown credentials waiting
  uint64_t auth_parallel_peak = 0;  // most password checks that ran at once
  uint64_t posts_queued = 0;        // POST jobs handed to the workers
  uint64_t posts_dropped = 0;       // queued POST jobs dropped: their client left first
  uint64_t half_closed = 0;         // clients that shut down their side while a handler ran
  uint64_t accept_errors = 0;       // accept() out of descriptors (EMFILE/ENFILE)
  uint64_t tls_reloads = 0;         // certificate/key/CA files loaded again after a change
  uint64_t tls_reload_failures = 0;  // changed files that did not load (the old ones kept)
};

// One request's head as the server reads it: Boost.Beast's HTTP/1.1 parser for the grammar, and
// Go's net/http's checks on top (exactly one Host for HTTP/1.1, at most one for HTTP/1.0).
struct RequestHead {
  std::string method;
  std::string path;  // the target without its query
  bool http10 = false;
  std::string authorization;
  std::string accept;
  std::string connection;  // lower case
  bool has_body = false;   // a Content-Length above 0, or any Transfer-Encoding
  bool chunked = false;
  size_t content_length = 0;
};
enum class HeadParse { kIncomplete, kComplete, kBad, kTooLarge };
// Parses the head at the front of `in`; kComplete sets `*head_bytes` (the body follows).
HeadParse ParseRequestHead(std::string_view in, size_t max_header_bytes, RequestHead* head,
                           size_t* head_bytes);

class MetricsServer {
 public:
  MetricsServer(const Publisher& publisher, HttpOptions options);
  ~MetricsServer();  // Stop()s
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Loads the web config, binds (errors: kUsage for a bad address, kInvalidInput for the web
  // config, kUnavailable when the port cannot be bound) and serves on a thread.
  Status Start();
  void Stop();
  int port() const { return port_; }
  bool tls() const { return tls_; }
  HttpStats stats() const;

  class Loop;  // the event loop (http_server.cc)

 private:
  const Publisher& publisher_;
  HttpOptions options_;
  std::unique_ptr<Loop> loop_;
  int port_ = 0;
  bool tls_ = false;
};

}  // namespace gpulet::metrics
