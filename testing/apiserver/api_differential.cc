// api-differential: one scenario of API calls, made with gpulet's own client (k8s::Client), against
// the fake API server (--fake) or a real kube-apiserver (--kubeconfig FILE), printed as a
// transcript with nothing in it that differs between two correct servers: no uids, timestamps or
// resourceVersion values, names with the run's suffix replaced by "@". The cluster tier's
// differential test (tests/differential/apiserver_test.sh) diffs the two transcripts; a line that
// differs is a stand-in defect, fixed in testing/apiserver (docs/real-cluster.md, "Stand-ins
// checked against the real components").
//
// For each call the transcript says what gpulet sees (ok, or the HTTP code and the message its
// error carries) and, for a failure, the Status body itself (reason, code, details), read by
// sending the same request again through gpulet's transport (a refused request changes nothing).
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "apiserver/fake_apiserver.h"
#include "k8s/access.h"
#include "k8s/client.h"
#include "k8s/http.h"

namespace {

using gpulet::Result;
using gpulet::Status;
using nlohmann::json;
namespace k8s = gpulet::k8s;

class Transcript {
 public:
  explicit Transcript(std::string suffix) : suffix_(std::move(suffix)) {}

  // The run's suffix as "@", uuids as UID, and (in messages) every run of digits as N.
  std::string Norm(std::string s, bool digits) const {
    for (size_t at; !suffix_.empty() && (at = s.find(suffix_)) != std::string::npos;) {
      s.replace(at, suffix_.size(), "@");
    }
    static const std::regex uid("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}");
    s = std::regex_replace(s, uid, "UID");
    if (digits) {
      static const std::regex number("[0-9]+");
      s = std::regex_replace(s, number, "N");
    }
    return s;
  }
  void Line(const std::string& text) { std::cout << Norm(text, false) << "\n" << std::flush; }

 private:
  std::string suffix_;
};

// The keys of an object, sorted, without managedFields (gpulet never reads it; the stand-in does
// not keep it).
std::string Keys(const json& j) {
  if (!j.is_object()) return j.is_null() ? "null" : "(not an object)";
  std::string out;
  for (const auto& [k, v] : j.items()) {
    if (k == "managedFields") continue;
    out += (out.empty() ? "" : ",") + k;
  }
  return "{" + out + "}";
}

std::string Str(const json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : "-";
}

// A Status body's shape: reason, code, and details (name, group, kind, causes' fields).
std::string StatusShape(const json& s) {
  if (!s.is_object()) return "not JSON";
  std::string out = "kind=" + Str(s, "kind") + " status=" + Str(s, "status") +
                    " reason=" + Str(s, "reason") +
                    " code=" + (s.contains("code") ? s["code"].dump() : "-");
  if (s.contains("details") && s["details"].is_object()) {
    const json& d = s["details"];
    out += " details{name=" + Str(d, "name") + " group=" + Str(d, "group") +
           " kind=" + Str(d, "kind");
    if (d.contains("causes") && d["causes"].is_array()) {
      out += " causes=[";
      for (const json& c : d["causes"]) out += Str(c, "reason") + ":" + Str(c, "field") + " ";
      out += "]";
    }
    out += "}";
  } else {
    out += " details=-";
  }
  return out;
}

class Scenario {
 public:
  Scenario(const k8s::ClusterAccess& access, std::string suffix)
      : access_(access), client_(access), out_(suffix), suffix_(std::move(suffix)) {}

  // Every step; false when a step that later ones depend on failed.
  bool Run();

