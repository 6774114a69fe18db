#include "extender/extender.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string_view>
#include <tuple>

#include "extender/request.h"

namespace gpulet::extender {
namespace {

using nlohmann::json;

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

// Scheduler-shaped bodies: the names as views into the request, and the array's text.
struct Body {
  std::string_view pod_text;
  std::vector<std::string_view> plain_names;
  std::string_view names_text;
};

// The body as kube-scheduler sends it: {"Pod": {...}, "Nodes": null, "NodeNames": ["..."]},
// names plain ASCII. Reads the names without the general JSON parser (which costs more than
// the filtering at 5,000 nodes) and leaves the Pod to the SAX reader; everything else is checked
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
  b.pod_text = pod_text;
  return b;
}

struct Args {
  bool cache_mode = true;          // NodeNames given (else Nodes.items)
  std::vector<std::string> owned;  // the names, when they are not views into the request
  NameList list;                   // the names (views into the request or into `owned`)
  Result<PodRequest> pod = Status(ErrorCode::kInvalidInput, "no pod");
};

// ExtenderArgs from the body: the scheduler's shape through the scanner, anything else through
// the SAX reader; neither builds a DOM of the body.
Status ReadArgs(const std::string& body, const MemoryResourceTest& is_memory, Args& a) {
  if (std::optional<Body> fast = ParseSchedulerBody(body)) {
    if (fast->plain_names.size() > kMaxNodeNames) {
      return Status(ErrorCode::kInvalidInput, "ExtenderArgs.NodeNames: more than " +
                                                  std::to_string(kMaxNodeNames) + " nodes");
    }
    a.list.names = std::move(fast->plain_names);
    a.list.text = fast->names_text;
    a.pod = ParsePodRequestText(fast->pod_text, is_memory);
    if (!a.pod.ok() && a.pod.status().message().rfind("Pod: ", 0) == 0) {
      return Status(ErrorCode::kInvalidInput, "ExtenderArgs." + a.pod.status().message());
    }
    return Status::Ok();
  }
  auto fields = ReadExtenderArgs(body, is_memory);
  if (!fields.ok()) return fields.status();
  a.cache_mode = fields->names_given;
  a.owned = fields->names_given ? std::move(fields->names) : std::move(fields->node_items);
  a.list.names.assign(a.owned.begin(), a.owned.end());
  if (fields->pod_error.empty()) {
    a.pod = std::move(fields->pod);
  } else {
    a.pod = Status(ErrorCode::kInvalidInput, fields->pod_error);
  }
  return Status::Ok();
}

}  // namespace

Extender::Extender(ClusterView& view, Binder binder, PodGetter pods)
    : view_(view),
      binder_(std::move(binder)),
      pods_(std::move(pods)),
      is_memory_([this](std::string_view name) { return view_.IsMemoryResource(name); }) {}

