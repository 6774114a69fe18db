#include "dra/allocator.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <tuple>

#include "k8s/quantity.h"

namespace gpulet::testing::dra {

namespace {

using nlohmann::json;

std::string Qualify(const std::string& name, const std::string& driver) {
  return name.find('/') == std::string::npos ? driver + "/" + name : name;
}

// The value inside a DeviceAttribute ({"string": "x"} → "x").
json AttributeValue(const json& attr) {
  if (!attr.is_object() || attr.size() != 1) return nullptr;
  return attr.begin().value();
}

std::optional<int64_t> Quantity(const json& v) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (!v.is_string()) return std::nullopt;
  Result<int64_t> q = k8s::ParseWholeQuantity(v.get<std::string>());
  if (!q.ok()) return std::nullopt;
  return *q;
}

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\n");
  const size_t e = s.find_last_not_of(" \t\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

}  // namespace

namespace {

// A tiny cursor over one selector term.
struct Cursor {
  const std::string& s;
  size_t i = 0;
  void Space() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n')) ++i;
  }
  bool Eat(const std::string& word) {
    Space();
    if (s.compare(i, word.size(), word) != 0) return false;
    i += word.size();
    return true;
  }
  std::optional<std::string> Quoted() {
    Space();
    if (i >= s.size() || (s[i] != '"' && s[i] != '\'')) return std::nullopt;
    const char q = s[i];
    const size_t end = s.find(q, i + 1);
    if (end == std::string::npos) return std::nullopt;
    std::string out = s.substr(i + 1, end - i - 1);
    i = end + 1;
    return out;
  }
  std::string Identifier() {
    Space();
    const size_t start = i;
    while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '_')) ++i;
    return s.substr(start, i - start);
  }
};

}  // namespace

Result<Selector> ParseSelector(const std::string& cel) {
  Selector out;
  size_t pos = 0;
  while (pos <= cel.size()) {
    const size_t amp = cel.find("&&", pos);
    const std::string term = Trim(cel.substr(pos, amp == std::string::npos ? std::string::npos
                                                                             : amp - pos));
    auto outside = [&] {
      return Status(ErrorCode::kInvalidInput, "selector \"" + cel + "\": term \"" + term +
                                                  "\" is outside the stand-in's CEL subset");
    };
    Cursor c{term};
    if (c.Eat("device.driver")) {
      std::optional<std::string> v;
      if (!c.Eat("==") || !(v = c.Quoted())) return outside();
      c.Space();
      if (c.i != term.size()) return outside();
      out.push_back({"", *v});
    } else if (c.Eat("device.attributes")) {
      std::optional<std::string> domain;
      if (!c.Eat("[") || !(domain = c.Quoted()) || !c.Eat("]") || !c.Eat(".")) return outside();
      const std::string name = c.Identifier();
      if (name.empty() || !c.Eat("==")) return outside();
      const std::string v = Trim(term.substr(c.i));
      json value;
      if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front() &&
          v.find(v.front(), 1) == v.size() - 1) {
        value = v.substr(1, v.size() - 2);
      } else if (v == "true" || v == "false") {
        value = v == "true";
      } else if (v.size() < 19 && !v.empty() && v != "-" &&
                 std::all_of(v.begin() + (v[0] == '-'), v.end(),
                             [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); })) {
        value = std::stoll(v);
      } else {
        return Status(ErrorCode::kInvalidInput,
                      "selector \"" + cel + "\": value " + v + " is not a literal");
      }
      out.push_back({*domain + "/" + name, value});
    } else {
      return outside();
    }
    if (amp == std::string::npos) break;
    pos = amp + 2;
  }
  return out;
}

