package trajectory

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// rescoreSpec reads every signal steps gained in migration 10 (budget, deadline,
// progress_delta, a violation's suggestion) and the metering the worker measured before
// scoring (policy_ns) and after it (reward_ns, 0 when scored), with state across steps,
// a task verifier's named numbers on each episode's last step (migration 12), the
// action (tool and arguments), which a repeat detector reads, the kinds of the faults a
// step met, which the detectors read (they hold their count on a step a fault answered),
// and the limits a step hit (migration 15), recorded in the safety events before it (and
// scored so).
const rescoreSpec = `name: rescore
version: "1"
components:
  - {name: task, builtin: task, weight: 1}
  - {name: timeliness, builtin: timeliness, weight: 0.5}
  - {name: thrift, expr: "signals.budget > 0.0 ? -signals.spend / signals.budget : 0.0", weight: 0.3}
  - {name: advice, expr: "size(signals.violations) > 0 && signals.violations[0].suggestion != '' ? -1.0 : 0.0", weight: 0.2}
  - {name: latency, expr: "double(metering.policy_ns + metering.reward_ns) / 1e6", weight: 0.1, normalise: [{zscore: {window: 3}}]}
  - {name: progress, potential: {expr: signals.progress, gamma: 0.9}, weight: 0.4}
  - {name: delta, expr: "signals.progress_delta * double(episode.steps)", weight: 0.05, normalise: [{clip: [-1, 1]}]}
  - {name: repeat, detector: {kind: repeat, window: 3, faults: hold}, weight: 0.1}
  - {name: idle, detector: {kind: idle, window: 3, faults: hold}, weight: 0.1}
  - {name: tests, verifier: tests, weight: 0.5}
  - {name: style, expr: "'style' in verifier ? verifier.style - 0.5 : 0.0", weight: 0.25}
  - {name: safety, builtin: safety, weight: 0.5}
  - {name: limits, expr: "-double(size(signals.limits))", weight: 0.1}
`

// rescoreRun writes a run of episodes × steps scored under spec, as the pipeline does: each
// step scored with its episode's state before its reward_ns is measured, then recorded.
func rescoreRun(t *testing.T, w *Writer, runID string, spec scoring.Spec, episodes, steps int) {
	t.Helper()
	var events []*gauntletv1.Event
	for e := range episodes {
		var state gauntletv1.RewardState
		for i := range steps {
			ev := stepEvent(runID, e, i)
			st := ev.GetStep()
			st.Signals.Spend = float64((i*7+e)%11) * 3.1
			st.Signals.Budget = float64(100 + e)
			st.Signals.ProgressDelta = float64((i+e)%5)/7 - 0.2
			st.Signals.Progress = float64((i*3+e)%10) / 9
			st.Signals.DeadlineVirtualNs = int64(1+e%3) * 1_000_000_000
			st.Metering.PolicyNs = uint64(1_000_000 + (i*e%13)*250_000)
			st.Terminated = i == steps-1 && e%2 == 0
			if i >= 4 && i < 10 { // one search six times in a row: the repeat detector reads actions
				st.Action.ArgsJson = `{"query":"usb-c cable"}`
			}
			faultsMet(st, e, i)
			hitLimit(st, e, i)
			if i == steps-1 {
				st.Signals.VerifierNames = []string{"style", "tests"}
				st.Signals.VerifierValues = []float64{float64(e%4) / 3, float64(e%3) / 2}
			}
			st.Score = scoring.ScoreState(spec, &state, st)
			st.Metering.RewardNs = uint64(300_000 + i*1000) // measured after scoring
			events = append(events, ev)
		}
		end := endEvent(runID, e, steps, requestedAt+9e9)
		end.GetEnded().Episode.RewardSpec = spec.Digest
		events = append(events, end)
	}
	if _, err := w.Write(context.Background(), events); err != nil {
		t.Fatal(err)
	}
}

