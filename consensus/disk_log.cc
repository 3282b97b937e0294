// disk_log.cc — segment files, recovery, padded durable appends and the
// segment preparer thread (the group-commit disk thread is disk_writer.cc).
#include "consensus/disk_log.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

namespace lockstep {

namespace {

constexpr std::string_view kSegmentMagic = "lockstep-segment";  // 16 bytes
constexpr size_t kSegmentHeaderSize = RecordSize(kSegmentMagic.size());
constexpr size_t kPadMinSize = RecordSize(0);
constexpr size_t kZeroChunk = 1 << 20;

std::string ErrnoText(int e) {
  return std::strerror(e);
}

std::string Hex16(uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "%016" PRIx64, v);
  return b;
}

std::string SegmentName(uint64_t base) {
  return "seg-" + Hex16(base);
}
std::string PrepName(uint64_t base) {
  return "prep-" + Hex16(base);
}

// "seg-" + exactly 16 hex digits.
bool ParseName(const char* name, std::string_view prefix, uint64_t* base) {
  std::string_view n(name);
  if (n.size() != prefix.size() + 16 || n.substr(0, prefix.size()) != prefix) return false;
  uint64_t v = 0;
  for (char c : n.substr(prefix.size())) {
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else
      return false;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *base = v;
  return true;
}

uint64_t AlignUp(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

// Where a batch of `bytes` starting at `start` ends once padded: the next
// multiple of align, leaving room for a pad record when one is needed.
uint64_t PaddedEnd(uint64_t start, uint64_t bytes, uint64_t align) {
  uint64_t end = start + bytes;
  if (end % align == 0) return end;
  uint64_t gap = AlignUp(end, align) - end;
  if (gap < kPadMinSize) gap += align;
  return end + gap;
}

bool IsSegmentHeader(const DecodedRecord& r) {
  return r.header.type == static_cast<uint8_t>(EntryType::kPad) && r.payload == kSegmentMagic;
}

bool AllZero(const uint8_t* p, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    if (v) return false;
  }
  for (; i < n; i++)
    if (p[i]) return false;
  return true;
}

bool MakeDirs(const std::string& dir, std::string* error) {
  std::string cur;
  size_t i = 0;
  while (i <= dir.size()) {
    size_t j = dir.find('/', i);
    if (j == std::string::npos) j = dir.size();
    cur = dir.substr(0, j);
    if (!cur.empty() && mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
      *error = "cannot create directory " + cur + ": " + ErrnoText(errno);
      return false;
    }
    i = j + 1;
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *error = dir + " is not a directory";
    return false;
  }
  return true;
}

// Writes all of buf at off; on failure returns the errno (EIO for a write
// that makes no progress).
int PwriteAll(int fd, const uint8_t* buf, size_t len, uint64_t off) {
  while (len > 0) {
    ssize_t n = pwrite(fd, buf, len, static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;
    buf += n;
    len -= static_cast<size_t>(n);
    off += static_cast<uint64_t>(n);
  }
  return 0;
}

int PreadAll(int fd, uint8_t* buf, size_t len, uint64_t off, size_t* got) {
  *got = 0;
  while (len > 0) {
    ssize_t n = pread(fd, buf, len, static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) break;
    buf += n;
    len -= static_cast<size_t>(n);
    off += static_cast<uint64_t>(n);
    *got += static_cast<size_t>(n);
  }
  return 0;
}

long ReadSysfsLong(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return 0;
  long v = 0;
  if (std::fscanf(f, "%ld", &v) != 1) v = 0;
  std::fclose(f);
  return v;
}

// The sector size batches are aligned to: the device's physical block size,
// at least its logical one and the O_DIRECT offset alignment; 4096 when the
// file system sits on no block device we can see.
size_t DetectSectorBytes(const std::string& dir) {
  size_t align = 512;
  struct statx sx;
  if (statx(AT_FDCWD, dir.c_str(), 0, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) &&
      sx.stx_dio_offset_align > align) {
    align = sx.stx_dio_offset_align;
  }
  long physical = 0, logical = 0;
  struct stat st;
  if (stat(dir.c_str(), &st) == 0 && major(st.st_dev) != 0) {
    std::string base = "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" +
                       std::to_string(minor(st.st_dev));
    for (const char* q : {"/queue/", "/../queue/"}) {
      physical = ReadSysfsLong(base + q + "physical_block_size");
      logical = ReadSysfsLong(base + q + "logical_block_size");
      if (physical > 0) break;
    }
  }
  if (physical <= 0) physical = 4096;
  align = std::max<size_t>(align, static_cast<size_t>(std::max(physical, logical)));
  if (align > 65536 || (align & (align - 1)) != 0) align = 4096;
  return align;
}

// Creates `path` (which must not exist) with `size` bytes reserved and, when
// zero_fill, written with zeros and synced, so that later writes into it
// change no metadata. On failure removes the file, returns the errno and
// says which step failed in *what.
int PrepareSegmentFile(const std::string& path, uint64_t size, bool zero_fill, std::string* what) {
  unlink(path.c_str());
  int fd = open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0) {
    *what = "create";
    return errno;
  }
  int err = 0;
  if (fallocate(fd, 0, 0, static_cast<off_t>(size)) != 0) {
    err = errno;
    if (err == EOPNOTSUPP) {
      // No fallocate on this file system: writing zeros allocates instead.
      err = 0;
      zero_fill = true;
    } else {
      *what = "preallocate";
    }
  }
  if (err == 0 && zero_fill) {
    int dfd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_DIRECT);
    int wfd = dfd >= 0 ? dfd : fd;
    void* zeros = nullptr;
    if (posix_memalign(&zeros, 4096, kZeroChunk) != 0) {
      err = ENOMEM;
    } else {
      std::memset(zeros, 0, kZeroChunk);
      for (uint64_t off = 0; off < size && err == 0; off += kZeroChunk) {
        size_t n = static_cast<size_t>(std::min<uint64_t>(kZeroChunk, size - off));
        err = PwriteAll(wfd, static_cast<uint8_t*>(zeros), n, off);
        if (err == EINVAL && wfd == dfd) {  // O_DIRECT refused this size: buffered
          wfd = fd;
          err = PwriteAll(wfd, static_cast<uint8_t*>(zeros), n, off);
        }
      }
      std::free(zeros);
      if (err) *what = "fill with zeros";
    }
    if (dfd >= 0) close(dfd);
  }
  if (err == 0 && fdatasync(fd) != 0) {
    err = errno;
    *what = "sync";
  }
  close(fd);
  if (err) unlink(path.c_str());
  return err;
}

bool IsDiskFull(int e) {
  return e == ENOSPC || e == EDQUOT;
}

// Why the bytes at buf are not a valid record claimed to sit at `position`.
std::string WhyBad(const uint8_t* buf, size_t avail, uint64_t position) {
  char b[256];
  if (avail < kHeaderSize + kCanarySize) {
    std::snprintf(b, sizeof b, "only %zu bytes left in the file, a record needs at least %zu",
                  avail, kHeaderSize + kCanarySize);
    return b;
  }
  RecordHeader h;
  std::memcpy(&h, buf, sizeof h);
  if (AllZero(buf, kHeaderSize)) return "zeroed header (record never written)";
  if (h.magic != kRecordMagic) {
    std::snprintf(b, sizeof b, "bad magic 0x%08x", h.magic);
    return b;
  }
  if (h.position != position) {
    std::snprintf(b, sizeof b,
                  "position field %" PRIu64 " where %" PRIu64
                  " was expected (stale bytes from another file or offset)",
                  h.position, position);
    return b;
  }
  if (h.payload_len > kMaxPayload) {
    std::snprintf(b, sizeof b, "payload length %u exceeds the limit", h.payload_len);
    return b;
  }
  size_t size = RecordSize(h.payload_len);
  if (size > avail) {
    std::snprintf(b, sizeof b, "record of %zu bytes runs past the end of the file (%zu bytes left)",
                  size, avail);
    return b;
  }
  uint64_t canary;
  std::memcpy(&canary, buf + size - kCanarySize, sizeof canary);
  if (canary != CanaryFor(h.ballot, h.index, h.position))
    return "canary mismatch (record not completely written)";
  return std::string("checksum mismatch in a ") + EntryTypeName(static_cast<EntryType>(h.type)) +
         " record (bytes changed)";
}

// First offset >= from (8-byte steps) where a valid record decodes at its own
// position; -1 when none.
int64_t ScanForValid(const uint8_t* buf, size_t size, uint64_t base, size_t from,
                     DecodedRecord* found) {
  for (size_t off = AlignUp(from, 8); off + kHeaderSize + kCanarySize <= size; off += 8) {
    uint32_t magic;
    std::memcpy(&magic, buf + off, 4);
    if (magic != kRecordMagic) continue;
    if (DecodeRecord(buf + off, size - off, base + off, found) == DecodeStatus::kOk)
      return static_cast<int64_t>(off);
  }
  return -1;
}

bool ReadWholeFile(const std::string& path, std::vector<uint8_t>* out, std::string* error) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = "cannot open " + path + ": " + ErrnoText(errno);
    return false;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    *error = "cannot stat " + path + ": " + ErrnoText(errno);
    close(fd);
    return false;
  }
  out->resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  int err = PreadAll(fd, out->data(), out->size(), 0, &got);
  close(fd);
  if (err) {
    *error = "cannot read " + path + ": " + ErrnoText(err);
    return false;
  }
  out->resize(got);
  return true;
}

}  // namespace

