package workflows

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Promotion metrics.
const (
	MetricSuccessRate = "success_rate"
	MetricRewardMean  = "reward_mean"
)

// Limits on a curriculum spec.
const (
	MaxStages = 1000
	// MaxBatchesPerExecution bounds the batches one workflow execution runs before it
	// continues as new, so its history stays small (about 10 events per batch).
	MaxBatchesPerExecution = 200
)

// CurriculumSpec is a curriculum: ordered stages, each run in batches until its promotion
// rule holds (next stage) or its episode budget is spent (the curriculum stops there).
// It is read from YAML or JSON with unknown keys refused; field names are the YAML/JSON keys.
type CurriculumSpec struct {
	// Name is a free-form name, kept in reports.
	Name string `json:"name,omitempty" yaml:"name"`
	// Seed derives every batch's seed: the same spec and seed give the same episodes.
	Seed uint64 `json:"seed,omitempty" yaml:"seed"`
	// MaxInFlight caps the episodes of one batch in flight at once (default 2000).
	MaxInFlight uint32 `json:"max_in_flight,omitempty" yaml:"max_in_flight"`
	// Stages run in order.
	Stages []StageSpec `json:"stages" yaml:"stages"`
}

// StageSpec is one stage of a curriculum.
type StageSpec struct {
	// Name names the stage in progress and reports (default "stage-<index>").
	Name string `json:"name,omitempty" yaml:"name"`
	// Env is the task family, e.g. "shop".
	Env string `json:"env" yaml:"env"`
	// Params are the env's parameters (a mapping; default: the env's defaults).
	Params map[string]any `json:"params,omitempty" yaml:"params"`
	// Tasks makes the stage play a set of task folders: the tasks env (Env may be left
	// out) over a dataset of the stack, filtered. Its keys become the env's params.
	Tasks *TaskSet `json:"tasks,omitempty" yaml:"tasks"`
	// Policies is the policy mix, "oracle=3,random=1" as `gauntlet run --policies` takes it.
	Policies string `json:"policies" yaml:"policies"`
	// Profiles is the fault profile mix, "baseline=60,stress=40" (default: baseline only).
	Profiles string `json:"profiles,omitempty" yaml:"profiles"`
	// MaxSteps truncates each episode (0: the env's default).
	MaxSteps uint32 `json:"max_steps,omitempty" yaml:"max_steps"`
	// Episodes is the stage's budget.
	Episodes Budget `json:"episodes" yaml:"episodes"`
	// Batch is how many episodes run per batch (default: Promotion.Window). It must divide
	// the window and both budget bounds, so "the last K episodes" is exact.
	Batch uint64 `json:"batch,omitempty" yaml:"batch"`
	// Promotion says when the stage is passed.
	Promotion Promotion `json:"promotion" yaml:"promotion"`
	// Drift ramps fault parameters over the stage's episodes.
	Drift []DriftSpec `json:"drift,omitempty" yaml:"drift"`
	// RewardSpec is the text of the reward spec file the stage's steps are scored under
	// (docs/rewards.md; default: the built-in default/1), written inline so the workflow's
	// input is the whole curriculum.
	RewardSpec string `json:"reward_spec,omitempty" yaml:"reward_spec"`
	// PolicyEndpoint is the model endpoint the stage's "http" policy asks; required
	// when its policies name it, refused otherwise.
	PolicyEndpoint *EndpointSpec `json:"policy_endpoint,omitempty" yaml:"policy_endpoint"`
}

// EndpointSpec is the model endpoint of a stage's or a batch's "http" policy
// (gauntlet.v1.PolicyEndpoint). It is part of the workflow's input, kept in Temporal's
// history, and recorded with each run: it names the credential whose key the workers
// send (a file of their --policy.http.credentials-dir), never the key.
type EndpointSpec struct {
	// URL is the OpenAI-compatible API base, e.g. http://10.0.0.7:8000/v1.
	URL string `json:"url" yaml:"url"`
	// Model is the model name sent (default: the workers' --policy.http.model).
	Model string `json:"model,omitempty" yaml:"model"`
	// Credential names the key to send (default: the workers' --policy.http.api-key).
	Credential string `json:"credential,omitempty" yaml:"credential"`
	// Logprobs says whether the policy asks for the completions' token ids and logprobs
	// and records them (default: the workers' --policy.http.logprobs).
	Logprobs *bool `json:"logprobs,omitempty" yaml:"logprobs"`
}

