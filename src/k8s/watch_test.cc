// CollectionWatcher against the fake API server over real TLS: the first LIST then the events;
// a watch the server closes resumes from the last resourceVersion; 410 Gone re-lists, and what
// was deleted meanwhile is gone from the new list; a broken stream or a failed LIST backs off and
// retries; Stop() wakes a backoff wait. (The same loop under ObjectWatcher: client_test.cc.)
#include "k8s/watch.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <condition_variable>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "apiserver/fake_apiserver.h"
#include "k8s/access.h"
#include "k8s/client.h"
#include "support/wait_until.h"

namespace gpulet::k8s {
namespace {

using gpulet::testing::FakeApiServer;
using gpulet::testing::TestPki;
using nlohmann::json;
using namespace std::chrono_literals;

const std::string kConfigMaps = "/api/v1/namespaces/gpulet-system/configmaps";
const std::string kSelector = "gpulet.io/memory-pool=true";

json ConfigMap(const std::string& name, bool selected, const std::string& value) {
  json cm = {{"apiVersion", "v1"},
             {"kind", "ConfigMap"},
             {"metadata", {{"name", name}, {"namespace", "gpulet-system"}}},
             {"data", {{"value", value}}}};
  if (selected) cm["metadata"]["labels"]["gpulet.io/memory-pool"] = "true";
  return cm;
}

// Mirrors the collection the way an informer's store does: a LIST replaces everything, events
// change one object. Records the event types per object for the test thread.
class Store {
 public:
  void List(const std::vector<json>& items) {
    std::lock_guard<std::mutex> lock(mu_);
    objects_.clear();
    for (const json& item : items) objects_[item["metadata"].value("name", "")] = item;
    cv_.notify_all();
  }
  void Event(const std::string& type, const json& object) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string name = object["metadata"].value("name", "");
    events_.push_back(type + " " + name);
    if (type == "DELETED") {
      objects_.erase(name);
    } else {
      objects_[name] = object;
    }
    cv_.notify_all();
  }
  // Waits (bounded) until `name` holds data.value `value` ("" = until it is absent).
  bool WaitFor(const std::string& name, const std::string& value) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, 20s, [&] {
      auto it = objects_.find(name);
      if (value.empty()) return it == objects_.end();
      return it != objects_.end() && it->second["data"].value("value", "") == value;
    });
  }
  std::vector<std::string> names() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto& [name, obj] : objects_) out.push_back(name);
    return out;
  }
  std::vector<std::string> events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, json> objects_;
  std::vector<std::string> events_;
};

// The watcher sets synced() and its counters without a notification: polled (bounded).
bool Eventually(const std::function<bool()>& f) { return testing::WaitUntil(f, 20s, 5ms); }

class CollectionWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "gpulet-watch-XXXXXX";
    ASSERT_NE(mkdtemp(dir_.data()), nullptr);
    Result<TestPki> pki = gpulet::testing::MakeTestPki(dir_);
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    pki_ = *pki;
    Result<std::unique_ptr<FakeApiServer>> s = FakeApiServer::Start(pki_, {});
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(s).value();
    server_->Put(kConfigMaps + "/a", ConfigMap("a", true, "a1"));
    server_->Put(kConfigMaps + "/b", ConfigMap("b", true, "b1"));
    server_->Put(kConfigMaps + "/other", ConfigMap("other", false, "x"));
    WriteToken("test-token");
  }
  void WriteToken(const std::string& token) { std::ofstream(dir_ + "/token") << token << "\n"; }
  void Start(const std::string& path = kConfigMaps, const std::string& selector = kSelector,
             WatcherOptions options = Fast()) {
    ClusterAccess a;
    a.server = server_->url();
    a.ca_file = pki_.ca_cert;
    a.token_file = dir_ + "/token";  // re-read for every request
    client_ = std::make_unique<Client>(a);
    watcher_ = std::make_unique<CollectionWatcher>(*client_, path, selector, options);
    thread_ = std::thread([this] {
      watcher_->Run(
          stop_, [this](const std::vector<json>& items) { store_.List(items); },
          [this](const std::string& type, const json& object) { store_.Event(type, object); });
    });
  }
  static WatcherOptions Fast() {
    WatcherOptions o;
    o.initial_backoff = 50ms;
    o.max_backoff = 200ms;
    return o;
  }
  void TearDown() override {
    stop_.Stop();
    if (thread_.joinable()) thread_.join();
  }
  // The watch requests made so far (their queries).
  std::vector<std::string> Watches() const {
    std::vector<std::string> out;
    for (const auto& r : server_->requests()) {
      if (r.query.find("watch=1") != std::string::npos) out.push_back(r.query);
    }
    return out;
  }
  bool Resumed(const std::string& rv) const {
    for (const std::string& q : Watches()) {
      if (q.find("resourceVersion=" + rv) != std::string::npos) return true;
    }
    return false;
  }

  std::string dir_;
  TestPki pki_;
  std::unique_ptr<FakeApiServer> server_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<CollectionWatcher> watcher_;
  StopSignal stop_;
  Store store_;
  std::thread thread_;
};

