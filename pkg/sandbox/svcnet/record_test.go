package svcnet_test

import (
	"fmt"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/svcnet"
)

// TestRecorderEgressSharesTheCap: a command's refused attempts at addresses are denied
// requests (the address as the host, the port, the protocol as the method, a reason)
// after what the gateway recorded, under the same MaxDenied as the gateway's denied
// requests; those past it, and those the runtime only counted, are in the DROPPED
// entry. Allowed requests are never dropped.
func TestRecorderEgressSharesTheCap(t *testing.T) {
	var r svcnet.Recorder
	r.OnEgress([]sandbox.EgressAttempt{{Addr: "203.0.113.7", Port: 443, Protocol: "TCP"}, {Addr: "2001:db8::7", Port: 53, Protocol: "UDP"}}, 0)
	got := r.TakeRequests()
	if len(got) != 2 || got[0].Host != "203.0.113.7" || got[0].Port != 443 || got[0].Method != svcnet.MethodTCP || !got[0].Denied || got[0].Error == "" ||
		got[1].Host != "2001:db8::7" || got[1].Method != svcnet.MethodUDP || got[1].Error != got[0].Error {
		t.Fatalf("recorded %+v, want the two attempts denied with the reason", got)
	}

	for i := range 200 {
		r.OnRequest(svcnet.Request{Host: fmt.Sprintf("h%d.example", i), Method: svcnet.MethodDNS, Denied: true})
	}
	r.OnRequest(svcnet.Request{Host: "releases.example.test", Method: "GET", Status: 200})
	var scan []sandbox.EgressAttempt
	for i := range 100 {
		scan = append(scan, sandbox.EgressAttempt{Addr: fmt.Sprintf("10.0.0.%d", i), Port: 22, Protocol: "TCP"})
	}
	r.OnEgress(scan, 5) // and the runtime counted five more past its own cap
	r.OnRequest(svcnet.Request{Host: "releases.example.test", Method: "GET", Status: 200})
	got = r.TakeRequests()
	if want := svcnet.MaxDenied + 2 + 1; len(got) != want {
		t.Fatalf("recorded %d entries, want %d (the denied up to the cap, both allowed, the count)", len(got), want)
	}
	if e := got[201]; e.Host != "10.0.0.0" || e.Method != svcnet.MethodTCP {
		t.Errorf("first attempt %+v, want 10.0.0.0 after the lookups and the first request", e)
	}
	if last := got[len(got)-1]; last.Method != svcnet.MethodDropped || !last.Denied || last.Dropped != 200+100-svcnet.MaxDenied+5 {
		t.Errorf("last entry %+v, want %d dropped", last, 200+100-svcnet.MaxDenied+5)
	}
	if got[len(got)-2].Method != "GET" {
		t.Errorf("the request after the scan was dropped: %+v", got[len(got)-2])
	}
}
