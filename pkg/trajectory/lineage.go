package trajectory

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Run states in the runs table's state column.
const (
	RunRunning = "running"
	RunDone    = "done"
	RunRefused = "refused"
)

// RunRow is one row of the runs table (migration 6): a run's spec, where it came from
// (gauntlet.v1.RunOrigin) and the scheduler's account of it. The store rewrites the row
// as the run goes on; its version is the run state's update time, so the newest account
// wins whatever order the rows arrive in.
type RunRow struct {
	RunID  string `json:"run_id"`
	Label  string `json:"label"`
	Env    string `json:"env"`
	Params string `json:"params"`
	// TaskDataset, TaskIDs and TaskDigests are, for a run of the tasks env, the
	// dataset's name and the tasks its params pin (migration 8): what the run covers.
	TaskDataset string   `json:"task_dataset"`
	TaskIDs     []string `json:"task_ids"`
	TaskDigests []string `json:"task_digests"`
	PolicyMix   string   `json:"policy_mix"` // "random=1,oracle=3", as people write it
	ProfileMix  string   `json:"profile_mix"`
	// ProfileFiles are the files the custom profiles were read from; CustomProfiles the
	// custom profiles' names.
	ProfileFiles   []string `json:"profile_files"`
	CustomProfiles []string `json:"custom_profiles"`
	DriftText      string   `json:"drift_text"`
	DriftSelectors []string `json:"drift_selectors"`
	Seed           uint64   `json:"seed"`
	Episodes       uint64   `json:"episodes"`
	MaxInFlight    uint32   `json:"max_in_flight"`
	MaxSteps       uint32   `json:"max_steps"`
	RewardSpec     string   `json:"reward_spec"`
	// PolicyURL, PolicyModel and PolicyCredential are the model endpoint the run's
	// "http" policy asks (RunRequested.policy_endpoint, migration 14): its URL, model
	// and the name of the credential its workers send, never the secret; empty for runs
	// of other policies.
	PolicyURL        string `json:"policy_url"`
	PolicyModel      string `json:"policy_model"`
	PolicyCredential string `json:"policy_credential"`
	// PolicyLogprobs is whether the run's "http" policy asks its endpoint for token
	// ids and logprobs (PolicyEndpoint.logprobs, migration 16): LogprobsOn, LogprobsOff,
	// or "" when the run left it to each worker's --policy.http.logprobs (and for runs
	// of other policies).
	PolicyLogprobs string `json:"policy_logprobs"`
	// CurriculumID is the curriculum workflow's id when the run is one of its batches.
	CurriculumID     string    `json:"curriculum_id"`
	CurriculumName   string    `json:"curriculum_name"`
	CurriculumPrefix string    `json:"curriculum_prefix"`
	Stage            uint32    `json:"stage"`
	StageName        string    `json:"stage_name"`
	Batch            uint32    `json:"batch"`
	GauntletVersion  string    `json:"gauntlet_version"`
	SubmittedBy      string    `json:"submitted_by"`
	SubmittedAt      time.Time `json:"submitted_at"`
	SubmittedAtNs    uint64    `json:"submitted_at_ns"`
	StartedAt        time.Time `json:"started_at"`
	StartedAtNs      uint64    `json:"started_at_ns"`
	// FinishedAt is when the scheduler counted the run's last episode (or refused it);
	// the epoch while it runs.
	FinishedAt   time.Time `json:"finished_at"`
	FinishedAtNs uint64    `json:"finished_at_ns"`
	State        string    `json:"state"` // RunRunning, RunDone or RunRefused
	Error        string    `json:"error"`
	Assigned     uint64    `json:"assigned"`
	Ended        uint64    `json:"ended"`
	Succeeded    uint64    `json:"succeeded"`
	Steps        uint64    `json:"steps"`
	FaultsFired  uint64    `json:"faults_fired"`
	InfraErrors  uint64    `json:"infra_errors"`
	RewardSum    float64   `json:"reward_sum"`
	Version      uint64    `json:"version"`
}

