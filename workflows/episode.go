package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/errkind"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/templates"
	"github.com/gauntlet-rl/gauntlet/pkg/play"
	"github.com/gauntlet-rl/gauntlet/pkg/rewardspecs"
	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// EpisodeSpec is the input of the DurableEpisode workflow: one episode of an env.
type EpisodeSpec struct {
	Env      string         `json:"env"`
	Params   map[string]any `json:"params,omitempty"`
	Policy   string         `json:"policy"`
	Profile  string         `json:"profile,omitempty"` // fault profile (default baseline)
	Seed     uint64         `json:"seed,omitempty"`
	MaxSteps uint32         `json:"max_steps,omitempty"`
	// HeartbeatTimeout is how long a silent worker keeps the episode before another
	// worker resumes it (default 10 s).
	HeartbeatTimeout time.Duration `json:"heartbeat_timeout,omitempty"`
	// RewardSpec is the text of the reward spec file the episode's steps are scored under
	// (docs/rewards.md), as a batch's: PlayEpisode puts it in the gauntlet_reward_specs
	// bucket before the first step, and the episode names it by digest.
	RewardSpec string `json:"reward_spec,omitempty"`
	// RewardSpecDigest names the spec by its digest instead, for a file already in the
	// bucket (put there by `gauntlet run --reward-spec`, a batch, or whoever starts the
	// workflow). With RewardSpec too, it must be that file's digest. Neither: the env's
	// built-in default spec.
	RewardSpecDigest string `json:"reward_spec_digest,omitempty"`
}

// PlayInput is the PlayEpisode activity's input: the episode's request as the scheduler
// would derive it, and its fault profile.
type PlayInput struct {
	Run *RunRef `json:"run"`
}

// RunRef is the one-episode run a durable episode belongs to.
type RunRef struct {
	RunID       string `json:"run_id"`
	Env         string `json:"env"`
	ParamsJSON  string `json:"params_json"`
	Policy      string `json:"policy"`
	Profile     string `json:"profile"`
	Seed        uint64 `json:"seed"`
	MaxSteps    uint32 `json:"max_steps"`
	RequestedAt int64  `json:"requested_at_unix_nano"`
	// RewardSpec is the digest of the spec the episode is scored under (empty: the env's
	// default); RewardSpecText, when not empty, its file, which PlayEpisode puts in the
	// bucket.
	RewardSpec     string `json:"reward_spec,omitempty"`
	RewardSpecText string `json:"reward_spec_text,omitempty"`
}

func (r RunRef) request() (*gauntletv1.RunRequested, error) {
	req := &gauntletv1.RunRequested{
		RunId: r.RunID, Env: r.Env, ParamsJson: r.ParamsJSON,
		Policies: []*gauntletv1.Share{{Name: r.Policy, Weight: 1}},
		Profiles: []*gauntletv1.Share{{Name: r.Profile, Weight: 1}},
		Episodes: 1, Seed: r.Seed, MaxInFlight: 1, MaxSteps: r.MaxSteps, RequestedAtUnixNano: r.RequestedAt,
		RewardSpec: r.RewardSpec,
	}
	if err := runs.Validate(req); err != nil {
		return nil, err
	}
	if _, err := r.rewardSpec(); err != nil {
		return nil, err
	}
	return req, nil
}

// rewardSpec is the episode's spec file parsed, checked against the digest it is named
// by; nil when the episode names none or only a digest.
func (r RunRef) rewardSpec() (*scoring.Spec, error) {
	if r.RewardSpecText == "" {
		return nil, nil
	}
	spec, err := scoring.Parse("reward_spec", []byte(r.RewardSpecText))
	if err != nil {
		return nil, err
	}
	if spec.Digest != r.RewardSpec {
		return nil, fmt.Errorf("reward_spec_digest: %s is not the digest of reward_spec (%s)", r.RewardSpec, spec.Digest)
	}
	return &spec, nil
}

// rewardSpecRef names the spec of an episode of spec by digest, with its file when the
// input has it.
func rewardSpecRef(spec EpisodeSpec) (digest, text string, err error) {
	if d := spec.RewardSpecDigest; d != "" && !runs.IsSpecDigest(d) {
		return "", "", fmt.Errorf("reward_spec_digest: %s is not a spec digest (sha256: and 64 hex digits)", quote(d))
	}
	if spec.RewardSpec == "" {
		return spec.RewardSpecDigest, "", nil
	}
	parsed, err := scoring.Parse("reward_spec", []byte(spec.RewardSpec))
	if err != nil {
		return "", "", err
	}
	if spec.RewardSpecDigest != "" && spec.RewardSpecDigest != parsed.Digest {
		return "", "", fmt.Errorf("reward_spec_digest: %s is not the digest of reward_spec (%s)", spec.RewardSpecDigest, parsed.Digest)
	}
	return parsed.Digest, spec.RewardSpec, nil
}

