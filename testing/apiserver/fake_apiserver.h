// FakeApiServer: a Kubernetes API server stand-in for tests, over HTTPS on 127.0.0.1 (port 0).
//
// It stores objects by path ("/api/v1/nodes/n1"), starting from recorded API responses
// (testdata/*.json), and behaves as kube-apiserver does where gpulet's code depends on it; each rule
// names the upstream file it follows in fake_apiserver.cc, and tests/differential/apiserver_test.sh
// checks what gpulet's client sees of it against a real kube-apiserver. In short:
//   Errors are Statuses naming the resource as the real server does (configmaps "a" not found,
//          leases.coordination.k8s.io "l" already exists, Operation cannot be fulfilled on …),
//          with details (name, group, kind; causes for 422)
//   GET    <object path> → the object, or a 404 Status
//   GET    <collection> (no watch) → a <Kind>List (items without kind/apiVersion) filtered by
//          fieldSelector (a=b, a!=b; a field the resource cannot select on is 400) and
//          labelSelector (a=b, a!=b, a); /api/v1/pods spans every namespace; limit and continue
//          page it
//   GET    <collection>?watch=1[&fieldSelector][&labelSelector][&resourceVersion=R]
//          [&allowWatchBookmarks=true][&timeoutSeconds=N] → a chunked stream of JSON lines. Without
//          R (or R=0) an ADDED per matching object first; with R every change after R. A MODIFIED
//          whose object starts matching the selectors arrives as ADDED, one that stops matching as
//          DELETED. R older than ExpireVersionsBefore() gets an ERROR 410 event (HTTP 410 with
//          SetGoneAsHttpStatus); ExpireWatches() sends 410 in the middle of open streams and
//          SendWatchError() any other ERROR event, each ending the stream; SendBookmarks() sends a
//          BOOKMARK to streams that asked; timeoutSeconds ends a stream cleanly.
//   POST   <collection> → creates (409 AlreadyExists; 422 for a name that is not a DNS
//          subdomain; 404 for a missing namespace with Options::require_namespaces); uid,
//          creationTimestamp, metadata.namespace (from the URL) and, for resources with a spec,
//          generation are assigned; a pod's status is {phase: Pending}, a node gets the
//          not-ready taint, a namespace its name label
//   PATCH  <object path> → merge / json-patch; strategic merge only where it equals a merge patch
//          (a list or $-directive is refused, 422); a stale metadata.resourceVersion in the patch
//          is 409; a patch that changes nothing bumps no version and sends no event
//   PUT    <object path> → replace (404, 409 on a stale resourceVersion)
//   GET/PATCH/PUT <object path>/status → the status subresource: only `status` changes; a
//          write through the main path of a resource with a status subresource (pods, nodes,
//          namespaces, PDBs, StatefulSets, Deployments, ResourceClaims) keeps the stored status;
//          a ResourceClaim is created with an empty one, as the scheduler's /status write is the
//          only way in
//   ResourceSlices (resource.k8s.io/v1, cluster-scoped) are validated on every write as the
//          real server does where a publisher can go wrong (limits on devices, counter sets,
//          counters, attributes+capacities, taints; devices or sharedCounters; exactly one node
//          selection; driver and nodeName immutable): 422 Invalid naming the field
//   DELETE <collection>[?fieldSelector][&labelSelector] → deletecollection: every matching item,
//          answered as a List of them (the kubelet wipes a node's slices this way)
//   DELETE <object path> → the object's last state for pods, namespaces, ResourceClaims and
//          ResourceSlices, a Success Status naming it for the rest;
//          with DeleteOptions preconditions (409); a pod bound to a node and not
//          finished goes Terminating (deletionTimestamp) and is removed after
//          min(grace period, Options::pod_termination), as its kubelet would
//   POST   .../pods/NAME/binding → 404 without the pod; 409 when metadata.uid differs, the pod is
//          being deleted, has schedulingGates or is bound; sets spec.nodeName and PodScheduled=True
//   POST   .../pods/NAME/eviction → a pod not Running (Succeeded, Failed, Pending) or terminating
//          is deleted regardless of budgets; otherwise every PodDisruptionBudget of the namespace
//          whose selector (matchLabels, matchExpressions) matches: more than one → a Failure
//          Status (code 500) in a 201 answer, none allowed → 429, else decremented and the pod
//          deleted as DELETE does
//   InjectWriteFault() makes the next matching writes fail: 5xx, 429 with Retry-After, a
//   timeout, or a success whose answer is lost.
// Every request must carry `Authorization: Bearer <token>` (401 otherwise); with
// require_client_cert the TLS handshake also demands a certificate signed by the test CA.
// Tests change objects with Put/Delete and cut open watch streams mid-line with BreakWatches.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "k8s/access.h"

