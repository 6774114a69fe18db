#include "metrics/web_config.h"

#include <crypt.h>
#include <yaml-cpp/yaml.h>

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

}  // namespace

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
      if (const YAML::Node v = tls["min_version"]; v) {
        const std::string s = v.as<std::string>();
        if (s == "TLS10")
          cfg.min_tls_version = 10;
        else if (s == "TLS11")
          cfg.min_tls_version = 11;
        else if (s == "TLS12")
          cfg.min_tls_version = 12;
        else if (s == "TLS13")
          cfg.min_tls_version = 13;
        else {
          return Status(ErrorCode::kInvalidInput, Where(path, v, "tls_server_config.min_version") +
                                                      ": want TLS10, TLS11, TLS12 or TLS13, got " +
                                                      s);
        }
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

bool BasicAuth::Check(const std::string& authorization) {
  static const std::string kPrefix = "Basic ";
  if (authorization.compare(0, kPrefix.size(), kPrefix) != 0) return false;
  const LibCrypto* crypto = Crypto();
  if (crypto == nullptr) return false;  // no libcrypto: nobody is let in
  std::string decoded;
  if (!DecodeBase64(*crypto, authorization.substr(kPrefix.size()), &decoded)) return false;
  const size_t colon = decoded.find(':');
  if (colon == std::string::npos) return false;
  const std::string user = decoded.substr(0, colon);
  const std::string password = decoded.substr(colon + 1);
  auto it = users_.find(user);
  // An unknown user still pays one bcrypt, so response time does not reveal which users exist.
  static const std::string kDummy = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi";
  const std::string& hash = it == users_.end() ? kDummy : it->second;
  const std::string key = Sha256(*crypto, user + '\0' + hash + '\0' + password);
  {
    std::lock_guard lock(mu_);
    if (it != users_.end() && verified_.count(key)) return true;
  }
  const bool ok = BcryptMatches(*crypto, password, hash) && it != users_.end();
  if (ok) {
    std::lock_guard lock(mu_);
    if (verified_.size() >= 256) verified_.clear();  // bounded
    verified_.insert(key);
  }
  return ok;
}

}  // namespace gpulet::metrics
