package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/rewardspecs"
	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// BatchInput is one batch: a run of Episodes episodes of one stage, submitted to the
// scheduler as a RunRequested with the id RunID. The same input always makes the same
// run: a retried activity finds the run already accepted and only waits for it.
type BatchInput struct {
	RunID       string `json:"run_id"`
	Env         string `json:"env"`
	ParamsJSON  string `json:"params_json"`
	Policies    string `json:"policies"`
	Profiles    string `json:"profiles"`
	Episodes    uint64 `json:"episodes"`
	Seed        uint64 `json:"seed"`
	MaxInFlight uint32 `json:"max_in_flight"`
	MaxSteps    uint32 `json:"max_steps"`
	Label       string `json:"label,omitempty"`
	// Ramps drift fault parameters linearly over the batch's episodes.
	Ramps []Ramp `json:"ramps,omitempty"`
	// DriftText is more drift in `gauntlet run --drift` form; wall-time schedules take
	// RequestedAtUnixNano as their origin.
	DriftText string `json:"drift_text,omitempty"`
	// RewardSpec is the text of the reward spec file the batch's steps are scored under;
	// empty: the built-in default/1. RunBatch puts it in the gauntlet_reward_specs bucket
	// and the run names it by digest.
	RewardSpec string `json:"reward_spec,omitempty"`
	// PolicyEndpoint is the model endpoint of the batch's "http" policy (a name of its
	// credential, never the key: the input is in Temporal's history).
	PolicyEndpoint *EndpointSpec `json:"policy_endpoint,omitempty"`
	// RequestedAtUnixNano is the workflow's time when it decided the batch (ClickHouse
	// partitions by it); fixed in the input so retries submit the identical request.
	RequestedAtUnixNano int64 `json:"requested_at_unix_nano"`
	// Origin is where the batch comes from, recorded with its run (the runs table).
	Origin BatchOrigin `json:"origin,omitempty"`
}

// BatchOrigin names who started the batch's workflow and, for a curriculum's batch,
// which curriculum, stage and batch it is.
type BatchOrigin struct {
	SubmittedBy      string `json:"submitted_by,omitempty"`
	CurriculumID     string `json:"curriculum_id,omitempty"`
	CurriculumName   string `json:"curriculum_name,omitempty"`
	CurriculumPrefix string `json:"curriculum_prefix,omitempty"`
	Stage            int    `json:"stage,omitempty"`
	StageName        string `json:"stage_name,omitempty"`
	Batch            int    `json:"batch,omitempty"`
}

// BatchResult is what a finished batch reports, read from the scheduler's run state.
type BatchResult struct {
	RunID       string `json:"run_id"`
	Episodes    uint64 `json:"episodes"`
	Succeeded   uint64 `json:"succeeded"`
	InfraErrors uint64 `json:"infra_errors"`
	// InfraByKind splits InfraErrors by what failed ("model_endpoint", "sandbox",
	// "verifier", "gauntlet"; "unknown" for an end that did not say); kinds with none are
	// absent.
	InfraByKind map[string]uint64 `json:"infra_by_kind,omitempty"`
	Steps       uint64            `json:"steps"`
	FaultsFired uint64            `json:"faults_fired"`
	RewardSum   float64           `json:"reward_sum"`
	// WallNs is the batch's wall time as its activity saw it: from submitting the run (or,
	// on a retry, from finding it submitted) to seeing it done. Time outside it is the
	// control plane's (workflow tasks, activity dispatch).
	WallNs int64 `json:"wall_ns"`
}

// Scored is how many of the batch's episodes are scored: those that did not end as
// infra errors (which are not the policy's doing and carry no reward).
func (r BatchResult) Scored() uint64 {
	if r.InfraErrors >= r.Episodes {
		return 0
	}
	return r.Episodes - r.InfraErrors
}

// SuccessRate is Succeeded over the scored episodes (0 for none), as the run summary
// and the episodes_scored view count it.
func (r BatchResult) SuccessRate() float64 {
	if r.Scored() == 0 {
		return 0
	}
	return float64(r.Succeeded) / float64(r.Scored())
}

// RewardMean is RewardSum over the scored episodes (0 for none).
func (r BatchResult) RewardMean() float64 {
	if r.Scored() == 0 {
		return 0
	}
	return r.RewardSum / float64(r.Scored())
}

// InfraKinds names the counts of RunProgress.infra_by_kind by kind, leaving out zeros;
// nil when there are none.
func InfraKinds(byKind []uint64) map[string]uint64 {
	var out map[string]uint64
	for k, n := range byKind {
		if n == 0 {
			continue
		}
		name := gauntletv1.InfraKind(k).Name()
		if name == "" {
			name = "unknown"
		}
		if out == nil {
			out = map[string]uint64{}
		}
		out[name] += n
	}
	return out
}

