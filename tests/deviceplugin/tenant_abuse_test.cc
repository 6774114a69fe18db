// `gpulet node` with GPU memory limits, against containers that are root in their directories
// (issue 23, "Proof"): FIFOs and symlinks (to /dev/zero, to files outside) where the agent expects
// files, a region rewritten at full speed and truncated under the exporter, UUIDs that are not
// UTF-8, a tenant that rewrites the old limit field and sets GPULET_CUDA_PASSTHROUGH=1. Throughout,
// the node agent keeps serving the kubelet harness and /metrics, its scrape stays valid UTF-8
// with the agent's limits, a SIGTERM still stops it, and a CUDA program in the abused container
// (the memlimit probe on the simulated driver, preloaded with the library) still stops at its
// limit.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/process.h"
#include "common/utf8.h"
#include "cudashim/region.h"
#include "support/build_dir.h"
#include "support/wait_until.h"
#include "testing/kubelet/kubelet_harness.h"
#include "tests/deviceplugin/plugin_process.h"

extern char** environ;

namespace gpulet::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr char kGpu[] = "nvidia.com/gpu";
constexpr uint64_t kGiB = 1ULL << 30;

// One request on a fresh connection; the whole response.
std::string Get(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{30, 0};  // a hang fails the scrape instead of the test run
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      ssize_t n;
      while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return out;
}

// The value of the series that starts with `prefix` (labels included), or -1.
double Value(const std::string& text, const std::string& prefix) {
  const size_t at = text.find(prefix);
  if (at == std::string::npos) return -1;
  const size_t space = text.find(' ', at + prefix.size());
  return space == std::string::npos ? -1 : std::stod(text.substr(space + 1));
}

class TenantAbuseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dp_ = tmp_.path() + "/plugins";
    state_ = tmp_.path() + "/state";
    hostlib_ = tmp_.path() + "/hostlib";
    outside_ = tmp_.path() + "/outside";
    for (const std::string& d : {dp_, state_, hostlib_, outside_}) fs::create_directories(d);
    fs::copy_file(BuildDir() + "/lib/libgpulet-cuda.so", hostlib_ + "/libgpulet-cuda.so");
    std::ofstream(outside_ + "/node-secret") << "the node's own file\n";
    config_ = tmp_.path() + "/config.yaml";
    std::ofstream(config_) << "version: v1\n"
                              "sharing:\n"
                              "  timeSlicing:\n"
                              "    resources:\n"
                              "      - name: nvidia.com/gpu\n"
                              "        replicas: 4\n"
                              "gpulet:\n"
                              "  memoryLimits:\n"
                              "    resources:\n"
                              "      - name: nvidia.com/gpu\n"
                              "    library: "
                           << hostlib_ << "/libgpulet-cuda.so\n"
                           << "    stateDir: " << state_ << "\n";
  }

  // What a container that got `ids` sees: the Allocate response's host paths.
  struct Container {
    std::string name;
    std::vector<std::string> ids;
    std::string limits;  // host path of the read-only limits file
    std::string cuda;    // host path of the read-write directory
    std::string dir;     // the per-container directory (agent's)
  };
  Container Allocate(KubeletHarness& harness, const std::string& name,
                     const std::vector<std::string>& ids) {
    Container c{name, ids, "", "", ""};
    auto r = harness.Allocate(kGpu, ids);
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (!r.ok()) return c;
    for (const auto& m : r->mounts()) {
      if (m.container_path() == "/usr/lib/gpulet/gpulet-cuda.limits") c.limits = m.host_path();
      if (m.container_path() == "/run/gpulet/cuda") c.cuda = m.host_path();
    }
    EXPECT_EQ(r->envs().count("GPULET_CUDA_PASSTHROUGH"), 0u);
    c.dir = fs::path(c.cuda).parent_path().string();
    return c;
  }

  // Runs the memlimit probe as a process of container `c`: the library and the limits file as the
  // container sees them (/usr/lib/gpulet/, read-only from the node: here a copy of each), its
  // writable directory as GPULET_CUDA_DIR, and the tenant's own attempt at turning limits off.
  CommandOutput Probe(const Container& c, const std::vector<std::string>& args) {
    const std::string usr = tmp_.path() + "/" + c.name + "-usr-lib-gpulet";
    fs::create_directories(usr);
    fs::copy_file(hostlib_ + "/libgpulet-cuda.so", usr + "/libgpulet-cuda.so",
                  fs::copy_options::overwrite_existing);
    fs::copy_file(c.limits, usr + "/" + cudashim::kLimitsFileName,
                  fs::copy_options::overwrite_existing);
    std::map<std::string, std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e;
      const auto eq = kv.find('=');
      if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    env["LD_PRELOAD"] = usr + "/libgpulet-cuda.so";
    env["LD_LIBRARY_PATH"] = BuildDir() + "/sim:" + BuildDir() + "/cuda_sim";
    env["GPULET_SIM_FIXTURE"] = std::string(GPULET_SOURCE_DIR) + "/testing/fixtures/dgx-h100.yaml";
    env["GPULET_CUDA_DIR"] = c.cuda;
    env["GPULET_CUDA_PASSTHROUGH"] = "1";  // the tenant's; ignored
    env["GPULET_CUDA_SIM_CONTEXT_BYTES"] = std::to_string(256ULL << 20);
#ifdef GPULET_ASAN_RUNTIME
    // ASan must be the first object of the process, ahead of the (ASan-built) library.
    env["LD_PRELOAD"] = std::string(GPULET_ASAN_RUNTIME) + " " + env["LD_PRELOAD"];
#endif
    CommandSpec spec;
    spec.argv = {BuildDir() + "/bin/memlimit_probe"};
    spec.argv.insert(spec.argv.end(), args.begin(), args.end());
    spec.env.emplace();
    for (const auto& [k, v] : env) spec.env->push_back(k + "=" + v);
    spec.timeout = std::chrono::seconds(120);
    auto out = RunCommand(spec);
    EXPECT_TRUE(out.ok()) << out.status().message();
    return out.ok() ? *out : CommandOutput{};
  }

  TempDir tmp_;
  std::string dp_, state_, hostlib_, outside_, config_;
};