const char* SyncModeName(SyncMode m) {
  switch (m) {
    case SyncMode::kDirectDsync: return "O_DIRECT|O_DSYNC";
    case SyncMode::kWriteFdatasync: return "write+fdatasync";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------
// Preparer: makes the next segment file (prep-<base>) in the background, so a
// roll only renames it.

class DiskLog::Preparer {
 public:
  Preparer(std::string dir, uint64_t size, bool zero_fill)
      : dir_(std::move(dir)), size_(size), zero_fill_(zero_fill), thread_([this] { Run(); }) {}
  ~Preparer() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    if (ready_) unlink(Path(ready_base_).c_str());
  }
  std::string Path(uint64_t base) const { return dir_ + "/" + PrepName(base); }

  void Request(uint64_t base) {
    std::lock_guard<std::mutex> l(mu_);
    if ((ready_ && ready_base_ == base) || (busy_ && busy_base_ == base) ||
        (want_ && want_base_ == base))
      return;
    if (ready_) {
      unlink(Path(ready_base_).c_str());
      ready_ = false;
    }
    want_ = true;
    want_base_ = base;
    cv_.notify_all();
  }

  // True with the prepared file's path when the segment at base is ready
  // (waits while it is being made); false when it is not to be had.
  bool Take(uint64_t base, std::string* path) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return !(busy_ && busy_base_ == base) && !(want_ && want_base_ == base); });
    if (ready_ && ready_base_ == base) {
      ready_ = false;
      *path = Path(base);
      return true;
    }
    return false;
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [&] { return stop_ || want_; });
      if (stop_) return;
      uint64_t base = want_base_;
      want_ = false;
      busy_ = true;
      busy_base_ = base;
      l.unlock();
      std::string what;
      int err = PrepareSegmentFile(Path(base), size_, zero_fill_, &what);
      l.lock();
      busy_ = false;
      if (err == 0) {
        if (ready_ && ready_base_ != base) unlink(Path(ready_base_).c_str());
        ready_ = true;
        ready_base_ = base;
      }
      cv_.notify_all();
    }
  }

  const std::string dir_;
  const uint64_t size_;
  const bool zero_fill_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool want_ = false, busy_ = false, ready_ = false;
  uint64_t want_base_ = 0, busy_base_ = 0, ready_base_ = 0;
  std::thread thread_;
};

