#include "k8s/client.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <vector>

#include "k8s/http.h"

namespace gpulet::k8s {
namespace {

constexpr std::chrono::seconds kConnectTimeout{10};

std::string ReadToken(const ClusterAccess& a) {
  if (a.token_file.empty()) return a.token;
  std::ifstream in(a.token_file);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string t = ss.str();
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ')) t.pop_back();
  return t;
}

http::Request MakeRequest(const ClusterAccess& a, const std::string& method,
                          const std::string& path, const std::string& content_type,
                          std::string body) {
  http::Request r;
  r.method = method;
  r.target = path;
  r.headers.emplace_back("Accept", "application/json");
  r.headers.emplace_back("User-Agent", "gpulet");
  const std::string token = ReadToken(a);
  if (!token.empty()) r.headers.emplace_back("Authorization", "Bearer " + token);
  if (!content_type.empty()) r.headers.emplace_back("Content-Type", content_type);
  r.body = std::move(body);
  return r;
}

// "METHOD PATH: HTTP 403: <message from the Status body>" as a Status.
Status HttpError(const std::string& method, const std::string& path, long code,
                 const std::string& body) {
  std::string message;
  nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("message") && j["message"].is_string()) {
    message = j["message"].get<std::string>();
  } else {
    message = body.substr(0, 200);
  }
  std::string text = method + " " + path + ": HTTP " + std::to_string(code) + ": " + message;
  if (code == 404) return {ErrorCode::kNotFound, text};
  if (code == 401 || code == 403) {
    return {ErrorCode::kUnavailable, text + " (check the token and gpulet's RBAC)"};
  }
  return {ErrorCode::kUnavailable, text};
}

}  // namespace

// What a Client and its copies share: the parsed server URL, the TLS configuration (built on the
// first https request, rebuilt when a CA, certificate or key file changes), and at most kMaxIdle
// idle connections that GETs left open. A connection whose exchange failed is not kept.
struct Client::HandlePool {
  static constexpr size_t kMaxIdle = 4;
  std::mutex mu;
  std::shared_ptr<http::TlsConfig> tls;
  std::vector<std::unique_ptr<http::Connection>> idle;

  std::unique_ptr<http::Connection> Take() {
    std::lock_guard<std::mutex> lock(mu);
    while (!idle.empty()) {
      std::unique_ptr<http::Connection> c = std::move(idle.back());
      idle.pop_back();
      if (c->LooksAlive()) return c;
    }
    return nullptr;
  }
  void Give(std::unique_ptr<http::Connection> c) {
    std::lock_guard<std::mutex> lock(mu);
    if (idle.size() < kMaxIdle) idle.push_back(std::move(c));
  }
  // The TLS configuration to connect with (null for http://).
  Result<std::shared_ptr<http::TlsConfig>> Tls(const ClusterAccess& a, const http::Endpoint& e) {
    if (!e.tls) return std::shared_ptr<http::TlsConfig>();
    std::lock_guard<std::mutex> lock(mu);
    if (tls && !http::TlsConfigIsStale(*tls)) return tls;
    Result<std::shared_ptr<http::TlsConfig>> made = http::MakeTlsConfig(a);
    if (!made.ok()) return made.status();
    if (tls) idle.clear();  // connections made with the old configuration
    tls = *made;
    return tls;
  }
};

