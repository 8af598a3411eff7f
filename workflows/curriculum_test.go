package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	_ "github.com/gauntlet-rl/gauntlet/pkg/env/shop"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// fakeBatches stands in for the scheduler in workflow unit tests: a batch's successes are
// its episodes times the rate its policy mix gives, and every call is recorded.
type fakeBatches struct {
	rate  map[string]float64 // by Policies string
	calls []BatchInput
	// stages are the stage transitions the curriculum recorded, in order.
	stages []*gauntletv1.StageTransition
}

func (f *fakeBatches) recordStage(_ context.Context, t *gauntletv1.StageTransition) error {
	f.stages = append(f.stages, t)
	return nil
}

func (f *fakeBatches) run(_ context.Context, in BatchInput) (BatchResult, error) {
	f.calls = append(f.calls, in)
	ok := uint64(float64(in.Episodes) * f.rate[in.Policies])
	return BatchResult{RunID: in.RunID, Episodes: in.Episodes, Succeeded: ok, RewardSum: float64(ok)}, nil
}

func newEnv(t *testing.T, f *fakeBatches) *testsuite.TestWorkflowEnvironment {
	s := newSuite(t)
	env := s.NewTestWorkflowEnvironment()
	env.RegisterWorkflowWithOptions(Curriculum, workflow.RegisterOptions{Name: WorkflowCurriculum})
	env.RegisterActivityWithOptions(f.run, activity.RegisterOptions{Name: ActivityRunBatch})
	env.RegisterActivityWithOptions(f.recordStage, activity.RegisterOptions{Name: ActivityRecordStage})
	return env
}

const threeStages = `
name: t
seed: 3
stages:
  - {name: a, env: shop, policies: %s, episodes: {min: 20, max: 60}, promotion: {metric: success_rate, threshold: 0.8, window: 20}}
  - {name: b, env: shop, policies: %s, profiles: "baseline=1,stress=1", episodes: {min: 20, max: 60}, batch: 10, promotion: {metric: success_rate, threshold: 0.8, window: 20}}
  - {name: c, env: shop, policies: %s, episodes: {min: 40, max: 80}, promotion: {metric: reward_mean, threshold: 0.5, window: 20}}
`

