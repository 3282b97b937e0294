// checkpoint_store_test.cc — the checkpoint store's integrity checks on disk:
// commit, list, verify and restore, damaged files and manifests, pruning,
// leftovers of interrupted commits, a full disk.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint/store.h"

namespace lockstep {
namespace {

using namespace checkpoint_test;
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------
// The store.

class CheckpointStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    std::string error;
    ASSERT_TRUE(store_.Open(tmp_ / "replica", &error)) << error;
    fs::create_directories(tmp_ / "src/nested/deeper");
    WriteFile(tmp_ / "src/dump.rdb", std::string(100000, 'r'), 0640);
    WriteFile(tmp_ / "src/nested/deeper/a file with spaces%", "spaces");
    WriteFile(tmp_ / "src/empty", "");
    fs::create_directories(tmp_ / "src/empty-dir");
    symlink("nested/deeper", (tmp_ / "src/link").c_str());
  }

  // Commits a checkpoint at `index` with an image file holding `image`.
  void CommitOne(uint64_t index, const std::string& image, const std::string& extra = "") {
    PendingCheckpoint p;
    std::string error;
    ASSERT_TRUE(store_.Begin(index, &p, &error)) << error;
    WriteFile(p.img_dir + "/pages-1.img", image);
    WriteFile(p.img_dir + "/inventory.img", "inv" + std::to_string(index));
    ASSERT_TRUE(store_.CopyDataDir(tmp_ / "src", &p, &error)) << error;
    CheckpointMeta meta;
    meta.replica_id = 3;
    meta.time_unix = 1700000000 + static_cast<int64_t>(index);
    meta.dump_us = 1234;
    meta.extra = extra;
    ASSERT_TRUE(store_.Commit(&p, meta, &error)) << error;
  }

  std::vector<uint64_t> Indexes() {
    std::vector<uint64_t> out;
    for (const auto& c : store_.List()) out.push_back(c.index);
    return out;
  }

  TempDir tmp_;
  CheckpointStore store_;
};

