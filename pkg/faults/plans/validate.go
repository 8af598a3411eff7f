package plans

import (
	"errors"
	"fmt"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Validate reports every problem of a plan at once, each naming the rule and field.
// The range checks are written so NaN fails them. A plan that passes can be evaluated by an
// Injector without panicking. A nil plan has no rules and is valid.
func Validate(p *gauntletv1.FaultPlan) error {
	var errs []error
	rules := p.GetRules()
	// NewInjector validates every plan on the worker's hot path: small plans (all of the
	// catalogue's) find duplicate ids by scanning, which allocates nothing; big ones use a
	// set. Formatting a location is left to rules with a problem.
	var seen map[string]bool
	if len(rules) > 64 {
		seen = make(map[string]bool, len(rules))
	}
	dup := func(i int, id string) bool {
		if seen != nil {
			return seen[id]
		}
		for _, q := range rules[:i] {
			if q != nil && q.Id == id {
				return true
			}
		}
		return false
	}
	for i, r := range rules {
		if r != nil && !dup(i, r.Id) && ruleLooksValid(r) {
			if seen != nil {
				seen[r.Id] = true
			}
			continue
		}
		where := fmt.Sprintf("rules[%d]", i)
		if r == nil {
			errs = append(errs, fmt.Errorf("%s: missing rule", where))
			continue
		}
		if r.Id == "" {
			errs = append(errs, fmt.Errorf("%s.id: must not be empty", where))
		} else if dup(i, r.Id) {
			errs = append(errs, fmt.Errorf("%s.id: duplicate id %q", where, r.Id))
		}
		if seen != nil {
			seen[r.Id] = true
		}
		if r.Target == "" {
			errs = append(errs, fmt.Errorf("%s.target: must not be empty", where))
		}
		if !(r.Probability >= 0 && r.Probability <= 1) { // NaN fails both
			errs = append(errs, fmt.Errorf("%s.probability: %v is outside [0,1]", where, r.Probability))
		}
		switch s := r.Spec.(type) {
		case *gauntletv1.FaultRule_HttpError:
			if s.HttpError == nil {
				errs = append(errs, fmt.Errorf("%s.http_error: missing", where))
			} else if st := s.HttpError.Status; st < 400 || st > 599 {
				errs = append(errs, fmt.Errorf("%s.http_error.status: %d is not an HTTP error status (400-599)", where, st))
			}
		case *gauntletv1.FaultRule_Latency:
			if s.Latency == nil {
				errs = append(errs, fmt.Errorf("%s.latency: missing", where))
				break
			}
			if m := s.Latency.MeanMs; !(m >= 0 && m <= catalogue.MaxLatencyMs) {
				errs = append(errs, fmt.Errorf("%s.latency.mean_ms: %v is outside [0,%d]", where, m, catalogue.MaxLatencyMs))
			}
			if j := s.Latency.JitterMs; !(j >= 0 && j <= catalogue.MaxLatencyMs) {
				errs = append(errs, fmt.Errorf("%s.latency.jitter_ms: %v is outside [0,%d]", where, j, catalogue.MaxLatencyMs))
			}
		case *gauntletv1.FaultRule_Truncate:
			if s.Truncate == nil {
				errs = append(errs, fmt.Errorf("%s.truncate: missing", where))
			} else if k := s.Truncate.KeepFraction; !(k >= 0 && k < 1) {
				errs = append(errs, fmt.Errorf("%s.truncate.keep_fraction: %v is outside [0,1)", where, k))
			}
		case nil:
			errs = append(errs, fmt.Errorf("%s: no fault kind set (http_error, latency or truncate)", where))
		}
	}
	if p.GetBoundarySpec() != "" {
		if _, err := BoundaryRules(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ruleLooksValid is the fast path of Validate: true when r passes every check below.
func ruleLooksValid(r *gauntletv1.FaultRule) bool {
	if r.Id == "" || r.Target == "" || !(r.Probability >= 0 && r.Probability <= 1) {
		return false
	}
	switch s := r.Spec.(type) {
	case *gauntletv1.FaultRule_HttpError:
		return s.HttpError != nil && s.HttpError.Status >= 400 && s.HttpError.Status <= 599
	case *gauntletv1.FaultRule_Latency:
		return s.Latency != nil && s.Latency.MeanMs >= 0 && s.Latency.MeanMs <= catalogue.MaxLatencyMs &&
			s.Latency.JitterMs >= 0 && s.Latency.JitterMs <= catalogue.MaxLatencyMs
	case *gauntletv1.FaultRule_Truncate:
		return s.Truncate != nil && s.Truncate.KeepFraction >= 0 && s.Truncate.KeepFraction < 1
	}
	return false
}
