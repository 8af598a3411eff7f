package codefix

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultfs"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Faults at the sandbox's boundaries (B1, B2, B4): the plan's boundary_spec holds storage
// and resource faults. Storage faults reach the file tools through a faultfs.Gate over a
// Decider keyed by the plan's seed, spending their delays on the episode's virtual clock;
// every fault that fires is a FaultFired of the step whose tool met it (target
// "sandbox/<tool>", detail "<op> <path>: <what>"). Resource faults are decided once per
// episode (inject.ResourcesFor) and applied through the runtime's cgroup knobs
// (sandbox.LimitUpdater) before every tool call: cpu_throttle as the CPU quota,
// memory_leak as a memory limit shrinking with the episode's virtual time; clock_skew
// through the runtime's sandbox.ClockSkewer in the environment of the agent's commands
// (process: libfaketime; a runtime without it records the fault as not applied). They are
// recorded on the episode's first step. Limits are put back before the verifier's
// snapshot and before the sandbox goes back to its pool.

// boundary is an episode's state for faults at its sandbox's boundaries.
type boundary struct {
	decider *inject.Decider // storage faults; nil when the plan has none
	// cmd collects the storage faults the agent's commands meet (shellfaults.go); nil
	// when no layer is attached.
	cmd *cmdFaults
	res inject.Resources
	// tool is the tool being run, fired the storage faults fired during this step.
	tool  string
	fired []*gauntletv1.FaultFired
	// applied: the limits last written (zero: the sandbox's own); base: the sandbox's own.
	applied sandbox.Limits
	base    sandbox.Limits
	// skewNote is added to clock_skew's record when the runtime cannot apply it.
	skewNote string
}

// skewed reports whether a clock_skew fault is in force.
func (b *boundary) skewed() bool { return b.res.ClockOffset != 0 || b.res.ClockDriftPPM != 0 }

// execEnv is the environment of the agent's commands under clock_skew: the wall clock
// offset by the fault's offset plus the drift accumulated over the episode's virtual time
// so far, running at the drifted rate within each command. Nil without the fault or when
// the runtime cannot skew clocks (recorded on the first step).
func (e *episode) execEnv() []string {
	if !e.bnd.skewed() {
		return nil
	}
	cs, ok := e.cfg.Sandboxes.Runtime().(sandbox.ClockSkewer)
	if !ok || e.bnd.skewNote != "" {
		return nil
	}
	off := e.bnd.res.ClockOffset + time.Duration(float64(e.clock)*e.bnd.res.ClockDriftPPM/1e6)
	env, _ := cs.ClockSkewEnv(off, 1+e.bnd.res.ClockDriftPPM/1e6) // checked by initBoundary; nil at rate 0 (drift_ppm -1e6)
	return env
}

// ambient reports whether a resource fault is in force.
func (b *boundary) ambient() bool { return b.res.CPUFraction > 0 || b.res.MemoryLimitMB > 0 }

// initBoundary reads the plan's boundary faults for a new episode.
func (e *episode) initBoundary() error {
	rules := e.faults.BoundaryRules()
	spec, err := sandboxSpec(e.task, e.p)
	if err != nil {
		return err
	}
	e.bnd = boundary{base: spec.Limits}
	if len(rules) == 0 {
		return nil
	}
	seed := e.faults.Plan().GetSeed()
	e.bnd.res = inject.ResourcesFor(seed, rules)
	for _, r := range rules {
		if r.Kind.Layer == catalogue.LayerStorage {
			e.bnd.decider = inject.NewDecider(seed, rules)
			break
		}
	}
	if e.bnd.skewed() {
		if cs, ok := e.cfg.Sandboxes.Runtime().(sandbox.ClockSkewer); !ok {
			e.bnd.skewNote = " (not applied: runtime " + e.cfg.Sandboxes.Runtime().Name() + " cannot skew clocks)"
		} else if _, err := cs.ClockSkewEnv(0, 1); err != nil {
			e.bnd.skewNote = " (not applied: " + err.Error() + ")"
		}
	}
	if e.bnd.ambient() {
		if _, ok := e.cfg.Sandboxes.Runtime().(sandbox.LimitUpdater); !ok {
			return fmt.Errorf("codefix: the plan has resource faults but runtime %s cannot change limits: %w", e.cfg.Sandboxes.Runtime().Name(), sandbox.ErrUnsupported)
		}
	}
	return nil
}