// ---------------------------------------------------------------------------
// DiskLog

std::unique_ptr<DiskLog> DiskLog::Open(const DiskLogOptions& options, RecoveredLog* recovered,
                                       std::string* error) {
  std::string scratch;
  if (!error) error = &scratch;
  RecoveredLog ignored;
  if (!recovered) recovered = &ignored;
  *recovered = RecoveredLog{};
  if (options.dir.empty()) {
    *error = "disk log: no directory given";
    return nullptr;
  }
  std::unique_ptr<DiskLog> log(new DiskLog());
  log->options_ = options;
  log->dir_ = options.dir;
  while (log->dir_.size() > 1 && log->dir_.back() == '/') log->dir_.pop_back();
  log->mode_ = options.mode;
  if (!options.read_only && !MakeDirs(log->dir_, error)) return nullptr;

  log->dir_fd_ = open(log->dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (log->dir_fd_ < 0) {
    *error = "cannot open directory " + log->dir_ + ": " + ErrnoText(errno);
    return nullptr;
  }
  std::string lock_path = log->dir_ + "/LOCK";
  log->lock_fd_ = options.read_only ? open(lock_path.c_str(), O_RDONLY | O_CLOEXEC)
                                    : open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (log->lock_fd_ < 0) {
    *error = "cannot open " + lock_path + ": " + ErrnoText(errno);
    return nullptr;
  }
  const int lock_kind = options.read_only ? LOCK_SH : LOCK_EX;
  int lock_rc = flock(log->lock_fd_, lock_kind | LOCK_NB);
  for (int waited_ms = 0; lock_rc != 0 && errno == EWOULDBLOCK && waited_ms < options.lock_wait_ms;
       waited_ms += 20) {
    usleep(20000);
    lock_rc = flock(log->lock_fd_, lock_kind | LOCK_NB);
  }
  if (lock_rc != 0) {
    *error = errno == EWOULDBLOCK ? "disk log " + log->dir_ + " is in use by another DiskLog (" +
                                        lock_path + " is locked)"
                                  : "cannot lock " + lock_path + ": " + ErrnoText(errno);
    return nullptr;
  }

  size_t detected = DetectSectorBytes(log->dir_);
  if (options.sector_bytes) {
    size_t s = options.sector_bytes;
    if (s < 512 || (s & (s - 1)) != 0) {
      *error = "disk log: sector_bytes must be a power of two >= 512, not " + std::to_string(s);
      return nullptr;
    }
    log->align_ = s;
  } else {
    log->align_ = detected;
  }
  uint64_t seg = AlignUp(options.segment_bytes, log->align_);
  if (seg < 4 * log->align_) {
    *error = "disk log: segment_bytes " + std::to_string(options.segment_bytes) +
             " is too small (at least " + std::to_string(4 * log->align_) + ")";
    return nullptr;
  }
  log->segment_bytes_ = seg;
  log->zeros_.assign(2 * 65536, '\0');

  if (!log->Recover(recovered, error)) return nullptr;
  if (options.prepare_ahead && !options.read_only) {
    // The next segment is prepared once the active one is half full (see
    // Append), not now: zero-filling 64 MiB at start competes with the first
    // durable writes of every replica on this host.
    log->preparer_ = std::make_unique<Preparer>(log->dir_, log->segment_bytes_, options.zero_fill);
  }
  return log;
}

DiskLog::~DiskLog() {
  preparer_.reset();
  if (active_fd_ >= 0) close(active_fd_);
  if (dir_fd_ >= 0) close(dir_fd_);
  if (lock_fd_ >= 0) close(lock_fd_);  // releases the flock
  std::free(buf_);
}

std::vector<std::string> DiskLog::SegmentPaths() const {
  std::vector<std::string> out;
  for (const Segment& s : segments_) out.push_back(s.path);
  return out;
}

bool DiskLog::SyncDir(std::string* error) {
  if (fsync(dir_fd_) != 0) {
    *error = "cannot sync directory " + dir_ + ": " + ErrnoText(errno);
    return false;
  }
  return true;
}

bool DiskLog::OpenForWrite(const std::string& path, int* fd, std::string* error) {
  if (mode_ == SyncMode::kDirectDsync) {
    *fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_DIRECT | O_DSYNC);
    if (*fd >= 0) return true;
    if (errno != EINVAL) {
      *error = "cannot open " + path + ": " + ErrnoText(errno);
      return false;
    }
    mode_ = SyncMode::kWriteFdatasync;  // this file system refuses O_DIRECT
  }
  *fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (*fd < 0) {
    *error = "cannot open " + path + ": " + ErrnoText(errno);
    return false;
  }
  return true;
}

