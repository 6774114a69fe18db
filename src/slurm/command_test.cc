#include "slurm/command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "slurm/scontrol.h"

namespace gpulet::slurm {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

TEST(ProcessRunner, CapturesOutputAndExitCode) {
  ProcessRunner r;
  Result<CommandOutput> out = r.Run({"sh", "-c", "echo hello; echo oops >&2; exit 3"}, 10s);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(out->exit_code, 3);
  EXPECT_EQ(out->out, "hello\n");
  EXPECT_EQ(out->err, "oops\n");
}

TEST(ProcessRunner, LargeOutputOnBothStreams) {
  ProcessRunner r;
  Result<CommandOutput> out =
      r.Run({"sh", "-c", "head -c 200000 /dev/zero; head -c 100000 /dev/zero >&2"}, 10s);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->out.size(), 200000u);
  EXPECT_EQ(out->err.size(), 100000u);
}

TEST(ProcessRunner, MissingProgramIsNotFound) {
  ProcessRunner r;
  Result<CommandOutput> out = r.Run({"gpulet-no-such-program-xyz"}, 10s);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), ErrorCode::kNotFound);
  EXPECT_THAT(out.status().message(), HasSubstr("gpulet-no-such-program-xyz"));
}

TEST(ProcessRunner, HungProgramIsKilledAtTheDeadline) {
  ProcessRunner r;
  Result<CommandOutput> out = r.Run({"sleep", "30"}, 200ms);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), ErrorCode::kUnavailable);
}

// A scontrol stand-in started while gpulet has SIGTERM/SIGINT/SIGHUP blocked (as every gpulet
// command does, to wait for them with sigtimedwait) must start with an empty signal mask:
// otherwise `scontrol` ignores a SIGTERM and a timeout cannot stop it politely.
TEST(ProcessRunner, ScontrolStandInStartsWithAnEmptySignalMask) {
  char dir_template[] = "/tmp/gpulet-scontrol-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string scontrol = dir + "/scontrol";
  {
    std::ofstream f(scontrol);
    f << "#!/bin/sh\n"
         "echo \"NodeName=$4 State=IDLE $(grep '^SigBlk:' /proc/self/status | tr -d '\\t')\"\n";
  }
  ASSERT_EQ(chmod(scontrol.c_str(), 0755), 0);

  sigset_t set, old;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, &old);
  SlurmClient client(std::make_shared<ProcessRunner>(), scontrol, 10s);
  Result<CommandOutput> out = ProcessRunner().Run({scontrol, "show", "node", "-o", "n1"}, 10s);
  Result<NodeStatus> node = client.ShowNode("n1");
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  std::filesystem::remove_all(dir);

  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_THAT(out->out, HasSubstr("SigBlk:0000000000000000")) << out->out;
  ASSERT_TRUE(node.ok()) << node.status().message();
  EXPECT_EQ(node->name, "n1");
}

TEST(ProcessRunner, OutputIsBounded) {
  ProcessRunner r;
  // Far more than any scontrol answer: the runner keeps a bounded prefix instead of all of it.
  Result<CommandOutput> out = r.Run({"sh", "-c", "head -c 40000000 /dev/zero"}, 30s);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(out->out.size(), ProcessRunner::kMaxOutput);
  EXPECT_TRUE(out->truncated);
}

}  // namespace
}  // namespace gpulet::slurm
