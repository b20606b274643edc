#include "cli/benchmark_report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "speculative/cap.h"
#include "speculative/decode_report.h"
#include "text/jinja_strings.h"

namespace dspark::cli {
namespace {

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double median_of(const std::vector<TrialRun>& trials, double TrialRun::*field) {
  std::vector<double> values;
  for (const TrialRun& trial : trials) values.push_back(trial.*field);
  return median(std::move(values));
}

double mean(const std::vector<double>& values) {
  if (values.empty()) return 0.0;
  double total = 0.0;
  for (double value : values) total += value;
  return total / static_cast<double>(values.size());
}

std::vector<std::string> suites_of(const ArmResult& arm) {
  std::vector<std::string> suites;
  for (const PromptResult& prompt : arm.prompts) {
    if (std::find(suites.begin(), suites.end(), prompt.suite) == suites.end())
      suites.push_back(prompt.suite);
  }
  return suites;
}

// The mean over a suite's prompts of a per-prompt figure; for "" the mean of the suite means.
double suite_mean(const ArmResult& arm, const std::string& suite,
                  const std::function<double(const PromptResult&)>& figure) {
  if (suite.empty()) {
    std::vector<double> means;
    for (const std::string& name : suites_of(arm)) means.push_back(suite_mean(arm, name, figure));
    return mean(means);
  }
  std::vector<double> values;
  for (const PromptResult& prompt : arm.prompts) {
    if (prompt.suite == suite) values.push_back(figure(prompt));
  }
  return mean(values);
}

nlohmann::json calibration_json(const Calibration& calibration, int max_cap, int derived_cap) {
  nlohmann::json out = cost_curves_json(calibration.curves);
  out["key"] = calibration.key;
  out["from_cache"] = calibration.from_cache;
  if (calibration.stale) {
    out["stale_cache"] = {{"cached_width1_ms", calibration.stale->cached_ms},
                          {"now_width1_ms", calibration.stale->now_ms}};
  }
  out["seconds"] = calibration.seconds;
  out["max_cap"] = max_cap;
  out["derived_cap"] = derived_cap;
  out["prior_p"] = kDerivedCapPrior;
  return out;
}

}  // namespace

double PromptResult::tok_s() const {
  return median_of(trials, &TrialRun::tok_s);
}
double PromptResult::decode_tok_s() const {
  return median_of(trials, &TrialRun::decode_tok_s);
}
double PromptResult::accept() const {
  return median_of(trials, &TrialRun::accept);
}
double PromptResult::speedup() const {
  return median_of(trials, &TrialRun::speedup);
}

int64_t PromptResult::peak_rss_bytes() const {
  int64_t peak = 0;
  for (const TrialRun& trial : trials) peak = std::max(peak, trial.peak_rss_bytes);
  return peak;
}

bool PromptResult::matches_plain() const {
  return std::all_of(trials.begin(), trials.end(),
                     [](const TrialRun& t) { return t.matches_plain; });
}

double ArmResult::tok_s(const std::string& suite) const {
  return suite_mean(*this, suite, [](const PromptResult& p) { return p.tok_s(); });
}
double ArmResult::decode_tok_s(const std::string& suite) const {
  return suite_mean(*this, suite, [](const PromptResult& p) { return p.decode_tok_s(); });
}
double ArmResult::accept(const std::string& suite) const {
  return suite_mean(*this, suite, [](const PromptResult& p) { return p.accept(); });
}
double ArmResult::speedup(const std::string& suite) const {
  return suite_mean(*this, suite, [](const PromptResult& p) { return p.speedup(); });
}

int64_t ArmResult::peak_rss_bytes() const {
  int64_t peak = 0;
  for (const PromptResult& prompt : prompts) peak = std::max(peak, prompt.peak_rss_bytes());
  return peak;
}

std::vector<double> ArmResult::slot_acceptance() const {
  return dspark::slot_acceptance(totals);
}

std::string BenchmarkReport::decoding() const {
  if (temperature <= 0.0f) return "greedy";
  return fmt::format("temperature {}, seed {}", temperature, seed);
}

const Calibration& BenchmarkReport::calibration_for(DecodeMode mode) const {
  for (const DrafterCalibration& entry : drafter_calibrations) {
    if (parse_decode_mode(entry.mode) == mode) return entry.calibration;
  }
  return calibration;
}

double Roofline::ceiling_tok_s() const {
  return bytes_per_token > 0 ? bandwidth_all_gbs * 1e9 / static_cast<double>(bytes_per_token) : 0.0;
}

std::string format_arm(const BenchmarkReport& report, const ArmResult& arm) {
  std::string text =
      fmt::format("  {:<22} {:6.1f} tok/s e2e · {:6.1f} decode   accept {:.2f} ({:.2f}x)\n",
                  arm.label, arm.tok_s(), arm.decode_tok_s(), arm.accept(), arm.speedup());
  std::vector<std::string> parts;
  for (const std::string& suite : report.suites) {
    parts.push_back(fmt::format("{} {:.1f} {:.2f}x", suite, arm.tok_s(suite), arm.speedup(suite)));
  }
  text += "    " + fmt::format("{}", fmt::join(parts, "  ·  "));
  text += fmt::format("  ·  peak RSS {:.3f} GB", arm.peak_rss_bytes() / 1e9);
  return text;
}

nlohmann::json report_json(const BenchmarkReport& report) {
  nlohmann::json out;
  out["dspark"] = report.version;
  out["device"] = report.device;
  out["os"] = report.os;
  out["threads"] = report.threads;
  out["target"] = report.target;
  out["drafter"] = report.drafter;
  out["drafter_bits"] = report.drafter_bits;
  out["trials"] = report.trials;
  out["max_new_tokens"] = report.max_new_tokens;
  out["temperature"] = report.temperature;
  out["seed"] = report.seed;
  out["suites"] = report.suites;
  const double ceiling = report.roofline.ceiling_tok_s();
  out["roofline"] = {{"bytes_per_token", report.roofline.bytes_per_token},
                     {"bandwidth_1t_gbs", report.roofline.bandwidth_1t_gbs},
                     {"bandwidth_all_gbs", report.roofline.bandwidth_all_gbs},
                     {"ceiling_tok_s", ceiling}};
  out["calibration"] =
      calibration_json(report.calibration, report.calibration_max_cap, report.derived_cap);
  out["drafter_calibrations"] = nlohmann::json::object();
  for (const auto& entry : report.drafter_calibrations) {
    out["drafter_calibrations"][entry.mode] =
        calibration_json(entry.calibration, report.calibration_max_cap, entry.derived_cap);
  }
  out["skipped"] = nlohmann::json::array();
  for (const auto& [mode, reason] : report.skipped) {
    out["skipped"].push_back({{"mode", mode}, {"reason", reason}});
  }
  nlohmann::json runs = nlohmann::json::array();
  for (const ArmResult& arm : report.arms) {
    nlohmann::json run;
    run["run"] = arm.label;
    run["mode"] = decode_mode_name(arm.mode);
    run["cap_choice"] = arm.cap_choice;
    run["cap"] = arm.cap;
    run["tok_s"] = arm.tok_s();
    run["decode_tok_s"] = arm.decode_tok_s();
    run["accept"] = arm.accept();
    run["speedup"] = arm.speedup();
    run["decode_fraction_of_roofline"] = ceiling > 0 ? arm.decode_tok_s() / ceiling : 0.0;
    run["peak_rss_bytes"] = arm.peak_rss_bytes();
    run["slot_acceptance"] = arm.slot_acceptance();
    run["rounds"] = arm.totals.rounds;
    run["plain_steps"] = arm.totals.plain_steps;
    run["drafted"] = arm.totals.drafted;
    run["accepted"] = arm.totals.accepted;
    run["unverified"] = arm.totals.unverified;
    // Rounds whose drafts came from n-gram lookup: every round of a lookup arm, the pre-step's in a
    // +lookup arm.
    run["lookup_rounds"] = arm.totals.lookup_rounds;
    const CostCurves& curves = report.calibration_for(arm.mode).curves;
    if (arm.mode != DecodeMode::baseline && !curves.empty()) {
      run["derived_cap_measured"] =
          derive_cap(curves, report.calibration_max_cap, measured_survival(arm.totals));
    }
    nlohmann::json per_suite = nlohmann::json::object();
    for (const std::string& suite : report.suites) {
      per_suite[suite] = {{"tok_s", arm.tok_s(suite)},
                          {"decode_tok_s", arm.decode_tok_s(suite)},
                          {"accept", arm.accept(suite)},
                          {"speedup", arm.speedup(suite)}};
    }
    run["per_suite"] = per_suite;
    nlohmann::json prompts = nlohmann::json::array();
    bool all_match = true;
    for (const PromptResult& prompt : arm.prompts) {
      all_match = all_match && prompt.matches_plain();
      nlohmann::json trials = nlohmann::json::array();
      for (const TrialRun& trial : prompt.trials) {
        trials.push_back({{"tok_s", trial.tok_s},
                          {"decode_tok_s", trial.decode_tok_s},
                          {"accept", trial.accept},
                          {"generated", trial.generated},
                          {"speedup", trial.speedup},
                          {"peak_rss_bytes", trial.peak_rss_bytes}});
      }
      prompts.push_back({{"suite", prompt.suite},
                         {"id", prompt.id},
                         {"tok_s", prompt.tok_s()},
                         {"decode_tok_s", prompt.decode_tok_s()},
                         {"accept", prompt.accept()},
                         {"speedup", prompt.speedup()},
                         {"matches_plain", prompt.matches_plain()},
                         {"trials", trials}});
    }
    const bool compared = report.compares_tokens(arm.mode);
    if (!compared) {
      for (nlohmann::json& prompt : prompts) prompt["matches_plain"] = nullptr;
    }
    run["matches_plain"] = compared ? nlohmann::json(all_match) : nlohmann::json(nullptr);
    run["prompts"] = prompts;
    out["runs"].push_back(run);
  }
  if (!report.loads.empty()) {
    out["concurrency"] = nlohmann::json::array();
    for (const LoadRun& load : report.loads) {
      nlohmann::json entry = {{"run", load.arm},
                              {"sequences", load.sequences},
                              {"generations", load.generations},
                              {"generated_tokens", load.generated_tokens},
                              {"tok_s", load.median_tok_s()},
                              {"tok_s_trials", load.tok_s},
                              {"speedup", load.median_speedup()},
                              {"full_tok_s", load.median_full_tok_s()},
                              {"full_tok_s_trials", load.full_tok_s},
                              {"full_speedup", load.median_full_speedup()},
                              {"step_ms", load.step_ms},
                              {"sequences_per_step", load.sequences_per_step},
                              {"rows_per_step", load.rows_per_step},
                              {"drafts_per_round", load.drafts_per_round},
                              {"matches_plain", nullptr}};
      if (report.compares_tokens(load.mode)) {
        entry["matches_plain"] = load.matches_plain;
      }
      if (load.derived_cap >= 0) entry["derived_cap"] = load.derived_cap;
      out["concurrency"].push_back(entry);
    }
  }
  return out;
}

double LoadRun::median_tok_s() const {
  return tok_s.empty() ? 0.0 : median(tok_s);
}

double LoadRun::median_speedup() const {
  return speedup.empty() ? 0.0 : median(speedup);
}

double LoadRun::median_full_tok_s() const {
  return full_tok_s.empty() ? 0.0 : median(full_tok_s);
}

double LoadRun::median_full_speedup() const {
  return full_speedup.empty() ? 0.0 : median(full_speedup);
}

std::string format_load(const LoadRun& load) {
  std::string line = fmt::format(
      "  {:>2} sequences  {:<22} {:7.1f} tok/s ({:.2f}x) · step {:.1f} ms, {:.1f} sequences, "
      "{:.1f} rows",
      load.sequences, load.arm, load.median_tok_s(), load.median_speedup(), load.step_ms,
      load.sequences_per_step, load.rows_per_step);
  line += fmt::format(" · all decoding {:.1f} tok/s ({:.2f}x)", load.median_full_tok_s(),
                      load.median_full_speedup());
  if (load.derived_cap >= 0) line += fmt::format(" · derived cap {}", load.derived_cap);
  if (load.drafts_per_round > 0)
    line += fmt::format(" · {:.2f} drafts/round", load.drafts_per_round);
  if (!load.matches_plain) line += " (OUTPUT DIFFERS)";
  return line;
}

namespace {

// One chart of the --concurrency figure: a frame with y ticks from 0 and x ticks at given values,
// on a log2 or linear x axis.
struct LoadPanel {
  std::string title, x_label;
  double left = 0, top = 0, width = 0, height = 0;
  double x_min = 1, x_max = 2, y_max = 1;
  bool log_x = true;

