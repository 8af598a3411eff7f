package console

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Bounds on what one request reads. Every query carries a LIMIT no larger than these,
// so no request can ask ClickHouse for a table.
const (
	// MaxRuns bounds the runs list.
	MaxRuns = 500
	// MaxEpisodes bounds one page of a run's episodes.
	MaxEpisodes = 1000
	// MaxSteps bounds one page of an episode's steps: a step's recorded values are held
	// to 1 MiB each (play.MaxFieldBytes), so a page is bounded in bytes too.
	MaxSteps = 200
	// histogramBins is how many bins the reward distribution has.
	histogramBins = 20
	// seriesPoints is about how many points the chart over episode index has.
	seriesPoints = 200
	// maxFaultKinds bounds the per fault kind table.
	maxFaultKinds = 200
)

// RunSummary is one run as the runs list and the run page show it.
type RunSummary struct {
	RunID       string  `json:"run_id"`
	Env         string  `json:"env"`
	Episodes    uint64  `json:"episodes"`
	Successes   uint64  `json:"successes"`
	SuccessRate float64 `json:"success_rate"`
	MeanReward  float64 `json:"mean_reward"`
	Steps       uint64  `json:"steps"`
	// InfraErrors is how many of Episodes ended as infra errors: they carry no reward
	// and SuccessRate and MeanReward leave them out, as the run summary and the
	// episodes_scored view do. InfraByKind splits them by what failed
	// (episodes.infra_kind; "unknown" for one recorded before infra errors had kinds);
	// kinds with none are absent.
	InfraErrors uint64            `json:"infra_errors"`
	InfraByKind map[string]uint64 `json:"infra_by_kind"`
	First       time.Time         `json:"first"`
	Last        time.Time         `json:"last"`
	// State is the scheduler's: StateRunning or StateDone; empty when it has no record
	// of the run (runs of env API sessions).
	State string `json:"state,omitempty"`
	// Planned is how many episodes the run plans, from the scheduler's record.
	Planned *uint64 `json:"planned,omitempty"`
	// Live is whether the pages should refresh: the run is in flight (by the
	// scheduler's record), its ended episodes are not all in ClickHouse yet, or, without
	// a record, an episode of the run ended in the last 15 seconds (by
	// ClickHouse's clock): the pages refresh while any run they show is live.
	Live bool `json:"live"`
}

// A run's state, from the scheduler's record.
const (
	StateRunning = "running"
	StateDone    = "done"
)

// runSummarySQL summarises runs from their ended episodes; {db} is the database and
// {where} the filter. A table of runs written at submission would replace this query.
// Rates and means are computed in Go from sums: an empty group has none (not NaN). Its
// last columns count the infra errors of each kind of infraKinds, in that order.
var runSummarySQL = `SELECT run_id, any(env), count(), sum(success), sum(total_reward),
	sum(steps), sum(infra_error), min(started_at), max(ended_at),
	max(ended_at) >= now() - 15` + infraKindColumns() + `
FROM {db}.episodes FINAL {where}
GROUP BY run_id`

// infraKinds are the values episodes.infra_kind takes, in the enum's order: "" for an
// infra error recorded before infra errors said what failed, then each kind's name.
var infraKinds = func() []string {
	nums := make([]int, 0, len(gauntletv1.InfraKind_name))
	for n := range gauntletv1.InfraKind_name {
		nums = append(nums, int(n))
	}
	sort.Ints(nums)
	out := make([]string, len(nums))
	for i, n := range nums {
		out[i] = gauntletv1.InfraKind(n).Name()
	}
	return out
}()

// unknownInfraKind is what InfraByKind calls the kind of an infra error recorded before
// infra errors said what failed.
const unknownInfraKind = "unknown"

// infraKindColumns counts a group's infra errors of each of infraKinds (the kinds are
// the enum's own names, safe to quote).
func infraKindColumns() string {
	var b strings.Builder
	for _, k := range infraKinds {
		fmt.Fprintf(&b, ", countIf(infra_error = 1 AND infra_kind = '%s')", k)
	}
	return b.String()
}

// byKind maps the counts of infraKindColumns to their kinds, leaving out the zeros.
func byKind(counts []uint64) map[string]uint64 {
	out := map[string]uint64{}
	for i, n := range counts {
		if n == 0 {
			continue
		}
		k := infraKinds[i]
		if k == "" {
			k = unknownInfraKind
		}
		out[k] = n
	}
	return out
}

// reader runs the console's queries on one connection.
type reader struct {
	conn     driver.Conn
	database string // checked by trajectory.Connect: letters, digits and underscores
}

func (r reader) sql(q string) string { return strings.ReplaceAll(q, "{db}", r.database) }

func scanSummary(rows driver.Rows) (RunSummary, error) {
	var s RunSummary
	var reward float64
	var live uint8
	kinds := make([]uint64, len(infraKinds))
	dest := []any{&s.RunID, &s.Env, &s.Episodes, &s.Successes, &reward, &s.Steps, &s.InfraErrors, &s.First, &s.Last, &live}
	for i := range kinds {
		dest = append(dest, &kinds[i])
	}
	if err := rows.Scan(dest...); err != nil {
		return s, err
	}
	n := scored(s.Episodes, s.InfraErrors)
	s.SuccessRate, s.MeanReward = ratio(float64(s.Successes), n), ratio(reward, n)
	s.InfraByKind = byKind(kinds)
	s.Live = live == 1
	return s, nil
}

