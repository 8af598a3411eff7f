package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/workflows"
)

var (
	benchEpisodes = flag.Uint64("curriculum.episodes", 100_000, "episodes of BenchmarkCurriculumOverhead's curriculum (and of its plain run)")
	benchBatch    = flag.Uint64("curriculum.batch", 5000, "batch size of BenchmarkCurriculumOverhead's stages")
)

// BenchmarkCurriculumOverhead measures what driving episodes through a Temporal curriculum
// costs next to one plain run of the same episodes, on the full in-process stack:
//
//   - temporal_share_%: the curriculum's wall time outside its batches' runs (workflow
//     tasks, activity scheduling, the gap between one batch's end and the next one's
//     acceptance) over its wall time — Temporal's share;
//   - batching_overhead_%: curriculum wall time over the plain run's, minus 1 — adds what
//     cutting the episodes into batches costs (each batch's pipeline fills and drains).
//
// Three stages of 30 %, 30 % and 40 % of the episodes (min = max, threshold 0, so every
// episode runs), oracle policy, the demo's profile mix. The two runs alternate in order
// across iterations.
//
//	go test -run '^$' -bench CurriculumOverhead -benchtime 1x ./cmd/gauntlet -curriculum.episodes 100000
func BenchmarkCurriculumOverhead(b *testing.B) {
	n, batch := *benchEpisodes, *benchBatch
	s1, s2 := n*3/10/batch*batch, n*3/10/batch*batch
	s3 := n - s1 - s2
	if s1 == 0 || s3%batch != 0 {
		b.Fatalf("-curriculum.episodes %d and -curriculum.batch %d: want episodes a multiple of 10 batches", n, batch)
	}
	cfg := testConfig(b)
	cfg.Worker.Concurrency = 256
	cfg.Store.BatchRows = 50_000
	cfg.Store.FlushEvery = time.Second
	s := startStack(b, cfg, modAll)
	tc := dialTemporal(b, s.app.temporalAddr())
	bb := s.app.getBus()
	stage := func(name string, eps uint64) string {
		return fmt.Sprintf(`  - {name: %s, env: shop, policies: oracle=1, profiles: "baseline=60,stress=25,edge=15", episodes: {min: %d, max: %d}, batch: %d, promotion: {metric: success_rate, threshold: 0, window: %d}}
`, name, eps, eps, batch, batch)
	}
	specYAML := "name: bench\nseed: 3\nmax_in_flight: 10000\nstages:\n" + stage("a", s1) + stage("b", s2) + stage("c", s3)
	spec, err := workflows.LoadSpec(strings.NewReader(specYAML))
	if err != nil {
		b.Fatal(err)
	}
	raw, _ := json.Marshal(spec)
	ctx := context.Background()

	var tRun, tCur, inRuns time.Duration
	for i := 0; i < b.N; i++ {
		plain := func() {
			o := runOpts{env: "shop", params: "{}", policies: "oracle=1", profiles: "baseline=60,stress=25,edge=15",
				episodes: n, seed: uint64(100 + i), maxInFlight: 10000}
			req, err := o.request()
			if err != nil {
				b.Fatal(err)
			}
			t0 := time.Now()
			if err := bb.PublishCommand(ctx, bus.SubjectRun, req.RunId+"/run", req); err != nil {
				b.Fatal(err)
			}
			kv, err := bb.JS.KeyValue(ctx, bus.BucketRuns)
			if err != nil {
				b.Fatal(err)
			}
			for {
				if p := progressFromKV(ctx, kv, req.RunId); p != nil && p.Done {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			tRun += time.Since(t0)
		}
		curriculum := func() {
			t0 := time.Now()
			run, err := tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), i), TaskQueue: workflows.TaskQueue},
				workflows.WorkflowCurriculum, json.RawMessage(raw))
			if err != nil {
				b.Fatal(err)
			}
			var p workflows.Progress
			if err := run.Get(ctx, &p); err != nil {
				b.Fatal(err)
			}
			d := time.Since(t0)
			tCur += d
			var in time.Duration
			for _, r := range p.Reports {
				in += time.Duration(r.RunWallNs)
			}
			inRuns += in
			if p.TotalEpisodes != n || p.Status != workflows.StatusCompleted {
				b.Fatalf("curriculum ran %d episodes, status %s", p.TotalEpisodes, p.Status)
			}
			b.Logf("iteration %d: curriculum %v (in runs %v, %d batches)", i, d, in, len(p.Reports))
		}
		if i%2 == 0 {
			plain()
			curriculum()
		} else {
			curriculum()
			plain()
		}
	}
	b.ReportMetric(tRun.Seconds()/float64(b.N), "plain_run_s")
	b.ReportMetric(tCur.Seconds()/float64(b.N), "curriculum_s")
	b.ReportMetric(100*(tCur-inRuns).Seconds()/tCur.Seconds(), "temporal_share_%")
	b.ReportMetric(100*(tCur.Seconds()/tRun.Seconds()-1), "batching_overhead_%")
	b.ReportMetric(float64(n)/(tCur.Seconds()/float64(b.N)), "curriculum_episodes/s")
}