TEST_F(CheckpointStoreTest, CommitListVerifyRestore) {
  std::string extra("\0binary\n %ff\xfe table", 19);
  CommitOne(123456, std::string(5000, 'p'), extra);
  auto list = store_.List();
  ASSERT_EQ(list.size(), 1u);
  const CheckpointInfo& c = list[0];
  EXPECT_TRUE(c.ok) << c.error;
  EXPECT_EQ(c.index, 123456u);
  EXPECT_EQ(c.path, tmp_.path() + "/replica/checkpoints/00000000000000123456");
  EXPECT_EQ(c.meta.replica_id, 3u);
  EXPECT_EQ(c.meta.time_unix, 1700000000 + 123456);
  EXPECT_EQ(c.meta.dump_us, 1234);
  EXPECT_EQ(c.meta.extra, extra);
  EXPECT_EQ(c.bytes, 5000u + 9 + 100000 + 6 + 0);  // pages, inventory, dump.rdb, spaces, empty
  EXPECT_EQ(Names(tmp_ / "replica/checkpoints"), std::vector<std::string>{"00000000000000123456"});
  EXPECT_EQ(Names(c.path), (std::vector<std::string>{"MANIFEST", "data", "img"}));
  std::string error;
  EXPECT_TRUE(store_.Verify(123456, &error)) << error;

  // The data dir comes back whole: contents, modes, links, empty dirs.
  fs::create_directories(tmp_ / "live");
  WriteFile(tmp_ / "live/stale", "gone after the restore");
  ASSERT_TRUE(store_.RestoreDataDir(123456, tmp_ / "live", &error)) << error;
  EXPECT_FALSE(fs::exists(tmp_ / "live/stale"));
  EXPECT_EQ(ReadFile(tmp_ / "live/dump.rdb"), std::string(100000, 'r'));
  EXPECT_EQ(ReadFile(tmp_ / "live/nested/deeper/a file with spaces%"), "spaces");
  EXPECT_TRUE(fs::is_directory(tmp_ / "live/empty-dir"));
  EXPECT_EQ(fs::read_symlink(tmp_ / "live/link"), "nested/deeper");
  struct stat st;
  ASSERT_EQ(stat((tmp_ / "live/dump.rdb").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(Names(tmp_.path()), (std::vector<std::string>{"live", "replica", "src"}))
      << "no staging dir left behind";
  // Into a dir that does not exist yet.
  ASSERT_TRUE(store_.RestoreDataDir(123456, tmp_ / "fresh", &error)) << error;
  EXPECT_EQ(ReadFile(tmp_ / "fresh/empty"), "");
  EXPECT_FALSE(store_.RestoreDataDir(99, tmp_ / "fresh", &error));
  EXPECT_NE(error.find("checkpoint 99 has no data dir"), std::string::npos) << error;
}

TEST_F(CheckpointStoreTest, AMountLeftInTheLiveDirIsDetachedNotEmptied) {
  // A CRIU killed during a restore can leave its proc mounted in the
  // server's directory ("proc.crtools"): replacing that directory must
  // neither fail on it nor delete what the mount shows.
  CommitOne(7, "x");
  fs::create_directories(tmp_ / "live/proc.crtools");
  fs::create_directories(tmp_ / "elsewhere");
  WriteFile(tmp_ / "elsewhere/keep", "not ours to delete");
  ASSERT_EQ(mount((tmp_ / "elsewhere").c_str(), (tmp_ / "live/proc.crtools").c_str(), nullptr,
                  MS_BIND, nullptr),
            0)
      << "bind mount (the tests run as root, as CRIU needs): " << strerror(errno);
  std::string error;
  bool ok = store_.RestoreDataDir(7, tmp_ / "live", &error);
  if (!ok) umount2((tmp_ / "live/proc.crtools").c_str(), MNT_DETACH);  // clean up for TempDir
  ASSERT_TRUE(ok) << error;
  EXPECT_FALSE(fs::exists(tmp_ / "live/proc.crtools"));
  EXPECT_EQ(ReadFile(tmp_ / "elsewhere/keep"), "not ours to delete");
  EXPECT_EQ(ReadFile(tmp_ / "live/dump.rdb"), std::string(100000, 'r'));
}

TEST_F(CheckpointStoreTest, FlippedByteFailsVerifyAndNewestGoodFallsBack) {
  CommitOne(100, std::string(70000, 'a'));
  CommitOne(200, std::string(70000, 'b'));
  std::string error;
  ASSERT_TRUE(store_.Verify(200, &error)) << error;
  FlipByte(store_.PathOf(200) + "/img/pages-1.img", 65536);
  EXPECT_FALSE(store_.Verify(200, &error));
  EXPECT_EQ(error, "checkpoint 200: img/pages-1.img: its SHA-256 differs from the MANIFEST");
  EXPECT_TRUE(store_.List()[0].ok) << "List reads MANIFESTs only";

  std::vector<std::string> skipped;
  auto good = store_.NewestGood(UINT64_MAX, &skipped);
  ASSERT_TRUE(good.has_value());
  EXPECT_EQ(good->index, 100u);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("img/pages-1.img"), std::string::npos) << skipped[0];

  EXPECT_EQ(store_.NewestGood(150)->index, 100u);
  EXPECT_FALSE(store_.NewestGood(99).has_value());
  FlipByte(store_.PathOf(100) + "/data/dump.rdb", 0);
  skipped.clear();
  EXPECT_FALSE(store_.NewestGood(UINT64_MAX, &skipped).has_value());
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_NE(skipped[1].find("data/dump.rdb"), std::string::npos) << skipped[1];
}

TEST_F(CheckpointStoreTest, TruncatedFileFailsVerifyNamingIt) {
  CommitOne(100, "old");
  CommitOne(200, "new");
  ASSERT_EQ(truncate((store_.PathOf(200) + "/data/nested/deeper/a file with spaces%").c_str(), 3),
            0);
  std::string error;
  EXPECT_FALSE(store_.Verify(200, &error));
  EXPECT_EQ(error,
            "checkpoint 200: data/nested/deeper/a file with spaces%: 3 bytes, the MANIFEST says 6");
  EXPECT_EQ(store_.NewestGood(UINT64_MAX)->index, 100u);
}

TEST_F(CheckpointStoreTest, MissingExtraAndChangedFilesFailVerify) {
  CommitOne(1, "x");
  std::string error;
  std::string path = store_.PathOf(1);
  WriteFile(path + "/data/intruder", "?");
  EXPECT_FALSE(store_.Verify(1, &error));
  EXPECT_EQ(error, "checkpoint 1: data/intruder: not in the MANIFEST");
  unlink((path + "/data/intruder").c_str());
  ASSERT_TRUE(store_.Verify(1, &error)) << error;
  unlink((path + "/img/inventory.img").c_str());
  EXPECT_FALSE(store_.Verify(1, &error));
  EXPECT_EQ(error, "checkpoint 1: img/inventory.img: missing");
  CommitOne(2, "y");
  path = store_.PathOf(2);
  unlink((path + "/data/link").c_str());
  symlink("elsewhere", (path + "/data/link").c_str());
  EXPECT_FALSE(store_.Verify(2, &error));
  EXPECT_EQ(error, "checkpoint 2: data/link: the symlink points to elsewhere, not nested/deeper");
  // Files a restore leaves in img/ do not count against the checkpoint.
  CommitOne(3, "z");
  WriteFile(store_.PathOf(3) + "/img/restore.log", "log");
  WriteFile(store_.PathOf(3) + "/img/restore.out", "out");
  EXPECT_TRUE(store_.Verify(3, &error)) << error;
}

TEST_F(CheckpointStoreTest, DamagedOrTruncatedManifestIsCaught) {
  CommitOne(5, "five");
  CommitOne(6, "six");
  std::string manifest = store_.PathOf(6) + "/MANIFEST";
  std::string text = ReadFile(manifest);
  FlipByte(manifest, static_cast<off_t>(text.find("dump_us") + 8));  // 1234 -> 0234 + 1 bit
  auto list = store_.List();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].index, 6u);
  EXPECT_FALSE(list[0].ok);
  EXPECT_EQ(list[0].error, "MANIFEST: damaged (its checksum does not match)");
  EXPECT_TRUE(list[1].ok);
  std::string error;
  EXPECT_FALSE(store_.Verify(6, &error));
  EXPECT_EQ(error, "checkpoint 6: MANIFEST: damaged (its checksum does not match)");
  // Cut before its closing line: also refused.
  WriteFile(manifest, text.substr(0, text.rfind("end ")));
  EXPECT_FALSE(store_.Verify(6, &error));
  EXPECT_EQ(error, "checkpoint 6: MANIFEST: truncated (no closing line)");
  EXPECT_EQ(store_.NewestGood(UINT64_MAX)->index, 5u);
}

