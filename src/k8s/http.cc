#include "k8s/http.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "common/files.h"
#include "common/openssl_library.h"

namespace gpulet::k8s::http {
namespace {

constexpr size_t kMaxPemBytes = 4 * 1024 * 1024;

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

bool IsIpLiteral(const std::string& host) {
  in6_addr a6;
  in_addr a4;
  return inet_pton(AF_INET, host.c_str(), &a4) == 1 || inet_pton(AF_INET6, host.c_str(), &a6) == 1;
}

int MillisUntil(Clock::time_point deadline, int cap_ms) {
  if (deadline == Clock::time_point::max()) return cap_ms;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return static_cast<int>(std::min<long long>(left, cap_ms));
}

// OpenSSL writes to the socket with write(2): a peer that closed would raise SIGPIPE, which kills
// a process that does not ignore it. The signal is blocked in this thread around each TLS call and
// a SIGPIPE it raised is taken off again.
class NoSigpipe {
 public:
  NoSigpipe() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~NoSigpipe() {
    if (!sigismember(&old_, SIGPIPE)) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE)) {
        timespec zero{};
        sigtimedwait(&pipe_, nullptr, &zero);
      }
      pthread_sigmask(SIG_SETMASK, &old_, nullptr);
    }
  }
  NoSigpipe(const NoSigpipe&) = delete;
  NoSigpipe& operator=(const NoSigpipe&) = delete;

 private:
  sigset_t pipe_{}, old_{};
};

// The newest OpenSSL error in words (and the queue emptied).
std::string OpenSslError(const LibCrypto& c, const std::string& fallback) {
  unsigned long e = 0, last = 0;
  while ((e = c.err_get_error()) != 0) last = e;
  if (last == 0) return fallback;
  char buf[256];
  c.err_error_string_n(last, buf, sizeof buf);
  return buf;
}

// The PEM of a file or of inline data; `what` names it in errors.
Result<std::string> Pem(const std::string& file, const std::string& data, const char* what) {
  if (!data.empty()) return data;
  Result<std::string> text = ReadFileBounded(file, kMaxPemBytes);
  if (!text.ok()) return Status(ErrorCode::kInvalidInput, std::string(what) + " " + file + ": " +
                                                                text.status().message());
  return text;
}

struct FileStamp {
  std::string path;
  timespec mtime{};
  off_t size = 0;
};

FileStamp Stamp(const std::string& path) {
  FileStamp s;
  s.path = path;
  struct stat st {};
  if (!path.empty() && ::stat(path.c_str(), &st) == 0) {
    s.mtime = st.st_mtim;
    s.size = st.st_size;
  }
  return s;
}

// X509_VERIFY_PARAM_set_hostflags, from the libcrypto that Crypto() loaded (not in its table,
// which the exporter's TLS shares; RTLD_NOLOAD finds the copy already mapped). Null when absent.
using SetHostFlags = decltype(&::X509_VERIFY_PARAM_set_hostflags);
SetHostFlags HostFlagsSetter() {
  static const SetHostFlags fn = [] {
    void* lib = dlopen("libcrypto.so.3", RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) return SetHostFlags{nullptr};
    auto* f = reinterpret_cast<SetHostFlags>(dlsym(lib, "X509_VERIFY_PARAM_set_hostflags"));
    dlclose(lib);  // Crypto() keeps its own reference for the program
    return f;
  }();
  return fn;
}

