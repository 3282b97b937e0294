// relocate.cc — see relocate.h.
#include "checkpoint/relocate.h"

#include <arpa/inet.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string_view>

namespace lockstep {

namespace {

namespace fs = std::filesystem;

constexpr uint32_t kImgCommonMagic = 0x54564319;
constexpr uint32_t kFilesMagic = 0x56303138;
constexpr uint32_t kTcpListen = 10;  // linux TCP_LISTEN; criu stores the kernel's value

// file_entry and the fields relocated inside it (criu/images/*.proto).
constexpr uint32_t kFileEntryReg = 3;
constexpr uint32_t kFileEntryIsk = 4;
constexpr uint32_t kFileEntryUsk = 16;
constexpr uint32_t kRegName = 6;
constexpr uint32_t kUskName = 11;  // unix_sk_entry.name: a bound socket's path (bytes)
constexpr uint32_t kIskState = 6;
constexpr uint32_t kIskSrcPort = 7;
constexpr uint32_t kIskSrcAddr = 11;  // repeated uint32: one for IPv4, the in_addr as stored

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLen = 2, kFixed32 = 5 };

bool ReadVarint(std::string_view in, size_t* pos, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*pos >= in.size()) return false;
    uint8_t b = static_cast<uint8_t>(in[(*pos)++]);
    *v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

void WriteVarint(uint64_t v, std::string* out) {
  do {
    uint8_t b = v & 0x7f;
    v >>= 7;
    out->push_back(static_cast<char>(v ? b | 0x80 : b));
  } while (v);
}

// One field of a message as it is on the wire.
struct Field {
  uint32_t number;
  uint32_t wire;
  uint64_t varint;        // kVarint
  std::string_view data;  // kLen: the payload; others: the raw value bytes
};

// Calls visit for each field of msg; visit returns the field's new encoding
// (tag included), or nullopt to keep its bytes. out may be null (a read-only
// walk). false on malformed input.
bool RewriteMessage(std::string_view msg,
                    const std::function<std::optional<std::string>(const Field&)>& visit,
                    std::string* out) {
  size_t pos = 0;
  while (pos < msg.size()) {
    size_t start = pos;
    uint64_t tag;
    if (!ReadVarint(msg, &pos, &tag)) return false;
    Field f{static_cast<uint32_t>(tag >> 3), static_cast<uint32_t>(tag & 7), 0, {}};
    switch (f.wire) {
      case kVarint:
        if (!ReadVarint(msg, &pos, &f.varint)) return false;
        break;
      case kFixed64:
      case kFixed32: {
        size_t n = f.wire == kFixed64 ? 8 : 4;
        if (msg.size() - pos < n) return false;
        f.data = msg.substr(pos, n);
        pos += n;
        break;
      }
      case kLen: {
        uint64_t n;
        if (!ReadVarint(msg, &pos, &n) || n > msg.size() - pos) return false;
        f.data = msg.substr(pos, n);
        pos += n;
        break;
      }
      default: return false;  // groups: not in criu's images
    }
    std::optional<std::string> repl = visit(f);
    if (!out) continue;
    if (repl)
      out->append(*repl);
    else
      out->append(msg.substr(start, pos - start));
  }
  return true;
}

std::string EncodeLen(uint32_t number, std::string_view data) {
  std::string out;
  WriteVarint(static_cast<uint64_t>(number) << 3 | kLen, &out);
  WriteVarint(data.size(), &out);
  out.append(data);
  return out;
}

std::string EncodeVarint(uint32_t number, uint64_t v) {
  std::string out;
  WriteVarint(static_cast<uint64_t>(number) << 3 | kVarint, &out);
  WriteVarint(v, &out);
  return out;
}

uint32_t Le32(std::string_view s, size_t at) {
  uint32_t v;
  memcpy(&v, s.data() + at, 4);
  return v;
}

void PutLe32(uint32_t v, std::string* out) {
  out->append(reinterpret_cast<const char*>(&v), 4);
}

// The relocated message (a reg_file_entry, a unix_sk_entry), or nullopt when
// its path field (name_field) is not under from_dir. An abstract unix
// socket's name begins with a NUL byte and is never under a directory.
std::optional<std::string> RelocatePath(std::string_view msg, uint32_t name_field,
                                        const Relocation& r, bool* bad, int* changed) {
  bool touched = false;
  std::string out;
  bool ok = RewriteMessage(
      msg,
      [&](const Field& f) -> std::optional<std::string> {
        if (f.number != name_field || f.wire != kLen) return std::nullopt;
        std::string_view name = f.data;
        if (name != r.from_dir &&
            !(name.size() > r.from_dir.size() && name.substr(0, r.from_dir.size()) == r.from_dir &&
              name[r.from_dir.size()] == '/'))
          return std::nullopt;
        touched = true;
        return EncodeLen(name_field, r.to_dir + std::string(name.substr(r.from_dir.size())));
      },
      &out);
  if (!ok) *bad = true;
  if (!touched) return std::nullopt;
  (*changed)++;
  return out;
}

// The relocated inet_sk_entry, or nullopt when it is not the listening socket.
std::optional<std::string> RelocateIsk(std::string_view isk, const Relocation& r, bool* bad,
                                       int* changed) {
  // First pass: is it the socket listening on from_port?
  uint64_t state = 0, port = 0;
  if (!RewriteMessage(
          isk,
          [&](const Field& f) -> std::optional<std::string> {
            if (f.wire == kVarint && f.number == kIskState) state = f.varint;
            if (f.wire == kVarint && f.number == kIskSrcPort) port = f.varint;
            return std::nullopt;
          },
          nullptr)) {
    *bad = true;
    return std::nullopt;
  }
  if (state != kTcpListen || port != r.from_port) return std::nullopt;
  // Its address moves when the peer's host is not ours: criu stores an IPv4
  // address as the one uint32 of the in_addr's bytes (s_addr).
  in_addr from{}, to{};
  bool move_addr = !r.from_host.empty() && r.from_host != r.to_host &&
                   inet_pton(AF_INET, r.from_host.c_str(), &from) == 1 &&
                   inet_pton(AF_INET, r.to_host.c_str(), &to) == 1;
  std::string out;
  RewriteMessage(
      isk,
      [&](const Field& f) -> std::optional<std::string> {
        if (f.wire == kVarint && f.number == kIskSrcPort)
          return EncodeVarint(kIskSrcPort, r.to_port);
        if (move_addr && f.wire == kVarint && f.number == kIskSrcAddr && f.varint == from.s_addr)
          return EncodeVarint(kIskSrcAddr, to.s_addr);
        return std::nullopt;
      },
      &out);
  (*changed)++;
  return out;
}

}  // namespace

