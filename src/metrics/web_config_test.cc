#include "metrics/web_config.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

namespace gpulet::metrics {
namespace {

// bcrypt ($2y$, cost 4) of "s3cret", made with crypt(3).
constexpr char kHash[] = "$2y$04$MiDM8uS.jofjwf1Go9KEoeCzCbjf0ak.3PVmsjmmOOk8OYgDL7V8O";

std::string Basic(const std::string& user_pass) {
  std::string out(4 * ((user_pass.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(user_pass.data()),
                          static_cast<int>(user_pass.size()));
  out.resize(n);
  return "Basic " + out;
}

class WebConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpulet-webcfg-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& text) {
    const std::string p = dir_ + "/web.yml";
    std::ofstream(p) << text;
    return p;
  }
  std::string dir_;
};

TEST_F(WebConfigTest, ParsesTlsAndUsersWithRelativePaths) {
  auto cfg = LoadWebConfig(Write(std::string("tls_server_config:\n  cert_file: s.crt\n  key_file: /k/s.key\n"
                                             "  min_version: TLS12\nbasic_auth_users:\n  alice: ") +
                                 kHash + "\nhttp_server_config:\n  headers:\n    X-Frame-Options: deny\n"));
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  EXPECT_EQ(cfg->cert_file, dir_ + "/s.crt");
  EXPECT_EQ(cfg->key_file, "/k/s.key");
  EXPECT_EQ(cfg->min_tls_version, 12);
  EXPECT_TRUE(cfg->tls());
  EXPECT_EQ(cfg->users.at("alice"), kHash);
  EXPECT_EQ(cfg->headers.at("X-Frame-Options"), "deny");
}

TEST_F(WebConfigTest, ErrorsNameFileLineAndField) {
  struct Case {
    const char* text;
    const char* want;
  } cases[] = {
      {"tls_server_config:\n  cert_file: a\n  key_file: b\n  bogus: 1\n", "web.yml:4: tls_server_config.bogus: unknown key"},
      {"basic_auth_users:\n  bob: plaintext\n", "web.yml:2: basic_auth_users.bob: want a bcrypt hash"},
      {"tls_server_config:\n  cert_file: a\n", "cert_file and key_file are required"},
      {"tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS99\n", "web.yml:4: tls_server_config.min_version"},
      {"tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequestClientCert\n", "not supported"},
      {"other: 1\n", "web.yml:1: other: unknown key"},
  };
  for (const Case& c : cases) {
    auto cfg = LoadWebConfig(Write(c.text));
    ASSERT_FALSE(cfg.ok()) << c.text;
    EXPECT_NE(cfg.status().message().find(c.want), std::string::npos) << cfg.status().message();
  }
  EXPECT_EQ(LoadWebConfig(dir_ + "/missing.yml").status().code(), ErrorCode::kNotFound);
}

TEST(BasicAuth, ChecksBcryptThroughCrypt3) {
  BasicAuth auth(std::map<std::string, std::string>{{"alice", kHash}});
  EXPECT_TRUE(auth.enabled());
  EXPECT_TRUE(auth.Check(Basic("alice:s3cret")));
  EXPECT_TRUE(auth.Check(Basic("alice:s3cret")));  // cached path
  EXPECT_FALSE(auth.Check(Basic("alice:wrong")));
  EXPECT_FALSE(auth.Check(Basic("mallory:s3cret")));
  EXPECT_FALSE(auth.Check("Bearer x"));
  EXPECT_FALSE(auth.Check("Basic !!!"));
  EXPECT_FALSE(auth.Check(""));
  EXPECT_FALSE(BasicAuth(std::map<std::string, std::string>{}).enabled());
}

// Issue 35, item 3: the four TLS keys exporter-toolkit applies are parsed into what OpenSSL
// takes; names exporter-toolkit refuses are errors naming file:line.
TEST_F(WebConfigTest, TlsVersionsSuitesAndCurvesAsExporterToolkit) {
  auto cfg = LoadWebConfig(Write(
      "tls_server_config:\n  cert_file: s.crt\n  key_file: s.key\n  min_version: TLS11\n"
      "  max_version: TLS12\n  cipher_suites:\n    - TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256\n"
      "    - TLS_AES_128_GCM_SHA256\n    - TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256\n"
      "  curve_preferences: [CurveP521, X25519]\n  prefer_server_cipher_suites: false\n"));
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  EXPECT_EQ(cfg->min_tls_version, 11);
  EXPECT_EQ(cfg->max_tls_version, 12);
  // The TLS 1.3 suite is accepted and left out (Go does not configure TLS 1.3 suites).
  EXPECT_EQ(cfg->cipher_list, "ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-CHACHA20-POLY1305");
  EXPECT_EQ(cfg->groups, "P-521:X25519");
  EXPECT_FALSE(cfg->prefer_server_cipher_suites);
  EXPECT_TRUE(LoadWebConfig(Write("tls_server_config:\n  cert_file: a\n  key_file: b\n"))
                  ->prefer_server_cipher_suites);  // exporter-toolkit's default

  struct Case {
    const char* text;
    const char* want;
  } cases[] = {
      {"tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites:\n    - TLS_FOO\n",
       "web.yml:5: tls_server_config.cipher_suites[0]: unknown cipher suite TLS_FOO"},
      {"tls_server_config:\n  cert_file: a\n  key_file: b\n  curve_preferences: [P256]\n",
       "web.yml:4: tls_server_config.curve_preferences[0]: unknown curve P256"},
      {"tls_server_config:\n  cert_file: a\n  key_file: b\n  max_version: TLS14\n",
       "web.yml:4: tls_server_config.max_version: want TLS10"},
      {"tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS13\n"
       "  max_version: TLS12\n",
       "web.yml:5: tls_server_config.max_version: lower than min_version"},
      {"tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: x\n",
       "web.yml:4: tls_server_config.cipher_suites: want a list"},
  };
  for (const Case& c : cases) {
    auto bad = LoadWebConfig(Write(c.text));
    ASSERT_FALSE(bad.ok()) << c.text;
    EXPECT_NE(bad.status().message().find(c.want), std::string::npos) << bad.status().message();
  }
}

// Issue 35, item 8: crypt(3) stops at a NUL; the password does not.
TEST(BasicAuth, PasswordWithNulIsRefused) {
  BasicAuth auth(std::map<std::string, std::string>{{"alice", kHash}});
  EXPECT_FALSE(auth.Check(Basic(std::string("alice:s3cret\0junk", 17))));
  EXPECT_FALSE(auth.Check(Basic(std::string("alice:s3cret\0", 13))));
  EXPECT_TRUE(auth.Check(Basic("alice:s3cret")));
  // Not from the cache either.
  EXPECT_FALSE(auth.Check(Basic(std::string("alice:s3cret\0junk", 17))));
}

// Issue 35, item 8: an unknown user pays a bcrypt of the configured cost (it used to be a fixed
// cost 10 against cost-4 users, and the other way round: users enumerable by timing).
TEST(BasicAuth, UnknownUsersAreCheckedAtTheConfiguredCost) {
  BasicAuth cheap(std::map<std::string, std::string>{{"alice", kHash}});
  EXPECT_EQ(cheap.dummy_hash().substr(0, 7), "$2b$04$");
  const std::string cost6 = "$2y$06$MiDM8uS.jofjwf1Go9KEoeCzCbjf0ak.3PVmsjmmOOk8OYgDL7V8O";
  BasicAuth mixed(std::map<std::string, std::string>{{"alice", kHash}, {"bob", cost6}});
  EXPECT_EQ(mixed.dummy_hash().substr(0, 7), "$2b$06$");  // the highest
  EXPECT_EQ(mixed.dummy_hash().size(), 60u);
  EXPECT_FALSE(mixed.Check(Basic("mallory:s3cret")));
}

}  // namespace
}  // namespace gpulet::metrics
