// shim_channel.cc — see shim_channel.h.
#include "guard/server/shim_channel.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>
#include <thread>

#include "consensus/assert.h"

namespace lockstep {

// Records and ring sizes are multiples of 8, so every record starts 8-aligned.
static_assert(LS_SUB_RING_BYTES % 8 == 0 && sizeof(ls_sub_record) % 8 == 0);
constexpr uint32_t kMaxPort = 65535;
static_assert(sizeof(ls_out_record) == 32 && sizeof(ls_out_slot) == 64);
// Output records consumed before the tail is published to the shim (and
// always when the ring is found empty): one cache-line transfer per batch.
constexpr uint64_t kOutputTailBatch = 64;

// Where each part of the region lies, as this build creates it.
struct RegionLayout {
  uint64_t header = (sizeof(ls_shim_header) + 4095) & ~uint64_t{4095};
  uint64_t sub = header;
  uint64_t done = sub + LS_SUB_RING_BYTES;
  uint64_t order = done + uint64_t{LS_DONE_RING_SLOTS} * sizeof(ls_done_record);
  uint64_t out = order + uint64_t{LS_ORDER_SLOTS} * sizeof(ls_order_record);
  uint64_t win = out + uint64_t{LS_OUT_RING_SLOTS} * sizeof(ls_out_record);
  uint64_t win_bytes = win + uint64_t{LS_OUT_SLOTS} * sizeof(ls_out_slot);
  uint64_t stacks = win_bytes + uint64_t{LS_OUT_SLOTS} * LS_OUT_WINDOW;
  uint64_t end = stacks + uint64_t{LS_OUT_SLOTS} * LS_SEND_STACKS * sizeof(ls_send_stack);
};

static bool ValidOutputRing(uint64_t records) {
  return records > 0 && records <= LS_OUT_RING_SLOTS && (records & (records - 1)) == 0;
}

void ShimChannel::Fail(const std::string& why) {
  if (error_.empty()) error_ = why;
}

ShimChannel::~ShimChannel() {
  if (hdr_) munmap(hdr_, size_);
  for (int fd : {region_fd_, wake_server_fd_, wake_daemon_fd_})
    if (fd >= 0) close(fd);
}

// Our private copies of the ring geometry, taken once from the header.
void ShimChannel::UseRings() {
  char* base = reinterpret_cast<char*>(hdr_);
  sub_bytes_ = hdr_->sub_bytes;
  done_slots_ = hdr_->done_slots;
  order_slots_ = hdr_->order_slots;
  out_slots_ = hdr_->out_slots;
  sub_ring_ = base + hdr_->sub_offset;
  done_ring_ = reinterpret_cast<ls_done_record*>(base + hdr_->done_offset);
  order_ring_ = reinterpret_cast<ls_order_record*>(base + hdr_->order_offset);
  out_ring_ = reinterpret_cast<const ls_out_record*>(base + hdr_->out_offset);
  out_win_ = reinterpret_cast<const ls_out_slot*>(base + hdr_->win_offset);
  out_bytes_ = base + hdr_->win_bytes_offset;
  out_stacks_ = reinterpret_cast<const ls_send_stack*>(base + hdr_->stacks_offset);
}

bool ShimChannel::Create(uint32_t max_chunk, std::string* error, uint32_t output_ring_records) {
  if (!ValidOutputRing(output_ring_records)) {
    *error = "output ring of " + std::to_string(output_ring_records) +
             " records: not a power of two up to " + std::to_string(LS_OUT_RING_SLOTS);
    return false;
  }
  size_ = ls_shim_region_bytes();
  region_fd_ = memfd_create("lockstep-shim", 0);
  if (region_fd_ < 0 || ftruncate(region_fd_, static_cast<off_t>(size_)) != 0) {
    *error = std::string("shim region: ") + strerror(errno);
    return false;
  }
  void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, region_fd_, 0);
  if (p == MAP_FAILED) {
    *error = std::string("shim region mmap: ") + strerror(errno);
    return false;
  }
  hdr_ = new (p) ls_shim_header();  // the memfd is zero-filled; this sets up the atomics
  RegionLayout layout;
  LS_ASSERT(layout.end == size_, "region layout ends at %lu, not %lu", (unsigned long)layout.end,
            (unsigned long)size_);
  hdr_->size = size_;
  hdr_->sub_offset = layout.sub;
  hdr_->sub_bytes = LS_SUB_RING_BYTES;
  hdr_->done_offset = layout.done;
  hdr_->done_slots = LS_DONE_RING_SLOTS;
  hdr_->order_offset = layout.order;
  hdr_->order_slots = LS_ORDER_SLOTS;
  hdr_->out_offset = layout.out;
  hdr_->out_slots = output_ring_records;
  hdr_->win_offset = layout.win;
  hdr_->win_bytes_offset = layout.win_bytes;
  hdr_->stacks_offset = layout.stacks;
  hdr_->out_mark_bytes = LS_OUT_MARK_BYTES;
  hdr_->max_chunk = max_chunk;
  hdr_->version = LS_SHIM_VERSION;
  hdr_->magic = LS_SHIM_MAGIC;
  UseRings();
  wake_server_fd_ = eventfd(0, EFD_NONBLOCK);
  wake_daemon_fd_ = eventfd(0, EFD_NONBLOCK);
  if (wake_server_fd_ < 0 || wake_daemon_fd_ < 0) {
    *error = std::string("eventfd: ") + strerror(errno);
    return false;
  }
  for (int i = LS_MAX_REPLAY - 1; i >= 0; i--) free_slots_.push_back(i);
  return true;
}