func specJSON(t *testing.T, yamlText string) json.RawMessage {
	t.Helper()
	s, err := LoadSpec(strings.NewReader(yamlText))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func three(policy string) string {
	return strings.ReplaceAll(threeStages, "%s", policy)
}

func result(t *testing.T, env *testsuite.TestWorkflowEnvironment) Progress {
	t.Helper()
	if !env.IsWorkflowCompleted() {
		t.Fatal("workflow did not complete")
	}
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	var p Progress
	if err := env.GetWorkflowResult(&p); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCurriculumPromotesThroughEveryStage(t *testing.T) {
	f := &fakeBatches{rate: map[string]float64{"oracle=1": 1}}
	env := newEnv(t, f)
	env.ExecuteWorkflow(WorkflowCurriculum, specJSON(t, three("oracle=1")), nil)
	p := result(t, env)
	if p.Status != StatusCompleted || len(p.Reports) != 3 {
		t.Fatalf("status %s, %d reports; want completed, 3", p.Status, len(p.Reports))
	}
	// Stage a: one batch of 20 (window); b: two of 10; c: min 40 = two of 20.
	want := []struct {
		eps     uint64
		batches int
	}{{20, 1}, {20, 2}, {40, 2}}
	for i, r := range p.Reports {
		if r.Outcome != OutcomePromoted || r.Episodes != want[i].eps || r.Batches != want[i].batches {
			t.Errorf("stage %d: %+v; want promoted after %d episodes in %d batches", i, r, want[i].eps, want[i].batches)
		}
	}
	if p.TotalEpisodes != 80 || len(f.calls) != 5 {
		t.Errorf("total %d episodes in %d batches; want 80 in 5", p.TotalEpisodes, len(f.calls))
	}
	// Run ids: deterministic per (workflow, stage, batch), distinct.
	seen := map[string]bool{}
	for _, c := range f.calls {
		if seen[c.RunID] || !strings.HasPrefix(c.RunID, p.RunPrefix+"-s") {
			t.Errorf("run id %s repeated or without prefix %s", c.RunID, p.RunPrefix)
		}
		seen[c.RunID] = true
	}
	if f.calls[1].RunID != p.RunPrefix+"-s1-b0" || f.calls[2].RunID != p.RunPrefix+"-s1-b1" {
		t.Errorf("stage 1 run ids %s, %s", f.calls[1].RunID, f.calls[2].RunID)
	}
	if f.calls[1].Profiles != "baseline=1,stress=1" || f.calls[0].Profiles != "baseline=1" {
		t.Errorf("profiles %q, %q", f.calls[0].Profiles, f.calls[1].Profiles)
	}
	// Each batch names its curriculum, stage and batch for the runs table.
	if o := f.calls[2].Origin; o.CurriculumName != "t" || o.CurriculumPrefix != p.RunPrefix || o.Stage != 1 ||
		o.StageName != "b" || o.Batch != 1 || o.CurriculumID == "" || o.SubmittedBy != "temporal" {
		t.Errorf("origin of the second batch of stage 1: %+v", o)
	}
	// Each stage's close is recorded: outcome, what was measured, what runs next.
	if len(f.stages) != 3 {
		t.Fatalf("%d stage transitions recorded; want 3", len(f.stages))
	}
	for i, st := range f.stages {
		r := p.Reports[i]
		if st.GetStage() != uint32(i) || st.GetOutcome() != OutcomePromoted || st.GetNextStage() != uint32(i+1) ||
			st.GetEpisodes() != r.Episodes || st.GetWindowValue() != r.WindowValue || st.GetCurriculumPrefix() != p.RunPrefix ||
			st.GetThreshold() == 0 || st.GetMetric() == "" || st.GetClosedAtUnixNano() == 0 {
			t.Errorf("stage transition %d: %v; report %+v", i, st, r)
		}
	}
	if f.stages[2].GetMetric() != MetricRewardMean {
		t.Errorf("stage 2 metric %q; want %s", f.stages[2].GetMetric(), MetricRewardMean)
	}
}

func TestCurriculumStopsWhenBudgetSpent(t *testing.T) {
	f := &fakeBatches{rate: map[string]float64{"random=1": 0.1}}
	env := newEnv(t, f)
	env.ExecuteWorkflow(WorkflowCurriculum, specJSON(t, three("random=1")), nil)
	p := result(t, env)
	if p.Status != StatusStopped || len(p.Reports) != 1 || p.Stage != 0 {
		t.Fatalf("got %+v; want stopped at stage 0 with one report", p)
	}
	r := p.Reports[0]
	if r.Outcome != OutcomeNotPromoted || r.Episodes != 60 || r.Batches != 3 || r.Succeeded != 6 {
		t.Errorf("report %+v; want not_promoted after 60 episodes, 3 batches, 6 successes", r)
	}
	// The stop is recorded, with nothing after it.
	if len(f.stages) != 1 || f.stages[0].GetOutcome() != OutcomeNotPromoted || f.stages[0].GetNextStage() != 3 {
		t.Errorf("stage transitions %v; want one not_promoted with next stage 3 (none)", f.stages)
	}
}

func TestCurriculumWindowIsTheLastEpisodes(t *testing.T) {
	// Success only in later batches: the window must forget the early failures.
	s := newSuite(t)
	env := s.NewTestWorkflowEnvironment()
	env.RegisterWorkflowWithOptions(Curriculum, workflow.RegisterOptions{Name: WorkflowCurriculum})
	n := 0
	env.RegisterActivityWithOptions(func(_ context.Context, in BatchInput) (BatchResult, error) {
		n++
		ok := uint64(0)
		if n > 2 {
			ok = in.Episodes
		}
		return BatchResult{RunID: in.RunID, Episodes: in.Episodes, Succeeded: ok}, nil
	}, activity.RegisterOptions{Name: ActivityRunBatch})
	env.ExecuteWorkflow(WorkflowCurriculum, specJSON(t, `
stages:
  - {env: shop, policies: oracle=1, episodes: {min: 10, max: 100}, batch: 10, promotion: {metric: success_rate, threshold: 1, window: 20}}
`), nil)
	p := result(t, env)
	if p.Status != StatusCompleted || p.Reports[0].Episodes != 40 || p.Reports[0].WindowValue != 1 {
		t.Fatalf("got %+v; want promoted after 40 episodes (2 failing batches, then a full window)", p)
	}
}

func TestCurriculumSignals(t *testing.T) {
	f := &fakeBatches{rate: map[string]float64{"random=1": 0}}
	env := newEnv(t, f)
	// Every batch takes a minute of (test) time, so signals land between batches.
	var progress []Progress
	query := func() {
		v, err := env.QueryWorkflow(QueryProgress)
		if err != nil {
			t.Error(err)
			return
		}
		var p Progress
		if err := v.Get(&p); err != nil {
			t.Error(err)
		}
		progress = append(progress, p)
	}
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(SignalPause, nil) }, time.Millisecond)
	env.RegisterDelayedCallback(query, time.Hour)
	env.RegisterDelayedCallback(func() {
		if len(f.calls) != 1 {
			t.Errorf("%d batches ran while paused; want 1 (the one in flight)", len(f.calls))
		}
		env.SignalWorkflow(SignalSkip, nil)
		env.SignalWorkflow(SignalResume, nil)
	}, 2*time.Hour)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(SignalAbort, nil) }, 2*time.Hour+150*time.Second)
	env.OnActivity(ActivityRunBatch, mock.Anything, mock.Anything).Return(f.run).After(time.Minute)
	env.ExecuteWorkflow(WorkflowCurriculum, specJSON(t, three("random=1")), nil)
	if !env.IsWorkflowCompleted() {
		t.Fatal("workflow did not complete")
	}
	// Aborted, it closes as canceled (not completed), its progress the details.
	p, ok := ProgressOf(env.GetWorkflowError())
	if !ok {
		t.Fatalf("aborted curriculum closed with error %v; want a cancellation carrying its progress", env.GetWorkflowError())
	}
	if len(progress) != 1 || progress[0].Status != StatusPaused || progress[0].Stage != 0 || progress[0].StageEpisodes != 20 {
		t.Errorf("progress while paused: %+v", progress)
	}
	if p.Status != StatusAborted || len(p.Reports) != 2 || p.Reports[0].Outcome != OutcomeSkipped || p.Reports[1].Outcome != OutcomeAborted {
		t.Fatalf("got %+v; want stage 0 skipped, stage 1 aborted", p)
	}
}

