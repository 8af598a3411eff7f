package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/policy/httppolicy"
	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// cmdDemo starts the whole stack in this process, runs one campaign through it, prints the
// results and stops the stack: the end-to-end job of the README's quick start.
func cmdDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", stderr)
	var cfg config
	cfg.register(fs)
	var o runOpts
	o.register(fs, 20_000)
	if err := parse(fs, args); err != nil {
		return err
	}
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	if !explicit["log.level"] {
		cfg.LogLevel = "warn" // the progress bar and summary are the demo's output
	}
	if o.label == "" {
		o.label = "demo"
	}
	o.worlds = cfg.Worlds
	if pol, err := runs.ParseShares("--policies", o.policies); err == nil &&
		slices.ContainsFunc(pol, func(s *gauntletv1.Share) bool { return s.Name == httppolicy.Name }) {
		// The demo's runs ask the endpoint its own stack is configured with.
		o.endpoint, o.model = cfg.PolicyHTTP.URL, cfg.PolicyHTTP.Model
	}
	o.tasks.datasets = func() (map[string]string, error) { return cfg.Tasks.Datasets, nil }
	req, err := o.request()
	if err != nil {
		return err
	}
	a, err := newAppLogging(cfg, stderr)
	if err != nil {
		return err
	}
	stackCtx, stopStack := context.WithCancel(context.Background())
	defer stopStack()
	stackErr := make(chan error, 1)
	// The data plane only: a demo needs no Temporal (and must not take its ports).
	go func() { stackErr <- a.run(stackCtx, []string{modPipeline}) }()

	fmt.Fprintln(stdout, "starting gauntlet (embedded NATS, local ClickHouse, all services)…")
	if !waitReady(ctx, a) {
		stopStack()
		if err := <-stackErr; err != nil {
			return fmt.Errorf("stack did not start: %w", err)
		}
		return ctx.Err()
	}
	fmt.Fprintf(stdout, "up: nats %s, clickhouse %s, metrics http://%s/metrics\n\n", a.natsURL(), a.clickHouseAddr(), cfg.HTTPAddr)
	runErr := putRewardSpec(ctx, a.getBus(), o.spec)
	if runErr == nil {
		runErr = runAndReport(ctx, a.getBus(), a.clickHouseAddr(), cfg.Database, req, stdout, stderr)
	}
	fmt.Fprintln(stdout, "\nstopping gauntlet…")
	stopStack()
	if err := <-stackErr; err != nil && runErr == nil {
		runErr = err
	}
	return runErr
}

// waitReady waits until every module of a runs; false if ctx ended first or the stack
// failed to start.
func waitReady(ctx context.Context, a *app) bool {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if a.mgr.Ready() == nil {
			return true
		}
		for _, st := range a.mgr.States() {
			if st == "failed" {
				return false
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
}
