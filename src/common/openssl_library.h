// OpenSSL, loaded when it is first needed instead of linked: by the exporter's web config (TLS or
// basic auth) and by the Kubernetes API client (k8s/http.h) for an https server. Most node agents
// serve plain HTTP and never talk to the API server, and libcrypto (let alone libssl) mapped into
// every gpulet process costs resident memory even unused (docs/benchmarks.md, "Footprint"). Types
// and constants still come from the OpenSSL headers; only the calls go through these tables.
// Nothing in gpulet calls OpenSSL directly: the binary has no NEEDED entry for libcrypto or libssl
// (tests/deploy/image_test.cc checks what it maps).
//
// Two levels, one loader: basic auth needs libcrypto only (SHA-256, base64, constant-time
// compare); TLS loads libssl on top of it.
#pragma once

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/pem.h>

#include <string>
#include <string_view>

namespace gpulet {

// libcrypto.so.3.
struct LibCrypto {
  decltype(&::EVP_Digest) evp_digest;
  decltype(&::EVP_sha256) evp_sha256;
  decltype(&::EVP_DecodeBlock) evp_decode_block;
  decltype(&::CRYPTO_memcmp) crypto_memcmp;
  decltype(&::ERR_clear_error) err_clear_error;
  // The API client's TLS: PEM certificates and keys from memory, its errors in words.
  decltype(&::ERR_get_error) err_get_error;
  decltype(&::ERR_error_string_n) err_error_string_n;
  decltype(&::BIO_new_mem_buf) bio_new_mem_buf;
  decltype(&::BIO_free) bio_free;
  decltype(&::PEM_read_bio_X509) pem_read_bio_x509;
  decltype(&::PEM_read_bio_PrivateKey) pem_read_bio_private_key;
  decltype(&::X509_free) x509_free;
  decltype(&::EVP_PKEY_free) evp_pkey_free;
  decltype(&::X509_STORE_add_cert) x509_store_add_cert;
  decltype(&::X509_verify_cert_error_string) x509_verify_cert_error_string;
  decltype(&::X509_VERIFY_PARAM_set1_ip_asc) x509_verify_param_set1_ip_asc;
};

// libssl.so.3.
struct LibSsl {
  decltype(&::TLS_server_method) tls_server_method;
  decltype(&::SSL_CTX_new) ctx_new;
  decltype(&::SSL_CTX_free) ctx_free;
  decltype(&::SSL_CTX_ctrl) ctx_ctrl;
  decltype(&::SSL_CTX_use_certificate_chain_file) ctx_use_certificate_chain_file;
  decltype(&::SSL_CTX_use_PrivateKey_file) ctx_use_private_key_file;
  decltype(&::SSL_CTX_check_private_key) ctx_check_private_key;
  decltype(&::SSL_CTX_load_verify_locations) ctx_load_verify_locations;
  decltype(&::SSL_CTX_set_client_CA_list) ctx_set_client_ca_list;
  decltype(&::SSL_load_client_CA_file) load_client_ca_file;
  decltype(&::SSL_CTX_set_verify) ctx_set_verify;
  decltype(&::SSL_new) ssl_new;
  decltype(&::SSL_set_fd) set_fd;
  decltype(&::SSL_free) ssl_free;
  decltype(&::SSL_accept) accept;
  decltype(&::SSL_get_error) get_error;
  decltype(&::SSL_read) read;
  decltype(&::SSL_write) write;
  decltype(&::SSL_shutdown) shutdown;
  // The API client (k8s/http.cc).
  decltype(&::TLS_client_method) tls_client_method;
  decltype(&::SSL_CTX_set_options) ctx_set_options;
  decltype(&::SSL_CTX_get_cert_store) ctx_get_cert_store;
  decltype(&::SSL_CTX_set_default_verify_paths) ctx_set_default_verify_paths;
  decltype(&::SSL_CTX_use_certificate) ctx_use_certificate;
  decltype(&::SSL_CTX_use_PrivateKey) ctx_use_private_key;
  decltype(&::SSL_ctrl) ssl_ctrl;
  decltype(&::SSL_set1_host) set1_host;
  decltype(&::SSL_get0_param) get0_param;
  decltype(&::SSL_get_verify_result) get_verify_result;
  decltype(&::SSL_connect) connect;
  decltype(&::SSL_get1_session) get1_session;
  decltype(&::SSL_set_session) set_session;
  decltype(&::SSL_SESSION_free) session_free;
  decltype(&::SSL_SESSION_is_resumable) session_is_resumable;
  decltype(&::SSL_session_reused) session_reused;
};

// The tables, each loaded once, thread-safely, on first call, and kept for the program. Null when
// the library or one of its functions cannot be found; then `error` (when given) says why, naming
// the library and its Debian package. Ssl() loads libcrypto first (libssl needs it anyway).
const LibCrypto* Crypto(std::string* error = nullptr);
const LibSsl* Ssl(std::string* error = nullptr);

// SHA-256 of `data` (32 bytes) through the table.
std::string Sha256(const LibCrypto& crypto, std::string_view data);

}  // namespace gpulet