namespace gpulet::testing {

// A throwaway CA, a server certificate for 127.0.0.1/localhost and a client certificate, made
// with the openssl command in `dir`.
struct TestPki {
  std::string ca_cert, server_cert, server_key, client_cert, client_key;
};
// The names the server certificate carries: its subject CN and its subjectAltName extension
// ("" for none: a CN-only certificate), for the client's hostname-check tests.
struct ServerCertNames {
  std::string common_name = "127.0.0.1";
  std::string subject_alt_names = "IP:127.0.0.1,DNS:localhost";
};
Result<TestPki> MakeTestPki(const std::string& dir, const ServerCertNames& names = {});

// A recorded API response from testing/apiserver/testdata (e.g. "node.json").
Result<nlohmann::json> LoadRecorded(const std::string& name);

struct RecordedRequest {
  std::string method;
  std::string path;   // without the query
  std::string query;  // raw, e.g. "watch=1&resourceVersion=12"
  std::string content_type;
  int remote_port = 0;  // the client's side of the connection: the same port, the same connection
};

// A fault the next matching writes meet (FakeApiServer::InjectWriteFault).
struct WriteFault {
  enum class Kind {
    kServerError,      // HTTP `code` (500, 503, …) with a Status; nothing is written
    kTooManyRequests,  // 429 with Retry-After: retry_after_seconds; nothing is written
    kTimeout,          // held for `delay`, then 504 Timeout; nothing is written
    kLostAnswer,       // the write happens, then the connection is cut before the answer
  };
  std::string method;       // "POST", "PATCH", "PUT", "DELETE"; empty: every write
  std::string path_prefix;  // the request path starts with it; empty: every path
  Kind kind = Kind::kServerError;
  int code = 500;
  int retry_after_seconds = 1;
  std::chrono::milliseconds delay{0};
  int times = 1;  // how many matching writes meet it
};

class FakeApiServer {
 public:
  struct Options {
    std::string token = "test-token";
    bool require_client_cert = false;
    // How long a gracefully deleted pod stays Terminating at most (its grace period is the
    // other bound): the time its kubelet takes to stop it.
    std::chrono::milliseconds pod_termination{500};
    // A create in a namespace that has no Namespace object here is 404 (namespaces "NS" not
    // found), as on a real server; off by default, for tests that never create namespaces.
    bool require_namespaces = false;
  };

  static Result<std::unique_ptr<FakeApiServer>> Start(const TestPki& pki, Options options);
  ~FakeApiServer();
  FakeApiServer(const FakeApiServer&) = delete;
  FakeApiServer& operator=(const FakeApiServer&) = delete;

  std::string url() const;  // "https://127.0.0.1:PORT"
  // How a k8s::Client reaches this server: its URL, `pki`'s CA and the server's bearer token.
  k8s::ClusterAccess Access(const TestPki& pki) const;

  // Stores the object (its metadata.resourceVersion set to a new version) and notifies watches:
  // ADDED when new, MODIFIED otherwise. Returns the version.
  uint64_t Put(const std::string& object_path, nlohmann::json object);
  void Delete(const std::string& object_path);
  std::optional<nlohmann::json> Object(const std::string& object_path) const;
  uint64_t current_version() const;

  void InjectWriteFault(WriteFault fault);
  // Called before each write is applied, without the server's lock: it may change objects with
  // Put/Delete, as another controller's write racing this one would.
  void BeforeEachWrite(std::function<void(const RecordedRequest&)> hook);
  // A BOOKMARK to every open watch that asked for them (allowWatchBookmarks=true).
  void SendBookmarks();
  // An ERROR event with a 410 Status in the middle of every open watch, which then ends.
  void ExpireWatches();
  // An ERROR event with this Status in every open watch, which then ends.
  void SendWatchError(int code, const std::string& reason, const std::string& message);
  // Cuts every open watch stream in the middle of a line, without the closing chunk.
  void BreakWatches();
  // Ends every open watch stream cleanly (the closing chunk), as a server does at timeoutSeconds.
  void CloseWatches();
  // Watches asking for a version older than `version` get 410 Gone.
  void ExpireVersionsBefore(uint64_t version);
  void SetGoneAsHttpStatus(bool on);

  size_t open_watches() const;
  // Waits (bounded) until at least `n` watch streams are open.
  bool WaitForOpenWatches(size_t n, std::chrono::milliseconds timeout) const;
  std::vector<RecordedRequest> requests() const;

 private:
  struct State;
  FakeApiServer() = default;
  std::shared_ptr<State> state_;
};

}  // namespace gpulet::testing