namespace {

Result<std::vector<Selector>> ParseSelectors(const json& list, const std::string& where) {
  std::vector<Selector> out;
  if (list.is_null()) return out;
  if (!list.is_array()) return Status(ErrorCode::kInvalidInput, where + ": not a list");
  for (size_t i = 0; i < list.size(); ++i) {
    const json& s = list[i];
    if (!s.is_object() || !s.contains("cel") || !s["cel"].contains("expression") ||
        !s["cel"]["expression"].is_string()) {
      return Status(ErrorCode::kInvalidInput,
                    where + "[" + std::to_string(i) + "].cel.expression: required");
    }
    Result<Selector> sel = ParseSelector(s["cel"]["expression"].get<std::string>());
    if (!sel.ok()) return sel.status();
    out.push_back(std::move(*sel));
  }
  return out;
}

}  // namespace

Result<DeviceClass> ParseDeviceClass(const json& object) {
  DeviceClass c;
  c.name = object.contains("metadata") ? object["metadata"].value("name", "") : "";
  if (c.name.empty()) return Status(ErrorCode::kInvalidInput, "DeviceClass: metadata.name missing");
  const json spec = object.value("spec", json::object());
  Result<std::vector<Selector>> sel =
      ParseSelectors(spec.value("selectors", json()), "DeviceClass " + c.name + ": spec.selectors");
  if (!sel.ok()) return sel.status();
  c.selectors = std::move(*sel);
  return c;
}

Result<ClaimSpec> ParseClaimSpec(const json& spec) {
  ClaimSpec out;
  const json devices = spec.value("devices", json::object());
  const json requests = devices.value("requests", json::array());
  for (size_t i = 0; i < requests.size(); ++i) {
    const std::string f = "spec.devices.requests[" + std::to_string(i) + "]";
    const json& r = requests[i];
    if (!r.contains("exactly")) {
      return Status(ErrorCode::kInvalidInput, f + ": only `exactly` requests are supported");
    }
    const json& e = r["exactly"];
    Request req;
    req.name = r.value("name", "");
    req.device_class = e.value("deviceClassName", "");
    if (e.value("allocationMode", "ExactCount") != "ExactCount") {
      return Status(ErrorCode::kInvalidInput, f + ".exactly.allocationMode: only ExactCount");
    }
    req.count = e.value("count", 1);
    Result<std::vector<Selector>> sel =
        ParseSelectors(e.value("selectors", json()), f + ".exactly.selectors");
    if (!sel.ok()) return sel.status();
    req.selectors = std::move(*sel);
    if (e.contains("capacity") && e["capacity"].contains("requests")) {
      for (const auto& [k, v] : e["capacity"]["requests"].items()) {
        std::optional<int64_t> q = Quantity(v);
        if (!q) return Status(ErrorCode::kInvalidInput, f + ".exactly.capacity.requests." + k);
        req.capacity[k] = *q;
      }
    }
    for (const json& t : e.value("tolerations", json::array())) {
      req.tolerations.push_back({t.value("key", ""), t.value("operator", "Equal"),
                                 t.value("value", ""), t.value("effect", "")});
    }
    out.requests.push_back(std::move(req));
  }
  for (const json& c : devices.value("constraints", json::array())) {
    Constraint con;
    for (const json& r : c.value("requests", json::array())) con.requests.push_back(r);
    con.match_attribute = c.value("matchAttribute", "");
    con.distinct_attribute = c.value("distinctAttribute", "");
    out.constraints.push_back(std::move(con));
  }
  return out;
}

struct Allocator::Device {
  std::string name;
  std::string slice;
  std::string driver;
  size_t pool = 0;
  std::map<std::string, json> attributes;  // qualified → DeviceAttribute
  struct Capacity {
    int64_t value = 0;
    bool has_policy = false;
    int64_t default_value = 0;
    std::optional<int64_t> min, max, step;
    std::vector<int64_t> valid_values;
  };
  std::map<std::string, Capacity> capacity;  // qualified
  bool multi = false;
  std::vector<std::pair<std::string, std::map<std::string, int64_t>>> consumes;
  std::vector<json> taints;
};

struct Allocator::Pool {
  std::string driver, name;
  std::vector<Device> devices;
  std::map<std::string, std::map<std::string, int64_t>> counters;
};

