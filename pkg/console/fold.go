package console

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/runs"
)

// A run's report and its fault heatmap summarise every episode of the run. Read with the
// SQL of reader.go, each look at a run of a million episodes reads its million episodes
// with FINAL, and its faults, again: seconds of ClickHouse per answer, and the kept
// answers of a run in flight are refreshed every few seconds, so those reads took most
// of ClickHouse while the run was writing (docs/benchmarks.md, the console probe).
//
// For a run the scheduler planned, the console folds instead: episodes are numbered 0
// to planned-1 under ids that sort as their indices (runs.EpisodeID), and end roughly in
// that order. The fold keeps, in memory, the sums of the episodes of index below a
// watermark, moved on a chunk of foldChunk episodes at a time once the chunk has ended;
// each answer reads, by the episodes' and faults' keys, only the episodes at or past the
// watermark and the few below it that were not folded. Nothing is written, so the
// store's write path pays nothing (the pre-aggregation filled by the store cost the
// pipeline up to 30 % of its throughput).
//
// The answers equal reader.go's: an episode is folded only once its end is final. An
// ended, scored episode is: its later copies (redeliveries, a stale infra-error end of
// an episode retried after it) carry its version or a lower one, so FINAL keeps it. An
// infra error is not (the scheduler retries the episode under the same id, and the
// retry's end supersedes it), nor is an episode that has not ended when its chunk is
// folded (a straggler): both are kept apart by id, pending, and read by key with every
// answer until they end scored.
const (
	// foldChunk is how many episodes the watermark moves by.
	foldChunk = 4096
	// foldAhead: a chunk with episodes still missing is folded once an episode this many
	// chunks past it has ended; its missing episodes become pending.
	foldAhead = 2
	// maxPending bounds the pending episodes of a fold; the watermark waits rather than
	// exceed it.
	maxPending = 2000
	// maxFolded bounds the planned size of a folded run: episode ids sort as their
	// indices while these have 7 digits (runs.EpisodeID).
	maxFolded = 10_000_000
	// maxFolds bounds the runs folded at once; the least recently read goes first.
	maxFolds = 8
)

// foldedEpisode is what the fold keeps of a folded episode: what the reward histogram
// and the chart over episode index need of it (the sums are kept apart).
type foldedEpisode struct {
	reward  float64
	ended   uint32 // unix seconds
	success bool
	folded  bool // false: pending, or not folded yet
}

// cellKey is a heatmap cell: a fault kind and a service.
type cellKey struct{ kind, service string }

// tally is how a set of scored episodes did.
type tally struct {
	episodes, successes uint64
	reward              float64
}

func (t *tally) add(e foldRow) {
	t.episodes++
	if e.success {
		t.successes++
	}
	t.reward += e.reward
}

// foldSums are the sums over a set of episodes every answer needs.
type foldSums struct {
	env                      string
	episodes, successes      uint64
	steps, infra             uint64
	reward                   float64
	infraKinds               map[string]uint64
	first, last              time.Time
	kinds                    map[string]*tally
	cells                    map[cellKey]*tally
	noFault                  tally
	anyEpisode, anyFirstLast bool
}

func newFoldSums() *foldSums {
	return &foldSums{infraKinds: map[string]uint64{}, kinds: map[string]*tally{}, cells: map[cellKey]*tally{}}
}

// add adds episode e, with the fault cells it met, to s.
func (s *foldSums) add(e foldRow, cells []cellKey) {
	if !s.anyEpisode {
		s.env, s.anyEpisode = e.env, true
	}
	s.episodes++
	s.steps += uint64(e.steps)
	s.reward += e.reward
	if !s.anyFirstLast || e.started.Before(s.first) {
		s.first = e.started
	}
	if !s.anyFirstLast || e.ended.After(s.last) {
		s.last = e.ended
	}
	s.anyFirstLast = true
	if e.success {
		s.successes++
	}
	if e.infra {
		s.infra++
		s.infraKinds[e.infraKind]++
		return
	}
	if e.faultsFired == 0 {
		s.noFault.add(e)
	}
	seen := map[string]bool{}
	for _, c := range cells {
		t := s.cells[c]
		if t == nil {
			t = &tally{}
			s.cells[c] = t
		}
		t.add(e)
		if !seen[c.kind] {
			seen[c.kind] = true
			k := s.kinds[c.kind]
			if k == nil {
				k = &tally{}
				s.kinds[c.kind] = k
			}
			k.add(e)
		}
	}
}

