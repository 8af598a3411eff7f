// Package envapi is the env API for trainers (E-features, docs/envapi.md): a connect-go
// service (proto/gauntlet/v1/envapi.proto) served over gRPC, gRPC-Web and Connect's
// HTTP/JSON on one port, through which a trainer resets episodes and chooses each action
// itself, one step at a time, in batches (StepBatch, Send/Recv like EnvPool) or as a
// stream of results.
//
// Every step takes the same path as a worker's (pkg/play): the episode's fault plan comes
// from the faults service, the env applies the action, the reward service scores it, and
// the started, steps and ended events go to GAUNTLET_EVENTS for the store to write into
// ClickHouse; a trainer's token ids, logprobs and policy version travel with the step into
// the trainer_steps table.
//
// MCP: the same port serves each env as an MCP server (streamable HTTP, the official Go
// SDK) at MCPPath+"<env>" (mcp.go, docs/mcp.md): an MCP session is one episode, reset at
// initialize and closed when the session ends; tools/list is the env's tools and
// tools/call a step through the same step path, tokens, quotas and error kinds.
//
// Tenancy: API tokens map to tenants (Tokens); a tenant sees only its own episodes (others'
// are NOT_FOUND), is capped in live episodes (RESOURCE_EXHAUSTED with Retry-After), and its
// episodes are recorded under run "api-<tenant>". The guard in front of connect
// authenticates each request and checks its size before its body is read, and backs off
// addresses that keep failing; the listener caps connections in all and per address.
//
// Concurrency: handlers run on the HTTP server's goroutines. The episode table is guarded
// by one mutex; each episode has its own, held for the length of a step, so one episode
// steps one action at a time while different episodes step in parallel. A reaper goroutine
// ends idle and overdue episodes.
package envapi

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/metric"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/templates"
	"github.com/gauntlet-rl/gauntlet/pkg/play"
	"github.com/gauntlet-rl/gauntlet/pkg/telemetry"
	"github.com/gauntlet-rl/gauntlet/pkg/threats"
	"github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1/gauntletv1connect"
)

// Config configures the env API.
type Config struct {
	// Addr is where the API listens (host:port; port 0 picks a free one).
	Addr string
	// TokensFile is the tenants file (see Tokens); empty makes one tenant, "default",
	// whose random token is written to DevTokenPath.
	TokensFile   string
	DevTokenPath string
	// IDKeyPath is the file of the key episode ids are signed with (made on first use),
	// by which the API tells an episode it ran before a restart from an id it never
	// issued; empty: a key per process, so after a restart such episodes are NOT_FOUND.
	IDKeyPath string
	// MaxEpisodes is a tenant's default cap on live episodes; ServerMaxEpisodes caps
	// them all together.
	MaxEpisodes       int
	ServerMaxEpisodes int
	// StepTimeout bounds one step (env and reward); StartTimeout a Reset (fault plan and
	// env start); EpisodeTimeout an episode's wall time from Reset; IdleTimeout how long
	// an episode may wait for its next step before it is reaped.
	StepTimeout    time.Duration
	StartTimeout   time.Duration
	EpisodeTimeout time.Duration
	IdleTimeout    time.Duration
	// SegmentSteps is how many steps go in one StepsTaken event (as the worker's).
	SegmentSteps int
	// ScoreBatch caps the steps of one score request.
	ScoreBatch int
	// MaxConns caps the connections the API holds (more wait to be accepted);
	// MaxConnsPerHost those from one remote address (more are closed at once).
	MaxConns        int
	MaxConnsPerHost int
	// MaxBatchBytes caps the body of a batch call (StepBatch, Send, StepStream); one
	// Step's cap is fixed by what a step may carry (stepBodyMax).
	MaxBatchBytes int
	// ReadTimeout bounds reading one request, headers and body.
	ReadTimeout time.Duration
	// AuthFailures failed tokens from one address within a minute make the API refuse
	// that address for AuthBackoff (0: never).
	AuthFailures int
	AuthBackoff  time.Duration
	// ID names the API in events (the worker_id column); default "envapi-<random>".
	ID string
	// Sandboxes lends real sandboxes to envs that need them (codefix): the process's
	// sandbox runtime (--sandbox.*), shared with the worker. Nil, or a nil result, makes
	// such envs' Reset fail with env.ErrNoSandbox.
	Sandboxes func() env.Sandboxes
	// Datasets are the task datasets episodes may play, by name (--tasks.datasets, set by
	// the process); nil: none.
	Datasets map[string]string
}