bool DiskLog::Recover(RecoveredLog* out, std::string* error) {
  // List the directory.
  std::vector<Segment> files;
  std::vector<std::string> stale_preps;
  DIR* d = opendir(dir_.c_str());
  if (!d) {
    *error = "cannot list " + dir_ + ": " + ErrnoText(errno);
    return false;
  }
  while (dirent* e = readdir(d)) {
    uint64_t base;
    if (ParseName(e->d_name, "seg-", &base)) {
      files.push_back(Segment{base, 0, dir_ + "/" + e->d_name, 0});
    } else if (ParseName(e->d_name, "prep-", &base)) {
      stale_preps.push_back(dir_ + "/" + e->d_name);
    }
  }
  closedir(d);
  if (!options_.read_only)
    for (const std::string& p : stale_preps) unlink(p.c_str());
  std::sort(files.begin(), files.end(),
            [](const Segment& a, const Segment& b) { return a.base < b.base; });
  for (Segment& f : files) {
    struct stat st;
    if (stat(f.path.c_str(), &st) != 0) {
      *error = "cannot stat " + f.path + ": " + ErrnoText(errno);
      return false;
    }
    f.size = static_cast<uint64_t>(st.st_size);
    next_base_ = std::max(next_base_, AlignUp(f.base + f.size, 4096));
  }

  std::map<uint64_t, Entry> slots;
  auto apply = [&](const DecodedRecord& r, Segment* seg) {
    out->records++;
    out->bytes += r.size;
    const RecordHeader& h = r.header;
    EntryType type = static_cast<EntryType>(h.type);
    if (IsSlotType(type)) {
      seg->max_slot = std::max(seg->max_slot, h.index);
      out->commit_index = std::max(out->commit_index, h.commit_index);
      if (h.index < std::max<uint64_t>(out->truncated_below, 1)) return;
      Entry& e = slots[h.index];
      e.index = h.index;
      e.ballot = h.ballot;
      e.type = type;
      e.payload.assign(r.payload);
    } else if (type == EntryType::kPromise) {
      out->promised = h.ballot;
    } else if (type == EntryType::kTruncate) {
      out->truncated_below = h.index;
      out->truncate_note.assign(r.payload);
      out->commit_index = std::max(out->commit_index, h.commit_index);
      slots.erase(slots.begin(), slots.lower_bound(h.index));
    }
  };

  // Follow the chain.
  std::vector<uint8_t> buf;
  size_t last = files.size();  // index of the segment where the chain ends
  uint64_t end_off = 0;
  bool mismatch = false;
  uint64_t mismatch_pos = 0;
  for (size_t i = 0; i < files.size(); i++) {
    Segment& seg = files[i];
    if (!ReadWholeFile(seg.path, &buf, error)) return false;
    // Valid records from the start, the first being the segment header.
    std::vector<uint64_t> ends;
    uint64_t off = 0;
    DecodedRecord r;
    while (off < buf.size() && DecodeRecord(buf.data() + off, buf.size() - off, seg.base + off,
                                            &r) == DecodeStatus::kOk) {
      if (off == 0 && !IsSegmentHeader(r)) break;
      off += r.size;
      ends.push_back(off);
    }
    uint64_t seg_end = off;
    bool rolled = false;
    if (i + 1 < files.size()) {
      // Where the next segment says this one ended.
      uint8_t hb[kSegmentHeaderSize];
      int fd = open(files[i + 1].path.c_str(), O_RDONLY | O_CLOEXEC);
      size_t got = 0;
      if (fd < 0 || PreadAll(fd, hb, sizeof hb, 0, &got) != 0) {
        *error = "cannot read " + files[i + 1].path + ": " + ErrnoText(errno);
        if (fd >= 0) close(fd);
        return false;
      }
      close(fd);
      DecodedRecord h;
      if (DecodeRecord(hb, got, files[i + 1].base, &h) == DecodeStatus::kOk && IsSegmentHeader(h)) {
        uint64_t x = h.header.index;
        if (x >= seg.base && std::binary_search(ends.begin(), ends.end(), x - seg.base)) {
          seg_end =
              x - seg.base;  // records past x come from a write that failed: not part of the log
          rolled = true;
        } else {
          mismatch = true;
          mismatch_pos = x;
        }
      }
    }
    for (uint64_t o = 0; o < seg_end;) {
      DecodeRecord(buf.data() + o, buf.size() - o, seg.base + o, &r);
      apply(r, &seg);
      o += r.size;
    }
    if (rolled) continue;
    last = i;
    end_off = seg_end;
    break;
  }

  // Classify what follows the end of the chain.
  if (last < files.size()) {
    Segment& seg = files[last];
    const uint64_t end_pos = seg.base + end_off;
    // buf still holds segment `last`.
    std::string why = WhyBad(buf.data() + std::min<size_t>(end_off, buf.size()),
                             buf.size() - std::min<size_t>(end_off, buf.size()), end_pos);
    char where_buf[512];
    std::snprintf(where_buf, sizeof where_buf,
                  "%s at offset %" PRIu64 " (log position %" PRIu64 ")", seg.path.c_str(), end_off,
                  end_pos);
    std::string where = where_buf;
    // A clean end: a batch boundary (on the smallest sector any run uses)
    // followed by nothing but zeros.
    bool tail_zero = end_off % 512 == 0 && AllZero(buf.data() + end_off, buf.size() - end_off);
    std::string found_where;
    DecodedRecord found;
    int64_t at = ScanForValid(buf.data(), buf.size(), seg.base, end_off + 8, &found);
    if (at >= 0) {
      found_where = seg.path + " at offset " + std::to_string(at);
    }
    bool later_zero = true;
    std::vector<uint8_t> lbuf;
    for (size_t j = last + 1; j < files.size(); j++) {
      if (!ReadWholeFile(files[j].path, &lbuf, error)) return false;
      if (!AllZero(lbuf.data(), lbuf.size())) later_zero = false;
      if (j == last + 1 && !mismatch && tail_zero && !later_zero) {
        // This segment ended cleanly: the first bad record is the next
        // segment's header.
        why = WhyBad(lbuf.data(), lbuf.size(), files[j].base);
        std::snprintf(where_buf, sizeof where_buf,
                      "%s at offset 0 (log position %" PRIu64 ", the segment header)",
                      files[j].path.c_str(), files[j].base);
        where = where_buf;
      }
      if (found_where.empty()) {
        int64_t a = ScanForValid(lbuf.data(), lbuf.size(), files[j].base, 0, &found);
        if (a >= 0) found_where = files[j].path + " at offset " + std::to_string(a);
      }
    }
    if (mismatch) {
      out->damaged = true;
      char b[256];
      std::snprintf(b, sizeof b,
                    "; the next segment %s says the log continued to position %" PRIu64,
                    files[last + 1].path.c_str(), mismatch_pos);
      out->problem = "damaged log: bad record in " + where + ": " + why + b +
                     "; everything from there on is dropped";
    } else if (!found_where.empty()) {
      out->damaged = true;
      out->problem = "damaged log: bad record in " + where + ": " + why + "; a valid " +
                     EntryTypeName(static_cast<EntryType>(found.header.type)) + " record (index " +
                     std::to_string(found.header.index) + ") follows in " + found_where +
                     "; everything from the bad record on is dropped";
    } else if (!(tail_zero && later_zero)) {
      out->torn_tail = true;
      out->problem = "torn tail: incomplete record in " + where + ": " + why +
                     "; nothing valid follows; dropped from there on";
    }
    const bool clean = !out->damaged && !out->torn_tail;

    // Segments past the end of the chain, and this one when it holds nothing
    // valid: empty or torn ones go, damaged ones are kept aside (renamed, so
    // recovery never reads them again) for inspection.
    size_t keep = end_off > 0 ? last + 1 : last;
    bool removed = false;
    for (size_t j = keep; j < files.size() && !options_.read_only; j++) {
      if (out->damaged) {
        std::string to = files[j].path + ".damaged";
        for (int n = 1; access(to.c_str(), F_OK) == 0; n++)
          to = files[j].path + ".damaged." + std::to_string(n);
        if (rename(files[j].path.c_str(), to.c_str()) != 0) {
          *error = "cannot rename " + files[j].path + ": " + ErrnoText(errno);
          return false;
        }
      } else if (unlink(files[j].path.c_str()) != 0) {
        *error = "cannot remove " + files[j].path + ": " + ErrnoText(errno);
        return false;
      }
      removed = true;
    }
    if (removed && !SyncDir(error)) return false;
    files.resize(keep);

    // end_off == 0 happens only in the first segment (a later one is reached
    // through its valid header), so then no valid record precedes.
    chain_end_ = end_off > 0 ? end_pos : 0;
    if (clean && end_off > 0 && end_off % align_ == 0 && !options_.read_only) {
      // Continue in this segment, right after the last valid record.
      if (!OpenForWrite(seg.path, &active_fd_, error)) return false;
      write_off_ = end_off;
    }
  }

  for (Segment& f : files) segments_.push_back(f);

  // The contiguous slots.
  uint64_t first = std::max<uint64_t>(out->truncated_below, 1);
  uint64_t expect = first;
  for (auto& [index, e] : slots) {
    if (index != expect) {
      out->damaged = true;
      if (!out->problem.empty()) out->problem += "; ";
      out->problem += "slot " + std::to_string(expect) +
                      " is missing (next slot found: " + std::to_string(index) + "): slots from " +
                      std::to_string(expect) + " on are dropped";
      break;
    }
    out->slots.push_back(std::move(e));
    expect++;
  }
  promised_ = out->promised;
  truncated_below_ = out->truncated_below;
  last_index_ = out->slots.empty() ? 0 : out->slots.back().index;
  max_commit_ = out->commit_index;
  return true;
}

