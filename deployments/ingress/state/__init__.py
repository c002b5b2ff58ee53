"""Gateway state that outlives a router process and is shared by every router replica: virtual
keys, budgets and the usage ledger / request log, in SQLite (embedded) or PostgreSQL
(docs/gateway-state.md). One module per job: the backends behind one interface, migrations, a
module per table, the write-behind queue, and the replica's view of the keys."""
