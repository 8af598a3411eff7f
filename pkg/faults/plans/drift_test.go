package plans_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

func pts(xy ...float64) []*gauntletv1.DriftPoint {
	out := make([]*gauntletv1.DriftPoint, 0, len(xy)/2)
	for i := 0; i+1 < len(xy); i += 2 {
		out = append(out, &gauntletv1.DriftPoint{At: xy[i], Value: xy[i+1]})
	}
	return out
}

func drift(sel string, shape gauntletv1.DriftShape, xy ...float64) *gauntletv1.Drift {
	return &gauntletv1.Drift{Selector: sel, Schedule: &gauntletv1.DriftSchedule{Shape: shape, Points: pts(xy...)}}
}

const (
	step      = gauntletv1.DriftShape_DRIFT_SHAPE_STEP
	linear    = gauntletv1.DriftShape_DRIFT_SHAPE_LINEAR
	piecewise = gauntletv1.DriftShape_DRIFT_SHAPE_PIECEWISE
)

func TestEvalSchedule(t *testing.T) {
	tests := []struct {
		name string
		d    *gauntletv1.Drift
		x    []float64
		want []float64
	}{
		{"step holds", drift("", step, 0, 1, 10, 2, 20, 3), []float64{0, 9.99, 10, 15, 20, 1e9}, []float64{1, 1, 2, 2, 3, 3}},
		{"step before first point", drift("", step, 5, 7), []float64{0, 5}, []float64{7, 7}},
		{"linear ramps and clamps", drift("", linear, 0, 20, 100, 520), []float64{0, 50, 99, 100, 500}, []float64{20, 270, 515, 520, 520}},
		{"piecewise", drift("", piecewise, 0, 0, 10, 1, 20, 0), []float64{5, 10, 15, 30}, []float64{0.5, 1, 0.5, 0}},
	}
	for _, tt := range tests {
		for i, x := range tt.x {
			if got := plans.EvalSchedule(tt.d.Schedule, x); math.Abs(got-tt.want[i]) > 1e-12 {
				t.Errorf("%s: at %v = %v, want %v", tt.name, x, got, tt.want[i])
			}
		}
	}
}

func TestValidateDrift(t *testing.T) {
	tests := []struct {
		name  string
		drift []*gauntletv1.Drift
		want  []string
	}{
		{name: "valid", drift: []*gauntletv1.Drift{
			drift("*.latency.mean_ms", linear, 0, 20, 1000, 500),
			drift("payment.http_503.probability", step, 0, 0.01, 10, 0.5),
			drift("shipping.truncate.keep_fraction", piecewise, 0, 0.9, 5, 0.5, 9, 0.1),
		}},
		{name: "no drift"},
		{name: "selector shape", drift: []*gauntletv1.Drift{drift("latency.mean_ms", step, 0, 1)},
			want: []string{`drift[0].selector: "latency.mean_ms": want <service|*>.<fault>.<param>`}},
		{name: "unknown fault", drift: []*gauntletv1.Drift{drift("*.chaos.mean_ms", step, 0, 1)},
			want: []string{`drift[0].selector: "*.chaos.mean_ms": unknown fault "chaos" (known: http_401`}},
		{name: "wrong param for kind", drift: []*gauntletv1.Drift{drift("*.latency.keep_fraction", step, 0, 1)},
			want: []string{`fault latency (kind latency) has no parameter "keep_fraction" (known: probability, mean_ms, jitter_ms)`}},
		{name: "partial wildcard", drift: []*gauntletv1.Drift{drift("pay*.latency.mean_ms", step, 0, 1)},
			want: []string{`service must be a name or "*"`}},
		{name: "probability over 1", drift: []*gauntletv1.Drift{drift("*.http_429.probability", linear, 0, 0, 10, 1.5)},
			want: []string{`drift[0].schedule.points[1].value: *.http_429.probability: 1.5 is above the maximum 1 probability`}},
		{name: "negative latency", drift: []*gauntletv1.Drift{drift("*.latency.mean_ms", step, 0, -1)},
			want: []string{`points[0].value: *.latency.mean_ms: -1 is below the minimum 0 ms`}},
		{name: "status not whole", drift: []*gauntletv1.Drift{drift("*.http_500.status", step, 0, 500.5)},
			want: []string{`500.5 is not a whole number of status`}},
		{name: "linear needs 2", drift: []*gauntletv1.Drift{drift("*.latency.mean_ms", linear, 0, 1, 2, 3, 4, 5)},
			want: []string{`drift[0].schedule.points: a linear schedule needs exactly 2 points, got 3`}},
		{name: "out of order", drift: []*gauntletv1.Drift{drift("*.latency.mean_ms", piecewise, 0, 1, 5, 2, 5, 3)},
			want: []string{`drift[0].schedule.points[2].at: 5 is not after points[1].at 5`}},
		{name: "NaN at", drift: []*gauntletv1.Drift{drift("*.latency.mean_ms", step, math.NaN(), 1)},
			want: []string{`points[0].at: NaN must be a finite number >= 0`}},
		{name: "duplicate selector", drift: []*gauntletv1.Drift{drift("*.latency.mean_ms", step, 0, 1), drift("*.latency.mean_ms", step, 0, 2)},
			want: []string{`drift[1].selector: "*.latency.mean_ms" already drifts at drift[0]`}},
		{name: "missing schedule", drift: []*gauntletv1.Drift{{Selector: "*.latency.mean_ms"}}, want: []string{"drift[0].schedule: missing schedule"}},
		{name: "wall time without origin", drift: []*gauntletv1.Drift{{Selector: "*.latency.mean_ms", Schedule: &gauntletv1.DriftSchedule{
			Axis: gauntletv1.DriftAxis_DRIFT_AXIS_WALL_TIME, Points: pts(0, 1)}}},
			want: []string{"drift[0].schedule.origin_unix_nano: a wall-time schedule needs a positive origin"}},
		{name: "unknown shape", drift: []*gauntletv1.Drift{drift("*.latency.mean_ms", 9, 0, 1)}, want: []string{"drift[0].schedule.shape: unknown shape 9"}},
		{name: "missing entry", drift: []*gauntletv1.Drift{nil}, want: []string{"drift[0]: missing drift"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantErrs(t, plans.ValidateDrift(tt.drift), tt.want...)
		})
	}
}

