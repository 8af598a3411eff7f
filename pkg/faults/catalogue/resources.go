package catalogue

import (
	"fmt"
	"math"
	"time"
)

// Resources is what a profile's resource faults (memory_leak, cpu_throttle, clock_skew)
// ask of a sandbox, in the terms a runtime applies: cgroup v2 knob values and a clock
// transform. A runtime decides once per episode which ambient faults are in force
// (inject.ResourcesFor) and then reads the knobs as the episode runs.
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
	Fired []Fired
}

// ApplyAmbient returns res with resource rule r, of kind k, in force, and the detail its
// firing records: the ambient counterpart of Apply. Kinds that act on events leave res
// as it is.
func (k *KindInfo) ApplyAmbient(res Resources, r *Rule) (Resources, string) {
	if k.ambient == nil {
		return res, ""
	}
	return k.ambient(res, r)
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
