package trajectory

import (
	"strings"
	"time"
)

// column binds one ClickHouse column to a field of the row type R. One list per table
// serves both directions, so column names, order and Go types live in one place:
// Writer appends whole columns (one slice per column per block; as fast as one
// Append per row in BenchmarkWriteSteps, with half the allocations) and readers scan
// into the fields.
type column[R any] struct {
	name string
	// values returns the column's values for rows, as the slice type clickhouse-go
	// appends to a column of this ClickHouse type, in buf (a slice an earlier call
	// returned, or nil) when it is large enough. clickhouse-go copies what it appends,
	// so the slice can serve the next block.
	values func(rows []R, buf any) any
	// field returns a pointer to the field of r, for Rows.Scan.
	field func(r *R) any
}

// col binds a column to a field whose Go type is what clickhouse-go appends and scans
// for it (string for String, uint32 for UInt32, []string for Array(String), ...).
func col[R, V any](name string, field func(*R) *V) column[R] {
	return column[R]{
		name: name,
		values: func(rows []R, buf any) any {
			out := reuse[V](buf, len(rows))
			for i := range rows {
				out[i] = *field(&rows[i])
			}
			return out
		},
		field: func(r *R) any { return field(r) },
	}
}

// flag binds a UInt8 column to a bool field (ClickHouse 18.16 has no Bool type).
func flag[R any](name string, field func(*R) *bool) column[R] {
	return column[R]{
		name: name,
		values: func(rows []R, buf any) any {
			out := reuse[uint8](buf, len(rows))
			for i := range rows {
				out[i] = 0
				if *field(&rows[i]) {
					out[i] = 1
				}
			}
			return out
		},
		field: func(r *R) any { return field(r) }, // clickhouse-go scans UInt8 into *bool
	}
}

// reuse returns buf as n values of V when it is such a slice with room for them, else a
// new slice.
func reuse[V any](buf any, n int) []V {
	if b, ok := buf.([]V); ok && cap(b) >= n {
		return b[:n]
	}
	return make([]V, n)
}

// columnList returns "a, b, c": the explicit column list every INSERT and SELECT
// names, so the tables can gain columns without breaking older writers.
func columnList[R any](cols []column[R]) string {
	names := make([]string, len(cols))
	for i, c := range cols {
		names[i] = c.name
	}
	return strings.Join(names, ", ")
}

