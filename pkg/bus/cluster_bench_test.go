package bus_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/natslocal/natstest"
)

// BenchmarkPublishReplicas is the latency of one acknowledged publish (1 KiB, as a step
// event) to GAUNTLET_EVENTS on a nats-server process of the embedded version over
// loopback: a single node at 1 replica, against a 3-node cluster at 3 replicas, where the
// ack waits for a quorum. It reports p50 and p99 besides the mean (docs/benchmarks.md).
//
//	go test -run '^$' -bench PublishReplicas -benchtime 3000x ./pkg/bus
func BenchmarkPublishReplicas(b *testing.B) {
	for _, c := range []struct{ nodes, replicas int }{{1, 1}, {3, 3}} {
		b.Run("nodes="+strconv.Itoa(c.nodes)+"/replicas="+strconv.Itoa(c.replicas), func(b *testing.B) {
			cl := natstest.Start(b, c.nodes)
			ctx := context.Background()
			bb := natstest.Bus(ctx, b, cl, c.replicas, 256<<20)
			data := make([]byte, 1024)
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				begin := time.Now()
				if _, err := bb.JS.Publish(ctx, "gauntlet.ev.steps.bench", data); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(begin))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}