// EpisodeResult is what a durable episode reports.
type EpisodeResult struct {
	EpisodeID   string  `json:"episode_id"`
	Steps       uint32  `json:"steps"`
	Success     bool    `json:"success"`
	TotalReward float64 `json:"total_reward"`
	FaultsFired uint32  `json:"faults_fired"`
	Reason      string  `json:"reason"`
	// Attempt is the activity attempt that finished the episode; ResumedAt the step it
	// resumed from (0: it ran from the start).
	Attempt   int32  `json:"attempt"`
	ResumedAt uint32 `json:"resumed_at"`
}

// EpisodeCheckpoint is the PlayEpisode activity's heartbeat detail: every step below
// NextStep is in the event stream.
type EpisodeCheckpoint struct {
	NextStep    uint32  `json:"next_step"`
	TotalReward float64 `json:"total_reward"`
	FaultsFired uint32  `json:"faults_fired"`
	// RewardState is the scoring state of the episode's named spec after step
	// NextStep-1 (gauntletv1.RewardState, encoded), as that step's score left it; empty
	// under the env's default spec. A retry scores its steps from NextStep on from this
	// state, not from the one its re-executed steps give: a spec may read what differs
	// from one execution to the next (wall and CPU time), and the recorded steps are
	// what the later scores must follow from.
	RewardState []byte `json:"reward_state,omitempty"`
}

// DurableEpisode runs one episode as a workflow whose step loop is the heartbeating
// PlayEpisode activity. When the worker running it dies, the activity times out on its
// heartbeat and is retried, on any worker, from the last step its heartbeat recorded:
// earlier steps are re-executed silently to rebuild the world (episodes are
// deterministic), later ones are published as new. Steps published twice (after the last
// heartbeat, before the death) carry the same message ids, so the stream and the store
// keep one of each.
//
// The input is an EpisodeSpec as JSON, read strictly (ParseEpisodeSpecJSON). Under a
// named reward spec the scoring state of the spec goes with the checkpoint
// (EpisodeCheckpoint.RewardState), so a resumed episode scores as one played through.
func DurableEpisode(ctx workflow.Context, input json.RawMessage) (EpisodeResult, error) {
	spec, err := ParseEpisodeSpecJSON(input)
	if err != nil {
		return EpisodeResult{}, temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeInvalidSpec, nil)
	}
	st := StageSpec{Params: spec.Params}
	params, err := st.ParamsJSON()
	if err != nil {
		return EpisodeResult{}, temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeInvalidSpec, nil)
	}
	ref := RunRef{
		RunID: runPrefix(ctx, "d"), Env: spec.Env, ParamsJSON: params, Policy: spec.Policy,
		Profile: spec.Profile, Seed: spec.Seed, MaxSteps: spec.MaxSteps, RequestedAt: workflow.Now(ctx).UnixNano(),
	}
	if ref.Profile == "" {
		ref.Profile = "baseline"
	}
	if ref.RewardSpec, ref.RewardSpecText, err = rewardSpecRef(spec); err != nil {
		return EpisodeResult{}, temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeInvalidSpec, nil)
	}
	if _, err := ref.request(); err != nil {
		return EpisodeResult{}, temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeInvalidSpec, nil)
	}
	hb := spec.HeartbeatTimeout
	if hb <= 0 {
		hb = 10 * time.Second
	}
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 7 * 24 * time.Hour,
		HeartbeatTimeout:    hb,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: 100 * time.Millisecond, BackoffCoefficient: 2, MaximumInterval: 5 * time.Second,
			NonRetryableErrorTypes: []string{ErrTypeInvalidSpec, ErrTypeNotFound},
		},
	})
	var res EpisodeResult
	err = workflow.ExecuteActivity(actx, ActivityPlayEpisode, PlayInput{Run: &ref}).Get(ctx, &res)
	return res, err
}

// ParseEpisodeSpecJSON reads a durable episode's input, refusing unknown keys: a
// misspelt key would otherwise be dropped without a word (reward_spec_digset, and the
// episode scored under the default spec).
func ParseEpisodeSpecJSON(b []byte) (EpisodeSpec, error) {
	return decodeInput[EpisodeSpec]("durable episode", b)
}

