package svcnet_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/ctrdlocal/ctrdtest"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/ctrd"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/process"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/svcnet"
)

// remoteHost is the allowed host of the egress tests: a name no resolver of this machine
// knows (.test is reserved), reached only through the runtime's host map.
const remoteHost = "releases.example.test"

// egressProfile: each path of the allowed host meets one kind of fault.
const egressProfile = `
name: egress-test
faults:
  - id: rate-limit
    kind: http_error
    match: {hosts: [releases.example.test], paths: ["/limited"]}
    params: {status: 429, retry_after_ms: 2000}
  - id: down
    kind: http_error
    match: {hosts: [releases.example.test], paths: ["/down"]}
    params: {status: 503}
  - id: cut
    kind: truncate
    match: {hosts: [releases.example.test], paths: ["/cut"]}
    params: {keep_fraction: 0.5}
  - id: rst
    kind: reset
    match: {hosts: [releases.example.test], paths: ["/reset"]}
    params: {after_bytes: 10}
  - id: slow
    kind: latency
    match: {hosts: [releases.example.test], paths: ["/slow"]}
    params: {mean_ms: 300, jitter_ms: 0}
`

// remote starts the "remote" server on the host's loopback: every path answers bodyLen
// bytes.
func remote(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Repeat("0123456789", bodyLen/10)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, body) })}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}

func TestProcessEgress(t *testing.T) {
	addr := remote(t)
	tlsAddr, cert := tlsRemote(t)
	rt, err := process.New(process.Config{StateDir: t.TempDir(), Hosts: egressHostMap(addr, tlsAddr, tcpRemote(t))})
	if err != nil {
		t.Fatalf("process runtime unavailable: %v", err)
	}
	t.Cleanup(func() { _ = rt.Purge(context.Background()); _ = rt.Close() })
	runEgress(t, rt, "", addr)
	t.Run("tls", func(t *testing.T) {
		runEgressTLS(t, rt, "", cert, map[string]tlsClient{"curl": curlClient, "python": pythonClient, "wget": wgetClient})
	})
	t.Run("tcp", func(t *testing.T) { runEgressTCP(t, rt, "") })
	t.Run("loss", func(t *testing.T) { runEgressLoss(t, rt, "") })
	t.Run("refused", func(t *testing.T) { runEgressRefused(t, rt, "", true) })
}

func TestContainerdEgress(t *testing.T) {
	if testing.Short() {
		t.Skip("runs containerd; -short runs unit tests only")
	}
	addr := remote(t)
	tlsAddr, cert := tlsRemote(t)
	srv := ctrdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rt, err := ctrd.New(ctx, ctrd.Options{Address: srv.Address(), StateDir: t.TempDir(), AgentBinary: runtimestest.AgentBinary(t), Hosts: egressHostMap(addr, tlsAddr, tcpRemote(t))})
	if err != nil {
		t.Fatalf("open containerd runtime: %v", err)
	}
	t.Cleanup(func() { _ = rt.Close() })
	runEgress(t, rt, "", addr)
	t.Run("tls", func(t *testing.T) { runEgressTLS(t, rt, "", cert, map[string]tlsClient{"wget": wgetClient}) })
	t.Run("tcp", func(t *testing.T) { runEgressTCP(t, rt, "") })
	t.Run("loss", func(t *testing.T) { runEgressLoss(t, rt, "") })
	t.Run("refused", func(t *testing.T) { runEgressRefused(t, rt, "", false) })
}

