#include "metrics/web_config.h"

#include <crypt.h>
#include <yaml-cpp/yaml.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <memory>

#include "common/openssl_library.h"

namespace gpulet::metrics {
namespace {

std::string Where(const std::string& path, const YAML::Node& n, const std::string& field) {
  return path + ":" + std::to_string(n.Mark().line + 1) + ": " + field;
}

std::string Resolve(const std::string& base_dir, const std::string& p) {
  if (p.empty() || p.front() == '/') return p;
  return (std::filesystem::path(base_dir) / p).string();
}

Status CheckKeys(const std::string& path, const YAML::Node& map, const std::string& prefix,
                 std::initializer_list<const char*> allowed) {
  if (!map.IsMap())
    return Status(ErrorCode::kInvalidInput, Where(path, map, prefix) + ": want a mapping");
  for (const auto& kv : map) {
    const std::string key = kv.first.as<std::string>();
    bool ok = false;
    for (const char* a : allowed) ok = ok || key == a;
    if (!ok) {
      return Status(
          ErrorCode::kInvalidInput,
          Where(path, kv.first, prefix.empty() ? key : prefix + "." + key) + ": unknown key");
    }
  }
  return Status::Ok();
}

// libcrypto's calls go through the lazily loaded table (common/openssl_library.h);
// MetricsServer::Start loads it, with an error naming the web config, before serving basic auth.
bool DecodeBase64(const LibCrypto& crypto, const std::string& in, std::string* out) {
  if (in.empty() || in.size() % 4 != 0 || in.size() > 4096) return false;
  std::string buf(in.size() / 4 * 3, '\0');
  int n = crypto.evp_decode_block(reinterpret_cast<unsigned char*>(buf.data()),
                                  reinterpret_cast<const unsigned char*>(in.data()),
                                  static_cast<int>(in.size()));
  if (n < 0) return false;
  size_t pad = 0;
  if (in.back() == '=') ++pad;
  if (in.size() > 1 && in[in.size() - 2] == '=') ++pad;
  buf.resize(static_cast<size_t>(n) - pad);
  *out = std::move(buf);
  return true;
}

bool BcryptMatches(const LibCrypto& crypto, const std::string& password, const std::string& hash) {
  auto data = std::make_unique<crypt_data>();  // large; thread-safe crypt_r needs its own
  const char* got = crypt_r(password.c_str(), hash.c_str(), data.get());
  if (got == nullptr || got[0] == '*') return false;
  const std::string computed = got;
  return computed.size() == hash.size() &&
         crypto.crypto_memcmp(computed.data(), hash.data(), hash.size()) == 0;
}

// exporter-toolkit's version names.
int TlsVersion(const std::string& s) {
  if (s == "TLS10") return 10;
  if (s == "TLS11") return 11;
  if (s == "TLS12") return 12;
  if (s == "TLS13") return 13;
  return 0;
}

// crypto/tls constant names (what exporter-toolkit's cipher_suites take) → OpenSSL names.
struct CipherName {
  std::string_view go;
  std::string_view openssl;
};
constexpr CipherName kCiphers[] = {
    {"TLS_RSA_WITH_RC4_128_SHA", "RC4-SHA"},
    {"TLS_RSA_WITH_3DES_EDE_CBC_SHA", "DES-CBC3-SHA"},
    {"TLS_RSA_WITH_AES_128_CBC_SHA", "AES128-SHA"},
    {"TLS_RSA_WITH_AES_256_CBC_SHA", "AES256-SHA"},
    {"TLS_RSA_WITH_AES_128_CBC_SHA256", "AES128-SHA256"},
    {"TLS_RSA_WITH_AES_128_GCM_SHA256", "AES128-GCM-SHA256"},
    {"TLS_RSA_WITH_AES_256_GCM_SHA384", "AES256-GCM-SHA384"},
    {"TLS_ECDHE_ECDSA_WITH_RC4_128_SHA", "ECDHE-ECDSA-RC4-SHA"},
    {"TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA", "ECDHE-ECDSA-AES128-SHA"},
    {"TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA", "ECDHE-ECDSA-AES256-SHA"},
    {"TLS_ECDHE_RSA_WITH_RC4_128_SHA", "ECDHE-RSA-RC4-SHA"},
    {"TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA", "ECDHE-RSA-DES-CBC3-SHA"},
    {"TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", "ECDHE-RSA-AES128-SHA"},
    {"TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA", "ECDHE-RSA-AES256-SHA"},
    {"TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256", "ECDHE-ECDSA-AES128-SHA256"},
    {"TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256", "ECDHE-RSA-AES128-SHA256"},
    {"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "ECDHE-RSA-AES128-GCM-SHA256"},
    {"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "ECDHE-ECDSA-AES128-GCM-SHA256"},
    {"TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", "ECDHE-RSA-AES256-GCM-SHA384"},
    {"TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", "ECDHE-ECDSA-AES256-GCM-SHA384"},
    {"TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256", "ECDHE-RSA-CHACHA20-POLY1305"},
    {"TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256", "ECDHE-ECDSA-CHACHA20-POLY1305"},
};
constexpr std::string_view kTls13Ciphers[] = {"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384",
                                              "TLS_CHACHA20_POLY1305_SHA256"};

// exporter-toolkit's curve names → OpenSSL group names.
std::string_view OpenSslGroupName(const std::string& go) {
  if (go == "CurveP256") return "P-256";
  if (go == "CurveP384") return "P-384";
  if (go == "CurveP521") return "P-521";
  if (go == "X25519") return "X25519";
  return "";
}

// A YAML sequence of names, each mapped by `map` ("" = unknown, an error naming file:line).
Status NameList(const std::string& path, const YAML::Node& list, const std::string& field,
                const char* what, auto map, std::string* out) {
  if (!list.IsSequence()) {
    return Status(ErrorCode::kInvalidInput, Where(path, list, field) + ": want a list");
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string name = list[i].as<std::string>();
    const std::string_view mapped = map(name, list[i]);
    if (mapped == "-") continue;  // valid, ignored
    if (mapped.empty()) {
      return Status(ErrorCode::kInvalidInput,
                    Where(path, list[i], field + "[" + std::to_string(i) + "]") + ": unknown " +
                        what + " " + name);
    }
    if (!out->empty()) *out += ':';
    *out += mapped;
  }
  return Status::Ok();
}

}  // namespace

std::string_view OpenSslCipherName(std::string_view go_name, bool* tls13) {
  if (tls13) *tls13 = false;
  for (const CipherName& c : kCiphers) {
    if (c.go == go_name) return c.openssl;
  }
  for (std::string_view t : kTls13Ciphers) {
    if (t == go_name) {
      if (tls13) *tls13 = true;
      return t;
    }
  }
  return "";
}

Result<WebConfig> LoadWebConfig(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return Status(ErrorCode::kNotFound, "cannot read web config file " + path);
  } catch (const YAML::Exception& e) {
    return Status(ErrorCode::kInvalidInput,
                  path + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  WebConfig cfg;
  if (root.IsNull()) return cfg;
  const std::string dir = std::filesystem::path(path).parent_path().string();
  try {
    if (Status s = CheckKeys(path, root, "",
                             {"tls_server_config", "basic_auth_users", "http_server_config"});
        !s.ok()) {
      return s;
    }
    if (const YAML::Node tls = root["tls_server_config"]; tls && !tls.IsNull()) {
      if (Status s = CheckKeys(
              path, tls, "tls_server_config",
              {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version",
               "max_version", "cipher_suites", "prefer_server_cipher_suites", "curve_preferences"});
          !s.ok()) {
        return s;
      }
      cfg.cert_file = Resolve(dir, tls["cert_file"].as<std::string>(""));
      cfg.key_file = Resolve(dir, tls["key_file"].as<std::string>(""));
      cfg.client_ca_file = Resolve(dir, tls["client_ca_file"].as<std::string>(""));
      if (cfg.cert_file.empty() || cfg.key_file.empty()) {
        return Status(ErrorCode::kInvalidInput, Where(path, tls, "tls_server_config") +
                                                    ": cert_file and key_file are required");
      }
      const std::string auth = tls["client_auth_type"].as<std::string>("NoClientCert");
      if (auth == "RequireAndVerifyClientCert") {
        cfg.require_client_cert = true;
        if (cfg.client_ca_file.empty()) {
          return Status(ErrorCode::kInvalidInput,
                        Where(path, tls["client_auth_type"], "tls_server_config.client_auth_type") +
                            ": RequireAndVerifyClientCert needs client_ca_file");
        }
      } else if (auth != "NoClientCert") {
        return Status(ErrorCode::kInvalidInput,
                      Where(path, tls["client_auth_type"], "tls_server_config.client_auth_type") +
                          ": \"" + auth +
                          "\" not supported (NoClientCert or RequireAndVerifyClientCert)");
      }
      for (const char* key : {"min_version", "max_version"}) {
        const YAML::Node v = tls[key];
        if (!v) continue;
        const std::string s = v.as<std::string>();
        const int version = TlsVersion(s);
        if (version == 0) {
          return Status(ErrorCode::kInvalidInput,
                        Where(path, v, std::string("tls_server_config.") + key) +
                            ": want TLS10, TLS11, TLS12 or TLS13, got " + s);
        }
        (std::string_view(key) == "min_version" ? cfg.min_tls_version : cfg.max_tls_version) =
            version;
      }
      if (cfg.min_tls_version && cfg.max_tls_version && cfg.max_tls_version < cfg.min_tls_version) {
        return Status(ErrorCode::kInvalidInput,
                      Where(path, tls["max_version"], "tls_server_config.max_version") +
                          ": lower than min_version");
      }
      if (const YAML::Node v = tls["cipher_suites"]; v && !v.IsNull()) {
        auto map = [&](const std::string& name, const YAML::Node& at) -> std::string_view {
          bool tls13 = false;
          const std::string_view o = OpenSslCipherName(name, &tls13);
          if (!tls13) return o;
          spdlog::warn(
              "event=web_config_ignored file={}:{} field=tls_server_config.cipher_suites "
              "value={} reason=\"TLS 1.3 suites are not configurable (as in Go)\"",
              path, at.Mark().line + 1, name);
          return "-";
        };
        if (Status s = NameList(path, v, "tls_server_config.cipher_suites", "cipher suite", map,
                                &cfg.cipher_list);
            !s.ok()) {
          return s;
        }
      }
      if (const YAML::Node v = tls["curve_preferences"]; v && !v.IsNull()) {
        auto map = [](const std::string& name, const YAML::Node&) {
          return OpenSslGroupName(name);
        };
        if (Status s = NameList(path, v, "tls_server_config.curve_preferences", "curve", map,
                                &cfg.groups);
            !s.ok()) {
          return s;
        }
      }
      if (const YAML::Node v = tls["prefer_server_cipher_suites"]; v && !v.IsNull()) {
        cfg.prefer_server_cipher_suites = v.as<bool>();
      }
    }
    if (const YAML::Node users = root["basic_auth_users"]; users && !users.IsNull()) {
      if (!users.IsMap()) {
        return Status(ErrorCode::kInvalidInput,
                      Where(path, users, "basic_auth_users") + ": want a mapping");
      }
      for (const auto& kv : users) {
        const std::string user = kv.first.as<std::string>();
        const std::string hash = kv.second.as<std::string>("");
        if (hash.rfind("$2", 0) != 0) {
          return Status(ErrorCode::kInvalidInput,
                        Where(path, kv.second, "basic_auth_users." + user) +
                            ": want a bcrypt hash ($2a$, $2b$ or $2y$)");
        }
        cfg.users[user] = hash;
      }
    }
    if (const YAML::Node http = root["http_server_config"]; http && !http.IsNull()) {
      if (Status s = CheckKeys(path, http, "http_server_config", {"headers", "http2"}); !s.ok())
        return s;
      if (const YAML::Node h = http["headers"]; h && h.IsMap()) {
        for (const auto& kv : h)
          cfg.headers[kv.first.as<std::string>()] = kv.second.as<std::string>();
      }
    }
  } catch (const YAML::Exception& e) {
    return Status(ErrorCode::kInvalidInput,
                  path + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  return cfg;
}

namespace {

// The cost field of a bcrypt hash ("$2y$10$..." → 10); 0 when there is none.
int BcryptCost(const std::string& hash) {
  if (hash.size() < 7 || hash[0] != '$' || hash[3] != '$' || hash[6] != '$') return 0;
  if (!std::isdigit(static_cast<unsigned char>(hash[4])) ||
      !std::isdigit(static_cast<unsigned char>(hash[5]))) {
    return 0;
  }
  return (hash[4] - '0') * 10 + (hash[5] - '0');
}

}  // namespace

BasicAuth::BasicAuth(std::map<std::string, std::string> users) : users_(std::move(users)) {
  if (users_.empty()) return;  // no basic auth: nothing is ever checked
  int cost = 4;
  for (const auto& [user, hash] : users_) cost = std::max(cost, BcryptCost(hash));
  // crypt_gensalt_rn draws its salt from the kernel; the password is never compared to anything.
  char salt[CRYPT_GENSALT_OUTPUT_SIZE];
  auto data = std::make_unique<crypt_data>();
  if (crypt_gensalt_rn("$2b$", static_cast<unsigned long>(cost), nullptr, 0, salt, sizeof salt)) {
    if (const char* h = crypt_r("gpulet-no-such-user", salt, data.get()); h && h[0] != '*') {
      dummy_ = h;
    }
  }
  // Not expected (libxcrypt always has bcrypt): the fixed cost-10 hash exporter-toolkit uses.
  if (dummy_.empty()) dummy_ = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi";
}

bool BasicAuth::Check(const std::string& authorization) {
  static const std::string kPrefix = "Basic ";
  if (users_.empty() || authorization.compare(0, kPrefix.size(), kPrefix) != 0) return false;
  const LibCrypto* crypto = Crypto();
  if (crypto == nullptr) return false;  // no libcrypto: nobody is let in
  std::string decoded;
  if (!DecodeBase64(*crypto, authorization.substr(kPrefix.size()), &decoded)) return false;
  const size_t colon = decoded.find(':');
  if (colon == std::string::npos) return false;
  const std::string user = decoded.substr(0, colon);
  const std::string password = decoded.substr(colon + 1);
  auto it = users_.find(user);
  // An unknown user pays one bcrypt of the same cost, so response time does not reveal which
  // users exist.
  const std::string& hash = it == users_.end() ? dummy_ : it->second;
  // crypt(3) reads the password up to its first NUL: one holding a NUL is a different password
  // from the prefix it would be checked as. It still pays the bcrypt (no shortcut to time).
  const bool whole = password.find('\0') == std::string::npos;
  const std::string key = Sha256(*crypto, user + '\0' + hash + '\0' + password);
  {
    std::lock_guard lock(mu_);
    if (whole && it != users_.end() && verified_.count(key)) return true;
  }
  const bool ok = BcryptMatches(*crypto, password, hash) && whole && it != users_.end();
  if (ok) {
    std::lock_guard lock(mu_);
    if (verified_.size() >= 256) verified_.clear();  // bounded
    verified_.insert(key);
  }
  return ok;
}

}  // namespace gpulet::metrics
