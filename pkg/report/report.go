package report

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
)

// ErrNoEpisodes is returned when the runs asked for have no episode in ClickHouse.
var ErrNoEpisodes = errors.New("no episodes recorded")

// Z is the normal quantile of the report's 95 % intervals.
const Z = 1.959963984540054

// Rate is a success rate with its Wilson score interval (95 %).
type Rate struct {
	Trials    uint64  `json:"trials"`
	Successes uint64  `json:"successes"`
	Rate      float64 `json:"rate"`
	Low       float64 `json:"low"`
	High      float64 `json:"high"`
}

// Wilson returns k successes of n trials with the Wilson score interval at Z: unlike
// the normal approximation it stays within [0, 1] and is honest for rates near 0 or 1
// and for small n. No trials give a rate of 0 in [0, 1].
func Wilson(k, n uint64) Rate {
	r := Rate{Trials: n, Successes: k, High: 1}
	if n == 0 {
		return r
	}
	nf, p := float64(n), float64(k)/float64(n)
	z2 := Z * Z
	den := 1 + z2/nf
	center := (p + z2/(2*nf)) / den
	half := Z / den * math.Sqrt(p*(1-p)/nf+z2/(4*nf*nf))
	r.Rate, r.Low, r.High = p, math.Max(0, center-half), math.Min(1, center+half)
	return r
}

// Quantiles are the 50th, 90th and 99th percentiles (exact).
type Quantiles struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
}

// Group is one line of a breakdown: episodes of a run, a policy or a stage.
type Group struct {
	Key        string    `json:"key"`
	Episodes   uint64    `json:"episodes"`
	Success    Rate      `json:"success"`
	RewardMean float64   `json:"reward_mean"`
	Reward     Quantiles `json:"reward,omitzero"`
	// Run is the run's metadata (runs table) in the by-run breakdown, when recorded.
	Run *trajectory.RunRow `json:"run,omitempty"`
}

// FaultLine is how episodes did under one fault kind.
type FaultLine struct {
	Kind string `json:"kind"`
	// Met: episodes that met the kind at least once. First: episodes whose first fault
	// was of this kind (each faulted episode counted once).
	Met             Rate    `json:"met"`
	MetRewardMean   float64 `json:"met_reward_mean"`
	First           Rate    `json:"first"`
	FirstRewardMean float64 `json:"first_reward_mean"`
}

// Trigger is a safety event or a broken causal rule and what its steps scored.
type Trigger struct {
	Name     string `json:"name"`
	Times    uint64 `json:"times"`
	Episodes uint64 `json:"episodes"`
	// ComponentMean is the mean of the reward component that answers it (safety for a
	// safety event, causal for a rule) on the steps it happened in; StepRewardMean their
	// mean total, to compare with Cost.StepRewardMean.
	ComponentMean  float64 `json:"component_mean"`
	StepRewardMean float64 `json:"step_reward_mean"`
}

// Limit is how episodes did when their sandbox hit one kind of resource limit (timeout,
// oom_kill, pids_limit, disk_full, output_capped, cpu_throttled): counted apart from
// the safety events, since honest programs hit limits too.
type Limit struct {
	Kind string `json:"kind"`
	// Times is how often a step hit it.
	Times uint64 `json:"times"`
	// Met is the scored episodes that hit it at least once, and how many of them
	// succeeded; RewardMean their mean total reward.
	Met        Rate    `json:"met"`
	RewardMean float64 `json:"reward_mean"`
	// Ended is how many of them ended on a step that hit it.
	Ended uint64 `json:"ended"`
	// StepRewardMean is the mean reward of the steps that hit it (a step counted once a
	// hit), to compare with Cost.StepRewardMean.
	StepRewardMean float64 `json:"step_reward_mean"`
}

// Cost is the run's cost and metering, over every step.
type Cost struct {
	Steps           uint64  `json:"steps"`
	Spend           float64 `json:"spend"`
	ToolCalls       uint64  `json:"tool_calls"`
	Errors          uint64  `json:"errors"`
	InvalidActions  uint64  `json:"invalid_actions"`
	BytesIn         uint64  `json:"bytes_in"`
	BytesOut        uint64  `json:"bytes_out"`
	CPUNs           uint64  `json:"cpu_ns"`
	PeakMemoryBytes uint64  `json:"peak_memory_bytes"`
	WallNs          uint64  `json:"wall_ns"`
	VirtualNs       uint64  `json:"virtual_ns"`
	StepRewardMean  float64 `json:"step_reward_mean"`
}

