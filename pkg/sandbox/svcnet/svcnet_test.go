package svcnet_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/ctrdlocal/ctrdtest"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/ctrd"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/process"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/svcnet"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// The episode's faults: each path of the api service meets one kind; /flaky fails half
// of the time, so seeds show in what it meets.
const profile = `
name: gateway-test
faults:
  - id: rate-limit
    kind: http_error
    match: {services: [api], paths: ["/limited"]}
    params: {status: 429, retry_after_ms: 3000}
  - id: down
    kind: http_error
    match: {services: [api], paths: ["/down"]}
    params: {status: 503}
  - id: cut
    kind: truncate
    match: {services: [api], paths: ["/cut"]}
    params: {keep_fraction: 0.25}
  - id: rst
    kind: reset
    match: {services: [api], paths: ["/reset"]}
    params: {after_bytes: 12}
  - id: slow
    kind: latency
    match: {services: [api], paths: ["/slow"]}
    params: {mean_ms: 400, jitter_ms: 0}
  - id: flaky
    kind: http_error
    probability: 0.5
    match: {services: [api], paths: ["/flaky"]}
    params: {status: 500}
  - id: tcp-rst
    kind: reset
    match: {services: [echo]}
    params: {after_bytes: 4}
`

const bodyLen = 2000

// upstreams starts the host services: an HTTP api (every path answers bodyLen bytes),
// a TCP echo, and a secret HTTP server no sandbox declares.
func upstreams(t *testing.T) (api, echo, secret string) {
	t.Helper()
	serve := func(h http.Handler) string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: h}
		go func() { _ = srv.Serve(l) }()
		t.Cleanup(func() { _ = srv.Close() })
		return l.Addr().String()
	}
	body := strings.Repeat("0123456789", bodyLen/10)
	api = serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, body) }))
	secret = serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "top-secret") }))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return api, l.Addr().String(), secret
}

func TestProcessServiceFaults(t *testing.T) {
	dir := t.TempDir()
	rt, err := process.New(process.Config{StateDir: dir})
	if err != nil {
		t.Fatalf("process runtime unavailable: %v", err)
	}
	t.Cleanup(func() { _ = rt.Purge(context.Background()); _ = rt.Close() })
	runServiceFaults(t, rt, "")
	t.Run("dns", func(t *testing.T) { runDNSFaults(t, rt, "") })
}

func TestContainerdServiceFaults(t *testing.T) {
	srv := ctrdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rt, err := ctrd.New(ctx, ctrd.Options{Address: srv.Address(), StateDir: t.TempDir(), AgentBinary: runtimestest.AgentBinary(t)})
	if err != nil {
		t.Fatalf("open containerd runtime: %v", err)
	}
	t.Cleanup(func() { _ = rt.Close() })
	runServiceFaults(t, rt, "")
	t.Run("dns", func(t *testing.T) { runDNSFaults(t, rt, "") })
}

