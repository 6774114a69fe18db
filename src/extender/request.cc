#include "extender/request.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>

#include "k8s/quantity.h"

namespace gpulet::extender {
namespace {

using nlohmann::json;

constexpr int64_t kMaxUnits = int64_t{1} << 40;

bool SameLetters(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  }
  return true;
}

// What is kept of a v1.Pod.
struct PodFields {
  std::string ns, name, uid;
  struct Quantity {
    std::string resource;
    std::string text;  // the quantity's text ("20", "2k"); empty with `bad`
    std::string bad;   // the JSON value was not a string or number: what it was
    bool from_limits = false;
  };
  struct Container {
    bool init = false;
    size_t index = 0;  // in its list
    std::string name;
    std::string restart_policy;
    std::vector<Quantity> quantities;  // of memory resources only
  };
  std::vector<Container> containers;
  size_t init_count = 0, app_count = 0;
};

// One SAX pass. Frames name where the parser is; anything else is skipped by depth alone.
class Reader {
 public:
  enum class Root { kPod, kArgs };
  Reader(Root root, const MemoryResourceTest& is_memory) : root_(root), is_memory_(is_memory) {}

  // nlohmann's SAX interface.
  bool null() { return Scalar(Value::kNull, {}); }
  bool boolean(bool) { return Scalar(Value::kOther, "a boolean"); }
  bool number_integer(json::number_integer_t v) {
    return Scalar(Value::kNumber, std::to_string(v));
  }
  bool number_unsigned(json::number_unsigned_t v) {
    return Scalar(Value::kNumber, std::to_string(v));
  }
  bool number_float(json::number_float_t, const std::string& text) {
    return Scalar(Value::kNumber, text);
  }
  bool string(std::string& v) { return Scalar(Value::kString, std::move(v)); }
  bool binary(json::binary_t&) { return Scalar(Value::kOther, "binary"); }
  bool key(std::string& k) {
    if (skip_ == 0) key_ = std::move(k);
    return true;
  }
  bool start_object(size_t) { return Start(true); }
  bool start_array(size_t) { return Start(false); }
  bool end_object() { return End(); }
  bool end_array() { return End(); }
  bool parse_error(size_t position, const std::string&, const nlohmann::detail::exception&) {
    error_ = "not JSON (at byte " + std::to_string(position) + ")";
    return false;
  }

  std::string error_;  // the first error
  bool root_object = false;
  bool has_pod = false;
  PodFields pod;
  bool names_given = false;
  std::vector<std::string> names;
  long bad_name = -1;
  bool nodes_given = false;
  std::vector<std::string> node_items;

 private:
  enum class Frame {
    kArgs,
    kPod,
    kMeta,
    kSpec,
    kContainers,
    kContainer,
    kResources,
    kQuantities,
    kNodeNames,
    kNodes,
    kNodeItems,
    kNodeItem,
    kNodeItemMeta
  };
  enum class Value { kNull, kNumber, kString, kOther };

  bool TooMany(const char* field) {
    return Fail(std::string(field) + ": more than " + std::to_string(kMaxNodeNames) + " nodes");
  }
  bool Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }

  // A top-level ExtenderArgs key, as Go matches it.
  bool ArgsKey(std::string_view name) const { return SameLetters(key_, name); }

