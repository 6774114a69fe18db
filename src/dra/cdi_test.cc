// CDI: the version rules, the JSON shape, edit merging, and finding the driver's files under a
// root (versions, sonames, what is required).
#include "dra/cdi.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/files.h"

namespace gpulet::dra {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TempDir() {
  std::string t = ::testing::TempDir() + "gpulet-cdi-XXXXXX";
  EXPECT_NE(mkdtemp(t.data()), nullptr);
  return t;
}

void Touch(const fs::path& p) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << "x";
}

TEST(CdiTest, TheLowestVersionCoveringTheFieldsUsed) {
  CdiSpec s;
  s.devices.push_back({"abc-gpu-0", {}});
  s.devices[0].edits.device_nodes.push_back({"/dev/nvidia0", ""});
  s.devices[0].edits.mounts.push_back({"/a", "/a", {"ro"}});
  EXPECT_EQ(MinimumCdiVersion(s), "0.3.0");
  CdiSpec digit = s;
  digit.devices[0].name = "0bc-gpu-0";
  EXPECT_EQ(MinimumCdiVersion(digit), "0.5.0");
  CdiSpec host = s;
  host.edits.device_nodes.push_back({"/dev/nvidiactl", "/host/dev/nvidiactl"});
  EXPECT_EQ(MinimumCdiVersion(host), "0.5.0");
  CdiSpec dotted = s;
  dotted.kind = "gpu.gpulet.io/claim.v2";
  EXPECT_EQ(MinimumCdiVersion(dotted), "0.6.0");
}

TEST(CdiTest, JsonLeavesOutWhatIsEmpty) {
  CdiSpec s;
  CdiEdits e;
  e.env = {"A=1"};
  e.hooks.push_back({"createContainer", "/usr/bin/hook", {"hook", "x"}});
  s.devices.push_back({"d", e});
  const nlohmann::json j = CdiSpecToJson(s);
  EXPECT_EQ(j, nlohmann::json::parse(R"({"cdiVersion":"0.3.0","kind":"gpu.gpulet.io/claim",
      "devices":[{"name":"d","containerEdits":{"env":["A=1"],
      "hooks":[{"hookName":"createContainer","path":"/usr/bin/hook","args":["hook","x"]}]}}]})"));
  EXPECT_EQ(TransientSpecName("u-1"), "gpu.gpulet.io-claim_u-1");
  EXPECT_EQ(QualifiedDeviceName(kCdiKind, "n"), "gpu.gpulet.io/claim=n");
}

TEST(CdiTest, MergeKeepsOneOfEachTarget) {
  CdiEdits a;
  a.env = {"A=1"};
  a.device_nodes = {{"/dev/nvidia0", ""}};
  a.mounts = {{"/h", "/c", {"ro"}}};
  CdiEdits b = a;
  b.env.push_back("B=2");
  b.device_nodes.push_back({"/dev/nvidia1", ""});
  b.mounts.push_back({"/h2", "/c", {"ro"}});  // same target: the first stays
  a.Merge(b);
  EXPECT_THAT(a.env, ElementsAre("A=1", "B=2"));
  ASSERT_EQ(a.device_nodes.size(), 2u);
  ASSERT_EQ(a.mounts.size(), 1u);
  EXPECT_EQ(a.mounts[0].host_path, "/h");
}

TEST(CdiTest, FindsTheDriversFilesOfItsVersionWithTheirSonames) {
  const std::string root = TempDir();
  const std::string lib = root + "/usr/lib64";
  Touch(lib + "/libcuda.so.570.86.10");
  fs::create_symlink("libcuda.so.570.86.10", lib + "/libcuda.so.1");
  Touch(lib + "/libcuda.so.560.1.1");  // another version: not this driver's
  Touch(lib + "/libnvidia-ml.so.570.86.10");
  fs::create_symlink("libnvidia-ml.so.570.86.10", lib + "/libnvidia-ml.so.1");
  fs::create_symlink("/elsewhere/libnvidia-ml.so.570.86.10", lib + "/libnvidia-ml.so");
  Touch(lib + "/libnvidia-nvvm.so.570.86.10");
  fs::create_symlink("libnvidia-nvvm.so.570.86.10", lib + "/libnvidia-nvvm.so.4");
  Touch(root + "/usr/bin/nvidia-smi");
  Touch(root + "/usr/local/bin/nvidia-cdi-hook");
  Touch(root + "/dev/nvidiactl");
  Touch(root + "/dev/nvidia-uvm");

  Result<DriverFiles> f = FindDriverFiles(root, "570.86.10");
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_THAT(f->control_nodes, ElementsAre("/dev/nvidiactl", "/dev/nvidia-uvm"));
  ASSERT_EQ(f->libraries.size(), 3u);
  EXPECT_EQ(f->libraries[0].path, "/usr/lib64/libcuda.so.570.86.10");
  EXPECT_THAT(f->libraries[0].sonames, ElementsAre("/usr/lib64/libcuda.so.1"));
  EXPECT_EQ(f->libraries[1].path, "/usr/lib64/libnvidia-ml.so.570.86.10");
  EXPECT_THAT(f->libraries[1].sonames, ElementsAre("/usr/lib64/libnvidia-ml.so.1"));
  EXPECT_THAT(f->libraries[2].sonames, ElementsAre("/usr/lib64/libnvidia-nvvm.so.4"));
  EXPECT_THAT(f->binaries, ElementsAre("/usr/bin/nvidia-smi"));
  EXPECT_EQ(f->cdi_hook, "/usr/local/bin/nvidia-cdi-hook");
  EXPECT_THAT(f->library_dirs, ElementsAre("/usr/lib64"));

  // The host sees the root at /; the hook is the driver's unless one is given.
  CdiEdits e = CommonDriverEdits(*f, "/", "");
  ASSERT_EQ(e.hooks.size(), 1u);
  EXPECT_EQ(e.hooks[0].path, "/usr/local/bin/nvidia-cdi-hook");
  EXPECT_THAT(e.hooks[0].args,
              ElementsAre("nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib64"));
  EXPECT_EQ(e.mounts.size(), 7u);  // 3 libraries, 3 sonames, 1 binary
  EXPECT_EQ(CommonDriverEdits(*f, "/", "/opt/hook").hooks[0].path, "/opt/hook");

  Result<DriverFiles> wrong = FindDriverFiles(root, "999.0");
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr(root + ": no libcuda.so.999.0"));
  fs::remove(root + "/dev/nvidiactl");
  Result<DriverFiles> no_ctl = FindDriverFiles(root, "570.86.10");
  ASSERT_FALSE(no_ctl.ok());
  EXPECT_THAT(no_ctl.status().message(), HasSubstr("/dev/nvidiactl: missing"));
}

