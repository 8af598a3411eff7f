package fromlog_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/fromlog"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func load(t *testing.T, names ...string) []fromlog.Input {
	t.Helper()
	var out []fromlog.Input
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join("testdata", "logs", n))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fromlog.Input{Name: n, Data: b})
	}
	return out
}

// TestGolden runs from-log on each sample log and on all of them together, compares the
// profile with its golden file, and checks the profile parses as a valid spec.
func TestGolden(t *testing.T) {
	all := []string{"nginx-access.log", "nginx-error.log", "app.jsonl", "go-panic.log", "java-trace.log", "python-trace.log", "free-text.log"}
	cases := map[string][]string{"all": all}
	for _, n := range all {
		cases[strings.TrimSuffix(n, filepath.Ext(n))] = []string{n}
	}
	for name, files := range cases {
		t.Run(name, func(t *testing.T) {
			res, err := fromlog.Analyze(load(t, files...))
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if err := res.WriteProfile(&out, "from-"+name); err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", "golden", name+".yaml")
			if *update {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create)", err)
			}
			if !bytes.Equal(out.Bytes(), want) {
				t.Errorf("profile differs from %s:\n%s", golden, out.String())
			}
			if _, _, err := plans.ParseSpec(out.Bytes()); err != nil {
				t.Errorf("the profile is not a valid spec: %v", err)
			}
		})
	}
}

// TestExpectedKindsAndRates pins the facts the sample logs were written to contain.
func TestExpectedKindsAndRates(t *testing.T) {
	res, err := fromlog.Analyze(load(t, "nginx-access.log"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 600 {
		t.Fatalf("requests = %d, want 600", res.Requests)
	}
	got := map[string]fromlog.Finding{}
	for _, f := range res.Findings {
		got[f.ID()] = f
	}
	for id, count := range map[string]int{"http-429": 36, "http-503": 23} {
		if got[id].Count != count {
			t.Errorf("%s: %d seen, want %d", id, got[id].Count, count)
		}
	}
	if f := got["http-503"]; f.BurstLen < 2 {
		t.Errorf("503s come in bursts of 3-5 in the sample, burst length %v", f.BurstLen)
	}
	if f := got["http-429"]; len(f.Services) != 1 || f.Services[0] != "payment" || f.Rate != 0.06 {
		t.Errorf("429: services %v rate %v, want [payment] 0.06", f.Services, f.Rate)
	}
	if f := got["latency"]; f.Params["mean_ms"] < 150 || f.Params["mean_ms"] > 210 {
		t.Errorf("latency mean %v ms, the sample's requests take about 180", f.Params["mean_ms"])
	}

	text, err := fromlog.Analyze(load(t, "free-text.log"))
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]fromlog.Finding{}
	for _, f := range text.Findings {
		kinds[f.ID()] = f
	}
	if f := kinds["timeout"]; f.Count != 3 || f.Params["hold_ms"] != 30000 || f.Services[0] != "payment" {
		t.Errorf("timeout finding %+v: want 3 on payment, hold 30 s (median)", f)
	}
	if f := kinds["http-503"]; f.Params["retry_after_ms"] != 10000 {
		t.Errorf("503 retry-after %v, want 10000", f.Params["retry_after_ms"])
	}
	if len(text.Unmapped) != 0 {
		t.Errorf("unmapped %v", text.Unmapped)
	}
}