// proto is the endpoint as runs carry it; nil for none.
func (e *EndpointSpec) proto() *gauntletv1.PolicyEndpoint {
	if e == nil {
		return nil
	}
	return &gauntletv1.PolicyEndpoint{Url: e.URL, Model: e.Model, Credential: e.Credential, Logprobs: policy.LogprobsProto(e.Logprobs)}
}

// TaskSet is a stage's tasks: a dataset the stack plays (one of its --tasks.datasets
// names) and filters over its tasks, as `gauntlet run --tasks` takes them. Each episode
// plays the task its seed picks among those the filters select (docs/tasks.md).
type TaskSet struct {
	Dataset string `json:"dataset" yaml:"dataset"`
	// Tags: a task must have every one.
	Tags []string `json:"tags,omitempty" yaml:"tags"`
	// Difficulty: a task's difficulty must be one of these (easy, medium, hard).
	Difficulty []string `json:"difficulty,omitempty" yaml:"difficulty"`
	// Glob: a task's id must match one of these patterns (path.Match).
	Glob []string `json:"glob,omitempty" yaml:"glob"`
	// Tasks pins the selection by id and digest. `gauntlet curriculum start` fills it
	// from the dataset when the stack's stack.json names the dataset's folder, so the
	// curriculum's runs record the tasks they cover and refuse a task changed since.
	Tasks []TaskPin `json:"tasks,omitempty" yaml:"tasks"`
	// CanaryRate mixes the dataset's canaries into the stage's draws: the share of its
	// episodes (0..1) that play one, chosen by each episode's seed (docs/tasks.md).
	CanaryRate float64 `json:"canary_rate,omitempty" yaml:"canary_rate"`
}

// TaskPin is one task of a pinned selection (pkg/env/taskenv.Pinned).
type TaskPin struct {
	ID     string `json:"id" yaml:"id"`
	Digest string `json:"digest" yaml:"digest"`
}

// tasksEnv is the env task sets are played by (pkg/env/taskenv.Name).
const tasksEnv = "tasks"

// selectionParams are the params of the tasks env a task set fills.
var selectionParams = []string{"dataset", "task", "digest", "tags", "difficulty", "glob", "tasks", "canary_rate"}

// Budget bounds a stage's episodes: promotion is not considered before Min episodes ran,
// and the curriculum stops at the stage when Max ran without promotion.
type Budget struct {
	Min uint64 `json:"min" yaml:"min"`
	Max uint64 `json:"max" yaml:"max"`
}

// Promotion is a stage's rule: Metric over the stage's last Window episodes >= Threshold.
type Promotion struct {
	// Metric is "success_rate" (successful episodes / episodes) or "reward_mean" (mean of
	// the episodes' total reward).
	Metric    string  `json:"metric" yaml:"metric"`
	Threshold float64 `json:"threshold" yaml:"threshold"`
	Window    uint64  `json:"window" yaml:"window"`
}

// DriftSpec ramps one fault parameter linearly from From (the stage's first episode) to
// To (its episodes.max-th episode); the faults service records the value in force on every
// episode (ClickHouse episodes.drift_selectors / drift_values).
type DriftSpec struct {
	// Selector names the fault parameter: "<service|*>.<fault>.<param>", e.g.
	// "*.latency.mean_ms" (docs/faults.md lists them).
	Selector string  `json:"selector" yaml:"selector"`
	From     float64 `json:"from" yaml:"from"`
	To       float64 `json:"to" yaml:"to"`
	// Continue starts the ramp where the previous stage's ramp of the same selector was
	// when that stage ended (the value in force for its next episode), instead of at
	// From, which must be left out: a stage promoted early hands on its difficulty
	// rather than dropping back.
	Continue bool `json:"continue,omitempty" yaml:"continue"`
}

