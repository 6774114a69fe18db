#include "broker/journal.h"

#include <nlohmann/json.hpp>

#include "common/files.h"

namespace gpulet::broker {

std::string JournalToJson(const Journal& j) {
  nlohmann::json nodes = nlohmann::json::object();
  for (const auto& [name, e] : j.nodes) {
    nodes[name] = {
        {"owner", OwnerName(e.owner)}, {"step", e.step}, {"since", e.since},
        {"stepSince", e.step_since},   {"gpus", e.gpus}, {"lastPodSeen", e.last_pod_seen}};
  }
  nlohmann::json returned = nlohmann::json::object();
  for (const auto& [name, t] : j.returned_at) returned[name] = t;
  nlohmann::json out = {{"version", 1},
                        {"nodes", nodes},
                        {"demandStreak", j.demand_streak},
                        {"quietStreak", j.quiet_streak},
                        {"lastTransition", j.last_transition},
                        {"returnedAt", returned}};
  return out.dump(2) + "\n";
}

Result<Journal> JournalFromJson(const std::string& text, const std::string& source) {
  nlohmann::json in = nlohmann::json::parse(text, nullptr, false);
  auto bad = [&](const std::string& field, const std::string& problem) {
    return Status(ErrorCode::kInvalidInput, source + ": " + field + ": " + problem);
  };
  if (in.is_discarded() || !in.is_object()) return bad("(top)", "not a JSON object");
  if (in.value("version", 0) != 1) return bad("version", "must be 1");
  Journal j;
  try {
    for (const auto& [name, e] : in.at("nodes").items()) {
      JournalEntry entry;
      if (!ParseOwner(e.at("owner").get<std::string>(), &entry.owner)) {
        return bad("nodes." + name + ".owner", "unknown owner " + e.at("owner").dump());
      }
      entry.step = e.at("step").get<std::string>();
      entry.since = e.at("since").get<TimeMs>();
      entry.step_since = e.at("stepSince").get<TimeMs>();
      entry.gpus = e.at("gpus").get<int>();
      entry.last_pod_seen = e.at("lastPodSeen").get<TimeMs>();
      if (entry.owner != Owner::kSlurm) j.nodes[name] = entry;
    }
    j.demand_streak = in.at("demandStreak").get<int>();
    j.quiet_streak = in.at("quietStreak").get<int>();
    j.last_transition = in.at("lastTransition").get<TimeMs>();
    for (const auto& [name, t] : in.at("returnedAt").items()) j.returned_at[name] = t.get<TimeMs>();
  } catch (const nlohmann::json::exception& e) {
    return bad("(content)", e.what());
  }
  return j;
}

Result<Journal> LoadJournal(const std::string& path) {
  Result<std::string> text = ReadFileBounded(path, 64u << 20);
  if (!text.ok()) {
    if (text.status().code() == ErrorCode::kNotFound) return Journal{};
    return Status(ErrorCode::kInvalidInput,
                  path + ": cannot read the journal: " + text.status().message());
  }
  return JournalFromJson(*text, path);
}

Status SaveJournal(const std::string& path, const Journal& journal) {
  return WriteFileAtomic(path, JournalToJson(journal), 0644);
}

}  // namespace gpulet::broker