// runColumns is the runs table of migrations 6, 8, 14 and 16.
var runColumns = []column[RunRow]{
	col("run_id", func(r *RunRow) *string { return &r.RunID }),
	col("label", func(r *RunRow) *string { return &r.Label }),
	col("env", func(r *RunRow) *string { return &r.Env }),
	col("params", func(r *RunRow) *string { return &r.Params }),
	col("task_dataset", func(r *RunRow) *string { return &r.TaskDataset }),
	col("task_ids", func(r *RunRow) *[]string { return &r.TaskIDs }),
	col("task_digests", func(r *RunRow) *[]string { return &r.TaskDigests }),
	col("policy_mix", func(r *RunRow) *string { return &r.PolicyMix }),
	col("profile_mix", func(r *RunRow) *string { return &r.ProfileMix }),
	col("profile_files", func(r *RunRow) *[]string { return &r.ProfileFiles }),
	col("custom_profiles", func(r *RunRow) *[]string { return &r.CustomProfiles }),
	col("drift_text", func(r *RunRow) *string { return &r.DriftText }),
	col("drift_selectors", func(r *RunRow) *[]string { return &r.DriftSelectors }),
	col("seed", func(r *RunRow) *uint64 { return &r.Seed }),
	col("episodes", func(r *RunRow) *uint64 { return &r.Episodes }),
	col("max_in_flight", func(r *RunRow) *uint32 { return &r.MaxInFlight }),
	col("max_steps", func(r *RunRow) *uint32 { return &r.MaxSteps }),
	col("reward_spec", func(r *RunRow) *string { return &r.RewardSpec }),
	col("policy_url", func(r *RunRow) *string { return &r.PolicyURL }),
	col("policy_model", func(r *RunRow) *string { return &r.PolicyModel }),
	col("policy_credential", func(r *RunRow) *string { return &r.PolicyCredential }),
	col("policy_logprobs", func(r *RunRow) *string { return &r.PolicyLogprobs }),
	col("curriculum_id", func(r *RunRow) *string { return &r.CurriculumID }),
	col("curriculum_name", func(r *RunRow) *string { return &r.CurriculumName }),
	col("curriculum_prefix", func(r *RunRow) *string { return &r.CurriculumPrefix }),
	col("stage", func(r *RunRow) *uint32 { return &r.Stage }),
	col("stage_name", func(r *RunRow) *string { return &r.StageName }),
	col("batch", func(r *RunRow) *uint32 { return &r.Batch }),
	col("gauntlet_version", func(r *RunRow) *string { return &r.GauntletVersion }),
	col("submitted_by", func(r *RunRow) *string { return &r.SubmittedBy }),
	col("submitted_at", func(r *RunRow) *time.Time { return &r.SubmittedAt }),
	col("submitted_at_ns", func(r *RunRow) *uint64 { return &r.SubmittedAtNs }),
	col("started_at", func(r *RunRow) *time.Time { return &r.StartedAt }),
	col("started_at_ns", func(r *RunRow) *uint64 { return &r.StartedAtNs }),
	col("finished_at", func(r *RunRow) *time.Time { return &r.FinishedAt }),
	col("finished_at_ns", func(r *RunRow) *uint64 { return &r.FinishedAtNs }),
	col("state", func(r *RunRow) *string { return &r.State }),
	col("error", func(r *RunRow) *string { return &r.Error }),
	col("assigned", func(r *RunRow) *uint64 { return &r.Assigned }),
	col("ended", func(r *RunRow) *uint64 { return &r.Ended }),
	col("succeeded", func(r *RunRow) *uint64 { return &r.Succeeded }),
	col("steps", func(r *RunRow) *uint64 { return &r.Steps }),
	col("faults_fired", func(r *RunRow) *uint64 { return &r.FaultsFired }),
	col("infra_errors", func(r *RunRow) *uint64 { return &r.InfraErrors }),
	col("reward_sum", func(r *RunRow) *float64 { return &r.RewardSum }),
	col("version", func(r *RunRow) *uint64 { return &r.Version }),
}

