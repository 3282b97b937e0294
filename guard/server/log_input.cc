// log_input.cc — see log_input.h.
#include "guard/server/log_input.h"

#include <cstdio>

#include "consensus/log_format.h"  // BallotString
#include "guard/net/wire.h"
#include "preload/shim_abi.h"

namespace lockstep {

std::string EncodeInput(uint8_t kind, ConnKey key, uint64_t seq, std::string_view bytes,
                        uint64_t clock_ns, uint64_t out_before) {
  ByteWriter w;
  w.u8(kind);
  w.u64(key.ballot);
  w.u32(key.no);
  w.u64(seq);
  w.bytes(bytes);
  w.u64(clock_ns);
  w.u64(out_before);
  return std::move(w.str());
}

bool DecodeInput(std::string_view payload, Input* in) {
  ByteReader r(payload);
  if (!r.u8(&in->kind) || !r.u64(&in->key.ballot) || !r.u32(&in->key.no) || !r.u64(&in->seq) ||
      !r.bytes(&in->bytes))
    return false;
  in->clock_ns = 0;  // an entry from before the stamp ends here (log_input.h)
  in->out_before = 0;
  if (!r.done() && !r.u64(&in->clock_ns)) return false;
  if (!r.done() && !r.u64(&in->out_before)) return false;
  return r.done() && in->kind >= LS_SUB_ACCEPT && in->kind <= LS_SUB_TICK &&
         (in->kind != LS_SUB_TICK || in->bytes.empty());
}

std::string EscapeBytes(std::string_view bytes) {
  std::string out;
  for (unsigned char ch : bytes) {
    if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\\') {
      out += "\\\\";
    } else if (ch < 0x20 || ch >= 0x7f) {
      char hex[8];
      snprintf(hex, sizeof hex, "\\x%02x", ch);
      out += hex;
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out;
}

std::string DescribeInput(const Input& in, size_t max_bytes) {
  if (in.kind == LS_SUB_TICK)
    return "TICK " + BallotString(in.key.ballot) + " epoll set " + std::to_string(in.key.no);
  const char* kind = in.kind == LS_SUB_ACCEPT ? "ACCEPT"
                     : in.kind == LS_SUB_DATA ? "DATA"
                                              : "CLOSE";
  std::string out =
      std::string(kind) + " " + BallotString(in.key.ballot) + "/" + std::to_string(in.key.no);
  // The reply gate, where there is one: "after 54 bytes out".
  std::string gate =
      in.out_before ? " after " + std::to_string(in.out_before) + " bytes out" : std::string();
  if (in.kind == LS_SUB_CLOSE) return out + gate;
  out += in.kind == LS_SUB_ACCEPT ? " from "
                                  : " " + std::to_string(in.bytes.size()) + " bytes" + gate + ": ";
  out += EscapeBytes(std::string_view(in.bytes).substr(0, max_bytes));
  if (in.bytes.size() > max_bytes) out += "...";
  return out;
}

}  // namespace lockstep
