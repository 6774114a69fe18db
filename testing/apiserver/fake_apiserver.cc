#include "apiserver/fake_apiserver.h"

#include <httplib.h>
#include <signal.h>

#include <condition_variable>
#include <cstdlib>
#include <algorithm>
#include <fstream>
#include <functional>
#include <optional>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

namespace gpulet::testing {

namespace {

Status RunOpenssl(const std::string& args) {
  const std::string cmd = "openssl " + args + " >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    return {ErrorCode::kInternal, "openssl failed: " + cmd};
  }
  return {};
}

nlohmann::json StatusBody(int code, const std::string& reason, const std::string& message) {
  return {{"kind", "Status"},    {"apiVersion", "v1"}, {"metadata", nlohmann::json::object()},
          {"status", "Failure"}, {"message", message}, {"reason", reason},
          {"code", code}};
}

void Fail(httplib::Response& res, int code, const std::string& reason, const std::string& message) {
  res.status = code;
  res.set_content(StatusBody(code, reason, message).dump(), "application/json");
}

std::string SelectedName(const httplib::Request& req) {
  const std::string sel = req.get_param_value("fieldSelector");
  const std::string prefix = "metadata.name=";
  return sel.rfind(prefix, 0) == 0 ? sel.substr(prefix.size()) : "";
}

std::vector<std::string> Segments(const std::string& path) {
  std::vector<std::string> out;
  std::stringstream ss(path);
  std::string seg;
  while (std::getline(ss, seg, '/')) {
    if (!seg.empty()) out.push_back(seg);
  }
  return out;
}

// A collection path: /api/v1/RES, /api/v1/namespaces/NS/RES, /apis/G/V/RES,
// /apis/G/V/namespaces/NS/RES.
bool IsCollection(const std::string& path) {
  const std::vector<std::string> s = Segments(path);
  if (s.size() >= 2 && s[0] == "api") return s.size() == 3 || (s.size() == 5 && s[2] == "namespaces");
  if (s.size() >= 3 && s[0] == "apis") return s.size() == 4 || (s.size() == 6 && s[3] == "namespaces");
  return false;
}

// Whether `object_path` is an item of `collection` (cluster-wide lists of namespaced resources
// span every namespace).
bool InCollection(const std::string& collection, const std::string& object_path) {
  const std::vector<std::string> c = Segments(collection), o = Segments(object_path);
  if (o.size() == c.size() + 1) {
    return std::equal(c.begin(), c.end(), o.begin());
  }
  const size_t group = c[0] == "api" ? 2 : 3;  // segments before the resource
  if (c.size() == group + 1 && o.size() == group + 4 && o[group] == "namespaces") {
    return std::equal(c.begin(), c.begin() + group, o.begin()) && o[group + 2] == c[group];
  }
  return false;
}

// The value at a dotted path ("spec.nodeName") as a string; "" when absent.
std::string FieldValue(const nlohmann::json& obj, const std::string& dotted) {
  const nlohmann::json* cur = &obj;
  std::stringstream ss(dotted);
  std::string key;
  while (std::getline(ss, key, '.')) {
    if (!cur->is_object() || !cur->contains(key)) return "";
    cur = &(*cur)[key];
  }
  if (cur->is_string()) return cur->get<std::string>();
  if (cur->is_boolean()) return cur->get<bool>() ? "true" : "false";
  if (cur->is_number()) return cur->dump();
  return "";
}

// "a=b,c!=d,e" against a getter; `exists` decides bare keys (label selectors only).
bool Selects(const std::string& selector,
             const std::function<std::optional<std::string>(const std::string&)>& get) {
  std::stringstream ss(selector);
  std::string term;
  while (std::getline(ss, term, ',')) {
    if (term.empty()) continue;
    const size_t ne = term.find("!=");
    const size_t eq = term.find('=');
    if (ne != std::string::npos) {
      auto v = get(term.substr(0, ne));
      if (v && *v == term.substr(ne + 2)) return false;
    } else if (eq != std::string::npos) {
      const size_t vstart = term.compare(eq, 2, "==") == 0 ? eq + 2 : eq + 1;
      auto v = get(term.substr(0, eq));
      if (!v || *v != term.substr(vstart)) return false;
    } else if (!get(term)) {
      return false;
    }
  }
  return true;
}

bool Matches(const nlohmann::json& obj, const std::string& field_selector,
             const std::string& label_selector) {
  const bool fields = Selects(field_selector, [&](const std::string& k) -> std::optional<std::string> {
    return FieldValue(obj, k);
  });
  if (!fields) return false;
  return Selects(label_selector, [&](const std::string& k) -> std::optional<std::string> {
    const nlohmann::json labels =
        obj.contains("metadata") ? obj["metadata"].value("labels", nlohmann::json::object())
                                 : nlohmann::json::object();
    if (!labels.contains(k) || !labels[k].is_string()) return std::nullopt;
    return labels[k].get<std::string>();
  });
}

}  // namespace

