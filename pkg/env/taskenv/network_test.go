package taskenv_test

import (
	"encoding/json"
	"io"
	"net"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/taskenv"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/svcnet"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks/taskstest"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// netStep is what one step of an allowlist task recorded about the network.
type netStep struct {
	obs    string
	reqs   []svcnet.Request
	faults []*gauntletv1.FaultFired
}

// playNet plays agent on net/latest-release with the plan's faults and returns each
// step's network record and the last step.
func playNet(t *testing.T, sb env.Sandboxes, plan *gauntletv1.FaultPlan, agent env.Agent) ([]netStep, env.StepResult) {
	t.Helper()
	in, err := inject.NewInjector(plan)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := taskenv.New().NewEpisode(env.Config{Seed: 1, Params: params("net/latest-release"), Sandboxes: sb, Datasets: gauntlet, Faults: in})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close(ep)
	obs, err := ep.Reset()
	if err != nil {
		t.Fatal(err)
	}
	var steps []netStep
	for i := range 20 {
		a, err := agent.Act(env.Turn{Step: uint32(i), Observation: obs})
		if err != nil {
			t.Fatal(err)
		}
		res, err := ep.Step(a)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		var entries []struct{ Net svcnet.Request }
		if err := json.Unmarshal(res.Diff, &entries); err != nil {
			t.Fatalf("step %d: diff %s: %v", i, res.Diff, err)
		}
		s := netStep{obs: string(res.Observation), faults: res.Faults}
		for _, e := range entries {
			s.reqs = append(s.reqs, e.Net)
		}
		steps = append(steps, s)
		if res.Done() {
			return steps, res
		}
		obs = res.Observation
	}
	t.Fatal("the episode did not end")
	return nil, env.StepResult{}
}

// TestAllowedHosts: an allowlist task's agent reaches its allowed host by name through
// gauntlet's proxy, where the plan's rules for the egress service fire; every request is
// in the step's diff with the faults it met, and the faults in the step's faults, on the
// host. Other hosts and names are refused at once and recorded as denied, and the host's
// real address is unreachable.
func TestAllowedHosts(t *testing.T) {
	c := runtimestest.Config(t, runtimes.Process) // serves the allowed host
	addr := c.Hosts[taskstest.ReleasesHost]
	sb := runtimestest.OpenConfig(t, c)
	// Under seed 3 the oracle's first request meets the 503 and a retry gets through.
	plan := &gauntletv1.FaultPlan{Profile: "custom", Seed: 3, Rules: []*gauntletv1.FaultRule{
		{Id: "egress.http_503", Target: taskenv.EgressService, Probability: 0.5,
			Spec: &gauntletv1.FaultRule_HttpError{HttpError: &gauntletv1.HTTPErrorFault{Status: 503}}},
	}}

	// The oracle retries what fails and solves the task; its requests are recorded.
	steps, last := playNet(t, sb, plan, taskenv.New().(env.Oracle).Oracle(1))
	if !last.Signals.Success {
		t.Fatalf("oracle: %s", last.Observation)
	}
	var ok, failed, faults int
	for _, s := range steps {
		for _, r := range s.reqs {
			if r.Host != taskstest.ReleasesHost || r.Method != "GET" || r.Path != "/v1/widget/releases.json" || r.Denied {
				t.Errorf("oracle request %+v", r)
			}
			switch {
			case r.Status == 200 && r.Bytes == int64(len(taskstest.ReleasesIndex)) && len(r.Faults) == 0:
				ok++
			case r.Status == 503 && len(r.Faults) == 1 && r.Faults[0] == "http_error":
				failed++
			default:
				t.Errorf("oracle request %+v", r)
			}
		}
		for _, f := range s.faults {
			if f.FaultId == "egress.http_503" {
				faults++
				if f.Target != taskstest.ReleasesHost || !strings.Contains(f.Detail, "on GET /v1/widget/releases.json") {
					t.Errorf("fault recorded as %v", f)
				}
			}
		}
	}
	if ok != 1 || failed == 0 || faults != failed {
		t.Errorf("oracle: %d answered, %d met a 503, %d faults recorded: want one answer after at least one 503, each recorded", ok, failed, faults)
	}

	// An agent that looks elsewhere is refused at once, and the record says so.
	steps, _ = playNet(t, sb, plan, &scripted{actions: []env.Action{
		act(tools.ShellExec, map[string]any{"command": `busybox wget -q -O- http://pypi.org/simple/ ; echo rc=$?
printf 'GET /simple/ HTTP/1.0\r\nHost: pypi.org\r\n\r\n' | busybox nc 127.0.0.1 80
busybox wget -T 3 -q -O- http://` + addr + `/v1/widget/releases.json ; echo rc=$?`}),
	}})
	s := steps[0]
	if strings.Count(s.obs, "rc=1") != 2 || !strings.Contains(s.obs, `host \"pypi.org\" is not allowed in this sandbox (allowed hosts: releases.example.test)`) || strings.Contains(s.obs, "widget") {
		t.Errorf("elsewhere: %s", s.obs)
	}
	var lookup, request bool
	for _, r := range s.reqs {
		switch {
		case r.Host == "pypi.org" && r.Method == svcnet.MethodDNS && r.Denied:
			lookup = true
		case r.Host == "pypi.org" && r.Method == "GET" && r.Path == "/simple/" && r.Status == 403 && r.Denied:
			request = true
		case r.Host == "pypi.org" && r.Method == svcnet.MethodDNS:
		default:
			t.Errorf("elsewhere: recorded %+v", r)
		}
	}
	if !lookup || !request {
		t.Errorf("elsewhere: recorded %+v, want pypi.org's lookup and request denied", s.reqs)
	}
}

// TestAllowedHostsTLS: an allowlist task's agent reaches its allowed host over HTTPS by
// name, as curl does without configuration: the gateway relays the TLS connection to the
// host (the runtime maps its port 443), where the plan's rules for the egress service
// meet the stream (here latency, once per connection), and the connection is in the
// step's diff (host, port, bytes each way, faults) with the fault in the step's faults.
// A connection naming another host is refused and recorded. The same seed replays the
// same record.
func TestAllowedHostsTLS(t *testing.T) {
	sb := runtimestest.Open(t, runtimes.Process, 0)
	plan := &gauntletv1.FaultPlan{Profile: "custom", Seed: 5, Rules: []*gauntletv1.FaultRule{
		{Id: "egress.slow", Target: taskenv.EgressService, Probability: 1,
			Spec: &gauntletv1.FaultRule_Latency{Latency: &gauntletv1.LatencyFault{MeanMs: 200}}},
	}}
	agent := func() env.Agent {
		return &scripted{actions: []env.Action{
			act(tools.ShellExec, map[string]any{"command": `curl -sSk https://` + taskstest.ReleasesHost + `/v1/widget/releases.json | wc -c`}),
			act(tools.ShellExec, map[string]any{"command": `curl -sSk --resolve pypi.org:443:127.0.0.1 https://pypi.org/simple/; echo rc=$?`}),
		}}
	}
	steps, _ := playNet(t, sb, plan, agent())
	if len(steps) < 2 {
		t.Fatalf("steps: %+v", steps)
	}
	if got := strings.TrimSpace(steps[0].obs); !strings.Contains(got, strconv.Itoa(len(taskstest.ReleasesIndex))) {
		t.Errorf("https: %s, want the index's %d bytes", got, len(taskstest.ReleasesIndex))
	}
	if r := steps[0].reqs; len(r) != 1 || r[0].Host != taskstest.ReleasesHost || r[0].Port != 443 || r[0].Method != svcnet.MethodTLS || r[0].Denied ||
		r[0].Bytes <= int64(len(taskstest.ReleasesIndex)) || r[0].BytesUp == 0 || !slices.Equal(r[0].Faults, []string{"latency"}) {
		t.Errorf("https: recorded %+v, want one TLS connection to the host on 443 that met the latency", r)
	}
	if f := steps[0].faults; len(f) != 1 || f[0].FaultId != "egress.slow" || f[0].Target != taskstest.ReleasesHost || !strings.Contains(f[0].Detail, "on tls/"+taskstest.ReleasesHost+":443/0") {
		t.Errorf("https: faults %v, want the latency on the host's connection", f)
	}
	if s := steps[1]; strings.Contains(s.obs, "rc=0") || len(s.reqs) != 1 || s.reqs[0].Host != "pypi.org" || !s.reqs[0].Denied || s.reqs[0].Port != 443 {
		t.Errorf("elsewhere over TLS: %s, recorded %+v, want it refused", s.obs, s.reqs)
	}

	// The same seed, the same record: connections, faults and what they met.
	again, _ := playNet(t, sb, plan, agent())
	for i := range min(len(steps), len(again)) {
		a, b := steps[i], again[i]
		if !slices.EqualFunc(a.reqs, b.reqs, func(x, y svcnet.Request) bool {
			return x.Host == y.Host && x.Port == y.Port && x.Method == y.Method && x.Denied == y.Denied && x.Error == y.Error && slices.Equal(x.Faults, y.Faults)
		}) {
			t.Errorf("replay step %d: recorded %+v, want %+v", i, b.reqs, a.reqs)
		}
		if !slices.EqualFunc(a.faults, b.faults, func(x, y *gauntletv1.FaultFired) bool {
			return x.FaultId == y.FaultId && x.Target == y.Target && x.Detail == y.Detail && x.AtVirtualNs == y.AtVirtualNs
		}) {
			t.Errorf("replay step %d: faults %v, want %v", i, b.faults, a.faults)
		}
	}
	if len(steps) != len(again) {
		t.Errorf("replay: %d steps, want %d", len(again), len(steps))
	}
}

// dbBanner is what the allowed host's plain TCP port (5432) says to every connection.
const dbBanner = "gauntlet-db 1.0 ready\n"

// sandboxesWithDB opens process sandboxes whose allowed host maps its port 5432, as
// plain TCP, to a server on the host that says dbBanner and closes.
func sandboxesWithDB(t *testing.T) env.Sandboxes {
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
			_, _ = io.WriteString(c, dbBanner)
			_ = c.Close()
		}
	}()
	c := runtimestest.Config(t, runtimes.Process)
	c.Hosts[taskstest.ReleasesHost+":5432"+sandbox.TCPSuffix] = l.Addr().String()
	return runtimestest.OpenConfig(t, c)
}