// faultsMet gives steps of episode e faults: a truncation that answered the 6th (one of
// the six searches in a row) in odd episodes, a 503 that answered the 2nd in even ones,
// and a latency, which answers nothing, on every third.
func faultsMet(st *gauntletv1.StepTaken, e, i int) {
	if i%3 == 0 {
		st.Faults = append(st.Faults, &gauntletv1.FaultFired{FaultId: "lat", Kind: "latency", Target: "catalog/catalog.search", Detail: "latency_ms=40.0"})
	}
	switch {
	case e%2 == 1 && i == 5:
		st.Faults = append(st.Faults, &gauntletv1.FaultFired{FaultId: "cut", Kind: "truncate", Target: "catalog/catalog.search", Detail: "keep_fraction=0.50"})
	case e%2 == 0 && i == 1:
		st.Faults = append(st.Faults, &gauntletv1.FaultFired{FaultId: "down", Kind: "http_error", Target: "catalog/catalog.search", Detail: "status=503 retry_after_ms=0"})
	}
}

// hitLimit makes every sixth step of episode e hit a limit: in its limits (migration 15)
// in even episodes, in its safety events, as recorded before, in odd ones.
func hitLimit(st *gauntletv1.StepTaken, e, i int) {
	if i%6 != 2 {
		return
	}
	if e%2 == 0 {
		st.Signals.Limits = []string{"timeout: killed after 30s"}
	} else {
		st.Signals.SafetyEvents = []string{"timeout: killed after 30s"}
	}
}

type digestSpecs map[string]scoring.Spec

func (d digestSpecs) Get(_ context.Context, digest string) (scoring.Spec, error) {
	if s, ok := d[digest]; ok {
		return s, nil
	}
	return scoring.Spec{}, fmt.Errorf("no spec %s", digest)
}