Result<TestPki> MakeTestPki(const std::string& dir) {
  TestPki p;
  p.ca_cert = dir + "/ca.crt";
  const std::string ca_key = dir + "/ca.key";
  p.server_cert = dir + "/server.crt";
  p.server_key = dir + "/server.key";
  p.client_cert = dir + "/client.crt";
  p.client_key = dir + "/client.key";
  const std::string ext = dir + "/server.ext";
  std::ofstream(ext) << "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                        "extendedKeyUsage=serverAuth\n";
  const std::string client_ext = dir + "/client.ext";
  std::ofstream(client_ext) << "extendedKeyUsage=clientAuth\n";
  for (const std::string& args : {
           "req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=gpulet-test-ca -keyout " + ca_key +
               " -out " + p.ca_cert,
           "req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout " + p.server_key + " -out " +
               dir + "/server.csr",
           "x509 -req -days 2 -in " + dir + "/server.csr -CA " + p.ca_cert + " -CAkey " + ca_key +
               " -CAcreateserial -extfile " + ext + " -out " + p.server_cert,
           "req -newkey rsa:2048 -nodes -subj /CN=system:node:gpu-node-1/O=system:nodes -keyout " +
               p.client_key + " -out " + dir + "/client.csr",
           "x509 -req -days 2 -in " + dir + "/client.csr -CA " + p.ca_cert + " -CAkey " + ca_key +
               " -CAcreateserial -extfile " + client_ext + " -out " + p.client_cert,
       }) {
    Status s = RunOpenssl(args);
    if (!s.ok()) return s;
  }
  return p;
}

Result<nlohmann::json> LoadRecorded(const std::string& name) {
  const std::string path = std::string(GPULET_APISERVER_TESTDATA) + "/" + name;
  std::ifstream in(path);
  if (!in) return Status(ErrorCode::kNotFound, "recorded response " + path + " not found");
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded()) return Status(ErrorCode::kInvalidInput, path + ": not JSON");
  return j;
}

struct FakeApiServer::State {
  Options options;
  std::unique_ptr<httplib::SSLServer> server;
  std::thread thread;
  int port = 0;

  mutable std::mutex mu;
  mutable std::condition_variable cv;
  std::map<std::string, nlohmann::json> objects;  // path → object
  struct Event {
    uint64_t version;
    std::string type;
    std::string path;
    nlohmann::json object;
  };
  std::vector<Event> history;
  uint64_t version = 100;
  uint64_t expired_before = 0;
  bool gone_as_http = false;
  uint64_t break_generation = 0;
  uint64_t close_generation = 0;  // CloseWatches()
  bool stopping = false;
  size_t open_watches = 0;
  std::vector<RecordedRequest> requests;

  // Caller holds mu.
  uint64_t Record(const std::string& type, const std::string& path, nlohmann::json object) {
    const uint64_t v = ++version;
    object["metadata"]["resourceVersion"] = std::to_string(v);
    if (type == "DELETED") {
      objects.erase(path);
    } else {
      objects[path] = object;
    }
    history.push_back({v, type, path, std::move(object)});
    cv.notify_all();
    return v;
  }

