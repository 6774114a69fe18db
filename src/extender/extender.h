// The kube-scheduler HTTP extender's verbs (k8s.io/kube-scheduler/extender/v1 JSON, PascalCase
// field names as the scheduler's Go structs marshal them): filter, prioritize and bind, on a
// ClusterView. No sockets here: the HTTP server (metrics/http_server.h) calls these with the
// request body; the API calls go through the injected Binder and PodGetter.
//
//   filter     ExtenderArgs {Pod, Nodes, NodeNames} → ExtenderFilterResult {Nodes, NodeNames,
//              FailedNodes, FailedAndUnresolvableNodes, Error}. Node-cache mode (NodeNames) and
//              full-node mode (Nodes.items) both answered in the mode asked.
//   prioritize ExtenderArgs → HostPriorityList [{Host, Score}], Score 0..MaxExtenderPriority.
//   bind       ExtenderBindingArgs {PodName, PodNamespace, PodUID, Node} → ExtenderBindingResult
//              {Error}: reserves the units (refused if the pod no longer fits), creates the
//              Binding, drops the reservation if that fails.
// A body that is not JSON or lacks the required fields is answered 400.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>

#include "extender/view.h"

namespace gpulet::extender {

struct Answer {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

// Creates the pod's Binding to `node` (POST .../pods/NAME/binding).
using Binder = std::function<Status(const std::string& ns, const std::string& name,
                                    const std::string& uid, const std::string& node)>;
// GETs a pod (for a bind whose pod was not seen by filter).
using PodGetter =
    std::function<Result<nlohmann::json>(const std::string& ns, const std::string& name)>;

class Extender {
 public:
  Extender(ClusterView& view, Binder binder, PodGetter pods);

  Answer Filter(const std::string& body);
  Answer Prioritize(const std::string& body);
  Answer Bind(const std::string& body);

  // Prometheus text exposition of the extender's counters and the view's gauges.
  std::string Metrics() const;

 private:
  void Remember(const PodRequest& pod);
  std::optional<PodRequest> Recall(const std::string& uid, const std::string& key);

  ClusterView& view_;
  Binder binder_;
  PodGetter pods_;

  std::mutex pods_mu_;  // the pods seen by filter, by UID, for bind (bounded, oldest dropped)
  std::unordered_map<std::string, PodRequest> seen_;
  std::deque<std::string> seen_order_;

  std::atomic<uint64_t> filter_requests_{0}, prioritize_requests_{0}, bad_requests_{0};
  std::atomic<uint64_t> nodes_passed_{0}, nodes_failed_{0}, nodes_unresolvable_{0};
  std::atomic<uint64_t> binds_ok_{0}, binds_refused_{0}, binds_failed_{0};
};

}  // namespace gpulet::extender
