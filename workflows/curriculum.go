package workflows

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/gauntlet-rl/gauntlet/pkg/rng"
)

// Names under which workflows, activities, signals and queries are registered: what the
// temporal CLI and the Web UI show, and what other SDKs call.
const (
	TaskQueue = "gauntlet"

	WorkflowCurriculum = "Curriculum"
	WorkflowBatch      = "Batch"
	WorkflowEpisode    = "DurableEpisode"

	ActivityRunBatch    = "RunBatch"
	ActivityPlayEpisode = "PlayEpisode"

	SignalPause  = "pause"
	SignalResume = "resume"
	SignalSkip   = "skip"
	SignalAbort  = "abort"

	QueryProgress = "progress"
)

// Curriculum statuses.
const (
	StatusRunning   = "running"
	StatusPaused    = "paused"
	StatusCompleted = "completed" // the last stage promoted (earlier ones promoted or skipped)
	StatusStopped   = "stopped"   // a stage spent its budget without promotion
	StatusAborted   = "aborted"   // the abort signal
	// StatusSkipped: the skip signal ended the last stage, so the curriculum ran out of
	// stages without its last one passed; not completed, as nothing showed the agent
	// can do what the curriculum ends with.
	StatusSkipped = "skipped"
)

// Stage outcomes.
const (
	OutcomePromoted    = "promoted"
	OutcomeNotPromoted = "not_promoted"
	OutcomeSkipped     = "skipped"
	OutcomeAborted     = "aborted"
)

// StageReport is what one stage did.
type StageReport struct {
	Index     int     `json:"index"`
	Name      string  `json:"name"`
	Outcome   string  `json:"outcome"`
	Episodes  uint64  `json:"episodes"`
	Succeeded uint64  `json:"succeeded"`
	RewardSum float64 `json:"reward_sum"`
	// InfraErrors is how many of Episodes ended as infra errors: the stage's rates,
	// window and budget count the others only.
	InfraErrors uint64 `json:"infra_errors,omitempty"`
	// InfraByKind splits InfraErrors by what failed, as BatchResult.InfraByKind: a stage
	// that ended on a model endpoint's failures says so after it closed too.
	InfraByKind map[string]uint64 `json:"infra_by_kind,omitempty"`
	Batches     int               `json:"batches"`
	// RunWallNs is the stage's time in runs: the sum of its batches' wall times
	// (BatchResult.WallNs, submission to completion).
	RunWallNs int64 `json:"run_wall_ns"`
	// WindowValue is the promotion metric over the last window when the stage ended.
	WindowValue float64 `json:"window_value"`
	// RunPrefix is what every run id of the stage starts with ("<prefix>-s<index>-b").
	RunPrefix string `json:"run_prefix"`
}

// CurriculumState is the curriculum's progress, carried across continue-as-new.
type CurriculumState struct {
	Prefix         string  `json:"prefix"`
	Stage          int     `json:"stage"`
	StageEpisodes  uint64  `json:"stage_episodes"`
	StageSucceeded uint64  `json:"stage_succeeded"`
	StageReward    float64 `json:"stage_reward"`
	// StageInfraErrors is how many of StageEpisodes ended as infra errors, by kind in
	// StageInfraByKind.
	StageInfraErrors uint64            `json:"stage_infra_errors,omitempty"`
	StageInfraByKind map[string]uint64 `json:"stage_infra_by_kind,omitempty"`
	StageBatches     int               `json:"stage_batches"`
	StageRunWallNs   int64             `json:"stage_run_wall_ns"`
	Window           []BatchResult     `json:"window,omitempty"`
	TotalEpisodes    uint64            `json:"total_episodes"`
	Reports          []StageReport     `json:"reports,omitempty"`
	Paused           bool              `json:"paused,omitempty"`
	// PauseReason says why the curriculum paused itself (a batch mostly of infra
	// errors); empty for a pause signal. A resume clears it.
	PauseReason string `json:"pause_reason,omitempty"`
	Skip        bool   `json:"skip,omitempty"`
	Abort       bool   `json:"abort,omitempty"`
	Status      string `json:"status"`
	Executions  int    `json:"executions"`
	// DriftReached is, per drift selector of the last stage closed, the value its ramp
	// had reached (in force for the next episode): where a ramp with continue: true of
	// the next stage starts.
	DriftReached []DriftValue `json:"drift_reached,omitempty"`
}

