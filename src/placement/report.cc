#include "placement/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace gpulet::placement {
namespace {

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

std::string RenderCsv(std::span<const PolicySummary> summaries) {
  std::string out =
      "policy,arrived_load,allocation_mean,allocation_stddev,allocation_min,allocation_max,"
      "fragmented_gpus_mean,fragmented_of_idle_mean,runs\n";
  for (const PolicySummary& s : summaries) {
    for (const PointSummary& p : s.points) {
      out += s.policy + "," + Fixed(p.arrived, 2) + "," + Fixed(p.mean, 6) + "," +
             Fixed(p.stddev, 6) + "," + Fixed(p.min, 6) + "," + Fixed(p.max, 6) + "," +
             Fixed(p.fragmented_gpus, 2) + "," + Fixed(p.fragmented_of_idle, 6) + "," +
             std::to_string(p.runs) + "\n";
    }
  }
  return out;
}

std::string RenderJson(const ReportInfo& info, std::span<const PolicySummary> summaries,
                       std::span<const ReplayResult> runs) {
  nlohmann::ordered_json j;
  j["trace"] = info.trace;
  j["nodes"] = info.nodes;
  j["load"] = info.load;
  j["policies"] = nlohmann::ordered_json::array();
  for (const PolicySummary& s : summaries) {
    nlohmann::ordered_json p;
    p["policy"] = s.policy;
    p["seeds"] = s.seeds;
    p["points"] = nlohmann::ordered_json::array();
    for (const PointSummary& pt : s.points) {
      p["points"].push_back({{"arrived_load", pt.arrived},
                             {"allocation_mean", pt.mean},
                             {"allocation_stddev", pt.stddev},
                             {"allocation_min", pt.min},
                             {"allocation_max", pt.max},
                             {"fragmented_gpus_mean", pt.fragmented_gpus},
                             {"fragmented_of_idle_mean", pt.fragmented_of_idle},
                             {"runs", pt.runs}});
    }
    p["failed_pods_mean"] = s.failed_pods_mean;
    p["failed_pods_total_mean"] = s.failed_pods_total_mean;
    j["policies"].push_back(std::move(p));
  }
  j["runs"] = nlohmann::ordered_json::array();
  for (const ReplayResult& r : runs) {
    nlohmann::ordered_json run;
    run["policy"] = r.policy;
    run["seed"] = r.seed;
    run["capacity_gpus"] = static_cast<double>(r.capacity_milli) / kMilliPerGpu;
    run["pods_arrived"] = r.pods_arrived;
    run["pods_failed"] = r.pods_failed;
    nlohmann::ordered_json failed = nlohmann::ordered_json::object();
    for (const auto& [type, count] : r.failed)
      failed[type] = {{"pods", count.pods},
                      {"gpus", static_cast<double>(count.gpu_milli) / kMilliPerGpu}};
    run["failed"] = std::move(failed);
    run["allocation"] = nlohmann::ordered_json::array();
    for (const LoadPoint& p : r.points)
      run["allocation"].push_back({{"arrived_load", p.arrived},
                                   {"allocation", p.allocated},
                                   {"fragmented_gpus", p.fragmented_gpus},
                                   {"fragmented_of_idle", p.fragmented_of_idle}});
    run["final"] = {{"arrived_load", r.final.arrived},
                    {"allocation", r.final.allocated},
                    {"fragmented_gpus", r.final.fragmented_gpus},
                    {"fragmented_of_idle", r.final.fragmented_of_idle}};
    j["runs"].push_back(std::move(run));
  }
  // Names come from files and flags: bytes that are not UTF-8 are replaced, not thrown about.
  return j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

std::string RenderSvg(const ReportInfo& info, std::span<const PolicySummary> summaries) {
  static const char* kColors[] = {"#7f7f7f", "#1f77b4", "#2ca02c", "#9467bd",
                                  "#ff7f0e", "#d62728", "#8c564b", "#e377c2"};
  const double width = 760, height = 480, left = 70, right = 190, top = 40, bottom = 60;
  const double plot_w = width - left - right, plot_h = height - top - bottom;
  double x_min = 1e9, x_max = -1e9, y_min = 1;
  for (const PolicySummary& s : summaries)
    for (const PointSummary& p : s.points) {
      x_min = std::min(x_min, p.arrived);
      x_max = std::max(x_max, p.arrived);
      y_min = std::min(y_min, p.min);
    }
  if (x_min > x_max) x_min = 0.5, x_max = 1.3;
  if (x_max - x_min < 1e-9) x_max = x_min + 0.05;
  y_min = std::max(0.0, std::floor(y_min * 20 - 1e-9) / 20);  // down to a 5 % step
  const double y_max = 1.0;
  if (y_max - y_min < 0.05) y_min = y_max - 0.05;
  auto X = [&](double v) { return left + (v - x_min) / (x_max - x_min) * plot_w; };
  auto Y = [&](double v) { return top + (y_max - v) / (y_max - y_min) * plot_h; };

  std::string o;
  o += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + Fixed(width, 0) + "\" height=\"" +
       Fixed(height, 0) + "\" viewBox=\"0 0 " + Fixed(width, 0) + " " + Fixed(height, 0) +
       "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o += "<text x=\"" + Fixed(left, 0) +
       "\" y=\"24\" font-size=\"14\">GPU allocation ratio vs. "
       "arrived GPU load: " +
       Escape(info.trace) + "</text>\n";
  // Grid and ticks: x every 10 %, y every 5 %.
  for (int pct = static_cast<int>(std::ceil(x_min * 10 - 1e-9)) * 10;
       pct <= static_cast<int>(std::floor(x_max * 100 + 1e-9)); pct += 10) {
    const double x = X(pct / 100.0);
    o += "<line x1=\"" + Fixed(x, 1) + "\" y1=\"" + Fixed(top, 1) + "\" x2=\"" + Fixed(x, 1) +
         "\" y2=\"" + Fixed(top + plot_h, 1) + "\" stroke=\"#ddd\"/>\n";
    o += "<text x=\"" + Fixed(x, 1) + "\" y=\"" + Fixed(top + plot_h + 18, 1) +
         "\" text-anchor=\"middle\">" + std::to_string(pct) + "%</text>\n";
  }
  for (int pct = static_cast<int>(std::lround(y_min * 100)); pct <= 100; pct += 5) {
    const double y = Y(pct / 100.0);
    o += "<line x1=\"" + Fixed(left, 1) + "\" y1=\"" + Fixed(y, 1) + "\" x2=\"" +
         Fixed(left + plot_w, 1) + "\" y2=\"" + Fixed(y, 1) + "\" stroke=\"#ddd\"/>\n";
    o += "<text x=\"" + Fixed(left - 8, 1) + "\" y=\"" + Fixed(y + 4, 1) +
         "\" text-anchor=\"end\">" + std::to_string(pct) + "%</text>\n";
  }
  o += "<rect x=\"" + Fixed(left, 1) + "\" y=\"" + Fixed(top, 1) + "\" width=\"" +
       Fixed(plot_w, 1) + "\" height=\"" + Fixed(plot_h, 1) +
       "\" fill=\"none\" stroke=\"#333\"/>\n";
  o += "<text x=\"" + Fixed(left + plot_w / 2, 1) + "\" y=\"" + Fixed(height - 16, 1) +
       "\" text-anchor=\"middle\">arrived GPU request / cluster GPU capacity</text>\n";
  o += "<text transform=\"translate(18," + Fixed(top + plot_h / 2, 1) +
       ") rotate(-90)\" text-anchor=\"middle\">allocated GPU share / capacity</text>\n";
  for (size_t i = 0; i < summaries.size(); ++i) {
    const PolicySummary& s = summaries[i];
    const std::string color = kColors[i % (sizeof kColors / sizeof kColors[0])];
    if (s.points.empty()) continue;
    if (s.seeds.size() > 1) {  // the seeds' spread
      std::string band;
      for (const PointSummary& p : s.points)
        band += Fixed(X(p.arrived), 1) + "," + Fixed(Y(p.max), 1) + " ";
      for (auto it = s.points.rbegin(); it != s.points.rend(); ++it)
        band += Fixed(X(it->arrived), 1) + "," + Fixed(Y(it->min), 1) + " ";
      o += "<polygon points=\"" + band + "\" fill=\"" + color +
           "\" fill-opacity=\"0.15\" stroke=\"none\"/>\n";
    }
    std::string line;
    for (const PointSummary& p : s.points)
      line += Fixed(X(p.arrived), 1) + "," + Fixed(Y(p.mean), 1) + " ";
    o += "<polyline points=\"" + line + "\" fill=\"none\" stroke=\"" + color +
         "\" stroke-width=\"2\"/>\n";
    const double ly = top + 10 + 20 * static_cast<double>(i);
    const double lx = left + plot_w + 16;
    o += "<line x1=\"" + Fixed(lx, 1) + "\" y1=\"" + Fixed(ly, 1) + "\" x2=\"" + Fixed(lx + 24, 1) +
         "\" y2=\"" + Fixed(ly, 1) + "\" stroke=\"" + color + "\" stroke-width=\"2\"/>\n";
    o += "<text x=\"" + Fixed(lx + 30, 1) + "\" y=\"" + Fixed(ly + 4, 1) + "\">" +
         Escape(s.policy) + " (" + Fixed(s.points.back().mean * 100, 1) + "%)</text>\n";
  }
  o += "</svg>\n";
  return o;
}

}  // namespace gpulet::placement