bool ShimChannel::Adopt(pid_t server_pid, const std::vector<int>& server_fds, std::string* error) {
  if (server_fds.size() != 3) {
    *error = "the checkpoint names " + std::to_string(server_fds.size()) + " channel fds, not 3";
    return false;
  }
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, server_pid, 0));
  if (pidfd < 0) {
    *error = "pidfd_open of the restored server: " + std::string(strerror(errno));
    return false;
  }
  int* mine[3] = {&region_fd_, &wake_server_fd_, &wake_daemon_fd_};
  for (int i = 0; i < 3; i++) {
    *mine[i] = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, server_fds[i], 0));
    if (*mine[i] < 0) {
      *error = "cannot take fd " + std::to_string(server_fds[i]) +
               " of the restored server: " + strerror(errno);
      close(pidfd);
      return false;
    }
  }
  close(pidfd);
  struct stat st;
  if (fstat(region_fd_, &st) != 0 || static_cast<uint64_t>(st.st_size) != ls_shim_region_bytes()) {
    *error = "the restored server's fd " + std::to_string(server_fds[0]) +
             " is not a shim region of this version";
    return false;
  }
  size_ = ls_shim_region_bytes();
  void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, region_fd_, 0);
  if (p == MAP_FAILED) {
    *error = std::string("restored shim region mmap: ") + strerror(errno);
    return false;
  }
  hdr_ = static_cast<ls_shim_header*>(p);
  RegionLayout layout;
  if (hdr_->magic != LS_SHIM_MAGIC || hdr_->version != LS_SHIM_VERSION || hdr_->size != size_ ||
      hdr_->sub_bytes != LS_SUB_RING_BYTES || hdr_->done_slots != LS_DONE_RING_SLOTS ||
      hdr_->order_slots != LS_ORDER_SLOTS || hdr_->sub_offset != layout.sub ||
      hdr_->done_offset != layout.done || hdr_->order_offset != layout.order ||
      hdr_->out_offset != layout.out || !ValidOutputRing(hdr_->out_slots) ||
      hdr_->win_offset != layout.win || hdr_->win_bytes_offset != layout.win_bytes ||
      hdr_->stacks_offset != layout.stacks) {
    *error = "the restored shim region's header does not match this build";
    return false;
  }
  UseRings();
  // Our positions are the ones we had published when the dump was taken.
  sub_tail_ = hdr_->sub_tail.load();
  if (sub_tail_ % 8 != 0) {  // the server's memory: rejected, never asserted on
    *error = "the restored shim region's submission tail " + std::to_string(sub_tail_) +
             " is not 8-aligned";
    return false;
  }
  done_head_ = hdr_->done_head.load();
  order_written_ = order_published_ = hdr_->order_head.load();
  // Output records published before the dump are history: not delivered again.
  out_tail_ = hdr_->out_head.load();
  hdr_->out_tail.store(out_tail_);
  for (int i = LS_MAX_REPLAY - 1; i >= 0; i--)
    if (hdr_->replay[i].port.load() == 0) free_slots_.push_back(i);
  return true;
}

