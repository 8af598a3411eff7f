package workflows

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"
)

// A batch's infra errors say nothing of the policy: its success rate is over the scored
// episodes, as the run summary's is.
func TestBatchResultRatesLeaveInfraErrorsOut(t *testing.T) {
	r := BatchResult{Episodes: 20, InfraErrors: 5, Succeeded: 12, RewardSum: 6}
	if r.Scored() != 15 || r.SuccessRate() != 0.8 || r.RewardMean() != 0.4 || r.MostlyInfra() {
		t.Errorf("%+v: scored %d, success %v, reward %v, mostly infra %v; want 15, 0.8, 0.4, false",
			r, r.Scored(), r.SuccessRate(), r.RewardMean(), r.MostlyInfra())
	}
	all := BatchResult{Episodes: 4, InfraErrors: 4}
	if all.Scored() != 0 || all.SuccessRate() != 0 || all.RewardMean() != 0 || !all.MostlyInfra() {
		t.Errorf("a batch of infra errors only: %+v", all)
	}
	if (BatchResult{Episodes: 4, InfraErrors: 2}).MostlyInfra() {
		t.Error("half infra errors counted as mostly infra errors")
	}
}

// infraBatches plays batches whose results a test scripts, one per call; the last one
// repeats.
type infraBatches struct {
	results []BatchResult // Episodes is a share of the batch asked: see run
	calls   []BatchInput
	rec     fakeBatches // the stage transitions recorded
}

// run returns the next scripted result scaled to the episodes asked: InfraErrors and
// Succeeded are per 20 episodes.
func (f *infraBatches) run(_ context.Context, in BatchInput) (BatchResult, error) {
	r := f.results[min(len(f.calls), len(f.results)-1)]
	f.calls = append(f.calls, in)
	r.RunID, r.Episodes = in.RunID, in.Episodes
	r.InfraErrors = r.InfraErrors * in.Episodes / 20
	r.Succeeded = r.Succeeded * in.Episodes / 20
	r.RewardSum = float64(r.Succeeded)
	return r, nil
}

func infraEnv(t *testing.T, f *infraBatches) *testsuite.TestWorkflowEnvironment {
	s := newSuite(t)
	env := s.NewTestWorkflowEnvironment()
	env.RegisterWorkflowWithOptions(Curriculum, workflow.RegisterOptions{Name: WorkflowCurriculum})
	env.RegisterActivityWithOptions(f.run, activity.RegisterOptions{Name: ActivityRunBatch})
	env.RegisterActivityWithOptions(f.rec.recordStage, activity.RegisterOptions{Name: ActivityRecordStage})
	return env
}

// A stage's promotion is decided on its scored episodes: 12 successes in each batch of
// 20 with 5 infra errors is a success rate of 0.8 (12 of 15), which promotes once the
// window holds 20 scored episodes. Counting the infra errors as failures (0.6) would
// run the stage to its budget and stop the curriculum.
func TestCurriculumPromotesOnScoredEpisodes(t *testing.T) {
	f := &infraBatches{results: []BatchResult{{InfraErrors: 5, Succeeded: 12}}}
	env := infraEnv(t, f)
	env.ExecuteWorkflow(WorkflowCurriculum, specJSON(t, `
stages:
  - {name: a, env: shop, policies: oracle=1, episodes: {min: 20, max: 60}, batch: 20, promotion: {metric: success_rate, threshold: 0.8, window: 20}}
`), nil)
	p := result(t, env)
	if p.Status != StatusCompleted || len(p.Reports) != 1 {
		t.Fatalf("got %+v; want completed, the stage promoted", p)
	}
	r := p.Reports[0]
	if r.Outcome != OutcomePromoted || r.Episodes != 40 || r.InfraErrors != 10 || r.Succeeded != 24 || r.WindowValue != 0.8 || r.Batches != 2 {
		t.Errorf("report %+v; want promoted after 2 batches, 40 episodes of which 10 infra errors, 24 successes, window 0.8", r)
	}
}

// The budget counts scored episodes: a stage of at most 40 whose batches are a quarter
// infra errors runs on past 40 ended episodes until 40 were scored.
func TestCurriculumBudgetCountsScoredEpisodes(t *testing.T) {
	f := &infraBatches{results: []BatchResult{{InfraErrors: 5, Succeeded: 0}}}
	env := infraEnv(t, f)
	env.ExecuteWorkflow(WorkflowCurriculum, specJSON(t, `
stages:
  - {name: a, env: shop, policies: random=1, episodes: {min: 20, max: 40}, batch: 20, promotion: {metric: success_rate, threshold: 0.8, window: 20}}
`), nil)
	p := result(t, env)
	if p.Status != StatusStopped || len(p.Reports) != 1 {
		t.Fatalf("got %+v; want stopped after the budget", p)
	}
	// 20 (15 scored), 20 (30), then the 10 the budget holds (2 infra errors: 38), then 2.
	r := p.Reports[0]
	if r.Outcome != OutcomeNotPromoted || r.Episodes-r.InfraErrors != 40 || r.InfraErrors == 0 {
		t.Errorf("report %+v; want not_promoted after 40 scored episodes", r)
	}
	if f.calls[2].Episodes != 10 {
		t.Errorf("third batch asked %d episodes; want the 10 the budget still holds", f.calls[2].Episodes)
	}
}

