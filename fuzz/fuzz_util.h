// fuzz_util.h — what the fuzz targets in fuzz/ share: a cursor over the
// fuzzer's bytes and FUZZ_CHECK, which aborts (a crash libFuzzer reports,
// with the input saved) when a decoder breaks a promise of its header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#define FUZZ_CHECK(cond)                                                              \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                        \
    }                                                                                 \
  } while (0)

namespace lockstep::fuzz {

// Takes fixed-size values off the front of the input; past its end, zeros.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t u8() { return static_cast<uint8_t>(take(1)); }
  uint32_t u32() { return static_cast<uint32_t>(take(4)); }
  uint64_t u64() { return take(8); }
  // Everything not taken yet.
  std::string_view rest() const {
    return {reinterpret_cast<const char*>(data_ + pos_), size_ - pos_};
  }

 private:
  uint64_t take(size_t n) {
    uint64_t v = 0;
    size_t k = n < size_ - pos_ ? n : size_ - pos_;
    memcpy(&v, data_ + pos_, k);
    pos_ += k;
    return v;
  }
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Bit-for-bit equality of doubles (a NaN from the wire compares equal to itself).
inline bool SameBits(double a, double b) {
  return memcmp(&a, &b, sizeof a) == 0;
}

}  // namespace lockstep::fuzz