// RunRowOf projects a run's state as the scheduler keeps it (the gauntlet_runs bucket)
// into its runs row.
func RunRowOf(s *gauntletv1.RunState) RunRow {
	spec := s.GetSpec()
	o := spec.GetOrigin()
	r := RunRow{
		RunID: spec.GetRunId(), Label: spec.GetLabel(), Env: spec.GetEnv(), Params: spec.GetParamsJson(),
		PolicyMix: formatShares(spec.GetPolicies()), ProfileMix: formatShares(spec.GetProfiles()),
		ProfileFiles: nonNil(o.GetProfileFiles()), CustomProfiles: []string{}, DriftText: o.GetDriftText(),
		DriftSelectors: []string{},
		Seed:           spec.GetSeed(), Episodes: spec.GetEpisodes(), MaxInFlight: spec.GetMaxInFlight(), MaxSteps: spec.GetMaxSteps(),
		RewardSpec: o.GetRewardSpec(), CurriculumID: o.GetCurriculumId(), CurriculumName: o.GetCurriculumName(),
		PolicyURL: spec.GetPolicyEndpoint().GetUrl(), PolicyModel: spec.GetPolicyEndpoint().GetModel(),
		PolicyCredential: spec.GetPolicyEndpoint().GetCredential(), PolicyLogprobs: logprobsOf(spec.GetPolicyEndpoint().GetLogprobs()),
		CurriculumPrefix: o.GetCurriculumPrefix(), Stage: o.GetStage(), StageName: o.GetStageName(), Batch: o.GetBatch(),
		GauntletVersion: o.GetGauntletVersion(), SubmittedBy: o.GetSubmittedBy(),
		SubmittedAt: dateTime(spec.GetRequestedAtUnixNano()), SubmittedAtNs: unsigned(spec.GetRequestedAtUnixNano()),
		StartedAt: dateTime(s.GetStartedAtUnixNano()), StartedAtNs: unsigned(s.GetStartedAtUnixNano()),
		FinishedAt: dateTime(0), State: RunRunning, Error: s.GetError(),
		Assigned: s.GetAssigned(), Ended: s.EndedCount(), Succeeded: s.GetSucceeded(), Steps: s.GetSteps(),
		FaultsFired: s.GetFaultsFired(), InfraErrors: s.GetInfraErrors(), RewardSum: s.GetRewardSum(),
		Version: unsigned(max(s.GetUpdatedAtUnixNano(), s.GetStartedAtUnixNano())),
	}
	r.TaskDataset, r.TaskIDs, r.TaskDigests = runTasks(spec.GetEnv(), spec.GetParamsJson())
	for _, c := range spec.GetCustomProfiles() {
		r.CustomProfiles = append(r.CustomProfiles, c.GetName())
	}
	for _, d := range spec.GetDrift() {
		r.DriftSelectors = append(r.DriftSelectors, d.GetSelector())
	}
	if s.Done() {
		r.State = RunDone
		if s.GetError() != "" {
			r.State = RunRefused
		}
		end := max(s.GetUpdatedAtUnixNano(), s.GetStartedAtUnixNano())
		r.FinishedAt, r.FinishedAtNs = dateTime(end), unsigned(end)
	}
	return r
}

// The runs table's policy_logprobs values, as a run's PolicyEndpoint.logprobs says.
const (
	LogprobsOn  = "on"
	LogprobsOff = "off"
)

// logprobsOf is l as the runs table records it: "" for unspecified.
func logprobsOf(l gauntletv1.Logprobs) string {
	switch l {
	case gauntletv1.Logprobs_LOGPROBS_ON:
		return LogprobsOn
	case gauntletv1.Logprobs_LOGPROBS_OFF:
		return LogprobsOff
	}
	return ""
}

// tasksEnv is the name of the env that plays task folders (pkg/env/taskenv.Name).
const tasksEnv = "tasks"

