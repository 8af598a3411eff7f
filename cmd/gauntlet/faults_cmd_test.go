package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := runMain(context.Background(), args, &out, &errOut)
	return out.String() + errOut.String(), err
}

func TestFaultsLsListsEveryLayer(t *testing.T) {
	out, err := runCLI(t, "faults", "ls")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"packet_loss", "burst_len=[1,1e+06]packets", "disk_full", "header_garbled", "clock_skew", "http_error", "retry_after_ms=[0,3.6e+06]ms"} {
		if !strings.Contains(out, want) {
			t.Errorf("faults ls does not show %q", want)
		}
	}
}

func TestFaultsPlanIsDeterministic(t *testing.T) {
	a, err := runCLI(t, "faults", "plan", "--env", "shop", "--seed", "9", "--profile", "stress", "--calls", "40")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := runCLI(t, "faults", "plan", "--env", "shop", "--seed", "9", "--profile", "stress", "--calls", "40")
	c, _ := runCLI(t, "faults", "plan", "--env", "shop", "--seed", "10", "--profile", "stress", "--calls", "40")
	if a != b || a == c || !strings.Contains(a, "payment.http_503") {
		t.Fatalf("plans: same seed equal %v, different seeds differ %v:\n%s", a == b, a != c, a)
	}
	out, err := runCLI(t, "faults", "plan", "--profile", filepath.Join("..", "..", "pkg", "faults", "plans", "testdata", "profiles", "flaky-payments.yaml"), "--calls", "30")
	if err != nil || !strings.Contains(out, "pay-429") || !strings.Contains(out, "retry_after_ms=2000") {
		t.Fatalf("plan of a YAML profile: %v\n%s", err, out)
	}
}

func TestFaultsValidateAndFromLog(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("name: x\nfaults:\n  - {id: a, kind: packet_loss, params: {rate: 1.5}}\n  - {id: b, kind: teleport}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runCLI(t, "faults", "validate", filepath.Join("..", "..", "pkg", "faults", "plans", "testdata", "profiles", "full-disk.yaml"), bad)
	if err == nil || !strings.Contains(out, "ok  ") || !strings.Contains(out, "faults[0].params.rate: 1.5 is above the maximum 1") ||
		!strings.Contains(out, `faults[1].kind: unknown fault "teleport"`) {
		t.Fatalf("validate: %v\n%s", err, out)
	}

	logs := filepath.Join("..", "..", "pkg", "faults", "fromlog", "testdata", "logs")
	profile := filepath.Join(dir, "p.yaml")
	var args []string
	for _, n := range []string{"nginx-access.log", "nginx-error.log", "app.jsonl", "go-panic.log", "java-trace.log", "python-trace.log", "free-text.log"} {
		args = append(args, filepath.Join(logs, n))
	}
	if out, err := runCLI(t, append([]string{"faults", "from-log", "--name", "from-all", "-o", profile}, args...)...); err != nil {
		t.Fatalf("from-log: %v\n%s", err, out)
	}
	got, _ := os.ReadFile(profile)
	want, _ := os.ReadFile(filepath.Join("..", "..", "pkg", "faults", "fromlog", "testdata", "golden", "all.yaml"))
	if !bytes.Equal(got, want) {
		t.Fatalf("from-log output differs from the golden profile:\n%s", got)
	}
	if out, err := runCLI(t, "faults", "validate", profile); err != nil {
		t.Fatalf("the derived profile does not validate: %v\n%s", err, out)
	}
}

func TestFaultsBadCommandLines(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"faults"}, "gauntlet faults ls"},
		{[]string{"faults", "explode"}, `unknown subcommand "explode"`},
		{[]string{"faults", "plan", "--profile", "chaos"}, `unknown profile "chaos"`},
		{[]string{"faults", "plan", "--drift", "*.latency.mean_ms=linear(0:-1,5:3)"}, "-1 is below the minimum 0 ms"},
		{[]string{"faults", "validate"}, "give one or more YAML profile files"},
		{[]string{"faults", "from-log"}, "give one or more log files"},
		{[]string{"faults", "drift", "set"}, "gauntlet faults drift: show | history | set"},
		{[]string{"run", "--drift", "*.chaos.mean_ms=step(0:1)"}, `--drift: drift[0].selector: "*.chaos.mean_ms": unknown fault "chaos"`},
	} {
		out, err := runCLI(t, tc.args...)
		if err == nil {
			t.Errorf("%v accepted", tc.args)
			continue
		}
		if msg := err.Error() + "\n" + out; !strings.Contains(msg, tc.want) {
			t.Errorf("%v: %q does not say %q", tc.args, msg, tc.want)
		}
	}
}