std::vector<std::pair<std::string, std::string>> ShimChannel::ServerEnv(int server_port) const {
  std::vector<std::pair<std::string, std::string>> env = {
      {"LOCKSTEP_SHIM_FD", std::to_string(region_fd_)},
      {"LOCKSTEP_SHIM_WAKE_SERVER", std::to_string(wake_server_fd_)},
      {"LOCKSTEP_SHIM_WAKE_DAEMON", std::to_string(wake_daemon_fd_)},
      {"LOCKSTEP_SHIM_PORT", std::to_string(server_port)},
      {"LOCKSTEP_SHIM_RANDOM_SEED", random_seed_env_},
      {"LOCKSTEP_SHIM_SAME_CLOCK", same_clock_ ? "1" : "0"},
      {"LOCKSTEP_SHIM_TIMERS", timers_in_log_ ? "1" : "0"},
      {"LOCKSTEP_SHIM_CLONED", cloned_ ? "1" : "0"},
      {"LOCKSTEP_SHIM_SERIAL", std::to_string(serial_inputs_)},
      {"LOCKSTEP_SHIM_UNCHECKED_GREETING", unchecked_greeting_ ? "1" : "0"},
      {"LOCKSTEP_SHIM_UNCHECKED_RESP", unchecked_replies_env_},
      {"LOCKSTEP_SHIM_LEASE_READS_RESP", lease_memcached_ ? "" : lease_reads_env_},
      {"LOCKSTEP_SHIM_LEASE_READS_MEMCACHED", lease_memcached_ ? lease_reads_env_ : ""}};
  if (!output_digests_env_.empty())
    env.push_back({"LOCKSTEP_SHIM_OUTPUT_DIGESTS", output_digests_env_});
  return env;
}

uint32_t ShimChannel::forked_served() const {
  return hdr_ ? hdr_->forked_served.load() : 0;
}

bool ShimChannel::shim_attached() const {
  return hdr_ && hdr_->shim_attached.load();
}

void ShimChannel::SetLeader(bool leader) {
  hdr_->mode.store(leader ? LS_MODE_LEADER : LS_MODE_PASSTHROUGH);
}

void ShimChannel::SetLease(uint64_t until_ns) {
  if (hdr_ && hdr_->lease_until_ns.load(std::memory_order_relaxed) != until_ns)
    hdr_->lease_until_ns.store(until_ns, std::memory_order_release);
}

uint64_t ShimChannel::lease_reads() const {
  return hdr_ ? hdr_->lease_reads.load(std::memory_order_relaxed) : 0;
}

uint64_t ShimChannel::lease_misses() const {
  return hdr_ ? hdr_->lease_misses.load(std::memory_order_relaxed) : 0;
}

void ShimChannel::SetStopping() {
  if (hdr_) hdr_->mode.store(LS_MODE_STOPPING);
}

