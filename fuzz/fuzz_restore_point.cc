// fuzz_restore_point.cc — libFuzzer target for guard/server/restore_point.h:
// DecodeRestorePoint on a checkpoint's `extra` blob (read back from the
// store, or from a checkpoint a peer sent in a state transfer). A decoded
// point encodes again and decodes to the same value.
#include "fuzz/fuzz_util.h"
#include "guard/server/restore_point.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lockstep;
  RestorePoint p;
  if (!DecodeRestorePoint(std::string_view(reinterpret_cast<const char*>(data), size), &p))
    return 0;
  RestorePoint p2;
  FUZZ_CHECK(DecodeRestorePoint(EncodeRestorePoint(p), &p2));
  FUZZ_CHECK(p2.server_fds == p.server_fds && p2.open_conns == p.open_conns &&
             p2.log_bytes == p.log_bytes && p2.ticks == p.ticks &&
             p2.replay_conns.size() == p.replay_conns.size());
  for (size_t i = 0; i < p.replay_conns.size(); i++)
    FUZZ_CHECK(p2.replay_conns[i].key == p.replay_conns[i].key &&
               p2.replay_conns[i].slot == p.replay_conns[i].slot &&
               p2.replay_conns[i].bytes == p.replay_conns[i].bytes);
  return 0;
}