// runServiceFaults is the proof on one runtime: commands run through shell.exec inside a
// sandbox meet each fault of the profile on their way to the declared services, the
// faults are recorded, the same seed meets the same faults, and nothing undeclared
// becomes reachable.
func runServiceFaults(t *testing.T, rt sandbox.Runtime, image string) {
	ctx := context.Background()
	api, echo, secret := upstreams(t)
	spec := sandbox.Spec{Image: image, Services: []sandbox.Service{
		{Name: "api", Port: 8080, Upstream: api},
		{Name: "echo", Port: 7000, Upstream: echo, Protocol: sandbox.ProtocolTCP},
	}}
	h, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { _ = rt.Destroy(context.Background(), h.ID) })
	_, rules, err := plans.ParseSpec([]byte(profile))
	if err != nil {
		t.Fatal(err)
	}
	attach := func(seed uint64) (*svcnet.Gateway, *svcnet.Recorder) {
		t.Helper()
		rec := &svcnet.Recorder{}
		g, err := svcnet.Attach(ctx, rt, h.ID, h.Spec.Services, svcnet.Options{Decider: inject.NewDecider(seed, rules), OnFire: rec.OnFire})
		if err != nil {
			t.Fatalf("attach: %v", err)
		}
		t.Cleanup(func() { _ = g.Close() })
		return g, rec
	}
	tb := tools.New(rt, h.ID, tools.Options{})
	sh := func(cmd string) (tools.ExecResult, time.Duration) {
		t.Helper()
		args, _ := json.Marshal(tools.ExecArgs{Command: cmd, TimeoutMS: 20000})
		start := time.Now()
		out, err := tb.Call(ctx, "shell.exec", args)
		took := time.Since(start)
		if err != nil {
			t.Fatalf("shell.exec %q: %v", cmd, err)
		}
		var res tools.ExecResult
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatal(err)
		}
		return res, took
	}
	if _, err := rt.(sandbox.ServiceListener).ListenService(ctx, h.ID, 9999); !errors.Is(err, sandbox.ErrNotDeclared) {
		t.Errorf("listen on an undeclared port: %v, want ErrNotDeclared", err)
	}
	g, rec := attach(42)

	// A clean call: the service answers by name, announced in the environment.
	if res, _ := sh(`busybox wget -q -O- "$API_URL/ok" | wc -c`); strings.TrimSpace(res.Stdout) != strconv.Itoa(bodyLen) {
		t.Fatalf("clean call: %+v", res)
	}
	// 429 with its Retry-After (3000 ms: 3 s), read raw (wget hides the headers of an
	// error) and then as wget meets it.
	if res, _ := sh(`printf 'GET /limited HTTP/1.0\r\nHost: api\r\n\r\n' | busybox nc api 8080; busybox wget -O- http://api:8080/limited`); !strings.Contains(res.Stdout, " 429 Too Many Requests\r\n") || !strings.Contains(res.Stdout, "Retry-After: 3\r\n") || !strings.Contains(res.Stderr, "429 Too Many Requests") {
		t.Errorf("429: want status and Retry-After: 3, got %+v", res)
	}
	// 503.
	if res, _ := sh(`busybox wget -S -O- http://127.0.0.1:8080/down 2>&1`); !strings.Contains(res.Stdout, "503") {
		t.Errorf("503: got %+v", res)
	}
	// Truncated body: a quarter arrives, the client notices.
	if res, _ := sh(`busybox wget -O body http://api:8080/cut; echo rc=$?; wc -c < body`); !strings.Contains(res.Stdout, "rc=1") || !strings.HasSuffix(strings.TrimSpace(res.Stdout), strconv.Itoa(bodyLen/4)) {
		t.Errorf("truncate: want rc=1 and %d bytes, got %+v", bodyLen/4, res)
	}
	// Connection reset: on an HTTP call (after 12 bytes of the answer) and on a TCP
	// stream (after 4 bytes).
	if res, _ := sh(`busybox wget -O- http://api:8080/reset; echo rc=$?`); !strings.Contains(res.Stdout, "rc=1") || !strings.Contains(strings.ToLower(res.Stderr), "reset") {
		t.Errorf("http reset: got %+v", res)
	}
	if res, _ := sh(`echo hello-world | busybox nc echo 7000; echo rc=$?`); strings.Contains(res.Stdout, "hello-world") {
		t.Errorf("tcp reset: the echo came back whole: %+v", res)
	}
	// Latency: 400 ms added to the call, a lower bound on the command's wall time.
	_, fast := sh(`busybox wget -q -O /dev/null http://api:8080/ok`)
	res, slow := sh(`busybox wget -q -O /dev/null http://api:8080/slow`)
	if res.ExitCode != 0 || slow < 400*time.Millisecond {
		t.Errorf("latency: %v (a clean call took %v), %+v", slow, fast, res)
	}
	t.Logf("clean call %v, with 400 ms latency %v", fast, slow)

	// Every fault fired is recorded, once per call, with what it did.
	want := map[string]string{"rate-limit": "status=429", "down": "status=503", "cut": "keep_fraction=0.25", "rst": "after_bytes=12", "slow": "latency_ms=400.0", "tcp-rst": "after_bytes=4"}
	got := map[string]int{}
	for _, ev := range rec.Take() {
		got[ev.FaultId]++
		if w, ok := want[ev.FaultId]; !ok || !strings.Contains(ev.Detail, w) {
			t.Errorf("recorded %v, want detail %q", ev, w)
		}
	}
	for id := range want {
		if n := map[string]int{"rate-limit": 2}[id]; got[id] != max(n, 1) {
			t.Errorf("fault %s recorded %d times, want %d (all: %v)", id, got[id], max(n, 1), got)
		}
	}

	// Nothing undeclared is reachable: not the host's other services, not the gateway as
	// a forward proxy, not the outside.
	_, secretPort, _ := net.SplitHostPort(secret)
	res, _ = sh(`busybox wget -T 3 -q -O- http://127.0.0.1:` + secretPort + `/ ; echo rc=$?
printf 'GET http://` + secret + `/ HTTP/1.0\r\n\r\n' | busybox nc api 8080
busybox wget -T 3 -q -O- http://10.0.0.1/ ; echo rc=$?`)
	if strings.Contains(res.Stdout, "top-secret") || strings.Count(res.Stdout, "rc=1") != 2 || !strings.Contains(res.Stdout, "403") {
		t.Errorf("egress: want two failures and a 403, got %+v", res)
	}

	// Same seed, same faults; another seed, others. /flaky fails with probability 0.5.
	flaky := func() (string, []*gauntletv1.FaultFired) {
		res, _ := sh(`for i in 0 1 2 3 4 5 6 7 8 9 10 11; do busybox wget -q -O /dev/null http://api:8080/flaky 2>/dev/null && printf ok, || printf fail,; done`)
		return res.Stdout, rec.Take()
	}
	_ = g.Close()
	run := func(seed uint64) (string, []*gauntletv1.FaultFired) {
		g2, r2 := attach(seed)
		defer g2.Close()
		rec = r2
		return flaky()
	}
	a, aEv := run(7)
	b, bEv := run(7)
	c, _ := run(8)
	if a != b || len(aEv) != len(bEv) {
		t.Errorf("same seed, different faults: %s (%d recorded) vs %s (%d)", a, len(aEv), b, len(bEv))
	}
	if a == c {
		t.Errorf("seeds 7 and 8 met the same faults: %s", a)
	}
	if n := strings.Count(a, "fail"); n != len(aEv) || n == 0 || n == 12 {
		t.Errorf("seed 7: %s, %d faults recorded", a, len(aEv))
	}
	t.Logf("seed 7: %s; seed 8: %s", a, c)
}

