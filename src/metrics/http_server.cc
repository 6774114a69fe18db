#include "metrics/http_server.h"

#include <dlfcn.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <cerrno>
#include <condition_variable>
#include <limits>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/listen_address.h"
#include "common/openssl_library.h"

namespace gpulet::metrics {
namespace {

using Steady = std::chrono::steady_clock;

struct Request : RequestHead {
  std::string body;  // POST routes only
};

const char* Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 411:
      return "Length Required";
    case 500:
      return "Internal Server Error";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
    default:
      return "Bad Request";
  }
}

// SHA-256 of an Authorization value: what the credential cache keys on (libcrypto is loaded:
// Start loads it when basic auth is configured).
std::string Digest(const std::string& s) { return Sha256(*Crypto(), s); }

constexpr size_t kAuthCacheSize = 4096;

// The server-side calls libssl has that the shared table (common/openssl_library.h) does not
// carry yet, looked up in the libssl that Ssl() loaded. Null when libssl lacks one.
struct ServerTlsCalls {
  decltype(&::SSL_CTX_set_session_id_context) set_session_id_context;
  decltype(&::SSL_CTX_set_cipher_list) set_cipher_list;
};
const ServerTlsCalls* ServerTls() {
  static const ServerTlsCalls* calls = []() -> const ServerTlsCalls* {
    if (Ssl() == nullptr) return nullptr;
    void* lib = dlopen("libssl.so.3", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (lib == nullptr) return nullptr;
    static ServerTlsCalls c;
    c.set_session_id_context = reinterpret_cast<decltype(c.set_session_id_context)>(
        dlsym(lib, "SSL_CTX_set_session_id_context"));
    c.set_cipher_list =
        reinterpret_cast<decltype(c.set_cipher_list)>(dlsym(lib, "SSL_CTX_set_cipher_list"));
    return c.set_session_id_context && c.set_cipher_list ? &c : nullptr;
  }();
  return calls;
}

Result<SSL_CTX*> MakeTlsContext(const WebConfig& web, const std::string& file);

// What the certificate, key and client CA files are now (device, inode, size, times; or the
// stat error): a change means they are loaded again.
std::string TlsFilesSignature(const WebConfig& web) {
  std::string sig;
  for (const std::string* f : {&web.cert_file, &web.key_file, &web.client_ca_file}) {
    struct stat st {};
    if (f->empty()) {
      sig += "-;";
    } else if (::stat(f->c_str(), &st) != 0) {
      sig += "e" + std::to_string(errno) + ";";
    } else {
      sig += std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" +
             std::to_string(st.st_size) + ":" + std::to_string(st.st_mtim.tv_sec) + "." +
             std::to_string(st.st_mtim.tv_nsec) + ":" + std::to_string(st.st_ctim.tv_sec) + "." +
             std::to_string(st.st_ctim.tv_nsec) + ";";
    }
  }
  return sig;
}

constexpr std::chrono::milliseconds kAcceptBackoffFirst{5};
constexpr std::chrono::milliseconds kAcceptBackoffMax{1000};

}  // namespace

HeadParse ParseRequestHead(std::string_view in, size_t max_header_bytes, RequestHead* r,
                           size_t* head_bytes) {
  namespace http = boost::beast::http;
  http::request_parser<http::empty_body> p;
  p.eager(false);  // the head only: the body is framed (and budgeted) by the server
  p.header_limit(static_cast<std::uint32_t>(std::min<size_t>(max_header_bytes, UINT32_MAX)));
  // Beast's own body limit (1 MiB for requests) would turn a larger Content-Length into a parse
  // error (400) while the head is read; the server's budget decides on bodies, and answers 413.
  p.body_limit(std::numeric_limits<std::uint64_t>::max());
  boost::system::error_code ec;
  const size_t n = p.put(boost::asio::const_buffer(in.data(), in.size()), ec);
  if (ec == http::error::need_more) {
    return in.size() > max_header_bytes ? HeadParse::kTooLarge : HeadParse::kIncomplete;
  }
  if (ec == http::error::header_limit) return HeadParse::kTooLarge;
  if (ec || !p.is_header_done()) return HeadParse::kBad;
  const auto& m = p.get();
  // Go's net/http: HTTP/1.1 needs a Host; more than one is refused in any version.
  const size_t hosts = m.count(http::field::host);
  if (hosts > 1 || (m.version() == 11 && hosts == 0)) return HeadParse::kBad;
  *r = RequestHead{};
  r->method = std::string(m.method_string());
  const std::string_view target(m.target().data(), m.target().size());
  r->path = std::string(target.substr(0, target.find('?')));
  r->http10 = m.version() == 10;
  // The first of a repeated field, as Go's Header.Get.
  auto first = [&](http::field f) -> std::string {
    auto it = m.find(f);
    return it == m.end() ? std::string() : std::string(it->value());
  };
  r->authorization = first(http::field::authorization);
  r->accept = first(http::field::accept);
  r->connection = first(http::field::connection);
  for (char& c : r->connection) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  r->chunked = m.count(http::field::transfer_encoding) > 0;
  r->content_length = p.content_length() ? static_cast<size_t>(*p.content_length()) : 0;
  r->has_body = r->chunked || r->content_length > 0;
  *head_bytes = n;
  return HeadParse::kComplete;
}

class MetricsServer::Loop {
 public:
  Loop(const Publisher& publisher, const HttpOptions& options, std::unique_ptr<BasicAuth> auth,
       const WebConfig& web, SSL_CTX* ssl_ctx, int listen_fd)
      : publisher_(publisher),
        options_(options),
        auth_(std::move(auth)),
        headers_(web.headers),
        web_(web),
        ssl_ctx_(ssl_ctx),
        tls_signature_(ssl_ctx ? TlsFilesSignature(web) : ""),
        listen_fd_(listen_fd) {}