// PlayEpisode plays a durable episode's steps, publishing each step's event and waiting
// for the stream's ack before recording the step in its heartbeat. On a retry it resumes
// after the last recorded step.
func (a *Activities) PlayEpisode(ctx context.Context, in PlayInput) (EpisodeResult, error) {
	if in.Run == nil {
		return EpisodeResult{}, temporal.NewNonRetryableApplicationError("play episode: no run", ErrTypeInvalidSpec, nil)
	}
	req, err := in.Run.request()
	if err != nil {
		return EpisodeResult{}, temporal.NewNonRetryableApplicationError("play episode: "+err.Error(), ErrTypeInvalidSpec, nil)
	}
	b := a.Bus()
	if b == nil {
		return EpisodeResult{}, errors.New("play episode: not connected to NATS yet")
	}
	info := activity.GetInfo(ctx)
	var cp EpisodeCheckpoint
	if activity.HasHeartbeatDetails(ctx) {
		if err := activity.GetHeartbeatDetails(ctx, &cp); err != nil {
			return EpisodeResult{}, fmt.Errorf("play episode: read checkpoint: %w", err)
		}
	}
	ep := runs.Episode(req, 0)
	// The state goes to the reward service as it is; a checkpoint whose state does not
	// decode fails the attempt here rather than its first re-scored step.
	var restore gauntletv1.RewardState
	if err := restore.DecodeReusing(cp.RewardState); err != nil {
		return EpisodeResult{}, fmt.Errorf("play episode %s: read checkpoint's reward state: %w", ep.EpisodeId, err)
	}
	// The spec first, so no step names a spec the reward service cannot read.
	if spec, _ := in.Run.rewardSpec(); spec != nil {
		if err := rewardspecs.NewClient(b.JS).Put(ctx, *spec); err != nil {
			return EpisodeResult{}, fmt.Errorf("play episode %s: %w", ep.EpisodeId, err)
		}
	}
	var plans gauntletv1.PlanReply
	if err := b.Request(ctx, bus.SubjectPlan, &gauntletv1.PlanRequest{Episodes: []*gauntletv1.EpisodeRequested{ep}, Profiles: req.Profiles}, &plans); err != nil {
		return EpisodeResult{}, fmt.Errorf("play episode %s: plan: %w", ep.EpisodeId, err)
	}
	perr := errkind.FromReply(plans.Error, plans.ErrorKind)
	if perr == nil && len(plans.Plans) != 1 {
		perr = errkind.E(errkind.Internal, fmt.Errorf("faults service returned %d plans for 1 episode", len(plans.Plans)))
	}
	if perr != nil {
		return EpisodeResult{}, activityError(fmt.Sprintf("play episode %s: faults service cannot plan it", ep.EpisodeId), perr)
	}
	plan := plans.Plans[0]
	out := &durableOut{bus: b, from: cp.NextStep, afterStep: a.AfterStep, episodeID: ep.EpisodeId, last: cp,
		total: cp.TotalReward, restore: cp.RewardState}
	sess := play.NewSession(&gauntletv1.EpisodeAssigned{Episode: ep, Plan: plan}, a.WorkerID, requestScorer{b}, out)
	defer func() { _ = sess.Close() }()
	out.scoring = sess.Scoring()
	deps := a.Play
	if deps.Templates == nil {
		// The bus is known only now; a plan of a user-defined profile finds its template.
		deps.Templates = templates.NewClient(b.JS)
	}
	e, err := sess.Prepare(ctx, deps)
	var agent env.Agent
	if err == nil {
		agent, err = deps.NewAgent(e, ep)
	}
	if err != nil {
		return EpisodeResult{}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("play episode %s: %v", ep.EpisodeId, err), ErrTypeInvalidSpec, nil)
	}
	obs, err := sess.Reset(ctx, uint32(info.Attempt))
	if err != nil {
		return EpisodeResult{}, fmt.Errorf("play episode %s: %w", ep.EpisodeId, err)
	}
	if err := sess.Run(ctx, agent, env.Turn{Observation: obs}); err != nil {
		if errors.Is(err, play.ErrAbandoned) {
			return EpisodeResult{}, ctx.Err()
		}
		if k := errkind.Of(err); k == errkind.NotFound || k == errkind.Invalid {
			// No retry can score it (a spec the bucket does not hold): the episode ends
			// as an infra error with the reason, as a worker's does, never with scores
			// of another spec.
			if ferr := sess.FinishInfra(ctx, err); ferr != nil {
				return EpisodeResult{}, fmt.Errorf("play episode %s: record its end (%v): %w", ep.EpisodeId, err, ferr)
			}
			return EpisodeResult{}, activityError("play episode "+ep.EpisodeId+": ended as an infra error", err)
		}
		return EpisodeResult{}, err
	}
	if err := sess.Finish(ctx); err != nil {
		return EpisodeResult{}, err
	}
	ended := sess.Ended
	res := EpisodeResult{EpisodeID: ep.EpisodeId, Attempt: info.Attempt, ResumedAt: cp.NextStep}
	res.Steps, res.Success, res.TotalReward, res.FaultsFired, res.Reason =
		ended.Steps, ended.Success, ended.TotalReward, ended.FaultsFired, ended.Reason.String()
	return res, nil
}

