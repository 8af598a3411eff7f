package plans

import (
	"errors"
	"fmt"
	"math"
	"slices"
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

// Selector addresses one parameter of one fault on one or every service:
// "<service|*>.<fault>.<param>", e.g. "*.latency.mean_ms" or "payment.http_503.probability".
// The fault is a built-in plan's fault (its catalogue name) or a user-defined profile's
// fault (its id, which may hold dots: the param is the last part); a fault targeting tools
// is addressed by the tools' service ("catalog.cut.keep_fraction" for a fault "cut" on
// tool catalog.search).
type Selector struct {
	// Service is a service name, or "*" for every service.
	Service string
	// Fault is a catalogue fault name ("latency", "http_503", ...) or a user-defined
	// profile's fault id.
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
	return ParseSelectorFor(text, nil)
}

// ParseSelectorFor is ParseSelector for a run with user-defined profiles: the fault may
// also be one of their faults' ids (of a kind the plan's rules carry: http_error, latency,
// truncate), whose kind then decides the parameters.
func ParseSelectorFor(text string, custom CustomProfiles) (Selector, error) {
	s, err := splitSelector(text)
	if err != nil {
		return Selector{}, err
	}
	kind, ok := catalogueKind(s.Fault)
	if !ok {
		if kind, err = custom.faultKind(s.Fault); err != nil {
			return Selector{}, fmt.Errorf("%q: %w", text, err)
		}
	}
	return s.withParam(text, kind)
}

// errUnknownFault is a selector's fault that is neither in the catalogue nor a given
// user-defined profile's.
var errUnknownFault = errors.New("unknown fault")

// faultKind is the kind of the user-defined profiles' fault id (the same kind in every
// profile that has it), among the kinds drift can reach.
func (c CustomProfiles) faultKind(id string) (string, error) {
	kind := ""
	var known []string
	for _, name := range c.Names() {
		var ids []string
		for _, r := range c[name] {
			if boundaryKind(r.Kind) {
				if r.ID == id {
					return "", fmt.Errorf("fault %s of profile %s: drift changes a plan's rules, not its %s boundary faults", id, name, r.Kind.Name)
				}
				continue
			}
			ids = append(ids, r.ID)
			if r.ID != id {
				continue
			}
			if kind != "" && kind != r.Kind.Name {
				return "", fmt.Errorf("fault %s is a %s in one profile and a %s in another: rename one", id, kind, r.Kind.Name)
			}
			kind = r.Kind.Name
		}
		slices.Sort(ids)
		known = append(known, name+": "+strings.Join(ids, ", "))
	}
	if kind == "" {
		theirs := ""
		if len(known) > 0 {
			theirs = "; of the run's profiles, " + strings.Join(known, "; ")
		}
		return "", fmt.Errorf("%w %q (known: %s%s)", errUnknownFault, id, strings.Join(catalogueNames(), ", "), theirs)
	}
	return kind, nil
}

// splitSelector parses a selector's text: the service is the first part, the param the
// last, the fault what is between (a user-defined fault id may hold dots).
func splitSelector(text string) (Selector, error) {
	parts := strings.Split(text, ".")
	if len(parts) < 3 || slices.Contains(parts, "") {
		return Selector{}, fmt.Errorf("%q: want <service|*>.<fault>.<param>, e.g. *.latency.mean_ms", text)
	}
	s := Selector{Service: parts[0], Fault: strings.Join(parts[1:len(parts)-1], "."), Param: parts[len(parts)-1]}
	if s.Service != "*" && strings.Contains(s.Service, "*") {
		return Selector{}, fmt.Errorf("%q: service must be a name or \"*\"", text)
	}
	return s, nil
}

// withParam completes s with its fault's kind and the parameter of that kind it names.
func (s Selector) withParam(text, kind string) (Selector, error) {
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

// matchesRule reports whether the selector addresses rule r, whose id is
// "<target>.<fault>" and whose target is a service or one of its tools ("<service>.<tool>").
func (s Selector) matchesRule(r *gauntletv1.FaultRule) bool {
	n := len(r.Target)
	if len(r.Id) <= n || r.Id[n] != '.' || r.Id[:n] != r.Target || r.Id[n+1:] != s.Fault {
		return false
	}
	svc, _, _ := strings.Cut(r.Target, ".")
	return s.Service == "*" || s.Service == svc
}

// ValidateDrift reports every problem of a list of drift schedules at once, each naming its
// field ("drift[1].schedule.points[2].at: ..."): bad selectors, a selector listed twice,
// schedules with too few points or points out of order, values outside the parameter's
// range, and a wall-time axis without an origin.
func ValidateDrift(drift []*gauntletv1.Drift) error {
	return ValidateDriftFor(drift, nil)
}

// ValidateDriftFor is ValidateDrift for a run with user-defined profiles, whose faults
// selectors may name by id (ParseSelectorFor).
func ValidateDriftFor(drift []*gauntletv1.Drift, custom CustomProfiles) error {
	var errs []error
	seen := map[string]int{}
	for i, d := range drift {
		where := fmt.Sprintf("drift[%d]", i)
		if d == nil {
			errs = append(errs, fmt.Errorf("%s: missing drift", where))
			continue
		}
		sel, err := ParseSelectorFor(d.Selector, custom)
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
// parameter's range; the plan is not modified when any is invalid. A selector naming a
// user-defined profile's fault takes the kind of the plan's rules of that fault; a plan
// without such rules (another profile's, in the same run) records the value and changes
// nothing.
func ApplyDrift(plan *gauntletv1.FaultPlan, values []*gauntletv1.DriftValue) error {
	sels := make([]Selector, len(values))
	skip := make([]bool, len(values))
	var errs []error
	for i, v := range values {
		sel, err := ParseSelector(v.GetSelector())
		if errors.Is(err, errUnknownFault) {
			sel, skip[i], err = selectorInPlan(plan, v.GetSelector())
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("drift_values[%d].selector: %w", i, err))
			continue
		}
		if skip[i] {
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
		if skip[i] {
			plan.DriftValues = append(plan.DriftValues, v)
			continue
		}
		x := v.Value
		if sels[i].param.Integer {
			x = math.Round(x)
			v = &gauntletv1.DriftValue{Selector: v.Selector, Value: x, Source: v.Source}
		}
		for _, r := range plan.Rules {
			if sels[i].matchesRule(r) && catalogue.KindOf(r) == sels[i].kind {
				sels[i].param.Set(r, x)
			}
		}
		plan.DriftValues = append(plan.DriftValues, v)
	}
	return nil
}

// selectorInPlan parses a selector naming a fault outside the catalogue (a user-defined
// profile's) against the plan's rules: the kind is theirs; none in the plan means the
// value is for another plan of the run (skip).
func selectorInPlan(plan *gauntletv1.FaultPlan, text string) (Selector, bool, error) {
	s, err := splitSelector(text)
	if err != nil {
		return Selector{}, false, err
	}
	for _, r := range plan.GetRules() {
		if s.matchesRule(r) || (s.Service != "*" && Selector{Service: "*", Fault: s.Fault}.matchesRule(r)) {
			s, err = s.withParam(text, catalogue.KindOf(r))
			return s, false, err
		}
	}
	return s, true, nil
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

// DriftFault is a fault of the built-in plans as drift selectors name it.
type DriftFault struct {
	// Name is the selector's fault part ("http_503").
	Name string
	// Kind is its kind, whose parameters a selector may name.
	Kind   string
	Params []catalogue.Param
}

// DriftFaults lists the faults of the built-in plans a selector may name, in catalogue
// order, each with its kind's parameters (probability first).
func DriftFaults() []DriftFault {
	out := make([]DriftFault, 0, len(simFaults))
	for _, name := range catalogueNames() {
		k := catalogueKinds[name]
		out = append(out, DriftFault{Name: name, Kind: k, Params: catalogue.KindParams(k)})
	}
	return out
}

// catalogueNames lists the catalogue's fault names in catalogue order.
func catalogueNames() []string {
	out := make([]string, len(simFaults))
	for i, f := range simFaults {
		out[i] = f.name
	}
	return out
}