// LoadSpec reads a curriculum from YAML (JSON is YAML too) and validates it: the one
// check `gauntlet curriculum validate` and `start` both make, so a spec that validates
// starts. A spec over MaxSpecBytes is refused unread (ErrSpecTooLarge). Every problem is
// reported at once (unknown keys, wrong types and invalid values alike), each naming the
// key as written and its line, e.g. "line 7: stages[1].promotion.window: must be > 0";
// no message quotes more than a few dozen bytes of the input.
func LoadSpec(r io.Reader) (CurriculumSpec, error) {
	var s CurriculumSpec
	data, err := io.ReadAll(io.LimitReader(r, MaxSpecBytes+1))
	if err != nil {
		return s, fmt.Errorf("curriculum spec: read: %w", err)
	}
	if len(data) > MaxSpecBytes {
		return s, ErrSpecTooLarge
	}
	decodeErrs, lines, err := decodeSpec(data, &s)
	if err != nil {
		return s, err
	}
	s.Normalize()
	// What start sends is the spec as JSON, the workflow's input: checked before the
	// values, as a spec too large to send needs no other answer.
	if _, err := EncodeSpec(s); err != nil {
		return s, err
	}
	problems := append(decodeErrs, s.problems(decodeErrs)...)
	for _, p := range problems {
		if p.Line == 0 {
			p.Line = lineOf(lines, p.Path)
		}
	}
	if err := joinFieldErrors(problems); err != nil {
		return s, err
	}
	return s, nil
}

// lineOf is the line of the key at path, or of its nearest parent that has one.
func lineOf(lines map[string]int, path string) int {
	for path != "" {
		if l, ok := lines[path]; ok {
			return l
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			return 0
		}
		path = path[:i]
	}
	return 0
}

// EncodeSpec is the workflow input for a valid spec: its JSON, refused with
// ErrSpecTooLarge over MaxSpecBytes (aliases can make a small YAML file a large spec).
func EncodeSpec(s CurriculumSpec) (json.RawMessage, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encode curriculum spec: %w", err)
	}
	if len(b) > MaxSpecBytes {
		return nil, ErrSpecTooLarge
	}
	return b, nil
}

// ParseSpecJSON reads a curriculum from JSON, refusing unknown keys, and validates it.
// Workflows call it on their input, so a spec started with the temporal CLI is checked as
// strictly as one started with gauntlet, and against the same size limit.
func ParseSpecJSON(b []byte) (CurriculumSpec, error) {
	var s CurriculumSpec
	if len(b) > MaxSpecBytes {
		return s, ErrSpecTooLarge
	}
	decode := func(strict bool) error {
		s = CurriculumSpec{}
		dec := json.NewDecoder(bytes.NewReader(b))
		if strict {
			dec.DisallowUnknownFields()
		}
		dec.UseNumber()
		return dec.Decode(&s)
	}
	var unknown error
	if err := decode(true); err != nil {
		// An unknown key does not hide the other problems: decoded again without it.
		if !strings.Contains(err.Error(), "unknown field") || decode(false) != nil {
			return s, fmt.Errorf("curriculum spec: %s", boundMessage(err.Error()))
		}
		unknown = fmt.Errorf("curriculum spec: %s", boundMessage(err.Error()))
	}
	s.Params2Float()
	s.Normalize()
	if err := errors.Join(unknown, s.Validate()); err != nil {
		return s, err
	}
	return s, nil
}

// Params2Float turns json.Number parameter values into float64 or int64, as YAML gives.
func (s *CurriculumSpec) Params2Float() {
	for i := range s.Stages {
		for k, v := range s.Stages[i].Params {
			if n, ok := v.(json.Number); ok {
				if iv, err := n.Int64(); err == nil {
					s.Stages[i].Params[k] = iv
				} else if fv, err := n.Float64(); err == nil {
					s.Stages[i].Params[k] = fv
				}
			}
		}
	}
}

// unknownField matches yaml.v3's message for a key KnownFields refuses.
var unknownField = regexp.MustCompile(`field (\S+) not found in type \S+`)