// stepColumns is the steps table, in the order of migrations 1 and 2.
var stepColumns = []column[StepRow]{
	col("run_id", func(r *StepRow) *string { return &r.RunID }),
	col("episode_id", func(r *StepRow) *string { return &r.EpisodeID }),
	col("step", func(r *StepRow) *uint32 { return &r.Step }),
	col("requested_at", func(r *StepRow) *time.Time { return &r.RequestedAt }),
	col("env", func(r *StepRow) *string { return &r.Env }),
	col("policy", func(r *StepRow) *string { return &r.Policy }),
	col("profile", func(r *StepRow) *string { return &r.Profile }),
	col("worker_id", func(r *StepRow) *string { return &r.WorkerID }),
	col("tool", func(r *StepRow) *string { return &r.Tool }),
	col("agent", func(r *StepRow) *string { return &r.Agent }), // migration 13
	col("args", func(r *StepRow) *string { return &r.Args }),
	col("observation", func(r *StepRow) *string { return &r.Observation }),
	col("state_diff", func(r *StepRow) *string { return &r.StateDiff }),
	col("fault_ids", func(r *StepRow) *[]string { return &r.FaultIDs }),
	col("fault_kinds", func(r *StepRow) *[]string { return &r.FaultKinds }),
	col("fault_targets", func(r *StepRow) *[]string { return &r.FaultTargets }),
	col("fault_details", func(r *StepRow) *[]string { return &r.FaultDetails }),
	col("tool_calls", func(r *StepRow) *uint32 { return &r.ToolCalls }),
	col("errors", func(r *StepRow) *uint32 { return &r.Errors }),
	col("virtual_ns", func(r *StepRow) *uint64 { return &r.VirtualNs }),
	col("wall_ns", func(r *StepRow) *uint64 { return &r.WallNs }),
	col("bytes_in", func(r *StepRow) *uint32 { return &r.BytesIn }),
	col("bytes_out", func(r *StepRow) *uint32 { return &r.BytesOut }),
	col("cpu_ns", func(r *StepRow) *uint64 { return &r.CPUNs }),
	col("peak_memory_bytes", func(r *StepRow) *uint64 { return &r.PeakMemoryBytes }),
	col("processes", func(r *StepRow) *uint32 { return &r.Processes }),
	col("read_bytes", func(r *StepRow) *uint64 { return &r.ReadBytes }),
	col("written_bytes", func(r *StepRow) *uint64 { return &r.WrittenBytes }),
	col("runtime", func(r *StepRow) *string { return &r.Runtime }),
	// Migration 6.
	col("policy_ns", func(r *StepRow) *uint64 { return &r.PolicyNs }),
	col("reward_ns", func(r *StepRow) *uint64 { return &r.RewardNs }),
	// Migration 10.
	col("progress_delta", func(r *StepRow) *float64 { return &r.ProgressDelta }),
	col("budget", func(r *StepRow) *float64 { return &r.Budget }),
	col("deadline_virtual_ns", func(r *StepRow) *int64 { return &r.DeadlineVirtualNs }),
	col("violation_suggestions", func(r *StepRow) *[]string { return &r.ViolationSuggestions }),
	flag("scoring_inputs", func(r *StepRow) *bool { return &r.ScoringInputs }),
	// Migration 12.
	col("verifier_names", func(r *StepRow) *[]string { return &r.VerifierNames }),
	col("verifier_values", func(r *StepRow) *[]float64 { return &r.VerifierValues }),
	// Migration 15.
	col("limits", func(r *StepRow) *[]string { return &r.Limits }),
	col("progress", func(r *StepRow) *float64 { return &r.Progress }),
	flag("invalid_action", func(r *StepRow) *bool { return &r.InvalidAction }),
	flag("success", func(r *StepRow) *bool { return &r.Success }),
	col("violation_rules", func(r *StepRow) *[]string { return &r.ViolationRules }),
	col("violation_reasons", func(r *StepRow) *[]string { return &r.ViolationReasons }),
	col("safety_events", func(r *StepRow) *[]string { return &r.SafetyEvents }),
	col("spend", func(r *StepRow) *float64 { return &r.Spend }),
	flag("terminated", func(r *StepRow) *bool { return &r.Terminated }),
	flag("truncated", func(r *StepRow) *bool { return &r.Truncated }),
	col("reason", func(r *StepRow) *string { return &r.Reason }),
	col("virtual_time_ns", func(r *StepRow) *uint64 { return &r.VirtualTimeNs }),
	col("reward", func(r *StepRow) *float64 { return &r.Reward }),
	col("r_task", func(r *StepRow) *float64 { return &r.RTask }),
	col("r_cost", func(r *StepRow) *float64 { return &r.RCost }),
	col("r_safety", func(r *StepRow) *float64 { return &r.RSafety }),
	col("r_timeliness", func(r *StepRow) *float64 { return &r.RTimeliness }),
	col("r_causal", func(r *StepRow) *float64 { return &r.RCausal }),
	col("reward_names", func(r *StepRow) *[]string { return &r.RewardNames }),
	col("reward_values", func(r *StepRow) *[]float64 { return &r.RewardValues }),
	col("reward_spec", func(r *StepRow) *string { return &r.RewardSpec }),
	col("reward_spec_digest", func(r *StepRow) *string { return &r.RewardSpecDigest }), // migration 7
	col("version", func(r *StepRow) *uint64 { return &r.Version }),
}

// episodeColumns is the episodes table: migration 1's columns, then later ones.
var episodeColumns = []column[EpisodeRow]{
	col("run_id", func(r *EpisodeRow) *string { return &r.RunID }),
	col("episode_id", func(r *EpisodeRow) *string { return &r.EpisodeID }),
	col("idx", func(r *EpisodeRow) *uint64 { return &r.Idx }),
	col("env", func(r *EpisodeRow) *string { return &r.Env }),
	col("params", func(r *EpisodeRow) *string { return &r.Params }),
	col("seed", func(r *EpisodeRow) *uint64 { return &r.Seed }),
	col("policy", func(r *EpisodeRow) *string { return &r.Policy }),
	col("profile", func(r *EpisodeRow) *string { return &r.Profile }),
	col("plan", func(r *EpisodeRow) *string { return &r.Plan }),
	col("worker_id", func(r *EpisodeRow) *string { return &r.WorkerID }),
	col("requested_at", func(r *EpisodeRow) *time.Time { return &r.RequestedAt }),
	col("started_at", func(r *EpisodeRow) *time.Time { return &r.StartedAt }),
	col("ended_at", func(r *EpisodeRow) *time.Time { return &r.EndedAt }),
	col("started_at_ns", func(r *EpisodeRow) *uint64 { return &r.StartedAtNs }),
	col("ended_at_ns", func(r *EpisodeRow) *uint64 { return &r.EndedAtNs }),
	col("steps", func(r *EpisodeRow) *uint32 { return &r.Steps }),
	flag("terminated", func(r *EpisodeRow) *bool { return &r.Terminated }),
	flag("truncated", func(r *EpisodeRow) *bool { return &r.Truncated }),
	col("reason", func(r *EpisodeRow) *string { return &r.Reason }),
	flag("infra_error", func(r *EpisodeRow) *bool { return &r.InfraError }),
	col("error", func(r *EpisodeRow) *string { return &r.Error }),
	flag("success", func(r *EpisodeRow) *bool { return &r.Success }),
	col("total_reward", func(r *EpisodeRow) *float64 { return &r.TotalReward }),
	col("faults_fired", func(r *EpisodeRow) *uint32 { return &r.FaultsFired }),
	col("virtual_time_ns", func(r *EpisodeRow) *uint64 { return &r.VirtualTimeNs }),
	col("version", func(r *EpisodeRow) *uint64 { return &r.Version }),
	// Migration 2.
	col("drift_selectors", func(r *EpisodeRow) *[]string { return &r.DriftSelectors }),
	col("drift_values", func(r *EpisodeRow) *[]float64 { return &r.DriftValues }),
	col("drift_sources", func(r *EpisodeRow) *[]string { return &r.DriftSources }),
	// Migration 5.
	col("plan_seed", func(r *EpisodeRow) *uint64 { return &r.PlanSeed }),
	col("catalogue_version", func(r *EpisodeRow) *string { return &r.CatalogueVersion }),
	col("plan_template", func(r *EpisodeRow) *string { return &r.PlanTemplate }),
	col("plan_digest", func(r *EpisodeRow) *string { return &r.PlanDigest }),
	// Migration 7.
	col("reward_spec_digest", func(r *EpisodeRow) *string { return &r.RewardSpecDigest }),
	// Migration 9.
	col("parent_episode_id", func(r *EpisodeRow) *string { return &r.ParentEpisodeID }),
	col("parent_step", func(r *EpisodeRow) *uint32 { return &r.ParentStep }),
	// Migration 10.
	col("infra_kind", func(r *EpisodeRow) *string { return &r.InfraKind }),
	// Migration 12.
	col("verifier_names", func(r *EpisodeRow) *[]string { return &r.VerifierNames }),
	col("verifier_values", func(r *EpisodeRow) *[]float64 { return &r.VerifierValues }),
}