  double x_of(double value) const {
    const auto at = [&](double v) { return log_x ? std::log2(v) : v; };
    return left + width * (at(value) - at(x_min)) / std::max(1e-9, at(x_max) - at(x_min));
  }
  double y_of(double value) const { return top + height - height * value / y_max; }

  std::string frame(const std::vector<double>& x_ticks, const char* y_format) const {
    std::string svg = fmt::format(
        "<text x=\"{}\" y=\"{}\" font-weight=\"bold\">{}</text>\n"
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999999\"/>\n",
        left, top - 10, jinja::html_escape(title), left, top, width, height);
    for (int tick = 0; tick <= 4; ++tick) {
      const double value = y_max * tick / 4.0;
      svg += fmt::format(
          "<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#e5e5e5\"/>\n"
          "<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n",
          left, y_of(value), left + width, y_of(value), left - 6, y_of(value) + 4,
          fmt::format(fmt::runtime(y_format), value));
    }
    for (double tick : x_ticks) {
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{:g}</text>\n",
                         x_of(tick), top + height + 16, tick);
    }
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                       left + width / 2, top + height + 34, jinja::html_escape(x_label));
    return svg;
  }

  // A line through (x, y) points with a dot at each.
  std::string series(const std::vector<std::pair<double, double>>& points, const std::string& color,
                     bool dashed) const {
    std::string svg, line;
    for (const auto& [x, y] : points) {
      line += fmt::format("{}{:.1f},{:.1f}", line.empty() ? "" : " ", x_of(x), y_of(y));
      svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", x_of(x),
                         y_of(y), color);
    }
    svg +=
        fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{}/>\n",
                    line, color, dashed ? " stroke-dasharray=\"6 4\"" : "");
    return svg;
  }
};

}  // namespace