// yamlMessage makes yaml.v3's type errors read as field errors.
func yamlMessage(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs := make([]string, len(te.Errors))
		for i, m := range te.Errors {
			msgs[i] = unknownField.ReplaceAllString(m, `unknown key "$1"`)
		}
		return strings.Join(msgs, "; ")
	}
	return err.Error()
}

// Normalize fills defaults: stage names, batch sizes, the baseline profile.
func (s *CurriculumSpec) Normalize() {
	if s.MaxInFlight == 0 {
		s.MaxInFlight = runs.DefaultMaxInFlight
	}
	for i := range s.Stages {
		st := &s.Stages[i]
		if st.Name == "" {
			st.Name = fmt.Sprintf("stage-%d", i)
		}
		if st.Profiles == "" {
			st.Profiles = "baseline=1"
		}
		if st.Batch == 0 {
			st.Batch = st.Promotion.Window
		}
		if st.Episodes.Min == 0 {
			st.Episodes.Min = st.Promotion.Window
		}
		if st.Tasks != nil && st.Env == "" {
			st.Env = tasksEnv
		}
	}
}

// Validate reports every problem at once, each naming its key path.
func (s CurriculumSpec) Validate() error {
	return joinFieldErrors(s.problems(nil))
}

// problems are the spec's invalid values, each at its key path. A path (or a parent of
// it) already in decoded, the problems of decoding, is not reported again.
func (s CurriculumSpec) problems(decoded []*FieldError) []*FieldError {
	var errs []*FieldError
	add := func(field, format string, a ...any) {
		errs = append(errs, &FieldError{Path: field, Msg: fmt.Sprintf(format, a...)})
	}
	if len(s.Stages) == 0 {
		add("stages", "at least one stage is needed")
	}
	if len(s.Stages) > MaxStages {
		add("stages", "%d stages is more than %d", len(s.Stages), MaxStages)
	}
	if len(s.Name) > MaxNameBytes {
		add("name", "%d bytes is longer than %d", len(s.Name), MaxNameBytes)
	}
	names := map[string]int{}
	// reached is, per selector, where the previous stage's ramp ends: what a ramp with
	// continue: true starts from.
	var reached map[string]float64
	for i, st := range s.Stages {
		f := fmt.Sprintf("stages[%d]", i)
		if len(st.Name) > MaxNameBytes {
			add(f+".name", "%d bytes is longer than %d", len(st.Name), MaxNameBytes)
		}
		if j, dup := names[st.Name]; dup {
			add(f+".name", "%s is also the name of stages[%d]", quote(st.Name), j)
		}
		names[st.Name] = i
		if st.RewardSpec != "" {
			if _, err := scoring.Parse(f+".reward_spec", []byte(st.RewardSpec)); err != nil {
				add(f+".reward_spec", "%v", err)
			}
		}
		p := st.Promotion
		switch p.Metric {
		case MetricSuccessRate:
			if p.Threshold < 0 || p.Threshold > 1 {
				add(f+".promotion.threshold", "%v is outside [0, 1] for success_rate", p.Threshold)
			}
		case MetricRewardMean:
			if !finite(p.Threshold) {
				add(f+".promotion.threshold", "must be a finite number")
			}
		case "":
			add(f+".promotion.metric", "missing: want success_rate or reward_mean")
		default:
			add(f+".promotion.metric", "%s is not one of success_rate, reward_mean", quote(p.Metric))
		}
		if p.Window == 0 {
			add(f+".promotion.window", "must be > 0")
		}
		b := st.Episodes
		if b.Max == 0 {
			add(f+".episodes.max", "must be > 0")
		}
		if b.Max > runs.MaxEpisodes {
			add(f+".episodes.max", "%d is more than %d", b.Max, runs.MaxEpisodes)
		}
		if b.Min > b.Max && b.Max > 0 {
			add(f+".episodes.min", "%d is more than episodes.max %d", b.Min, b.Max)
		}
		if p.Window > b.Max && b.Max > 0 {
			add(f+".promotion.window", "%d is more than episodes.max %d: the stage could never be promoted", p.Window, b.Max)
		}
		if st.Batch > 0 && p.Window > 0 {
			if p.Window%st.Batch != 0 {
				add(f+".batch", "%d does not divide promotion.window %d", st.Batch, p.Window)
			}
			if b.Min%st.Batch != 0 {
				add(f+".episodes.min", "%d is not a multiple of the batch size %d", b.Min, st.Batch)
			}
			if b.Max%st.Batch != 0 {
				add(f+".episodes.max", "%d is not a multiple of the batch size %d", b.Max, st.Batch)
			}
		}
		drift := append([]DriftSpec(nil), st.Drift...)
		for j, d := range st.Drift {
			df := fmt.Sprintf("%s.drift[%d]", f, j)
			if !finite(d.From) {
				add(df+".from", "must be a finite number")
			}
			if !finite(d.To) {
				add(df+".to", "must be a finite number")
			}
			if d.Continue {
				from, ok := reached[d.Selector]
				switch {
				case i == 0:
					add(df+".continue", "the first stage has no ramp to continue")
				case !ok:
					add(df+".continue", "stages[%d] has no drift of %s to continue", i-1, quote(d.Selector))
				default:
					// Checked from the end of the previous ramp: a value between two
					// checked values is in the parameter's range too.
					drift[j].From = from
				}
				if d.From != 0 {
					add(df+".from", "must be left out with continue: true (the ramp starts where the previous stage's ended)")
				}
			}
		}
		reached = map[string]float64{}
		for _, d := range drift {
			reached[d.Selector] = d.To
		}
		if ts := st.Tasks; ts != nil {
			if st.Env != tasksEnv {
				add(f+".env", "%s: a stage with tasks plays the %s env", quote(st.Env), tasksEnv)
			}
			if ts.Dataset == "" {
				add(f+".tasks.dataset", "required: the name of a dataset the stack plays (its --tasks.datasets)")
			}
			for _, k := range selectionParams {
				if _, ok := st.Params[k]; ok {
					add(f+".params."+k, "the stage's tasks make the selection")
				}
			}
		}
		// What the scheduler would refuse, refused now with the stage's key names; the
		// drift is checked as a ramp over the whole stage (selectors, value ranges).
		req, err := st.runRequest("cvalidate-s0-b0", 1, max(st.Batch, 1), s.MaxInFlight, 0)
		if err != nil {
			errs = append(errs, stageErrors(f, err)...)
			continue
		}
		req.Drift = stageDrift(drift, 0, max(b.Max, 1), max(b.Max, 1))
		if err := runs.Validate(req); err != nil {
			errs = append(errs, stageErrors(f, err)...)
		}
	}
	return withoutDecoded(errs, decoded)
}