// runTasks reads, from the params of a run of the tasks env, its dataset and the tasks
// they pin ({"dataset", "tasks": [{"id", "digest"}]}, as pkg/env/taskenv.Selection
// writes them). Other runs, and params that do not parse (the scheduler refuses them),
// cover no recorded task.
func runTasks(env, params string) (dataset string, ids, digests []string) {
	ids, digests = []string{}, []string{}
	if env != tasksEnv {
		return "", ids, digests
	}
	var p struct {
		Dataset string `json:"dataset"`
		Tasks   []struct {
			ID     string `json:"id"`
			Digest string `json:"digest"`
		} `json:"tasks"`
	}
	if json.Unmarshal([]byte(params), &p) != nil {
		return "", ids, digests
	}
	for _, t := range p.Tasks {
		ids, digests = append(ids, t.ID), append(digests, t.Digest)
	}
	return p.Dataset, ids, digests
}

// formatShares writes shares as people do ("a=3,b=1"), as pkg/runs.FormatShares.
func formatShares(shares []*gauntletv1.Share) string {
	var b strings.Builder
	for i, s := range shares {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(s.GetName())
		b.WriteByte('=')
		b.WriteString(strconv.FormatUint(uint64(s.GetWeight()), 10))
	}
	return b.String()
}

// StageRow is one row of the curriculum_stages table (migration 6): a curriculum stage
// closing, from a gauntlet.v1.StageTransition.
type StageRow struct {
	CurriculumID     string  `json:"curriculum_id"`
	CurriculumName   string  `json:"curriculum_name"`
	CurriculumPrefix string  `json:"curriculum_prefix"`
	Stage            uint32  `json:"stage"`
	StageName        string  `json:"stage_name"`
	Outcome          string  `json:"outcome"`
	Metric           string  `json:"metric"`
	Threshold        float64 `json:"threshold"`
	WindowEpisodes   uint64  `json:"window_episodes"`
	WindowValue      float64 `json:"window_value"`
	Episodes         uint64  `json:"episodes"`
	Succeeded        uint64  `json:"succeeded"`
	RewardSum        float64 `json:"reward_sum"`
	// InfraErrors is how many of Episodes ended as infra errors (migration 14): the
	// stage's window, rates and budget left them out.
	InfraErrors uint64 `json:"infra_errors"`
	// InfraKinds and InfraCounts split InfraErrors by what failed (migration 15), in
	// parallel and sorted by kind; empty for stages closed before.
	InfraKinds  []string  `json:"infra_kinds"`
	InfraCounts []uint64  `json:"infra_counts"`
	Batches     uint32    `json:"batches"`
	NextStage   uint32    `json:"next_stage"`
	ClosedAt    time.Time `json:"closed_at"`
	ClosedAtNs  uint64    `json:"closed_at_ns"`
	Version     uint64    `json:"version"`
}

// stageColumns is the curriculum_stages table of migrations 7, 14 and 15.
var stageColumns = []column[StageRow]{
	col("curriculum_id", func(r *StageRow) *string { return &r.CurriculumID }),
	col("curriculum_name", func(r *StageRow) *string { return &r.CurriculumName }),
	col("curriculum_prefix", func(r *StageRow) *string { return &r.CurriculumPrefix }),
	col("stage", func(r *StageRow) *uint32 { return &r.Stage }),
	col("stage_name", func(r *StageRow) *string { return &r.StageName }),
	col("outcome", func(r *StageRow) *string { return &r.Outcome }),
	col("metric", func(r *StageRow) *string { return &r.Metric }),
	col("threshold", func(r *StageRow) *float64 { return &r.Threshold }),
	col("window_episodes", func(r *StageRow) *uint64 { return &r.WindowEpisodes }),
	col("window_value", func(r *StageRow) *float64 { return &r.WindowValue }),
	col("episodes", func(r *StageRow) *uint64 { return &r.Episodes }),
	col("succeeded", func(r *StageRow) *uint64 { return &r.Succeeded }),
	col("reward_sum", func(r *StageRow) *float64 { return &r.RewardSum }),
	col("infra_errors", func(r *StageRow) *uint64 { return &r.InfraErrors }),
	col("infra_kinds", func(r *StageRow) *[]string { return &r.InfraKinds }),   // migration 15
	col("infra_counts", func(r *StageRow) *[]uint64 { return &r.InfraCounts }), // migration 15
	col("batches", func(r *StageRow) *uint32 { return &r.Batches }),
	col("next_stage", func(r *StageRow) *uint32 { return &r.NextStage }),
	col("closed_at", func(r *StageRow) *time.Time { return &r.ClosedAt }),
	col("closed_at_ns", func(r *StageRow) *uint64 { return &r.ClosedAtNs }),
	col("version", func(r *StageRow) *uint64 { return &r.Version }),
}