// Validate reports every problem at once, naming the flag.
func (c Config) Validate() error {
	var errs []error
	if c.Addr == "" {
		errs = append(errs, errors.New("envapi.addr: must not be empty"))
	}
	if c.TokensFile == "" && c.DevTokenPath == "" {
		errs = append(errs, errors.New("envapi.tokens: a tenants file is required"))
	}
	if c.MaxEpisodes < 1 {
		errs = append(errs, fmt.Errorf("envapi.max-episodes: %d must be at least 1", c.MaxEpisodes))
	}
	if c.ServerMaxEpisodes < 1 {
		errs = append(errs, fmt.Errorf("envapi.server-max-episodes: %d must be at least 1", c.ServerMaxEpisodes))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"envapi.step-timeout", c.StepTimeout}, {"envapi.start-timeout", c.StartTimeout},
		{"envapi.episode-timeout", c.EpisodeTimeout}, {"envapi.idle-timeout", c.IdleTimeout}} {
		if d.v < 10*time.Millisecond {
			errs = append(errs, fmt.Errorf("%s: %v must be at least 10ms", d.name, d.v))
		}
	}
	if c.MaxConns < 1 {
		errs = append(errs, fmt.Errorf("envapi.max-conns: %d must be at least 1", c.MaxConns))
	}
	if c.MaxConnsPerHost < 1 || c.MaxConnsPerHost > c.MaxConns {
		errs = append(errs, fmt.Errorf("envapi.max-conns-per-host: %d must be between 1 and envapi.max-conns (%d)", c.MaxConnsPerHost, c.MaxConns))
	}
	if c.MaxBatchBytes < stepBodyMax {
		errs = append(errs, fmt.Errorf("envapi.max-batch-bytes: %d must be at least %d, one step's cap", c.MaxBatchBytes, stepBodyMax))
	}
	if c.ReadTimeout < time.Second {
		errs = append(errs, fmt.Errorf("envapi.read-timeout: %v must be at least 1s", c.ReadTimeout))
	}
	if c.AuthFailures < 0 {
		errs = append(errs, fmt.Errorf("envapi.auth-failures: %d must not be negative", c.AuthFailures))
	}
	if c.AuthFailures > 0 && c.AuthBackoff < time.Second {
		errs = append(errs, fmt.Errorf("envapi.auth-backoff: %v must be at least 1s", c.AuthBackoff))
	}
	if c.SegmentSteps < 1 {
		errs = append(errs, fmt.Errorf("envapi.segment-steps: %d must be at least 1", c.SegmentSteps))
	}
	if c.ScoreBatch < 1 {
		errs = append(errs, fmt.Errorf("envapi.score-batch: %d must be at least 1", c.ScoreBatch))
	}
	return errors.Join(errs...)
}

// Service is the env API server.
type Service struct {
	cfg    Config
	bus    func() *bus.Bus
	log    *slog.Logger
	scorer *play.Scorer
	// deps builds episodes: the registry, the sandboxes of the runtime (if any), the
	// plan templates.
	deps   play.Deps
	tokens *Tokens
	ln     net.Listener
	srv    *http.Server
	ctx    context.Context // the service's own, for steps that outlive their request
	cancel context.CancelFunc
	wg     sync.WaitGroup // background steps
	index  atomic.Uint64
	ids    *episodeIDs
	meter  metric.Meter

	mu        sync.Mutex
	live      map[string]*episode
	ended     map[string]*tombstone
	perTenant map[string]int
	inboxes   map[string]*inbox
	snapshots map[string]*snapshot
	// mcpSessions are the live MCP sessions by id (each plays one episode); stopping
	// is set when the API stops, so ending sessions leave their episodes to Stopping.
	mcpSessions map[string]*mcpSession
	stopping    atomic.Bool

	backoff *backoff

	steps        metric.Int64Counter
	episodes     metric.Int64Counter
	cut          metric.Int64Counter
	active       metric.Int64UpDownCounter
	authFailures metric.Int64Counter
}

// New allocates the env API; getBus is its NATS connection.
func New(cfg Config, getBus func() *bus.Bus, tel *telemetry.Telemetry, log *slog.Logger) *Service {
	if cfg.ID == "" {
		cfg.ID = fmt.Sprintf("envapi-%08x", randUint64()>>32)
	}
	m := tel.Meter("gauntlet/envapi")
	key := make([]byte, idKeyBytes)
	_, _ = rand.Read(key) // Starting replaces it with the one in cfg.IDKeyPath
	return &Service{
		cfg: cfg, bus: getBus, log: log, ids: newEpisodeIDs(key),
		scorer:    play.NewScorer(getBus, cfg.ScoreBatch, 4, m, "gauntlet_envapi"),
		live:      map[string]*episode{},
		ended:     map[string]*tombstone{},
		perTenant: map[string]int{},
		inboxes:   map[string]*inbox{},
		snapshots: map[string]*snapshot{},
		steps:     telemetry.Must(m.Int64Counter("gauntlet_envapi_steps_total", metric.WithDescription("Steps taken over the env API."))),
		episodes:  telemetry.Must(m.Int64Counter("gauntlet_envapi_episodes_total", metric.WithDescription("Env API episodes ended."))),
		cut: telemetry.Must(m.Int64Counter("gauntlet_envapi_recorded_bytes_cut_total",
			metric.WithDescription("Bytes of actions, observations and diffs left out of the recording, each value being held to play.MaxFieldBytes."))),
		active: telemetry.Must(m.Int64UpDownCounter("gauntlet_envapi_active_episodes", metric.WithDescription("Env API episodes live now."))),
		authFailures: telemetry.Must(m.Int64Counter("gauntlet_envapi_auth_failures_total",
			metric.WithDescription("Env API calls refused for a missing or unknown token."))),
		backoff:     newBackoff(cfg.AuthFailures, cfg.AuthBackoff),
		mcpSessions: map[string]*mcpSession{},
		meter:       m,
	}
}