 private:
  // The same request sent again through gpulet's transport, for the body of a refused one.
  json RawStatus(const std::string& method, const std::string& path,
                 const std::string& content_type, const std::string& body) {
    Result<k8s::http::Endpoint> ep = k8s::http::ParseServerUrl(access_.server);
    Result<std::shared_ptr<k8s::http::TlsConfig>> tls = k8s::http::MakeTlsConfig(access_);
    if (!ep.ok() || !tls.ok()) return "no transport";
    const auto deadline = k8s::http::Clock::now() + std::chrono::seconds(30);
    auto conn = k8s::http::Connection::Open(*ep, *tls, std::chrono::seconds(10), deadline);
    if (!conn.ok()) return "connect failed";
    k8s::http::Request req{method, path, {{"Accept", "application/json"}}, body};
    if (!access_.token.empty()) {
      req.headers.emplace_back("Authorization", "Bearer " + access_.token);
    }
    if (!content_type.empty()) req.headers.emplace_back("Content-Type", content_type);
    k8s::http::ExchangeOptions options;
    options.deadline = deadline;
    k8s::http::ResponseHead head;
    std::string answer;
    auto err = k8s::http::Exchange(**conn, *ep, req, options, head,
                                   [&](const k8s::http::ResponseHead&, std::string_view b) {
                                     answer.append(b);
                                     return true;
                                   });
    if (err) return "exchange failed";
    json j = json::parse(answer, nullptr, false);
    return j.is_discarded() ? json("not JSON") : j;
  }

  // One call's outcome. `summary` describes a successful answer.
  template <typename Summary>
  bool Report(const std::string& step, const k8s::ApiResult<json>& r, const std::string& method,
              const std::string& path, const std::string& content_type, const std::string& body,
              const Summary& summary) {
    out_.Line("== " + step);
    if (r.ok()) {
      out_.Line("  ok " + summary(*r));
      return true;
    }
    out_.Line("  error http=" + std::to_string(r.http_status()) + " code=" +
              std::to_string(static_cast<int>(r.status().code())));
    std::string message = out_.Norm(r.status().message(), true);
    // A validation error's message goes on with the validator's own words for the value; what is
    // compared is its head: the object, and the field it names.
    if (r.http_status() == 422) {
      const size_t invalid = message.find(" is invalid: ");
      if (invalid != std::string::npos) {
        const size_t field_end = message.find(": ", invalid + 13);
        message = message.substr(0, field_end);
      }
    }
    out_.Line("  message " + message);
    if (r.http_status() != 0) {
      out_.Line("  status " + StatusShape(RawStatus(method, path, content_type, body)));
    }
    return false;
  }

  static std::string ObjectSummary(const json& o) {
    if (!o.is_object()) return "(not an object)";
    std::string s = "kind=" + Str(o, "kind") + " apiVersion=" + Str(o, "apiVersion") +
                    " metadata" + Keys(o.value("metadata", json::object()));
    if (Str(o, "kind") == "Status") s += " " + StatusShape(o);
    return s;
  }