Answer Extender::Filter(const std::string& body) {
  ++filter_requests_;
  Args args;
  if (Status st = ReadArgs(body, is_memory_, args); !st.ok()) {
    ++bad_requests_;
    return BadRequest("filter: " + st.message());
  }
  const std::vector<std::string_view>& names = args.list.names;
  FilterOutcome out;
  std::vector<size_t> passed;  // indices into names
  const Result<PodRequest>& pod = args.pod;
  if (!pod.ok()) {
    // The pod's own spec is wrong: no node can take it, and preemption cannot help.
    for (std::string_view n : names) out.unresolvable.emplace(n, pod.status().message());
  } else {
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
    // kube-scheduler reads only the names of the nodes returned (it keeps its own NodeInfo for
    // each), so each passing node is answered by its name.
    r += "{\"Nodes\":{\"metadata\":{},\"items\":[";
    for (size_t k = 0; k < passed.size(); ++k) {
      if (k) r += ',';
      r += "{\"metadata\":{\"name\":";
      AppendString(r, names[passed[k]]);
      r += "}}";
    }
    r += "]}";
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
  Args args;
  if (Status st = ReadArgs(body, is_memory_, args); !st.ok()) {
    ++bad_requests_;
    return BadRequest("prioritize: " + st.message());
  }
  const std::vector<std::string_view>& names = args.list.names;
  // HostPriorityList.
  std::vector<int> scores;  // parallel to names
  const Result<PodRequest>& pod = args.pod;
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
  // ExtenderBindingArgs is four short strings: a larger body is not one (and is not parsed).
  if (body.size() > kMaxBindBody) {
    ++bad_requests_;
    return BadRequest("bind: ExtenderBindingArgs larger than " + std::to_string(kMaxBindBody) +
                      " bytes");
  }
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
  if (name.empty() || ns.empty() || node.empty() || uid.empty()) {
    ++bad_requests_;
    return BadRequest(
        "bind: ExtenderBindingArgs: PodName, PodNamespace, PodUID and Node are required");
  }
  // Object names as the API server allows them (DNS subdomains; a namespace is a DNS label):
  // anything else names no pod, and must not reach an API path.
  for (const auto& [field, value, max] :
       {std::tuple{"PodNamespace", &ns, size_t{63}}, std::tuple{"PodName", &name, size_t{253}},
        std::tuple{"Node", &node, size_t{253}}}) {
    const bool ok =
        value->size() <= max && std::all_of(value->begin(), value->end(), [](char c) {
          return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.';
        });
    if (!ok || *value == "." || *value == "..") {
      ++bad_requests_;
      return BadRequest(std::string("bind: ExtenderBindingArgs.") + field +
                        ": not a Kubernetes object name: " + json(*value).dump().substr(0, 80));
    }
  }
  auto fail = [&](const std::string& message, std::atomic<uint64_t>& counter) {
    ++counter;
    spdlog::warn("event=bind_failed pod={}/{} uid={} node={} error=\"{}\"", ns, name, uid, node,
                 message);
    return Answer{200, "application/json", json{{"Error", message}}.dump()};
  };
  // The pod as the API server has it, never as a request described it: the UID must be the
  // scheduler's, the pod still unbound, and the units its spec asks for.
  auto got = pods_(ns, name);
  if (!got.ok()) return fail("bind: " + got.status().message(), binds_failed_);
  const json& meta = got->contains("metadata") && (*got)["metadata"].is_object()
                         ? (*got)["metadata"]
                         : json::object();
  const std::string api_uid = meta.value("uid", "");
  if (api_uid != uid) {
    return fail("bind: pod " + ns + "/" + name + " has UID " + api_uid + ", the request names " +
                    uid + " (a recreated pod, or a forged request): refused",
                binds_refused_);
  }
  if (meta.contains("deletionTimestamp") && !meta["deletionTimestamp"].is_null()) {
    return fail("bind: pod " + ns + "/" + name + " is being deleted: refused", binds_refused_);
  }
  if (got->contains("spec") && (*got)["spec"].is_object() &&
      !(*got)["spec"].value("nodeName", "").empty()) {
    return fail("bind: pod " + ns + "/" + name + " is already bound to node " +
                    (*got)["spec"].value("nodeName", "") + ": refused",
                binds_refused_);
  }
  auto parsed = ParsePodRequest(*got, is_memory_);
  if (!parsed.ok()) return fail("bind: " + parsed.status().message(), binds_refused_);
  PodRequest& pod = *parsed;
  if (!pod.names_memory) {
    return fail("bind: pod " + ns + "/" + name +
                    " asks for no GPU memory resource; the extender binds only those: refused",
                binds_refused_);
  }
  // A pod naming the resource with 0 units holds none: bound where the scheduler chose, nothing
  // reserved (refusing it would leave it Pending for ever: the scheduler binds it through us).
  bool already = false;
  Result<std::vector<Assignment>> reserved = std::vector<Assignment>{};
  if (pod.asks()) reserved = view_.Reserve(pod, node, &already);
  if (!reserved.ok()) return fail(reserved.status().message(), binds_refused_);
  // The Binding carries the UID: the API server refuses it if the pod was replaced meanwhile.
  Status s = binder_(ns, name, uid, node);
  if (!s.ok()) {
    // A failed write may still have landed (its answer lost, or the client gave up first): the
    // pod as the API server has it now decides. Bound here under this UID: it is a success, and
    // the reservation stays. Unbound or elsewhere: the reservation goes. Unknown: it stays, and
    // ends on evidence like every other (the node lists the pod, or the pod is gone or elsewhere).
    auto now = pods_(ns, name);
    if (now.ok()) {
      const json meta = now->value("metadata", json::object());
      const json spec = now->value("spec", json::object());
      if (meta.value("uid", "") == uid && spec.value("nodeName", "") == node) {
        spdlog::info("event=bind_landed pod={}/{} uid={} node={} error=\"{}\"", ns, name, uid,
                     node, s.message());
        ++binds_ok_;
        return {200, "application/json", json{{"Error", ""}}.dump()};
      }
      if (pod.asks() && !already) view_.Unreserve(uid, node);
    }
    return fail(s.message(), binds_failed_);
  }
  ++binds_ok_;
  std::string gpus;
  for (const Assignment& a : *reserved) {
    gpus += (gpus.empty() ? "" : ",") + a.container + ":" + a.gpu + ":" + std::to_string(a.units);
  }
  spdlog::debug("event=bound pod={}/{} uid={} node={} reserved={}", ns, name, uid, node, gpus);
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
