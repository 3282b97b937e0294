// store.cc — checksummed checkpoints on disk (see store.h).
#include "checkpoint/store.h"

#include <dirent.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <map>
#include <memory>

namespace lockstep {
namespace {

constexpr size_t kIndexDigits = 20;
constexpr const char* kTmpPrefix = "tmp-";
constexpr size_t kMaxManifestBytes = 256 << 20;

std::string Errno(const std::string& what, int err) {
  return what + ": " + strerror(err);
}

std::string Join(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a.back() == '/' ? a + b : a + "/" + b;
}

std::string IndexName(uint64_t index) {
  char buf[32];
  snprintf(buf, sizeof buf, "%020llu", static_cast<unsigned long long>(index));
  return buf;
}

bool ParseIndexName(const std::string& name, uint64_t* index) {
  if (name.size() != kIndexDigits) return false;
  uint64_t v = 0;
  for (char c : name) {
    if (c < '0' || c > '9') return false;
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *index = v;
  return true;
}

std::string RandomHex() {
  unsigned char b[8];
  if (getrandom(b, sizeof b, 0) != static_cast<ssize_t>(sizeof b)) {
    uint64_t t = static_cast<uint64_t>(clock()) ^ static_cast<uint64_t>(time(nullptr)) ^
                 (static_cast<uint64_t>(getpid()) << 32);
    memcpy(b, &t, sizeof b);
  }
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) {
    s += kHex[c >> 4];
    s += kHex[c & 15];
  }
  return s;
}

std::string Hex(const std::string& bytes) {
  static const char* kHex = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    s += kHex[c >> 4];
    s += kHex[c & 15];
  }
  return s;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool Unhex(const std::string& hex, std::string* out) {
  if (hex.size() % 2) return false;
  out->clear();
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = HexDigit(hex[i]), lo = HexDigit(hex[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<char>(hi << 4 | lo));
  }
  return true;
}

// Paths and link targets may hold any byte but '\0': spaces, '%', control
// bytes and non-ASCII become %XX so that a MANIFEST line splits on spaces.
std::string Escape(const std::string& s) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (c <= 0x20 || c >= 0x7f || c == '%') {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

bool Unescape(const std::string& s, std::string* out) {
  out->clear();
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] != '%') {
      out->push_back(s[i]);
      continue;
    }
    if (i + 2 >= s.size()) return false;
    int hi = HexDigit(s[i + 1]), lo = HexDigit(s[i + 2]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<char>(hi << 4 | lo));
    i += 2;
  }
  return true;
}

bool ParseU64(const std::string& s, uint64_t* v) {
  if (s.empty() || s.size() > 20) return false;
  uint64_t x = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (x > (UINT64_MAX - d) / 10) return false;
    x = x * 10 + d;
  }
  *v = x;
  return true;
}

bool ParseI64(const std::string& s, int64_t* v) {
  bool neg = !s.empty() && s[0] == '-';
  uint64_t x;
  if (!ParseU64(neg ? s.substr(1) : s, &x) || x > static_cast<uint64_t>(INT64_MAX)) return false;
  *v = neg ? -static_cast<int64_t>(x) : static_cast<int64_t>(x);
  return true;
}

std::vector<std::string> SplitSpaces(const std::string& line) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < line.size()) {
    size_t j = line.find(' ', i);
    if (j == std::string::npos) j = line.size();
    out.push_back(line.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

struct EvpCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

std::string Sha256Hex(const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), md, &n, EVP_sha256(), nullptr);
  return Hex(std::string(reinterpret_cast<char*>(md), n));
}

// Reads the whole file through SHA-256; with `sync`, also fsyncs it (Commit
// makes every byte it vouches for durable in the same pass).
bool HashFile(const std::string& path, bool sync, std::string* hex, uint64_t* size,
              std::string* error) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    *error = Errno("cannot open " + path, errno);
    return false;
  }
  posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::unique_ptr<EVP_MD_CTX, EvpCtxFree> ctx(EVP_MD_CTX_new());
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    close(fd);
    *error = "cannot set up SHA-256 (OpenSSL)";
    return false;
  }
  std::vector<char> buf(1 << 20);
  uint64_t total = 0;
  for (;;) {
    ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *error = Errno("cannot read " + path, errno);
      close(fd);
      return false;
    }
    if (n == 0) break;
    EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(n));
    total += static_cast<uint64_t>(n);
  }
  if (sync && fsync(fd) != 0) {
    *error = Errno("cannot fsync " + path, errno);
    close(fd);
    return false;
  }
  close(fd);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &n);
  *hex = Hex(std::string(reinterpret_cast<char*>(md), n));
  *size = total;
  return true;
}