bool DiskLog::Append(const std::vector<LogRecord>& batch, std::string* error) {
  std::string scratch;
  return AppendRecords(batch, false, error ? error : &scratch);
}

// Checks everything before anything is written: slot indexes keep the log
// contiguous, only the types a caller may append, payloads that fit.
bool DiskLog::CheckBatch(const std::vector<LogRecord>& batch, bool internal, uint64_t* total,
                         std::string* error) const {
  if (options_.read_only) {
    *error = "disk log " + dir_ + " was opened read-only";
    return false;
  }
  uint64_t next = std::max(last_index_ + 1, FirstIndex());
  *total = 0;
  for (const LogRecord& r : batch) {
    if (IsSlotType(r.type)) {
      if (r.index < FirstIndex() || r.index > next) {
        *error = "disk log: slot index " + std::to_string(r.index) + " out of range [" +
                 std::to_string(FirstIndex()) + ", " + std::to_string(next) +
                 "] (the log must stay contiguous)";
        return false;
      }
      if (r.index == next) next++;
    } else if (r.type == EntryType::kPromise || (internal && r.type == EntryType::kTruncate)) {
    } else {
      *error = std::string("disk log: cannot append a ") + EntryTypeName(r.type) + " record" +
               (r.type == EntryType::kTruncate ? " (use TruncateBelow)" : "");
      return false;
    }
    if (r.payload.size() > kMaxPayload) {
      *error = "disk log: payload of " + std::to_string(r.payload.size()) + " bytes is too large";
      return false;
    }
    *total += RecordSize(r.payload.size());
  }
  uint64_t fresh = PaddedEnd(0, kSegmentHeaderSize + *total, align_);
  if (fresh > segment_bytes_) {
    *error = "disk log: a batch of " + std::to_string(*total) +
             " bytes does not fit in a segment of " + std::to_string(segment_bytes_) + " bytes";
    return false;
  }
  return true;
}

