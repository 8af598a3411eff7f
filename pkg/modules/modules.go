// Package modules runs a set of named lifecycle services with declared dependencies, the way
// Loki and dskit assemble one binary from many modules. A module's init function builds its
// service (allocation only); the manager starts modules in dependency order, runs them
// together, and on a stop request or the first failure stops them in reverse order within
// a bounded time.
//
// Virtual modules (no service, only dependencies) name groups such as "all". A Manager is
// configured by one goroutine before Run; Ready and States are safe for concurrent use.
package modules

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/lifecycle"
)

// State is where a module is in its lifecycle.
type State string

// Module states, in order.
const (
	StateNew        State = "new"
	StateStarting   State = "starting"
	StateRunning    State = "running"
	StateStopping   State = "stopping"
	StateTerminated State = "terminated"
	StateFailed     State = "failed"
	// StateUnready is what States reports for a running module whose service, a
	// lifecycle.Readier, says it cannot do its work now (its child server is down).
	StateUnready State = "unready"
)

// InitFunc builds a module's service. It runs after the init functions of the module's
// dependencies, so it may use what they built, but must not do I/O.
type InitFunc func() (lifecycle.Service, error)

type module struct {
	name    string
	init    InitFunc // nil for a virtual module
	deps    []string
	service lifecycle.Service
	state   State
}

// Manager holds the module graph and runs a selection of it.
type Manager struct {
	log         *slog.Logger
	stopTimeout time.Duration

	mu      sync.Mutex
	modules map[string]*module
	running []*module
}

// New returns an empty manager. stopTimeout bounds the whole stopping phase.
func New(log *slog.Logger, stopTimeout time.Duration) *Manager {
	return &Manager{log: log, stopTimeout: stopTimeout, modules: map[string]*module{}}
}

// Register adds a module with a service.
func (m *Manager) Register(name string, init InitFunc, deps ...string) {
	m.modules[name] = &module{name: name, init: init, deps: deps, state: StateNew}
}

// RegisterVirtual adds a module that only groups its dependencies.
func (m *Manager) RegisterVirtual(name string, deps ...string) {
	m.modules[name] = &module{name: name, deps: deps, state: StateNew}
}

