// The exporter's HTTP endpoint: /metrics (text 0.0.4, or OpenMetrics when the Accept header asks
// for application/openmetrics-text), /health, and a small index page at /.
//
// Bounded: a fixed pool of worker threads, read/write timeouts so a slow client holds a worker for
// at most the write timeout, request bodies refused, and response bodies shared — every scrape
// writes the same immutable rendering (no per-scrape copy or rendering).
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "common/status.h"
#include "metrics/collector.h"
#include "metrics/web_config.h"

namespace httplib {
class Server;
}

namespace gpulet::metrics {

struct HttpOptions {
  std::string address = ":9400";  // [host]:port; ":9400" = every interface; port 0 = any free port
  std::string web_config_file;    // optional, see web_config.h
  int threads = 4;
  int write_timeout_s = 10;
  // /health fails when the last collection is older than this (0 = never).
  std::chrono::milliseconds stale_after{0};
};

// "host:port" → (host, port). ":9400" → ("0.0.0.0", 9400); "[::1]:9400" → ("::1", 9400).
Result<std::pair<std::string, int>> ParseListenAddress(const std::string& address);

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

 private:
  const Publisher& publisher_;
  HttpOptions options_;
  std::unique_ptr<BasicAuth> auth_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  bool tls_ = false;
};

}  // namespace gpulet::metrics
