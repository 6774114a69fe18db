#include "common/openssl_library.h"

#include <dlfcn.h>

#include <type_traits>
#include <utility>

namespace gpulet {
namespace {

template <typename Table>
struct Loaded {
  Table api{};
  const Table* table = nullptr;
  std::string error;
};

template <typename Table>
const Loaded<Table>* Failed(std::string error) {
  auto* l = new Loaded<Table>();  // lives for the program, as a loaded table does
  l->error = std::move(error);
  return l;
}

// Opens `soname` (both OpenSSL libraries come in Debian's libssl3) and fills the table through
// `fill(table, resolve)`; the table is usable only when the library and every function were found.
template <typename Table, typename Fill>
const Loaded<Table>* Load(const char* soname, Fill fill) {
  void* lib = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    return Failed<Table>(std::string("cannot load ") + soname +
                         " (Debian package libssl3): " + (why != nullptr ? why : "unknown error"));
  }
  auto* l = new Loaded<Table>();  // lives for the program, as the library does
  auto resolve = [&](auto& fn, const char* name) {
    void* sym = dlsym(lib, name);
    if (sym == nullptr && l->error.empty()) l->error = std::string(soname) + " has no " + name;
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(sym);
  };
  fill(l->api, resolve);
  if (l->error.empty()) l->table = &l->api;
  return l;
}

template <typename Table>
const Table* TableOrError(const Loaded<Table>& l, std::string* error) {
  if (l.table == nullptr && error != nullptr) *error = l.error;
  return l.table;
}

void FillCrypto(LibCrypto& a, auto& resolve) {
  resolve(a.evp_digest, "EVP_Digest");
  resolve(a.evp_sha256, "EVP_sha256");
  resolve(a.evp_decode_block, "EVP_DecodeBlock");
  resolve(a.crypto_memcmp, "CRYPTO_memcmp");
  resolve(a.err_clear_error, "ERR_clear_error");
  resolve(a.err_get_error, "ERR_get_error");
  resolve(a.err_error_string_n, "ERR_error_string_n");
  resolve(a.bio_new_mem_buf, "BIO_new_mem_buf");
  resolve(a.bio_free, "BIO_free");
  resolve(a.pem_read_bio_x509, "PEM_read_bio_X509");
  resolve(a.pem_read_bio_private_key, "PEM_read_bio_PrivateKey");
  resolve(a.x509_free, "X509_free");
  resolve(a.evp_pkey_free, "EVP_PKEY_free");
  resolve(a.x509_store_add_cert, "X509_STORE_add_cert");
  resolve(a.x509_verify_cert_error_string, "X509_verify_cert_error_string");
  resolve(a.x509_verify_param_set1_ip_asc, "X509_VERIFY_PARAM_set1_ip_asc");
}

void FillSsl(LibSsl& a, auto& resolve) {
  resolve(a.tls_server_method, "TLS_server_method");
  resolve(a.ctx_new, "SSL_CTX_new");
  resolve(a.ctx_free, "SSL_CTX_free");
  resolve(a.ctx_ctrl, "SSL_CTX_ctrl");
  resolve(a.ctx_use_certificate_chain_file, "SSL_CTX_use_certificate_chain_file");
  resolve(a.ctx_use_private_key_file, "SSL_CTX_use_PrivateKey_file");
  resolve(a.ctx_check_private_key, "SSL_CTX_check_private_key");
  resolve(a.ctx_load_verify_locations, "SSL_CTX_load_verify_locations");
  resolve(a.ctx_set_client_ca_list, "SSL_CTX_set_client_CA_list");
  resolve(a.load_client_ca_file, "SSL_load_client_CA_file");
  resolve(a.ctx_set_verify, "SSL_CTX_set_verify");
  resolve(a.ssl_new, "SSL_new");
  resolve(a.set_fd, "SSL_set_fd");
  resolve(a.ssl_free, "SSL_free");
  resolve(a.accept, "SSL_accept");
  resolve(a.get_error, "SSL_get_error");
  resolve(a.read, "SSL_read");
  resolve(a.write, "SSL_write");
  resolve(a.shutdown, "SSL_shutdown");
  resolve(a.tls_client_method, "TLS_client_method");
  resolve(a.ctx_set_options, "SSL_CTX_set_options");
  resolve(a.ctx_get_cert_store, "SSL_CTX_get_cert_store");
  resolve(a.ctx_set_default_verify_paths, "SSL_CTX_set_default_verify_paths");
  resolve(a.ctx_use_certificate, "SSL_CTX_use_certificate");
  resolve(a.ctx_use_private_key, "SSL_CTX_use_PrivateKey");
  resolve(a.ssl_ctrl, "SSL_ctrl");
  resolve(a.set1_host, "SSL_set1_host");
  resolve(a.get0_param, "SSL_get0_param");
  resolve(a.get_verify_result, "SSL_get_verify_result");
  resolve(a.connect, "SSL_connect");
  resolve(a.get1_session, "SSL_get1_session");
  resolve(a.set_session, "SSL_set_session");
  resolve(a.session_free, "SSL_SESSION_free");
  resolve(a.session_is_resumable, "SSL_SESSION_is_resumable");
  resolve(a.session_reused, "SSL_session_reused");
}

}  // namespace

const LibCrypto* Crypto(std::string* error) {
  static const Loaded<LibCrypto>* loaded =
      Load<LibCrypto>("libcrypto.so.3", [](LibCrypto& a, auto& r) { FillCrypto(a, r); });
  return TableOrError(*loaded, error);
}

const LibSsl* Ssl(std::string* error) {
  // libcrypto is checked inside the initialisation: one guard per call on the TLS I/O path.
  static const Loaded<LibSsl>* loaded = [] {
    std::string crypto_error;
    if (Crypto(&crypto_error) == nullptr) return Failed<LibSsl>(crypto_error);
    return Load<LibSsl>("libssl.so.3", [](LibSsl& a, auto& r) { FillSsl(a, r); });
  }();
  return TableOrError(*loaded, error);
}

std::string Sha256(const LibCrypto& crypto, std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  crypto.evp_digest(data.data(), data.size(), md, &len, crypto.evp_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(md), len);
}

}  // namespace gpulet
