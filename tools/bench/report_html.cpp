// The HTML report of `tandem bench compare`: one file, inline SVG, no script or network.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <sstream>

#include "tools/bench/compare.h"

namespace tandem::bench {
namespace {

struct series {
  std::string label, color;
  std::vector<std::pair<double, double>> points;  // (x, y)
};

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else o += c;
  }
  return o;
}

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", v);
  return b;
}

// A line chart with axes, five ticks per axis and a legend.
std::string chart(const std::string& title, const std::string& xlabel, const std::string& ylabel,
                  const std::vector<series>& all, bool steps) {
  const double W = 560, H = 320, L = 60, R = 20, T = 30, B = 45;
  double x0 = 1e300, x1 = -1e300, y0 = 0, y1 = -1e300;
  for (const auto& s : all)
    for (auto [x, y] : s.points) {
      x0 = std::min(x0, x);
      x1 = std::max(x1, x);
      y1 = std::max(y1, y);
    }
  if (x0 > x1) x0 = 0, x1 = 1;
  if (x1 == x0) x1 = x0 + 1;
  if (!(y1 > y0)) y1 = 1;
  x0 = std::min(x0, 0.0);
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };
  std::ostringstream o;
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
    << "' font-family='sans-serif' font-size='11'>";
  o << "<text x='" << W / 2 << "' y='18' text-anchor='middle' font-size='13'>" << esc(title) << "</text>";
  o << "<line x1='" << L << "' y1='" << H - B << "' x2='" << W - R << "' y2='" << H - B << "' stroke='#333'/>";
  o << "<line x1='" << L << "' y1='" << T << "' x2='" << L << "' y2='" << H - B << "' stroke='#333'/>";
  for (int i = 0; i <= 4; ++i) {
    const double xv = x0 + (x1 - x0) * i / 4, yv = y0 + (y1 - y0) * i / 4;
    o << "<text x='" << px(xv) << "' y='" << H - B + 15 << "' text-anchor='middle'>" << fmt(xv) << "</text>";
    o << "<text x='" << L - 5 << "' y='" << py(yv) + 4 << "' text-anchor='end'>" << fmt(yv) << "</text>";
    o << "<line x1='" << L << "' y1='" << py(yv) << "' x2='" << W - R << "' y2='" << py(yv) << "' stroke='#eee'/>";
  }
  o << "<text x='" << (L + W - R) / 2 << "' y='" << H - 8 << "' text-anchor='middle'>" << esc(xlabel) << "</text>";
  o << "<text transform='translate(14," << (T + H - B) / 2 << ") rotate(-90)' text-anchor='middle'>" << esc(ylabel)
    << "</text>";
  int li = 0;
  for (const auto& s : all) {
    o << "<polyline fill='none' stroke='" << s.color << "' stroke-width='2' points='";
    double prev_y = 0;
    bool first = true;
    for (auto [x, y] : s.points) {
      if (steps && !first) o << px(x) << "," << py(prev_y) << " ";
      o << px(x) << "," << py(y) << " ";
      prev_y = y;
      first = false;
    }
    o << "'/>";
    if (!steps)
      for (auto [x, y] : s.points)
        o << "<circle cx='" << px(x) << "' cy='" << py(y) << "' r='3' fill='" << s.color << "'/>";
    o << "<rect x='" << L + 10 << "' y='" << T + 5 + 16 * li << "' width='12' height='3' fill='" << s.color << "'/>";
    o << "<text x='" << L + 27 << "' y='" << T + 10 + 16 * li << "'>" << esc(s.label) << "</text>";
    ++li;
  }
  o << "</svg>";
  return o.str();
}

series cdf(const std::string& label, const std::string& color, std::vector<double> v_ms) {
  series s{label, color, {}};
  std::sort(v_ms.begin(), v_ms.end());
  for (size_t i = 0; i < v_ms.size(); ++i) s.points.emplace_back(v_ms[i], double(i + 1) / double(v_ms.size()));
  return s;
}

}  // namespace

