package trajectory

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/canonjson"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// The version column of every table. ReplacingMergeTree keeps, per key, the row with
// the highest version, and among equal versions the one inserted last.
//
// The version comes from the event, never from the clock of the insert: the event log
// is the truth and the tables are its projection, so a row must win because its fact
// is newer, not because it happened to be delivered later. An insert-time version
// would let a stale redelivery (or a rebuild from the stream) overwrite a newer row,
// and would make two rebuilds of the projection differ.
//
//   - steps and faults: stepVersion, a constant. Copies of a StepTaken are the same
//     fact: a redelivery is the same bytes, and a deterministic re-run differs only in
//     host measurements (wall_ns, worker_id). Any copy is right, and a constant makes
//     redelivered copies identical rows, so FINAL, GROUP BY and merges agree. (The
//     event carries no attempt number; if re-runs could take different actions, an
//     attempt field in StepTaken would be the version to use.)
//   - episodes: the episode's ended_at_unix_nano. An episode retried after an infra
//     error ends again, later: the later end is the one that counts, whatever the
//     order in which the two EpisodeEnded events arrive.
//   - episode_worlds: the episode's started_at_unix_nano, for the same reason.
const stepVersion = 1

// WorldRow is one row of the episode_worlds table (migration 11): the world file an
// episode of a world env played, by name and digest. It comes from the episode's first
// observation (EpisodeStarted), which a world begins with {"world":NAME,"digest":...}:
// the digest is what the worker loaded, whatever another process has.
type WorldRow struct {
	RunID       string
	EpisodeID   string
	RequestedAt time.Time
	World       string
	Digest      string
	Version     uint64
}

// worldRowOf projects the start of an episode of a world; ok is false for any other env.
func worldRowOf(s *gauntletv1.EpisodeStarted) (WorldRow, bool) {
	world, digest, ok := worldOf(s.GetObservationJson())
	if !ok || s.GetEpisode().GetEpisodeId() == "" {
		return WorldRow{}, false
	}
	req := s.GetEpisode()
	return WorldRow{
		RunID:       req.GetRunId(),
		EpisodeID:   req.GetEpisodeId(),
		RequestedAt: dateTime(req.GetRequestedAtUnixNano()),
		World:       world,
		Digest:      digest,
		Version:     unsigned(s.GetStartedAtUnixNano()),
	}, true
}

