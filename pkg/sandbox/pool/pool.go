// Package pool keeps warm sandboxes per template and hands them out on demand.
//
// For each Template the pool creates one sandbox, snapshots its fresh workspace as the
// template snapshot, and keeps Size sandboxes ready (made by forking that snapshot when the
// runtime can, by Create otherwise). Acquire pops a ready sandbox — a hit, no runtime call
// at all — or, when none is ready, creates one on the spot (a miss). Release restores the
// sandbox to the template snapshot and puts it back instead of destroying it; a runtime
// without snapshots gets it destroyed and replaced. A background loop refills every
// template; at most MaxStarting sandboxes are being created at once and at most
// MaxSandboxes exist (ready, leased or starting), so neither creation nor the pool runs
// unbounded. A reaper destroys leases not released or renewed within LeaseTTL (leaked by a
// crashed episode).
//
// Metrics (OpenTelemetry, names prefixed gauntlet_pool_): acquires by template and result
// (hit, miss), ready and leased sandboxes by template, creations, resets, reaped leases,
// and acquire latency. A Pool is safe for concurrent use. Start launches its goroutines;
// Stop ends them and destroys the ready sandboxes and template snapshots (leased ones are
// destroyed when released after Stop).
package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/telemetry"
)

// Template is one kind of sandbox the pool keeps warm.
type Template struct {
	// Name identifies the template in Acquire and in metrics.
	Name string
	// Spec is what its sandboxes are made from (Spec.ID must be empty).
	Spec sandbox.Spec
	// Size is how many ready sandboxes to keep.
	Size int
}

// Config configures a Pool.
type Config struct {
	Runtime   sandbox.Runtime
	Templates []Template
	// MaxStarting caps sandboxes being created at once (refills and misses); default 4.
	MaxStarting int
	// MaxSandboxes caps sandboxes the pool holds (ready + leased + starting); default
	// 4 × the sum of the templates' sizes, at least 16.
	MaxSandboxes int
	// LeaseTTL is how long a lease lives without Renew before the reaper destroys its
	// sandbox; default 10 minutes.
	LeaseTTL time.Duration
	// ReapInterval is how often the reaper and the refill check run; default 1 s.
	ReapInterval time.Duration
	// Meter receives the metrics; nil disables them.
	Meter metric.Meter
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// Validate reports every problem of the config at once.
func (c Config) Validate() error {
	var errs []error
	if c.Runtime == nil {
		errs = append(errs, errors.New("runtime: required"))
	}
	if len(c.Templates) == 0 {
		errs = append(errs, errors.New("templates: at least one required"))
	}
	seen := map[string]bool{}
	for i, t := range c.Templates {
		switch {
		case t.Name == "":
			errs = append(errs, fmt.Errorf("templates[%d].name: required", i))
		case seen[t.Name]:
			errs = append(errs, fmt.Errorf("templates[%d].name: %q appears twice", i, t.Name))
		}
		seen[t.Name] = true
		if t.Size < 0 {
			errs = append(errs, fmt.Errorf("templates[%d].size: %d is negative", i, t.Size))
		}
		if t.Spec.ID != "" {
			errs = append(errs, fmt.Errorf("templates[%d].spec.id: must be empty (the pool names sandboxes)", i))
		}
		if err := t.Spec.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("templates[%d].spec: %w", i, err))
		}
	}
	if c.MaxStarting < 0 {
		errs = append(errs, fmt.Errorf("max_starting: %d is negative", c.MaxStarting))
	}
	if c.MaxSandboxes < 0 {
		errs = append(errs, fmt.Errorf("max_sandboxes: %d is negative", c.MaxSandboxes))
	}
	if c.LeaseTTL < 0 || c.ReapInterval < 0 {
		errs = append(errs, errors.New("lease_ttl, reap_interval: must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: pool config: %w", sandbox.ErrInvalid, err)
	}
	return nil
}