// worldColumns is the episode_worlds table of migration 10.
var worldColumns = []column[WorldRow]{
	col("run_id", func(r *WorldRow) *string { return &r.RunID }),
	col("episode_id", func(r *WorldRow) *string { return &r.EpisodeID }),
	col("requested_at", func(r *WorldRow) *time.Time { return &r.RequestedAt }),
	col("world", func(r *WorldRow) *string { return &r.World }),
	col("digest", func(r *WorldRow) *string { return &r.Digest }),
	col("version", func(r *WorldRow) *uint64 { return &r.Version }),
}

// rewardSpecColumns is the reward_specs table of migration 7.
var rewardSpecColumns = []column[RewardSpecRow]{
	col("digest", func(r *RewardSpecRow) *string { return &r.Digest }),
	col("spec", func(r *RewardSpecRow) *string { return &r.Spec }),
	col("name", func(r *RewardSpecRow) *string { return &r.Name }),
	col("spec_version", func(r *RewardSpecRow) *string { return &r.SpecVersion }),
	col("source", func(r *RewardSpecRow) *string { return &r.Source }),
	col("components", func(r *RewardSpecRow) *[]string { return &r.Components }),
	col("weights", func(r *RewardSpecRow) *[]float64 { return &r.Weights }),
	col("rules", func(r *RewardSpecRow) *[]string { return &r.Rules }),
	col("version", func(r *RewardSpecRow) *uint64 { return &r.Version }),
}

// templateColumns is the plan_templates table of migration 5.
var templateColumns = []column[TemplateRow]{
	col("template", func(r *TemplateRow) *string { return &r.Template }),
	col("profile", func(r *TemplateRow) *string { return &r.Profile }),
	col("catalogue_version", func(r *TemplateRow) *string { return &r.CatalogueVersion }),
	col("plan", func(r *TemplateRow) *string { return &r.Plan }),
	col("version", func(r *TemplateRow) *uint64 { return &r.Version }),
}

// faultColumns is the faults table, in the order of migration 1.
var faultColumns = []column[FaultRow]{
	col("run_id", func(r *FaultRow) *string { return &r.RunID }),
	col("episode_id", func(r *FaultRow) *string { return &r.EpisodeID }),
	col("step", func(r *FaultRow) *uint32 { return &r.Step }),
	col("seq", func(r *FaultRow) *uint16 { return &r.Seq }),
	col("requested_at", func(r *FaultRow) *time.Time { return &r.RequestedAt }),
	col("profile", func(r *FaultRow) *string { return &r.Profile }),
	col("fault_id", func(r *FaultRow) *string { return &r.FaultID }),
	col("kind", func(r *FaultRow) *string { return &r.Kind }),
	col("target", func(r *FaultRow) *string { return &r.Target }),
	col("detail", func(r *FaultRow) *string { return &r.Detail }),
	col("at_virtual_ns", func(r *FaultRow) *int64 { return &r.AtVirtualNs }),
	col("version", func(r *FaultRow) *uint64 { return &r.Version }),
}