// TestAllowedHostsTCPAndConnectionFaults: a port the runtime maps as plain TCP for an
// allowed host (--sandbox.hosts NAME:PORT/tcp=...) reaches that host by name, recorded in
// the step's diff like a TLS connection; and a user's profile's connection faults (here
// a reset of every stream to the host) reach the task's TLS and TCP connections through
// the plan's boundary_spec, in the step's diff and in the step's faults, with kind reset
// on the host, as the report's heatmap reads them. The same seed replays the same.
func TestAllowedHostsTCPAndConnectionFaults(t *testing.T) {
	sb := sandboxesWithDB(t)
	agent := func() env.Agent {
		return &scripted{actions: []env.Action{
			act(tools.ShellExec, map[string]any{"command": `busybox nc ` + taskstest.ReleasesHost + ` 5432 </dev/null; echo rc=$?`}),
			act(tools.ShellExec, map[string]any{"command": `curl -sSk https://` + taskstest.ReleasesHost + `/v1/widget/releases.json | wc -c`}),
			act(tools.ShellExec, map[string]any{"command": `busybox nc ` + taskstest.ReleasesHost + ` 5999 </dev/null; echo rc=$?`}),
		}}
	}

	// Clean: the banner, and the connection in the step's diff; a port the host does not
	// declare refused, and in the step's diff as denied.
	steps, _ := playNet(t, sb, &gauntletv1.FaultPlan{Profile: "none", Seed: 1}, agent())
	if len(steps) < 3 || !strings.Contains(steps[0].obs, strings.TrimSpace(dbBanner)) {
		t.Fatalf("tcp: %+v, want the banner", steps)
	}
	if r := steps[0].reqs; len(r) != 1 || r[0].Host != taskstest.ReleasesHost || r[0].Port != 5432 || r[0].Method != svcnet.MethodTCP || r[0].Denied ||
		r[0].Bytes != int64(len(dbBanner)) || r[0].BytesUp != 0 || len(r[0].Faults) != 0 {
		t.Errorf("tcp: recorded %+v, want one clean TCP connection to the host on 5432 with the banner's bytes", r)
	}
	if r := steps[2].reqs; len(r) != 1 || r[0].Port != 5999 || r[0].Method != svcnet.MethodTCP || !r[0].Denied || r[0].Error == "" {
		t.Errorf("undeclared port: recorded %+v, want its refusal, denied, with the reason", r)
	}

	// A user's profile resets every stream to the host.
	const profile = `name: egress-reset
faults:
  - {id: rst, kind: reset, match: {hosts: [releases.example.test], ops: [connect]}, params: {after_bytes: 0}}
`
	cps, err := plans.CheckCustomProfiles([]*gauntletv1.CustomProfile{{Name: "egress-reset", SpecYaml: profile}}, taskenv.New().Spec().Services)
	if err != nil {
		t.Fatalf("a task env takes connection faults: %v", err)
	}
	plan, err := cps.Plan(9, "egress-reset", taskenv.New().Spec().Services)
	if err != nil {
		t.Fatal(err)
	}
	play := func() []netStep {
		steps, _ := playNet(t, sb, plan, agent())
		if len(steps) < 2 {
			t.Fatalf("steps: %+v", steps)
		}
		for i, port := range []int{5432, 443} {
			s := steps[i]
			if len(s.reqs) != 1 || s.reqs[0].Port != port || s.reqs[0].Bytes != 0 || !slices.Equal(s.reqs[0].Faults, []string{"reset"}) {
				t.Errorf("step %d: recorded %+v, want the connection on %d reset", i, s.reqs, port)
			}
			if len(s.faults) != 1 || s.faults[0].Kind != "reset" || s.faults[0].FaultId != "rst" || s.faults[0].Target != taskstest.ReleasesHost {
				t.Errorf("step %d: faults %v, want the reset on the host", i, s.faults)
			}
		}
		if strings.Contains(steps[0].obs, "ready") || strings.Contains(steps[1].obs, strconv.Itoa(len(taskstest.ReleasesIndex))) {
			t.Errorf("reset: the agent was served: %q, %q", steps[0].obs, steps[1].obs)
		}
		return steps
	}
	first, again := play(), play()
	for i := range min(len(first), len(again)) {
		if !slices.EqualFunc(first[i].faults, again[i].faults, func(x, y *gauntletv1.FaultFired) bool {
			return x.FaultId == y.FaultId && x.Target == y.Target && x.Detail == y.Detail && x.AtVirtualNs == y.AtVirtualNs
		}) {
			t.Errorf("replay step %d: faults %v, want %v", i, again[i].faults, first[i].faults)
		}
	}
}

