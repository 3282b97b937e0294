// relocate.h — makes another replica's checkpoint restorable here. CRIU's
// images name the paths of the files the server had open (its data
// directory, its log, its working directory) and the port its listening
// socket was bound to, and a restore reopens and rebinds exactly those. A
// checkpoint fetched from a peer (state transfer) would therefore reopen the
// peer's files and fight the peer's server for its port. Relocation builds a
// view of the images in which those names are this replica's: every image
// is linked as is, except files.img, rewritten.
//
// files.img is a CRIU image: two magic words, then entries, each a 32-bit
// length and a protobuf file_entry (criu/images/fdinfo.proto). The rewrite
// walks the protobuf wire format and touches two fields only:
// file_entry.reg (3) -> reg_file_entry.name (6) and file_entry.usk (16) ->
// unix_sk_entry.name (11), paths (a file, a bound unix socket such as
// MariaDB's): from_dir's prefix becomes to_dir; and file_entry.isk (4) -> inet_sk_entry.src_port
// (7) of a listening socket (state 6 == TCP_LISTEN): from_port becomes to_port, and its bound
// address (src_addr, 11) from_host becomes to_host, for replicas on hosts of their own (netns
// hosts, real machines), whose servers listen on their own addresses (a socket bound to
// 0.0.0.0 stays so). Everything else is copied byte for byte.
#pragma once

#include <cstdint>
#include <string>

namespace lockstep {

struct Relocation {
  std::string from_dir;    // the peer's replica dir (no trailing slash)
  std::string to_dir;      // ours
  uint32_t from_port = 0;  // the peer's server port
  uint32_t to_port = 0;    // ours
  std::string from_host;   // the peer's host (IPv4, as in cluster.toml); "": addresses stay
  std::string to_host;     // ours
};

// Rewrites one files.img image (its bytes) as above. false and *error on an
// image it cannot parse (then nothing is written). *changed counts the
// fields rewritten.
bool RelocateFilesImage(const std::string& in, const Relocation& r, std::string* out, int* changed,
                        std::string* error);

// Makes view_dir (emptied first) a copy of img_dir made of symlinks, with
// files.img relocated. The view is what criu restore reads (and writes its
// restore.log into); img_dir is not touched.
bool BuildRelocatedView(const std::string& img_dir, const std::string& view_dir,
                        const Relocation& r, std::string* error);

}  // namespace lockstep
