// failpoints.cc — parsing failpoint specs, and the peer messages they drop
// or delay (failpoints.h).
#include "guard/daemon/failpoints.h"

#include <algorithm>
#include <charconv>
#include <cstdio>

namespace lockstep {

namespace {
bool ParseU64(std::string_view v, uint64_t* out) {
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), *out);
  return ec == std::errc() && end == v.data() + v.size();
}
}  // namespace

bool ParseFailpointSpec(std::string_view text, FailpointSpec* out, std::string* error) {
  FailpointSpec s;
  size_t i = 0;
  bool off = false, any = false;
  while (i < text.size()) {
    while (i < text.size() && text[i] == ' ') i++;
    size_t j = text.find(' ', i);
    if (j == std::string_view::npos) j = text.size();
    std::string_view item = text.substr(i, j - i);
    i = j;
    if (item.empty()) continue;
    if (item == "off") {
      off = true;
      continue;
    }
    any = true;
    size_t eq = item.find('=');
    std::string_view key = item.substr(0, eq);
    std::string_view val = eq == std::string_view::npos ? "" : item.substr(eq + 1);
    uint64_t n = 0;
    auto bad = [&](const char* want) {
      *error = "failpoint '" + std::string(item) + "': " + want;
      return false;
    };
    if (eq == std::string_view::npos || val.empty()) return bad("expected key=value");
    if (key == "drop") {
      char* end = nullptr;
      std::string v(val);
      double p = strtod(v.c_str(), &end);
      if (end != v.c_str() + v.size() || !(p >= 0 && p <= 1)) return bad("a probability 0..1");
      s.drop = p;
    } else if (key == "delay_ms" || key == "jitter_ms" || key == "disk_delay_ms" ||
               key == "clock_jump_ms") {
      if (!ParseU64(val, &n) || n > 600000) return bad("milliseconds, 0..600000");
      uint32_t ms = static_cast<uint32_t>(n);
      (key == "delay_ms"        ? s.delay_ms
       : key == "jitter_ms"     ? s.jitter_ms
       : key == "disk_delay_ms" ? s.disk_delay_ms
                                : s.clock_jump_ms) = ms;
    } else if (key == "to") {
      if (!ParseU64(val, &n) || n > 63) return bad("a replica id");
      s.to = static_cast<int>(n);
    } else if (key == "torn_write") {
      if (val != "0" && val != "1") return bad("0 or 1");
      s.torn_write = val == "1";
    } else if (key == "seed") {
      if (!ParseU64(val, &n)) return bad("an unsigned integer");
      s.seed = n;
    } else {
      return bad(
          "unknown key (drop, delay_ms, jitter_ms, to, disk_delay_ms, clock_jump_ms, "
          "torn_write, seed)");
    }
  }
  if (off && any) {
    *error = "failpoint: 'off' stands alone";
    return false;
  }
  if (!off && !any) {
    *error = "failpoint: empty spec (give key=value pairs, or 'off')";
    return false;
  }
  *out = s;
  return true;
}

std::string FormatFailpointSpec(const FailpointSpec& s) {
  std::string out;
  char b[64];
  auto add = [&](const char* k, uint64_t v) {
    std::snprintf(b, sizeof b, "%s%s=%llu", out.empty() ? "" : " ", k, (unsigned long long)v);
    out += b;
  };
  if (s.drop > 0) {
    std::snprintf(b, sizeof b, "drop=%g", s.drop);
    out += b;
  }
  if (s.delay_ms) add("delay_ms", s.delay_ms);
  if (s.jitter_ms) add("jitter_ms", s.jitter_ms);
  if (s.to >= 0) add("to", static_cast<uint64_t>(s.to));
  if (s.disk_delay_ms) add("disk_delay_ms", s.disk_delay_ms);
  if (s.clock_jump_ms) add("clock_jump_ms", s.clock_jump_ms);
  if (s.torn_write) add("torn_write", 1);
  if (out.empty()) return "off";
  add("seed", s.seed);
  return out;
}

void MessageFaults::Set(const FailpointSpec& spec) {
  spec_ = spec;
  rng_.seed(spec.seed);
  // Held messages keep their times: a new spec does not hurry them out.
}

bool MessageFaults::Intercept(const Message& m, uint64_t now_us) {
  if (spec_.to >= 0 && m.to != spec_.to) return false;
  if (spec_.drop > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < spec_.drop) {
    dropped_++;
    return true;
  }
  if (!spec_.delay_ms && !spec_.jitter_ms && held_.empty()) return false;
  uint64_t delay_us = uint64_t{spec_.delay_ms} * 1000;
  if (spec_.jitter_ms) delay_us += rng_() % (uint64_t{spec_.jitter_ms} * 1000 + 1);
  if (static_cast<size_t>(m.to) >= last_due_us_.size()) last_due_us_.resize(m.to + 1, 0);
  // Never ahead of what is already held for that peer (its order is TCP's).
  uint64_t due = std::max(now_us + delay_us, last_due_us_[m.to]);
  last_due_us_[m.to] = due;
  held_.push_back({due, m});
  delayed_++;
  return true;
}

std::vector<Message> MessageFaults::Due(uint64_t now_us) {
  std::vector<Message> out;
  // Oldest first; a later message to another peer may be due before an
  // earlier one, so look at every held message.
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->due_us <= now_us) {
      out.push_back(std::move(it->m));
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

}  // namespace lockstep