// A run recorded under a stateful spec re-scores, from its rows alone, to its recorded
// scores bit for bit, under that spec; under another it lands beside them in step_scores,
// and the two compare in SQL. A re-score cancelled after its first batch finishes when
// run again, and step_scores FINAL then holds every step once with the values a re-score
// in one go gives.
func TestRescore(t *testing.T) {
	ctx := context.Background()
	conn := setup(t)
	query1 := func(t *testing.T, sql string) string {
		t.Helper()
		_, rows, err := Query(ctx, conn, sql)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 1 || len(rows[0]) != 1 {
			t.Fatalf("%s: %v, want one value", sql, rows)
		}
		return rows[0][0]
	}
	shaped, err := scoring.Parse("rescore.yaml", []byte(rescoreSpec))
	if err != nil {
		t.Fatal(err)
	}
	const episodes, steps = 10, 14
	w := NewWriter(conn, testDB).WithRewardSpecs(digestSpecs{shaped.Digest: shaped})
	rescoreRun(t, w, "run-s", shaped, episodes, steps)

	res, err := Rescore(ctx, conn, testDB, "run-s", shaped, RescoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := (RescoreResult{Episodes: episodes, Scored: episodes, Steps: episodes * steps, Compared: episodes * steps}); res != want {
		t.Fatalf("rescore under the recorded spec: %+v, want %+v", res, want)
	}
	// The same in SQL, every value of every step, to the bit (reinterpretAsUInt64 would
	// be exact too; Float64 equality is, for values that are never NaN or -0).
	if got := query1(t, `SELECT toString(count()) || ' ' || toString(countIf(s.reward != r.reward OR s.reward_values != r.reward_values))
		FROM `+testDB+`.steps_final AS s
		ANY INNER JOIN (SELECT episode_id, step, reward, reward_values FROM `+testDB+`.step_scores_final
			WHERE run_id = 'run-s' AND spec_digest = '`+shaped.Digest+`') AS r USING (episode_id, step)
		WHERE run_id = 'run-s'`); got != fmt.Sprint(episodes*steps, " 0") {
		t.Errorf("re-scored against recorded (steps, differing): %s", got)
	}

	// Under the default spec, cancelled after the first batch of 3 episodes (a crash
	// between batches; one inside a batch leaves part of it, which the next call redoes).
	def := scoring.SpecFor("shop")
	cctx, cancel := context.WithCancel(ctx)
	res, err = Rescore(cctx, conn, testDB, "run-s", def, RescoreOptions{Episodes: 3, Progress: func(RescoreResult) { cancel() }})
	if !errors.Is(err, context.Canceled) || res.Scored != 3 || res.Compared != 0 {
		t.Fatalf("cancelled re-score: %+v, %v; want 3 episodes scored, then context canceled", res, err)
	}
	res, err = Rescore(ctx, conn, testDB, "run-s", def, RescoreOptions{Episodes: 3})
	if err != nil {
		t.Fatal(err)
	}
	if want := (RescoreResult{Episodes: episodes, Done: 3, Scored: episodes - 3, Steps: (episodes - 3) * steps}); res != want {
		t.Fatalf("resumed re-score: %+v, want %+v", res, want)
	}
	// Once more: nothing left, nothing written.
	if res, err = Rescore(ctx, conn, testDB, "run-s", def, RescoreOptions{}); err != nil || res.Done != episodes || res.Steps != 0 {
		t.Fatalf("third re-score: %+v, %v; want every episode done", res, err)
	}
	// What one uninterrupted pass gives, in Go.
	var wantSum float64
	for e := range episodes {
		for i := range steps {
			st := stepEvent("run-s", e, i).GetStep()
			st.Signals.Spend = float64((i*7+e)%11) * 3.1
			st.Signals.Budget = float64(100 + e)
			st.Signals.ProgressDelta = float64((i+e)%5)/7 - 0.2
			st.Signals.Progress = float64((i*3+e)%10) / 9
			st.Signals.DeadlineVirtualNs = int64(1+e%3) * 1_000_000_000
			hitLimit(st, e, i)
			wantSum += scoring.Score(def, st).Total
		}
	}
	got := query1(t, `SELECT toString(count()) || ' ' || toString(uniqExact(episode_id, step)) || ' ' || toString(sum(reward)) || ' ' || spec
		FROM `+testDB+`.step_scores FINAL WHERE run_id = 'run-s' AND spec_digest = '`+def.Digest+`' GROUP BY spec`)
	want := query1(t, fmt.Sprintf(`SELECT toString(%d) || ' ' || toString(%d) || ' ' || toString(toFloat64(%v)) || ' default/1'`, episodes*steps, episodes*steps, wantSum))
	if got != want {
		t.Errorf("step_scores FINAL under default/1 (rows, steps, reward sum, spec): %s, want %s", got, want)
	}
	if raw := query1(t, `SELECT toString(count()) FROM `+testDB+`.step_scores WHERE run_id = 'run-s'`); raw == "0" {
		t.Error("step_scores has no rows")
	}

	// docs/rewards.md's side-by-side comparisons: per episode, the total under each spec;
	// per policy, the mean return under each.
	_, rows, err := Query(ctx, conn, `SELECT count(), countIf(total_a != total_b), toString(abs(sum(total_a) - `+fmt.Sprint(wantSum)+`) < 1e-9)
		FROM (
		SELECT episode_id, total_a, total_b, total_b - total_a AS change
		FROM (SELECT episode_id, sum(reward) AS total_a FROM `+testDB+`.step_scores FINAL
		      WHERE run_id = 'run-s' AND spec_digest = '`+def.Digest+`' GROUP BY episode_id)
		ANY INNER JOIN
		     (SELECT episode_id, sum(reward) AS total_b FROM `+testDB+`.step_scores FINAL
		      WHERE run_id = 'run-s' AND spec_digest = '`+shaped.Digest+`' GROUP BY episode_id)
		USING episode_id
		ORDER BY abs(change) DESC LIMIT 20)`)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(rows) != "[[10 10 1]]" {
		t.Errorf("episode totals side by side (episodes, differing, default's sum right): %v", rows)
	}
	_, rows, err = Query(ctx, conn, `SELECT policy, spec, count(), round(avg(total), 3) AS return_mean
		FROM (
		  SELECT episode_id, spec, sum(reward) AS total
		  FROM `+testDB+`.step_scores FINAL WHERE run_id = 'run-s'
		  GROUP BY episode_id, spec
		)
		ANY INNER JOIN (SELECT episode_id, policy FROM `+testDB+`.episodes FINAL WHERE run_id = 'run-s' AND infra_error = 0) USING episode_id
		GROUP BY policy, spec ORDER BY policy, spec`)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0][1] != "default/1" || rows[0][2] != "10" || rows[1][1] != "rescore/1" || rows[1][2] != "10" {
		t.Errorf("mean return per policy and spec: %v", rows)
	}
}