// The allocation state of one device.
struct DeviceState {
  bool allocated = false;  // exclusive devices
  int shares = 0;          // multi-allocatable devices
  std::map<std::string, int64_t> used;
};

// What is allocated: committed in the Allocator between claims, copied by a search.
struct Allocator::State {
  std::map<std::pair<size_t, size_t>, DeviceState> devices;  // (pool, device)
  std::map<std::tuple<size_t, std::string, std::string>, int64_t> counters;  // used
};

struct Allocator::Search {
  const ClaimSpec* claim = nullptr;
  std::vector<std::pair<size_t, size_t>> slots;  // (request index, k)
  State state;
  std::vector<DeviceResult> chosen;
  std::vector<const Device*> chosen_devices;
};

Allocator::~Allocator() = default;

Allocator::Allocator(std::vector<json> slices, std::vector<DeviceClass> classes)
    : state_(std::make_unique<State>()) {
  for (DeviceClass& c : classes) classes_[c.name] = std::move(c);
  std::sort(slices.begin(), slices.end(), [](const json& a, const json& b) {
    return a["metadata"].value("name", "") < b["metadata"].value("name", "");
  });
  // Highest generation per pool, and completeness.
  std::map<std::pair<std::string, std::string>, int64_t> gen;
  for (const json& s : slices) {
    const json& spec = s["spec"];
    auto key = std::make_pair(spec.value("driver", ""), spec["pool"].value("name", ""));
    gen[key] = std::max(gen.count(key) ? gen[key] : int64_t{-1},
                        spec["pool"].value("generation", int64_t{0}));
  }
  std::map<std::pair<std::string, std::string>, std::vector<const json*>> current;
  for (const json& s : slices) {
    const json& spec = s["spec"];
    auto key = std::make_pair(spec.value("driver", ""), spec["pool"].value("name", ""));
    if (spec["pool"].value("generation", int64_t{0}) == gen[key]) current[key].push_back(&s);
  }
  for (auto& [key, list] : current) {
    const int64_t want = (*list.front())["spec"]["pool"].value("resourceSliceCount", int64_t{1});
    if (static_cast<int64_t>(list.size()) != want) {
      slice_errors_.push_back("pool " + key.second + ": " + std::to_string(list.size()) + " of " +
                              std::to_string(want) + " slices (incomplete, not used)");
      continue;
    }
    Pool pool;
    pool.driver = key.first;
    pool.name = key.second;
    const size_t pool_index = pools_.size();
    for (const json* s : list) {
      const json& spec = (*s)["spec"];
      const std::string slice = (*s)["metadata"].value("name", "");
      for (const json& set : spec.value("sharedCounters", json::array())) {
        auto& counters = pool.counters[set.value("name", "")];
        const json set_counters = set.value("counters", json::object());
        for (const auto& [k, v] : set_counters.items()) {
          std::optional<int64_t> q = Quantity(v.value("value", json()));
          if (!q) slice_errors_.push_back(slice + ": counter " + k + ": not a quantity");
          counters[k] = q.value_or(0);
        }
      }
      for (const json& d : spec.value("devices", json::array())) {
        Device dev;
        dev.name = d.value("name", "");
        dev.slice = slice;
        dev.driver = pool.driver;
        dev.pool = pool_index;
        const json attributes = d.value("attributes", json::object());
        const json capacity = d.value("capacity", json::object());
        for (const auto& [k, v] : attributes.items()) {
          dev.attributes[Qualify(k, pool.driver)] = v;
        }
        for (const auto& [k, v] : capacity.items()) {
          Device::Capacity c;
          std::optional<int64_t> q = Quantity(v.value("value", json()));
          if (!q) slice_errors_.push_back(slice + "/" + dev.name + ": capacity " + k);
          c.value = q.value_or(0);
          if (v.contains("requestPolicy")) {
            const json& p = v["requestPolicy"];
            c.has_policy = true;
            c.default_value = Quantity(p.value("default", json())).value_or(c.value);
            if (p.contains("validRange")) {
              const json& r = p["validRange"];
              if (r.contains("min")) c.min = Quantity(r["min"]);
              if (r.contains("max")) c.max = Quantity(r["max"]);
              if (r.contains("step")) c.step = Quantity(r["step"]);
            }
            for (const json& vv : p.value("validValues", json::array())) {
              if (auto x = Quantity(vv)) c.valid_values.push_back(*x);
            }
            std::sort(c.valid_values.begin(), c.valid_values.end());
          }
          dev.capacity[Qualify(k, pool.driver)] = c;
        }
        dev.multi = d.value("allowMultipleAllocations", false);
        for (const json& c : d.value("consumesCounters", json::array())) {
          std::map<std::string, int64_t> need;
          const json counters = c.value("counters", json::object());
          for (const auto& [k, v] : counters.items()) {
            need[k] = Quantity(v.value("value", json())).value_or(0);
          }
          dev.consumes.push_back({c.value("counterSet", ""), std::move(need)});
        }
        for (const json& t : d.value("taints", json::array())) dev.taints.push_back(t);
        pool.devices.push_back(std::move(dev));
      }
    }
    for (const Device& d : pool.devices) {
      for (const auto& [set, need] : d.consumes) {
        if (!pool.counters.count(set)) {
          slice_errors_.push_back(d.slice + "/" + d.name + ": counter set " + set +
                                  " is not in the pool");
        }
        for (const auto& [k, v] : need) {
          if (pool.counters.count(set) && !pool.counters[set].count(k)) {
            slice_errors_.push_back(d.slice + "/" + d.name + ": counter " + set + "/" + k +
                                    " is not in the set");
          }
          (void)v;
        }
      }
    }
    pools_.push_back(std::move(pool));
  }
}