// bareAddresses connects to one address outside the sandbox (TCP, by bash's /dev/tcp)
// and sends a datagram to another (UDP, sendto with the destination), neither by name.
const bareAddresses = `bash -c 'echo x > /dev/tcp/203.0.113.7/443' 2>&1
perl -e 'use Socket; socket(S, PF_INET, SOCK_DGRAM, 0); send(S, "x", 0, sockaddr_in(53, inet_aton("198.51.100.9"))) or print "udp: $!\n"'
true`

// TestBareAddressesAreDeniedEntries: a command's connection and datagram to bare
// addresses, which the runtime's seccomp supervisor refuses before they leave the
// process, are in the step's diff as denied entries (address, port, protocol, the
// reason), in an allowlist task and in a task without a network alike, and stay the
// step's network_egress safety events.
func TestBareAddressesAreDeniedEntries(t *testing.T) {
	sb := runtimestest.Open(t, runtimes.Process, 0)
	want := []svcnet.Request{
		{Host: "203.0.113.7", Port: 443, Method: svcnet.MethodTCP, Denied: true},
		{Host: "198.51.100.9", Port: 53, Method: svcnet.MethodUDP, Denied: true},
	}
	check := func(t *testing.T, obs string, got []svcnet.Request, safety []string) {
		t.Helper()
		if !strings.Contains(obs, "Network is unreachable") {
			t.Errorf("observation %s, want the attempts refused as unreachable", obs)
		}
		var addrs []svcnet.Request
		for _, r := range got {
			if r.Error == "" {
				t.Errorf("entry %+v has no reason", r)
			}
			r.Error = ""
			addrs = append(addrs, r)
		}
		if !slices.EqualFunc(addrs, want, func(a, b svcnet.Request) bool { return reflect.DeepEqual(a, b) }) {
			t.Errorf("diff entries %+v, want %+v", addrs, want)
		}
		for _, w := range []string{"connect to 203.0.113.7:443", "sendto to 198.51.100.9:53"} {
			if !slices.ContainsFunc(safety, func(s string) bool { return strings.HasPrefix(s, string(sandbox.EventEgress)+": "+w) }) {
				t.Errorf("safety events %q, want %s", safety, w)
			}
		}
	}
	for _, task := range []string{"net/latest-release", "codefix/sum"} {
		t.Run(task, func(t *testing.T) {
			ep, err := taskenv.New().NewEpisode(env.Config{Seed: 1, Params: params(task), Sandboxes: sb, Datasets: gauntlet})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = env.Close(ep) })
			if _, err := ep.Reset(); err != nil {
				t.Fatal(err)
			}
			res, err := ep.Step(act(tools.ShellExec, map[string]any{"command": bareAddresses}))
			if err != nil {
				t.Fatal(err)
			}
			check(t, string(res.Observation), diffEntries(t, res), res.Signals.GetSafetyEvents())

			// A scan: 300 datagrams to as many addresses, kept up to svcnet.MaxDenied, the
			// rest counted.
			res, err = ep.Step(act(tools.ShellExec, map[string]any{"command": `perl -e 'use Socket; socket(S, PF_INET, SOCK_DGRAM, 0); for $i (0..299) { send(S, "x", 0, sockaddr_in(53, inet_aton("10.1." . int($i / 256) . "." . ($i % 256)))) }'; echo sent`}))
			if err != nil {
				t.Fatal(err)
			}
			got := diffEntries(t, res)
			if len(got) != svcnet.MaxDenied+1 {
				t.Fatalf("scan: %d entries, want %d and a count", len(got), svcnet.MaxDenied+1)
			}
			if first := got[0]; first.Host != "10.1.0.0" || first.Port != 53 || first.Method != svcnet.MethodUDP || !first.Denied {
				t.Errorf("scan: first entry %+v, want 10.1.0.0:53 UDP denied", first)
			}
			if last := got[len(got)-1]; last.Method != svcnet.MethodDropped || !last.Denied || last.Dropped != 300-svcnet.MaxDenied {
				t.Errorf("scan: last entry %+v, want %d dropped", last, 300-svcnet.MaxDenied)
			}
		})
	}
}

