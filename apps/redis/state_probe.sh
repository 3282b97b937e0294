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
# check. So one EVAL digests a slice of ~SLICE keys (default 1000: a few ms):
# the keys SCAN returns from the cursor, a DUMP of each, and DBSIZE (a key
# missing or extra anywhere shows at once). The EVAL's answer is compared
# between the replicas (output checking); the cursor it hands back is kept
# in CURSOR_FILE for the next check, on the leader that runs the probe (a new
# leader starts from the beginning). A full cycle covers every key that
# stayed in the keyspace (SCAN's guarantee): a value that drifted among N
# keys is found within N / SLICE checks.
#
# The slice must not depend on the hash table's layout, which differs
# between replicas that hold the same keys: every lookup steps an
# incremental rehash, and a backup's redis also answers inspection
# connections (EXISTS, GET: preload/shim_inspect.c) that no other replica
# executes, so one replica's table may have finished growing while
# another's still rehashes. SCAN on a rehashing table returns a small
# bucket together with its expansions in the big one; on a finished one,
# each big bucket alone. Slices ending wherever SCAN COUNT 1000 stopped (as
# they once did) then held different keys, and a state check reported a
# leader that merely had not rehashed yet (CI: test_no_unagreed_service).
# SCAN's order is the same on both: by the bit-reversed low bits of a key's
# hash. So the keyspace is cut into G groups (G a power of two, at most
# DBSIZE / 8, below any table size redis keeps at that many keys): group g
# holds the keys whose low log2(G) hash bits, reversed, are g, and starts at
# cursor reverse(g). A slice is whole groups: SCAN ... COUNT 1 steps on (its
# keys come from the last bucket it visited, so the group they belong to is
# known from the cursor it returns; larger COUNTs where no group start that
# could end the slice is passed), and the slice ends at the first group
# start by which SLICE keys were found. Keys and dumps are digested one by
# one and sorted (SCAN's order within a bucket is each table's own).
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
local want = tonumber(ARGV[2])
local size = redis.call("DBSIZE")
local bits, groups = 0, 1
while groups * 2 <= size / 8 do bits, groups = bits + 1, groups * 2 end
-- the group a cursor is in: its low bits, reversed (also the cursor at
-- which a group starts, reversal being its own inverse)
local function reversed(c)
  local g, x = 0, c % groups
  for _ = 1, bits do g, x = g * 2 + x % 2, (x - x % 2) / 2 end
  return g
end
local cursor = tonumber(ARGV[1]) % groups
local at, stop, found, fine = reversed(cursor), nil, {}, false
repeat
  -- Half the keys still wanted a call, while no group start that could end
  -- the slice lies inside what it returns; one bucket a call otherwise.
  local count = fine and 1 or math.max(1, math.floor((want - #found) / 2))
  local r = redis.call("SCAN", cursor, "COUNT", count)
  local after = tonumber(r[1])
  -- the last group start the call reached, and the group of its keys (of
  -- its last bucket: with COUNT 1, the only one that had any)
  local reached, keys_in
  if after == 0 then
    reached, keys_in = groups, groups - 1
  elseif after < groups then
    reached = reversed(after); keys_in = reached - 1
  else
    reached = reversed(after); keys_in = reached
  end
  if count > 1 and reached > at and #found + #r[2] >= want then
    fine = true -- the slice may end at a start inside: walk it again finely
  else
    for b = at + 1, reached do
      local before = #found + ((keys_in < b) and #r[2] or 0)
      if before >= want or b == groups then stop = b; break end
    end
    if stop == nil or keys_in < stop then
      for _, k in ipairs(r[2]) do found[#found + 1] = k end
    end
    at, cursor = reached, after
  end
until stop
local digests = {}
for i, k in ipairs(found) do
  digests[i] = redis.sha1hex(#k .. ":" .. k .. (redis.call("DUMP", k) or ""))
end
table.sort(digests)
local resume = (stop == groups) and 0 or reversed(stop)
return {size, resume, #found, redis.sha1hex(table.concat(digests))}'
out=$(redis-cli --raw -h "$host" -p "$port" EVAL "$script" 0 "$cursor" "$slice")
set -- $out
[ $# -eq 4 ] || { echo "redis answered: $out" >&2; exit 1; }
echo "$2" >"$cursor_file.new" && mv "$cursor_file.new" "$cursor_file"
echo "$4 $1 keys, $3 from cursor $cursor"
# Cursor 0: the pass over the keyspace ended. Any other: exit 3, a
# slice checked and the pass unfinished (guard/server/state_check.h), so the
# leader goes on checking the rest though no client writes any more.
[ "$2" = 0 ] || exit 3
