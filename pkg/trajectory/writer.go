package trajectory

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Writer projects events into the steps, faults, episodes, episode_worlds and plan_templates tables of
// one database. Its only state between calls is the set of templates it has written; it
// is safe for concurrent use.
type Writer struct {
	conn     driver.Conn
	database string
	err      error // a bad database name, reported by every Write

	templates TemplateSource
	written   sync.Map // template id → struct{}: in plan_templates already

	rewardSpecs RewardSpecSource
	specsDone   sync.Map // spec digest → struct{}: in reward_specs already
	// spare keeps up to two scratches between Writes. Not a sync.Pool: the collector
	// empties those within two cycles, and at full speed a store's batches are further
	// apart than that.
	spare chan *scratch
}

// scratch is one Write's working memory, kept for the next: the rows of a batch and the
// values of each column block. A store batch's step rows take megabytes, and a page
// touched for the first time is slow: freshly allocated per Write, just copying the rows
// into that slice showed in the pipeline's profile (docs/benchmarks.md, Costs the code
// cites, Trajectory store).
type scratch struct {
	steps      []StepRow
	stepEvents []*gauntletv1.StepTaken
	stepAt     map[stepKey]int
	episodes   []EpisodeRow
	episodeAt  map[string]int
	faults     []FaultRow
	trainer    []TrainerRow
	worlds     []WorldRow
	worldAt    map[string]int
	// blocks holds, per table, the value slice of each column last appended.
	blocks map[string][]any
	ptrs   elemPtrs
}

// release drops every reference into the written events (their strings alias the
// messages a store batch holds only until it is written) and keeps the capacity.
func (sc *scratch) release() {
	clear(sc.steps)
	clear(sc.stepEvents)
	clear(sc.stepAt)
	clear(sc.episodes)
	clear(sc.episodeAt)
	clear(sc.faults)
	clear(sc.trainer)
	clear(sc.worlds)
	clear(sc.worldAt)
	sc.worlds = sc.worlds[:0]
	sc.steps, sc.stepEvents, sc.episodes = sc.steps[:0], sc.stepEvents[:0], sc.episodes[:0]
	sc.faults, sc.trainer = sc.faults[:0], sc.trainer[:0]
	for _, bufs := range sc.blocks {
		for _, b := range bufs {
			if b != nil {
				// To its capacity: a batch's last block is shorter than the ones before.
				v := reflect.ValueOf(b)
				v.Slice(0, v.Cap()).Clear()
			}
		}
	}
}

// buffers returns the column value slices of table, one per column.
func (sc *scratch) buffers(table string, columns int) []any {
	if sc.blocks == nil {
		sc.blocks = make(map[string][]any)
	}
	b := sc.blocks[table]
	if len(b) != columns {
		b = make([]any, columns)
		sc.blocks[table] = b
	}
	return b
}

// TemplateSource finds the templates compact plans name (pkg/faults/templates.Client).
type TemplateSource interface {
	Get(ctx context.Context, id string) (*gauntletv1.FaultPlan, error)
}

// WithTemplates makes Write record the template of every user-defined profile's plan an
// episode names, once, in plan_templates, before the episode's row. Without a source, a
// batch holding such an episode fails.
func (w *Writer) WithTemplates(src TemplateSource) *Writer {
	w.templates = src
	return w
}

// RewardSpecSource finds the reward specs steps name by digest (pkg/rewardspecs.Client).
type RewardSpecSource interface {
	Get(ctx context.Context, digest string) (scoring.Spec, error)
}

// WithRewardSpecs makes Write record every reward spec a step or an episode names, once, in
// reward_specs, before the rows naming it. Without a source, only the built-in spec can be
// recorded, and a batch naming another fails.
func (w *Writer) WithRewardSpecs(src RewardSpecSource) *Writer {
	w.rewardSpecs = src
	return w
}

// Counts says what one Write did.
type Counts struct {
	// Steps, Faults, Episodes and Trainer are the rows inserted into each table
	// (Trainer: trainer_steps).
	Steps, Faults, Episodes, Trainer int
	// Duplicates is how many events were dropped because another event of the same
	// call had the same key ((episode_id, step) for steps, episode_id for ends).
	// Of those, the one kept is the one ReplacingMergeTree would keep: the highest
	// version, and the last one among equals.
	Duplicates int
	// Invalid is how many events could not be projected (nil, no body, no episode
	// id) and were skipped.
	Invalid int
	// Unscored is how many steps were written without their reward vector (their
	// total kept) because their compact score did not fit their segment's score
	// specs; UnscoredErr says why for the first of them.
	Unscored    int
	UnscoredErr error
}

