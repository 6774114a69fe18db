// FakeApiServer: a Kubernetes API server stand-in for tests, over HTTPS on 127.0.0.1 (port 0).
//
// It stores objects by path ("/api/v1/nodes/n1"), starting from recorded API responses
// (testdata/*.json), and serves what gpulet's client uses:
//   GET    <object path>                         → the object, or a 404 Status
//   PATCH  <object path>                         → merge / strategic-merge (as a JSON merge
//                                                  patch) / json-patch; bumps resourceVersion
//   GET    <collection>?watch=1&fieldSelector=metadata.name=X[&resourceVersion=R]
//          → a chunked stream of JSON lines {"type","object"}: without R an ADDED for the current
//            object, with R every recorded change newer than R, then changes as they happen. R
//            older than ExpireVersionsBefore() gets an ERROR event with a 410 Status (as a real
//            server answers a compacted version), or HTTP 410 when SetGoneAsHttpStatus(true).
//   GET    <collection> (no watch)               → a List of the stored objects directly under it
//          (/api/v1/pods also spans every namespace), filtered by fieldSelector (a=b, a!=b on
//          dotted fields such as spec.nodeName, status.phase) and labelSelector (a=b, a!=b, a)
//   POST   <collection>                          → creates the object named by metadata.name
//                                                  (409 AlreadyExists when present)
//   POST   .../pods/NAME/eviction                → Eviction: 404 without the pod; 429 when a
//          PodDisruptionBudget of its namespace (/apis/policy/v1/namespaces/NS/
//          poddisruptionbudgets/*) selects it by spec.selector.matchLabels and has
//          status.disruptionsAllowed < 1; otherwise the pod is deleted (and the PDB's allowance
//          decremented)
//   PATCH  with metadata.resourceVersion in a merge patch → 409 Conflict when it is stale
//   POST   .../pods/NAME/binding                 → sets the pod's spec.nodeName to target.name;
//          404 without the pod, 409 when already bound or metadata.uid differs
//   GET    <collection>?watch=1[&labelSelector=..][&resourceVersion=R] (no metadata.name field
//          selector) → the same stream for every object of the collection the selectors match
// Every request must carry `Authorization: Bearer <token>` (401 otherwise); with
// require_client_cert the TLS handshake also demands a certificate signed by the test CA.
// Tests change objects with Put/Delete and cut open watch streams mid-line with BreakWatches.
#pragma once

#include <chrono>
#include <cstdint>
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
Result<TestPki> MakeTestPki(const std::string& dir);

// A recorded API response from testing/apiserver/testdata (e.g. "node.json").
Result<nlohmann::json> LoadRecorded(const std::string& name);

struct RecordedRequest {
  std::string method;
  std::string path;   // without the query
  std::string query;  // raw, e.g. "watch=1&resourceVersion=12"
  std::string content_type;
};

class FakeApiServer {
 public:
  struct Options {
    std::string token = "test-token";
    bool require_client_cert = false;
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
