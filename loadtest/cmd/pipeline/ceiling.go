package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/play"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// corpus is the events the ceiling writes: what the workers of a real run would publish,
// generated in this process before any timing.
type corpus struct {
	events   []*gauntletv1.Event
	episodes int
	steps    int
	faults   int
	// GenSeconds is how long generating took; StepsPerSec is the in-process rate of
	// env + policy + faults + scoring + event building on one goroutine.
	GenSeconds float64
}

// segmentSteps is the worker's default --worker.segment-steps.
const segmentSteps = 32

// generate runs episodes of the same kind of run the pipeline is given (shop, policyName,
// the demo's default profile mix) until at least minSteps steps are recorded, building the
// events exactly as services/worker does: StepsTaken segments of up to segmentSteps steps
// each scored with pkg/scoring, the first carrying the start and the last the end with the
// fault plan (play.Segmenter). Fault plans come from pkg/faults/plans as services/faults derives
// them, and the ends carry them compact, as the worker does.
func generate(ctx context.Context, policyName string, minSteps int) (*corpus, error) {
	req := &gauntletv1.RunRequested{
		RunId: runs.NewID(), Env: "shop", ParamsJson: "{}",
		Policies: []*gauntletv1.Share{{Name: policyName, Weight: 1}},
		Episodes: runs.MaxEpisodes, Seed: 1, MaxInFlight: 10_000,
		RequestedAtUnixNano: time.Now().UnixNano(), Label: "loadtest-ceiling",
	}
	// The demo's --profiles default.
	mix, err := runs.ParseShares("--profiles", "baseline=60,stress=25,edge=15")
	if err != nil {
		return nil, err
	}
	req.Profiles = mix
	if err := runs.Validate(req); err != nil {
		return nil, fmt.Errorf("ceiling run: %w", err)
	}
	e, err := env.Lookup(req.Env)
	if err != nil {
		return nil, err
	}
	pol, err := policy.Lookup(policyName)
	if err != nil {
		return nil, err
	}
	spec := scoring.SpecFor(req.Env)
	services := e.Spec().Services
	workerID := fmt.Sprintf("w-%08x", rng.Derive(uint64(req.RequestedAtUnixNano), "worker")>>32)

	c := &corpus{}
	t0 := time.Now()
	for index := uint64(0); c.steps < minSteps; index++ {
		if index%1000 == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		ep := runs.Episode(req, index)
		// services/faults/faults.go: Service.Plan.
		profile, err := plans.ChooseProfile(rng.Derive(ep.Seed, "profile"), req.Profiles)
		if err != nil {
			return nil, fmt.Errorf("choose profile: %w", err)
		}
		plan, err := plans.Derive(rng.Derive(ep.Seed, "faults"), profile, services)
		if err != nil {
			return nil, fmt.Errorf("plan: %w", err)
		}
		// Recorded by reference, as the faults service hands plans out (plans.Compact).
		ref, err := plans.Compact(plan, "")
		if err != nil {
			return nil, fmt.Errorf("plan: %w", err)
		}
		if err := c.play(ctx, pol, spec, workerID, ep, ref); err != nil {
			return nil, err
		}
	}
	c.GenSeconds = time.Since(t0).Seconds()
	return c, nil
}

// play plays one episode through pkg/play as services/worker does, with the reward
// service replaced by a direct call of the same pure function (play.LocalScorer) and the
// bus replaced by c.events; the segments come from the same play.Segmenter the worker
// publishes through.
func (c *corpus) play(ctx context.Context, pol policy.Policy, spec scoring.Spec, workerID string, req *gauntletv1.EpisodeRequested, ref *gauntletv1.FaultPlan) error {
	out := &corpusOut{c: c, seg: play.Segmenter{Max: segmentSteps, Emit: func(ev *gauntletv1.Event) error {
		c.events = append(c.events, ev)
		return nil
	}}}
	sess := play.NewSession(&gauntletv1.EpisodeAssigned{Episode: req, Plan: ref}, workerID, play.LocalScorer{Spec: spec}, out)
	defer func() { _ = sess.Close() }()
	e, err := sess.Prepare(ctx, play.Deps{})
	if err != nil {
		return fmt.Errorf("episode %s: %w", req.EpisodeId, err)
	}
	agent, err := pol.NewAgent(e, rng.Derive(req.Seed, "policy"))
	if err != nil {
		return fmt.Errorf("policy %s: %w", req.Policy, err)
	}
	obs, err := sess.Reset(ctx, 1)
	if err != nil {
		return err
	}
	if err := sess.Run(ctx, agent, env.Turn{Observation: obs}); err != nil {
		return err
	}
	if err := sess.Finish(ctx); err != nil {
		return err
	}
	c.episodes++
	return nil
}

// corpusOut is the ceiling's play.Output: the worker's segments, kept in the corpus.
type corpusOut struct {
	c   *corpus
	seg play.Segmenter
}

func (o *corpusOut) Start(_ context.Context, st *gauntletv1.EpisodeStarted) error {
	o.seg.Start(st)
	return nil
}

