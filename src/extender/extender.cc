#include "extender/extender.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string_view>

namespace gpulet::extender {
namespace {

using nlohmann::json;

constexpr size_t kSeenPods = 65536;

Answer BadRequest(const std::string& message) {
  return {400, "application/json", json{{"Error", message}}.dump()};
}

// Go's encoding/json matches field names case-insensitively; the scheduler sends PascalCase.
const json* Field(const json& obj, const std::string& name) {
  auto it = obj.find(name);
  if (it != obj.end()) return &*it;
  for (auto i = obj.begin(); i != obj.end(); ++i) {
    if (i.key().size() != name.size()) continue;
    bool same = true;
    for (size_t k = 0; k < name.size() && same; ++k) {
      same = std::tolower(static_cast<unsigned char>(i.key()[k])) ==
             std::tolower(static_cast<unsigned char>(name[k]));
    }
    if (same) return &*i;
  }
  return nullptr;
}

// JSON string literal of `s` (the answers are written by hand: building nlohmann objects for
// 5,000 nodes cost more than the filtering itself).
void AppendString(std::string& out, std::string_view s) {
  out += '"';
  // Node names never need escaping: append them whole; escape character by character otherwise.
  const bool plain = std::none_of(s.begin(), s.end(), [](char ch) {
    const unsigned char c = static_cast<unsigned char>(ch);
    return c == '"' || c == '\\' || c < 0x20;
  });
  if (plain) {
    out.append(s);
    out += '"';
    return;
  }
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  out += '"';
}

void AppendMap(std::string& out, const std::map<std::string, std::string>& m) {
  out += '{';
  bool first = true;
  for (const auto& [k, v] : m) {
    if (!first) out += ',';
    first = false;
    AppendString(out, k);
    out += ':';
    AppendString(out, v);
  }
  out += '}';
}

// The request body parsed, with ExtenderArgs.NodeNames (5,000 names at scale) collected straight
// into strings rather than into a JSON array of them: the DOM keeps an empty array in its place.
struct Body {
  json doc;                        // discarded when not JSON
  bool names_taken = false;        // an array under the exact key "NodeNames" was collected
  std::vector<std::string> names;  // its strings (general parser)
  long bad_name = -1;              // index of its first element that is not a string
  // Scheduler-shaped bodies: the names as views into the request, and the array's text.
  bool plain = false;
  std::vector<std::string_view> plain_names;
  std::string_view names_text;
};

Body ParseBody(const std::string& text) {
  Body b;
  bool key_is_names = false;  // the last top-level key was "NodeNames"
  bool in_names = false;
  long index = 0;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) -> bool {
    using E = json::parse_event_t;
    if (depth == 1) {
      if (event == E::key) {
        key_is_names = parsed.is_string() && parsed.get_ref<const std::string&>() == "NodeNames";
      } else if (event == E::array_start && key_is_names) {
        in_names = true;
        b.names_taken = true;  // a repeated key: the last one counts, as in the DOM
        b.names.clear();
        b.names.reserve(text.size() / 16);
        b.bad_name = -1;
        index = 0;
      } else if (event == E::array_end) {
        in_names = false;
      }
      return true;
    }
    if (depth != 2 || !in_names) return true;
    if (event == E::value) {
      if (parsed.is_string()) {
        b.names.push_back(std::move(parsed.get_ref<std::string&>()));
      } else if (b.bad_name < 0) {
        b.bad_name = index;
      }
      ++index;
      return false;  // not kept in the DOM
    }
    if (event == E::object_start || event == E::array_start) {
      if (b.bad_name < 0) b.bad_name = index;
      ++index;
      return false;
    }
    return true;
  };
  b.doc = json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/false);
  return b;
}

