package plans

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// maxDriftText bounds the text ParseDrift accepts.
const maxDriftText = 64 << 10

// ParseDrift parses drift schedules written as text, the form `gauntlet run --drift` and
// `gauntlet faults drift set` take:
//
//	SELECTOR=SHAPE(AT:VALUE,AT:VALUE,...)[;SELECTOR=...]
//
// SHAPE is step, linear or piecewise, positioned on episode indices; SHAPE@wall positions
// AT in seconds of wall time since now (the origin recorded in the schedule). Examples:
//
//	*.latency.mean_ms=linear(0:20,999:500)
//	payment.http_503.probability=step(0:0.01,500:0.2);*.truncate.probability=piecewise@wall(0:0,60:0.3,120:0)
//
// White space around tokens is ignored. The result is validated (ValidateDrift); errors
// name the entry ("drift[1]: ...").
func ParseDrift(text string, now time.Time) ([]*gauntletv1.Drift, error) {
	return ParseDriftFor(text, now, nil)
}

// ParseDriftFor is ParseDrift for a run with user-defined profiles, whose faults
// selectors may name by id (ValidateDriftFor).
func ParseDriftFor(text string, now time.Time, custom CustomProfiles) ([]*gauntletv1.Drift, error) {
	if len(text) > maxDriftText {
		return nil, fmt.Errorf("drift: %d bytes is more than %d", len(text), maxDriftText)
	}
	var out []*gauntletv1.Drift
	var errs []error
	for i, entry := range strings.Split(text, ";") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		d, err := parseDriftEntry(entry, now)
		if err != nil {
			errs = append(errs, fmt.Errorf("drift[%d]: %q: %w", i, entry, err))
			continue
		}
		out = append(out, d)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := ValidateDriftFor(out, custom); err != nil {
		return nil, err
	}
	return out, nil
}

func parseDriftEntry(entry string, now time.Time) (*gauntletv1.Drift, error) {
	sel, sched, ok := strings.Cut(entry, "=")
	if !ok {
		return nil, errors.New("want SELECTOR=SHAPE(AT:VALUE,...)")
	}
	shapeText, rest, ok := strings.Cut(strings.TrimSpace(sched), "(")
	if !ok || !strings.HasSuffix(rest, ")") {
		return nil, errors.New("schedule: want SHAPE(AT:VALUE,...), e.g. linear(0:20,999:500)")
	}
	s := &gauntletv1.DriftSchedule{}
	shapeText, axis, wall := strings.Cut(strings.TrimSpace(shapeText), "@")
	if wall {
		if strings.TrimSpace(axis) != "wall" {
			return nil, fmt.Errorf("schedule: unknown axis %q (only @wall; none means episodes)", axis)
		}
		s.Axis = gauntletv1.DriftAxis_DRIFT_AXIS_WALL_TIME
		s.OriginUnixNano = now.UnixNano()
	}
	switch strings.TrimSpace(shapeText) {
	case "step":
		s.Shape = gauntletv1.DriftShape_DRIFT_SHAPE_STEP
	case "linear":
		s.Shape = gauntletv1.DriftShape_DRIFT_SHAPE_LINEAR
	case "piecewise":
		s.Shape = gauntletv1.DriftShape_DRIFT_SHAPE_PIECEWISE
	default:
		return nil, fmt.Errorf("schedule: unknown shape %q (step, linear or piecewise)", shapeText)
	}
	body := strings.TrimSuffix(rest, ")")
	if strings.TrimSpace(body) != "" {
		for j, p := range strings.Split(body, ",") {
			at, val, ok := strings.Cut(p, ":")
			if !ok {
				return nil, fmt.Errorf("points[%d]: %q: want AT:VALUE", j, strings.TrimSpace(p))
			}
			a, err := strconv.ParseFloat(strings.TrimSpace(at), 64)
			if err != nil {
				return nil, fmt.Errorf("points[%d].at: %q is not a number", j, strings.TrimSpace(at))
			}
			v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
			if err != nil {
				return nil, fmt.Errorf("points[%d].value: %q is not a number", j, strings.TrimSpace(val))
			}
			s.Points = append(s.Points, &gauntletv1.DriftPoint{At: a, Value: v})
		}
	}
	return &gauntletv1.Drift{Selector: strings.TrimSpace(sel), Schedule: s}, nil
}

// FormatDrift writes drift back in ParseDrift's syntax (wall-time offsets stay relative to
// each schedule's own origin).
func FormatDrift(drift []*gauntletv1.Drift) string {
	var b strings.Builder
	for i, d := range drift {
		if i > 0 {
			b.WriteByte(';')
		}
		b.WriteString(d.GetSelector())
		b.WriteByte('=')
		switch d.GetSchedule().GetShape() {
		case gauntletv1.DriftShape_DRIFT_SHAPE_LINEAR:
			b.WriteString("linear")
		case gauntletv1.DriftShape_DRIFT_SHAPE_PIECEWISE:
			b.WriteString("piecewise")
		default:
			b.WriteString("step")
		}
		if d.GetSchedule().GetAxis() == gauntletv1.DriftAxis_DRIFT_AXIS_WALL_TIME {
			b.WriteString("@wall")
		}
		b.WriteByte('(')
		for j, p := range d.GetSchedule().GetPoints() {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatFloat(p.GetAt(), 'g', -1, 64))
			b.WriteByte(':')
			b.WriteString(strconv.FormatFloat(p.GetValue(), 'g', -1, 64))
		}
		b.WriteByte(')')
	}
	return b.String()
}
