package inject_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
)

// TestDeciderConcurrentStreamsMatchSequential: streams decided from many goroutines at
// once meet exactly the faults they meet one after another (run with -race).
func TestDeciderConcurrentStreamsMatchSequential(t *testing.T) {
	const yaml = `  - {id: e, kind: http_error, probability: 0.2, params: {status: 503}}
  - {id: l, kind: latency, params: {mean_ms: 20, jitter_ms: 5}}
  - {id: loss, kind: packet_loss, params: {rate: 0.05, burst_len: 3}}
  - {id: cut, kind: truncate, probability: 0.1, params: {keep_fraction: 0.5}}
`
	const streams, events = 16, 300
	trace := func(d *inject.Decider, key string) string {
		var s string
		for range events {
			dec := d.Decide(key, request)
			s += fmt.Sprintf("%s/%d/%d/%.2f;", dec.Abort, dec.Status, dec.Delay, dec.Keep)
		}
		return s
	}
	seq := specDecider(t, 99, yaml)
	want := make([]string, streams)
	for i := range want {
		want[i] = trace(seq, fmt.Sprintf("conn/%d", i))
	}
	par := specDecider(t, 99, yaml)
	got := make([]string, streams)
	var wg sync.WaitGroup
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = trace(par, fmt.Sprintf("conn/%d", i))
		}()
	}
	wg.Wait()
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("stream %d differs when decided concurrently", i)
		}
	}
	par.Forget("conn/0")
	if again := trace(par, "conn/0"); again != want[0] {
		t.Fatal("a forgotten stream does not start over")
	}
}

// TestDeciderCloneContinuesLikeItsParent: a clone taken mid-stream (a branched episode)
// decides what the parent decides from there on, and each goes on without moving the
// other.
func TestDeciderCloneContinuesLikeItsParent(t *testing.T) {
	const yaml = `  - {id: e, kind: http_error, probability: 0.3, params: {status: 503}}
  - {id: loss, kind: packet_loss, params: {rate: 0.1, burst_len: 4}}
`
	trace := func(d *inject.Decider, n int) string {
		var s string
		for range n {
			dec := d.Decide("http/docs", request)
			s += fmt.Sprintf("%s/%d;", dec.Abort, dec.Status)
		}
		return s
	}
	d := specDecider(t, 5, yaml)
	_ = trace(d, 37)
	c := d.Clone()
	want := trace(d, 200)
	if got := trace(c, 200); got != want {
		t.Fatal("the clone decides differently from its parent")
	}
	if trace(d, 50) != trace(c, 50) {
		t.Fatal("parent and clone drift apart after both moved on")
	}
}