// withoutDecoded drops the problems at a path that decoding already reported on (the
// value left at its zero would be reported a second time, and wrongly).
func withoutDecoded(errs, decoded []*FieldError) []*FieldError {
	if len(decoded) == 0 {
		return errs
	}
	out := errs[:0]
	for _, e := range errs {
		dup := false
		for _, d := range decoded {
			if d.Path != "" && (e.Path == d.Path || strings.HasPrefix(e.Path, d.Path+".") || strings.HasPrefix(e.Path, d.Path+"[")) {
				dup = true
				break
			}
		}
		if !dup {
			out = append(out, e)
		}
	}
	return out
}

// driftPoint matches the fault checks' path of a ramp's ends.
var driftPoint = regexp.MustCompile(`^(drift\[\d+\])\.schedule\.points\[(\d+)\]\.value$`)

// stageErrors turns the run checks' joined errors ("policies[0]: unknown policy") into
// problems under the stage's path, naming the spec's keys: a ramp's schedule points are
// the spec's from and to.
func stageErrors(stage string, err error) []*FieldError {
	var out []*FieldError
	for _, line := range strings.Split(err.Error(), "\n") {
		if line == "" {
			continue
		}
		path, msg, ok := strings.Cut(line, ": ")
		if !ok || strings.ContainsAny(path, " \"") {
			out = append(out, &FieldError{Path: stage, Msg: line})
			continue
		}
		if m := driftPoint.FindStringSubmatch(path); m != nil {
			path = m[1] + ".from"
			if m[2] != "0" {
				path = m[1] + ".to"
			}
		}
		out = append(out, &FieldError{Path: stage + "." + path, Msg: msg})
	}
	return out
}

