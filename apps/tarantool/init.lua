-- apps/tarantool/init.lua — Tarantool's start-up script under lockstep
-- (apps/tarantool.toml). Copied into every replica's data directory, {port},
-- {dir} and {host} replaced by its own.
-- Listening comes last (below), once the spaces exist: a client that
-- connects as soon as the port answers finds them.
box.cfg{
    work_dir = '{dir}',
    -- The replicated log is the durable history: its own write-ahead log is
    -- written without fsync (vinyl needs one to exist), and no snapshots are
    -- taken on a timer (a timer runs at another moment on each replica).
    wal_mode = 'write',
    checkpoint_interval = 0,
    memtx_memory = 256 * 1024 * 1024,
    log_level = 4,
    -- Its own replication stays off: lockstep replicates it.
    background = false,
}
-- Who may do what: the guest user (no password: a password login's scramble
-- uses the greeting's random salt, different on every replica).
box.once('lockstep-schema', function()
    box.schema.user.grant('guest', 'read,write,execute,create,drop', 'universe')
    -- A document store (MongoDB's kind): documents by id in memory, with a
    -- secondary index on a field of the document.
    local docs = box.schema.space.create('docs', {engine = 'memtx'})
    docs:create_index('primary', {type = 'tree', parts = {1, 'unsigned'}})
    docs:create_index('owner', {type = 'tree', unique = false, parts = {2, 'string'}})
    -- A key-value store on disk, an LSM tree (SSDB's kind, on LevelDB).
    local kv = box.schema.space.create('kv', {engine = 'vinyl'})
    kv:create_index('primary', {type = 'tree', parts = {1, 'string'}})
end)
box.cfg{listen = '{host}:{port}'}