TEST_F(CheckpointStoreTest, ManifestRoundTripsAnyPathAndBlob) {
  Manifest m;
  m.index = 42;
  m.meta.replica_id = 7;
  m.meta.time_unix = -5;
  m.meta.dump_us = 99;
  m.meta.extra = std::string("\0\r\n x", 5);
  m.bytes = 3;
  m.entries.push_back({false, "data/we ird\n%20name", 3, std::string(64, 'a'), ""});
  m.entries.push_back({true, "data/l", 0, "", "tar get"});
  Manifest back;
  std::string error;
  ASSERT_TRUE(DecodeManifest(EncodeManifest(m), &back, &error)) << error;
  EXPECT_EQ(back.index, 42u);
  EXPECT_EQ(back.meta.replica_id, 7u);
  EXPECT_EQ(back.meta.time_unix, -5);
  EXPECT_EQ(back.meta.extra, m.meta.extra);
  ASSERT_EQ(back.entries.size(), 2u);
  EXPECT_EQ(back.entries[0].path, "data/we ird\n%20name");
  EXPECT_EQ(back.entries[1].link_target, "tar get");
  EXPECT_TRUE(back.entries[1].is_link);
  // An empty blob survives too.
  m.meta.extra.clear();
  ASSERT_TRUE(DecodeManifest(EncodeManifest(m), &back, &error)) << error;
  EXPECT_EQ(back.meta.extra, "");
  // A future format is refused, not misread.
  Manifest other = m;
  other.version = 2;
  EXPECT_FALSE(DecodeManifest(EncodeManifest(other), &back, &error));
  EXPECT_EQ(error, "line 1: format version 2 is not supported (this build reads 1)");
}