bool FsyncPath(const std::string& path, std::string* error) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECTORY);
  if (fd < 0) {
    *error = Errno("cannot open " + path, errno);
    return false;
  }
  if (fsync(fd) != 0) {
    *error = Errno("cannot fsync " + path, errno);
    close(fd);
    return false;
  }
  close(fd);
  return true;
}

// The names in a directory, sorted, without "." and "..".
bool ListDir(const std::string& path, std::vector<std::string>* names, std::string* error) {
  names->clear();
  DIR* d = opendir(path.c_str());
  if (!d) {
    *error = Errno("cannot read the directory " + path, errno);
    return false;
  }
  errno = 0;
  while (struct dirent* e = readdir(d)) {
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) names->push_back(e->d_name);
    errno = 0;
  }
  int err = errno;
  closedir(d);
  if (err) {
    *error = Errno("cannot read the directory " + path, err);
    return false;
  }
  std::sort(names->begin(), names->end());
  return true;
}

// A directory something is mounted on: another device than its parent's,
// or (a bind mount of the same file system) the kernel says so.
static bool IsMountRoot(const std::string& path, const struct stat& st, const struct stat& parent) {
  if (st.st_dev != parent.st_dev) return true;
  struct statx sx;
  if (statx(AT_FDCWD, path.c_str(), AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &sx) != 0) return false;
  return (sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) &&
         (sx.stx_attributes & STATX_ATTR_MOUNT_ROOT);
}

// rm -rf that never follows a symlink and never enters another file
// system: a mount found inside (a proc CRIU mounted in a server's directory
// and could not take down, being killed) is detached, not emptied. Missing
// is fine.
bool RemoveTree(const std::string& path, std::string* error) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return true;
    *error = Errno("cannot stat " + path, errno);
    return false;
  }
  if (S_ISDIR(st.st_mode)) {
    std::vector<std::string> names;
    if (!ListDir(path, &names, error)) return false;
    for (const auto& n : names) {
      std::string child = Join(path, n);
      struct stat cs;
      if (lstat(child.c_str(), &cs) == 0 && S_ISDIR(cs.st_mode) && IsMountRoot(child, cs, st) &&
          umount2(child.c_str(), MNT_DETACH) != 0) {
        *error = Errno("cannot unmount " + child + " (another file system mounted there)", errno);
        return false;
      }
      if (!RemoveTree(child, error)) return false;
    }
    if (rmdir(path.c_str()) != 0 && errno != ENOENT) {
      *error = Errno("cannot remove " + path, errno);
      return false;
    }
    return true;
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    *error = Errno("cannot remove " + path, errno);
    return false;
  }
  return true;
}

void KeepOwnerAndTimes(int fd, const char* path, const struct stat& st) {
  // Owners only stick for root; a non-root daemon copies its own files anyway.
  if (fd >= 0) {
    if (fchown(fd, st.st_uid, st.st_gid) != 0) {
    }
    struct timespec ts[2] = {st.st_atim, st.st_mtim};
    futimens(fd, ts);
  } else {
    if (lchown(path, st.st_uid, st.st_gid) != 0) {
    }
    struct timespec ts[2] = {st.st_atim, st.st_mtim};
    utimensat(AT_FDCWD, path, ts, AT_SYMLINK_NOFOLLOW);
  }
}

