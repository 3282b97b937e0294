// inspection.cc — `lockstep inspect`'s relay in the daemon (inspection.h):
// one thread per inspection, between the admin's TLS connection and a TCP
// connection to this replica's own server that the shim admits by its
// claimed port.
#include "guard/server/inspection.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "guard/common/event_loop.h"  // NowUs
#include "guard/net/wire.h"
#include "guard/server/shim_channel.h"

namespace lockstep {

namespace {

std::string Upper(std::string_view s) {
  std::string u(s);
  for (char& c : u)
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  return u;
}

// A RESP length line ("123\r\n") at in[*i]; false when incomplete or bad
// (*bad says which).
bool LengthLine(std::string_view in, size_t* i, int64_t* value, bool* bad) {
  size_t nl = in.find('\n', *i);
  if (nl == std::string_view::npos) {
    *bad = in.size() - *i > 32;
    return false;
  }
  std::string_view digits = in.substr(*i, nl - *i);
  if (!digits.empty() && digits.back() == '\r') digits.remove_suffix(1);
  bool neg = !digits.empty() && digits[0] == '-';
  if (neg) digits.remove_prefix(1);
  if (digits.empty() || digits.size() > 12) {
    *bad = true;
    return false;
  }
  int64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') {
      *bad = true;
      return false;
    }
    v = v * 10 + (c - '0');
  }
  *value = neg ? -v : v;
  *i = nl + 1;
  return true;
}

constexpr size_t kMalformed = static_cast<size_t>(-2);
constexpr size_t kMaxRequest = 64u << 20;  // a request longer than this ends the inspection

}  // namespace

RespFilter::RespFilter(const std::string& list) {
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    std::vector<std::string> words;
    std::string word;
    for (size_t i = start; i <= comma; i++) {
      char c = i < comma ? list[i] : ' ';
      if (c == ' ' || c == '\t') {
        if (!word.empty()) words.push_back(Upper(word));
        word.clear();
      } else {
        word += c;
      }
    }
    if (!words.empty()) allowed_.push_back(std::move(words));
    start = comma + 1;
  }
}

bool RespFilter::Allowed(const std::vector<std::string>& words) const {
  for (const auto& a : allowed_) {
    if (words.empty() || a[0] != words[0]) continue;
    if (a.size() == 1 || (words.size() > 1 && a[1] == words[1])) return true;
  }
  return false;
}

RespFilter::Verdict RespFilter::Next(std::string_view in, size_t* len, std::string* name) const {
  if (in.empty()) return Verdict::kMore;
  std::vector<std::string> words;  // the first two, upper case
  size_t i = 0;
  bool bad = false;
  if (in[0] == '*') {
    i = 1;
    int64_t argc;
    if (!LengthLine(in, &i, &argc, &bad)) return bad ? Verdict::kMalformed : Verdict::kMore;
    if (argc < 1 || argc > 1 << 20) return Verdict::kMalformed;
    for (int64_t a = 0; a < argc; a++) {
      if (i >= in.size()) return Verdict::kMore;
      if (in[i] != '$') return Verdict::kMalformed;
      i++;
      int64_t n;
      if (!LengthLine(in, &i, &n, &bad)) return bad ? Verdict::kMalformed : Verdict::kMore;
      if (n < 0 || static_cast<uint64_t>(n) > kMaxRequest) return Verdict::kMalformed;
      if (in.size() - i < static_cast<size_t>(n) + 2) {
        if (i + n + 2 > kMaxRequest) return Verdict::kMalformed;
        return Verdict::kMore;
      }
      if (words.size() < 2) words.push_back(Upper(in.substr(i, n)));
      i += n + 2;
    }
  } else {
    size_t nl = in.find('\n');
    if (nl == std::string_view::npos)
      return in.size() > (64u << 10) ? Verdict::kMalformed : Verdict::kMore;
    i = nl + 1;
    std::string_view line = in.substr(0, nl);
    size_t p = 0;
    while (p < line.size() && words.size() < 2) {
      while (p < line.size() && (line[p] == ' ' || line[p] == '\t' || line[p] == '\r')) p++;
      size_t q = p;
      while (q < line.size() && line[q] != ' ' && line[q] != '\t' && line[q] != '\r') q++;
      if (q > p) words.push_back(Upper(line.substr(p, q - p)));
      p = q;
    }
    if (words.empty()) {
      *len = i;
      return Verdict::kSkip;  // redis answers an empty line with nothing
    }
  }
  *len = i;
  *name = words[0];
  if (Allowed(words)) return Verdict::kAllow;
  // Named with its subcommand where the list allows some subcommands of it.
  for (const auto& a : allowed_)
    if (a.size() > 1 && a[0] == words[0] && words.size() > 1) {
      *name += " " + words[1];
      break;
    }
  return Verdict::kRefuse;
}