SubmissionAt ParseSubmission(const char* ring, uint64_t ring_bytes, uint64_t tail, uint64_t head,
                             ShimChannel::Submission* s, uint64_t* size, std::string* error) {
  if (ring_bytes == 0 || ring_bytes % 8 != 0 || tail % 8 != 0) {  // ours: never in the daemon
    *error = "submission ring: geometry " + std::to_string(ring_bytes) + ", tail " +
             std::to_string(tail);
    return SubmissionAt::kCorrupt;
  }
  if (head == tail) return SubmissionAt::kEmpty;
  // The shim publishes whole 8-aligned records, never more than the ring holds.
  uint64_t avail = head - tail;
  if (head % 8 != 0 || avail > ring_bytes) {
    *error = "submission ring: head " + std::to_string(head) + " against tail " +
             std::to_string(tail) + " in a ring of " + std::to_string(ring_bytes);
    return SubmissionAt::kCorrupt;
  }
  uint64_t at = tail % ring_bytes;
  const auto* r = reinterpret_cast<const ls_sub_record*>(ring + at);
  if (r->kind == LS_SUB_WRAP) {  // its kind and len fit in the 8 bytes left at least
    uint64_t waste = ring_bytes - at;
    if (waste > avail) {
      *error = "submission ring: wrap at " + std::to_string(at) + " past the head";
      return SubmissionAt::kCorrupt;
    }
    *size = waste;
    return SubmissionAt::kWrap;
  }
  // Copied once: the shim's memory may change under us, the checked length may not.
  ls_sub_record h;
  if (at + sizeof h > ring_bytes) {
    *error = "submission ring: record header at " + std::to_string(at) + " crosses the end";
    return SubmissionAt::kCorrupt;
  }
  memcpy(&h, r, sizeof h);
  uint64_t record = (sizeof h + uint64_t{h.len} + 7) & ~uint64_t{7};
  if (at + record > ring_bytes || record > avail) {
    *error = "submission ring: record of " + std::to_string(h.len) + " bytes at " +
             std::to_string(at) + " outside the ring or past the head";
    return SubmissionAt::kCorrupt;
  }
  if (h.kind < LS_SUB_ACCEPT || h.kind > LS_SUB_TICK) {
    *error = "submission ring: record of unknown kind " + std::to_string(h.kind) + " at " +
             std::to_string(at);
    return SubmissionAt::kCorrupt;
  }
  s->tick_waiter = 0;
  s->tick_min_clock_ns = 0;
  if (h.kind == LS_SUB_TICK) {
    ls_tick tick;
    if (h.len != sizeof tick) {
      *error = "submission ring: TICK of " + std::to_string(h.len) + " bytes at " +
               std::to_string(at) + " (a tick is " + std::to_string(sizeof tick) + ")";
      return SubmissionAt::kCorrupt;
    }
    memcpy(&tick, r + 1, sizeof tick);
    if (tick.waiter >= ShimChannel::kMaxWaiter) {
      *error = "submission ring: TICK for epoll set " + std::to_string(tick.waiter) + " at " +
               std::to_string(at);
      return SubmissionAt::kCorrupt;
    }
    s->tick_waiter = tick.waiter;
    s->tick_min_clock_ns = tick.min_clock_ns;
  }
  s->kind = h.kind;
  s->conn = h.conn;
  s->seq = h.seq;
  s->out_before = h.out_before;
  s->bytes = std::string_view(reinterpret_cast<const char*>(r + 1), h.len);
  *size = record;
  return SubmissionAt::kRecord;
}

bool ShimChannel::Peek(Submission* s) {
  if (!error_.empty()) return false;
  for (;;) {
    LS_ASSERT(sub_tail_ % 8 == 0, "submission tail %lu not 8-aligned", (unsigned long)sub_tail_);
    uint64_t head = hdr_->sub_head.load(std::memory_order_acquire);
    uint64_t size = 0;
    std::string why;
    switch (ParseSubmission(sub_ring_, sub_bytes_, sub_tail_, head, s, &size, &why)) {
      case SubmissionAt::kEmpty: return false;
      case SubmissionAt::kCorrupt: Fail(why); return false;
      case SubmissionAt::kWrap:
        sub_tail_ += size;
        hdr_->sub_tail.store(sub_tail_, std::memory_order_release);
        continue;
      case SubmissionAt::kRecord: peeked_bytes_ = size; return true;
    }
  }
}

void ShimChannel::Pop() {
  LS_ASSERT(peeked_bytes_ > 0 && peeked_bytes_ % 8 == 0, "Pop of %lu bytes without a Peek",
            (unsigned long)peeked_bytes_);
  sub_tail_ += peeked_bytes_;
  hdr_->sub_tail.store(sub_tail_, std::memory_order_release);
  peeked_bytes_ = 0;
}

