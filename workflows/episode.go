package workflows

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/errkind"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/templates"
	"github.com/gauntlet-rl/gauntlet/pkg/play"
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
}

func (r RunRef) request() (*gauntletv1.RunRequested, error) {
	req := &gauntletv1.RunRequested{
		RunId: r.RunID, Env: r.Env, ParamsJson: r.ParamsJSON,
		Policies: []*gauntletv1.Share{{Name: r.Policy, Weight: 1}},
		Profiles: []*gauntletv1.Share{{Name: r.Profile, Weight: 1}},
		Episodes: 1, Seed: r.Seed, MaxInFlight: 1, MaxSteps: r.MaxSteps, RequestedAtUnixNano: r.RequestedAt,
	}
	if err := runs.Validate(req); err != nil {
		return nil, err
	}
	return req, nil
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
}

// DurableEpisode runs one episode as a workflow whose step loop is the heartbeating
// PlayEpisode activity. When the worker running it dies, the activity times out on its
// heartbeat and is retried, on any worker, from the last step its heartbeat recorded:
// earlier steps are re-executed silently to rebuild the world (episodes are
// deterministic), later ones are published as new. Steps published twice (after the last
// heartbeat, before the death) carry the same message ids, so the stream and the store
// keep one of each.
func DurableEpisode(ctx workflow.Context, spec EpisodeSpec) (EpisodeResult, error) {
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
			NonRetryableErrorTypes: []string{ErrTypeInvalidSpec},
		},
	})
	var res EpisodeResult
	err = workflow.ExecuteActivity(actx, ActivityPlayEpisode, PlayInput{Run: &ref}).Get(ctx, &res)
	return res, err
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
	out := &durableOut{bus: b, from: cp.NextStep, afterStep: a.AfterStep, episodeID: ep.EpisodeId, last: cp}
	sess := play.NewSession(&gauntletv1.EpisodeAssigned{Episode: ep, Plan: plan}, a.WorkerID, requestScorer{b}, out)
	defer func() { _ = sess.Close() }()
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
	// Running totals for the heartbeat, over every step, replayed or not.
	total float64
	fired uint32
	// last is the checkpoint last recorded in the heartbeat.
	last EpisodeCheckpoint
}

// publish publishes one event. While the events stream has no room the publish waits
// (back-pressure), heartbeating the last checkpoint so the wait does not look like a
// dead worker and start another attempt.
func (o *durableOut) publish(ctx context.Context, ev *gauntletv1.Event) error {
	return o.bus.PublishEventWith(ctx, ev, bus.Patience{Waiting: func() { activity.RecordHeartbeat(ctx, o.last) }})
}

// Start publishes the start, unless an earlier attempt did.
func (o *durableOut) Start(ctx context.Context, st *gauntletv1.EpisodeStarted) error {
	if o.from > 0 {
		return nil
	}
	return o.publish(ctx, &gauntletv1.Event{Body: &gauntletv1.Event_Started{Started: st}})
}

// Step publishes one step and records it in the heartbeat.
func (o *durableOut) Step(ctx context.Context, st *gauntletv1.StepTaken) error {
	o.total += st.Score.GetTotal()
	o.fired += uint32(len(st.Faults))
	if st.Step < o.from {
		return nil
	}
	// One step per event: the message id <episode>/steps/<n>-<n> is the same whichever
	// attempt publishes it.
	if err := o.publish(ctx, &gauntletv1.Event{Body: &gauntletv1.Event_Steps{Steps: &gauntletv1.StepsTaken{Steps: []*gauntletv1.StepTaken{st}}}}); err != nil {
		return err
	}
	o.last = EpisodeCheckpoint{NextStep: st.Step + 1, TotalReward: o.total, FaultsFired: o.fired}
	activity.RecordHeartbeat(ctx, o.last)
	if o.afterStep != nil {
		o.afterStep(ctx, o.episodeID, st.Step)
	}
	return nil
}

// Flush has nothing to do: every step is published as it comes.
func (o *durableOut) Flush() error { return nil }

// End publishes the end.
func (o *durableOut) End(ctx context.Context, e *gauntletv1.EpisodeEnded) error {
	return o.publish(ctx, &gauntletv1.Event{Body: &gauntletv1.Event_Ended{Ended: e}})
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
		req.States = []*gauntletv1.RewardState{named.State}
	}
	var reply gauntletv1.ScoreReply
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := r.bus.Request(rctx, bus.SubjectScore, req, &reply); err != nil {
		return nil, fmt.Errorf("score step %d of %s: %w", st.Step, st.EpisodeId, err)
	}
	scores, err := reply.StepScores(req.Steps)
	if err != nil {
		return nil, fmt.Errorf("score step %d of %s: %w", st.Step, st.EpisodeId, err)
	}
	if named != nil {
		states := reply.GetTable().GetStates()
		if len(states) != 1 {
			return nil, fmt.Errorf("score step %d of %s: reward service returned %d states for 1 step", st.Step, st.EpisodeId, len(states))
		}
		named.State = states[0]
	}
	return scores[0], nil
}
