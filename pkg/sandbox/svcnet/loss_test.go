package svcnet_test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultnet"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/svcnet"
)

// lossyHost is the plain TCP host of the packet loss tests, on a port of its own, served
// by tcpRemote.
var lossyHost = sandbox.HostPort{Host: "lossy-db.example.test", Port: 5438}

// lossProfile loses a fifth of lossyHost's segments, each resent after 100 ms.
const lossProfile = `name: egress-loss
faults:
  - {id: loss, kind: packet_loss, match: {hosts: [lossy-db.example.test]}, params: {rate: 0.2, rto_ms: 100}}
`

// lossSeed is a seed under which lossProfile loses some of the 14 segments of a
// 20,000-byte answer.
const lossSeed = 7

// runEgressLoss is the proof on one runtime that a profile's packet_loss reaches a plain
// TCP stream through the plan: no byte is lost, but each lost segment of the answer (the
// ones a decider under the same seed draws for it, segment by segment) stalls it one
// RTO and is recorded as a fault of the step on the connection; and the same again on a
// second gateway under the same seed.
func runEgressLoss(t *testing.T, rt sandbox.Runtime, image string) {
	r := newEgressRig(t, rt, image, sandbox.Service{Hosts: []string{lossyHost.Host}, TCPPorts: []sandbox.HostPort{lossyHost}})
	const n = 20000
	want := tcpBanner + strings.Repeat("0123456789", n/10)
	cmd := fmt.Sprintf(`printf 'SEND %d\n' | busybox nc %s %d > out; echo rc=$?; wc -c < out; rm -f out`, n, lossyHost.Host, lossyHost.Port)

	// What the plan's decider draws for this connection's segments: the lost ones, to
	// the sandbox (down) and from it (up), and whether its SYN is lost.
	key := "tcp/" + lossyHost.Host + ":" + strconv.Itoa(lossyHost.Port) + "/0"
	ev := catalogue.Event{Layer: catalogue.LayerNetwork, Op: catalogue.OpConnect, Service: "egress", Host: lossyHost.Host}
	d := planDecider(t, lossProfile, lossSeed)
	var wantLost []string
	if d.Decide(key, ev).Abort == catalogue.KindPacketLoss {
		wantLost = append(wantLost, "lost")
	}
	for _, dir := range []struct {
		name, to string
		bytes    int
	}{{"down", "to the client", len(want)}, {"up", "from the client", len("SEND 20000\n")}} {
		for seg := 0; seg*faultnet.SegmentBytes < dir.bytes; seg++ {
			if d.DecideKind(key+"/"+dir.name, ev, catalogue.KindPacketLoss).Abort == catalogue.KindPacketLoss {
				wantLost = append(wantLost, fmt.Sprintf("segment %d %s lost, resent after 100ms", seg, dir.to))
			}
		}
	}
	slices.Sort(wantLost)
	if len(wantLost) < 2 {
		t.Fatalf("seed %d loses %v: pick a seed that loses some segments", lossSeed, wantLost)
	}

	play := func() []string {
		res, took := r.sh(cmd)
		if res.Stdout != "rc=0\n"+strconv.Itoa(len(want))+"\n" {
			t.Fatalf("lossy: got %+v, want every byte: a stream loses none", res)
		}
		if min := time.Duration(len(wantLost)) * 100 * time.Millisecond; took < min {
			t.Errorf("lossy: took %v, want at least %v (%d RTOs)", took, min, len(wantLost))
		}
		got := r.requests(1)
		if len(got) != 1 || got[0].Method != svcnet.MethodTCP || got[0].Bytes != int64(len(want)) || !slices.Equal(got[0].Faults, []string{catalogue.KindPacketLoss}) {
			t.Errorf("lossy: recorded %+v, want the whole answer meeting packet_loss once", got)
		}
		var details []string
		for _, f := range r.rec.Take() {
			if f.Kind != catalogue.KindPacketLoss || f.Target != lossyHost.Host || !strings.HasSuffix(f.Detail, " on "+key) {
				t.Errorf("fault %v, want packet_loss on %s", f, key)
			}
			details = append(details, strings.TrimSuffix(f.Detail, " on "+key))
		}
		slices.Sort(details)
		return details
	}
	r.attach(planDecider(t, lossProfile, lossSeed))
	if got := play(); !slices.Equal(got, wantLost) {
		t.Errorf("lost %q, want %q", got, wantLost)
	}
	r.attach(planDecider(t, lossProfile, lossSeed))
	if got := play(); !slices.Equal(got, wantLost) {
		t.Errorf("replay: lost %q, want %q", got, wantLost)
	}
}
