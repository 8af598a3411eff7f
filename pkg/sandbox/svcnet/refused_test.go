package svcnet_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/svcnet"
)

// runEgressRefused is the proof on one runtime that a connection a sandbox with allowed
// hosts attempts to a port none of them declares, which its own kernel refuses, is
// recorded as denied with the address, the port, the protocol and the reason (and a
// datagram's, where the sandbox has python3 to send one); and that a flood of such
// attempts is recorded up to svcnet.MaxDenied and counted past it.
func runEgressRefused(t *testing.T, rt sandbox.Runtime, image string, udp bool) {
	r := newEgressRig(t, rt, image, sandbox.Service{Hosts: []string{remoteHost}})
	r.attach(nil)
	cmd := `busybox nc ` + remoteHost + ` 5999 </dev/null; echo rc=$?`
	want := []svcnet.Request{{Host: "127.0.0.1", Port: 5999, Method: svcnet.MethodTCP, Denied: true}}
	if udp {
		cmd += `; python3 -c "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'x', ('127.0.0.1', 5998))"`
		want = append(want, svcnet.Request{Host: "127.0.0.1", Port: 5998, Method: svcnet.MethodUDP, Denied: true})
	}
	res, _ := r.sh(cmd)
	if !strings.Contains(res.Stdout, "rc=1") || !strings.Contains(res.Stdout+res.Stderr, "refused") {
		t.Errorf("undeclared port: got %+v, want the connection refused at once", res)
	}
	got := r.requests(len(want))
	if !slices.EqualFunc(got, want, func(a, b svcnet.Request) bool {
		return a.Host == b.Host && a.Port == b.Port && a.Method == b.Method && a.Denied && a.Error != "" && a.Bytes == 0
	}) {
		t.Errorf("undeclared port: recorded %+v, want %+v, each with a reason", got, want)
	}

	// A flood: a scan of 300 ports, kept up to MaxDenied, the rest counted.
	const n = 300
	res, _ = r.sh(fmt.Sprintf(`i=0; while [ $i -lt %d ]; do busybox nc 127.0.0.1 $((6000+i)) </dev/null 2>/dev/null; i=$((i+1)); done; echo done`, n))
	if res.Stdout != "done\n" {
		t.Fatalf("flood: %+v", res)
	}
	got = r.requests(svcnet.MaxDenied + 1)
	if len(got) != svcnet.MaxDenied+1 {
		t.Fatalf("flood: recorded %d entries, want %d and a count", len(got), svcnet.MaxDenied+1)
	}
	if last := got[len(got)-1]; last.Method != svcnet.MethodDropped || !last.Denied || last.Dropped != n-svcnet.MaxDenied {
		t.Errorf("flood: last entry %+v, want %d dropped", last, n-svcnet.MaxDenied)
	}
	if first := got[0]; first.Host != "127.0.0.1" || first.Port != 6000 || first.Method != svcnet.MethodTCP {
		t.Errorf("flood: first entry %+v, want 127.0.0.1:6000 TCP", first)
	}
	if again := r.requests(0); len(again) != 0 {
		t.Errorf("after the flood: %+v, want nothing", again)
	}
}
