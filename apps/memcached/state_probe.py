"""memcached's state probe (apps/memcached.toml `state_probe`, guard/server/state_check.h):
prints a digest of every item the server holds: its key, flags, remaining time to live and
value, in key order.

    python3 state_probe.py HOST PORT

memcached has no command that digests its items, and its LRU crawler (whose `lru_crawler
metadump` lists keys) is off in the profile, since it expires items on its own clock. So:
`stats items` names the slab classes in use, `stats cachedump CLASS 0` lists each one's keys
(memcached stops a class's list at 2 MB of output: past some tens of thousands of keys per
class the digest covers the first ones only), and a meta get (`mg KEY v f t`) reads each item.
The daemon relays these requests through the log: every backup's server answers the same
ones at the same point, and any answer that differs (a key list, a value) is a divergence of
kind state. An item that expired since the listing answers EN everywhere alike."""

import hashlib
import socket
import sys

BATCH = 200  # meta gets sent before their answers are read


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

    def stats(what):
        f.write(b"stats " + what + b"\r\n")
        f.flush()
        out = []
        while (got := line()) != b"END":
            if got.startswith((b"ERROR", b"CLIENT_ERROR")):
                sys.exit(f"stats {what.decode()}: {got.decode(errors='replace')}")
            out.append(got)
        return out

    classes = sorted(
        {int(s.split(b":")[1]) for s in stats(b"items") if s.startswith(b"STAT items:")}
    )
    keys = []
    for c in classes:
        keys += [s.split(b" ")[1] for s in stats(b"cachedump %d 0" % c) if s.startswith(b"ITEM ")]
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
