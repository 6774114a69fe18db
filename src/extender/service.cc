#include "extender/service.h"

#include <spdlog/spdlog.h>

#include <set>

#include "common/listen_address.h"
#include "metrics/collector.h"
#include "metrics/http_server.h"
#include "metrics/web_config.h"

namespace gpulet::extender {

using nlohmann::json;

std::string PathSegment(std::string_view name) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(name.size());
  for (char ch : name) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c == '-' || c == '_' || c == '~' ||
        (c == '.' && name != "." && name != "..")) {
      out += ch;
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string PodPath(const std::string& ns, const std::string& name) {
  return "/api/v1/namespaces/" + PathSegment(ns) + "/pods/" + PathSegment(name);
}

Status CreateBinding(const k8s::Client& client, const std::string& ns, const std::string& name,
                     const std::string& uid, const std::string& node) {
  json binding = {{"apiVersion", "v1"},
                  {"kind", "Binding"},
                  {"metadata", {{"name", name}, {"namespace", ns}}},
                  {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node}}}};
  if (!uid.empty()) binding["metadata"]["uid"] = uid;
  // Within kube-scheduler's extender timeout (httpTimeout, 5 s by default): a write the API
  // server holds longer is given up here, and Bind then reads the pod to learn what happened.
  auto r = client.Post(PodPath(ns, name) + "/binding", binding, std::chrono::seconds(4));
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
            auto r = client_.Get(PodPath(ns, name));
            if (!r.ok()) return r.status();
            return *r;
          }) {
  // LIST + WATCH of both sources.
  objects_ = std::make_unique<k8s::CollectionWatcher>(
      client, "/api/v1/namespaces/" + PathSegment(options_.view.ns) + "/configmaps",
      std::string(kMemoryPoolLabel) + "=true");
  nodes_ = std::make_unique<k8s::CollectionWatcher>(client, "/api/v1/nodes", "");
}

Service::~Service() { Stop(); }

int Service::port() const { return server_ ? server_->port() : 0; }

bool Service::synced() const {
  return objects_->synced() && (!options_.watch_nodes || nodes_->synced());
}

std::set<std::string> FailedNodesOf(const std::string& filter_answer) {
  std::set<std::string> nodes;
  const json a = json::parse(filter_answer, nullptr, /*allow_exceptions=*/false);
  if (!a.is_object()) return nodes;
  for (const char* key : {"FailedNodes", "FailedAndUnresolvableNodes"}) {
    auto it = a.find(key);
    if (it == a.end() || !it->is_object()) continue;
    for (const auto& [name, reason] : it->items()) nodes.insert(name);
  }
  return nodes;
}

Status CheckVerbsListener(const std::string& address, const std::string& web_config_file) {
  auto addr = ParseListenAddress(address);
  if (!addr.ok()) return addr.status();
  if (IsLoopback(addr->host)) return Status::Ok();
  metrics::WebConfig web;
  if (!web_config_file.empty()) {
    auto loaded = metrics::LoadWebConfig(web_config_file);
    if (!loaded.ok()) return loaded.status();
    web = std::move(loaded).value();
  }
  if (!web.tls()) {
    return Status(ErrorCode::kUsage,
                  "--listen " + address +
                      ": plain HTTP is served on loopback only; give a --web-config-file with a "
                      "certificate (tls_server_config) or listen on 127.0.0.1");
  }
  if (!web.require_client_cert) {
    return Status(ErrorCode::kUsage,
                  web_config_file + ": tls_server_config.client_auth_type: the extender serves "
                  "/filter, /prioritize and /bind on " + address +
                  " (not loopback) only to kube-scheduler's client certificate: set "
                  "client_auth_type: RequireAndVerifyClientCert and client_ca_file, or listen on "
                  "127.0.0.1 (docs/security.md)");
  }
  return Status::Ok();
}

