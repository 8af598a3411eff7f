package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/childproc/childproctest"
	"github.com/gauntlet-rl/gauntlet/pkg/natslocal/natstest"
	"github.com/gauntlet-rl/gauntlet/pkg/splitlocal"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
	"github.com/gauntlet-rl/gauntlet/workflows"
)

// startSplit starts the split stack as `gauntlet split up` does (pkg/splitlocal: a 3-node
// NATS cluster at 3 replicas, two ClickHouse replicas on a ZooKeeper, Temporal, one gauntlet process per instance of
// the Layout), supervised until the test ends.
func startSplit(t *testing.T, args ...string) *splitlocal.Stack {
	t.Helper()
	return startSplitWith(t, splitlocal.Options{}, args...)
}

// startSplitWith is startSplit with opts' Layout and ClickHouseReplicas.
func startSplitWith(t *testing.T, opts splitlocal.Options, args ...string) *splitlocal.Stack {
	t.Helper()
	bin := buildBinary(t)
	natsBin := natstest.Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	opts.Dir, opts.Gauntlet, opts.NATSServer = t.TempDir(), bin, natsBin
	opts.Args = append([]string{"--log.level=warn"}, args...)
	opts.TemporalSearchAttributes, opts.Logger = workflows.SearchAttributes, childproctest.Logger(t)
	s, err := splitlocal.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRun := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		_ = s.Run(rctx)
	}()
	t.Cleanup(func() {
		stopRun()
		<-ran
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := s.Stop(sctx); err != nil {
			t.Errorf("stop the split stack: %v", err)
		}
	})
	return s
}

