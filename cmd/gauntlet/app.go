package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/childproc"
	"github.com/gauntlet-rl/gauntlet/pkg/chlocal"
	"github.com/gauntlet-rl/gauntlet/pkg/console"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/lifecycle"
	"github.com/gauntlet-rl/gauntlet/pkg/modules"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/policy/httppolicy"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/telemetry"
	"github.com/gauntlet-rl/gauntlet/pkg/temporallocal"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
	"github.com/gauntlet-rl/gauntlet/services/curriculum"
	"github.com/gauntlet-rl/gauntlet/services/envapi"
	"github.com/gauntlet-rl/gauntlet/services/faults"
	"github.com/gauntlet-rl/gauntlet/services/reward"
	"github.com/gauntlet-rl/gauntlet/services/scheduler"
	"github.com/gauntlet-rl/gauntlet/services/store"
	"github.com/gauntlet-rl/gauntlet/services/worker"
	"github.com/gauntlet-rl/gauntlet/workflows"
)

// Module names. "all" is every service; the others are the pieces they stand on.
const (
	modNATS       = "nats"
	modBus        = "bus"
	modClickHouse = "clickhouse"
	modHTTP       = "http"
	modScheduler  = "scheduler"
	modWorker     = "worker"
	modFaults     = "faults"
	modReward     = "reward"
	modStore      = "store"
	modTemporal   = "temporal"
	modCurriculum = "curriculum"
	modPipeline   = "pipeline"
	modEnvAPI     = "envapi"
	modSandbox    = "sandbox"
	modConsole    = "console"
	modAll        = "all"
)

// app wires gauntlet's modules for one process, like Loki's modules.go: each init function
// builds one module from the config and from what its dependencies built.
type app struct {
	cfg config
	log *slog.Logger
	tel *telemetry.Telemetry
	mgr *modules.Manager

	nats  *bus.Server
	bus   *bus.Bus            // the process's own connection (streams, demo client)
	conns map[string]*bus.Bus // one connection per service module, as in split mode
	ch    *chlocal.Server
	http  *http.Server
	// mux is the http server's, built by the http module; the console mounts on it.
	mux *http.ServeMux

	temporal *temporallocal.Server // nil when --temporal names an external server
	// temporalUp is temporal once started: what other goroutines read (the console's
	// handlers may ask for the address while the temporal module starts).
	temporalUp atomic.Pointer[temporallocal.Server]
	// children are the supervisors of the local servers this process runs, for the
	// restart counter.
	children children
	// publishers are the bus connections, for the back-pressure metrics.
	publishers publishers
	envapi     *envapi.Service
	// sandboxes is the process's sandbox runtime, opened by the sandbox module; nil when
	// --sandbox.runtime is empty.
	sandboxes *runtimes.Sandboxes
}

