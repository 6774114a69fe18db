// The kube-scheduler HTTP extender's verbs (k8s.io/kube-scheduler/extender/v1 JSON, PascalCase
// field names as the scheduler's Go structs marshal them): filter, prioritize and bind, on a
// ClusterView. No sockets here: the HTTP server (metrics/http_server.h) calls these with the
// request body; the API calls go through the injected Binder and PodGetter.
//
//   filter     ExtenderArgs {Pod, Nodes, NodeNames} → ExtenderFilterResult {Nodes, NodeNames,
//              FailedNodes, FailedAndUnresolvableNodes, Error}. Node-cache mode (NodeNames) and
//              full-node mode (Nodes.items) both answered in the mode asked (full-node mode
//              with {"metadata":{"name"}} per passing node: the scheduler reads only names).
//   prioritize ExtenderArgs → HostPriorityList [{Host, Score}], Score 0..MaxExtenderPriority.
//   bind       ExtenderBindingArgs {PodName, PodNamespace, PodUID, Node} → ExtenderBindingResult
//              {Error}: reads the pod from the API server (refused unless its UID is PodUID,
//              it is unbound and not being deleted, and it asks for a memory resource),
//              reserves the units (refused if the pod no longer fits), creates the Binding
//              with the UID as precondition, drops the reservation if that fails. Nothing a
//              filter request said about a pod is kept for a bind.
// A body that is not JSON or lacks the required fields is answered 400. Bodies are read without a
// DOM (extender/request.h); a bind body over kMaxBindBody is refused unread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "extender/view.h"

namespace gpulet::extender {

// The largest request body the extender accepts (HttpOptions::max_body_bytes): ExtenderArgs for
// 5,000 nodes in node-cache mode (names up to 253 bytes, the DNS subdomain maximum: 5,000 × 256 =
// 1.28 MB) with a Pod of up to 1.5 MiB (etcd's default object limit) and room for JSON's longer
// encoding of it. docs/memory-requests.md, "Bounds".
inline constexpr size_t kMaxBodyBytes = 4 << 20;
inline constexpr size_t kMaxBindBody = 16 << 10;

struct Answer {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

// Creates the pod's Binding to `node` (POST .../pods/NAME/binding).
using Binder = std::function<Status(const std::string& ns, const std::string& name,
                                    const std::string& uid, const std::string& node)>;
// GETs a pod from the API server (every bind reads the pod there).
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
  ClusterView& view_;
  Binder binder_;
  PodGetter pods_;
  const MemoryResourceTest is_memory_;

  std::atomic<uint64_t> filter_requests_{0}, prioritize_requests_{0}, bad_requests_{0};
  std::atomic<uint64_t> nodes_passed_{0}, nodes_failed_{0}, nodes_unresolvable_{0};
  std::atomic<uint64_t> binds_ok_{0}, binds_refused_{0}, binds_failed_{0};
};

}  // namespace gpulet::extender