namespace {

bool SelectorHolds(const Selector& sel, const std::string& driver,
                   const std::map<std::string, json>& attributes) {
  for (const Equality& e : sel) {
    if (e.attribute.empty()) {
      if (driver != e.value) return false;
      continue;
    }
    auto it = attributes.find(e.attribute);
    if (it == attributes.end() || AttributeValue(it->second) != e.value) return false;
  }
  return true;
}

bool Tolerated(const json& taint, const std::vector<Toleration>& tolerations) {
  const std::string effect = taint.value("effect", "");
  if (effect != "NoSchedule" && effect != "NoExecute") return true;
  for (const Toleration& t : tolerations) {
    if (!t.effect.empty() && t.effect != effect) continue;
    if (t.key.empty() && t.op == "Exists") return true;
    if (t.key != taint.value("key", "")) continue;
    if (t.op == "Exists" || t.value == taint.value("value", "")) return true;
  }
  return false;
}

// The amount a share of `c` takes for a request of `want` (nullopt: no request); nullopt when
// the request is outside the policy.
std::optional<int64_t> Rounded(const auto& c, std::optional<int64_t> want) {
  if (!c.has_policy) return want.value_or(c.value);
  if (!want) return c.default_value;
  int64_t r = *want;
  if (!c.valid_values.empty()) {
    for (int64_t v : c.valid_values) {
      if (v >= r) return v;
    }
    return std::nullopt;
  }
  const int64_t min = c.min.value_or(0);
  if (r < min) r = min;
  if (c.step && *c.step > 0) r = min + (r - min + *c.step - 1) / *c.step * *c.step;
  if (c.max && r > *c.max) return std::nullopt;
  return r;
}

}  // namespace