// Pool hands out warm sandboxes. See the package doc.
type Pool struct {
	cfg   Config
	log   *slog.Logger
	snap  sandbox.Snapshotter // nil: release destroys
	fork  sandbox.Forker      // nil: refill creates
	start chan struct{}       // creation semaphore, MaxStarting slots
	kick  chan struct{}       // wakes the refill loop

	mu     sync.Mutex
	tpl    map[string]*tplState
	leases map[string]*Lease
	total  int // ready + leased + starting
	// freed is closed (and replaced) whenever a sandbox becomes ready or the total falls,
	// waking Acquires waiting at MaxSandboxes.
	freed   chan struct{}
	stopped bool
	// capacity is the cap on sandboxes (Config.MaxSandboxes), grown by AddTemplate when the
	// config left it to the pool (autoMax).
	capacity int
	autoMax  bool
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	stopOnce sync.Once

	m metrics
}

type tplState struct {
	Template
	snapshot string // template snapshot id ("" until made)
	ready    []sandbox.Handle
	starting int
	leased   int
	// removed is set by RemoveTemplate: the template serves no more, and its sandboxes
	// still out or being made are destroyed when they come back.
	removed bool
}

// Lease is one handed-out sandbox. Release or Discard it when the episode ends.
type Lease struct {
	// Handle is the leased sandbox.
	Handle sandbox.Handle
	// Template is the template it came from.
	Template string
	// Warm says whether it came ready from the pool (a hit).
	Warm bool

	p        *Pool
	t        *tplState // its template, which RemoveTemplate may take out of p.tpl
	mu       sync.Mutex
	deadline time.Time
	done     bool
}

type metrics struct {
	acquires metric.Int64Counter
	created  metric.Int64Counter
	resets   metric.Int64Counter
	reaped   metric.Int64Counter
	latency  metric.Float64Histogram
}

// New allocates a pool; Start fills it.
func New(cfg Config) (*Pool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxStarting == 0 {
		cfg.MaxStarting = 4
	}
	autoMax := cfg.MaxSandboxes == 0
	if autoMax {
		n := 0
		for _, t := range cfg.Templates {
			n += t.Size
		}
		cfg.MaxSandboxes = max(4*n, 16)
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 10 * time.Minute
	}
	if cfg.ReapInterval == 0 {
		cfg.ReapInterval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Meter == nil {
		cfg.Meter = noop.NewMeterProvider().Meter("gauntlet/pool")
	}
	p := &Pool{
		cfg:      cfg,
		log:      cfg.Logger,
		start:    make(chan struct{}, cfg.MaxStarting),
		kick:     make(chan struct{}, 1),
		tpl:      map[string]*tplState{},
		leases:   map[string]*Lease{},
		freed:    make(chan struct{}),
		capacity: cfg.MaxSandboxes, autoMax: autoMax,
	}
	p.snap, _ = cfg.Runtime.(sandbox.Snapshotter)
	if p.snap != nil {
		p.fork, _ = cfg.Runtime.(sandbox.Forker)
	}
	for _, t := range cfg.Templates {
		t.Spec.Template = t.Name
		p.tpl[t.Name] = &tplState{Template: t}
	}
	m := cfg.Meter
	p.m = metrics{
		acquires: telemetry.Must(m.Int64Counter("gauntlet_pool_acquires_total", metric.WithDescription("Sandbox acquisitions, by template and result (hit, miss)."))),
		created:  telemetry.Must(m.Int64Counter("gauntlet_pool_sandboxes_created_total", metric.WithDescription("Sandboxes created by the pool, by template."))),
		resets:   telemetry.Must(m.Int64Counter("gauntlet_pool_resets_total", metric.WithDescription("Released sandboxes reset to the template snapshot, by template and result."))),
		reaped:   telemetry.Must(m.Int64Counter("gauntlet_pool_leases_reaped_total", metric.WithDescription("Leases destroyed by the reaper after their TTL, by template."))),
		latency:  telemetry.Must(m.Float64Histogram("gauntlet_pool_acquire_seconds", metric.WithDescription("Acquire latency, by template and result."), metric.WithUnit("s"))),
	}
	gauge := func(name, desc string, f func(*tplState) int) {
		telemetry.Must(m.Int64ObservableGauge(name, metric.WithDescription(desc),
			metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
				p.mu.Lock()
				defer p.mu.Unlock()
				for name, t := range p.tpl {
					o.Observe(int64(f(t)), metric.WithAttributes(attribute.String("template", name)))
				}
				return nil
			})))
	}
	gauge("gauntlet_pool_ready", "Ready (warm) sandboxes, by template.", func(t *tplState) int { return len(t.ready) })
	gauge("gauntlet_pool_leased", "Leased sandboxes, by template.", func(t *tplState) int { return t.leased })
	return p, nil
}