size_t RespFilter::ReplyEnd(size_t pos, int depth) const {
  if (depth > 64) return kMalformed;
  if (pos >= out_.size()) return std::string::npos;
  char type = out_[pos];
  size_t i = pos + 1;
  bool bad = false;
  switch (type) {
    case '+':
    case '-':
    case ':':
    case ',':
    case '#':
    case '(':
    case '_': {
      size_t nl = out_.find('\n', i);
      return nl == std::string::npos ? std::string::npos : nl + 1;
    }
    case '$':
    case '!':
    case '=': {
      int64_t n;
      if (!LengthLine(out_, &i, &n, &bad)) return bad ? kMalformed : std::string::npos;
      if (n < 0) return i;
      if (out_.size() - i < static_cast<size_t>(n) + 2) return std::string::npos;
      return i + n + 2;
    }
    case '*':
    case '~':
    case '>':
    case '%':
    case '|': {
      int64_t n;
      if (!LengthLine(out_, &i, &n, &bad)) return bad ? kMalformed : std::string::npos;
      if (n < 0) return i;
      if (type == '%' || type == '|') n *= 2;
      for (int64_t e = 0; e < n; e++) {
        i = ReplyEnd(i, depth + 1);
        if (i == std::string::npos || i == kMalformed) return i;
      }
      // An attribute precedes the reply it describes.
      return type == '|' ? ReplyEnd(i, depth + 1) : i;
    }
    default: return kMalformed;
  }
}

bool RespFilter::FeedReplies(std::string_view out) {
  out_.append(out);
  size_t pos = 0;
  for (;;) {
    size_t end = ReplyEnd(pos, 0);
    if (end == kMalformed) return false;
    if (end == std::string::npos) break;
    // A RESP3 push (">") is no reply to a request.
    if (out_[pos] != '>') replies_++;
    pos = end;
  }
  out_.erase(0, pos);
  return true;
}

Inspections::Inspections(const ClusterConfig& config, const ReplicaConfig& me,
                         const ReplicaLog& log)
    : cfg_(config), me_(me), log_(log) {}

Inspections::~Inspections() {
  stop_ = true;
  for (auto& r : relays_) {
    if (r->thread.joinable()) r->thread.join();
    if (r->server_fd >= 0) close(r->server_fd);
  }
}

void Inspections::Reap(ShimChannel* shim) {
  for (auto it = relays_.begin(); it != relays_.end();) {
    Relay& r = **it;
    if (!r.done) {
      ++it;
      continue;
    }
    r.thread.join();
    if (shim && r.port) shim->RevokeInspectSlot(r.port);
    if (r.server_fd >= 0) close(r.server_fd);
    it = relays_.erase(it);
  }
}

void Inspections::Serve(std::unique_ptr<Stream> client, const std::string& who,
                        const std::string& peer, const std::string& program, ShimChannel* shim,
                        bool leading) {
  Reap(shim);
  int no = next_no_++;
  std::string about = who + " from " + peer + (program.empty() ? "" : " running '" + program + "'");
  std::string failed;
  int fd = -1, port = 0;
  if (!shim) {
    failed = "replica " + std::to_string(me_.id) + " runs no server now";
  } else if (relays_.size() >= kMaxRelays) {
    failed = std::to_string(relays_.size()) + " inspections are open here (the limit)";
  } else {
    // Bound here, before the claim: while this socket holds the address and
    // port (no SO_REUSEADDR, no SO_REUSEPORT), nothing else can connect from
    // them, so the claim names this connection alone.
    fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in local{};
    local.sin_family = AF_INET;
    inet_pton(AF_INET, me_.host.c_str(), &local.sin_addr);
    socklen_t len = sizeof local;
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) {
      failed = std::string("cannot open a connection to the server: ") + strerror(errno);
      if (fd >= 0) close(fd);
      fd = -1;
    } else {
      port = ntohs(local.sin_port);
      shim->ClaimInspectSlot(local.sin_addr.s_addr, port);
      sockaddr_in to = local;
      to.sin_port = htons(static_cast<uint16_t>(me_.server_port));
      if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0 && errno != EINPROGRESS)
        failed = std::string("cannot connect to the server: ") + strerror(errno);
      // (fd stays open, failed or not, until Reap has revoked the claim.)
    }
  }
  std::string where = leading ? "a client of the leader's server: its requests go through the log"
                              : "outside the log: this replica is a backup (the inspection ends "
                                "if it comes to lead)";
  auto relay = std::make_unique<Relay>();
  relay->server_fd = fd;
  relay->port = port;
  Relay* self = relay.get();
  relay->thread =
      std::thread([this, no, c = std::move(client), fd, failed, about, where, self]() mutable {
        Run(no, std::move(c), fd, failed, about, where, self);
      });
  relays_.push_back(std::move(relay));
}