bool Changed(const FileStamp& s) {
  if (s.path.empty()) return false;
  FileStamp now = Stamp(s.path);
  return now.size != s.size || now.mtime.tv_sec != s.mtime.tv_sec ||
         now.mtime.tv_nsec != s.mtime.tv_nsec;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

Result<Endpoint> ParseServerUrl(const std::string& server) {
  Endpoint e;
  std::string_view rest(server);
  if (rest.starts_with("https://")) {
    rest.remove_prefix(8);
  } else if (rest.starts_with("http://")) {
    e.tls = false;
    rest.remove_prefix(7);
  } else {
    return Status(ErrorCode::kInvalidInput,
                  "server \"" + server + "\": the URL must start with https:// or http://");
  }
  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    e.path_prefix = std::string(rest.substr(slash));
    while (!e.path_prefix.empty() && e.path_prefix.back() == '/') e.path_prefix.pop_back();
  }
  if (const size_t at = authority.rfind('@'); at != std::string_view::npos) {
    authority.remove_prefix(at + 1);  // user info is not used
  }
  std::string_view port;
  if (authority.starts_with("[")) {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos)
      return Status(ErrorCode::kInvalidInput, "server \"" + server + "\": unclosed [ in the host");
    e.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (after.starts_with(":")) port = after.substr(1);
    else if (!after.empty())
      return Status(ErrorCode::kInvalidInput, "server \"" + server + "\": bad text after the host");
  } else {
    const size_t colon = authority.rfind(':');
    e.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) port = authority.substr(colon + 1);
  }
  if (e.host.empty()) return Status(ErrorCode::kInvalidInput, "server \"" + server + "\": no host");
  if (!port.empty()) {
    if (port.size() > 5 || !std::all_of(port.begin(), port.end(),
                                        [](char c) { return c >= '0' && c <= '9'; }) ||
        std::stoi(std::string(port)) > 65535 || std::stoi(std::string(port)) == 0) {
      return Status(ErrorCode::kInvalidInput,
                    "server \"" + server + "\": port \"" + std::string(port) + "\" is not a number from 1 to 65535");
    }
    e.port = std::string(port);
  } else {
    e.port = e.tls ? "443" : "80";
  }
  e.host_is_ip = IsIpLiteral(e.host);
  const bool v6 = e.host.find(':') != std::string::npos;
  e.host_header = v6 ? "[" + e.host + "]" : e.host;
  if (!port.empty()) e.host_header += ":" + e.port;
  return e;
}

// ---------------------------------------------------------------------------------------------

class TlsConfig {
 public:
  ~TlsConfig() {
    if (ctx_ != nullptr) ssl_->ctx_free(ctx_);
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, session] : sessions_) ssl_->session_free(session);
  }
  SSL_CTX* ctx() const { return ctx_; }
  bool verify() const { return verify_; }
  const LibSsl* ssl() const { return ssl_; }
  const LibCrypto* crypto() const { return crypto_; }

  // The last session the server at `key` ("host:port") gave: a new connection there resumes it
  // (an abbreviated handshake, no key exchange and no certificate chain to verify again). A
  // resumed session skips the certificate and hostname checks, so it is offered only to the host
  // and port whose checks it passed, as Go's tls.Config.ClientSessionCache is keyed.
  void ResumeInto(SSL* ssl, const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(key);
    if (it != sessions_.end()) ssl_->set_session(ssl, it->second);  // takes its own reference
  }
  void Keep(SSL* ssl, const std::string& key) {
    SSL_SESSION* s = ssl_->get1_session(ssl);
    if (s == nullptr) return;
    if (ssl_->session_is_resumable(s) == 0) {
      ssl_->session_free(s);
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    SSL_SESSION*& slot = sessions_[key];
    if (slot != nullptr) ssl_->session_free(slot);
    slot = s;
  }

  std::vector<FileStamp> stamps;

 private:
  friend Result<std::shared_ptr<TlsConfig>> MakeTlsConfig(const ClusterAccess& access);
  const LibSsl* ssl_ = nullptr;
  const LibCrypto* crypto_ = nullptr;
  SSL_CTX* ctx_ = nullptr;
  bool verify_ = true;
  std::mutex mu_;
  std::map<std::string, SSL_SESSION*> sessions_;  // "host:port" → its last resumable session
};