// newApp validates cfg (see config.validate) and wires the modules; it starts nothing.
func newApp(cfg config, log *slog.Logger) (*app, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// User worlds are envs like the built-in ones for every module of the process.
	if err := cfg.Worlds.Register(); err != nil {
		return nil, err
	}
	httpPolicy, err := httppolicy.New(cfg.PolicyHTTP)
	if err != nil {
		return nil, err
	}
	// The policies this process's agents are built from, configured here rather than in
	// a package variable.
	policies := policy.NewSet(httpPolicy)
	tel, err := telemetry.New("gauntlet", cfg.TraceFile)
	if err != nil {
		return nil, err
	}
	a := &app{cfg: cfg, log: log, tel: tel, mgr: modules.New(log, cfg.StopTimeout), conns: map[string]*bus.Bus{}}
	if err := a.children.register(tel.Meter("gauntlet")); err != nil {
		return nil, err
	}
	if err := a.publishers.register(tel.Meter("gauntlet")); err != nil {
		return nil, err
	}
	m := a.mgr
	m.Register(modNATS, a.initNATS)
	m.Register(modBus, a.initBus, modNATS)
	m.Register(modClickHouse, a.initClickHouse)
	m.Register(modHTTP, a.initHTTP)
	m.Register(modSandbox, a.initSandbox)
	m.Register(modFaults, func() (lifecycle.Service, error) {
		return faults.New(a.busFor(modFaults), tel.Meter("gauntlet/faults"), log.With("module", modFaults)), nil
	}, modBus, modHTTP)
	m.Register(modReward, func() (lifecycle.Service, error) {
		return reward.New(cfg.Reward, a.busFor(modReward), tel.Meter("gauntlet/reward"), log.With("module", modReward)), nil
	}, modBus, modHTTP)
	m.Register(modScheduler, func() (lifecycle.Service, error) {
		return scheduler.New(cfg.Scheduler, a.busFor(modScheduler), tel.Meter("gauntlet/scheduler"), log.With("module", modScheduler)), nil
	}, modBus, modHTTP)
	m.Register(modWorker, func() (lifecycle.Service, error) {
		wc := cfg.Worker
		wc.Policies, wc.Sandboxes, wc.Datasets = policies, a.getSandboxes, cfg.Tasks.Datasets
		return worker.New(wc, a.busFor(modWorker), a.busFor(connWorkerRPC), tel, log.With("module", modWorker)), nil
	}, modBus, modHTTP, modSandbox)
	m.Register(modStore, func() (lifecycle.Service, error) {
		sc := cfg.Store
		sc.Addr = a.clickHouseAddr
		return store.New(sc, a.busFor(modStore), tel.Meter("gauntlet/store"), log.With("module", modStore)), nil
	}, modBus, modClickHouse, modHTTP)
	m.Register(modEnvAPI, func() (lifecycle.Service, error) {
		if cfg.EnvAPI.Addr == "" {
			return lifecycle.Funcs{}, nil // off
		}
		ec := cfg.EnvAPI
		ec.Sandboxes, ec.Datasets = a.getSandboxes, cfg.Tasks.Datasets
		a.envapi = envapi.New(ec, a.busFor(modEnvAPI), tel, log.With("module", modEnvAPI))
		return a.envapi, nil
	}, modBus, modHTTP, modSandbox)
	m.Register(modConsole, a.initConsole, modBus, modClickHouse, modHTTP)
	m.Register(modTemporal, a.initTemporal)
	m.Register(modCurriculum, func() (lifecycle.Service, error) {
		return curriculum.New(curriculum.Config{
			Address: a.temporalAddr, Namespace: cfg.TemporalNamespace,
			WorkerID: cfg.Worker.ID, Version: version, StopTimeout: cfg.StopTimeout / 2,
			Sandboxes: a.getSandboxes, Policies: policies, Datasets: cfg.Tasks.Datasets,
		}, a.busFor(modCurriculum), log.With("module", modCurriculum)), nil
	}, modBus, modTemporal, modHTTP, modSandbox)
	// Services depend on each other only through NATS (requests retry until a responder
	// is there), so none is a module dependency of another; the order of "all" starts the
	// responders (faults, reward) before their callers anyway.
	// "pipeline" is the data plane (what `gauntlet demo` needs); "all" adds the Temporal
	// control plane and the env API for trainers.
	m.RegisterVirtual(modPipeline, modHTTP, modStore, modFaults, modReward, modScheduler, modWorker)
	m.RegisterVirtual(modAll, modPipeline, modCurriculum, modEnvAPI, modConsole)
	return a, nil
}

func (a *app) getBus() *bus.Bus { return a.bus }

// busFor returns the connection of a service module, opened by the bus module's Starting.
// Each service has its own connection even in one process, so no service's traffic queues
// behind another's and the wiring is the same as in split mode.
func (a *app) busFor(module string) func() *bus.Bus {
	return func() *bus.Bus { return a.conns[module] }
}

// connWorkerRPC is the worker's second connection, for score requests: on the connection
// that carries its event publishes, a request would queue behind hundreds of publishes.
const connWorkerRPC = "worker-rpc"

var connNames = []string{modFaults, modReward, modScheduler, modWorker, connWorkerRPC, modStore, modCurriculum, modEnvAPI}

func (a *app) clickHouseAddr() string {
	if a.ch != nil {
		return a.ch.Addr()
	}
	return a.cfg.ClickHouse
}

// natsURL is where outside clients reach this process's NATS.
func (a *app) natsURL() string {
	if a.nats != nil {
		return a.nats.ClientURL()
	}
	return a.cfg.NATSURL
}

// run runs the targets until ctx ends or a module fails.
func (a *app) run(ctx context.Context, targets []string) error {
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = a.tel.Shutdown(sctx)
	}()
	return a.mgr.Run(ctx, targets)
}

func (a *app) initNATS() (lifecycle.Service, error) {
	if a.cfg.NATSURL != "" {
		return lifecycle.Funcs{}, nil // an external cluster: nothing to run here
	}
	a.nats = bus.NewServer(bus.ServerConfig{
		StoreDir: filepath.Join(a.cfg.DataDir, "jetstream"),
		Port:     a.cfg.NATSPort,
	}, a.log.With("module", modNATS))
	return a.nats, nil
}