// `faults validate --env` and `faults plan --env` refuse a profile the env cannot run, with
// every reason at once, as a run does (pkg/runs TestUnfitProfileRefusedAllAtOnce).
func TestFaultsValidateAndPlanRefuseWhatRunRefuses(t *testing.T) {
	learned := filepath.Join("..", "..", "pkg", "faults", "plans", "testdata", "profiles", "learned-shop.yaml")
	problems := []string{
		"faults[0].kind: timeout cannot apply in a sim env",
		"faults[1].kind: reset cannot apply in a sim env",
		"fault disk-full: disk_full applies only in envs whose agents act in a real sandbox",
		`fault http-429: unknown service "psp"`,
		"faults[4].match: a sim env's calls have no host, path, method or op",
	}
	if out, err := runCLI(t, "faults", "validate", learned); err != nil {
		t.Fatalf("without --env the profile is a valid spec: %v\n%s", err, out)
	}
	out, err := runCLI(t, "faults", "validate", "--env", "shop", learned)
	for _, p := range problems {
		if err == nil || !strings.Contains(out, p) {
			t.Errorf("validate --env shop: want %q (err %v):\n%s", p, err, out)
		}
	}
	out, err = runCLI(t, "faults", "plan", "--env", "shop", "--profile", learned)
	for _, p := range problems {
		if err == nil || !strings.Contains(out+fmt.Sprint(err), p) {
			t.Errorf("plan --env shop: want %q (err %v):\n%s", p, err, out)
		}
	}
	// A profile that fits is planned as the env's run would plan it: one rule per service.
	fits := filepath.Join(t.TempDir(), "fits.yaml")
	if err := os.WriteFile(fits, []byte("name: fits\nfaults:\n  - {id: pay-429, kind: http_error, probability: 0.2, match: {services: [payment]}, params: {status: 429, retry_after_ms: 1500}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := runCLI(t, "faults", "validate", "--env", "shop", fits); err != nil || !strings.Contains(out, "ok  ") {
		t.Fatalf("validate --env shop of a fitting profile: %v\n%s", err, out)
	}
	out, err = runCLI(t, "faults", "plan", "--env", "shop", "--profile", fits)
	if err != nil || !strings.Contains(out, "payment.pay-429") || !strings.Contains(out, "retry_after_ms=1500") {
		t.Fatalf("plan --env shop of a fitting profile: %v\n%s", err, out)
	}
	// Drift reaches the profile's own fault, by its id.
	out, err = runCLI(t, "faults", "plan", "--env", "shop", "--profile", fits, "--drift", "payment.pay-429.retry_after_ms=step(0:4000)")
	if err != nil || !strings.Contains(out, "status=429 retry_after_ms=4000") || !strings.Contains(out, "drift payment.pay-429.retry_after_ms = 4000 (run)") {
		t.Fatalf("plan --env shop --drift of a user-defined fault: %v\n%s", err, out)
	}
}

// `faults ls` lists the names drift selectors use: the built-in plans' faults with their
// kinds and parameters.
func TestFaultsLsListsDriftNames(t *testing.T) {
	out, err := runCLI(t, "faults", "ls")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"http_503", "http_429", "http_401", "latency", "truncate", "probability status retry_after_ms", "probability mean_ms jitter_ms"} {
		if !strings.Contains(out[strings.Index(out, "Drift selectors"):], want) {
			t.Errorf("faults ls does not list drift name %q after \"Drift selectors\":\n%s", want, out)
		}
	}
}

// `gauntlet run --drift` may name a fault of a profile given by --profile-files, by id.
func TestRunRequestDriftsUserDefinedFault(t *testing.T) {
	fits := filepath.Join(t.TempDir(), "fits.yaml")
	if err := os.WriteFile(fits, []byte("name: fits\nfaults:\n  - {id: pay-429, kind: http_error, probability: 0.2, match: {services: [payment]}, params: {status: 429}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o := runOpts{env: "shop", params: "{}", policies: "oracle=1", profiles: "fits=1", episodes: 10, seed: 1, maxInFlight: 1,
		profileFiles: fits, drift: "payment.pay-429.probability=linear(0:0.1,9:0.9)"}
	req, err := o.request()
	if err != nil {
		t.Fatal(err)
	}
	if len(req.Drift) != 1 || req.Drift[0].Selector != "payment.pay-429.probability" {
		t.Fatalf("drift %v", req.Drift)
	}
	o.drift = "payment.pay-430.probability=step(0:0.5)"
	if _, err := o.request(); err == nil || !strings.Contains(err.Error(), `unknown fault "pay-430"`) || !strings.Contains(err.Error(), "fits: pay-429") {
		t.Fatalf("a fault no profile has: %v", err)
	}
}
