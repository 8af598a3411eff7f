package play

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/threats"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// ErrAbandoned marks an episode given up because its context ended (the process stopping).
var ErrAbandoned = errors.New("episode abandoned: context ended")

// Session is one episode being played: its env episode, where its steps are scored, where
// its events go, and the running totals of its EpisodeEnded.
type Session struct {
	// Req and Plan are what the episode was assigned.
	Req  *gauntletv1.EpisodeRequested
	Plan *gauntletv1.FaultPlan
	// Env is the episode's env, known after Prepare.
	Env env.Env
	// Ended accumulates the episode's end: steps, reward, faults; Finish records it.
	Ended *gauntletv1.EpisodeEnded

	workerID string
	profile  string // the plan's, read per step without touching the plan
	episode  env.Episode
	scorer   StepScorer
	named    *EpisodeScoring // the run's spec and the episode's state; nil under the default
	threats  *threats.Watcher
	out      Output
	step     uint32
	cut      uint64 // bytes left out of the recording (CutBytes)
	reply    chan ScoreResult
	done     bool
	// turnAt is when the agent got its turn: the reset's or the last step's end (zero
	// before the reset). The next step's policy time runs from it.
	turnAt time.Time
}

// NewSession allocates the session of an assigned episode, played by workerID (a worker
// id, the env API's id, "cli"), its steps scored by scorer and its events sent to out.
func NewSession(a *gauntletv1.EpisodeAssigned, workerID string, scorer StepScorer, out Output) *Session {
	return &Session{
		Req: a.Episode, Plan: a.Plan, workerID: workerID, profile: a.Plan.GetProfile(),
		scorer: scorer, out: out, named: NewEpisodeScoring(a.Episode),
		reply: make(chan ScoreResult, 1),
		Ended: &gauntletv1.EpisodeEnded{
			Episode: a.Episode, Profile: a.Plan.GetProfile(), Plan: a.Plan, WorkerId: workerID,
			StartedAtUnixNano: time.Now().UnixNano(),
		},
	}
}

// Prepare builds the env episode from the request and the fault plan (Deps.Prepare); Plan
// stays as assigned, compact, for the record. Its errors are the request's fault; Fail
// records them.
func (s *Session) Prepare(ctx context.Context, d Deps) (env.Env, error) {
	e, ep, err := d.Prepare(ctx, s.Req, s.Plan)
	if err != nil {
		return nil, err
	}
	s.Env, s.episode, s.threats = e, ep, d.Threats
	return e, nil
}

// Scoring is the spec the episode's run named and the episode's scoring state, which
// each step's score advances before the step goes to the output; nil under the env's
// default spec. An output may read the state (a durable episode keeps it with its
// checkpoint) and, while replaying steps it recorded before, set it back to what it
// recorded, so the steps after score as they would have then.
func (s *Session) Scoring() *EpisodeScoring { return s.named }

// Episode is the env episode, known after Prepare (nil after Close).
func (s *Session) Episode() env.Episode { return s.episode }

// Reset resets the prepared episode and records its start (attempt counts the deliveries
// of a worker's assignment, or a durable episode's activity attempts; 1 otherwise). Its
// errors are infra errors.
func (s *Session) Reset(ctx context.Context, attempt uint32) (json.RawMessage, error) {
	if s.episode == nil {
		return nil, errors.New("reset before prepare")
	}
	obs, err := s.episode.Reset()
	if err != nil {
		return nil, fmt.Errorf("reset %s: %w", s.Req.EpisodeId, err)
	}
	// The plan goes with the end (and into ClickHouse); the start stays small.
	first := []byte(obs)
	if len(first) > MaxFieldBytes {
		var cut int
		first, cut = cutValue(first, false)
		s.cut += uint64(cut)
	}
	if err := s.out.Start(ctx, &gauntletv1.EpisodeStarted{
		Episode: s.Req, WorkerId: s.workerID, StartedAtUnixNano: s.Ended.StartedAtUnixNano,
		ObservationJson: string(first), Attempt: attempt,
	}); err != nil {
		return nil, err
	}
	s.turnAt = time.Now()
	return obs, nil
}

// CutBytes is how many bytes of the episode's values (actions, observations, diffs) were
// left out of its recording, each value being held to MaxFieldBytes.
func (s *Session) CutBytes() uint64 { return s.cut }

// Steps is how many steps the session has played.
func (s *Session) Steps() uint32 { return s.step }

// Done reports whether the episode reached its end (terminated or truncated by the env).
func (s *Session) Done() bool { return s.done }