// durableOut is a durable episode's output (play.Output): the start and each step are
// published as events of their own, each acked by the stream before the step is recorded
// in the activity's heartbeat. Steps below from were published by an earlier attempt and
// are only replayed (the episode is deterministic), to rebuild the world.
type durableOut struct {
	bus       *bus.Bus
	from      uint32
	afterStep func(ctx context.Context, episodeID string, step uint32)
	episodeID string
	// Running totals for the heartbeat: total is the recorded steps' reward sum (the
	// checkpoint's, then each step published), fired counts every step's faults,
	// replayed or not (a plan fires the same faults on every execution).
	total float64
	fired uint32
	// last is the checkpoint last recorded in the heartbeat.
	last EpisodeCheckpoint
	// scoring is the session's named spec and state (nil under the default spec);
	// restore the state the checkpoint recorded after step from-1, which replaces the
	// re-executed one once that step is replayed.
	scoring *play.EpisodeScoring
	restore []byte
	// prev is the scoring state before the step being output (the one the step before
	// left); a step the stream holds already is scored again from it (realign).
	prev []byte
}

// publish publishes one event. While the events stream has no room the publish waits
// (back-pressure), heartbeating the last checkpoint so the wait does not look like a
// dead worker and start another attempt. dup, when not nil, is set to the sequence of
// the copy the stream keeps when it holds the event already (0: it did not).
func (o *durableOut) publish(ctx context.Context, ev *gauntletv1.Event, dup *uint64) error {
	p := bus.Patience{Waiting: func() { activity.RecordHeartbeat(ctx, o.last) }}
	if dup != nil {
		p.Duplicate = func(seq uint64) { *dup = seq }
	}
	return o.bus.PublishEventWith(ctx, ev, p)
}

// Start publishes the start, unless an earlier attempt did.
func (o *durableOut) Start(ctx context.Context, st *gauntletv1.EpisodeStarted) error {
	if o.from > 0 {
		return nil
	}
	return o.publish(ctx, &gauntletv1.Event{Body: &gauntletv1.Event_Started{Started: st}}, nil)
}

// Step publishes one step and records it in the heartbeat.
func (o *durableOut) Step(ctx context.Context, st *gauntletv1.StepTaken) error {
	o.fired += uint32(len(st.Faults))
	if st.Step < o.from {
		if st.Step+1 == o.from && o.scoring != nil {
			o.scoring.State = o.restore
		}
		o.keepPrev()
		return nil
	}
	// One step per event: the message id <episode>/steps/<n>-<n> is the same whichever
	// attempt publishes it.
	var dup uint64
	if err := o.publish(ctx, &gauntletv1.Event{Body: &gauntletv1.Event_Steps{Steps: &gauntletv1.StepsTaken{Steps: []*gauntletv1.StepTaken{st}}}}, &dup); err != nil {
		return err
	}
	total := st.Score.GetTotal()
	if dup != 0 && o.scoring != nil {
		var err error
		if total, err = o.realign(ctx, dup, st); err != nil {
			return err
		}
	}
	o.total += total
	cp := EpisodeCheckpoint{NextStep: st.Step + 1, TotalReward: o.total, FaultsFired: o.fired}
	if o.scoring != nil {
		cp.RewardState = o.scoring.State
	}
	o.last = cp
	o.keepPrev()
	activity.RecordHeartbeat(ctx, o.last)
	if o.afterStep != nil {
		o.afterStep(ctx, o.episodeID, st.Step)
	}
	return nil
}

// keepPrev remembers the state the step just output left, the state before the next.
// Scores replace the state rather than write into it, so the slice is enough.
func (o *durableOut) keepPrev() {
	if o.scoring != nil {
		o.prev = o.scoring.State
	}
}

