#include "deviceplugin/manager.h"

#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "deviceplugin_v1beta1.grpc.pb.h"

namespace gpulet::deviceplugin {

namespace fs = std::filesystem;

Manager::Manager(ManagerOptions options, std::shared_ptr<const gpu::Inventory> inventory,
                 const gpu::HealthBoard& health, SetupLoader loader, Clock& clock)
    : options_(std::move(options)),
      inventory_(std::move(inventory)),
      health_(health),
      loader_(std::move(loader)),
      clock_(clock) {
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

Manager::~Manager() {
  entries_.clear();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void Manager::Stop() {
  stop_requested_ = true;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
}

void Manager::RequestReload() {
  reload_requested_ = true;
  Wake();
}

void Manager::Wake() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
}

std::string Manager::SocketPath(const sharing::Resource& r) const {
  return (fs::path(options_.plugin_dir) / r.socket_name).string();
}

std::string Manager::KubeletIdentity() const {
  struct stat st {};
  std::string path = (fs::path(options_.plugin_dir) / options_.kubelet_socket_name).string();
  if (::stat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return "";
  return std::to_string(st.st_ino) + ":" + std::to_string(st.st_ctim.tv_sec) + "." +
         std::to_string(st.st_ctim.tv_nsec);
}

Status Manager::Register(const ResourceServer& server) {
  std::string kubelet = (fs::path(options_.plugin_dir) / options_.kubelet_socket_name).string();
  auto channel = grpc::CreateChannel("unix:" + kubelet, grpc::InsecureChannelCredentials());
  auto stub = v1beta1::Registration::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + options_.register_timeout);
  v1beta1::RegisterRequest req;
  req.set_version(kApiVersion);
  req.set_endpoint(fs::path(server.socket_path()).filename().string());
  req.set_resource_name(server.resource().name);
  req.mutable_options()->set_get_preferred_allocation_available(true);
  req.mutable_options()->set_pre_start_required(false);
  v1beta1::Empty resp;
  grpc::Status st = stub->Register(&ctx, req, &resp);
  if (!st.ok()) {
    return Status(ErrorCode::kUnavailable, "register " + server.resource().name + " with " +
                                               kubelet + ": " + st.error_message());
  }
  return Status::Ok();
}

void Manager::Apply(ServingSetup setup) {
  if (setup.inventory) inventory_ = std::move(setup.inventory);
  std::map<std::string, Entry> next;
  for (sharing::Resource& r : setup.plan.resources) {
    auto it = entries_.find(r.name);
    if (it != entries_.end() && it->second.server->resource() == r &&
        it->second.server->options() == setup.allocate) {
      next[r.name] = std::move(it->second);
      entries_.erase(it);
      continue;
    }
    if (it != entries_.end()) {
      spdlog::info("event=resource_changed resource={}", r.name);
      it->second.server->Stop();
      entries_.erase(it);
    }
    Entry e;
    std::string name = r.name;
    std::string path = SocketPath(r);
    e.server =
        std::make_unique<ResourceServer>(std::move(r), inventory_, setup.allocate, health_, path);
    e.server->OnStreamLost([this] { Wake(); });
    Status s = e.server->Start();
    if (!s.ok()) spdlog::error("event=serve_failed resource={} error=\"{}\"", name, s.message());
    next[name] = std::move(e);
  }
  for (auto& [name, e] : entries_) {
    spdlog::info("event=resource_removed resource={}", name);
    e.server->Stop();
  }
  entries_ = std::move(next);
}

void Manager::Reconcile() {
  const std::string kubelet = KubeletIdentity();
  const Clock::TimePoint now = clock_.Now();
  for (auto& [name, e] : entries_) {
    if (!e.server->SocketPresent()) {
      spdlog::info("event=socket_missing resource={} socket={} action=restart", name,
                   e.server->socket_path());
      e.server->Stop();
      Status s = e.server->Start();
      if (!s.ok()) {
        spdlog::error("event=serve_failed resource={} error=\"{}\"", name, s.message());
        continue;
      }
      e.registered = false;
    }
    if (const uint64_t lost = e.server->streams_lost(); lost != e.lost_seen) {
      e.lost_seen = lost;
      if (e.registered && e.server->open_streams() == 0) {
        // Lost soon after registering: back off (doubling up to max_backoff); otherwise at once.
        const bool soon = now - e.registered_at < std::chrono::seconds(10);
        e.lost_backoff = soon ? std::min(std::max(e.lost_backoff * 2, std::chrono::milliseconds(100)),
                                         options_.max_backoff)
                              : std::chrono::milliseconds(0);
        e.registered = false;
        e.next_attempt = now + e.lost_backoff;
        spdlog::warn("event=stream_lost resource={} action=register retry_ms={}", name,
                     e.lost_backoff.count());
      }
    }
    if (kubelet.empty()) {
      if (e.registered) spdlog::info("event=kubelet_gone resource={}", name);
      e.registered = false;
      continue;
    }
    if (e.registered && e.registered_with == kubelet) continue;
    if (now < e.next_attempt) continue;
    auto started = clock_.Now();
    Status s = Register(*e.server);
    auto took = std::chrono::duration_cast<std::chrono::milliseconds>(clock_.Now() - started);
    if (s.ok()) {
      e.registered = true;
      e.registered_with = kubelet;
      e.registered_at = clock_.Now();
      e.backoff = std::chrono::milliseconds(0);
      spdlog::info("event=registered resource={} endpoint={} took_ms={}", name,
                   fs::path(e.server->socket_path()).filename().string(), took.count());
    } else {
      e.registered = false;
      e.backoff =
          std::min(std::max(e.backoff * 2, std::chrono::milliseconds(100)), options_.max_backoff);
      e.next_attempt = clock_.Now() + e.backoff;
      spdlog::warn("event=register_failed resource={} retry_ms={} error=\"{}\"", name,
                   e.backoff.count(), s.message());
    }
  }
}

Status Manager::Run(ServingSetup initial) {
  std::error_code ec;
  fs::create_directories(options_.plugin_dir, ec);
  if (ec) {
    return Status(ErrorCode::kUnavailable, "cannot create device plugin directory " +
                                               options_.plugin_dir + ": " + ec.message());
  }
  if (wake_fd_ < 0)
    return Status(ErrorCode::kInternal, std::string("eventfd: ") + std::strerror(errno));
  int inotify_fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  int dir_wd = -1, config_wd = -1;
  std::string config_name;
  if (inotify_fd >= 0) {
    dir_wd = ::inotify_add_watch(inotify_fd, options_.plugin_dir.c_str(),
                                 IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO);
    if (dir_wd < 0) {
      spdlog::warn("event=inotify_unavailable dir={} error=\"{}\" fallback=poll",
                   options_.plugin_dir, std::strerror(errno));
    }
    if (!options_.config_path.empty()) {
      fs::path cfg = fs::absolute(options_.config_path);
      config_name = cfg.filename().string();
      config_wd = ::inotify_add_watch(inotify_fd, cfg.parent_path().c_str(),
                                      IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE);
      if (config_wd < 0) {
        spdlog::warn("event=config_watch_failed path={} error=\"{}\"", cfg.string(),
                     std::strerror(errno));
      }
    }
  } else {
    spdlog::warn("event=inotify_unavailable error=\"{}\" fallback=poll", std::strerror(errno));
  }

  Apply(std::move(initial));
  spdlog::info("event=plugin_manager_started dir={} resources={}", options_.plugin_dir,
               entries_.size());
  alignas(inotify_event) char buf[16 * 1024];
  while (!stop_requested_) {
    Reconcile();
    if (stop_requested_) break;
    // Sleep until something happens, the next registration retry is due, or the periodic check.
    auto wait = options_.reconcile_interval;
    const Clock::TimePoint now = clock_.Now();
    for (const auto& [name, e] : entries_) {
      if (e.registered || e.next_attempt <= now) continue;
      wait = std::min(wait,
                      std::chrono::duration_cast<std::chrono::milliseconds>(e.next_attempt - now) +
                          std::chrono::milliseconds(1));
    }
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {inotify_fd, POLLIN, 0}};
    int n = ::poll(fds, inotify_fd >= 0 ? 2 : 1, static_cast<int>(wait.count()));
    if (n < 0 && errno != EINTR) {
      spdlog::error("event=poll_failed error=\"{}\"", std::strerror(errno));
    }
    if (fds[0].revents & POLLIN) {
      uint64_t v;
      [[maybe_unused]] ssize_t r = ::read(wake_fd_, &v, sizeof(v));
    }
    if (inotify_fd >= 0 && (fds[1].revents & POLLIN)) {
      ssize_t len;
      while ((len = ::read(inotify_fd, buf, sizeof(buf))) > 0) {
        for (char* p = buf; p < buf + len;) {
          auto* ev = reinterpret_cast<inotify_event*>(p);
          p += sizeof(inotify_event) + ev->len;
          std::string name = ev->len ? ev->name : "";
          if (ev->wd == config_wd && (name == config_name || name.rfind("..", 0) == 0)) {
            spdlog::info("event=config_changed file={}", name);
            reload_requested_ = true;
          }
          if (ev->wd == dir_wd) {
            spdlog::debug("event=plugin_dir_change name={} mask={:#x}", name, ev->mask);
            if (name == options_.kubelet_socket_name && (ev->mask & (IN_CREATE | IN_MOVED_TO))) {
              // A new kubelet: register now, whatever backoff the old one earned.
              for (auto& [rname, e] : entries_) {
                e.next_attempt = {};
                e.backoff = std::chrono::milliseconds(0);
              }
            }
          }
        }
      }
    }
    if (reload_requested_.exchange(false) && !stop_requested_) {
      Result<ServingSetup> setup =
          loader_ ? loader_() : Result<ServingSetup>(Status(ErrorCode::kInternal, "no loader"));
      if (setup.ok()) {
        spdlog::info("event=reload resources={}", setup->plan.resources.size());
        Apply(std::move(setup).value());
      } else {
        spdlog::error("event=reload_failed action=keep_current error=\"{}\"",
                      setup.status().message());
      }
    }
  }
  spdlog::info("event=plugin_manager_stopping resources={}", entries_.size());
  for (auto& [name, e] : entries_) e.server->Stop();
  entries_.clear();
  if (inotify_fd >= 0) ::close(inotify_fd);
  return Status::Ok();
}

}  // namespace gpulet::deviceplugin
