// A small Kubernetes API client: GET, PATCH, POST, DELETE and WATCH, which is all gpulet needs,
// over its own HTTP/1.1 transport (k8s/http.h; OpenSSL is loaded on the first https request). One
// Client may be used by several threads at once. GETs keep their connection: a few idle ones are
// pooled per Client (and its copies), so a GET after another pays no TCP or TLS handshake, and a
// GET whose kept connection had died before any answer is sent again on a new one. Writes and
// watches use a new connection each, never resent: a POST or PATCH whose answer was lost after
// the server acted must not be applied twice (client-go's transport retries only idempotent
// ones). A new connection resumes the last TLS session, so a write pays no key exchange either.
//
// Errors: an HTTP error becomes an ApiResult whose Status names the method, path, HTTP code and
// the API server's message (404 → kNotFound, 401/403 → kUnavailable "check RBAC", anything else
// and connection/TLS failures → kUnavailable) and whose http_status() carries the code itself:
// callers branch on the number (429: a PodDisruptionBudget refused an eviction; 409: a conflict),
// never on the message text.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "k8s/access.h"
#include "k8s/http.h"

namespace gpulet::k8s {

enum class PatchType { kMerge, kStrategicMerge, kJsonPatch };

// A Result that also carries the HTTP status of a failed call: 0 when no HTTP answer came (the
// connection or TLS failed, or a 2xx body was not JSON). On success http_status() is 0 too.
// Converts to Result<T> (the status travels in the Status's code and message only).
template <typename T>
class ApiResult : public Result<T> {
 public:
  ApiResult(T value) : Result<T>(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  ApiResult(Status status, long http_status = 0,  // NOLINT(google-explicit-constructor)
            std::chrono::seconds retry_after = std::chrono::seconds(0))
      : Result<T>(std::move(status)), http_status_(http_status), retry_after_(retry_after) {}
  long http_status() const { return http_status_; }
  // The server's Retry-After on a failed call (429, 503; the API server's priority and fairness
  // and its timeout filter send it), in seconds; 0 when it sent none.
  std::chrono::seconds retry_after() const { return retry_after_; }

 private:
  long http_status_ = 0;
  std::chrono::seconds retry_after_{0};
};

struct WatchEvent {
  std::string type;  // ADDED, MODIFIED, DELETED, BOOKMARK, ERROR
  nlohmann::json object;
};

// How a watch stream ended.
enum class WatchEnd {
  kClosed,   // the server ended the stream cleanly (e.g. timeoutSeconds): resume from the last RV
  kBroken,   // the connection failed or the stream was cut mid-way: resume from the last RV
  kGone,     // 410 Gone (HTTP status or ERROR event): the RV is too old, re-list
  kStopped,  // the caller asked to stop (stop flag or on_event returned false)
  kFailed,   // any other HTTP error (403, 404, …): see error
};

struct WatchResult {
  WatchEnd end = WatchEnd::kClosed;
  Status error;  // set for kBroken and kFailed
  long http_status = 0;
};

// What a write returns on success: the object the server answers with, or nothing (null) for a
// caller that only needs to know that the write landed. The answer is checked either way (JSON,
// and not a Failure Status); kNothing builds no tree of it, which for a large object (a
// ResourceSlice of a 16-GPU node is hundreds of KiB of JSON) is megabytes of short-lived
// allocations the process's heap would otherwise keep fragments of.
enum class Answer { kObject, kNothing };

// What an API server may send, per kind of answer (docs/security.md, "The API client"). An answer
// over its bound fails the call (a watch: the stream breaks and the watch loop starts another);
// the bytes are not kept.
// One watch event (one JSON line). The API server refuses objects over 3 MiB (etcd stores at most
// 1.5 MiB), so 16 MiB leaves room for any real object and bounds the tree built from a line.
inline constexpr size_t kMaxWatchLineBytes = size_t{16} << 20;
// The answer to a write (POST, PATCH): one object, or a Status.
inline constexpr size_t kMaxObjectAnswerBytes = size_t{16} << 20;
// The answer to a GET or DELETE, which may be a whole collection (a List). A list larger than this
// needs paging (limit/continue), as client-go's reflector pages its LISTs.
inline constexpr size_t kMaxListAnswerBytes = size_t{256} << 20;
// The body of an HTTP error kept for its message.
inline constexpr size_t kMaxErrorBodyBytes = 64 * 1024;

struct ClientOptions {
  http::Liveness liveness;  // TCP keepalive on every connection: a dead peer noticed in 45 s
  // A watch that receives nothing (no event, no bookmark) this long is broken, and the watch loop
  // starts another. The API server sends a BOOKMARK to a watch that asked for them
  // (allowWatchBookmarks=true) about once a minute, so a healthy stream is never this silent;
  // this catches a server process that hangs while its host still answers TCP keepalives.
  std::chrono::milliseconds watch_silence{std::chrono::seconds(120)};
};

class Client {
 public:
  explicit Client(ClusterAccess access, ClientOptions options = {});

  // GET `path` (e.g. "/api/v1/nodes/n1"): the decoded body.
  ApiResult<nlohmann::json> Get(const std::string& path) const;

  // PATCH `path` with `patch` as merge-patch+json, strategic-merge-patch+json or json-patch+json:
  // the object the server returns.
  ApiResult<nlohmann::json> Patch(const std::string& path, const nlohmann::json& patch,
                                  PatchType type, Answer answer = Answer::kObject) const;

  // POST `body` (application/json) to `path`: the object the server returns. Used to create objects
  // and for subresources such as a pod's eviction. A refused eviction (PDB) is http_status() 429.
  ApiResult<nlohmann::json> Post(const std::string& path, const nlohmann::json& body,
                                 Answer answer = Answer::kObject) const;
  // The same, given up after `timeout` (the default is 30 s): for a caller that must answer
  // its own caller sooner (the extender's bind, inside kube-scheduler's 5 s extender timeout).
  ApiResult<nlohmann::json> Post(const std::string& path, const nlohmann::json& body,
                                 std::chrono::milliseconds timeout) const;

  // DELETE `path`: the server's answer (the object's last state, or a Status). A 404 is
  // kNotFound with http_status() 404: callers that want the object gone treat it as done.
  ApiResult<nlohmann::json> Delete(const std::string& path) const;

  // Streams a watch (`path` includes the query, with watch=1) and calls on_event for each JSON
  // line until the stream ends, on_event returns false, or *stop becomes true (checked at least
  // once a second). An ERROR event with code 410 ends it as kGone without calling on_event. A
  // line over kMaxWatchLineBytes, or a stream silent for options.watch_silence, ends it as kBroken.
  WatchResult Watch(const std::string& path, const std::function<bool(const WatchEvent&)>& on_event,
                    const std::atomic<bool>* stop) const;

  const ClusterAccess& access() const { return access_; }

  struct HandlePool;  // idle GET handles with their live connections (client.cc)

 private:
  ClusterAccess access_;
  ClientOptions options_;
  std::shared_ptr<HandlePool> pool_;
};

// Percent-encodes a query value (fieldSelector=metadata.name%3Dnode-1).
std::string EscapeQueryValue(const std::string& value);

}  // namespace gpulet::k8s