// *vanished: src was removed before it could be opened (nothing is copied).
bool CopyFile(const std::string& src, const std::string& dst, const struct stat& st, bool* vanished,
              std::string* error) {
  *vanished = false;
  int in = open(src.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (in < 0 && errno == ENOENT) {
    *vanished = true;
    return true;
  }
  if (in < 0) {
    *error = Errno("cannot open " + src, errno);
    return false;
  }
  int out = open(dst.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (out < 0) {
    *error = Errno("cannot create " + dst, errno);
    close(in);
    return false;
  }
  auto fail = [&](const std::string& what, int err) {
    *error = Errno(what, err);
    close(in);
    close(out);
    return false;
  };
  // copy_file_range keeps the bytes in the kernel; plain read/write where a
  // file system does not support it.
  bool kernel_copy = true;
  std::vector<char> buf;
  for (;;) {
    if (kernel_copy) {
      ssize_t n = copy_file_range(in, nullptr, out, nullptr, 1 << 30, 0);
      if (n > 0) continue;
      if (n == 0) break;
      if (errno == EINTR) continue;
      if (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP ||
          errno == EBADF) {
        kernel_copy = false;
        buf.resize(1 << 20);
        continue;
      }
      return fail("cannot copy " + src + " to " + dst, errno);
    }
    ssize_t n = read(in, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("cannot read " + src, errno);
    if (n == 0) break;
    for (ssize_t done = 0; done < n;) {
      ssize_t w = write(out, buf.data() + done, static_cast<size_t>(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return fail("cannot write " + dst, errno);
      done += w;
    }
  }
  KeepOwnerAndTimes(out, nullptr, st);
  if (fchmod(out, st.st_mode & 07777) != 0) return fail("cannot chmod " + dst, errno);
  close(in);
  if (close(out) != 0) {  // NFS and friends report a failed write only here
    *error = Errno("cannot write " + dst, errno);
    return false;
  }
  return true;
}

// Copies the contents of the directory src into the existing directory dst.
bool CopyTree(const std::string& src, const std::string& dst, std::string* error) {
  std::vector<std::string> names;
  if (!ListDir(src, &names, error)) return false;
  for (const auto& name : names) {
    std::string s = Join(src, name), d = Join(dst, name);
    struct stat st;
    if (lstat(s.c_str(), &st) != 0) {
      if (errno == ENOENT) continue;  // the server removed it meanwhile
      *error = Errno("cannot stat " + s, errno);
      return false;
    }
    if (S_ISREG(st.st_mode)) {
      bool vanished;  // e.g. redis's temp-<pid>.rdb, renamed away meanwhile
      if (!CopyFile(s, d, st, &vanished, error)) return false;
    } else if (S_ISDIR(st.st_mode)) {
      if (mkdir(d.c_str(), 0700) != 0) {
        *error = Errno("cannot create " + d, errno);
        return false;
      }
      if (!CopyTree(s, d, error)) return false;
      if (chmod(d.c_str(), st.st_mode & 07777) != 0) {
        *error = Errno("cannot chmod " + d, errno);
        return false;
      }
      KeepOwnerAndTimes(-1, d.c_str(), st);
    } else if (S_ISLNK(st.st_mode)) {
      std::string target(static_cast<size_t>(st.st_size) + 1, '\0');
      ssize_t n = readlink(s.c_str(), target.data(), target.size());
      if (n < 0) {
        *error = Errno("cannot read the link " + s, errno);
        return false;
      }
      target.resize(static_cast<size_t>(n));
      if (symlink(target.c_str(), d.c_str()) != 0) {
        *error = Errno("cannot create the link " + d, errno);
        return false;
      }
      KeepOwnerAndTimes(-1, d.c_str(), st);
    } else if (S_ISSOCK(st.st_mode) || S_ISFIFO(st.st_mode)) {
      continue;  // rendezvous points, no data: the server (or criu) makes them anew
    } else {
      *error = "cannot copy " + s + ": a device file";
      return false;
    }
  }
  return true;
}

struct WalkEntry {
  std::string rel;  // relative to the checkpoint dir
  bool is_link = false;
  uint64_t size = 0;
  std::string link_target;
};

// What a restore from a committed checkpoint writes into its img/: not part
// of the checkpoint, so neither hashed nor held against it.
bool IsRestoreScratch(const std::string& rel) {
  return rel == "img/restore.log" || rel == "img/restore.out" || rel == "img/stats-restore";
}

// Every regular file and symlink under root/rel (recursively), and every directory.
bool Walk(const std::string& root, const std::string& rel, std::vector<WalkEntry>* files,
          std::vector<std::string>* dirs, std::string* error) {
  std::string path = Join(root, rel);
  dirs->push_back(path);
  std::vector<std::string> names;
  if (!ListDir(path, &names, error)) return false;
  for (const auto& name : names) {
    std::string r = Join(rel, name), p = Join(root, r);
    if (IsRestoreScratch(r)) continue;
    struct stat st;
    if (lstat(p.c_str(), &st) != 0) {
      *error = Errno("cannot stat " + p, errno);
      return false;
    }
    if (S_ISDIR(st.st_mode)) {
      if (!Walk(root, r, files, dirs, error)) return false;
    } else if (S_ISREG(st.st_mode)) {
      files->push_back({r, false, static_cast<uint64_t>(st.st_size), ""});
    } else if (S_ISLNK(st.st_mode)) {
      std::string target(static_cast<size_t>(st.st_size) + 1, '\0');
      ssize_t n = readlink(p.c_str(), target.data(), target.size());
      if (n < 0) {
        *error = Errno("cannot read the link " + p, errno);
        return false;
      }
      target.resize(static_cast<size_t>(n));
      files->push_back({r, true, 0, target});
    } else {
      *error = r + ": not a regular file, directory or symlink";
      return false;
    }
  }
  return true;
}

bool WalkCheckpoint(const std::string& dir, std::vector<WalkEntry>* files,
                    std::vector<std::string>* dirs, std::string* error) {
  for (const char* sub : {"img", "data"})
    if (!Walk(dir, sub, files, dirs, error)) return false;
  std::sort(files->begin(), files->end(),
            [](const WalkEntry& a, const WalkEntry& b) { return a.rel < b.rel; });
  return true;
}

bool WriteFileSynced(const std::string& path, const std::string& text, std::string* error) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    *error = Errno("cannot create " + path, errno);
    return false;
  }
  for (size_t done = 0; done < text.size();) {
    ssize_t w = write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      *error = Errno("cannot write " + path, errno);
      close(fd);
      return false;
    }
    done += static_cast<size_t>(w);
  }
  if (fsync(fd) != 0) {
    *error = Errno("cannot fsync " + path, errno);
    close(fd);
    return false;
  }
  if (close(fd) != 0) {
    *error = Errno("cannot write " + path, errno);
    return false;
  }
  return true;
}

bool ReadFile(const std::string& path, std::string* text, std::string* error) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = Errno("cannot open " + path, errno);
    return false;
  }
  text->clear();
  char buf[65536];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *error = Errno("cannot read " + path, errno);
      close(fd);
      return false;
    }
    if (n == 0) break;
    text->append(buf, static_cast<size_t>(n));
    if (text->size() > kMaxManifestBytes) {
      *error = path + " is implausibly large";
      close(fd);
      return false;
    }
  }
  close(fd);
  return true;
}

