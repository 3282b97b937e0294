// restore_point.cc — see restore_point.h.
#include "guard/server/restore_point.h"

#include "guard/net/wire.h"

namespace lockstep {

namespace {
constexpr uint32_t kRestorePointVersion = 1;
constexpr uint32_t kMaxEntries = 1u << 20;  // sanity bound for a decoded count
}  // namespace

std::string EncodeRestorePoint(const RestorePoint& p) {
  ByteWriter w;
  w.u32(kRestorePointVersion);
  w.u32(static_cast<uint32_t>(p.server_fds.size()));
  for (int fd : p.server_fds) w.u32(static_cast<uint32_t>(fd));
  w.u32(static_cast<uint32_t>(p.open_conns.size()));
  for (const ConnKey& k : p.open_conns) {
    w.u64(k.ballot);
    w.u32(k.no);
  }
  w.u32(static_cast<uint32_t>(p.replay_conns.size()));
  for (const auto& c : p.replay_conns) {
    w.u64(c.key.ballot);
    w.u32(c.key.no);
    w.u32(static_cast<uint32_t>(c.slot));
    w.u64(c.bytes);
  }
  w.u64(p.log_bytes);
  w.u64(p.ticks);
  w.bytes(p.membership);
  return std::move(w.str());
}

bool DecodeRestorePoint(std::string_view in, RestorePoint* p) {
  ByteReader r(in);
  uint32_t version = 0, n = 0;
  if (!r.u32(&version) || version != kRestorePointVersion) return false;
  if (!r.u32(&n) || n > kMaxEntries) return false;
  p->server_fds.clear();
  for (uint32_t i = 0; i < n; i++) {
    uint32_t fd;
    if (!r.u32(&fd)) return false;
    p->server_fds.push_back(static_cast<int>(fd));
  }
  if (!r.u32(&n) || n > kMaxEntries) return false;
  p->open_conns.clear();
  for (uint32_t i = 0; i < n; i++) {
    ConnKey k;
    if (!r.u64(&k.ballot) || !r.u32(&k.no)) return false;
    p->open_conns.insert(k);
  }
  if (!r.u32(&n) || n > kMaxEntries) return false;
  p->replay_conns.clear();
  for (uint32_t i = 0; i < n; i++) {
    Replayer::OpenConn c;
    uint32_t slot;
    if (!r.u64(&c.key.ballot) || !r.u32(&c.key.no) || !r.u32(&slot) || !r.u64(&c.bytes))
      return false;
    c.slot = static_cast<int>(slot);
    p->replay_conns.push_back(c);
  }
  // Older restore points end before the ticks, or before the membership
  // (restore_point.h).
  p->ticks = 0;
  p->membership.clear();
  if (!r.u64(&p->log_bytes)) return false;
  if (r.done()) return true;
  if (!r.u64(&p->ticks)) return false;
  if (r.done()) return true;
  return r.bytes(&p->membership) && r.done();
}

}  // namespace lockstep
