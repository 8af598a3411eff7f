package svcnet_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/boundary"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/svcnet"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// The hosts of the plain TCP tests, each on a port of its own (a plain stream names no
// host: the port tells them apart), all served by one server speaking tcpRemote's
// protocol; each meets one kind of the plan's connection faults (db none).
var tcpHosts = []sandbox.HostPort{
	{Host: "db.example.test", Port: 5432},
	{Host: "rst-db.example.test", Port: 5433},
	{Host: "cut-db.example.test", Port: 5434},
	{Host: "thin-db.example.test", Port: 5435},
	{Host: "hole-db.example.test", Port: 5436},
	{Host: "flaky-db.example.test", Port: 5437},
}

// tcpProfile is a user's profile of connection faults, as a run names it: it reaches
// the gateway through the plan's boundary_spec, not as raw rules. Its last rule resets
// the TLS connections of rst.example.test, which only latency could meet from a plan
// before.
const tcpProfile = `name: egress-conn
faults:
  - {id: db-rst, kind: reset, match: {hosts: [rst-db.example.test]}, params: {after_bytes: 0}}
  - {id: db-cut, kind: reset, match: {hosts: [cut-db.example.test]}, params: {after_bytes: 100}}
  - {id: db-thin, kind: bandwidth, match: {hosts: [thin-db.example.test]}, params: {bytes_per_sec: 20000}}
  - {id: db-hole, kind: timeout, match: {hosts: [hole-db.example.test]}, params: {hold_ms: 1000}}
  - {id: db-flaky, kind: reset, probability: 0.5, match: {hosts: [flaky-db.example.test]}, params: {after_bytes: 0}}
  - {id: tls-rst, kind: reset, match: {hosts: [rst.example.test]}, params: {after_bytes: 0}}
`

// tcpBanner is what tcpRemote says first, as a database server does.
const tcpBanner = "READY\n"

// tcpRemote starts the "remote" plain TCP server on the host's loopback: it says
// tcpBanner, reads one line "SEND <n>", sends n bytes and closes.
func tcpRemote(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(time.Minute))
				if _, err := io.WriteString(c, tcpBanner); err != nil {
					return
				}
				line, err := bufio.NewReader(c).ReadString('\n')
				n, perr := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(line), "SEND "))
				if err != nil || perr != nil {
					return
				}
				_, _ = io.WriteString(c, strings.Repeat("0123456789", n/10))
			}()
		}
	}()
	return l.Addr().String()
}

// egressHostMap is tlsHostMap with every port of tcpHosts mapped as plain TCP to the
// server at tcpAddr.
func egressHostMap(httpAddr, tlsAddr, tcpAddr string) sandbox.HostMap {
	m := tlsHostMap(httpAddr, tlsAddr)
	for _, hp := range tcpHosts {
		m[hp.Host+":"+strconv.Itoa(hp.Port)+sandbox.TCPSuffix] = tcpAddr
	}
	m[lossyHost.Host+":"+strconv.Itoa(lossyHost.Port)+sandbox.TCPSuffix] = tcpAddr
	return m
}

// planDecider is the gateway's decider of an episode of a sandboxed env (services
// sandbox and egress) playing a user's profile under seed: the plan's, through the
// boundary layer, as a task episode's.
func planDecider(t *testing.T, profile string, seed uint64) *inject.Decider {
	t.Helper()
	name := strings.TrimPrefix(strings.SplitN(profile, "\n", 2)[0], "name: ")
	c, err := plans.CompileCustomProfiles([]*gauntletv1.CustomProfile{{Name: name, SpecYaml: profile}})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := c.Plan(seed, name, []string{plans.SandboxService, "egress"})
	if err != nil {
		t.Fatal(err)
	}
	in, err := inject.NewInjector(plan)
	if err != nil {
		t.Fatal(err)
	}
	return boundary.ServicesDecider(in)
}