// DriftValue is a drifting fault parameter and the value in force.
type DriftValue struct {
	Selector string  `json:"selector"`
	Value    float64 `json:"value"`
}

// Progress is the answer to the progress query and the curriculum's result.
type Progress struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	// PauseRequested: a pause signal arrived and the batch in flight is finishing.
	PauseRequested bool `json:"pause_requested,omitempty"`
	// PauseReason says why a curriculum paused itself (CurriculumState.PauseReason).
	PauseReason   string `json:"pause_reason,omitempty"`
	Stage         int    `json:"stage"`
	StageName     string `json:"stage_name"`
	Stages        int    `json:"stages"`
	StageEpisodes uint64 `json:"stage_episodes"`
	// StageInfraErrors is how many of StageEpisodes ended as infra errors;
	// StageSuccessRate leaves them out, and so do the window's figures.
	StageInfraErrors uint64            `json:"stage_infra_errors,omitempty"`
	StageInfraByKind map[string]uint64 `json:"stage_infra_by_kind,omitempty"`
	StageSuccessRate float64           `json:"stage_success_rate"`
	// WindowEpisodes is how many scored episodes (not infra errors) the window holds.
	WindowEpisodes    uint64        `json:"window_episodes"`
	WindowSuccessRate float64       `json:"window_success_rate"`
	WindowRewardMean  float64       `json:"window_reward_mean"`
	TotalEpisodes     uint64        `json:"total_episodes"`
	Drift             []DriftValue  `json:"drift,omitempty"`
	Reports           []StageReport `json:"reports"`
	RunPrefix         string        `json:"run_prefix"`
	// Executions counts this curriculum's workflow executions (continue-as-new).
	Executions int `json:"executions"`
	// Waiting says what a running curriculum that makes no progress waits for (a worker
	// to resume its batch after a restart, episodes held by a stopped worker). The
	// workflow never sets it: `gauntlet curriculum status` fills it from Temporal's
	// record of the pending batch (BatchWaiting).
	Waiting string `json:"waiting,omitempty"`
}

// runPrefix names a workflow's runs: kind and 12 hex digits of a hash of the workflow id
// and its first run id. Stable across retries, replays, worker restarts and
// continue-as-new; different for a new workflow that reuses an old id.
func runPrefix(ctx workflow.Context, kind string) string {
	info := workflow.GetInfo(ctx)
	sum := sha256.Sum256([]byte(info.WorkflowExecution.ID + "/" + info.FirstRunID))
	return kind + hex.EncodeToString(sum[:6])
}

// StageRunPrefix is what the run ids of stage i of a curriculum with prefix start with.
func StageRunPrefix(prefix string, stage int) string { return fmt.Sprintf("%s-s%d-b", prefix, stage) }

