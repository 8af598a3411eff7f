package scoring_test

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
)

func TestComponents(t *testing.T) {
	want := []string{"task", "cost", "safety", "timeliness", "causal"}
	if got := scoring.Components(); !slices.Equal(got, want) {
		t.Fatalf("Components() = %v, want %v", got, want)
	}
	var inSpec []string
	for _, w := range scoring.SpecFor("shop").Weights {
		inSpec = append(inSpec, w.Component)
	}
	if !slices.Equal(inSpec, want) {
		t.Errorf("default spec orders components %v, want %v", inSpec, want)
	}
}

func TestSpecFor(t *testing.T) {
	s := scoring.SpecFor("shop")
	if s.Env != "shop" || s.Version != "default/1" {
		t.Errorf("SpecFor(shop) = %q %q", s.Env, s.Version)
	}
	if err := s.Validate(); err != nil {
		t.Errorf("default spec invalid: %v", err)
	}
	s.Weights[0].Weight = 99
	if scoring.SpecFor("shop").Weights[0].Weight != 1 {
		t.Error("SpecFor shares its weights between callers")
	}
}

func TestSpecValidate(t *testing.T) {
	w := func(c string, v float64) scoring.Weight { return scoring.Weight{Component: c, Weight: v} }
	tests := []struct {
		name      string
		weights   []scoring.Weight
		noVersion bool
		want      []string // substrings of the error; none means valid
	}{
		{name: "valid", weights: []scoring.Weight{w("task", 1), w("cost", 0)}},
		{name: "unknown component", weights: []scoring.Weight{w("task", 1), w("charm", 1)},
			want: []string{`weights[1].component: unknown component "charm" (known: task, cost, safety, timeliness, causal)`}},
		{name: "negative weight", weights: []scoring.Weight{w("task", -1)}, want: []string{"weights[0].weight: -1 must be a finite number >= 0"}},
		{name: "NaN weight", weights: []scoring.Weight{w("task", math.NaN())}, want: []string{"weights[0].weight: NaN"}},
		{name: "infinite weight", weights: []scoring.Weight{w("task", math.Inf(1))}, want: []string{"weights[0].weight: +Inf"}},
		{name: "duplicate", weights: []scoring.Weight{w("cost", 1), w("task", 1), w("cost", 2)},
			want: []string{`weights[2].component: duplicate component "cost" (first at weights[0])`}},
		{name: "no weights", want: []string{"weights: must name at least one component"}},
		{name: "no version", noVersion: true, weights: []scoring.Weight{w("task", 1)}, want: []string{"version: must not be empty"}},
		{name: "every problem at once", noVersion: true, weights: []scoring.Weight{w("x", -1), w("task", 1), w("task", math.NaN())},
			want: []string{"version:", "weights[0].component", "weights[0].weight", "weights[2].component: duplicate", "weights[2].weight"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := scoring.Spec{Env: "shop", Version: "test/1", Weights: tt.weights}
			if tt.noVersion {
				spec.Version = ""
			}
			err := spec.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want one mentioning %q", tt.want)
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
		})
	}
	err := scoring.Spec{Version: "v", Weights: []scoring.Weight{w("charm", 1)}}.Validate()
	if !errors.Is(err, scoring.ErrUnknownComponent) {
		t.Errorf("errors.Is(%v, ErrUnknownComponent) = false", err)
	}
}
