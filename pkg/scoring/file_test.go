package scoring_test

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
	"google.golang.org/protobuf/proto"
)

// legacyDefault is the default spec as it was built in Go before spec files: the embedded
// file must score every step exactly as it did.
func legacyDefault() scoring.Spec {
	return scoring.Spec{Env: "shop", Version: "default/1", Weights: []scoring.Weight{
		{Component: "task", Weight: 1.0}, {Component: "cost", Weight: 0.2}, {Component: "safety", Weight: 0.5},
		{Component: "timeliness", Weight: 0.1}, {Component: "causal", Weight: 0.3},
	}}
}

// variedSteps returns steps covering every branch of the built-in formulas.
func variedSteps() []*gauntletv1.StepTaken {
	var steps []*gauntletv1.StepTaken
	for i := range 200 {
		f := float64(i)
		sig := &gauntletv1.Signals{
			Progress: math.Mod(f*0.013, 1), ProgressDelta: math.Sin(f) * 0.7, Success: i%17 == 0, InvalidAction: i%5 == 0,
			Spend: math.Mod(f*3.7, 120) - 10, Budget: float64(i%4) * 40, DeadlineVirtualNs: int64(i%3) * 2e9,
			SafetyEvents: make([]string, i%4), Violations: make([]*gauntletv1.CausalViolation, i%6),
		}
		if i%13 == 0 { // a verdict step's named numbers, which default/1 does not read
			sig.VerifierNames, sig.VerifierValues = []string{"style", "tests"}, []float64{f, -f}
		}
		if i == 7 {
			sig.ProgressDelta = math.NaN()
		}
		if i == 9 {
			sig.Spend = math.Inf(1)
		}
		met := &gauntletv1.Metering{ToolCalls: uint32(i % 7), VirtualNs: uint64(i) * 37 * ms, Errors: uint32(i % 2)}
		if i%50 == 3 {
			sig, met = nil, nil
		}
		steps = append(steps, &gauntletv1.StepTaken{EpisodeId: "ep", Step: uint32(i), Env: "shop", Signals: sig, Metering: met, Terminated: i == 199})
	}
	return steps
}

func TestDefaultFileScoresAsBefore(t *testing.T) {
	spec := scoring.SpecFor("shop")
	if spec.Name != "default" || spec.Version != scoring.DefaultVersion || !strings.HasPrefix(spec.Digest, "sha256:") || spec.Stateful() {
		t.Fatalf("default spec %q %q %q stateful=%v", spec.Name, spec.Version, spec.Digest, spec.Stateful())
	}
	if spec.Source != string(scoring.DefaultFile()) {
		t.Error("default spec's source is not the embedded file")
	}
	legacy := legacyDefault()
	opts := proto.MarshalOptions{Deterministic: true}
	for _, st := range variedSteps() {
		got, want := scoring.Score(spec, st), scoring.Score(legacy, st)
		if got.SpecDigest != spec.Digest {
			t.Fatalf("step %d: digest %q, want %q", st.Step, got.SpecDigest, spec.Digest)
		}
		got.SpecDigest = ""
		a, _ := opts.Marshal(got)
		b, _ := opts.Marshal(want)
		if string(a) != string(b) {
			t.Fatalf("step %d: file spec scores %v, built-in %v", st.Step, got, want)
		}
		// Explain runs the general path: it must agree to the bit as well.
		ex, total := scoring.Explain(spec, nil, st)
		if math.Float64bits(total) != math.Float64bits(want.Total) {
			t.Fatalf("step %d: Explain total %v, Score %v", st.Step, total, want.Total)
		}
		for i, e := range ex {
			if math.Float64bits(e.Value) != math.Float64bits(want.Components[i].Value) || e.Rule != "builtin "+e.Name {
				t.Fatalf("step %d: Explain %s = %v (%s), Score %v", st.Step, e.Name, e.Value, e.Rule, want.Components[i].Value)
			}
		}
	}
}

// A spec file with every feature, as docs/rewards.md describes it.
const fullSpec = `name: shop-shaped
version: "3"
description: progress shaping, thrift and a careful agent
components:
  - name: task
    builtin: task
    weight: 1
  - name: errors
    description: tool errors, a running z-score over the last 5 steps
    expr: -double(metering.errors)
    weight: 0.1
    normalise:
      - zscore: {window: 5}
      - clip: [-2, 2]
      - scale: 0.5
  - name: careful
    expr: 'signals.invalid_action || size(signals.violations) > 0 ? -1.0 : 0.0'
    weight: 0.2
  - name: streak
    expr: episode.invalid_actions == 0u && signals.success
    weight: 0.5
  - name: progress
    potential: {expr: signals.progress, gamma: 0.9}
    weight: 1
`