// The body as kube-scheduler sends it: {"Pod": {...}, "Nodes": null, "NodeNames": ["..."]},
// names plain ASCII. Reads the names without the general JSON parser (which costs more than
// the filtering at 5,000 nodes) and parses only the Pod with it; everything else is checked
// with json::accept. Anything else (escapes, other shapes, keys in other cases, repeated keys)
// returns nullopt, and the general parser (ParseBody) answers, so the answers are the same.
std::optional<Body> ParseSchedulerBody(const std::string& text) {
  const char* p = text.data();
  const char* const end = p + text.size();
  auto ws = [&] {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) ++p;
  };
  auto plain = [&](std::string_view* out) {  // a string without escapes, ASCII only
    if (p >= end || *p != '"') return false;
    const char* start = ++p;
    for (; p < end; ++p) {
      const unsigned char c = static_cast<unsigned char>(*p);
      if (c == '"') {
        *out = std::string_view(start, static_cast<size_t>(p - start));
        ++p;
        return true;
      }
      if (c == '\\' || c < 0x20 || c >= 0x80) return false;
    }
    return false;
  };
  auto skip = [&] {  // to the end of one value (its validity is checked by the caller)
    int depth = 0;
    while (p < end) {
      const char c = *p;
      if (c == '"') {
        for (++p; p < end && *p != '"'; ++p) {
          if (*p == '\\') ++p;
        }
        if (p >= end) return false;
        ++p;
        if (depth == 0) return true;
      } else if (c == '{' || c == '[') {
        ++depth;
        ++p;
      } else if (c == '}' || c == ']') {
        if (depth == 0) return true;
        ++p;
        if (--depth == 0) return true;
      } else if (c == ',' && depth == 0) {
        return true;
      } else {
        ++p;
      }
    }
    return false;
  };
  auto same_letters = [](std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::tolower(static_cast<unsigned char>(a[i])) !=
          std::tolower(static_cast<unsigned char>(b[i])))
        return false;
    }
    return true;
  };
  Body b;
  std::string_view pod_text;
  bool have_pod = false, have_names = false;
  ws();
  if (p >= end || *p != '{') return std::nullopt;
  ++p;
  for (;;) {
    ws();
    std::string_view key;
    if (!plain(&key)) return std::nullopt;
    ws();
    if (p >= end || *p != ':') return std::nullopt;
    ++p;
    ws();
    if (key == "NodeNames") {
      if (have_names || p >= end || *p != '[') return std::nullopt;
      have_names = true;
      ++p;
      ws();
      const char* first = p;
      b.plain_names.reserve(text.size() / 16);
      if (p < end && *p == ']') {
        ++p;
      } else {
        for (;;) {
          std::string_view name;
          if (!plain(&name)) return std::nullopt;
          b.plain_names.push_back(name);
          ws();
          if (p < end && *p == ',') {
            ++p;
            ws();
          } else if (p < end && *p == ']') {
            b.names_text = std::string_view(first, static_cast<size_t>(p - first));
            ++p;
            break;
          } else {
            return std::nullopt;
          }
        }
      }
    } else {
      if ((key != "Pod" && same_letters(key, "Pod")) || same_letters(key, "NodeNames") ||
          (key == "Pod" && have_pod))
        return std::nullopt;
      const char* start = p;
      if (!skip()) return std::nullopt;
      const std::string_view value(start, static_cast<size_t>(p - start));
      if (key == "Pod") {
        have_pod = true;
        pod_text = value;
      } else if (!json::accept(value.begin(), value.end())) {
        return std::nullopt;
      }
    }
    ws();
    if (p < end && *p == ',') {
      ++p;
    } else if (p < end && *p == '}') {
      ++p;
      break;
    } else {
      return std::nullopt;
    }
  }
  ws();
  if (p != end || !have_pod || !have_names) return std::nullopt;
  json pod = json::parse(pod_text.begin(), pod_text.end(), nullptr, /*allow_exceptions=*/false);
  if (pod.is_discarded()) return std::nullopt;
  b.doc = json::object();
  b.doc["Pod"] = std::move(pod);
  b.doc["NodeNames"] = json::array();
  b.names_taken = true;
  b.plain = true;
  return b;
}