// worldOf reads the name and digest a world's first observation starts with (its name is
// letters, digits and _, its digest "sha256:" and hex, so neither has escapes). Any other
// observation is not a world's.
func worldOf(obs string) (world, digest string, ok bool) {
	const head, mid = `{"world":"`, `","digest":"`
	rest, found := strings.CutPrefix(obs, head)
	if !found {
		return "", "", false
	}
	world, rest, found = strings.Cut(rest, mid)
	if !found || world == "" || strings.ContainsAny(world, `"\`) {
		return "", "", false
	}
	digest, _, found = strings.Cut(rest, `"`)
	if !found || !strings.HasPrefix(digest, "sha256:") || strings.Contains(digest, `\`) {
		return "", "", false
	}
	return world, digest, true
}

// StepRow is one row of the steps table: one step of one episode, with its metering,
// signals and reward vector. Times are DateTime, so RequestedAt has whole seconds.
type StepRow struct {
	RunID       string
	EpisodeID   string
	Step        uint32
	RequestedAt time.Time
	Env         string
	Policy      string
	Profile     string
	WorkerID    string
	Tool        string
	// Agent is the role that acted, in a world of several agents, whose actions are
	// named "role:tool": the part of Tool before the colon (migration 13). Empty for
	// every other env.
	Agent       string
	Args        string // canonical JSON
	Observation string // canonical JSON
	StateDiff   string // canonical JSON
	// Faults fired during the step, as parallel arrays (one entry per fault).
	FaultIDs     []string
	FaultKinds   []string
	FaultTargets []string
	FaultDetails []string
	ToolCalls    uint32
	Errors       uint32
	VirtualNs    uint64
	WallNs       uint64
	BytesIn      uint32
	BytesOut     uint32
	Progress     float64
	// InvalidAction and the other flags are UInt8 columns (18.16 has no Bool).
	InvalidAction    bool
	Success          bool
	ViolationRules   []string
	ViolationReasons []string
	SafetyEvents     []string
	Spend            float64
	Terminated       bool
	Truncated        bool
	// Reason is the termination reason's short name ("success", "max_steps"), "" while
	// the episode goes on.
	Reason        string
	VirtualTimeNs uint64
	// Reward is the weighted total; RTask to RCausal are the (unweighted) values of
	// the components of those names, 0 when the spec has no such component.
	Reward      float64
	RTask       float64
	RCost       float64
	RSafety     float64
	RTimeliness float64
	RCausal     float64
	// RewardNames and RewardValues are the whole reward vector, in the spec's order.
	RewardNames  []string
	RewardValues []float64
	RewardSpec   string
	Version      uint64
	// RewardSpecDigest names the spec's row in reward_specs (migration 7); empty for
	// steps recorded before specs had digests.
	RewardSpecDigest string

	// Measured by a real sandbox around the step's commands (migration 2); zero for sim.
	CPUNs           uint64
	PeakMemoryBytes uint64
	Processes       uint32
	ReadBytes       uint64
	WrittenBytes    uint64
	Runtime         string

	// Where the step's time went besides the env's WallNs (migration 6): the policy
	// choosing the action, the scoring of the step.
	PolicyNs uint64
	RewardNs uint64

	// The rest of the step's signals (migration 10): with the columns above, every input
	// of its score, so it can be re-scored from the row (Rescore). ScoringInputs says
	// the row has them; rows recorded before have 0 here and cannot be re-scored.
	ProgressDelta        float64
	Budget               float64
	DeadlineVirtualNs    int64
	ViolationSuggestions []string
	ScoringInputs        bool

	// VerifierNames and VerifierValues are the named numbers a task's verifier wrote, on
	// its verdict step (migration 12; Signals.verifier_names, verifier_values): in
	// parallel, sorted by name, empty on other steps. Scores read them too.
	VerifierNames  []string
	VerifierValues []float64

	// Limits are the resource limits the step's sandbox hit, "KIND: DETAIL" (migration
	// 15; Signals.limits): kept apart from SafetyEvents since honest programs hit them.
	// Steps recorded before hold theirs in SafetyEvents, and are scored so.
	Limits []string
}

// EpisodeRow is one row of the episodes table, from an EpisodeEnded event.
type EpisodeRow struct {
	RunID     string
	EpisodeID string
	Idx       uint64
	Env       string
	Params    string // canonical JSON
	Seed      uint64
	Policy    string
	Profile   string
	// Plan is a whole FaultPlan as compact protojson with proto field names; empty for
	// a plan recorded by reference (the columns below, pkg/faults/plans.Expand).
	Plan        string
	WorkerID    string
	RequestedAt time.Time
	StartedAt   time.Time
	EndedAt     time.Time
	StartedAtNs uint64
	EndedAtNs   uint64
	Steps       uint32
	Terminated  bool
	Truncated   bool
	Reason      string
	InfraError  bool
	Error       string
	Success     bool
	TotalReward float64
	FaultsFired uint32
	// VirtualTimeNs is the episode's virtual clock at its end.
	VirtualTimeNs uint64
	Version       uint64
	// DriftSelectors, DriftValues and DriftSources are the plan's drift_values as
	// parallel arrays.
	DriftSelectors []string
	DriftValues    []float64
	DriftSources   []string
	// PlanSeed, CatalogueVersion, PlanTemplate and PlanDigest are the plan's inputs and
	// digest; with Profile, the env's services and the drift values they re-derive it.
	PlanSeed         uint64
	CatalogueVersion string
	PlanTemplate     string
	PlanDigest       string
	// RewardSpecDigest is the digest of the spec the episode's steps were scored under
	// (migration 7).
	RewardSpecDigest string
	// ParentEpisodeID and ParentStep are, for an episode forked from another, that
	// episode and the step it was forked at (migration 9); empty and 0 otherwise.
	ParentEpisodeID string
	ParentStep      uint32
	// InfraKind is what failed in an infra error (migration 10): "model_endpoint",
	// "sandbox", "verifier" or "gauntlet"; "" for every other end, and for an infra error
	// recorded before infra errors said what failed.
	InfraKind string
	// VerifierNames and VerifierValues are the named numbers of a task's verifier, as on
	// the episode's last step (migration 12); empty for an infra error.
	VerifierNames  []string
	VerifierValues []float64
}

// infraKind is the InfraKind column of an end: an infra error recorded by a sender that
// predates kinds says nothing, and is recorded as "".
func infraKind(e *gauntletv1.EpisodeEnded) string {
	if !e.GetInfraError() {
		return ""
	}
	return e.GetInfraKind().Name()
}

// RewardSpecRow is one row of reward_specs: a reward spec, recorded once by digest.
type RewardSpecRow struct {
	Digest string
	// Spec is the id steps.reward_spec records ("default/1"); Name and SpecVersion its parts.
	Spec        string
	Name        string
	SpecVersion string
	Source      string // the file
	// Components, Weights and Rules are the spec's components in order: name, weight,
	// and what produces its raw value ("builtin task", "expr ...", "potential ...").
	Components []string
	Weights    []float64
	Rules      []string
	Version    uint64
}

// TemplateRow is one row of plan_templates: a user-defined profile's plan template.
type TemplateRow struct {
	Template         string // its id
	Profile          string
	CatalogueVersion string
	Plan             string // the template as a FaultPlan in canonical JSON
	Version          uint64
}

// CompactPlan returns the compact plan the row records (nil when the row holds a whole
// plan in Plan, or no plan), for pkg/faults/plans.Expand. Its digest is empty when the episode
// ended before its plan was expanded (a request that could not be played).
func (r EpisodeRow) CompactPlan() *gauntletv1.FaultPlan {
	if r.Plan != "" || r.CatalogueVersion == "" {
		return nil
	}
	p := &gauntletv1.FaultPlan{Profile: r.Profile, Seed: r.PlanSeed, CatalogueVersion: r.CatalogueVersion,
		Digest: r.PlanDigest, Compact: true, Template: r.PlanTemplate}
	for i, sel := range r.DriftSelectors {
		p.DriftValues = append(p.DriftValues, &gauntletv1.DriftValue{Selector: sel, Value: r.DriftValues[i], Source: r.DriftSources[i]})
	}
	return p
}

// FaultRow is one row of the faults table: one fault that fired during a step.
type FaultRow struct {
	RunID       string
	EpisodeID   string
	Step        uint32
	Seq         uint16 // index among the step's faults
	RequestedAt time.Time
	Profile     string
	FaultID     string
	Kind        string
	Target      string
	Detail      string
	AtVirtualNs int64
	Version     uint64
}

// agentOf is the role an action names ("role:tool"), or "" when it names none.
func agentOf(tool string) string {
	role, _, ok := strings.Cut(tool, ":")
	if !ok {
		return ""
	}
	return role
}

// newStepRow projects a StepTaken scored sc (read with StepsTaken.ScoreOf, so the
// score's names and values may share the event's memory). Arrays are empty, not nil,
// when the event has no entries, as ClickHouse returns them.
func newStepRow(s *gauntletv1.StepTaken, sc gauntletv1.Score) StepRow {
	r := StepRow{
		RunID:            s.GetRunId(),
		EpisodeID:        s.GetEpisodeId(),
		Step:             s.GetStep(),
		RequestedAt:      dateTime(s.GetRequestedAtUnixNano()),
		Env:              s.GetEnv(),
		Policy:           s.GetPolicy(),
		Profile:          s.GetProfile(),
		WorkerID:         s.GetWorkerId(),
		Tool:             s.GetAction().GetTool(),
		Agent:            agentOf(s.GetAction().GetTool()),
		Args:             s.GetAction().GetArgsJson(),
		Observation:      s.GetObservationJson(),
		StateDiff:        s.GetStateDiffJson(),
		ToolCalls:        s.GetMetering().GetToolCalls(),
		Errors:           s.GetMetering().GetErrors(),
		VirtualNs:        s.GetMetering().GetVirtualNs(),
		WallNs:           s.GetMetering().GetWallNs(),
		BytesIn:          s.GetMetering().GetBytesIn(),
		BytesOut:         s.GetMetering().GetBytesOut(),
		Progress:         s.GetSignals().GetProgress(),
		InvalidAction:    s.GetSignals().GetInvalidAction(),
		Success:          s.GetSignals().GetSuccess(),
		SafetyEvents:     nonNil(s.GetSignals().GetSafetyEvents()),
		Spend:            s.GetSignals().GetSpend(),
		Terminated:       s.GetTerminated(),
		Truncated:        s.GetTruncated(),
		Reason:           s.GetReason().Name(),
		VirtualTimeNs:    unsigned(s.GetVirtualTimeNs()),
		Reward:           sc.Total,
		RewardSpec:       sc.Version,
		RewardSpecDigest: sc.Digest,
		RewardNames:      nonNil(sc.Names),
		RewardValues:     nonNil(sc.Values),
		Version:          stepVersion,
	}
	m := s.GetMetering()
	r.CPUNs, r.PeakMemoryBytes, r.Processes = m.GetCpuNs(), m.GetPeakMemoryBytes(), m.GetProcesses()
	r.ReadBytes, r.WrittenBytes, r.Runtime = m.GetReadBytes(), m.GetWrittenBytes(), m.GetRuntime()
	r.PolicyNs, r.RewardNs = m.GetPolicyNs(), m.GetRewardNs()
	sig := s.GetSignals()
	r.ProgressDelta, r.Budget, r.DeadlineVirtualNs = sig.GetProgressDelta(), sig.GetBudget(), sig.GetDeadlineVirtualNs()
	r.ScoringInputs = true
	r.VerifierNames, r.VerifierValues = parallel(sig.GetVerifierNames(), sig.GetVerifierValues())
	r.Limits = nonNil(sig.GetLimits())

	faults := s.GetFaults()
	r.FaultIDs = make([]string, len(faults))
	r.FaultKinds = make([]string, len(faults))
	r.FaultTargets = make([]string, len(faults))
	r.FaultDetails = make([]string, len(faults))
	for i, f := range faults {
		r.FaultIDs[i], r.FaultKinds[i], r.FaultTargets[i], r.FaultDetails[i] =
			f.GetFaultId(), f.GetKind(), f.GetTarget(), f.GetDetail()
	}

	violations := s.GetSignals().GetViolations()
	r.ViolationRules = make([]string, len(violations))
	r.ViolationReasons = make([]string, len(violations))
	r.ViolationSuggestions = make([]string, len(violations))
	for i, v := range violations {
		r.ViolationRules[i], r.ViolationReasons[i], r.ViolationSuggestions[i] = v.GetRule(), v.GetReason(), v.GetSuggestion()
	}

	for i, name := range r.RewardNames {
		v := r.RewardValues[i]
		switch name {
		case scoring.ComponentTask:
			r.RTask = v
		case scoring.ComponentCost:
			r.RCost = v
		case scoring.ComponentSafety:
			r.RSafety = v
		case scoring.ComponentTimeliness:
			r.RTimeliness = v
		case scoring.ComponentCausal:
			r.RCausal = v
		}
	}
	return r
}

// appendFaultRows appends one row per fault of s. Faults past the 65,536th of a step
// are dropped: seq is a UInt16 and no env fires that many.
func appendFaultRows(rows []FaultRow, s *gauntletv1.StepTaken) []FaultRow {
	faults := s.GetFaults()
	if len(faults) > math.MaxUint16+1 {
		faults = faults[:math.MaxUint16+1]
	}
	requestedAt := dateTime(s.GetRequestedAtUnixNano())
	for i, f := range faults {
		rows = append(rows, FaultRow{
			RunID:       s.GetRunId(),
			EpisodeID:   s.GetEpisodeId(),
			Step:        s.GetStep(),
			Seq:         uint16(i),
			RequestedAt: requestedAt,
			Profile:     s.GetProfile(),
			FaultID:     f.GetFaultId(),
			Kind:        f.GetKind(),
			Target:      f.GetTarget(),
			Detail:      f.GetDetail(),
			AtVirtualNs: f.GetAtVirtualNs(),
			Version:     stepVersion,
		})
	}
	return rows
}

// newEpisodeRow projects an EpisodeEnded.
func newEpisodeRow(e *gauntletv1.EpisodeEnded) (EpisodeRow, error) {
	var plan string
	if p := e.GetPlan(); p != nil && !p.GetCompact() { // a whole plan, from an older worker
		var err error
		if plan, err = canonicalJSON(p); err != nil {
			return EpisodeRow{}, fmt.Errorf("episode %s: encode fault plan: %w", e.GetEpisode().GetEpisodeId(), err)
		}
	}
	req := e.GetEpisode()
	names, values := parallel(e.GetVerifierNames(), e.GetVerifierValues())
	dv := e.GetPlan().GetDriftValues()
	sels, vals, srcs := make([]string, len(dv)), make([]float64, len(dv)), make([]string, len(dv))
	for i, v := range dv {
		sels[i], vals[i], srcs[i] = v.GetSelector(), v.GetValue(), v.GetSource()
	}
	return EpisodeRow{
		DriftSelectors:   sels,
		DriftValues:      vals,
		DriftSources:     srcs,
		RunID:            req.GetRunId(),
		EpisodeID:        req.GetEpisodeId(),
		Idx:              req.GetIndex(),
		Env:              req.GetEnv(),
		Params:           req.GetParamsJson(),
		Seed:             req.GetSeed(),
		Policy:           req.GetPolicy(),
		Profile:          e.GetProfile(),
		Plan:             plan,
		PlanSeed:         e.GetPlan().GetSeed(),
		CatalogueVersion: e.GetPlan().GetCatalogueVersion(),
		PlanTemplate:     e.GetPlan().GetTemplate(),
		PlanDigest:       e.GetPlan().GetDigest(),
		RewardSpecDigest: rewardSpecDigest(e.GetEpisode()),
		ParentEpisodeID:  req.GetParentEpisodeId(),
		ParentStep:       req.GetParentStep(),
		WorkerID:         e.GetWorkerId(),
		RequestedAt:      dateTime(req.GetRequestedAtUnixNano()),
		StartedAt:        dateTime(e.GetStartedAtUnixNano()),
		EndedAt:          dateTime(e.GetEndedAtUnixNano()),
		StartedAtNs:      unsigned(e.GetStartedAtUnixNano()),
		EndedAtNs:        unsigned(e.GetEndedAtUnixNano()),
		Steps:            e.GetSteps(),
		Terminated:       e.GetTerminated(),
		Truncated:        e.GetTruncated(),
		Reason:           e.GetReason().Name(),
		InfraError:       e.GetInfraError(),
		InfraKind:        infraKind(e),
		VerifierNames:    names,
		VerifierValues:   values,
		Error:            e.GetError(),
		Success:          e.GetSuccess(),
		TotalReward:      e.GetTotalReward(),
		FaultsFired:      e.GetFaultsFired(),
		VirtualTimeNs:    unsigned(e.GetVirtualTimeNs()),
		Version:          unsigned(e.GetEndedAtUnixNano()), // see stepVersion
	}, nil
}

// canonicalJSON encodes plan as compact JSON in protojson's shape (proto field names,
// fields in number order, zero values left out, 64-bit integers as strings), written by
// hand: it runs once per episode in the store's hot path, where protojson's reflection
// was a large share of Write (docs/benchmarks.md, Costs the code cites, Trajectory
// store). TestCanonicalJSONMatchesProtojson holds the two together. A
// nil plan encodes as "{}".
func canonicalJSON(plan *gauntletv1.FaultPlan) (string, error) {
	w := &jsonObject{b: make([]byte, 0, 256+160*len(plan.GetRules()))}
	w.open()
	w.str("profile", plan.GetProfile())
	if seed := plan.GetSeed(); seed != 0 {
		w.key("seed")
		w.b = strconv.AppendUint(append(w.b, '"'), seed, 10)
		w.b = append(w.b, '"')
	}
	if rules := plan.GetRules(); len(rules) > 0 {
		w.key("rules")
		w.b = append(w.b, '[')
		for i, r := range rules {
			if i > 0 {
				w.b = append(w.b, ',')
			}
			w.rule(r)
		}
		w.b = append(w.b, ']')
	}
	w.str("catalogue_version", plan.GetCatalogueVersion())
	if dv := plan.GetDriftValues(); len(dv) > 0 {
		w.key("drift_values")
		w.b = append(w.b, '[')
		for i, v := range dv {
			if i > 0 {
				w.b = append(w.b, ',')
			}
			w.open()
			w.str("selector", v.GetSelector())
			w.float("value", v.GetValue())
			w.str("source", v.GetSource())
			w.close()
		}
		w.b = append(w.b, ']')
	}
	w.str("boundary_spec", plan.GetBoundarySpec())
	w.close()
	if w.err != nil {
		return "", w.err
	}
	return string(w.b), nil
}

// jsonObject writes JSON objects the way protojson does: keys in call order, zero values
// left out. Nested objects share its buffer; each level keeps its own field count.
type jsonObject struct {
	b      []byte
	counts []int // fields written so far, per open object
	err    error
}

func (w *jsonObject) open() { w.b = append(w.b, '{'); w.counts = append(w.counts, 0) }

func (w *jsonObject) close() { w.b = append(w.b, '}'); w.counts = w.counts[:len(w.counts)-1] }

// key writes the separator and the key of the next field.
func (w *jsonObject) key(name string) {
	top := len(w.counts) - 1
	if w.counts[top] > 0 {
		w.b = append(w.b, ',')
	}
	w.counts[top]++
	w.b = append(canonjson.AppendString(w.b, name), ':')
}

func (w *jsonObject) str(name, v string) {
	if v != "" {
		w.key(name)
		w.b = canonjson.AppendString(w.b, v)
	}
}

func (w *jsonObject) uint(name string, v uint32) {
	if v != 0 {
		w.key(name)
		w.b = strconv.AppendUint(w.b, uint64(v), 10)
	}
}

func (w *jsonObject) float(name string, v float64) {
	if v == 0 || w.err != nil {
		return
	}
	w.key(name)
	b, err := canonjson.AppendFloat(w.b, v)
	if err != nil {
		w.err = fmt.Errorf("%s: %w", name, err)
		return
	}
	w.b = b
}

// rule writes one FaultRule; its oneof is present even when empty, as in protojson.
func (w *jsonObject) rule(r *gauntletv1.FaultRule) {
	w.open()
	w.str("id", r.GetId())
	w.str("target", r.GetTarget())
	w.float("probability", r.GetProbability())
	switch s := r.GetSpec().(type) {
	case *gauntletv1.FaultRule_HttpError:
		w.key("http_error")
		w.open()
		w.uint("status", s.HttpError.GetStatus())
		w.uint("retry_after_ms", s.HttpError.GetRetryAfterMs())
		w.close()
	case *gauntletv1.FaultRule_Latency:
		w.key("latency")
		w.open()
		w.float("mean_ms", s.Latency.GetMeanMs())
		w.float("jitter_ms", s.Latency.GetJitterMs())
		w.close()
	case *gauntletv1.FaultRule_Truncate:
		w.key("truncate")
		w.open()
		w.float("keep_fraction", s.Truncate.GetKeepFraction())
		w.close()
	}
	w.close()
}

// dateTime converts Unix nanoseconds to the second-precision UTC time a DateTime
// column holds; times before 1970 (which DateTime cannot hold) become the epoch.
func dateTime(unixNano int64) time.Time {
	if unixNano < 0 {
		unixNano = 0
	}
	return time.Unix(unixNano/int64(time.Second), 0).UTC()
}

// unsigned clamps a signed count of nanoseconds to the UInt64 columns that hold it.
func unsigned(n int64) uint64 {
	if n < 0 {
		return 0
	}
	return uint64(n)
}

// nonNil returns s, or an empty slice for nil: arrays are empty, not nil, in rows, as
// ClickHouse returns them.
// parallel returns names and values cut to the same length, never nil, so an ARRAY JOIN
// of the two columns never fails on an env that sent more of one than of the other.
func parallel(names []string, values []float64) ([]string, []float64) {
	n := min(len(names), len(values))
	return nonNil(names[:n]), nonNil(values[:n])
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// rewardSpecDigest is the digest of the spec episode's steps were scored under: the one
// its run named, else the built-in spec's.
func rewardSpecDigest(e *gauntletv1.EpisodeRequested) string {
	if d := e.GetRewardSpec(); d != "" {
		return d
	}
	return scoring.DefaultDigest()
}

// NewRewardSpecRow returns the reward_specs row of spec.
func NewRewardSpecRow(spec scoring.Spec) RewardSpecRow {
	r := RewardSpecRow{
		Digest: spec.Digest, Spec: spec.Version, Name: spec.Name, Source: spec.Source,
		SpecVersion: strings.TrimPrefix(spec.Version, spec.Name+"/"),
		Components:  make([]string, len(spec.Weights)), Weights: make([]float64, len(spec.Weights)),
		Rules: spec.Rules(), Version: 1,
	}
	for i, w := range spec.Weights {
		r.Components[i], r.Weights[i] = w.Component, w.Weight
	}
	return r
}
