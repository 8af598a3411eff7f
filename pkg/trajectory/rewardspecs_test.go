package trajectory

import (
	"context"
	"fmt"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	"github.com/gauntlet-rl/gauntlet/pkg/rewardspecs"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// shapedSpec is a spec a run names: weights that are not the default's, an expression,
// normalisation and shaping.
const shapedSpec = `name: shaped
version: "7"
components:
  - {name: task, builtin: task, weight: 0.7}
  - {name: cost, builtin: cost, weight: 0.3, normalise: [{scale: 2}]}
  - {name: thrift, expr: "signals.budget > 0.0 ? -signals.spend / signals.budget : 0.0", weight: 0.15}
  - {name: calls, expr: double(metering.errors), weight: 0.05, normalise: [{zscore: {window: 3}}]}
  - {name: progress, potential: {expr: signals.progress, gamma: 0.97}, weight: 0.4}
`

// Steps scored under a named spec and under the default are recorded with their spec's
// digest, each spec once in reward_specs (its file, components, weights and rules), and
// every step's total is rebuilt in SQL from its values and the spec's weights, to the bit.
func TestRewardSpecsRecordedOnceAndTotalsRebuildInSQL(t *testing.T) {
	ctx := context.Background()
	conn := setup(t)
	b := bustest.Start(t)
	specs := rewardspecs.NewClient(b.JS)
	shaped, err := scoring.Parse("shaped.yaml", []byte(shapedSpec))
	if err != nil {
		t.Fatal(err)
	}
	if err := specs.Put(ctx, shaped); err != nil {
		t.Fatal(err)
	}
	w := NewWriter(conn, testDB).WithRewardSpecs(rewardspecs.NewClient(b.JS))
	const steps = 25
	for ep, spec := range []scoring.Spec{shaped, scoring.SpecFor("shop"), shaped} {
		var events []*gauntletv1.Event
		var state gauntletv1.RewardState
		for i := range steps {
			ev := stepEvent("run-r", ep, i)
			st := ev.GetStep()
			st.Signals.Spend, st.Signals.Progress = float64(i%9)*7.3, float64(i%10)/9
			st.Score = scoring.ScoreState(spec, &state, st)
			events = append(events, ev)
		}
		end := endEvent("run-r", ep, steps, requestedAt+9e9)
		if spec.Digest != scoring.DefaultDigest() {
			end.GetEnded().Episode.RewardSpec = spec.Digest
		}
		// Twice: reward_specs keeps one row per spec, whichever batch met it first.
		for range 2 {
			if _, err := w.Write(ctx, append(events, end)); err != nil {
				t.Fatal(err)
			}
		}
	}

	_, rows, err := Query(ctx, conn, "SELECT spec, name, spec_version, digest, components, weights, rules, source = '' FROM "+testDB+".reward_specs_final ORDER BY spec")
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"default/1", "default", "1", scoring.DefaultDigest(), "['task','cost','safety','timeliness','causal']", "[1,0.2,0.5,0.1,0.3]",
			"['builtin task','builtin cost','builtin safety','builtin timeliness','builtin causal']", "0"},
		{"shaped/7", "shaped", "7", shaped.Digest, "['task','cost','thrift','calls','progress']", "[0.7,0.3,0.15,0.05,0.4]",
			"['builtin task','builtin cost | scale 2','expr signals.budget > 0.0 ? -signals.spend / signals.budget : 0.0','expr double(metering.errors) | zscore window 3','potential gamma*phi(after) - phi(before), phi = signals.progress, gamma = 0.97']", "0"},
	}
	if fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Errorf("reward_specs:\n%v\nwant\n%v", rows, want)
	}
	_, rows, err = Query(ctx, conn, "SELECT count() FROM "+testDB+".reward_specs")
	if err != nil || rows[0][0] != "2" {
		t.Errorf("reward_specs has %v rows (%v), want each spec written once", rows, err)
	}

	// The query docs/querying.md gives to rebuild a total.
	_, rows, err = Query(ctx, conn, `SELECT reward_spec, count(), countIf(rebuilt != reward)
		FROM (
			SELECT reward_spec, reward_spec_digest, reward,
				arraySum(arrayMap((v, w) -> v * w, reward_values, weights)) AS rebuilt
			FROM `+testDB+`.steps_final
			ANY INNER JOIN (SELECT digest AS reward_spec_digest, weights FROM `+testDB+`.reward_specs_final)
			USING reward_spec_digest
		)
		GROUP BY reward_spec ORDER BY reward_spec`)
	if err != nil {
		t.Fatal(err)
	}
	if want := "[[default/1 25 0] [shaped/7 50 0]]"; fmt.Sprint(rows) != want {
		t.Errorf("rebuilt totals (spec, steps, differing) = %v, want %v", rows, want)
	}
	// docs/querying.md's contributions per component.
	_, rows, err = Query(ctx, conn, `SELECT reward_spec, name, count()
		FROM (
			SELECT reward_spec, reward_names, reward_values, weights
			FROM `+testDB+`.steps FINAL
			ANY INNER JOIN (SELECT digest AS reward_spec_digest, weights FROM `+testDB+`.reward_specs FINAL)
			USING reward_spec_digest
			WHERE run_id = 'run-r'
		)
		ARRAY JOIN reward_names AS name, reward_values AS v, weights AS w
		GROUP BY reward_spec, name ORDER BY reward_spec, name`)
	if err != nil {
		t.Fatal(err)
	}
	if want := "[[default/1 causal 25] [default/1 cost 25] [default/1 safety 25] [default/1 task 25] [default/1 timeliness 25] " +
		"[shaped/7 calls 50] [shaped/7 cost 50] [shaped/7 progress 50] [shaped/7 task 50] [shaped/7 thrift 50]]"; fmt.Sprint(rows) != want {
		t.Errorf("contributions: %v, want %v", rows, want)
	}
	_, rows, err = Query(ctx, conn, "SELECT episode_id, reward_spec_digest FROM "+testDB+".episodes_final ORDER BY episode_id")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || rows[0][1] != shaped.Digest || rows[1][1] != scoring.DefaultDigest() || rows[2][1] != shaped.Digest {
		t.Errorf("episodes' spec digests %v", rows)
	}
}