func TestCurriculumContinuesAsNew(t *testing.T) {
	f := &fakeBatches{rate: map[string]float64{"random=1": 0}}
	env := newEnv(t, f)
	spec := specJSON(t, `
stages:
  - {env: shop, policies: random=1, episodes: {min: 1, max: 250}, promotion: {metric: success_rate, threshold: 1, window: 1}}
`)
	env.ExecuteWorkflow(WorkflowCurriculum, spec, nil)
	var can *workflow.ContinueAsNewError
	if err := env.GetWorkflowError(); !errors.As(err, &can) {
		t.Fatalf("error %v; want continue-as-new after %d batches", err, MaxBatchesPerExecution)
	}
	if len(f.calls) != MaxBatchesPerExecution {
		t.Fatalf("%d batches before continue-as-new; want %d", len(f.calls), MaxBatchesPerExecution)
	}
	var gotSpec json.RawMessage
	var state *CurriculumState
	dc := converter.GetDefaultDataConverter()
	if err := dc.FromPayloads(can.Input, &gotSpec, &state); err != nil {
		t.Fatal(err)
	}
	if state.StageEpisodes != MaxBatchesPerExecution || state.StageBatches != MaxBatchesPerExecution {
		t.Fatalf("carried state %+v", state)
	}
	env2 := newEnv(t, f)
	env2.ExecuteWorkflow(WorkflowCurriculum, gotSpec, state)
	p := result(t, env2)
	if p.Status != StatusStopped || p.Reports[0].Episodes != 250 || p.Executions != 2 || len(f.calls) != 250 {
		t.Fatalf("after continue-as-new: %+v, %d batches", p, len(f.calls))
	}
	if f.calls[249].RunID != state.Prefix+"-s0-b249" {
		t.Errorf("last run id %s; want the carried prefix and batch 249", f.calls[249].RunID)
	}
}

