#include "metrics/openssl_library.h"

#include <dlfcn.h>

#include <type_traits>

namespace gpulet::metrics {
namespace {

template <typename Table>
struct Loaded {
  Table api{};
  const Table* table = nullptr;
  std::string error;
};

// Opens `soname` (both OpenSSL libraries come in Debian's libssl3) and fills l->api through
// `fill(resolve)`; l->table is set only when the library and every function were found.
template <typename Table, typename Fill>
Loaded<Table>* Load(const char* soname, Fill fill) {
  auto* l = new Loaded<Table>();  // lives for the program, as the library does
  void* lib = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    l->error = std::string("cannot load ") + soname +
               " (Debian package libssl3): " + (why != nullptr ? why : "unknown error");
    return l;
  }
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

}  // namespace

const LibCrypto* Crypto(std::string* error) {
  static const Loaded<LibCrypto>* loaded =
      Load<LibCrypto>("libcrypto.so.3", [](LibCrypto& a, auto& resolve) {
        resolve(a.evp_digest, "EVP_Digest");
        resolve(a.evp_sha256, "EVP_sha256");
        resolve(a.evp_decode_block, "EVP_DecodeBlock");
        resolve(a.crypto_memcmp, "CRYPTO_memcmp");
        resolve(a.err_clear_error, "ERR_clear_error");
      });
  return TableOrError(*loaded, error);
}

const LibSsl* Ssl(std::string* error) {
  if (Crypto(error) == nullptr) return nullptr;
  static const Loaded<LibSsl>* loaded = Load<LibSsl>("libssl.so.3", [](LibSsl& a, auto& resolve) {
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
  });
  return TableOrError(*loaded, error);
}

std::string Sha256(const LibCrypto& crypto, std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  crypto.evp_digest(data.data(), data.size(), md, &len, crypto.evp_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(md), len);
}

}  // namespace gpulet::metrics
