// gpulet-kubelet-harness: plays the kubelet's part of the device plugin API on a directory, so a
// user can check that a plugin registers, advertises the devices it should, and allocates; the
// demo uses it to show the flow. One line per event on stdout (key=value); exit 0 when every
// requested check passed, 1 when one failed, 2 on a usage error.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <thread>

#include "kubelet/kubelet_harness.h"

namespace {

using gpulet::testing::HarnessDevice;
using gpulet::testing::KubeletHarness;
using gpulet::testing::ResourceState;

std::mutex out_mu;

void Print(const std::string& line) {
  std::lock_guard<std::mutex> lock(out_mu);
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

std::string Join(const std::vector<std::string>& v, const char* sep = ",") {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

std::string Quoted(const std::string& s) { return "\"" + s + "\""; }

std::string FormatAllocation(const v1beta1::ContainerAllocateResponse& r) {
  std::vector<std::string> envs, mounts, devices, annotations, cdi;
  for (const auto& [k, v] : r.envs()) envs.push_back(k + "=" + v);
  for (const auto& m : r.mounts()) {
    mounts.push_back(m.host_path() + ":" + m.container_path() + (m.read_only() ? ":ro" : ""));
  }
  for (const auto& d : r.devices()) {
    devices.push_back(d.host_path() + ":" + d.container_path() + ":" + d.permissions());
  }
  for (const auto& [k, v] : r.annotations()) annotations.push_back(k + "=" + v);
  for (const auto& c : r.cdi_devices()) cdi.push_back(c.name());
  std::sort(envs.begin(), envs.end());
  std::sort(annotations.begin(), annotations.end());
  return "envs=" + Quoted(Join(envs, ";")) + " mounts=" + Quoted(Join(mounts, ";")) +
         " device_specs=" + Quoted(Join(devices, ";")) +
         " annotations=" + Quoted(Join(annotations, ";")) +
         " cdi_devices=" + Quoted(Join(cdi, ";"));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "gpulet-kubelet-harness: serves the kubelet's Registration service on DIR/kubelet.sock,\n"
      "dials back every registering device plugin (GetDevicePluginOptions before replying, as\n"
      "the kubelet does), keeps one ListAndWatch stream per resource and prints one key=value\n"
      "line per event. Checks: --expect N healthy devices, --allocate K (preferred allocation\n"
      "then Allocate). Exit 0 when the checks pass, 1 when one fails, 2 on usage errors.\n"
      "Stop the real kubelet first, or point --dir at a scratch directory."};
  std::string dir;
  std::string resource = "nvidia.com/gpu";
  std::string pod_socket;
  int expect = -1;
  int allocate = 0;
  double timeout_s = 30;
  double restart_every_s = 0;
  double restart_downtime_s = 0;
  double duration_s = 0;
  double dial_timeout_s = 5;
  double removal_grace_s = 300;
  bool watch = false;
  app.add_option("--dir", dir, "device plugin directory to serve (kubelet.sock is created there)")
      ->required()
      ->envname("GPULET_HARNESS_DIR");
  app.add_option("--resource", resource, "resource to check")
      ->capture_default_str()
      ->envname("GPULET_HARNESS_RESOURCE");
  app.add_option("--expect", expect, "require exactly N healthy devices of --resource")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--allocate", allocate,
                 "ask for a preferred allocation of K healthy devices, then Allocate them and "
                 "print the response")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--timeout", timeout_s, "seconds to wait for registration and devices")
      ->capture_default_str();
  app.add_option("--restart-every", restart_every_s,
                 "with --watch: simulate a kubelet restart every S seconds (0: never)");
  app.add_option("--restart-downtime", restart_downtime_s,
                 "with --restart-every: seconds the simulated kubelet stays down (its streams "
                 "ended, its sockets not yet replaced; the real one's is about 2.5)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--watch", watch,
               "after the checks keep serving and printing events until SIGINT/SIGTERM (or "
               "--duration)");
  app.add_option("--duration", duration_s,
                 "with --watch: stop after S seconds (0: run until signalled)");
  app.add_option("--pod-resources-socket", pod_socket,
                 "pod-resources socket to serve (default DIR/pod-resources/kubelet.sock)");
  app.add_option("--dial-timeout", dial_timeout_s,
                 "seconds the dial-back GetDevicePluginOptions may take inside Register")
      ->capture_default_str();
  app.add_option("--removal-grace", removal_grace_s,
                 "seconds a resource whose stream ended keeps its Unhealthy devices")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  // Signals are taken synchronously by the main thread (sigtimedwait); block them everywhere.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto ms = [](double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); };
  gpulet::testing::HarnessOptions options;
  options.pod_resources_socket = pod_socket;
  options.dial_timeout = ms(dial_timeout_s);
  options.removal_grace = ms(removal_grace_s);
  KubeletHarness harness(options);
  if (auto st = harness.Start(dir); !st.ok()) {
    Print("result=fail reason=" + Quoted(st.message()));
    return 1;
  }
  Print("event=serving socket=" + harness.kubelet_socket() +
        " pod_resources_socket=" + harness.pod_resources_socket());

  // Events are printed by the printer thread as they come, and by the main thread before each
  // line of its own, so the output reads in order.
  uint64_t printed = 0;  // under out_mu
  auto print_pending = [&] {
    std::lock_guard<std::mutex> lock(out_mu);
    while (auto e = harness.NextEvent(printed, std::chrono::milliseconds(0))) {
      printed = e->seq;
      std::fputs((gpulet::testing::FormatEvent(*e) + "\n").c_str(), stdout);
    }
    std::fflush(stdout);
  };
  std::atomic<bool> done{false};
  std::thread printer([&] {
    while (!done.load()) {
      uint64_t after;
      {
        std::lock_guard<std::mutex> lock(out_mu);
        after = printed;
      }
      if (harness.NextEvent(after, std::chrono::milliseconds(200))) print_pending();
    }
  });
  auto say = [&](const std::string& line) {
    print_pending();
    Print(line);
  };
  auto finish = [&](int code) {
    done = true;
    printer.join();
    harness.Stop();
    print_pending();
    return code;
  };
  auto fail = [&](const std::string& why) {
    say("result=fail reason=" + Quoted(why));
    return finish(1);
  };

  const auto timeout = ms(timeout_s);
  if (auto st = harness.WaitForRegistration(resource, timeout); !st.ok()) {
    return fail(st.message());
  }
  auto first_list = [](const ResourceState& s) { return s.updates > 0; };
  auto expected = [&](const ResourceState& s) {
    return s.updates > 0 && static_cast<int>(s.HealthyCount()) == expect;
  };
  if (auto st = expect >= 0 ? harness.WaitFor(resource, expected, timeout)
                            : harness.WaitFor(resource, first_list, timeout);
      !st.ok()) {
    return fail(st.message());
  }

  if (allocate > 0) {
    std::vector<std::string> healthy;
    for (const HarnessDevice& d : harness.Devices(resource)) {
      if (d.healthy()) healthy.push_back(d.id);
    }
    if (static_cast<int>(healthy.size()) < allocate) {
      return fail("only " + std::to_string(healthy.size()) + " healthy devices, asked for " +
                  std::to_string(allocate));
    }
    std::vector<std::string> ids(healthy.begin(), healthy.begin() + allocate);
    auto state = harness.State(resource);
    if (state && state->options.get_preferred_allocation_available()) {
      auto preferred = harness.GetPreferredAllocation(resource, healthy, {}, allocate);
      if (!preferred.ok()) return fail(preferred.status().message());
      ids = *preferred;
      say("event=preferred resource=" + resource + " size=" + std::to_string(allocate) +
          " ids=" + Join(ids));
    }
    auto response = harness.Allocate(resource, ids);
    if (!response.ok()) return fail(response.status().message());
    say("event=allocated resource=" + resource + " ids=" + Join(ids) + " " +
        FormatAllocation(*response));
  }

  if (watch) {
    const auto start = std::chrono::steady_clock::now();
    auto next_restart = start + ms(restart_every_s);
    while (true) {
      auto now = std::chrono::steady_clock::now();
      auto wake = now + std::chrono::hours(1);
      if (duration_s > 0) wake = std::min(wake, start + ms(duration_s));
      if (restart_every_s > 0) wake = std::min(wake, next_restart);
      auto wait = std::chrono::duration_cast<std::chrono::nanoseconds>(wake - now);
      if (wait.count() < 0) wait = std::chrono::nanoseconds(0);
      timespec ts{static_cast<time_t>(wait.count() / 1000000000),
                  static_cast<long>(wait.count() % 1000000000)};
      if (sigtimedwait(&signals, nullptr, &ts) > 0) break;
      now = std::chrono::steady_clock::now();
      if (duration_s > 0 && now >= start + ms(duration_s)) break;
      if (restart_every_s > 0 && now >= next_restart) {
        if (auto st = harness.Restart(ms(restart_downtime_s)); !st.ok()) return fail(st.message());
        next_restart = now + ms(restart_every_s);
      }
    }
  }
  say("result=ok resource=" + resource +
      " registrations=" + std::to_string(harness.RegistrationCount(resource)));
  return finish(0);
}