func TestCurriculumRefusesBadSpecBeforeAnyBatch(t *testing.T) {
	f := &fakeBatches{}
	env := newEnv(t, f)
	env.ExecuteWorkflow(WorkflowCurriculum, json.RawMessage(`{"stages":[{"env":"shop","policies":"oracle=1","episodes":{"max":10},"promotion":{"metric":"success_rate","threshold":0.5,"window":0}}],"colour":"red"}`), nil)
	err := env.GetWorkflowError()
	if !IsInvalidSpec(err) || !strings.Contains(err.Error(), `unknown field "colour"`) {
		t.Fatalf("error %v; want InvalidSpec naming the unknown field", err)
	}
	if !strings.Contains(err.Error(), "stages[0].promotion.window: must be > 0") {
		t.Errorf("error %v; the unknown key hides stages[0].promotion.window", err)
	}
	env = newEnv(t, f)
	env.ExecuteWorkflow(WorkflowCurriculum, json.RawMessage(`{"stages":[{"env":"shop","policies":"oracle=1","episodes":{"max":10},"promotion":{"metric":"success_rate","threshold":0.5,"window":0}}]}`), nil)
	err = env.GetWorkflowError()
	if !IsInvalidSpec(err) || !strings.Contains(err.Error(), "stages[0].promotion.window: must be > 0") {
		t.Fatalf("error %v; want InvalidSpec naming stages[0].promotion.window", err)
	}
	if len(f.calls) != 0 {
		t.Errorf("%d batches ran for invalid specs", len(f.calls))
	}
}

// newSuite is a test suite whose SDK logs go to t.Log only on warnings.
func newSuite(t *testing.T) *testsuite.WorkflowTestSuite {
	var s testsuite.WorkflowTestSuite
	s.SetLogger(log.NewStructuredLogger(slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	return &s
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p))
	return len(p), nil
}

func TestCurriculumDriftRampsAcrossBatches(t *testing.T) {
	f := &fakeBatches{rate: map[string]float64{"random=1": 0}}
	env := newEnv(t, f)
	var inForce []DriftValue
	env.RegisterDelayedCallback(func() {
		v, err := env.QueryWorkflow(QueryProgress)
		if err != nil {
			t.Error(err)
			return
		}
		var p Progress
		_ = v.Get(&p)
		inForce = p.Drift
	}, 90*time.Second)
	env.OnActivity(ActivityRunBatch, mock.Anything, mock.Anything).Return(f.run).After(time.Minute)
	env.ExecuteWorkflow(WorkflowCurriculum, specJSON(t, `
stages:
  - env: shop
    policies: random=1
    episodes: {min: 10, max: 41}
    batch: 1
    promotion: {metric: success_rate, threshold: 1, window: 1}
    drift:
      - {selector: "*.latency.mean_ms", from: 10, to: 500}
`), nil)
	p := result(t, env)
	if p.Reports[0].Episodes != 41 || len(f.calls) != 41 {
		t.Fatalf("%+v", p)
	}
	// Batch b holds stage episode b: the ramp's value there, 10 + 490*b/40.
	for b, c := range f.calls {
		want := 10 + 490*float64(b)/40
		if len(c.Ramps) != 1 || c.Ramps[0].From != want || c.Ramps[0].To != want || c.Ramps[0].Selector != "*.latency.mean_ms" {
			t.Fatalf("batch %d ramps %+v; want %v", b, c.Ramps, want)
		}
	}
	// At 90 s one batch had finished: the value in force is stage episode 1's.
	if len(inForce) != 1 || inForce[0].Value != 10+490.0/40 {
		t.Errorf("drift in force %+v", inForce)
	}
}

func TestBatchRampsAreContinuous(t *testing.T) {
	d := []DriftSpec{{Selector: "*.latency.mean_ms", From: 10, To: 500}}
	// A stage of 100 episodes in batches of 25: each batch's ends are the stage's values.
	for b := uint64(0); b < 4; b++ {
		r := batchRamps(d, b*25, 25, 100)[0]
		if r.From != rampAt(10, 500, b*25, 100) || r.To != rampAt(10, 500, b*25+24, 100) {
			t.Errorf("batch %d: %+v", b, r)
		}
	}
	if v := rampAt(10, 500, 99, 100); v != 500 {
		t.Errorf("last episode %v; want 500", v)
	}
	drift := stageDrift(d, 25, 25, 100)
	if len(drift) != 1 || len(drift[0].Schedule.Points) != 2 || drift[0].Schedule.Points[1].At != 24 {
		t.Errorf("schedule %v", drift)
	}
}