// The device check's H200 machine: the driver under /usr/local/nvidia, named by an ld.so.conf.d
// file, with symlinks to it in /usr/lib (links, not the driver's files: skipped there).
TEST(CdiTest, FindsADriverWhereTheRootsLdConfigurationSaysItIs) {
  const std::string root = TempDir();
  const std::string lib = root + "/usr/local/nvidia/lib64";
  Touch(lib + "/libcuda.so.580.159.04");
  fs::create_symlink("libcuda.so.580.159.04", lib + "/libcuda.so.1");
  Touch(lib + "/libnvidia-ml.so.580.159.04");
  fs::create_directories(root + "/usr/lib");
  fs::create_symlink("/usr/local/nvidia/lib64/libcuda.so.1", root + "/usr/lib/libcuda.so.1");
  Touch(root + "/usr/local/nvidia/bin/nvidia-smi");
  Touch(root + "/dev/nvidiactl");
  fs::create_directories(root + "/etc/ld.so.conf.d");
  ASSERT_TRUE(
      WriteFileAtomic(root + "/etc/ld.so.conf", "# libc\ninclude /etc/ld.so.conf.d/*.conf\n").ok());
  ASSERT_TRUE(WriteFileAtomic(root + "/etc/ld.so.conf.d/000_cuda.conf",
                              "/usr/local/cuda/lib64\n  /usr/local/nvidia/lib64/  # the driver\n"
                              "relative/ignored\n/a/../etc\n").ok());
  ASSERT_TRUE(WriteFileAtomic(root + "/etc/ld.so.conf.d/loop.conf", "include ld.so.conf\n").ok());

  Result<DriverFiles> f = FindDriverFiles(root, "580.159.04");
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_EQ(f->libraries.size(), 2u);
  EXPECT_EQ(f->libraries[0].path, "/usr/local/nvidia/lib64/libcuda.so.580.159.04");
  EXPECT_THAT(f->libraries[0].sonames, ElementsAre("/usr/local/nvidia/lib64/libcuda.so.1"));
  EXPECT_THAT(f->library_dirs, ElementsAre("/usr/local/nvidia/lib64"));
  EXPECT_THAT(f->binaries, ElementsAre("/usr/local/nvidia/bin/nvidia-smi"));
}

TEST(CdiTest, AnyDriverVersionWhenNoneIsKnown) {
  const std::string root = TempDir();
  Touch(root + "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15");
  Touch(root + "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15");
  Touch(root + "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1");  // a file, not a link: not a soname
  Touch(root + "/dev/nvidiactl");
  Result<DriverFiles> f = FindDriverFiles(root, "");
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_EQ(f->libraries.size(), 2u);
  EXPECT_EQ(f->libraries[1].path, "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15");
  EXPECT_TRUE(f->libraries[1].sonames.empty());
}

TEST(CdiTest, NvidiaCtkDevicesAreReadFromItsSpecsOnly) {
  const std::string dir = TempDir();
  ASSERT_TRUE(WriteFileAtomic(dir + "/nvidia.yaml",
                              "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n"
                              "  - {name: \"0\"}\n  - {name: GPU-abc}\n  - {name: all}\n")
                  .ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/other.json",
                              R"({"cdiVersion":"0.5.0","kind":"vendor.com/x","devices":[{"name":"1"}]})")
                  .ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/broken.yaml", "kind: [").ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/gpu.gpulet.io-claim_x.json",
                              R"({"kind":"nvidia.com/gpu","devices":[{"name":"7"}]})")
                  .ok());
  NvidiaCdiDevices d = FindNvidiaCdiDevices({dir, dir + "/missing"});
  EXPECT_THAT(d.names, ElementsAre("0", "GPU-abc", "all"));
  EXPECT_TRUE(d.Has("GPU-abc"));
  EXPECT_FALSE(d.Has("1"));
}

}  // namespace
}  // namespace gpulet::dra