bool Allocator::Fits(const Device& d, const Request& r, const Search& s,
                     std::map<std::string, int64_t>* consumed) const {
  const DeviceClass& cls = classes_.at(r.device_class);
  for (const Selector& sel : cls.selectors) {
    if (!SelectorHolds(sel, d.driver, d.attributes)) return false;
  }
  for (const Selector& sel : r.selectors) {
    if (!SelectorHolds(sel, d.driver, d.attributes)) return false;
  }
  for (const json& t : d.taints) {
    if (!Tolerated(t, r.tolerations)) return false;
  }
  const size_t di = static_cast<size_t>(&d - pools_[d.pool].devices.data());
  auto st = s.state.devices.find({d.pool, di});
  const DeviceState state = st == s.state.devices.end() ? DeviceState{} : st->second;
  std::map<std::string, int64_t> want;
  for (const auto& [k, v] : r.capacity) want[Qualify(k, d.driver)] = v;
  if (d.multi) {
    for (const auto& [name, _] : want) {
      if (!d.capacity.count(name)) return false;
    }
    for (const auto& [name, c] : d.capacity) {
      std::optional<int64_t> w;
      if (auto it = want.find(name); it != want.end()) w = it->second;
      std::optional<int64_t> take = Rounded(c, w);
      if (!take) return false;
      const int64_t used = state.used.count(name) ? state.used.at(name) : 0;
      if (used + *take > c.value) return false;
      (*consumed)[name] = *take;
    }
  } else {
    if (state.allocated) return false;
    for (const auto& [name, v] : want) {
      auto it = d.capacity.find(name);
      if (it == d.capacity.end() || it->second.value < v) return false;
    }
  }
  if (!d.multi || state.shares == 0) {
    for (const auto& [set, need] : d.consumes) {
      auto pc = pools_[d.pool].counters.find(set);
      if (pc == pools_[d.pool].counters.end()) return false;
      for (const auto& [k, v] : need) {
        auto total = pc->second.find(k);
        if (total == pc->second.end()) return false;
        auto u = s.state.counters.find({d.pool, set, k});
        if ((u == s.state.counters.end() ? 0 : u->second) + v > total->second) return false;
      }
    }
  }
  return true;
}

namespace {

bool ConstraintsHold(const ClaimSpec& claim, const std::vector<DeviceResult>& chosen,
                     const std::vector<const void*>& attrs_of) {
  for (const Constraint& c : claim.constraints) {
    std::vector<const std::map<std::string, json>*> in;
    for (size_t i = 0; i < chosen.size(); ++i) {
      if (!c.requests.empty() && std::find(c.requests.begin(), c.requests.end(),
                                           chosen[i].request) == c.requests.end()) {
        continue;
      }
      in.push_back(static_cast<const std::map<std::string, json>*>(attrs_of[i]));
    }
    if (!c.match_attribute.empty()) {
      const json* first = nullptr;
      for (const auto* a : in) {
        auto it = a->find(c.match_attribute);
        if (it == a->end()) return false;
        if (first == nullptr) {
          first = &it->second;
        } else if (*first != it->second) {
          return false;
        }
      }
    }
    if (!c.distinct_attribute.empty()) {
      std::vector<json> seen;
      for (const auto* a : in) {
        auto it = a->find(c.distinct_attribute);
        if (it == a->end()) return false;
        if (std::find(seen.begin(), seen.end(), it->second) != seen.end()) return false;
        seen.push_back(it->second);
      }
    }
  }
  return true;
}

}  // namespace

bool Allocator::Place(Search& s, size_t slot) const {
  if (slot == s.slots.size()) return true;
  const Request& r = s.claim->requests[s.slots[slot].first];
  for (size_t p = 0; p < pools_.size(); ++p) {
    const Pool& pool = pools_[p];
    for (size_t di = 0; di < pool.devices.size(); ++di) {
      const Device& d = pool.devices[di];
      std::map<std::string, int64_t> consumed;
      if (!Fits(d, r, s, &consumed)) continue;
      const Search saved = s;
      DeviceState& st = s.state.devices[{p, di}];
      if (!d.multi || st.shares == 0) {
        for (const auto& [set, need] : d.consumes) {
          for (const auto& [k, v] : need) s.state.counters[{p, set, k}] += v;
        }
      }
      DeviceResult res{r.name, d.driver, pool.name, d.name, "", {}};
      if (d.multi) {
        ++st.shares;
        for (const auto& [k, v] : consumed) st.used[k] += v;
        res.consumed = consumed;
      } else {
        st.allocated = true;
      }
      s.chosen.push_back(res);
      s.chosen_devices.push_back(&d);
      std::vector<const void*> attrs;
      for (const Device* cd : s.chosen_devices) attrs.push_back(&cd->attributes);
      if (ConstraintsHold(*s.claim, s.chosen, attrs) && Place(s, slot + 1)) return true;
      s = saved;
    }
  }
  return false;
}