// leanSpec reads neither episode nor actions (loadtest/specs/eight-with-three-cel.yaml):
// scoring keeps only its potentials from step to step, and a worker sends no actions.
const leanSpec = `name: lean
version: "1"
components:
  - {name: task, builtin: task, weight: 1}
  - {name: cost, builtin: cost, weight: 0.2}
  - {name: safety, builtin: safety, weight: 0.5}
  - {name: timeliness, builtin: timeliness, weight: 0.1}
  - {name: causal, builtin: causal, weight: 0.3, normalise: [{scale: 2}, {clip: [-1, 0]}]}
  - {name: thrift, expr: "signals.budget > 0.0 ? -signals.spend / signals.budget : 0.0", weight: 0.1}
  - {name: careful, expr: "signals.invalid_action || size(signals.violations) > 0 ? -1.0 : 0.0", weight: 0.1}
  - {name: progress, potential: {expr: signals.progress, gamma: 0.99}, weight: 0.5}
`

// A run recorded under a spec whose state is only its potentials re-scores from its rows,
// whose actions it does not read, to its recorded scores bit for bit.
func TestRescoreLeanState(t *testing.T) {
	ctx := context.Background()
	conn := setup(t)
	lean, err := scoring.Parse("lean.yaml", []byte(leanSpec))
	if err != nil {
		t.Fatal(err)
	}
	if lean.ReadsActions() || !lean.Stateful() {
		t.Fatalf("lean spec: reads actions %v, stateful %v", lean.ReadsActions(), lean.Stateful())
	}
	const episodes, steps = 6, 12
	w := NewWriter(conn, testDB).WithRewardSpecs(digestSpecs{lean.Digest: lean})
	rescoreRun(t, w, "run-lean", lean, episodes, steps)
	res, err := Rescore(ctx, conn, testDB, "run-lean", lean, RescoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := (RescoreResult{Episodes: episodes, Scored: episodes, Steps: episodes * steps, Compared: episodes * steps}); res != want {
		t.Fatalf("rescore under the recorded spec: %+v, want %+v", res, want)
	}
}

// A run whose rows lack the scoring inputs (recorded before migration 10) is refused, not
// scored from zeros.
func TestRescoreRefusesRowsWithoutInputs(t *testing.T) {
	ctx := context.Background()
	conn := setup(t)
	w := NewWriter(conn, testDB)
	if _, err := w.Write(ctx, runEvents("run-o", 2, 3)); err != nil {
		t.Fatal(err)
	}
	old, err := EpisodeSteps(ctx, conn, testDB, "run-o-ep-000001")
	if err != nil || len(old) != 3 {
		t.Fatalf("steps: %d, %v", len(old), err)
	}
	// An older writer's rows: the same step, later, without the new columns.
	old[1].ScoringInputs, old[1].Budget, old[1].Version = false, 0, old[1].Version+1
	if err := insert(ctx, conn, testDB, "steps", stepColumns, old[1:2], new(scratch)); err != nil {
		t.Fatal(err)
	}
	_, err = Rescore(ctx, conn, testDB, "run-o", scoring.SpecFor("shop"), RescoreOptions{})
	if !errors.Is(err, ErrNotRescorable) {
		t.Fatalf("rescore of rows without inputs: %v, want ErrNotRescorable", err)
	}
	if _, err := Rescore(ctx, conn, testDB, "no-such-run", scoring.SpecFor("shop"), RescoreOptions{}); err == nil {
		t.Fatal("rescore of a run with no steps succeeded")
	}
}