TEST_F(TenantAbuseTest, TheNodeAgentKeepsServingAndTheLimitHolds) {
  // A directory left by a hostile container before the agent starts (the layout of earlier
  // releases, where `devices` sat in the container's writable directory): a FIFO as `devices`
  // blocked the janitor's first pass forever, and SIGTERM then hung on its join.
  fs::create_directories(state_ + "/old-fifo");
  ASSERT_EQ(::mkfifo((state_ + "/old-fifo/devices").c_str(), 0666), 0);
  fs::create_directories(state_ + "/old-zero");
  fs::create_symlink("/dev/zero", state_ + "/old-zero/devices");
  fs::create_symlink(outside_, state_ + "/old-link");

  HarnessOptions ho;
  ho.dial_timeout = 10s;
  KubeletHarness harness(ho);
  ASSERT_TRUE(harness.Start(dp_).ok());
  GpuletProcess node({"--simulate", "dgx-h100", "--sim-state", tmp_.path() + "/sim", "node",
                      "--device-plugin-path", dp_, "--config-file", config_, "-a", "127.0.0.1:0",
                      "-c", "200", "--memory-limits-state-dir", state_, "--pod-resources-socket",
                      harness.pod_resources_socket()},
                     tmp_.path() + "/node.log",
                     // The node names the driver the library calls (issue 36 item 3: the
                     // tenant's LD_LIBRARY_PATH below no longer does).
                     {{"GPULET_POD_RESOURCES_SOCKET", harness.pod_resources_socket()},
                      {"GPULET_CONTAINER_CUDA_DRIVER", BuildDir() + "/cuda_sim/libcuda.so.1"}});
  ASSERT_TRUE(node.Start());
  ASSERT_TRUE(harness
                  .WaitFor(
                      kGpu,
                      [](const ResourceState& s) {
                        return s.registered && s.streaming && s.devices.size() == 32;
                      },
                      60s)
                  .ok())
      << node.Log();
  const int port = ListeningPort(node, 30s);
  ASSERT_GT(port, 0) << node.Log();
  std::vector<std::string> ids;
  for (const HarnessDevice& d : harness.Devices(kGpu)) ids.push_back(d.id);
  std::sort(ids.begin(), ids.end());

  // Four containers, one replica (a quarter of the GPU) each, on GPU 0 (CUDA device 0 of the
  // simulated driver, which reads the same fixture).
  std::smatch g0;
  const std::string first = Get(port, "/metrics");
  ASSERT_TRUE(std::regex_search(first, g0, std::regex("gpu=\"0\",UUID=\"([^\"]+)\"")));
  const std::string gpu0 = g0[1];
  std::vector<Container> cs;
  for (int i = 0; i < 4; ++i)
    cs.push_back(Allocate(harness, "c" + std::to_string(i), {gpu0 + "::" + std::to_string(i)}));
  // The kubelet's other allocations go to the other GPUs (a newer Allocate of one of c0..c3's
  // replica IDs would end that container's directory).
  std::vector<std::string> others;
  for (const std::string& id : ids) {
    if (id.rfind(gpu0 + "::", 0) != 0) others.push_back(id);
  }
  ASSERT_EQ(others.size(), 28u);
  std::vector<PodAssignment> pods;
  for (const Container& c : cs) pods.push_back({"team", "pod-" + c.name, "main", kGpu, c.ids});
  harness.SetPodResources(pods);
  ASSERT_FALSE(cs[0].cuda.empty());
  // A quarter of the GPU: what the plugin wrote in the read-only limits file.
  cudashim::LimitsFile lf{};
  ASSERT_EQ(cudashim::ReadLimitsFile(cs[3].limits, &lf), "");
  ASSERT_EQ(lf.gpu_count, 1u);
  const uint64_t limit = lf.gpus[0].limit;
  ASSERT_GT(limit, 18 * kGiB);

  // c0: its region replaced by a FIFO. c1: by a symlink to /dev/zero. c2: by a symlink to a
  // node file, plus symlinks and a FIFO beside it. c3: rewritten at full speed (below).
  const std::string region = cudashim::kRegionFileName;
  fs::remove(cs[0].cuda + "/" + region);
  ASSERT_EQ(::mkfifo((cs[0].cuda + "/" + region).c_str(), 0666), 0);
  fs::remove(cs[1].cuda + "/" + region);
  fs::create_symlink("/dev/zero", cs[1].cuda + "/" + region);
  fs::remove(cs[2].cuda + "/" + region);
  fs::create_symlink(outside_ + "/node-secret", cs[2].cuda + "/" + region);
  fs::create_symlink(outside_, cs[2].cuda + "/escape");
  ASSERT_EQ(::mkfifo((cs[2].cuda + "/pipe").c_str(), 0666), 0);

  std::atomic<bool> stop{false}, truncating{true};
  std::atomic<uint64_t> rewrites{0};
  std::thread writer([&] {
    const std::string path = cs[3].cuda + "/" + region;
    const int fd = ::open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    const std::string bad_uuid = "GPU-\xc3\x28\xff\xfe" + std::string(70, '\xff');
    const uint64_t huge = 1ULL << 60;
    for (uint64_t i = 0; !stop.load(); ++i) {
      const uint32_t count = i % 2 == 0 ? 0xFFFFFFFFu : 1u;
      ::pwrite(fd, &count, sizeof count, offsetof(cudashim::RegionHeader, gpu_count));
      ::pwrite(fd, bad_uuid.data(), bad_uuid.size(), offsetof(cudashim::RegionLayout, gpus));
      ::pwrite(fd, &huge, sizeof huge,
               offsetof(cudashim::RegionLayout, gpus) + offsetof(cudashim::GpuSlot, unused_limit));
      if (truncating.load() && i % 5 == 0) {
        ::ftruncate(fd, 0);
        ::ftruncate(fd, sizeof(cudashim::RegionLayout));
      }
      rewrites.fetch_add(1);
    }
    ::close(fd);
  });

  int scrapes_ok = 0, allocations_ok = 0;
  const std::string limit_c3 =
      "gpulet_container_memory_limit_bytes{namespace=\"team\",pod=\"pod-c3\"";
  // The exporter has seen the kubelet's owners (its first collection after SetPodResources).
  ASSERT_TRUE(WaitUntil([&] { return Value(Get(port, "/metrics"), limit_c3) > 0; }));
  // Meanwhile the kubelet keeps allocating and Prometheus keeps scraping.
  for (int i = 0; i < 30; ++i) {
    const std::string r = Get(port, "/metrics");
    const size_t body = r.find("\r\n\r\n");
    if (r.find(" 200 ") != std::string::npos && body != std::string::npos &&
        IsValidUtf8(r.substr(body)) && Value(r, limit_c3) == static_cast<double>(limit)) {
      ++scrapes_ok;
    } else if (i == 29) {
      std::string series;
      std::istringstream lines(r);
      for (std::string l; std::getline(lines, l);) {
        if (l.rfind("gpulet_container", 0) == 0) series += l + "\n";
      }
      ADD_FAILURE() << r.substr(0, 200) << "...\n" << series;
    }
    if (harness.Allocate(kGpu, {others[static_cast<size_t>(i) % others.size()]}).ok()) {
      ++allocations_ok;
    }
  }
  EXPECT_EQ(scrapes_ok, 30);
  EXPECT_EQ(allocations_ok, 30);
  EXPECT_GT(rewrites.load(), 0u);
  EXPECT_TRUE(node.Running());
  EXPECT_TRUE(harness.State(kGpu)->streaming);

  // The limit holds in the abused container: the tenant rewrites the old limit field, gpu_count
  // and the UUID while a program fills the GPU, with GPULET_CUDA_PASSTHROUGH=1 in its
  // environment. (Truncating its own mapped region would only crash its own program.)
  truncating = false;
  {
    const int fd = ::open((cs[3].cuda + "/" + region).c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, sizeof(cudashim::RegionLayout)), 0);
    ::close(fd);
  }
  stop = true;  // the probe needs a region whose header is intact to attach: restart the writer
  writer.join();
  ASSERT_EQ(cudashim::CreateRegion(cs[3].cuda, {{gpu0, 0, 0}}, /*replace=*/true), "");
  stop = false;
  truncating = false;
  std::thread rewriter([&] {
    const int fd = ::open((cs[3].cuda + "/" + region).c_str(), O_RDWR);
    if (fd < 0) return;
    const uint64_t huge = 1ULL << 60;
    const uint32_t many = 0xFFFFFFFFu;
    while (!stop.load()) {
      ::pwrite(fd, &huge, sizeof huge,
               offsetof(cudashim::RegionLayout, gpus) + offsetof(cudashim::GpuSlot, unused_limit));
      ::pwrite(fd, &many, sizeof many, offsetof(cudashim::RegionHeader, gpu_count));
    }
    ::close(fd);
  });
  const CommandOutput out = Probe(cs[3], {"init", "fill", "alloc", std::to_string(kGiB)});
  stop = true;
  rewriter.join();
  EXPECT_EQ(out.exit_code, 0) << out.out << out.err;
  EXPECT_NE(out.out.find("init rc=0"), std::string::npos) << out.out << out.err;
  std::smatch fill;
  ASSERT_TRUE(std::regex_search(out.out, fill, std::regex("admitted=([0-9]+)"))) << out.out;
  const uint64_t admitted = std::stoull(fill[1]);
  EXPECT_LE(admitted + (256ULL << 20), limit) << "the limit did not hold";
  EXPECT_GE(admitted + 2 * kGiB, limit);  // and the tenant got its share

  // The exporter still collects after all this: a use the tenant writes now shows up.
  {
    const int fd = ::open((cs[3].cuda + "/" + region).c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    const uint32_t one = 1;
    const uint64_t used = 12345;
    ::pwrite(fd, &one, sizeof one, offsetof(cudashim::RegionHeader, gpu_count));
    ::pwrite(fd, &used, sizeof used,
             offsetof(cudashim::RegionLayout, gpus) + offsetof(cudashim::GpuSlot, used));
    ::close(fd);
  }
  const std::string used_c3 =
      "gpulet_container_memory_used_bytes{namespace=\"team\",pod=\"pod-c3\"";
  EXPECT_TRUE(WaitUntil([&] { return Value(Get(port, "/metrics"), used_c3) == 12345; }));
  EXPECT_TRUE(harness.Allocate(kGpu, {others[0]}).ok());
  EXPECT_TRUE(fs::exists(outside_ + "/node-secret"));

  // A SIGTERM still stops the node agent (the janitor is not stuck on a FIFO).
  EXPECT_EQ(node.Stop(SIGTERM, std::chrono::seconds(30)), 0) << node.Log();
  harness.Stop();
}

}  // namespace
}  // namespace gpulet::testing