// Addr is the address the API listens on, once Starting has returned.
func (s *Service) Addr() string {
	if s.ln == nil {
		return s.cfg.Addr
	}
	return s.ln.Addr().String()
}

// Handler is the API's HTTP handler (gRPC, gRPC-Web and Connect, and MCP at MCPPath)
// behind the guard, which authenticates and checks sizes before connect or the MCP SDK
// reads a request.
func (s *Service) Handler() http.Handler {
	handler := func(readMax int) http.Handler {
		opts := []connect.HandlerOption{connect.WithReadMaxBytes(readMax)}
		for _, c := range strictJSONCodecs {
			opts = append(opts, connect.WithCodec(c))
		}
		_, h := gauntletv1connect.NewEnvServiceHandler(s, opts...)
		return h
	}
	path, _ := gauntletv1connect.NewEnvServiceHandler(s)
	mux := http.NewServeMux()
	g := &guard{
		auth: auth{tokens: s.tokens}, log: s.log, errw: connect.NewErrorWriter(), backoff: s.backoff,
		failures: s.authFailures,
		small:    handler(smallBodyMax), step: handler(stepBodyMax), batch: handler(s.cfg.MaxBatchBytes),
		batchMax: int64(s.cfg.MaxBatchBytes),
	}
	mux.Handle(path, g)
	mux.Handle(MCPPath, s.mcpHandler(g))
	return mux
}

// Starting loads the tenants and binds the listener.
func (s *Service) Starting(ctx context.Context) error {
	if err := s.cfg.Validate(); err != nil {
		return err
	}
	var err error
	if s.tokens, err = OpenTokens(s.cfg, s.log); err != nil {
		return err
	}
	if s.cfg.TokensFile == "" {
		s.log.Info("envapi: no --envapi.tokens; tenant \"default\" gets the token in " + s.cfg.DevTokenPath)
	}
	if s.cfg.IDKeyPath != "" {
		if s.ids, err = loadEpisodeIDs(s.cfg.IDKeyPath, s.log); err != nil {
			return err
		}
	}
	s.ln, err = net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("envapi.addr %s: %w", s.cfg.Addr, err)
	}
	if s.cfg.Sandboxes != nil {
		s.deps.Sandboxes = s.cfg.Sandboxes()
	}
	s.deps.Datasets = s.cfg.Datasets
	if b := s.bus(); b != nil {
		s.deps.Templates = templates.NewClient(b.JS)
		// The threat fingerprints every player shares (pkg/threats): a trainer's episode
		// is flagged like a worker's.
		s.deps.Threats = threats.NewWatcher(b.JS, s.meter, "gauntlet_envapi", s.log)
		if err := s.deps.Threats.Start(ctx); err != nil {
			return err
		}
	}
	// One port for HTTP/1.1 (Connect JSON, gRPC-Web) and unencrypted HTTP/2 (gRPC).
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	// The read timeouts bound how long a client may take to send a request (headers,
	// then the whole body); a long step is the response and is not bounded by them.
	// IdleTimeout closes keep-alive connections nobody uses.
	s.srv = &http.Server{Handler: s.Handler(), Protocols: &protocols,
		ReadHeaderTimeout: 10 * time.Second, ReadTimeout: s.cfg.ReadTimeout, IdleTimeout: 2 * time.Minute}
	s.ln = newLimitListener(s.ln, s.cfg.MaxConns, s.cfg.MaxConnsPerHost)
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	return nil
}

// Running serves until ctx ends, scoring steps and reaping idle episodes meanwhile.
func (s *Service) Running(ctx context.Context) error {
	go s.scorer.Run(s.ctx)
	if s.deps.Threats != nil {
		go s.deps.Threats.Run(s.ctx)
	}
	go s.reap(ctx)
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return fmt.Errorf("envapi server: %w", err)
	}
}

// Stopping stops accepting calls, lets calls and background steps in flight finish (up
// to ctx), then ends every live episode as an infra error (not the policy's doing) so its
// events reach the stream.
func (s *Service) Stopping(ctx context.Context) error {
	if s.srv == nil {
		return nil
	}
	s.stopMCP()
	err := s.srv.Shutdown(ctx)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	s.mu.Lock()
	eps := make([]*episode, 0, len(s.live))
	for _, e := range s.live {
		eps = append(eps, e)
	}
	s.mu.Unlock()
	for _, e := range eps {
		e.mu.Lock()
		s.endLocked(ctx, e, func(ctx context.Context) error {
			return e.sess.FinishInfra(ctx, errors.New("env API stopping"))
		})
		e.mu.Unlock()
	}
	s.cancel()
	return err
}

func randUint64() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

// runID is where a tenant's episodes are recorded.
func runID(tenant string) string { return "api-" + tenant }

// envOr returns v, or def when v is empty.
func envOr(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
