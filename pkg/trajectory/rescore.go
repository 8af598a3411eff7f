package trajectory

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// ScoreRow is one row of step_scores: a recorded step scored again under a spec, by
// Rescore. The key is (run_id, spec_digest, episode_id, step), so re-scoring a run under
// the same spec again replaces its rows with equal ones.
type ScoreRow struct {
	RunID       string
	SpecDigest  string
	EpisodeID   string
	Step        uint32
	RequestedAt time.Time // the step's, so the row lands in the step's partition
	Env         string
	Spec        string // name/version
	Reward      float64
	// RewardNames and RewardValues are the vector, in the spec's order, as in steps.
	RewardNames  []string
	RewardValues []float64
	Version      uint64
}

// scoreColumns is the step_scores table of migration 10.
var scoreColumns = []column[ScoreRow]{
	col("run_id", func(r *ScoreRow) *string { return &r.RunID }),
	col("spec_digest", func(r *ScoreRow) *string { return &r.SpecDigest }),
	col("episode_id", func(r *ScoreRow) *string { return &r.EpisodeID }),
	col("step", func(r *ScoreRow) *uint32 { return &r.Step }),
	col("requested_at", func(r *ScoreRow) *time.Time { return &r.RequestedAt }),
	col("env", func(r *ScoreRow) *string { return &r.Env }),
	col("spec", func(r *ScoreRow) *string { return &r.Spec }),
	col("reward", func(r *ScoreRow) *float64 { return &r.Reward }),
	col("reward_names", func(r *ScoreRow) *[]string { return &r.RewardNames }),
	col("reward_values", func(r *ScoreRow) *[]float64 { return &r.RewardValues }),
	col("version", func(r *ScoreRow) *uint64 { return &r.Version }),
}

// scoringInputColumns are the columns of steps a score reads (ScoringStep), and what
// Rescore needs besides: the step's identity, its recorded score, and whether the row
// holds every input. Not the observation or the action, which are most of a row's bytes.
var scoringInputColumns = pick(stepColumns,
	"run_id", "episode_id", "step", "requested_at", "env",
	"tool_calls", "errors", "virtual_ns", "wall_ns", "bytes_in", "bytes_out",
	"cpu_ns", "peak_memory_bytes", "processes", "read_bytes", "written_bytes", "runtime", "policy_ns",
	"progress", "progress_delta", "invalid_action", "success", "violation_rules", "violation_reasons",
	"violation_suggestions", "safety_events", "spend", "budget", "deadline_virtual_ns", "terminated",
	"verifier_names", "verifier_values", "limits",
	"reward", "reward_values", "reward_spec_digest", "scoring_inputs")

// scoringActionColumns are scoringInputColumns and the step's action, for a spec that
// reads it (scoring.Spec.ReadsActions): the action's bytes are read only then.
var scoringActionColumns = append(pick(stepColumns, "tool", "args"), scoringInputColumns...)

// scoringColumns returns the columns of steps a re-score under spec reads: the scoring
// inputs, the action for a spec that reads it, and the faults' kinds for a spec that
// reads them (scoring.Spec.ReadsFaults; their ids, targets and details never).
func scoringColumns(spec scoring.Spec) []column[StepRow] {
	cols := scoringInputColumns
	if spec.ReadsActions() {
		cols = scoringActionColumns
	}
	if spec.ReadsFaults() {
		cols = append(pick(stepColumns, "fault_kinds"), cols...)
	}
	return cols
}

// pick returns the columns of cols with the given names, in the order given.
func pick[R any](cols []column[R], names ...string) []column[R] {
	out := make([]column[R], 0, len(names))
	for _, n := range names {
		found := false
		for _, c := range cols {
			if c.name == n {
				out, found = append(out, c), true
				break
			}
		}
		if !found {
			panic("trajectory: no column " + n) // a typo above; TestRescore reads them all
		}
	}
	return out
}