  ~Loop() {
    Stop();
    for (auto& [fd, c] : conns_) Release(*c);
    conns_.clear();
    if (epoll_fd_ >= 0) ::close(epoll_fd_);
    if (wake_fd_ >= 0) ::close(wake_fd_);
    if (listen_fd_ >= 0) ::close(listen_fd_);
    if (ssl_ctx_) Ssl()->ctx_free(ssl_ctx_);
  }

  Status Start() {
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epoll_fd_ < 0 || wake_fd_ < 0) {
      return Status(ErrorCode::kInternal, std::string("epoll/eventfd: ") + std::strerror(errno));
    }
    Watch(listen_fd_, EPOLLIN, EPOLL_CTL_ADD);
    Watch(wake_fd_, EPOLLIN, EPOLL_CTL_ADD);
    const int workers = auth_->enabled() ? std::max(1, options_.password_check_threads) : 0;
    for (int i = 0; i < workers; ++i) auth_threads_.emplace_back([this] { AuthWorker(); });
    const int post_workers = options_.post_routes.empty() ? 0 : std::max(1, options_.threads);
    for (int i = 0; i < post_workers; ++i) post_threads_.emplace_back([this] { PostWorker(); });
    thread_ = std::thread([this] { Run(); });
    return Status::Ok();
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> l(auth_mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    auth_cv_.notify_all();
    {
      std::lock_guard<std::mutex> l(post_mu_);
      post_stopping_ = true;
    }
    post_cv_.notify_all();
    Wake();
    if (thread_.joinable()) thread_.join();
    for (std::thread& t : auth_threads_) t.join();
    auth_threads_.clear();
    for (std::thread& t : post_threads_) t.join();
    post_threads_.clear();
  }

  HttpStats stats() const {
    std::lock_guard<std::mutex> l(stats_mu_);
    return stats_;
  }

 private:
  // kBodyWait: headers read, the body not yet: waiting for room in max_body_bytes_in_flight.
  enum class Phase { kHandshake, kReading, kBodyWait, kAuthWait, kPostWait, kWriting };
  // A request's head is parsed (`pending`) before anything else of it is looked at: the
  // password is checked next (kAuthWait), and only then is its body granted room and read.
  struct Conn {
    int fd = -1;
    uint64_t id = 0;
    SSL* ssl = nullptr;
    Phase phase = Phase::kReading;
    std::string in;
    std::string head;
    std::shared_ptr<const Rendered> keep;  // keeps `body` alive while it is written
    const char* body = nullptr;
    size_t body_len = 0;
    size_t sent = 0;
    bool close_after = false;
    bool eof = false;  // the client shut down its side: answer what is buffered, then close
    int requests = 0;
    bool have_head = false;   // `pending` holds the parsed head of the request being read
    bool authorized = false;  // `pending`'s credentials are checked and good
    size_t scanned = 0;       // bytes of `in` known to hold no end of a head
    Request pending;
    size_t body_grant = 0;  // bytes of max_body_bytes_in_flight this connection's body holds
    Steady::time_point deadline;
    Steady::time_point last_active;
    uint32_t events = 0;
  };
  struct AuthJob {
    uint64_t conn_id;
    std::string key;
    std::string authorization;
  };
  struct AuthDone {
    uint64_t conn_id;
    std::string key;
    bool ok;
  };
  struct PostJob {
    uint64_t conn_id;
    const std::function<HttpOptions::PostReply(const std::string&)>* handler;
    std::string body;
    size_t grant = 0;  // held until the handler is done with the body
  };
  struct PostDone {
    uint64_t conn_id;
    HttpOptions::PostReply reply;
    size_t grant = 0;
  };

  void Count(uint64_t HttpStats::*field, uint64_t n = 1) {
    std::lock_guard<std::mutex> l(stats_mu_);
    stats_.*field += n;
  }

  void Wake() {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
  }

