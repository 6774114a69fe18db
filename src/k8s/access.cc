#include "k8s/access.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace gpulet::k8s {
namespace {

Status Invalid(const std::string& file, const YAML::Node& at, const std::string& field,
               const std::string& problem) {
  const int line = at.IsDefined() ? at.Mark().line + 1 : 0;
  return {ErrorCode::kInvalidInput,
          file + ":" + std::to_string(line) + ": " + field + ": " + problem};
}

// The entry of `list` (a sequence of {name, <kind>: {...}}) called `name`.
YAML::Node Entry(const YAML::Node& list, const std::string& name) {
  if (!list.IsSequence()) return YAML::Node(YAML::NodeType::Undefined);
  for (const YAML::Node& item : list) {
    if (item.IsMap() && item["name"] && item["name"].IsScalar() && item["name"].Scalar() == name) {
      return item;
    }
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

std::string Resolve(const std::filesystem::path& dir, const std::string& file) {
  if (file.empty() || std::filesystem::path(file).is_absolute()) return file;
  return (dir / file).string();
}

}  // namespace

Result<std::string> DecodeBase64(const std::string& text) {
  std::string out;
  unsigned buffer = 0;
  int bits = 0;
  int padding = 0;
  for (char c : text) {
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    int v;
    if (c >= 'A' && c <= 'Z')
      v = c - 'A';
    else if (c >= 'a' && c <= 'z')
      v = c - 'a' + 26;
    else if (c >= '0' && c <= '9')
      v = c - '0' + 52;
    else if (c == '+')
      v = 62;
    else if (c == '/')
      v = 63;
    else if (c == '=') {
      ++padding;
      continue;
    } else
      return Status(ErrorCode::kInvalidInput, "invalid base64 character");
    if (padding > 0) return Status(ErrorCode::kInvalidInput, "base64 data after padding");
    buffer = (buffer << 6) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((buffer >> bits) & 0xff));
    }
  }
  return out;
}

Result<ClusterAccess> InClusterAccess(const std::string& sa_dir, const std::string& host,
                                      const std::string& port) {
  if (host.empty()) {
    return Status(ErrorCode::kNotFound,
                  "not running in a pod (KUBERNETES_SERVICE_HOST is not set); pass --kubeconfig");
  }
  ClusterAccess a;
  const bool ipv6 = host.find(':') != std::string::npos;
  a.server = "https://" + (ipv6 ? "[" + host + "]" : host) + ":" + (port.empty() ? "443" : port);
  a.ca_file = sa_dir + "/ca.crt";
  a.token_file = sa_dir + "/token";
  if (!std::filesystem::exists(a.token_file)) {
    return Status(ErrorCode::kNotFound, "service account token " + a.token_file + " not found");
  }
  return a;
}

Result<ClusterAccess> InClusterAccessFromEnvironment() {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  return InClusterAccess(kServiceAccountDir, host ? host : "", port ? port : "");
}

Result<ClusterAccess> ResolveClusterAccess(const std::string& kubeconfig) {
  if (!kubeconfig.empty()) return LoadKubeconfig(kubeconfig);
  return InClusterAccessFromEnvironment();
}