std::string html_report(const compare_result& r, const compare_options& o) {
  const std::string palette[] = {"#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};
  const double common = r.explained_rate;
  std::vector<series> ttft, tpot, good;
  const auto names = contender_names(o);
  for (size_t m = 0; m < names.size(); ++m) {
    const std::string& mode = names[m];
    const std::string& color = palette[m % std::size(palette)];
    series g{mode, color, {}};
    for (const auto& run : r.runs) {
      if (run.mode != mode) continue;
      g.points.emplace_back(run.rate, run.report.figures.goodput);
      if (run.rate != common) continue;
      std::vector<double> t1, t2;
      for (const auto& q : run.report.outcomes) {
        if (!q.ok) continue;
        t1.push_back(q.ttft_s * 1e3);
        if (auto t = tpot_of(q)) t2.push_back(*t * 1e3);
      }
      ttft.push_back(cdf(mode, color, t1));
      tpot.push_back(cdf(mode, color, t2));
    }
    std::sort(g.points.begin(), g.points.end());
    good.push_back(std::move(g));
  }
  std::ostringstream h;
  h << "<!doctype html><html><head><meta charset='utf-8'><title>tandem bench compare: " << esc(o.trace)
    << "</title><style>body{font-family:sans-serif;max-width:1200px;margin:20px auto;color:#222}"
       "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
       ".v{background:#f4f4f4;padding:10px;border-left:4px solid #1f77b4}</style></head><body>";
  std::string title;
  for (const auto& n : names) title += (title.empty() ? "" : " vs ") + n;
  h << "<h1>" << esc(title) << ": " << esc(o.trace) << " trace</h1>";
  h << "<p class='v'><b>Verdict.</b> " << esc(r.verdict) << "</p>";
  h << "<p>" << o.requests << " requests per run; " << o.total_threads
    << " threads in all (colocated: one worker with all of them; disaggregated: a prefill and a decode worker with "
       "half each; "
       "shared: those two workers, each keeping its half while busy and computing on the other's while it is idle); "
    << (o.against.empty() ? "tandem's WebSocket client" : "the OpenAI API (SSE) for every server")
    << "; SLO attainment target " << 100 * o.attainment << "%.</p>";
  h << chart("Goodput vs offered rate", "offered rate (req/s)", "goodput (req/s meeting the SLOs)", good, false);
  if (common > 0) {
    h << "<br>" << chart("TTFT CDF at " + fmt(common) + " req/s", "TTFT (ms)", "fraction of requests", ttft, true);
    h << chart("TPOT CDF at " + fmt(common) + " req/s", "TPOT (ms)", "fraction of requests", tpot, true);
  }
  h << "<h2>Runs</h2><table><tr><th>mode</th><th>rate</th><th>goodput</th><th>throughput</th><th>SLO %</th>"
       "<th>TTFT p50</th><th>TTFT p90</th><th>TPOT p50</th><th>TPOT p90</th><th>KV handoff ms</th><th>failed</th></tr>";
  auto row = [&](const mode_run& m, const std::string& tag) {
    const auto& f = m.report.figures;
    const double handoff = m.report.server.is_object() ? double(m.report.server.value("handoff_ms_mean", 0.0)) : 0.0;
    h << "<tr><td>" << m.mode << tag << "</td><td>" << fmt(m.rate) << "</td><td>" << fmt(f.goodput) << "</td><td>"
      << fmt(f.request_throughput) << "</td><td>" << fmt(100 * f.slo_attainment) << "</td><td>"
      << fmt(f.ttft_s.p50 * 1e3) << "</td><td>" << fmt(f.ttft_s.p90 * 1e3) << "</td><td>" << fmt(f.tpot_s.p50 * 1e3)
      << "</td><td>" << fmt(f.tpot_s.p90 * 1e3) << "</td><td>" << fmt(handoff) << "</td><td>" << f.failed
      << "</td></tr>";
  };
  for (const auto& m : r.runs) row(m, "");
  for (const auto& m : r.chaos_runs) row(m, " (chaos)");
  h << "</table><p>Latencies in ms, rates in requests per second.</p></body></html>\n";
  return h.str();
}

}  // namespace tandem::bench
