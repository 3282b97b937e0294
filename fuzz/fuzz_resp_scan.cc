// fuzz_resp_scan.cc — libFuzzer target for preload/resp_scan.h, the scanners
// the shim runs inside the server on what clients send (requests) and what
// the server answers (replies), to leave the unchecked commands' replies out
// of the compared output: resp_list_parse on an app profile's list, then
// both scanners on any bytes. Every run the reply scanner hands out must be
// non-empty and inside what it was given, and how the streams are cut into
// reads and sends must not change which bytes are checked.
#include <string>

#include "fuzz/fuzz_util.h"
#include "preload/resp_scan.h"

namespace {

struct Conn {
  resp_list list{};
  resp_in in{};
  resp_out out{};
  resp_queue queue{};
  uint64_t tail = 0;

  static int Push(void* ctx, uint64_t number) {
    auto* c = static_cast<Conn*>(ctx);
    if (c->tail - c->out.head >= RESP_QUEUE) return 0;
    c->queue.at[c->tail++ % RESP_QUEUE] = number;
    return 1;
  }
  // Reads `bytes` in pieces of `cut` (0: at once).
  void Read(std::string_view bytes, size_t cut) {
    while (!bytes.empty()) {
      size_t n = cut ? std::min(cut, bytes.size()) : bytes.size();
      resp_scan_requests(&list, &in, reinterpret_cast<const unsigned char*>(bytes.data()), n, Push,
                         this);
      FUZZ_CHECK(tail >= out.head && tail - out.head <= RESP_QUEUE);
      bytes.remove_prefix(n);
    }
  }
  // Sends `bytes` in pieces of `cut`; returns the checked bytes.
  std::string Send(std::string_view bytes, size_t cut) {
    std::string kept;
    while (!bytes.empty()) {
      size_t n = cut ? std::min(cut, bytes.size()) : bytes.size();
      auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
      size_t left = n;
      while (left > 0) {
        int skipped = 0;
        size_t run = resp_output_run(&out, &queue, tail, p, left, &skipped);
        FUZZ_CHECK(run > 0 && run <= left);
        FUZZ_CHECK(out.head <= tail);
        if (!skipped) kept.append(reinterpret_cast<const char*>(p), run);
        p += run;
        left -= run;
      }
      bytes.remove_prefix(n);
    }
    return kept;
  }
};

}  // namespace

// Input: the unchecked list (up to a NUL), cut sizes u8 u8, the request
// bytes' length u16, the requests, the replies.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view all(reinterpret_cast<const char*>(data), size);
  size_t nul = all.find('\0');
  if (nul == std::string_view::npos) return 0;
  std::string list_text(all.substr(0, nul));
  lockstep::fuzz::Cursor c(data + nul + 1, size - nul - 1);
  size_t read_cut = c.u8(), send_cut = c.u8();
  size_t req_len = c.u8() | size_t{c.u8()} << 8;
  std::string_view rest = c.rest();
  std::string_view requests = rest.substr(0, std::min(req_len, rest.size()));
  std::string_view replies = rest.substr(requests.size());

  Conn whole, cut;
  if (resp_list_parse(&whole.list, list_text.c_str()) != 0) {
    FUZZ_CHECK(whole.list.count == 0);  // refused: left empty
    return 0;
  }
  FUZZ_CHECK(whole.list.count <= RESP_LIST);
  cut.list = whole.list;
  whole.Read(requests, 0);
  cut.Read(requests, read_cut);
  FUZZ_CHECK(whole.tail == cut.tail && whole.in.requests == cut.in.requests);
  std::string a = whole.Send(replies, 0);
  std::string b = cut.Send(replies, send_cut);
  FUZZ_CHECK(a.size() <= replies.size());
  FUZZ_CHECK(a == b);
  return 0;
}
