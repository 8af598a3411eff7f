package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/childproc/childproctest"
	"github.com/gauntlet-rl/gauntlet/pkg/natslocal/natstest"
	"github.com/gauntlet-rl/gauntlet/pkg/splitlocal"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
	"github.com/gauntlet-rl/gauntlet/workflows"
)

// BenchmarkSplitStackPerEpisode measures what the sizing model in docs/architecture.md is
// fitted to: on a fresh split stack, with ClickHouse as one server and as two replicas,
// one run of -split.episodes shop episodes, and per step the CPU of every kind of process
// (user plus system time from /proc, read before the run and 3 s after it is in
// ClickHouse), per episode the messages and bytes through the NATS servers (the nodes'
// /varz, route traffic included) and into the events stream, and ClickHouse's inserts and
// the other replica's part fetches over the run.
//
//	go test -run '^$' -bench SplitStackPerEpisode -benchtime 1x ./cmd/gauntlet
func BenchmarkSplitStackPerEpisode(b *testing.B) {
	for _, replicas := range []int{1, splitlocal.ClickHouseReplicas} {
		b.Run(fmt.Sprintf("clickhouse=%d", replicas), func(b *testing.B) {
			for range b.N {
				measureSplitRun(b, replicas)
			}
		})
	}
}

// splitBenchEpisodes is the run's size: large enough that the stack's idle costs are
// small beside it, short enough for a benchmark on a busy machine.
const splitBenchEpisodes = 3000

// varz is the part of a nats-server's /varz the benchmark reads.
type varz struct {
	InMsgs  int64 `json:"in_msgs"`
	InBytes int64 `json:"in_bytes"`
}