func ratio(sum float64, n uint64) float64 {
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

// scored is how many of n ended episodes, infra of them infra errors, are scored: the
// denominator of every success rate and mean reward the console shows (an infra error
// is not the policy's doing and carries no reward).
func scored(n, infra uint64) uint64 {
	if infra >= n {
		return 0
	}
	return n - infra
}

// Runs returns the limit runs whose last episode ended most recently.
func (r reader) Runs(ctx context.Context, limit int) ([]RunSummary, error) {
	q := strings.Replace(r.sql(runSummarySQL), "{where}", "", 1) + " ORDER BY max(ended_at) DESC, run_id LIMIT ?"
	return r.runs(ctx, q, limit)
}

// RunsExcept returns, as Runs does, the limit runs whose last episode ended most
// recently, leaving out the runs except (sorted). They are left out by the episodes
// table's key (run_id first): ClickHouse reads none of their granules, only those it
// shares with a neighbour.
func (r reader) RunsExcept(ctx context.Context, except []string, limit int) ([]RunSummary, error) {
	if len(except) == 0 {
		return r.Runs(ctx, limit)
	}
	args := make([]any, 0, len(except)+1)
	for _, id := range except {
		args = append(args, id)
	}
	args = append(args, limit)
	where := "WHERE run_id != ?" + strings.Repeat(" AND run_id != ?", len(except)-1)
	q := strings.Replace(r.sql(runSummarySQL), "{where}", where, 1) + " ORDER BY max(ended_at) DESC, run_id LIMIT ?"
	return r.runs(ctx, q, args...)
}

// runs reads the run summaries of runSummarySQL q.
func (r reader) runs(ctx context.Context, q string, args ...any) ([]RunSummary, error) {
	rows, err := r.conn.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	defer rows.Close()
	out := []RunSummary{}
	for rows.Next() {
		s, err := scanSummary(rows)
		if err != nil {
			return nil, fmt.Errorf("list runs: scan: %w", err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	return out, nil
}

// errNotFound is a run or episode with no row.
var errNotFound = errors.New("not found")

// Run returns one run's summary; errNotFound when no episode of it has ended.
func (r reader) Run(ctx context.Context, runID string) (RunSummary, error) {
	q := strings.Replace(r.sql(runSummarySQL), "{where}", "WHERE run_id = ?", 1) + " LIMIT 1"
	rows, err := r.conn.Query(ctx, q, runID)
	if err != nil {
		return RunSummary{}, fmt.Errorf("run %s: %w", runID, err)
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return RunSummary{}, fmt.Errorf("run %s: %w", runID, err)
		}
		return RunSummary{}, fmt.Errorf("run %s: %w (no episode of it has ended)", runID, errNotFound)
	}
	s, err := scanSummary(rows)
	if err != nil {
		return RunSummary{}, fmt.Errorf("run %s: scan: %w", runID, err)
	}
	return s, nil
}

// Bin is one bar of the reward distribution: Count episodes had Lo <= reward < Hi (the
// last bin includes Hi).
type Bin struct {
	Lo    float64 `json:"lo"`
	Hi    float64 `json:"hi"`
	Count uint64  `json:"count"`
}

// RewardHistogram returns the distribution of the run's episode rewards in
// histogramBins equal bins between the lowest and the highest, over the scored episodes
// (an infra error's reward of 0 is no reward).
func (r reader) RewardHistogram(ctx context.Context, runID string) ([]Bin, error) {
	var lo, hi float64
	var n uint64
	if err := r.conn.QueryRow(ctx, r.sql(`SELECT count(), min(total_reward), max(total_reward)
		FROM {db}.episodes FINAL WHERE run_id = ? AND infra_error = 0`), runID).Scan(&n, &lo, &hi); err != nil {
		return nil, fmt.Errorf("run %s reward range: %w", runID, err)
	}
	if n == 0 {
		return []Bin{}, nil
	}
	if !(hi > lo) { // every reward equal: one bin
		return []Bin{{Lo: lo, Hi: hi, Count: n}}, nil
	}
	width := (hi - lo) / histogramBins
	bins := make([]Bin, histogramBins)
	for i := range bins {
		bins[i] = Bin{Lo: lo + float64(i)*width, Hi: lo + float64(i+1)*width}
	}
	bins[len(bins)-1].Hi = hi
	rows, err := r.conn.Query(ctx, r.sql(`SELECT toUInt64(floor((total_reward - (?)) / (?))) AS bin, count()
		FROM {db}.episodes FINAL WHERE run_id = ? AND infra_error = 0 GROUP BY bin ORDER BY bin LIMIT ?`), lo, width, runID, histogramBins+1)
	if err != nil {
		return nil, fmt.Errorf("run %s reward histogram: %w", runID, err)
	}
	defer rows.Close()
	for rows.Next() {
		var bin, count uint64
		if err := rows.Scan(&bin, &count); err != nil {
			return nil, fmt.Errorf("run %s reward histogram: scan: %w", runID, err)
		}
		// The highest reward falls on the upper edge of the last bin.
		bins[min(bin, histogramBins-1)].Count += count
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("run %s reward histogram: %w", runID, err)
	}
	return bins, nil
}

// FaultKind is how episodes that met one fault kind did. Kind "" stands for the
// episodes that met no fault.
type FaultKind struct {
	Kind        string  `json:"kind"`
	Episodes    uint64  `json:"episodes"`
	Successes   uint64  `json:"successes"`
	SuccessRate float64 `json:"success_rate"`
	MeanReward  float64 `json:"mean_reward"`
}

// runFaults selects a run's faults (its id three times as parameters). The faults
// table is ordered by episode_id, not run_id: a filter on run_id alone reads the faults
// of every run. The run's episodes that met a fault, read by the episodes table's key,
// select the faults' key ranges instead. The faults are read without FINAL: copies of a
// fault are identical rows (trajectory's stepVersion), and every read of them takes
// distinct (episode, kind …), so a copy not yet merged away changes nothing.
const runFaults = `run_id = ? AND episode_id IN (SELECT episode_id FROM {db}.episodes WHERE run_id = ? AND faults_fired > 0)`

// FaultKinds returns, for each fault kind fired in the run, the scored episodes (not
// infra errors) where it fired at least once and how they did, most met first; then the
// scored episodes that met no fault.
func (r reader) FaultKinds(ctx context.Context, runID string) ([]FaultKind, error) {
	rows, err := r.conn.Query(ctx, r.sql(`SELECT kind, count(), sum(success), sum(total_reward)
		FROM (SELECT DISTINCT episode_id, kind FROM {db}.faults WHERE `+runFaults+`)
		ANY INNER JOIN (SELECT episode_id, success, total_reward FROM {db}.episodes FINAL WHERE run_id = ? AND infra_error = 0)
		USING episode_id
		GROUP BY kind ORDER BY count() DESC, kind LIMIT ?`), runID, runID, runID, maxFaultKinds)
	if err != nil {
		return nil, fmt.Errorf("run %s per fault kind: %w", runID, err)
	}
	defer rows.Close()
	out := []FaultKind{}
	for rows.Next() {
		var k FaultKind
		var reward float64
		if err := rows.Scan(&k.Kind, &k.Episodes, &k.Successes, &reward); err != nil {
			return nil, fmt.Errorf("run %s per fault kind: scan: %w", runID, err)
		}
		k.SuccessRate, k.MeanReward = ratio(float64(k.Successes), k.Episodes), ratio(reward, k.Episodes)
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("run %s per fault kind: %w", runID, err)
	}
	var none FaultKind
	var reward float64
	if err := r.conn.QueryRow(ctx, r.sql(`SELECT count(), sum(success), sum(total_reward)
		FROM {db}.episodes FINAL WHERE run_id = ? AND faults_fired = 0 AND infra_error = 0`), runID).Scan(&none.Episodes, &none.Successes, &reward); err != nil {
		return nil, fmt.Errorf("run %s episodes without faults: %w", runID, err)
	}
	if none.Episodes > 0 {
		none.SuccessRate, none.MeanReward = ratio(float64(none.Successes), none.Episodes), ratio(reward, none.Episodes)
		out = append(out, none)
	}
	return out, nil
}

// Point is one point of a run's chart: the episodes with index in [From, From+Width).
type Point struct {
	From     uint64 `json:"from"`
	Episodes uint64 `json:"episodes"`
	// InfraErrors is how many of Episodes ended as infra errors; the rates leave them out.
	InfraErrors uint64    `json:"infra_errors"`
	SuccessRate float64   `json:"success_rate"`
	MeanReward  float64   `json:"mean_reward"`
	LastEnded   time.Time `json:"last_ended"`
}

// Series returns the run's success rate and mean reward over episode index, in about
// seriesPoints buckets of equal width (returned as width).
func (r reader) Series(ctx context.Context, runID string) (points []Point, width uint64, err error) {
	var maxIdx, n uint64
	if err := r.conn.QueryRow(ctx, r.sql(`SELECT count(), max(idx) FROM {db}.episodes FINAL WHERE run_id = ?`), runID).Scan(&n, &maxIdx); err != nil {
		return nil, 0, fmt.Errorf("run %s index range: %w", runID, err)
	}
	if n == 0 {
		return []Point{}, 1, nil
	}
	width = max(1, uint64(math.Ceil(float64(maxIdx+1)/seriesPoints)))
	rows, err := r.conn.Query(ctx, r.sql(`SELECT toUInt64(intDiv(idx, ?)) AS b, count(), sum(infra_error), sum(success), sum(total_reward), max(ended_at)
		FROM {db}.episodes FINAL WHERE run_id = ? GROUP BY b ORDER BY b LIMIT ?`), width, runID, seriesPoints+1)
	if err != nil {
		return nil, 0, fmt.Errorf("run %s series: %w", runID, err)
	}
	defer rows.Close()
	points = []Point{}
	for rows.Next() {
		var p Point
		var b, successes uint64
		var reward float64
		if err := rows.Scan(&b, &p.Episodes, &p.InfraErrors, &successes, &reward, &p.LastEnded); err != nil {
			return nil, 0, fmt.Errorf("run %s series: scan: %w", runID, err)
		}
		p.From = b * width
		n := scored(p.Episodes, p.InfraErrors)
		p.SuccessRate, p.MeanReward = ratio(float64(successes), n), ratio(reward, n)
		points = append(points, p)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("run %s series: %w", runID, err)
	}
	return points, width, nil
}

// EpisodeSummary is one ended episode as the run page lists it and the replay viewer
// heads it.
type EpisodeSummary struct {
	EpisodeID string `json:"episode_id"`
	RunID     string `json:"run_id"`
	Idx       uint64 `json:"idx"`
	Env       string `json:"env"`
	// Seed is a string in JSON: a uint64 loses digits as a JavaScript number.
	Seed        uint64    `json:"seed,string"`
	Policy      string    `json:"policy"`
	Profile     string    `json:"profile"`
	Steps       uint32    `json:"steps"`
	Success     bool      `json:"success"`
	TotalReward float64   `json:"total_reward"`
	Reason      string    `json:"reason"`
	InfraError  bool      `json:"infra_error"`
	Error       string    `json:"error"`
	FaultsFired uint32    `json:"faults_fired"`
	EndedAt     time.Time `json:"ended_at"`
	// ParentEpisodeID and ParentStep are, for a forked episode, the episode it was
	// forked from and the step (its steps before that are the parent's, replayed).
	ParentEpisodeID string `json:"parent_episode_id,omitempty"`
	ParentStep      uint32 `json:"parent_step,omitempty"`
}

const episodeColumns = `episode_id, run_id, idx, env, seed, policy, profile, steps, success,
	total_reward, reason, infra_error, error, faults_fired, ended_at, parent_episode_id, parent_step`

// scanEpisode scans a row of episodeColumns, then of the columns after them into more.
func scanEpisode(rows driver.Rows, more ...any) (EpisodeSummary, error) {
	var e EpisodeSummary
	var success, infra uint8
	err := rows.Scan(append([]any{&e.EpisodeID, &e.RunID, &e.Idx, &e.Env, &e.Seed, &e.Policy, &e.Profile, &e.Steps,
		&success, &e.TotalReward, &e.Reason, &infra, &e.Error, &e.FaultsFired, &e.EndedAt, &e.ParentEpisodeID, &e.ParentStep}, more...)...)
	e.Success, e.InfraError = success == 1, infra == 1
	return e, err
}

// Episodes returns a page of the run's ended episodes in index order.
func (r reader) Episodes(ctx context.Context, runID string, offset, limit int) ([]EpisodeSummary, error) {
	return r.episodesWhere(ctx, runID, `FINAL WHERE run_id = ? ORDER BY idx, episode_id LIMIT ?, ?`, runID, offset, limit)
}

// EpisodesByRank returns what Episodes does, for a run whose episode ids do not sort as
// their indices (an env API run's are random): the page's ids first, by rank over two
// narrow columns of the run's rows without FINAL (copies of an episode carry its index,
// so the distinct pairs are the episodes FINAL keeps), then the page's rows by key, the
// newest version of each (EpisodesFrom). It still reads a row of every episode of the
// run, but not every column of it, nor merges them.
func (r reader) EpisodesByRank(ctx context.Context, runID string, offset, limit int) ([]EpisodeSummary, error) {
	rows, err := r.conn.Query(ctx, r.sql(`SELECT DISTINCT idx, episode_id FROM {db}.episodes WHERE run_id = ?
		ORDER BY idx, episode_id LIMIT ?, ?`), runID, offset, limit)
	if err != nil {
		return nil, fmt.Errorf("run %s episodes by rank: %w", runID, err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var idx uint64
		var id string
		if err := rows.Scan(&idx, &id); err != nil {
			return nil, fmt.Errorf("run %s episodes by rank: scan: %w", runID, err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("run %s episodes by rank: %w", runID, err)
	}
	return r.episodesByID(ctx, runID, ids)
}

// keyedGranules bounds what one read of a keyed page (EpisodesAfter) reads: this many
// granules of 8,192 rows (max_rows_to_read, which ClickHouse checks against the granules
// the key selects before it reads any).
const keyedGranules = 4

// tooManyRows is ClickHouse's TOO_MANY_ROWS: a read whose key range selects more rows
// than max_rows_to_read, refused before it reads one.
const tooManyRows = 158

func isTooManyRows(err error) bool {
	var ex *clickhouse.Exception
	return errors.As(err, &ex) && ex.Code == tooManyRows
}

// Keyed reports whether run runID's episodes can be paged by key (EpisodesAfter): it has
// no episode whose id is of a form other than the issued one (runs.IssuedIDPrefix).
// Runs of the env API from before that form, and planned runs the scheduler no longer
// knows, are paged by rank. Their ids sort before the issued ones, so the question reads
// the range below them, refused unread past keyedGranulesMost granules (a no too).
func (r reader) Keyed(ctx context.Context, runID string) (bool, error) {
	from, _ := runs.IssuedIDRange(runID)
	// An empty range still selects a granule of each part whose keys surround it: the
	// cap grows past those before it says no.
	for granules := keyedGranules; ; granules *= 2 {
		var n uint64
		err := r.conn.QueryRow(ctx, r.sql(`SELECT count() FROM {db}.episodes WHERE run_id = ? AND episode_id < ?
			SETTINGS read_overflow_mode = 'throw', max_rows_to_read = `+strconv.Itoa(granules*8192)), runID, from).Scan(&n)
		switch {
		case isTooManyRows(err) && granules < keyedGranulesMost:
		case isTooManyRows(err):
			return false, nil
		case err != nil:
			return false, fmt.Errorf("run %s: ids in issue order: %w", runID, err)
		default:
			return n == 0, nil
		}
	}
}

// keyedGranulesMost is the most granules Keyed reads of a run's ids of other forms
// before it takes their number to say no: 64 granules, 524,288 rows.
const keyedGranulesMost = 64

// EpisodesAfter returns up to limit ended episodes of run runID whose ids follow after
// (all of them for ""), in id order, which is the order they were issued in: a run whose
// every id is issued (Keyed). It reads a range of the episodes table's key, bounded,
// since ClickHouse 18.16 reads a key range whole whatever the LIMIT: each read is capped
// at keyedGranules granules, which ClickHouse refuses before reading a row. So the rest
// of the run is asked for first; when it is larger than that, a window of issue times
// from the cursor, halved until it fits, then widened again from its end while the page
// is not full. The newest version of each episode is kept (EpisodesFrom says why not
// FINAL). The windows' times come from the ids, so a clock only sets where the search
// starts, never what a page holds.
func (r reader) EpisodesAfter(ctx context.Context, runID, after string, limit int) ([]EpisodeSummary, error) {
	from, to := runs.IssuedIDRange(runID)
	lo, inclusive := after, false
	var at uint64
	if after == "" {
		lo, inclusive = from, true
		at = issuedSince
	} else {
		t, ok := runs.IssuedAt(runID, after)
		if !ok {
			return nil, fmt.Errorf("%w: after=%q: not an episode id of run %s in issue order", errBadRequest, after, runID)
		}
		at = t
	}
	out := []EpisodeSummary{}
	granules, reads := keyedGranules, 0
	read := func(hi string) ([]EpisodeSummary, error) {
		if reads++; reads > maxKeyedReads {
			return nil, fmt.Errorf("run %s episodes after %q: no page in %d reads", runID, after, maxKeyedReads)
		}
		return r.episodesIn(ctx, runID, lo, inclusive, hi, limit-len(out), granules)
	}
	// window is the span of issue times a read covers, in nanoseconds; it starts at what
	// lies between the cursor and an hour from now.
	window := uint64(1)
	if soon := uint64(time.Now().Add(time.Hour).UnixNano()); soon > at {
		window = soon - at
	}
	if after == "" {
		// The first page: from a time before any id, a window that ends just past an
		// id of the run, so that the search does not halve its way through the
		// empty times before the run, reading the granule around each.
		first, ok, err := r.someIssued(ctx, runID)
		if err != nil {
			return nil, err
		}
		if ok && first >= at {
			window = first - at + 1
		}
	}
	for len(out) < limit {
		// The rest of the run first: refused at once when it is larger than the cap.
		eps, err := read(to)
		if err == nil {
			return append(out, eps...), nil
		}
		if !isTooManyRows(err) {
			return nil, err
		}
		for {
			end, hi := at+window, to
			if end > at {
				hi = runs.IssuedIDPrefix(runID, end)
			}
			eps, err = read(hi)
			if err == nil {
				out = append(out, eps...)
				lo, inclusive, at = hi, true, end
				// An empty window still read the granules around it: the next one is
				// much wider, since a refusal costs nothing and a read does.
				grow := uint64(2)
				if len(eps) == 0 {
					grow = 16
				}
				window = min(window, math.MaxUint64/grow) * grow
				break
			}
			if !isTooManyRows(err) {
				return nil, err
			}
			if window == 1 {
				// One nanosecond's ids span more granules than the cap: the run's rows
				// are spread over many parts (being written). A larger cap, not a
				// narrower window.
				granules *= 2
				continue
			}
			window /= 2
		}
	}
	return out, nil
}

// someIssued returns the issue time of one of run runID's issued ids, the first of the
// first part ClickHouse reads, reading a granule or so: the first one in key order of
// one part, so the run's first id is issued then or before. false for a run with none.
func (r reader) someIssued(ctx context.Context, runID string) (uint64, bool, error) {
	from, to := runs.IssuedIDRange(runID)
	rows, err := r.conn.Query(ctx, r.sql(`SELECT episode_id FROM {db}.episodes WHERE run_id = ? AND episode_id >= ? AND episode_id < ?
		LIMIT 1 SETTINGS max_threads = 1, max_block_size = 8192, max_rows_to_read = 8192, read_overflow_mode = 'break'`), runID, from, to)
	if err != nil {
		return 0, false, fmt.Errorf("run %s: an issued id: %w", runID, err)
	}
	defer rows.Close()
	var id string
	for rows.Next() {
		if err := rows.Scan(&id); err != nil {
			return 0, false, fmt.Errorf("run %s: an issued id: %w", runID, err)
		}
	}
	if err := rows.Err(); err != nil {
		return 0, false, fmt.Errorf("run %s: an issued id: %w", runID, err)
	}
	at, ok := runs.IssuedAt(runID, id)
	return at, ok, nil
}

// issuedSince is a time before any issued id (2026-12-01): where the windows of a run's
// first page start. An id issued before it by a clock set wrong is still read: the first
// window starts at the least issued id of the run, whatever its time.
const issuedSince = 1796083200 * uint64(time.Second)

// maxKeyedReads bounds the reads of one keyed page: each halving of a window is one
// (refused, it reads nothing), and 64 halvings span every time a uint64 holds.
const maxKeyedReads = 400

// episodesIn reads up to limit episodes of run runID with ids from lo (inclusive or not)
// to below hi, the newest version of each, in id order, refusing (TOO_MANY_ROWS) a range
// of more than granules granules.
func (r reader) episodesIn(ctx context.Context, runID, lo string, inclusive bool, hi string, limit, granules int) ([]EpisodeSummary, error) {
	op := ">"
	if inclusive {
		op = ">="
	}
	return r.episodesWhere(ctx, runID, `WHERE run_id = ? AND episode_id `+op+` ? AND episode_id < ?
		ORDER BY episode_id, version DESC LIMIT 1 BY episode_id LIMIT ?
		SETTINGS read_overflow_mode = 'throw', max_rows_to_read = `+strconv.Itoa(granules*8192), runID, lo, hi, limit)
}

// episodesByID reads the newest version of the episodes ids of run runID, in index order.
func (r reader) episodesByID(ctx context.Context, runID string, ids []string) ([]EpisodeSummary, error) {
	if len(ids) == 0 {
		return []EpisodeSummary{}, nil
	}
	args := make([]any, 0, len(ids)+2)
	args = append(args, runID)
	for _, id := range ids {
		args = append(args, id)
	}
	args = append(args, len(ids))
	return r.episodesWhere(ctx, runID, `WHERE run_id = ? AND episode_id IN (?`+strings.Repeat(", ?", len(ids)-1)+`)
		ORDER BY idx, episode_id, version DESC LIMIT 1 BY episode_id LIMIT ?`, args...)
}

// episodesWhere reads the episodes of run runID that the rest of the query (after FROM
// episodes: FINAL or not, where and order, with args) selects.
func (r reader) episodesWhere(ctx context.Context, runID, where string, args ...any) ([]EpisodeSummary, error) {
	rows, err := r.conn.Query(ctx, r.sql(`SELECT `+episodeColumns+` FROM {db}.episodes `+where), args...)
	if err != nil {
		return nil, fmt.Errorf("run %s episodes: %w", runID, err)
	}
	defer rows.Close()
	out := []EpisodeSummary{}
	for rows.Next() {
		e, err := scanEpisode(rows)
		if err != nil {
			return nil, fmt.Errorf("run %s episodes: scan: %w", runID, err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("run %s episodes: %w", runID, err)
	}
	return out, nil
}

// EpisodesFrom returns the run's ended episodes with index from from to from+limit-1,
// in index order, for a run the scheduler planned: its episodes are numbered 0 to
// planned-1, each once, under the ids runs.EpisodeID gives. They are read by those ids,
// the episodes table's key, where a page by rank (Episodes) sorts every episode of the
// run to skip the first from.
//
// Without FINAL, which merges the rows of every part holding the page's granules, all
// columns at once, on one thread (100 ms for 200 episodes across the parts of a run
// being written): the page's rows are few, and the newest version of each is the one
// FINAL would keep (two ends of one version are copies of one event).
func (r reader) EpisodesFrom(ctx context.Context, runID string, from, limit int) ([]EpisodeSummary, error) {
	ids := make([]string, limit)
	for i := range ids {
		ids[i] = runs.EpisodeID(runID, uint64(from+i))
	}
	return r.episodesByID(ctx, runID, ids)
}

// Episode returns one ended episode; nil (no error) while it has not ended.
//
// The episodes table is ordered by (run_id, episode_id), so an episode found by its id
// alone is looked for in every episode of every run: seconds in a table of millions. Its
// run is read first from one of its steps (the steps table is ordered by episode_id), and
// the episode then by its whole key. Only an episode with no step recorded (one that
// ended at its start, or has not recorded a step yet) is looked for by its id alone.
// runID, when known (an episode of a run the scheduler planned), spares the first read.
func (r reader) Episode(ctx context.Context, episodeID, runID string) (*EpisodeSummary, error) {
	e, _, err := r.episode(ctx, episodeID, runID)
	return e, err
}

// episode is Episode, also returning the episode's requested_at (its rows' partition
// key; zero while it has not ended).
//
// Its key selects whole granules: one in each part whose keys span the episode's place,
// and in ClickHouse 18.16, whose index has no upper bound on a part's last granule, the
// last granule of every part whose keys start before it (the newest episode of a run
// being written is after every part's last granule). The key is read in PREWHERE, so the
// other columns are read from the granules that hold the episode only. ClickHouse does
// not move a condition on the table's key to PREWHERE by itself.
func (r reader) episode(ctx context.Context, episodeID, runID string) (*EpisodeSummary, time.Time, error) {
	if runID == "" {
		err := r.conn.QueryRow(ctx, r.sql(`SELECT run_id FROM {db}.steps PREWHERE episode_id = ? LIMIT 1`), episodeID).Scan(&runID)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return nil, time.Time{}, fmt.Errorf("episode %s: its run: %w", episodeID, err)
		}
	}
	where, args := "run_id = ? AND episode_id = ?", []any{runID, episodeID}
	if runID == "" {
		where, args = "episode_id = ?", []any{episodeID}
	}
	// Its newest version, the row FINAL would keep, without merging every part's
	// granules of it (EpisodesFrom).
	rows, err := r.conn.Query(ctx, r.sql(`SELECT `+episodeColumns+`, requested_at
		FROM {db}.episodes PREWHERE `+where+` ORDER BY version DESC LIMIT 1`), args...)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("episode %s: %w", episodeID, err)
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return nil, time.Time{}, fmt.Errorf("episode %s: %w", episodeID, err)
		}
		return nil, time.Time{}, nil
	}
	var requestedAt time.Time
	e, err := scanEpisode(rows, &requestedAt)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("episode %s: scan: %w", episodeID, err)
	}
	return &e, requestedAt, nil
}

// Fault is one fault fired in a step.
type Fault struct {
	Kind   string `json:"kind"`
	Target string `json:"target"`
	Detail string `json:"detail"`
}

// Component is one named component of a step's reward vector.
type Component struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
}

// Step is one recorded step as the replay viewer shows it. Args, Observation and
// StateDiff are the recorded JSON text.
type Step struct {
	Step        uint32      `json:"step"`
	Tool        string      `json:"tool"`
	Args        string      `json:"args"`
	Observation string      `json:"observation"`
	StateDiff   string      `json:"state_diff"`
	Faults      []Fault     `json:"faults"`
	Reward      float64     `json:"reward"`
	Components  []Component `json:"components"`
	RewardSpec  string      `json:"reward_spec"`
	Progress    float64     `json:"progress"`
	Invalid     bool        `json:"invalid_action"`
	Success     bool        `json:"success"`
	Terminated  bool        `json:"terminated"`
	Truncated   bool        `json:"truncated"`
	Reason      string      `json:"reason"`
	Violations  []string    `json:"violations"`
	Safety      []string    `json:"safety_events"`
}

// Steps returns a page of an episode's steps, from step from on, in order. requestedAt
// is the episode's requested_at (episode), or zero when it is not known.
//
// Without FINAL: copies of a step are the same fact, any of them right (trajectory's
// stepVersion), so one per step (LIMIT 1 BY) is the page. FINAL would merge every
// part's rows of the episode's granules, all columns at once.
//
// The key (episode_id, step) selects whole granules of 8,192 rows, and more of them the
// more parts the table has: one in each part whose keys span the episode's place, and,
// in ClickHouse 18.16, the last granule of every part whose keys start before it, which
// is every part for the newest episode of a run being written. The key is read in
// PREWHERE, which ClickHouse does not do by itself for the key's columns: the wide
// columns (observations, diffs) are read only from the granules that hold the
// episode's steps, not from every granule the key selects (225 MB against 3.8 MB for the
// newest episode of a run in 40 parts, observations of 1 KB, in
// TestReplayReadsTheEpisodesGranules).
// requested_at, the partition key, fixed per episode, leaves out the partitions and the
// parts of other times (minmax_requested_at.idx): their granules are not even selected.
func (r reader) Steps(ctx context.Context, episodeID string, requestedAt time.Time, from, limit int) ([]Step, error) {
	where, args := "episode_id = ? AND step >= ?", []any{episodeID, from}
	if !requestedAt.IsZero() {
		where, args = where+" AND requested_at = toDateTime(?)", append(args, uint32(requestedAt.Unix()))
	}
	rows, err := r.conn.Query(ctx, r.sql(`SELECT step, tool, args, observation, state_diff,
		fault_kinds, fault_targets, fault_details, reward, reward_names, reward_values, reward_spec,
		progress, invalid_action, success, terminated, truncated, reason, violation_reasons, safety_events
		FROM {db}.steps PREWHERE `+where+` ORDER BY step LIMIT 1 BY step LIMIT ?`), append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("episode %s steps: %w", episodeID, err)
	}
	defer rows.Close()
	out := []Step{}
	for rows.Next() {
		var s Step
		var kinds, targets, details, names []string
		var values []float64
		var invalid, success, terminated, truncated uint8
		if err := rows.Scan(&s.Step, &s.Tool, &s.Args, &s.Observation, &s.StateDiff,
			&kinds, &targets, &details, &s.Reward, &names, &values, &s.RewardSpec,
			&s.Progress, &invalid, &success, &terminated, &truncated, &s.Reason, &s.Violations, &s.Safety); err != nil {
			return nil, fmt.Errorf("episode %s steps: scan: %w", episodeID, err)
		}
		s.Invalid, s.Success, s.Terminated, s.Truncated = invalid == 1, success == 1, terminated == 1, truncated == 1
		s.Faults = make([]Fault, len(kinds))
		for i := range kinds {
			s.Faults[i].Kind = kinds[i]
			if i < len(targets) {
				s.Faults[i].Target = targets[i]
			}
			if i < len(details) {
				s.Faults[i].Detail = details[i]
			}
		}
		s.Components = make([]Component, 0, len(names))
		for i := range min(len(names), len(values)) {
			s.Components = append(s.Components, Component{Name: names[i], Value: values[i]})
		}
		if s.Violations == nil {
			s.Violations = []string{}
		}
		if s.Safety == nil {
			s.Safety = []string{}
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("episode %s steps: %w", episodeID, err)
	}
	return out, nil
}

// maxHeatmapCells bounds the fault heatmap's cells (kinds × services).
const maxHeatmapCells = 2000

// faultHeatmapSQL is, per fault kind and service (the target's part before "/": the
// service a call fault hit, or the whole target of a sandbox-wide fault), the scored
// (not infra-error) episodes of a run where that kind fired on that service at least
// once, how many succeeded and their success rate. docs/querying.md prints it (under
// <!-- console:fault_heatmap -->, with gauntlet for {db} and 'r…' for the run id); the
// console runs it with a LIMIT.
const faultHeatmapSQL = `SELECT kind, service, count() AS episodes, sum(success) AS succeeded, sum(success) / count() AS success_rate
FROM (SELECT DISTINCT episode_id, kind, splitByChar('/', target)[1] AS service
      FROM {db}.faults WHERE run_id = ? AND episode_id IN (SELECT episode_id FROM {db}.episodes WHERE run_id = ? AND faults_fired > 0))
ANY INNER JOIN (SELECT episode_id, success FROM {db}.episodes FINAL WHERE run_id = ? AND infra_error = 0)
USING episode_id
GROUP BY kind, service ORDER BY kind, service`

// HeatCell is one cell of a run's fault heatmap.
type HeatCell struct {
	Kind        string  `json:"kind"`
	Service     string  `json:"service"`
	Episodes    uint64  `json:"episodes"`
	Succeeded   uint64  `json:"succeeded"`
	SuccessRate float64 `json:"success_rate"`
}

// FaultHeatmap returns the run's fault kind × service cells (faultHeatmapSQL).
func (r reader) FaultHeatmap(ctx context.Context, runID string) ([]HeatCell, error) {
	rows, err := r.conn.Query(ctx, r.sql(faultHeatmapSQL)+" LIMIT ?", runID, runID, runID, maxHeatmapCells)
	if err != nil {
		return nil, fmt.Errorf("run %s fault heatmap: %w", runID, err)
	}
	defer rows.Close()
	out := []HeatCell{}
	for rows.Next() {
		var h HeatCell
		if err := rows.Scan(&h.Kind, &h.Service, &h.Episodes, &h.Succeeded, &h.SuccessRate); err != nil {
			return nil, fmt.Errorf("run %s fault heatmap: scan: %w", runID, err)
		}
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("run %s fault heatmap: %w", runID, err)
	}
	return out, nil
}

// maxForks bounds the forks of one episode the replay viewer lists.
const maxForks = 100

// Fork is an episode forked from another, as the replay viewer lists it.
type Fork struct {
	EpisodeID string `json:"episode_id"`
	Step      uint32 `json:"step"`
}

// Forks returns the ended episodes of run forked from episode, by the step they were
// forked at. A fork runs in its parent's run (the env API's run of the tenant), so the
// read stays within the run's rows.
func (r reader) Forks(ctx context.Context, runID, episodeID string) ([]Fork, error) {
	// Without FINAL, one row per fork: an episode's parent and the step it was forked at
	// are the same in every row of it, and FINAL would read the key of every episode of
	// the run where this reads one narrow column of them.
	rows, err := r.conn.Query(ctx, r.sql(`SELECT episode_id, any(parent_step) AS at FROM {db}.episodes
		WHERE run_id = ? AND parent_episode_id = ? GROUP BY episode_id ORDER BY at, episode_id LIMIT ?`), runID, episodeID, maxForks)
	if err != nil {
		return nil, fmt.Errorf("episode %s forks: %w", episodeID, err)
	}
	defer rows.Close()
	out := []Fork{}
	for rows.Next() {
		var f Fork
		if err := rows.Scan(&f.EpisodeID, &f.Step); err != nil {
			return nil, fmt.Errorf("episode %s forks: scan: %w", episodeID, err)
		}
		out = append(out, f)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("episode %s forks: %w", episodeID, err)
	}
	return out, nil
}
