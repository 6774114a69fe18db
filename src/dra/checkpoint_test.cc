// The plugin's checkpoint: round trip, atomic replacement, corrupted and foreign files moved aside.
#include "dra/checkpoint.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "common/files.h"

namespace gpulet::dra {
namespace {

namespace fs = std::filesystem;

std::string TempDir() {
  std::string tmpl = ::testing::TempDir() + "gpulet-dra-cp-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

Checkpoint Sample() {
  Checkpoint cp;
  cp.node_name = "node-1";
  cp.boot_id = "boot-a";
  CheckpointEntry e;
  e.ref = {"default", "claim-a", "uid-a"};
  e.state = CheckpointEntry::State::kPrepared;
  CheckpointDevice d;
  d.requests = {"gpu"};
  d.pool = "node-1";
  d.device = "gpu-0-mem";
  d.share_id = "share-1";
  d.cdi_device_ids = {"gpu.gpulet.io/gpu=uid-a-gpu-0-mem"};
  d.admin_access = true;
  e.devices = {d};
  e.record_json = R"({"v":1,"x":"y"})";
  cp.claims[e.ref.uid] = e;
  CheckpointEntry p;
  p.ref = {"ns2", "claim-b", "uid-b"};
  p.state = CheckpointEntry::State::kPreparing;
  cp.claims[p.ref.uid] = p;
  return cp;
}

std::vector<std::string> Files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Checkpoint, RoundTrip) {
  const std::string dir = TempDir();
  const std::string path = dir + "/checkpoint.json";
  ASSERT_TRUE(WriteCheckpoint(path, Sample()).ok());
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  Result<LoadedCheckpoint> l = LoadCheckpoint(path, "node-1", "boot-a");
  ASSERT_TRUE(l.ok()) << l.status().message();
  ASSERT_EQ(l->outcome, LoadedCheckpoint::Outcome::kLoaded);
  const Checkpoint& cp = l->checkpoint;
  EXPECT_FALSE(cp.rebuild_pending);
  ASSERT_EQ(cp.claims.size(), 2u);
  const CheckpointEntry& a = cp.claims.at("uid-a");
  EXPECT_EQ(a.ref.namespace_, "default");
  EXPECT_EQ(a.ref.name, "claim-a");
  EXPECT_EQ(a.state, CheckpointEntry::State::kPrepared);
  EXPECT_EQ(a.record_json, R"({"v":1,"x":"y"})");
  ASSERT_EQ(a.devices.size(), 1u);
  EXPECT_EQ(a.devices[0].device, "gpu-0-mem");
  EXPECT_EQ(a.devices[0].share_id, "share-1");
  EXPECT_TRUE(a.devices[0].admin_access);
  EXPECT_EQ(a.devices[0].cdi_device_ids.at(0), "gpu.gpulet.io/gpu=uid-a-gpu-0-mem");
  EXPECT_EQ(cp.claims.at("uid-b").state, CheckpointEntry::State::kPreparing);
  // Only the file: no temporary left behind.
  EXPECT_EQ(Files(dir), std::vector<std::string>{"checkpoint.json"});
}

TEST(Checkpoint, MissingIsAFirstStart) {
  const std::string dir = TempDir();
  Result<LoadedCheckpoint> l = LoadCheckpoint(dir + "/checkpoint.json", "node-1", "boot-a");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->outcome, LoadedCheckpoint::Outcome::kMissing);
  EXPECT_TRUE(l->checkpoint.claims.empty());
  EXPECT_FALSE(l->checkpoint.rebuild_pending);
  EXPECT_EQ(l->checkpoint.boot_id, "boot-a");
}

// A write replaces the whole file or nothing: a reader between two writes sees one of them, and a
// failed write (the directory is gone) leaves the old file alone.
TEST(Checkpoint, ReplacedAtomically) {
  const std::string dir = TempDir();
  const std::string path = dir + "/checkpoint.json";
  Checkpoint one = Sample();
  ASSERT_TRUE(WriteCheckpoint(path, one).ok());
  Checkpoint two = one;
  two.claims.erase("uid-a");
  ASSERT_TRUE(WriteCheckpoint(path, two).ok());
  Result<LoadedCheckpoint> l = LoadCheckpoint(path, "node-1", "boot-a");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->checkpoint.claims.size(), 1u);
  EXPECT_FALSE(WriteCheckpoint(dir + "/nodir/checkpoint.json", one).ok());
}

struct Corruption {
  const char* what;
  std::function<std::string(std::string)> edit;
  const char* problem;
};