// The split stack, the whole way: a run on separate processes over a 3-node JetStream
// cluster and a two-replica ClickHouse, while one NATS node, one worker, one store, the
// scheduler leader and the ClickHouse replica the stores write to are killed with SIGKILL
// in a seeded order by the stack's chaos (each brought back by the stack's supervision, as
// a Deployment would) ends with
// every episode and step exactly once and no infra error, read with FINAL through the
// Distributed tables and on each replica's own tables, and the standby scheduler takes
// over within seconds.
func TestSplitStackSurvivesKills(t *testing.T) {
	s := startSplit(t, "--worker.concurrency=32", "--worker.ack-wait=10s",
		"--store.batch-rows=2000", "--store.flush-every=200ms")
	b, err := bus.Connect(s.NATS.URL(), "test", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if len(s.CH) != splitlocal.ClickHouseReplicas {
		t.Fatalf("the split stack runs %d ClickHouse servers, want %d replicas", len(s.CH), splitlocal.ClickHouseReplicas)
	}
	conn := connect(t, s.CHAddr(), "gauntlet") // fails over, as the stack's processes do

	for _, name := range []string{bus.StreamCommands, bus.StreamEvents, "KV_" + bus.BucketRuns, "KV_" + bus.BucketLeases} {
		st, err := b.JS.Stream(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if r := st.CachedInfo().Config.Replicas; r != splitlocal.StreamReplicas {
			t.Fatalf("stream %s has %d replicas, want %d", name, r, splitlocal.StreamReplicas)
		}
	}

	const episodes = 800
	req := newRun(t, episodes, "oracle=1,random=1", 23)
	req.MaxInFlight = 24 // slow enough that every kill lands mid-run
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	if err := b.PublishCommand(ctx, bus.SubjectRun, req.RunId+"/run", req); err != nil {
		t.Fatal(err)
	}
	kv, err := b.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	ctx, unguard := guardStall(ctx, t, b, req.RunId)
	defer unguard()
	ended := func(n uint64) func() bool {
		return func() bool {
			p := progressFromKV(ctx, kv, req.RunId)
			return p != nil && p.Ended >= n
		}
	}

	// One chaos round (splitlocal.PlanChaos: a NATS node, a worker, a store, the
	// scheduler leader and a ClickHouse replica, in an order drawn from the seed), each
	// kill done by Stack.Chaos as `gauntlet split up --chaos.seed` does, but struck at a
	// fixed share of the run instead of after a wait, so that every kill lands mid-run on
	// a machine of any speed. Instance 0 of the ClickHouse replicas is the first in every
	// process's --clickhouse: the one the stores write to. Seed 23 kills a store, a NATS
	// node, then the leader: the order in which a new leader once waited 30 s for the
	// ended events its predecessor had fetched (TestEndsFetchedByAKilledLeaderReachItsSuccessor).
	plan := splitlocal.PlanChaos(23, 1, 0, 0)
	leader := func(ctx context.Context) (string, error) { return schedulerLeader(ctx, b, s) }
	var after uint64 // episodes ended when the previous fault's part was back
	for i, f := range plan {
		// At its share of the run, and once the run has gone on after the previous
		// fault.
		waitFor(ctx, t, ended(max(uint64(i+1)*episodes/8, after+episodes/16)))
		if f.Kind == splitlocal.KillClickHouse {
			f.Instance = 0
		}
		before := progressFromKV(ctx, kv, req.RunId).GetAssigned()
		var ev splitlocal.ChaosEvent
		if err := s.Chaos(ctx, []splitlocal.Fault{f}, leader, func(e splitlocal.ChaosEvent) { ev = e }); err != nil {
			t.Fatal(err)
		}
		after = progressFromKV(ctx, kv, req.RunId).GetEnded()
		t.Logf("%s %s killed at %d ended, back in %v", f.Kind, ev.Victim, after, ev.Recovered)
		if f.Kind != splitlocal.KillSchedulerLeader {
			continue
		}
		// The standby or the killed one restarted wins the expired lease: either is a
		// new leader, told apart by its pid.
		waitFor(ctx, t, func() bool {
			l, err := schedulerLeader(ctx, b, s)
			return err == nil && s.Proc(l).Pid() != ev.Pid
		})
		waitFor(ctx, t, func() bool { return progressFromKV(ctx, kv, req.RunId).GetAssigned() > before })
		took := time.Since(ev.At)
		l, _ := schedulerLeader(ctx, b, s)
		t.Logf("%s leads, assigning again %v after the leader's kill", l, took)
		if took > 4*bus.LeaseTTL {
			t.Errorf("assignments resumed %v after the leader was killed; want within seconds (lease TTL %v)", took, bus.LeaseTTL)
		}
	}

	var final *gauntletv1.RunProgress
	waitFor(ctx, t, func() bool {
		final = progressFromKV(ctx, kv, req.RunId)
		return final != nil && final.Done
	})
	if err := waitPersisted(ctx, b, conn, "gauntlet", req.RunId, req.Episodes, final.Steps, io.Discard); err != nil {
		failStalled(t, ctx, err, missingEpisodes(conn, "gauntlet", req.RunId, req.Episodes))
	}
	assertExact(t, b, conn, "gauntlet", req, final)
	if n := queryOne(t, conn, fmt.Sprintf(`SELECT count() FROM gauntlet.episodes FINAL WHERE run_id = '%s' AND infra_error = 1`, req.RunId)); n != "0" {
		t.Errorf("%s episodes recorded as infra errors; the kills must cost none", n)
	}
	if final.InfraErrors != 0 {
		t.Errorf("the scheduler counted %d infra errors", final.InfraErrors)
	}
	// Each replica holds every row itself, the killed one included once it has caught up.
	for _, r := range s.CH {
		rc := connect(t, r.Addr(), "gauntlet")
		for _, q := range []string{"SYSTEM SYNC REPLICA gauntlet.episodes_local", "SYSTEM SYNC REPLICA gauntlet.steps_local"} {
			if err := rc.Exec(ctx, q); err != nil {
				t.Fatalf("replica %s: %s: %v", r.Replica(), q, err)
			}
		}
		for table, want := range map[string]uint64{"episodes_local": req.Episodes, "steps_local": final.Steps} {
			q := fmt.Sprintf(`SELECT count() FROM gauntlet.%s FINAL WHERE run_id = '%s'`, table, req.RunId)
			if got := queryOne(t, rc, q); got != fmt.Sprint(want) {
				t.Errorf("replica %s: %s holds %s rows of the run, want %d", r.Replica(), table, got, want)
			}
		}
	}
}