bool RelocateFilesImage(const std::string& in, const Relocation& r, std::string* out, int* changed,
                        std::string* error) {
  *changed = 0;
  out->clear();
  if (in.size() < 8 || Le32(in, 0) != kImgCommonMagic || Le32(in, 4) != kFilesMagic) {
    *error = "not a criu files.img (magic)";
    return false;
  }
  out->append(in, 0, 8);
  size_t pos = 8;
  while (pos < in.size()) {
    if (in.size() - pos < 4) {
      *error = "files.img ends inside an entry's length";
      return false;
    }
    uint32_t n = Le32(in, pos);
    pos += 4;
    if (n > in.size() - pos) {
      *error = "files.img entry runs past the end";
      return false;
    }
    std::string_view entry(in.data() + pos, n);
    pos += n;
    bool bad = false;
    std::string rewritten;
    bool ok = RewriteMessage(
        entry,
        [&](const Field& f) -> std::optional<std::string> {
          if (f.wire != kLen) return std::nullopt;
          std::optional<std::string> inner;
          if (f.number == kFileEntryReg) inner = RelocatePath(f.data, kRegName, r, &bad, changed);
          if (f.number == kFileEntryUsk) inner = RelocatePath(f.data, kUskName, r, &bad, changed);
          if (f.number == kFileEntryIsk) inner = RelocateIsk(f.data, r, &bad, changed);
          if (!inner) return std::nullopt;
          return EncodeLen(f.number, *inner);
        },
        &rewritten);
    if (!ok || bad) {
      *error = "files.img holds an entry that does not parse as protobuf";
      return false;
    }
    PutLe32(static_cast<uint32_t>(rewritten.size()), out);
    out->append(rewritten);
  }
  return true;
}

bool BuildRelocatedView(const std::string& img_dir, const std::string& view_dir,
                        const Relocation& r, std::string* error) {
  std::error_code ec;
  fs::remove_all(view_dir, ec);
  if (!fs::create_directories(view_dir, ec)) {
    *error = "cannot create " + view_dir + ": " + ec.message();
    return false;
  }
  bool have_files = false;
  for (const auto& e : fs::directory_iterator(img_dir, ec)) {
    std::string name = e.path().filename();
    if (name == "restore.log" || name == "restore.out" || name == "stats-restore") continue;
    if (name != "files.img") {
      fs::create_symlink(e.path(), fs::path(view_dir) / name, ec);
      if (ec) {
        *error = "cannot link " + name + " into " + view_dir + ": " + ec.message();
        return false;
      }
      continue;
    }
    have_files = true;
    std::ifstream f(e.path(), std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    std::string out;
    int changed = 0;
    if (!f || !RelocateFilesImage(ss.str(), r, &out, &changed, error)) {
      if (error->empty()) *error = "cannot read " + e.path().string();
      return false;
    }
    std::ofstream o(fs::path(view_dir) / name, std::ios::binary | std::ios::trunc);
    o.write(out.data(), static_cast<std::streamsize>(out.size()));
    if (!o) {
      *error = "cannot write " + view_dir + "/files.img";
      return false;
    }
  }
  if (ec) {
    *error = "cannot list " + img_dir + ": " + ec.message();
    return false;
  }
  if (!have_files) {
    *error = img_dir + " holds no files.img";
    return false;
  }
  return true;
}

}  // namespace lockstep
