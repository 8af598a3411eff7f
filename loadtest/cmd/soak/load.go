package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	connectrpc "connectrpc.com/connect"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
	"github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1/gauntletv1connect"
)

// counters are the actions played so far, shared by the drivers for pacing.
type counters struct {
	big      atomic.Uint64 // big actions the API acknowledged
	api      atomic.Uint64 // env API steps acknowledged
	builtin  atomic.Uint64 // steps of finished built-in runs
	inFlight atomic.Uint64 // expected steps of built-in runs in flight
}

func (c *counters) total() uint64 { return c.api.Load() + c.builtin.Load() }

// builtin submits runs of built-in episodes, keeps up to -runs-in-flight of them open and
// notes each when ClickHouse holds all its episodes.
type builtin struct {
	natsURL  string
	ch       driver.Conn
	env      string
	policies string
	profiles string
	episodes uint64
	inFlight int
	pace     pacer
	c        *counters
	log      *slog.Logger

	mu   sync.Mutex
	runs []runLedger
	open map[string]uint64 // run id → episodes, not yet all in ClickHouse
	// stepsPerEpisode is the mean over finished runs, the expected size of the next.
	stepsPerEpisode float64
	submitErrors    int
}

func (b *builtin) ledger() []runLedger {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]runLedger(nil), b.runs...)
}

func (b *builtin) openRuns() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.open)
}

