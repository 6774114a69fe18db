// gpulet quota: renders ResourceQuota + LimitRange per tenant namespace from a tenants file and
// checks the budgets against the fleet's inventory files (gpulet info --output json).
#include <cstdio>

#include "cli/commands.h"
#include "quota/quota.h"

namespace gpulet::cli {
namespace {

struct QuotaFlags {
  std::string tenants;
  std::vector<std::string> inventories;
  int shared_replicas = 0;
  bool allow_overcommit = false;
};

int RunQuota(const QuotaFlags& f) {
  Result<quota::TenantsFile> tenants = quota::LoadTenants(f.tenants);
  if (!tenants.ok()) return ReportError(tenants.status());
  if (!f.inventories.empty()) {
    quota::FleetCapacity fleet;
    for (const std::string& path : f.inventories) {
      Status s = quota::LoadInventory(fleet, path);
      if (!s.ok()) return ReportError(s);
    }
    quota::CheckOptions o;
    o.shared_replicas = f.shared_replicas;
    o.allow_overcommit = f.allow_overcommit;
    Result<quota::CheckReport> r = quota::CheckAgainstFleet(*tenants, fleet, o);
    if (!r.ok()) return ReportError(r.status());
    for (const std::string& w : r->warnings)
      std::fprintf(stderr, "gpulet: warning: %s\n", w.c_str());
  } else {
    std::fprintf(stderr,
                 "gpulet: warning: no --inventory: budgets not checked against the fleet\n");
  }
  std::fputs(quota::RenderManifests(*tenants).c_str(), stdout);
  return 0;
}

}  // namespace

void RegisterQuota(CLI::App& app, GlobalOptions& /*global*/, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "quota",
      "Render per-tenant ResourceQuota + LimitRange for GPU, shared GPU, MIG and GPU memory "
      "resources, checked against the fleet's inventory");
  auto f = std::make_shared<QuotaFlags>();
  cmd->add_option("--tenants", f->tenants, "Tenants file (YAML, see docs/quotas.md)")
      ->envname("GPULET_TENANTS")
      ->required();
  cmd->add_option("--inventory", f->inventories,
                  "Inventory of a node (gpulet info --output json); repeat for every node");
  cmd->add_option("--shared-replicas", f->shared_replicas,
                  "Replicas per shared GPU, to check sharedGpus against the fleet")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--allow-overcommit", f->allow_overcommit,
                "Budgets above the fleet's capacity are warnings, not errors");
  cmd->callback([f, &exit_code] { exit_code = RunQuota(*f); });
}

}  // namespace gpulet::cli
