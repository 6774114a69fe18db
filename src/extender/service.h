// The running extender: the cluster view fed by two collection watches (the per-node GPU memory
// ConfigMaps, label gpulet.io/memory-pool=true, in gpulet's namespace; and the Nodes), the verbs
// served over the bounded HTTP server (POST /filter, /prioritize, /bind; GET /healthz, /metrics),
// and binds made through the API (POST .../pods/NAME/binding).
//
// Serving: the verbs bind pods of every namespace, so a listener that is not loopback must be
// mutual TLS (a web config file in the exporter's format, metrics/web_config.h, with
// client_auth_type: RequireAndVerifyClientCert): only a client with a certificate of the client
// CA (kube-scheduler's) gets an answer. On a loopback address (127.0.0.0/8, ::1, localhost) TLS
// and client certificates are optional: only processes in the extender's network namespace reach
// it (a sidecar in kube-scheduler's pod; with hostNetwork, every process of the node).
// Start() returns once both watches have listed (the server opens only then; /healthz is 200).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>

#include "common/clock.h"
#include "common/status.h"
#include "extender/extender.h"
#include "extender/view.h"
#include "k8s/client.h"
#include "k8s/watch.h"

namespace gpulet::metrics {
class MetricsServer;
class Publisher;
}  // namespace gpulet::metrics

namespace gpulet::extender {

struct ServiceOptions {
  std::string address = "127.0.0.1:8888";
  std::string web_config_file;            // TLS certificate (and optional basic auth)
  int threads = 8;                        // workers for the verbs (bind blocks on the API server)
  size_t max_body_bytes = kMaxBodyBytes;  // extender.h: a 5,000-node NodeNames request
  // Bodies held at once (HttpOptions::max_body_bytes_in_flight): one per worker at the largest.
  size_t max_body_bytes_in_flight = 8 * kMaxBodyBytes;
  // How often the pods of reservations are looked up: a reservation ends when its pod is gone,
  // replaced (another UID), bound to another node or finished (an unbound pod keeps it: its
  // Binding may be on its way).
  std::chrono::milliseconds reservation_check{5000};
  // At /filter, the reservations on the nodes that failed are looked up at once (at most this many
  // per request), so a pod kube-scheduler retries finds the units of a pod deleted since the last
  // look free (the scheduler sees no event for the reservation's end). A lookup counts only if it
  // started after the request arrived: the deletion that made the scheduler retry happened before
  // the request, so an earlier lookup (the periodic one, another filter's) may predate it.
  int filter_recheck_max = 16;
  ViewOptions view;  // view.ns: where the per-node objects live
  bool watch_nodes = true;
  std::chrono::milliseconds sync_timeout{60000};
};

// A name as one segment of an API path: every byte but [A-Za-z0-9-._~] percent-encoded (and "."
// and ".." whole), so a name holding "/", "?" or "%" cannot change the path.
std::string PathSegment(std::string_view name);

// Whether `address` may serve the verbs with `web_config_file` (see above): kUsage naming the
// file and field when not, kInvalidInput/kNotFound for a web config that does not load.
Status CheckVerbsListener(const std::string& address, const std::string& web_config_file);

// The node names in FailedNodes and FailedAndUnresolvableNodes of an ExtenderFilterResult.
std::set<std::string> FailedNodesOf(const std::string& filter_answer);

// POST .../pods/NAME/binding through `client`, with metadata.uid as the precondition.
Status CreateBinding(const k8s::Client& client, const std::string& ns, const std::string& name,
                     const std::string& uid, const std::string& node);

class Service {
 public:
  Service(const k8s::Client& client, const Clock& clock, ServiceOptions options);
  ~Service();  // Stop()s
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  // Starts the watches, waits for their first lists (kUnavailable after sync_timeout), then
  // serves (errors, before anything starts: kUsage for a listener that is not loopback without
  // TLS client certificates (CheckVerbsListener); then the server's).
  Status Start();
  void Stop();

  int port() const;
  bool synced() const;
  ClusterView& view() { return view_; }
  Extender& extender() { return extender_; }

 private:
  const k8s::Client& client_;
  ServiceOptions options_;
  ClusterView view_;
  Extender extender_;
  std::unique_ptr<k8s::CollectionWatcher> objects_;  // the per-node GPU memory ConfigMaps
  std::unique_ptr<k8s::CollectionWatcher> nodes_;
  k8s::StopSignal stop_;
  void CheckReservations();
  // Why the pod of `held` no longer needs its units, as the API server shows it ("" while it does,
  // or when the API server did not answer).
  std::string GoneReason(const ClusterView::HeldPod& held) const;
  bool EndIfGone(const ClusterView::HeldPod& held);  // true: the reservation ended
  // The reservations on `nodes` not looked up since `arrived` (a filter request's arrival).
  bool EndGoneReservationsOn(const std::set<std::string>& nodes,
                             std::chrono::steady_clock::time_point arrived);
  std::mutex checked_mu_;
  // uid -> when the last lookup that found the pod still holding its units started
  std::map<std::string, std::chrono::steady_clock::time_point> checked_;

  std::thread objects_thread_, nodes_thread_, reservations_thread_;
  std::unique_ptr<metrics::Publisher> unused_publisher_;  // the server's own /metrics is replaced
  std::unique_ptr<metrics::MetricsServer> server_;
};

}  // namespace gpulet::extender
