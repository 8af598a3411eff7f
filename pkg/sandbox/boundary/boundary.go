package boundary

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultfs"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/svcnet"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Options says what a Layer applies its faults to.
type Options struct {
	// Env names the env that opens the layer; its errors start with it.
	Env string
	// Target is the fault target of the sandbox's tools: a tool call's faults are
	// recorded as "<Target>/<tool>", the resource faults as Target.
	Target string
	// Runtime and Sandbox are the episode's sandbox.
	Runtime sandbox.Runtime
	Sandbox string
	// Limits are the sandbox's own limits (its spec's): resource faults only lower them,
	// and Close puts them back.
	Limits sandbox.Limits
	// Services are the sandbox's services (its spec's), reached through a fault gateway;
	// none opens no gateway.
	Services []sandbox.Service
	// Faults is the episode's fault injector; nil injects none.
	Faults *inject.Injector
	// Clock is the episode's virtual clock: storage faults' delays advance it, and what
	// fires is stamped with it. It must outlive the layer.
	Clock *time.Duration
}

// Layer is one episode's faults at its sandbox's boundaries.
type Layer struct {
	env, target string
	rt          sandbox.Runtime
	sb          string
	clock       *time.Duration

	decider *inject.Decider // storage faults of the file tools; nil when the plan has none
	// cmd collects the storage faults the agent's commands meet; nil when no layer of
	// the runtime is attached.
	cmd *cmdFaults
	res catalogue.Resources
	// tool is the tool being run, fired the faults fired during its call.
	tool  string
	fired []*gauntletv1.FaultFired
	// applied: the limits last written (zero: the sandbox's own); base: the sandbox's own.
	applied sandbox.Limits
	base    sandbox.Limits
	// skewNote is added to clock_skew's record when the runtime cannot apply it.
	skewNote string
	// svc is the services' gateway; nil without services.
	svc *gateway
}

// Open reads the boundary faults of o.Faults' plan for a new episode and attaches to the
// sandbox what they need: the runtime's storage-fault layer for commands and the
// services' gateway. It fails when the plan has resource faults the runtime cannot apply
// (sandbox.ErrUnsupported). On error nothing stays attached.
func Open(ctx context.Context, o Options) (*Layer, error) {
	l := &Layer{env: o.Env, target: o.Target, rt: o.Runtime, sb: o.Sandbox, clock: o.Clock, base: o.Limits}
	if rules := o.Faults.BoundaryRules(); len(rules) > 0 {
		seed := o.Faults.Plan().GetSeed()
		l.res = inject.ResourcesFor(seed, rules)
		for _, r := range rules {
			if r.Kind.Layer == catalogue.LayerStorage {
				l.decider = inject.NewDecider(seed, rules)
				break
			}
		}
		if l.skewed() {
			if cs, ok := l.rt.(sandbox.ClockSkewer); !ok {
				l.skewNote = " (not applied: runtime " + l.rt.Name() + " cannot skew clocks)"
			} else if _, err := cs.ClockSkewEnv(0, 1); err != nil {
				l.skewNote = " (not applied: " + err.Error() + ")"
			}
		}
		if l.ambient() {
			if _, ok := l.rt.(sandbox.LimitUpdater); !ok {
				return nil, fmt.Errorf("%s: the plan has resource faults but runtime %s cannot change limits: %w", l.env, l.rt.Name(), sandbox.ErrUnsupported)
			}
		}
	}
	if err := l.attachCommands(ctx, l.decider.Clone()); err != nil {
		return nil, err
	}
	if len(o.Services) > 0 {
		if err := l.attachServices(ctx, o.Services, servicesDecider(o.Faults)); err != nil {
			return nil, errors.Join(err, l.Close(ctx))
		}
	}
	return l, nil
}

// Branch returns the layer of a branch of the episode, whose sandbox id was forked from
// this one's and whose clock is clock: the branch's tools, commands and services meet
// from here on what this episode's would, and its limits are those of this moment.
func (l *Layer) Branch(ctx context.Context, id string, clock *time.Duration) (*Layer, error) {
	b := *l
	b.sb, b.clock = id, clock
	b.decider = l.decider.Clone()
	b.fired = nil
	b.applied = sandbox.Limits{}
	b.cmd, b.svc = nil, nil
	if l.cmd != nil {
		if err := b.attachCommands(ctx, l.cmd.d.Clone()); err != nil {
			return nil, err
		}
	}
	// A fork starts with the spec's limits (process) or the source's (containerd): write
	// the faults' limits of this moment either way.
	if b.ambient() {
		b.applied = sandbox.Limits{MemoryBytes: -1}
		if err := b.apply(ctx, *b.clock); err != nil {
			return nil, errors.Join(err, b.Close(ctx))
		}
	}
	if l.svc != nil {
		if err := b.attachServices(ctx, l.svc.services, l.svc.d.Clone()); err != nil {
			return nil, errors.Join(err, b.Close(ctx))
		}
	}
	return &b, nil
}

