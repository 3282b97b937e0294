// store.h — the checkpoints of one replica on disk, each taken at a log
// index, each checksummed so that a damaged one is found before the server
// is restored from it.
//
// Layout under <replica dir>/checkpoints/:
//   00000000000000123456/      one checkpoint, named by its log index (20 digits)
//     img/                     criu's images (and its logs)
//     data/                    a copy of the server's data directory
//     MANIFEST                 what the checkpoint is, and the SHA-256 of every file
//   tmp-<index>-<random>/      one being written (Begin); removed by Open after a crash
//
// A checkpoint counts only once Commit has hashed and fsynced every file,
// written and fsynced its MANIFEST, and renamed its tmp dir to the final
// name (then fsynced checkpoints/). A commit for an index that already has a
// checkpoint swaps the two dirs in one atomic rename (RENAME_EXCHANGE): at
// every instant the index names a complete checkpoint, the old or the new.
//
// MANIFEST is text, one `key value` line each, in this order:
//   lockstep-checkpoint 1
//   index <n>            replica <id>          time <unix seconds>
//   dump_us <n>          bytes <total of the files' sizes>
//   extra <hex of the daemon's opaque blob>
//   file <sha256 hex> <size> <path>     (one per regular file, path percent-escaped)
//   link <target percent-escaped> <path>  (one per symlink)
//   end <sha256 hex of every byte above this line>
// The closing checksum makes a truncated or damaged MANIFEST detectable too.
// Not covered, because a restore from the checkpoint writes them into img/:
// img/restore.log, img/restore.out, img/stats-restore.
//
// Blocking file I/O throughout (a big server's images are hundreds of MB to
// hash and fsync): call it off the event loop. Methods may run on different
// threads at once; Commit's rename, Prune and Remove are serialized.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace lockstep {

// What the daemon knows about a checkpoint; the store adds the rest.
struct CheckpointMeta {
  uint64_t replica_id = 0;
  int64_t time_unix = 0;  // when it was taken; 0: Commit uses the current time
  int64_t dump_us = 0;    // how long criu's dump took
  std::string extra;      // opaque to the store, any bytes (the replay-connection table, fds)
};

struct CheckpointInfo {
  uint64_t index = 0;
  CheckpointMeta meta;
  uint64_t bytes = 0;  // total size of the files in img/ and data/
  std::string path;    // the checkpoint's directory
  bool ok = false;     // the MANIFEST reads back (List), or every file checks out (Verify)
  std::string error;   // why not ok
};

// A checkpoint being written: criu dumps into img_dir, CopyDataDir fills data_dir.
struct PendingCheckpoint {
  uint64_t index = 0;
  std::string path;  // checkpoints/tmp-<index>-<random>
  std::string img_dir;
  std::string data_dir;
  bool active() const { return !path.empty(); }
};

class CheckpointStore {
 public:
  static constexpr int kFormatVersion = 1;

  // Creates <replica_dir>/checkpoints/ if needed (fsynced) and removes tmp-*
  // dirs a crash left behind.
  bool Open(const std::string& replica_dir, std::string* error);
  // For looking only (List, Verify, NewestGood) at the store of a replica
  // that is not running: writes nothing, removes nothing. false when
  // <replica_dir>/checkpoints/ does not exist.
  bool OpenToRead(const std::string& replica_dir, std::string* error);
  const std::string& dir() const { return dir_; }
  std::string PathOf(uint64_t index) const;  // where checkpoint `index` lives (or would)

  // Creates tmp-<index>-<random>/ with img/ and data/.
  bool Begin(uint64_t index, PendingCheckpoint* pending, std::string* error);
  // Copies the tree under src (regular files, dirs, symlinks; modes, owners
  // and mtimes kept; sockets and fifos skipped: a server makes them anew and
  // criu rebinds them; a file removed while the copy runs is skipped) into
  // pending->data_dir. src must not contain the store. On failure the
  // pending checkpoint is aborted (its tmp dir removed).
  bool CopyDataDir(const std::string& src, PendingCheckpoint* pending, std::string* error);
  // Hashes and fsyncs every file, writes MANIFEST, renames the tmp dir into
  // place. On failure the pending checkpoint is aborted and no older
  // checkpoint has been touched. *info (optional) describes the new one.
  bool Commit(PendingCheckpoint* pending, const CheckpointMeta& meta, std::string* error,
              CheckpointInfo* info = nullptr);
  // Removes the tmp dir. Safe on an inactive pending checkpoint.
  void Abort(PendingCheckpoint* pending);

  // Every checkpoint, newest (highest index) first, from the MANIFESTs alone:
  // cheap, and says nothing about the files (ok=false for a MANIFEST that
  // does not read back).
  std::vector<CheckpointInfo> List() const;
  // Rehashes every file and compares with the MANIFEST. false with an error
  // naming the first file that is missing, extra, of the wrong size, or of
  // the wrong content.
  bool Verify(uint64_t index, std::string* error, CheckpointInfo* info = nullptr) const;
  // The newest checkpoint with index <= max_index that verifies. Each newer
  // one that does not is skipped and described in *skipped (optional).
  std::optional<CheckpointInfo> NewestGood(uint64_t max_index,
                                           std::vector<std::string>* skipped = nullptr) const;
  // Keeps the newest `keep` (at least 1) checkpoints that verify and removes
  // every other one, damaged ones included; never removes the newest good
  // one. *removed (optional) lists what went and why.
  bool Prune(size_t keep, std::string* error, std::vector<std::string>* removed = nullptr);
  bool Remove(uint64_t index, std::string* error);
  // Makes dst a copy of checkpoint `index`'s data/: built next to dst (in
  // <dst>.restore-<random>), then swapped in with one rename, so a failure
  // leaves dst as it was; dst must therefore not be a mount point. Does not
  // verify (NewestGood already has) and does not fsync: after a crash the
  // daemon restores again from the checkpoint.
  bool RestoreDataDir(uint64_t index, const std::string& dst, std::string* error) const;

 private:
  bool RemoveLocked(uint64_t index, std::string* error);

  std::string dir_;
  mutable std::mutex mu_;  // Commit's final rename, Prune, Remove
};

// The MANIFEST codec, exposed for tests and tools.
struct ManifestEntry {
  bool is_link = false;
  std::string path;  // relative to the checkpoint dir, e.g. "img/core-1.img"
  uint64_t size = 0;
  std::string sha256_hex;   // files
  std::string link_target;  // links
};
struct Manifest {
  int version = CheckpointStore::kFormatVersion;
  uint64_t index = 0;
  CheckpointMeta meta;
  uint64_t bytes = 0;
  std::vector<ManifestEntry> entries;  // sorted by path
};
std::string EncodeManifest(const Manifest& m);
bool DecodeManifest(const std::string& text, Manifest* m, std::string* error);

// For threads that hash, fsync or send a checkpoint (hundreds of MB): the
// lowest CPU and I/O priority, so that this work yields to the log's own
// durable writes and the servers (on one machine, the leader's too).
void LowerThisThreadsPriority();

}  // namespace lockstep