  bool Authorized(const httplib::Request& req, httplib::Response& res) {
    {
      std::lock_guard<std::mutex> lock(mu);
      requests.push_back({req.method, req.path,
                          req.target.find('?') == std::string::npos
                              ? ""
                              : req.target.substr(req.target.find('?') + 1),
                          req.get_header_value("Content-Type")});
    }
    if (req.get_header_value("Authorization") == "Bearer " + options.token) return true;
    Fail(res, 401, "Unauthorized", "Unauthorized");
    return false;
  }

  void HandleGet(const httplib::Request& req, httplib::Response& res,
                 const std::shared_ptr<State>& self) {
    if (!Authorized(req, res)) return;
    const std::string watch = req.get_param_value("watch");
    if (watch == "1" || watch == "true") {
      HandleWatch(req, res, self);
      return;
    }
    std::lock_guard<std::mutex> lock(mu);
    auto it = objects.find(req.path);
    if (it == objects.end() && IsCollection(req.path)) {
      nlohmann::json items = nlohmann::json::array();
      const std::string fields = req.get_param_value("fieldSelector");
      const std::string labels = req.get_param_value("labelSelector");
      for (const auto& [path, obj] : objects) {
        if (InCollection(req.path, path) && Matches(obj, fields, labels)) items.push_back(obj);
      }
      res.set_content(nlohmann::json{{"kind", "List"},
                                     {"apiVersion", "v1"},
                                     {"metadata", {{"resourceVersion", std::to_string(version)}}},
                                     {"items", items}}
                          .dump(),
                      "application/json");
      return;
    }
    if (it == objects.end()) {
      Fail(res, 404, "NotFound", "\"" + req.path + "\" not found");
      return;
    }
    res.set_content(it->second.dump(), "application/json");
  }