  void Watch(int fd, uint32_t events, int op) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = fd;
    ::epoll_ctl(epoll_fd_, op, fd, &ev);
  }

  void SetInterest(Conn& c, uint32_t events) {
    if (c.events == events) return;
    c.events = events;
    Watch(c.fd, events, EPOLL_CTL_MOD);
  }

  void Release(Conn& c) {
    if (c.ssl) Ssl()->ssl_free(c.ssl);
    c.ssl = nullptr;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
    ::close(c.fd);
  }

  void Close(int fd) {
    auto it = conns_.find(fd);
    if (it == conns_.end()) return;
    if (it->second->phase == Phase::kPostWait) DropQueuedPost(it->second->id);
    ReleaseBody(*it->second);
    by_id_.erase(it->second->id);
    Release(*it->second);
    conns_.erase(it);
  }

  void Run() {
    // OpenSSL writes to the sockets with write(2) (SSL_write, the handshake, close_notify), and a
    // write to a peer that has reset the connection raises SIGPIPE, whose default action ends the
    // process: any client that closes before its answer (kube-scheduler past its httpTimeout, a
    // scraper that gives up) would stop the server. Blocked in this thread, the only one that
    // touches the sockets, the write fails with EPIPE and the connection is closed; the signal
    // stays pending on this thread, which never unblocks it.
    sigset_t pipe_signal;
    sigemptyset(&pipe_signal);
    sigaddset(&pipe_signal, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr);
    std::vector<epoll_event> events(256);
    Steady::time_point next_sweep = Steady::now();
    for (;;) {
      int timeout_ms = ready_.empty() ? 100 : 0;
      if (accept_paused_) {
        const auto left =
            std::chrono::ceil<std::chrono::milliseconds>(accept_resume_ - Steady::now());
        timeout_ms = std::clamp<int>(static_cast<int>(left.count()), 0, timeout_ms);
      }
      const int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()),
                                 timeout_ms);
      {
        std::lock_guard<std::mutex> l(auth_mu_);
        if (stopping_) return;
      }
      for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        if (fd == listen_fd_) {
          AcceptAll();
        } else if (fd == wake_fd_) {
          uint64_t v;
          [[maybe_unused]] ssize_t r = ::read(wake_fd_, &v, sizeof v);
          AuthCompletions();
          PostCompletions();
        } else {
          Handle(fd, events[i].events);
        }
      }
      // Connections with a response just written: whatever they sent next (pipelined, perhaps
      // held decrypted inside OpenSSL where epoll cannot see it) is read now. One pass per turn
      // of the loop, so a pipelining client neither recurses nor starves the others.
      std::vector<uint64_t> ready;
      ready.swap(ready_);
      for (uint64_t id : ready) {
        auto it = by_id_.find(id);
        if (it == by_id_.end()) continue;
        Conn& c = *conns_.at(it->second);
        if (c.phase == Phase::kReading) ReadRequest(c);
      }
      const Steady::time_point now = Steady::now();
      if (accept_paused_ && now >= accept_resume_) {
        accept_paused_ = false;
        Watch(listen_fd_, EPOLLIN, EPOLL_CTL_MOD);
        AcceptAll();
      }
      if (now >= next_sweep) {
        Sweep(now);
        next_sweep = now + std::chrono::milliseconds(100);
      }
      if (grants_changed_) GrantWaiting();
    }
  }

  // Bodies in flight: a POST body is read only once its Content-Length fits in
  // max_body_bytes_in_flight next to the bodies already held (one body is always let through);
  // others wait in arrival order, reading nothing. A body is held from its headers until its
  // handler returns (also when the client left meanwhile).
  bool AcquireBody(Conn& c, size_t bytes) {
    const size_t cap = options_.max_body_bytes_in_flight;
    if (cap != 0 && bodies_in_flight_ > 0 &&
        (bodies_in_flight_ + bytes > cap || !body_waiting_.empty())) {
      return false;
    }
    bodies_in_flight_ += bytes;
    c.body_grant = bytes;
    return true;
  }
  void ReleaseGrant(size_t bytes) {
    if (bytes == 0) return;
    bodies_in_flight_ -= bytes;
    grants_changed_ = true;
  }
  void ReleaseBody(Conn& c) {
    ReleaseGrant(c.body_grant);
    c.body_grant = 0;
  }
  void GrantWaiting() {
    grants_changed_ = false;
    std::vector<int> ready;
    while (!body_waiting_.empty()) {
      auto id = by_id_.find(body_waiting_.front().first);
      if (id == by_id_.end() || conns_.at(id->second)->phase != Phase::kBodyWait) {
        body_waiting_.pop_front();  // gone
        continue;
      }
      const size_t bytes = body_waiting_.front().second;
      const size_t cap = options_.max_body_bytes_in_flight;
      if (bodies_in_flight_ > 0 && bodies_in_flight_ + bytes > cap) break;
      body_waiting_.pop_front();
      Conn& c = *conns_.at(id->second);
      bodies_in_flight_ += bytes;
      c.body_grant = bytes;
      c.phase = Phase::kReading;
      c.deadline = Steady::now() + options_.request_timeout;
      SetInterest(c, EPOLLIN | EPOLLRDHUP);
      ready.push_back(c.fd);
    }
    for (int fd : ready) {
      auto it = conns_.find(fd);
      if (it != conns_.end()) ReadRequest(*it->second);
    }
  }

  void AcceptAll() {
    // A bounded batch per wake-up, so requests on accepted connections are read in between
    // (a flood of connects must not evict a client before its request is looked at).
    for (int batch = 0; batch < 64; ++batch) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE) {
          Count(&HttpStats::accept_errors);
          // Out of descriptors: shed the quietest connection so the next accept succeeds.
          if (EvictQuietest()) continue;
          // Nothing to shed (the descriptors are held elsewhere): the pending connection keeps
          // the listener readable, so wait before trying again, as Go's Serve does (5 ms,
          // doubling to 1 s) instead of spinning on it.
          accept_delay_ = accept_delay_.count() == 0
                              ? kAcceptBackoffFirst
                              : std::min(accept_delay_ * 2, kAcceptBackoffMax);
          accept_paused_ = true;
          accept_resume_ = Steady::now() + accept_delay_;
          Watch(listen_fd_, 0, EPOLL_CTL_MOD);
          spdlog::warn("event=accept_paused reason=\"{}\" retry_ms={}", std::strerror(errno),
                       accept_delay_.count());
          return;
        }
        return;  // EAGAIN, or an aborted connection
      }
      accept_delay_ = std::chrono::milliseconds(0);
      Count(&HttpStats::accepted);
      if (conns_.size() >= options_.max_connections && !EvictQuietest()) {
        // Every connection has a request in flight: the newcomer waits its turn elsewhere.
        Count(&HttpStats::refused);
        ::close(fd);
        continue;
      }
      int yes = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      c->id = ++next_id_;
      c->last_active = Steady::now();
      c->deadline = c->last_active + options_.request_timeout;
      if (ssl_ctx_) {
        ReloadTlsIfChanged();
        c->ssl = Ssl()->ssl_new(ssl_ctx_);
        Ssl()->set_fd(c->ssl, fd);
        c->phase = Phase::kHandshake;
      }
      c->events = EPOLLIN | EPOLLRDHUP;
      Watch(fd, c->events, EPOLL_CTL_ADD);
      by_id_[c->id] = fd;
      conns_[fd] = std::move(c);
    }
  }

  // Closes the connection that has been quiet the longest, never one whose request is being
  // worked on (a password check, a POST handler such as the extender's bind: its client is
  // quiet because it waits for us); false when there is none.
  bool EvictQuietest() {
    Conn* victim = nullptr;
    for (auto& [fd, c] : conns_) {
      if (c->phase == Phase::kAuthWait || c->phase == Phase::kPostWait) continue;
      if (!victim || c->last_active < victim->last_active) victim = c.get();
    }
    if (!victim) return false;
    Count(&HttpStats::evicted);
    Close(victim->fd);
    return true;
  }

  void Sweep(Steady::time_point now) {
    std::vector<int> expired;
    for (auto& [fd, c] : conns_) {
      if (now >= c->deadline) expired.push_back(fd);
    }
    if (!expired.empty()) Count(&HttpStats::timed_out, expired.size());
    for (int fd : expired) Close(fd);
  }

  void Handle(int fd, uint32_t ev) {
    auto it = conns_.find(fd);
    if (it == conns_.end()) return;
    Conn& c = *it->second;
    if (ev & EPOLLERR) return Close(fd);
    c.last_active = Steady::now();
    switch (c.phase) {
      case Phase::kHandshake:
        return Handshake(c);
      case Phase::kReading:
        return ReadRequest(c);
      case Phase::kWriting:
        return WriteResponse(c);
      case Phase::kPostWait:
        if (ev & (EPOLLHUP | EPOLLERR)) return Close(fd);
        if (ev & EPOLLRDHUP) {
          // FIN: a job not yet started is dropped with its connection (the client is gone as
          // far as TCP tells); a running one answers the half-closed connection, then closes.
          if (DropQueuedPost(c.id)) return Close(fd);
          c.eof = true;
          Count(&HttpStats::half_closed);
          SetInterest(c, 0);  // EPOLLHUP and EPOLLERR are still reported
        }
        return;
      case Phase::kAuthWait:
      case Phase::kBodyWait:
        if (ev & (EPOLLHUP | EPOLLRDHUP)) Close(fd);
        return;
    }
  }

  void Handshake(Conn& c) {
    const int r = Ssl()->accept(c.ssl);
    if (r == 1) {
      c.phase = Phase::kReading;
      SetInterest(c, EPOLLIN | EPOLLRDHUP);
      return ReadRequest(c);
    }
    const int err = Ssl()->get_error(c.ssl, r);
    if (err == SSL_ERROR_WANT_READ) return SetInterest(c, EPOLLIN | EPOLLRDHUP);
    if (err == SSL_ERROR_WANT_WRITE) return SetInterest(c, EPOLLOUT);
    Crypto()->err_clear_error();
    Close(c.fd);
  }

  // Reads what is there (up to the header limit); -1: the connection is gone.
  int Receive(Conn& c) {
    char buf[16384];
    for (;;) {
      // Headers, and a body only once it holds a grant (the header block's size is not known
      // here: the grant bounds what is read beyond the header limit).
      const size_t cap = options_.max_header_bytes + 1 + c.body_grant;
      const size_t room = cap - std::min(c.in.size(), cap);
      if (room == 0) return 0;
      const size_t want = std::min(room, sizeof buf);
      ssize_t n;
      if (c.ssl) {
        n = Ssl()->read(c.ssl, buf, static_cast<int>(want));
        if (n <= 0) {
          const int err = Ssl()->get_error(c.ssl, static_cast<int>(n));
          if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) return 0;
          Crypto()->err_clear_error();
          if (err == SSL_ERROR_ZERO_RETURN) {
            c.eof = true;
            return 0;
          }
          return -1;
        }
      } else {
        n = ::recv(c.fd, buf, want, 0);
        if (n == 0) {
          c.eof = true;
          return 0;
        }
        if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
      }
      if (c.in.empty()) c.deadline = Steady::now() + options_.request_timeout;  // a new request
      c.in.append(buf, static_cast<size_t>(n));
    }
  }

  void ReadRequest(Conn& c) {
    const int fd = c.fd;
    for (;;) {
      if (Receive(c) < 0) return Close(fd);
      const bool eof = c.eof;
      const size_t grant = c.body_grant;
      ProcessBuffered(c);
      // `c` may be closed by now.
      auto it = conns_.find(fd);
      if (it == conns_.end()) return;
      // A body just granted: read it now (TLS may hold its bytes already, with the socket quiet).
      if (!eof && it->second->phase == Phase::kReading && it->second->body_grant > grant) continue;
      // Nothing (complete) to answer from a client that is gone.
      if (eof && it->second->phase == Phase::kReading) Close(fd);
      return;
    }
  }

  // Works on the request at the front of `in`: its head once complete, then its credentials,
  // then (authenticated only) its body.
  void ProcessBuffered(Conn& c) {
    if (!c.have_head) {
      // Beast wants the whole head at once: call it when an end of head may be there (every head
      // ends in "\n\r\n", or "\n\n" from a lax client Beast then refuses), so a trickled head
      // is scanned once, not parsed again on every read.
      const size_t from = c.scanned >= 2 ? c.scanned - 2 : 0;
      const bool maybe_end = c.in.find("\n\r\n", from) != std::string::npos ||
                             c.in.find("\n\n", from) != std::string::npos;
      Request req;
      size_t head_bytes = 0;
      const HeadParse parsed =
          maybe_end || c.in.size() > options_.max_header_bytes
              ? ParseRequestHead(c.in, options_.max_header_bytes, &req, &head_bytes)
              : HeadParse::kIncomplete;
      if (parsed == HeadParse::kIncomplete) {
        c.scanned = c.in.size();
        if (c.in.size() <= options_.max_header_bytes) return;  // within the request timeout
      }
      if (parsed == HeadParse::kTooLarge || parsed == HeadParse::kIncomplete) {
        Count(&HttpStats::too_large);
        return Respond(c, 431, "text/plain", "request headers too large\n", /*close=*/true);
      }
      if (parsed == HeadParse::kBad) {
        c.in.clear();
        return Respond(c, 400, "text/plain", "bad request\n", true);
      }
      c.in.erase(0, head_bytes);
      c.scanned = 0;
      // Refusals that need no credentials (the connection is closed: a body is not read).
      const bool post_route = req.method == "POST" && options_.post_routes.count(req.path);
      if (post_route && req.chunked) {
        return Respond(c, 411, "text/plain", "a Content-Length is required\n", true);
      }
      if (req.has_body && !(post_route && req.content_length <= options_.max_body_bytes)) {
        return Respond(c, 413, "text/plain", "request bodies are not accepted\n", true);
      }
      if (req.method != "GET" && req.method != "HEAD" && !post_route) {
        return Respond(c, 405, "text/plain", "method not allowed\n", true);
      }
      c.pending = std::move(req);
      c.have_head = true;
      c.authorized = !auth_->enabled();
    }
    if (!c.authorized) return Authenticate(c);
    Request& req = c.pending;
    if (req.has_body) {  // a POST route's body, within max_body_bytes
      if (c.body_grant == 0 && !AcquireBody(c, req.content_length)) {
        body_waiting_.emplace_back(c.id, req.content_length);
        c.phase = Phase::kBodyWait;
        c.deadline = Steady::now() + options_.post_timeout;
        return SetInterest(c, EPOLLRDHUP);
      }
      if (c.in.size() < req.content_length) return;  // wait for the rest of the body
      req.body = c.in.substr(0, req.content_length);
      // A fresh buffer: the old one's capacity (the whole body) is not kept with the connection.
      std::string rest = c.in.substr(req.content_length);
      c.in.swap(rest);
    }
    c.have_head = false;
    const Request ready = std::move(c.pending);
    c.pending = Request{};
    Route(c, ready);
  }

  // The credentials of `c.pending`, from the cache or by a password worker (kAuthWait).
  void Authenticate(Conn& c) {
    if (c.pending.authorization.empty()) return Unauthorized(c);
    const std::string key = Digest(c.pending.authorization);
    auto known = auth_cache_.find(key);
    if (known != auth_cache_.end()) {
      if (!known->second) return Unauthorized(c);
      c.authorized = true;
      return ProcessBuffered(c);
    }
    bool queued = false;
    {
      std::lock_guard<std::mutex> l(auth_mu_);
      if (auth_queue_.size() < options_.max_pending_auth) {
        auth_queue_.push_back({c.id, key, c.pending.authorization});
        queued = true;
      }
    }
    if (!queued) {  // answered outside auth_mu_, as Post answers outside post_mu_
      Count(&HttpStats::auth_throttled);
      // The body (if any) is unread: the connection cannot carry another request.
      const bool close = c.pending.has_body;
      const Request req = std::move(c.pending);
      c.pending = Request{};
      c.have_head = false;
      return Respond(c, 429, "text/plain", "too many password checks pending, retry\n", close,
                     "Retry-After: 1\r\n", &req);
    }
    auth_cv_.notify_one();
    c.phase = Phase::kAuthWait;
    SetInterest(c, EPOLLRDHUP);
  }

  void Authenticated(Conn& c, bool ok) {
    if (!ok) return Unauthorized(c);
    c.authorized = true;
    if (c.phase != Phase::kReading) {
      c.phase = Phase::kReading;
      SetInterest(c, EPOLLIN | EPOLLRDHUP);
    }
    ReadRequest(c);  // the body, or the request as it is
  }

  void Unauthorized(Conn& c) {
    // A body announced but not read would be taken for the next request: close after answering.
    const bool close = c.pending.has_body;
    const Request req = std::move(c.pending);
    c.pending = Request{};
    c.have_head = false;
    Respond(c, 401, "text/plain", "Unauthorized\n", close, "WWW-Authenticate: Basic\r\n", &req);
  }

  void AuthWorker() {
    for (;;) {
      AuthJob job;
      {
        std::unique_lock<std::mutex> l(auth_mu_);
        auth_cv_.wait(l, [this] { return stopping_ || !auth_queue_.empty(); });
        if (stopping_) return;
        job = std::move(auth_queue_.front());
        auth_queue_.pop_front();
      }
      const uint64_t running = ++auth_running_;
      {
        std::lock_guard<std::mutex> l(stats_mu_);
        stats_.auth_parallel_peak = std::max(stats_.auth_parallel_peak, running);
      }
      const bool ok = auth_->Check(job.authorization);
      --auth_running_;
      Count(&HttpStats::auth_checks);
      {
        std::lock_guard<std::mutex> l(auth_mu_);
        auth_done_.push_back({job.conn_id, job.key, ok});
      }
      Wake();
    }
  }

  void AuthCompletions() {
    std::vector<AuthDone> done;
    {
      std::lock_guard<std::mutex> l(auth_mu_);
      done.swap(auth_done_);
    }
    for (AuthDone& d : done) {
      if (auth_cache_.size() >= kAuthCacheSize) {
        auth_cache_.erase(auth_order_.front());
        auth_order_.pop_front();
      }
      if (auth_cache_.emplace(d.key, d.ok).second) auth_order_.push_back(d.key);
      auto id = by_id_.find(d.conn_id);
      if (id == by_id_.end()) continue;  // the client left meanwhile
      Conn& c = *conns_.at(id->second);
      if (c.phase != Phase::kAuthWait) continue;
      Authenticated(c, d.ok);
    }
  }

  // Hands a POST to the workers; the answer comes back through PostCompletions.
  // Never answers under post_mu_: an answer written at once goes on to the client's next
  // (pipelined) request, which may be a POST again.
  void Post(Conn& c, Request req) {
    const auto& handler = options_.post_routes.at(req.path);
    bool queued = false;
    {
      std::lock_guard<std::mutex> l(post_mu_);
      if (post_queue_.size() < options_.max_pending_posts) {
        post_queue_.push_back({c.id, &handler, std::move(req.body), c.body_grant});
        queued = true;
      }
    }
    if (!queued) {
      return Respond(c, 503, "text/plain", "too many requests pending, retry\n", false,
                     "Retry-After: 1\r\n", &req);
    }
    Count(&HttpStats::posts_queued);
    c.body_grant = 0;  // now the job's
    post_cv_.notify_one();
    req.body.clear();
    c.pending = std::move(req);
    c.phase = Phase::kPostWait;
    c.deadline = Steady::now() + options_.post_timeout;
    SetInterest(c, EPOLLRDHUP);
  }

  void PostWorker() {
    for (;;) {
      PostJob job;
      {
        std::unique_lock<std::mutex> l(post_mu_);
        post_cv_.wait(l, [this] { return post_stopping_ || !post_queue_.empty(); });
        if (post_stopping_) return;
        job = std::move(post_queue_.front());
        post_queue_.pop_front();
      }
      HttpOptions::PostReply reply;
      try {
        reply = (*job.handler)(job.body);
      } catch (const std::exception& e) {
        reply = {500, "text/plain", std::string("internal error: ") + e.what() + "\n"};
      }
      std::string().swap(job.body);
      {
        std::lock_guard<std::mutex> l(post_mu_);
        post_done_.push_back({job.conn_id, std::move(reply), job.grant});
      }
      Wake();
    }
  }

  // Removes the job of connection `id` if no worker has taken it yet (its body budget is given
  // back); false when there is none.
  bool DropQueuedPost(uint64_t id) {
    size_t grant = 0;
    {
      std::lock_guard<std::mutex> l(post_mu_);
      auto it = std::find_if(post_queue_.begin(), post_queue_.end(),
                             [id](const PostJob& j) { return j.conn_id == id; });
      if (it == post_queue_.end()) return false;
      grant = it->grant;
      post_queue_.erase(it);
    }
    ReleaseGrant(grant);
    Count(&HttpStats::posts_dropped);
    return true;
  }

  // On a new connection: the certificate, key and client CA are loaded again when their files
  // changed (exporter-toolkit reads them on every handshake); files that fail to load keep the
  // previous context, and are tried again only once they change again.
  void ReloadTlsIfChanged() {
    const std::string sig = TlsFilesSignature(web_);
    if (sig == tls_signature_ || sig == tls_failed_signature_) return;
    Result<SSL_CTX*> made = MakeTlsContext(web_, options_.web_config_file);
    if (!made.ok()) {
      tls_failed_signature_ = sig;
      Count(&HttpStats::tls_reload_failures);
      spdlog::error("event=tls_reload_failed error=\"{}\" action=\"serving the previous files\"",
                    made.status().message());
      return;
    }
    Ssl()->ctx_free(ssl_ctx_);  // connections that use it hold their own reference
    ssl_ctx_ = *made;
    tls_signature_ = sig;
    tls_failed_signature_.clear();
    Count(&HttpStats::tls_reloads);
    spdlog::info("event=tls_reloaded cert={} key={} client_ca={}", web_.cert_file, web_.key_file,
                 web_.client_ca_file);
  }

  void PostCompletions() {
    std::vector<PostDone> done;
    {
      std::lock_guard<std::mutex> l(post_mu_);
      done.swap(post_done_);
    }
    for (PostDone& d : done) {
      ReleaseGrant(d.grant);
      auto id = by_id_.find(d.conn_id);
      if (id == by_id_.end()) continue;  // the client left meanwhile
      Conn& c = *conns_.at(id->second);
      if (c.phase != Phase::kPostWait) continue;
      Request req = std::move(c.pending);
      Respond(c, d.reply.status, d.reply.content_type, d.reply.body, false, "", &req);
    }
  }

  void Route(Conn& c, const Request& req) {
    if (req.method == "POST") return Post(c, req);
    if (auto it = options_.routes.find(req.path); it != options_.routes.end()) {
      auto [type, body] = it->second();
      return Respond(c, 200, type, body, false, "", &req);
    }
    if (req.path == "/metrics") {
      std::shared_ptr<const Rendered> r = publisher_.Current();
      if (!r) return Respond(c, 503, "text/plain", "no collection yet\n", false, "", &req);
      const bool om = req.accept.find("application/openmetrics-text") != std::string::npos;
      const std::string* body = om ? &r->openmetrics : &r->text;
      return Respond(c, 200, om ? kOpenMetricsContentType : kText004ContentType, "", false, "",
                     &req, std::move(r), body);
    }
    if (req.path == "/health") {
      std::shared_ptr<const Rendered> r = publisher_.Current();
      if (!r) return Respond(c, 503, "text/plain", "KO: no collection yet\n", false, "", &req);
      if (options_.stale_after.count() > 0) {
        const auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
        if (now_ms - r->collected_at_ms > options_.stale_after.count()) {
          return Respond(
              c, 503, "text/plain",
              "KO: last collection " + std::to_string(now_ms - r->collected_at_ms) + " ms ago\n",
              false, "", &req);
        }
      }
      return Respond(c, 200, "text/plain", "OK\n", false, "", &req);
    }
    if (req.path == "/") {
      return Respond(c, 200, "text/html",
                     "<html><head><title>gpulet exporter</title></head><body><h1>gpulet "
                     "exporter</h1><p><a href=\"/metrics\">Metrics</a> <a "
                     "href=\"/health\">Health</a></p></body></html>\n",
                     false, "", &req);
    }
    Respond(c, 404, "text/plain", "not found\n", false, "", &req);
  }

  // Queues a response and starts writing it. `body` (kept alive by `keep`) is sent instead of
  // `text` when given.
  void Respond(Conn& c, int status, std::string_view type, const std::string& text, bool close,
               const std::string& extra = "", const Request* req = nullptr,
               std::shared_ptr<const Rendered> keep = nullptr, const std::string* body = nullptr) {
    ReleaseBody(c);  // a body not handed to a handler is done with
    ++c.requests;
    if (req && (req->http10 ? req->connection != "keep-alive" : req->connection == "close")) {
      close = true;
    }
    if (c.requests >= options_.max_requests_per_connection || c.eof) close = true;
    const bool head_only = req && req->method == "HEAD";
    const size_t len = body ? body->size() : text.size();
    std::string& h = c.head;
    h.clear();
    h += "HTTP/1.1 " + std::to_string(status) + " " + Reason(status) + "\r\n";
    h += "Content-Type: ";
    h += type;
    h += "\r\nContent-Length: " + std::to_string(len) + "\r\n";
    for (const auto& [k, v] : headers_) h += k + ": " + v + "\r\n";
    h += extra;
    h += close ? "Connection: close\r\n\r\n" : "Connection: keep-alive\r\n\r\n";
    if (!body && !head_only) h += text;
    c.keep = std::move(keep);
    c.body = body && !head_only ? body->data() : nullptr;
    c.body_len = body && !head_only ? body->size() : 0;
    c.sent = 0;
    c.close_after = close;
    c.phase = Phase::kWriting;
    c.deadline = Steady::now() + std::chrono::seconds(options_.write_timeout_s);
    Count(&HttpStats::responses);
    WriteResponse(c);
  }

  void WriteResponse(Conn& c) {
    const size_t total = c.head.size() + c.body_len;
    while (c.sent < total) {
      ssize_t n;
      if (c.ssl) {
        const char* p =
            c.sent < c.head.size() ? c.head.data() + c.sent : c.body + (c.sent - c.head.size());
        const size_t left = c.sent < c.head.size() ? c.head.size() - c.sent : total - c.sent;
        n = Ssl()->write(c.ssl, p, static_cast<int>(std::min<size_t>(left, 1 << 20)));
        if (n <= 0) {
          const int err = Ssl()->get_error(c.ssl, static_cast<int>(n));
          if (err == SSL_ERROR_WANT_WRITE) return SetInterest(c, EPOLLOUT);
          if (err == SSL_ERROR_WANT_READ) return SetInterest(c, EPOLLIN);
          Crypto()->err_clear_error();
          return Close(c.fd);
        }
      } else {
        iovec iov[2];
        int cnt = 0;
        if (c.sent < c.head.size()) {
          iov[cnt++] = {const_cast<char*>(c.head.data() + c.sent), c.head.size() - c.sent};
          if (c.body_len) iov[cnt++] = {const_cast<char*>(c.body), c.body_len};
        } else {
          const size_t off = c.sent - c.head.size();
          iov[cnt++] = {const_cast<char*>(c.body + off), c.body_len - off};
        }
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = static_cast<size_t>(cnt);
        n = ::sendmsg(c.fd, &msg, MSG_NOSIGNAL);
        if (n < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            return SetInterest(c, EPOLLOUT);
          }
          return Close(c.fd);
        }
      }
      c.sent += static_cast<size_t>(n);
    }
    // Done: close, or wait for the next request on the kept-alive connection.
    c.keep.reset();
    c.body = nullptr;
    c.body_len = 0;
    if (c.close_after) {
      if (c.ssl) Ssl()->shutdown(c.ssl);
      return Close(c.fd);
    }
    c.phase = Phase::kReading;
    c.deadline = Steady::now() + options_.idle_timeout;
    SetInterest(c, EPOLLIN | EPOLLRDHUP);
    if (!c.in.empty()) c.deadline = Steady::now() + options_.request_timeout;  // pipelined
    // The next request is read by the loop (Run), not from here. TLS: epoll cannot tell about
    // bytes OpenSSL already decrypted.
    if (c.ssl || !c.in.empty()) ready_.push_back(c.id);
  }

  const Publisher& publisher_;
  const HttpOptions options_;
  const std::unique_ptr<BasicAuth> auth_;
  const std::map<std::string, std::string> headers_;
  const WebConfig web_;
  SSL_CTX* ssl_ctx_;  // replaced when its files change (event thread)
  std::string tls_signature_;         // of the files ssl_ctx_ was made from
  std::string tls_failed_signature_;  // of files that did not load
  const int listen_fd_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  // Event thread only.
  std::unordered_map<int, std::unique_ptr<Conn>> conns_;
  std::unordered_map<uint64_t, int> by_id_;
  uint64_t next_id_ = 0;
  size_t bodies_in_flight_ = 0;  // granted bytes (max_body_bytes_in_flight)
  std::deque<std::pair<uint64_t, size_t>> body_waiting_;  // connection id, Content-Length
  bool grants_changed_ = false;
  std::vector<uint64_t> ready_;  // connections to read from again (a response was written)
  bool accept_paused_ = false;   // out of descriptors: not accepting until accept_resume_
  Steady::time_point accept_resume_;
  std::chrono::milliseconds accept_delay_{0};
  std::atomic<uint64_t> auth_running_{0};
  std::unordered_map<std::string, bool> auth_cache_;  // SHA-256 of Authorization → verdict
  std::deque<std::string> auth_order_;                // oldest first, for eviction
  // Shared with the password workers.
  std::mutex auth_mu_;
  std::condition_variable auth_cv_;
  bool stopping_ = false;
  std::deque<AuthJob> auth_queue_;
  std::vector<AuthDone> auth_done_;
  mutable std::mutex stats_mu_;
  HttpStats stats_;
  std::vector<std::thread> auth_threads_;
  // Shared with the POST workers.
  std::mutex post_mu_;
  std::condition_variable post_cv_;
  bool post_stopping_ = false;
  std::deque<PostJob> post_queue_;
  std::vector<PostDone> post_done_;
  std::vector<std::thread> post_threads_;
  std::thread thread_;
};