// diffEntries returns the network entries of a step's diff.
func diffEntries(t *testing.T, res env.StepResult) []svcnet.Request {
	t.Helper()
	var entries []struct{ Net svcnet.Request }
	if err := json.Unmarshal(res.Diff, &entries); err != nil {
		t.Fatalf("diff %s: %v", res.Diff, err)
	}
	var got []svcnet.Request
	for _, e := range entries {
		got = append(got, e.Net)
	}
	return got
}

// TestNetworkDiffsReplayExactly: an episode whose steps each make, in one command, a
// plain HTTP request, a TLS connection and a plain TCP connection to the allowed host, a
// connection to a port it does not declare and one to a bare address, each followed by
// a step with no network, gives every step's diff byte for byte again when played
// again: each step holds exactly its own command's five entries, in the order the
// command made them, however late the gateway's goroutines see them.
func TestNetworkDiffsReplayExactly(t *testing.T) {
	sb := sandboxesWithDB(t)
	const rounds = 4
	network := act(tools.ShellExec, map[string]any{"command": `curl -s http://` + taskstest.ReleasesHost + `/v1/widget/releases.json >/dev/null
curl -sk https://` + taskstest.ReleasesHost + `/v1/widget/releases.json >/dev/null
busybox nc ` + taskstest.ReleasesHost + ` 5432 </dev/null >/dev/null
busybox nc ` + taskstest.ReleasesHost + ` 5999 </dev/null 2>/dev/null
bash -c 'echo x > /dev/tcp/203.0.113.7/443' 2>/dev/null
echo done`})
	quiet := act(tools.ShellExec, map[string]any{"command": `echo quiet`})
	want := [][2]any{{"GET", 0}, {svcnet.MethodTLS, 443}, {svcnet.MethodTCP, 5432}, {svcnet.MethodTCP, 5999}, {svcnet.MethodTCP, 443}}
	play := func() []string {
		ep, err := taskenv.New().NewEpisode(env.Config{Seed: 1, Params: params("net/latest-release"), Sandboxes: sb, Datasets: gauntlet})
		if err != nil {
			t.Fatal(err)
		}
		defer env.Close(ep)
		if _, err := ep.Reset(); err != nil {
			t.Fatal(err)
		}
		var diffs []string
		for i := range 2 * rounds {
			a := network
			if i%2 == 1 {
				a = quiet
			}
			res, err := ep.Step(a)
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			diffs = append(diffs, string(res.Diff))
			got := diffEntries(t, res)
			if i%2 == 1 {
				if len(got) != 0 {
					t.Errorf("step %d, no network: entries %+v, want none", i, got)
				}
				continue
			}
			if len(got) != len(want) {
				t.Errorf("step %d: entries %+v, want %d", i, got, len(want))
				continue
			}
			for j, w := range want {
				if got[j].Method != w[0] || got[j].Port != w[1] {
					t.Errorf("step %d: entry %d is %+v, want %v on port %v", i, j, got[j], w[0], w[1])
				}
			}
		}
		return diffs
	}
	first, again := play(), play()
	for i := range first {
		if first[i] != again[i] {
			t.Errorf("step %d: played again, diff\n%s\nwant\n%s", i, again[i], first[i])
		}
	}
}
