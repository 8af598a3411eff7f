package plans_test

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/faulttest"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

func TestValidatePlan(t *testing.T) {
	good := faulttest.HTTPError("payment.http_503", "payment", 0.1, 503, 100)
	tests := []struct {
		name  string
		rules []*gauntletv1.FaultRule
		want  []string // substrings of the error; none means valid
	}{
		{name: "valid", rules: []*gauntletv1.FaultRule{good, faulttest.Latency("l", "*", 1, 0, 0), faulttest.Truncate("t", "payment.pay", 0, 0)}},
		{name: "no rules"},
		{name: "probability above 1", rules: []*gauntletv1.FaultRule{faulttest.HTTPError("a", "x", 1.5, 503, 0)}, want: []string{"rules[0].probability: 1.5 is outside [0,1]"}},
		{name: "negative probability", rules: []*gauntletv1.FaultRule{faulttest.HTTPError("a", "x", -0.1, 503, 0)}, want: []string{"rules[0].probability: -0.1"}},
		{name: "NaN probability", rules: []*gauntletv1.FaultRule{faulttest.HTTPError("a", "x", math.NaN(), 503, 0)}, want: []string{"rules[0].probability: NaN"}},
		{name: "status 200", rules: []*gauntletv1.FaultRule{faulttest.HTTPError("a", "x", 0.1, 200, 0)}, want: []string{"rules[0].http_error.status: 200 is not an HTTP error status"}},
		{name: "empty id", rules: []*gauntletv1.FaultRule{faulttest.HTTPError("", "x", 0.1, 503, 0)}, want: []string{"rules[0].id: must not be empty"}},
		{name: "duplicate id", rules: []*gauntletv1.FaultRule{good, good}, want: []string{`rules[1].id: duplicate id "payment.http_503"`}},
		{name: "empty target", rules: []*gauntletv1.FaultRule{faulttest.HTTPError("a", "", 0.1, 503, 0)}, want: []string{"rules[0].target: must not be empty"}},
		{name: "missing spec", rules: []*gauntletv1.FaultRule{{Id: "a", Target: "x"}}, want: []string{"rules[0]: no fault kind set"}},
		{name: "missing rule", rules: []*gauntletv1.FaultRule{good, nil}, want: []string{"rules[1]: missing rule"}},
		{name: "empty http_error", rules: []*gauntletv1.FaultRule{{Id: "a", Target: "x", Spec: &gauntletv1.FaultRule_HttpError{}}}, want: []string{"rules[0].http_error: missing"}},
		{name: "empty latency", rules: []*gauntletv1.FaultRule{{Id: "a", Target: "x", Spec: &gauntletv1.FaultRule_Latency{}}}, want: []string{"rules[0].latency: missing"}},
		{name: "empty truncate", rules: []*gauntletv1.FaultRule{{Id: "a", Target: "x", Spec: &gauntletv1.FaultRule_Truncate{}}}, want: []string{"rules[0].truncate: missing"}},
		{name: "negative mean", rules: []*gauntletv1.FaultRule{faulttest.Latency("a", "x", 1, -5, 1)}, want: []string{"rules[0].latency.mean_ms: -5"}},
		{name: "infinite jitter", rules: []*gauntletv1.FaultRule{faulttest.Latency("a", "x", 1, 5, math.Inf(1))}, want: []string{"rules[0].latency.jitter_ms: +Inf"}},
		{name: "latency beyond an hour", rules: []*gauntletv1.FaultRule{faulttest.Latency("a", "x", 1, 4e6, 0)}, want: []string{"rules[0].latency.mean_ms: 4e+06 is outside [0,3600000]"}},
		{name: "keep 1", rules: []*gauntletv1.FaultRule{faulttest.Truncate("a", "x", 1, 1)}, want: []string{"rules[0].truncate.keep_fraction: 1 is outside [0,1)"}},
		{
			name:  "every problem at once",
			rules: []*gauntletv1.FaultRule{faulttest.HTTPError("", "x", 2, 200, 0), good, good, {Id: "b", Target: "x"}},
			want:  []string{"rules[0].id", "rules[0].probability", "rules[0].http_error.status", "rules[2].id: duplicate", "rules[3]: no fault kind"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantErrs(t, plans.Validate(&gauntletv1.FaultPlan{Rules: tt.rules}), tt.want...)
		})
	}
	if err := plans.Validate(nil); err != nil {
		t.Errorf("Validate(nil) = %v", err)
	}
}

// FuzzValidatePlan feeds arbitrary wire bytes as a plan. Whatever they hold, Validate
// must not panic, and a plan it accepts must run through an Injector without panicking or
// producing an impossible Outcome.
func FuzzValidatePlan(f *testing.F) {
	for _, profile := range plans.Profiles() {
		p, err := plans.Derive(1, profile, shopServices)
		if err != nil {
			f.Fatal(err)
		}
		b, _ := proto.Marshal(p)
		f.Add(b)
	}
	for _, r := range []*gauntletv1.FaultRule{
		faulttest.HTTPError("a", "*", math.NaN(), 200, 0),
		faulttest.Latency("b", "payment.*", 1, 1e300, 1e300),
		faulttest.Truncate("c", "payment", 1, -1),
		{Id: "d", Target: "x", Spec: &gauntletv1.FaultRule_Latency{}},
	} {
		b, _ := proto.Marshal(&gauntletv1.FaultPlan{Rules: []*gauntletv1.FaultRule{r}})
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var plan gauntletv1.FaultPlan
		if proto.Unmarshal(data, &plan) != nil {
			return
		}
		if plans.Validate(&plan) != nil {
			return
		}
		in, err := inject.NewInjector(&plan)
		if err != nil {
			t.Fatalf("Validate accepted what NewInjector refused: %v", err)
		}
		body := []byte(strings.Repeat("x", 64))
		for i, c := range script(32) {
			out := in.Call(c.service, c.tool, time.Duration(i))
			if out.Latency < 0 || !(out.Keep >= 0 && out.Keep <= 1) {
				t.Fatalf("impossible outcome %+v", out)
			}
			if n := len(out.Truncate(body)); n > len(body) {
				t.Fatalf("Truncate grew the body to %d bytes", n)
			}
		}
	})
}

// TestValidateBigPlanFindsDuplicates covers the set used for plans of more than 64 rules.
func TestValidateBigPlanFindsDuplicates(t *testing.T) {
	var rules []*gauntletv1.FaultRule
	for i := range 70 {
		rules = append(rules, faulttest.HTTPError(fmt.Sprintf("r%d", i), "*", 0.1, 503, 0))
	}
	if err := plans.Validate(&gauntletv1.FaultPlan{Rules: rules}); err != nil {
		t.Fatal(err)
	}
	rules = append(rules, faulttest.HTTPError("r3", "*", 0.1, 503, 0), faulttest.HTTPError("r71", "*", 2, 503, 0))
	wantErrs(t, plans.Validate(&gauntletv1.FaultPlan{Rules: rules}), `rules[70].id: duplicate id "r3"`, "rules[71].probability: 2 is outside [0,1]")
}