Result<std::shared_ptr<TlsConfig>> MakeTlsConfig(const ClusterAccess& a) {
  std::string error;
  const LibSsl* ssl = Ssl(&error);
  if (ssl == nullptr) return Status(ErrorCode::kUnavailable, "TLS for the API server: " + error);
  const LibCrypto& c = *Crypto();
  // client-go refuses this pair (k8s.io/client-go/transport, TLSConfigFor): a CA that would not
  // be used is a configuration mistake, not a request to skip verification.
  if (a.insecure_skip_tls_verify && (!a.ca_data.empty() || !a.ca_file.empty())) {
    return Status(ErrorCode::kInvalidInput,
                  "insecure-skip-tls-verify with certificate-authority: specifying a root "
                  "certificates file with the insecure flag is not allowed");
  }
  auto config = std::make_shared<TlsConfig>();
  config->ssl_ = ssl;
  config->crypto_ = &c;
  config->stamps = {Stamp(a.ca_data.empty() ? a.ca_file : ""),
                    Stamp(a.client_cert_data.empty() ? a.client_cert_file : ""),
                    Stamp(a.client_key_data.empty() ? a.client_key_file : "")};
  c.err_clear_error();
  config->ctx_ = ssl->ctx_new(ssl->tls_client_method());
  if (config->ctx_ == nullptr)
    return Status(ErrorCode::kInternal, "SSL_CTX_new: " + OpenSslError(c, "failed"));
  SSL_CTX* ctx = config->ctx_;
  ssl->ctx_ctrl(ctx, SSL_CTRL_SET_MIN_PROTO_VERSION, TLS1_2_VERSION, nullptr);
  // A peer that closes without close_notify ends the stream; the HTTP framing (Content-Length,
  // chunked) is what tells a cut body from a whole one.
  ssl->ctx_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
  ssl->ctx_ctrl(ctx, SSL_CTRL_MODE,
                SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_ENABLE_PARTIAL_WRITE, nullptr);
  config->verify_ = !a.insecure_skip_tls_verify;
  if (config->verify_) {
    ssl->ctx_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    if (!a.ca_data.empty() || !a.ca_file.empty()) {
      const char* what = a.ca_data.empty() ? "certificate-authority" : "certificate-authority-data";
      Result<std::string> pem = Pem(a.ca_file, a.ca_data, what);
      if (!pem.ok()) return pem.status();
      BIO* bio = c.bio_new_mem_buf(pem->data(), static_cast<int>(pem->size()));
      X509_STORE* store = ssl->ctx_get_cert_store(ctx);
      int added = 0;
      while (X509* x = c.pem_read_bio_x509(bio, nullptr, nullptr, nullptr)) {
        if (c.x509_store_add_cert(store, x) == 1) ++added;
        c.x509_free(x);
      }
      c.bio_free(bio);
      c.err_clear_error();  // the end of the PEM reads as an error
      if (added == 0) {
        return Status(ErrorCode::kInvalidInput,
                      std::string(what) + (a.ca_data.empty() ? " " + a.ca_file : "") +
                          ": no PEM certificate in it");
      }
    } else if (ssl->ctx_set_default_verify_paths(ctx) != 1) {
      c.err_clear_error();
    }
  }
  if (!a.client_cert_data.empty() || !a.client_cert_file.empty()) {
    const char* what = a.client_cert_data.empty() ? "client-certificate" : "client-certificate-data";
    Result<std::string> pem = Pem(a.client_cert_file, a.client_cert_data, what);
    if (!pem.ok()) return pem.status();
    BIO* bio = c.bio_new_mem_buf(pem->data(), static_cast<int>(pem->size()));
    int n = 0;
    bool ok = true;
    while (X509* x = c.pem_read_bio_x509(bio, nullptr, nullptr, nullptr)) {
      if (n++ == 0) {
        ok = ssl->ctx_use_certificate(ctx, x) == 1;
        c.x509_free(x);
      } else if (ssl->ctx_ctrl(ctx, SSL_CTRL_EXTRA_CHAIN_CERT, 0, x) != 1) {  // takes x
        c.x509_free(x);
        ok = false;
      }
      if (!ok) break;
    }
    c.bio_free(bio);
    if (n == 0 || !ok) {
      return Status(ErrorCode::kInvalidInput,
                    std::string(what) + (a.client_cert_data.empty() ? " " + a.client_cert_file : "") +
                        ": " + (n == 0 ? "no PEM certificate in it" : OpenSslError(c, "refused")));
    }
    c.err_clear_error();
  }
  if (!a.client_key_data.empty() || !a.client_key_file.empty()) {
    const char* what = a.client_key_data.empty() ? "client-key" : "client-key-data";
    Result<std::string> pem = Pem(a.client_key_file, a.client_key_data, what);
    if (!pem.ok()) return pem.status();
    BIO* bio = c.bio_new_mem_buf(pem->data(), static_cast<int>(pem->size()));
    EVP_PKEY* key = c.pem_read_bio_private_key(bio, nullptr, nullptr, nullptr);
    c.bio_free(bio);
    const std::string name =
        std::string(what) + (a.client_key_data.empty() ? " " + a.client_key_file : "");
    if (key == nullptr) {
      return Status(ErrorCode::kInvalidInput,
                    name + ": no PEM private key in it (" + OpenSslError(c, "unreadable") + ")");
    }
    const bool used = ssl->ctx_use_private_key(ctx, key) == 1;
    c.evp_pkey_free(key);
    if (!used || ssl->ctx_check_private_key(ctx) != 1) {
      return Status(ErrorCode::kInvalidInput,
                    name + ": does not match the client certificate (" +
                        OpenSslError(c, "refused") + ")");
    }
  }
  return config;
}

