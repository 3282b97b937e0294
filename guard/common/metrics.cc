// metrics.cc — the registry's bookkeeping and the text exposition (format
// 0.0.4: https://prometheus.io/docs/instrumenting/exposition_formats/).
#include "guard/common/metrics.h"

#include <cmath>
#include <cstdio>

#include "consensus/assert.h"

namespace lockstep {

namespace {

bool ValidName(const std::string& s, bool label) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); i++) {
    char c = s[i];
    bool letter =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (!label && c == ':');
    if (!letter && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return !(label && s.size() >= 2 && s[0] == '_' && s[1] == '_');  // reserved
}

// HELP text escapes \ and newline; label values also ".
std::string Escape(const std::string& s, bool quote) {
  std::string out;
  for (char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (quote && c == '"')
      out += "\\\"";
    else
      out += c;
  }
  return out;
}

const char* TypeName(int type) {
  static const char* const kNames[] = {"counter", "gauge", "histogram"};
  return kNames[type];
}

// name{labels} or name{labels,extra} or name
std::string SeriesName(const std::string& name, const std::string& labels,
                       const std::string& extra = "") {
  if (labels.empty() && extra.empty()) return name;
  std::string all = labels;
  if (!extra.empty()) all += (all.empty() ? "" : ",") + extra;
  return name + "{" + all + "}";
}

}  // namespace

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  for (size_t i = 0; i <= kBuckets; i++) {
    s.counts[i] = counts_[i].load(std::memory_order_relaxed);
    s.count += s.counts[i];
  }
  s.sum_us = sum_us_.load(std::memory_order_relaxed);
  return s;
}

std::string FormatMetricValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e15)
    snprintf(buf, sizeof buf, "%.0f", v);
  else
    snprintf(buf, sizeof buf, "%.15g", v);
  return buf;
}

std::string FormatBucketBound(uint64_t bound_us) {
  char buf[64];
  snprintf(buf, sizeof buf, "%lu.%06lu", (unsigned long)(bound_us / 1000000),
           (unsigned long)(bound_us % 1000000));
  std::string s = buf;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

MetricsRegistry::Series& MetricsRegistry::Add(const std::string& name, const std::string& help,
                                              Type type, const MetricLabels& labels) {
  LS_ASSERT(ValidName(name, false), "metric name '%s' is not a Prometheus name", name.c_str());
  std::string rendered;
  for (const auto& [k, v] : labels) {
    LS_ASSERT(ValidName(k, true) && k != "le", "label name '%s' of %s is not usable", k.c_str(),
              name.c_str());
    rendered += (rendered.empty() ? "" : ",") + k + "=\"" + Escape(v, true) + "\"";
  }
  std::lock_guard<std::mutex> l(mu_);
  Family* f = nullptr;
  for (auto& fam : families_)
    if (fam->name == name) f = fam.get();
  if (!f) {
    families_.push_back(std::make_unique<Family>(Family{name, help, type, {}}));
    f = families_.back().get();
  }
  LS_ASSERT(f->type == type, "metric %s registered with two types", name.c_str());
  for (const Series& s : f->series)
    LS_ASSERT(s.labels != rendered, "metric %s{%s} registered twice", name.c_str(),
              rendered.c_str());
  f->series.push_back(Series{rendered, nullptr, nullptr, nullptr});
  return f->series.back();
}

Counter* MetricsRegistry::AddCounter(const std::string& name, const std::string& help,
                                     MetricLabels labels) {
  LS_ASSERT(name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0,
            "counter %s must end in _total", name.c_str());
  Series& s = Add(name, help, Type::kCounter, labels);
  s.counter = std::make_unique<Counter>();
  return s.counter.get();
}

Gauge* MetricsRegistry::AddGauge(const std::string& name, const std::string& help,
                                 MetricLabels labels) {
  Series& s = Add(name, help, Type::kGauge, labels);
  s.gauge = std::make_unique<Gauge>();
  return s.gauge.get();
}

Histogram* MetricsRegistry::AddHistogram(const std::string& name, const std::string& help,
                                         MetricLabels labels) {
  Series& s = Add(name, help, Type::kHistogram, labels);
  s.histogram = std::make_unique<Histogram>();
  return s.histogram.get();
}

std::vector<std::string> MetricsRegistry::Names() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<std::string> names;
  for (const auto& f : families_) names.push_back(f->name);
  return names;
}

std::string MetricsRegistry::Render() const {
  std::lock_guard<std::mutex> l(mu_);
  std::string out;
  out.reserve(families_.size() * 256);
  for (const auto& f : families_) {
    out += "# HELP " + f->name + " " + Escape(f->help, false) + "\n";
    out += "# TYPE " + f->name + " " + TypeName(static_cast<int>(f->type)) + "\n";
    for (const Series& s : f->series) {
      switch (f->type) {
        case Type::kCounter:
          out += SeriesName(f->name, s.labels) + " " + std::to_string(s.counter->value()) + "\n";
          break;
        case Type::kGauge:
          out += SeriesName(f->name, s.labels) + " " + FormatMetricValue(s.gauge->value()) + "\n";
          break;
        case Type::kHistogram: {
          Histogram::Snapshot h = s.histogram->Read();
          uint64_t cumulative = 0;
          for (size_t i = 0; i < Histogram::kBuckets; i++) {
            cumulative += h.counts[i];
            out += SeriesName(f->name + "_bucket", s.labels,
                              "le=\"" + FormatBucketBound(Histogram::kBoundsUs[i]) + "\"") +
                   " " + std::to_string(cumulative) + "\n";
          }
          out += SeriesName(f->name + "_bucket", s.labels, "le=\"+Inf\"") + " " +
                 std::to_string(h.count) + "\n";
          out += SeriesName(f->name + "_sum", s.labels) + " " +
                 FormatMetricValue(static_cast<double>(h.sum_us) / 1e6) + "\n";
          out += SeriesName(f->name + "_count", s.labels) + " " + std::to_string(h.count) + "\n";
          break;
        }
      }
    }
  }
  return out;
}

}  // namespace lockstep