  bool Get(const std::string& step, const std::string& path,
           const std::function<std::string(const json&)>& more = nullptr) {
    auto r = client_.Get(path);
    if (r.ok()) last_ = *r;
    return Report(step, r, "GET", path, "", "", [&](const json& j) {
      return ObjectSummary(j) + (more ? " " + more(j) : "");
    });
  }
  bool Post(const std::string& step, const std::string& path, const json& body,
            const std::function<std::string(const json&)>& more = nullptr) {
    auto r = client_.Post(path, body);
    if (r.ok()) last_ = *r;
    return Report(step, r, "POST", path, "application/json", body.dump(), [&](const json& j) {
      return ObjectSummary(j) + (more ? " " + more(j) : "");
    });
  }
  bool Patch(const std::string& step, const std::string& path, const json& patch,
             k8s::PatchType type, const std::function<std::string(const json&)>& more = nullptr) {
    auto r = client_.Patch(path, patch, type);
    if (r.ok()) last_ = *r;
    const char* ct = type == k8s::PatchType::kMerge ? "application/merge-patch+json"
                     : type == k8s::PatchType::kStrategicMerge
                         ? "application/strategic-merge-patch+json"
                         : "application/json-patch+json";
    return Report(step, r, "PATCH", path, ct, patch.dump(), [&](const json& j) {
      return ObjectSummary(j) + (more ? " " + more(j) : "");
    });
  }
  bool Delete(const std::string& step, const std::string& path) {
    auto r = client_.Delete(path);
    return Report(step, r, "DELETE", path, "", "", ObjectSummary);
  }
  // A LIST: its kind, metadata keys, and the names of its items with their keys.
  bool List(const std::string& step, const std::string& path) {
    auto r = client_.Get(path);
    if (r.ok()) last_ = *r;
    return Report(step, r, "GET", path, "", "", [&](const json& j) {
      std::string s = "kind=" + Str(j, "kind") + " apiVersion=" + Str(j, "apiVersion") +
                      " metadata" + Keys(j.value("metadata", json::object())) + " items=[";
      for (const json& item : j.value("items", json::array())) {
        s += Str(item.value("metadata", json::object()), "name") + Keys(item) + " ";
      }
      return s + "]";
    });
  }
  // A WATCH that ends after `want` events or `within`: the events (type, kind, name) and how the
  // stream ended.
  void Watch(const std::string& step, const std::string& path, size_t want,
             std::chrono::seconds within) {
    out_.Line("== " + step);
    std::atomic<bool> stop{false};
    std::thread timer([&] {
      const auto until = std::chrono::steady_clock::now() + within;
      while (!stop && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      stop = true;
    });
    size_t seen = 0;
    k8s::WatchResult r = client_.Watch(
        path,
        [&](const k8s::WatchEvent& e) {
          const json meta = e.object.value("metadata", json::object());
          std::string line = "  event " + e.type + " kind=" + Str(e.object, "kind") +
                             " name=" + Str(meta, "name");
          if (e.type == "ERROR") line += " " + StatusShape(e.object);
          out_.Line(line);
          return ++seen < want;
        },
        &stop);
    stop = true;
    timer.join();
    static const char* ends[] = {"closed", "broken", "gone", "stopped", "failed"};
    out_.Line(std::string("  end ") + ends[static_cast<int>(r.end)] + " http=" +
              std::to_string(r.http_status) +
              (r.end == k8s::WatchEnd::kFailed ? " " + out_.Norm(r.error.message(), true) : ""));
  }

  std::string Rv() const { return last_["metadata"].value("resourceVersion", ""); }

  k8s::ClusterAccess access_;
  k8s::Client client_;
  Transcript out_;
  std::string suffix_;
  json last_;
};

std::string Data(const json& o) { return "data=" + o.value("data", json::object()).dump(); }
std::string Labels(const json& o) {
  return "labels=" + o.value("metadata", json::object()).value("labels", json::object()).dump();
}

bool Scenario::Run() {
  const std::string ns = "diff-" + suffix_;
  const std::string cms = "/api/v1/namespaces/" + ns + "/configmaps";
  // Every object this run makes carries diff=<suffix>: a real cluster may still hold an earlier
  // run's (a namespace is deleted in the background).
  const std::string mine = "?labelSelector=diff%3D" + suffix_;
  auto cm = [&](const std::string& name, const std::string& app) {
    return json{{"apiVersion", "v1"},
                {"kind", "ConfigMap"},
                {"metadata", {{"name", name}, {"labels", {{"diff", suffix_}, {"app", app}}}}},
                {"data", {{"k", "v"}}}};
  };
  if (!Post("create namespace", "/api/v1/namespaces",
            {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}})) {
    return false;
  }