bool ReadManifest(const std::string& dir, uint64_t index, Manifest* m, std::string* error) {
  std::string text;
  if (!ReadFile(Join(dir, "MANIFEST"), &text, error)) return false;
  if (!DecodeManifest(text, m, error)) {
    *error = "MANIFEST: " + *error;
    return false;
  }
  if (m->index != index) {
    *error = "MANIFEST: it names index " + std::to_string(m->index);
    return false;
  }
  return true;
}

CheckpointInfo InfoFrom(const Manifest& m, const std::string& path) {
  CheckpointInfo info;
  info.index = m.index;
  info.meta = m.meta;
  info.bytes = m.bytes;
  info.path = path;
  info.ok = true;
  return info;
}

}  // namespace

std::string EncodeManifest(const Manifest& m) {
  std::string s;
  s += "lockstep-checkpoint " + std::to_string(m.version) + "\n";
  s += "index " + std::to_string(m.index) + "\n";
  s += "replica " + std::to_string(m.meta.replica_id) + "\n";
  s += "time " + std::to_string(m.meta.time_unix) + "\n";
  s += "dump_us " + std::to_string(m.meta.dump_us) + "\n";
  s += "bytes " + std::to_string(m.bytes) + "\n";
  s += "extra " + Hex(m.meta.extra) + "\n";
  for (const auto& e : m.entries) {
    if (e.is_link)
      s += "link " + Escape(e.link_target) + " " + Escape(e.path) + "\n";
    else
      s += "file " + e.sha256_hex + " " + std::to_string(e.size) + " " + Escape(e.path) + "\n";
  }
  s += "end " + Sha256Hex(s) + "\n";
  return s;
}

