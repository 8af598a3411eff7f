package inject

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
)

// Resources is what a profile's resource faults (memory_leak, cpu_throttle, clock_skew)
// ask of a sandbox, in the terms a runtime applies: cgroup v2 knob values and a clock
// transform. A runtime decides once per episode which ambient faults are in force
// (ResourcesFor) and then reads the knobs as the episode runs.
type Resources struct {
	// CPUFraction is the CPUs the sandbox may use (0: no throttle).
	CPUFraction float64
	// MemoryLimitMB and LeakMBPerMin: the memory limit starts at MemoryLimitMB and shrinks
	// by LeakMBPerMin (0 limit: no memory fault).
	MemoryLimitMB float64
	LeakMBPerMin  float64
	// ClockOffset and ClockDriftPPM skew the sandbox clock.
	ClockOffset   time.Duration
	ClockDriftPPM float64
	// Fired lists the ambient faults in force, to record on the episode's first step.
	Fired []catalogue.Fired
}

// ResourcesFor decides, for one episode, which of rules' resource faults are in force:
// each fires with its probability, drawn by (seed, rule id, "episode", 0) like any other
// fault. Several of one kind combine to the strictest (lowest CPU, lowest limit, fastest
// leak) or add up (clock offsets and drifts).
func ResourcesFor(seed uint64, rules []catalogue.Rule) Resources {
	var r Resources
	for _, rule := range AmbientRules(rules) {
		if !fireDraw(seed, rule.ID+"\x00episode", 0, rule.Probability) {
			continue
		}
		var detail string
		switch rule.Kind.Name {
		case catalogue.KindCPUThrottle:
			r.CPUFraction = minPositive(r.CPUFraction, rule.Num("cpu_fraction"))
			detail = "cpu_fraction=" + fmtNum(rule.Num("cpu_fraction"))
		case catalogue.KindMemoryLeak:
			r.MemoryLimitMB = minPositive(r.MemoryLimitMB, rule.Num("limit_mb"))
			r.LeakMBPerMin = math.Max(r.LeakMBPerMin, rule.Num("mb_per_min"))
			detail = "limit_mb=" + fmtNum(rule.Num("limit_mb")) + " mb_per_min=" + fmtNum(rule.Num("mb_per_min"))
		case catalogue.KindClockSkew:
			r.ClockOffset += ms(rule.Num("offset_ms"))
			r.ClockDriftPPM += rule.Num("drift_ppm")
			detail = "offset_ms=" + fmtNum(rule.Num("offset_ms")) + " drift_ppm=" + fmtNum(rule.Num("drift_ppm"))
		}
		r.Fired = append(r.Fired, catalogue.Fired{RuleID: rule.ID, Kind: rule.Kind.Name, Detail: detail})
	}
	return r
}

// CPUMax is the cgroup v2 cpu.max value ("<quota> <period>" in µs, or "max").
func (r Resources) CPUMax() string {
	if r.CPUFraction <= 0 {
		return "max 100000"
	}
	const period = 100000
	return fmt.Sprintf("%d %d", max(1000, int64(math.Round(r.CPUFraction*period))), period)
}

// MemoryMaxAt is the cgroup v2 memory.max in bytes after elapsed time of the episode
// (-1: no limit). The leak never takes the limit below 16 MiB, so the sandbox can still
// report the failure.
func (r Resources) MemoryMaxAt(elapsed time.Duration) int64 {
	if r.MemoryLimitMB <= 0 {
		return -1
	}
	mb := math.Max(16, r.MemoryLimitMB-r.LeakMBPerMin*elapsed.Minutes())
	return int64(mb * (1 << 20))
}

// Clock maps the host's time to the sandbox's: the offset, plus the drift accumulated
// since the episode started.
func (r Resources) Clock(start, now time.Time) time.Time {
	drift := time.Duration(float64(now.Sub(start)) * r.ClockDriftPPM / 1e6)
	return now.Add(r.ClockOffset + drift)
}

func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

func fmtNum(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// minPositive is the smaller of two caps, 0 meaning none.
func minPositive(cur, v float64) float64 {
	if cur == 0 || v < cur {
		return v
	}
	return cur
}