// Names lists the registered modules, sorted.
func (m *Manager) Names() []string {
	out := make([]string, 0, len(m.modules))
	for n := range m.modules {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Order returns the targets and everything they depend on, dependencies first. It reports
// unknown names and cycles.
func (m *Manager) Order(targets []string) ([]string, error) {
	var order []string
	state := map[string]int{} // 0 unseen, 1 visiting, 2 done
	var visit func(name string, path []string) error
	visit = func(name string, path []string) error {
		mod, ok := m.modules[name]
		if !ok {
			return fmt.Errorf("unknown module %q (known: %s)", name, strings.Join(m.Names(), ", "))
		}
		switch state[name] {
		case 1:
			return fmt.Errorf("module dependency cycle: %s", strings.Join(append(path, name), " -> "))
		case 2:
			return nil
		}
		state[name] = 1
		for _, d := range mod.deps {
			if err := visit(d, append(path, name)); err != nil {
				return err
			}
		}
		state[name] = 2
		order = append(order, name)
		return nil
	}
	for _, t := range targets {
		if err := visit(t, nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// Run initialises, starts and runs the targets until ctx is cancelled or a module fails,
// then stops everything it started in reverse order. It returns the first failure, or nil
// after a requested stop.
func (m *Manager) Run(ctx context.Context, targets []string) error {
	order, err := m.Order(targets)
	if err != nil {
		return err
	}
	var mods []*module
	for _, name := range order {
		mod := m.modules[name]
		if mod.init == nil {
			continue
		}
		svc, err := mod.init()
		if err != nil {
			return fmt.Errorf("init module %s: %w", name, err)
		}
		mod.service = svc
		mods = append(mods, mod)
	}

	runCtx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	var (
		started []*module
		failure error
		wg      sync.WaitGroup
		failed  = make(chan error, len(mods))
	)
	for _, mod := range mods {
		m.setState(mod, StateStarting)
		m.log.Info("module starting", "module", mod.name)
		t0 := time.Now()
		started = append(started, mod)
		if err := mod.service.Starting(ctx); err != nil {
			m.setState(mod, StateFailed)
			failure = fmt.Errorf("start module %s: %w", mod.name, err)
			break
		}
		m.setState(mod, StateRunning)
		m.log.Info("module running", "module", mod.name, "start_ms", time.Since(t0).Milliseconds())
		wg.Add(1)
		go func(mod *module) {
			defer wg.Done()
			err := mod.service.Running(runCtx)
			if err == nil && runCtx.Err() == nil {
				// A module that stops by itself leaves the others running without it
				// (a worker that quietly stopped pulling left runs unfinished, forever).
				err = errors.New("its run loop returned before the stop")
			}
			if err != nil {
				m.setState(mod, StateFailed)
				failed <- fmt.Errorf("module %s failed: %w", mod.name, err)
			}
		}(mod)
	}
	m.mu.Lock()
	m.running = started
	m.mu.Unlock()

	if failure == nil {
		select {
		case <-ctx.Done():
			m.log.Info("stop requested")
		case failure = <-failed:
			m.log.Error("module failed; stopping", "err", failure)
		}
	}
	cancelRun()
	stopCtx, cancelStop := context.WithTimeout(context.Background(), m.stopTimeout)
	defer cancelStop()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-stopCtx.Done():
		m.log.Warn("modules did not leave their run loops in time")
	}
	var stopErrs []error
	for i := len(started) - 1; i >= 0; i-- {
		mod := started[i]
		failedBefore := m.stateOf(mod) == StateFailed
		if !failedBefore {
			m.setState(mod, StateStopping)
		}
		if err := mod.service.Stopping(stopCtx); err != nil {
			stopErrs = append(stopErrs, fmt.Errorf("stop module %s: %w", mod.name, err))
		}
		if !failedBefore {
			m.setState(mod, StateTerminated)
		}
		m.log.Info("module stopped", "module", mod.name)
	}
	return errors.Join(append([]error{failure}, stopErrs...)...)
}

func (m *Manager) setState(mod *module, s State) {
	m.mu.Lock()
	mod.state = s
	m.mu.Unlock()
}

func (m *Manager) stateOf(mod *module) State {
	m.mu.Lock()
	defer m.mu.Unlock()
	return mod.state
}

// States reports each started module's state; a running module that is a
// lifecycle.Readier and not ready is StateUnready.
func (m *Manager) States() map[string]State {
	out := map[string]State{}
	for _, st := range m.check() {
		out[st.name] = st.state
	}
	return out
}

// Ready reports nil when every started module runs and is ready, else which are not and
// why.
func (m *Manager) Ready() error {
	states := m.check()
	if len(states) == 0 {
		return errors.New("no module started yet")
	}
	var not []string
	for _, st := range states {
		switch {
		case st.unready != nil:
			not = append(not, fmt.Sprintf("%s is not ready: %v", st.name, st.unready))
		case st.state != StateRunning:
			not = append(not, fmt.Sprintf("%s is %s", st.name, st.state))
		}
	}
	if len(not) > 0 {
		return errors.New(strings.Join(not, "; "))
	}
	return nil
}

// moduleState is one started module's state as check saw it.
type moduleState struct {
	name    string
	state   State
	unready error // why a running Readier is not ready
}

// check reads the started modules' states, in start order, asking each running Readier
// (outside the lock: a check may take a lock of its own).
func (m *Manager) check() []moduleState {
	m.mu.Lock()
	out := make([]moduleState, len(m.running))
	svcs := make([]lifecycle.Service, len(m.running))
	for i, mod := range m.running {
		out[i] = moduleState{name: mod.name, state: mod.state}
		svcs[i] = mod.service
	}
	m.mu.Unlock()
	for i := range out {
		if r, ok := svcs[i].(lifecycle.Readier); ok && out[i].state == StateRunning {
			if err := r.Ready(); err != nil {
				out[i].state, out[i].unready = StateUnready, err
			}
		}
	}
	return out
}
