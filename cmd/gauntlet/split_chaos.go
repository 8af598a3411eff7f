package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/splitlocal"
	"github.com/gauntlet-rl/gauntlet/services/scheduler"
)

// chaosFlags are split up's --chaos.* flags.
type chaosFlags struct {
	seed             uint64
	rounds           int
	minWait, maxWait time.Duration
}

// validate names the flag that is wrong.
func (c chaosFlags) validate() error {
	switch {
	case c.seed == 0:
		return nil
	case c.rounds < 1:
		return fmt.Errorf("--chaos.rounds %d: want 1 or more", c.rounds)
	case c.minWait < 0:
		return fmt.Errorf("--chaos.min-wait %v: want 0 or more", c.minWait)
	case c.maxWait < c.minWait:
		return fmt.Errorf("--chaos.max-wait %v: want at least --chaos.min-wait %v", c.maxWait, c.minWait)
	}
	return nil
}

func chaosLogPath(dataDir string) string { return filepath.Join(dataDir, "chaos.jsonl") }

// startChaos runs the seeded chaos plan against s in the background, appending every
// fault to path (truncated first: one file per split up), and closes the returned
// channel when the plan is over or ctx ends. A part that stays down ends the chaos with
// an error in the log and in the file; the stack keeps running for the operator to see.
func startChaos(ctx context.Context, s *splitlocal.Stack, c chaosFlags, path string, log *slog.Logger) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f, err := os.Create(path)
		if err != nil {
			log.Error("chaos: cannot record faults; no chaos", "path", path, "err", err)
			return
		}
		defer f.Close()
		b, err := bus.Connect(s.NATS.URL(), "split-chaos", log)
		if err != nil {
			log.Error("chaos: connect to nats; no chaos", "err", err)
			return
		}
		defer b.Close()
		plan := splitlocal.PlanChaos(c.seed, c.rounds, c.minWait, c.maxWait)
		log.Info("chaos: started", "seed", c.seed, "faults", len(plan), "path", path)
		enc := json.NewEncoder(f)
		err = s.Chaos(ctx, plan, func(ctx context.Context) (string, error) { return schedulerLeader(ctx, b, s) },
			func(ev splitlocal.ChaosEvent) {
				if err := enc.Encode(ev); err != nil {
					log.Error("chaos: record fault", "err", err)
				}
				log.Info("chaos: killed", "kind", ev.Kind, "victim", ev.Victim, "pid", ev.Pid, "recovered", ev.Recovered, "error", ev.Err)
			})
		switch {
		case err == nil:
			log.Info("chaos: plan done", "faults", len(plan))
		case !errors.Is(err, context.Canceled):
			log.Error("chaos: stopped", "err", err)
		}
	}()
	return done
}

// schedulerLeader names the stack's scheduler process holding the leader lease, whose
// value is "host/pid/random".
func schedulerLeader(ctx context.Context, b *bus.Bus, s *splitlocal.Stack) (string, error) {
	kv, err := b.JS.KeyValue(ctx, bus.BucketLeases)
	if err != nil {
		return "", fmt.Errorf("open bucket %s: %w", bus.BucketLeases, err)
	}
	e, err := kv.Get(ctx, scheduler.LeaseKey)
	if err != nil {
		return "", fmt.Errorf("read lease %s: %w", scheduler.LeaseKey, err)
	}
	parts := strings.Split(string(e.Value()), "/")
	if len(parts) != 3 {
		return "", fmt.Errorf("lease %s holds %q, not host/pid/random", scheduler.LeaseKey, e.Value())
	}
	pid, _ := strconv.Atoi(parts[1])
	for _, p := range s.Procs {
		if p.Target == "scheduler" && p.Pid() == pid {
			return p.Name, nil
		}
	}
	return "", fmt.Errorf("lease %s is held by pid %d, none of the stack's schedulers", scheduler.LeaseKey, pid)
}

// chaosSummary is status's line about the chaos of the running split up: how many
// faults were done and the last one; "" when there is no chaos file.
func chaosSummary(dataDir string) string {
	f, err := os.Open(chaosLogPath(dataDir))
	if err != nil {
		return ""
	}
	defer f.Close()
	var n, failed int
	var last splitlocal.ChaosEvent
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var ev splitlocal.ChaosEvent
		if json.Unmarshal(sc.Bytes(), &ev) != nil {
			continue
		}
		n++
		if ev.Err != "" {
			failed++
		}
		last = ev
	}
	if n == 0 {
		return "chaos: no fault yet"
	}
	s := fmt.Sprintf("chaos: %d faults, %d not recovered; last %s %s at %s", n, failed, last.Kind, last.Victim, last.At.Format(time.TimeOnly))
	if last.Err != "" {
		s += " (" + last.Err + ")"
	} else {
		s += fmt.Sprintf(" (back in %v)", last.Recovered.Round(time.Millisecond))
	}
	return s
}
