// A scripted CommandRunner for unit tests: answers by the joined command line, records calls.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "slurm/command.h"

namespace gpulet::slurm::testing {

class FakeRunner : public CommandRunner {
 public:
  // Answer for an exact command line ("scontrol show node -o n1"); unknown lines exit 1.
  void On(const std::string& line, Result<CommandOutput> answer) {
    std::lock_guard<std::mutex> lock(mu_);
    answers_.insert_or_assign(line, std::move(answer));
  }
  std::vector<std::string> calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  Result<CommandOutput> Run(const std::vector<std::string>& argv,
                            std::chrono::milliseconds) const override {
    std::string line;
    for (const std::string& a : argv) line += (line.empty() ? "" : " ") + a;
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(line);
    auto it = answers_.find(line);
    if (it == answers_.end()) return CommandOutput{1, "", "unexpected command: " + line};
    return it->second;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, Result<CommandOutput>> answers_;
  mutable std::vector<std::string> calls_;
};

}  // namespace gpulet::slurm::testing