// Curriculum runs a curriculum: each stage in batches through the scheduler until its
// promotion rule holds over the last window of episodes (next stage) or its budget is
// spent (the curriculum stops). specJSON is the CurriculumSpec as JSON (unknown keys are
// refused); state is nil on a fresh start and the carried progress after continue-as-new.
//
// Signals: pause and resume (take effect between batches), skip (ends the current stage
// after its batch in flight, as skipped; skipping the last stage ends the curriculum as
// skipped, not completed), abort (ends the curriculum likewise). Query:
// progress. The result is the final Progress; an invalid spec fails the workflow at once
// with a non-retryable InvalidSpec error naming every bad field.
//
// Infra errors (a model endpoint down, a sandbox that could not start) say nothing of
// the policy: a stage's promotion metric, window, minimum and budget count only its
// scored episodes, as the run summary and the episodes_scored view do. A batch whose
// episodes are mostly infra errors (BatchResult.MostlyInfra) is kept for its scored
// episodes but takes no stage decision: the curriculum pauses itself, saying why
// (Progress.PauseReason, the memo's pause_reason), and waits for a resume once the
// infrastructure is fixed, instead of promoting, or stopping a stage, on what the
// infrastructure did.
func Curriculum(ctx workflow.Context, specJSON json.RawMessage, state *CurriculumState) (Progress, error) {
	spec, err := ParseSpecJSON(specJSON)
	if err != nil {
		return Progress{}, temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeInvalidSpec, nil)
	}
	if state == nil {
		state = &CurriculumState{Prefix: runPrefix(ctx, "c"), Status: StatusRunning}
	}
	state.Executions++
	c := &curriculum{spec: spec, st: state, id: workflow.GetInfo(ctx).WorkflowExecution.ID, submittedBy: submittedBy(ctx)}
	if err := workflow.SetQueryHandler(ctx, QueryProgress, func() (Progress, error) { return c.progress(), nil }); err != nil {
		return Progress{}, err
	}
	if workflow.GetVersion(ctx, versionVisibility, workflow.DefaultVersion, 1) == 1 {
		c.visible, c.searchAttrs = true, memoBool(ctx, MemoSearchAttributes)
	}
	c.infraOut = workflow.GetVersion(ctx, versionInfraUnscored, workflow.DefaultVersion, 1) == 1
	c.publish(ctx)
	chans := signalChannels(ctx)
	workflow.Go(ctx, func(ctx workflow.Context) {
		for {
			sel := workflow.NewSelector(ctx)
			for _, sc := range chans {
				sel.AddReceive(sc.ch, func(ch workflow.ReceiveChannel, _ bool) {
					ch.Receive(ctx, nil)
					c.apply(sc.name)
				})
			}
			sel.Select(ctx)
		}
	})
	log := workflow.GetLogger(ctx)
	ran := 0
	for state.Stage < len(spec.Stages) {
		if state.Paused && !state.Abort {
			state.Status = StatusPaused
			c.publish(ctx)
			if err := workflow.Await(ctx, func() bool { return !state.Paused || state.Abort }); err != nil {
				return c.progress(), err
			}
			state.Status = StatusRunning
			c.publish(ctx)
		}
		if state.Abort {
			c.closeStage(OutcomeAborted)
			state.Status = StatusAborted
			c.recordStage(ctx)
			break
		}
		if state.Skip {
			state.Skip = false
			c.closeStage(OutcomeSkipped)
			c.recordStage(ctx)
			c.publish(ctx)
			continue
		}
		in, err := c.nextBatch(workflow.Now(ctx).UnixNano())
		if err != nil {
			return c.progress(), temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeInvalidSpec, nil)
		}
		var res BatchResult
		if err := workflow.ExecuteActivity(batchActivityOptions(ctx), ActivityRunBatch, in).Get(ctx, &res); err != nil {
			return c.progress(), fmt.Errorf("stage %d (%s) batch %s: %w", state.Stage, spec.Stages[state.Stage].Name, in.RunID, err)
		}
		ran++
		c.fold(res)
		log.Info("batch done", "stage", state.Stage, "run_id", res.RunID, "episodes", res.Episodes,
			"infra_errors", res.InfraErrors, "stage_episodes", state.StageEpisodes, "window", c.windowValue())
		switch {
		case c.infraOut && res.MostlyInfra():
			state.Paused = true
			what := FormatInfraKinds(res.InfraByKind)
			if what == "" {
				what = "the batch's episodes in ClickHouse say what failed"
			}
			state.PauseReason = fmt.Sprintf("stage %d (%s) batch %s: %d of %d episodes ended as infra errors (%s); "+
				"no stage decision is taken on them: resume once the cause is fixed",
				state.Stage, spec.Stages[state.Stage].Name, res.RunID, res.InfraErrors, res.Episodes, what)
			log.Warn("curriculum paused: a batch of infra errors", "stage", state.Stage, "run_id", res.RunID,
				"infra_errors", res.InfraErrors, "episodes", res.Episodes)
		case c.promotable():
			c.closeStage(OutcomePromoted)
			c.recordStage(ctx)
		case c.stageScored() >= spec.Stages[state.Stage].Episodes.Max:
			c.closeStage(OutcomeNotPromoted)
			state.Status = StatusStopped
			c.recordStage(ctx)
		}
		c.publish(ctx)
		if state.Status == StatusStopped {
			break
		}
		if state.Stage < len(spec.Stages) && (ran >= MaxBatchesPerExecution || workflow.GetInfo(ctx).GetContinueAsNewSuggested()) {
			// Signals already in the channels but not yet handled go with the state.
			for _, sc := range chans {
				for sc.ch.ReceiveAsync(nil) {
					c.apply(sc.name)
				}
			}
			return Progress{}, workflow.NewContinueAsNewError(ctx, WorkflowCurriculum, specJSON, state)
		}
	}
	if state.Status == StatusRunning || state.Status == StatusPaused {
		state.Status = StatusCompleted
		if n := len(state.Reports); n > 0 && state.Reports[n-1].Outcome == OutcomeSkipped {
			state.Status = StatusSkipped
		}
	}
	c.publish(ctx)
	if state.Status == StatusAborted && c.visible {
		// An aborted curriculum closes as canceled, not completed: Temporal's UI and
		// `temporal workflow list` then tell it apart from one that ran to its end. Its
		// progress is the cancellation's details (ProgressOf reads it).
		p := c.progress()
		return p, temporal.NewCanceledError(p)
	}
	return c.progress(), nil
}