// NewWriter returns a Writer inserting into database, whose tables Migrate created.
func NewWriter(conn driver.Conn, database string) *Writer {
	return &Writer{conn: conn, database: database, err: checkDatabase(database), spare: make(chan *scratch, 2)}
}

// Write inserts the rows projected from events: one row per StepTaken (alone or in a
// StepsTaken segment) into steps, one per step carrying trainer data into trainer_steps,
// one per fired fault into faults, one per EpisodeEnded (alone or ending a segment) into
// episodes, one per start of a world's episode into episode_worlds, each table in one
// batch. Other episode starts produce no rows. Within one call only one event per key
// is kept (see Counts.Duplicates), so batches carry no duplicates; across calls
// ReplacingMergeTree collapses them. An empty events is a no-op.
//
// Write is idempotent: after an error (some tables may have been written), retry with
// the same events.
func (w *Writer) Write(ctx context.Context, events []*gauntletv1.Event) (Counts, error) {
	var n Counts
	if w.err != nil {
		return n, fmt.Errorf("write trajectory: %w", w.err)
	}
	if len(events) == 0 {
		return n, nil
	}
	events = flatten(events)

	nSteps := 0 // sized up front: a StepsTaken segment holds many steps
	for _, ev := range events {
		if seg := ev.GetSteps(); seg != nil {
			nSteps += len(seg.GetSteps())
		} else if ev.GetStep() != nil {
			nSteps++
		}
	}
	var sc *scratch
	select {
	case sc = <-w.spare:
	default:
		sc = &scratch{stepAt: make(map[stepKey]int, nSteps), episodeAt: make(map[string]int), worldAt: make(map[string]int)}
	}
	var (
		steps      = slices.Grow(sc.steps, nSteps)
		stepEvents = slices.Grow(sc.stepEvents, nSteps)
		stepAt     = sc.stepAt
		episodes   = sc.episodes
		episodeAt  = sc.episodeAt
	)
	defer func() {
		// Back to sc as they ended up, grown or not, cleared, for the next Write.
		sc.steps, sc.stepEvents, sc.episodes = steps, stepEvents, episodes
		sc.release()
		select {
		case w.spare <- sc:
		default:
		}
	}()
	// seg is the step's segment, nil for a lone step.
	addStep := func(seg *gauntletv1.StepsTaken, s *gauntletv1.StepTaken) {
		if s == nil || s.GetEpisodeId() == "" {
			n.Invalid++
			return
		}
		score, err := seg.ScoreOf(s)
		if err != nil {
			n.Unscored++
			if n.UnscoredErr == nil {
				n.UnscoredErr = fmt.Errorf("episode %s: %w", s.GetEpisodeId(), err)
			}
		}
		row := newStepRow(s, score)
		k := stepKey{row.EpisodeID, row.Step}
		if i, dup := stepAt[k]; dup {
			n.Duplicates++
			if row.Version >= steps[i].Version { // as ReplacingMergeTree would choose
				steps[i], stepEvents[i] = row, s
			}
			return
		}
		stepAt[k] = len(steps)
		steps = append(steps, row)
		stepEvents = append(stepEvents, s)
	}
	// A start makes a row only for a world's episode: which world file it played.
	addStart := func(s *gauntletv1.EpisodeStarted) {
		row, ok := worldRowOf(s)
		if !ok {
			return
		}
		if i, dup := sc.worldAt[row.EpisodeID]; dup {
			if row.Version >= sc.worlds[i].Version {
				sc.worlds[i] = row
			}
			return
		}
		sc.worldAt[row.EpisodeID] = len(sc.worlds)
		sc.worlds = append(sc.worlds, row)
	}
	addEpisode := func(e *gauntletv1.EpisodeEnded) error {
		if e == nil || e.GetEpisode().GetEpisodeId() == "" {
			n.Invalid++
			return nil
		}
		row, err := newEpisodeRow(e)
		if err != nil {
			return fmt.Errorf("write trajectory: %w", err)
		}
		if i, dup := episodeAt[row.EpisodeID]; dup {
			n.Duplicates++
			if row.Version >= episodes[i].Version {
				episodes[i] = row
			}
			return nil
		}
		episodeAt[row.EpisodeID] = len(episodes)
		episodes = append(episodes, row)
		return nil
	}
	for _, ev := range events {
		switch body := ev.GetBody().(type) {
		case *gauntletv1.Event_Step:
			addStep(nil, body.Step)
		case *gauntletv1.Event_Steps:
			seg := body.Steps
			if len(seg.GetSteps()) == 0 && seg.GetEnded() == nil {
				n.Invalid++
			}
			for _, st := range seg.GetSteps() {
				addStep(seg, st)
			}
			if seg.GetStarted() != nil {
				addStart(seg.GetStarted())
			}
			if seg.GetEnded() != nil {
				if err := addEpisode(seg.GetEnded()); err != nil {
					return n, err
				}
			}
		case *gauntletv1.Event_Ended:
			if err := addEpisode(body.Ended); err != nil {
				return n, err
			}
		case *gauntletv1.Event_Started:
			// An episode's row comes from its end; a world's start says which world.
			addStart(body.Started)
		default:
			n.Invalid++
		}
	}

	// Faults are derived from the kept steps, so duplicates drop out with them.
	nFaults := 0
	for _, st := range stepEvents {
		nFaults += len(st.GetFaults())
	}
	faults := slices.Grow(sc.faults, nFaults)
	trainer := sc.trainer
	for _, s := range stepEvents {
		faults = appendFaultRows(faults, s)
		trainer = appendTrainerRow(trainer, s)
	}
	sc.faults, sc.trainer = faults, trainer

	// A spec before the first row naming it, so every recorded total can be rebuilt.
	specs, err := w.newRewardSpecs(ctx, steps, episodes)
	if err != nil {
		return n, err
	}
	if err := insert(ctx, w.conn, w.database, "reward_specs", rewardSpecColumns, specs, sc); err != nil {
		return n, err
	}
	for _, r := range specs {
		w.specsDone.Store(r.Digest, struct{}{})
	}
	if err := insert(ctx, w.conn, w.database, "steps", stepColumns, steps, sc); err != nil {
		return n, err
	}
	n.Steps = len(steps)
	if err := insert(ctx, w.conn, w.database, "faults", faultColumns, faults, sc); err != nil {
		return n, err
	}
	n.Faults = len(faults)
	if err := insert(ctx, w.conn, w.database, "trainer_steps", trainerColumns, trainer, sc); err != nil {
		return n, err
	}
	n.Trainer = len(trainer)
	// A template before the first episode naming it, so every recorded plan can be expanded.
	tmpls, err := w.newTemplates(ctx, episodes)
	if err != nil {
		return n, err
	}
	if err := insert(ctx, w.conn, w.database, "plan_templates", templateColumns, tmpls, sc); err != nil {
		return n, err
	}
	for _, t := range tmpls {
		w.written.Store(strings.Clone(t.Template), struct{}{}) // not the batch's memory
	}
	if err := insert(ctx, w.conn, w.database, "episode_worlds", worldColumns, sc.worlds, sc); err != nil {
		return n, err
	}
	if err := insert(ctx, w.conn, w.database, "episodes", episodeColumns, episodes, sc); err != nil {
		return n, err
	}
	n.Episodes = len(episodes)
	return n, nil
}