// Start launches the refill loop and the reaper. They run until Stop or ctx ends.
func (p *Pool) Start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped || p.cancel != nil {
		return errors.New("pool: already started or stopped")
	}
	ctx, p.cancel = context.WithCancel(ctx)
	p.wg.Add(1)
	go p.loop(ctx)
	return nil
}

// Stop ends the background loops, waits for creations in flight, and destroys the ready
// sandboxes and the template snapshots.
func (p *Pool) Stop(ctx context.Context) error {
	var err error
	p.stopOnce.Do(func() {
		p.mu.Lock()
		p.stopped = true
		p.freeLocked() // waiting Acquires return ErrClosed
		cancel := p.cancel
		p.mu.Unlock()
		if cancel != nil {
			cancel()
		}
		p.wg.Wait()
		p.mu.Lock()
		var ready []sandbox.Handle
		var snaps []string
		for _, t := range p.tpl {
			ready = append(ready, t.ready...)
			p.total -= len(t.ready)
			t.ready = nil
			if t.snapshot != "" {
				snaps = append(snaps, t.snapshot)
				t.snapshot = ""
			}
		}
		p.mu.Unlock()
		var errs []error
		for _, h := range ready {
			if e := p.cfg.Runtime.Destroy(ctx, h.ID); e != nil && !errors.Is(e, sandbox.ErrNotFound) {
				errs = append(errs, e)
			}
		}
		for _, s := range snaps {
			if e := p.snap.DeleteSnapshot(ctx, s); e != nil && !errors.Is(e, sandbox.ErrNotFound) {
				errs = append(errs, e)
			}
		}
		err = errors.Join(errs...)
	})
	return err
}

func (p *Pool) loop(ctx context.Context) {
	defer p.wg.Done()
	var fills sync.WaitGroup
	defer fills.Wait()
	tick := time.NewTicker(p.cfg.ReapInterval)
	defer tick.Stop()
	for {
		p.reap(ctx)
		p.refill(ctx, &fills)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-p.kick:
		}
	}
}

// refill starts creations for every template below its size, within the caps.
func (p *Pool) refill(ctx context.Context, fills *sync.WaitGroup) {
	for {
		p.mu.Lock()
		var t *tplState
		for _, s := range p.tpl {
			if len(s.ready)+s.starting < s.Size && p.total < p.capacity {
				t = s
				break
			}
		}
		if t == nil || p.stopped {
			p.mu.Unlock()
			return
		}
		t.starting++
		p.total++
		p.mu.Unlock()
		select {
		case p.start <- struct{}{}:
		case <-ctx.Done():
			p.mu.Lock()
			t.starting--
			p.total--
			p.freeLocked()
			p.mu.Unlock()
			return
		}
		fills.Add(1)
		go func() {
			defer fills.Done()
			h, err := p.make(ctx, t)
			<-p.start
			p.mu.Lock()
			defer p.mu.Unlock()
			t.starting--
			defer p.freeLocked()
			if err != nil {
				p.total--
				if ctx.Err() == nil && !t.removed {
					p.log.Warn("pool refill failed", "template", t.Name, "err", err)
				}
				return
			}
			if p.stopped || t.removed {
				p.total--
				go func() { _ = p.cfg.Runtime.Destroy(context.Background(), h.ID) }()
				return
			}
			t.ready = append(t.ready, h)
		}()
	}
}