// runEgress is the proof on one runtime that a sandbox reaches its allowed host only
// through the gateway, meeting the faults there, and nothing else: every request and
// every refused lookup is recorded.
func runEgress(t *testing.T, rt sandbox.Runtime, image, addr string) {
	r := newEgressRig(t, rt, image, sandbox.Service{Hosts: []string{remoteHost}})
	r.attach(inject.NewDecider(1, rulesOf(t, egressProfile)))
	rec, sh := r.rec, r.sh
	want := func(step string, reqs ...svcnet.Request) {
		t.Helper()
		got := rec.TakeRequests()
		if !slices.EqualFunc(got, reqs, func(a, b svcnet.Request) bool {
			return a.Host == b.Host && a.Method == b.Method && a.Path == b.Path && a.Status == b.Status && a.Bytes == b.Bytes && a.Denied == b.Denied && slices.Equal(a.Faults, b.Faults)
		}) {
			t.Errorf("%s: recorded %+v, want %+v", step, got, reqs)
		}
	}
	get := func(path string) svcnet.Request {
		return svcnet.Request{Host: remoteHost, Method: http.MethodGet, Path: path, Status: http.StatusOK, Bytes: bodyLen}
	}

	// The allowed host answers by name, through the gateway.
	if res, _ := sh(`busybox wget -q -O- http://` + remoteHost + `/ok | wc -c`); strings.TrimSpace(res.Stdout) != strconv.Itoa(bodyLen) {
		t.Fatalf("allowed host: %+v", res)
	}
	want("clean", get("/ok"))

	// The fault spectrum applies there: 429, 503, a truncated body, a reset, latency.
	res, _ := sh(`busybox wget -q -O- http://` + remoteHost + `/limited; echo rc=$?
busybox wget -q -O- http://` + remoteHost + `/down; echo rc=$?
busybox wget -q -O body http://` + remoteHost + `/cut; echo rc=$?; wc -c < body
busybox wget -q -O- http://` + remoteHost + `/reset; echo rc=$?`)
	if strings.Count(res.Stdout, "rc=1") != 4 || !strings.Contains(res.Stdout, strconv.Itoa(bodyLen/2)) {
		t.Errorf("faults: want four failures and half the body cut, got %+v", res)
	}
	limited, down, cut, rst := get("/limited"), get("/down"), get("/cut"), get("/reset")
	limited.Status, limited.Faults = 429, []string{"http_error"}
	down.Status, down.Faults = 503, []string{"http_error"}
	limited.Bytes = int64(len(`{"error":"Too Many Requests","status":429}` + "\n"))
	down.Bytes = int64(len(`{"error":"Service Unavailable","status":503}` + "\n"))
	cut.Bytes, cut.Faults = bodyLen/2, []string{"truncate"}
	rst.Status, rst.Bytes, rst.Faults = 0, 0, []string{"reset"}
	want("faults", limited, down, cut, rst)
	if res, took := sh(`busybox wget -q -O /dev/null http://` + remoteHost + `/slow`); res.ExitCode != 0 || took < 300*time.Millisecond {
		t.Errorf("latency: %v, %+v", took, res)
	}
	slow := get("/slow")
	slow.Faults = []string{"latency"}
	want("latency", slow)
	kinds := map[string]int{}
	for _, f := range rec.Take() {
		kinds[f.FaultId]++
		if f.Target != remoteHost {
			t.Errorf("fault %s recorded on %q, want the host", f.FaultId, f.Target)
		}
	}
	if len(kinds) != 5 {
		t.Errorf("faults recorded: %v, want one of each of the five", kinds)
	}

	// A host not allowed is refused at once, with the reason, whether the client names
	// it in Host or asks the gateway as a forward proxy; CONNECT is refused too.
	res, _ = sh(`printf 'GET /x HTTP/1.0\r\nHost: other.example.test\r\n\r\n' | busybox nc 127.0.0.1 80
printf 'GET http://evil.example.test/y HTTP/1.0\r\n\r\n' | busybox nc 127.0.0.1 80
printf 'CONNECT ` + remoteHost + `:443 HTTP/1.0\r\n\r\n' | busybox nc 127.0.0.1 80`)
	if strings.Count(res.Stdout, " 403 Forbidden") != 3 || !strings.Contains(res.Stdout, `host "other.example.test" is not allowed in this sandbox (allowed hosts: `+remoteHost+")") {
		t.Errorf("denied hosts: want three 403s naming the allowed hosts, got %+v", res)
	}
	n := func(host string) int64 {
		return int64(len(`gauntlet: host "` + host + `" is not allowed in this sandbox (allowed hosts: ` + remoteHost + ")\n"))
	}
	want("denied",
		svcnet.Request{Host: "other.example.test", Method: "GET", Path: "/x", Status: 403, Bytes: n("other.example.test"), Denied: true},
		svcnet.Request{Host: "evil.example.test", Method: "GET", Path: "/y", Status: 403, Bytes: n("evil.example.test"), Denied: true},
		svcnet.Request{Host: remoteHost, Method: "CONNECT", Status: 403, Bytes: int64(len(`gauntlet: CONNECT to "` + remoteHost + `" refused: no proxy is needed, connect to the host itself (https://` + remoteHost + `/ reaches it through gauntlet's gateway)` + "\n")), Denied: true},
	)

	// A name not allowed does not resolve, fast, and the lookup is recorded as denied.
	res, took := sh(`busybox wget -q -O- http://evil.example.test/; echo rc=$?`)
	if !strings.Contains(res.Stdout, "rc=1") || took > 5*time.Second {
		t.Errorf("unlisted name: want a fast failure, got %+v in %v", res, took)
	}
	if got := rec.TakeRequests(); len(got) == 0 || !slices.ContainsFunc(got, func(r svcnet.Request) bool {
		return r.Host == "evil.example.test" && r.Method == svcnet.MethodDNS && r.Denied
	}) {
		t.Errorf("unlisted name: recorded %+v, want its lookup denied", got)
	}

	// No bypass: the remote server's own address is unreachable from the sandbox, and
	// the gateway refuses an address as a host.
	_, port, _ := net.SplitHostPort(addr)
	res, _ = sh(`busybox wget -T 3 -q -O- http://127.0.0.1:` + port + `/ok; echo rc=$?
busybox wget -T 3 -q -O- http://` + addr + `/ok; echo rc=$?
busybox wget -q -O- http://127.0.0.1/ok; echo rc=$?`)
	if strings.Count(res.Stdout, "rc=1") != 3 || strings.Contains(res.Stdout, "0123456789") {
		t.Errorf("bypass: want three failures and no body, got %+v", res)
	}
	if got := rec.TakeRequests(); len(got) != 1 || got[0].Host != "127.0.0.1" || !got[0].Denied {
		t.Errorf("bypass: recorded %+v, want the gateway's refusal of 127.0.0.1 alone", got)
	}
}