// Step plays one action: the env applies it (its wall time metered), the scorer scores it,
// and the scored step goes to the output. trainer, when not nil, is the trainer's data for
// the step, recorded with it. A non-nil error is an infra error (or ErrAbandoned when ctx
// ended); the episode must then be ended with Fail or FinishInfra.
func (s *Session) Step(ctx context.Context, act env.Action, trainer *gauntletv1.TrainerData) (*gauntletv1.StepTaken, env.StepResult, error) {
	return s.step1(ctx, act, trainer, nil)
}

// step1 is Step; a replayed step (rec not nil) gets the threat flags it was recorded with
// (rec.Flags) instead of what this process's watcher knows now, and its limits where
// they were recorded (rec.LimitsAsSafety), so it scores as recorded.
func (s *Session) step1(ctx context.Context, act env.Action, trainer *gauntletv1.TrainerData, rec *Recorded) (*gauntletv1.StepTaken, env.StepResult, error) {
	if s.done {
		return nil, env.StepResult{}, errors.New("step after the episode ended")
	}
	var policy time.Duration
	if !s.turnAt.IsZero() {
		policy = time.Since(s.turnAt)
	}
	res, err := ApplyStep(s.episode, act)
	if err != nil {
		return nil, res, fmt.Errorf("step %d of %s: %w", s.step, s.Req.EpisodeId, err)
	}
	res.Metering.PolicyNs = uint64(policy)
	replay := rec != nil
	if replay && rec.LimitsAsSafety && len(res.Signals.GetLimits()) > 0 {
		res.Signals.SafetyEvents = append(slices.Clip(res.Signals.SafetyEvents), res.Signals.Limits...)
		res.Signals.Limits = nil
	}
	switch {
	case replay && len(rec.Flags) > 0:
		if res.Signals == nil {
			res.Signals = &gauntletv1.Signals{}
		}
		res.Signals.SafetyEvents = append(slices.Clip(res.Signals.SafetyEvents), rec.Flags...)
	case !replay && s.threats != nil:
		s.threatStep(act, &res)
	}
	st, cut := stepEvent(s.Req, s.profile, s.workerID, s.step, act, res, s.episode.Now())
	s.cut += uint64(cut)
	st.Trainer = trainer
	t0 := time.Now()
	score, err := s.scorer.Score(ctx, st, s.named, s.reply)
	if err != nil {
		// The scorer may still be sending st, whose metering is res's: neither is
		// written again.
		if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, res, ErrAbandoned
		}
		// The reply may still arrive on the reused channel; a fresh one keeps it away
		// from the next step.
		s.reply = make(chan ScoreResult, 1)
		return nil, res, err
	}
	res.Metering.RewardNs = uint64(time.Since(t0))
	st.Score = score
	if err := s.out.Step(ctx, st); err != nil {
		return nil, res, err
	}
	CountStep(s.Ended, s.step, res, score.GetTotal())
	s.step++
	s.done = res.Done()
	s.turnAt = time.Now()
	return st, res, nil
}

// threatStep fingerprints the attacks the step's sandbox recorded, for every other
// player, and flags the step when its action matches a fingerprint known already (from
// any episode, this one included). The fingerprint is made before the flag is added: a
// flag is never a fingerprint's event.
func (s *Session) threatStep(act env.Action, res *env.StepResult) {
	if len(res.Signals.GetSafetyEvents()) > 0 {
		if f, ok := threats.Make(act.Tool, act.Args, res.Signals.SafetyEvents); ok {
			f.Run, f.Episode, f.Step, f.Worker = s.Req.RunId, s.Req.EpisodeId, s.step, s.workerID
			s.threats.Record(f)
		}
	}
	if f := s.threats.Match(act.Tool, act.Args); f != nil {
		if res.Signals == nil {
			res.Signals = &gauntletv1.Signals{}
		}
		// A new slice: the env may still hold the one it returned.
		res.Signals.SafetyEvents = append(slices.Clip(res.Signals.SafetyEvents), f.Flag())
	}
}