// make creates one sandbox of t: a fork of the template snapshot when possible. The first
// sandbox of a template makes the template snapshot.
func (p *Pool) make(ctx context.Context, t *tplState) (sandbox.Handle, error) {
	p.mu.Lock()
	snap := t.snapshot
	p.mu.Unlock()
	var h sandbox.Handle
	var err error
	if snap != "" && p.fork != nil {
		h, err = p.fork.Fork(ctx, snap)
	} else {
		h, err = p.cfg.Runtime.Create(ctx, t.Spec)
	}
	if err != nil {
		return sandbox.Handle{}, err
	}
	p.m.created.Add(ctx, 1, metric.WithAttributes(attribute.String("template", t.Name)))
	if snap == "" && p.snap != nil {
		s, err := p.snap.Snapshot(ctx, h.ID)
		if err != nil {
			_ = p.cfg.Runtime.Destroy(context.Background(), h.ID)
			return sandbox.Handle{}, fmt.Errorf("template snapshot: %w", err)
		}
		p.mu.Lock()
		if t.snapshot == "" && !t.removed {
			t.snapshot = s.ID
			s.ID = ""
		}
		p.mu.Unlock()
		if s.ID != "" { // another creation made one first, or the template was removed
			_ = p.snap.DeleteSnapshot(ctx, s.ID)
		}
	}
	return h, nil
}

// AddTemplate adds a template to the pool, started or not (a task's image first seen
// after Start, say); the refill loop fills it as it fills the others. Unless
// Config.MaxSandboxes was given, the cap on sandboxes grows by 4 × its size, as New sizes
// it. A name the pool knows is ErrExists; a template New would refuse, ErrInvalid.
func (p *Pool) AddTemplate(t Template) error {
	if err := (Config{Runtime: p.cfg.Runtime, Templates: []Template{t}}).Validate(); err != nil {
		return fmt.Errorf("add template %s: %w", t.Name, err)
	}
	p.mu.Lock()
	switch _, known := p.tpl[t.Name]; {
	case p.stopped:
		p.mu.Unlock()
		return fmt.Errorf("add template %s: %w", t.Name, sandbox.ErrClosed)
	case known:
		p.mu.Unlock()
		return fmt.Errorf("add template %s: %w", t.Name, sandbox.ErrExists)
	}
	t.Spec.Template = t.Name
	p.tpl[t.Name] = &tplState{Template: t}
	if p.autoMax {
		p.capacity += 4 * t.Size
		p.freeLocked() // Acquires waiting at the cap may go on
	}
	p.mu.Unlock()
	p.kicked()
	return nil
}

