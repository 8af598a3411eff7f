package play

import (
	"time"
	"unsafe"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// ApplyStep applies one action to the episode, measuring the step's wall time into its
// metering. An error is an infra error; the episode is dead after one.
func ApplyStep(ep env.Episode, act env.Action) (env.StepResult, error) {
	t0 := time.Now()
	res, err := ep.Step(act)
	if err != nil {
		return res, err
	}
	if res.Metering == nil {
		res.Metering = &gauntletv1.Metering{}
	}
	res.Metering.WallNs = uint64(time.Since(t0))
	return res, nil
}

// StepEvent records one played step as the StepTaken event workers publish (without its
// score, which the reward service adds). A value over MaxFieldBytes is recorded cut (Cut).
func StepEvent(req *gauntletv1.EpisodeRequested, profile, workerID string, step uint32, act env.Action, res env.StepResult, now time.Duration) *gauntletv1.StepTaken {
	st, _ := stepEvent(req, profile, workerID, step, act, res, now)
	return st
}

// stepEvent is StepEvent, also saying how many bytes of the step's values it cut.
func stepEvent(req *gauntletv1.EpisodeRequested, profile, workerID string, step uint32, act env.Action, res env.StepResult, now time.Duration) (*gauntletv1.StepTaken, int) {
	a, o, d, cut := []byte(act.Args), []byte(res.Observation), []byte(res.Diff), 0
	if len(a) > MaxFieldBytes || len(o) > MaxFieldBytes || len(d) > MaxFieldBytes {
		a, o, d, cut = boundStep(a, o, d)
	}
	// Two allocations where there were five: the event with its action, and one copy of
	// the three byte strings that the event's strings share.
	rec := new(stepRecord)
	text := make([]byte, 0, len(a)+len(o)+len(d))
	text = append(append(append(text, a...), o...), d...)
	args, obs, diff := len(a), len(a)+len(o), len(text)
	rec.action = gauntletv1.Action{Tool: act.Tool, ArgsJson: bytesString(text[:args])}
	rec.step = gauntletv1.StepTaken{
		EpisodeId: req.EpisodeId, Step: step, RunId: req.RunId, Env: req.Env, Policy: req.Policy,
		Profile: profile, Action: &rec.action,
		ObservationJson: bytesString(text[args:obs]), StateDiffJson: bytesString(text[obs:diff]), Faults: res.Faults,
		Metering: res.Metering, Signals: res.Signals, Terminated: res.Terminated, Truncated: res.Truncated,
		Reason: res.Reason, VirtualTimeNs: int64(now), WorkerId: workerID,
		RequestedAtUnixNano: req.RequestedAtUnixNano,
	}
	return &rec.step, cut
}

// stepRecord is a StepTaken allocated together with its action.
type stepRecord struct {
	step   gauntletv1.StepTaken
	action gauntletv1.Action
}

// bytesString is b as a string without a copy; b must never change afterwards.
func bytesString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// CountStep folds played step number step (its result and its reward) into the episode's
// end record: the step count, the reward and fault totals, and, when the step ends the
// episode, how it ended and what its verifier wrote. Every path that plays episodes keeps its EpisodeEnded this way.
func CountStep(e *gauntletv1.EpisodeEnded, step uint32, res env.StepResult, reward float64) {
	e.Steps = step + 1
	e.TotalReward += reward
	e.FaultsFired += uint32(len(res.Faults))
	if res.Done() {
		e.Terminated, e.Truncated, e.Reason = res.Terminated, res.Truncated, res.Reason
		e.Success = res.Signals.GetSuccess()
		e.VerifierNames, e.VerifierValues = res.Signals.GetVerifierNames(), res.Signals.GetVerifierValues()
	}
}