TEST_F(CheckpointStoreTest, PruneKeepsTheNewestGoodOnes) {
  for (uint64_t i = 1; i <= 5; i++) CommitOne(i, "image " + std::to_string(i));
  std::string error;
  std::vector<std::string> removed;
  ASSERT_TRUE(store_.Prune(2, &error, &removed)) << error;
  EXPECT_EQ(Indexes(), (std::vector<uint64_t>{5, 4}));
  EXPECT_EQ(removed.size(), 3u);
  // A damaged newest one is removed, and does not count toward `keep`.
  CommitOne(6, "image 6");
  CommitOne(7, "image 7");
  FlipByte(store_.PathOf(7) + "/img/pages-1.img", 0);
  removed.clear();
  ASSERT_TRUE(store_.Prune(2, &error, &removed)) << error;
  EXPECT_EQ(Indexes(), (std::vector<uint64_t>{6, 5}));
  ASSERT_EQ(removed.size(), 2u);
  EXPECT_NE(removed[0].find("checkpoint 7: img/pages-1.img"), std::string::npos) << removed[0];
  // keep 0 still keeps the newest good one.
  ASSERT_TRUE(store_.Prune(0, &error)) << error;
  EXPECT_EQ(Indexes(), (std::vector<uint64_t>{6}));
  EXPECT_EQ(Names(tmp_ / "replica/checkpoints"), std::vector<std::string>{"00000000000000000006"});
  ASSERT_TRUE(store_.Remove(6, &error)) << error;
  EXPECT_TRUE(Indexes().empty());
  EXPECT_FALSE(store_.Remove(6, &error));
  EXPECT_NE(error.find("cannot remove checkpoint 6"), std::string::npos) << error;
}

TEST_F(CheckpointStoreTest, StaleTmpDirsAreRemovedAtOpen) {
  CommitOne(10, "ten");
  std::string dir = tmp_ / "replica/checkpoints";
  fs::create_directories(dir + "/tmp-00000000000000000011-deadbeef/img/sub");
  WriteFile(dir + "/tmp-00000000000000000011-deadbeef/img/sub/pages.img", "half written");
  PendingCheckpoint p;
  std::string error;
  ASSERT_TRUE(store_.Begin(12, &p, &error)) << error;  // a crash while this one is pending
  CheckpointStore reopened;
  ASSERT_TRUE(reopened.Open(tmp_ / "replica", &error)) << error;
  EXPECT_EQ(Names(dir), std::vector<std::string>{"00000000000000000010"});
  ASSERT_EQ(reopened.List().size(), 1u);
  EXPECT_TRUE(reopened.Verify(10, &error)) << error;
}

TEST_F(CheckpointStoreTest, AbortAndFailedCopyLeaveNoTmpDir) {
  CommitOne(1, "one");
  std::string dir = tmp_ / "replica/checkpoints";
  PendingCheckpoint p;
  std::string error;
  ASSERT_TRUE(store_.Begin(2, &p, &error)) << error;
  EXPECT_TRUE(fs::is_directory(p.img_dir));
  EXPECT_TRUE(fs::is_directory(p.data_dir));
  EXPECT_EQ(Names(dir).size(), 2u);
  store_.Abort(&p);
  EXPECT_FALSE(p.active());
  EXPECT_EQ(Names(dir), std::vector<std::string>{"00000000000000000001"});

  ASSERT_TRUE(store_.Begin(3, &p, &error)) << error;
  EXPECT_FALSE(store_.CopyDataDir(tmp_ / "no-such-dir", &p, &error));
  EXPECT_NE(error.find("no-such-dir: No such file or directory"), std::string::npos) << error;
  EXPECT_FALSE(p.active());
  EXPECT_EQ(Names(dir), std::vector<std::string>{"00000000000000000001"});
  EXPECT_FALSE(store_.Commit(&p, CheckpointMeta{}, &error));
  EXPECT_EQ(error, "no checkpoint is being written");

  // A data dir that holds the store would copy itself forever.
  ASSERT_TRUE(store_.Begin(4, &p, &error)) << error;
  EXPECT_FALSE(store_.CopyDataDir(tmp_ / "replica/..", &p, &error));
  EXPECT_NE(error.find("the checkpoint store " + dir + " is inside it"), std::string::npos)
      << error;
  EXPECT_FALSE(p.active());
  EXPECT_EQ(Names(dir), std::vector<std::string>{"00000000000000000001"});
}

TEST_F(CheckpointStoreTest, CommitOverAnExistingIndexReplacesIt) {
  CommitOne(9, "first");
  CommitOne(9, "second, longer");
  std::string error;
  ASSERT_TRUE(store_.Verify(9, &error)) << error;
  EXPECT_EQ(ReadFile(store_.PathOf(9) + "/img/pages-1.img"), "second, longer");
  EXPECT_EQ(Names(tmp_ / "replica/checkpoints"), std::vector<std::string>{"00000000000000000009"});
}