TEST_F(CollectionWatchTest, ListsTheSelectedObjectsThenFollowsTheirEvents) {
  Start();
  ASSERT_TRUE(Eventually([&] { return watcher_->synced(); }));      // set after on_list returns
  EXPECT_EQ(store_.names(), (std::vector<std::string>{"a", "b"}));  // "other" is not selected
  const std::string listed = watcher_->resource_version();
  EXPECT_EQ(listed, std::to_string(server_->current_version()));
  ASSERT_TRUE(server_->WaitForOpenWatches(1, 20s));

  server_->Put(kConfigMaps + "/c", ConfigMap("c", true, "c1"));
  server_->Put(kConfigMaps + "/a", ConfigMap("a", true, "a2"));
  server_->Delete(kConfigMaps + "/b");
  server_->Put(kConfigMaps + "/other", ConfigMap("other", false, "y"));
  ASSERT_TRUE(store_.WaitFor("c", "c1"));
  ASSERT_TRUE(store_.WaitFor("a", "a2"));
  ASSERT_TRUE(store_.WaitFor("b", ""));
  EXPECT_EQ(store_.names(), (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(store_.events(), (std::vector<std::string>{"ADDED c", "MODIFIED a", "DELETED b"}));

  EXPECT_EQ(watcher_->stats().lists.load(), 1u);
  EXPECT_EQ(watcher_->stats().reconnects.load(), 0u);
  // The LIST and the watch both carry the selector; the watch starts at the list's version.
  const auto reqs = server_->requests();
  bool list_selected = false;
  for (const auto& r : reqs) {
    if (r.path == kConfigMaps && r.query == "labelSelector=gpulet.io%2Fmemory-pool%3Dtrue") {
      list_selected = true;
    }
  }
  EXPECT_TRUE(list_selected);
  const std::vector<std::string> watches = Watches();
  ASSERT_FALSE(watches.empty());
  EXPECT_NE(watches[0].find("labelSelector=gpulet.io%2Fmemory-pool%3Dtrue"), std::string::npos)
      << watches[0];
  EXPECT_NE(watches[0].find("resourceVersion=" + listed), std::string::npos) << watches[0];
}

// issue 26 item 5: an object whose label is removed stops matching the selector; the API server
// sends DELETED (cache_watcher.go) and the object must leave the store. One that gains the label
// arrives as ADDED. The old stand-in sent nothing for the first, so a stale object stayed.
TEST_F(CollectionWatchTest, AnObjectThatStopsMatchingLeavesAndOneThatStartsEnters) {
  Start();
  ASSERT_TRUE(Eventually([&] { return watcher_->synced(); }));
  ASSERT_TRUE(server_->WaitForOpenWatches(1, 20s));
  server_->Put(kConfigMaps + "/a", ConfigMap("a", false, "a1"));       // label removed
  server_->Put(kConfigMaps + "/other", ConfigMap("other", true, "x"));  // label added
  ASSERT_TRUE(store_.WaitFor("a", ""));
  ASSERT_TRUE(store_.WaitFor("other", "x"));
  EXPECT_EQ(store_.names(), (std::vector<std::string>{"b", "other"}));
  EXPECT_EQ(store_.events(), (std::vector<std::string>{"DELETED a", "ADDED other"}));
}

TEST_F(CollectionWatchTest, WithoutASelectorFollowsTheWholeCollection) {
  Start("/api/v1/nodes", "");
  server_->Put("/api/v1/nodes/n1", ConfigMap("n1", false, "1"));
  ASSERT_TRUE(store_.WaitFor("n1", "1"));
  ASSERT_TRUE(Eventually([&] { return watcher_->synced(); }));
  for (const auto& r : server_->requests()) {
    EXPECT_EQ(r.query.find("labelSelector"), std::string::npos) << r.query;
  }
}

TEST_F(CollectionWatchTest, AClosedWatchResumesFromTheLastVersionWithoutBackoff) {
  Start();
  ASSERT_TRUE(server_->WaitForOpenWatches(1, 20s));
  server_->Put(kConfigMaps + "/a", ConfigMap("a", true, "a2"));
  ASSERT_TRUE(store_.WaitFor("a", "a2"));
  const std::string last = watcher_->resource_version();
  EXPECT_EQ(last, std::to_string(server_->current_version()));
  // The server ends the stream (as at timeoutSeconds); a change made meanwhile still arrives.
  server_->CloseWatches();
  server_->Put(kConfigMaps + "/b", ConfigMap("b", true, "b2"));
  ASSERT_TRUE(store_.WaitFor("b", "b2"));
  EXPECT_TRUE(Resumed(last)) << "no watch resumed from " << last;
  EXPECT_GE(watcher_->stats().watches.load(), 2u);
  EXPECT_EQ(watcher_->stats().lists.load(), 1u);       // resumed, not re-listed
  EXPECT_EQ(watcher_->stats().reconnects.load(), 0u);  // a clean end is not a failure
}

TEST_F(CollectionWatchTest, GoneReListsAndDropsWhatWasDeletedWhileAway) {
  Start();
  ASSERT_TRUE(server_->WaitForOpenWatches(1, 20s));
  ASSERT_TRUE(store_.WaitFor("b", "b1"));
  // Every version the watcher knows is compacted away. The stream ends before the deletion, so
  // no DELETED event can carry it: only the new LIST can.
  server_->ExpireVersionsBefore(server_->current_version() + 1);
  server_->CloseWatches();
  server_->Delete(kConfigMaps + "/b");
  server_->Put(kConfigMaps + "/d", ConfigMap("d", true, "d1"));
  ASSERT_TRUE(store_.WaitFor("d", "d1"));
  ASSERT_TRUE(store_.WaitFor("b", ""));
  EXPECT_EQ(store_.names(), (std::vector<std::string>{"a", "d"}));
  for (const std::string& e : store_.events()) EXPECT_NE(e, "DELETED b");
  EXPECT_GE(watcher_->stats().gone.load(), 1u);
  EXPECT_GE(watcher_->stats().lists.load(), 2u);
  EXPECT_TRUE(watcher_->synced());
}

TEST_F(CollectionWatchTest, GoneAsHttpStatusReListsToo) {
  server_->SetGoneAsHttpStatus(true);
  Start();
  ASSERT_TRUE(server_->WaitForOpenWatches(1, 20s));
  server_->ExpireVersionsBefore(server_->current_version() + 1);
  server_->CloseWatches();
  server_->Delete(kConfigMaps + "/a");
  ASSERT_TRUE(store_.WaitFor("a", ""));
  EXPECT_GE(watcher_->stats().gone.load(), 1u);
  EXPECT_GE(watcher_->stats().lists.load(), 2u);
}

TEST_F(CollectionWatchTest, ABrokenStreamBacksOffThenResumesFromTheLastVersion) {
  Start();
  ASSERT_TRUE(server_->WaitForOpenWatches(1, 20s));
  server_->Put(kConfigMaps + "/a", ConfigMap("a", true, "a2"));
  ASSERT_TRUE(store_.WaitFor("a", "a2"));
  const std::string last = watcher_->resource_version();
  server_->BreakWatches();
  server_->Put(kConfigMaps + "/a", ConfigMap("a", true, "a3"));  // while down or reconnecting
  ASSERT_TRUE(store_.WaitFor("a", "a3"));
  EXPECT_GE(watcher_->stats().reconnects.load(), 1u);
  EXPECT_EQ(watcher_->stats().lists.load(), 1u);
  EXPECT_TRUE(Resumed(last)) << "no watch resumed from " << last;
}

TEST_F(CollectionWatchTest, AFailedListBacksOffAndRetriesUntilItSucceeds) {
  WriteToken("wrong");  // 401 until the token is right
  Start();
  ASSERT_TRUE(Eventually([&] { return watcher_->stats().lists.load() >= 3; }));
  EXPECT_FALSE(watcher_->synced());
  EXPECT_GE(watcher_->stats().reconnects.load(), 2u);
  EXPECT_EQ(watcher_->stats().watches.load(), 0u);  // no watch without a list
  WriteToken("test-token");
  ASSERT_TRUE(Eventually([&] { return watcher_->synced(); }));
  EXPECT_TRUE(store_.WaitFor("a", "a1"));
}

// A watcher waiting out a long backoff ends as soon as it is stopped: a wait that missed the
// signal would hang join() for an hour, past the ctest timeout, which fails the test.
TEST_F(CollectionWatchTest, StopWakesABackoffWaitAtOnce) {
  WriteToken("wrong");
  WatcherOptions slow;
  slow.initial_backoff = std::chrono::hours(1);
  slow.max_backoff = std::chrono::hours(1);
  Start(kConfigMaps, kSelector, slow);
  ASSERT_TRUE(Eventually([&] { return watcher_->stats().reconnects.load() >= 1; }));
  stop_.Stop();
  thread_.join();
  EXPECT_EQ(watcher_->stats().lists.load(), 1u);
  EXPECT_FALSE(watcher_->synced());
}

}  // namespace
}  // namespace gpulet::k8s
