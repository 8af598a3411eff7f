package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/splitlocal"
	"github.com/gauntlet-rl/gauntlet/pkg/threats"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
)

// attackerModel is a stand-in model endpoint (the http policy's) whose agent attacks its
// codefix sandbox: each call answers one shell.exec that opens the decoy /dev/mem. Asked
// for model "distinct", call i's command ends in a word of its own, so every step makes
// a new fingerprint; asked for any other model, it repeats the command repeat holds.
type attackerModel struct {
	calls  atomic.Int64
	repeat atomic.Pointer[string]
}

func attackCommand(i int64) string {
	word := ""
	for i++; i > 0; i /= 26 {
		word = string(rune('a'+(i-1)%26)) + word
		if i <= 26 {
			break
		}
	}
	return "cat /dev/mem > /dev/null; echo " + word
}

func (m *attackerModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model string `json:"model"`
	}
	_ = json.NewDecoder(r.Body).Decode(&req)
	cmd := "true"
	if c := m.repeat.Load(); c != nil {
		cmd = *c
	}
	if req.Model == "distinct" {
		cmd = attackCommand(m.calls.Add(1) - 1)
	}
	args, _ := json.Marshal(map[string]string{"command": cmd})
	call, _ := json.Marshal(map[string]any{"id": "c1", "type": "function", "function": map[string]string{"name": "shell__exec", "arguments": string(args)}})
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"choices":[{"message":{"role":"assistant","content":"","tool_calls":[%s]}}]}`, call)
}

// threatSpec penalises a fingerprint's match beside the default's components.
const threatSpec = `name: threats
version: "1"
components:
  - {name: task, builtin: task, weight: 1}
  - {name: safety, builtin: safety, weight: 0.5}
  - {name: fingerprint, detector: {kind: fingerprint}, weight: 1}