// TestDriftChangesNumbersNotDraws: drift overrides parameters and records them, but the
// plan's seed, rule ids and structure stay, so no random stream is reseeded.
func TestDriftChangesNumbersNotDraws(t *testing.T) {
	for seed := uint64(0); seed < 200; seed++ {
		plain, err := plans.Derive(seed, plans.ProfileEdge, shopServices)
		if err != nil {
			t.Fatal(err)
		}
		drifted, _ := plans.Derive(seed, plans.ProfileEdge, shopServices)
		vals := []*gauntletv1.DriftValue{
			{Selector: "*.latency.mean_ms", Value: 400, Source: plans.DriftSourceGlobal},
			{Selector: "payment.http_503.probability", Value: 0.25, Source: plans.DriftSourceRun},
			{Selector: "payment.http_503.retry_after_ms", Value: 1234.4, Source: plans.DriftSourceRun},
		}
		if err := plans.ApplyDrift(drifted, vals); err != nil {
			t.Fatal(err)
		}
		if drifted.Seed != plain.Seed || len(drifted.Rules) != len(plain.Rules) || len(drifted.DriftValues) != 3 {
			t.Fatalf("seed %d: drift changed the plan's structure", seed)
		}
		for i, r := range drifted.Rules {
			p := plain.Rules[i]
			if r.Id != p.Id {
				t.Fatalf("rule %d id %s became %s", i, p.Id, r.Id)
			}
			switch {
			case r.GetLatency() != nil && r.Id[len(r.Id)-len(".latency"):] == ".latency":
				if r.GetLatency().MeanMs != 400 || r.GetLatency().JitterMs != p.GetLatency().JitterMs {
					t.Fatalf("%s: latency %v, want mean 400 and jitter kept", r.Id, r.GetLatency())
				}
			case r.Id == "payment.http_503":
				if r.Probability != 0.25 || r.GetHttpError().RetryAfterMs != 1234 {
					t.Fatalf("%s: %v", r.Id, r)
				}
			default:
				if r.String() != p.String() {
					t.Fatalf("%s changed: %v -> %v", r.Id, p, r)
				}
			}
		}
		if err := plans.Validate(drifted); err != nil {
			t.Fatal(err)
		}
	}
	bad := &gauntletv1.FaultPlan{}
	err := plans.ApplyDrift(bad, []*gauntletv1.DriftValue{{Selector: "*.latency.mean_ms", Value: -3}})
	wantErrs(t, err, "drift_values[0].value: *.latency.mean_ms: -3 is below the minimum 0 ms")
	if len(bad.DriftValues) != 0 {
		t.Fatal("a rejected drift was recorded")
	}
}