  bool Start(bool object) {
    if (skip_ > 0) {
      ++skip_;
      return true;
    }
    if (stack_.empty()) {
      root_object = object;
      if (!object) return Fail("must be an object");
      stack_.push_back(root_ == Root::kPod ? Frame::kPod : Frame::kArgs);
      if (root_ == Root::kPod) has_pod = true;
      return true;
    }
    const Frame top = stack_.back();
    auto enter = [&](Frame f) {
      stack_.push_back(f);
      return true;
    };
    switch (top) {
      case Frame::kArgs:
        if (ArgsKey("Pod")) {
          if (!object) return Fail("Pod: must be an object");
          has_pod = true;
          pod = PodFields{};
          return enter(Frame::kPod);
        }
        if (ArgsKey("NodeNames")) {
          if (object) return Fail("NodeNames: must be a list");
          names_given = true;
          names.clear();
          bad_name = -1;
          return enter(Frame::kNodeNames);
        }
        if (ArgsKey("Nodes")) {
          if (!object) return Fail("Nodes: must be an object");
          nodes_given = true;
          node_items.clear();
          return enter(Frame::kNodes);
        }
        break;
      case Frame::kPod:
        if (object && key_ == "metadata") return enter(Frame::kMeta);
        if (object && key_ == "spec") return enter(Frame::kSpec);
        break;
      case Frame::kSpec:
        if (!object && (key_ == "initContainers" || key_ == "containers")) {
          in_init_ = key_ == "initContainers";
          return enter(Frame::kContainers);
        }
        break;
      case Frame::kContainers:
        if (object) {
          PodFields::Container c;
          c.init = in_init_;
          c.index = in_init_ ? pod.init_count++ : pod.app_count++;
          pod.containers.push_back(std::move(c));
          return enter(Frame::kContainer);
        }
        (in_init_ ? pod.init_count : pod.app_count)++;
        break;
      case Frame::kContainer:
        if (object && key_ == "resources") return enter(Frame::kResources);
        break;
      case Frame::kResources:
        if (object && (key_ == "limits" || key_ == "requests")) {
          from_limits_ = key_ == "limits";
          return enter(Frame::kQuantities);
        }
        break;
      case Frame::kQuantities:
        if (is_memory_(key_)) {
          Quantity(Value::kOther, object ? "an object" : "a list");
        }
        break;
      case Frame::kNodeNames:
        if (names.size() >= kMaxNodeNames) return TooMany("NodeNames");
        if (bad_name < 0) bad_name = static_cast<long>(names.size());
        names.emplace_back();
        break;
      case Frame::kNodes:
        if (SameLetters(key_, "items")) {
          if (object) return Fail("Nodes.items: must be a list");
          node_items.clear();
          return enter(Frame::kNodeItems);
        }
        break;
      case Frame::kNodeItems:
        if (node_items.size() >= kMaxNodeNames) return TooMany("Nodes.items");
        node_items.emplace_back();
        if (object) return enter(Frame::kNodeItem);
        break;
      case Frame::kNodeItem:
        if (object && key_ == "metadata") return enter(Frame::kNodeItemMeta);
        break;
      case Frame::kMeta:
      case Frame::kNodeItemMeta:
        break;
    }
    skip_ = 1;
    return true;
  }

  bool End() {
    if (skip_ > 0) {
      --skip_;
      return true;
    }
    if (!stack_.empty()) stack_.pop_back();
    return true;
  }

  void Quantity(Value type, std::string text) {
    PodFields::Quantity q;
    q.resource = key_;
    q.from_limits = from_limits_;
    if (type == Value::kString || type == Value::kNumber) {
      q.text = std::move(text);
    } else {
      q.bad = std::move(text);
    }
    auto& list = pod.containers.back().quantities;
    // A repeated key: the last one counts.
    list.erase(std::remove_if(list.begin(), list.end(),
                              [&](const PodFields::Quantity& o) {
                                return o.resource == q.resource && o.from_limits == q.from_limits;
                              }),
               list.end());
    list.push_back(std::move(q));
  }

