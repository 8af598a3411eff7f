package svcnet

import (
	"fmt"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// TestRecorderKeepsTheEarliestDenied: the denied requests a Recorder keeps past
// MaxDenied are the first MaxDenied in the step's order (by when each began, the
// runtime's attempts after the gateway's), whatever order they arrived in: the same
// actions keep the same entries, and DROPPED counts the rest.
func TestRecorderKeepsTheEarliestDenied(t *testing.T) {
	const n = MaxDenied + 44
	var r Recorder
	// The runtime's attempts arrive first, then the gateway's refusals, latest first.
	var attempts []sandbox.EgressAttempt
	for i := range 10 {
		attempts = append(attempts, sandbox.EgressAttempt{Addr: fmt.Sprintf("10.0.0.%d", i), Port: 22, Protocol: "TCP"})
	}
	r.OnEgress(attempts, 0)
	for i := n - 1; i >= 0; i-- {
		r.OnRequest(Request{Host: "127.0.0.1", Port: 10000 + i, Method: MethodTCP, Denied: true, at: int64(1000 + i)})
	}
	r.OnRequest(Request{Host: "releases.example.test", Method: "GET", Status: 200, at: 5000})
	got := r.TakeRequests()
	if want := MaxDenied + 1 + 1; len(got) != want {
		t.Fatalf("recorded %d entries, want %d (the denied up to the cap, the allowed, the count)", len(got), want)
	}
	for i, e := range got[:MaxDenied] {
		if e.Port != 10000+i || e.at != int64(1000+i) {
			t.Fatalf("entry %d is %s:%d (began at %d), want port %d: the earliest %d denied, in order", i, e.Host, e.Port, e.at, 10000+i, MaxDenied)
		}
	}
	if e := got[MaxDenied]; e.Method != "GET" {
		t.Errorf("entry %d %+v, want the allowed request", MaxDenied, e)
	}
	if last := got[len(got)-1]; last.Method != MethodDropped || last.Dropped != n+10-MaxDenied {
		t.Errorf("last entry %+v, want %d dropped", last, n+10-MaxDenied)
	}

	// The runtime's attempts after the cap: kept in the order tried, before those past it.
	for i := range MaxDenied - 2 {
		r.OnRequest(Request{Host: "127.0.0.1", Port: 20000 + i, Method: MethodUDP, Denied: true, at: int64(1 + i)})
	}
	r.OnEgress(attempts, 3)
	got = r.TakeRequests()
	if len(got) != MaxDenied+1 {
		t.Fatalf("recorded %d entries, want %d", len(got), MaxDenied+1)
	}
	if a, b := got[MaxDenied-2], got[MaxDenied-1]; a.Host != "10.0.0.0" || b.Host != "10.0.0.1" {
		t.Errorf("the attempts kept: %s, %s, want 10.0.0.0 and 10.0.0.1, the first tried", a.Host, b.Host)
	}
	if last := got[len(got)-1]; last.Dropped != 8+3 {
		t.Errorf("last entry %+v, want 11 dropped", last)
	}
}