func (o *corpusOut) Step(_ context.Context, st *gauntletv1.StepTaken) error {
	if err := o.seg.Step(st); err != nil {
		return err
	}
	o.c.steps++
	o.c.faults += len(st.Faults)
	return nil
}

func (o *corpusOut) Flush() error { return o.seg.Flush() }

func (o *corpusOut) End(_ context.Context, e *gauntletv1.EpisodeEnded) error { return o.seg.End(e) }

// batches cuts the corpus into the store's batch shape: each batch closes at the first
// event that brings it to batchRows step and episode rows (trajectory.RowsOf), as the
// store's do. A real store batch holds the interleaved events of thousands of episodes in
// flight, so each batch's events are shuffled (with a fixed seed) instead of kept episode
// by episode.
func (c *corpus) batches(batchRows int) [][]*gauntletv1.Event {
	var out [][]*gauntletv1.Event
	r := rand.New(rand.NewPCG(1, 2))
	var cur []*gauntletv1.Event
	rows := 0
	cut := func() {
		r.Shuffle(len(cur), func(i, j int) { cur[i], cur[j] = cur[j], cur[i] })
		out = append(out, cur)
		cur, rows = nil, 0
	}
	for _, ev := range c.events {
		cur = append(cur, ev)
		if rows += trajectory.RowsOf(ev); rows >= batchRows {
			cut()
		}
	}
	if len(cur) > 0 {
		cut()
	}
	return out
}

// encodedBatch is one batch as the store receives it: protobuf messages off the stream.
type encodedBatch [][]byte

// encode marshals the corpus's batches and drops the decoded events. Holding half a
// million decoded steps would give the ceiling's Writes a live heap (and so GC work)
// many times what the store ever holds, which is one batch filling and one writing.
func (c *corpus) encode(batchRows int) ([]encodedBatch, error) {
	var out []encodedBatch
	for _, b := range c.batches(batchRows) {
		eb := make(encodedBatch, len(b))
		for i, ev := range b {
			var err error
			if eb[i], err = gauntletv1.Marshal(ev); err != nil { // as the worker encodes them
				return nil, fmt.Errorf("marshal event: %w", err)
			}
		}
		out = append(out, eb)
	}
	c.events = nil
	return out, nil
}

// decode unmarshals one batch, as the store's reader does before a Write (the same
// decoder, so the Write reads events laid out in memory as the store's are).
func (b encodedBatch) decode() ([]*gauntletv1.Event, error) {
	out := make([]*gauntletv1.Event, len(b))
	for i, data := range b {
		var ev gauntletv1.Event
		if err := gauntletv1.UnmarshalStepsInBlocks(data, &ev); err != nil {
			return nil, fmt.Errorf("unmarshal event: %w", err)
		}
		out[i] = &ev
	}
	return out, nil
}

// ceilingResult is one timed pass of the corpus through trajectory.Writer.
type ceilingResult struct {
	Database    string  `json:"database"`
	Episodes    int     `json:"episodes"`
	Events      int     `json:"events"`
	Writes      int     `json:"writes"`
	BatchEvents int     `json:"batch_events"` // events in the first batch
	StepRows    int     `json:"step_rows"`
	FaultRows   int     `json:"fault_rows"`
	EpisodeRows int     `json:"episode_rows"`
	Seconds     float64 `json:"seconds"`
	// StepRowsPerSec is the headline: step rows per second of Write.
	StepRowsPerSec  float64   `json:"step_rows_per_sec"`
	TotalRowsPerSec float64   `json:"total_rows_per_sec"`
	WriteSeconds    []float64 `json:"write_seconds"`
	Window          window    `json:"window"`
}

// measureCeiling writes every batch, in order, into a fresh database and times only the
// Write calls (each batch is decoded, untimed, just before its Write, as the store does).
func measureCeiling(ctx context.Context, addr, database string, batches []encodedBatch, episodes int, procs procSet) (ceilingResult, error) {
	r := ceilingResult{Database: database, Episodes: episodes, Writes: len(batches)}
	if len(batches) > 0 {
		r.BatchEvents = len(batches[0])
	}
	conn, err := trajectory.Connect(ctx, addr, database)
	if err != nil {
		return r, err
	}
	defer conn.Close()
	if err := trajectory.Migrate(ctx, conn, database); err != nil {
		return r, err
	}
	w := trajectory.NewWriter(conn, database)
	win := startWindow(procs)
	var total time.Duration
	for _, eb := range batches {
		b, err := eb.decode()
		if err != nil {
			return r, err
		}
		t0 := time.Now()
		n, err := w.Write(ctx, b)
		d := time.Since(t0)
		if err != nil {
			return r, fmt.Errorf("ceiling: write %d events into %s: %w", len(b), database, err)
		}
		total += d
		r.WriteSeconds = append(r.WriteSeconds, d.Seconds())
		r.Events += len(b)
		r.StepRows += n.Steps
		r.FaultRows += n.Faults
		r.EpisodeRows += n.Episodes
	}
	r.Window = win.end()
	r.Seconds = total.Seconds()
	r.StepRowsPerSec = float64(r.StepRows) / r.Seconds
	r.TotalRowsPerSec = float64(r.StepRows+r.FaultRows+r.EpisodeRows) / r.Seconds
	return r, nil
}
