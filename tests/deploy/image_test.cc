// deploy/Dockerfile, checked the way `docker build` would resolve it (no Docker on the test
// machines): every COPY source exists where its stage puts it (the build context, filtered by
// .dockerignore, or the build stage's output tree, which is `make build BUILD=/build`, i.e. our
// build directory), every shared library the binary needs comes from a package the runtime stage
// installs, and the shipped files carry no path of the machine that built them.
#include <fnmatch.h>
#include <unistd.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "../cli/run_command.h"

namespace gpulet::testing {
namespace {

namespace fs = std::filesystem;
const std::string kSource = GPULET_SOURCE_DIR;
const std::string kBuild = GPULET_BUILD_DIR;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The Dockerfile as instructions: continuation lines joined, comments dropped.
struct Instruction {
  std::string op;
  std::vector<std::string> words;
  std::string text;
  int line = 0;
};

std::vector<Instruction> ParseDockerfile(const std::string& text) {
  std::vector<Instruction> out;
  std::istringstream in(text);
  std::string line, joined;
  int n = 0, start = 0;
  while (std::getline(in, line)) {
    ++n;
    if (joined.empty() && (line.empty() || line[0] == '#')) continue;
    if (joined.empty()) start = n;
    if (!line.empty() && line.back() == '\\') {
      joined += line.substr(0, line.size() - 1) + " ";
      continue;
    }
    joined += line;
    Instruction ins;
    ins.text = joined;
    ins.line = start;
    std::istringstream words(joined);
    words >> ins.op;
    for (std::string w; words >> w;) ins.words.push_back(w);
    out.push_back(ins);
    joined.clear();
  }
  return out;
}

struct Stage {
  std::string name;
  std::string build_dir;  // where `make build BUILD=…` puts its output, when the stage runs it
  std::vector<std::string> packages;  // apt-get install arguments
};

std::vector<Stage> Stages(const std::vector<Instruction>& ins) {
  std::vector<Stage> stages;
  for (const Instruction& i : ins) {
    if (i.op == "FROM") {
      Stage s;
      if (i.words.size() >= 3 && (i.words[1] == "AS" || i.words[1] == "as")) s.name = i.words[2];
      stages.push_back(s);
      continue;
    }
    if (stages.empty() || i.op != "RUN") continue;
    std::smatch m;
    if (std::regex_search(i.text, m, std::regex(R"(make build BUILD=(\S+))"))) {
      stages.back().build_dir = m[1];
    }
    const size_t install = i.text.find("apt-get install");
    if (install != std::string::npos) {
      std::istringstream words(i.text.substr(install + 15));
      for (std::string w; words >> w;) {
        if (w == "&&" || w == ";") break;
        if (w[0] != '-') stages.back().packages.push_back(w);
      }
    }
  }
  return stages;
}

bool Ignored(const std::string& path) {
  std::istringstream in(ReadAll(kSource + "/.dockerignore"));
  for (std::string pat; std::getline(in, pat);) {
    if (pat.empty() || pat[0] == '#') continue;
    // A pattern excludes the path or any directory above it.
    std::string p = path;
    while (!p.empty()) {
      if (fnmatch(pat.c_str(), p.c_str(), 0) == 0) return true;
      const size_t slash = p.rfind('/');
      if (slash == std::string::npos) break;
      p = p.substr(0, slash);
    }
  }
  return false;
}

// The Debian package that owns a file (following a symbolic link); empty when none does.
std::string PackageOf(const std::string& path) {
  const CommandResult owner =
      RunCommand("dpkg -S " + path + " 2>/dev/null || dpkg -S $(readlink -f " + path + ")");
  if (owner.exit_code != 0) return "";
  return owner.output.substr(0, owner.output.find(':'));
}

// Libraries gpulet loads with dlopen rather than links (common/openssl_library.cc): libcrypto and
// libssl for an https API server (k8s/http.cc) and when a web config asks for TLS, libcrypto alone
// for basic auth.
constexpr const char* kDlopened[] = {"libcrypto.so.3", "libssl.so.3"};

class ImageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ins_ = ParseDockerfile(ReadAll(kSource + "/deploy/Dockerfile"));
    stages_ = Stages(ins_);
    ASSERT_GE(stages_.size(), 2u);
  }
  std::vector<Instruction> ins_;
  std::vector<Stage> stages_;
};