  // ConfigMaps: the memory publisher's and the extender's objects.
  Get("get a missing configmap", cms + "/cm-a");
  if (!Post("create configmap cm-a", cms, cm("cm-a", "diff"), Data)) return false;
  Post("create cm-a again", cms, cm("cm-a", "diff"));
  Post("create an invalid name", cms, cm("Bad_Name", "diff"));
  Post("create without a name", cms, json{{"apiVersion", "v1"}, {"kind", "ConfigMap"}});
  Post("create in a missing namespace", "/api/v1/namespaces/nowhere-" + suffix_ + "/configmaps",
       cm("cm-x", "diff"));
  Get("get cm-a", cms + "/cm-a", Data);
  const std::string rv_a = Rv();
  Patch("merge patch", cms + "/cm-a", {{"data", {{"k", "w"}, {"k2", "x"}}}},
        k8s::PatchType::kMerge, Data);
  Patch("merge patch with a stale resourceVersion", cms + "/cm-a",
        {{"metadata", {{"resourceVersion", rv_a}}}, {"data", {{"k", "z"}}}},
        k8s::PatchType::kMerge);
  Get("get cm-a again", cms + "/cm-a");
  const std::string rv_now = Rv();
  Patch("merge patch with the current resourceVersion", cms + "/cm-a",
        {{"metadata", {{"resourceVersion", rv_now}}}, {"data", {{"k2", nullptr}}}},
        k8s::PatchType::kMerge, Data);
  const std::string rv_before_noop = Rv();
  Patch("merge patch that changes nothing", cms + "/cm-a", {{"data", {{"k", "w"}}}},
        k8s::PatchType::kMerge, [&](const json& o) {
          return std::string("resourceVersion ") +
                 (o["metadata"].value("resourceVersion", "") == rv_before_noop ? "kept"
                                                                               : "changed");
        });
  Patch("strategic merge patch of a map", cms + "/cm-a",
        {{"metadata", {{"annotations", {{"a", "1"}}}}}}, k8s::PatchType::kStrategicMerge,
        [](const json& o) {
          return "annotations=" + o["metadata"].value("annotations", json()).dump();
        });
  Patch("json patch", cms + "/cm-a",
        json::array({{{"op", "replace"}, {"path", "/data"}, {"value", {{"k", "j"}}}}}),
        k8s::PatchType::kJsonPatch, Data);
  Patch("json patch whose test fails", cms + "/cm-a",
        json::array({{{"op", "test"}, {"path", "/data/k"}, {"value", "no"}}}),
        k8s::PatchType::kJsonPatch);
  Patch("json patch of a missing path", cms + "/cm-a",
        json::array({{{"op", "replace"}, {"path", "/spec/x"}, {"value", 1}}}),
        k8s::PatchType::kJsonPatch);
  Patch("merge patch of a missing object", cms + "/cm-none", {{"data", {{"k", "v"}}}},
        k8s::PatchType::kMerge);
  Post("create configmap cm-b", cms, cm("cm-b", "other"));
  Post("create configmap cm-c", cms, cm("cm-c", "diff"));

  // Selectors and pages (the kube-root-ca.crt ConfigMap the controller-manager adds to every
  // namespace carries no `diff` label: every list here selects on it).
  List("list by label",
       cms + "?labelSelector=" + k8s::EscapeQueryValue("diff=" + suffix_ + ",app=diff"));
  List("list by label inequality",
       cms + "?labelSelector=" + k8s::EscapeQueryValue("diff=" + suffix_ + ",app!=diff"));
  List("list by label existence", cms + "?labelSelector=" + k8s::EscapeQueryValue("diff,app"));
  List("list by field", cms + "?fieldSelector=" + k8s::EscapeQueryValue("metadata.name=cm-b"));
  List("list by field inequality",
       cms + mine + "&fieldSelector=" +
           k8s::EscapeQueryValue("metadata.name!=cm-b"));
  List("list with an unsupported field",
       cms + "?fieldSelector=" + k8s::EscapeQueryValue("data.k=v"));
  List("list across namespaces", "/api/v1/configmaps?labelSelector=" +
                                     k8s::EscapeQueryValue("diff=" + suffix_ + ",app=other"));
  List("list, first page", cms + mine + "&limit=2");
  const std::string next = last_.value("metadata", json::object()).value("continue", "");
  List("list, next page", cms + mine + "&limit=2&continue=" + k8s::EscapeQueryValue(next));

