// fuzz_log_input.cc — libFuzzer target for guard/server/log_input.h: DecodeInput on
// a kInput entry's payload (what a leader proposed, read back from the log or
// from a peer), and DescribeInput, which `lockstep log` prints it with. A
// decoded input encodes again to the same bytes (an entry from before the
// clock stamp: to those bytes and the stamps' zeros).
#include "fuzz/fuzz_util.h"
#include "guard/server/log_input.h"
#include "preload/shim_abi.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lockstep;
  std::string_view payload(reinterpret_cast<const char*>(data), size);
  Input in;
  if (!DecodeInput(payload, &in)) return 0;
  FUZZ_CHECK(in.kind >= LS_SUB_ACCEPT && in.kind <= LS_SUB_TICK);
  FUZZ_CHECK(in.kind != LS_SUB_TICK || in.bytes.empty());  // a tick carries no bytes
  std::string again = EncodeInput(in.kind, in.key, in.seq, in.bytes, in.clock_ns, in.out_before);
  FUZZ_CHECK(again.size() == kInputHeader + in.bytes.size());
  if (payload.size() == again.size()) {
    FUZZ_CHECK(again == payload);
  } else {  // older layouts: a prefix, the missing stamps zero
    FUZZ_CHECK(payload.size() < again.size() && again.compare(0, payload.size(), payload) == 0);
    FUZZ_CHECK(in.out_before == 0);
  }
  Input in2;
  FUZZ_CHECK(DecodeInput(again, &in2));
  FUZZ_CHECK(in2.kind == in.kind && in2.key == in.key && in2.seq == in.seq &&
             in2.bytes == in.bytes && in2.clock_ns == in.clock_ns &&
             in2.out_before == in.out_before);
  std::string line = DescribeInput(in, size % 97);
  FUZZ_CHECK(!line.empty());
  for (char ch : EscapeBytes(in.bytes))
    FUZZ_CHECK(ch >= 0x20 && ch < 0x7f);  // printable, whatever the bytes
  return 0;
}
