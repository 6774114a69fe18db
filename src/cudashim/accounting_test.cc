#include "cudashim/accounting.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>

namespace gpulet::cudashim {
namespace {

// A region of one GPU limited to 1000 bytes, and this process attached to it.
class AccountingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpulet-accounting-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ASSERT_EQ(CreateRegion(dir_, {{"GPU-a", 1000, 0}}), "");
    ASSERT_EQ(WriteLimitsFile(dir_ + "/" + kLimitsFileName, {{"GPU-a", 1000, 0}}), "");
    ASSERT_EQ(region_.Open(dir_), "");
    ASSERT_EQ(region_.LoadLimits(dir_ + "/" + kLimitsFileName), "");
    proc_.store(region_.Attach());
    ASSERT_GE(proc_.load(), 0);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  uint64_t Used() const { return region_.Usage().at(0).used; }
  // Charges `bytes` and records them under `key`, as an allocation does.
  void Allocate(uintptr_t key, uint64_t bytes, CUmemoryPool pool = nullptr) {
    ASSERT_TRUE(pool != nullptr || region_.Admit(proc_.load(), 0, bytes));
    std::lock_guard lock(mu_);
    RecordLocked(account_, records_, key, Charge{0, bytes, pool});
  }

  std::string dir_;
  Region region_;
  std::atomic<int> proc_{-1};
  Account account_{region_, proc_};
  std::mutex mu_;
  std::map<uintptr_t, Charge> records_;
};

TEST_F(AccountingTest, ANewRecordUnderAStaleKeyUnchargesTheStaleOne) {
  Allocate(0x1000, 300);
  Allocate(0x1000, 200);  // the driver handed the address out again; its free was never seen
  EXPECT_EQ(Used(), 200u);
  ASSERT_EQ(records_.size(), 1u);
  EXPECT_EQ(records_.at(0x1000).bytes, 200u);
}

TEST_F(AccountingTest, APoolBlockUnderAStaleKeyIsThePoolsCharge) {
  auto* pool = reinterpret_cast<CUmemoryPool>(0x5);
  ASSERT_TRUE(region_.Admit(proc_.load(), 0, 400));  // what the pool holds
  Allocate(0x2000, 100, pool);
  Allocate(0x2000, 50);
  EXPECT_EQ(Used(), 450u);  // the pool's 400 stay with the pool
}

TEST_F(AccountingTest, ATakenRecordPutBackAfterARefusal) {
  Allocate(0x3000, 300);
  Charge c;
  ASSERT_TRUE(TakeRecord(mu_, records_, uintptr_t{0x3000}, &c));
  EXPECT_FALSE(TakeRecord(mu_, records_, uintptr_t{0x3000}, &c));  // taken once
  EXPECT_EQ(c.bytes, 300u);
  PutBack(mu_, account_, records_, uintptr_t{0x3000}, c);  // the driver refused the free
  EXPECT_EQ(records_.at(0x3000).bytes, 300u);
  EXPECT_EQ(Used(), 300u);
}

TEST_F(AccountingTest, APutBackOverANewerRecordUnchargesTheOlder) {
  Allocate(0x4000, 300);
  Charge c;
  ASSERT_TRUE(TakeRecord(mu_, records_, uintptr_t{0x4000}, &c));
  Allocate(0x4000, 100);  // another thread got the same address meanwhile
  PutBack(mu_, account_, records_, uintptr_t{0x4000}, c);
  EXPECT_EQ(records_.at(0x4000).bytes, 100u);
  EXPECT_EQ(Used(), 100u);
}

TEST_F(AccountingTest, RechargeFollowsTheDriversSizeEvenPastTheLimit) {
  Allocate(0x5000, 600);
  account_.Recharge(0, 600, 1100);  // the driver chose a larger pitch: the memory exists
  EXPECT_EQ(Used(), 1100u);
  account_.Recharge(0, 1100, 500);
  EXPECT_EQ(Used(), 500u);
  account_.Uncharge(-1, 500);  // no slot: nothing
  account_.Uncharge(0, 0);
  EXPECT_EQ(Used(), 500u);
}

}  // namespace
}  // namespace gpulet::cudashim