  // Watches: replayed from a resourceVersion, with the selector's ADDED/DELETED conversions.
  List("list before the changes", cms + mine);
  const std::string rv0 = last_["metadata"].value("resourceVersion", "");
  Patch("cm-a changes", cms + "/cm-a", {{"data", {{"k", "after"}}}}, k8s::PatchType::kMerge);
  Patch("cm-c leaves app=diff", cms + "/cm-c", {{"metadata", {{"labels", {{"app", "other"}}}}}},
        k8s::PatchType::kMerge);
  Patch("cm-b joins app=diff", cms + "/cm-b", {{"metadata", {{"labels", {{"app", "diff"}}}}}},
        k8s::PatchType::kMerge);
  Delete("delete cm-a", cms + "/cm-a");
  Delete("delete cm-a again", cms + "/cm-a");
  Watch("watch app=diff from before the changes",
        cms + "?watch=1&allowWatchBookmarks=true&labelSelector=app%3Ddiff&resourceVersion=" + rv0,
        4, std::chrono::seconds(10));
  Watch("watch one object by name, no resourceVersion",
        cms + "?watch=1&fieldSelector=" + k8s::EscapeQueryValue("metadata.name=cm-b"), 1,
        std::chrono::seconds(10));
  // Not here: a watch from a version older than the server keeps (410 Gone). A real server
  // answers it only after etcd was compacted (kube-apiserver compacts every 5 minutes), so it
  // cannot be had on demand; tests of 410 use the stand-in's ExpireVersionsBefore.
  List("list for the current resourceVersion", cms + mine);
  Watch("watch that times out",
        cms + mine + "&watch=1&timeoutSeconds=1&resourceVersion=" +
            last_["metadata"].value("resourceVersion", ""),
        1, std::chrono::seconds(10));
  Watch("watch of a missing namespace's collection (none is refused)",
        "/api/v1/namespaces/nowhere-" + suffix_ + "/configmaps?watch=1&timeoutSeconds=1", 1,
        std::chrono::seconds(10));

  // Leases: the broker's leader election.
  const std::string leases = "/apis/coordination.k8s.io/v1/namespaces/" + ns + "/leases";
  const json lease = {{"apiVersion", "coordination.k8s.io/v1"},
                      {"kind", "Lease"},
                      {"metadata", {{"name", "leader"}}},
                      {"spec", {{"holderIdentity", "a"}, {"leaseDurationSeconds", 15}}}};
  Post("create lease", leases, lease);
  const std::string lease_rv = Rv();
  Post("create lease again", leases, lease);
  Patch("take the lease", leases + "/leader",
        {{"metadata", {{"resourceVersion", lease_rv}}}, {"spec", {{"holderIdentity", "b"}}}},
        k8s::PatchType::kMerge);
  Patch("take the lease with the old resourceVersion", leases + "/leader",
        {{"metadata", {{"resourceVersion", lease_rv}}}, {"spec", {{"holderIdentity", "c"}}}},
        k8s::PatchType::kMerge);

  // Nodes: the main path leaves status alone, /status leaves the rest alone.
  const std::string node = "/api/v1/nodes/diff-node-" + suffix_;
  auto node_view = [](const json& o) {
    return Labels(o) + " capacity=" +
           o.value("status", json::object()).value("capacity", json::object()).dump() +
           " unschedulable=" +
           o.value("spec", json::object()).value("unschedulable", json(false)).dump();
  };
  Post("create node", "/api/v1/nodes",
       {{"apiVersion", "v1"},
        {"kind", "Node"},
        // An annotation of its own: the controller-manager's TTL controller adds one to every
        // node when it gets to it, which would otherwise make `annotations` come and go.
        {"metadata",
         {{"name", "diff-node-" + suffix_},
          {"labels", {{"diff", suffix_}}},
          {"annotations", {{"diff", "1"}}}}}},
       [&](const json& o) {
         // The taints only here, from admission (TaintNodesByCondition): right after, the node
         // lifecycle controller takes a node without conditions' not-ready taint off again.
         return node_view(o) +
                " taints=" + o.value("spec", json::object()).value("taints", json::array()).dump();
       });
  Patch("node: label and status through the main path", node,
        {{"metadata", {{"labels", {{"gpu", "yes"}}}}},
         {"status", {{"capacity", {{"nvidia.com/gpu", "8"}}}}}},
        k8s::PatchType::kMerge, node_view);
  Patch("node: status and spec through /status", node + "/status",
        {{"spec", {{"unschedulable", true}}},
         {"status", {{"capacity", {{"nvidia.com/gpu", "8"}}}}}},
        k8s::PatchType::kMerge, node_view);
  Get("node: GET /status", node + "/status", node_view);
  List("nodes by label",
       "/api/v1/nodes?labelSelector=" + k8s::EscapeQueryValue("gpu=yes,diff=" + suffix_));