type namedChannel struct {
	name string
	ch   workflow.ReceiveChannel
}

func signalChannels(ctx workflow.Context) []namedChannel {
	var out []namedChannel
	for _, n := range []string{SignalPause, SignalResume, SignalSkip, SignalAbort} {
		out = append(out, namedChannel{n, workflow.GetSignalChannel(ctx, n)})
	}
	return out
}

// curriculum is the pure decision logic over the spec and the state.
type curriculum struct {
	spec CurriculumSpec
	st   *CurriculumState
	// id is the workflow's id and submittedBy who started it, recorded with each
	// batch's run.
	id, submittedBy string
	// visible: the memo (and, with searchAttrs, the search attributes) follow the
	// status and stage (publish); last is what was published last.
	visible, searchAttrs bool
	last                 *shown
	// infraOut: infra errors are left out of the stage's figures and decisions (see
	// Curriculum); false for workflows started before, which replay as they ran.
	infraOut bool
}

// versionInfraUnscored is the change id under which curricula leave infra errors out of
// their stage decisions and pause on a batch mostly of them.
const versionInfraUnscored = "infra-errors-unscored"

// scored is how many of r's episodes count for the stage: those not infra errors (all
// of them for a workflow started before infra errors were left out).
func (c *curriculum) scored(r BatchResult) uint64 {
	if !c.infraOut {
		return r.Episodes
	}
	return r.Scored()
}

// stageScored is how many of the stage's episodes count for it (see scored).
func (c *curriculum) stageScored() uint64 {
	return c.scored(BatchResult{Episodes: c.st.StageEpisodes, InfraErrors: c.st.StageInfraErrors})
}

func (c *curriculum) apply(signal string) {
	switch signal {
	case SignalPause:
		c.st.Paused = true
	case SignalResume:
		c.st.Paused, c.st.PauseReason = false, ""
	case SignalSkip:
		c.st.Skip = true
	case SignalAbort:
		c.st.Abort = true
	}
}

