package export

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
)

// ATIFVersion is the version of the Agent Trajectory Interchange Format written.
const ATIFVersion = "ATIF-v1.4"

// Trajectory is an ATIF trajectory: the root object of the format.
type Trajectory struct {
	SchemaVersion string          `json:"schema_version"`
	SessionID     string          `json:"session_id"`
	Agent         Agent           `json:"agent"`
	Steps         []Step          `json:"steps"`
	Notes         string          `json:"notes,omitempty"`
	FinalMetrics  *FinalMetrics   `json:"final_metrics,omitempty"`
	Extra         json.RawMessage `json:"extra,omitempty"`
}

// Agent identifies the agent system of a trajectory.
type Agent struct {
	Name      string          `json:"name"`
	Version   string          `json:"version"`
	ModelName string          `json:"model_name,omitempty"`
	Extra     json.RawMessage `json:"extra,omitempty"`
}

// Step is one ATIF step: here, one recorded tool call of the agent and what it observed.
type Step struct {
	StepID      int             `json:"step_id"`
	Timestamp   string          `json:"timestamp,omitempty"`
	Source      string          `json:"source"`
	Message     string          `json:"message"`
	ToolCalls   []ToolCall      `json:"tool_calls,omitempty"`
	Observation *Observation    `json:"observation,omitempty"`
	Metrics     json.RawMessage `json:"metrics,omitempty"`
	Extra       json.RawMessage `json:"extra,omitempty"`
}

// ToolCall is one tool invocation of a step.
type ToolCall struct {
	ToolCallID   string          `json:"tool_call_id"`
	FunctionName string          `json:"function_name"`
	Arguments    json.RawMessage `json:"arguments"`
}

// Observation holds the results of a step's tool calls.
type Observation struct {
	Results []ObservationResult `json:"results"`
}

// ObservationResult is the result of one tool call.
type ObservationResult struct {
	SourceCallID string `json:"source_call_id,omitempty"`
	Content      string `json:"content,omitempty"`
}

// FinalMetrics are a trajectory's aggregates.
type FinalMetrics struct {
	TotalSteps int             `json:"total_steps"`
	Extra      json.RawMessage `json:"extra,omitempty"`
}

// stepExtra is what gauntlet puts in a step's extra: the reward vector and faults for
// readers of ATIF, and the whole recorded row for FromATIF.
type stepExtra struct {
	Reward       float64            `json:"reward"`
	Rewards      map[string]float64 `json:"rewards,omitempty"`
	Faults       []string           `json:"faults,omitempty"`
	Terminated   bool               `json:"terminated,omitempty"`
	Truncated    bool               `json:"truncated,omitempty"`
	GauntletStep json.RawMessage    `json:"gauntlet_step"`
}

type rootExtra struct {
	Env             string          `json:"env"`
	Seed            uint64          `json:"seed"`
	Profile         string          `json:"profile"`
	Success         bool            `json:"success"`
	TotalReward     float64         `json:"total_reward"`
	GauntletEpisode json.RawMessage `json:"gauntlet_episode"`
}

// callID names step n's tool call, so the observation can point at it.
func callID(step uint32) string { return fmt.Sprintf("call-%d", step) }

// ToATIF converts a recorded episode to an ATIF trajectory; version is gauntlet's, the
// agent system's version as ATIF asks.
func ToATIF(ep trajectory.EpisodeRow, steps []trajectory.StepRow, version string) (*Trajectory, error) {
	epJSON, err := trajectory.MarshalEpisodeJSON(ep)
	if err != nil {
		return nil, fmt.Errorf("export episode %s as ATIF: %w", ep.EpisodeID, err)
	}
	root, err := json.Marshal(rootExtra{Env: ep.Env, Seed: ep.Seed, Profile: ep.Profile, Success: ep.Success,
		TotalReward: ep.TotalReward, GauntletEpisode: epJSON})
	if err != nil {
		return nil, fmt.Errorf("export episode %s as ATIF: %w", ep.EpisodeID, err)
	}
	t := &Trajectory{
		SchemaVersion: ATIFVersion,
		SessionID:     ep.EpisodeID,
		Agent:         Agent{Name: ep.Policy, Version: version},
		Notes: "Exported by gauntlet from its ClickHouse recording. Each step is one tool call of the agent; " +
			"its observation is the env's reply as recorded (JSON text). extra.gauntlet_step and extra.gauntlet_episode " +
			"hold the recorded rows whole, keyed by column name.",
		FinalMetrics: &FinalMetrics{TotalSteps: len(steps)},
		Extra:        root,
		Steps:        make([]Step, 0, len(steps)),
	}
	for i, s := range steps {
		row, err := trajectory.MarshalStepJSON(s)
		if err != nil {
			return nil, fmt.Errorf("export episode %s step %d as ATIF: %w", ep.EpisodeID, s.Step, err)
		}
		rewards := make(map[string]float64, len(s.RewardNames))
		for j, n := range s.RewardNames {
			if j < len(s.RewardValues) {
				rewards[n] = s.RewardValues[j]
			}
		}
		extra, err := json.Marshal(stepExtra{Reward: s.Reward, Rewards: rewards, Faults: s.FaultKinds,
			Terminated: s.Terminated, Truncated: s.Truncated, GauntletStep: row})
		if err != nil {
			return nil, fmt.Errorf("export episode %s step %d as ATIF: %w", ep.EpisodeID, s.Step, err)
		}
		id := callID(s.Step)
		t.Steps = append(t.Steps, Step{
			StepID:      i + 1,
			Timestamp:   s.RequestedAt.UTC().Format(time.RFC3339Nano),
			Source:      "agent",
			Message:     "",
			ToolCalls:   []ToolCall{{ToolCallID: id, FunctionName: s.Tool, Arguments: argumentsObject(s.Args)}},
			Observation: &Observation{Results: []ObservationResult{{SourceCallID: id, Content: s.Observation}}},
			Extra:       extra,
		})
	}
	return t, nil
}