func (a *app) initBus() (lifecycle.Service, error) {
	return lifecycle.Funcs{
		OnStarting: func(ctx context.Context) error {
			var err error
			if a.bus, err = a.connect("gauntlet"); err != nil {
				return err
			}
			sc := bus.DefaultStreamConfig()
			sc.Replicas = a.cfg.Replicas
			sc.EventsMaxBytes, sc.EventsHistoryBytes = a.cfg.EventsMaxBytes, a.cfg.EventsHistoryBytes
			if err := a.bus.EnsureStreams(ctx, sc); err != nil {
				return err
			}
			a.publishers.add(a.bus)
			for _, m := range connNames {
				if a.conns[m], err = a.connect("gauntlet-" + m); err != nil {
					return err
				}
				a.publishers.add(a.conns[m])
			}
			return nil
		},
		// What every required consumer has processed leaves the events stream, so it
		// never holds the stream full (bus.TrimEvents); each process trims, harmlessly.
		OnRunning: func(ctx context.Context) error {
			a.bus.RetainEvents(ctx, a.cfg.EventsHistoryBytes, time.Second)
			return nil
		},
		OnStopping: func(context.Context) error {
			var errs []error
			for _, b := range a.conns {
				errs = append(errs, b.Close())
			}
			return errors.Join(append(errs, a.bus.Close())...)
		},
	}, nil
}

// connect opens a connection to this process's NATS (in-process when embedded).
func (a *app) connect(name string) (*bus.Bus, error) {
	if a.nats != nil && a.cfg.NATSTCP {
		return bus.Connect(a.nats.ClientURL(), name, a.log)
	}
	if a.nats != nil {
		return bus.Connect("", name, a.log, a.nats.ConnectOption())
	}
	return bus.Connect(a.cfg.NATSURL, name, a.log)
}

// initClickHouse runs ClickHouse as a supervised child unless --clickhouse names a
// server: restarted when it dies, the module unready until it answers again (the store
// keeps its events meanwhile and writes them then).
func (a *app) initClickHouse() (lifecycle.Service, error) {
	if a.cfg.ClickHouse != "" {
		return externalClickHouse(a.cfg.ClickHouse, a.log.With("module", modClickHouse)), nil
	}
	var sup *childproc.Supervisor
	return lifecycle.Funcs{
		OnStarting: func(ctx context.Context) error {
			var err error
			a.ch, err = chlocal.Start(ctx, chlocal.Options{
				Dir:     filepath.Join(a.cfg.DataDir, "clickhouse"),
				TCPPort: a.cfg.ClickHousePort,
				Logger:  a.log.With("module", modClickHouse),
			})
			if err != nil {
				return err
			}
			sup = a.ch.Supervise(childproc.DefaultBackoff)
			a.children.add(modClickHouse, sup)
			return nil
		},
		OnRunning: func(ctx context.Context) error { return sup.Run(ctx) },
		OnReady:   func() error { return sup.Ready() },
		OnStopping: func(ctx context.Context) error {
			if a.ch == nil {
				return nil
			}
			return a.ch.Stop(ctx)
		},
	}, nil
}

// externalProbeEvery spaces the probes of an external ClickHouse; externalProbeTimeout
// bounds one (a server that takes longer to answer SELECT 1 is not serving).
const (
	externalProbeEvery   = 2 * time.Second
	externalProbeTimeout = 5 * time.Second
)

// externalClickHouse is the clickhouse module for a server this process does not run
// (--clickhouse): nothing to start or stop, but readiness tells whether it answers
// SELECT 1, probed in the background so that a readiness check only reads the last
// answer. An unreachable ClickHouse leaves the store's events waiting in NATS, so the
// stack is up but not ready.
func externalClickHouse(addr string, log *slog.Logger) lifecycle.Service {
	var last atomic.Pointer[error]
	probe := func(ctx context.Context) {
		pctx, cancel := context.WithTimeout(ctx, externalProbeTimeout)
		err := chlocal.Ping(pctx, addr)
		cancel()
		if ctx.Err() != nil {
			return // stopping: the probe's failure says nothing about the server
		}
		if err != nil {
			err = fmt.Errorf("clickhouse at %s does not answer: %w", addr, err)
		}
		switch prev := last.Swap(&err); {
		case err != nil && (prev == nil || *prev == nil):
			log.Warn("external clickhouse does not answer", "addr", addr, "err", err)
		case err == nil && prev != nil && *prev != nil:
			log.Info("external clickhouse answers again", "addr", addr)
		}
	}
	return lifecycle.Funcs{
		OnStarting: func(ctx context.Context) error {
			probe(ctx)
			return nil
		},
		OnRunning: func(ctx context.Context) error {
			t := time.NewTicker(externalProbeEvery)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return nil
				case <-t.C:
					probe(ctx)
				}
			}
		},
		OnReady: func() error {
			if err := last.Load(); err != nil {
				return *err
			}
			return fmt.Errorf("clickhouse at %s not probed yet", addr)
		},
	}
}