// Run lets agent play the episode from turn (what it sees before its next action: the
// reset's observation, or where a Replay left off) to its end. Its errors are infra
// errors, the policy's included (ErrAbandoned when ctx ended); the caller then ends the
// episode with FinishInfra, or leaves it to a retry.
func (s *Session) Run(ctx context.Context, agent env.Agent, turn env.Turn) error {
	src, _ := agent.(TrainerSource)
	for !s.done {
		if ctx.Err() != nil {
			return ErrAbandoned
		}
		act, err := agent.Act(turn)
		if err != nil {
			return fmt.Errorf("policy %s at step %d: %w", s.Req.GetPolicy(), turn.Step, err)
		}
		var td *gauntletv1.TrainerData
		if src != nil {
			td = src.LastTrainerData()
		}
		st, res, err := s.Step(ctx, act, td)
		if err != nil {
			return err
		}
		turn = env.Turn{Step: s.step, Observation: res.Observation, Reward: st.Score.GetTotal()}
	}
	return nil
}

// TrainerSource is an agent that can say how it produced its last action: the http
// policy's agent, with the token ids and logprobs its model endpoint returned. Run
// records that with the step (StepTaken.trainer, the trainer_steps table), as the env API
// records a trainer's.
type TrainerSource interface {
	// LastTrainerData is the data of the action Act returned last; nil for none.
	LastTrainerData() *gauntletv1.TrainerData
}

// Recorded is one step of a recording to replay: its action and, when the recording has
// them, the observation the action produced and the step's state diff as recorded
// (StepTaken.StateDiffJson, cut as the recording cut it) (nil: not checked).
type Recorded struct {
	Action      env.Action
	Observation []byte
	Diff        []byte
	// Flags are the threat fingerprint flags the step was recorded with (its safety
	// events of kind threats.EventMatch, ThreatFlags): a replayed step gets these, not
	// what the replaying process knows, so it scores as it was scored.
	Flags []string
	// LimitsAsSafety says the step was recorded before limits were kept apart from
	// safety events (its recorded safety events hold a limit: RecordedLimitsAsSafety): the
	// replayed step's limits go back among its safety events, so it scores as it was
	// scored then.
	LimitsAsSafety bool
}

// RecordedLimitsAsSafety reports whether a recorded step's safety events hold a limit
// (sandbox.LimitEvent), as every step recorded before Signals.limits did, for
// Recorded.LimitsAsSafety.
func RecordedLimitsAsSafety(events []string) bool {
	return slices.ContainsFunc(events, sandbox.LimitEvent)
}

// ThreatFlags returns the threat fingerprint flags among a recorded step's safety events,
// for Recorded.Flags.
func ThreatFlags(events []string) []string {
	var out []string
	for _, ev := range events {
		if strings.HasPrefix(ev, threats.EventMatch+": ") {
			out = append(out, ev)
		}
	}
	return out
}

// ErrReplayEnded is returned by Replay when the episode ends before the recording does.
var ErrReplayEnded = errors.New("the episode ended before the recording")

// ErrDiverged is returned by Replay when an env with outside state (env.OutsideState)
// records another diff than the recording at a replayed step: the party outside answered
// otherwise, so the replayed episode is not the recorded one and cannot be forked.
var ErrDiverged = errors.New("the replay diverged from the recording")

// Replay re-executes recorded steps on the reset episode, through Step (so they are scored
// and sent to the output like any step), and proves the episode is the recorded one:
// diverged is the first step whose observation differs from the recording's, or -1 when
// every one is identical. Envs are deterministic given their seed, params, fault plan and
// actions, so a divergence means a command whose output is not (a sandbox's clock, say).
// turn is what an agent sees after the last replayed step, for Run to go on from.
//
// An env whose state is outside (env.OutsideState) is held to more: a replayed step whose
// diff is not the recorded one (when the recording has it) ends the replay with
// ErrDiverged, before any later step reaches the party in a state the recording never had.
func (s *Session) Replay(ctx context.Context, rec []Recorded) (turn env.Turn, diverged int, err error) {
	diverged = -1
	turn = env.Turn{Step: s.step}
	outside, _ := s.Env.(env.OutsideState)
	for i, r := range rec {
		if s.done {
			return turn, diverged, fmt.Errorf("replay %s: %w: it ended at step %d of %d", s.Req.EpisodeId, ErrReplayEnded, s.step-1, len(rec))
		}
		st, res, err := s.step1(ctx, r.Action, nil, &rec[i])
		if err != nil {
			return turn, diverged, fmt.Errorf("replay step %d: %w", i, err)
		}
		if outside != nil && r.Diff != nil && st.StateDiffJson != string(r.Diff) {
			return turn, int(st.Step), fmt.Errorf("replay %s: %w at step %d (%s): %s answered otherwise than it did when the step was recorded, "+
				"so the replayed state is not the recorded one; a fork replays the recorded calls into a fresh party, "+
				"which only a party whose answers depend on its calls and seed alone passes (recorded %.300s; now %.300s)",
				s.Req.EpisodeId, ErrDiverged, st.Step, r.Action.Tool, outside.OutsideState(), r.Diff, st.StateDiffJson)
		}
		if diverged < 0 && r.Observation != nil && !bytes.Equal(res.Observation, r.Observation) {
			diverged = int(st.Step)
		}
		turn = env.Turn{Step: s.step, Observation: res.Observation, Reward: st.Score.GetTotal()}
	}
	return turn, diverged, nil
}