// Whether a batch of `total` record bytes goes into the active segment (no
// new segment first).
bool DiskLog::FitsActiveSegment(uint64_t total) const {
  return active_fd_ >= 0 && PaddedEnd(write_off_, total, align_) <= segments_.back().size;
}

// Lays the batch out in the write buffer at the active segment's write
// offset (a header first in a fresh segment, a pad to the sector boundary
// last) and says where it goes. Changes nothing the log knows.
bool DiskLog::EncodeBatch(const std::vector<LogRecord>& batch, uint64_t total, AppendWrite* w,
                          std::string* error) {
  const Segment& seg = segments_.back();
  const uint64_t start = write_off_;
  const bool header = write_off_ == 0;
  const uint64_t end = PaddedEnd(start, (header ? kSegmentHeaderSize : 0) + total, align_);
  const size_t len = static_cast<size_t>(end - start);
  if (len > buf_cap_) {
    size_t cap = static_cast<size_t>(AlignUp(std::max<size_t>(len, 2 * buf_cap_), 4096));
    void* p = nullptr;
    if (posix_memalign(&p, 4096, cap) != 0) {
      *error = "disk log: out of memory for a " + std::to_string(len) + " byte write buffer";
      return false;
    }
    std::free(buf_);
    buf_ = static_cast<uint8_t*>(p);
    buf_cap_ = cap;
  }
  size_t p = 0;
  if (header) {
    EncodeRecord(buf_, EntryType::kPad, 0, chain_end_, 0, seg.base, kSegmentMagic);
    p += kSegmentHeaderSize;
  }
  for (const LogRecord& r : batch) {
    EncodeRecord(buf_ + p, r.type, r.ballot, r.index, r.commit_index, seg.base + start + p,
                 r.payload);
    p += RecordSize(r.payload.size());
  }
  w->last_canary = p - kCanarySize;
  if (p < len) {
    size_t pad = len - p - kPadMinSize;
    EncodeRecord(buf_ + p, EntryType::kPad, 0, 0, 0, seg.base + start + p,
                 std::string_view(zeros_.data(), pad));
  }
  w->fd = active_fd_;
  w->data = buf_;
  w->len = len;
  w->offset = start;
  w->needs_datasync = mode_ == SyncMode::kWriteFdatasync;
  w->records = batch.size();
  return true;
}

// A write or sync of the active segment failed: whatever reached the disk
// is never acknowledged; the segment is abandoned and the batch goes to a
// fresh one next time, so stale bytes of this attempt can never line up
// with a later record. Returns true when the same batch should be tried
// again at once (the device wants a larger O_DIRECT alignment than it said).
bool DiskLog::WriteFailed(const AppendWrite& w, int err, const char* step, bool first_attempt,
                          std::string* error) {
  const std::string& path = segments_.back().path;
  if (active_fd_ >= 0) close(active_fd_);
  active_fd_ = -1;
  if (err == EINVAL && mode_ == SyncMode::kDirectDsync && align_ < 4096 && first_attempt) {
    align_ = 4096;
    return true;
  }
  char b[512];
  if (IsDiskFull(err)) {
    std::snprintf(b, sizeof b, "disk full: cannot append %zu bytes to %s: %s", w.len, path.c_str(),
                  ErrnoText(err).c_str());
  } else {
    std::snprintf(b, sizeof b,
                  "I/O error: cannot append %zu bytes to %s at offset %" PRIu64 " (%s): %s", w.len,
                  path.c_str(), w.offset, step, ErrnoText(err).c_str());
  }
  *error = b;
  return false;
}