// realign follows the copy of step st that the stream keeps, at sequence seq: an earlier
// attempt published it after its last checkpoint reached Temporal, and died. The stream
// (and so the store) keeps that copy, not this attempt's, and what a spec reads of the
// host (the policy's think time, CPU time) differs between the two; so the episode's
// state is the one scoring that copy from the state before it gives, and the episode's
// total counts that copy's score, which realign returns. Without the copy (trimmed from
// the stream already) the step stays as this attempt scored it.
func (o *durableOut) realign(ctx context.Context, seq uint64, st *gauntletv1.StepTaken) (float64, error) {
	own := st.Score.GetTotal()
	stream, err := o.bus.JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		return 0, fmt.Errorf("step %d of %s: read the copy the stream keeps: %w", st.Step, o.episodeID, err)
	}
	msg, err := stream.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return own, nil
	}
	if err != nil {
		return 0, fmt.Errorf("step %d of %s: read the copy the stream keeps: %w", st.Step, o.episodeID, err)
	}
	var ev gauntletv1.Event
	if err := gauntletv1.Unmarshal(msg.Data, &ev); err != nil {
		return 0, fmt.Errorf("step %d of %s: decode the copy the stream keeps: %w", st.Step, o.episodeID, err)
	}
	seg := ev.GetSteps()
	if len(seg.GetSteps()) != 1 || seg.Steps[0].GetEpisodeId() != st.EpisodeId || seg.Steps[0].GetStep() != st.Step {
		return 0, fmt.Errorf("step %d of %s: the stream's message %d is not that step", st.Step, o.episodeID, seq)
	}
	kept := seg.Steps[0]
	sc, err := seg.ScoreOf(kept)
	if err != nil {
		return 0, fmt.Errorf("step %d of %s: the copy the stream keeps: %w", st.Step, o.episodeID, err)
	}
	named := &play.EpisodeScoring{Spec: o.scoring.Spec, State: o.prev}
	if _, err := (requestScorer{o.bus}).Score(ctx, kept, named, nil); err != nil {
		return 0, err
	}
	o.scoring.State = named.State
	return sc.Total, nil
}

// Flush has nothing to do: every step is published as it comes.
func (o *durableOut) Flush() error { return nil }

// End publishes the end. Its total is the recorded steps' sum, taken in step order as
// the session takes it: the steps an earlier attempt recorded count with the scores
// they were recorded with, not those of their re-execution.
func (o *durableOut) End(ctx context.Context, e *gauntletv1.EpisodeEnded) error {
	if !e.InfraError {
		e.TotalReward = o.total
	}
	return o.publish(ctx, &gauntletv1.Event{Body: &gauntletv1.Event_Ended{Ended: e}}, nil)
}

// requestScorer asks the reward service for each step's score, one request per step
// (scoring is a pure function of the step, so re-scoring a replayed step gives what the
// first attempt got). A step of a named spec carries its action, which a repeat
// detector reads, and the kind of a fault that answered its call
// (scoring.AnsweredFaults), which a detector holding under faults reads: a durable
// episode's steps are few and slow, so it does not leave them out as a worker's batching
// scorer does for specs that read neither.
type requestScorer struct{ bus *bus.Bus }

// Score implements play.StepScorer.
func (r requestScorer) Score(ctx context.Context, st *gauntletv1.StepTaken, named *play.EpisodeScoring, _ chan play.ScoreResult) (*gauntletv1.StepScored, error) {
	req := &gauntletv1.ScoreRequest{Steps: []*gauntletv1.StepTaken{{
		EpisodeId: st.EpisodeId, Step: st.Step, Env: st.Env, Signals: st.Signals, Metering: st.Metering,
	}}}
	if named != nil {
		req.Steps[0].RewardSpec, req.Steps[0].Terminated, req.Steps[0].Action = named.Spec, st.Terminated, st.Action
		req.Steps[0].Faults = scoring.AnsweredFaults(st.Faults)
		req.EncodedStates = [][]byte{named.State}
	}
	var reply gauntletv1.ScoreReply
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := r.bus.Request(rctx, bus.SubjectScore, req, &reply); err != nil {
		return nil, fmt.Errorf("score step %d of %s: %w", st.Step, st.EpisodeId, err)
	}
	if reply.Error != "" {
		// With its kind: a spec the bucket does not hold is not worth a retry.
		return nil, fmt.Errorf("score step %d of %s: reward service: %w", st.Step, st.EpisodeId, errkind.FromReply(reply.Error, reply.ErrorKind))
	}
	scores, err := reply.StepScores(req.Steps)
	if err != nil {
		return nil, fmt.Errorf("score step %d of %s: %w", st.Step, st.EpisodeId, err)
	}
	if named != nil {
		states := reply.GetTable().GetEncodedStates()
		if len(states) != 1 {
			return nil, fmt.Errorf("score step %d of %s: reward service returned %d encoded states for 1 step", st.Step, st.EpisodeId, len(states))
		}
		named.State = states[0]
	}
	return scores[0], nil
}