// runEgressTCP is the proof on one runtime that a sandbox reaches a port its runtime
// declares plain TCP for an allowed host, by the host's name, through the gateway's
// relay, a protocol whose server speaks first and whose client closes its side and reads
// on; that the connection is recorded (host, port, bytes each way, faults); that a
// user's profile's connection faults (reset, a cut after N bytes, bandwidth, timeout)
// reach plain TCP and TLS streams through the plan, are recorded as the step's faults,
// and replay the same under the same seed; and that a port not declared is refused.
func runEgressTCP(t *testing.T, rt sandbox.Runtime, image string) {
	hosts := []string{rstHost}
	for _, hp := range tcpHosts {
		hosts = append(hosts, hp.Host)
	}
	r := newEgressRig(t, rt, image, sandbox.Service{Hosts: hosts, TLSPorts: []int{443}, TCPPorts: tcpHosts})
	r.attach(planDecider(t, tcpProfile, 1))
	fetch := func(hp sandbox.HostPort, n int) string {
		return fmt.Sprintf(`printf 'SEND %d\n' | busybox nc %s %d > out; echo rc=$?; wc -c < out; rm -f out`, n, hp.Host, hp.Port)
	}
	const n = 20000
	want := tcpBanner + strings.Repeat("0123456789", n/10)
	up := int64(len("SEND 20000\n"))

	// Clean: the banner and the body, by name, recorded with both directions' bytes.
	db := tcpHosts[0]
	if res, _ := r.sh(fetch(db, n)); res.Stdout != "rc=0\n"+strconv.Itoa(len(want))+"\n" {
		t.Fatalf("clean: got %+v, want the banner and the body", res)
	}
	got := r.rec.TakeRequests()
	clean := svcnet.Request{Host: db.Host, Port: db.Port, Method: svcnet.MethodTCP, Bytes: int64(len(want)), BytesUp: up}
	if len(got) != 1 || !sameConn(got[0], clean) || got[0].Bytes != clean.Bytes || got[0].BytesUp != up {
		t.Fatalf("clean: recorded %+v, want %+v", got, clean)
	}
	if f := r.rec.Take(); len(f) != 0 {
		t.Errorf("clean: faults %v", f)
	}

	// A port not declared reaches nothing: nothing listens there; the refusal is
	// recorded, denied.
	if res, _ := r.sh(`printf 'SEND 10\n' | busybox nc ` + db.Host + ` 5999; echo rc=$?`); !strings.Contains(res.Stdout+res.Stderr, "rc=1") {
		t.Errorf("undeclared port: got %+v, want a refusal", res)
	}
	if got := r.requests(1); len(got) != 1 || got[0].Port != 5999 || got[0].Method != svcnet.MethodTCP || !got[0].Denied || got[0].Bytes+got[0].BytesUp != 0 {
		t.Errorf("undeclared port: recorded %+v, want its refusal alone, nothing relayed", got)
	}

	// The plan's connection faults, and replay: every host once, flaky six times, then
	// the same on a new gateway under the same seed.
	play := func() ([]svcnet.Request, map[string]time.Duration, map[string]string) {
		took, outs := map[string]time.Duration{}, map[string]string{}
		for _, hp := range append(slices.Clone(tcpHosts[1:]), tcpHosts[5], tcpHosts[5], tcpHosts[5], tcpHosts[5], tcpHosts[5]) {
			res, d := r.sh(fetch(hp, n))
			took[hp.Host], outs[hp.Host] = max(took[hp.Host], d), res.Stdout
		}
		res, _ := r.sh(wgetClient("https://" + rstHost + "/ok"))
		outs[rstHost] = res.Stdout
		return r.rec.TakeRequests(), took, outs
	}
	first, took, outs := play()
	if len(first) != 11 {
		t.Fatalf("faults: recorded %+v, want eleven connections", first)
	}
	byHost := map[string][]svcnet.Request{}
	for _, c := range first {
		byHost[c.Host] = append(byHost[c.Host], c)
	}
	one := func(host, kind string) svcnet.Request {
		t.Helper()
		cs := byHost[host]
		if len(cs) != 1 || !slices.Equal(cs[0].Faults, []string{kind}) || cs[0].Denied {
			t.Errorf("%s: recorded %+v, want one connection meeting %s", host, cs, kind)
			return svcnet.Request{}
		}
		return cs[0]
	}
	if c := one("rst-db.example.test", "reset"); c.Bytes != 0 || c.Method != svcnet.MethodTCP || c.Port != 5433 {
		t.Errorf("reset: %+v, want nothing delivered", c)
	}
	// after_bytes counts both ways: the request's 11 bytes, then 89 of the answer.
	if c := one("cut-db.example.test", "reset"); c.Bytes != 100-up || c.BytesUp != up {
		t.Errorf("cut: %+v, want %d bytes delivered", c, 100-up)
	}
	if c := one("thin-db.example.test", "bandwidth"); c.Bytes != int64(len(want)) || took["thin-db.example.test"] < 900*time.Millisecond {
		t.Errorf("bandwidth: %+v in %v, want the whole answer in about a second", c, took["thin-db.example.test"])
	}
	if c := one("hole-db.example.test", "timeout"); c.Bytes != 0 || took["hole-db.example.test"] < time.Second {
		t.Errorf("timeout: %+v in %v, want nothing delivered, held a second", c, took["hole-db.example.test"])
	}
	if c := one(rstHost, "reset"); c.Method != svcnet.MethodTLS || c.Bytes != 0 || strings.Contains(outs[rstHost], "rc=0") {
		t.Errorf("TLS reset from the plan: %+v, %q", c, outs[rstHost])
	}
	var flaky []string
	for _, c := range byHost["flaky-db.example.test"] {
		flaky = append(flaky, strings.Join(c.Faults, "+"))
	}
	if len(flaky) != 6 || !slices.Contains(flaky, "reset") || !slices.Contains(flaky, "") {
		t.Errorf("flaky: %v, want six connections, some reset and some not under seed 1", flaky)
	}
	// The step's faults: each kind, on its host, on its connection.
	firstFaults := r.rec.Take()
	kinds := map[string]bool{}
	for _, f := range firstFaults {
		kinds[f.Kind] = true
		if f.Target == "egress" || !strings.Contains(f.Detail, " on tcp/"+f.Target+":") && !strings.Contains(f.Detail, " on tls/"+f.Target+":443/") {
			t.Errorf("fault recorded as %v, want it on the host's connection", f)
		}
	}
	if len(kinds) != 3 || !kinds["reset"] || !kinds["bandwidth"] || !kinds["timeout"] {
		t.Errorf("faults recorded: %v, want reset, bandwidth and timeout", kinds)
	}

	r.attach(planDecider(t, tcpProfile, 1))
	again, _, _ := play()
	if !slices.EqualFunc(first, again, func(a, b svcnet.Request) bool {
		return sameConn(a, b) && (!slices.Contains(a.Faults, "reset") || a.Bytes == b.Bytes)
	}) {
		t.Errorf("replay: recorded %+v, want %+v", again, first)
	}
	var a, b []string
	for _, f := range firstFaults {
		a = append(a, f.FaultId+" "+f.Target+" "+f.Detail)
	}
	for _, f := range r.rec.Take() {
		b = append(b, f.FaultId+" "+f.Target+" "+f.Detail)
	}
	if !slices.Equal(a, b) {
		t.Errorf("replay: faults %v, want %v", b, a)
	}
}

// sameConn reports whether two recorded connections are the same but for their bytes.
func sameConn(a, b svcnet.Request) bool {
	return a.Host == b.Host && a.Port == b.Port && a.Method == b.Method && slices.Equal(a.Faults, b.Faults) && a.Denied == b.Denied && a.Error == b.Error
}