// A full disk, for real: a 1 MiB tmpfs in a private mount namespace of a
// child process (so the mount cannot outlive the test). The child reports
// "ok" or what went wrong through a pipe.
std::string FullDiskScenario(const std::string& root, const std::string& big_src,
                             const std::string& small_src) {
  if (unshare(CLONE_NEWNS) != 0) return std::string("unshare(CLONE_NEWNS): ") + strerror(errno);
  if (mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
    return std::string("making / private: ") + strerror(errno);
  if (mount("tmpfs", root.c_str(), "tmpfs", 0, "size=1m") != 0)
    return std::string("mount tmpfs: ") + strerror(errno);
  CheckpointStore store;
  std::string error;
  if (!store.Open(root + "/replica", &error)) return "Open: " + error;
  PendingCheckpoint p;
  if (!store.Begin(1, &p, &error) || !store.CopyDataDir(small_src, &p, &error) ||
      !store.Commit(&p, CheckpointMeta{}, &error))
    return "the first checkpoint: " + error;
  std::string dir = root + "/replica/checkpoints";
  auto only_the_first = [&]() -> std::string {
    auto names = Names(dir);
    if (names != std::vector<std::string>{"00000000000000000001"})
      return "checkpoints/ holds " + std::to_string(names.size()) + " entries";
    if (!store.Verify(1, &error)) return "the first checkpoint no longer verifies: " + error;
    return "";
  };
  // The copy runs out of space.
  if (!store.Begin(2, &p, &error)) return "Begin 2: " + error;
  if (store.CopyDataDir(big_src, &p, &error)) return "copying 2 MiB into 1 MiB succeeded";
  if (error.find("No space left on device") == std::string::npos) return "copy error: " + error;
  if (p.active()) return "the failed copy left its checkpoint pending";
  if (std::string why = only_the_first(); !why.empty()) return "after the copy: " + why;
  // Commit runs out of space writing the MANIFEST: criu filled the disk.
  if (!store.Begin(3, &p, &error)) return "Begin 3: " + error;
  int fd = open((p.img_dir + "/pages-1.img").c_str(), O_WRONLY | O_CREAT, 0600);
  std::string chunk(4096, 'x');
  while (write(fd, chunk.data(), chunk.size()) > 0) {
  }
  close(fd);
  if (store.Commit(&p, CheckpointMeta{}, &error)) return "Commit on a full disk succeeded";
  if (error.find("No space left on device") == std::string::npos) return "commit error: " + error;
  if (error.find("MANIFEST") == std::string::npos) return "commit error: " + error;
  if (std::string why = only_the_first(); !why.empty()) return "after the commit: " + why;
  // With the space back, the next checkpoint works.
  if (!store.Begin(4, &p, &error) || !store.CopyDataDir(small_src, &p, &error) ||
      !store.Commit(&p, CheckpointMeta{}, &error))
    return "the checkpoint after: " + error;
  return "ok";
}

TEST_F(CheckpointStoreTest, FullDiskFailsClearlyAndLeavesOlderCheckpointsIntact) {
  ASSERT_EQ(geteuid(), 0u) << "this test mounts a tmpfs: it needs root";
  fs::create_directories(tmp_ / "big");
  WriteFile(tmp_ / "big/a", std::string(1 << 20, 'a'));
  WriteFile(tmp_ / "big/b", std::string(1 << 20, 'b'));
  fs::create_directories(tmp_ / "small");
  WriteFile(tmp_ / "small/x", "x");
  fs::create_directories(tmp_ / "mnt");
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  pid_t child = fork();
  if (child == 0) {
    close(pipe_fds[0]);
    std::string report = FullDiskScenario(tmp_ / "mnt", tmp_ / "big", tmp_ / "small");
    ssize_t ignored = write(pipe_fds[1], report.data(), report.size());
    (void)ignored;
    _exit(0);
  }
  ASSERT_GT(child, 0);
  close(pipe_fds[1]);
  std::string report;
  char buf[4096];
  ssize_t n;
  while ((n = read(pipe_fds[0], buf, sizeof buf)) > 0) report.append(buf, static_cast<size_t>(n));
  close(pipe_fds[0]);
  int st;
  ASSERT_EQ(waitpid(child, &st, 0), child);
  EXPECT_EQ(report, "ok");
  EXPECT_TRUE(Names(tmp_ / "mnt").empty()) << "the tmpfs was private to the child";
}

}  // namespace
}  // namespace lockstep