bool DecodeManifest(const std::string& text, Manifest* m, std::string* error) {
  *m = Manifest{};
  // The closing line vouches for every byte before it.
  if (text.empty() || text.back() != '\n') {
    *error = "truncated (no closing line)";
    return false;
  }
  size_t last = text.rfind('\n', text.size() - 2);
  size_t end_at = last == std::string::npos ? 0 : last + 1;
  std::string end_line = text.substr(end_at, text.size() - 1 - end_at);
  if (end_line.rfind("end ", 0) != 0) {
    *error = "truncated (no closing line)";
    return false;
  }
  std::string body = text.substr(0, end_at);
  if (end_line.substr(4) != Sha256Hex(body)) {
    *error = "damaged (its checksum does not match)";
    return false;
  }
  size_t pos = 0;
  int line_no = 0;
  std::map<std::string, bool> seen;
  while (pos < body.size()) {
    size_t nl = body.find('\n', pos);
    std::string line = body.substr(pos, nl - pos);
    pos = nl + 1;
    line_no++;
    std::vector<std::string> f = SplitSpaces(line);
    auto bad = [&](const std::string& why) {
      *error = "line " + std::to_string(line_no) + ": " + why;
      return false;
    };
    if (f.empty()) return bad("empty");
    const std::string key = f[0];  // a copy: f may grow below
    if (line_no == 1) {
      uint64_t v;
      if (key != "lockstep-checkpoint" || f.size() != 2 || !ParseU64(f[1], &v))
        return bad("not a lockstep checkpoint MANIFEST");
      if (v != static_cast<uint64_t>(CheckpointStore::kFormatVersion))
        return bad("format version " + f[1] + " is not supported (this build reads " +
                   std::to_string(CheckpointStore::kFormatVersion) + ")");
      m->version = static_cast<int>(v);
      continue;
    }
    if (key == "file") {
      ManifestEntry e;
      if (f.size() != 4 || f[1].size() != 64 || !ParseU64(f[2], &e.size) ||
          !Unescape(f[3], &e.path))
        return bad("malformed file line");
      e.sha256_hex = f[1];
      m->entries.push_back(std::move(e));
      continue;
    }
    if (key == "link") {
      ManifestEntry e;
      e.is_link = true;
      if (f.size() != 3 || !Unescape(f[1], &e.link_target) || !Unescape(f[2], &e.path))
        return bad("malformed link line");
      m->entries.push_back(std::move(e));
      continue;
    }
    if (seen[key]) return bad("repeated key " + key);
    seen[key] = true;
    if (key == "extra" && f.size() == 1) f.push_back("");  // an empty blob
    if (f.size() != 2) return bad("malformed " + key);
    bool ok = false;
    if (key == "index") {
      ok = ParseU64(f[1], &m->index);
    } else if (key == "replica") {
      ok = ParseU64(f[1], &m->meta.replica_id);
    } else if (key == "time") {
      ok = ParseI64(f[1], &m->meta.time_unix);
    } else if (key == "dump_us") {
      ok = ParseI64(f[1], &m->meta.dump_us);
    } else if (key == "bytes") {
      ok = ParseU64(f[1], &m->bytes);
    } else if (key == "extra") {
      ok = Unhex(f[1], &m->meta.extra);
    } else {
      return bad("unknown key " + key);
    }
    if (!ok) return bad("malformed " + key);
  }
  for (const char* key : {"index", "replica", "time", "dump_us", "bytes", "extra"})
    if (!seen[key]) {
      *error = std::string("missing ") + key;
      return false;
    }
  return true;
}