bool TlsConfigIsStale(const TlsConfig& config) {
  return std::any_of(config.stamps.begin(), config.stamps.end(), Changed);
}

// ---------------------------------------------------------------------------------------------

struct Connection::Impl {
  int fd = -1;
  SSL* ssl = nullptr;
  std::shared_ptr<TlsConfig> tls;
  std::string session_key;  // "host:port": which TLS sessions this connection may resume and keep

  ~Impl() {
    if (ssl != nullptr) {
      NoSigpipe guard;
      tls->ssl()->shutdown(ssl);  // one close_notify, not waited for
      tls->ssl()->ssl_free(ssl);
    }
    if (fd >= 0) ::close(fd);
  }

  // Waits for `events` on the socket until the deadline, waking each second for *stop.
  Status Wait(short events, Clock::time_point deadline, const std::atomic<bool>* stop,
              const char* what) const {
    for (;;) {
      if (stop != nullptr && stop->load()) return Status(ErrorCode::kUnavailable, "stopped");
      const int ms = MillisUntil(deadline, stop != nullptr ? 1000 : 60'000);
      if (ms == 0 && Clock::now() >= deadline)
        return Status(ErrorCode::kUnavailable, std::string("timed out ") + what);
      pollfd p{fd, events, 0};
      const int r = ::poll(&p, 1, ms);
      if (r > 0) return Status::Ok();
      if (r < 0 && errno != EINTR)
        return Status(ErrorCode::kUnavailable, std::string("poll: ") + std::strerror(errno));
    }
  }

  // Drives a TLS call that may want to read or write first.
  template <typename Call>
  Result<int> TlsIo(Call call, Clock::time_point deadline, const std::atomic<bool>* stop,
                    const char* what) {
    const LibSsl& s = *tls->ssl();
    for (;;) {
      int r;
      int err;
      {
        NoSigpipe guard;
        tls->crypto()->err_clear_error();
        errno = 0;
        r = call();
        err = r > 0 ? SSL_ERROR_NONE : s.get_error(ssl, r);
      }
      if (err == SSL_ERROR_NONE) return r;
      if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        Status w = Wait(err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline, stop, what);
        if (!w.ok()) return w;
        continue;
      }
      if (err == SSL_ERROR_ZERO_RETURN) return 0;
      if (err == SSL_ERROR_SYSCALL) {
        if (errno == 0) return 0;  // EOF without close_notify
        return Status(ErrorCode::kUnavailable, std::string(what) + ": " + std::strerror(errno));
      }
      std::string detail = OpenSslError(*tls->crypto(), "TLS error");
      if (const long v = s.get_verify_result(ssl); v != X509_V_OK) {
        detail = std::string("server certificate not trusted: ") +
                 tls->crypto()->x509_verify_cert_error_string(v);
      }
      return Status(ErrorCode::kUnavailable, std::string(what) + ": " + detail);
    }
  }
};