// sortedKinds returns kinds as parallel lists sorted by kind, as StageTransition carries
// them; nil for none.
func sortedKinds(kinds map[string]uint64) ([]string, []uint64) {
	if len(kinds) == 0 {
		return nil, nil
	}
	names := make([]string, 0, len(kinds))
	for k := range kinds {
		names = append(names, k)
	}
	sort.Strings(names)
	counts := make([]uint64, len(names))
	for i, k := range names {
		counts[i] = kinds[k]
	}
	return names, counts
}

// FormatInfraKinds writes kinds as "model_endpoint 3, sandbox 1", by name.
func FormatInfraKinds(kinds map[string]uint64) string {
	names := make([]string, 0, len(kinds))
	for k := range kinds {
		names = append(names, k)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = fmt.Sprintf("%s %d", k, kinds[k])
	}
	return strings.Join(parts, ", ")
}

// MostlyInfra reports whether more than half of the batch's episodes ended as infra
// errors: what it measured is the infrastructure's health, not the policy's, so a
// curriculum takes no stage decision on it and pauses (see Curriculum).
func (r BatchResult) MostlyInfra() bool { return r.Episodes > 0 && 2*r.InfraErrors > r.Episodes }

// request builds the run request.
func (in BatchInput) request() (*gauntletv1.RunRequested, error) {
	st := StageSpec{Env: in.Env, Policies: in.Policies, Profiles: in.Profiles, MaxSteps: in.MaxSteps, PolicyEndpoint: in.PolicyEndpoint}
	req, err := st.runRequest(in.RunID, in.Seed, in.Episodes, in.MaxInFlight, in.RequestedAtUnixNano)
	if err != nil {
		return nil, err
	}
	spec, err := in.rewardSpec()
	if err != nil {
		return nil, err
	}
	req.ParamsJson = in.ParamsJSON
	if req.ParamsJson == "" {
		req.ParamsJson = "{}"
	}
	req.Label = in.Label
	o := in.Origin
	req.Origin = &gauntletv1.RunOrigin{
		SubmittedBy: o.SubmittedBy, DriftText: in.DriftText, RewardSpec: scoring.SpecFor(in.Env).Version,
		CurriculumId: o.CurriculumID, CurriculumName: o.CurriculumName, CurriculumPrefix: o.CurriculumPrefix,
		Stage: uint32(o.Stage), StageName: o.StageName, Batch: uint32(o.Batch),
	}
	if spec != nil {
		req.RewardSpec, req.Origin.RewardSpec = spec.Digest, spec.Version
	}
	req.Drift = rampsToDrift(in.Ramps, in.Episodes)
	if in.DriftText != "" {
		more, err := plans.ParseDrift(in.DriftText, time.Unix(0, in.RequestedAtUnixNano))
		if err != nil {
			return nil, err
		}
		req.Drift = append(req.Drift, more...)
	}
	if err := runs.Validate(req); err != nil {
		return nil, err
	}
	return req, nil
}

// rewardSpec is the batch's reward spec, parsed; nil for the default.
func (in BatchInput) rewardSpec() (*scoring.Spec, error) {
	if in.RewardSpec == "" {
		return nil, nil
	}
	spec, err := scoring.Parse("reward_spec", []byte(in.RewardSpec))
	if err != nil {
		return nil, err
	}
	return &spec, nil
}

// Error types of non-retryable activity and workflow failures.
const (
	ErrTypeInvalidSpec = "InvalidSpec"
	ErrTypeRunRefused  = "RunRefused"
)

// batchPoll is how often RunBatch reads the run's state besides watching it.
const batchPoll = time.Second

