package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/policy/httppolicy"
	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	"github.com/gauntlet-rl/gauntlet/pkg/telemetry"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
	"github.com/gauntlet-rl/gauntlet/services/reward"
	"github.com/gauntlet-rl/gauntlet/services/store"
)

// stallingModel is a stand-in for an OpenAI-compatible endpoint (outside the product) that
// always answers with the same catalogue search, so a re-run plays the same actions, and
// that stops answering after stallAfter requests (0: never), as a worker's process would
// see its world end mid-step.
type stallingModel struct {
	stallAfter int32
	calls      atomic.Int32
}

func (m *stallingModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	if n := m.calls.Add(1); m.stallAfter > 0 && n > m.stallAfter {
		<-r.Context().Done()
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"choices":[{"message":{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"catalog__search","arguments":"{\"query\":\"mug\"}"}}]}}]}`)
}

// A worker dies in the middle of a lot whose episodes are longer than one segment, after
// publishing some of their segments. Its lease lapses and another worker re-runs the whole
// lot, later than the stream's duplicate window, so the stream keeps both copies of the
// segments the first worker published (the test checks that it did: otherwise it would
// not be testing the case). The store writes both; ClickHouse, read with FINAL, holds each
// episode once, each step once and one end, the re-run's, with no infra error.
func TestLotRerunAfterTheDuplicateWindowIsRecordedOnce(t *testing.T) {
	ch := chtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := bus.NewServer(bus.ServerConfig{StoreDir: t.TempDir(), Port: -1}, log)
	if err := srv.Starting(ctx); err != nil {
		t.Fatalf("start embedded NATS: %v", err)
	}
	t.Cleanup(func() { _ = srv.Stopping(context.Background()) })
	connect := func(name string) *bus.Bus {
		b, err := bus.Connect("", name, log, srv.ConnectOption())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	const window = time.Second
	b := connect("services")
	streams := bus.DefaultStreamConfig()
	streams.DuplicateWindow = window
	if err := b.EnsureStreams(ctx, streams); err != nil {
		t.Fatal(err)
	}
	tel, err := telemetry.New("rerun-test", "")
	if err != nil {
		t.Fatal(err)
	}
	get := func() *bus.Bus { return b }
	rw := reward.New(reward.Config{Subscribers: 1}, get, tel.Meter("reward"), log)
	if err := rw.Starting(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rw.Stopping(context.Background()) })
	st := store.New(store.Config{Addr: ch.Addr, Database: "rerun", BatchRows: 1_000_000, FlushEvery: time.Hour,
		IdleFlush: 100 * time.Millisecond, AckWait: 10 * time.Second}, get, noop.NewMeterProvider().Meter("test"), log)
	if err := st.Starting(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Stopping(context.Background()) })
	sctx, stopStore := context.WithCancel(ctx)
	storeDone := make(chan error, 1)
	go func() { storeDone <- st.Running(sctx) }()
	t.Cleanup(func() { stopStore(); <-storeDone })

	// startWorker runs a worker on its own connection, playing the http policy against m.
	startWorker := func(id string, m *stallingModel) (b *bus.Bus, kill func()) {
		model := httptest.NewServer(m)
		t.Cleanup(model.Close)
		p, err := httppolicy.New(httppolicy.Config{URL: model.URL + "/v1", Model: "m", Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		wb := connect(id)
		w := New(Config{ID: id, Concurrency: 2, ScoreBatch: 64, ScoreRequests: 2, AckWait: 2 * time.Second,
			MaxDeliver: 3, SegmentSteps: 4, Policies: policy.NewSet(p)},
			func() *bus.Bus { return wb }, func() *bus.Bus { return wb }, tel, log)
		if err := w.Starting(ctx); err != nil {
			t.Fatal(err)
		}
		wctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = w.Running(wctx) }()
		var once atomic.Bool
		kill = func() {
			if once.CompareAndSwap(false, true) {
				wb.NC.Close() // the process is gone: nothing of it reaches the server any more
				model.CloseClientConnections()
				stop()
				<-done
			}
		}
		t.Cleanup(kill)
		return wb, kill
	}

	const episodes, steps = 2, 12
	r := &gauntletv1.RunRequested{RunId: "rrerun", Env: "shop", Seed: 8, Episodes: episodes, MaxSteps: steps,
		Policies: []*gauntletv1.Share{{Name: httppolicy.Name, Weight: 1}}}
	// The first worker answers 10 of the 24 steps, then hangs mid-step.
	first := &stallingModel{stallAfter: 10}
	_, killFirst := startWorker("worker-first", first)
	a := &gauntletv1.Assignment{}
	for i := range uint64(episodes) {
		a.Episodes = append(a.Episodes, &gauntletv1.EpisodeAssigned{Episode: runs.Episode(r, i)})
	}
	if err := b.PublishCommand(ctx, bus.SubjectEpisode(r.RunId), r.RunId+"/assigned", a); err != nil {
		t.Fatal(err)
	}
	// It dies once it has published some segments and is stuck in the next step.
	for first.calls.Load() <= first.stallAfter || len(segments(ctx, t, b, r.RunId)) == 0 {
		if ctx.Err() != nil {
			t.Fatalf("the first worker made %d model calls and published no segment", first.calls.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	killFirst()

	// Another worker takes the lot once the lease lapses: later than the window.
	startWorker("worker-second", &stallingModel{})
	db := "rerun"
	conn, err := trajectory.Connect(ctx, ch.Addr(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	want := fmt.Sprint(episodes * steps)
	settled(ctx, t, b)
	// The stream kept the re-run's copies of the segments the first worker had published:
	// the window did not drop them, so the keys below are what makes them one.
	copies := 0
	for _, n := range segments(ctx, t, b, r.RunId) {
		if n > 1 {
			copies++
		}
	}
	if copies == 0 {
		t.Fatal("the stream holds no segment twice: the duplicate window dropped the re-run's copies, and this test needs them kept")
	}
	for _, c := range []struct{ q, want string }{
		// Raw: the first worker's segments and the re-run's copies of them.
		{"SELECT count() > " + want + " FROM " + db + ".steps WHERE run_id = 'rrerun'", "1"},
		{"SELECT count(), uniqExact(episode_id, step), min(step), max(step) FROM " + db + ".steps FINAL WHERE run_id = 'rrerun'",
			fmt.Sprintf("%s %s 0 %d", want, want, steps-1)},
		{"SELECT DISTINCT worker_id FROM " + db + ".steps FINAL WHERE run_id = 'rrerun'", "worker-second"},
		{"SELECT count(), sum(infra_error), groupUniqArray(worker_id)[1] FROM " + db + ".episodes FINAL WHERE run_id = 'rrerun'",
			fmt.Sprintf("%d 0 worker-second", episodes)},
	} {
		_, rows, err := trajectory.Query(ctx, conn, c.q)
		if err != nil {
			t.Fatalf("%s: %v", c.q, err)
		}
		got := ""
		for i, row := range rows {
			if i > 0 {
				got += "; "
			}
			for j, v := range row {
				if j > 0 {
					got += " "
				}
				got += v
			}
		}
		if got != c.want {
			t.Errorf("%s = %q, want %q", c.q, got, c.want)
		}
	}
}

// settled waits until the workers have acknowledged every assignment and the store has
// written every event the stream holds.
func settled(ctx context.Context, t *testing.T, b *bus.Bus) {
	t.Helper()
	kv, err := b.StoreBucket(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for {
		c, err := b.JS.Consumer(ctx, bus.StreamCommands, ConsumerName)
		if err != nil {
			t.Fatal(err)
		}
		ci, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		last, err := b.EventsLastSeq(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var written uint64
		if p, err := bus.GetStoreProgress(ctx, kv); err == nil {
			written = p.GetWrittenSeq()
		}
		if ci.NumPending == 0 && ci.NumAckPending == 0 && written >= last {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("not settled: %d assignments pending, %d unacknowledged; the store has written up to event %d of %d",
				ci.NumPending, ci.NumAckPending, written, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// segments reads the run's events from the events stream and counts the segments it
// holds by episode and first step: a count of 2 is a segment published twice and kept.
func segments(ctx context.Context, t *testing.T, b *bus.Bus, runID string) map[string]int {
	t.Helper()
	cons, err := b.JS.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{bus.SubjectEvent(bus.KindSteps, runID), bus.SubjectEvent(bus.KindEnded, runID)}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := b.JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for seq := uint64(0); seq < info.State.LastSeq; {
		m, err := cons.Next(jetstream.FetchMaxWait(500 * time.Millisecond))
		if errors.Is(err, nats.ErrTimeout) {
			break // nothing more of the run
		}
		if err != nil {
			t.Fatal(err)
		}
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		seq = md.Sequence.Stream
		var ev gauntletv1.Event
		if err := gauntletv1.Unmarshal(m.Data(), &ev); err != nil {
			t.Fatal(err)
		}
		for _, e := range ev.Events() {
			if seg := e.GetSteps(); seg != nil && len(seg.GetSteps()) > 0 {
				got[fmt.Sprintf("%s/%d", seg.GetSteps()[0].GetEpisodeId(), seg.GetSteps()[0].GetStep())]++
			}
		}
	}
	return got
}