// RemoveTemplate takes a template out of the pool (a task image no episode has asked for
// lately): Acquire no longer knows it, its ready sandboxes and its template snapshot are
// destroyed now, and those leased or being made are destroyed when they are released or
// done, never made ready again. Unless Config.MaxSandboxes was given, the cap shrinks as
// AddTemplate grew it. An unknown name is ErrNotFound.
func (p *Pool) RemoveTemplate(ctx context.Context, name string) error {
	p.mu.Lock()
	t, ok := p.tpl[name]
	if !ok {
		p.mu.Unlock()
		return fmt.Errorf("remove template %s: %w", name, sandbox.ErrNotFound)
	}
	delete(p.tpl, name)
	t.removed = true
	ready, snap := t.ready, t.snapshot
	t.ready, t.snapshot = nil, ""
	p.total -= len(ready)
	if p.autoMax {
		p.capacity -= 4 * t.Size
	}
	p.freeLocked()
	p.mu.Unlock()
	p.kicked()
	var errs []error
	for _, h := range ready {
		if err := p.cfg.Runtime.Destroy(ctx, h.ID); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	if snap != "" {
		if err := p.snap.DeleteSnapshot(ctx, snap); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove template %s: %w", name, err)
	}
	return nil
}

// Acquire hands out a sandbox of the named template: a ready one if any (hit), else a
// new one created now (miss), waiting for a creation slot if MaxStarting are busy. When
// the pool holds MaxSandboxes already it waits for one to be released or destroyed: more
// episodes than sandboxes is back-pressure, not a failure. Only ctx bounds that wait; its
// error then wraps sandbox.ErrLimit and ctx's error.
func (p *Pool) Acquire(ctx context.Context, template string) (*Lease, error) {
	begin := time.Now()
	p.mu.Lock()
	t, ok := p.tpl[template]
	if !ok {
		p.mu.Unlock()
		return nil, fmt.Errorf("acquire: %w: unknown template %q", sandbox.ErrNotFound, template)
	}
	for {
		if p.stopped {
			p.mu.Unlock()
			return nil, fmt.Errorf("acquire %s: %w", template, sandbox.ErrClosed)
		}
		if n := len(t.ready); n > 0 {
			h := t.ready[n-1]
			t.ready = t.ready[:n-1]
			l := p.leaseLocked(t, h, true)
			p.mu.Unlock()
			p.kicked()
			p.record(ctx, template, "hit", begin)
			return l, nil
		}
		if p.total < p.capacity {
			break
		}
		freed, limit := p.freed, p.capacity
		p.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return nil, fmt.Errorf("acquire %s: %w: the pool holds %d sandboxes, none given back in time: %w",
				template, sandbox.ErrLimit, limit, ctx.Err())
		}
		p.mu.Lock()
	}
	p.total++
	t.starting++
	p.mu.Unlock()

	undo := func() {
		p.mu.Lock()
		p.total--
		t.starting--
		p.freeLocked()
		p.mu.Unlock()
	}
	select {
	case p.start <- struct{}{}:
	case <-ctx.Done():
		undo()
		return nil, fmt.Errorf("acquire %s: %w", template, ctx.Err())
	}
	h, err := p.make(ctx, t)
	<-p.start
	if err != nil {
		undo()
		return nil, fmt.Errorf("acquire %s: %w", template, err)
	}
	p.mu.Lock()
	t.starting--
	l := p.leaseLocked(t, h, false)
	p.mu.Unlock()
	p.kicked()
	p.record(ctx, template, "miss", begin)
	return l, nil
}

func (p *Pool) record(ctx context.Context, template, result string, begin time.Time) {
	attrs := metric.WithAttributes(attribute.String("template", template), attribute.String("result", result))
	p.m.acquires.Add(ctx, 1, attrs)
	p.m.latency.Record(ctx, time.Since(begin).Seconds(), attrs)
}

func (p *Pool) leaseLocked(t *tplState, h sandbox.Handle, warm bool) *Lease {
	t.leased++
	l := &Lease{Handle: h, Template: t.Name, Warm: warm, p: p, t: t, deadline: time.Now().Add(p.cfg.LeaseTTL)}
	p.leases[h.ID] = l
	return l
}

// freeLocked wakes the Acquires waiting at MaxSandboxes; p.mu is held.
func (p *Pool) freeLocked() {
	close(p.freed)
	p.freed = make(chan struct{})
}

func (p *Pool) kicked() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Renew extends the lease by the pool's LeaseTTL. It fails once the lease has ended.
func (l *Lease) Renew() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return fmt.Errorf("renew %s: %w: lease ended", l.Handle.ID, sandbox.ErrNotFound)
	}
	l.deadline = time.Now().Add(l.p.cfg.LeaseTTL)
	return nil
}

// end marks the lease finished; it reports false if it already was.
func (l *Lease) end() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return false
	}
	l.done = true
	return true
}