// The batch is durable: now update what the log knows.
void DiskLog::NoteDurable(const std::vector<LogRecord>& batch, const AppendWrite& w) {
  const uint64_t end = w.offset + w.len;
  write_off_ = end;
  if (preparer_ && write_off_ >= segment_bytes_ / 2) preparer_->Request(next_base_);
  newest_empty_ = false;
  Segment& s = segments_.back();
  chain_end_ = s.base + end;
  for (const LogRecord& r : batch) {
    if (IsSlotType(r.type)) {
      last_index_ = std::max(last_index_, r.index);
      s.max_slot = std::max(s.max_slot, r.index);
      max_commit_ = std::max(max_commit_, r.commit_index);
    } else if (r.type == EntryType::kPromise) {
      promised_ = r.ballot;
    } else if (r.type == EntryType::kTruncate) {
      truncated_below_ = r.index;
      max_commit_ = std::max(max_commit_, r.commit_index);
      if (last_index_ < r.index) last_index_ = 0;  // no slot at or above the new first index
    }
  }
}

bool DiskLog::AppendRecords(const std::vector<LogRecord>& batch, bool internal,
                            std::string* error) {
  if (batch.empty()) return true;
  if (uint32_t us = append_delay_us_.load()) usleep(us);  // failpoint: a slow disk
  uint64_t total = 0;
  if (!CheckBatch(batch, internal, &total, error)) return false;
  for (int attempt = 0;; attempt++) {
    if (!FitsActiveSegment(total) && !Roll(PaddedEnd(0, kSegmentHeaderSize + total, align_), error))
      return false;
    AppendWrite w;
    if (!EncodeBatch(batch, total, &w, error)) return false;
    if (!internal && tear_next_append_.exchange(false)) {
      // A crash in the middle of this write: the sectors before the one
      // that holds the last record's canary reach the disk, the rest not
      // (a sector is written whole or not at all).
      size_t cut = w.last_canary / align_ * align_;
      int e = cut ? PwriteAll(w.fd, w.data, cut, w.offset) : 0;
      if (e == 0 && cut && fdatasync(w.fd) != 0) e = errno;
      std::fprintf(stderr,
                   "failpoint torn_write: %zu of the %zu bytes of a %zu-record append written "
                   "(%s), the last record's canary not; exiting as a crash would\n",
                   cut, w.len, batch.size(), e ? ErrnoText(e).c_str() : "on disk");
      std::fflush(stderr);
      _exit(kTornWriteExit);
    }
    int err = PwriteAll(w.fd, w.data, w.len, w.offset);
    const char* step = "write";
    if (err == 0 && w.needs_datasync && fdatasync(w.fd) != 0) {
      err = errno;
      step = "sync";
    }
    if (err != 0) {
      if (WriteFailed(w, err, step, attempt == 0, error)) continue;
      return false;
    }
    NoteDurable(batch, w);
    return true;
  }
}

bool DiskLog::BeginAppend(const std::vector<LogRecord>& batch, AppendWrite* w) {
  // What a failpoint must see, a new segment (file operations that may
  // block) and every error go the synchronous way (Append).
  if (batch.empty() || append_delay_us_.load() || tear_next_append_.load()) return false;
  uint64_t total = 0;
  std::string error;
  if (!CheckBatch(batch, false, &total, &error) || !FitsActiveSegment(total)) return false;
  return EncodeBatch(batch, total, w, &error);
}

bool DiskLog::EndAppend(const std::vector<LogRecord>& batch, const AppendWrite& w, int err,
                        const char* step, std::string* error) {
  if (err != 0) {
    WriteFailed(w, err, step, false, error);
    return false;
  }
  NoteDurable(batch, w);
  return true;
}

