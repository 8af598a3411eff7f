// Package workflows is gauntlet's Temporal control plane (curricula, durable episodes,
// drift; see README.md here and docs/curriculum.md): the Curriculum workflow
// (ordered stages run in batches, promotion by a rule over the last window of scored
// episodes, infra errors left out and a batch mostly of them pausing the curriculum,
// drift of fault parameters over a stage, pause / resume / skip / abort signals, a progress
// query, continue-as-new), the Batch workflow (N episodes of one spec and their
// statistics) and the DurableEpisode workflow (one episode whose step loop is a
// heartbeating activity that resumes on another worker, scored under the reward spec its
// input names, the spec's scoring state kept in the heartbeat with each step).
//
// Workflows are deterministic: they read time only through workflow.Now, derive seeds and
// run ids with pure functions of their input and of the workflow's id and first run id,
// and never iterate maps. Activities do all I/O, over NATS only: a batch is one run the
// scheduler accepts once (its id is deterministic and the scheduler keeps run state in
// KV), so a retried activity or a restarted process never runs an episode twice. Steps
// never go through Temporal: at training scale a Temporal event per step or per episode
// would cost more than the episode: an activity costs milliseconds, an episode's steps
// microseconds (docs/benchmarks.md, Temporal curricula).
//
// Concurrency: Activities is safe for concurrent use; workflow functions run under the
// SDK's deterministic scheduler.
//
// What people see: each batch's run carries its curriculum, stage and batch (the runs
// table); each closed stage is recorded by the RecordStage activity (curriculum_stages);
// the memo and, where registered, the search attributes follow the curriculum's state and
// stage in Temporal's UI, and an aborted curriculum closes as canceled with its progress
// (visibility.go). These are versioned changes: older histories replay as they ran.
//
// Secrets: a stage's or a batch's model endpoint names its credential, never the key
// (EndpointSpec): workflow inputs are kept in Temporal's history.
//
// Errors: an invalid spec fails the workflow at once with a non-retryable application
// error of type InvalidSpec whose message names every bad field; a run the scheduler
// refuses fails it with RunRefused. Other activity errors are retried.
package workflows
