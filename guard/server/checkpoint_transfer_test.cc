// checkpoint_transfer_test.cc — what a peer asking for a checkpoint is told
// when none comes (guard/server/checkpoint_transfer.h, CheckpointSenders::Serve).
#include "guard/server/checkpoint_transfer.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>

#include "guard/net/tls.h"
#include "guard/net/wire.h"

namespace lockstep {
namespace {

// A backup being repaired from the leader's own server asks the leader
// while that checkpoint is being taken; the checkpoint fails. The backup
// must hear why (its divergence report shows it), not only that the
// leader has none.
TEST(CheckpointSenders, APeerWaitingForACheckpointThatFailedIsToldWhy) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  std::atomic<int> asked{0};
  {
    CheckpointSenders senders([](const std::string&) {});
    senders.Serve(std::make_unique<Stream>(fds[0]), nullptr, 42, [&](std::string* why_none) {
      if (++asked < 3) return true;  // being taken
      *why_none = "the leader's checkpoint of its own server failed: the dump was refused";
      return false;
    });
    Stream peer(fds[1]);
    FrameKind kind{};
    std::string body, error;
    ASSERT_TRUE(ReadFrame(peer, &kind, &body, 10000, &error)) << error;
    ASSERT_EQ(kind, FrameKind::kCheckpointDone);
    CheckpointDone done;
    ASSERT_TRUE(DecodeCheckpointDone(body, &done));
    EXPECT_FALSE(done.ok);
    EXPECT_EQ(done.error,
              "no checkpoint here: the leader's checkpoint of its own server failed: the dump "
              "was refused");
  }  // the sender's thread is joined
  EXPECT_EQ(asked.load(), 3);
}

}  // namespace
}  // namespace lockstep