bool CheckpointStore::Open(const std::string& replica_dir, std::string* error) {
  if (mkdir(replica_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    *error = Errno("cannot create " + replica_dir, errno);
    return false;
  }
  std::string dir = Join(replica_dir, "checkpoints");
  if (mkdir(dir.c_str(), 0755) == 0) {
    if (!FsyncPath(replica_dir, error)) return false;
  } else if (errno != EEXIST) {
    *error = Errno("cannot create " + dir, errno);
    return false;
  }
  std::vector<std::string> names;
  if (!ListDir(dir, &names, error)) return false;
  for (const auto& n : names)
    if (n.rfind(kTmpPrefix, 0) == 0 && !RemoveTree(Join(dir, n), error)) return false;
  dir_ = dir;
  return true;
}

bool CheckpointStore::OpenToRead(const std::string& replica_dir, std::string* error) {
  std::string dir = Join(replica_dir, "checkpoints");
  struct stat st;
  int err = stat(dir.c_str(), &st) != 0 ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
  if (err) {
    *error = Errno("cannot open " + dir, err);
    return false;
  }
  dir_ = dir;
  return true;
}

std::string CheckpointStore::PathOf(uint64_t index) const {
  return Join(dir_, IndexName(index));
}

bool CheckpointStore::Begin(uint64_t index, PendingCheckpoint* pending, std::string* error) {
  *pending = PendingCheckpoint{};
  if (dir_.empty()) {
    *error = "the checkpoint store is not open";
    return false;
  }
  std::string path = Join(dir_, kTmpPrefix + IndexName(index) + "-" + RandomHex());
  if (mkdir(path.c_str(), 0755) != 0) {
    *error = Errno("cannot create " + path, errno);
    return false;
  }
  // The images hold the server's memory: readable by the daemon's user only.
  std::string img = Join(path, "img"), data = Join(path, "data");
  if (mkdir(img.c_str(), 0700) != 0 || mkdir(data.c_str(), 0700) != 0) {
    *error = Errno("cannot create " + img + " and " + data, errno);
    std::string ignored;
    RemoveTree(path, &ignored);
    return false;
  }
  pending->index = index;
  pending->path = path;
  pending->img_dir = img;
  pending->data_dir = data;
  return true;
}

void CheckpointStore::Abort(PendingCheckpoint* pending) {
  if (!pending->active()) return;
  std::string ignored;
  RemoveTree(pending->path, &ignored);
  *pending = PendingCheckpoint{};
}

bool CheckpointStore::CopyDataDir(const std::string& src, PendingCheckpoint* pending,
                                  std::string* error) {
  if (!pending->active()) {
    *error = "no checkpoint is being written";
    return false;
  }
  struct stat st;
  bool found = stat(src.c_str(), &st) == 0;
  if (!found || !S_ISDIR(st.st_mode)) {
    *error = !found ? Errno("cannot copy the data dir " + src, errno)
                    : "cannot copy the data dir " + src + ": not a directory";
    Abort(pending);
    return false;
  }
  // A store inside the data dir would copy itself forever.
  char* real_src = realpath(src.c_str(), nullptr);
  char* real_store = realpath(dir_.c_str(), nullptr);
  bool inside = real_src && real_store &&
                (std::string(real_store) + "/").rfind(std::string(real_src) + "/", 0) == 0;
  free(real_src);
  free(real_store);
  if (inside) {
    *error = "cannot copy the data dir " + src + ": the checkpoint store " + dir_ + " is inside it";
    Abort(pending);
    return false;
  }
  if (!CopyTree(src, pending->data_dir, error)) {
    *error = "cannot copy the data dir: " + *error;
    Abort(pending);
    return false;
  }
  chmod(pending->data_dir.c_str(), st.st_mode & 07777);
  KeepOwnerAndTimes(-1, pending->data_dir.c_str(), st);
  return true;
}

bool CheckpointStore::Commit(PendingCheckpoint* pending, const CheckpointMeta& meta,
                             std::string* error, CheckpointInfo* info) {
  if (!pending->active()) {
    *error = "no checkpoint is being written";
    return false;
  }
  auto fail = [&](const std::string& why) {
    *error = "cannot commit checkpoint " + std::to_string(pending->index) + ": " + why;
    Abort(pending);
    return false;
  };
  Manifest m;
  m.index = pending->index;
  m.meta = meta;
  if (m.meta.time_unix == 0) m.meta.time_unix = static_cast<int64_t>(time(nullptr));
  std::vector<WalkEntry> files;
  std::vector<std::string> dirs;
  std::string why;
  if (!WalkCheckpoint(pending->path, &files, &dirs, &why)) return fail(why);
  for (const auto& f : files) {
    ManifestEntry e;
    e.path = f.rel;
    e.is_link = f.is_link;
    e.link_target = f.link_target;
    if (!f.is_link) {
      if (!HashFile(Join(pending->path, f.rel), true, &e.sha256_hex, &e.size, &why))
        return fail(why);
      m.bytes += e.size;
    }
    m.entries.push_back(std::move(e));
  }
  for (const auto& d : dirs)
    if (!FsyncPath(d, &why)) return fail(why);
  if (!WriteFileSynced(Join(pending->path, "MANIFEST"), EncodeManifest(m), &why) ||
      !FsyncPath(pending->path, &why))
    return fail(why);

  std::lock_guard<std::mutex> lock(mu_);
  std::string final_path = PathOf(pending->index);
  struct stat st;
  bool replace = lstat(final_path.c_str(), &st) == 0;
  // RENAME_EXCHANGE: the old checkpoint moves to the tmp name in the same
  // step, so the index never names nothing (and never half of anything).
  if (renameat2(AT_FDCWD, pending->path.c_str(), AT_FDCWD, final_path.c_str(),
                replace ? RENAME_EXCHANGE : RENAME_NOREPLACE) != 0)
    return fail(Errno("cannot rename " + pending->path + " to " + final_path, errno));
  if (!FsyncPath(dir_, &why)) {
    // Not known to be durable: put things back as they were, so that false
    // means nothing changed.
    if (replace)
      renameat2(AT_FDCWD, pending->path.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE);
    else
      rename(final_path.c_str(), pending->path.c_str());
    return fail(why);
  }
  if (replace) {
    std::string ignored;  // the tmp dir now holds the replaced checkpoint; Open removes leftovers
    RemoveTree(pending->path, &ignored);
  }
  if (info) *info = InfoFrom(m, final_path);
  *pending = PendingCheckpoint{};
  return true;
}

std::vector<CheckpointInfo> CheckpointStore::List() const {
  std::vector<CheckpointInfo> out;
  std::vector<std::string> names;
  std::string error;
  if (dir_.empty() || !ListDir(dir_, &names, &error)) return out;
  for (const auto& name : names) {
    uint64_t index;
    if (!ParseIndexName(name, &index)) continue;
    std::string path = Join(dir_, name);
    Manifest m;
    CheckpointInfo info;
    if (ReadManifest(path, index, &m, &error)) {
      info = InfoFrom(m, path);
    } else {
      info.index = index;
      info.path = path;
      info.error = error;
    }
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(),
            [](const CheckpointInfo& a, const CheckpointInfo& b) { return a.index > b.index; });
  return out;
}

bool CheckpointStore::Verify(uint64_t index, std::string* error, CheckpointInfo* info) const {
  std::string path = PathOf(index);
  auto fail = [&](const std::string& why) {
    *error = "checkpoint " + std::to_string(index) + ": " + why;
    if (info) {
      info->index = index;
      info->path = path;
      info->ok = false;
      info->error = *error;
    }
    return false;
  };
  Manifest m;
  std::string why;
  if (!ReadManifest(path, index, &m, &why)) return fail(why);
  std::vector<WalkEntry> files;
  std::vector<std::string> dirs;
  if (!WalkCheckpoint(path, &files, &dirs, &why)) return fail(why);
  std::map<std::string, const WalkEntry*> found;
  for (const auto& f : files) found[f.rel] = &f;
  // Missing files, wrong sizes and wrong links first: cheap, and they explain
  // a truncation better than a checksum does.
  for (const auto& e : m.entries) {
    auto it = found.find(e.path);
    if (it == found.end()) return fail(e.path + ": missing");
    const WalkEntry& f = *it->second;
    if (f.is_link != e.is_link)
      return fail(e.path + (e.is_link ? ": should be a symlink" : ": should be a regular file"));
    if (e.is_link && f.link_target != e.link_target)
      return fail(e.path + ": the symlink points to " + f.link_target + ", not " + e.link_target);
    if (!e.is_link && f.size != e.size)
      return fail(e.path + ": " + std::to_string(f.size) + " bytes, the MANIFEST says " +
                  std::to_string(e.size));
    found.erase(it);
  }
  if (!found.empty()) return fail(found.begin()->first + ": not in the MANIFEST");
  for (const auto& e : m.entries) {
    if (e.is_link) continue;
    std::string hex;
    uint64_t size;
    if (!HashFile(Join(path, e.path), false, &hex, &size, &why)) return fail(why);
    if (size != e.size)
      return fail(e.path + ": " + std::to_string(size) + " bytes, the MANIFEST says " +
                  std::to_string(e.size));
    if (hex != e.sha256_hex) return fail(e.path + ": its SHA-256 differs from the MANIFEST");
  }
  if (info) *info = InfoFrom(m, path);
  return true;
}

std::optional<CheckpointInfo> CheckpointStore::NewestGood(uint64_t max_index,
                                                          std::vector<std::string>* skipped) const {
  for (const auto& c : List()) {
    if (c.index > max_index) continue;
    std::string error;
    CheckpointInfo info;
    if (Verify(c.index, &error, &info)) return info;
    if (skipped) skipped->push_back(error);
  }
  return std::nullopt;
}

bool CheckpointStore::Remove(uint64_t index, std::string* error) {
  std::lock_guard<std::mutex> lock(mu_);
  return RemoveLocked(index, error);
}

bool CheckpointStore::RemoveLocked(uint64_t index, std::string* error) {
  std::string path = PathOf(index);
  // Renamed away first, so that a crash midway leaves a tmp-* dir (removed
  // by Open), never a checkpoint with half its files.
  std::string doomed = Join(dir_, kTmpPrefix + IndexName(index) + "-" + RandomHex());
  if (rename(path.c_str(), doomed.c_str()) != 0) {
    *error = Errno("cannot remove checkpoint " + std::to_string(index), errno);
    return false;
  }
  std::string why;
  if (!FsyncPath(dir_, &why) || !RemoveTree(doomed, &why)) {
    *error = "cannot remove checkpoint " + std::to_string(index) + ": " + why;
    return false;
  }
  return true;
}

bool CheckpointStore::Prune(size_t keep, std::string* error, std::vector<std::string>* removed) {
  if (keep == 0) keep = 1;
  // Held throughout: a Commit replacing a checkpoint this has just verified
  // must not be removed as if it were the verified one.
  std::lock_guard<std::mutex> lock(mu_);
  size_t good = 0;
  for (const auto& c : List()) {
    std::string why;
    if (good < keep) {
      if (Verify(c.index, &why)) {
        good++;
        continue;
      }
    } else {
      why = "checkpoint " + std::to_string(c.index) + ": older than the newest " +
            std::to_string(keep) + " good ones";
    }
    if (!RemoveLocked(c.index, error)) return false;
    if (removed) removed->push_back(why);
  }
  return true;
}

bool CheckpointStore::RestoreDataDir(uint64_t index, const std::string& dst,
                                     std::string* error) const {
  std::string src = Join(PathOf(index), "data");
  struct stat st;
  if (stat(src.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *error = "checkpoint " + std::to_string(index) + " has no data dir (" + src + ")";
    return false;
  }
  std::string base = dst;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  std::string staging = base + ".restore-" + RandomHex();
  auto fail = [&](const std::string& why) {
    *error = "cannot restore the data dir " + dst + " from checkpoint " + std::to_string(index) +
             ": " + why;
    std::string ignored;
    RemoveTree(staging, &ignored);
    return false;
  };
  if (mkdir(staging.c_str(), 0700) != 0) return fail(Errno("cannot create " + staging, errno));
  std::string why;
  if (!CopyTree(src, staging, &why)) return fail(why);
  chmod(staging.c_str(), st.st_mode & 07777);
  KeepOwnerAndTimes(-1, staging.c_str(), st);
  struct stat old;
  bool replace = lstat(base.c_str(), &old) == 0;
  if (renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, base.c_str(),
                replace ? RENAME_EXCHANGE : RENAME_NOREPLACE) != 0)
    return fail(Errno("cannot rename " + staging + " to " + base, errno));
  if (replace && !RemoveTree(staging, &why)) {  // staging now holds the old contents
    *error = "restored " + dst + " but cannot remove its old contents: " + why;
    return false;
  }
  return true;
}

void LowerThisThreadsPriority() {
  // Per thread on Linux: setpriority and ioprio_set with a thread id.
  pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
  setpriority(PRIO_PROCESS, static_cast<id_t>(tid), 19);
  constexpr int kIoprioWhoProcess = 1, kIoprioClassIdle = 3, kIoprioClassShift = 13;
  syscall(SYS_ioprio_set, kIoprioWhoProcess, tid, kIoprioClassIdle << kIoprioClassShift);
}

}  // namespace lockstep