// merge returns s and o summed, leaving both as they were.
func (s *foldSums) merge(o *foldSums) *foldSums {
	out := newFoldSums()
	for _, x := range []*foldSums{s, o} {
		if x.anyEpisode && !out.anyEpisode {
			out.env, out.anyEpisode = x.env, true
		}
		out.episodes += x.episodes
		out.successes += x.successes
		out.steps += x.steps
		out.infra += x.infra
		out.reward += x.reward
		for k, n := range x.infraKinds {
			out.infraKinds[k] += n
		}
		if x.anyFirstLast {
			if !out.anyFirstLast || x.first.Before(out.first) {
				out.first = x.first
			}
			if !out.anyFirstLast || x.last.After(out.last) {
				out.last = x.last
			}
			out.anyFirstLast = true
		}
		for k, t := range x.kinds {
			if out.kinds[k] == nil {
				out.kinds[k] = &tally{}
			}
			*out.kinds[k] = tally{out.kinds[k].episodes + t.episodes, out.kinds[k].successes + t.successes, out.kinds[k].reward + t.reward}
		}
		for k, t := range x.cells {
			if out.cells[k] == nil {
				out.cells[k] = &tally{}
			}
			*out.cells[k] = tally{out.cells[k].episodes + t.episodes, out.cells[k].successes + t.successes, out.cells[k].reward + t.reward}
		}
		out.noFault = tally{out.noFault.episodes + x.noFault.episodes, out.noFault.successes + x.noFault.successes, out.noFault.reward + x.noFault.reward}
	}
	return out
}

// foldRow is one episode as the fold reads it (episodes FINAL).
type foldRow struct {
	id             string
	idx            uint64
	env            string
	success, infra bool
	infraKind      string
	reward         float64
	steps          uint32
	faultsFired    uint32
	started, ended time.Time
	version        uint64
}

// runFold is the fold of one planned run. Its lock is held for the whole of a refresh,
// so the run page and the heatmap of one run refresh it one after the other.
type runFold struct {
	mu      sync.Mutex
	runID   string
	planned uint64
	// next is the watermark: every episode of index below it is folded or pending.
	next   uint64
	sums   *foldSums
	folded []foldedEpisode // by index, below next
	// pending are the ids below next not folded: not ended, or ended as infra errors.
	pending map[string]uint64 // id → index
	// infra are the pending infra errors as last read. Each answer reads the other
	// pending episodes (stragglers, near the watermark) again, but these only once
	// recheck has passed since checked: they are scattered over the run (one in a
	// thousand episodes, say), so reading them touches a granule of nearly every part,
	// and one is superseded only when a worker presumed dead ends it after all.
	infra   map[string]foldRow
	checked time.Time
	recheck time.Duration
	// window is how many episodes past the watermark one read takes while whole windows
	// fold (folds.window).
	window uint64
	used   time.Time
}

// foldView is a refreshed fold's answer material: the folded sums plus the live
// episodes (at or past the watermark, and pending), and the per-index episodes the
// histogram and the chart need.
type foldView struct {
	sums   *foldSums
	folded []foldedEpisode
	live   []foldRow
}

// folds are the console's runFolds, by run id.
type folds struct {
	mu   sync.Mutex
	runs map[string]*runFold
	// recheck is how often a fold reads its pending infra errors again (runFold.infra).
	recheck time.Duration
	// window is runFold.window.
	window uint64
}

// infraRecheck is folds.recheck: how stale a run's report may be about an infra error
// superseded by a late end.
const infraRecheck = 30 * time.Second

// foldWindow is folds.window: 65,536 episodes, about 10 MB as read.
const foldWindow = 16 * foldChunk

// get returns the fold of runID, planned episodes, making it if need be.
func (f *folds) get(runID string, planned uint64) *runFold {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.runs == nil {
		f.runs = map[string]*runFold{}
	}
	rf := f.runs[runID]
	if rf == nil || rf.planned != planned {
		if len(f.runs) >= maxFolds {
			var oldest string
			var at time.Time
			for id, r := range f.runs {
				if oldest == "" || r.used.Before(at) {
					oldest, at = id, r.used
				}
			}
			delete(f.runs, oldest)
		}
		rf = &runFold{runID: runID, planned: planned, sums: newFoldSums(), pending: map[string]uint64{},
			infra: map[string]foldRow{}, checked: time.Now(), recheck: f.recheck, window: f.window}
		f.runs[runID] = rf
	}
	rf.used = time.Now()
	return rf
}

// room says whether a run can be folded without forgetting another's fold.
func (f *folds) room() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.runs) < maxFolds
}

