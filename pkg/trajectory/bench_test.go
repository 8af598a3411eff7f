package trajectory

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
)

const benchRows = 100_000

// storeBatchRows is the store's default --store.batch-rows.
const storeBatchRows = 25_000

// BenchmarkWriteSteps measures Writer.Write with batches of 100,000 realistic steps
// (observations of about 300 bytes), from events to rows acknowledged by the server,
// and compares the ways into clickhouse-go: whole columns (what insert does), one
// Append per row, and LZ4 compression on the wire.
//
// Its results are in docs/benchmarks.md (Go micro-benchmarks; the first measurement of
// each way in is under Costs the code cites, Trajectory store). Run it with
// go test -run X -bench WriteSteps -benchtime 10x ./pkg/trajectory/ .
func BenchmarkWriteSteps(b *testing.B) {
	srv := chtest.Start(b)
	ctx := context.Background()
	conn, err := Connect(ctx, srv.Addr(), testDB)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	if err := Migrate(ctx, conn, testDB); err != nil {
		b.Fatal(err)
	}
	events := runEvents("run-bench", benchRows/50, 50)[:benchRows] // steps only
	var obsBytes int
	for _, ev := range events {
		obsBytes += len(ev.GetStep().GetObservationJson())
	}
	rows := make([]StepRow, len(events))
	for i, ev := range events {
		rows[i] = newStepRow(ev.GetStep(), mustScore(b, nil, ev.GetStep()))
	}

	// Every iteration writes new episodes, as production does: rewriting the same keys
	// would make ClickHouse merge duplicates, which steady ingest does not do.
	var iteration int
	renumber := func(b *testing.B) {
		b.StopTimer()
		iteration++
		prefix := fmt.Sprintf("it%06d-", iteration)
		for i, ev := range events {
			s := ev.GetStep()
			s.EpisodeId = prefix + strings.TrimPrefix(s.EpisodeId, fmt.Sprintf("it%06d-", iteration-1))
			rows[i].EpisodeID = s.EpisodeId
		}
		b.StartTimer()
	}
	// Each variant starts from empty tables, so none pays for another's merges.
	truncate := func(b *testing.B) {
		for _, table := range []string{"steps", "faults"} {
			if err := conn.Exec(ctx, "TRUNCATE TABLE "+testDB+"."+table); err != nil {
				b.Fatal(err)
			}
		}
	}
	// client_us/row is this process's CPU (user and system) per row: the writer's own
	// cost, which the machine's noise moves far less than rows/s. It includes the
	// untimed renumbering, the same for every variant.
	// server_us/row is the ClickHouse server's, background merges included.
	var cpu0, server0 time.Duration
	start := func(b *testing.B) {
		truncate(b)
		cpu0, server0 = processCPU(b), serverCPU(b, srv.Pid())
	}
	report := func(b *testing.B) {
		rows := float64(benchRows * b.N)
		b.ReportMetric(rows/b.Elapsed().Seconds(), "rows/s")
		b.ReportMetric(float64(obsBytes)/float64(len(events)), "obs_bytes")
		b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/rows, "client_us/row")
		b.ReportMetric(float64((serverCPU(b, srv.Pid())-server0).Microseconds())/rows, "server_us/row")
	}

	b.Run("write", func(b *testing.B) {
		start(b)
		w := NewWriter(conn, testDB)
		for b.Loop() {
			renumber(b)
			if _, err := w.Write(ctx, events); err != nil {
				b.Fatal(err)
			}
		}
		report(b)
	})
	b.Run("insert=columns", func(b *testing.B) {
		start(b)
		sc := &scratch{} // as a Writer keeps it between Writes
		for b.Loop() {
			renumber(b)
			if err := insert(ctx, conn, testDB, "steps", stepColumns, rows, sc); err != nil {
				b.Fatal(err)
			}
			sc.release()
		}
		report(b)
	})
	// The store's batches: 25,000 rows (--store.batch-rows), so each insert's first
	// block, whose column buffers clickhouse-go grows from nothing, is a large part of it.
	b.Run("insert=columns/store-batches", func(b *testing.B) {
		start(b)
		sc := &scratch{}
		for b.Loop() {
			renumber(b)
			for start := 0; start < len(rows); start += storeBatchRows {
				if err := insert(ctx, conn, testDB, "steps", stepColumns, rows[start:min(start+storeBatchRows, len(rows))], sc); err != nil {
					b.Fatal(err)
				}
				sc.release()
			}
		}
		report(b)
	})
	b.Run("insert=rows", func(b *testing.B) {
		start(b)
		for b.Loop() {
			renumber(b)
			if err := insertRowByRow(ctx, conn, rows); err != nil {
				b.Fatal(err)
			}
		}
		report(b)
	})
	b.Run("insert=columns/lz4", func(b *testing.B) {
		start(b)
		lz4, err := clickhouse.Open(&clickhouse.Options{
			Addr:        []string{srv.Addr()},
			Compression: &clickhouse.Compression{Method: clickhouse.CompressionLZ4},
		})
		if err != nil {
			b.Fatal(err)
		}
		defer lz4.Close()
		sc := &scratch{}
		for b.Loop() {
			renumber(b)
			if err := insert(ctx, lz4, testDB, "steps", stepColumns, rows, sc); err != nil {
				b.Fatal(err)
			}
			sc.release()
		}
		report(b)
	})
}

// processCPU returns the user and system CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverCPU returns the user and system CPU time process pid has used, from
// /proc/PID/stat (in clock ticks of 10 ms).
func serverCPU(b *testing.B, pid int) time.Duration {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command, which may hold spaces, in parentheses: utime and
	// stime are the 14th and 15th of the line, the 12th and 13th after it.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			b.Fatalf("%s: %v", stat, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// insertRowByRow is the alternative to insert that the benchmark compares it with:
// one batch.Append per row, in blocks of blockRows like insert.
func insertRowByRow(ctx context.Context, conn driver.Conn, rows []StepRow) error {
	batch, err := conn.PrepareBatch(ctx, "INSERT INTO "+testDB+".steps ("+columnList(stepColumns)+")")
	if err != nil {
		return err
	}
	b := func(v bool) uint8 {
		if v {
			return 1
		}
		return 0
	}
	for i := range rows {
		r := &rows[i]
		err := batch.Append(r.RunID, r.EpisodeID, r.Step, r.RequestedAt, r.Env, r.Policy, r.Profile,
			r.WorkerID, r.Tool, r.Args, r.Observation, r.StateDiff, r.FaultIDs, r.FaultKinds,
			r.FaultTargets, r.FaultDetails, r.ToolCalls, r.Errors, r.VirtualNs, r.WallNs, r.BytesIn,
			r.BytesOut, r.Progress, b(r.InvalidAction), b(r.Success), r.ViolationRules,
			r.ViolationReasons, r.SafetyEvents, r.Spend, b(r.Terminated), b(r.Truncated), r.Reason,
			r.VirtualTimeNs, r.Reward, r.RTask, r.RCost, r.RSafety, r.RTimeliness, r.RCausal,
			r.RewardNames, r.RewardValues, r.RewardSpec, r.Version)
		if err != nil {
			_ = batch.Abort()
			return err
		}
		if (i+1)%blockRows == 0 && i+1 < len(rows) {
			if err := batch.Flush(); err != nil {
				_ = batch.Abort()
				return err
			}
		}
	}
	return batch.Send()
}