void ShimChannel::Complete(uint32_t kind, uint64_t seq, uint32_t conn, uint64_t clock_ns) {
  unflushed_.push_back(ls_done_record{seq, conn, kind, clock_ns});
}

uint64_t ShimChannel::OrderTaken() const {
  return hdr_->order_tail.load(std::memory_order_acquire);
}

uint64_t ShimChannel::OrderPending() const {
  uint64_t tail = hdr_->order_tail.load(std::memory_order_acquire);
  return order_written_ > tail ? order_written_ - tail : 0;
}

bool ShimChannel::PushOrder(int slot, uint32_t kind, uint64_t len, uint64_t clock_ns,
                            uint64_t out_before) {
  LS_ASSERT(
      slot >= 0 && slot < static_cast<int>(kind == LS_ORDER_TICK ? kMaxWaiter : LS_MAX_REPLAY),
      "replay slot %d (order kind %u)", slot, kind);
  uint64_t tail = hdr_->order_tail.load(std::memory_order_acquire);
  if (tail > order_published_) {  // the shim took records not yet published
    Fail("order ring: tail " + std::to_string(tail) + " past the head " +
         std::to_string(order_published_));
    return false;
  }
  if (order_written_ - tail >= order_slots_) return false;
  order_ring_[order_written_ % order_slots_] =
      ls_order_record{static_cast<uint32_t>(slot), kind, len, clock_ns, out_before};
  order_written_++;
  return true;
}

bool ShimChannel::Flush() {
  if (!error_.empty()) return false;
  uint64_t out_head;
  if (!output_consumer_ && TakeOutputHead(&out_head) && out_head != out_tail_) {
    out_tail_ = out_head;  // nobody compares outputs: leave the shim room
    hdr_->out_tail.store(out_tail_, std::memory_order_release);
  }
  if (!error_.empty()) return false;
  size_t n = 0;
  if (!unflushed_.empty()) {
    uint64_t tail = hdr_->done_tail.load(std::memory_order_acquire);
    if (tail > done_head_ || done_head_ - tail > done_slots_) {
      Fail("completion ring: tail " + std::to_string(tail) + " against the head " +
           std::to_string(done_head_) + " in a ring of " + std::to_string(done_slots_));
      return false;
    }
    size_t room = done_slots_ - (done_head_ - tail);
    n = std::min(room, unflushed_.size());
    for (size_t i = 0; i < n; i++) done_ring_[(done_head_ + i) % done_slots_] = unflushed_[i];
    unflushed_.erase(unflushed_.begin(), unflushed_.begin() + static_cast<long>(n));
    if (n) {
      done_head_ += n;
      hdr_->done_head.store(done_head_, std::memory_order_seq_cst);
    }
  }
  bool order = order_written_ != order_published_;
  if (order) {
    order_published_ = order_written_;
    hdr_->order_head.store(order_written_, std::memory_order_seq_cst);
  }
  if (n == 0 && !order) return false;
  hdr_->done_futex.fetch_add(1, std::memory_order_seq_cst);
  if (hdr_->server_sleepers.load(std::memory_order_seq_cst) > 0) {
    uint64_t one = 1;
    (void)!write(wake_server_fd_, &one, sizeof one);
  }
  if (hdr_->futex_sleepers.load(std::memory_order_seq_cst) > 0)
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&hdr_->done_futex), FUTEX_WAKE, INT32_MAX,
            nullptr, nullptr, 0);
  return true;
}

bool ShimChannel::PrepareSleep(bool ignore_submissions, bool replay_waiting) {
  hdr_->replay_waiting.store(replay_waiting ? 1 : 0, std::memory_order_relaxed);
  // Held submissions wait for a commit (a peer's doorbell), not for more
  // of their kind: unannounced, a burst of them does not wake us once each.
  // The shim wakes us for nothing else then but replay reads.
  if (!ignore_submissions || replay_waiting)
    hdr_->daemon_sleeping.store(1, std::memory_order_seq_cst);
  bool submissions = hdr_->sub_head.load(std::memory_order_seq_cst) != sub_tail_;
  if ((submissions && !ignore_submissions) || !unflushed_.empty() ||
      order_written_ != order_published_) {
    hdr_->daemon_sleeping.store(0);
    return false;
  }
  return true;
}

