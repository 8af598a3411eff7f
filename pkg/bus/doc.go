// Package bus owns gauntlet's NATS JetStream plumbing: the embedded server, the connection,
// the streams and their subjects, and publishing with de-duplicating message ids.
//
// Layout (see docs/architecture.md):
//
//	GAUNTLET_CMD     work-queue  gauntlet.cmd.run                  RunRequested    -> scheduler
//	                             gauntlet.cmd.episode.<run_id>     Assignment      -> workers
//	GAUNTLET_EVENTS  limits*     gauntlet.ev.<kind>.<run_id>       Event           -> store, scheduler
//	                             (kinds: started, steps, ended; an Event may be a batch)
//	GAUNTLET_STALLED work-queue  $JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.GAUNTLET_CMD.worker
//	                                                               advisory        -> scheduler
//	core request/reply           gauntlet.rpc.reward.score         ScoreRequest    -> reward
//	                             gauntlet.rpc.faults.plan          PlanRequest     -> faults
//	core publish                 gauntlet.progress.<run_id>        RunProgress     -> CLIs
//	KV gauntlet_runs             <run_id>                          RunState        scheduler -> workflows, CLIs, store
//	KV gauntlet_store            written                           StoreProgress   store -> whoever waits for rows
//	KV gauntlet_curricula        <prefix>.<stage>                  StageTransition curriculum -> store
//
// * trimmed (TrimEvents) below what the store and the scheduler have processed, beyond a
// sized history; only unprocessed events can fill it, and a publish refused for lack of
// room waits (back-pressure) instead of failing.
//
// Every JetStream publish carries a message id derived from what it describes (episode,
// step, kind), so a retried publish is dropped by the stream's duplicate window and a
// re-run episode produces the same ids. Streams are created or updated idempotently by
// EnsureStreams; each service creates its own durable consumers.
//
// A Bus is safe for concurrent use. The embedded Server is a lifecycle.Service.
package bus
