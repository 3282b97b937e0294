"""memcached's state probe (apps/memcached.toml `state_probe`, guard/server/state_check.h):
prints a digest of every item the server holds: its key, flags, remaining time to live and
value, in key order.

    python3 state_probe.py HOST PORT

memcached has no command that digests its items, and its LRU crawler (whose `lru_crawler
metadump` lists keys) is off in the profile, since it expires items on its own clock. So:
`stats cachedump CLASS 0` lists the keys of each slab class, 16 classes asked at once
(preload/mc_scan.h pairs at most MC_QUEUE 32 of its replies with their requests at a time;
an unused class answers END at once; memcached stops a class's list at 2 MB of output: past
some tens of thousands of keys per class the digest covers the first ones only), and a meta
get (`mg KEY v f t`) reads each item. Not `stats items` to find the classes in use: its
lrutail_reflocked counts items a reply still held when a store looked at the LRU's tail, and
a leader's reply to a client holds its item longer than a backup's to the daemon, so that
count differed with the items alike (a fresh-clone test run saw the leader found divergent
at byte 425 of this probe's connection, in that line, and handed leadership over).
The daemon relays these requests through the log: every backup's server answers the same
ones at the same point, and any answer that differs (a key list, a value) is a divergence of
kind state. An item that expired since the listing answers EN everywhere alike. With lease
reads (apps/memcached.toml) a get moves an item idle for 60 s to its LRU's head on the
leader only, so the shim compares each cachedump answer as a sum over its lines, in any
order (preload/mc_scan.h), and serves none of this connection's reads under the lease."""

import hashlib
import socket
import sys

BATCH = 200  # meta gets sent before their answers are read
DUMPS = 16  # stats cachedumps sent before their answers are read
CLASSES = range(1, 64)  # memcached's slab class ids (MAX_NUMBER_OF_SLAB_CLASSES is 64)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: state_probe.py HOST PORT")
    conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=15)
    f = conn.makefile("rwb")

    def line():
        got = f.readline()
        if not got.endswith(b"\r\n"):
            sys.exit(f"memcached closed the connection or sent a broken line: {got!r}")
        return got[:-2]

    keys = []
    for start in range(CLASSES.start, CLASSES.stop, DUMPS):
        batch = range(start, min(start + DUMPS, CLASSES.stop))
        f.write(b"".join(b"stats cachedump %d 0\r\n" % c for c in batch))
        f.flush()
        for c in batch:
            while (got := line()) != b"END":
                if not got.startswith(b"ITEM "):
                    sys.exit(f"stats cachedump {c} 0: {got.decode(errors='replace')}")
                keys.append(got.split(b" ")[1])
    digest = hashlib.sha1()
    keys.sort()
    for start in range(0, len(keys), BATCH):
        batch = keys[start : start + BATCH]
        f.write(b"".join(b"mg " + k + b" v f t\r\n" for k in batch))
        f.flush()
        for k in batch:
            head = line()
            digest.update(k + b"\n" + head + b"\n")
            if head.startswith(b"VA "):
                size = int(head.split(b" ")[1])
                data = f.read(size + 2)
                if len(data) != size + 2:
                    sys.exit("memcached closed the connection inside a value")
                digest.update(data)
            elif not head.startswith(b"EN"):
                sys.exit(f"mg {k.decode(errors='replace')}: {head.decode(errors='replace')}")
    print(f"{digest.hexdigest()} {len(keys)} items")


if __name__ == "__main__":
    main()