struct Args {
  const json* pod = nullptr;              // in the parsed body (which outlives the Args)
  bool cache_mode = true;                 // NodeNames given (else Nodes.items)
  std::vector<std::string> owned;         // the names, when they are not views into the request
  NameList list;                          // the names (views into the request or into `owned`)
  std::vector<const json*> node_objects;  // full-node mode, parallel to the names
};

// Parses ExtenderArgs into `a`; the error text says what is wrong.
Status ParseArgs(Body& parsed, Args& a) {
  const json& body = parsed.doc;
  if (!body.is_object()) return Status(ErrorCode::kInvalidInput, "ExtenderArgs: must be an object");
  const json* pod = Field(body, "Pod");
  if (!pod || !pod->is_object()) {
    return Status(ErrorCode::kInvalidInput, "ExtenderArgs.Pod: required, an object");
  }
  a.pod = pod;
  if (parsed.plain) {  // the scheduler's shape: the names are views into the request
    a.list.names = std::move(parsed.plain_names);
    a.list.text = parsed.names_text;
    return Status::Ok();
  }
  const json* names = Field(body, "NodeNames");
  const json* nodes = Field(body, "Nodes");
  auto views = [&a] {
    a.list.names.assign(a.owned.begin(), a.owned.end());
    return Status::Ok();
  };
  if (names && names->is_array() && parsed.names_taken && body.find("NodeNames") != body.end()) {
    if (parsed.bad_name >= 0) {
      return Status(
          ErrorCode::kInvalidInput,
          "ExtenderArgs.NodeNames[" + std::to_string(parsed.bad_name) + "]: must be a string");
    }
    a.owned = std::move(parsed.names);
    return views();
  }
  if (names && names->is_array()) {
    a.owned.reserve(names->size());
    for (size_t i = 0; i < names->size(); ++i) {
      if (!(*names)[i].is_string()) {
        return Status(ErrorCode::kInvalidInput,
                      "ExtenderArgs.NodeNames[" + std::to_string(i) + "]: must be a string");
      }
      a.owned.push_back((*names)[i].get<std::string>());
    }
    return views();
  }
  if (names && !names->is_null()) {
    return Status(ErrorCode::kInvalidInput, "ExtenderArgs.NodeNames: must be a list");
  }
  if (nodes && nodes->is_object()) {
    a.cache_mode = false;
    const json* items = Field(*nodes, "items");
    if (items && items->is_array()) {
      for (size_t i = 0; i < items->size(); ++i) {
        const json& n = (*items)[i];
        std::string name;
        if (n.is_object() && n.contains("metadata") && n["metadata"].is_object()) {
          name = n["metadata"].value("name", "");
        }
        if (name.empty()) {
          return Status(ErrorCode::kInvalidInput, "ExtenderArgs.Nodes.items[" + std::to_string(i) +
                                                      "].metadata.name: required");
        }
        a.owned.push_back(name);
        a.node_objects.push_back(&n);
      }
    }
    return views();
  }
  return Status(ErrorCode::kInvalidInput, "ExtenderArgs: NodeNames or Nodes required");
}

}  // namespace

Extender::Extender(ClusterView& view, Binder binder, PodGetter pods)
    : view_(view), binder_(std::move(binder)), pods_(std::move(pods)) {}

void Extender::Remember(const PodRequest& pod) {
  if (pod.uid.empty()) return;
  std::lock_guard l(pods_mu_);
  if (seen_.insert_or_assign(pod.uid, pod).second) {
    seen_order_.push_back(pod.uid);
    if (seen_order_.size() > kSeenPods) {
      seen_.erase(seen_order_.front());
      seen_order_.pop_front();
    }
  }
}

std::optional<PodRequest> Extender::Recall(const std::string& uid, const std::string& key) {
  std::lock_guard l(pods_mu_);
  auto it = seen_.find(uid);
  if (it == seen_.end() || it->second.key() != key) return std::nullopt;
  return it->second;
}