namespace {

// One request on a pooled connection (GETs) or a fresh one (writes, watches): a GET whose reused
// connection had died before any byte of an answer is sent again on a fresh one; a write never is.
struct Outcome {
  http::ResponseHead head;
  std::optional<http::ExchangeError> error;
};

Outcome RoundTrip(const ClusterAccess& a, const ClientOptions& client_options,
                  Client::HandlePool& pool, const http::Request& req,
                  const http::ExchangeOptions& options, bool reuse,
                  const http::BodySink& on_body) {
  Outcome out;
  Result<http::Endpoint> endpoint = http::ParseServerUrl(a.server);
  if (!endpoint.ok()) {
    out.error = http::ExchangeError{endpoint.status()};
    return out;
  }
  Result<std::shared_ptr<http::TlsConfig>> tls = pool.Tls(a, *endpoint);
  if (!tls.ok()) {
    out.error = http::ExchangeError{tls.status()};
    return out;
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::unique_ptr<http::Connection> c = reuse && attempt == 0 ? pool.Take() : nullptr;
    const bool reused = c != nullptr;
    if (!c) {
      Result<std::unique_ptr<http::Connection>> opened = http::Connection::Open(
          *endpoint, *tls, std::chrono::duration_cast<std::chrono::milliseconds>(kConnectTimeout),
          options.deadline, client_options.liveness);
      if (!opened.ok()) {
        out.error = http::ExchangeError{opened.status(), true};
        return out;
      }
      c = std::move(*opened);
    }
    out.head = http::ResponseHead{};
    out.error = http::Exchange(*c, *endpoint, req, options, out.head, on_body);
    if (!out.error) {
      if (!reused) c->KeepTlsSession();
      if (reuse && out.head.reusable) pool.Give(std::move(c));
      return out;
    }
    if (!(reused && out.error->nothing_received && !out.error->stopped)) return out;
  }
  return out;
}

// The top-level "kind", "status" and "code" of an answer: what says it is a Failure Status.
struct StatusFields {
  std::string kind, status;
  std::optional<long> code;
  bool IsFailure() const { return kind == "Status" && status == "Failure"; }
};

StatusFields StatusFieldsOf(const nlohmann::json& j) {
  StatusFields f;
  if (!j.is_object()) return f;
  // Only string values count: an object's "status" (a Pod's, say) is itself an object.
  if (auto it = j.find("kind"); it != j.end() && it->is_string()) f.kind = *it;
  if (auto it = j.find("status"); it != j.end() && it->is_string()) f.status = *it;
  if (auto it = j.find("code"); it != j.end() && it->is_number_integer()) f.code = it->get<long>();
  return f;
}

// The same fields read by a SAX pass, without building the answer's tree (Answer::kNothing).
class StatusFieldsReader final : public nlohmann::json::json_sax_t {
 public:
  StatusFields fields;

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t v) override { return Code(v); }
  bool number_unsigned(number_unsigned_t v) override { return Code(static_cast<long>(v)); }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t& v) override {
    if (depth_ == 1 && key_ == "kind") fields.kind = v;
    if (depth_ == 1 && key_ == "status") fields.status = v;
    return true;
  }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return ++depth_, true; }
  bool end_object() override { return --depth_, true; }
  bool start_array(std::size_t) override { return ++depth_, true; }
  bool end_array() override { return --depth_, true; }
  // Only depth 1 keys are kept: a value at depth 1 always follows its key there.
  bool key(string_t& k) override {
    if (depth_ == 1) key_ = k;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  bool Code(long v) {
    if (depth_ == 1 && key_ == "code") fields.code = v;
    return true;
  }
  int depth_ = 0;
  std::string key_;
};

ApiResult<nlohmann::json> Perform(const ClusterAccess& a, const ClientOptions& client_options,
                                  Client::HandlePool& pool, const std::string& method,
                                  const std::string& path, const std::string& content_type,
                                  std::string body,
                                  std::chrono::milliseconds timeout = std::chrono::seconds(30),
                                  Answer answer = Answer::kObject) {
  const bool is_get = method == "GET";
  http::Request req = MakeRequest(a, method, path, content_type, std::move(body));
  http::ExchangeOptions options;
  options.deadline = http::Clock::now() + timeout;
  // A GET or DELETE may answer with a whole collection; a write answers with one object.
  options.max_body_bytes =
      is_get || method == "DELETE" ? kMaxListAnswerBytes : kMaxObjectAnswerBytes;
  std::string response;
  bool sized = false;
  Outcome o = RoundTrip(a, client_options, pool, req, options, is_get,
                        [&](const http::ResponseHead& head, std::string_view bytes) {
    const bool ok = head.status >= 200 && head.status < 300;
    if (!sized) {  // the announced size at once, not grown by doubling (a list: tens of MiB)
      sized = true;
      if (ok && head.content_length > 0) response.reserve(static_cast<size_t>(head.content_length));
    }
    if (!ok) {  // an error Status: kept (bounded) for its message
      if (response.size() < kMaxErrorBodyBytes)
        response.append(bytes.substr(0, kMaxErrorBodyBytes - response.size()));
      return true;
    }
    response.append(bytes);
    return true;
  });
  if (o.error) {
    return Status(ErrorCode::kUnavailable,
                  method + " " + a.server + path + ": " + o.error->status.message());
  }
  const long code = o.head.status;
  if (code < 200 || code >= 300) {
    return ApiResult<nlohmann::json>(HttpError(method, path, code, response), code,
                                     std::chrono::seconds(o.head.retry_after));
  }
  // A 2xx answer can still carry a Failure Status: the eviction subresource answers a pod under
  // two PodDisruptionBudgets that way (201, code 500). client-go turns it into an error
  // (staging/src/k8s.io/client-go/rest/request.go, transformResponse); so do we, with its code.
  nlohmann::json j;
  StatusFields fields;
  if (answer == Answer::kNothing) {
    StatusFieldsReader reader;
    if (!nlohmann::json::sax_parse(response, &reader, nlohmann::json::input_format_t::json,
                                   /*strict=*/true)) {
      return Status(ErrorCode::kUnavailable, method + " " + path + ": response is not JSON");
    }
    fields = std::move(reader.fields);
  } else {
    j = nlohmann::json::parse(response, nullptr, false);
    if (j.is_discarded()) {
      return Status(ErrorCode::kUnavailable, method + " " + path + ": response is not JSON");
    }
    fields = StatusFieldsOf(j);
  }
  if (fields.IsFailure()) {
    const long failed = fields.code.value_or(500);
    return ApiResult<nlohmann::json>(HttpError(method, path, failed, response), failed);
  }
  return j;
}