// gate returns the storage-fault gate of the episode's toolbox (nil without storage
// faults). Its delays advance the virtual clock.
func (e *episode) gate() *faultfs.Gate {
	if e.bnd.decider == nil {
		return nil
	}
	return faultfs.NewGate(e.bnd.decider, func(_ string, ev catalogue.Event, fired []catalogue.Fired) {
		for _, f := range fired {
			e.bnd.fired = append(e.bnd.fired, &gauntletv1.FaultFired{
				FaultId: f.RuleID, Kind: f.Kind, Target: Service + "/" + e.bnd.tool,
				Detail: ev.Op + " " + ev.Path + ": " + f.Detail, AtVirtualNs: int64(e.clock),
			})
		}
	}, func(_ context.Context, d time.Duration) error {
		e.clock += d
		return nil
	})
}

// ambientFired is the record of the resource faults in force, for the first step.
func (e *episode) ambientFired() []*gauntletv1.FaultFired {
	out := make([]*gauntletv1.FaultFired, len(e.bnd.res.Fired))
	for i, f := range e.bnd.res.Fired {
		out[i] = &gauntletv1.FaultFired{FaultId: f.RuleID, Kind: f.Kind, Target: Service, Detail: f.Detail}
		if f.Kind == catalogue.KindClockSkew {
			out[i].Detail += e.bnd.skewNote
		}
	}
	return out
}

// limitsAt are the limits the resource faults ask for at virtual time at, never above
// the sandbox's own.
func (e *episode) limitsAt(at time.Duration) sandbox.Limits {
	l := e.bnd.base
	if f := e.bnd.res.CPUFraction; f > 0 {
		l.CPUMillis = min(l.CPUMillis, max(10, int64(math.Round(f*1000))))
	}
	if m := e.bnd.res.MemoryMaxAt(at); m > 0 {
		l.MemoryBytes = min(l.MemoryBytes, m)
	}
	return sandbox.Limits{MemoryBytes: l.MemoryBytes, CPUMillis: l.CPUMillis}
}

// applyResources writes the limits of virtual time at (a call's start) to the sandbox
// when they changed.
func (e *episode) applyResources(ctx context.Context, at time.Duration) error {
	if !e.bnd.ambient() {
		return nil
	}
	want := e.limitsAt(at)
	if want == e.bnd.applied {
		return nil
	}
	lu := e.cfg.Sandboxes.Runtime().(sandbox.LimitUpdater) // checked by initBoundary
	if err := lu.UpdateLimits(ctx, e.sb, want); err != nil {
		return fmt.Errorf("codefix: apply resource faults: %w", err)
	}
	e.bnd.applied = want
	return nil
}

// restoreLimits puts the sandbox's own limits back if resource faults changed them.
func (e *episode) restoreLimits(ctx context.Context) error {
	if e.bnd.applied == (sandbox.Limits{}) || e.sb == "" {
		return nil
	}
	lu, ok := e.cfg.Sandboxes.Runtime().(sandbox.LimitUpdater)
	if !ok {
		return nil
	}
	base := sandbox.Limits{MemoryBytes: e.bnd.base.MemoryBytes, CPUMillis: e.bnd.base.CPUMillis}
	if err := lu.UpdateLimits(ctx, e.sb, base); err != nil {
		return fmt.Errorf("codefix: restore limits of %s: %w", e.sb, err)
	}
	e.bnd.applied = sandbox.Limits{}
	return nil
}