// ParamsJSON is the stage's params as a JSON object (keys sorted, so stable), with its
// task set's keys.
func (st StageSpec) ParamsJSON() (string, error) {
	params := st.Params
	if ts := st.Tasks; ts != nil {
		params = make(map[string]any, len(st.Params)+4)
		for k, v := range st.Params {
			params[k] = v
		}
		params["dataset"] = ts.Dataset
		for k, v := range map[string][]string{"tags": ts.Tags, "difficulty": ts.Difficulty, "glob": ts.Glob} {
			if len(v) > 0 {
				params[k] = v
			}
		}
		if len(ts.Tasks) > 0 {
			params["tasks"] = ts.Tasks
		}
		if ts.CanaryRate != 0 {
			params["canary_rate"] = ts.CanaryRate
		}
	}
	if len(params) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(params)
	if err != nil {
		return "", fmt.Errorf("params: %w", err)
	}
	return string(b), nil
}

// Ramp is a linear ramp of one fault parameter over a run's episodes: From at episode 0,
// To at its last episode.
type Ramp struct {
	Selector string  `json:"selector"`
	From     float64 `json:"from"`
	To       float64 `json:"to"`
}

// batchRamps cuts the stage's ramps to the batch covering stage episodes
// [offset, offset+n): the batch's episode j gets the stage's value at offset+j.
func batchRamps(drift []DriftSpec, offset, n, stageMax uint64) []Ramp {
	var out []Ramp
	for _, d := range drift {
		out = append(out, Ramp{
			Selector: d.Selector,
			From:     rampAt(d.From, d.To, offset, stageMax),
			To:       rampAt(d.From, d.To, offset+n-1, stageMax),
		})
	}
	return out
}

// stageDrift is the drift contract of a batch: each ramp as a schedule over the batch's
// episode indices (linear through both ends; a one-episode batch holds its value).
func stageDrift(drift []DriftSpec, offset, n, stageMax uint64) []*gauntletv1.Drift {
	return rampsToDrift(batchRamps(drift, offset, n, stageMax), n)
}

func rampsToDrift(ramps []Ramp, n uint64) []*gauntletv1.Drift {
	var out []*gauntletv1.Drift
	for _, r := range ramps {
		sched := &gauntletv1.DriftSchedule{Axis: gauntletv1.DriftAxis_DRIFT_AXIS_EPISODE}
		if n <= 1 {
			sched.Shape = gauntletv1.DriftShape_DRIFT_SHAPE_STEP
			sched.Points = []*gauntletv1.DriftPoint{{At: 0, Value: r.From}}
		} else {
			sched.Shape = gauntletv1.DriftShape_DRIFT_SHAPE_LINEAR
			sched.Points = []*gauntletv1.DriftPoint{{At: 0, Value: r.From}, {At: float64(n - 1), Value: r.To}}
		}
		out = append(out, &gauntletv1.Drift{Selector: r.Selector, Schedule: sched})
	}
	return out
}

// runRequest is the run one batch of the stage submits to the scheduler.
func (st StageSpec) runRequest(runID string, seed, episodes uint64, maxInFlight uint32, requestedAt int64) (*gauntletv1.RunRequested, error) {
	var errs []error
	pol, err := runs.ParseShares("policies", st.Policies)
	if err != nil {
		errs = append(errs, err)
	}
	prof, err := runs.ParseShares("profiles", st.Profiles)
	if err != nil {
		errs = append(errs, err)
	}
	params, err := st.ParamsJSON()
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &gauntletv1.RunRequested{
		RunId: runID, Env: st.Env, ParamsJson: params, Policies: pol, Profiles: prof,
		Episodes: episodes, Seed: seed, MaxInFlight: maxInFlight, MaxSteps: st.MaxSteps,
		RequestedAtUnixNano: requestedAt, PolicyEndpoint: st.PolicyEndpoint.proto(),
	}, nil
}