// Close puts the sandbox's own limits back and detaches the storage-fault layer and the
// services' gateway. It is safe on a nil Layer and after Close.
func (l *Layer) Close(ctx context.Context) error {
	if l == nil {
		return nil
	}
	err := errors.Join(l.RestoreLimits(ctx), l.detachCommands(ctx))
	if l.svc != nil {
		_ = l.svc.gw.Close()
		l.svc = nil
	}
	return err
}

// skewed reports whether a clock_skew fault is in force.
func (l *Layer) skewed() bool { return l.res.ClockOffset != 0 || l.res.ClockDriftPPM != 0 }

// ambient reports whether a resource fault is in force.
func (l *Layer) ambient() bool { return l.res.CPUFraction > 0 || l.res.MemoryLimitMB > 0 }

// ExecEnv is the environment of the agent's commands under clock_skew: the wall clock
// offset by the fault's offset plus the drift accumulated over the episode's virtual time
// so far, running at the drifted rate within each command. Nil without the fault or when
// the runtime cannot skew clocks (recorded on the first step). It is the toolbox's
// tools.Options.ExecEnv.
func (l *Layer) ExecEnv() []string {
	if !l.skewed() {
		return nil
	}
	cs, ok := l.rt.(sandbox.ClockSkewer)
	if !ok || l.skewNote != "" {
		return nil
	}
	off := l.res.ClockOffset + time.Duration(float64(*l.clock)*l.res.ClockDriftPPM/1e6)
	env, _ := cs.ClockSkewEnv(off, 1+l.res.ClockDriftPPM/1e6) // checked by Open; nil at rate 0 (drift_ppm -1e6)
	return env
}

// Gate returns the storage-fault gate of the episode's toolbox (tools.Options.Storage;
// nil without storage faults). Its delays advance the virtual clock; what fires is a
// fault of the tool being called.
func (l *Layer) Gate() *faultfs.Gate {
	if l.decider == nil {
		return nil
	}
	return faultfs.NewGate(l.decider, func(_ string, ev catalogue.Event, fired []catalogue.Fired) {
		for _, f := range fired {
			l.fired = append(l.fired, &gauntletv1.FaultFired{
				FaultId: f.RuleID, Kind: f.Kind, Target: l.target + "/" + l.tool,
				Detail: ev.Op + " " + ev.Path + ": " + f.Detail, AtVirtualNs: int64(*l.clock),
			})
		}
	}, func(_ context.Context, d time.Duration) error {
		*l.clock += d
		return nil
	})
}

// Begin prepares the call of tool that starts at virtual time at: it writes the limits
// of that moment to the sandbox when they changed and starts collecting the call's
// faults (Fired). An error is the runtime's.
func (l *Layer) Begin(ctx context.Context, tool string, at time.Duration) error {
	if err := l.apply(ctx, at); err != nil {
		return err
	}
	l.tool, l.fired = tool, nil
	return nil
}

// Fired returns the faults fired since Begin: the tool's own and, after CommandDone,
// its command's.
func (l *Layer) Fired() []*gauntletv1.FaultFired { return l.fired }

// Ambient is the record of the resource faults in force, for the episode's first step.
func (l *Layer) Ambient() []*gauntletv1.FaultFired {
	out := make([]*gauntletv1.FaultFired, len(l.res.Fired))
	for i, f := range l.res.Fired {
		out[i] = &gauntletv1.FaultFired{FaultId: f.RuleID, Kind: f.Kind, Target: l.target, Detail: f.Detail}
		if f.Kind == catalogue.KindClockSkew {
			out[i].Detail += l.skewNote
		}
	}
	return out
}