// Branch returns a new session going on from this one's state in an independent copy of
// its episode (env.Brancher), its events sent to out. The copy has its own sandbox, if
// any; Close releases it.
func (s *Session) Branch(ctx context.Context, out Output) (*Session, error) {
	br, ok := s.episode.(env.Brancher)
	if !ok {
		return nil, fmt.Errorf("branch %s: env %s episodes cannot branch", s.Req.EpisodeId, s.Req.Env)
	}
	ep, err := br.Branch(ctx)
	if err != nil {
		return nil, fmt.Errorf("branch %s: %w", s.Req.EpisodeId, err)
	}
	b := *s
	b.episode, b.out, b.reply, b.cut = ep, out, make(chan ScoreResult, 1), 0 // the branch counts its own cuts
	b.Ended = cloneEnded(s.Ended)
	b.named = s.named.clone()
	return &b, nil
}

func cloneEnded(e *gauntletv1.EpisodeEnded) *gauntletv1.EpisodeEnded {
	return &gauntletv1.EpisodeEnded{
		Episode: e.Episode, Profile: e.Profile, Plan: e.Plan, WorkerId: e.WorkerId,
		StartedAtUnixNano: e.StartedAtUnixNano, Steps: e.Steps, TotalReward: e.TotalReward,
		FaultsFired: e.FaultsFired,
	}
}

// Flush sends the steps queued so far without waiting (Output.Flush).
func (s *Session) Flush() error { return s.out.Flush() }

// Fail ends the episode at once as terminated by a failure of the request itself (bad env,
// params or plan), recording err, and records the end.
func (s *Session) Fail(ctx context.Context, err error) error {
	s.Ended.Terminated = true
	s.Ended.Reason = gauntletv1.TerminationReason_TERMINATION_REASON_FAILURE
	s.Ended.Error = err.Error()
	return s.Finish(ctx)
}

// Truncate ends a running episode from outside (a timeout, an idle reaper, a client's
// close) with reason and a note of why, and records the end.
func (s *Session) Truncate(ctx context.Context, reason gauntletv1.TerminationReason, why string) error {
	s.Ended.Truncated = true
	s.Ended.Reason = reason
	s.Ended.Error = why
	return s.Finish(ctx)
}

// FinishInfra ends the episode as an infra error (gauntlet, its sandbox, the task's
// verifier or the policy's model endpoint failed, not the policy), with what failed
// (InfraKind), so trainers mask it rather than punish it, and records the end. The end
// carries no reward: the steps it played keep theirs, but the episode's total is 0 and
// means nothing; summaries leave infra errors out.
func (s *Session) FinishInfra(ctx context.Context, err error) error {
	s.Ended.Terminated = false
	s.Ended.Truncated = true
	s.Ended.Reason = gauntletv1.TerminationReason_TERMINATION_REASON_INFRA_ERROR
	s.Ended.InfraError = true
	s.Ended.InfraKind = InfraKind(err)
	s.Ended.Success = false
	s.Ended.TotalReward = 0
	s.Ended.VerifierNames, s.Ended.VerifierValues = nil, nil
	s.Ended.Error = err.Error()
	return s.Finish(ctx)
}

// Finish records the episode's end through the output (Output.End). A nil error means the
// whole episode is where the output keeps it (for a Publisher: in the stream, or, with
// Hold, all of it but Held).
func (s *Session) Finish(ctx context.Context) error {
	s.done = true
	if s.episode != nil {
		s.Ended.VirtualTimeNs = int64(s.episode.Now())
	}
	s.Ended.EndedAtUnixNano = time.Now().UnixNano()
	return s.out.End(ctx, s.Ended)
}

// Close releases what the env episode holds (a sandbox, for envs that use one). Call it
// once the session is over, whether it finished or was abandoned; it is safe to call on a
// session that never prepared and to call more than once.
func (s *Session) Close() error {
	ep := s.episode
	s.episode = nil
	if ep == nil {
		return nil
	}
	return env.Close(ep)
}