void ShimChannel::Awake() {
  hdr_->daemon_sleeping.store(0, std::memory_order_relaxed);
  uint64_t v;
  (void)!read(wake_daemon_fd_, &v, sizeof v);
}

void ShimChannel::SetReplaySource(uint32_t ipv4) {
  hdr_->replay_source.store(ipv4);
}

void ShimChannel::ClaimInspectSlot(uint32_t ipv4, int port) {
  hdr_->inspect_source.store(ipv4);
  ls_inspect_slot& s = hdr_->inspect[next_inspect_slot_++ % LS_MAX_INSPECT];
  s.port.store(0);  // no half-made claim is ever matched
  s.accepted.store(0);
  s.port.store(static_cast<uint32_t>(port));
}

void ShimChannel::RevokeInspectSlot(int port) {
  for (ls_inspect_slot& s : hdr_->inspect) {
    uint32_t p = static_cast<uint32_t>(port);
    s.port.compare_exchange_strong(p, 0);
  }
}

int ShimChannel::ClaimReplaySlot(int port) {
  ReuseSlots();
  if (free_slots_.empty() || port <= 0 || port > static_cast<int>(kMaxPort)) return -1;
  int slot = free_slots_.back();
  free_slots_.pop_back();
  LS_ASSERT(slot >= 0 && slot < static_cast<int>(LS_MAX_REPLAY), "replay slot %d", slot);
  ls_replay_slot& s = hdr_->replay[slot];
  s.read_bytes.store(0);
  s.eof_read.store(0);
  s.accepted.store(0);
  s.claim.store(NextClaim());
  s.port.store(static_cast<uint32_t>(port));
  hdr_->replay_port_bits[port / 64].fetch_or(uint64_t{1} << (port % 64));
  return slot;
}

uint32_t ShimChannel::NextClaim() {
  // From a random start: a server restored from a checkpoint remembers
  // claims of an earlier daemon's region, which must not match this one's.
  if (!last_claim_ && getrandom(&last_claim_, sizeof last_claim_, 0) != sizeof last_claim_)
    last_claim_ = static_cast<uint32_t>(time(nullptr)) * 2654435761u;
  if (++last_claim_ == 0) ++last_claim_;
  return last_claim_;
}

int ShimChannel::ReattachReplaySlot(int slot, int port) {
  if (slot < 0 || slot >= static_cast<int>(LS_MAX_REPLAY) || port <= 0 ||
      port > static_cast<int>(kMaxPort))
    return -1;
  ls_replay_slot& s = hdr_->replay[slot];
  s.claim.store(NextClaim());
  uint32_t old = s.port.exchange(static_cast<uint32_t>(port));
  if (old && old <= kMaxPort)
    hdr_->replay_port_bits[old / 64].fetch_and(~(uint64_t{1} << (old % 64)));
  hdr_->replay_port_bits[port / 64].fetch_or(uint64_t{1} << (port % 64));
  s.accepted.store(0);
  s.reattach.store(1);
  std::erase(free_slots_, slot);
  return slot;
}

void ShimChannel::ReleaseReplaySlot(int slot) {
  if (slot < 0) return;
  LS_ASSERT(slot < static_cast<int>(LS_MAX_REPLAY), "replay slot %d", slot);
  ls_replay_slot& s = hdr_->replay[slot];
  uint32_t port = s.port.exchange(0);  // ours, but in memory the server can write
  if (port > kMaxPort)
    Fail("replay slot " + std::to_string(slot) + " holds port " + std::to_string(port));
  else if (port)
    hdr_->replay_port_bits[port / 64].fetch_and(~(uint64_t{1} << (port % 64)));
  // The slot is reused only once the shim has taken every order record that
  // names it, so that none of them is read as the next connection's.
  held_slots_.push_back({slot, order_written_});
  ReuseSlots();
}