// ScoringStep returns the step as the reward service scored it, from its row: its
// signals, its metering and whether it terminated the episode, which is everything a
// score reads, and its action and its faults' kinds when the row was read with them
// (scoringColumns). The metering's reward_ns is 0: it measures the scoring itself, after it.
// It is exact only for a row with ScoringInputs.
func (r *StepRow) ScoringStep() *gauntletv1.StepTaken {
	sig := &gauntletv1.Signals{
		Progress: r.Progress, InvalidAction: r.InvalidAction, Success: r.Success, Spend: r.Spend,
		Budget: r.Budget, DeadlineVirtualNs: r.DeadlineVirtualNs, ProgressDelta: r.ProgressDelta,
		SafetyEvents: r.SafetyEvents, VerifierNames: r.VerifierNames, VerifierValues: r.VerifierValues,
		Limits: r.Limits,
	}
	if n := len(r.ViolationRules); n > 0 {
		vs := make([]gauntletv1.CausalViolation, n)
		sig.Violations = make([]*gauntletv1.CausalViolation, n)
		for i := range vs {
			vs[i].Rule = r.ViolationRules[i]
			if i < len(r.ViolationReasons) {
				vs[i].Reason = r.ViolationReasons[i]
			}
			if i < len(r.ViolationSuggestions) {
				vs[i].Suggestion = r.ViolationSuggestions[i]
			}
			sig.Violations[i] = &vs[i]
		}
	}
	var action *gauntletv1.Action
	if r.Tool != "" {
		action = &gauntletv1.Action{Tool: r.Tool, ArgsJson: r.Args}
	}
	var faults []*gauntletv1.FaultFired
	if len(r.FaultKinds) > 0 {
		// What a score reads of the faults: their kinds (scoring.AnsweredFaults).
		faults = make([]*gauntletv1.FaultFired, len(r.FaultKinds))
		for i, k := range r.FaultKinds {
			faults[i] = &gauntletv1.FaultFired{Kind: k}
		}
	}
	return &gauntletv1.StepTaken{
		EpisodeId: r.EpisodeID, Step: r.Step, RunId: r.RunID, Env: r.Env, Action: action, Faults: faults,
		Metering: &gauntletv1.Metering{
			ToolCalls: r.ToolCalls, Errors: r.Errors, VirtualNs: r.VirtualNs, WallNs: r.WallNs,
			BytesIn: r.BytesIn, BytesOut: r.BytesOut, CpuNs: r.CPUNs, PeakMemoryBytes: r.PeakMemoryBytes,
			Processes: r.Processes, ReadBytes: r.ReadBytes, WrittenBytes: r.WrittenBytes,
			Runtime: r.Runtime, PolicyNs: r.PolicyNs,
		},
		Signals:    sig,
		Terminated: r.Terminated,
	}
}

// ErrNotRescorable is wrapped by Rescore's error for a run whose rows do not hold every
// input of their scores (recorded before migration 10), or miss steps.
var ErrNotRescorable = errors.New("cannot be re-scored from its rows")

// RescoreOptions tune Rescore.
type RescoreOptions struct {
	// Episodes is how many episodes are scored and written per batch (default 200): a
	// crash loses at most one batch's work.
	Episodes int
	// Progress, when not nil, is called after each batch is written, with the counts so far.
	Progress func(RescoreResult)
}

// RescoreResult says what Rescore did.
type RescoreResult struct {
	// Episodes of the run with steps; Done of them already re-scored under the spec by an
	// earlier call (skipped); Scored of them scored by this one, Steps being their steps.
	Episodes, Done, Scored, Steps int
	// Compared is how many of the steps scored were recorded under the same spec (by
	// digest), and Differ how many of those scored otherwise than recorded, to the bit,
	// FirstDiffer naming the first ("episode/step").
	Compared, Differ int
	FirstDiffer      string
}