// loop submits and polls until ctx ends (no new runs after that).
func (b *builtin) loop(ctx context.Context) {
	b.open = map[string]uint64{}
	b.stepsPerEpisode = 10
	seed := uint64(1)
	for ctx.Err() == nil {
		b.poll(ctx)
		b.mu.Lock()
		n := len(b.open)
		expected := uint64(b.stepsPerEpisode * float64(b.episodes))
		b.mu.Unlock()
		if n < b.inFlight && b.pace.submitRun(b.c.big.Load(), b.c.total()+b.c.inFlight.Load()) {
			if err := b.submit(ctx, seed); err != nil {
				b.mu.Lock()
				b.submitErrors++
				b.mu.Unlock()
				b.log.Warn("soak: submit run", "err", err)
			} else {
				seed++
				b.c.inFlight.Add(expected)
				continue
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// submit publishes one run under an id chosen here, retrying the same id (JetStream
// drops a duplicate by its message id) until it is acknowledged, so a run is in the
// ledger exactly when the stack has it.
func (b *builtin) submit(ctx context.Context, seed uint64) error {
	pol, err := runs.ParseShares("--policies", b.policies)
	if err != nil {
		return err
	}
	prof, err := runs.ParseShares("--profiles", b.profiles)
	if err != nil {
		return err
	}
	req := &gauntletv1.RunRequested{RunId: runs.NewID(), Env: b.env, ParamsJson: "{}", Policies: pol,
		Profiles: prof, Episodes: b.episodes, Seed: seed, MaxInFlight: runs.DefaultMaxInFlight,
		RequestedAtUnixNano: time.Now().UnixNano(), Label: "soak"}
	if err := runs.Validate(req); err != nil {
		return fmt.Errorf("invalid run: %w", err)
	}
	for attempt := 0; ; attempt++ {
		err := b.publish(ctx, req)
		if err == nil {
			b.mu.Lock()
			b.runs = append(b.runs, runLedger{ID: req.RunId, Episodes: req.Episodes})
			b.open[req.RunId] = req.Episodes
			b.mu.Unlock()
			return nil
		}
		if attempt > 0 && attempt%30 == 0 {
			b.log.Warn("soak: run not yet acknowledged, retrying", "run", req.RunId, "err", err)
		}
		// Leaving now would leave a run the stack may have but the ledger not: keep the
		// id until acknowledged, even past the end of the load phase.
		time.Sleep(time.Second)
		if attempt > 600 {
			return fmt.Errorf("run %s never acknowledged: %w", req.RunId, err)
		}
	}
}

func (b *builtin) publish(ctx context.Context, req *gauntletv1.RunRequested) error {
	c, err := bus.Connect(b.natsURL, "soak", slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	defer c.Close()
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return c.PublishCommand(pctx, bus.SubjectRun, req.RunId+"/run", req)
}

// poll asks ClickHouse which open runs are complete.
func (b *builtin) poll(ctx context.Context) {
	b.mu.Lock()
	ids := make([]string, 0, len(b.open))
	for id := range b.open {
		ids = append(ids, id)
	}
	b.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
	defer cancel()
	rows, err := b.ch.Query(qctx, `SELECT run_id, uniqExact(episode_id), sum(steps) FROM episodes
		WHERE run_id IN (`+inList(ids)+`) GROUP BY run_id`)
	if err != nil {
		return // ClickHouse may be down (killed): ask again later
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var eps, steps uint64
		if rows.Scan(&id, &eps, &steps) != nil {
			return
		}
		b.mu.Lock()
		if want, ok := b.open[id]; ok && eps >= want {
			delete(b.open, id)
			done := len(b.runs) - len(b.open)
			b.stepsPerEpisode += (float64(steps)/float64(eps) - b.stepsPerEpisode) / float64(done)
			b.c.builtin.Add(steps)
			b.c.inFlight.Store(uint64(len(b.open)) * uint64(b.stepsPerEpisode*float64(b.episodes)))
		}
		b.mu.Unlock()
	}
}

// inList renders ids as a SQL list of string literals, escaped. (A slice bound to one
// placeholder, `IN (?)`, matched no run against ClickHouse 18.16 in this harness's first
// run, so the list is written out.)
func inList(ids []string) string {
	var sb strings.Builder
	for i, id := range ids {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteByte('\'')
		sb.WriteString(strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(id))
		sb.WriteByte('\'')
	}
	return sb.String()
}

// trainers play episodes over the env API, choosing every action themselves; some of
// the actions are big, as the pacer says.
type trainers struct {
	addr      string
	token     func() string
	n         int
	maxSteps  uint32
	bigAction string
	pace      pacer
	c         *counters
	log       *slog.Logger

	mu       sync.Mutex
	episodes []*apiEpisode
	errs     map[string]int // call errors by kind, for the report
	samples  []string       // the first few messages of each kind
	start    time.Time
	// hard ends every call: the soak's own context (an interrupt), where the run's
	// context ends only the stepping.
	hard context.Context
}

func (t *trainers) client() gauntletv1connect.EnvServiceClient {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	auth := connectrpc.UnaryInterceptorFunc(func(next connectrpc.UnaryFunc) connectrpc.UnaryFunc {
		return func(ctx context.Context, req connectrpc.AnyRequest) (connectrpc.AnyResponse, error) {
			req.Header().Set("Authorization", "Bearer "+t.token())
			return next(ctx, req)
		}
	})
	return gauntletv1connect.NewEnvServiceClient(&http.Client{Transport: tr, Timeout: 2 * time.Minute},
		"http://"+t.addr, connectrpc.WithGRPC(), connectrpc.WithInterceptors(auth),
		connectrpc.WithSendMaxBytes(16<<20), connectrpc.WithReadMaxBytes(16<<20))
}

func (t *trainers) noteErr(kind string, err error) {
	t.mu.Lock()
	if t.errs == nil {
		t.errs = map[string]int{}
	}
	t.errs[kind]++
	if t.errs[kind] <= 3 {
		t.samples = append(t.samples, fmt.Sprintf("%s at %s: %.300s", kind, time.Since(t.start).Round(time.Second), err))
	}
	t.mu.Unlock()
}

func (t *trainers) ledger() []apiEpisode {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]apiEpisode, len(t.episodes))
	for i, e := range t.episodes {
		out[i] = *e
	}
	return out
}

func (t *trainers) errors() (map[string]int, []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]int{}
	for k, v := range t.errs {
		out[k] = v
	}
	return out, append([]string(nil), t.samples...)
}

// run starts n trainers and returns when all have finished their episodes after ctx.
func (t *trainers) run(ctx context.Context) {
	t.start = time.Now()
	var wg sync.WaitGroup
	for i := range t.n {
		wg.Go(func() { t.trainer(ctx, i) })
	}
	wg.Wait()
}

var queries = []string{"mug", "lamp", "desk", "chair", "pen", "cable"}

func (t *trainers) trainer(ctx context.Context, i int) {
	cl := t.client()
	small := fmt.Sprintf(`{"query":%q}`, queries[i%len(queries)])
	for seed := uint64(i) << 32; ctx.Err() == nil; seed++ {
		id, ok := t.reset(ctx, cl, seed)
		if !ok {
			continue
		}
		e := &apiEpisode{ID: id}
		t.mu.Lock()
		t.episodes = append(t.episodes, e)
		t.mu.Unlock()
		t.play(ctx, cl, e, small)
	}
}

// reset starts an episode, waiting out a stack that is down.
func (t *trainers) reset(ctx context.Context, cl gauntletv1connect.EnvServiceClient, seed uint64) (string, bool) {
	r, err := cl.Reset(ctx, connectrpc.NewRequest(&gauntletv1.ResetRequest{Env: "shop", Seed: seed,
		Profile: "baseline", MaxSteps: t.maxSteps, Policy: "soak"}))
	if err != nil {
		t.noteErr("reset "+codeOf(err), err)
		sleep(ctx, 250*time.Millisecond)
		return "", false
	}
	return r.Msg.EpisodeId, true
}

// play steps one episode to its end (or Close), noting what the API answered. After
// ctx ends it stops stepping and closes the episode, retrying until the API answers.
func (t *trainers) play(ctx context.Context, cl gauntletv1connect.EnvServiceClient, e *apiEpisode, small string) {
	// A step once sent is waited for past the end of the load (it completes on the
	// server anyway), but not past an interrupt.
	bg := t.hard
	for ctx.Err() == nil {
		args, big := small, t.pace.sendBig(t.c.big.Load(), t.c.total())
		if big {
			args = t.bigAction
		}
		res, err := cl.Step(bg, connectrpc.NewRequest(&gauntletv1.StepRequest{EpisodeId: e.ID,
			Action: &gauntletv1.Action{Tool: "catalog.search", ArgsJson: args}}))
		if err != nil {
			if t.over(e, err) {
				return
			}
			t.mu.Lock()
			e.Unacked++
			t.mu.Unlock()
			sleep(ctx, 250*time.Millisecond)
			continue
		}
		t.mu.Lock()
		e.Acked++
		if big {
			e.Big++
		}
		if res.Msg.Info.GetInfraError() {
			e.InfraSeen++
		}
		ended := res.Msg.Terminated || res.Msg.Truncated
		if ended {
			e.Over = true
		}
		t.mu.Unlock()
		t.c.api.Add(1)
		if big {
			t.c.big.Add(1)
		}
		if ended {
			return
		}
	}
	// Close until answered, up to closeBound: a stack that never answers leaves the
	// episode unclosed, which the accounting reports.
	cctx, cancel := context.WithTimeout(t.hard, closeBound)
	defer cancel()
	for cctx.Err() == nil {
		_, err := cl.Close(cctx, connectrpc.NewRequest(&gauntletv1.CloseRequest{EpisodeId: e.ID}))
		if err == nil {
			t.mu.Lock()
			e.Over = true
			t.mu.Unlock()
			return
		}
		if t.over(e, err) {
			return
		}
		sleep(cctx, 250*time.Millisecond)
	}
	t.mu.Lock()
	e.Unclosed = true
	t.mu.Unlock()
}

// closeBound is how long a trainer tries to close its episode at the end of the load
// (through a restart of gauntlet, which takes seconds).
const closeBound = 3 * time.Minute

// over reports whether err ends the episode for the harness: SERVER_RESTARTED marks it
// cut; any other answer that the episode is over marks it over (the API ended it); a
// transport error or UNAVAILABLE is retried.
func (t *trainers) over(e *apiEpisode, err error) bool {
	t.noteErr("step "+codeOf(err), err)
	var ce *connectrpc.Error
	if !errors.As(err, &ce) {
		return false
	}
	switch ce.Code() {
	case connectrpc.CodeFailedPrecondition:
		t.mu.Lock()
		defer t.mu.Unlock()
		if restarted(ce) {
			e.Cut = true
		} else {
			e.Over = true
		}
		return true
	case connectrpc.CodeNotFound:
		// The API forgot a live episode of its own tenant: a defect the accounting names
		// (an episode from before a restart answers SERVER_RESTARTED instead).
		t.mu.Lock()
		e.Forgotten = true
		t.mu.Unlock()
		return true
	}
	return false
}

func restarted(ce *connectrpc.Error) bool {
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if s := fmt.Sprint(v); strings.Contains(s, "SERVER_RESTARTED") {
				return true
			}
		}
	}
	return strings.Contains(ce.Message(), "server restarted")
}

func codeOf(err error) string {
	var ce *connectrpc.Error
	if errors.As(err, &ce) {
		return ce.Code().String()
	}
	return "transport"
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// eventsStream reads the size of GAUNTLET_EVENTS, over a connection that follows the
// stack through its restarts.
type eventsStream struct {
	url string
	nc  *nats.Conn
}

// size returns the stream's bytes and cap; false when NATS cannot say (gauntlet down).
func (e *eventsStream) size(ctx context.Context) (uint64, int64, bool) {
	if e.nc == nil {
		nc, err := nats.Connect(e.url, nats.Name("soak-sampler"), nats.MaxReconnects(-1),
			nats.ReconnectWait(250*time.Millisecond))
		if err != nil {
			return 0, 0, false
		}
		e.nc = nc
	}
	js, err := jetstream.New(e.nc)
	if err != nil {
		return 0, 0, false
	}
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := js.Stream(qctx, bus.StreamEvents)
	if err != nil {
		return 0, 0, false
	}
	info := s.CachedInfo()
	return info.State.Bytes, info.Config.MaxBytes, true
}

func (e *eventsStream) close() {
	if e.nc != nil {
		e.nc.Close()
	}
}
