package faults

import (
	"errors"
	"fmt"
	"math"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// ValidatePlan reports every problem of a plan at once, each naming the rule and field.
func ValidatePlan(p *gauntletv1.FaultPlan) error {
	var errs []error
	seen := map[string]bool{}
	for i, r := range p.GetRules() {
		where := fmt.Sprintf("rules[%d]", i)
		if r.Id == "" {
			errs = append(errs, fmt.Errorf("%s.id: must not be empty", where))
		} else if seen[r.Id] {
			errs = append(errs, fmt.Errorf("%s.id: duplicate id %q", where, r.Id))
		}
		seen[r.Id] = true
		if r.Target == "" {
			errs = append(errs, fmt.Errorf("%s.target: must not be empty", where))
		}
		if math.IsNaN(r.Probability) || r.Probability < 0 || r.Probability > 1 {
			errs = append(errs, fmt.Errorf("%s.probability: %v is outside [0,1]", where, r.Probability))
		}
		switch s := r.Spec.(type) {
		case *gauntletv1.FaultRule_HttpError:
			if st := s.HttpError.GetStatus(); st < 400 || st > 599 {
				errs = append(errs, fmt.Errorf("%s.http_error.status: %d is not an HTTP error status (400-599)", where, st))
			}
		case *gauntletv1.FaultRule_Latency:
			l := s.Latency
			if !(l.GetMeanMs() >= 0) || math.IsInf(l.GetMeanMs(), 0) {
				errs = append(errs, fmt.Errorf("%s.latency.mean_ms: %v must be a finite value >= 0", where, l.GetMeanMs()))
			}
			if !(l.GetJitterMs() >= 0) || math.IsInf(l.GetJitterMs(), 0) {
				errs = append(errs, fmt.Errorf("%s.latency.jitter_ms: %v must be a finite value >= 0", where, l.GetJitterMs()))
			}
		case *gauntletv1.FaultRule_Truncate:
			if k := s.Truncate.GetKeepFraction(); !(k >= 0 && k < 1) {
				errs = append(errs, fmt.Errorf("%s.truncate.keep_fraction: %v is outside [0,1)", where, k))
			}
		case nil:
			errs = append(errs, fmt.Errorf("%s: no fault kind set (http_error, latency or truncate)", where))
		}
	}
	return errors.Join(errs...)
}
