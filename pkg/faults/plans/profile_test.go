package plans_test

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

func share(name string, weight uint32) *gauntletv1.Share {
	return &gauntletv1.Share{Name: name, Weight: weight}
}

// wantErrs checks that err mentions every string of want, or is nil when want is empty.
func wantErrs(t *testing.T, err error, want ...string) {
	t.Helper()
	if len(want) == 0 {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("no error, want one mentioning %q", want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
}

// within5Sigma fails unless hits out of n trials is within five binomial standard deviations
// of n*p.
func within5Sigma(t *testing.T, what string, hits, n int, p float64) {
	t.Helper()
	mean, sd := float64(n)*p, math.Sqrt(float64(n)*p*(1-p))
	if d := math.Abs(float64(hits) - mean); d > 5*sd {
		t.Errorf("%s: %d of %d, want %.0f ± %.0f (5 sigma)", what, hits, n, mean, 5*sd)
	}
}

func TestProfiles(t *testing.T) {
	got := plans.Profiles()
	if want := []string{"baseline", "edge", "stress"}; !slices.Equal(got, want) {
		t.Fatalf("Profiles() = %v, want %v", got, want)
	}
	got[0] = "mutated"
	if plans.Profiles()[0] != "baseline" {
		t.Fatal("Profiles returned the package's own slice")
	}
}

func TestValidateMix(t *testing.T) {
	tests := []struct {
		name string
		mix  []*gauntletv1.Share
		want []string // substrings of the error; none means valid
	}{
		{name: "empty means default", mix: nil},
		{name: "default", mix: plans.DefaultMix()},
		{name: "zero weights allowed beside a positive one", mix: []*gauntletv1.Share{share("baseline", 0), share("edge", 1)}},
		{
			name: "unknown name",
			mix:  []*gauntletv1.Share{share("baseline", 1), share("foo", 1)},
			want: []string{`profiles[1].name: unknown profile "foo" (known: baseline, edge, stress)`},
		},
		{
			name: "duplicate name",
			mix:  []*gauntletv1.Share{share("stress", 1), share("edge", 1), share("stress", 2)},
			want: []string{`profiles[2].name: duplicate profile "stress" (first at profiles[0])`},
		},
		{
			name: "zero total",
			mix:  []*gauntletv1.Share{share("baseline", 0), share("edge", 0)},
			want: []string{"profiles: total weight is 0"},
		},
		{name: "missing entry", mix: []*gauntletv1.Share{nil, share("edge", 1)}, want: []string{"profiles[0]: missing share"}},
		{
			name: "every problem at once",
			mix:  []*gauntletv1.Share{share("", 0), share("edge", 0), share("edge", 0)},
			want: []string{`profiles[0].name: unknown profile ""`, `profiles[2].name: duplicate profile "edge"`, "total weight is 0"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantErrs(t, plans.ValidateMix(tt.mix), tt.want...)
		})
	}
}

func TestValidateMixWrapsErrUnknownProfile(t *testing.T) {
	err := plans.ValidateMix([]*gauntletv1.Share{share("foo", 1)})
	if !errors.Is(err, plans.ErrUnknownProfile) {
		t.Fatalf("errors.Is(%v, ErrUnknownProfile) = false", err)
	}
	_, err = plans.ChooseProfile(1, []*gauntletv1.Share{share("foo", 1)})
	if !errors.Is(err, plans.ErrUnknownProfile) {
		t.Fatalf("ChooseProfile: errors.Is(%v, ErrUnknownProfile) = false", err)
	}
}

func TestChooseProfileIsDeterministic(t *testing.T) {
	for seed := uint64(0); seed < 1000; seed++ {
		a, err := plans.ChooseProfile(seed, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := plans.ChooseProfile(seed, plans.DefaultMix())
		if a != b {
			t.Fatalf("seed %d: empty mix chose %q, DefaultMix chose %q", seed, a, b)
		}
	}
}

func TestChooseProfileFollowsWeights(t *testing.T) {
	const n = 100_000
	tests := []struct {
		name string
		mix  []*gauntletv1.Share
		want map[string]float64
	}{
		{name: "default", mix: nil, want: map[string]float64{"baseline": 0.60, "stress": 0.25, "edge": 0.15}},
		{name: "zero weight never chosen", mix: []*gauntletv1.Share{share("baseline", 0), share("edge", 3), share("stress", 1)},
			want: map[string]float64{"baseline": 0, "edge": 0.75, "stress": 0.25}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			counts := map[string]int{}
			for seed := uint64(0); seed < n; seed++ {
				p, err := plans.ChooseProfile(seed, tt.mix)
				if err != nil {
					t.Fatal(err)
				}
				counts[p]++
			}
			for name, p := range tt.want {
				within5Sigma(t, name, counts[name], n, p)
			}
		})
	}
}
