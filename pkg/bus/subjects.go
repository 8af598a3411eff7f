package bus

import (
	"fmt"
	"strings"
)

// Stream names.
const (
	StreamCommands = "GAUNTLET_CMD"
	StreamEvents   = "GAUNTLET_EVENTS"
	// StreamStalled keeps JetStream's advisories of assignments that ran out of
	// deliveries, so the scheduler records their episodes even if it was down when one
	// was published.
	StreamStalled = "GAUNTLET_STALLED"
)

// Subjects and subject prefixes.
const (
	SubjectRun           = "gauntlet.cmd.run"
	SubjectEpisodePrefix = "gauntlet.cmd.episode."
	SubjectEventsAll     = "gauntlet.ev.>"
	SubjectEndedAll      = "gauntlet.ev.ended.>"
	SubjectScore         = "gauntlet.rpc.reward.score"
	SubjectPlan          = "gauntlet.rpc.faults.plan"
	SubjectProgressAll   = "gauntlet.progress.>"
	// SubjectAssignmentsStalled is JetStream's max-deliveries advisory for the workers'
	// consumer of GAUNTLET_CMD: an assignment delivered --worker.max-deliver times without
	// an ack (its workers died or hung on it every time).
	SubjectAssignmentsStalled = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + StreamCommands + ".worker"
)

// Event kinds, the third token of an event subject.
const (
	KindStarted = "started"
	KindStep    = "step"
	KindSteps   = "steps"
	KindEnded   = "ended"
)

// KV buckets.
const (
	BucketRuns = "gauntlet_runs"
	// BucketDrift holds the global fault drift (a DriftSet under key KeyDriftGlobal); its
	// history is the record of every change.
	BucketDrift = "gauntlet_drift"
	// BucketPlanTemplates holds the templates of user-defined profiles' fault plans, keyed
	// by template id; compact plans name them (pkg/faults/templates).
	BucketPlanTemplates = "gauntlet_plan_templates"
	// BucketRewardSpecs holds the files of the reward specs runs name, keyed by their
	// digest (pkg/rewardspecs).
	BucketRewardSpecs = "gauntlet_reward_specs"
	// KeyDriftGlobal is the key of the global DriftSet in BucketDrift.
	KeyDriftGlobal = "global"
	// BucketStore holds what the store publishes about itself: under KeyStoreWritten, a
	// StoreProgress saying up to which GAUNTLET_EVENTS sequence ClickHouse holds every
	// event.
	BucketStore = "gauntlet_store"
	// KeyStoreWritten is the key of the store's StoreProgress in BucketStore.
	KeyStoreWritten = "written"
	// BucketCurricula holds each closed curriculum stage, a StageTransition under
	// "<curriculum run prefix>.<stage>", for the store to project (curriculum_stages).
	BucketCurricula = "gauntlet_curricula"
	// BucketLeases holds leader leases (Lease): a key per singleton role, held by the
	// instance that acts while the others stand by; entries expire after LeaseTTL.
	BucketLeases = "gauntlet_leases"
	// BucketThreats holds the threat fingerprints: one per dangerous behaviour a sandbox
	// recorded, keyed by the fingerprint's id, watched by every process that plays
	// episodes so a later match anywhere is flagged (pkg/threats).
	BucketThreats = "gauntlet_threats"
)

// SubjectEpisode is where the scheduler assigns the episodes of a run.
func SubjectEpisode(runID string) string { return SubjectEpisodePrefix + runID }

// SubjectEvent is the subject of a run's events of a kind.
//
// Subjects name the run, not the episode: JetStream keeps an in-memory index entry for
// every distinct subject a stream holds, so per-episode subjects made the server's memory
// grow with every episode (docs/benchmarks.md, Costs the code cites, Trajectory store:
// per-run subjects). Per-run subjects keep
// that index as small as the number of runs. Episodes stay in order (one worker publishes
// an episode, in order, on one connection), each event still carries its episode id, and
// message ids stay per episode and step, so de-duplication is unchanged.
func SubjectEvent(kind, runID string) string { return "gauntlet.ev." + kind + "." + runID }

// SubjectProgress is where the scheduler announces a run's progress.
func SubjectProgress(runID string) string { return "gauntlet.progress." + runID }

// ValidToken reports an error if s cannot be one token of a NATS subject: run and episode
// ids become subject tokens, so they must be non-empty and free of '.', '*', '>' and
// white space.
func ValidToken(field, s string) error {
	if s == "" {
		return fmt.Errorf("%s: must not be empty", field)
	}
	if len(s) > 128 {
		return fmt.Errorf("%s: %d bytes is longer than 128", field, len(s))
	}
	if i := strings.IndexAny(s, ".*> \t\r\n"); i >= 0 {
		return fmt.Errorf("%s: %q contains %q, which cannot appear in a NATS subject token", field, s, s[i])
	}
	return nil
}
