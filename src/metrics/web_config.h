// The Prometheus exporter web configuration file (--web-config-file), the format of
// prometheus/exporter-toolkit that dcgm-exporter also reads:
//
//   tls_server_config:
//     cert_file: server.crt
//     key_file: server.key
//     client_auth_type: RequireAndVerifyClientCert   # or NoClientCert (default)
//     client_ca_file: ca.crt
//     min_version: TLS12                             # TLS10..TLS13
//   basic_auth_users:
//     alice: $2y$10$...                              # bcrypt hash
//   http_server_config:
//     headers: {X-Frame-Options: deny}
//
// Unknown keys are errors naming file:line. Passwords are checked with crypt(3) (libxcrypt, which
// supports bcrypt $2a$/$2b$/$2y$); a verified user/password pair is cached (by SHA-256) so a
// scrape every second does not pay a bcrypt each time.
#pragma once

#include <map>
#include <mutex>
#include <set>
#include <string>

#include "common/status.h"

namespace gpulet::metrics {

struct WebConfig {
  std::string cert_file;
  std::string key_file;
  std::string client_ca_file;
  bool require_client_cert = false;
  int min_tls_version = 0;  // 0 = library default, else 10..13
  std::map<std::string, std::string> users;  // user → bcrypt hash
  std::map<std::string, std::string> headers;

  bool tls() const { return !cert_file.empty(); }
};

// Relative paths in the file are resolved against the file's directory.
Result<WebConfig> LoadWebConfig(const std::string& path);

class BasicAuth {
 public:
  explicit BasicAuth(std::map<std::string, std::string> users) : users_(std::move(users)) {}
  bool enabled() const { return !users_.empty(); }
  // `authorization` is the Authorization header value ("Basic <base64>").
  bool Check(const std::string& authorization);

 private:
  std::map<std::string, std::string> users_;
  std::mutex mu_;
  std::set<std::string> verified_;  // SHA-256 of user, hash and password
};

}  // namespace gpulet::metrics
