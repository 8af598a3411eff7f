package console

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"
)

// curriculumCountsSQL counts, per curriculum, its runs (from the runs table) and their
// ended episodes, infra errors and successes (from episodes). {db} is the database; the
// one parameter is the curricula's ids.
const curriculumCountsSQL = `SELECT curriculum_id, any(curriculum_name), count(), sum(eps), sum(infra), sum(ok)
FROM (SELECT run_id, curriculum_id, curriculum_name FROM {db}.runs FINAL WHERE has(?, curriculum_id))
ANY LEFT JOIN (SELECT run_id, count() AS eps, sum(infra_error) AS infra, sum(success) AS ok FROM {db}.episodes FINAL
	WHERE run_id IN (SELECT run_id FROM {db}.runs FINAL WHERE has(?, curriculum_id)) GROUP BY run_id)
USING run_id
GROUP BY curriculum_id`

// curriculumCount is one curriculum's row of curriculumCountsSQL.
type curriculumCount struct {
	Name                                   string
	Runs, Episodes, InfraErrors, Successes uint64
}

// CurriculumCounts returns, by curriculum id, its name, runs and their ended episodes,
// infra errors and successes; a curriculum without a run yet is absent.
func (r reader) CurriculumCounts(ctx context.Context, ids []string) (map[string]curriculumCount, error) {
	out := map[string]curriculumCount{}
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := r.conn.Query(ctx, r.sql(curriculumCountsSQL), ids, ids)
	if err != nil {
		return nil, fmt.Errorf("count curricula's episodes: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var n curriculumCount
		if err := rows.Scan(&id, &n.Name, &n.Runs, &n.Episodes, &n.InfraErrors, &n.Successes); err != nil {
			return nil, fmt.Errorf("count curricula's episodes: scan: %w", err)
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count curricula's episodes: %w", err)
	}
	return out, nil
}

// StageRow is one closed stage of a curriculum (the curriculum_stages table).
type StageRow struct {
	Stage          uint32  `json:"stage"`
	StageName      string  `json:"stage_name"`
	Outcome        string  `json:"outcome"`
	Metric         string  `json:"metric"`
	Threshold      float64 `json:"threshold"`
	WindowEpisodes uint64  `json:"window_episodes"`
	WindowValue    float64 `json:"window_value"`
	Episodes       uint64  `json:"episodes"`
	Succeeded      uint64  `json:"succeeded"`
	RewardSum      float64 `json:"reward_sum"`
	// InfraErrors is how many of Episodes ended as infra errors (0 for stages closed
	// before they were recorded), by kind in InfraByKind (curriculum_stages.infra_kinds
	// and infra_counts; empty for stages closed before kinds were recorded, and kinds
	// with none are absent), as a batch's are.
	InfraErrors uint64            `json:"infra_errors"`
	InfraByKind map[string]uint64 `json:"infra_by_kind"`
	Batches     uint32            `json:"batches"`
	ClosedAt    time.Time         `json:"closed_at"`
}

// CurriculumStages returns the stages the curriculum closed, in order.
func (r reader) CurriculumStages(ctx context.Context, id string) ([]StageRow, error) {
	rows, err := r.conn.Query(ctx, r.sql(`SELECT stage, stage_name, outcome, metric, threshold,
		window_episodes, window_value, episodes, succeeded, reward_sum, infra_errors, infra_kinds, infra_counts, batches, closed_at
		FROM {db}.curriculum_stages FINAL WHERE curriculum_id = ? ORDER BY stage, closed_at_ns LIMIT ?`), id, maxBatches)
	if err != nil {
		return nil, fmt.Errorf("curriculum %s stages: %w", id, err)
	}
	defer rows.Close()
	out := []StageRow{}
	for rows.Next() {
		var s StageRow
		var kinds []string
		var counts []uint64
		if err := rows.Scan(&s.Stage, &s.StageName, &s.Outcome, &s.Metric, &s.Threshold, &s.WindowEpisodes,
			&s.WindowValue, &s.Episodes, &s.Succeeded, &s.RewardSum, &s.InfraErrors, &kinds, &counts, &s.Batches, &s.ClosedAt); err != nil {
			return nil, fmt.Errorf("curriculum %s stages: scan: %w", id, err)
		}
		s.InfraByKind = make(map[string]uint64, len(kinds))
		for i, k := range kinds {
			if i < len(counts) && counts[i] > 0 {
				s.InfraByKind[k] += counts[i]
			}
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("curriculum %s stages: %w", id, err)
	}
	return out, nil
}

// BatchPoint is one batch (one run) of a curriculum: a point of its page's chart.
type BatchPoint struct {
	RunID       string    `json:"run_id"`
	Stage       uint32    `json:"stage"`
	StageName   string    `json:"stage_name"`
	Batch       uint32    `json:"batch"`
	DriftText   string    `json:"drift_text"`
	SubmittedAt time.Time `json:"submitted_at"`
	Episodes    uint64    `json:"episodes"`
	Successes   uint64    `json:"successes"`
	SuccessRate float64   `json:"success_rate"`
	MeanReward  float64   `json:"mean_reward"`
	// InfraErrors is how many of Episodes ended as infra errors, by kind in InfraByKind
	// (as RunSummary's); the rates leave them out, as the curriculum's promotion does.
	InfraErrors uint64            `json:"infra_errors"`
	InfraByKind map[string]uint64 `json:"infra_by_kind"`
	// Drift is, per selector of CurriculumPage.Selectors, the mean value its ramp had
	// over the batch's episodes; null where the batch had no such drift.
	Drift []*float64 `json:"drift"`
}

// curriculumBatchesSQL is a curriculum's batches in order with their ended episodes;
// its last columns count each batch's infra errors of each kind of infraKinds.
var curriculumBatchesSQL = `SELECT run_id, stage, stage_name, batch, drift_text, submitted_at, eps, infra, ok, reward` + batchKindColumns() + `
FROM (SELECT run_id, stage, stage_name, batch, drift_text, submitted_at FROM {db}.runs FINAL WHERE curriculum_id = ?)
ANY LEFT JOIN (SELECT run_id, count() AS eps, sum(infra_error) AS infra, sum(success) AS ok, sum(total_reward) AS reward` + infraKindColumnsAs() + ` FROM {db}.episodes FINAL
	WHERE run_id IN (SELECT run_id FROM {db}.runs FINAL WHERE curriculum_id = ?) GROUP BY run_id)
USING run_id
ORDER BY stage, batch LIMIT ?`

// infraKindColumnsAs is infraKindColumns with each count named k0, k1, ... for the outer
// query of curriculumBatchesSQL, which batchKindColumns selects.
func infraKindColumnsAs() string {
	var b strings.Builder
	for i, k := range infraKinds {
		fmt.Fprintf(&b, ", countIf(infra_error = 1 AND infra_kind = '%s') AS k%d", k, i)
	}
	return b.String()
}

func batchKindColumns() string {
	var b strings.Builder
	for i := range infraKinds {
		fmt.Fprintf(&b, ", k%d", i)
	}
	return b.String()
}

// curriculumDriftSQL is, per batch of a curriculum and drift selector, the mean value in
// force over the batch's episodes.
const curriculumDriftSQL = `SELECT run_id, sel, avg(val)
FROM {db}.episodes FINAL ARRAY JOIN drift_selectors AS sel, drift_values AS val
WHERE run_id IN (SELECT run_id FROM {db}.runs FINAL WHERE curriculum_id = ?)
GROUP BY run_id, sel LIMIT ?`

// CurriculumBatches returns the curriculum's batches in order, with the drift each had,
// and the drift selectors met (sorted).
func (r reader) CurriculumBatches(ctx context.Context, id string) ([]BatchPoint, []string, error) {
	rows, err := r.conn.Query(ctx, r.sql(curriculumBatchesSQL), id, id, maxBatches)
	if err != nil {
		return nil, nil, fmt.Errorf("curriculum %s batches: %w", id, err)
	}
	defer rows.Close()
	out := []BatchPoint{}
	index := map[string]int{}
	for rows.Next() {
		var b BatchPoint
		var reward float64
		kinds := make([]uint64, len(infraKinds))
		dest := []any{&b.RunID, &b.Stage, &b.StageName, &b.Batch, &b.DriftText, &b.SubmittedAt, &b.Episodes, &b.InfraErrors, &b.Successes, &reward}
		for i := range kinds {
			dest = append(dest, &kinds[i])
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, nil, fmt.Errorf("curriculum %s batches: scan: %w", id, err)
		}
		n := scored(b.Episodes, b.InfraErrors)
		b.SuccessRate, b.MeanReward = ratio(float64(b.Successes), n), ratio(reward, n)
		b.InfraByKind = byKind(kinds)
		index[b.RunID] = len(out)
		out = append(out, b)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("curriculum %s batches: %w", id, err)
	}
	drows, err := r.conn.Query(ctx, r.sql(curriculumDriftSQL), id, maxBatches*16)
	if err != nil {
		return nil, nil, fmt.Errorf("curriculum %s drift: %w", id, err)
	}
	defer drows.Close()
	type cell struct {
		batch int
		sel   string
		value float64
	}
	var cells []cell
	seen := map[string]bool{}
	for drows.Next() {
		var run, sel string
		var v float64
		if err := drows.Scan(&run, &sel, &v); err != nil {
			return nil, nil, fmt.Errorf("curriculum %s drift: scan: %w", id, err)
		}
		i, ok := index[run]
		if !ok {
			continue // a batch past the page's bound
		}
		cells = append(cells, cell{i, sel, v})
		seen[sel] = true
	}
	if err := drows.Err(); err != nil {
		return nil, nil, fmt.Errorf("curriculum %s drift: %w", id, err)
	}
	selectors := make([]string, 0, len(seen))
	for s := range seen {
		selectors = append(selectors, s)
	}
	sort.Strings(selectors)
	col := map[string]int{}
	for i, s := range selectors {
		col[s] = i
	}
	for i := range out {
		out[i].Drift = make([]*float64, len(selectors))
	}
	for _, c := range cells {
		v := c.value
		out[c.batch].Drift[col[c.sel]] = &v
	}
	return out, selectors, nil
}