  bool Scalar(Value type, std::string text) {
    if (skip_ > 0) return true;
    if (stack_.empty()) {
      root_object = false;
      return Fail("must be an object");
    }
    const bool is_string = type == Value::kString;
    switch (stack_.back()) {
      case Frame::kArgs:
        if (ArgsKey("Pod")) {
          if (type != Value::kNull) return Fail("Pod: must be an object");
          has_pod = false;
        } else if (ArgsKey("NodeNames")) {
          if (type != Value::kNull) return Fail("NodeNames: must be a list");
          names_given = false;
        } else if (ArgsKey("Nodes")) {
          if (type != Value::kNull) return Fail("Nodes: must be an object");
          nodes_given = false;
        }
        break;
      case Frame::kMeta:
        if (!is_string) break;
        if (key_ == "name") pod.name = std::move(text);
        if (key_ == "namespace") pod.ns = std::move(text);
        if (key_ == "uid") pod.uid = std::move(text);
        break;
      case Frame::kContainers:
        (in_init_ ? pod.init_count : pod.app_count)++;
        break;
      case Frame::kContainer:
        if (!is_string) break;
        if (key_ == "name") pod.containers.back().name = std::move(text);
        if (key_ == "restartPolicy") pod.containers.back().restart_policy = std::move(text);
        break;
      case Frame::kQuantities:
        if (type != Value::kNull && is_memory_(key_)) Quantity(type, std::move(text));
        break;
      case Frame::kNodeNames:
        if (names.size() >= kMaxNodeNames) return TooMany("NodeNames");
        if (!is_string && bad_name < 0) bad_name = static_cast<long>(names.size());
        names.push_back(is_string ? std::move(text) : std::string());
        break;
      case Frame::kNodeItems:
        if (node_items.size() >= kMaxNodeNames) return TooMany("Nodes.items");
        node_items.emplace_back();
        break;
      case Frame::kNodeItemMeta:
        if (is_string && key_ == "name") node_items.back() = std::move(text);
        break;
      default:
        break;
    }
    return true;
  }

  const Root root_;
  const MemoryResourceTest& is_memory_;
  std::vector<Frame> stack_;  // at most 6 deep: deeper levels are only counted in skip_
  int64_t skip_ = 0;
  std::string key_;
  bool in_init_ = false;
  bool from_limits_ = false;
};

Result<PodRequest> BuildRequest(PodFields& f, const MemoryResourceTest& is_memory) {
  (void)is_memory;
  PodRequest r;
  r.ns = f.ns.empty() ? "default" : std::move(f.ns);
  r.name = std::move(f.name);
  r.uid = std::move(f.uid);
  for (PodFields::Container& c : f.containers) {
    const std::string list = c.init ? "initContainers" : "containers";
    const std::string where = "spec." + list + "[" + std::to_string(c.index) + "] (" + c.name + ")";
    // Extended resources: requests equal limits; a limit alone sets the request.
    std::map<std::string, const PodFields::Quantity*> asked;
    for (const PodFields::Quantity& q : c.quantities) {
      auto [it, inserted] = asked.emplace(q.resource, &q);
      if (!inserted && !q.from_limits) it->second = &q;
    }
    for (const auto& [name, q] : asked) {
      const std::string field =
          "resources." + std::string(q->from_limits ? "limits" : "requests") + "[\"" + name + "\"]";
      if (!q->bad.empty()) {
        return Status(ErrorCode::kInvalidInput,
                      where + ": " + field + ": must be a quantity, got " + q->bad);
      }
      auto units = k8s::ParseWholeQuantity(q->text, kMaxUnits);
      if (!units.ok()) {
        return Status(ErrorCode::kInvalidInput,
                      where + ": " + field +
                          ": must be a whole number of units: " + units.status().message());
      }
      r.names_memory = true;
      if (*units == 0) continue;
      if (!r.resource.empty() && r.resource != name) {
        return Status(ErrorCode::kInvalidInput, where + ": asks for both " + r.resource + " and " +
                                                    name + "; a pod may use one memory resource");
      }
      r.resource = name;
      PodRequest::Step s;
      s.container = {c.name, *units};
      s.kind = !c.init                        ? PodRequest::Step::kApp
               : c.restart_policy == "Always" ? PodRequest::Step::kSidecar
                                              : PodRequest::Step::kInit;
      r.steps.push_back(std::move(s));
    }
  }
  // The kubelet allocates init containers (in order) before the app containers.
  std::stable_partition(r.steps.begin(), r.steps.end(),
                        [](const PodRequest::Step& s) { return s.kind != PodRequest::Step::kApp; });
  return r;
}

}  // namespace