TEST(Checkpoint, CorruptedFilesAreMovedAsideAndReported) {
  const std::vector<Corruption> cases = {
      {"truncated", [](std::string s) { return s.substr(0, s.size() / 2); }, "not JSON"},
      {"empty", [](std::string) { return std::string(); }, "not JSON"},
      {"a flipped byte",
       [](std::string s) {
         const size_t at = s.find("claim-a");
         s[at] = 'C';
         return s;
       },
       "checksum does not match"},
      {"unknown version",
       [](std::string s) {
         const size_t at = s.find("\"version\": 1");
         return s.replace(at, 12, "\"version\": 9");
       },
       "version 9 is not 1"},
      {"not an object", [](std::string) { return std::string("[1,2]"); }, "not a JSON object"},
  };
  for (const Corruption& c : cases) {
    const std::string dir = TempDir();
    const std::string path = dir + "/checkpoint.json";
    ASSERT_TRUE(WriteFileAtomic(path, c.edit(SerializeCheckpoint(Sample())), 0600).ok());
    Result<LoadedCheckpoint> l = LoadCheckpoint(path, "node-1", "boot-a");
    ASSERT_TRUE(l.ok()) << c.what;
    EXPECT_EQ(l->outcome, LoadedCheckpoint::Outcome::kCorrupt) << c.what;
    EXPECT_NE(l->problem.find(path), std::string::npos) << l->problem;
    EXPECT_NE(l->problem.find(c.problem), std::string::npos) << c.what << ": " << l->problem;
    EXPECT_TRUE(l->checkpoint.claims.empty());
    EXPECT_TRUE(l->checkpoint.rebuild_pending);
    ASSERT_FALSE(l->kept_aside.empty()) << c.what;
    EXPECT_NE(l->kept_aside.find("checkpoint.json.corrupt-"), std::string::npos);
    EXPECT_TRUE(fs::exists(l->kept_aside));
    EXPECT_FALSE(fs::exists(path));
  }
}

TEST(Checkpoint, OtherBootOrNodeIsForeign) {
  for (const auto& [node, boot, problem] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"node-1", "boot-b", "written in boot boot-a, this boot is boot-b"},
           {"node-2", "boot-a", "written on node \"node-1\", this is \"node-2\""}}) {
    const std::string dir = TempDir();
    const std::string path = dir + "/checkpoint.json";
    ASSERT_TRUE(WriteCheckpoint(path, Sample()).ok());
    Result<LoadedCheckpoint> l = LoadCheckpoint(path, node, boot);
    ASSERT_TRUE(l.ok());
    EXPECT_EQ(l->outcome, LoadedCheckpoint::Outcome::kForeign);
    EXPECT_NE(l->problem.find(problem), std::string::npos) << l->problem;
    EXPECT_TRUE(l->checkpoint.claims.empty());
    EXPECT_TRUE(l->checkpoint.rebuild_pending);
    EXPECT_EQ(l->checkpoint.boot_id, boot);
    EXPECT_NE(l->kept_aside.find("checkpoint.json.foreign-"), std::string::npos);
    EXPECT_TRUE(fs::exists(l->kept_aside));
  }
}

TEST(Checkpoint, RebuildPendingIsSealed) {
  const std::string dir = TempDir();
  const std::string path = dir + "/checkpoint.json";
  Checkpoint cp = Sample();
  cp.rebuild_pending = true;
  ASSERT_TRUE(WriteCheckpoint(path, cp).ok());
  Result<LoadedCheckpoint> l = LoadCheckpoint(path, "node-1", "boot-a");
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->outcome, LoadedCheckpoint::Outcome::kLoaded);
  EXPECT_TRUE(l->checkpoint.rebuild_pending);
  // Clearing the flag by hand breaks the seal.
  std::string text = SerializeCheckpoint(cp);
  const size_t at = text.find("\"rebuildPending\": true");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 22, "\"rebuildPending\": false");
  ASSERT_TRUE(WriteFileAtomic(path, text, 0600).ok());
  l = LoadCheckpoint(path, "node-1", "boot-a");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->outcome, LoadedCheckpoint::Outcome::kCorrupt);
}

TEST(BootId, FirstLineTrimmed) {
  const std::string dir = TempDir();
  ASSERT_TRUE(WriteFileAtomic(dir + "/boot_id", "1b2c3d4e-aaaa-bbbb-cccc-0123456789ab\n").ok());
  Result<std::string> id = ReadBootId(dir + "/boot_id");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(*id, "1b2c3d4e-aaaa-bbbb-cccc-0123456789ab");
  ASSERT_TRUE(WriteFileAtomic(dir + "/empty", "\n").ok());
  EXPECT_EQ(ReadBootId(dir + "/empty").status().code(), ErrorCode::kInvalidInput);
  EXPECT_EQ(ReadBootId(dir + "/none").status().code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace gpulet::dra