Answer Extender::Filter(const std::string& body) {
  ++filter_requests_;
  std::optional<Body> fast = ParseSchedulerBody(body);
  Body parsed = fast ? std::move(*fast) : ParseBody(body);
  if (parsed.doc.is_discarded()) {
    ++bad_requests_;
    return BadRequest("filter: request body is not JSON");
  }
  Args args;
  if (Status st = ParseArgs(parsed, args); !st.ok()) {
    ++bad_requests_;
    return BadRequest("filter: " + st.message());
  }
  const std::vector<std::string_view>& names = args.list.names;
  FilterOutcome out;
  std::vector<size_t> passed;  // indices into names
  auto pod = ParsePodRequest(*args.pod);
  if (!pod.ok()) {
    // The pod's own spec is wrong: no node can take it, and preemption cannot help.
    for (std::string_view n : names) out.unresolvable.emplace(n, pod.status().message());
  } else {
    Remember(*pod);
    out = view_.Filter(*pod, args.list, &passed);
  }
  nodes_passed_ += passed.size();
  nodes_failed_ += out.failed.size();
  nodes_unresolvable_ += out.unresolvable.size();
  // ExtenderFilterResult.
  std::string r;
  size_t bytes = 128;
  for (size_t i : passed) bytes += names[i].size() + 3;
  r.reserve(bytes);
  if (args.cache_mode) {
    r += "{\"Nodes\":null,\"NodeNames\":[";
    if (!args.list.text.empty() && passed.size() == names.size()) {
      r += args.list.text;  // every node passed: the list as it came
    } else {
      for (size_t k = 0; k < passed.size(); ++k) {
        if (k) r += ',';
        AppendString(r, names[passed[k]]);
      }
    }
    r += ']';
  } else {
    json items = json::array();
    for (size_t i : passed) items.push_back(*args.node_objects[i]);
    r += "{\"Nodes\":";
    r += json{{"metadata", json::object()}, {"items", std::move(items)}}.dump();
    r += ",\"NodeNames\":null";
  }
  r += ",\"FailedNodes\":";
  AppendMap(r, out.failed);
  r += ",\"FailedAndUnresolvableNodes\":";
  AppendMap(r, out.unresolvable);
  r += ",\"Error\":\"\"}";
  return {200, "application/json", std::move(r)};
}

Answer Extender::Prioritize(const std::string& body) {
  ++prioritize_requests_;
  std::optional<Body> fast = ParseSchedulerBody(body);
  Body parsed = fast ? std::move(*fast) : ParseBody(body);
  if (parsed.doc.is_discarded()) {
    ++bad_requests_;
    return BadRequest("prioritize: request body is not JSON");
  }
  Args args;
  if (Status st = ParseArgs(parsed, args); !st.ok()) {
    ++bad_requests_;
    return BadRequest("prioritize: " + st.message());
  }
  const std::vector<std::string_view>& names = args.list.names;
  // HostPriorityList.
  std::vector<int> scores;  // parallel to names
  auto pod = ParsePodRequest(*args.pod);
  if (!pod.ok()) {
    scores.assign(names.size(), 0);
  } else {
    scores = view_.Scores(*pod, args.list);
  }
  std::string r;
  size_t bytes = 2;
  for (std::string_view n : names) bytes += n.size() + 32;
  r.reserve(bytes);
  r += '[';
  for (size_t i = 0; i < scores.size(); ++i) {
    if (i) r += ',';
    r += "{\"Host\":";
    AppendString(r, names[i]);
    r += ",\"Score\":";
    r += std::to_string(scores[i]);
    r += '}';
  }
  r += ']';
  return {200, "application/json", std::move(r)};
}