// TestProcessServicesSurviveRestart: a process sandbox's services namespace outlives the
// runtime that made it (a worker restart): a new runtime recovers the sandbox and its
// services answer again; Destroy unpins the namespace.
func TestProcessServicesSurviveRestart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	api, _, _ := upstreams(t)
	rt, err := process.New(process.Config{StateDir: dir})
	if err != nil {
		t.Fatalf("process runtime unavailable: %v", err)
	}
	t.Cleanup(func() {
		if rt, err := process.New(process.Config{StateDir: dir}); err == nil {
			_ = rt.Purge(context.Background())
		}
	})
	h, err := rt.Create(ctx, sandbox.Spec{Services: []sandbox.Service{{Name: "api", Port: 8080, Upstream: api}}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	_ = rt.Close()

	rt2, err := process.New(process.Config{StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer rt2.Close()
	if err := rt2.Recover(ctx, h); err != nil {
		t.Fatalf("recover: %v", err)
	}
	g, err := svcnet.Attach(ctx, rt2, h.ID, h.Spec.Services, svcnet.Options{})
	if err != nil {
		t.Fatalf("attach after recover: %v", err)
	}
	defer g.Close()
	res, err := rt2.Exec(ctx, h.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", `busybox wget -q -O- "$API_URL/x" | wc -c`}})
	if err != nil || strings.TrimSpace(string(res.Stdout)) != strconv.Itoa(bodyLen) {
		t.Fatalf("service after recover: %v, %+v", err, res)
	}
	ns := dir + "/netns/" + h.ID
	if _, err := os.Stat(ns); err != nil {
		t.Fatalf("pinned namespace missing: %v", err)
	}
	if err := rt2.Destroy(ctx, h.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ns); !os.IsNotExist(err) {
		t.Fatalf("namespace still pinned after Destroy: %v", err)
	}
}

// runDNSFaults is the proof of the sandbox's name server on one runtime: commands
// inside the sandbox resolve the docs service's name through it and meet NXDOMAIN,
// SERVFAIL or a timeout when the rules say so and an answer when not; the faults are
// recorded once per lookup; the same seed meets the same faults.
func runDNSFaults(t *testing.T, rt sandbox.Runtime, image string) {
	ctx := context.Background()
	api, _, _ := upstreams(t)
	h, err := rt.Create(ctx, sandbox.Spec{Image: image, Services: []sandbox.Service{{Name: "docs", Port: 8080, Upstream: api}}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { _ = rt.Destroy(context.Background(), h.ID) })
	tb := tools.New(rt, h.ID, tools.Options{})
	sh := func(cmd string) (string, time.Duration) {
		t.Helper()
		args, _ := json.Marshal(tools.ExecArgs{Command: cmd, TimeoutMS: 20000})
		start := time.Now()
		out, err := tb.Call(ctx, "shell.exec", args)
		if err != nil {
			t.Fatalf("shell.exec %q: %v", cmd, err)
		}
		var res tools.ExecResult
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatal(err)
		}
		return res.Stdout + res.Stderr, time.Since(start)
	}
	// attach opens the gateway under the rules of spec (closing the one before: the name
	// server's address is taken while it is open).
	var g *svcnet.Gateway
	t.Cleanup(func() {
		if g != nil {
			_ = g.Close()
		}
	})
	attach := func(seed uint64, spec string) *svcnet.Recorder {
		t.Helper()
		if g != nil {
			_ = g.Close()
		}
		var d *inject.Decider
		if spec != "" {
			_, rules, err := plans.ParseSpec([]byte("name: dns-test\nfaults:\n" + spec))
			if err != nil {
				t.Fatal(err)
			}
			d = inject.NewDecider(seed, rules)
		}
		rec := &svcnet.Recorder{}
		var err error
		if g, err = svcnet.Attach(ctx, rt, h.ID, h.Spec.Services, svcnet.Options{Decider: d, OnFire: rec.OnFire}); err != nil {
			t.Fatalf("attach: %v", err)
		}
		return rec
	}
	const lookup = `busybox nslookup -timeout=1 -retry=1 docs; busybox wget -q -O /dev/null "$DOCS_URL/x" && echo fetched; echo done`

	// No fault: the name answers 127.0.0.1, the service is reached by it, an unknown
	// name is NXDOMAIN (no recursion), nothing is recorded.
	rec := attach(1, "")
	out, _ := sh(lookup + `; busybox nslookup elsewhere.example`)
	if !strings.Contains(out, "Address: 127.0.0.1") || !strings.Contains(out, "fetched") || !strings.Contains(out, "can't find elsewhere.example: NXDOMAIN") {
		t.Fatalf("clean lookups: %s", out)
	}
	if ev := rec.Take(); len(ev) != 0 {
		t.Fatalf("clean lookups recorded faults: %v", ev)
	}

	for _, tc := range []struct {
		kind, want string
		slow       bool
	}{
		{catalogue.KindDNSNXDomain, "can't find docs: NXDOMAIN", false},
		{catalogue.KindDNSServFail, "can't find docs: SERVFAIL", false},
		{catalogue.KindDNSTimeout, "timed out", true},
	} {
		rec := attach(1, "  - {id: dns, kind: "+tc.kind+", match: {services: [docs]}}\n")
		out, took := sh(lookup + `; busybox nslookup localhost`)
		t.Logf("%s: the lookups took %v", tc.kind, took)
		if !strings.Contains(out, tc.want) || strings.Contains(out, "fetched") || !strings.Contains(out, "bad address 'docs:8080'") {
			t.Errorf("%s: want %q and wget failing on the name, got %s", tc.kind, tc.want, out)
		}
		if !strings.Contains(out, "Address: ::1") {
			t.Errorf("%s: localhost (no service) should still resolve: %s", tc.kind, out)
		}
		if tc.slow && took < time.Second {
			t.Errorf("%s: the lookups took %v, want the client's timeout (at least 1 s)", tc.kind, took)
		}
		// One fault per lookup (nslookup's, wget's), on the service.
		ev := rec.Take()
		if len(ev) != 2 {
			t.Errorf("%s: recorded %v, want 2 faults", tc.kind, ev)
		}
		for _, e := range ev {
			if e.Kind != tc.kind || e.Target != "docs" || e.FaultId != "dns" || !strings.Contains(e.Detail, "dns/docs") {
				t.Errorf("%s: recorded %v", tc.kind, e)
			}
		}
	}

	// Same seed, same faults; another seed, others: SERVFAIL half of the time.
	flaky := func(seed uint64) (string, int) {
		rec := attach(seed, "  - {id: flaky, kind: dns_servfail, probability: 0.5, match: {hosts: [docs]}}\n")
		out, _ := sh(`for i in 0 1 2 3 4 5 6 7 8 9 10 11; do busybox wget -q -O /dev/null "$DOCS_URL/x" 2>/dev/null && printf ok, || printf fail,; done`)
		return out, len(rec.Take())
	}
	a, na := flaky(7)
	b, nb := flaky(7)
	c, _ := flaky(8)
	if a != b || na != nb {
		t.Errorf("same seed, different faults: %s (%d recorded) vs %s (%d)", a, na, b, nb)
	}
	if a == c {
		t.Errorf("seeds 7 and 8 met the same faults: %s", a)
	}
	if n := strings.Count(a, "fail"); n != na || n == 0 || n == 12 {
		t.Errorf("seed 7: %s, %d faults recorded", a, na)
	}
	t.Logf("seed 7: %s; seed 8: %s", a, c)
}