  void HandlePost(const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    nlohmann::json body = nlohmann::json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object()) {
      Fail(res, 400, "BadRequest", "body is not a JSON object");
      return;
    }
    std::lock_guard<std::mutex> lock(mu);
    const std::vector<std::string> seg = Segments(req.path);
    if (seg.size() >= 3 && seg.back() == "eviction" && seg[seg.size() - 3] == "pods") {
      const std::string pod_path = req.path.substr(0, req.path.rfind('/'));
      auto pod = objects.find(pod_path);
      if (pod == objects.end()) {
        Fail(res, 404, "NotFound", "pods \"" + seg[seg.size() - 2] + "\" not found");
        return;
      }
      const std::string ns = pod->second["metadata"].value("namespace", "");
      const nlohmann::json labels = pod->second["metadata"].value("labels", nlohmann::json::object());
      const std::string pdbs = "/apis/policy/v1/namespaces/" + ns + "/poddisruptionbudgets";
      for (auto& [path, pdb] : objects) {
        if (!InCollection(pdbs, path)) continue;
        const nlohmann::json want = pdb.contains("spec") && pdb["spec"].contains("selector")
                                        ? pdb["spec"]["selector"].value("matchLabels",
                                                                        nlohmann::json::object())
                                        : nlohmann::json::object();
        bool selected = true;
        for (const auto& [k, v] : want.items()) {
          if (!labels.contains(k) || labels[k] != v) selected = false;
        }
        if (!selected) continue;
        const int allowed = pdb.contains("status") ? pdb["status"].value("disruptionsAllowed", 0) : 0;
        if (allowed < 1) {
          Fail(res, 429, "TooManyRequests",
               "Cannot evict pod as it would violate the pod's disruption budget.");
          return;
        }
        nlohmann::json updated = pdb;
        updated["status"]["disruptionsAllowed"] = allowed - 1;
        Record("MODIFIED", path, updated);
        break;
      }
      Record("DELETED", pod_path, pod->second);
      res.status = 201;
      res.set_content(nlohmann::json{{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Success"}}.dump(),
                      "application/json");
      return;
    }
    if (seg.size() >= 3 && seg.back() == "binding" && seg[seg.size() - 3] == "pods") {
      HandleBinding(req.path, body, res);
      return;
    }
    if (!IsCollection(req.path)) {
      Fail(res, 405, "MethodNotAllowed", "POST " + req.path + ": not a collection");
      return;
    }
    const std::string name = body.contains("metadata") ? body["metadata"].value("name", "") : "";
    if (name.empty()) {
      Fail(res, 422, "Invalid", "metadata.name: Required value");
      return;
    }
    const std::string path = req.path + "/" + name;
    if (objects.count(path)) {
      Fail(res, 409, "AlreadyExists", "\"" + name + "\" already exists");
      return;
    }
    Record("ADDED", path, body);
    res.status = 201;
    res.set_content(objects[path].dump(), "application/json");
  }

  // POST .../pods/NAME/binding (caller holds mu): sets spec.nodeName from target.name; 404 without
  // the pod, 409 when it is already bound, 409 when metadata.uid is given and differs.
  void HandleBinding(const std::string& path, const nlohmann::json& body, httplib::Response& res) {
    const std::string pod_path = path.substr(0, path.rfind('/'));
    const std::string name = pod_path.substr(pod_path.rfind('/') + 1);
    auto pod = objects.find(pod_path);
    if (pod == objects.end()) {
      Fail(res, 404, "NotFound", "pods \"" + name + "\" not found");
      return;
    }
    const std::string node = body.contains("target") && body["target"].is_object()
                                 ? body["target"].value("name", "")
                                 : "";
    if (node.empty()) {
      Fail(res, 422, "Invalid", "target.name: Required value");
      return;
    }
    const std::string uid = body.contains("metadata") && body["metadata"].is_object()
                                ? body["metadata"].value("uid", "")
                                : "";
    if (!uid.empty() && uid != pod->second["metadata"].value("uid", "")) {
      Fail(res, 409, "Conflict", "Operation cannot be fulfilled on pods/binding \"" + name +
                                     "\": the UID in the binding does not match the pod");
      return;
    }
    const nlohmann::json spec = pod->second.value("spec", nlohmann::json::object());
    if (!spec.value("nodeName", "").empty()) {
      Fail(res, 409, "Conflict", "Operation cannot be fulfilled on pods/binding \"" + name +
                                     "\": pod " + name + " is already assigned to node \"" +
                                     spec.value("nodeName", "") + "\"");
      return;
    }
    nlohmann::json updated = pod->second;
    updated["spec"]["nodeName"] = node;
    Record("MODIFIED", pod_path, updated);
    res.status = 201;
    res.set_content(nlohmann::json{{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Success"}}.dump(),
                    "application/json");
  }

  void HandlePatch(const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    const std::string ct = req.get_header_value("Content-Type");
    nlohmann::json patch = nlohmann::json::parse(req.body, nullptr, false);
    if (patch.is_discarded()) {
      Fail(res, 400, "BadRequest", "body is not JSON");
      return;
    }
    std::lock_guard<std::mutex> lock(mu);
    auto it = objects.find(req.path);
    if (it == objects.end()) {
      Fail(res, 404, "NotFound", "\"" + req.path + "\" not found");
      return;
    }
    if (patch.is_object() && patch.contains("metadata") && patch["metadata"].is_object() &&
        patch["metadata"].contains("resourceVersion") &&
        patch["metadata"]["resourceVersion"] != it->second["metadata"].value("resourceVersion", "")) {
      Fail(res, 409, "Conflict",
           "the object has been modified; please apply your changes to the latest version");
      return;
    }
    nlohmann::json updated = it->second;
    if (ct == "application/merge-patch+json" || ct == "application/strategic-merge-patch+json") {
      // Strategic merge equals a JSON merge patch for maps (labels, annotations, data).
      updated.merge_patch(patch);
    } else if (ct == "application/json-patch+json") {
      try {
        updated = updated.patch(patch);
      } catch (const nlohmann::json::exception& e) {
        Fail(res, 422, "Invalid", e.what());
        return;
      }
    } else {
      Fail(res, 415, "UnsupportedMediaType", "unsupported patch type " + ct);
      return;
    }
    Record("MODIFIED", req.path, updated);
    res.set_content(objects[req.path].dump(), "application/json");
  }

  void HandleWatch(const httplib::Request& req, httplib::Response& res,
                   const std::shared_ptr<State>& self) {
    const std::string name = SelectedName(req);
    const std::string object_path = req.path + "/" + name;
    // Without a metadata.name field selector: a watch of the whole collection, filtered by the
    // label (and field) selectors.
    const std::string collection = name.empty() ? req.path : "";
    const std::string field_selector = req.get_param_value("fieldSelector");
    const std::string label_selector = req.get_param_value("labelSelector");
    auto selected = [collection, object_path, field_selector, label_selector](
                        const std::string& path, const nlohmann::json& obj) {
      if (collection.empty()) return path == object_path;
      return InCollection(collection, path) && Matches(obj, field_selector, label_selector);
    };
    const std::string rv_text = req.get_param_value("resourceVersion");
    uint64_t from = 0;
    bool initial_added = rv_text.empty() || rv_text == "0";
    if (!initial_added) from = std::strtoull(rv_text.c_str(), nullptr, 10);
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!initial_added && from < expired_before && gone_as_http) {
        Fail(res, 410, "Expired", "too old resource version: " + rv_text);
        return;
      }
      ++open_watches;
      cv.notify_all();
    }
    struct Stream {
      uint64_t cursor;
      uint64_t break_generation;
      uint64_t close_generation;
      bool started = false;
      bool initial_added;
      bool gone;
    };
    auto stream = std::make_shared<Stream>();
    {
      std::lock_guard<std::mutex> lock(mu);
      stream->cursor = initial_added ? version : from;
      stream->break_generation = break_generation;
      stream->close_generation = close_generation;
      stream->initial_added = initial_added;
      stream->gone = !initial_added && from < expired_before;
    }
    res.set_chunked_content_provider(
        "application/json",
        [self, stream, name, object_path, collection, selected](size_t, httplib::DataSink& sink) {
          std::unique_lock<std::mutex> lock(self->mu);
          if (!stream->started) {
            stream->started = true;
            if (stream->gone) {
              const std::string line =
                  nlohmann::json{{"type", "ERROR"},
                                 {"object", StatusBody(410, "Expired", "too old resource version")}}
                      .dump() +
                  "\n";
              lock.unlock();
              sink.write(line.data(), line.size());
              sink.done();
              return true;
            }
            if (stream->initial_added && !collection.empty()) {
              std::string out;
              for (const auto& [path, obj] : self->objects) {
                if (selected(path, obj)) {
                  out += nlohmann::json{{"type", "ADDED"}, {"object", obj}}.dump() + "\n";
                }
              }
              lock.unlock();
              if (out.empty()) return true;
              return sink.write(out.data(), out.size());
            }
            if (stream->initial_added) {
              auto it = self->objects.find(object_path);
              if (it != self->objects.end()) {
                const std::string line =
                    nlohmann::json{{"type", "ADDED"}, {"object", it->second}}.dump() + "\n";
                lock.unlock();
                return sink.write(line.data(), line.size());
              }
            }
          }
          self->cv.wait_for(lock, std::chrono::milliseconds(100), [&] {
            return self->stopping || self->break_generation != stream->break_generation ||
                   self->close_generation != stream->close_generation ||
                   (!self->history.empty() && self->history.back().version > stream->cursor);
          });
          if (self->stopping || self->close_generation != stream->close_generation) {
            lock.unlock();
            sink.done();
            return true;
          }
          if (self->break_generation != stream->break_generation) {
            // Half an event, then the connection drops without the terminating chunk.
            const std::string half = "{\"type\":\"MODIFIED\",\"object\":{\"kind\":";
            lock.unlock();
            sink.write(half.data(), half.size());
            return false;
          }
          std::string out;
          for (const Event& e : self->history) {
            if (e.version <= stream->cursor) continue;
            stream->cursor = e.version;
            if (!selected(e.path, e.object)) continue;
            out += nlohmann::json{{"type", e.type}, {"object", e.object}}.dump() + "\n";
          }
          lock.unlock();
          if (!out.empty()) return sink.write(out.data(), out.size());
          return true;
        },
        [self](bool) {
          std::lock_guard<std::mutex> lock(self->mu);
          --self->open_watches;
          self->cv.notify_all();
        });
  }
};

Result<std::unique_ptr<FakeApiServer>> FakeApiServer::Start(const TestPki& pki, Options options) {
  // A client that hangs up mid-stream must not kill the test process.
  signal(SIGPIPE, SIG_IGN);
  auto state = std::make_shared<State>();
  state->options = std::move(options);
  state->server = std::make_unique<httplib::SSLServer>(
      pki.server_cert.c_str(), pki.server_key.c_str(),
      state->options.require_client_cert ? pki.ca_cert.c_str() : nullptr);
  if (!state->server->is_valid()) {
    return Status(ErrorCode::kInternal, "fake API server: TLS setup failed for " + pki.server_cert);
  }
  state->server->new_task_queue = [] { return new httplib::ThreadPool(32); };
  // As a real API server (Go sets TCP_NODELAY): without it, a response written as headers then
  // body waits for the client's delayed ACK (40 ms) on every call.
  state->server->set_tcp_nodelay(true);
  std::weak_ptr<State> weak = state;
  state->server->Get(".*", [weak](const httplib::Request& req, httplib::Response& res) {
    if (auto s = weak.lock()) s->HandleGet(req, res, s);
  });
  state->server->Post(".*", [weak](const httplib::Request& req, httplib::Response& res) {
    if (auto s = weak.lock()) s->HandlePost(req, res);
  });
  state->server->Patch(".*", [weak](const httplib::Request& req, httplib::Response& res) {
    if (auto s = weak.lock()) s->HandlePatch(req, res);
  });
  state->port = state->server->bind_to_any_port("127.0.0.1");
  if (state->port <= 0) return Status(ErrorCode::kInternal, "fake API server: bind failed");
  httplib::SSLServer* srv = state->server.get();
  state->thread = std::thread([srv] { srv->listen_after_bind(); });
  // stop() is a no-op until the accept loop runs: wait for it so the destructor cannot hang.
  for (int i = 0; i < 2000 && !srv->is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::unique_ptr<FakeApiServer> f(new FakeApiServer());
  f->state_ = state;
  return f;
}

FakeApiServer::~FakeApiServer() {
  if (!state_) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stopping = true;
  }
  state_->cv.notify_all();
  state_->server->stop();
  if (state_->thread.joinable()) state_->thread.join();
}

std::string FakeApiServer::url() const {
  return "https://127.0.0.1:" + std::to_string(state_->port);
}

k8s::ClusterAccess FakeApiServer::Access(const TestPki& pki) const {
  k8s::ClusterAccess a;
  a.server = url();
  a.ca_file = pki.ca_cert;
  a.token = state_->options.token;
  return a;
}

uint64_t FakeApiServer::Put(const std::string& object_path, nlohmann::json object) {
  std::lock_guard<std::mutex> lock(state_->mu);
  const bool exists = state_->objects.count(object_path) > 0;
  return state_->Record(exists ? "MODIFIED" : "ADDED", object_path, std::move(object));
}

void FakeApiServer::Delete(const std::string& object_path) {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->objects.find(object_path);
  if (it == state_->objects.end()) return;
  state_->Record("DELETED", object_path, it->second);
}

std::optional<nlohmann::json> FakeApiServer::Object(const std::string& object_path) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->objects.find(object_path);
  if (it == state_->objects.end()) return std::nullopt;
  return it->second;
}

uint64_t FakeApiServer::current_version() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->version;
}

void FakeApiServer::BreakWatches() {
  std::lock_guard<std::mutex> lock(state_->mu);
  ++state_->break_generation;
  state_->cv.notify_all();
}

void FakeApiServer::CloseWatches() {
  std::lock_guard<std::mutex> lock(state_->mu);
  ++state_->close_generation;
  state_->cv.notify_all();
}

void FakeApiServer::ExpireVersionsBefore(uint64_t version) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->expired_before = version;
}

void FakeApiServer::SetGoneAsHttpStatus(bool on) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->gone_as_http = on;
}

size_t FakeApiServer::open_watches() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->open_watches;
}

bool FakeApiServer::WaitForOpenWatches(size_t n, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(state_->mu);
  return state_->cv.wait_for(lock, timeout, [&] { return state_->open_watches >= n; });
}

std::vector<RecordedRequest> FakeApiServer::requests() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->requests;
}

}  // namespace gpulet::testing