// temporalAddr is where Temporal clients reach the frontend.
func (a *app) temporalAddr() string {
	if t := a.temporalUp.Load(); t != nil {
		return t.Addr()
	}
	return a.cfg.Temporal
}

// temporalUI is the Web UI of the local dev server ("" for an external server).
func (a *app) temporalUI() string {
	if t := a.temporalUp.Load(); t != nil {
		return t.UIURL()
	}
	return ""
}

// initTemporal starts the Temporal dev server (SQLite under the data dir, Web UI on) as
// a supervised child unless --temporal names an existing server.
func (a *app) initTemporal() (lifecycle.Service, error) {
	if a.cfg.Temporal != "" {
		return lifecycle.Funcs{}, nil
	}
	var sup *childproc.Supervisor
	return lifecycle.Funcs{
		OnStarting: func(ctx context.Context) error {
			var err error
			a.temporal, err = temporallocal.Start(ctx, temporallocal.Options{
				Dir:    filepath.Join(a.cfg.DataDir, "temporal"),
				Port:   a.cfg.TemporalPort,
				UIPort: a.cfg.TemporalUIPort,
				NoUI:   a.cfg.TemporalUIPort < 0,
				Logger: a.log.With("module", modTemporal),
				// Curricula show their state and stage in Temporal's UI.
				SearchAttributes: workflows.SearchAttributes,
			})
			if err != nil {
				return err
			}
			// A dev server that dies is restarted on its SQLite database: workflows
			// resume where they were, and the curriculum worker reconnects.
			a.temporalUp.Store(a.temporal)
			sup = a.temporal.Supervise(childproc.DefaultBackoff)
			a.children.add(modTemporal, sup)
			return nil
		},
		OnRunning: func(ctx context.Context) error { return sup.Run(ctx) },
		OnReady:   func() error { return sup.Ready() },
		OnStopping: func(ctx context.Context) error {
			if a.temporal == nil {
				return nil
			}
			return a.temporal.Stop(ctx)
		},
	}, nil
}

