// Package curriculum is the Temporal worker module of gauntlet: it polls the
// "gauntlet" task queue of a Temporal server and runs the Curriculum, Batch and
// DurableEpisode workflows and their activities (package workflows). Like every service
// it talks to the others only over NATS: its activities submit runs to the scheduler and
// read their state from the scheduler's KV bucket.
//
// Lifecycle: Starting dials Temporal (a dead server fails the start with the address),
// Running runs the worker until the context ends, Stopping stops it, letting activities
// in flight finish for up to the stop timeout; an unfinished batch is retried by Temporal
// on another worker, and since the run keeps going in the scheduler nothing is lost.
//
// Concurrency: one worker per Service; the SDK runs workflow tasks and activities on its
// own goroutines.
package curriculum

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/play"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/threats"
	"github.com/gauntlet-rl/gauntlet/workflows"
)

// Config configures the worker.
type Config struct {
	// Address is the Temporal frontend, host:port; a func because the address of a
	// locally started dev server is known only once it runs.
	Address func() string
	// Namespace is the Temporal namespace.
	Namespace string
	// WorkerID names this process in durable-episode events.
	WorkerID string
	// Version is the gauntlet build, recorded with the runs the worker submits.
	Version string
	// StopTimeout bounds how long activities in flight may finish on stop.
	StopTimeout time.Duration
	// Sandboxes lends real sandboxes to durable episodes of envs that need them
	// (codefix): the process's sandbox runtime (--sandbox.*), shared with the worker. Nil,
	// or a nil result, makes such episodes fail with env.ErrNoSandbox.
	Sandboxes func() env.Sandboxes
	// Policies are the policies durable episodes play, with their configuration; nil is
	// the registered policies alone.
	Policies *policy.Set
	// Datasets are the task datasets episodes may play, by name (--tasks.datasets, set by
	// the process); nil: none.
	Datasets map[string]string
}

// Service is the Temporal worker.
type Service struct {
	cfg Config
	bus func() *bus.Bus
	log *slog.Logger

	client  client.Client
	worker  worker.Worker
	threats *threats.Watcher
}

// New allocates the service.
func New(cfg Config, getBus func() *bus.Bus, log *slog.Logger) *Service {
	return &Service{cfg: cfg, bus: getBus, log: log}
}

// Starting dials Temporal and registers the workflows and activities, whose durable
// episodes take the sandboxes of the process's runtime, if any.
func (s *Service) Starting(ctx context.Context) error {
	deps := play.Deps{Policies: s.cfg.Policies, Datasets: s.cfg.Datasets}
	if s.cfg.Sandboxes != nil {
		deps.Sandboxes = s.cfg.Sandboxes()
	}
	// Durable episodes share the threat fingerprints like every player (pkg/threats).
	if b := s.bus(); b != nil {
		s.threats = threats.NewWatcher(b.JS, otel.GetMeterProvider().Meter("gauntlet/curriculum"), "gauntlet_curriculum", s.log)
		if err := s.threats.Start(ctx); err != nil {
			return err
		}
		deps.Threats = s.threats
	}
	addr := s.cfg.Address()
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := client.DialContext(dctx, client.Options{
		HostPort: addr, Namespace: s.cfg.Namespace,
		Logger: sdklog.NewStructuredLogger(warnOnly(s.log)),
	})
	if err != nil {
		if s.threats != nil {
			s.threats.Stop()
		}
		return fmt.Errorf("dial temporal at %s (namespace %s): %w", addr, s.cfg.Namespace, err)
	}
	s.client = c
	s.worker = worker.New(c, workflows.TaskQueue, worker.Options{
		WorkerStopTimeout: s.cfg.StopTimeout,
		Identity:          s.cfg.WorkerID,
	})
	workflows.Register(s.worker, &workflows.Activities{Bus: s.bus, WorkerID: s.cfg.WorkerID, Version: s.cfg.Version, Play: deps})
	return nil
}

// Running polls the task queue until ctx ends.
func (s *Service) Running(ctx context.Context) error {
	if s.threats != nil {
		go s.threats.Run(ctx)
	}
	if err := s.worker.Start(); err != nil {
		return fmt.Errorf("start temporal worker on task queue %s: %w", workflows.TaskQueue, err)
	}
	s.log.Info("temporal worker polling", "task_queue", workflows.TaskQueue, "address", s.cfg.Address())
	<-ctx.Done()
	return nil
}

// Stopping stops the worker, then closes the client.
func (s *Service) Stopping(context.Context) error {
	if s.worker != nil {
		s.worker.Stop()
	}
	if s.client != nil {
		s.client.Close()
	}
	return nil
}

// warnOnly keeps the SDK's chatty info logs (every poller start) out of gauntlet's log.
func warnOnly(l *slog.Logger) *slog.Logger {
	return slog.New(levelFilter{l.Handler(), slog.LevelWarn})
}

type levelFilter struct {
	slog.Handler
	min slog.Level
}

func (f levelFilter) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= f.min && f.Handler.Enabled(ctx, l)
}

func (f levelFilter) WithAttrs(a []slog.Attr) slog.Handler {
	return levelFilter{f.Handler.WithAttrs(a), f.min}
}

func (f levelFilter) WithGroup(n string) slog.Handler {
	return levelFilter{f.Handler.WithGroup(n), f.min}
}