// A batch mostly of infra errors takes no stage decision: the curriculum pauses itself,
// saying why, and a resume goes on with the stage; the infra errors spend none of its
// budget. Counting them, the stage would stop at once (its budget is one batch), not
// promoted, on what the model endpoint did.
func TestCurriculumPausesOnABatchOfInfraErrors(t *testing.T) {
	f := &infraBatches{results: []BatchResult{{InfraErrors: 20, InfraByKind: map[string]uint64{"model_endpoint": 18, "sandbox": 2}}, {Succeeded: 20}}}
	env := infraEnv(t, f)
	var paused Progress
	env.RegisterDelayedCallback(func() {
		v, err := env.QueryWorkflow(QueryProgress)
		if err != nil {
			t.Error(err)
			return
		}
		if err := v.Get(&paused); err != nil {
			t.Error(err)
		}
		if len(f.calls) != 1 {
			t.Errorf("%d batches ran while paused; want 1", len(f.calls))
		}
		env.SignalWorkflow(SignalResume, nil)
	}, time.Hour)
	env.ExecuteWorkflow(WorkflowCurriculum, specJSON(t, `
stages:
  - {name: a, env: shop, policies: oracle=1, episodes: {min: 20, max: 20}, promotion: {metric: success_rate, threshold: 0.8, window: 20}}
`), nil)
	p := result(t, env)
	if paused.Status != StatusPaused || paused.StageInfraErrors != 20 || paused.StageEpisodes != 20 || paused.WindowEpisodes != 0 ||
		paused.StageInfraByKind["model_endpoint"] != 18 || paused.StageInfraByKind["sandbox"] != 2 ||
		!strings.Contains(paused.PauseReason, "20 of 20 episodes ended as infra errors (model_endpoint 18, sandbox 2)") || !strings.Contains(paused.PauseReason, "resume once the cause is fixed") {
		t.Errorf("progress while paused: %+v; want paused, 20 infra errors, the reason", paused)
	}
	if p.Status != StatusCompleted || len(p.Reports) != 1 || p.PauseReason != "" {
		t.Fatalf("got %+v; want completed after the resume, no pause reason left", p)
	}
	if p.StageInfraByKind != nil {
		t.Errorf("infra errors by kind %v left after the stage closed", p.StageInfraByKind)
	}
	if r := p.Reports[0]; r.Outcome != OutcomePromoted || r.Episodes != 40 || r.InfraErrors != 20 || r.Batches != 2 || r.WindowValue != 1 {
		t.Errorf("report %+v; want promoted after 2 batches, 20 of 40 episodes infra errors", r)
	}
	// The stage's report keeps them by kind, as its progress showed them.
	if r := p.Reports[0]; len(r.InfraByKind) != 2 || r.InfraByKind["model_endpoint"] != 18 || r.InfraByKind["sandbox"] != 2 {
		t.Errorf("report's infra errors by kind %v; want model_endpoint 18, sandbox 2", r.InfraByKind)
	}
	// And so does its record in ClickHouse (curriculum_stages), sorted by kind.
	if len(f.rec.stages) != 1 || !slices.Equal(f.rec.stages[0].InfraKinds, []string{"model_endpoint", "sandbox"}) || !slices.Equal(f.rec.stages[0].InfraCounts, []uint64{18, 2}) {
		t.Errorf("recorded stage transitions %v; want one, with model_endpoint 18, sandbox 2", f.rec.stages)
	}
}

// A run's infra errors by kind, as the scheduler counts them (entry k: InfraKind k), are
// named for people and for the pause's reason.
func TestInfraKindsNamed(t *testing.T) {
	kinds := InfraKinds([]uint64{1, 0, 3, 2})
	if len(kinds) != 3 || kinds["unknown"] != 1 || kinds["model_endpoint"] != 3 || kinds["sandbox"] != 2 {
		t.Errorf("InfraKinds = %v", kinds)
	}
	if got := FormatInfraKinds(kinds); got != "model_endpoint 3, sandbox 2, unknown 1" {
		t.Errorf("FormatInfraKinds = %q", got)
	}
	if InfraKinds(nil) != nil || InfraKinds([]uint64{0, 0}) != nil || FormatInfraKinds(nil) != "" {
		t.Error("no infra error named something")
	}
}