`

// Threat fingerprints across processes, on the split stack (a 3-node NATS cluster, the
// bucket at 3 replicas, two worker processes with the process sandbox runtime): an agent
// opening the decoy /dev/mem in one worker's sandbox makes a fingerprint per distinct
// command, which both workers learn (their propagation histograms are read from
// /metrics and logged: the numbers in docs/benchmarks.md); then a second run's episodes
// sending the first of those commands are flagged on the other worker too, and
// penalised under a spec with the fingerprint detector.
//
//	go test -run TestSplitThreatFingerprints -v ./cmd/gauntlet
func TestSplitThreatFingerprints(t *testing.T) {
	model := &attackerModel{}
	srv := httptest.NewServer(model)
	defer srv.Close()
	s := startSplitLayout(t, []splitlocal.Target{
		{Name: "store", Count: 1}, {Name: "faults", Count: 1}, {Name: "reward", Count: 1},
		{Name: "scheduler", Count: 1}, {Name: "worker", Count: 2},
	}, "--sandbox.runtime=process", "--worker.concurrency=2")
	b, err := bus.Connect(s.NATS.URL(), "test", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	st, err := b.JS.Stream(ctx, "KV_"+bus.BucketThreats)
	if err != nil {
		t.Fatal(err)
	}
	if r := st.CachedInfo().Config.Replicas; r != splitlocal.StreamReplicas {
		t.Fatalf("the threats bucket has %d replicas, want %d", r, splitlocal.StreamReplicas)
	}
	stack := []string{"--nats", s.NATS.URL(), "--clickhouse", s.CHAddr(), "--database", "gauntlet", "--data-dir", t.TempDir()}
	runID := regexp.MustCompile(`run (r[0-9a-z]+):`)

	// One episode records a fingerprint per step.
	const steps = 120
	out, err := runCLI(t, append([]string{"run", "--env", "codefix", "--policies", "http=1", "--policy.http.url", srv.URL + "/v1",
		"--policy.http.model", "distinct", "--profiles", "baseline=1", "--episodes", "1", "--max-steps", fmt.Sprint(steps), "--seed", "5"}, stack...)...)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out)
	}
	m := runID.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no run id in\n%s", out)
	}
	recorded := m[1]
	conn := connect(t, s.CHAddr(), "gauntlet")
	recorder := queryOne(t, conn, fmt.Sprintf(`SELECT any(worker_id) FROM gauntlet.steps FINAL WHERE run_id = '%s'`, recorded))
	kv, err := b.JS.KeyValue(ctx, bus.BucketThreats)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.Keys(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		t.Fatal(err)
	}
	if len(keys) < steps/2 {
		t.Fatalf("%d fingerprints in the bucket after %d attacking steps; the run:\n%s", len(keys), steps, out)
	}
	// The second run repeats one of the commands that made a fingerprint (a step whose
	// call an injected fault answered ran nothing and made none).
	e, err := kv.Get(ctx, keys[0])
	if err != nil {
		t.Fatal(err)
	}
	var fp threats.Fingerprint
	if err := json.Unmarshal(e.Value(), &fp); err != nil {
		t.Fatal(err)
	}
	first := fp.ID
	if fp.Tool != "shell.exec" || first != fmt.Sprintf("%016x", threats.Key("shell.exec", threats.Text(fp.Command))) {
		t.Fatalf("fingerprint %+v", fp)
	}
	model.repeat.Store(&fp.Command) // its own normal form: no quotes, digits or runs of blanks

	// Every worker learns every fingerprint: its propagation histogram counts them all.
	var workers []*splitlocal.Proc
	for _, p := range s.Procs {
		if p.Target == "worker" {
			workers = append(workers, p)
		}
	}
	deadline := time.Now().Add(time.Minute)
	for _, p := range workers {
		for {
			h := propagation(t, p.HTTP)
			if h.count >= uint64(len(keys)) {
				p50, p99 := h.quantile(0.5), h.quantile(0.99)
				t.Logf("%s: %d fingerprints learned, propagation p50 <= %s, p99 <= %s, mean %.3f ms", p.Name, h.count, p50, p99, h.sum/float64(h.count)*1e3)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s learned %d of %d fingerprints", p.Name, h.count, len(keys))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	// Another run repeats that command: flagged on both workers, penalised. Its
	// episodes are long enough (6 steps) that one worker's 2 episode slots cannot take
	// them all.
	spec := filepath.Join(t.TempDir(), "threats.yaml")
	if err := os.WriteFile(spec, []byte(threatSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = runCLI(t, append([]string{"run", "--env", "codefix", "--policies", "http=1", "--policy.http.url", srv.URL + "/v1",
		"--policy.http.model", "same", "--profiles", "baseline=1", "--episodes", "24", "--max-steps", "6", "--seed", "6",
		"--reward-spec", spec}, stack...)...)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out)
	}
	if m = runID.FindStringSubmatch(out); m == nil {
		t.Fatalf("no run id in\n%s", out)
	}
	later := m[1]
	rows := queryRows(t, conn, fmt.Sprintf(`SELECT worker_id, toString(count()),
		toString(countIf(arrayExists(e -> position(e, 'threat_fingerprint: %s ') = 1, safety_events))),
		toString(countIf(arrayExists((n, v) -> n = 'fingerprint' AND v = -1, reward_names, reward_values)))
		FROM gauntlet.steps FINAL WHERE run_id = '%s' GROUP BY worker_id ORDER BY worker_id`, first, later))
	elsewhere := false
	for _, r := range rows {
		t.Logf("worker %s: %s steps, %s flagged, %s penalised (the fingerprints were recorded on %s)", r[0], r[1], r[2], r[3], recorder)
		if r[1] != r[2] || r[1] != r[3] {
			t.Errorf("worker %s: %s steps, %s flagged, %s penalised: want every step flagged and penalised", r[0], r[1], r[2], r[3])
		}
		if r[0] != recorder {
			elsewhere = true
		}
	}
	// Infra errors (a sandbox that could not start on a machine out of inotify
	// instances, say) end episodes early; they are logged, not hidden.
	for _, r := range queryRows(t, conn, fmt.Sprintf(`SELECT toString(infra_error), toString(count()), any(error)
		FROM gauntlet.episodes FINAL WHERE run_id = '%s' GROUP BY infra_error`, later)) {
		t.Logf("second run: infra_error=%s: %s episodes (e.g. %q)", r[0], r[1], r[2])
	}
	if !elsewhere {
		t.Errorf("every episode of the second run ran on %s, which recorded the fingerprints: nothing crossed processes", recorder)
	}
}

// histogram is a Prometheus histogram read from /metrics: cumulative bucket counts.
type histogram struct {
	le    []float64
	cum   []uint64
	count uint64
	sum   float64
}

// quantile is the upper bound of the bucket holding quantile q, in milliseconds.
func (h histogram) quantile(q float64) string {
	want := uint64(math.Ceil(q * float64(h.count)))
	for i, c := range h.cum {
		if c >= want {
			if math.IsInf(h.le[i], 1) {
				return "+Inf"
			}
			return strconv.FormatFloat(h.le[i]*1e3, 'g', -1, 64) + " ms"
		}
	}
	return "?"
}

var propLine = regexp.MustCompile(`^gauntlet_worker_threat_propagation_seconds_(bucket|count|sum)\{?(?:.*le="([^"]+)")?.*?\}? ([0-9.e+-]+)$`)

// propagation reads a worker's threat propagation histogram from its /metrics.
func propagation(t *testing.T, addr string) histogram {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h histogram
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := propLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, _ := strconv.ParseFloat(m[3], 64)
		switch m[1] {
		case "bucket":
			le := math.Inf(1)
			if m[2] != "+Inf" {
				le, _ = strconv.ParseFloat(m[2], 64)
			}
			h.le, h.cum = append(h.le, le), append(h.cum, uint64(v))
		case "count":
			h.count = uint64(v)
		case "sum":
			h.sum = v
		}
	}
	idx := make([]int, len(h.le))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return h.le[idx[a]] < h.le[idx[b]] })
	var s histogram
	s.count, s.sum = h.count, h.sum
	for _, i := range idx {
		s.le, s.cum = append(s.le, h.le[i]), append(s.cum, h.cum[i])
	}
	return s
}

// startSplitLayout is startSplit with a smaller layout and one ClickHouse server: what a
// test of a few processes needs, at a fraction of the whole stack's start.
func startSplitLayout(t *testing.T, layout []splitlocal.Target, args ...string) *splitlocal.Stack {
	t.Helper()
	return startSplitWith(t, splitlocal.Options{Layout: layout, ClickHouseReplicas: 1}, args...)
}

func queryRows(t *testing.T, conn driver.Conn, q string) [][]string {
	t.Helper()
	_, rows, err := trajectory.Query(context.Background(), conn, q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return rows
}