Answer Extender::Bind(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    ++bad_requests_;
    return BadRequest("bind: request body is not a JSON object");
  }
  auto text = [&](const char* name) -> std::string {
    const json* f = Field(j, name);
    return f && f->is_string() ? f->get<std::string>() : "";
  };
  const std::string name = text("PodName"), ns = text("PodNamespace"), uid = text("PodUID"),
                    node = text("Node");
  if (name.empty() || ns.empty() || node.empty()) {
    ++bad_requests_;
    return BadRequest("bind: ExtenderBindingArgs: PodName, PodNamespace and Node are required");
  }
  auto fail = [&](const std::string& message, std::atomic<uint64_t>& counter) {
    ++counter;
    spdlog::warn("event=bind_failed pod={}/{} node={} error=\"{}\"", ns, name, node, message);
    return Answer{200, "application/json", json{{"Error", message}}.dump()};
  };
  std::optional<PodRequest> pod = Recall(uid, ns + "/" + name);
  if (!pod) {
    auto got = pods_(ns, name);
    if (!got.ok()) return fail("bind: " + got.status().message(), binds_failed_);
    auto parsed = ParsePodRequest(*got);
    if (!parsed.ok()) return fail("bind: " + parsed.status().message(), binds_refused_);
    pod = std::move(parsed).value();
  }
  if (pod->uid.empty()) pod->uid = uid;
  bool already = false;
  auto reserved = view_.Reserve(*pod, node, &already);
  if (!reserved.ok()) return fail(reserved.status().message(), binds_refused_);
  Status s = binder_(ns, name, uid, node);
  if (!s.ok()) {
    if (!already) view_.Unreserve(pod->key(), node);
    return fail(s.message(), binds_failed_);
  }
  ++binds_ok_;
  std::string gpus;
  for (const Assignment& a : *reserved) {
    gpus += (gpus.empty() ? "" : ",") + a.container + ":" + a.gpu + ":" + std::to_string(a.units);
  }
  spdlog::debug("event=bound pod={}/{} node={} reserved={}", ns, name, node, gpus);
  return {200, "application/json", json{{"Error", ""}}.dump()};
}

std::string Extender::Metrics() const {
  const ViewStats s = view_.stats();
  std::ostringstream o;
  auto counter = [&](const char* name, const char* help, uint64_t v,
                     const std::string& labels = "") {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n"
      << name << labels << " " << v << "\n";
  };
  auto gauge = [&](const char* name, const char* help, int64_t v) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n"
      << name << " " << v << "\n";
  };
  counter("gpulet_extender_filter_requests_total", "Filter calls.", filter_requests_.load());
  counter("gpulet_extender_prioritize_requests_total", "Prioritize calls.",
          prioritize_requests_.load());
  counter("gpulet_extender_bad_requests_total", "Requests answered 400.", bad_requests_.load());
  o << "# HELP gpulet_extender_filtered_nodes_total Nodes judged by filter, by outcome.\n"
       "# TYPE gpulet_extender_filtered_nodes_total counter\n"
    << "gpulet_extender_filtered_nodes_total{outcome=\"passed\"} " << nodes_passed_.load() << "\n"
    << "gpulet_extender_filtered_nodes_total{outcome=\"failed\"} " << nodes_failed_.load() << "\n"
    << "gpulet_extender_filtered_nodes_total{outcome=\"unresolvable\"} "
    << nodes_unresolvable_.load() << "\n";
  o << "# HELP gpulet_extender_binds_total Bind calls, by result.\n"
       "# TYPE gpulet_extender_binds_total counter\n"
    << "gpulet_extender_binds_total{result=\"bound\"} " << binds_ok_.load() << "\n"
    << "gpulet_extender_binds_total{result=\"refused\"} " << binds_refused_.load() << "\n"
    << "gpulet_extender_binds_total{result=\"failed\"} " << binds_failed_.load() << "\n";
  gauge("gpulet_extender_node_objects", "Per-node GPU memory objects known.",
        static_cast<int64_t>(s.objects));
  gauge("gpulet_extender_node_objects_malformed", "Objects that do not parse.",
        static_cast<int64_t>(s.malformed));
  gauge("gpulet_extender_node_objects_stale", "Objects not updated within the stale period.",
        static_cast<int64_t>(s.stale));
  gauge("gpulet_extender_reservations", "Bound pods whose units are held in memory.",
        static_cast<int64_t>(s.reservations));
  gauge("gpulet_extender_reserved_units", "Units held by reservations.", s.reserved_units);
  return o.str();
}

}  // namespace gpulet::extender