// Latency is where a step's time goes, each a distribution over the steps, in
// nanoseconds: the env's call (Env), the policy choosing the action (Policy), the
// scoring (Reward), and their sum (Step).
type Latency struct {
	Env    Quantiles `json:"env_ns"`
	Policy Quantiles `json:"policy_ns"`
	Reward Quantiles `json:"reward_ns"`
	Step   Quantiles `json:"step_ns"`
}

// Looping is an episode that repeats one action.
type Looping struct {
	EpisodeID string `json:"episode_id"`
	Tool      string `json:"tool"`
	Repeats   uint64 `json:"repeats"`
	Steps     uint64 `json:"steps"`
}

// Report is the compatibility report of one or more runs, or of a curriculum's runs.
type Report struct {
	Title       string    `json:"title"`
	GeneratedAt time.Time `json:"generated_at"`
	Database    string    `json:"database"`
	RunIDs      []string  `json:"run_ids"`
	Curriculum  string    `json:"curriculum,omitempty"`

	Episodes    uint64    `json:"episodes"`
	InfraErrors uint64    `json:"infra_errors"`
	Success     Rate      `json:"success"`
	RewardMean  float64   `json:"reward_mean"`
	Reward      Quantiles `json:"reward"`
	Steps       Quantiles `json:"steps"`

	ByRun    []Group `json:"by_run"`
	ByPolicy []Group `json:"by_policy"`
	ByStage  []Group `json:"by_stage,omitempty"`
	// Stages are the curriculum's closed stages (curriculum_stages).
	Stages []trajectory.StageRow `json:"stages,omitempty"`

	Unfaulted           Rate        `json:"unfaulted"`
	UnfaultedRewardMean float64     `json:"unfaulted_reward_mean"`
	Faults              []FaultLine `json:"faults"`

	Safety []Trigger `json:"safety"`
	// Limits are the resource limits the runs' sandboxes hit, by kind.
	Limits     []Limit   `json:"limits"`
	Violations []Trigger `json:"violations"`
	Cost       Cost      `json:"cost"`
	Latency    Latency   `json:"latency"`

	// Stuck: episodes that ran out of steps or time without succeeding, by reason.
	Stuck      uint64            `json:"stuck"`
	StuckBy    map[string]uint64 `json:"stuck_by_reason"`
	Looping    Rate              `json:"looping"`
	LoopingTop []Looping         `json:"looping_top"`
}

