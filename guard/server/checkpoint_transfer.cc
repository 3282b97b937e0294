// checkpoint_transfer.cc — see checkpoint_transfer.h.
#include "guard/server/checkpoint_transfer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>

#include "guard/net/client.h"
#include "guard/net/wire.h"

namespace lockstep {

namespace {

namespace fs = std::filesystem;

constexpr size_t kPartBytes = 1 << 20;

// Written into img/ by a restore from the checkpoint: not part of it.
bool RestoreLeftover(const std::string& rel) {
  return rel == "img/restore.log" || rel == "img/restore.out" || rel == "img/stats-restore";
}

// Streams checkpoint `cp` over `to`; false and *error when it cannot.
bool SendCheckpoint(Stream& to, const CheckpointInfo& cp, uint64_t* sent, std::string* error) {
  std::error_code ec;
  std::vector<fs::path> paths;
  for (auto it = fs::recursive_directory_iterator(cp.path, ec); !ec && it != fs::end(it);
       it.increment(ec))
    if (!it->is_directory(ec)) paths.push_back(it->path());
  if (ec) {
    *error = "cannot list " + cp.path + ": " + ec.message();
    return false;
  }
  std::sort(paths.begin(), paths.end());
  std::string buf(kPartBytes, '\0');
  for (const fs::path& p : paths) {
    std::string rel = fs::relative(p, cp.path, ec).string();
    if (ec || RestoreLeftover(rel)) continue;
    CheckpointPart part;
    part.path = rel;
    if (fs::is_symlink(p, ec)) {
      part.symlink = true;
      part.bytes = fs::read_symlink(p, ec).string();
      if (!WriteFrame(to, FrameKind::kCheckpointPart, EncodeCheckpointPart(part), error))
        return false;
      continue;
    }
    int in = open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (in < 0) {
      *error = "cannot open " + p.string() + ": " + strerror(errno);
      return false;
    }
    struct stat st;
    part.mode = fstat(in, &st) == 0 ? st.st_mode & 0777 : 0644;
    uint64_t off = 0;
    for (;;) {
      ssize_t n = pread(in, buf.data(), buf.size(), static_cast<off_t>(off));
      if (n < 0) {
        *error = "cannot read " + p.string() + ": " + strerror(errno);
        close(in);
        return false;
      }
      if (n == 0 && off > 0) break;
      part.offset = off;
      part.bytes.assign(buf.data(), static_cast<size_t>(n));
      if (!WriteFrame(to, FrameKind::kCheckpointPart, EncodeCheckpointPart(part), error)) {
        close(in);
        return false;
      }
      off += static_cast<uint64_t>(n);
      *sent += static_cast<uint64_t>(n);
      if (n == 0) break;  // an empty file: one empty part creates it
    }
    close(in);
  }
  return true;
}

std::string RandomSuffix() {
  std::random_device rd;
  char b[17];
  snprintf(b, sizeof b, "%08x%08x", rd(), rd());
  return b;
}

}  // namespace

// ---------------------------------------------------------------- sending

CheckpointSenders::~CheckpointSenders() {
  for (auto& s : senders_) s.thread.join();
}

void CheckpointSenders::Reap() {
  for (auto it = senders_.begin(); it != senders_.end();) {
    if (it->done->load()) {
      it->thread.join();
      it = senders_.erase(it);
    } else {
      ++it;
    }
  }
}

void CheckpointSenders::Serve(std::unique_ptr<Stream> to, const CheckpointStore* store,
                              uint64_t min_index, ComingFn coming) {
  Reap();
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread t([this, to = std::move(to), store, min_index, done, coming = std::move(coming)] {
    LowerThisThreadsPriority();
    CheckpointDone result;
    const CheckpointInfo* chosen = nullptr;
    std::vector<CheckpointInfo> all;
    std::string why_none;
    for (uint64_t waited_us = 0;; waited_us += kComingPollUs) {
      if (store) all = store->List();
      for (const auto& cp : all)
        if (cp.ok && cp.index >= min_index) {
          chosen = &cp;
          break;
        }
      if (chosen || !coming || !coming(&why_none) || waited_us >= kComingWaitUs) break;
      std::this_thread::sleep_for(std::chrono::microseconds(kComingPollUs));
    }
    uint64_t sent = 0;
    if (!chosen) {
      result.error = all.empty()
                         ? "no checkpoint here"
                         : "no checkpoint here at or past index " + std::to_string(min_index) +
                               " (newest " + std::to_string(all.front().index) + ")";
      if (!why_none.empty()) result.error += ": " + why_none;
    } else {
      result.index = chosen->index;
      result.ok = SendCheckpoint(*to, *chosen, &sent, &result.error);
    }
    std::string ignored;
    WriteFrame(*to, FrameKind::kCheckpointDone, EncodeCheckpointDone(result), &ignored);
    if (result.ok)
      log_("state transfer: sent checkpoint " + std::to_string(result.index) + " (" +
           std::to_string(sent / 1000000) + " MB)");
    else
      log_("state transfer: sent no checkpoint: " + result.error);
    done->store(true);
  });
  senders_.push_back(Sender{std::move(t), done});
}

// ---------------------------------------------------------------- fetching

CheckpointFetcher::~CheckpointFetcher() {
  if (thread_.joinable()) thread_.join();
}

void CheckpointFetcher::Start(uint64_t min_index, const std::vector<int>& first, bool only_first) {
  if (thread_.joinable()) thread_.join();
  done_ = false;
  ok_ = false;
  summary_.clear();
  int n = static_cast<int>(cfg_.replicas.size());
  std::vector<int> order;
  for (int r : first)
    if (r >= 0 && r < n && r != id_) order.push_back(r);
  for (int k = 1; k < n && !only_first; k++)
    if (std::find(order.begin(), order.end(), (id_ + k) % n) == order.end())
      order.push_back((id_ + k) % n);
  thread_ = std::thread([this, min_index, order] {
    std::string why;
    for (size_t k = 0; k < order.size() && !ok_; k++) {
      int peer = order[k];
      uint64_t index = 0;
      std::string err;
      auto t0 = std::chrono::steady_clock::now();
      if (FetchFrom(peer, min_index, &index, &err)) {
        double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                        .count();
        ok_ = true;
        index_ = index;
        char line[160];
        snprintf(line, sizeof line, "checkpoint %lu from replica %d in %.0f ms",
                 (unsigned long)index, peer, ms);
        summary_ = line;
      } else {
        why +=
            (why.empty() ? "" : "; ") + std::string("replica ") + std::to_string(peer) + ": " + err;
      }
    }
    if (!ok_) summary_ = why.empty() ? "no peer to ask (none agrees with the leader)" : why;
    done_ = true;
  });
}

bool CheckpointFetcher::FetchFrom(int peer, uint64_t min_index, uint64_t* index,
                                  std::string* error) {
  auto client = Client::Connect(cfg_, peer, 1000, error, Principal::kReplica, id_);
  if (!client) return false;
  std::string staging = store_->dir() + "/tmp-fetch-" + RandomSuffix();
  uint64_t bytes = 0;
  std::error_code ec;
  // The store's layout, whether or not the peer sends files into them (an
  // empty data dir is nothing to send).
  bool ok = client->FetchCheckpoint(min_index, staging, index, &bytes, error);
  fs::create_directories(staging + "/img", ec);
  fs::create_directories(staging + "/data", ec);
  if (!ok) {
    fs::remove_all(staging, ec);
    return false;
  }
  if (*index < min_index) {
    fs::remove_all(staging, ec);
    *error = "sent checkpoint " + std::to_string(*index) + ", older than asked";
    return false;
  }
  std::string final_path = store_->PathOf(*index);
  if (fs::exists(final_path, ec)) {
    // Ours already (an older fetch, or taken here): keep it, verify it below.
    fs::remove_all(staging, ec);
  } else {
    fs::rename(staging, final_path, ec);
    if (ec) {
      *error = "cannot move the fetched checkpoint into place: " + ec.message();
      fs::remove_all(staging, ec);
      return false;
    }
  }
  // Integrity: every file against the MANIFEST that came with them.
  if (!store_->Verify(*index, error)) {
    std::string ignored;
    store_->Remove(*index, &ignored);
    *error = "the fetched checkpoint " + std::to_string(*index) + " is damaged (" + *error +
             "): removed";
    return false;
  }
  log_("state transfer: received checkpoint " + std::to_string(*index) + " from replica " +
       std::to_string(peer) + " (" + std::to_string(bytes / 1000000) + " MB), verified");
  return true;
}

bool CheckpointFetcher::Collect(bool* ok, uint64_t* index, std::string* summary) {
  if (!thread_.joinable() || !done_.load()) return false;
  thread_.join();
  *ok = ok_;
  *index = ok_ ? index_ : 0;
  *summary = summary_;
  return true;
}

}  // namespace lockstep