// RunBatch submits the batch's run to the scheduler over NATS (as `gauntlet run` does),
// waits until every episode ended, heartbeating its progress, and returns the run's
// statistics. It submits only when the scheduler does not know the run yet, and the
// submission's message id is the run id, so neither a retry nor a restarted worker runs an
// episode twice.
func (a *Activities) RunBatch(ctx context.Context, in BatchInput) (BatchResult, error) {
	req, err := in.request()
	if err != nil {
		return BatchResult{}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("batch %s: %v", in.RunID, err), ErrTypeInvalidSpec, err)
	}
	req.Origin.GauntletVersion = a.Version
	t0 := time.Now()
	b := a.Bus()
	if b == nil {
		return BatchResult{}, errors.New("batch: not connected to NATS yet")
	}
	kv, err := b.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		return BatchResult{}, fmt.Errorf("batch %s: open run state: %w", in.RunID, err)
	}
	// Watch the run's state: the scheduler rewrites it as episodes end, and the watch
	// tells the moment the run is done (no polling delay between batches).
	w, err := kv.Watch(ctx, in.RunID)
	if err != nil {
		return BatchResult{}, fmt.Errorf("batch %s: watch run state: %w", in.RunID, err)
	}
	defer w.Stop()
	p, err := runProgress(ctx, kv, in.RunID)
	if err != nil {
		return BatchResult{}, err
	}
	if p == nil {
		// The spec first, so no step of the run names a spec the reward service cannot read.
		if spec, _ := in.rewardSpec(); spec != nil {
			if err := rewardspecs.NewClient(b.JS).Put(ctx, *spec); err != nil {
				return BatchResult{}, fmt.Errorf("batch %s: %w", in.RunID, err)
			}
		}
		if err := b.PublishCommand(ctx, bus.SubjectRun, req.RunId+"/run", req); err != nil {
			return BatchResult{}, fmt.Errorf("batch %s: submit: %w", in.RunID, err)
		}
	}
	// A slow poll backs the watch up (a watch recreates its consumer after a NATS
	// reconnect and may miss nothing but take a while).
	poll := time.NewTicker(batchPoll)
	defer poll.Stop()
	for {
		if p != nil {
			activity.RecordHeartbeat(ctx, batchHeartbeat(in, p))
			if p.GetError() != "" {
				return BatchResult{}, temporal.NewNonRetryableApplicationError(
					fmt.Sprintf("batch %s refused by the scheduler: %s", in.RunID, p.GetError()), ErrTypeRunRefused, nil)
			}
			if p.GetDone() {
				return BatchResult{
					RunID: in.RunID, Episodes: p.GetEnded(), Succeeded: p.GetSucceeded(),
					InfraErrors: p.GetInfraErrors(), InfraByKind: InfraKinds(p.GetInfraByKind()), Steps: p.GetSteps(), FaultsFired: p.GetFaultsFired(),
					RewardSum: p.GetRewardSum(), WallNs: int64(time.Since(t0)),
				}, nil
			}
		} else {
			activity.RecordHeartbeat(ctx, BatchHeartbeat{RunID: in.RunID, Episodes: in.Episodes})
		}
		select {
		case <-ctx.Done():
			return BatchResult{}, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return BatchResult{}, fmt.Errorf("batch %s: run state watch closed", in.RunID)
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue // the end of the initial values, or a delete
			}
			np, err := gauntletv1.DecodeRunProgress(e.Value())
			if err != nil {
				return BatchResult{}, fmt.Errorf("batch %s: %w", in.RunID, err)
			}
			p = np
		case <-poll.C:
			if p, err = runProgress(ctx, kv, in.RunID); err != nil {
				return BatchResult{}, err
			}
		}
	}
}

// runProgress reads a run's progress from the scheduler's KV bucket; nil when the
// scheduler has not accepted the run yet.
func runProgress(ctx context.Context, kv jetstream.KeyValue, runID string) (*gauntletv1.RunProgress, error) {
	e, err := kv.Get(ctx, runID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("batch %s: read run state: %w", runID, err)
	}
	p, err := gauntletv1.DecodeRunProgress(e.Value())
	if err != nil {
		return nil, fmt.Errorf("batch %s: %w", runID, err)
	}
	return p, nil
}

// BatchHeartbeatTimeout is how long Temporal waits for a RunBatch heartbeat before it
// gives the batch to another worker.
const BatchHeartbeatTimeout = 5 * time.Second

// BatchHeartbeat is what RunBatch heartbeats: the run's progress as the scheduler last
// wrote it, so that `gauntlet curriculum status` can tell what a stalled batch waits for
// (Temporal keeps the last heartbeat of the pending activity).
type BatchHeartbeat struct {
	RunID    string `json:"run_id"`
	Episodes uint64 `json:"episodes"`
	Assigned uint64 `json:"assigned"`
	Ended    uint64 `json:"ended"`
	// UpdatedAtUnixNano is when the scheduler last changed the run's state (accepted it,
	// assigned or ended an episode); 0 before it accepted the run.
	UpdatedAtUnixNano int64 `json:"updated_at_unix_nano,omitempty"`
}

func batchHeartbeat(in BatchInput, p *gauntletv1.RunProgress) BatchHeartbeat {
	// A run state written by an older scheduler may carry no update time until its first
	// progress tick; its acceptance time stands in (non-zero once the run is accepted).
	updated := p.GetUpdatedAtUnixNano()
	if updated == 0 {
		updated = p.GetStartedAtUnixNano()
	}
	return BatchHeartbeat{
		RunID: in.RunID, Episodes: in.Episodes, Assigned: p.GetAssigned(), Ended: p.GetEnded(),
		UpdatedAtUnixNano: updated,
	}
}

