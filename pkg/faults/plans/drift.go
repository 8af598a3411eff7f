package plans

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Drift sources, as recorded in DriftValue.source.
const (
	// DriftSourceGlobal is drift set for every run in the gauntlet_drift KV bucket.
	DriftSourceGlobal = "global"
	// DriftSourceRun is drift declared by the run (RunRequested.drift).
	DriftSourceRun = "run"
)

// maxDriftPoints bounds a schedule's points: schedules are read by hand and by a CLI, and a
// plan evaluates them once per episode.
const maxDriftPoints = 1024

// Selector addresses one parameter of one catalogue fault on one or every service:
// "<service|*>.<fault>.<param>", e.g. "*.latency.mean_ms" or "payment.http_503.probability".
type Selector struct {
	// Service is a service name, or "*" for every service.
	Service string
	// Fault is a catalogue fault name ("latency", "http_503", ...).
	Fault string
	// Param is the parameter of the fault's kind ("probability", "mean_ms", ...).
	Param string

	kind  string
	param catalogue.Param
}

// String returns the selector in its text form.
func (s Selector) String() string { return s.Service + "." + s.Fault + "." + s.Param }

// ParamSpec returns the typed parameter the selector addresses.
func (s Selector) ParamSpec() catalogue.Param { return s.param }

// ParseSelector parses "<service|*>.<fault>.<param>" and checks that the fault is in the
// catalogue and the parameter belongs to its kind.
func ParseSelector(text string) (Selector, error) {
	parts := strings.Split(text, ".")
	if len(parts) != 3 {
		return Selector{}, fmt.Errorf("%q: want <service|*>.<fault>.<param>, e.g. *.latency.mean_ms", text)
	}
	s := Selector{Service: parts[0], Fault: parts[1], Param: parts[2]}
	if s.Service == "" || (s.Service != "*" && strings.Contains(s.Service, "*")) {
		return Selector{}, fmt.Errorf("%q: service must be a name or \"*\"", text)
	}
	kind, ok := catalogueKind(s.Fault)
	if !ok {
		return Selector{}, fmt.Errorf("%q: unknown fault %q (known: %s)", text, s.Fault, strings.Join(catalogueNames(), ", "))
	}
	p, ok := catalogue.FindParam(kind, s.Param)
	if !ok {
		names := make([]string, 0, len(catalogue.KindParams(kind)))
		for _, p := range catalogue.KindParams(kind) {
			names = append(names, p.Name)
		}
		return Selector{}, fmt.Errorf("%q: fault %s (kind %s) has no parameter %q (known: %s)", text, s.Fault, kind, s.Param, strings.Join(names, ", "))
	}
	s.kind, s.param = kind, p
	return s, nil
}

// matchesRule reports whether the selector addresses rule id "<service>.<fault>".
func (s Selector) matchesRule(id string) bool {
	svc, fault, ok := strings.Cut(id, ".")
	return ok && fault == s.Fault && (s.Service == "*" || s.Service == svc)
}

// ValidateDrift reports every problem of a list of drift schedules at once, each naming its
// field ("drift[1].schedule.points[2].at: ..."): bad selectors, a selector listed twice,
// schedules with too few points or points out of order, values outside the parameter's
// range, and a wall-time axis without an origin.
func ValidateDrift(drift []*gauntletv1.Drift) error {
	var errs []error
	seen := map[string]int{}
	for i, d := range drift {
		where := fmt.Sprintf("drift[%d]", i)
		if d == nil {
			errs = append(errs, fmt.Errorf("%s: missing drift", where))
			continue
		}
		sel, err := ParseSelector(d.Selector)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s.selector: %w", where, err))
		} else if j, dup := seen[d.Selector]; dup {
			errs = append(errs, fmt.Errorf("%s.selector: %q already drifts at drift[%d]", where, d.Selector, j))
		} else {
			seen[d.Selector] = i
		}
		errs = append(errs, validateSchedule(where+".schedule", d.Schedule, sel, err == nil)...)
	}
	return errors.Join(errs...)
}

func validateSchedule(where string, s *gauntletv1.DriftSchedule, sel Selector, checkValues bool) []error {
	if s == nil {
		return []error{fmt.Errorf("%s: missing schedule", where)}
	}
	var errs []error
	n := len(s.Points)
	switch s.Shape {
	case gauntletv1.DriftShape_DRIFT_SHAPE_STEP:
		if n < 1 {
			errs = append(errs, fmt.Errorf("%s.points: a step schedule needs at least 1 point", where))
		}
	case gauntletv1.DriftShape_DRIFT_SHAPE_LINEAR:
		if n != 2 {
			errs = append(errs, fmt.Errorf("%s.points: a linear schedule needs exactly 2 points, got %d (use piecewise for more)", where, n))
		}
	case gauntletv1.DriftShape_DRIFT_SHAPE_PIECEWISE:
		if n < 2 {
			errs = append(errs, fmt.Errorf("%s.points: a piecewise schedule needs at least 2 points, got %d", where, n))
		}
	default:
		errs = append(errs, fmt.Errorf("%s.shape: unknown shape %d (step, linear or piecewise)", where, s.Shape))
	}
	if n > maxDriftPoints {
		errs = append(errs, fmt.Errorf("%s.points: %d points is more than %d", where, n, maxDriftPoints))
	}
	switch s.Axis {
	case gauntletv1.DriftAxis_DRIFT_AXIS_EPISODE:
	case gauntletv1.DriftAxis_DRIFT_AXIS_WALL_TIME:
		if s.OriginUnixNano <= 0 {
			errs = append(errs, fmt.Errorf("%s.origin_unix_nano: a wall-time schedule needs a positive origin", where))
		}
	default:
		errs = append(errs, fmt.Errorf("%s.axis: unknown axis %d (episode or wall_time)", where, s.Axis))
	}
	for i, p := range s.Points {
		pw := fmt.Sprintf("%s.points[%d]", where, i)
		if p == nil {
			errs = append(errs, fmt.Errorf("%s: missing point", pw))
			continue
		}
		if math.IsNaN(p.At) || math.IsInf(p.At, 0) || p.At < 0 {
			errs = append(errs, fmt.Errorf("%s.at: %v must be a finite number >= 0", pw, p.At))
		} else if i > 0 && s.Points[i-1] != nil && !(p.At > s.Points[i-1].At) {
			errs = append(errs, fmt.Errorf("%s.at: %v is not after points[%d].at %v", pw, p.At, i-1, s.Points[i-1].At))
		}
		if checkValues {
			if err := sel.param.Check(p.Value); err != nil {
				errs = append(errs, fmt.Errorf("%s.value: %s: %w", pw, sel, err))
			}
		}
	}
	return errs
}

