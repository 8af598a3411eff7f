// Package trajectory is the ClickHouse projection of gauntlet's event log: the steps,
// faults and episodes tables analysts query in SQL, how events become their rows, and
// the few reads the CLI and tests need.
//
// Contract:
//   - The event stream is the truth; these tables can be dropped and rebuilt from it.
//     Migrate owns the schema: numbered migrations recorded in schema_migrations,
//     each applied once, in order. The schema runs on Debian's ClickHouse 18.16 and on
//     current releases (no DateTime64, Map, JSON, Bool, LowCardinality, TTL, window
//     functions or CTE subqueries).
//   - Inserts are idempotent. Tables are ReplacingMergeTree keyed by the event's
//     identity ((episode_id, step) for steps, (episode_id, step, seq) for faults,
//     (run_id, episode_id) for episodes) and partitioned by the episode's fixed
//     requested_at, so a redelivered event collapses with its first copy. Until
//     ClickHouse merges them, both copies are stored: exact reads use FINAL, the
//     *_final views, or GROUP BY / uniqExact over the key, as the readers here do.
//   - On the replicas of a replicated ClickHouse (a server with the cluster, shard and
//     replica macros), Migrate creates each table as a Replicated* table_local with a
//     Distributed table under the table's name, so every reader, the writer and
//     analysts use the same names on either replica; MigrateReplicas migrates them all
//     (docs/architecture.md, Replicated ClickHouse). Connect takes the replicas'
//     addresses comma-separated and fails over from one to the next.
//   - Writer.Write turns one slice of events into at most one batch per table, with an
//     explicit column list (the only INSERT that works on 18.16 through clickhouse-go).
//     It is safe for concurrent use. On error nothing is rolled back: some tables may
//     hold the rows already; retrying the same events is the recovery.
//   - Errors name the operation and the table and wrap the driver's error, so
//     errors.As finds *clickhouse.Exception (and its server error code).
package trajectory