TEST_F(ImageTest, EveryCopySourceResolvesAsTheBuildWould) {
  int context_copies = 0, stage_copies = 0;
  for (const Instruction& i : ins_) {
    if (i.op != "COPY") continue;
    std::string from;
    std::vector<std::string> parts;
    for (const std::string& w : i.words) {
      if (w.rfind("--from=", 0) == 0) {
        from = w.substr(7);
      } else if (w.rfind("--", 0) != 0) {
        parts.push_back(w);
      }
    }
    ASSERT_GE(parts.size(), 2u) << "Dockerfile:" << i.line << ": " << i.text;
    parts.pop_back();  // destination
    for (std::string src : parts) {
      while (src.size() > 1 && src.back() == '/') src.pop_back();
      if (from.empty()) {
        ++context_copies;
        if (src.rfind("./", 0) == 0) src = src.substr(2);
        EXPECT_TRUE(fs::exists(kSource + "/" + src))
            << "Dockerfile:" << i.line << ": COPY source missing from the context: " << src;
        EXPECT_FALSE(Ignored(src))
            << "Dockerfile:" << i.line << ": " << src << " is excluded by .dockerignore";
        continue;
      }
      ++stage_copies;
      const Stage* stage = nullptr;
      for (const Stage& s : stages_) {
        if (s.name == from) stage = &s;
      }
      ASSERT_NE(stage, nullptr) << "Dockerfile:" << i.line << ": no stage named " << from;
      ASSERT_FALSE(stage->build_dir.empty())
          << "Dockerfile:" << i.line << ": stage " << from << " runs no `make build BUILD=…`";
      ASSERT_EQ(src.rfind(stage->build_dir + "/", 0), 0u)
          << "Dockerfile:" << i.line << ": " << src << " is not in the build output "
          << stage->build_dir;
      const std::string local = kBuild + src.substr(stage->build_dir.size());
      EXPECT_TRUE(fs::exists(local))
          << "Dockerfile:" << i.line << ": COPY --from=" << from << " " << src
          << ": the build does not produce it (no " << local << ")";
      if (fs::is_directory(local)) {
        EXPECT_FALSE(fs::is_empty(local)) << "Dockerfile:" << i.line << ": " << src << " is empty";
      }
    }
  }
  EXPECT_GE(context_copies, 4);
  EXPECT_GE(stage_copies, 3);
}

// Every library the binary links (ELF NEEDED) comes from a package the runtime stage installs, or
// from the essential packages every Debian image has; so does every library the simulated driver
// shipped beside it (sim/) links: its YAML helper links yaml-cpp.
TEST_F(ImageTest, RuntimeStageInstallsEveryLibraryTheBinaryNeeds) {
  const std::set<std::string> essential = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g"};
  const std::vector<std::string>& installed = stages_.back().packages;
  ASSERT_FALSE(installed.empty()) << "the runtime stage installs nothing";
  int checked = 0;
  std::set<std::string> used;  // packages of the libraries the binary links or loads
  const std::string build = GPULET_BUILD_DIR;
  for (const std::string& file : {GpuletBinary(), build + "/sim/libnvidia-ml.so.1",
                                  build + "/sim/libgpulet-sim-yaml.so"}) {
    const CommandResult needed = RunCommand("readelf -d " + file);
    ASSERT_EQ(needed.exit_code, 0) << needed.output;
    const CommandResult ldd = RunCommand("ldd " + file);
    ASSERT_EQ(ldd.exit_code, 0) << ldd.output;
    std::regex needed_re(R"(\(NEEDED\)\s+Shared library: \[([^\]]+)\])");
    for (std::sregex_iterator it(needed.output.begin(), needed.output.end(), needed_re), end;
         it != end; ++it) {
      const std::string lib = (*it)[1];
      // "lib.so => /path (…)", or "/path/lib.so (…)" for the dynamic loader.
      const std::string quoted = std::regex_replace(lib, std::regex(R"([.+])"), R"(\$&)");
      std::smatch m;
      const std::regex where(R"(\s)" + quoted + R"( => (\S+))");
      const std::regex loader(R"(\s(/\S*/)" + quoted + R"() \()");
      ASSERT_TRUE(std::regex_search(ldd.output, m, where) ||
                  std::regex_search(ldd.output, m, loader))
          << file << ": " << lib << " not resolved:\n"
          << ldd.output;
      const std::string pkg = PackageOf(m[1]);
      ASSERT_FALSE(pkg.empty()) << lib << ": no package owns " << m[1];
      ++checked;
      used.insert(pkg);
      if (essential.count(pkg)) continue;
      EXPECT_NE(std::find(installed.begin(), installed.end(), pkg), installed.end())
          << file << " needs " << lib << " from package " << pkg
          << ", which deploy/Dockerfile's runtime stage does not install";
    }
  }
  EXPECT_GE(checked, 6);
  // The other way round: every library package the runtime stage installs is one the binary links
  // or loads by name at run time (kDlopened; each must still be named in the binary).
  for (const char* soname : kDlopened) {
    EXPECT_NE(ReadAll(GpuletBinary()).find(soname), std::string::npos)
        << "build/gpulet no longer loads " << soname << ": drop it from kDlopened";
    const std::string pkg = PackageOf("/lib/x86_64-linux-gnu/" + std::string(soname));
    ASSERT_FALSE(pkg.empty()) << "no package owns " << soname;
    used.insert(pkg);
  }
  for (const std::string& pkg : installed) {
    if (pkg.rfind("lib", 0) != 0) continue;
    EXPECT_TRUE(used.count(pkg)) << "deploy/Dockerfile's runtime stage installs " << pkg
                                 << ", which neither build/gpulet nor sim/ links or loads: drop it";
  }
}