// EvalSchedule returns the schedule's value at axis position x (an episode index, or
// seconds since the origin). Before the first point and after the last it holds the end
// values. The schedule must be valid.
func EvalSchedule(s *gauntletv1.DriftSchedule, x float64) float64 {
	pts := s.Points
	// i is the first point strictly after x.
	i := sort.Search(len(pts), func(i int) bool { return pts[i].At > x })
	switch {
	case i == 0:
		return pts[0].Value
	case i == len(pts) || s.Shape == gauntletv1.DriftShape_DRIFT_SHAPE_STEP:
		return pts[i-1].Value
	}
	a, b := pts[i-1], pts[i]
	t := (x - a.At) / (b.At - a.At)
	return a.Value + t*(b.Value-a.Value)
}

// DriftPosition is where an episode sits on the drift axes.
type DriftPosition struct {
	// Index is the episode's index within its run.
	Index uint64
	// At is the episode's requested time, for wall-time schedules.
	At time.Time
}

// EpisodePosition is the drift position of an episode request.
func EpisodePosition(ep *gauntletv1.EpisodeRequested) DriftPosition {
	return DriftPosition{Index: ep.GetIndex(), At: time.Unix(0, ep.GetRequestedAtUnixNano())}
}

// DriftValues evaluates drift schedules at pos, in order, tagging each with source. The
// drift must be valid (ValidateDrift).
func DriftValues(drift []*gauntletv1.Drift, pos DriftPosition, source string) []*gauntletv1.DriftValue {
	out := make([]*gauntletv1.DriftValue, 0, len(drift))
	for _, d := range drift {
		var x float64
		if d.Schedule.Axis == gauntletv1.DriftAxis_DRIFT_AXIS_WALL_TIME {
			x = float64(pos.At.UnixNano()-d.Schedule.OriginUnixNano) / 1e9
		} else {
			x = float64(pos.Index)
		}
		out = append(out, &gauntletv1.DriftValue{Selector: d.Selector, Value: EvalSchedule(d.Schedule, x), Source: source})
	}
	return out
}

// ApplyDrift overrides plan parameters with drift values, in order (a later value for the
// same selector wins), and records the values on the plan's drift_values. It changes
// numbers only, never the plan's seed or rule ids, so every rule keeps its random stream:
// a drifted parameter shifts what a draw means, never which draws are made. Values for a
// fault the plan does not contain (an edge fault this plan did not pick) are recorded and
// change nothing. Integer parameters are rounded (and recorded rounded). Each value is checked against its
// parameter's range; the plan is not modified when any is invalid.
func ApplyDrift(plan *gauntletv1.FaultPlan, values []*gauntletv1.DriftValue) error {
	sels := make([]Selector, len(values))
	var errs []error
	for i, v := range values {
		sel, err := ParseSelector(v.GetSelector())
		if err != nil {
			errs = append(errs, fmt.Errorf("drift_values[%d].selector: %w", i, err))
			continue
		}
		x := v.Value
		if sel.param.Integer {
			x = math.Round(x) // a ramp between whole numbers passes through fractions
		}
		if err := sel.param.Check(x); err != nil {
			errs = append(errs, fmt.Errorf("drift_values[%d].value: %s: %w", i, sel, err))
		}
		sels[i] = sel
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("apply drift: %w", err)
	}
	for i, v := range values {
		x := v.Value
		if sels[i].param.Integer {
			x = math.Round(x)
			v = &gauntletv1.DriftValue{Selector: v.Selector, Value: x, Source: v.Source}
		}
		for _, r := range plan.Rules {
			if sels[i].matchesRule(r.Id) && catalogue.KindOf(r) == sels[i].kind {
				sels[i].param.Set(r, x)
			}
		}
		plan.DriftValues = append(plan.DriftValues, v)
	}
	return nil
}

// catalogueKinds maps each catalogue fault name to its kind, computed from the entries
// themselves so it cannot disagree with them.
var catalogueKinds = func() map[string]string {
	m := make(map[string]string, len(simFaults))
	g := rng.New(0, "kinds", 0)
	for _, f := range simFaults {
		fn := f.baseline
		if fn == nil {
			fn = f.edge
		}
		m[f.name] = catalogue.KindOf(fn(g))
	}
	return m
}()

func catalogueKind(name string) (string, bool) {
	k, ok := catalogueKinds[name]
	return k, ok
}

// catalogueNames lists the catalogue's fault names in catalogue order.
func catalogueNames() []string {
	out := make([]string, len(simFaults))
	for i, f := range simFaults {
		out[i] = f.name
	}
	return out
}
