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
	// The logs that reproduced misreadings (TestMultiLineEntriesByShape and the others
	// below) have golden profiles of their own.
	for _, n := range append(all, "mixed-trace.log", "scoped-access.log", "rate-limit.jsonl", "honesty.log") {
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
	// The rule is scoped to payment: its rate is over payment's 102 requests (it was over
	// all 600, 0.06, before rates followed the rule's scope).
	if f := got["http-429"]; len(f.Services) != 1 || f.Services[0] != "payment" || f.Rate != 0.3529 || f.Over != 102 {
		t.Errorf("429: services %v rate %v over %d, want [payment] 0.3529 (36 of 102)", f.Services, f.Rate, f.Over)
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

func findings(t *testing.T, names ...string) (*fromlog.Result, map[string]fromlog.Finding) {
	t.Helper()
	res, err := fromlog.Analyze(load(t, names...))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]fromlog.Finding{}
	for _, f := range res.Findings {
		got[f.ID()] = f
	}
	return res, got
}

// TestMultiLineEntriesByShape: a Python traceback without timestamps after a Java trace is
// an entry of its own, not a continuation of the Java one (which it used to turn into
// disk_full, with "unmapped: none" in the header while the Java entry's own error was lost).
func TestMultiLineEntriesByShape(t *testing.T) {
	res, got := findings(t, "mixed-trace.log")
	if res.Entries != 4 {
		t.Errorf("entries = %d, want 4 (two Java traces, two Python tracebacks)", res.Entries)
	}
	for id, src := range map[string]string{"timeout": "mixed-trace.log:1", "disk-full": "mixed-trace.log:5", "too-many-open-files": "mixed-trace.log:13"} {
		if f := got[id]; f.Count != 1 || len(f.Examples) != 1 || f.Examples[0] != src {
			t.Errorf("%s: %d seen at %v, want 1 at %s", id, f.Count, f.Examples, src)
		}
	}
	if len(res.Unmapped) != 1 || res.Unmapped[0].Source != "mixed-trace.log:9" {
		t.Errorf("unmapped = %+v, want the IllegalStateException entry at mixed-trace.log:9", res.Unmapped)
	}
	var out bytes.Buffer
	if err := res.WriteProfile(&out, "mixed"); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "unmapped: none") || !strings.Contains(out.String(), "mixed-trace.log:9:") {
		t.Errorf("the header does not report the unmapped Java entry:\n%s", out.String())
	}
}

// TestRetryAfterKept: every way the logs state a 429's Retry-After reaches the profile.
func TestRetryAfterKept(t *testing.T) {
	_, got := findings(t, "scoped-access.log")
	if f := got["http-429"]; f.Params["retry_after_ms"] != 3000 {
		t.Errorf("access log: 429 retry_after_ms = %v, want 3000 (retry_after=\"3\")", f.Params["retry_after_ms"])
	}
	if f := got["http-503"]; f.Params["retry_after_ms"] != 0 {
		t.Errorf("access log: 503 retry_after_ms = %v, the log states none", f.Params["retry_after_ms"])
	}
	res, got := findings(t, "rate-limit.jsonl")
	if f := got["http-429"]; f.Count != 3 || f.Params["retry_after_ms"] != 4000 {
		t.Errorf("JSON: 429 %d seen, retry_after_ms %v; want 3, 4000 (retry_after, headers.Retry-After, retry_after_ms)", f.Count, f.Params["retry_after_ms"])
	}
	var out bytes.Buffer
	if err := res.WriteProfile(&out, "rl"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "retry_after_ms: 4000") {
		t.Errorf("profile drops retry_after_ms:\n%s", out.String())
	}
}

// TestRatesOverTheRulesScope: a rule scoped to a service gets the rate of that service's
// requests (9 of 9 inventory requests failed), not of every request in the log.
func TestRatesOverTheRulesScope(t *testing.T) {
	res, got := findings(t, "scoped-access.log")
	if res.Requests != 200 {
		t.Fatalf("requests = %d, want 200", res.Requests)
	}
	if f := got["http-503"]; len(f.Services) != 1 || f.Services[0] != "inventory" || f.Rate != 1 {
		t.Errorf("503: services %v rate %v, want [inventory] 1 (9 of its 9 requests)", f.Services, f.Rate)
	}
	if f := got["http-429"]; len(f.Services) != 1 || f.Services[0] != "payment" || f.Rate != 0.2 {
		t.Errorf("429: services %v rate %v, want [payment] 0.2 (8 of its 40 requests)", f.Services, f.Rate)
	}
	// The upstream a JSON log names is not where its requests were served: with none of
	// payment's own requests logged, the rate stays per request of the log.
	_, got = findings(t, "rate-limit.jsonl")
	if f := got["http-429"]; f.Rate != 0.6 {
		t.Errorf("JSON 429 rate %v, want 0.6 (3 of the 5 requests logged; payment's own are not)", f.Rate)
	}
}

// TestReportsWhatItDidNotKeep: a parameter the log states but the profile cannot hold (a
// 2-hour hold, above the kind's maximum) and a second kind an entry also showed are
// reported in the profile's comments, not dropped in silence.
func TestReportsWhatItDidNotKeep(t *testing.T) {
	res, got := findings(t, "honesty.log")
	if f := got["disk-full"]; f.Count != 1 || f.AlsoMatched["timeout"] != 1 {
		t.Errorf("disk_full %d seen, also matched %v; want 1, timeout once", f.Count, f.AlsoMatched)
	}
	var out bytes.Buffer
	if err := res.WriteProfile(&out, "honesty"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"#   not kept: hold_ms 7200000: ",
		"#   also matched: timeout (1 entry)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the profile does not report %q:\n%s", want, out.String())
		}
	}
}