void ShimChannel::ReuseSlots() {
  uint64_t taken = hdr_->order_tail.load(std::memory_order_acquire);
  if (taken > order_published_) {
    Fail("order ring: tail " + std::to_string(taken) + " past the head " +
         std::to_string(order_published_));
    return;
  }
  while (!held_slots_.empty() && held_slots_.front().second <= taken) {
    free_slots_.push_back(held_slots_.front().first);
    held_slots_.pop_front();
  }
}

uint64_t ShimChannel::ReplayRead(int slot) const {
  LS_ASSERT(slot >= 0 && slot < static_cast<int>(LS_MAX_REPLAY), "replay slot %d", slot);
  return hdr_->replay[slot].read_bytes.load();
}
bool ShimChannel::ReplayAccepted(int slot) const {
  LS_ASSERT(slot >= 0 && slot < static_cast<int>(LS_MAX_REPLAY), "replay slot %d", slot);
  return hdr_->replay[slot].accepted.load() != 0;
}

bool ShimChannel::ReplayEof(int slot) const {
  LS_ASSERT(slot >= 0 && slot < static_cast<int>(LS_MAX_REPLAY), "replay slot %d", slot);
  return hdr_->replay[slot].eof_read.load() != 0;
}

uint32_t ShimChannel::ReplayConn(int slot) const {
  LS_ASSERT(slot >= 0 && slot < static_cast<int>(LS_MAX_REPLAY), "replay slot %d", slot);
  return hdr_->replay[slot].conn.load();
}

// The shim's output head, checked against our tail: it publishes whole
// records, never more than the ring holds.
bool ShimChannel::TakeOutputHead(uint64_t* head) {
  *head = hdr_->out_head.load(std::memory_order_acquire);
  if (*head - out_tail_ > out_slots_) {  // also a head behind the tail
    Fail("output ring: head " + std::to_string(*head) + " against tail " +
         std::to_string(out_tail_) + " in a ring of " + std::to_string(out_slots_));
    return false;
  }
  return true;
}

bool ShimChannel::PollOutput(OutputDigest* d) {
  if (!error_.empty() || !hdr_) return false;
  output_consumer_ = true;
  uint64_t head;
  if (!TakeOutputHead(&head)) return false;
  if (head == out_tail_) {
    if (hdr_->out_tail.load(std::memory_order_relaxed) != out_tail_)
      hdr_->out_tail.store(out_tail_, std::memory_order_release);
    return false;
  }
  // Copied once: the shim's memory may change under us, the checked copy may not.
  ls_out_record r;
  memcpy(&r, &out_ring_[out_tail_ % out_slots_], sizeof r);
  out_tail_++;
  if (out_tail_ % kOutputTailBatch == 0) hdr_->out_tail.store(out_tail_, std::memory_order_release);
  if (!DecodeOutputRecord(r, d)) {
    Fail("output ring: record " + std::to_string(out_tail_ - 1) + " names replay slot " +
         std::to_string(r.replay_slot) + ", output slot " + std::to_string(r.out_slot) +
         ", flags " + std::to_string(r.flags));
    return false;
  }
  return true;
}

bool ShimChannel::DecodeOutputRecord(const ls_out_record& r, OutputDigest* d) {
  if ((r.replay_slot != LS_OUT_NONE && r.replay_slot >= LS_MAX_REPLAY) ||
      (r.out_slot != LS_OUT_NONE && r.out_slot >= LS_OUT_SLOTS) || (r.flags & ~kOutputFlags) != 0)
    return false;
  d->conn = r.conn;
  d->replay_slot = r.replay_slot == LS_OUT_NONE ? -1 : r.replay_slot;
  d->out_slot = r.out_slot == LS_OUT_NONE ? -1 : r.out_slot;
  d->offset = r.offset;
  d->digest = r.digest;
  d->flags = r.flags;
  return true;
}