// newTemplates returns the rows of the templates episodes name that this Writer has not
// written yet.
func (w *Writer) newTemplates(ctx context.Context, episodes []EpisodeRow) ([]TemplateRow, error) {
	var rows []TemplateRow
	for i := range episodes {
		id := episodes[i].PlanTemplate
		if id == "" {
			continue
		}
		if _, done := w.written.Load(id); done || slices.ContainsFunc(rows, func(r TemplateRow) bool { return r.Template == id }) {
			continue
		}
		if w.templates == nil {
			return nil, fmt.Errorf("write trajectory: episode %s: plan template %s: this writer has no template source", episodes[i].EpisodeID, id)
		}
		t, err := w.templates.Get(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("write trajectory: episode %s: %w", episodes[i].EpisodeID, err)
		}
		plan, err := canonicalJSON(t)
		if err != nil {
			return nil, fmt.Errorf("write trajectory: plan template %s: %w", id, err)
		}
		rows = append(rows, TemplateRow{Template: id, Profile: t.GetProfile(), CatalogueVersion: t.GetCatalogueVersion(), Plan: plan, Version: 1})
	}
	return rows, nil
}

// newRewardSpecs returns the rows of the reward specs steps and episodes name that this
// Writer has not written yet. An episode's steps name one spec, so consecutive rows are
// checked once.
func (w *Writer) newRewardSpecs(ctx context.Context, steps []StepRow, episodes []EpisodeRow) ([]RewardSpecRow, error) {
	var rows []RewardSpecRow
	last := ""
	need := func(digest, episode string) error {
		if digest == "" || digest == last {
			return nil
		}
		last = digest
		if _, done := w.specsDone.Load(digest); done || slices.ContainsFunc(rows, func(r RewardSpecRow) bool { return r.Digest == digest }) {
			return nil
		}
		var spec scoring.Spec
		switch {
		case digest == scoring.DefaultDigest():
			spec = scoring.SpecFor("")
		case w.rewardSpecs == nil:
			return fmt.Errorf("write trajectory: episode %s: reward spec %s: this writer has no reward spec source", episode, digest)
		default:
			var err error
			if spec, err = w.rewardSpecs.Get(ctx, digest); err != nil {
				return fmt.Errorf("write trajectory: episode %s: %w", episode, err)
			}
		}
		rows = append(rows, NewRewardSpecRow(spec)) // the spec's own strings, not the batch's
		return nil
	}
	for i := range steps {
		if err := need(steps[i].RewardSpecDigest, steps[i].EpisodeID); err != nil {
			return nil, err
		}
	}
	for i := range episodes {
		if err := need(episodes[i].RewardSpecDigest, episodes[i].EpisodeID); err != nil {
			return nil, err
		}
	}
	return rows, nil
}

