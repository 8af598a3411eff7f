package mcpenv

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// BenchmarkCallOverhead measures what the harness adds to one tools/call: the notes
// server runs in a sandbox of each runtime (a sub-benchmark each), and the same session is called directly with the
// SDK's client and through the episode's Step (schema check, fault injector with a
// latency rule that fires on every call, the observation, the CEL verifier, metering),
// alternately, call for call. It reports each one's median wall time per call and the
// difference; episodes are restarted every 20 calls, off the clock, so the verifier sees
// the call lists a real episode has, and the median restart (a sandbox, the server's
// files copied in, the server started, initialize, tools/list) is reported too.
func BenchmarkCallOverhead(b *testing.B) {
	dir := b.TempDir()
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "bin", "mcp-notes-server"), ".")
	cmd.Dir = "../../../examples/mcp-notes-server"
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // static, for containerd's root
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build: %v: %s", err, out)
	}
	decl, err := os.ReadFile("../../../examples/mcp-notes-server/notes.yaml")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "notes.yaml"), decl, 0o644); err != nil {
		b.Fatal(err)
	}
	d, err := Load(filepath.Join(dir, "notes.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{runtimes.Process, runtimes.Containerd} {
		b.Run(name, func(b *testing.B) { benchCallOverhead(b, d, runtimestest.Open(b, name, 0)) })
	}
}

func benchCallOverhead(b *testing.B, d *Decl, sb env.Sandboxes) {
	x := New(d)
	var ep *episode
	start := func() {
		if ep != nil {
			_ = ep.Close()
		}
		in, err := inject.NewInjector(&gauntletv1.FaultPlan{Profile: "bench", Seed: 1, Rules: []*gauntletv1.FaultRule{
			{Id: "lat", Target: "*", Probability: 1, Spec: &gauntletv1.FaultRule_Latency{Latency: &gauntletv1.LatencyFault{MeanMs: 40}}}}})
		if err != nil {
			b.Fatal(err)
		}
		e, err := x.NewEpisode(env.Config{Seed: 1, Sandboxes: sb, Faults: in, MaxSteps: 1000})
		if err != nil {
			b.Fatal(err)
		}
		ep = e.(*episode)
		if _, err := ep.Reset(); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() { _ = ep.Close() })
	args := json.RawMessage(`{"name":"n2"}`)
	action := env.Action{Tool: "notes.get", Args: args}
	var direct, harness, resets []time.Duration
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		if i%20 == 0 {
			b.StopTimer()
			t := time.Now()
			start()
			resets = append(resets, time.Since(t))
			b.StartTimer()
		}
		t0 := time.Now()
		if _, err := ep.srv.sess.CallTool(ctx, &mcp.CallToolParams{Name: "notes.get", Arguments: args}); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := ep.Step(action); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		direct, harness = append(direct, t1.Sub(t0)), append(harness, t2.Sub(t1))
	}
	b.StopTimer()
	md, mh := median(direct), median(harness)
	b.ReportMetric(float64(md.Microseconds()), "direct-µs/call")
	b.ReportMetric(float64(mh.Microseconds()), "harness-µs/call")
	b.ReportMetric(float64((mh - md).Microseconds()), "overhead-µs/call")
	b.ReportMetric(float64(median(resets).Milliseconds()), "reset-ms")
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