Result<std::vector<DeviceResult>> Allocator::Allocate(const ClaimSpec& claim) {
  for (const Request& r : claim.requests) {
    if (!classes_.count(r.device_class)) {
      return Status(ErrorCode::kInvalidInput,
                    "request " + r.name + ": DeviceClass " + r.device_class + " not found");
    }
    if (r.count < 1) {
      return Status(ErrorCode::kInvalidInput, "request " + r.name + ": count must be >= 1");
    }
  }
  Search s;
  s.claim = &claim;
  s.state = *state_;
  for (size_t i = 0; i < claim.requests.size(); ++i) {
    for (int k = 0; k < claim.requests[i].count; ++k) s.slots.push_back({i, static_cast<size_t>(k)});
  }
  if (!Place(s, 0)) {
    return Status(ErrorCode::kUnavailable, "cannot allocate all claim requests");
  }
  for (size_t i = 0; i < s.chosen.size(); ++i) {
    if (s.chosen_devices[i]->multi) {
      char buf[40];
      std::snprintf(buf, sizeof buf, "5a4e0000-0000-4000-8000-%012llx",
                    static_cast<unsigned long long>(++next_share_));
      s.chosen[i].share_id = buf;
    }
  }
  *state_ = std::move(s.state);
  return s.chosen;
}

void Allocator::Release(const std::vector<DeviceResult>& results) {
  State& committed = *state_;
  for (const DeviceResult& r : results) {
    for (size_t p = 0; p < pools_.size(); ++p) {
      if (pools_[p].name != r.pool || pools_[p].driver != r.driver) continue;
      for (size_t di = 0; di < pools_[p].devices.size(); ++di) {
        const Device& d = pools_[p].devices[di];
        if (d.name != r.device) continue;
        DeviceState& st = committed.devices[{p, di}];
        bool give_counters = false;
        if (d.multi) {
          for (const auto& [k, v] : r.consumed) st.used[k] -= v;
          give_counters = --st.shares == 0;
        } else {
          give_counters = st.allocated;
          st.allocated = false;
        }
        if (give_counters) {
          for (const auto& [set, need] : d.consumes) {
            for (const auto& [k, v] : need) committed.counters[{p, set, k}] -= v;
          }
        }
      }
    }
  }
}

json Allocator::AllocationJson(const std::vector<DeviceResult>& results, const std::string& node) {
  json out = json::array();
  for (const DeviceResult& r : results) {
    json j = {{"request", r.request}, {"driver", r.driver}, {"pool", r.pool}, {"device", r.device}};
    if (!r.share_id.empty()) j["shareID"] = r.share_id;
    if (!r.consumed.empty()) {
      for (const auto& [k, v] : r.consumed) {
        const size_t slash = k.find('/');
        j["consumedCapacity"][slash == std::string::npos ? k : k.substr(slash + 1)] =
            std::to_string(v);
      }
    }
    out.push_back(std::move(j));
  }
  return {{"devices", {{"results", out}}},
          {"nodeSelector",
           {{"nodeSelectorTerms",
             json::array({{{"matchFields",
                            json::array({{{"key", "metadata.name"},
                                          {"operator", "In"},
                                          {"values", json::array({node})}}})}}})}}}};
}

}  // namespace gpulet::testing::dra
