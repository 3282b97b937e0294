// metrics_test.cc — the registry's text exposition (format 0.0.4), byte for
// byte, and its number formats. (promtool checks a live daemon's output:
// tests/test_metrics.py.)
#include "guard/common/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace lockstep {
namespace {

TEST(MetricsTest, CountersAndGaugesRenderWithHelpTypeAndLabels) {
  MetricsRegistry r;
  Counter* ok = r.AddCounter("demo_repairs_total", "Repairs, by outcome.", {{"outcome", "ok"}});
  Counter* bad = r.AddCounter("demo_repairs_total", "Repairs, by outcome.", {{"outcome", "bad"}});
  Gauge* g = r.AddGauge("demo_index", "An index.\nSecond line \\ backslash.");
  ok->Add(3);
  ok->Add();
  bad->Set(7);
  g->Set(12345678901.0);
  EXPECT_EQ(r.Render(),
            "# HELP demo_repairs_total Repairs, by outcome.\n"
            "# TYPE demo_repairs_total counter\n"
            "demo_repairs_total{outcome=\"ok\"} 4\n"
            "demo_repairs_total{outcome=\"bad\"} 7\n"
            "# HELP demo_index An index.\\nSecond line \\\\ backslash.\n"
            "# TYPE demo_index gauge\n"
            "demo_index 12345678901\n");
}

TEST(MetricsTest, LabelValuesAreEscaped) {
  MetricsRegistry r;
  r.AddGauge("demo_g", "g", {{"path", "a\"b\\c\nd"}})->Set(1);
  EXPECT_NE(r.Render().find("demo_g{path=\"a\\\"b\\\\c\\nd\"} 1\n"), std::string::npos)
      << r.Render();
}

TEST(MetricsTest, HistogramBucketsAreCumulativeUpToInfWithSumAndCount) {
  MetricsRegistry r;
  Histogram* h = r.AddHistogram("demo_latency_seconds", "Latency.", {{"kind", "x"}});
  h->ObserveUs(0);         // <= 10 us
  h->ObserveUs(10);        // <= 10 us (the bound is inclusive)
  h->ObserveUs(11);        // <= 25 us
  h->ObserveUs(3000);      // <= 5 ms
  h->ObserveUs(20000000);  // past 10 s: +Inf only
  std::string text = r.Render();
  std::istringstream in(text);
  std::string line;
  std::vector<std::string> buckets;
  while (std::getline(in, line))
    if (line.rfind("demo_latency_seconds_bucket", 0) == 0) buckets.push_back(line);
  ASSERT_EQ(buckets.size(), Histogram::kBuckets + 1);
  EXPECT_EQ(buckets[0], "demo_latency_seconds_bucket{kind=\"x\",le=\"0.00001\"} 2");
  EXPECT_EQ(buckets[1], "demo_latency_seconds_bucket{kind=\"x\",le=\"0.000025\"} 3");
  EXPECT_EQ(buckets[7], "demo_latency_seconds_bucket{kind=\"x\",le=\"0.0025\"} 3");
  EXPECT_EQ(buckets[8], "demo_latency_seconds_bucket{kind=\"x\",le=\"0.005\"} 4");
  EXPECT_EQ(buckets[18], "demo_latency_seconds_bucket{kind=\"x\",le=\"10\"} 4");
  EXPECT_EQ(buckets[19], "demo_latency_seconds_bucket{kind=\"x\",le=\"+Inf\"} 5");
  EXPECT_NE(text.find("demo_latency_seconds_sum{kind=\"x\"} 20.003021\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("demo_latency_seconds_count{kind=\"x\"} 5\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE demo_latency_seconds histogram\n"), std::string::npos);
}

TEST(MetricsTest, BucketBoundsRunFrom10MicrosecondsTo10SecondsLogSpaced) {
  EXPECT_EQ(Histogram::kBoundsUs.front(), 10u);
  EXPECT_EQ(Histogram::kBoundsUs.back(), 10000000u);
  for (size_t i = 1; i < Histogram::kBuckets; i++) {
    double ratio = static_cast<double>(Histogram::kBoundsUs[i]) / Histogram::kBoundsUs[i - 1];
    EXPECT_GE(ratio, 2.0) << i;
    EXPECT_LE(ratio, 2.5) << i;
  }
  EXPECT_EQ(FormatBucketBound(10), "0.00001");
  EXPECT_EQ(FormatBucketBound(250000), "0.25");
  EXPECT_EQ(FormatBucketBound(1000000), "1");
  EXPECT_EQ(FormatBucketBound(2500000), "2.5");
}

TEST(MetricsTest, ValueFormats) {
  EXPECT_EQ(FormatMetricValue(0), "0");
  EXPECT_EQ(FormatMetricValue(-3), "-3");
  EXPECT_EQ(FormatMetricValue(0.5), "0.5");
  EXPECT_EQ(FormatMetricValue(std::nan("")), "NaN");
  EXPECT_EQ(FormatMetricValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatMetricValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatMetricValue(1e20), "1e+20");
}

// Updates from several threads while another renders: every increment
// lands, and each rendered histogram is consistent (_count = +Inf bucket).
TEST(MetricsTest, ConcurrentUpdatesAllLand) {
  MetricsRegistry r;
  Counter* c = r.AddCounter("demo_ops_total", "ops");
  Histogram* h = r.AddHistogram("demo_op_seconds", "op time");
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; t++)
    threads.emplace_back([&] {
      for (int i = 0; i < 100000; i++) {
        c->Add();
        h->ObserveUs(static_cast<uint64_t>(i % 1000));
      }
    });
  for (int i = 0; i < 20; i++) {
    std::string text = r.Render();
    size_t inf = text.find("le=\"+Inf\"} "), count = text.find("demo_op_seconds_count ");
    ASSERT_NE(inf, std::string::npos);
    ASSERT_NE(count, std::string::npos);
    std::string a = text.substr(inf + 11, text.find('\n', inf) - inf - 11);
    std::string b = text.substr(count + 22, text.find('\n', count) - count - 22);
    EXPECT_EQ(a, b);
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c->value(), 200000u);
  EXPECT_EQ(h->Read().count, 200000u);
}

TEST(MetricsTest, NamesInRegistrationOrder) {
  MetricsRegistry r;
  r.AddGauge("b_gauge", "b");
  r.AddCounter("a_total", "a");
  r.AddGauge("b_gauge", "b", {{"x", "1"}});
  EXPECT_EQ(r.Names(), (std::vector<std::string>{"b_gauge", "a_total"}));
}

}  // namespace
}  // namespace lockstep
