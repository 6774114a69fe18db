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

}  // namespace
}  // namespace gpulet::metrics
