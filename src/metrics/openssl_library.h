// OpenSSL, loaded when a web config asks for TLS or basic auth instead of linked: most exporters
// and node agents serve plain HTTP, and libcrypto (let alone libssl) mapped into every gpulet
// process costs resident memory even unused (docs/benchmarks.md, "Footprint"). Types and
// constants still come from the OpenSSL headers; only the calls go through these tables, as
// k8s/curl_library.h does for libcurl. Nothing in gpulet calls OpenSSL directly: the binary has
// no NEEDED entry for libcrypto or libssl (tests/deploy/image_test.cc checks what it maps).
//
// Two levels, one loader: basic auth needs libcrypto only (SHA-256, base64, constant-time
// compare); TLS loads libssl on top of it.
#pragma once

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>

#include <string>
#include <string_view>

namespace gpulet::metrics {

// libcrypto.so.3.
struct LibCrypto {
  decltype(&::EVP_Digest) evp_digest;
  decltype(&::EVP_sha256) evp_sha256;
  decltype(&::EVP_DecodeBlock) evp_decode_block;
  decltype(&::CRYPTO_memcmp) crypto_memcmp;
  decltype(&::ERR_clear_error) err_clear_error;
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
};

// The tables, each loaded once, thread-safely, on first call, and kept for the program. Null when
// the library or one of its functions cannot be found; then `error` (when given) says why, naming
// the library and its Debian package. Ssl() loads libcrypto first (libssl needs it anyway).
const LibCrypto* Crypto(std::string* error = nullptr);
const LibSsl* Ssl(std::string* error = nullptr);

// SHA-256 of `data` (32 bytes) through the table.
std::string Sha256(const LibCrypto& crypto, std::string_view data);

}  // namespace gpulet::metrics
