package scoring

import (
	"errors"
	"fmt"
	"math"
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
// which order. Weights is a slice, not a map, so the vector's order and the floating-point
// sum are the same on every run. Version is recorded with every score and names both the
// weights and the formulas, so a score can always be traced to what produced it.
type Spec struct {
	Env     string
	Version string
	Weights []Weight
}

// SpecFor returns the reward spec of env. Every env currently gets the default spec (task
// 1.0, cost 0.2, safety 0.5, timeliness 0.1, causal 0.3, version DefaultVersion); per-env
// specs will be looked up here.
func SpecFor(env string) Spec {
	return Spec{
		Env:     env,
		Version: DefaultVersion,
		Weights: []Weight{
			{ComponentTask, 1.0},
			{ComponentCost, 0.2},
			{ComponentSafety, 0.5},
			{ComponentTimeliness, 0.1},
			{ComponentCausal, 0.3},
		},
	}
}

// Validate reports every problem of the spec at once, each naming its field: an empty
// version, no weights, unknown or duplicate components, and weights that are negative or
// not finite. A weight of 0 is allowed: the component is still reported, for debugging,
// but does not count.
func (s Spec) Validate() error {
	var errs []error
	if s.Version == "" {
		errs = append(errs, errors.New("version: must not be empty"))
	}
	if len(s.Weights) == 0 {
		errs = append(errs, errors.New("weights: must name at least one component"))
	}
	for i, w := range s.Weights {
		if !isComponent(w.Component) {
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
