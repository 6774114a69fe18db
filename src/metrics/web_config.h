// The Prometheus exporter web configuration file (--web-config-file), the format of
// prometheus/exporter-toolkit that dcgm-exporter also reads:
//
//   tls_server_config:
//     cert_file: server.crt
//     key_file: server.key
//     client_auth_type: RequireAndVerifyClientCert   # or NoClientCert (default)
//     client_ca_file: ca.crt
//     min_version: TLS12                             # TLS10..TLS13 (default TLS12)
//     max_version: TLS13                             # (default TLS13)
//     cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]  # Go names; TLS <= 1.2 only
//     curve_preferences: [CurveP256, X25519]         # CurveP256/P384/P521, X25519
//     prefer_server_cipher_suites: true              # (default true)
//   basic_auth_users:
//     alice: $2y$10$...                              # bcrypt hash
//   http_server_config:
//     headers: {X-Frame-Options: deny}
//
// Unknown keys are errors naming file:line, as are cipher, curve and version names that
// exporter-toolkit refuses. The four TLS keys are applied as exporter-toolkit's Go server applies
// them: cipher_suites restrict TLS 1.0-1.2 only (Go does not configure TLS 1.3 suites; a TLS 1.3
// suite name is accepted and ignored, with a warning), curve_preferences restrict the key
// exchange groups of every version. Passwords are checked with crypt(3) (libxcrypt, which
// supports bcrypt $2a$/$2b$/$2y$); a verified user/password pair is cached (by SHA-256) so a
// scrape every second does not pay a bcrypt each time.
#pragma once

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace gpulet::metrics {

struct WebConfig {
  std::string cert_file;
  std::string key_file;
  std::string client_ca_file;
  bool require_client_cert = false;
  int min_tls_version = 0;  // 0 = TLS 1.2 (exporter-toolkit's default), else 10..13
  int max_tls_version = 0;  // 0 = TLS 1.3, else 10..13
  std::string cipher_list;  // OpenSSL names of cipher_suites, ':'-joined; "" = library default
  std::string groups;       // OpenSSL names of curve_preferences, ':'-joined; "" = default
  bool prefer_server_cipher_suites = true;
  std::map<std::string, std::string> users;  // user → bcrypt hash
  std::map<std::string, std::string> headers;

  bool tls() const { return !cert_file.empty(); }
};

// Relative paths in the file are resolved against the file's directory.
Result<WebConfig> LoadWebConfig(const std::string& path);

// The OpenSSL name of a Go crypto/tls cipher suite name (tls.CipherSuites() and
// tls.InsecureCipherSuites(), TLS 1.0-1.2); "" when Go has no such suite. `tls13` is set for
// Go's TLS 1.3 suite names (valid, but not configurable in Go: ignored).
std::string_view OpenSslCipherName(std::string_view go_name, bool* tls13 = nullptr);

// Basic auth as exporter-toolkit checks it, with three differences that close timing and
// parsing holes: a password holding a NUL is refused (crypt(3) would see only its prefix); an
// unknown user is checked against a dummy hash of the configured users' highest bcrypt cost (not
// a fixed cost 10), so its answer takes as long as a real user's; a verified pair is cached.
class BasicAuth {
 public:
  explicit BasicAuth(std::map<std::string, std::string> users);
  bool enabled() const { return !users_.empty(); }
  // `authorization` is the Authorization header value ("Basic <base64>").
  bool Check(const std::string& authorization);
  // What an unknown user is checked against: "$2b$<cost>$..." of a fixed password, made at
  // construction with a random salt ("" without users).
  const std::string& dummy_hash() const { return dummy_; }

 private:
  std::map<std::string, std::string> users_;
  std::string dummy_;
  std::mutex mu_;
  std::set<std::string> verified_;  // SHA-256 of user, hash and password
};

}  // namespace gpulet::metrics