  // ResourceSlices: the DRA publisher's writes.
  const std::string slices = "/apis/resource.k8s.io/v1/resourceslices";
  const std::string slice_name = "diff-slice-" + suffix_;
  auto slice = [&](const json& spec) {
    return json{{"apiVersion", "resource.k8s.io/v1"},
                {"kind", "ResourceSlice"},
                {"metadata", {{"name", slice_name}}},
                {"spec", spec}};
  };
  const json spec = {{"driver", "gpu.nvidia.com"},
                     {"nodeName", "diff-node-" + suffix_},
                     {"pool", {{"name", "diff-node-" + suffix_}, {"generation", 1},
                               {"resourceSliceCount", 1}}},
                     {"devices", json::array({{{"name", "gpu-0"},
                                               {"attributes", {{"index", {{"int", 0}}}}}}})}};
  json two_selections = spec;
  two_selections["allNodes"] = true;
  Post("slice with two node selections", slices, slice(two_selections));
  json bad_device = spec;
  bad_device["devices"][0]["name"] = "GPU_0";
  Post("slice with an invalid device name", slices, slice(bad_device));
  Post("create slice", slices, slice(spec));
  Post("create slice again", slices, slice(spec));
  json respec = spec;
  respec["pool"]["generation"] = 2;
  Patch("slice: json patch of the spec", slices + "/" + slice_name,
        json::array({{{"op", "replace"}, {"path", "/spec"}, {"value", respec}}}),
        k8s::PatchType::kJsonPatch);
  json moved = respec;
  moved["nodeName"] = "elsewhere";
  Patch("slice: json patch moving it to another node", slices + "/" + slice_name,
        json::array({{{"op", "replace"}, {"path", "/spec"}, {"value", moved}}}),
        k8s::PatchType::kJsonPatch);
  List("slices of the node",
       slices + "?fieldSelector=" +
           k8s::EscapeQueryValue("spec.nodeName=diff-node-" + suffix_ +
                                 ",spec.driver=gpu.nvidia.com"));
  Delete("delete slice", slices + "/" + slice_name);
  Delete("delete slice again", slices + "/" + slice_name);

