#include "k8s/client.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

#include "k8s/curl_library.h"

namespace gpulet::k8s {
namespace {

struct CurlDeleter {
  void operator()(CURL* c) const { Curl()->easy_cleanup(c); }
};
struct SlistDeleter {
  void operator()(curl_slist* l) const { Curl()->slist_free_all(l); }
};
using CurlPtr = std::unique_ptr<CURL, CurlDeleter>;
using SlistPtr = std::unique_ptr<curl_slist, SlistDeleter>;

std::string ReadToken(const ClusterAccess& a) {
  if (a.token_file.empty()) return a.token;
  std::ifstream in(a.token_file);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string t = ss.str();
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ')) t.pop_back();
  return t;
}

void SetBlob(CURL* c, CURLoption option, const std::string& data) {
  curl_blob blob{const_cast<char*>(data.data()), data.size(), CURL_BLOB_COPY};
  Curl()->easy_setopt(c, option, &blob);
}

// A handle configured for `method url` with TLS and authentication from `a`: `reuse` (reset, so
// only its live connection and TLS session carry over) or a new one. The header list is returned
// through `headers` (it must outlive the transfer).
CurlPtr NewHandle(const ClusterAccess& a, const std::string& method, const std::string& path,
                  const std::string& content_type, SlistPtr& headers, CurlPtr reuse = nullptr) {
  if (Curl() == nullptr) return nullptr;
  CurlPtr c = reuse ? std::move(reuse) : CurlPtr(Curl()->easy_init());
  if (!c) return c;
  CURL* h = c.get();
  const std::string url = a.server + path;
  Curl()->easy_setopt(h, CURLOPT_URL, url.c_str());
  Curl()->easy_setopt(h, CURLOPT_CUSTOMREQUEST, method.c_str());
  Curl()->easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  Curl()->easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
  Curl()->easy_setopt(h, CURLOPT_PROTOCOLS_STR, "https,http");
  if (a.insecure_skip_tls_verify) {
    Curl()->easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 0L);
    Curl()->easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  if (!a.ca_data.empty())
    SetBlob(h, CURLOPT_CAINFO_BLOB, a.ca_data);
  else if (!a.ca_file.empty())
    Curl()->easy_setopt(h, CURLOPT_CAINFO, a.ca_file.c_str());
  if (!a.client_cert_data.empty())
    SetBlob(h, CURLOPT_SSLCERT_BLOB, a.client_cert_data);
  else if (!a.client_cert_file.empty())
    Curl()->easy_setopt(h, CURLOPT_SSLCERT, a.client_cert_file.c_str());
  if (!a.client_key_data.empty())
    SetBlob(h, CURLOPT_SSLKEY_BLOB, a.client_key_data);
  else if (!a.client_key_file.empty())
    Curl()->easy_setopt(h, CURLOPT_SSLKEY, a.client_key_file.c_str());
  curl_slist* list = Curl()->slist_append(nullptr, "Accept: application/json");
  const std::string token = ReadToken(a);
  if (!token.empty()) list = Curl()->slist_append(list, ("Authorization: Bearer " + token).c_str());
  if (!content_type.empty())
    list = Curl()->slist_append(list, ("Content-Type: " + content_type).c_str());
  headers.reset(list);
  Curl()->easy_setopt(h, CURLOPT_HTTPHEADER, list);
  return c;
}

// Keeps the Retry-After header's value (delay-seconds; an HTTP date is not used by the API
// server and is ignored), bounded to an hour.
size_t ReadRetryAfter(char* data, size_t size, size_t n, void* user) {
  const size_t total = size * n;
  static constexpr char kName[] = "retry-after:";
  constexpr size_t kLen = sizeof(kName) - 1;
  if (total > kLen) {
    bool match = true;
    for (size_t i = 0; i < kLen && match; ++i) {
      match = std::tolower(static_cast<unsigned char>(data[i])) == kName[i];
    }
    if (match) {
      long seconds = 0;
      size_t i = kLen;
      while (i < total && (data[i] == ' ' || data[i] == '\t')) ++i;
      bool digits = false;
      for (; i < total && std::isdigit(static_cast<unsigned char>(data[i])); ++i) {
        digits = true;
        seconds = std::min(3600L, seconds * 10 + (data[i] - '0'));
      }
      if (digits) *static_cast<long*>(user) = seconds;
    }
  }
  return total;
}

size_t AppendBody(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
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

// At most kMaxIdle handles wait here between GETs, each holding the connection its last GET used.
// A handle whose transfer failed is not kept (its connection is suspect).
struct Client::HandlePool {
  static constexpr size_t kMaxIdle = 4;
  std::mutex mu;
  std::vector<CurlPtr> idle;

  CurlPtr Take() {
    std::lock_guard<std::mutex> lock(mu);
    if (idle.empty()) return nullptr;
    CurlPtr c = std::move(idle.back());
    idle.pop_back();
    return c;
  }
  void Give(CurlPtr c) {
    Curl()->easy_reset(c.get());  // drops every option (and pointer into a finished call)
    std::lock_guard<std::mutex> lock(mu);
    if (idle.size() < kMaxIdle) idle.push_back(std::move(c));
  }
};

namespace {

ApiResult<nlohmann::json> Perform(const ClusterAccess& a, const std::string& method,
                                  const std::string& path, const std::string& content_type,
                                  const std::string& body,
                                  std::chrono::milliseconds timeout = std::chrono::seconds(30),
                                  Client::HandlePool* pool = nullptr) {
  SlistPtr headers;
  CurlPtr reuse = (pool != nullptr && Curl() != nullptr) ? pool->Take() : nullptr;
  CurlPtr c = NewHandle(a, method, path, content_type, headers, std::move(reuse));
  if (!c)
    return Status(ErrorCode::kInternal,
                  Curl() == nullptr ? CurlLoadError() : "curl_easy_init failed");
  std::string response;
  char errbuf[CURL_ERROR_SIZE] = {0};
  Curl()->easy_setopt(c.get(), CURLOPT_ERRORBUFFER, errbuf);
  Curl()->easy_setopt(c.get(), CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
  Curl()->easy_setopt(c.get(), CURLOPT_WRITEFUNCTION, AppendBody);
  Curl()->easy_setopt(c.get(), CURLOPT_WRITEDATA, &response);
  long retry_after = 0;
  Curl()->easy_setopt(c.get(), CURLOPT_HEADERFUNCTION, ReadRetryAfter);
  Curl()->easy_setopt(c.get(), CURLOPT_HEADERDATA, &retry_after);
  if (!body.empty()) {
    Curl()->easy_setopt(c.get(), CURLOPT_POSTFIELDS, body.c_str());
    Curl()->easy_setopt(c.get(), CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  }
  CURLcode rc = Curl()->easy_perform(c.get());
  if (rc != CURLE_OK) {
    return Status(ErrorCode::kUnavailable, method + " " + a.server + path + ": " +
                                               (errbuf[0] ? errbuf : Curl()->easy_strerror(rc)));
  }
  long code = 0;
  Curl()->easy_getinfo(c.get(), CURLINFO_RESPONSE_CODE, &code);
  if (pool != nullptr) pool->Give(std::move(c));
  if (code < 200 || code >= 300) {
    return ApiResult<nlohmann::json>(HttpError(method, path, code, response), code,
                                     std::chrono::seconds(retry_after));
  }
  nlohmann::json j = nlohmann::json::parse(response, nullptr, false);
  if (j.is_discarded()) {
    return Status(ErrorCode::kUnavailable, method + " " + path + ": response is not JSON");
  }
  // A 2xx answer can still carry a Failure Status: the eviction subresource answers a pod under
  // two PodDisruptionBudgets that way (201, code 500). client-go turns it into an error
  // (staging/src/k8s.io/client-go/rest/request.go, transformResponse); so do we, with its code.
  if (j.is_object() && j.value("kind", "") == "Status" && j.value("status", "") == "Failure") {
    const long failed = j.contains("code") && j["code"].is_number_integer()
                            ? j["code"].get<long>()
                            : 500;
    return ApiResult<nlohmann::json>(HttpError(method, path, failed, response), failed);
  }
  return j;
}

struct WatchState {
  const std::function<bool(const WatchEvent&)>* on_event = nullptr;
  const std::atomic<bool>* stop = nullptr;
  std::string pending;  // bytes after the last newline
  std::string body;     // whole body when the status is not 200 (an error Status)
  long http_status = 0;
  bool gone = false;
  bool stopped_by_callback = false;
  CURL* handle = nullptr;
};

// Returns false to abort the transfer.
bool HandleLine(WatchState& s, const std::string& line) {
  if (line.empty()) return true;
  nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    spdlog::warn("event=k8s_watch_bad_line bytes={}", line.size());
    return true;
  }
  WatchEvent ev;
  ev.type = j.value("type", "");
  ev.object = j.contains("object") ? j["object"] : nlohmann::json();
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

size_t WatchWrite(char* data, size_t size, size_t n, void* user) {
  auto& s = *static_cast<WatchState*>(user);
  const size_t total = size * n;
  if (s.http_status == 0) Curl()->easy_getinfo(s.handle, CURLINFO_RESPONSE_CODE, &s.http_status);
  if (s.http_status != 200) {
    s.body.append(data, total);
    return total;
  }
  s.pending.append(data, total);
  size_t start = 0;
  for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    if (!HandleLine(s, s.pending.substr(start, nl - start))) return 0;  // aborts the transfer
  }
  s.pending.erase(0, start);
  return total;
}

int WatchProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto& s = *static_cast<WatchState*>(user);
  return (s.stop != nullptr && s.stop->load()) ? 1 : 0;
}

}  // namespace

Client::Client(ClusterAccess access)
    : access_(std::move(access)), pool_(std::make_shared<HandlePool>()) {}

ApiResult<nlohmann::json> Client::Get(const std::string& path) const {
  return Perform(access_, "GET", path, "", "", std::chrono::seconds(30), pool_.get());
}

ApiResult<nlohmann::json> Client::Patch(const std::string& path, const nlohmann::json& patch,
                                        PatchType type) const {
  const char* ct = type == PatchType::kMerge            ? "application/merge-patch+json"
                   : type == PatchType::kStrategicMerge ? "application/strategic-merge-patch+json"
                                                        : "application/json-patch+json";
  return Perform(access_, "PATCH", path, ct, patch.dump());
}

ApiResult<nlohmann::json> Client::Post(const std::string& path, const nlohmann::json& body) const {
  return Perform(access_, "POST", path, "application/json", body.dump());
}

ApiResult<nlohmann::json> Client::Post(const std::string& path, const nlohmann::json& body,
                                       std::chrono::milliseconds timeout) const {
  return Perform(access_, "POST", path, "application/json", body.dump(), timeout);
}

ApiResult<nlohmann::json> Client::Delete(const std::string& path) const {
  return Perform(access_, "DELETE", path, "", "");
}

WatchResult Client::Watch(const std::string& path,
                          const std::function<bool(const WatchEvent&)>& on_event,
                          const std::atomic<bool>* stop) const {
  WatchResult result;
  SlistPtr headers;
  CurlPtr c = NewHandle(access_, "GET", path, "", headers);
  if (!c) {
    result.end = WatchEnd::kFailed;
    result.error =
        Status(ErrorCode::kInternal, Curl() == nullptr ? CurlLoadError() : "curl_easy_init failed");
    return result;
  }
  WatchState s;
  s.on_event = &on_event;
  s.stop = stop;
  s.handle = c.get();
  char errbuf[CURL_ERROR_SIZE] = {0};
  Curl()->easy_setopt(c.get(), CURLOPT_ERRORBUFFER, errbuf);
  Curl()->easy_setopt(c.get(), CURLOPT_WRITEFUNCTION, WatchWrite);
  Curl()->easy_setopt(c.get(), CURLOPT_WRITEDATA, &s);
  Curl()->easy_setopt(c.get(), CURLOPT_NOPROGRESS, 0L);
  Curl()->easy_setopt(c.get(), CURLOPT_XFERINFOFUNCTION, WatchProgress);
  Curl()->easy_setopt(c.get(), CURLOPT_XFERINFODATA, &s);
  // A stream that stays silent this long is dead (API servers send bookmarks or time out sooner).
  Curl()->easy_setopt(c.get(), CURLOPT_LOW_SPEED_LIMIT, 1L);
  Curl()->easy_setopt(c.get(), CURLOPT_LOW_SPEED_TIME, 600L);
  CURLcode rc = Curl()->easy_perform(c.get());
  Curl()->easy_getinfo(c.get(), CURLINFO_RESPONSE_CODE, &result.http_status);
  if (s.gone || result.http_status == 410) {
    result.end = WatchEnd::kGone;
  } else if (s.stopped_by_callback || (stop != nullptr && stop->load())) {
    result.end = WatchEnd::kStopped;
  } else if (result.http_status != 0 && result.http_status != 200) {
    result.end = WatchEnd::kFailed;
    result.error = HttpError("WATCH", path, result.http_status, s.body);
  } else if (rc != CURLE_OK) {
    result.end = WatchEnd::kBroken;
    result.error =
        Status(ErrorCode::kUnavailable, "WATCH " + access_.server + path + ": " +
                                            (errbuf[0] ? errbuf : Curl()->easy_strerror(rc)));
  } else {
    if (!s.pending.empty()) HandleLine(s, s.pending);
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