bool DefaultMemoryResource(std::string_view name) {
  return name.rfind(kMemoryResourcePrefix, 0) == 0;
}

int64_t PodRequest::total() const {
  int64_t init = 0, held = 0;
  for (const Step& s : steps) {
    if (s.kind == Step::kInit) {
      init = std::max(init, s.container.units);
    } else {
      held += s.container.units;
    }
  }
  return std::max(init, held);
}

Result<int64_t> ParseUnits(const json& q) {
  std::string text;
  if (q.is_number_unsigned() || q.is_number_integer()) {
    text = std::to_string(q.get<int64_t>());
  } else if (q.is_number_float()) {
    text = q.dump();
  } else if (q.is_string()) {
    text = q.get<std::string>();
  } else {
    return Status(ErrorCode::kInvalidInput, "must be a quantity, got " + q.dump().substr(0, 60));
  }
  auto v = k8s::ParseWholeQuantity(text, kMaxUnits);
  if (!v.ok()) {
    return Status(ErrorCode::kInvalidInput,
                  "must be a whole number of units: " + v.status().message());
  }
  return *v;
}

Result<PodRequest> ParsePodRequestText(std::string_view text, const MemoryResourceTest& is_memory) {
  Reader r(Reader::Root::kPod, is_memory);
  const bool ok = json::sax_parse(text.begin(), text.end(), &r);
  if (!ok || !r.root_object) {
    return Status(ErrorCode::kInvalidInput,
                  "Pod: " + (r.error_.empty() ? std::string("must be an object") : r.error_));
  }
  return BuildRequest(r.pod, is_memory);
}

Result<PodRequest> ParsePodRequest(const json& pod, const MemoryResourceTest& is_memory) {
  if (!pod.is_object()) return Status(ErrorCode::kInvalidInput, "Pod: must be an object");
  return ParsePodRequestText(pod.dump(), is_memory);
}

Result<ExtenderArgsFields> ReadExtenderArgs(std::string_view body,
                                            const MemoryResourceTest& is_memory) {
  Reader r(Reader::Root::kArgs, is_memory);
  const bool ok = json::sax_parse(body.begin(), body.end(), &r);
  if (!ok) {
    return Status(ErrorCode::kInvalidInput,
                  "ExtenderArgs: " + (r.error_.empty() ? std::string("not JSON") : r.error_));
  }
  if (!r.root_object) return Status(ErrorCode::kInvalidInput, "ExtenderArgs: must be an object");
  ExtenderArgsFields a;
  if (!r.has_pod) return Status(ErrorCode::kInvalidInput, "ExtenderArgs.Pod: required, an object");
  a.has_pod = true;
  if (r.names_given && r.bad_name >= 0) {
    return Status(ErrorCode::kInvalidInput,
                  "ExtenderArgs.NodeNames[" + std::to_string(r.bad_name) + "]: must be a string");
  }
  if (!r.names_given && r.nodes_given) {
    for (size_t i = 0; i < r.node_items.size(); ++i) {
      if (r.node_items[i].empty()) {
        return Status(ErrorCode::kInvalidInput, "ExtenderArgs.Nodes.items[" + std::to_string(i) +
                                                    "].metadata.name: required");
      }
    }
  }
  if (!r.names_given && !r.nodes_given) {
    return Status(ErrorCode::kInvalidInput, "ExtenderArgs: NodeNames or Nodes required");
  }
  a.names_given = r.names_given;
  a.names = std::move(r.names);
  a.nodes_given = r.nodes_given;
  a.node_items = std::move(r.node_items);
  auto pod = BuildRequest(r.pod, is_memory);
  if (pod.ok()) {
    a.pod = std::move(pod).value();
  } else {
    a.pod_error = pod.status().message();
  }
  return a;
}

}  // namespace gpulet::extender
