#include "common/openssl_library.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace gpulet {
namespace {

std::string Hex(const std::string& bytes) {
  std::string out;
  char b[3];
  for (unsigned char c : bytes) {
    std::snprintf(b, sizeof b, "%02x", c);
    out += b;
  }
  return out;
}

TEST(OpenSslLibrary, LoadsLibcryptoAndHashesThroughTheTable) {
  std::string error = "untouched";
  const LibCrypto* crypto = Crypto(&error);
  ASSERT_NE(crypto, nullptr) << error;
  EXPECT_EQ(error, "untouched");  // set only on failure
  EXPECT_EQ(crypto, Crypto());    // loaded once
  // FIPS 180-2, appendix B.1.
  EXPECT_EQ(Hex(Sha256(*crypto, "abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256(*crypto, std::string("a\0b", 3)).size(), 32u);
  EXPECT_NE(Sha256(*crypto, std::string("a\0b", 3)), Sha256(*crypto, "a"));  // not NUL-terminated

  unsigned char out[8] = {};
  const char in[] = "YWxpY2U6";  // "alice:"
  EXPECT_EQ(crypto->evp_decode_block(out, reinterpret_cast<const unsigned char*>(in), 8), 6);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(out), 6), "alice:");
  EXPECT_EQ(crypto->crypto_memcmp("abcd", "abcd", 4), 0);
  EXPECT_NE(crypto->crypto_memcmp("abcd", "abce", 4), 0);
}

TEST(OpenSslLibrary, LoadsLibsslOnTopOfLibcrypto) {
  std::string error;
  const LibSsl* ssl = Ssl(&error);
  ASSERT_NE(ssl, nullptr) << error;
  EXPECT_TRUE(error.empty()) << error;
  EXPECT_EQ(ssl, Ssl());
  SSL_CTX* ctx = ssl->ctx_new(ssl->tls_server_method());
  ASSERT_NE(ctx, nullptr);
  ssl->ctx_free(ctx);
}

}  // namespace
}  // namespace gpulet