// The binary carries its C++ runtime, yaml-cpp, spdlog and fmt (GPULET_STATIC_CXX): none is
// linked, and a simulated agent loads none either, because the simulated driver carries its own and
// reads the parsed fixture `--simulate` writes, not the YAML (sim/fixture_json.h).
TEST_F(ImageTest, TheBinaryAndTheSimulatedDriverLoadNoSharedCxxLibrary) {
#ifndef GPULET_STATIC_CXX_BUILD
  GTEST_SKIP() << "this build links the shared C++ libraries (GPULET_STATIC_CXX is off)";
#else
  const std::vector<std::string> cxx = {"libstdc++.so", "libgcc_s.so", "libyaml-cpp.so",
                                        "libspdlog.so", "libfmt.so"};
  const std::string build = GPULET_BUILD_DIR;
  for (const std::string& file : {GpuletBinary(), build + "/sim/libnvidia-ml.so.1"}) {
    const CommandResult needed = RunCommand("readelf -d " + file);
    ASSERT_EQ(needed.exit_code, 0) << needed.output;
    for (const std::string& lib : cxx) {
      EXPECT_EQ(needed.output.find(lib), std::string::npos) << file << " links " << lib;
    }
  }
  // What a simulated agent maps: the dynamic loader names every library it loads.
  const std::string dir = ::testing::TempDir() + "/static-cxx-" + std::to_string(::getpid());
  const CommandResult run =
      RunCommand("LD_DEBUG=files " + GpuletBinary() + " --simulate dgx-h100 --sim-state " + dir +
                 " info 2>&1 >/dev/null");
  std::filesystem::remove_all(dir);
  ASSERT_NE(run.output.find("libnvidia-ml.so.1"), std::string::npos)
      << "the simulated driver was not loaded:\n"
      << run.output;
  for (const std::string& lib : cxx) {
    EXPECT_EQ(run.output.find(lib), std::string::npos) << "`gpulet --simulate dgx-h100 info` loads "
                                                       << lib << ":\n"
                                                       << run.output;
  }
  EXPECT_EQ(run.output.find("libgpulet-sim-yaml.so"), std::string::npos)
      << "the simulated driver parsed the YAML itself instead of reading the parsed fixture";
#endif
}