const foldColumns = `episode_id, idx, env, success, infra_error, infra_kind, total_reward, steps, faults_fired, started_at, ended_at, version`

// readFold reads the episodes (FINAL) and their faults' cells that where selects, by the
// tables' keys; where is on episode_id, with args.
func (r reader) readFold(ctx context.Context, runID, where string, args ...any) ([]foldRow, map[string][]cellKey, error) {
	all := append([]any{runID}, args...)
	rows, err := r.conn.Query(ctx, r.sql(`SELECT `+foldColumns+` FROM {db}.episodes FINAL WHERE run_id = ? AND `+where), all...)
	if err != nil {
		return nil, nil, fmt.Errorf("run %s fold episodes: %w", runID, err)
	}
	var eps []foldRow
	for rows.Next() {
		var e foldRow
		var success, infra uint8
		if err := rows.Scan(&e.id, &e.idx, &e.env, &success, &infra, &e.infraKind, &e.reward, &e.steps, &e.faultsFired, &e.started, &e.ended, &e.version); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("run %s fold episodes: scan: %w", runID, err)
		}
		e.success, e.infra = success == 1, infra == 1
		eps = append(eps, e)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("run %s fold episodes: %w", runID, err)
	}
	// The faults table is ordered by episode_id: the same bounds read the same episodes'
	// faults. Copies of a fault are identical rows: DISTINCT is enough (runFaults).
	rows, err = r.conn.Query(ctx, r.sql(`SELECT DISTINCT episode_id, kind, splitByChar('/', target)[1]
		FROM {db}.faults WHERE run_id = ? AND `+where), all...)
	if err != nil {
		return nil, nil, fmt.Errorf("run %s fold faults: %w", runID, err)
	}
	defer rows.Close()
	cells := map[string][]cellKey{}
	for rows.Next() {
		var id string
		var c cellKey
		if err := rows.Scan(&id, &c.kind, &c.service); err != nil {
			return nil, nil, fmt.Errorf("run %s fold faults: scan: %w", runID, err)
		}
		cells[id] = append(cells[id], c)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("run %s fold faults: %w", runID, err)
	}
	return eps, cells, nil
}