// limitsAt are the limits the resource faults ask for at virtual time at, never above
// the sandbox's own.
func (l *Layer) limitsAt(at time.Duration) sandbox.Limits {
	lim := l.base
	if f := l.res.CPUFraction; f > 0 {
		lim.CPUMillis = min(lim.CPUMillis, max(10, int64(math.Round(f*1000))))
	}
	if m := l.res.MemoryMaxAt(at); m > 0 {
		lim.MemoryBytes = min(lim.MemoryBytes, m)
	}
	return sandbox.Limits{MemoryBytes: lim.MemoryBytes, CPUMillis: lim.CPUMillis}
}

// apply writes the limits of virtual time at (a call's start) to the sandbox when they
// changed.
func (l *Layer) apply(ctx context.Context, at time.Duration) error {
	if !l.ambient() {
		return nil
	}
	want := l.limitsAt(at)
	if want == l.applied {
		return nil
	}
	lu := l.rt.(sandbox.LimitUpdater) // checked by Open
	if err := lu.UpdateLimits(ctx, l.sb, want); err != nil {
		return fmt.Errorf("%s: apply resource faults: %w", l.env, err)
	}
	l.applied = want
	return nil
}

// RestoreLimits puts the sandbox's own limits back if resource faults changed them (a
// verifier runs with them); the next Begin applies the faults' again.
func (l *Layer) RestoreLimits(ctx context.Context) error {
	if l == nil || l.applied == (sandbox.Limits{}) {
		return nil
	}
	lu, ok := l.rt.(sandbox.LimitUpdater)
	if !ok {
		return nil
	}
	base := sandbox.Limits{MemoryBytes: l.base.MemoryBytes, CPUMillis: l.base.CPUMillis}
	if err := lu.UpdateLimits(ctx, l.sb, base); err != nil {
		return fmt.Errorf("%s: restore limits of %s: %w", l.env, l.sb, err)
	}
	l.applied = sandbox.Limits{}
	return nil
}

// gateway is the layer's attachment of the sandbox's services.
type gateway struct {
	services []sandbox.Service
	d        *inject.Decider
	rec      *svcnet.Recorder
	gw       *svcnet.Gateway
	// clock is the episode's clock as the gateway's goroutines read it (rec.Now): the
	// virtual time the running tool call started at, published by Publish before it runs.
	clock *atomic.Int64
}

// ServicesDecider is the decider of the faults a sandbox's services and allowed hosts
// meet (svcnet.Options.Decider), for an env that attaches a gateway itself: the layer's
// own (see servicesDecider). Nil without a plan.
func ServicesDecider(in *inject.Injector) *inject.Decider { return servicesDecider(in) }

// servicesDecider decides the faults of the services' traffic: the plan's rules for
// them, its DNS faults (boundary_spec), which meet the sandbox's lookups at the
// gateway's name server, and its connection faults (reset, bandwidth, timeout,
// packet_loss), which meet connections and requests as they open (a stream's loss, as
// its segments pass). Each rule draws on its own stream, so the
// other rules' draws are the same with or without them. Nil without a plan.
func servicesDecider(in *inject.Injector) *inject.Decider {
	if in == nil {
		return nil
	}
	plan := in.Plan()
	rules := catalogue.RulesFromPlan(plan)
	for _, r := range in.BoundaryRules() {
		if plans.IsDNSKind(r.Kind.Name) || plans.IsConnKind(r.Kind.Name) {
			rules = append(rules, r)
		}
	}
	return inject.NewDecider(plan.GetSeed(), rules)
}

// attachServices opens the gateway of the layer's sandbox with decider d.
func (l *Layer) attachServices(ctx context.Context, svcs []sandbox.Service, d *inject.Decider) error {
	clock := new(atomic.Int64)
	clock.Store(int64(*l.clock))
	rec := &svcnet.Recorder{Now: func() time.Duration { return time.Duration(clock.Load()) }}
	gw, err := svcnet.Attach(ctx, l.rt, l.sb, svcs, svcnet.Options{Decider: d, OnFire: rec.OnFire})
	if err != nil {
		return fmt.Errorf("%s: services: %w", l.env, err)
	}
	l.svc = &gateway{services: svcs, d: d, rec: rec, gw: gw, clock: clock}
	return nil
}

// Publish makes the episode's clock the time the services' gateway stamps faults with:
// call it once a call's start time is known, before the call runs.
func (l *Layer) Publish() {
	if l.svc != nil {
		l.svc.clock.Store(int64(*l.clock))
	}
}

// ServiceFaults returns the faults the services' traffic met since the last call.
func (l *Layer) ServiceFaults() []*gauntletv1.FaultFired {
	if l.svc == nil {
		return nil
	}
	return l.svc.rec.Take()
}
