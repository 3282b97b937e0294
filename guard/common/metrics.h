// metrics.h — a small Prometheus metrics registry: counters, gauges and
// histograms with fixed buckets, and their text exposition (format 0.0.4,
// what `GET /metrics` answers: guard/net/metrics_server.h).
//
// Updates come from the daemon's consensus loop at tens of thousands of
// operations a second, so an update is a few relaxed atomic operations on
// memory allocated once at registration: no lock, no allocation, no
// string. Any thread may update (the disk writer observes its own writes);
// Render() runs on the metrics listener's thread and reads every value
// once (a snapshot; a histogram's _count is the sum of the bucket counts it
// read, so the exposition is consistent within itself).
//
// Metrics are registered once, at start; the registry owns them and hands
// out pointers that stay valid for its lifetime. A family (one name) may
// hold several series told apart by labels fixed at registration
// (lockstep_repairs_total{outcome="repaired"}, {outcome="failed"}).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace lockstep {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// Only goes up (Add), or mirrors a count a room keeps itself (Set: the
// room's count never goes down while the process lives, nor does this).
class Counter {
 public:
  void Add(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  void Set(uint64_t v) { v_.store(v, std::memory_order_relaxed); }
  uint64_t value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

class Gauge {
 public:
  void Set(double v) { v_.store(v, std::memory_order_relaxed); }
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0};
};

// Durations, observed in microseconds and exposed in seconds. The buckets
// are fixed and log-spaced (1, 2.5, 5 per decade) from 10 µs to 10 s: a
// memory-durability commit takes tens of µs, a disk commit hundreds of µs
// to ms, a checkpoint dump hundreds of ms to seconds.
class Histogram {
 public:
  static constexpr size_t kBuckets = 19;
  // The buckets' upper bounds in µs (the +Inf bucket comes after them).
  static constexpr std::array<uint64_t, kBuckets> kBoundsUs = {
      10,    25,    50,     100,    250,    500,     1000,    2500,    5000,    10000,
      25000, 50000, 100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000};

  void ObserveUs(uint64_t us) {
    size_t i = 0;
    while (i < kBuckets && us > kBoundsUs[i]) i++;  // most observations stop early
    counts_[i].fetch_add(1, std::memory_order_relaxed);
    sum_us_.fetch_add(us, std::memory_order_relaxed);
  }

  struct Snapshot {
    std::array<uint64_t, kBuckets + 1> counts{};  // per bucket, not cumulative; last: > 10 s
    uint64_t count = 0;                           // their sum
    uint64_t sum_us = 0;
  };
  Snapshot Read() const;

 private:
  std::array<std::atomic<uint64_t>, kBuckets + 1> counts_{};
  std::atomic<uint64_t> sum_us_{0};
};

class MetricsRegistry {
 public:
  // name: [a-zA-Z_:][a-zA-Z0-9_:]*, as Prometheus wants (a wrong one is a
  // programming error: asserted). Series of one name share its help and
  // type and differ in their labels.
  Counter* AddCounter(const std::string& name, const std::string& help, MetricLabels labels = {});
  Gauge* AddGauge(const std::string& name, const std::string& help, MetricLabels labels = {});
  Histogram* AddHistogram(const std::string& name, const std::string& help,
                          MetricLabels labels = {});

  // The text exposition format 0.0.4 (# HELP, # TYPE, samples; histograms
  // as _bucket{le=...} cumulative up to +Inf, _sum, _count).
  std::string Render() const;

  // Every family's name, in registration order (tests, docs).
  std::vector<std::string> Names() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Series {
    std::string labels;  // rendered: k="v",k2="v2" (no braces)
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };
  struct Family {
    std::string name, help;
    Type type;
    std::vector<Series> series;
  };
  Series& Add(const std::string& name, const std::string& help, Type type,
              const MetricLabels& labels);

  mutable std::mutex mu_;  // registration against Render only; never taken by an update
  std::vector<std::unique_ptr<Family>> families_;
};

// The exposition's number formats (exposed for the unit test): a sample
// value ("NaN", "+Inf", "-Inf", integers without a point) and a bucket bound
// in seconds ("0.000025", "10").
std::string FormatMetricValue(double v);
std::string FormatBucketBound(uint64_t bound_us);

}  // namespace lockstep