Status Service::Start() {
  auto addr = ParseListenAddress(options_.address);
  if (!addr.ok()) return addr.status();
  // Before anything starts: who may call the verbs.
  if (Status s = CheckVerbsListener(options_.address, options_.web_config_file); !s.ok()) {
    return s;
  }
  metrics::HttpOptions o;
  o.address = options_.address;
  o.web_config_file = options_.web_config_file;
  o.threads = options_.threads;
  o.max_body_bytes = options_.max_body_bytes;
  o.max_body_bytes_in_flight = options_.max_body_bytes_in_flight;
  o.max_connections = 256;
  o.idle_timeout = std::chrono::seconds(90);  // the scheduler keeps its connections alive
  auto reply = [](Answer a) {
    return metrics::HttpOptions::PostReply{a.status, std::move(a.content_type), std::move(a.body)};
  };
  o.post_routes["/filter"] = [this, reply](const std::string& b) {
    const auto arrived = std::chrono::steady_clock::now();
    Answer a = extender_.Filter(b);
    // kube-scheduler retries a pod the extender turned away only on a cluster event it watches
    // (a pod, a node), and the end of a reservation (its pod deleted since the last look) is none:
    // without this, the pod waits for an unrelated event or the scheduler's 5-minute flush. So the
    // reservations on the nodes that failed are looked up now (bounded), and if one ended the
    // filter is answered again. Only a lookup begun after this request arrived is fresh enough: a
    // retry comes right after the deletion that caused it, often within moments of an earlier
    // lookup (on kube-scheduler 1.37, a preemptor's retry after its victim's deletion).
    if (a.status == 200 && EndGoneReservationsOn(FailedNodesOf(a.body), arrived)) {
      a = extender_.Filter(b);
    }
    return reply(std::move(a));
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
  reservations_thread_ = std::thread([this] { CheckReservations(); });
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
  spdlog::info("event=extender_started address={} port={} tls={} namespace={}", options_.address,
               server_->port(), server_->tls(), options_.view.ns);
  return Status::Ok();
}

std::string Service::GoneReason(const ClusterView::HeldPod& held) const {
  auto r = client_.Get(PodPath(held.ns, held.name));
  if (!r.ok()) return r.status().code() == ErrorCode::kNotFound ? "deleted" : "";
  const json& pod = *r;
  const json meta = pod.value("metadata", json::object());
  const json spec = pod.value("spec", json::object());
  const json status = pod.value("status", json::object());
  const std::string phase = status.is_object() ? status.value("phase", "") : "";
  const std::string bound = spec.is_object() ? spec.value("nodeName", "") : "";
  if (!meta.is_object() || meta.value("uid", "") != held.uid) {
    return "replaced by a pod of the same name";
  }
  if (!bound.empty() && bound != held.node) return "bound to node " + bound;
  if (phase == "Succeeded" || phase == "Failed") return "phase " + phase;
  return "";
}

bool Service::EndIfGone(const ClusterView::HeldPod& held) {
  const auto started = std::chrono::steady_clock::now();
  const std::string gone = GoneReason(held);
  if (gone.empty()) {
    std::lock_guard lock(checked_mu_);
    auto [it, added] = checked_.emplace(held.uid, started);
    if (!added && it->second < started) it->second = started;
    return false;
  }
  view_.EndReservation(held.uid);
  {
    std::lock_guard lock(checked_mu_);
    checked_.erase(held.uid);
  }
  spdlog::info("event=reservation_ended pod={}/{} uid={} node={} reason=\"{}\"", held.ns,
               held.name, held.uid, held.node, gone);
  return true;
}

void Service::CheckReservations() {
  while (!stop_.WaitFor(options_.reservation_check)) {
    for (const ClusterView::HeldPod& held : view_.Reservations()) EndIfGone(held);
    // Forget the check times of reservations that ended otherwise (the node listed the pod).
    std::set<std::string> held_uids;
    for (const ClusterView::HeldPod& held : view_.Reservations()) held_uids.insert(held.uid);
    std::lock_guard lock(checked_mu_);
    std::erase_if(checked_, [&](const auto& kv) { return !held_uids.count(kv.first); });
  }
}

bool Service::EndGoneReservationsOn(const std::set<std::string>& nodes,
                                    std::chrono::steady_clock::time_point arrived) {
  if (nodes.empty()) return false;
  int looked = 0;
  bool ended = false;
  for (const ClusterView::HeldPod& held : view_.Reservations()) {
    if (looked >= options_.filter_recheck_max) break;
    if (!nodes.count(held.node)) continue;
    {
      std::lock_guard lock(checked_mu_);
      auto it = checked_.find(held.uid);
      if (it != checked_.end() && it->second >= arrived) continue;  // looked up since it came
    }
    ++looked;
    ended = EndIfGone(held) || ended;
  }
  return ended;
}

void Service::Stop() {
  stop_.Stop();
  if (objects_thread_.joinable()) objects_thread_.join();
  if (nodes_thread_.joinable()) nodes_thread_.join();
  if (reservations_thread_.joinable()) reservations_thread_.join();
  if (server_) server_->Stop();
  server_.reset();
}

}  // namespace gpulet::extender