bool ShimChannel::OutputNow(int out_slot, uint32_t conn, uint64_t* end, uint64_t* digest) const {
  if (!hdr_ || out_slot < 0 || out_slot >= static_cast<int>(LS_OUT_SLOTS)) return false;
  const ls_out_slot& s = out_win_[out_slot];
  for (int attempt = 0; attempt < 64; attempt++) {  // the seqlock, as RecentOutput's
    uint32_t seq = s.seq.load(std::memory_order_acquire);
    if (seq & 1) continue;
    uint32_t state = s.state.load(std::memory_order_relaxed);
    uint32_t holder = s.conn.load(std::memory_order_relaxed);
    uint32_t lost = s.lost.load(std::memory_order_relaxed);
    uint64_t e = s.end.load(std::memory_order_relaxed);
    uint64_t d = s.end_digest.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.seq.load(std::memory_order_relaxed) != seq) continue;
    if (state == LS_OUT_FREE || holder != conn || lost) return false;
    *end = e;
    *digest = d;
    return true;
  }
  return false;
}

bool ShimChannel::RecentOutput(int out_slot, uint32_t conn, OutputWindow* w) const {
  if (!hdr_ || out_slot < 0 || out_slot >= static_cast<int>(LS_OUT_SLOTS)) return false;
  const ls_out_slot& s = out_win_[out_slot];
  const char* bytes = out_bytes_ + static_cast<size_t>(out_slot) * LS_OUT_WINDOW;
  // A seqlock: the shim may be writing it right now; retry until a read
  // falls between two of its writes.
  for (int attempt = 0; attempt < 1000; attempt++) {
    if (attempt >= 16) std::this_thread::yield();
    uint32_t seq = s.seq.load(std::memory_order_acquire);
    if (seq & 1) continue;
    uint32_t state = s.state.load(std::memory_order_relaxed);
    uint32_t holder = s.conn.load(std::memory_order_relaxed);
    uint64_t end = s.end.load(std::memory_order_relaxed);
    size_t n = static_cast<size_t>(std::min<uint64_t>(end, LS_OUT_WINDOW));
    uint64_t start = end - n;
    size_t at = static_cast<size_t>(start % LS_OUT_WINDOW);
    size_t first = std::min<size_t>(n, LS_OUT_WINDOW - at);
    w->bytes.resize(n);
    memcpy(w->bytes.data(), bytes + at, first);
    memcpy(w->bytes.data() + first, bytes, n - first);
    // The stacks of the last sends, oldest first.
    uint64_t sends = s.sends.load(std::memory_order_relaxed);
    const ls_send_stack* stacks = out_stacks_ + static_cast<size_t>(out_slot) * LS_SEND_STACKS;
    w->sends.clear();
    for (uint64_t k = sends > LS_SEND_STACKS ? sends - LS_SEND_STACKS : 0; k < sends; k++) {
      ls_send_stack copy;
      memcpy(&copy, &stacks[k % LS_SEND_STACKS], sizeof copy);
      OutputWindow::Send send{copy.start, copy.end, {}};
      for (uint32_t i = 0; i < std::min<uint32_t>(copy.depth, LS_STACK_DEPTH); i++)
        send.pcs.push_back(copy.pc[i]);
      w->sends.push_back(std::move(send));
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.seq.load(std::memory_order_relaxed) != seq) continue;
    if (state == LS_OUT_FREE || holder != conn) break;
    w->start = start;
    w->ended = state == LS_OUT_ENDED || state == LS_OUT_GONE;
    w->closed = state == LS_OUT_GONE;
    return true;
  }
  w->bytes.clear();
  return false;
}

ShimChannel::OutputStats ShimChannel::GetOutputStats() const {
  OutputStats st;
  if (!hdr_) return st;
  st.enabled = hdr_->out_enabled.load() != 0;
  st.published = hdr_->out_head.load();
  st.consumed = out_tail_;
  st.dropped_full = hdr_->out_dropped_full.load();
  st.dropped_busy = hdr_->out_dropped_busy.load();
  st.unhashed = hdr_->out_unhashed.load();
  st.unslotted = hdr_->out_unslotted.load();
  return st;
}

}  // namespace lockstep