Result<ClusterAccess> LoadKubeconfig(const std::string& path, const std::string& context) {
  std::ifstream in(path);
  if (!in) return Status(ErrorCode::kNotFound, "kubeconfig " + path + " not found or unreadable");
  std::stringstream ss;
  ss << in.rdbuf();
  YAML::Node root;
  try {
    root = YAML::Load(ss.str());
  } catch (const YAML::Exception& e) {
    return Status(ErrorCode::kInvalidInput,
                  path + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  if (!root.IsMap()) return Invalid(path, root, "(document)", "not a kubeconfig mapping");
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  try {
    std::string ctx_name = context;
    if (ctx_name.empty()) {
      if (!root["current-context"] || root["current-context"].Scalar().empty()) {
        return Invalid(path, root, "current-context", "not set and no --context given");
      }
      ctx_name = root["current-context"].Scalar();
    }
    YAML::Node ctx = Entry(root["contexts"], ctx_name);
    if (!ctx)
      return Invalid(path, root["contexts"], "contexts", "no context named \"" + ctx_name + "\"");
    YAML::Node c = ctx["context"];
    if (!c || !c.IsMap() || !c["cluster"]) {
      return Invalid(path, ctx, "contexts[" + ctx_name + "].context.cluster", "missing");
    }
    const std::string cluster_name = c["cluster"].Scalar();
    YAML::Node cluster = Entry(root["clusters"], cluster_name);
    if (!cluster || !cluster["cluster"].IsMap()) {
      return Invalid(path, c["cluster"], "contexts[" + ctx_name + "].context.cluster",
                     "no cluster named \"" + cluster_name + "\"");
    }
    ClusterAccess a;
    YAML::Node cl = cluster["cluster"];
    const std::string cfield = "clusters[" + cluster_name + "].cluster.";
    if (!cl["server"] || cl["server"].Scalar().empty())
      return Invalid(path, cl, cfield + "server", "missing");
    a.server = cl["server"].Scalar();
    while (!a.server.empty() && a.server.back() == '/') a.server.pop_back();
    if (a.server.rfind("https://", 0) != 0 && a.server.rfind("http://", 0) != 0) {
      return Invalid(path, cl["server"], cfield + "server", "must start with https:// or http://");
    }
    if (cl["certificate-authority"]) a.ca_file = Resolve(dir, cl["certificate-authority"].Scalar());
    if (cl["certificate-authority-data"]) {
      Result<std::string> d = DecodeBase64(cl["certificate-authority-data"].Scalar());
      if (!d.ok())
        return Invalid(path, cl["certificate-authority-data"],
                       cfield + "certificate-authority-data", d.status().message());
      a.ca_data = *d;
    }
    if (cl["insecure-skip-tls-verify"])
      a.insecure_skip_tls_verify = cl["insecure-skip-tls-verify"].as<bool>();
    // client-go refuses the pair (k8s.io/client-go/transport, TLSConfigFor), with these words.
    if (a.insecure_skip_tls_verify && (!a.ca_file.empty() || !a.ca_data.empty())) {
      return Invalid(path, cl["insecure-skip-tls-verify"], cfield + "insecure-skip-tls-verify",
                     "specifying a root certificates file with the insecure flag is not allowed");
    }

    if (c["user"]) {
      const std::string user_name = c["user"].Scalar();
      YAML::Node user = Entry(root["users"], user_name);
      if (!user) {
        return Invalid(path, c["user"], "contexts[" + ctx_name + "].context.user",
                       "no user named \"" + user_name + "\"");
      }
      YAML::Node u = user["user"];
      const std::string ufield = "users[" + user_name + "].user.";
      if (u && u.IsMap()) {
        if (u["token"]) a.token = u["token"].Scalar();
        if (u["tokenFile"]) a.token_file = Resolve(dir, u["tokenFile"].Scalar());
        if (u["client-certificate"])
          a.client_cert_file = Resolve(dir, u["client-certificate"].Scalar());
        if (u["client-key"]) a.client_key_file = Resolve(dir, u["client-key"].Scalar());
        for (const auto& [key, target] :
             {std::pair<const char*, std::string*>{"client-certificate-data", &a.client_cert_data},
              {"client-key-data", &a.client_key_data}}) {
          if (!u[key]) continue;
          Result<std::string> d = DecodeBase64(u[key].Scalar());
          if (!d.ok()) return Invalid(path, u[key], ufield + key, d.status().message());
          *target = *d;
        }
        if (u["exec"] || u["auth-provider"]) {
          return Invalid(path, u["exec"] ? u["exec"] : u["auth-provider"],
                         ufield + (u["exec"] ? "exec" : "auth-provider"),
                         "credential plugins are not supported; use a token or client certificate");
        }
      }
    }
    return a;
  } catch (const YAML::Exception& e) {
    return Status(ErrorCode::kInvalidInput,
                  path + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
}

}  // namespace gpulet::k8s