// Starts a new segment at next_base_: takes the prepared file (or prepares
// one now), names it, makes the name durable and opens it.
bool DiskLog::Roll(size_t write_bytes, std::string* error) {
  const uint64_t base = next_base_;
  const std::string path = dir_ + "/" + SegmentName(base);
  auto fail = [&](const std::string& what, int err) {
    char b[768];
    if (IsDiskFull(err)) {
      std::snprintf(b, sizeof b, "disk full: cannot append %zu bytes to %s: %s: %s", write_bytes,
                    path.c_str(), what.c_str(), ErrnoText(err).c_str());
    } else {
      std::snprintf(b, sizeof b, "I/O error: cannot append %zu bytes to %s: %s: %s", write_bytes,
                    path.c_str(), what.c_str(), ErrnoText(err).c_str());
    }
    *error = b;
    return false;
  };

  // The newest segment received no successful write (its first write
  // failed): it holds nothing acknowledged, and must go so that the chain
  // runs from the segment before it straight to the new one.
  if (newest_empty_ && !segments_.empty()) {
    if (unlink(segments_.back().path.c_str()) != 0 && errno != ENOENT)
      return fail("cannot remove the abandoned segment " + segments_.back().path, errno);
    if (fsync(dir_fd_) != 0) return fail("cannot sync directory " + dir_, errno);
    segments_.pop_back();
    newest_empty_ = false;
  }

  std::string prep;
  if (!preparer_ || !preparer_->Take(base, &prep)) {
    prep = dir_ + "/" + PrepName(base);
    std::string what;
    int err = PrepareSegmentFile(prep, segment_bytes_, options_.zero_fill, &what);
    if (err) {
      return fail(
          "cannot " + what + " a new segment of " + std::to_string(segment_bytes_) + " bytes", err);
    }
  }
  if (rename(prep.c_str(), path.c_str()) != 0) {
    int err = errno;
    unlink(prep.c_str());
    return fail("cannot rename " + prep, err);
  }
  std::string e;
  if (fsync(dir_fd_) != 0) {
    int err = errno;
    unlink(path.c_str());
    fsync(dir_fd_);
    return fail("cannot sync directory " + dir_, err);
  }
  int fd = -1;
  if (!OpenForWrite(path, &fd, &e)) {
    int err = errno;
    unlink(path.c_str());
    fsync(dir_fd_);
    return fail("cannot open the new segment", err);
  }
  if (active_fd_ >= 0) close(active_fd_);
  active_fd_ = fd;
  write_off_ = 0;
  newest_empty_ = true;
  segments_.push_back(Segment{base, segment_bytes_, path, 0});
  next_base_ = base + segment_bytes_;
  return true;
}

bool DiskLog::TruncateBelow(uint64_t index, std::string* error, std::string_view base_note) {
  std::string scratch;
  if (!error) error = &scratch;
  if (index <= truncated_below_) return true;
  if (options_.read_only) {
    *error = "disk log " + dir_ + " was opened read-only";
    return false;
  }
  // Everything below index is chosen (a truncation point is at most the
  // commit index + 1, or a checkpoint's index + 1): a recovery must not find
  // a log that starts past its commit index.
  max_commit_ = std::max(max_commit_, index - 1);
  std::vector<LogRecord> recs;
  recs.push_back(LogRecord{EntryType::kTruncate, 0, index, max_commit_, base_note});
  // Restate the promise: the segment holding the last one may be deleted.
  if (promised_ != 0) recs.push_back(LogRecord{EntryType::kPromise, promised_, 0, 0, {}});
  if (!AppendRecords(recs, true, error)) return false;
  // Delete the oldest segments holding only slots below index (never the
  // active one, and always a prefix, so the chain stays unbroken).
  while (segments_.size() > 1 && segments_.front().max_slot < index) {
    const std::string path = segments_.front().path;
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      *error = "cannot remove " + path + ": " + ErrnoText(errno);
      return false;
    }
    // One at a time: a later deletion must never be durable before an
    // earlier one, or the chain would have a hole.
    if (!SyncDir(error)) return false;
    segments_.pop_front();
  }
  return true;
}

// ---------------------------------------------------------------------------

std::vector<double> MeasureDurableWrites(const std::string& dir, SyncMode mode, size_t bytes, int n,
                                         std::string* error) {
  std::string scratch;
  if (!error) error = &scratch;
  std::vector<double> out;
  if (n <= 0) return out;
  if (!MakeDirs(dir, error)) return out;
  const size_t align = DetectSectorBytes(dir);
  const size_t len = static_cast<size_t>(AlignUp(std::max<size_t>(bytes, 1), align));
  static std::atomic<int> counter{0};
  const std::string path =
      dir + "/measure-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + ".tmp";
  std::string what;
  int err =
      PrepareSegmentFile(path, static_cast<uint64_t>(len) * static_cast<uint64_t>(n), true, &what);
  if (err) {
    *error = "cannot " + what + " " + path + ": " + ErrnoText(err);
    return out;
  }
  int flags = O_RDWR | O_CLOEXEC;
  if (mode == SyncMode::kDirectDsync) flags |= O_DIRECT | O_DSYNC;
  int fd = open(path.c_str(), flags);
  if (fd < 0) {
    *error = std::string("cannot open ") + path + " with " + SyncModeName(mode) + ": " +
             ErrnoText(errno);
    unlink(path.c_str());
    return out;
  }
  void* buf = nullptr;
  if (posix_memalign(&buf, 4096, AlignUp(len, 4096)) != 0) {
    *error = "out of memory";
    close(fd);
    unlink(path.c_str());
    return out;
  }
  std::memset(buf, 0x5a, len);
  for (int i = 0; i < n; i++) {
    auto t0 = std::chrono::steady_clock::now();
    err = PwriteAll(fd, static_cast<uint8_t*>(buf), len, static_cast<uint64_t>(i) * len);
    if (err == 0 && mode == SyncMode::kWriteFdatasync && fdatasync(fd) != 0) err = errno;
    auto t1 = std::chrono::steady_clock::now();
    if (err) {
      *error = "durable write to " + path + " failed: " + ErrnoText(err);
      out.clear();
      break;
    }
    out.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::free(buf);
  close(fd);
  unlink(path.c_str());
  return out;
}

}  // namespace lockstep