namespace {

Result<SSL_CTX*> MakeTlsContext(const WebConfig& web, const std::string& file) {
  SSL_CTX* ctx = Ssl()->ctx_new(Ssl()->tls_server_method());
  auto fail = [&](const std::string& what) -> Result<SSL_CTX*> {
    Ssl()->ctx_free(ctx);
    Crypto()->err_clear_error();
    return Status(ErrorCode::kInvalidInput, file + ": " + what);
  };
  if (!ctx) return fail("cannot create a TLS context");
  if (Ssl()->ctx_use_certificate_chain_file(ctx, web.cert_file.c_str()) != 1 ||
      Ssl()->ctx_use_private_key_file(ctx, web.key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      Ssl()->ctx_check_private_key(ctx) != 1) {
    return fail("cannot load TLS certificate/key (" + web.cert_file + ", " + web.key_file + ")");
  }
  if (web.require_client_cert) {
    if (Ssl()->ctx_load_verify_locations(ctx, web.client_ca_file.c_str(), nullptr) != 1) {
      return fail("cannot load client CA file " + web.client_ca_file);
    }
    Ssl()->ctx_set_client_ca_list(ctx, Ssl()->load_client_ca_file(web.client_ca_file.c_str()));
    Ssl()->ctx_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  auto version = [](int v) {
    return v == 10   ? TLS1_VERSION
           : v == 11 ? TLS1_1_VERSION
           : v == 13 ? TLS1_3_VERSION
                     : TLS1_2_VERSION;
  };
  // exporter-toolkit's defaults: TLS 1.2 to TLS 1.3.
  Ssl()->ctx_ctrl(ctx, SSL_CTRL_SET_MIN_PROTO_VERSION,  // SSL_CTX_set_min_proto_version
                  version(web.min_tls_version ? web.min_tls_version : 12), nullptr);
  Ssl()->ctx_ctrl(ctx, SSL_CTRL_SET_MAX_PROTO_VERSION,
                  version(web.max_tls_version ? web.max_tls_version : 13), nullptr);
  const ServerTlsCalls* more = ServerTls();
  if (more == nullptr) return fail("libssl.so.3 lacks SSL_CTX_set_cipher_list or session ids");
  // Go's cipher_suites restrict TLS 1.0-1.2 only: OpenSSL's cipher list is exactly that (TLS
  // 1.3 suites are SSL_CTX_set_ciphersuites, left at the default as Go leaves them).
  if (!web.cipher_list.empty() && more->set_cipher_list(ctx, web.cipher_list.c_str()) != 1) {
    return fail("tls_server_config.cipher_suites: none of " + web.cipher_list +
                " is available in this OpenSSL");
  }
  if (!web.groups.empty() &&
      Ssl()->ctx_ctrl(ctx, SSL_CTRL_SET_GROUPS_LIST, 0,  // SSL_CTX_set1_groups_list
                      const_cast<char*>(web.groups.c_str())) != 1) {
    return fail("tls_server_config.curve_preferences: cannot use " + web.groups);
  }
  if (web.prefer_server_cipher_suites) {
    Ssl()->ctx_set_options(ctx, SSL_OP_CIPHER_SERVER_PREFERENCE);
  }
  // Sessions are resumed only within this context: without an ID context, OpenSSL refuses to
  // resume a TLS 1.2 session when client certificates are verified (alert 80).
  static constexpr unsigned char kSessionContext[] = "gpulet-http";
  more->set_session_id_context(ctx, kSessionContext, sizeof kSessionContext - 1);
  Ssl()->ctx_ctrl(ctx, SSL_CTRL_MODE,  // SSL_CTX_set_mode
                  SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                      SSL_MODE_RELEASE_BUFFERS,
                  nullptr);
  return ctx;
}

Result<int> Listen(const ListenAddress& addr, const std::string& text, int* port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(addr.port);
  if (::getaddrinfo(addr.host.c_str(), service.c_str(), &hints, &res) != 0 || res == nullptr) {
    return Status(ErrorCode::kUnavailable, "cannot listen on " + text + " (unknown host)");
  }
  const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int yes = 1;
  // SO_REUSEADDR only (no SO_REUSEPORT): a second exporter must not share the port silently.
  if (fd >= 0) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  const bool ok =
      fd >= 0 && ::bind(fd, res->ai_addr, res->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0;
  const int err = errno;
  ::freeaddrinfo(res);
  if (!ok) {
    if (fd >= 0) ::close(fd);
    return Status(ErrorCode::kUnavailable,
                  "cannot listen on " + text + " (" + std::strerror(err) + ")");
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  *port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                         : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return fd;
}

}  // namespace

MetricsServer::MetricsServer(const Publisher& publisher, HttpOptions options)
    : publisher_(publisher), options_(std::move(options)) {}

MetricsServer::~MetricsServer() { Stop(); }

Status MetricsServer::Start() {
  Result<ListenAddress> addr = ParseListenAddress(options_.address);
  if (!addr.ok()) return addr.status();
  WebConfig web;
  if (!options_.web_config_file.empty()) {
    auto loaded = LoadWebConfig(options_.web_config_file);
    if (!loaded.ok()) return loaded.status();
    web = std::move(loaded).value();
  }
  // OpenSSL is loaded only when the web config needs it: libssl for TLS, libcrypto for basic
  // auth (credential digests, base64, constant-time compare).
  std::string openssl_error;
  if ((web.tls() && Ssl(&openssl_error) == nullptr) ||
      (!web.users.empty() && Crypto(&openssl_error) == nullptr)) {
    return Status(ErrorCode::kUnavailable, options_.web_config_file + ": " + openssl_error);
  }
  SSL_CTX* ctx = nullptr;
  if (web.tls()) {
    Result<SSL_CTX*> made = MakeTlsContext(web, options_.web_config_file);
    if (!made.ok()) return made.status();
    ctx = *made;
    tls_ = true;
  }
  Result<int> fd = Listen(*addr, options_.address, &port_);
  if (!fd.ok()) {
    if (ctx) Ssl()->ctx_free(ctx);
    return fd.status();
  }
  auto auth = std::make_unique<BasicAuth>(web.users);
  const bool basic_auth = auth->enabled();
  loop_ = std::make_unique<Loop>(publisher_, options_, std::move(auth), web, ctx, *fd);
  if (Status s = loop_->Start(); !s.ok()) {
    loop_.reset();
    return s;
  }
  spdlog::info(
      "event=listening address={} port={} tls={} basic_auth={} max_connections={} "
      "max_header_bytes={} idle_timeout_ms={}",
      options_.address, port_, tls_, basic_auth, options_.max_connections,
      options_.max_header_bytes, options_.idle_timeout.count());
  return Status::Ok();
}

void MetricsServer::Stop() {
  if (!loop_) return;
  loop_->Stop();
  const HttpStats s = loop_->stats();
  spdlog::info(
      "event=http_stopped accepted={} responses={} evicted={} timed_out={} too_large={} "
      "auth_checks={} auth_throttled={}",
      s.accepted, s.responses, s.evicted, s.timed_out, s.too_large, s.auth_checks,
      s.auth_throttled);
  loop_.reset();
}

HttpStats MetricsServer::stats() const { return loop_ ? loop_->stats() : HttpStats{}; }

}  // namespace gpulet::metrics
