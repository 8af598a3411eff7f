package catalogue

import (
	"fmt"
	"math"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Param describes one typed parameter of a fault kind: its name as used in drift selectors
// and specs, its unit, and the closed (or half-open) range a value must lie in.
type Param struct {
	// Name is the parameter's name in selectors ("mean_ms") and specs.
	Name string
	// Unit is what the number counts: "probability", "ms", "fraction", "status", ...
	Unit string
	// Min and Max bound the value; MaxOpen excludes Max itself.
	Min, Max float64
	MaxOpen  bool
	// Integer requires a whole number.
	Integer bool
	// Text marks a parameter whose value is a string (a header name), not a number.
	Text bool
	// Choices, when set, are the values a text parameter may take; DefaultText is the one
	// a spec that omits it gets.
	Choices     []string
	DefaultText string
	// Default is the value a spec that omits the parameter gets (numbers only).
	Default float64
	// Doc says what the parameter does, for `gauntlet faults ls` and docs/faults.md.
	Doc string

	get func(r *gauntletv1.FaultRule) float64
	set func(r *gauntletv1.FaultRule, v float64)
}

// Check reports why v is not a valid value of the parameter, or nil. NaN and infinities
// are never valid.
func (p Param) Check(v float64) error {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return fmt.Errorf("%v is not a finite number", v)
	case v < p.Min:
		return fmt.Errorf("%v is below the minimum %v %s", v, p.Min, p.Unit)
	case p.MaxOpen && v >= p.Max:
		return fmt.Errorf("%v is not below %v %s", v, p.Max, p.Unit)
	case v > p.Max:
		return fmt.Errorf("%v is above the maximum %v %s", v, p.Max, p.Unit)
	case p.Integer && v != math.Trunc(v):
		return fmt.Errorf("%v is not a whole number of %s", v, p.Unit)
	}
	return nil
}

// Get returns the parameter's value on rule r, which must be of the parameter's kind.
func (p Param) Get(r *gauntletv1.FaultRule) float64 { return p.get(r) }

// Set sets the parameter's value on rule r, which must be of the parameter's kind.
func (p Param) Set(r *gauntletv1.FaultRule, v float64) { p.set(r, v) }

// ProbabilityParam is shared by every kind: the chance the rule fires on a matching event.
var ProbabilityParam = Param{
	Name: "probability", Unit: "probability", Min: 0, Max: 1,
	Doc: "chance that the fault fires on a matching call",
	get: func(r *gauntletv1.FaultRule) float64 { return r.Probability },
	set: func(r *gauntletv1.FaultRule, v float64) { r.Probability = v },
}

// kindParams lists the parameters of each fault kind recorded in FaultRule's spec oneof.
var kindParams = map[string][]Param{
	KindHTTPError: {
		ProbabilityParam,
		{
			Name: "status", Unit: "status", Min: 400, Max: 599, Integer: true,
			Doc: "HTTP status the call is answered with instead of running",
			get: func(r *gauntletv1.FaultRule) float64 { return float64(r.GetHttpError().GetStatus()) },
			set: func(r *gauntletv1.FaultRule, v float64) { r.GetHttpError().Status = uint32(v) },
		},
		{
			Name: "retry_after_ms", Unit: "ms", Min: 0, Max: MaxLatencyMs, Integer: true,
			Doc: "Retry-After sent with the error (0: none)",
			get: func(r *gauntletv1.FaultRule) float64 { return float64(r.GetHttpError().GetRetryAfterMs()) },
			set: func(r *gauntletv1.FaultRule, v float64) { r.GetHttpError().RetryAfterMs = uint32(v) },
		},
	},
	KindLatency: {
		ProbabilityParam,
		{
			Name: "mean_ms", Unit: "ms", Min: 0, Max: MaxLatencyMs,
			Doc: "mean added latency; normally distributed, clamped at 0",
			get: func(r *gauntletv1.FaultRule) float64 { return r.GetLatency().GetMeanMs() },
			set: func(r *gauntletv1.FaultRule, v float64) { r.GetLatency().MeanMs = v },
		},
		{
			Name: "jitter_ms", Unit: "ms", Min: 0, Max: MaxLatencyMs,
			Doc: "standard deviation of the added latency",
			get: func(r *gauntletv1.FaultRule) float64 { return r.GetLatency().GetJitterMs() },
			set: func(r *gauntletv1.FaultRule, v float64) { r.GetLatency().JitterMs = v },
		},
	},
	KindTruncate: {
		ProbabilityParam,
		{
			Name: "keep_fraction", Unit: "fraction", Min: 0, Max: 1, MaxOpen: true,
			Doc: "fraction of the response body delivered",
			get: func(r *gauntletv1.FaultRule) float64 { return r.GetTruncate().GetKeepFraction() },
			set: func(r *gauntletv1.FaultRule, v float64) { r.GetTruncate().KeepFraction = v },
		},
	},
}

// KindOf names the kind of a plan rule's spec ("" for none).
func KindOf(r *gauntletv1.FaultRule) string {
	switch r.GetSpec().(type) {
	case *gauntletv1.FaultRule_HttpError:
		return KindHTTPError
	case *gauntletv1.FaultRule_Latency:
		return KindLatency
	case *gauntletv1.FaultRule_Truncate:
		return KindTruncate
	}
	return ""
}

// KindParams returns the parameters of a fault kind (KindHTTPError, KindLatency, ...), or
// nil for an unknown kind. The caller must not modify the result.
func KindParams(kind string) []Param { return kindParams[kind] }

// FindParam returns the parameter name of kind, if it has one.
func FindParam(kind, name string) (Param, bool) {
	for _, p := range kindParams[kind] {
		if p.Name == name {
			return p, true
		}
	}
	return Param{}, false
}