void Inspections::Run(int no, std::unique_ptr<Stream> stream, int server_fd, std::string failed,
                      std::string about, std::string where, Relay* self) {
  FrameConn client(std::move(stream), ConnRole::kClient);
  client.authenticated = true;
  client.frame_limit = 4u << 20;
  const std::string& list = cfg_.server.inspect_commands;
  const bool filtered = !list.empty();
  RespFilter filter(list);
  std::string err;
  auto finish = [&](const std::string& how) {
    if (server_fd >= 0) shutdown(server_fd, SHUT_RDWR);  // the server sees the end now
    log_("inspection %d by %s: %s", no, about.c_str(), how.c_str());
    self->done = true;
  };
  // Waits for what `events` asks of fd (and the client's TLS), a slice at a
  // time so that a daemon stopping is noticed.
  auto wait_connected = [&]() {
    uint64_t deadline = NowUs() + 5000000;
    while (!stop_ && NowUs() < deadline) {
      pollfd p{server_fd, POLLOUT, 0};
      if (poll(&p, 1, 200) > 0) {
        int e = 0;
        socklen_t el = sizeof e;
        getsockopt(server_fd, SOL_SOCKET, SO_ERROR, &e, &el);
        if (e) return std::string("cannot connect to the server: ") + strerror(e);
        return std::string();
      }
    }
    return std::string("the server did not accept the connection in time");
  };
  if (failed.empty() && server_fd >= 0) failed = wait_connected();
  InspectReply reply;
  reply.ok = failed.empty();
  reply.text = reply.ok ? std::string(filtered ? "read-only: the profile's inspect_commands pass"
                                               : "every byte passes (the profile lists no "
                                                 "inspect_commands)") +
                              "; " + where
                        : failed;
  client.Queue(FrameKind::kInspectResult, EncodeInspectReply(reply));
  auto flush_all = [&]() {
    for (int i = 0; i < 25 && client.WantsWrite() && client.Flush(&err); i++) {
      pollfd p{client.fd(), POLLOUT, 0};
      poll(&p, 1, 200);
    }
  };
  if (!reply.ok) {
    flush_all();
    finish("refused: " + failed);
    return;
  }
  int one = 1;
  setsockopt(server_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  log_("inspection %d by %s: opened, %s", no, about.c_str(), reply.text.c_str());

  std::string from_client;  // bytes the inspector sent, not yet judged (filtered)
  std::string to_server;    // judged and allowed, not yet written
  uint64_t forwarded = 0;   // requests sent to the server (filtered)
  uint64_t bytes_in = 0, bytes_out = 0, refused = 0;
  std::map<std::string, uint64_t> commands, refusals;
  bool client_eof = false, server_shut = false, server_eof = false;
  std::string end = "closed by the inspector";
  constexpr size_t kHighWater = 4u << 20;
  auto tally = [](std::map<std::string, uint64_t>& m, const std::string& name) {
    if (m.size() < 64 || m.count(name)) m[name]++;
  };
  // Judges what the inspector sent, request by request. A refused request's
  // error goes out once the server has answered every request before it.
  auto judge = [&]() -> bool {
    while (!from_client.empty()) {
      size_t len = 0;
      std::string name;
      RespFilter::Verdict v = filter.Next(from_client, &len, &name);
      if (v == RespFilter::Verdict::kMore) return true;
      if (v == RespFilter::Verdict::kMalformed) {
        end = "ended: the inspector's bytes are not redis's protocol (inspect_commands needs it)";
        return false;
      }
      if (v == RespFilter::Verdict::kRefuse) {
        if (filter.replies() < forwarded) return true;  // its turn comes after their replies
        refused++;
        tally(refusals, name);
        if (refused <= 10)
          log_("inspection %d: refused %s: not among the profile's inspect_commands", no,
               name.c_str());
        client.Queue(FrameKind::kInspectData,
                     "-ERR lockstep inspect: '" + name +
                         "' is not among this profile's inspect_commands (inspection is "
                         "read-only)\r\n");
      } else if (v == RespFilter::Verdict::kAllow) {
        tally(commands, name);
        to_server.append(from_client, 0, len);
        forwarded++;
      }
      from_client.erase(0, len);
    }
    return true;
  };

  char buf[65536];
  while (!stop_) {
    pollfd p[2] = {{client.fd(), 0, 0}, {server_fd, 0, 0}};
    if (!client_eof && to_server.size() < kHighWater && from_client.size() < kHighWater)
      p[0].events |= POLLIN;
    if (client.WantsWrite()) p[0].events |= POLLOUT;
    if (!server_eof && client.queued_bytes() < kHighWater) p[1].events |= POLLIN;
    if (!to_server.empty()) p[1].events |= POLLOUT;
    // TLS may hold bytes it took from the socket already: no poll says so.
    bool buffered = (p[0].events & POLLIN) && client.stream() && client.stream()->has_buffered();
    if (poll(p, 2, buffered ? 0 : 200) < 0 && errno != EINTR) {
      end = std::string("ended: poll: ") + strerror(errno);
      break;
    }
    if (buffered || (p[0].revents & (POLLIN | POLLHUP | POLLERR))) {
      bool ok = true;
      bool read_ok = client.ReadFrames(
          [&](FrameKind kind, std::string_view body) {
            if (kind != FrameKind::kInspectData) {
              ok = false;
              end = "ended: the inspector sent a frame of another kind";
              return;
            }
            if (body.empty()) {
              client_eof = true;
              return;
            }
            bytes_in += body.size();
            if (filtered)
              from_client.append(body);
            else
              to_server.append(body);
          },
          &err);
      if (!read_ok) break;  // the inspector went away
      if (!ok || (filtered && !judge())) break;
    }
    if (!to_server.empty()) {
      ssize_t n = send(server_fd, to_server.data(), to_server.size(), MSG_NOSIGNAL);
      if (n > 0) {
        to_server.erase(0, n);
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        end = std::string("ended: the server's connection broke: ") + strerror(errno);
        break;
      }
    }
    if (client_eof && to_server.empty() && from_client.empty() && !server_shut) {
      shutdown(server_fd, SHUT_WR);
      server_shut = true;
    }
    // (poll says POLLHUP at the end even when not asked.)
    if (!server_eof && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t n = read(server_fd, buf, sizeof buf);
      if (n > 0) {
        bytes_out += n;
        client.Queue(FrameKind::kInspectData, std::string_view(buf, n));
        if (filtered) {
          if (!filter.FeedReplies(std::string_view(buf, n))) {
            end = "ended: the server's replies are not redis's protocol";
            break;
          }
          if (!judge()) break;  // a refusal may have waited for these
        }
      } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        server_eof = true;
        end = n == 0 ? "closed by the server" : std::string("ended: ") + strerror(errno);
        client.Queue(FrameKind::kInspectData, "");
      }
    }
    if (!client.Flush(&err)) break;
    if (server_eof && !client.WantsWrite()) break;
  }
  if (stop_) end = "ended: the daemon stops";
  flush_all();
  std::string what;
  auto list_of = [](const std::map<std::string, uint64_t>& m) {
    std::string s;
    for (const auto& [name, count] : m)
      s += (s.empty() ? "" : ", ") + name + " x" + std::to_string(count);
    return s;
  };
  if (filtered)
    what = "; commands: " + (commands.empty() ? std::string("none") : list_of(commands)) +
           (refusals.empty() ? "" : "; refused: " + list_of(refusals));
  finish(end + ": " + std::to_string(bytes_in) + " bytes to the server, " +
         std::to_string(bytes_out) + " from it" + what);
}

}  // namespace lockstep