Connection::Connection(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Connection::~Connection() = default;

Result<std::unique_ptr<Connection>> Connection::Open(const Endpoint& e,
                                                     std::shared_ptr<TlsConfig> tls,
                                                     std::chrono::milliseconds connect_timeout,
                                                     Clock::time_point deadline,
                                                     const Liveness& liveness) {
  const std::string& dial = e.dial_host.empty() ? e.host : e.dial_host;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_ADDRCONFIG | (IsIpLiteral(dial) ? AI_NUMERICHOST : 0);
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(dial.c_str(), e.port.c_str(), &hints, &res); rc != 0) {
    return Status(ErrorCode::kUnavailable,
                  "cannot resolve " + dial + ": " + ::gai_strerror(rc));
  }
  const Clock::time_point connect_deadline = std::min(deadline, Clock::now() + connect_timeout);
  auto impl = std::make_unique<Impl>();
  std::string last_error = "no address";
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = std::string("socket: ") + std::strerror(errno);
      continue;
    }
    char addr[INET6_ADDRSTRLEN + 8] = "?";
    getnameinfo(ai->ai_addr, ai->ai_addrlen, addr, sizeof addr, nullptr, 0, NI_NUMERICHOST);
    impl->fd = fd;
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      Status w = impl->Wait(POLLOUT, connect_deadline, nullptr, "connecting");
      if (w.ok()) {
        int so_error = 0;
        socklen_t len = sizeof so_error;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
        rc = so_error == 0 ? 0 : -1;
        errno = so_error;
      } else {
        rc = -1;
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) break;
    last_error = std::string("connect to ") + addr + " port " + e.port + ": " + std::strerror(errno);
    ::close(fd);
    impl->fd = -1;
  }
  ::freeaddrinfo(res);
  if (impl->fd < 0) return Status(ErrorCode::kUnavailable, last_error);
  const int one = 1;
  ::setsockopt(impl->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (liveness.keepalive_count > 0) {
    const int idle = static_cast<int>(liveness.keepalive_idle.count());
    const int interval = static_cast<int>(liveness.keepalive_interval.count());
    const int count = liveness.keepalive_count;
    const unsigned user_timeout_ms = static_cast<unsigned>((idle + interval * count) * 1000);
    ::setsockopt(impl->fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    ::setsockopt(impl->fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    ::setsockopt(impl->fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
    ::setsockopt(impl->fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
    ::setsockopt(impl->fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms);
  }
  if (!e.tls) return std::unique_ptr<Connection>(new Connection(std::move(impl)));

  if (tls == nullptr) return Status(ErrorCode::kInternal, "https without a TLS configuration");
  const LibSsl& s = *tls->ssl();
  impl->tls = tls;  // shared: the configuration outlives the connection
  impl->ssl = s.ssl_new(tls->ctx());
  if (impl->ssl == nullptr)
    return Status(ErrorCode::kInternal, "SSL_new: " + OpenSslError(*tls->crypto(), "failed"));
  s.set_fd(impl->ssl, impl->fd);
  if (!e.host_is_ip) {
    s.ssl_ctrl(impl->ssl, SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name,
               const_cast<char*>(e.host.c_str()));
  }
  if (tls->verify()) {
    // As Go's crypto/x509 (VerifyHostname): names only from subjectAltName, never the subject's
    // CN (ignored since Go 1.15, even without SANs), and a wildcard only as the whole left-most
    // label ("*.example.test"; "f*.example.test" matches nothing).
    const SetHostFlags set_flags = HostFlagsSetter();
    if (set_flags == nullptr) {
      return Status(ErrorCode::kUnavailable,
                    "TLS: libcrypto.so.3 has no X509_VERIFY_PARAM_set_hostflags");
    }
    set_flags(s.get0_param(impl->ssl),
              X509_CHECK_FLAG_NEVER_CHECK_SUBJECT | X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    const int named = e.host_is_ip ? tls->crypto()->x509_verify_param_set1_ip_asc(
                                         s.get0_param(impl->ssl), e.host.c_str())
                                   : s.set1_host(impl->ssl, e.host.c_str());
    if (named != 1) return Status(ErrorCode::kInternal, "cannot set the expected host " + e.host);
  }
  impl->session_key = e.host + ":" + e.port;
  tls->ResumeInto(impl->ssl, impl->session_key);
  SSL* ssl = impl->ssl;
  Result<int> hs = impl->TlsIo([&] { return s.connect(ssl); }, connect_deadline, nullptr,
                               "TLS handshake");
  if (!hs.ok()) return hs.status();
  if (*hs == 0) return Status(ErrorCode::kUnavailable, "TLS handshake: the server closed the connection");
  return std::unique_ptr<Connection>(new Connection(std::move(impl)));
}

void Connection::KeepTlsSession() {
  if (impl_->ssl != nullptr) impl_->tls->Keep(impl_->ssl, impl_->session_key);
}

int Connection::native_handle() const { return impl_->fd; }

bool Connection::ResumedTls() const {
  return impl_->ssl != nullptr && impl_->tls->ssl()->session_reused(impl_->ssl) == 1;
}

bool Connection::LooksAlive() const {
  pollfd p{impl_->fd, POLLIN | POLLRDHUP, 0};
  const int r = ::poll(&p, 1, 0);
  // Readable while idle means EOF, an error, or bytes nobody asked for (a TLS session ticket can
  // arrive after the handshake; OpenSSL reads it with the next answer): only EOF/error rule it out.
  if (r == 0) return true;
  if ((p.revents & (POLLERR | POLLHUP | POLLRDHUP)) != 0) return false;
  char c;
  const ssize_t n = ::recv(impl_->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n > 0;
}

Status Connection::WriteAll(std::string_view data, Clock::time_point deadline) {
  while (!data.empty()) {
    if (impl_->ssl != nullptr) {
      SSL* ssl = impl_->ssl;
      const LibSsl& s = *impl_->tls->ssl();
      const int chunk = static_cast<int>(std::min<size_t>(data.size(), 1 << 20));
      Result<int> n = impl_->TlsIo([&] { return s.write(ssl, data.data(), chunk); }, deadline,
                                   nullptr, "sending the request");
      if (!n.ok()) return n.status();
      if (*n == 0) return Status(ErrorCode::kUnavailable, "sending the request: connection closed");
      data.remove_prefix(static_cast<size_t>(*n));
    } else {
      const ssize_t n = ::send(impl_->fd, data.data(), data.size(), MSG_NOSIGNAL);
      if (n > 0) {
        data.remove_prefix(static_cast<size_t>(n));
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        Status w = impl_->Wait(POLLOUT, deadline, nullptr, "sending the request");
        if (!w.ok()) return w;
      } else if (n < 0 && errno != EINTR) {
        return Status(ErrorCode::kUnavailable, std::string("sending the request: ") + std::strerror(errno));
      }
    }
  }
  return Status::Ok();
}

Result<size_t> Connection::ReadSome(char* buf, size_t cap, Clock::time_point deadline,
                                    const std::atomic<bool>* stop) {
  if (impl_->ssl != nullptr) {
    SSL* ssl = impl_->ssl;
    const LibSsl& s = *impl_->tls->ssl();
    const int want = static_cast<int>(std::min<size_t>(cap, 1 << 20));
    Result<int> n = impl_->TlsIo([&] { return s.read(ssl, buf, want); }, deadline, stop,
                                 "waiting for the answer");
    if (!n.ok()) return n.status();
    return static_cast<size_t>(*n);
  }
  for (;;) {
    const ssize_t n = ::recv(impl_->fd, buf, cap, 0);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      Status w = impl_->Wait(POLLIN, deadline, stop, "waiting for the answer");
      if (!w.ok()) return w;
    } else if (errno != EINTR) {
      return Status(ErrorCode::kUnavailable, std::string("reading the answer: ") + std::strerror(errno));
    }
  }
}

// ---------------------------------------------------------------------------------------------

namespace {

// Reads the answer through a buffer; body bytes go out as they come.
class Reader {
 public:
  Reader(Stream& c, const ExchangeOptions& o) : c_(c), o_(o) {}

  size_t buffered() const { return buf_.size() - pos_; }
  std::string_view view() const { return std::string_view(buf_).substr(pos_); }
  void consume(size_t n) {
    pos_ += n;
    scanned_ = 0;
    if (pos_ == buf_.size()) {
      buf_.clear();
      pos_ = 0;
    }
  }
  bool received_any() const { return received_any_; }

  // More bytes into the buffer; false at EOF. An error sets `error`.
  Result<bool> Fill() {
    if (pos_ > 0 && pos_ > buf_.size() / 2) {
      buf_.erase(0, pos_);
      pos_ = 0;
    }
    Clock::time_point deadline = o_.deadline;
    bool idle_bound = false;
    if (o_.idle_timeout.count() > 0 && Clock::now() + o_.idle_timeout < deadline) {
      deadline = Clock::now() + o_.idle_timeout;
      idle_bound = true;
    }
    char tmp[16384];
    Result<size_t> n = c_.ReadSome(tmp, sizeof tmp, deadline, o_.stop);
    if (!n.ok()) {
      if (idle_bound && Clock::now() >= deadline && !(o_.stop != nullptr && o_.stop->load())) {
        return Status(ErrorCode::kUnavailable,
                      "timed out: the answer was silent for " +
                          std::to_string(o_.idle_timeout.count()) + " ms");
      }
      return n.status();
    }
    if (*n == 0) return false;
    received_any_ = true;
    buf_.append(tmp, *n);
    return true;
  }

  // A line ending in CRLF (or LF), without it, no longer than `max`.
  Result<std::string> Line(size_t max, const char* what) {
    for (;;) {
      // Only bytes not looked at yet are searched: a line trickled in small reads costs its length.
      const size_t nl = view().find('\n', scanned_);
      scanned_ = buffered();
      if (nl != std::string_view::npos) {
        std::string line(view().substr(0, nl));
        consume(nl + 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return line;
      }
      if (buffered() > max)
        return Status(ErrorCode::kUnavailable, std::string(what) + " longer than " +
                                                   std::to_string(max) + " bytes");
      Result<bool> more = Fill();
      if (!more.ok()) return more.status();
      if (!*more) return Status(ErrorCode::kUnavailable, std::string("connection closed in the ") + what);
    }
  }

 private:
  Stream& c_;
  const ExchangeOptions& o_;
  std::string buf_;
  size_t pos_ = 0;
  size_t scanned_ = 0;  // bytes after pos_ already searched for a newline
  bool received_any_ = false;
};

}  // namespace

std::optional<ExchangeError> Exchange(Stream& c, const Endpoint& e, const Request& req,
                                      const ExchangeOptions& o, ResponseHead& head,
                                      const BodySink& on_body) {
  std::string msg;
  msg.reserve(256 + req.body.size());
  msg += req.method + " " + e.path_prefix + req.target + " HTTP/1.1\r\nHost: " + e.host_header + "\r\n";
  for (const auto& [k, v] : req.headers) msg += k + ": " + v + "\r\n";
  if (!req.body.empty() || req.method != "GET") {
    msg += "Content-Length: " + std::to_string(req.body.size()) + "\r\n";
  }
  msg += "\r\n";
  msg += req.body;
  auto fail = [](Status s, bool nothing, bool stopped = false) {
    return std::optional<ExchangeError>(ExchangeError{std::move(s), nothing, stopped});
  };
  if (Status w = c.WriteAll(msg, o.deadline); !w.ok()) return fail(w, true);

  Reader r(c, o);
  auto failed = [&](const Status& s) {
    return fail(s, !r.received_any(), o.stop != nullptr && o.stop->load());
  };
  // The head; 1xx answers before the real one are skipped.
  long content_length = -1;
  bool chunked = false, close = false;
  for (;;) {
    size_t header_bytes = 0;
    Result<std::string> status_line = r.Line(kMaxHeaderBytes, "status line");
    if (!status_line.ok()) return failed(status_line.status());
    // "HTTP/1.1 200 OK"
    const std::string& sl = *status_line;
    if (!sl.starts_with("HTTP/1.") || sl.size() < 12 || sl[8] != ' ' ||
        !std::isdigit(static_cast<unsigned char>(sl[9])) ||
        !std::isdigit(static_cast<unsigned char>(sl[10])) ||
        !std::isdigit(static_cast<unsigned char>(sl[11]))) {
      return fail(Status(ErrorCode::kUnavailable,
                         "the answer is not HTTP/1.x: \"" + sl.substr(0, 40) + "\""),
                  false);
    }
    head.status = std::stol(sl.substr(9, 3));
    close = sl.starts_with("HTTP/1.0");
    content_length = -1;
    chunked = false;
    for (;;) {
      Result<std::string> line = r.Line(kMaxHeaderBytes, "header");
      if (!line.ok()) return failed(line.status());
      header_bytes += line->size() + 2;
      if (header_bytes > kMaxHeaderBytes)
        return fail(Status(ErrorCode::kUnavailable, "the answer's headers exceed " +
                                                        std::to_string(kMaxHeaderBytes) + " bytes"),
                    false);
      if (line->empty()) break;
      const size_t colon = line->find(':');
      if (colon == std::string::npos) continue;
      const std::string name = Lower(Trim(std::string_view(*line).substr(0, colon)));
      const std::string_view value = Trim(std::string_view(*line).substr(colon + 1));
      if (name == "content-length") {
        long v = 0;
        bool digits = !value.empty();
        for (char ch : value) {
          if (ch < '0' || ch > '9' || v > (long{1} << 50)) digits = false;
          else v = v * 10 + (ch - '0');
        }
        if (!digits) return fail(Status(ErrorCode::kUnavailable, "bad Content-Length"), false);
        content_length = v;
      } else if (name == "transfer-encoding") {
        chunked = Lower(value).find("chunked") != std::string::npos;
      } else if (name == "connection") {
        const std::string v = Lower(value);
        if (v.find("close") != std::string::npos) close = true;
        if (v.find("keep-alive") != std::string::npos) close = false;
      } else if (name == "retry-after") {
        long seconds = 0;
        bool digits = false;
        for (char ch : value) {
          if (ch < '0' || ch > '9') break;
          digits = true;
          seconds = std::min(3600L, seconds * 10 + (ch - '0'));
        }
        if (digits) head.retry_after = seconds;
      }
    }
    if (head.status >= 100 && head.status < 200 && head.status != 101) continue;
    break;
  }

  const bool bounded = o.max_body_bytes > 0;
  auto too_big = [&](const std::string& what) {
    return fail(Status(ErrorCode::kUnavailable, what + " exceeds the limit of " +
                                                    std::to_string(o.max_body_bytes) + " bytes"),
                false);
  };
  head.content_length = chunked ? -1 : content_length;
  auto deliver = [&](std::string_view bytes) { return on_body(head, bytes); };
  // Delivers the next n bytes of the body, as they arrive.
  auto deliver_exactly = [&](size_t n) -> std::optional<ExchangeError> {
    while (n > 0) {
      if (r.buffered() == 0) {
        Result<bool> more = r.Fill();
        if (!more.ok()) return failed(more.status());
        if (!*more) return fail(Status(ErrorCode::kUnavailable, "connection closed mid-body"), false);
      }
      const size_t take = std::min(n, r.buffered());
      const bool go_on = deliver(r.view().substr(0, take));
      r.consume(take);
      n -= take;
      if (!go_on) return fail(Status(ErrorCode::kUnavailable, "stopped"), false, true);
    }
    return std::nullopt;
  };
  const bool no_body = req.method == "HEAD" || head.status == 204 || head.status == 304;
  size_t total = 0;
  if (no_body) {
    // nothing
  } else if (chunked) {
    for (;;) {
      Result<std::string> size_line = r.Line(4096, "chunk size");
      if (!size_line.ok()) return failed(size_line.status());
      size_t size = 0;
      size_t i = 0;
      for (; i < size_line->size(); ++i) {
        const char ch = static_cast<char>(std::tolower(static_cast<unsigned char>((*size_line)[i])));
        int d;
        if (ch >= '0' && ch <= '9') d = ch - '0';
        else if (ch >= 'a' && ch <= 'f') d = ch - 'a' + 10;
        else break;
        size = size * 16 + static_cast<size_t>(d);
        if (size > kMaxBodyBytes)
          return fail(Status(ErrorCode::kUnavailable, "a chunk larger than the body limit"), false);
      }
      if (i == 0) return fail(Status(ErrorCode::kUnavailable, "bad chunk size"), false);
      if (size == 0) {
        for (;;) {  // trailers up to the empty line
          Result<std::string> t = r.Line(kMaxHeaderBytes, "trailer");
          if (!t.ok()) return failed(t.status());
          if (t->empty()) break;
        }
        break;
      }
      total += size;
      if (bounded && total > o.max_body_bytes) return too_big("the chunked answer");
      if (auto e = deliver_exactly(size)) return e;
      Result<std::string> crlf = r.Line(2, "chunk end");
      if (!crlf.ok()) return failed(crlf.status());
      if (!crlf->empty()) return fail(Status(ErrorCode::kUnavailable, "bad chunk end"), false);
    }
  } else if (content_length >= 0) {
    if (bounded && static_cast<size_t>(content_length) > o.max_body_bytes) {
      return too_big("the answer's Content-Length " + std::to_string(content_length));
    }
    if (auto e = deliver_exactly(static_cast<size_t>(content_length))) return e;
  } else {
    close = true;  // the body ends with the connection
    for (;;) {
      if (r.buffered() > 0) {
        total += r.buffered();
        if (bounded && total > o.max_body_bytes) return too_big("the answer");
        const bool go_on = deliver(r.view());
        r.consume(r.buffered());
        if (!go_on) return fail(Status(ErrorCode::kUnavailable, "stopped"), false, true);
      }
      Result<bool> more = r.Fill();
      if (!more.ok()) return failed(more.status());
      if (!*more) break;
    }
  }
  head.reusable = !close && r.buffered() == 0;
  return std::nullopt;
}

bool LineSplitter::Feed(std::string_view bytes,
                        const std::function<bool(std::string_view line)>& on_line) {
  if (overflowed_) return false;
  auto overflow = [&] {
    overflowed_ = true;
    std::string().swap(pending_);
    return false;
  };
  while (!bytes.empty()) {
    const size_t nl = bytes.find('\n');  // each byte is searched once
    if (nl == std::string_view::npos) {
      if (pending_.size() + bytes.size() > max_line_) return overflow();
      pending_.append(bytes);
      return true;
    }
    std::string_view line = bytes.substr(0, nl);
    bytes.remove_prefix(nl + 1);
    if (!pending_.empty()) {
      if (pending_.size() + line.size() > max_line_) return overflow();
      pending_.append(line);
      line = pending_;
    } else if (line.size() > max_line_) {
      return overflow();
    }
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const bool go_on = on_line(line);
    pending_.clear();
    if (pending_.capacity() > (size_t{1} << 20)) std::string().swap(pending_);  // a big line's
    if (!go_on) return false;
  }
  return true;
}

}  // namespace gpulet::k8s::http