func TestParseFullSpec(t *testing.T) {
	spec, err := scoring.Parse("shaped.yaml", []byte(fullSpec))
	if err != nil {
		t.Fatal(err)
	}
	if spec.Version != "shop-shaped/3" || spec.Name != "shop-shaped" || !spec.Stateful() || len(spec.Weights) != 5 {
		t.Fatalf("spec %q %q stateful=%v weights %v", spec.Name, spec.Version, spec.Stateful(), spec.Weights)
	}
	again, _ := scoring.Parse("elsewhere.yaml", []byte(fullSpec))
	other, _ := scoring.Parse("x.yaml", []byte(fullSpec+"\n# a comment\n"))
	if again.Digest != spec.Digest || other.Digest == spec.Digest {
		t.Errorf("digests %s %s %s: want the file's bytes to decide", spec.Digest, again.Digest, other.Digest)
	}
	if err := spec.Validate(); err != nil {
		t.Errorf("Validate on a parsed spec: %v", err)
	}
}

func TestParseReportsEveryError(t *testing.T) {
	const bad = `name: Bad Name
version: ""
colour: blue
components:
  - name: task
    builtin: task
  - name: task
    builtin: charm
    weight: -1
  - name: x
    expr: signals.progres + 1
    weight: 1
  - name: y
    expr: '"text"'
    weight: 1
  - name: z
    builtin: cost
    expr: "1.0"
    weight: 1
    normalise:
      - clip: [1, 0]
      - scale: 1
        clip: [0, 1]
      - zscore: {window: 1}
      - wobble: 2
  - name: p
    potential: {expr: signals.progress, gamma: 1.5}
    weight: .nan
`
	_, err := scoring.Parse("bad.yaml", []byte(bad))
	if err == nil {
		t.Fatal("no error")
	}
	if !errors.Is(err, scoring.ErrInvalidSpec) {
		t.Errorf("error does not wrap ErrInvalidSpec: %v", err)
	}
	t.Log(err)
	for _, want := range []string{
		"bad.yaml:3: colour: unknown key (known here: name, version, description, components)",
		`bad.yaml:1: name: "Bad Name"`,
		"bad.yaml:2: version: must not be empty",
		"bad.yaml:5: components[0].weight: must be set",
		`bad.yaml:7: components[1].name: duplicate component "task" (first at components[0])`,
		`bad.yaml:8: components[1].builtin: unknown component "charm"`,
		"bad.yaml:9: components[1].weight: -1 must be a finite number >= 0",
		"bad.yaml:11: components[2].expr: expression 1:8: undefined field 'progres'",
		`bad.yaml:14: components[3].expr: "\"text\"" gives string, want a number`,
		"bad.yaml:16: components[4]: must have exactly one of builtin, expr, potential, detector and verifier (has 2)",
		"bad.yaml:21: components[4].normalise[0].clip: [1, 0] must be finite with low <= high",
		"bad.yaml:22: components[4].normalise[1]: must have exactly one of clip, scale and zscore (has 2)",
		"bad.yaml:24: components[4].normalise[2].zscore.window: 1 must be in [2, 10000] steps",
		"bad.yaml:25: wobble: unknown key (known here: clip, scale, zscore)",
		"bad.yaml:25: components[4].normalise[3]: must have exactly one of clip, scale and zscore (has 0)",
		"bad.yaml:27: components[5].potential.gamma: 1.5 must be in (0, 1]",
		"bad.yaml:28: components[5].weight: NaN must be a finite number >= 0",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	tests := map[string]struct{ doc, want string }{
		"empty":             {"", "empty document"},
		"not yaml":          {"name: [", "f.yaml:1:"},
		"two documents":     {"name: a\nversion: '1'\ncomponents: [{name: task, builtin: task, weight: 1}]\n---\nname: b\n", "more than one YAML document"},
		"no components":     {"name: a\nversion: '1'\n", "components: must declare at least one component"},
		"wrong type":        {"name: a\nversion: '1'\ncomponents: [{name: task, builtin: task, weight: heavy}]\n", "f.yaml:3: cannot unmarshal !!str `heavy` into float64"},
		"potential no expr": {"name: a\nversion: '1'\ncomponents: [{name: p, potential: {gamma: 1}, weight: 1}]\n", "components[0].potential.expr: must be set"},
		"too big":           {strings.Repeat("#", scoring.MaxFileBytes+1), "more than"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := scoring.Parse("f.yaml", []byte(tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one mentioning %q", err, tt.want)
			}
		})
	}
}

func TestLoadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shaped.yaml")
	if err := os.WriteFile(path, []byte(fullSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := scoring.LoadFile(path); err != nil {
		t.Fatal(err)
	}
	if _, err := scoring.LoadFile(path + ".missing"); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}
