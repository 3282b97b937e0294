# redis's state probe (apps/redis.toml `state_probe`, guard/server/state_check.h):
# prints a digest of the next slice of redis's keyspace, the slice the last
# check's cursor points to.
#
#     sh state_probe.sh HOST PORT CURSOR_FILE [SLICE]
#
# A state check holds redis, on every replica, for as long as its command
# takes (it goes through the log like any client's): DEBUG DIGEST of the
# whole data set takes ~5 µs a key (50 ms at 10,000 keys of 64 bytes here,
# seconds at millions), and the leader's clients would wait that long each
# check. So one EVAL digests a slice: SCAN from the cursor (COUNT SLICE,
# default 1000: ~5 ms), DUMP of every key it returns, a SHA-1 of keys and
# dumps, and DBSIZE (a key missing or extra anywhere shows at once). The
# cursor SCAN hands back is kept in CURSOR_FILE for the next check, on the
# leader that runs the probe (a new leader starts from the beginning). A
# full cycle covers every key that stayed in the keyspace (SCAN's
# guarantee): a value that drifted among N keys is found within N / SLICE
# checks. The EVAL's answer is compared between the replicas (output
# checking), the SHA-1 of what each one holds in the slice: SCAN walks the
# hash table, whose layout is the same on every replica whose inputs were
# (a client's own SCAN through the leader relies on that too).
#
# Prints "SHA1 DBSIZE keys, COUNT from cursor CURSOR" (the leader's, for
# `cluster status`); exits 3 unless the slice ended the pass (below). sh and
# redis-cli: a Python start-up costs more CPU here than the digest.
set -eu
[ $# -ge 3 ] || { echo "usage: state_probe.sh HOST PORT CURSOR_FILE [SLICE]" >&2; exit 2; }
host=$1 port=$2 cursor_file=$3 slice=${4:-1000}
cursor=$(cat "$cursor_file" 2>/dev/null || echo 0)
case $cursor in '' | *[!0-9]*) cursor=0 ;; esac
script='
local r = redis.call("SCAN", ARGV[1], "COUNT", ARGV[2])
local parts = {}
for _, k in ipairs(r[2]) do
  parts[#parts + 1] = k
  parts[#parts + 1] = redis.call("DUMP", k) or ""
end
return {redis.call("DBSIZE"), r[1], #r[2], redis.sha1hex(table.concat(parts, "\n"))}'
out=$(redis-cli --raw -h "$host" -p "$port" EVAL "$script" 0 "$cursor" "$slice")
set -- $out
[ $# -eq 4 ] || { echo "redis answered: $out" >&2; exit 1; }
echo "$2" >"$cursor_file.new" && mv "$cursor_file.new" "$cursor_file"
echo "$4 $1 keys, $3 from cursor $cursor"
# SCAN's cursor 0: the pass over the keyspace ended. Any other: exit 3, a
# slice checked and the pass unfinished (guard/server/state_check.h), so the
# leader goes on checking the rest though no client writes any more.
[ "$2" = 0 ] || exit 3
