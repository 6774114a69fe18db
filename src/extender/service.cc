#include "extender/service.h"

#include <spdlog/spdlog.h>

#include "common/listen_address.h"
#include "metrics/collector.h"
#include "metrics/http_server.h"

namespace gpulet::extender {

using nlohmann::json;

Status CreateBinding(const k8s::Client& client, const std::string& ns, const std::string& name,
                     const std::string& uid, const std::string& node) {
  json binding = {{"apiVersion", "v1"},
                  {"kind", "Binding"},
                  {"metadata", {{"name", name}, {"namespace", ns}}},
                  {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node}}}};
  if (!uid.empty()) binding["metadata"]["uid"] = uid;
  auto r = client.Post("/api/v1/namespaces/" + ns + "/pods/" + name + "/binding", binding);
  return r.ok() ? Status::Ok() : r.status();
}

Service::Service(const k8s::Client& client, const Clock& clock, ServiceOptions options)
    : client_(client),
      options_(std::move(options)),
      view_(clock, options_.view),
      extender_(
          view_,
          [this](const std::string& ns, const std::string& name, const std::string& uid,
                 const std::string& node) { return CreateBinding(client_, ns, name, uid, node); },
          [this](const std::string& ns, const std::string& name) -> Result<json> {
            auto r = client_.Get("/api/v1/namespaces/" + ns + "/pods/" + name);
            if (!r.ok()) return r.status();
            return *r;
          }) {
  // LIST + WATCH of both sources.
  objects_ = std::make_unique<k8s::CollectionWatcher>(
      client, "/api/v1/namespaces/" + options_.view.ns + "/configmaps",
      std::string(kMemoryPoolLabel) + "=true");
  nodes_ = std::make_unique<k8s::CollectionWatcher>(client, "/api/v1/nodes", "");
}

Service::~Service() { Stop(); }

int Service::port() const { return server_ ? server_->port() : 0; }

bool Service::synced() const {
  return objects_->synced() && (!options_.watch_nodes || nodes_->synced());
}

Status Service::Start() {
  auto addr = ParseListenAddress(options_.address);
  if (!addr.ok()) return addr.status();
  metrics::HttpOptions o;
  o.address = options_.address;
  o.web_config_file = options_.web_config_file;
  o.threads = options_.threads;
  o.max_body_bytes = options_.max_body_bytes;
  o.max_connections = 256;
  o.idle_timeout = std::chrono::seconds(90);  // the scheduler keeps its connections alive
  auto reply = [](Answer a) {
    return metrics::HttpOptions::PostReply{a.status, std::move(a.content_type), std::move(a.body)};
  };
  o.post_routes["/filter"] = [this, reply](const std::string& b) {
    return reply(extender_.Filter(b));
  };
  o.post_routes["/prioritize"] = [this, reply](const std::string& b) {
    return reply(extender_.Prioritize(b));
  };
  o.post_routes["/bind"] = [this, reply](const std::string& b) { return reply(extender_.Bind(b)); };
  o.routes["/metrics"] = [this] {
    return std::make_pair(std::string("text/plain; version=0.0.4; charset=utf-8"),
                          extender_.Metrics());
  };
  // The server starts once both sources are listed, so /healthz answering at all means ready.
  o.routes["/healthz"] = [] {
    return std::make_pair(std::string("text/plain"), std::string("ok\n"));
  };
  objects_thread_ = std::thread([this] {
    objects_->Run(
        stop_, [this](const std::vector<json>& items) { view_.ReplaceObjects(items); },
        [this](const std::string& type, const json& obj) {
          if (type == "DELETED") {
            view_.RemoveObject(obj.contains("metadata") ? obj["metadata"].value("name", "") : "");
          } else {
            view_.UpsertObject(obj);
          }
        });
  });
  if (options_.watch_nodes) {
    nodes_thread_ = std::thread([this] {
      nodes_->Run(
          stop_, [this](const std::vector<json>& items) { view_.ReplaceNodes(items); },
          [this](const std::string& type, const json& obj) {
            if (type == "DELETED") {
              view_.RemoveNode(obj.contains("metadata") ? obj["metadata"].value("name", "") : "");
            } else {
              view_.UpsertNode(obj);
            }
          });
    });
  }
  // Serve only once both sources have listed: before that every node would look missing.
  const auto deadline = std::chrono::steady_clock::now() + options_.sync_timeout;
  while (!synced()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      Stop();
      return Status(ErrorCode::kUnavailable,
                    "the API server did not list configmaps (" + std::string(kMemoryPoolLabel) +
                        "=true) in " + options_.view.ns + " and nodes within the sync timeout");
    }
    if (stop_.WaitFor(std::chrono::milliseconds(20))) {
      return Status(ErrorCode::kUnavailable, "stopped before the first list");
    }
  }
  unused_publisher_ = std::make_unique<metrics::Publisher>();
  server_ = std::make_unique<metrics::MetricsServer>(*unused_publisher_, o);
  if (Status s = server_->Start(); !s.ok()) {
    Stop();
    return s;
  }
  if (!server_->tls() && !IsLoopback(addr->host)) {
    Stop();
    return Status(ErrorCode::kUsage,
                  "--listen " + options_.address +
                      ": plain HTTP is served on loopback only; give a --web-config-file with a "
                      "certificate (tls_server_config) or listen on 127.0.0.1");
  }
  spdlog::info("event=extender_started address={} port={} tls={} namespace={}", options_.address,
               server_->port(), server_->tls(), options_.view.ns);
  return Status::Ok();
}

void Service::Stop() {
  stop_.Stop();
  if (objects_thread_.joinable()) objects_thread_.join();
  if (nodes_thread_.joinable()) nodes_thread_.join();
  if (server_) server_->Stop();
  server_.reset();
}

}  // namespace gpulet::extender