// nextBatch is the input of the stage's next batch.
func (c *curriculum) nextBatch(now int64) (BatchInput, error) {
	s := c.st
	st := c.spec.Stages[s.Stage]
	params, err := st.ParamsJSON()
	if err != nil {
		return BatchInput{}, fmt.Errorf("stages[%d].%w", s.Stage, err)
	}
	n := min(st.Batch, st.Episodes.Max-c.stageScored())
	return BatchInput{
		RunID:       fmt.Sprintf("%s%d", StageRunPrefix(s.Prefix, s.Stage), s.StageBatches),
		Env:         st.Env,
		ParamsJSON:  params,
		Policies:    st.Policies,
		Profiles:    st.Profiles,
		Episodes:    n,
		Seed:        rng.DeriveN(rng.DeriveN(c.spec.Seed, "curriculum-stage", uint64(s.Stage)), "batch", uint64(s.StageBatches)),
		MaxInFlight: c.spec.MaxInFlight,
		MaxSteps:    st.MaxSteps,
		Label:       fmt.Sprintf("curriculum %s stage %d (%s)", c.spec.Name, s.Stage, st.Name),
		Ramps:       batchRamps(c.stageDrift(), c.stageScored(), n, st.Episodes.Max),
		RewardSpec:  st.RewardSpec,

		PolicyEndpoint:      st.PolicyEndpoint,
		RequestedAtUnixNano: now,
		Origin: BatchOrigin{
			SubmittedBy: c.submittedBy, CurriculumID: c.id, CurriculumName: c.spec.Name, CurriculumPrefix: s.Prefix,
			Stage: s.Stage, StageName: st.Name, Batch: s.StageBatches,
		},
	}, nil
}

// fold adds a finished batch to the stage.
func (c *curriculum) fold(r BatchResult) {
	s := c.st
	s.StageEpisodes += r.Episodes
	s.StageSucceeded += r.Succeeded
	s.StageReward += r.RewardSum
	s.StageInfraErrors += r.InfraErrors
	for k, n := range r.InfraByKind { // sums: the order does not matter
		if s.StageInfraByKind == nil {
			s.StageInfraByKind = map[string]uint64{}
		}
		s.StageInfraByKind[k] += n
	}
	s.StageBatches++
	s.StageRunWallNs += r.WallNs
	s.TotalEpisodes += r.Episodes
	s.Window = append(s.Window, r)
	window := c.spec.Stages[s.Stage].Promotion.Window
	// Keep the fewest newest batches that cover the window.
	for len(s.Window) > 1 && c.sumScored(s.Window[1:]) >= window {
		s.Window = s.Window[1:]
	}
}

// sumScored is how many episodes of rs count for the stage.
func (c *curriculum) sumScored(rs []BatchResult) uint64 {
	var n uint64
	for _, r := range rs {
		n += c.scored(r)
	}
	return n
}

// window is the stage's window as one batch. For a workflow that counts infra errors
// (started before they were left out) it carries none, so its rates are over them all.
func (c *curriculum) window() BatchResult {
	var w BatchResult
	for _, r := range c.st.Window {
		w.Episodes += r.Episodes
		w.Succeeded += r.Succeeded
		w.RewardSum += r.RewardSum
		if c.infraOut {
			w.InfraErrors += r.InfraErrors
		}
	}
	return w
}

// windowValue is the stage's promotion metric over its window.
func (c *curriculum) windowValue() float64 {
	if c.st.Stage >= len(c.spec.Stages) {
		return 0
	}
	w := c.window()
	if c.spec.Stages[c.st.Stage].Promotion.Metric == MetricRewardMean {
		return w.RewardMean()
	}
	return w.SuccessRate()
}

// promotable reports whether the stage's rule holds: at least Min scored episodes ran,
// the window is full of scored episodes, and the metric over it reaches the threshold.
func (c *curriculum) promotable() bool {
	st := c.spec.Stages[c.st.Stage]
	return c.stageScored() >= st.Episodes.Min &&
		c.window().Scored() >= st.Promotion.Window &&
		c.windowValue() >= st.Promotion.Threshold
}

