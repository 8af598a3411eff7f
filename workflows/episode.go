package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/campaign"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/errkind"
	"github.com/gauntlet-rl/gauntlet/pkg/faults"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
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
	if err := campaign.Validate(req); err != nil {
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
	ep := campaign.Episode(req, 0)
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
	episode, agent, err := prepareEpisode(ep, plan)
	if err != nil {
		return EpisodeResult{}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("play episode %s: %v", ep.EpisodeId, err), ErrTypeInvalidSpec, nil)
	}
	obs, err := episode.Reset()
	if err != nil {
		return EpisodeResult{}, fmt.Errorf("play episode %s: reset: %w", ep.EpisodeId, err)
	}
	workerID := a.WorkerID
	startedAt := time.Now()
	if cp.NextStep == 0 {
		if err := b.PublishEvent(ctx, &gauntletv1.Event{Body: &gauntletv1.Event_Started{Started: &gauntletv1.EpisodeStarted{
			Episode: ep, WorkerId: workerID, StartedAtUnixNano: startedAt.UnixNano(),
			ObservationJson: string(obs), Attempt: uint32(info.Attempt),
		}}}); err != nil {
			return EpisodeResult{}, err
		}
	}
	ended := &gauntletv1.EpisodeEnded{
		Episode: ep, Profile: plan.GetProfile(), Plan: plan, WorkerId: workerID, StartedAtUnixNano: startedAt.UnixNano(),
	}
	res := EpisodeResult{EpisodeID: ep.EpisodeId, Attempt: info.Attempt, ResumedAt: cp.NextStep}
	turn := env.Turn{Observation: obs}
	for step := uint32(0); ; step++ {
		if err := ctx.Err(); err != nil {
			return EpisodeResult{}, err
		}
		act, sr, err := env.PlayStep(agent, episode, ep, turn)
		if err != nil {
			return EpisodeResult{}, err
		}
		ev := env.StepEvent(ep, plan.GetProfile(), workerID, step, act, sr, episode.Now())
		score, err := a.score(ctx, b, ev)
		if err != nil {
			return EpisodeResult{}, err
		}
		ev.Score = score
		env.CountStep(ended, step, sr, score.GetTotal())
		if step >= cp.NextStep {
			// One step per event: the message id <episode>/steps/<n>-<n> is the same
			// whichever attempt publishes it.
			if err := b.PublishEvent(ctx, &gauntletv1.Event{Body: &gauntletv1.Event_Steps{Steps: &gauntletv1.StepsTaken{Steps: []*gauntletv1.StepTaken{ev}}}}); err != nil {
				return EpisodeResult{}, err
			}
			activity.RecordHeartbeat(ctx, EpisodeCheckpoint{NextStep: step + 1, TotalReward: ended.TotalReward, FaultsFired: ended.FaultsFired})
			if a.AfterStep != nil {
				a.AfterStep(ctx, ep.EpisodeId, step)
			}
		}
		turn = env.Turn{Step: step + 1, Observation: sr.Observation, Reward: score.GetTotal()}
		if sr.Done() {
			break
		}
	}
	ended.VirtualTimeNs = int64(episode.Now())
	ended.EndedAtUnixNano = time.Now().UnixNano()
	if err := b.PublishEvent(ctx, &gauntletv1.Event{Body: &gauntletv1.Event_Ended{Ended: ended}}); err != nil {
		return EpisodeResult{}, err
	}
	res.Steps, res.Success, res.TotalReward, res.FaultsFired, res.Reason =
		ended.Steps, ended.Success, ended.TotalReward, ended.FaultsFired, ended.Reason.String()
	return res, nil
}

// score asks the reward service for one step's score (scoring is a pure function of the
// step, so re-scoring a replayed step gives what the first attempt got).
func (a *Activities) score(ctx context.Context, b *bus.Bus, st *gauntletv1.StepTaken) (*gauntletv1.StepScored, error) {
	req := &gauntletv1.ScoreRequest{Steps: []*gauntletv1.StepTaken{{
		EpisodeId: st.EpisodeId, Step: st.Step, Env: st.Env, Signals: st.Signals, Metering: st.Metering,
	}}}
	var reply gauntletv1.ScoreReply
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := b.Request(rctx, bus.SubjectScore, req, &reply); err != nil {
		return nil, fmt.Errorf("score step %d of %s: %w", st.Step, st.EpisodeId, err)
	}
	scores, err := reply.StepScores(req.Steps)
	if err != nil {
		return nil, fmt.Errorf("score step %d of %s: %w", st.Step, st.EpisodeId, err)
	}
	return scores[0], nil
}

// prepareEpisode builds the episode and its agent as a sandbox worker does.
func prepareEpisode(req *gauntletv1.EpisodeRequested, plan *gauntletv1.FaultPlan) (env.Episode, env.Agent, error) {
	e, err := env.Lookup(req.Env)
	if err != nil {
		return nil, nil, fmt.Errorf("env: %w", err)
	}
	// Curriculum stages name built-in profiles only, so a compact plan names no template.
	full, err := faults.Expand(plan, e.Spec().Services, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("fault plan: %w", err)
	}
	faults.Seal(plan, full) // the end records the digest of the plan played
	inj, err := faults.NewInjector(full)
	if err != nil {
		return nil, nil, fmt.Errorf("fault plan: %w", err)
	}
	episode, err := e.NewEpisode(env.Config{Seed: req.Seed, Params: json.RawMessage(req.ParamsJson), MaxSteps: req.MaxSteps, Faults: inj})
	if err != nil {
		return nil, nil, err
	}
	p, err := policy.Lookup(req.Policy)
	if err != nil {
		return nil, nil, fmt.Errorf("policy: %w", err)
	}
	agent, err := p.NewAgent(e, rng.Derive(req.Seed, "policy"))
	if err != nil {
		return nil, nil, fmt.Errorf("policy %s: %w", req.Policy, err)
	}
	return episode, agent, nil
}