struct WatchState {
  const std::function<bool(const WatchEvent&)>* on_event = nullptr;
  http::LineSplitter lines{kMaxWatchLineBytes};
  std::string body;     // whole body when the status is not 200 (an error Status)
  bool gone = false;
  bool stopped_by_callback = false;
};

// Returns false to end the stream.
bool HandleLine(WatchState& s, std::string_view line) {
  if (line.empty()) return true;
  nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    spdlog::warn("event=k8s_watch_bad_line bytes={}", line.size());
    return true;
  }
  WatchEvent ev;
  ev.type = j.value("type", "");
  // Moved, not copied: the event's object can be hundreds of KiB of tree.
  if (auto it = j.find("object"); it != j.end()) ev.object = std::move(*it);
  if (ev.type == "ERROR" && ev.object.is_object() && ev.object.value("code", 0) == 410) {
    s.gone = true;
    return false;
  }
  if (!(*s.on_event)(ev)) {
    s.stopped_by_callback = true;
    return false;
  }
  return true;
}

}  // namespace

Client::Client(ClusterAccess access, ClientOptions options)
    : access_(std::move(access)), options_(options), pool_(std::make_shared<HandlePool>()) {}

ApiResult<nlohmann::json> Client::Get(const std::string& path) const {
  return Perform(access_, options_, *pool_, "GET", path, "", "");
}

ApiResult<nlohmann::json> Client::Patch(const std::string& path, const nlohmann::json& patch,
                                        PatchType type, Answer answer) const {
  const char* ct = type == PatchType::kMerge            ? "application/merge-patch+json"
                   : type == PatchType::kStrategicMerge ? "application/strategic-merge-patch+json"
                                                        : "application/json-patch+json";
  return Perform(access_, options_, *pool_, "PATCH", path, ct, patch.dump(),
                 std::chrono::seconds(30), answer);
}

ApiResult<nlohmann::json> Client::Post(const std::string& path, const nlohmann::json& body,
                                       Answer answer) const {
  return Perform(access_, options_, *pool_, "POST", path, "application/json", body.dump(),
                 std::chrono::seconds(30), answer);
}

ApiResult<nlohmann::json> Client::Post(const std::string& path, const nlohmann::json& body,
                                       std::chrono::milliseconds timeout) const {
  return Perform(access_, options_, *pool_, "POST", path, "application/json", body.dump(), timeout);
}

ApiResult<nlohmann::json> Client::Delete(const std::string& path) const {
  return Perform(access_, options_, *pool_, "DELETE", path, "", "");
}

WatchResult Client::Watch(const std::string& path,
                          const std::function<bool(const WatchEvent&)>& on_event,
                          const std::atomic<bool>* stop) const {
  WatchResult result;
  WatchState s;
  s.on_event = &on_event;
  http::Request req = MakeRequest(access_, "GET", path, "", "");
  http::ExchangeOptions options;
  options.idle_timeout = options_.watch_silence;
  options.stop = stop;
  options.max_body_bytes = 0;  // a stream: each line is bounded instead
  Outcome o = RoundTrip(access_, options_, *pool_, req, options, false,
                        [&](const http::ResponseHead& head, std::string_view bytes) {
    if (head.status != 200) {  // an error Status, kept whole (bounded) for the message
      if (s.body.size() < kMaxErrorBodyBytes)
        s.body.append(bytes.substr(0, kMaxErrorBodyBytes - s.body.size()));
      return true;
    }
    return s.lines.Feed(bytes, [&](std::string_view line) { return HandleLine(s, line); });
  });
  result.http_status = o.head.status;
  if (s.lines.overflowed()) {
    result.end = WatchEnd::kBroken;
    result.error = Status(ErrorCode::kUnavailable,
                          "WATCH " + access_.server + path + ": an event line longer than " +
                              std::to_string(kMaxWatchLineBytes) + " bytes");
  } else if (s.gone || result.http_status == 410) {
    result.end = WatchEnd::kGone;
  } else if (s.stopped_by_callback || (stop != nullptr && stop->load())) {
    result.end = WatchEnd::kStopped;
  } else if (result.http_status != 0 && result.http_status != 200) {
    result.end = WatchEnd::kFailed;
    result.error = HttpError("WATCH", path, result.http_status, s.body);
  } else if (o.error) {
    result.end = WatchEnd::kBroken;
    result.error = Status(ErrorCode::kUnavailable,
                          "WATCH " + access_.server + path + ": " + o.error->status.message());
  } else {
    if (!s.lines.rest().empty()) HandleLine(s, s.lines.rest());
    result.end = s.gone ? WatchEnd::kGone : WatchEnd::kClosed;
  }
  return result;
}

std::string EscapeQueryValue(const std::string& value) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : value) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out;
}

}  // namespace gpulet::k8s
