package trajectory

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal"
	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
)

// BenchmarkWriteReplicated measures what the store's writes cost on a two-replica
// ClickHouse against a single server, side by side in one run: Writer.Write of realistic
// steps in the store's 25,000-row batches (--store.batch-rows), into a single server and
// into the first replica's Distributed tables. rows/s is the rate at which inserts are
// acknowledged; client_us/row is this process's CPU per row; server_us/row is the
// servers' CPU per row: for the pair, both replicas' and ZooKeeper's, measured once the
// other replica has fetched every part (replication is asynchronous, so it is not in
// rows/s but is in the CPU).
//
// Its results are in docs/benchmarks.md (Replicated ClickHouse). Run it with
// go test -run X -bench WriteReplicated -benchtime 8x ./pkg/trajectory/ .
func BenchmarkWriteReplicated(b *testing.B) {
	ctx := context.Background()
	single := chtest.Start(b)
	zk, replicas := chtest.StartCluster(b)
	if err := MigrateReplicas(ctx, chlocal.Addrs(replicas), testDB, slog.New(slog.DiscardHandler)); err != nil {
		b.Fatal(err)
	}
	events := runEvents("run-bench", benchRows/50, 50)[:benchRows] // steps only
	ids := make([]string, len(events))
	for i, ev := range events {
		ids[i] = ev.GetStep().GetEpisodeId()
	}
	// Every iteration writes new episodes, as production does (see BenchmarkWriteSteps).
	var iteration int
	renumber := func() {
		iteration++
		prefix := fmt.Sprintf("it%06d-", iteration)
		for i, ev := range events {
			ev.GetStep().EpisodeId = prefix + ids[i]
		}
	}
	for _, tc := range []struct {
		name    string
		addr    string
		servers []int // pids whose CPU counts
		other   string
	}{
		{"single", single.Addr(), []int{single.Pid()}, ""},
		{"replicated", replicas[0].Addr(), []int{replicas[0].Pid(), replicas[1].Pid(), zk.Pid()}, replicas[1].Addr()},
	} {
		b.Run(tc.name, func(b *testing.B) {
			conn, err := Connect(ctx, tc.addr, testDB)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			if tc.other == "" {
				if err := Migrate(ctx, conn, testDB); err != nil {
					b.Fatal(err)
				}
			}
			w := NewWriter(conn, testDB)
			serverCPUs := func() (d time.Duration) {
				for _, pid := range tc.servers {
					d += serverCPU(b, pid)
				}
				return d
			}
			cpu0, server0 := processCPU(b), serverCPUs()
			each0 := make([]time.Duration, len(tc.servers))
			for i, pid := range tc.servers {
				each0[i] = serverCPU(b, pid)
			}
			for b.Loop() {
				b.StopTimer()
				renumber()
				b.StartTimer()
				for start := 0; start < len(events); start += storeBatchRows {
					if _, err := w.Write(ctx, events[start:min(start+storeBatchRows, len(events))]); err != nil {
						b.Fatal(err)
					}
				}
			}
			elapsed := b.Elapsed()
			if tc.other != "" {
				waitReplicated(ctx, b, conn, tc.other)
			}
			rows := float64(benchRows * b.N)
			b.ReportMetric(rows/elapsed.Seconds(), "rows/s")
			b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/rows, "client_us/row")
			b.ReportMetric(float64((serverCPUs()-server0).Microseconds())/rows, "server_us/row")
			// Of which: the replica written to, the one fetching, ZooKeeper.
			for i, unit := range []string{"", "fetching_replica_us/row", "zookeeper_us/row"}[:len(tc.servers)] {
				if unit != "" {
					b.ReportMetric(float64((serverCPU(b, tc.servers[i])-each0[i]).Microseconds())/rows, unit)
				}
			}
		})
	}
}

// waitReplicated waits until the replica at other holds as many step rows as conn's.
func waitReplicated(ctx context.Context, b *testing.B, conn driver.Conn, other string) {
	o, err := Connect(ctx, other, testDB)
	if err != nil {
		b.Fatal(err)
	}
	defer o.Close()
	count := func(c driver.Conn) uint64 {
		var n uint64
		if err := c.QueryRow(ctx, "SELECT count() FROM "+testDB+".steps_local").Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n
	}
	want := count(conn)
	for deadline := time.Now().Add(2 * time.Minute); count(o) < want; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("the other replica holds %d of %d rows after two minutes", count(o), want)
		}
	}
}
