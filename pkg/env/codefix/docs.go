package codefix

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/svcnet"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// The docs service (param docs=1): an HTTP service the env runs on the host's loopback,
// which the sandbox reaches as http://docs:8080 ($DOCS_URL) through the fault gateway of
// package svcnet. The episode's fault plan has rules for it like for any
// service (baseline latency on every call, rare 429/503/truncation, more under stress and
// edge); the faults that fire on the agent's requests are recorded on the step. The
// sandbox resolves "docs" through the gateway's name server, where the plan's DNS faults
// (from its boundary_spec) apply.
const (
	// DocsService is the service's name inside the sandbox and its fault target.
	DocsService = "docs"
	// DocsPort is its port inside the sandbox.
	DocsPort = 8080
	// DocsTemplate is the sandbox template of episodes with the docs service.
	DocsTemplate = "codefix-sh-docs"
	// DocsCommand is what the oracle runs to read the docs.
	DocsCommand = `busybox wget -q -O- "$DOCS_URL/guide"`
)

// docsGuide is what GET /guide answers.
const docsGuide = `codefix guide
Each function of src/lib.sh is described in README.md; tests/test_lib.sh checks it.
Run the tests with: sh tests/test_lib.sh
Fix the function, never the tests: the verifier compares tests/ byte for byte.
`

var docsHost struct {
	once sync.Once
	addr string
	err  error
}

// docsUpstream starts the process's docs server on the host's loopback (once) and
// returns its address.
func docsUpstream() (string, error) {
	docsHost.once.Do(func() {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			docsHost.err = fmt.Errorf("codefix: docs service: %w", err)
			return
		}
		mux := http.NewServeMux()
		mux.HandleFunc("GET /guide", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = io.WriteString(w, docsGuide)
		})
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(l) }() // lives as long as the process
		docsHost.addr = l.Addr().String()
	})
	return docsHost.addr, docsHost.err
}

// docsServices are the services of an episode's sandbox.
func docsServices(p params) ([]sandbox.Service, error) {
	if !p.docs {
		return nil, nil
	}
	up, err := docsUpstream()
	if err != nil {
		return nil, err
	}
	return []sandbox.Service{{Name: DocsService, Port: DocsPort, Upstream: up}}, nil
}

// docsGateway is an episode's attachment of the docs service.
type docsGateway struct {
	d   *faults.Decider
	rec *svcnet.Recorder
	gw  *svcnet.Gateway
	// clock is the episode's clock as the gateway's goroutines read it (rec.Now): the
	// virtual time the running tool call started at, published by call before it runs.
	clock *atomic.Int64
}

// publishClock makes the episode's clock the time the gateway stamps faults with.
func (e *episode) publishClock() {
	if e.docs != nil {
		e.docs.clock.Store(int64(e.clock))
	}
}

// attachDocs opens the gateway of e's sandbox with decider d (the episode's plan when
// nil and the episode has one).
func (e *episode) attachDocs(ctx context.Context, d *faults.Decider) error {
	if !e.p.docs {
		return nil
	}
	svcs, err := docsServices(e.p)
	if err != nil {
		return err
	}
	if d == nil && e.cfg.Faults != nil {
		plan := e.cfg.Faults.Plan()
		rules := faults.RulesFromPlan(plan)
		// The plan's DNS faults (boundary_spec) meet the sandbox's lookups of "docs" at
		// the gateway's name server; they act on lookups only, so the other rules' draws
		// are the same with or without them.
		for _, r := range e.cfg.Faults.BoundaryRules() {
			if faults.IsDNSKind(r.Kind.Name) {
				rules = append(rules, r)
			}
		}
		d = faults.NewDecider(plan.GetSeed(), rules)
	}
	clock := new(atomic.Int64)
	clock.Store(int64(e.clock))
	rec := &svcnet.Recorder{Now: func() time.Duration { return time.Duration(clock.Load()) }}
	gw, err := svcnet.Attach(ctx, e.cfg.Sandboxes.Runtime(), e.sb, svcs, svcnet.Options{Decider: d, OnFire: rec.OnFire})
	if err != nil {
		return fmt.Errorf("codefix: docs service: %w", err)
	}
	e.docs = &docsGateway{d: d, rec: rec, gw: gw, clock: clock}
	return nil
}

// detachDocs closes the episode's gateway, if open.
func (e *episode) detachDocs() {
	if e.docs != nil {
		_ = e.docs.gw.Close()
		e.docs = nil
	}
}

// docsFaults returns the faults the docs service met since the last call.
func (e *episode) docsFaults() []*gauntletv1.FaultFired {
	if e.docs == nil {
		return nil
	}
	return e.docs.rec.Take()
}