// batchActivityOptions are the options of RunBatch: heartbeats let a dead worker's batch
// move to another worker within seconds; the run itself goes on in the scheduler
// meanwhile, and the retry only waits for it.
func batchActivityOptions(ctx workflow.Context) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 30 * 24 * time.Hour,
		HeartbeatTimeout:    BatchHeartbeatTimeout,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval:        200 * time.Millisecond,
			BackoffCoefficient:     2,
			MaximumInterval:        10 * time.Second,
			NonRetryableErrorTypes: []string{ErrTypeInvalidSpec, ErrTypeRunRefused},
		},
	})
}

// BatchSpec is the input of the Batch workflow: N episodes of one stage-like spec.
type BatchSpec struct {
	Env         string         `json:"env"`
	Params      map[string]any `json:"params,omitempty"`
	Policies    string         `json:"policies"`
	Profiles    string         `json:"profiles,omitempty"`
	Episodes    uint64         `json:"episodes"`
	Seed        uint64         `json:"seed,omitempty"`
	MaxInFlight uint32         `json:"max_in_flight,omitempty"`
	MaxSteps    uint32         `json:"max_steps,omitempty"`
	Label       string         `json:"label,omitempty"`
	// Drift is fault drift in `gauntlet run --drift` form.
	Drift string `json:"drift,omitempty"`
	// RewardSpec is the text of the reward spec file the batch is scored under (empty: the
	// built-in default/1).
	RewardSpec string `json:"reward_spec,omitempty"`
	// PolicyEndpoint is the model endpoint of the batch's "http" policy; required when
	// its policies name it (`gauntlet batch start --policy.http.url`).
	PolicyEndpoint *EndpointSpec `json:"policy_endpoint,omitempty"`
}

// Batch runs spec.Episodes episodes of one spec through the scheduler and returns their
// statistics. The run id derives from the workflow's id and first run id, so the batch is
// one run however often its activity is retried. The input is a BatchSpec as JSON, read
// strictly (ParseBatchSpecJSON): started with the temporal CLI, a misspelt key is refused,
// not dropped.
func Batch(ctx workflow.Context, input json.RawMessage) (BatchResult, error) {
	spec, err := ParseBatchSpecJSON(input)
	if err != nil {
		return BatchResult{}, temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeInvalidSpec, nil)
	}
	st := StageSpec{Env: spec.Env, Params: spec.Params, Policies: spec.Policies, Profiles: spec.Profiles, MaxSteps: spec.MaxSteps}
	if st.Profiles == "" {
		st.Profiles = "baseline=1"
	}
	if spec.MaxInFlight == 0 {
		spec.MaxInFlight = runs.DefaultMaxInFlight
	}
	params, err := st.ParamsJSON()
	if err != nil {
		return BatchResult{}, temporal.NewNonRetryableApplicationError("params: "+err.Error(), ErrTypeInvalidSpec, nil)
	}
	in := BatchInput{
		RunID: runPrefix(ctx, "b") + "-b0", Env: spec.Env, ParamsJSON: params, Policies: spec.Policies,
		Profiles: st.Profiles, Episodes: spec.Episodes, Seed: spec.Seed, MaxInFlight: spec.MaxInFlight,
		MaxSteps: spec.MaxSteps, Label: spec.Label, DriftText: spec.Drift, RewardSpec: spec.RewardSpec,
		PolicyEndpoint: spec.PolicyEndpoint, RequestedAtUnixNano: workflow.Now(ctx).UnixNano(),
	}
	if in.Label == "" {
		in.Label = "batch " + workflow.GetInfo(ctx).WorkflowExecution.ID
	}
	in.Origin.SubmittedBy = submittedBy(ctx)
	if _, err := in.request(); err != nil {
		return BatchResult{}, temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeInvalidSpec, nil)
	}
	var res BatchResult
	err = workflow.ExecuteActivity(batchActivityOptions(ctx), ActivityRunBatch, in).Get(ctx, &res)
	return res, err
}

// ParseBatchSpecJSON reads a Batch workflow's input, refusing unknown keys.
func ParseBatchSpecJSON(b []byte) (BatchSpec, error) { return decodeInput[BatchSpec]("batch", b) }

// MemoSubmittedBy is the memo field in which `gauntlet curriculum start` and `gauntlet
// batch start` record who started the workflow; its runs carry it into the runs table.
const MemoSubmittedBy = "submitted_by"

// submittedBy is who started the workflow, from its memo; "temporal" when it was
// started without one (the temporal CLI, another SDK). The memo is part of the
// workflow's start event, so replays read the same value.
func submittedBy(ctx workflow.Context) string {
	if m := workflow.GetInfo(ctx).Memo; m != nil {
		if p, ok := m.GetFields()[MemoSubmittedBy]; ok {
			var s string
			if err := converter.GetDefaultDataConverter().FromPayload(p, &s); err == nil && s != "" {
				return s
			}
		}
	}
	return "temporal"
}