func (a *app) initHTTP() (lifecycle.Service, error) {
	if a.cfg.HTTPAddr == "" {
		return lifecycle.Funcs{}, nil
	}
	mux := http.NewServeMux()
	a.mux = mux
	mux.Handle("GET /metrics", a.tel.Handler())
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, _ *http.Request) {
		if err := a.mgr.Ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("GET /modules", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(a.mgr.States())
	})
	a.http = &http.Server{Addr: a.cfg.HTTPAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	var ln net.Listener
	return lifecycle.Funcs{
		OnStarting: func(context.Context) error {
			var err error
			ln, err = net.Listen("tcp", a.cfg.HTTPAddr)
			if err != nil {
				return fmt.Errorf("--http %s: %w", a.cfg.HTTPAddr, err)
			}
			return nil
		},
		OnRunning: func(ctx context.Context) error {
			errc := make(chan error, 1)
			go func() { errc <- a.http.Serve(ln) }()
			select {
			case <-ctx.Done():
				return nil
			case err := <-errc:
				return fmt.Errorf("http server: %w", err)
			}
		},
		OnStopping: func(ctx context.Context) error {
			if err := a.http.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}, nil
}

// initConsole mounts the web console (pkg/console) on the http server, reading the
// ClickHouse database the store writes and, for runs in flight, the scheduler's records
// in the gauntlet_runs bucket, and curricula from Temporal (whose signals it sends to a
// holder of an env API token); off, like /ready, when --http is empty. It is mounted
// once its dependencies have started, so its handlers never see a half-built app.
func (a *app) initConsole() (lifecycle.Service, error) {
	if a.mux == nil {
		return lifecycle.Funcs{}, nil
	}
	var c *console.Console
	return lifecycle.Funcs{
		OnStarting: func(context.Context) error {
			runs := bus.NewBucket(a.bus.JS, bus.BucketRuns)
			// Actions on curricula take the env API's tokens, read as the env API
			// reads them (the same tenants file, or the same dev token).
			tokens, err := envapi.OpenTokens(a.cfg.EnvAPI, a.log.With("module", modConsole))
			if err != nil {
				return fmt.Errorf("console: %w", err)
			}
			c = console.New(console.Config{
				ClickHouse: a.clickHouseAddr, Database: a.cfg.Database,
				Temporal: a.temporalAddr, Namespace: a.cfg.TemporalNamespace,
				Authorize: func(tok string) bool { return tokens.Lookup(tok) != nil },
				Progress: func(ctx context.Context, runID string) (*gauntletv1.RunProgress, bool) {
					kv, err := runs.KV(ctx)
					if err != nil {
						return nil, false
					}
					e, err := kv.Get(ctx, runID)
					if err != nil {
						return nil, false
					}
					p, err := gauntletv1.DecodeRunProgress(e.Value())
					return p, err == nil
				},
			}, a.log.With("module", modConsole))
			a.mux.Handle(console.Prefix, c)
			return nil
		},
		OnStopping: func(context.Context) error { return c.Close() },
	}, nil
}

// stack is what `gauntlet up` tells client commands (run, sql, episode) about where the
// stack listens, in <data-dir>/stack.json.
type stack struct {
	NATSURL    string `json:"nats_url"`
	ClickHouse string `json:"clickhouse"`
	Database   string `json:"database"`
	HTTP       string `json:"http"`
	Temporal   string `json:"temporal,omitempty"`
	TemporalUI string `json:"temporal_ui,omitempty"`
	EnvAPI     string `json:"envapi,omitempty"`
	// Console is the web console's address, when this process serves it.
	Console string `json:"console,omitempty"`
	// Datasets are the task datasets the stack's episodes may play, by name
	// (--tasks.datasets): `gauntlet run --tasks` finds a dataset's name and folder here.
	Datasets map[string]string `json:"datasets,omitempty"`
	PID      int               `json:"pid"`
}

func stackPath(dataDir string) string { return filepath.Join(dataDir, "stack.json") }

func writeStack(dataDir string, s stack) error {
	b, _ := json.MarshalIndent(s, "", "  ")
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return err
	}
	// Written aside and renamed over, so a client reading it as gauntlet starts sees the
	// whole file or none, never a truncated one.
	f, err := os.CreateTemp(dataDir, ".stack-*.json")
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), stackPath(dataDir))
	}
	if err != nil {
		_ = os.Remove(f.Name())
	}
	return err
}

func readStack(dataDir string) (stack, error) {
	var s stack
	b, err := os.ReadFile(stackPath(dataDir))
	if err != nil {
		return s, fmt.Errorf("no running stack found in %s (%w): start one with `gauntlet up`, point --data-dir (default: $%s, else %s) at a running stack's data dir, or name its parts with --nats, --clickhouse, --temporal",
			dataDir, err, dataDirEnv, defaultDataDir)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("read %s: %w", stackPath(dataDir), err)
	}
	return s, nil
}

// initSandbox is the process's sandbox runtime (--sandbox.*): opened once, shared by every
// module that plays episodes (worker, env API, durable episodes), closed after all of them
// have stopped, since they depend on it. One runtime per process means one warm pool and,
// for containerd, one private daemon, whichever modules run.
func (a *app) initSandbox() (lifecycle.Service, error) {
	return lifecycle.Funcs{
		OnStarting: func(ctx context.Context) error {
			sc := a.cfg.Sandbox
			sb, err := runtimes.Open(ctx, sc, a.log.With("module", modSandbox, "sandbox_runtime", sc.Runtime))
			if err != nil {
				return err
			}
			a.sandboxes = sb
			if sb == nil { // --sandbox.runtime is empty
				return nil
			}
			if sup := sb.Supervisor(); sup != nil {
				a.children.add("containerd", sup)
			}
			return nil
		},
		// A private containerd is restarted when it dies, the module unready meanwhile.
		OnRunning: func(ctx context.Context) error {
			if a.sandboxes != nil && a.sandboxes.Supervisor() != nil {
				return a.sandboxes.Supervisor().Run(ctx)
			}
			<-ctx.Done()
			return nil
		},
		OnReady: func() error {
			if a.sandboxes == nil {
				return nil
			}
			return a.sandboxes.Ready()
		},
		OnStopping: func(context.Context) error {
			if a.sandboxes == nil {
				return nil
			}
			return a.sandboxes.Close()
		},
	}, nil
}

// getSandboxes is the process's sandbox runtime as the services take it: a nil interface
// (not a nil pointer in one) when none is configured.
func (a *app) getSandboxes() env.Sandboxes {
	if a.sandboxes == nil {
		return nil
	}
	return a.sandboxes
}