// flatten replaces each EventBatch in events by the events it carries (one level: a batch
// nested in a batch stays, and counts as invalid). Without batches it returns events.
func flatten(events []*gauntletv1.Event) []*gauntletv1.Event {
	n, batches := 0, false
	for _, ev := range events {
		if b := ev.GetBatch(); b != nil {
			n += len(b.GetEvents())
			batches = true
		} else {
			n++
		}
	}
	if !batches {
		return events
	}
	flat := make([]*gauntletv1.Event, 0, n)
	for _, ev := range events {
		if b := ev.GetBatch(); b != nil {
			flat = append(flat, b.GetEvents()...)
		} else {
			flat = append(flat, ev)
		}
	}
	return flat
}

// RowsOf is how many step and episode rows an event projects to (its fault and trainer
// rows not counted): the store sizes its batches by it, since one event may carry one row,
// a whole episode or a batch of episodes.
func RowsOf(ev *gauntletv1.Event) int {
	switch b := ev.GetBody().(type) {
	case *gauntletv1.Event_Step, *gauntletv1.Event_Ended:
		return 1
	case *gauntletv1.Event_Steps:
		n := len(b.Steps.GetSteps())
		if b.Steps.GetEnded() != nil {
			n++
		}
		return n
	case *gauntletv1.Event_Batch:
		n := 0
		for _, e := range b.Batch.GetEvents() {
			if e.GetBatch() == nil { // a nested batch projects to nothing
				n += RowsOf(e)
			}
		}
		return n
	}
	return 0
}

// EncodedRows is RowsOf for an encoded Event, read off the wire without decoding it: the
// store counts its batches with it while the events stay encoded until their Write. It
// fails when data is not a well-formed Event at the levels it reads.
func EncodedRows(data []byte) (int, error) {
	rows, err := encodedRows(data, true)
	if err != nil {
		return 0, fmt.Errorf("event: %w", err)
	}
	return rows, nil
}

// encodedRows counts an encoded Event's rows; batch says whether a batch may be read
// (a batch's events may not be batches themselves).
func encodedRows(data []byte, batch bool) (int, error) {
	rows := 0
	err := gauntletv1.ScanFields(data, func(num protowire.Number, typ protowire.Type, v []byte) error {
		switch num {
		case 2, 3: // step, ended
			rows++
		case 4: // steps: a segment
			return gauntletv1.ScanFields(v, func(num protowire.Number, _ protowire.Type, _ []byte) error {
				if num == 1 || num == 3 { // a step, the end
					rows++
				}
				return nil
			})
		case 5: // batch: its events
			if !batch {
				return nil
			}
			return gauntletv1.ScanFields(v, func(num protowire.Number, _ protowire.Type, ev []byte) error {
				if num != 1 {
					return nil
				}
				n, err := encodedRows(ev, false)
				rows += n
				return err
			})
		}
		return nil
	})
	return rows, err
}