var runIDRE = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,128}$`)

// Options says what to report on: runs by id, or a curriculum by workflow id or run
// prefix (its runs are read from the runs table).
type Options struct {
	Database   string
	RunIDs     []string
	Curriculum string
}

// Build reads the report from ClickHouse: every number is the result of one of Queries
// (or Wilson's interval over its counts).
func Build(ctx context.Context, conn driver.Conn, o Options) (*Report, error) {
	r := &Report{GeneratedAt: time.Now().UTC(), Database: o.Database, Curriculum: o.Curriculum, StuckBy: map[string]uint64{}}
	ids := o.RunIDs
	if o.Curriculum != "" {
		runs, err := trajectory.CurriculumRuns(ctx, conn, o.Database, o.Curriculum)
		if err != nil {
			return nil, fmt.Errorf("report: read the runs of curriculum %s: %w", o.Curriculum, err)
		}
		if len(runs) == 0 {
			return nil, fmt.Errorf("report: curriculum %s: no run in %s.runs names it (by workflow id or run prefix): %w", o.Curriculum, o.Database, ErrNoEpisodes)
		}
		for _, run := range runs {
			ids = append(ids, run.RunID)
		}
		if r.Stages, err = trajectory.CurriculumStages(ctx, conn, o.Database, o.Curriculum); err != nil {
			return nil, fmt.Errorf("report: read the stages of curriculum %s: %w", o.Curriculum, err)
		}
		r.Title = fmt.Sprintf("curriculum %s (%s)", runs[0].CurriculumName, o.Curriculum)
	}
	if len(ids) == 0 {
		return nil, errors.New("report: name at least one run or a curriculum")
	}
	for _, id := range ids {
		if !runIDRE.MatchString(id) {
			return nil, fmt.Errorf("report: run id %q: want letters, digits and _ . : -", id)
		}
	}
	r.RunIDs = ids
	if r.Title == "" {
		r.Title = "runs " + strings.Join(ids, ", ")
	}
	q := querier{ctx: ctx, conn: conn, scope: Scope{Database: o.Database, Runs: ids}}

	rows, err := q.run(qOverview)
	if err != nil {
		return nil, err
	}
	ov := rows[0]
	if r.Episodes = ov.u("episodes"); r.Episodes == 0 {
		return nil, fmt.Errorf("report: %s: %w", r.Title, ErrNoEpisodes)
	}
	q.scope.First, q.scope.Last = ov.u("first"), ov.u("last")
	r.InfraErrors = ov.u("infra_errors")
	r.Success = Wilson(ov.u("succeeded"), ov.u("scored"))
	r.RewardMean = ov.f("reward_mean")
	r.Reward, r.Steps = ov.q("reward_p50_p90_p99"), ov.q("steps_p50_p90_p99")
	r.Stuck = ov.u("stuck")

	meta := map[string]*trajectory.RunRow{}
	if runs, err := trajectory.Runs(ctx, conn, o.Database, ids...); err == nil {
		for i := range runs {
			meta[runs[i].RunID] = &runs[i]
		}
	} else {
		return nil, fmt.Errorf("report: read run metadata: %w", err)
	}
	if rows, err = q.run(qByRun); err != nil {
		return nil, err
	}
	for _, row := range rows {
		g := group(row, "run_id")
		g.Reward = row.q("reward_p50_p90_p99")
		g.Run = meta[g.Key]
		r.ByRun = append(r.ByRun, g)
	}
	if rows, err = q.run(qByPolicy); err != nil {
		return nil, err
	}
	for _, row := range rows {
		r.ByPolicy = append(r.ByPolicy, group(row, "policy"))
	}
	if o.Curriculum != "" {
		if rows, err = q.run(qByStage); err != nil {
			return nil, err
		}
		for _, row := range rows {
			g := group(row, "stage_name")
			g.Key = fmt.Sprintf("%d %s", row.u("stage"), g.Key)
			r.ByStage = append(r.ByStage, g)
		}
	}

	if rows, err = q.run(qUnfaulted); err != nil {
		return nil, err
	}
	r.Unfaulted = Wilson(rows[0].u("succeeded"), rows[0].u("episodes"))
	r.UnfaultedRewardMean = rows[0].f("reward_mean")
	metRows, err := q.run(qFaultMet)
	if err != nil {
		return nil, err
	}
	firstRows, err := q.run(qFaultFirst)
	if err != nil {
		return nil, err
	}
	// Every kind first met is a kind met: the lines are the met kinds, in order.
	at := map[string]int{}
	for _, row := range metRows {
		at[row.s("kind")] = len(r.Faults)
		r.Faults = append(r.Faults, FaultLine{Kind: row.s("kind"), Met: Wilson(row.u("succeeded"), row.u("episodes")), MetRewardMean: row.f("reward_mean")})
	}
	for _, row := range firstRows {
		i, ok := at[row.s("kind")]
		if !ok {
			i = len(r.Faults)
			r.Faults = append(r.Faults, FaultLine{Kind: row.s("kind")})
		}
		r.Faults[i].First, r.Faults[i].FirstRewardMean = Wilson(row.u("succeeded"), row.u("episodes")), row.f("reward_mean")
	}

	if r.Safety, err = q.triggers(qSafety, "event", "safety_mean"); err != nil {
		return nil, err
	}
	if rows, err = q.run(qLimits); err != nil {
		return nil, err
	}
	r.Limits = []Limit{}
	for _, row := range rows {
		r.Limits = append(r.Limits, Limit{Kind: row.s("kind"), Times: row.u("times"), Met: Wilson(row.u("succeeded"), row.u("episodes")),
			RewardMean: row.f("reward_mean"), Ended: row.u("ended"), StepRewardMean: row.f("step_reward_mean")})
	}
	if r.Violations, err = q.triggers(qViolations, "rule", "causal_mean"); err != nil {
		return nil, err
	}
	if rows, err = q.run(qCost); err != nil {
		return nil, err
	}
	c := rows[0]
	r.Cost = Cost{
		Steps: c.u("steps"), Spend: c.f("spend"), ToolCalls: c.u("tool_calls"), Errors: c.u("errors"),
		InvalidActions: c.u("invalid_actions"), BytesIn: c.u("bytes_in"), BytesOut: c.u("bytes_out"), CPUNs: c.u("cpu_ns"),
		PeakMemoryBytes: c.u("peak_memory_bytes"), WallNs: c.u("wall_ns"), VirtualNs: c.u("virtual_ns"),
		StepRewardMean: c.f("step_reward_mean"),
	}
	if rows, err = q.run(qLatency); err != nil {
		return nil, err
	}
	l := rows[0]
	r.Latency = Latency{Env: l.q("env_p50_p90_p99"), Policy: l.q("policy_p50_p90_p99"), Reward: l.q("reward_p50_p90_p99"), Step: l.q("step_p50_p90_p99")}
	if rows, err = q.run(qStuck); err != nil {
		return nil, err
	}
	for _, row := range rows {
		r.StuckBy[row.s("reason")] = row.u("episodes")
	}
	if rows, err = q.run(qLooping); err != nil {
		return nil, err
	}
	r.Looping = Wilson(rows[0].u("succeeded"), rows[0].u("episodes"))
	if rows, err = q.run(qLoopingTop); err != nil {
		return nil, err
	}
	for _, row := range rows {
		r.LoopingTop = append(r.LoopingTop, Looping{EpisodeID: row.s("episode_id"), Tool: row.s("tool"), Repeats: row.u("repeats"), Steps: row.u("steps")})
	}
	return r, nil
}

func group(row Row, key string) Group {
	return Group{Key: row.s(key), Episodes: row.u("episodes"), Success: Wilson(row.u("succeeded"), row.u("scored")), RewardMean: row.f("reward_mean")}
}

// querier runs the report's queries over one set of runs.
type querier struct {
	ctx   context.Context
	conn  driver.Conn
	scope Scope
}

func (q querier) run(query Query) ([]Row, error) {
	rows, err := Run(q.ctx, q.conn, query.SQL, q.scope)
	if err != nil {
		return nil, fmt.Errorf("report: query %s: %w", query.Name, err)
	}
	return rows, nil
}

func (q querier) triggers(query Query, name, component string) ([]Trigger, error) {
	rows, err := q.run(query)
	if err != nil {
		return nil, err
	}
	var out []Trigger
	for _, row := range rows {
		out = append(out, Trigger{Name: row.s(name), Times: row.u("times"), Episodes: row.u("episodes"),
			ComponentMean: row.f(component), StepRewardMean: row.f("step_reward_mean")})
	}
	return out, nil
}

// Scope is what the report's queries are about: their placeholders' values.
type Scope struct {
	Database string   // {db}
	Runs     []string // {runs}, quoted and separated by commas
	// First and Last bound the runs' episodes' requested_at, in Unix seconds ({first},
	// {last}; the overview query gives them).
	First, Last uint64
}

// Expand returns sql with its placeholders replaced by sc's values.
func Expand(sql string, sc Scope) string {
	quoted := make([]string, len(sc.Runs))
	for i, id := range sc.Runs {
		quoted[i] = "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(id) + "'"
	}
	return strings.NewReplacer("{db}", sc.Database, "{runs}", strings.Join(quoted, ", "),
		"{first}", strconv.FormatUint(sc.First, 10), "{last}", strconv.FormatUint(sc.Last, 10)).Replace(sql)
}

// Row is one result row by column name; numbers are uint64, int64, float64 or
// []float64, whatever width ClickHouse gave them.
type Row map[string]any

// Run runs sql (its placeholders expanded from sc) and returns its rows by column name.
func Run(ctx context.Context, conn driver.Conn, sql string, sc Scope) ([]Row, error) {
	rows, err := conn.Query(ctx, Expand(sql, sc))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	types := rows.ColumnTypes()
	var out []Row
	for rows.Next() {
		dest := make([]any, len(types))
		for i, t := range types {
			dest[i] = reflect.New(t.ScanType()).Interface()
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		row := Row{}
		for i, t := range types {
			row[t.Name()] = normalize(reflect.ValueOf(dest[i]).Elem())
		}
		out = append(out, row)
	}
	return out, rows.Err()
}

// normalize widens a scanned value: unsigned integers to uint64, signed to int64,
// floats to float64 (NaN, an average of nothing, to 0), arrays of floats to []float64.
func normalize(v reflect.Value) any {
	switch v.Kind() {
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return v.Uint()
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int()
	case reflect.Float32, reflect.Float64:
		f := v.Float()
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return 0.0
		}
		return f
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Float64 || v.Type().Elem().Kind() == reflect.Float32 {
			out := make([]float64, v.Len())
			for i := range out {
				out[i] = normalize(v.Index(i)).(float64)
			}
			return out
		}
	}
	return v.Interface()
}

func (r Row) u(name string) uint64 {
	switch v := r[name].(type) {
	case uint64:
		return v
	case int64:
		return uint64(max(v, 0))
	}
	return 0
}

func (r Row) f(name string) float64 {
	switch v := r[name].(type) {
	case float64:
		return v
	case uint64:
		return float64(v)
	case int64:
		return float64(v)
	}
	return 0
}

func (r Row) s(name string) string {
	s, _ := r[name].(string)
	return s
}

func (r Row) q(name string) Quantiles {
	v, _ := r[name].([]float64)
	if len(v) != 3 {
		return Quantiles{}
	}
	return Quantiles{P50: v[0], P90: v[1], P99: v[2]}
}