// Release returns the sandbox: reset to the template snapshot and made ready again, or
// destroyed when it cannot be reset (no snapshots, restore failed, pool full or stopped).
func (l *Lease) Release(ctx context.Context) error {
	if !l.end() {
		return fmt.Errorf("release %s: %w: lease already ended", l.Handle.ID, sandbox.ErrNotFound)
	}
	p := l.p
	p.mu.Lock()
	t := l.t
	delete(p.leases, l.Handle.ID)
	t.leased--
	snap, stopped, full := t.snapshot, p.stopped || t.removed, len(t.ready) >= t.Size
	p.mu.Unlock()
	attrs := func(r string) metric.MeasurementOption {
		return metric.WithAttributes(attribute.String("template", l.Template), attribute.String("result", r))
	}
	if snap != "" && !stopped && !full {
		// A reset sandbox never carries an episode's storage-fault layer.
		var err error
		if sf, ok := p.cfg.Runtime.(sandbox.StorageFaulter); ok {
			err = sf.DetachStorageFaults(ctx, l.Handle.ID)
		}
		if err == nil {
			err = p.snap.Restore(ctx, l.Handle.ID, snap)
		}
		if err == nil {
			p.mu.Lock()
			if !p.stopped && !t.removed {
				t.ready = append(t.ready, l.Handle)
				p.freeLocked()
				p.mu.Unlock()
				p.m.resets.Add(ctx, 1, attrs("ok"))
				return nil
			}
			p.mu.Unlock()
		} else {
			p.m.resets.Add(ctx, 1, attrs("failed"))
			p.log.Warn("pool reset failed; destroying", "sandbox", l.Handle.ID, "err", err)
		}
	}
	return p.destroy(ctx, l.Handle.ID)
}

// Discard destroys the sandbox instead of resetting it (use it when the episode may have
// left something a workspace restore does not undo).
func (l *Lease) Discard(ctx context.Context) error {
	if !l.end() {
		return fmt.Errorf("discard %s: %w: lease already ended", l.Handle.ID, sandbox.ErrNotFound)
	}
	p := l.p
	p.mu.Lock()
	delete(p.leases, l.Handle.ID)
	l.t.leased--
	p.mu.Unlock()
	return p.destroy(ctx, l.Handle.ID)
}

func (p *Pool) destroy(ctx context.Context, id string) error {
	err := p.cfg.Runtime.Destroy(ctx, id)
	p.mu.Lock()
	p.total--
	p.freeLocked()
	p.mu.Unlock()
	p.kicked()
	if err != nil && !errors.Is(err, sandbox.ErrNotFound) {
		return fmt.Errorf("pool destroy %s: %w", id, err)
	}
	return nil
}

// reap destroys the sandboxes of leases past their deadline.
func (p *Pool) reap(ctx context.Context) {
	now := time.Now()
	p.mu.Lock()
	var expired []*Lease
	for _, l := range p.leases {
		l.mu.Lock()
		if !l.done && now.After(l.deadline) {
			expired = append(expired, l)
		}
		l.mu.Unlock()
	}
	p.mu.Unlock()
	for _, l := range expired {
		if err := l.Discard(ctx); err != nil {
			if !errors.Is(err, sandbox.ErrNotFound) {
				p.log.Warn("pool reaper", "sandbox", l.Handle.ID, "err", err)
			}
			continue
		}
		p.log.Warn("pool reaped a leaked lease", "sandbox", l.Handle.ID, "template", l.Template)
		p.m.reaped.Add(ctx, 1, metric.WithAttributes(attribute.String("template", l.Template)))
	}
}

// Stats is a point-in-time view of one template.
type Stats struct {
	Ready, Starting, Leased int
}

// Stats reports the named template's counts.
func (p *Pool) Stats(template string) (Stats, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.tpl[template]
	if !ok {
		return Stats{}, false
	}
	return Stats{Ready: len(t.ready), Starting: t.starting, Leased: t.leased}, true
}