// closeStage records the current stage's report and moves to the next stage.
func (c *curriculum) closeStage(outcome string) {
	s := c.st
	if s.Stage >= len(c.spec.Stages) {
		return
	}
	s.DriftReached = c.driftInForce()
	s.Reports = append(s.Reports, StageReport{
		Index: s.Stage, Name: c.spec.Stages[s.Stage].Name, Outcome: outcome,
		Episodes: s.StageEpisodes, Succeeded: s.StageSucceeded, RewardSum: s.StageReward,
		InfraErrors: s.StageInfraErrors, InfraByKind: maps.Clone(s.StageInfraByKind),
		Batches: s.StageBatches, RunWallNs: s.StageRunWallNs, WindowValue: c.windowValue(), RunPrefix: StageRunPrefix(s.Prefix, s.Stage),
	})
	if outcome == OutcomePromoted || outcome == OutcomeSkipped {
		s.Stage++
		s.StageEpisodes, s.StageSucceeded, s.StageReward, s.StageBatches, s.StageRunWallNs, s.Window = 0, 0, 0, 0, 0, nil
		s.StageInfraErrors, s.StageInfraByKind = 0, nil
	}
}

func (c *curriculum) progress() Progress {
	s := c.st
	p := Progress{
		Name: c.spec.Name, Status: s.Status, Stage: s.Stage, Stages: len(c.spec.Stages),
		StageEpisodes: s.StageEpisodes, TotalEpisodes: s.TotalEpisodes,
		Reports: append([]StageReport{}, s.Reports...), RunPrefix: s.Prefix, Executions: s.Executions,
	}
	p.PauseRequested = s.Paused && s.Status == StatusRunning
	p.PauseReason, p.StageInfraErrors, p.StageInfraByKind = s.PauseReason, s.StageInfraErrors, maps.Clone(s.StageInfraByKind)
	if n := c.stageScored(); n > 0 {
		p.StageSuccessRate = float64(s.StageSucceeded) / float64(n)
	}
	w := c.window()
	p.WindowEpisodes, p.WindowSuccessRate, p.WindowRewardMean = w.Scored(), w.SuccessRate(), w.RewardMean()
	if s.Stage < len(c.spec.Stages) {
		p.StageName = c.spec.Stages[s.Stage].Name
		p.Drift = c.driftInForce()
	}
	return p
}

// stageDrift is the current stage's ramps, those with continue: true starting where the
// previous stage's ramp of their selector had reached.
func (c *curriculum) stageDrift() []DriftSpec {
	drift := c.spec.Stages[c.st.Stage].Drift
	cont := false
	for _, d := range drift {
		cont = cont || d.Continue
	}
	if !cont {
		return drift
	}
	out := append([]DriftSpec(nil), drift...)
	for i, d := range out {
		if !d.Continue {
			continue
		}
		for _, r := range c.st.DriftReached {
			if r.Selector == d.Selector {
				out[i].From = r.Value
			}
		}
	}
	return out
}

// driftInForce is each drifting parameter's value at the stage's next episode.
func (c *curriculum) driftInForce() []DriftValue {
	st := c.spec.Stages[c.st.Stage]
	var out []DriftValue
	for _, d := range c.stageDrift() {
		out = append(out, DriftValue{Selector: d.Selector, Value: rampAt(d.From, d.To, c.stageScored(), st.Episodes.Max)})
	}
	return out
}

// rampAt is the linear ramp from→to at episode i of n (from at 0, to at n-1).
func rampAt(from, to float64, i, n uint64) float64 {
	if n <= 1 {
		return from
	}
	i = min(i, n-1)
	return from + (to-from)*float64(i)/float64(n-1)
}

// IsInvalidSpec reports whether err is a workflow or activity failure caused by an
// invalid spec.
func IsInvalidSpec(err error) bool {
	var ae *temporal.ApplicationError
	return errors.As(err, &ae) && ae.Type() == ErrTypeInvalidSpec
}