// StageRowOf projects a stage transition into its curriculum_stages row. The version
// is the closing time: a stage closes once, so every copy is the same fact.
func StageRowOf(t *gauntletv1.StageTransition) StageRow {
	return StageRow{
		CurriculumID: t.GetCurriculumId(), CurriculumName: t.GetCurriculumName(), CurriculumPrefix: t.GetCurriculumPrefix(),
		Stage: t.GetStage(), StageName: t.GetStageName(), Outcome: t.GetOutcome(), Metric: t.GetMetric(),
		Threshold: t.GetThreshold(), WindowEpisodes: t.GetWindow(), WindowValue: t.GetWindowValue(),
		Episodes: t.GetEpisodes(), Succeeded: t.GetSucceeded(), RewardSum: t.GetRewardSum(), InfraErrors: t.GetInfraErrors(), Batches: t.GetBatches(),
		NextStage: t.GetNextStage(), ClosedAt: dateTime(t.GetClosedAtUnixNano()), ClosedAtNs: unsigned(t.GetClosedAtUnixNano()),
		Version:    unsigned(t.GetClosedAtUnixNano()),
		InfraKinds: nonNil(t.GetInfraKinds()), InfraCounts: nonNil(t.GetInfraCounts()),
	}
}

// WriteRuns inserts rows into the runs table in one batch; idempotent like Write.
func (w *Writer) WriteRuns(ctx context.Context, rows []RunRow) error {
	if w.err != nil {
		return fmt.Errorf("write runs: %w", w.err)
	}
	return insert(ctx, w.conn, w.database, "runs", runColumns, rows, &scratch{})
}

// WriteStages inserts rows into the curriculum_stages table in one batch; idempotent
// like Write.
func (w *Writer) WriteStages(ctx context.Context, rows []StageRow) error {
	if w.err != nil {
		return fmt.Errorf("write curriculum stages: %w", w.err)
	}
	return insert(ctx, w.conn, w.database, "curriculum_stages", stageColumns, rows, &scratch{})
}

// Runs reads the runs rows of the given ids (all runs when none), newest submission
// first.
func Runs(ctx context.Context, conn driver.Conn, database string, ids ...string) ([]RunRow, error) {
	if len(ids) == 0 {
		return selectRows(ctx, conn, database, "runs", runColumns, "ORDER BY submitted_at_ns DESC")
	}
	return selectRows(ctx, conn, database, "runs", runColumns, "WHERE has(?, run_id) ORDER BY submitted_at_ns DESC", ids)
}

// CurriculumRuns reads the runs rows of a curriculum, named by its workflow id or its
// run prefix, in stage and batch order.
func CurriculumRuns(ctx context.Context, conn driver.Conn, database, curriculum string) ([]RunRow, error) {
	return selectRows(ctx, conn, database, "runs", runColumns,
		"WHERE curriculum_id = ? OR curriculum_prefix = ? ORDER BY stage, batch", curriculum, curriculum)
}

// CurriculumStages reads the closed stages of a curriculum, named by its workflow id or
// its run prefix, in stage order.
func CurriculumStages(ctx context.Context, conn driver.Conn, database, curriculum string) ([]StageRow, error) {
	return selectRows(ctx, conn, database, "curriculum_stages", stageColumns,
		"WHERE curriculum_id = ? OR curriculum_prefix = ? ORDER BY stage, closed_at_ns", curriculum, curriculum)
}