  // Pods: the extender's binding and the broker's eviction.
  const std::string pods = "/api/v1/namespaces/" + ns + "/pods";
  auto pod = [&](const std::string& name) {
    return json{{"apiVersion", "v1"},
                {"kind", "Pod"},
                {"metadata", {{"name", name}, {"labels", {{"diff", suffix_}}}}},
                {"spec",
                 {{"containers", json::array({{{"name", "c"}, {"image", "pause"}}})},
                  {"terminationGracePeriodSeconds", 0}}}};
  };
  Post("create pod p1", pods, pod("p1"), [](const json& o) {
    return "phase=" + o.value("status", json::object()).value("phase", "-");
  });
  const std::string p1_uid = last_["metadata"].value("uid", "");
  const json binding = {{"apiVersion", "v1"},
                        {"kind", "Binding"},
                        {"metadata", {{"name", "p1"}, {"uid", p1_uid}}},
                        {"target", {{"apiVersion", "v1"}, {"kind", "Node"},
                                    {"name", "diff-node-" + suffix_}}}};
  Post("bind p1", pods + "/p1/binding", binding);
  Post("bind p1 again", pods + "/p1/binding", binding);
  Post("bind a missing pod", pods + "/p9/binding",
       json{{"apiVersion", "v1"}, {"kind", "Binding"}, {"metadata", {{"name", "p9"}}},
            {"target", {{"kind", "Node"}, {"name", "n"}}}});
  Get("p1 after binding", pods + "/p1", [](const json& o) {
    return "nodeName=" + o.value("spec", json::object()).value("nodeName", "-");
  });
  Patch("p1 Running through /status", pods + "/p1/status", {{"status", {{"phase", "Running"}}}},
        k8s::PatchType::kMerge, [](const json& o) {
          return "phase=" + o.value("status", json::object()).value("phase", "-");
        });
  for (const char* name : {"budget-1", "budget-2"}) {
    Post(std::string("create PodDisruptionBudget ") + name,
         "/apis/policy/v1/namespaces/" + ns + "/poddisruptionbudgets",
         {{"apiVersion", "policy/v1"},
          {"kind", "PodDisruptionBudget"},
          {"metadata", {{"name", name}}},
          {"spec", {{"minAvailable", 1}, {"selector", {{"matchLabels", {{"diff", suffix_}}}}}}}});
  }
  const json eviction = {{"apiVersion", "policy/v1"},
                         {"kind", "Eviction"},
                         {"metadata", {{"name", "p1"}, {"namespace", ns}}}};
  Post("evict p1 under two budgets", pods + "/p1/eviction", eviction);
  Delete("delete budget-2", "/apis/policy/v1/namespaces/" + ns + "/poddisruptionbudgets/budget-2");
  Post("evict p1 under one budget with no room", pods + "/p1/eviction", eviction);
  Post("evict a missing pod", pods + "/p9/eviction",
       json{{"apiVersion", "policy/v1"}, {"kind", "Eviction"},
            {"metadata", {{"name", "p9"}, {"namespace", ns}}}});
  Post("create pod p2 (unbound)", pods, pod("p2"));
  Post("evict p2 (Pending: no budget asked)", pods + "/p2/eviction",
       json{{"apiVersion", "policy/v1"}, {"kind", "Eviction"},
            {"metadata", {{"name", "p2"}, {"namespace", ns}}}});
  Get("p2 after its eviction", pods + "/p2");
  return true;
}

// What the scenario leaves on a real server: the namespace (and with it everything in it), the
// node. Pods bound to a node without a kubelet are removed at once (grace period 0).
void CleanUp(const k8s::Client& client, const std::string& suffix) {
  const std::string ns = "diff-" + suffix;
  (void)client.Delete("/api/v1/namespaces/" + ns + "/pods/p1?gracePeriodSeconds=0");
  (void)client.Delete("/api/v1/namespaces/" + ns);
  (void)client.Delete("/api/v1/nodes/diff-node-" + suffix);
  (void)client.Delete("/apis/resource.k8s.io/v1/resourceslices/diff-slice-" + suffix);
}

int Usage() {
  std::cerr << "usage: api-differential --fake | --kubeconfig FILE\n"
               "Runs the API scenario with gpulet's client and prints its normalized transcript.\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string kubeconfig;
  bool fake = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--fake") {
      fake = true;
    } else if (a == "--kubeconfig" && i + 1 < argc) {
      kubeconfig = argv[++i];
    } else if (a == "--help" || a == "-h") {
      Usage();
      return 0;
    } else {
      return Usage();
    }
  }
  if (fake == !kubeconfig.empty()) return Usage();
  // A suffix per run: a real cluster may hold an earlier run's objects.
  char suffix[16];
  std::snprintf(suffix, sizeof suffix, "%06x",
                static_cast<unsigned>((std::chrono::steady_clock::now().time_since_epoch().count() ^
                                       (getpid() << 8)) & 0xffffff));

  std::unique_ptr<gpulet::testing::FakeApiServer> server;
  k8s::ClusterAccess access;
  std::string pki_dir;
  if (fake) {
    pki_dir = (std::filesystem::temp_directory_path() / ("api-differential-" + std::string(suffix)))
                  .string();
    std::filesystem::create_directories(pki_dir);
    Result<gpulet::testing::TestPki> pki = gpulet::testing::MakeTestPki(pki_dir);
    if (!pki.ok()) {
      std::cerr << pki.status().message() << "\n";
      return 1;
    }
    gpulet::testing::FakeApiServer::Options options;
    options.require_namespaces = true;
    auto started = gpulet::testing::FakeApiServer::Start(*pki, options);
    if (!started.ok()) {
      std::cerr << started.status().message() << "\n";
      return 1;
    }
    server = std::move(*started);
    access = server->Access(*pki);
  } else {
    Result<k8s::ClusterAccess> loaded = k8s::LoadKubeconfig(kubeconfig);
    if (!loaded.ok()) {
      std::cerr << loaded.status().message() << "\n";
      return 1;
    }
    access = *loaded;
  }
  Scenario scenario(access, suffix);
  const bool complete = scenario.Run();
  if (!fake) CleanUp(k8s::Client(access), suffix);
  server.reset();
  if (!pki_dir.empty()) std::filesystem::remove_all(pki_dir);
  return complete ? 0 : 1;
}