// superseded returns the ids of infra whose episode has a row of a higher version than
// the one read: a later end. It reads two narrow columns, not the episodes' nor their
// faults'.
func (r reader) superseded(ctx context.Context, runID string, infra map[string]foldRow) ([]string, error) {
	args := make([]any, 0, len(infra)+1)
	args = append(args, runID)
	for id := range infra {
		args = append(args, id)
	}
	rows, err := r.conn.Query(ctx, r.sql(`SELECT episode_id, max(version) FROM {db}.episodes
		WHERE run_id = ? AND episode_id IN (?`+strings.Repeat(", ?", len(infra)-1)+`) GROUP BY episode_id`), args...)
	if err != nil {
		return nil, fmt.Errorf("run %s infra errors superseded: %w", runID, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		var version uint64
		if err := rows.Scan(&id, &version); err != nil {
			return nil, fmt.Errorf("run %s infra errors superseded: scan: %w", runID, err)
		}
		if version > infra[id].version {
			out = append(out, id)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("run %s infra errors superseded: %w", runID, err)
	}
	return out, nil
}

// refresh reads what changed since the last refresh, moves the watermark over the
// chunks that have ended, and calls use with the answer material, under the fold's lock:
// the view shares the fold's per-episode slice, which the next refresh writes.
func (f *runFold) refresh(ctx context.Context, r reader, use func(foldView) error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := make([]string, 0, len(f.pending))
	for id := range f.pending {
		if _, infra := f.infra[id]; !infra {
			ids = append(ids, id)
		}
	}
	if len(f.infra) > 0 && time.Since(f.checked) >= f.recheck {
		f.checked = time.Now()
		superseded, err := r.superseded(ctx, f.runID, f.infra)
		if err != nil {
			return err
		}
		ids = append(ids, superseded...)
	}
	if len(ids) > 0 {
		sort.Strings(ids)
		args := make([]any, len(ids))
		for i, id := range ids {
			args[i] = id
		}
		pend, pendCells, err := r.readFold(ctx, f.runID, `episode_id IN (?`+strings.Repeat(", ?", len(ids)-1)+`)`, args...)
		if err != nil {
			return err
		}
		for _, e := range pend {
			if e.infra {
				f.infra[e.id] = e
				continue
			}
			f.fold(e, pendCells[e.id])
			delete(f.pending, e.id)
			delete(f.infra, e.id)
		}
	}
	// The episodes at or past the watermark: ids of 7 digits from next's, up to the
	// run's ids' end ("-" is followed by "." in ASCII), read a window at a time while
	// whole windows fold (a first look at a large run holds one window in memory, not
	// the run).
	var tail []foldRow
	tailCells := map[string][]cellKey{}
	for {
		from, hi, bounded := f.next, f.runID+".", false
		if f.window > 0 && f.next+f.window < f.planned {
			hi, bounded = runs.EpisodeID(f.runID, f.next+f.window), true
		}
		eps, cells, err := r.readFold(ctx, f.runID, `episode_id >= ? AND episode_id < ?`, runs.EpisodeID(f.runID, from), hi)
		if err != nil {
			return err
		}
		tail = f.advance(eps, cells)
		maps.Copy(tailCells, cells)
		if !bounded {
			break
		}
		if f.next == from+f.window {
			continue
		}
		// The watermark stopped inside the window: the rest of the run is live too.
		more, moreCells, err := r.readFold(ctx, f.runID, `episode_id >= ? AND episode_id < ?`, hi, f.runID+".")
		if err != nil {
			return err
		}
		tail = append(tail, more...)
		maps.Copy(tailCells, moreCells)
		break
	}
	live := make([]foldRow, 0, len(f.infra)+len(tail))
	for _, e := range f.infra {
		live = append(live, e)
	}
	live = append(live, tail...)
	liveSums := newFoldSums()
	for _, e := range live {
		cells := tailCells[e.id]
		liveSums.add(e, cells)
	}
	// Pending infra errors' cells are not needed: an infra error counts in no cell.
	return use(foldView{sums: f.sums.merge(liveSums), folded: f.folded, live: live})
}

// advance moves the watermark over the chunks of tail (the episodes from next on, with
// their cells) that have ended, folding their scored episodes and keeping the rest
// pending, and returns the episodes of tail it left at or past the watermark.
func (f *runFold) advance(tail []foldRow, tailCells map[string][]cellKey) []foldRow {
	slices.SortFunc(tail, func(a, b foldRow) int { return cmp.Compare(a.idx, b.idx) })
	var maxIdx uint64
	for _, e := range tail {
		maxIdx = max(maxIdx, e.idx)
	}
	i := 0 // tail[:i] are below next
	for f.next < f.planned {
		end := min(f.next+foldChunk, f.planned)
		j := i
		for j < len(tail) && tail[j].idx < end {
			j++
		}
		present := uint64(j - i)
		complete := present == end-f.next
		if !complete && (len(tail) == 0 || maxIdx < end+foldAhead*foldChunk) {
			break
		}
		missing := end - f.next - present
		infra := 0
		for _, e := range tail[i:j] {
			if e.infra {
				infra++
			}
		}
		if len(f.pending)+int(missing)+infra > maxPending {
			break
		}
		at := f.next
		for _, e := range tail[i:j] {
			for ; at < e.idx; at++ {
				f.pending[runs.EpisodeID(f.runID, at)] = at
			}
			at = e.idx + 1
			if e.infra {
				f.pending[e.id], f.infra[e.id] = e.idx, e
				continue
			}
			f.fold(e, tailCells[e.id])
		}
		for ; at < end; at++ {
			f.pending[runs.EpisodeID(f.runID, at)] = at
		}
		f.next, i = end, j
	}
	return tail[i:]
}

// fold adds a scored episode, with its cells, to the folded sums.
func (f *runFold) fold(e foldRow, cells []cellKey) {
	f.sums.add(e, cells)
	if e.idx >= uint64(len(f.folded)) {
		n := max(e.idx+1, min(f.planned, uint64(len(f.folded))*2+foldChunk))
		f.folded = append(f.folded, make([]foldedEpisode, n-uint64(len(f.folded)))...)
	}
	f.folded[e.idx] = foldedEpisode{reward: e.reward, ended: uint32(e.ended.Unix()), success: e.success, folded: true}
}

// summary is the run's RunSummary (runSummarySQL's numbers).
func (v foldView) summary(runID string) (RunSummary, error) {
	s := v.sums
	if s.episodes == 0 {
		return RunSummary{}, fmt.Errorf("run %s: %w (no episode of it has ended)", runID, errNotFound)
	}
	out := RunSummary{RunID: runID, Env: s.env, Episodes: s.episodes, Successes: s.successes, Steps: s.steps,
		InfraErrors: s.infra, First: s.first, Last: s.last, Live: !s.last.Before(time.Now().Add(-15 * time.Second))}
	counts := make([]uint64, len(infraKinds))
	for i, k := range infraKinds {
		counts[i] = s.infraKinds[k]
	}
	out.InfraByKind = byKind(counts)
	n := scored(s.episodes, s.infra)
	out.SuccessRate, out.MeanReward = ratio(float64(s.successes), n), ratio(s.reward, n)
	return out, nil
}

// each calls fn with each ended episode's index, whether it is an infra error, its
// success, reward and end (unix seconds).
func (v foldView) each(fn func(idx uint64, infra, success bool, reward float64, ended int64)) {
	for i, e := range v.folded {
		if e.folded {
			fn(uint64(i), false, e.success, e.reward, int64(e.ended))
		}
	}
	for _, e := range v.live {
		fn(e.idx, e.infra, e.success, e.reward, e.ended.Unix())
	}
}

// histogram is RewardHistogram's answer.
func (v foldView) histogram() []Bin {
	var n uint64
	lo, hi := math.Inf(1), math.Inf(-1)
	v.each(func(_ uint64, infra, _ bool, reward float64, _ int64) {
		if !infra {
			n++
			lo, hi = min(lo, reward), max(hi, reward)
		}
	})
	if n == 0 {
		return []Bin{}
	}
	if !(hi > lo) {
		return []Bin{{Lo: lo, Hi: hi, Count: n}}
	}
	width := (hi - lo) / histogramBins
	bins := make([]Bin, histogramBins)
	for i := range bins {
		bins[i] = Bin{Lo: lo + float64(i)*width, Hi: lo + float64(i+1)*width}
	}
	bins[len(bins)-1].Hi = hi
	v.each(func(_ uint64, infra, _ bool, reward float64, _ int64) {
		if !infra {
			bins[min(uint64(math.Floor((reward-lo)/width)), histogramBins-1)].Count++
		}
	})
	return bins
}

// series is Series's answer.
func (v foldView) series() ([]Point, uint64) {
	var n, maxIdx uint64
	v.each(func(idx uint64, _, _ bool, _ float64, _ int64) { n, maxIdx = n+1, max(maxIdx, idx) })
	if n == 0 {
		return []Point{}, 1
	}
	width := max(1, uint64(math.Ceil(float64(maxIdx+1)/seriesPoints)))
	type bucket struct {
		n, infra, succ uint64
		reward         float64
		ended          int64
	}
	buckets := make([]bucket, maxIdx/width+1)
	v.each(func(idx uint64, infra, success bool, reward float64, ended int64) {
		b := &buckets[idx/width]
		b.n++
		if infra {
			b.infra++
		}
		if success {
			b.succ++
		}
		b.reward += reward
		b.ended = max(b.ended, ended)
	})
	points := []Point{}
	for i, b := range buckets {
		if b.n == 0 {
			continue
		}
		p := Point{From: uint64(i) * width, Episodes: b.n, InfraErrors: b.infra, LastEnded: time.Unix(b.ended, 0).UTC()}
		s := scored(b.n, b.infra)
		p.SuccessRate, p.MeanReward = ratio(float64(b.succ), s), ratio(b.reward, s)
		points = append(points, p)
	}
	return points, width
}

// faultKinds is FaultKinds's answer.
func (v foldView) faultKinds() []FaultKind {
	out := []FaultKind{}
	for k, t := range v.sums.kinds {
		out = append(out, FaultKind{Kind: k, Episodes: t.episodes, Successes: t.successes,
			SuccessRate: ratio(float64(t.successes), t.episodes), MeanReward: ratio(t.reward, t.episodes)})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Episodes != out[j].Episodes {
			return out[i].Episodes > out[j].Episodes
		}
		return out[i].Kind < out[j].Kind
	})
	if len(out) > maxFaultKinds {
		out = out[:maxFaultKinds]
	}
	if t := v.sums.noFault; t.episodes > 0 {
		out = append(out, FaultKind{Episodes: t.episodes, Successes: t.successes,
			SuccessRate: ratio(float64(t.successes), t.episodes), MeanReward: ratio(t.reward, t.episodes)})
	}
	return out
}

// heatmap is FaultHeatmap's answer.
func (v foldView) heatmap() []HeatCell {
	out := []HeatCell{}
	for k, t := range v.sums.cells {
		out = append(out, HeatCell{Kind: k.kind, Service: k.service, Episodes: t.episodes, Succeeded: t.successes,
			SuccessRate: float64(t.successes) / float64(t.episodes)})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Service < out[j].Service
	})
	if len(out) > maxHeatmapCells {
		out = out[:maxHeatmapCells]
	}
	return out
}