func TestDriftValuesOnBothAxes(t *testing.T) {
	origin := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ds := []*gauntletv1.Drift{
		drift("*.latency.mean_ms", linear, 0, 0, 100, 1000),
		{Selector: "*.http_429.probability", Schedule: &gauntletv1.DriftSchedule{
			Shape: step, Axis: gauntletv1.DriftAxis_DRIFT_AXIS_WALL_TIME, OriginUnixNano: origin.UnixNano(), Points: pts(0, 0.01, 60, 0.2)}},
	}
	if err := plans.ValidateDrift(ds); err != nil {
		t.Fatal(err)
	}
	got := plans.DriftValues(ds, plans.DriftPosition{Index: 25, At: origin.Add(90 * time.Second)}, plans.DriftSourceRun)
	if got[0].Value != 250 || got[1].Value != 0.2 || got[0].Source != "run" {
		t.Fatalf("values = %v", got)
	}
	got = plans.DriftValues(ds, plans.EpisodePosition(&gauntletv1.EpisodeRequested{Index: 50, RequestedAtUnixNano: origin.Add(59 * time.Second).UnixNano()}), plans.DriftSourceGlobal)
	if got[0].Value != 500 || got[1].Value != 0.01 {
		t.Fatalf("values = %v", got)
	}
}

// TestDriftReachesUserDefinedProfiles: a selector may name a user-defined profile's fault
// by its id; the run's drift then changes that fault's rules in the profile's plans, on
// every service it targets (tools by their service), and nothing else.
func TestDriftReachesUserDefinedProfiles(t *testing.T) {
	c, err := plans.CompileCustomProfiles([]*gauntletv1.CustomProfile{{Name: "flaky-shop", SpecYaml: flakyShop}})
	if err != nil {
		t.Fatal(err)
	}
	const text = "payment.pay-429.probability=step(0:0.9);*.lat.mean_ms=linear(0:100,10:300);catalog.cut.keep_fraction=step(0:0.5)"
	d, err := plans.ParseDriftFor(text, time.Unix(0, 0), c)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := c.Plan(5, "flaky-shop", shopServices)
	if err != nil {
		t.Fatal(err)
	}
	before := map[string]string{}
	for _, r := range plan.Rules {
		before[r.Id] = r.String()
	}
	if err := plans.ApplyDrift(plan, plans.DriftValues(d, plans.DriftPosition{Index: 5}, plans.DriftSourceRun)); err != nil {
		t.Fatal(err)
	}
	changed := 0
	for _, r := range plan.Rules {
		switch {
		case r.Id == "payment.pay-429":
			if r.Probability != 0.9 {
				t.Errorf("%s: probability %v, want 0.9", r.Id, r.Probability)
			}
		case strings.HasSuffix(r.Id, ".lat"):
			if r.GetLatency().MeanMs != 200 {
				t.Errorf("%s: mean_ms %v, want 200 (half way from 100 to 300)", r.Id, r.GetLatency().MeanMs)
			}
		case r.Id == "catalog.search.cut":
			if r.GetTruncate().KeepFraction != 0.5 {
				t.Errorf("%s: keep_fraction %v, want 0.5", r.Id, r.GetTruncate().KeepFraction)
			}
		default:
			t.Errorf("rule %s is not drifted", r.Id)
		}
		if r.String() != before[r.Id] {
			changed++
		}
	}
	if changed != len(plan.Rules) || len(plan.DriftValues) != 3 {
		t.Errorf("%d of %d rules changed, %d drift values recorded; want all, 3", changed, len(plan.Rules), len(plan.DriftValues))
	}
	if err := plans.Validate(plan); err != nil {
		t.Fatal(err)
	}

	// Without the profile, or for a parameter its kind lacks, the selector is refused
	// naming what is known.
	_, err = plans.ParseDrift("payment.pay-429.probability=step(0:0.9)", time.Unix(0, 0))
	wantErrs(t, err, `unknown fault "pay-429"`)
	_, err = plans.ParseDriftFor("payment.pay-429.mean_ms=step(0:9)", time.Unix(0, 0), c)
	wantErrs(t, err, `fault pay-429 (kind http_error) has no parameter "mean_ms" (known: probability, status, retry_after_ms)`)
	_, err = plans.ParseDriftFor("payment.pay-430.probability=step(0:0.9)", time.Unix(0, 0), c)
	wantErrs(t, err, `unknown fault "pay-430"`, "flaky-shop: cut, lat, pay-429")
	// The faults a built-in plan has are still addressed by their catalogue names.
	if _, err := plans.ParseDriftFor("payment.http_503.probability=step(0:0.2)", time.Unix(0, 0), c); err != nil {
		t.Fatal(err)
	}
}