// blockRows is how many rows go into one native block of a batch. The server squashes
// the blocks of one INSERT into parts of up to a million rows, so the tables see one
// insert either way; but the client reuses one block's buffers instead of growing
// them to the size of the whole batch, and the server works on one block while the
// client builds the next, which BenchmarkWriteSteps shows (docs/benchmarks.md, Costs the
// code cites, Trajectory store).
const blockRows = 10_000

type stepKey struct {
	episodeID string
	step      uint32
}

// insert sends rows to database.table in one native batch, a whole column at a time.
// The INSERT names its columns: that is the only insert that works on 18.16 (an
// INSERT ... VALUES through Exec hangs there) and it keeps old writers working when
// a migration adds columns.
func insert[R any](ctx context.Context, conn driver.Conn, database, table string, cols []column[R], rows []R, sc *scratch) error {
	if len(rows) == 0 {
		return nil
	}
	bufs := sc.buffers(table, len(cols))
	target := database + "." + table
	batch, err := conn.PrepareBatch(ctx, "INSERT INTO "+target+" ("+columnList(cols)+")")
	if err != nil {
		return fmt.Errorf("insert into %s: prepare batch: %w", target, err)
	}
	for start := 0; start < len(rows); start += blockRows {
		block := rows[start:min(start+blockRows, len(rows))]
		for i, c := range cols {
			bufs[i] = c.values(block, bufs[i])
			if err := appendColumn(batch.Column(i), bufs[i], &sc.ptrs); err != nil {
				_ = batch.Abort()
				return fmt.Errorf("insert into %s: append column %s: %w", target, c.name, err)
			}
		}
		if start+len(block) == len(rows) {
			break
		}
		if err := batch.Flush(); err != nil {
			_ = batch.Abort()
			return fmt.Errorf("insert into %s: send block: %w", target, err)
		}
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("insert into %s: send %d rows: %w", target, len(rows), err)
	}
	return nil
}

// appendColumn appends a block's values to one column of a batch. clickhouse-go appends
// a slice of arrays by reflection, element by element, each boxed through
// reflect.Value.Interface; given one array at a time it takes a typed path instead, and
// given each array as pointers to its elements it boxes nothing per element (a pointer
// fits in an interface; a string or a float64 is copied to the heap). The reflective path
// was a visible share of gauntlet's CPU, nearly all of it in the nine array columns of
// steps (docs/benchmarks.md, Costs the code cites, Trajectory store). ptrs is a scratch of pointers kept between calls.
func appendColumn(col driver.BatchColumn, values any, ptrs *elemPtrs) error {
	switch v := values.(type) {
	case [][]string:
		return appendArrays(col, v, &ptrs.strings)
	case [][]float64:
		return appendArrays(col, v, &ptrs.floats)
	}
	return col.Append(values)
}

// elemPtrs holds the pointer slices appendArrays passes, reused from row to row.
type elemPtrs struct {
	strings []*string
	floats  []*float64
}

// appendArrays appends each of rows to the Array column col, as pointers to its
// elements (clickhouse-go copies the values at once), through the scratch *ptrs, which
// it leaves empty and holding no pointers.
func appendArrays[V any](col driver.BatchColumn, rows [][]V, ptrs *[]*V) error {
	p := *ptrs
	defer func() {
		clear(p[:cap(p)]) // every row's pointers, not only the last row's
		*ptrs = p[:0]
	}()
	// Boxed once: most rows of the violation, safety and fault arrays are empty, and
	// boxing a slice costs an allocation.
	var empty any = []*V{}
	for _, r := range rows {
		if len(r) == 0 {
			if err := col.AppendRow(empty); err != nil {
				return err
			}
			continue
		}
		p = p[:0]
		for i := range r {
			p = append(p, &r[i])
		}
		if err := col.AppendRow(p); err != nil {
			return err
		}
	}
	return nil
}