func measureSplitRun(b *testing.B, replicas int) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s, err := splitlocal.Start(ctx, splitlocal.Options{Dir: b.TempDir(), Gauntlet: buildBinary(b), NATSServer: natstest.Binary(b),
		ClickHouseReplicas: replicas, Args: []string{"--log.level=warn"},
		TemporalSearchAttributes: workflows.SearchAttributes, Logger: childproctest.Logger(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := s.Stop(context.WithoutCancel(ctx)); err != nil {
			b.Error(err)
		}
	}()
	bb, err := bus.Connect(s.NATS.URL(), "bench", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	defer bb.Close()
	conn, err := trajectory.Connect(ctx, s.CHAddr(), "gauntlet")
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	monitors, err := natsMonitors(s.NATS.Dir())
	if err != nil {
		b.Fatal(err)
	}

	readVarz := func() (v varz) {
		for _, addr := range monitors {
			resp, err := http.Get("http://" + addr + "/varz")
			if err != nil {
				b.Fatal(err)
			}
			var x varz
			err = json.NewDecoder(resp.Body).Decode(&x)
			resp.Body.Close()
			if err != nil {
				b.Fatalf("varz of %s: %v", addr, err)
			}
			v.InMsgs += x.InMsgs
			v.InBytes += x.InBytes
		}
		return v
	}
	events := func() (lastSeq, bytes, msgs uint64) {
		st, err := bb.JS.Stream(ctx, bus.StreamEvents)
		if err != nil {
			b.Fatal(err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			b.Fatal(err)
		}
		return info.State.LastSeq, info.State.Bytes, info.State.Msgs
	}
	chEvents := func() map[string]uint64 {
		m := map[string]uint64{}
		for _, r := range s.CH {
			for _, e := range []string{"InsertQuery", "ReplicatedPartFetches"} {
				var v uint64
				// Each replica's own counters: a connection to it alone.
				rc, err := trajectory.Connect(ctx, r.Addr(), "gauntlet")
				if err != nil {
					b.Fatal(err)
				}
				err = rc.QueryRow(ctx, "SELECT toUInt64(sum(value)) FROM system.events WHERE event = ?", e).Scan(&v)
				rc.Close()
				if err != nil {
					b.Fatal(err)
				}
				m[e] += v
			}
		}
		return m
	}

	time.Sleep(5 * time.Second) // the stack's start settles
	cpu0, v0, ch0 := splitCPU(s), readVarz(), chEvents()
	seq0, _, _ := events()
	req := newRunFor(b, splitBenchEpisodes, 5)
	b.ResetTimer()
	if err := bb.PublishCommand(ctx, bus.SubjectRun, req.RunId+"/run", req); err != nil {
		b.Fatal(err)
	}
	final, err := follow(ctx, bb, req, io.Discard)
	if err != nil {
		b.Fatal(err)
	}
	if err := waitPersisted(ctx, bb, conn, "gauntlet", req.RunId, req.Episodes, final.Steps, io.Discard); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	time.Sleep(3 * time.Second) // the last merges and fetches
	cpu1, v1, ch1 := splitCPU(s), readVarz(), chEvents()
	seq1, heldBytes, held := events()

	steps, eps := float64(final.Steps), float64(req.Episodes)
	var total float64
	for k, sec := range cpu1 {
		d := sec - cpu0[k]
		total += d
		b.ReportMetric(d*1e6/steps, k+"-µs/step")
	}
	b.ReportMetric(total*1e6/steps, "stack-µs/step")
	b.ReportMetric(steps/eps, "steps/episode")
	b.ReportMetric(float64(v1.InMsgs-v0.InMsgs)/eps, "nats-msgs/episode")
	b.ReportMetric(float64(v1.InBytes-v0.InBytes)/eps, "nats-B/episode")
	b.ReportMetric(float64(seq1-seq0)/eps, "events-msgs/episode")
	if held > 0 {
		// The bytes per event the stream holds (the run's events nearly all: its history
		// is far above a run of this size), times the run's events.
		b.ReportMetric(float64(heldBytes)/float64(held)*float64(seq1-seq0)/eps, "events-B/episode")
	}
	b.ReportMetric(float64(ch1["InsertQuery"]-ch0["InsertQuery"]), "ch-inserts")
	b.ReportMetric(float64(ch1["ReplicatedPartFetches"]-ch0["ReplicatedPartFetches"]), "ch-fetches")
}

// newRunFor is newRun for a benchmark: episodes of the shop, oracle and random policies,
// the default profiles.
func newRunFor(b *testing.B, episodes, seed uint64) *gauntletv1.RunRequested {
	o := runOpts{env: "shop", params: "{}", policies: "oracle=1,random=1", profiles: "baseline=60,stress=25,edge=15",
		episodes: episodes, seed: seed, maxInFlight: 500, label: b.Name()}
	req, err := o.request()
	if err != nil {
		b.Fatal(err)
	}
	return req
}

// natsMonitors reads each node's monitoring address from its config under dir.
func natsMonitors(dir string) ([]string, error) {
	re := regexp.MustCompile(`(?m)^http: "([^"]+)"`)
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(p) != ".conf" {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if m := re.FindSubmatch(data); m != nil {
			out = append(out, string(m[1]))
		}
		return nil
	})
	if err == nil && len(out) == 0 {
		err = fmt.Errorf("no nats-server config with a monitoring address under %s", dir)
	}
	return out, err
}

// splitCPU is the CPU seconds (user plus system) of every process of the stack, summed
// by kind: each gauntlet target, nats, clickhouse, zookeeper, temporal.
func splitCPU(s *splitlocal.Stack) map[string]float64 {
	m := map[string]float64{}
	add := func(kind string, pid int) {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return // not running at the moment: its time is lost, as with a kill
		}
		// Fields after the command's closing parenthesis: utime and stime are the 12th
		// and 13th, in clock ticks of 1/100 s.
		f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
		u, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		m[kind] += (u + st) / 100
	}
	for i := range s.NATS.Nodes() {
		add("nats", s.NATS.Pid(i))
	}
	for _, r := range s.CH {
		add("clickhouse", r.Pid())
	}
	if s.ZK != nil {
		add("zookeeper", s.ZK.Pid())
	}
	add("temporal", s.Temporal.Pid())
	for _, p := range s.Procs {
		add(p.Target, p.Pid())
	}
	return m
}