std::string concurrency_svg(const BenchmarkReport& report) {
  constexpr double kPanelWidth = 300, kPanelHeight = 260, kLeft = 60, kTop = 70, kGap = 70;
  constexpr double kLegendWidth = 230;
  const std::vector<std::string> colors = {"#444444", "#1f77b4", "#d62728", "#2ca02c",
                                           "#9467bd", "#ff7f0e", "#8c564b"};
  std::vector<std::string> arms;
  std::vector<double> levels;
  double tok_s_max = 1.0, step_ms_max = 1.0, rows_max = 1.0, drafts_max = 1.0;
  for (const LoadRun& load : report.loads) {
    if (std::find(arms.begin(), arms.end(), load.arm) == arms.end()) arms.push_back(load.arm);
    if (std::find(levels.begin(), levels.end(), load.sequences) == levels.end()) {
      levels.push_back(load.sequences);
    }
    tok_s_max = std::max(tok_s_max, load.median_tok_s());
    step_ms_max = std::max(step_ms_max, load.step_ms);
    rows_max = std::max(rows_max, load.rows_per_step);
    drafts_max = std::max(drafts_max, load.drafts_per_round);
  }
  // The calibrated step cost of B verify rows, the curve the scheduler prices steps with.
  const std::vector<double>& calibrated = report.calibration.curves.verify_ms;
  for (size_t b = 0; b < calibrated.size(); ++b) {
    step_ms_max = std::max(step_ms_max, calibrated[b]);
    rows_max = std::max(rows_max, static_cast<double>(b + 1));
  }
  const double first = levels.empty() ? 1.0 : levels.front();
  const double last = levels.empty() ? 2.0 : std::max(levels.back(), first * 2);
  auto panel = [&](int index, std::string title, std::string x_label) {
    LoadPanel p;
    p.title = std::move(title);
    p.x_label = std::move(x_label);
    p.left = kLeft + index * (kPanelWidth + kGap);
    p.top = kTop;
    p.width = kPanelWidth;
    p.height = kPanelHeight;
    p.x_min = first;
    p.x_max = last;
    return p;
  };
  LoadPanel throughput = panel(0, "aggregate tok/s", "concurrent generations");
  throughput.y_max = tok_s_max * 1.1;
  LoadPanel steps = panel(1, "SPS(B): ms per step", "token rows per step (B)");
  steps.log_x = false;
  steps.x_min = 0;
  steps.x_max = std::ceil(rows_max * 1.05);
  steps.y_max = step_ms_max * 1.1;
  LoadPanel drafts = panel(2, "drafts verified per round", "concurrent generations");
  drafts.y_max = drafts_max * 1.1;

  const double width = kLeft + 3 * kPanelWidth + 2 * kGap + 20 + kLegendWidth;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.0f}\" height=\"{1:.0f}\" "
      "viewBox=\"0 0 {0:.0f} {1:.0f}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"{0:.0f}\" height=\"{1:.0f}\" fill=\"white\"/>\n",
      width, kTop + kPanelHeight + 80);
  svg += fmt::format(
      "<text x=\"{}\" y=\"24\" font-size=\"15\" font-weight=\"bold\">{}</text>\n", kLeft,
      jinja::html_escape(fmt::format("dspark benchmark · {} · under load (forwards batched into "
                                     "shared steps)",
                                     report.target)));
  std::vector<double> step_ticks;
  for (int tick = 0; tick <= 4; ++tick) step_ticks.push_back(std::round(steps.x_max * tick / 4));
  svg += throughput.frame(levels, "{:.0f}") + steps.frame(step_ticks, "{:.0f}") +
         drafts.frame(levels, "{:.1f}");

  std::string throughput_lines, step_lines, draft_lines;
  for (size_t a = 0; a < arms.size(); ++a) {
    const std::string& color = colors[a % colors.size()];
    std::vector<std::pair<double, double>> by_load, by_rows, drafted;
    for (const LoadRun& load : report.loads) {
      if (load.arm != arms[a]) continue;
      by_load.emplace_back(load.sequences, load.median_tok_s());
      by_rows.emplace_back(load.rows_per_step, load.step_ms);
      drafted.emplace_back(load.sequences, load.drafts_per_round);
    }
    throughput_lines += throughput.series(by_load, color, a == 0);
    step_lines += steps.series(by_rows, color, a == 0);
    if (a > 0) draft_lines += drafts.series(drafted, color, false);
    svg +=
        fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"{}\">{}</text>\n", width - kLegendWidth,
                    kTop + 16 + 18.0 * a, color, jinja::html_escape(arms[a]));
  }
  if (!calibrated.empty()) {
    std::vector<std::pair<double, double>> curve;
    for (size_t b = 0; b < calibrated.size(); ++b) curve.emplace_back(b + 1.0, calibrated[b]);
    step_lines += steps.series(curve, "#aaaaaa", true);
    svg += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#888888\">calibrated SPS(B), one sequence</text>\n",
        width - kLegendWidth, kTop + 16 + 18.0 * arms.size());
  }
  svg += fmt::format(
      "<g id=\"throughput\">\n{}</g>\n<g id=\"step-cost\">\n{}</g>\n"
      "<g id=\"drafts\">\n{}</g>\n",
      throughput_lines, step_lines, draft_lines);
  svg += fmt::format(
      "<text x=\"{}\" y=\"{:.1f}\" font-size=\"11\" fill=\"#333333\">{}</text>\n", kLeft,
      kTop + kPanelHeight + 58,
      jinja::html_escape(fmt::format("{} · {} threads · {} new tokens per generation, {} · medians "
                                     "of {} trials · step figures are means over each arm's steps "
                                     "· dspark {}",
                                     report.device, report.threads, report.max_new_tokens,
                                     report.decoding(), report.trials, report.version)));
  svg += "</svg>\n";
  return svg;
}