// libssl3 is in the image for the metrics port's TLS and basic auth, loaded by name (kDlopened):
// the binary serves HTTPS with a TLS web config; a plain exporter maps neither libssl nor
// libcrypto, and basic auth alone maps libcrypto only. Without a loadable libcrypto, a web config
// that needs it fails the start with an error naming the library and the file.
TEST_F(ImageTest, OpenSslIsLoadedOnlyWhenAWebConfigAsksForIt) {
  const std::string script = R"sh(set -u
pid=""; d=$(mktemp -d)
trap '[ -n "$pid" ] && kill $pid 2>/dev/null && wait $pid; rm -rf "$d"' EXIT
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$d/key.pem" -out "$d/cert.pem" -days 1 \
  -subj /CN=localhost 2>/dev/null || { echo "openssl req failed"; exit 2; }
printf 'tls_server_config:\n  cert_file: %s\n  key_file: %s\n' "$d/cert.pem" "$d/key.pem" > "$d/web.yml"
serve() {  # serve NAME [ARGS]: start an exporter on a free port, set $pid and $port
  "$GPULET" --simulate dgx-h100 --sim-state "$d/sim-$1" exporter -a 127.0.0.1:0 "${@:2}" \
    > "$d/$1.log" 2>&1 & pid=$!
  for _ in $(seq 300); do  # until it says where it listens (or exits)
    port=$(sed -n 's/.*event=listening .* port=\([0-9]*\).*/\1/p' "$d/$1.log")
    [ -n "$port" ] && return 0
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  echo "$1: not listening"; cat "$d/$1.log"; exit 3
}
maps() { echo "libssl=$(grep -c 'libssl\.so' /proc/$pid/maps) libcrypto=$(grep -c 'libcrypto\.so' /proc/$pid/maps)"; }
serve plain
echo "plain: $(curl -s http://127.0.0.1:$port/health) $(maps)"
kill $pid; wait $pid
# bcrypt ($2y$, cost 4) of "s3cret"
printf 'basic_auth_users:\n  alice: $2y$04$MiDM8uS.jofjwf1Go9KEoeCzCbjf0ak.3PVmsjmmOOk8OYgDL7V8O\n' > "$d/auth.yml"
serve auth --web-config-file "$d/auth.yml"
echo "auth: $(curl -s -u alice:s3cret http://127.0.0.1:$port/health) $(curl -s -o /dev/null -w %{http_code} -u alice:wrong http://127.0.0.1:$port/health) $(maps)"
kill $pid; wait $pid
serve tls --web-config-file "$d/web.yml"
echo "tls: $(curl -sk https://127.0.0.1:$port/health) $(maps)"
kill $pid; wait $pid; pid=""
mkdir "$d/broken"; echo "not a library" > "$d/broken/libcrypto.so.3"
LD_LIBRARY_PATH="$d/broken" "$GPULET" --simulate dgx-h100 --sim-state "$d/sim-broken" exporter \
  -a 127.0.0.1:0 --web-config-file "$d/auth.yml" > "$d/broken.log" 2>&1
echo "broken: rc=$? $(cat "$d/broken.log")"
)sh";
  const CommandResult r = RunCommand("GPULET=" + GpuletBinary() + " bash -c '" +
                                     std::regex_replace(script, std::regex("'"), "'\\''") + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("plain: OK libssl=0 libcrypto=0"), std::string::npos) << r.output;
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(r.output, m, std::regex(R"(auth: OK 401 libssl=0 libcrypto=(\d+))")))
      << r.output;
  EXPECT_GT(std::stoi(m[1]), 0) << r.output;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(tls: OK libssl=(\d+) libcrypto=(\d+))")))
      << r.output;
  EXPECT_GT(std::stoi(m[1]), 0) << r.output;
  EXPECT_GT(std::stoi(m[2]), 0) << r.output;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(broken: rc=(\d+))"))) << r.output;
  EXPECT_NE(std::stoi(m[1]), 0) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(auth\.yml: cannot load libcrypto\.so\.3)")))
      << r.output;
}

// The shipped files must not reveal or depend on the build machine's paths.
TEST_F(ImageTest, ShippedFilesCarryNoBuildPaths) {
  for (const std::string& file :
       {GpuletBinary(), kBuild + "/sim/libnvidia-ml.so.1", kBuild + "/lib/libgpulet-cuda.so"}) {
    const std::string bytes = ReadAll(file);
    ASSERT_FALSE(bytes.empty()) << file;
    EXPECT_EQ(bytes.find(kSource + "/"), std::string::npos) << file << " contains " << kSource;
    EXPECT_EQ(bytes.find(kBuild + "/"), std::string::npos) << file << " contains " << kBuild;
  }
}

}  // namespace
}  // namespace gpulet::testing