func TestCurriculumSkippingTheLastStageIsNotCompleted(t *testing.T) {
	f := &fakeBatches{rate: map[string]float64{"oracle=1": 1, "random=1": 0}}
	env := newEnv(t, f)
	// Stage a is promoted by its first batch; stage b never is: skipped after one batch.
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(SignalSkip, nil) }, 90*time.Second)
	env.OnActivity(ActivityRunBatch, mock.Anything, mock.Anything).Return(f.run).After(time.Minute)
	env.ExecuteWorkflow(WorkflowCurriculum, specJSON(t, `
stages:
  - {name: a, env: shop, policies: oracle=1, episodes: {max: 20}, promotion: {metric: success_rate, threshold: 1, window: 10}}
  - {name: b, env: shop, policies: random=1, episodes: {max: 100}, promotion: {metric: success_rate, threshold: 1, window: 10}}
`), nil)
	p := result(t, env)
	if len(p.Reports) != 2 || p.Reports[0].Outcome != OutcomePromoted || p.Reports[1].Outcome != OutcomeSkipped {
		t.Fatalf("reports %+v; want a promoted, b skipped", p.Reports)
	}
	if p.Status != StatusSkipped {
		t.Errorf("status %q after the last stage was skipped; want %q", p.Status, StatusSkipped)
	}
}

func TestCurriculumDriftContinuesAcrossStages(t *testing.T) {
	f := &fakeBatches{rate: map[string]float64{"oracle=1": 1}}
	env := newEnv(t, f)
	// Stage a ramps 10 -> 110 over 101 episodes but is promoted after 20: its ramp has
	// reached 30 (the value for episode 20). Stage b continues from there to 500.
	env.ExecuteWorkflow(WorkflowCurriculum, specJSON(t, `
stages:
  - env: shop
    policies: oracle=1
    episodes: {min: 20, max: 100}
    batch: 10
    promotion: {metric: success_rate, threshold: 1, window: 10}
    drift: [{selector: "*.latency.mean_ms", from: 10, to: 109}]
  - env: shop
    policies: oracle=1
    episodes: {min: 20, max: 50}
    batch: 10
    promotion: {metric: success_rate, threshold: 1, window: 10}
    drift: [{selector: "*.latency.mean_ms", continue: true, to: 500}]
`), nil)
	p := result(t, env)
	if p.Status != StatusCompleted || len(f.calls) != 4 {
		t.Fatalf("%+v after %d batches; want completed after 4", p, len(f.calls))
	}
	// Stage a's batches: episodes 0-9 and 10-19 of its ramp, 1 per episode.
	if r := f.calls[1].Ramps[0]; r.From != 20 || r.To != 29 {
		t.Errorf("stage a batch 1 ramp %+v; want 20..29", r)
	}
	// Stage b starts at 30, where a left off, and ramps to 500 at its 50th episode.
	want := rampAt(30, 500, 10, 50)
	if r := f.calls[2].Ramps[0]; r.From != 30 || r.To != rampAt(30, 500, 9, 50) {
		t.Errorf("stage b batch 0 ramp %+v; want from 30", r)
	}
	if r := f.calls[3].Ramps[0]; r.From != want {
		t.Errorf("stage b batch 1 ramp %+v; want from %v", r, want)
	}
}

func TestDriftContinueIsValidated(t *testing.T) {
	_, err := LoadSpec(strings.NewReader(`
stages:
  - {name: a, env: shop, policies: oracle=1, episodes: {max: 10}, promotion: {metric: success_rate, threshold: 1, window: 10}, drift: [{selector: "*.latency.mean_ms", continue: true, to: 5}]}
  - {name: b, env: shop, policies: oracle=1, episodes: {max: 10}, promotion: {metric: success_rate, threshold: 1, window: 10}, drift: [{selector: "*.latency.stddev_ms", from: 3, continue: true, to: 5}]}
  - {name: c, env: shop, policies: oracle=1, episodes: {max: 10}, promotion: {metric: success_rate, threshold: 1, window: 10}, drift: [{selector: "*.latency.stddev_ms", continue: yes please, to: 5}]}
`))
	for _, w := range []string{
		"line 3: stages[0].drift[0].continue: the first stage has no ramp to continue",
		`line 4: stages[1].drift[0].continue: stages[0] has no drift of "*.latency.stddev_ms" to continue`,
		"line 4: stages[1].drift[0].from: must be left out with continue: true",
		"line 5: stages[2].drift[0].continue: want true or false",
	} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error %q\ndoes not contain %q", err, w)
		}
	}
}