// argumentsObject is the recorded arguments as the JSON object ATIF requires: the
// arguments themselves when they are one, else {"args": value} (or {} when empty).
func argumentsObject(args string) json.RawMessage {
	trimmed := bytes.TrimSpace([]byte(args))
	if len(trimmed) == 0 {
		return json.RawMessage("{}")
	}
	if trimmed[0] == '{' && json.Valid(trimmed) {
		return json.RawMessage(trimmed)
	}
	if json.Valid(trimmed) {
		return json.RawMessage(`{"args":` + string(trimmed) + `}`)
	}
	b, _ := json.Marshal(map[string]string{"args": args}) // a string always marshals
	return b
}

// WriteATIF writes the trajectory as indented JSON.
func WriteATIF(w io.Writer, t *Trajectory) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(t); err != nil {
		return fmt.Errorf("write ATIF trajectory %s: %w", t.SessionID, err)
	}
	return nil
}

// ReadATIF reads an ATIF trajectory strictly: unknown fields are refused.
func ReadATIF(r io.Reader) (*Trajectory, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var t Trajectory
	if err := dec.Decode(&t); err != nil {
		return nil, fmt.Errorf("read ATIF trajectory: %w", err)
	}
	return &t, nil
}

// FromATIF recovers the recorded rows of a trajectory ToATIF made. It refuses a
// trajectory of another version or producer, steps out of order, and standard fields
// (tool, arguments, observation, session) that disagree with the recorded row.
func FromATIF(t *Trajectory) (trajectory.EpisodeRow, []trajectory.StepRow, error) {
	var ep trajectory.EpisodeRow
	if t.SchemaVersion != ATIFVersion {
		return ep, nil, fmt.Errorf("ATIF trajectory: schema_version %q, want %q", t.SchemaVersion, ATIFVersion)
	}
	var root rootExtra
	if err := strictJSON(t.Extra, &root); err != nil || len(root.GauntletEpisode) == 0 {
		return ep, nil, fmt.Errorf("ATIF trajectory %s: not a gauntlet export (extra.gauntlet_episode: %v)", t.SessionID, err)
	}
	ep, err := trajectory.UnmarshalEpisodeJSON(root.GauntletEpisode)
	if err != nil {
		return ep, nil, fmt.Errorf("ATIF trajectory %s: extra.gauntlet_episode: %w", t.SessionID, err)
	}
	if ep.EpisodeID != t.SessionID || ep.Policy != t.Agent.Name {
		return ep, nil, fmt.Errorf("ATIF trajectory %s: session_id or agent.name disagree with the recorded episode %s", t.SessionID, ep.EpisodeID)
	}
	if t.FinalMetrics != nil && t.FinalMetrics.TotalSteps != len(t.Steps) {
		return ep, nil, fmt.Errorf("ATIF trajectory %s: final_metrics.total_steps %d, but %d steps", t.SessionID, t.FinalMetrics.TotalSteps, len(t.Steps))
	}
	steps := make([]trajectory.StepRow, 0, len(t.Steps))
	for i, st := range t.Steps {
		where := fmt.Sprintf("ATIF trajectory %s step_id %d", t.SessionID, st.StepID)
		if st.StepID != i+1 {
			return ep, nil, fmt.Errorf("%s: step ids must run 1, 2, ... (at index %d)", where, i)
		}
		var extra stepExtra
		if err := strictJSON(st.Extra, &extra); err != nil || len(extra.GauntletStep) == 0 {
			return ep, nil, fmt.Errorf("%s: no extra.gauntlet_step (%v)", where, err)
		}
		s, err := trajectory.UnmarshalStepJSON(extra.GauntletStep)
		if err != nil {
			return ep, nil, fmt.Errorf("%s: extra.gauntlet_step: %w", where, err)
		}
		id := callID(s.Step)
		switch {
		case s.EpisodeID != ep.EpisodeID:
			return ep, nil, fmt.Errorf("%s: a step of episode %s", where, s.EpisodeID)
		case st.Source != "agent" || len(st.ToolCalls) != 1 || st.ToolCalls[0].ToolCallID != id || st.ToolCalls[0].FunctionName != s.Tool:
			return ep, nil, fmt.Errorf("%s: tool_calls disagree with the recorded step", where)
		case !bytes.Equal(compact(st.ToolCalls[0].Arguments), compact(argumentsObject(s.Args))):
			return ep, nil, fmt.Errorf("%s: arguments disagree with the recorded step", where)
		case st.Observation == nil || len(st.Observation.Results) != 1 || st.Observation.Results[0].SourceCallID != id ||
			st.Observation.Results[0].Content != s.Observation:
			return ep, nil, fmt.Errorf("%s: observation disagrees with the recorded step", where)
		}
		steps = append(steps, s)
	}
	return ep, steps, nil
}

func strictJSON(data []byte, v any) error {
	if len(data) == 0 {
		return errors.New("missing")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

func compact(b []byte) []byte {
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return b
	}
	return out.Bytes()
}
