#include "metrics/http_server.h"

#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace gpulet::metrics {

Result<std::pair<std::string, int>> ParseListenAddress(const std::string& address) {
  std::string host;
  std::string port_text;
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return Status(ErrorCode::kUsage, "bad listen address \"" + address + "\" (want [host]:port)");
    }
    host = address.substr(1, close - 1);
    port_text = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos) {
      return Status(ErrorCode::kUsage, "bad listen address \"" + address + "\" (want [host]:port, e.g. :9400)");
    }
    host = address.substr(0, colon);
    port_text = address.substr(colon + 1);
  }
  if (host.empty()) host = "0.0.0.0";
  if (port_text.empty() || port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return Status(ErrorCode::kUsage, "bad port in listen address \"" + address + "\"");
  }
  const int port = std::stoi(port_text);
  if (port > 65535) return Status(ErrorCode::kUsage, "port out of range in \"" + address + "\"");
  return std::make_pair(host, port);
}

MetricsServer::MetricsServer(const Publisher& publisher, HttpOptions options)
    : publisher_(publisher), options_(std::move(options)) {}

MetricsServer::~MetricsServer() { Stop(); }

Status MetricsServer::Start() {
  auto addr = ParseListenAddress(options_.address);
  if (!addr.ok()) return addr.status();
  WebConfig web;
  if (!options_.web_config_file.empty()) {
    auto loaded = LoadWebConfig(options_.web_config_file);
    if (!loaded.ok()) return loaded.status();
    web = std::move(loaded).value();
  }
  if (web.tls()) {
    auto ssl = std::make_unique<httplib::SSLServer>(
        web.cert_file.c_str(), web.key_file.c_str(),
        web.require_client_cert ? web.client_ca_file.c_str() : nullptr);
    if (!ssl->is_valid()) {
      return Status(ErrorCode::kInvalidInput, options_.web_config_file +
                                                  ": cannot load TLS certificate/key (" +
                                                  web.cert_file + ", " + web.key_file + ")");
    }
    if (web.min_tls_version != 0) {
      const int v = web.min_tls_version == 10   ? TLS1_VERSION
                    : web.min_tls_version == 11 ? TLS1_1_VERSION
                    : web.min_tls_version == 12 ? TLS1_2_VERSION
                                                : TLS1_3_VERSION;
      SSL_CTX_set_min_proto_version(ssl->ssl_context(), v);
    }
    server_ = std::move(ssl);
    tls_ = true;
  } else {
    server_ = std::make_unique<httplib::Server>();
  }
  auth_ = std::make_unique<BasicAuth>(web.users);

  const int threads = std::max(1, options_.threads);
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_->set_read_timeout(5, 0);
  server_->set_write_timeout(options_.write_timeout_s, 0);
  server_->set_keep_alive_timeout(30);
  server_->set_keep_alive_max_count(1000);
  server_->set_payload_max_length(4096);
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which would let a second
  // exporter bind the same port and silently take half the scrapes.
  server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    // Inherited by accepted sockets: headers and body go out in separate writes, and without
    // it Nagle + the client's delayed ACK add ~40 ms to a scrape.
    setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
  });
  const auto headers = web.headers;
  server_->set_pre_routing_handler(
      [this, headers](const httplib::Request& req, httplib::Response& res) {
        for (const auto& [k, v] : headers) res.set_header(k, v);
        if (!auth_->enabled() || auth_->Check(req.get_header_value("Authorization"))) {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        res.status = 401;
        res.set_header("WWW-Authenticate", "Basic");
        res.set_content("Unauthorized\n", "text/plain");
        return httplib::Server::HandlerResponse::Handled;
      });

  server_->Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
    std::shared_ptr<const Rendered> r = publisher_.Current();
    if (!r) {
      res.status = 503;
      res.set_content("no collection yet\n", "text/plain");
      return;
    }
    const bool om = req.get_header_value("Accept").find("application/openmetrics-text") !=
                    std::string::npos;
    const std::string* body = om ? &r->openmetrics : &r->text;
    // The provider keeps the rendering alive for as long as the response is being written.
    res.set_content_provider(
        body->size(), std::string(om ? kOpenMetricsContentType : kText004ContentType),
        [r, body](size_t offset, size_t length, httplib::DataSink& sink) {
          const size_t n = std::min(length, body->size() - offset);
          return sink.write(body->data() + offset, n);
        });
  });
  server_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    std::shared_ptr<const Rendered> r = publisher_.Current();
    if (!r) {
      res.status = 503;
      res.set_content("KO: no collection yet\n", "text/plain");
      return;
    }
    if (options_.stale_after.count() > 0) {
      const auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
      if (now_ms - r->collected_at_ms > options_.stale_after.count()) {
        res.status = 503;
        res.set_content("KO: last collection " + std::to_string(now_ms - r->collected_at_ms) +
                            " ms ago\n",
                        "text/plain");
        return;
      }
    }
    res.set_content("OK\n", "text/plain");
  });
  server_->Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(
        "<html><head><title>gpulet exporter</title></head><body><h1>gpulet exporter</h1>"
        "<p><a href=\"/metrics\">Metrics</a> <a href=\"/health\">Health</a></p></body></html>\n",
        "text/html");
  });

  const auto& [host, port] = *addr;
  if (port == 0) {
    port_ = server_->bind_to_any_port(host);
    if (port_ <= 0) return Status(ErrorCode::kUnavailable, "cannot listen on " + options_.address);
  } else {
    if (!server_->bind_to_port(host, port)) {
      return Status(ErrorCode::kUnavailable, "cannot listen on " + options_.address +
                                                 " (address in use or not permitted)");
    }
    port_ = port;
  }
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  // stop() is a no-op until the loop runs; wait for it so an early Stop() cannot be lost.
  for (int i = 0; i < 5000 && !server_->is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  spdlog::info("event=listening address={} port={} tls={} basic_auth={} threads={}",
               options_.address, port_, tls_, auth_->enabled(), threads);
  return Status::Ok();
}

void MetricsServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace gpulet::metrics