// Rescore scores every recorded step of a run under spec, from the steps table, into
// step_scores, and records spec in reward_specs, so the run's totals under both specs
// compare side by side in SQL (docs/rewards.md). Scoring is scoring.ScoreState's pure
// function over each episode's steps in order, as the reward service scored them: under
// the spec a step was recorded with, it gives the recorded score to the bit (Compared,
// Differ).
//
// It is idempotent and resumable: rows are keyed by (run, spec digest, episode, step),
// episodes whose every step is in step_scores already are skipped, and the others are
// scored whole, in batches of opt.Episodes, each written once scored. After a crash or a
// cancelled ctx, calling it again finishes the run and leaves step_scores FINAL as if
// nothing had happened. Episodes recorded while it runs are picked up by the next call.
func Rescore(ctx context.Context, conn driver.Conn, database, runID string, spec scoring.Spec, opt RescoreOptions) (RescoreResult, error) {
	var res RescoreResult
	if err := checkDatabase(database); err != nil {
		return res, err
	}
	if err := spec.Validate(); err != nil {
		return res, fmt.Errorf("rescore run %s: %w", runID, err)
	}
	if opt.Episodes <= 0 {
		opt.Episodes = 200
	}
	if spec.Digest == "" { // a spec built in Go: only the default has a row to join
		return res, fmt.Errorf("rescore run %s: spec %s has no digest (parse it from its file)", runID, spec.Version)
	}
	sc := new(scratch)
	if err := insert(ctx, conn, database, "reward_specs", rewardSpecColumns, []RewardSpecRow{NewRewardSpecRow(spec)}, sc); err != nil {
		return res, fmt.Errorf("rescore run %s: %w", runID, err)
	}

	recorded, err := episodeCounts(ctx, conn, "SELECT episode_id, count(), min(scoring_inputs) FROM "+database+".steps FINAL WHERE run_id = ? GROUP BY episode_id ORDER BY episode_id", runID)
	if err != nil {
		return res, fmt.Errorf("rescore run %s: steps: %w", runID, err)
	}
	if len(recorded) == 0 {
		return res, fmt.Errorf("rescore run %s: no recorded steps in %s.steps", runID, database)
	}
	for _, e := range recorded {
		if !e.inputs {
			return res, fmt.Errorf("rescore run %s: episode %s was recorded before steps held every input of their scores: it %w (replay it with reward explain)", runID, e.id, ErrNotRescorable)
		}
	}
	done, err := episodeCounts(ctx, conn, "SELECT episode_id, count(), 1 FROM "+database+".step_scores FINAL WHERE run_id = ? AND spec_digest = ? GROUP BY episode_id ORDER BY episode_id", runID, spec.Digest)
	if err != nil {
		return res, fmt.Errorf("rescore run %s: step_scores: %w", runID, err)
	}
	doneSteps := make(map[string]uint64, len(done))
	for _, e := range done {
		doneSteps[e.id] = e.steps
	}
	res.Episodes = len(recorded)
	todo := recorded[:0:0]
	for _, e := range recorded {
		if doneSteps[e.id] == e.steps {
			res.Done++
			continue
		}
		todo = append(todo, e)
	}

	version := uint64(time.Now().UnixNano())
	names := make([]string, len(spec.Weights))
	for i, w := range spec.Weights {
		names[i] = w.Component
	}
	var values [8]float64
	for start := 0; start < len(todo); start += opt.Episodes {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("rescore run %s: %w", runID, err)
		}
		batch := todo[start:min(start+opt.Episodes, len(todo))]
		want := make(map[string]bool, len(batch))
		for _, e := range batch {
			want[e.id] = true
		}
		// Consecutive in episode order: one range, the episodes done filtered out below.
		steps, err := selectRows(ctx, conn, database, "steps", scoringColumns(spec),
			"WHERE run_id = ? AND episode_id >= ? AND episode_id <= ? ORDER BY episode_id, step",
			runID, batch[0].id, batch[len(batch)-1].id)
		if err != nil {
			return res, fmt.Errorf("rescore run %s: %w", runID, err)
		}
		rows := make([]ScoreRow, 0, len(steps))
		var (
			state   gauntletv1.RewardState
			episode string
			next    uint32
			es      scoring.Spec
		)
		for i := range steps {
			r := &steps[i]
			if !want[r.EpisodeID] {
				continue
			}
			if r.EpisodeID != episode {
				episode, next, state = r.EpisodeID, 0, gauntletv1.RewardState{}
				es = spec.ForEnv(r.Env)
				res.Scored++
			}
			if r.Step != next && spec.Stateful() {
				return res, fmt.Errorf("rescore run %s: episode %s: step %d is not recorded, and %s scores each step after the ones before: the episode %w",
					runID, episode, next, spec.Version, ErrNotRescorable)
			}
			next = r.Step + 1
			vals, total := scoring.AppendValuesState(values[:0], es, &state, r.ScoringStep())
			row := ScoreRow{
				RunID: runID, SpecDigest: spec.Digest, EpisodeID: r.EpisodeID, Step: r.Step, RequestedAt: r.RequestedAt,
				Env: r.Env, Spec: spec.Version, Reward: total, RewardNames: names,
				RewardValues: append([]float64(nil), vals...), Version: version,
			}
			if r.RewardSpecDigest == spec.Digest {
				res.Compared++
				if !sameBits(r.Reward, total) || !sameValues(r.RewardValues, vals) {
					if res.Differ == 0 {
						res.FirstDiffer = fmt.Sprintf("%s/%d", r.EpisodeID, r.Step)
					}
					res.Differ++
				}
			}
			rows = append(rows, row)
		}
		if err := insert(ctx, conn, database, "step_scores", scoreColumns, rows, sc); err != nil {
			return res, fmt.Errorf("rescore run %s: %w", runID, err)
		}
		res.Steps += len(rows)
		if opt.Progress != nil {
			opt.Progress(res)
		}
	}
	return res, nil
}

// episodeCount is an episode's step count in a table, and (for steps) whether every
// row of it holds its scoring inputs.
type episodeCount struct {
	id     string
	steps  uint64
	inputs bool
}

func episodeCounts(ctx context.Context, conn driver.Conn, query string, args ...any) ([]episodeCount, error) {
	rows, err := conn.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []episodeCount
	for rows.Next() {
		var e episodeCount
		var inputs uint8
		if err := rows.Scan(&e.id, &e.steps, &inputs); err != nil {
			return nil, err
		}
		e.inputs = inputs == 1
		out = append(out, e)
	}
	return out, rows.Err()
}

func sameBits(a, b float64) bool { return math.Float64bits(a) == math.Float64bits(b) }

func sameValues(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !sameBits(a[i], b[i]) {
			return false
		}
	}
	return true
}
