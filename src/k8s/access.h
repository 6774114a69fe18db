// How to reach and authenticate to a Kubernetes API server: in cluster (the pod's service-account
// token and CA) or from a kubeconfig file. Only what gpulet's client uses is read: the server URL,
// the CA (file or inline data), a bearer token (inline or file), a client certificate and key (file
// or inline data), and insecure-skip-tls-verify.
#pragma once

#include <string>

#include "common/status.h"

namespace gpulet::k8s {

struct ClusterAccess {
  std::string server;      // "https://10.0.0.1:443", no trailing slash
  std::string ca_file;     // PEM file of the CA that signed the server's certificate
  std::string ca_data;     // or the PEM itself
  std::string token;       // bearer token
  std::string token_file;  // or a file holding it, re-read for every request (tokens rotate)
  std::string client_cert_file, client_cert_data;  // PEM
  std::string client_key_file, client_key_data;    // PEM
  bool insecure_skip_tls_verify = false;
};

inline constexpr const char* kServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount";

// In-cluster access: server https://HOST:PORT (IPv6 hosts bracketed), CA `<sa_dir>/ca.crt`, token
// file `<sa_dir>/token`. kNotFound when host is empty (not in a pod) or the token file is missing.
Result<ClusterAccess> InClusterAccess(const std::string& sa_dir, const std::string& host,
                                      const std::string& port);

// The same from KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT and kServiceAccountDir.
Result<ClusterAccess> InClusterAccessFromEnvironment();

// Reads the kubeconfig's `context` (empty: its current-context). Relative file paths in it are
// resolved against the kubeconfig's directory, *-data fields are base64. Errors: kNotFound (file
// missing), kInvalidInput as "FILE:LINE: FIELD: problem".
Result<ClusterAccess> LoadKubeconfig(const std::string& path, const std::string& context = "");

// `--kubeconfig FILE` when given, else in-cluster access (the pod's service account).
Result<ClusterAccess> ResolveClusterAccess(const std::string& kubeconfig);

// Decodes standard base64 (whitespace ignored); nullopt-like failure as kInvalidInput.
Result<std::string> DecodeBase64(const std::string& text);

}  // namespace gpulet::k8s
