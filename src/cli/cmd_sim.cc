// gpulet sim: changes a running simulated node from another process (XIDs, ECC errors, telemetry
// overrides, lost GPUs). Every verb is one atomic update of <state dir>/control.json; every
// process whose simulated driver uses that state directory sees it on its next NVML call.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "gpu/nvml_api.h"
#include "sim/simulation.h"
#include "sim/telemetry.h"

namespace gpulet::cli {
namespace {

struct SimArgs {
  std::string gpu;
  std::optional<unsigned> mig;
  uint64_t xid = 0;
  uint64_t single_bit = 0, double_bit = 0;
  std::optional<unsigned> temperature, gpu_util, mem_util, power;
  std::optional<uint64_t> memory_used;
};

// The node named by --simulate / --sim-state, its fixture and its control file.
struct SimTarget {
  sim::SimulatedNode node;
  sim::Fixture fixture;
  std::unique_ptr<sim::ControlFile> control;
};

Result<SimTarget> OpenTarget(const GlobalOptions& global) {
  if (global.simulate.empty()) {
    return Status(ErrorCode::kUsage,
                  "gpulet sim needs --simulate FIXTURE (or GPULET_SIMULATE) to find the node");
  }
  Result<sim::SimulatedNode> node = sim::PrepareSimulation(global.simulate, global.sim_state);
  if (!node.ok()) return node.status();
  Result<sim::Fixture> fixture = sim::LoadFixture(node->fixture_path);
  if (!fixture.ok()) return fixture.status();
  SimTarget t{*node, *fixture, std::make_unique<sim::ControlFile>(node->state_dir)};
  return t;
}

std::string Describe(const sim::Fixture& f, const sim::DeviceRef& d) {
  const auto& g = f.gpus[d.gpu];
  if (d.mig) {
    const auto& m = g.mig[*d.mig];
    return "GPU " + std::to_string(d.gpu) + " MIG " + std::to_string(*d.mig) + " (" + m.uuid +
           ", GI " + std::to_string(m.gi) + " CI " + std::to_string(m.ci) + ")";
  }
  return "GPU " + std::to_string(d.gpu) + " (" + g.uuid + ")";
}

nlohmann::json ShowJson(const SimTarget& t) {
  nlohmann::json out;
  out["fixture"] = t.node.fixture_path;
  out["state_dir"] = t.node.state_dir;
  Result<sim::ControlState> state = t.control->Read();
  out["control"] = state.ok() ? nlohmann::json::parse(sim::ControlStateToJson(*state))
                              : nlohmann::json(state.status().message());
  const int64_t now = sim::WallClockMs();
  nlohmann::json gpus = nlohmann::json::array();
  for (const auto& g : t.fixture.gpus) {
    const sim::GpuOverrides* o = state.ok() ? state->Find(g.index) : nullptr;
    const sim::Telemetry tm = sim::ComputeTelemetry(t.fixture, g, now, o);
    gpus.push_back({{"index", g.index},
                    {"uuid", g.uuid},
                    {"lost", o != nullptr && o->lost},
                    {"temperature_c", tm.temperature_c},
                    {"gpu_util", tm.gpu_util},
                    {"mem_util", tm.mem_util},
                    {"power_w", tm.power_mw / 1000.0},
                    {"memory_used_mib", tm.memory_used_mib},
                    {"ecc_corrected", tm.ecc_corrected},
                    {"ecc_uncorrected", tm.ecc_uncorrected}});
  }
  out["gpus"] = gpus;
  return out;
}

// Adds a verb whose body gets the opened node; errors become the exit code.
CLI::App* AddVerb(CLI::App* sim, const std::string& name, const std::string& help,
                  GlobalOptions& global, int& exit_code, std::function<Status(SimTarget&)> body) {
  CLI::App* verb = sim->add_subcommand(name, help);
  verb->callback([&global, &exit_code, body = std::move(body)] {
    Result<SimTarget> target = OpenTarget(global);
    if (!target.ok()) {
      exit_code = ReportError(target.status());
      return;
    }
    Status s = body(*target);
    if (!s.ok()) exit_code = ReportError(s);
  });
  return verb;
}

void AddDeviceOptions(CLI::App* verb, SimArgs& a, bool with_mig) {
  verb->add_option("--gpu", a.gpu, "GPU index, GPU UUID or MIG UUID")->required();
  if (with_mig) verb->add_option("--mig", a.mig, "MIG device index on that GPU");
}

Result<sim::DeviceRef> Device(const SimTarget& t, const SimArgs& a) {
  return sim::FindDevice(t.fixture, a.gpu, a.mig);
}

// Verbs that act on a whole GPU refuse a MIG UUID rather than silently widening it.
Result<unsigned> WholeGpu(const SimTarget& t, const SimArgs& a) {
  Result<sim::DeviceRef> d = Device(t, a);
  if (!d.ok()) return d.status();
  if (d->mig) return Status(ErrorCode::kUsage, "this verb acts on a whole GPU, not a MIG device");
  return d->gpu;
}

}  // namespace

void RegisterSim(CLI::App& app, GlobalOptions& global, int& exit_code) {
  CLI::App* sim = app.add_subcommand(
      "sim", "Change a running simulated node (needs --simulate FIXTURE, optionally --sim-state)");
  sim->require_subcommand(1);
  auto a = std::make_shared<SimArgs>();

  CLI::App* xid =
      AddVerb(sim, "xid", "Queue an XID critical error event (e.g. 79, 48, 13)", global, exit_code,
              [a](SimTarget& t) -> Status {
                Result<sim::DeviceRef> d = Device(t, *a);
                if (!d.ok()) return d.status();
                Status s = sim::InjectXid(*t.control, t.fixture, *d, a->xid);
                if (s.ok()) {
                  std::printf("queued XID %llu on %s\n", static_cast<unsigned long long>(a->xid),
                              Describe(t.fixture, *d).c_str());
                }
                return s;
              });
  AddDeviceOptions(xid, *a, true);
  xid->add_option("--code", a->xid, "XID number")->required();

  CLI::App* ecc =
      AddVerb(sim, "ecc", "Raise ECC error counters and queue the matching ECC event", global,
              exit_code, [a](SimTarget& t) -> Status {
                Result<sim::DeviceRef> d = Device(t, *a);
                if (!d.ok()) return d.status();
                Status s = sim::InjectEcc(*t.control, t.fixture, *d, a->single_bit, a->double_bit);
                if (s.ok()) {
                  std::printf("added %llu single-bit and %llu double-bit ECC errors on %s\n",
                              static_cast<unsigned long long>(a->single_bit),
                              static_cast<unsigned long long>(a->double_bit),
                              Describe(t.fixture, *d).c_str());
                }
                return s;
              });
  AddDeviceOptions(ecc, *a, true);
  ecc->add_option("--single-bit", a->single_bit, "Corrected (single-bit) errors to add");
  ecc->add_option("--double-bit", a->double_bit, "Uncorrected (double-bit) errors to add");

  CLI::App* set = AddVerb(
      sim, "set", "Override telemetry until reset", global, exit_code, [a](SimTarget& t) -> Status {
        Result<unsigned> gpu = WholeGpu(t, *a);
        if (!gpu.ok()) return gpu.status();
        sim::GpuOverrides o;
        o.temperature_c = a->temperature;
        o.gpu_util = a->gpu_util;
        o.mem_util = a->mem_util;
        o.power_w = a->power;
        o.memory_used_mib = a->memory_used;
        if (!o.temperature_c && !o.gpu_util && !o.mem_util && !o.power_w && !o.memory_used_mib) {
          return Status(ErrorCode::kUsage,
                        "set needs at least one of --temperature, --gpu-util, --mem-util, "
                        "--power, --memory-used");
        }
        Status s = sim::SetOverrides(*t.control, *gpu, o);
        if (s.ok()) std::printf("updated GPU %u\n", *gpu);
        return s;
      });
  AddDeviceOptions(set, *a, false);
  set->add_option("--temperature", a->temperature, "GPU temperature, degrees C")
      ->check(CLI::Range(0, 150));
  set->add_option("--gpu-util", a->gpu_util, "GPU utilisation, percent")->check(CLI::Range(0, 100));
  set->add_option("--mem-util", a->mem_util, "Memory utilisation, percent")
      ->check(CLI::Range(0, 100));
  set->add_option("--power", a->power, "Power draw, W")->check(CLI::Range(0, 5000));
  set->add_option("--memory-used", a->memory_used, "Memory used, MiB");

  CLI::App* lose = AddVerb(sim, "lose", "Make every call on the GPU return NVML_ERROR_GPU_IS_LOST",
                           global, exit_code, [a](SimTarget& t) -> Status {
                             Result<unsigned> gpu = WholeGpu(t, *a);
                             if (!gpu.ok()) return gpu.status();
                             Status s = sim::SetLost(*t.control, *gpu, true);
                             if (s.ok()) std::printf("GPU %u is lost\n", *gpu);
                             return s;
                           });
  AddDeviceOptions(lose, *a, false);

  CLI::App* restore = AddVerb(sim, "restore", "Bring a lost GPU back", global, exit_code,
                              [a](SimTarget& t) -> Status {
                                Result<unsigned> gpu = WholeGpu(t, *a);
                                if (!gpu.ok()) return gpu.status();
                                Status s = sim::SetLost(*t.control, *gpu, false);
                                if (s.ok()) std::printf("GPU %u is back\n", *gpu);
                                return s;
                              });
  AddDeviceOptions(restore, *a, false);

  CLI::App* reset = AddVerb(
      sim, "reset", "Clear overrides, lost flags, ECC additions and (without --gpu) events", global,
      exit_code, [a](SimTarget& t) -> Status {
        std::optional<unsigned> gpu;
        if (!a->gpu.empty()) {
          Result<unsigned> g = WholeGpu(t, *a);
          if (!g.ok()) return g.status();
          gpu = *g;
        }
        Status s = sim::ResetState(*t.control, gpu);
        if (s.ok()) {
          std::printf("reset %s\n", gpu ? ("GPU " + std::to_string(*gpu)).c_str() : "all GPUs");
        }
        return s;
      });
  reset->add_option("--gpu", a->gpu, "GPU index or UUID (default: every GPU and the event queue)");

  AddVerb(sim, "show", "Print the control state and current telemetry as JSON", global, exit_code,
          [](SimTarget& t) -> Status {
            std::printf("%s\n", ShowJson(t).dump(2).c_str());
            return Status::Ok();
          });
}

}  // namespace gpulet::cli
