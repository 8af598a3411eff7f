package scoring

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Component names, in canonical order.
const (
	ComponentTask       = "task"
	ComponentCost       = "cost"
	ComponentSafety     = "safety"
	ComponentTimeliness = "timeliness"
	ComponentCausal     = "causal"
)

// components is the canonical order of the vector: the default spec's order.
var components = []string{ComponentTask, ComponentCost, ComponentSafety, ComponentTimeliness, ComponentCausal}

// ErrUnknownComponent is wrapped by every error about a component name Score does not know.
var ErrUnknownComponent = errors.New("unknown component")

// DefaultVersion is the version of the spec SpecFor returns.
const DefaultVersion = "default/1"

// Components returns the names of the components Score knows, in canonical order.
func Components() []string {
	return append([]string(nil), components...)
}

// Weight is one entry of a reward spec: a component and its weight in the total.
type Weight struct {
	Component string
	Weight    float64
}

// Spec declares how an env's steps are scored: which components, with which weights, in
// which order, and (for a spec parsed from a file) how each component's value is produced
// and normalised. Weights is a slice, not a map, so the vector's order and the
// floating-point sum are the same on every run. Version is the spec's id as recorded with
// every score ("default/1": the file's name and version), naming both the weights and the
// formulas, so a score can always be traced to what produced it; Digest names the exact
// file. A Spec is a value: copies share its compiled part, which is read only.
type Spec struct {
	Env     string
	Name    string
	Version string
	// Digest is "sha256:" and the hex SHA-256 of the spec's file; empty for a spec built
	// in Go.
	Digest string
	// Source is the text of the spec's file; empty for a spec built in Go.
	Source  string
	Weights []Weight

	c *compiled // nil for a spec built in Go: every component a built-in, plain
}

// Stateful reports whether scoring under s reads what came before in the episode (a
// running z-score, potential-based shaping, an expression, a detector): its steps must then be
// scored in order with a RewardState carried from each to the next (ScoreState).
func (s Spec) Stateful() bool { return s.c != nil && s.c.stateful }

// ReadsActions reports whether a component of the spec reads the step's action (a repeat
// detector): its steps must then be scored with their action (StepTaken.action), which
// only then a reward request or a re-score carries.
func (s Spec) ReadsActions() bool { return s.c != nil && s.c.actions }

// ReadsFaults reports whether a component of the spec reads the step's faults (an idle
// or repeat detector with faults: hold): its steps must then be scored
// with the faults that answered their calls (StepTaken.faults; AnsweredFaults is what
// they need of them), which only then a reward request or a re-score carries.
func (s Spec) ReadsFaults() bool { return s.c != nil && s.c.faults }

// defaultSpec is the built-in spec file, parsed once.
var defaultSpec = func() Spec {
	s, err := Parse("default.yaml", defaultFile)
	if err != nil {
		// The file is part of the binary and TestSpecFor parses it: only a broken build
		// gets here.
		panic(fmt.Sprintf("built-in reward spec: %v", err))
	}
	return s
}()

// SpecFor returns the reward spec of env: the built-in spec (default.yaml: task 1.0, cost
// 0.2, safety 0.5, timeliness 0.1, causal 0.3, version DefaultVersion) unless a run names
// another. Each call returns its own Weights.
func SpecFor(env string) Spec {
	s := defaultSpec
	s.Env = env
	s.Weights = slices.Clone(s.Weights)
	return s
}

// DefaultDigest is the digest of the built-in spec's file: a step naming it, or naming no
// spec, is scored under SpecFor.
func DefaultDigest() string { return defaultSpec.Digest }

// ForEnv returns s for env: the same spec, with its own Weights.
func (s Spec) ForEnv(env string) Spec {
	s.Env = env
	s.Weights = slices.Clone(s.Weights)
	return s
}

// Validate reports every problem of a spec built in Go at once, each naming its field: an empty
// version, no weights, unknown or duplicate components, and weights that are negative or
// not finite. A weight of 0 is allowed: the component is still reported, for debugging,
// but does not count. A spec parsed from a file names its own components, which Parse
// checked: only their uniqueness and weights are checked again.
func (s Spec) Validate() error {
	var errs []error
	if s.Version == "" {
		errs = append(errs, errors.New("version: must not be empty"))
	}
	if len(s.Weights) == 0 {
		errs = append(errs, errors.New("weights: must name at least one component"))
	}
	for i, w := range s.Weights {
		if s.c == nil && !isComponent(w.Component) {
			errs = append(errs, fmt.Errorf("weights[%d].component: %w %q (known: %s)",
				i, ErrUnknownComponent, w.Component, strings.Join(components, ", ")))
		} else {
			for j, prev := range s.Weights[:i] {
				if prev.Component == w.Component {
					errs = append(errs, fmt.Errorf("weights[%d].component: duplicate component %q (first at weights[%d])", i, w.Component, j))
					break
				}
			}
		}
		if !(w.Weight >= 0) || math.IsInf(w.Weight, 1) { // NaN fails >= 0
			errs = append(errs, fmt.Errorf("weights[%d].weight: %v must be a finite number >= 0", i, w.Weight))
		}
	}
	return errors.Join(errs...)
}

func isComponent(name string) bool {
	for _, c := range components {
		if c == name {
			return true
		}
	}
	return false
}