std::string report_svg(const BenchmarkReport& report) {
  constexpr double kPanelWidth = 300, kPanelHeight = 240, kLeft = 60, kTop = 70, kGap = 30;
  const std::vector<std::string> colors = {"#1f77b4", "#d62728", "#2ca02c",
                                           "#9467bd", "#ff7f0e", "#8c564b"};
  const size_t panels = std::max<size_t>(report.suites.size(), 1);
  const double width = kLeft + panels * (kPanelWidth + kGap) + 10;
  const double height = kTop + kPanelHeight + 110;

  double y_max = 1.0;
  for (const ArmResult& arm : report.arms) {
    for (const PromptResult& prompt : arm.prompts) y_max = std::max(y_max, prompt.decode_tok_s());
  }
  y_max *= 1.1;

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" viewBox=\"0 0 "
      "{:.0f} "
      "{:.0f}\" font-family=\"sans-serif\" font-size=\"12\">\n",
      width, height, width, height);
  svg += fmt::format("<rect width=\"{:.0f}\" height=\"{:.0f}\" fill=\"white\"/>\n", width, height);
  svg += fmt::format("<text x=\"{}\" y=\"22\" font-size=\"15\" font-weight=\"bold\">{}</text>\n",
                     kLeft,
                     jinja::html_escape(fmt::format(
                         "dspark benchmark · {} · decode tok/s per prompt", report.target)));

  // Legend: plain dashed, every speculative arm solid.
  double legend_x = kLeft;
  for (size_t a = 0; a < report.arms.size(); ++a) {
    const ArmResult& arm = report.arms[a];
    const bool plain = arm.mode == DecodeMode::baseline;
    const std::string color = plain ? "#444444" : colors[(a - 1) % colors.size()];
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"42\" x2=\"{:.1f}\" y2=\"42\" stroke=\"{}\" "
        "stroke-width=\"2\"{}/>\n",
        legend_x, legend_x + 24, color, plain ? " stroke-dasharray=\"6 4\"" : "");
    const std::string label =
        plain ? arm.label
              : fmt::format("{} ({:.2f}x, accept {:.2f})", arm.label, arm.speedup(), arm.accept());
    svg += fmt::format("<text x=\"{:.1f}\" y=\"46\">{}</text>\n", legend_x + 30,
                       jinja::html_escape(label));
    legend_x += 40 + 7.0 * static_cast<double>(label.size());
  }

  for (size_t s = 0; s < report.suites.size(); ++s) {
    const std::string& suite = report.suites[s];
    const double x0 = kLeft + s * (kPanelWidth + kGap);
    svg += fmt::format(
        "<rect x=\"{:.1f}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" "
        "stroke=\"#999999\"/>\n",
        x0, kTop, kPanelWidth, kPanelHeight);
    std::string title = suite;
    for (const ArmResult& arm : report.arms) {
      if (arm.mode != DecodeMode::baseline) title += fmt::format(" · {:.2f}x", arm.speedup(suite));
    }
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" font-weight=\"bold\">{}</text>\n", x0 + 4,
                       kTop - 6, jinja::html_escape(title));
    for (int tick = 0; tick <= 4; ++tick) {
      const double value = y_max * tick / 4.0;
      const double y = kTop + kPanelHeight - kPanelHeight * tick / 4.0;
      svg += fmt::format(
          "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e5e5e5\"/>\n",
          x0, y, x0 + kPanelWidth, y);
      if (s == 0) {
        svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{:.0f}</text>\n",
                           x0 - 6, y + 4, value);
      }
    }
    for (size_t a = 0; a < report.arms.size(); ++a) {
      const ArmResult& arm = report.arms[a];
      std::vector<double> values;
      for (const PromptResult& prompt : arm.prompts) {
        if (prompt.suite == suite) values.push_back(prompt.decode_tok_s());
      }
      if (values.empty()) continue;
      const bool plain = arm.mode == DecodeMode::baseline;
      const std::string color = plain ? "#444444" : colors[(a - 1) % colors.size()];
      const double step = values.size() > 1 ? (kPanelWidth - 30) / (values.size() - 1) : 0.0;
      std::string points;
      for (size_t i = 0; i < values.size(); ++i) {
        const double x = x0 + 15 + step * i;
        const double y = kTop + kPanelHeight - kPanelHeight * values[i] / y_max;
        points += fmt::format("{}{:.1f},{:.1f}", i == 0 ? "" : " ", x, y);
        svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"{}\"/>\n", x, y,
                           color);
      }
      svg += fmt::format(
          "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{}/>\n", points,
          color, plain ? " stroke-dasharray=\"6 4\"" : "");
    }
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{} prompts</text>\n",
                       x0 + kPanelWidth / 2, kTop + kPanelHeight + 16, jinja::html_escape(suite));
  }
  svg += fmt::format(
      "<text x=\"16\" y=\"{:.1f}\" transform=\"rotate(-90 16 {:.1f})\" "
      "text-anchor=\"middle\">decode tok/s "
      "(median of {} trials)</text>\n",
      kTop + kPanelHeight / 2, kTop + kPanelHeight / 2, report.trials);

  std::string drafter_caps;
  for (const auto& entry : report.drafter_calibrations) {
    drafter_caps += fmt::format(", {} with its drafter {}", entry.derived_cap, entry.mode);
  }
  const Roofline& roofline = report.roofline;
  const std::vector<std::string> caption = {
      fmt::format("{} · {} threads · {} · {} new tokens, {} · dspark {}", report.device,
                  report.threads, report.os, report.max_new_tokens, report.decoding(),
                  report.version),
      fmt::format("roofline: {:.1f} MB read per token / {:.1f} GB/s measured read bandwidth ({} "
                  "threads; {:.1f} "
                  "GB/s one thread) = {:.0f} tok/s ceiling; plain decode reaches {:.0f}%",
                  roofline.bytes_per_token / 1e6, roofline.bandwidth_all_gbs, report.threads,
                  roofline.bandwidth_1t_gbs, roofline.ceiling_tok_s(),
                  report.arms.empty() || roofline.ceiling_tok_s() <= 0
                      ? 0.0
                      : 100.0 * report.arms[0].decode_tok_s() / roofline.ceiling_tok_s()),
      fmt::format("derived cap {} for the target alone{} (calibrated costs, prior p = {:.2f}); "
                  "speed-ups are medians of ratios to plain decoding run side by side",
                  report.derived_cap, drafter_caps, kDerivedCapPrior)};
  for (size_t i = 0; i < caption.size(); ++i) {
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" font-size=\"11\" fill=\"#333333\">{}</text>\n",
                       kLeft, kTop + kPanelHeight + 44 + 16.0 * i, jinja::html_escape(caption[i]));
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace dspark::cli
