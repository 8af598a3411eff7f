// Package envtest is the conformance suite every env (and world) passes, in the manner of
// containerd's snapshotter test suite: an env's test calls Run with a Subject that says how
// to configure its episodes, and the suite checks, as subtests, the contract package env
// states for every env:
//
//   - a replay of an episode's recorded actions is byte-identical to it;
//   - the same seed gives the same episode, different seeds different worlds;
//   - Step before Reset, and Step after the end, is an error, never a panic;
//   - an invalid action (an unknown tool, malformed arguments) is an observation with the
//     step's invalid signal set, never a Go error, and changes nothing;
//   - the end rules apply in env.End's order (verdict, invalid-action limit, deadline,
//     step limit);
//   - every observation is a JSON object (the observation space the env API declares);
//   - the Spec returned is the caller's copy.
//
// The suite runs the env for real (sandboxes included, when the Subject's config lends
// them) and closes every episode it makes.
package envtest

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
	prototextpkg "google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
)

// Subject is the env under test and how to make its episodes.
type Subject struct {
	// Env is the env under test.
	Env env.Env
	// Config returns the config of an episode of seed: the env's sandboxes, its fault
	// injector (a fresh one on every call: injectors have state), parameters. The suite
	// sets Params and MaxSteps itself where a check needs them.
	Config func(t testing.TB, seed uint64) env.Config
	// Limits returns the env's parameters that set the invalid-action limit and the
	// episode's deadline in virtual milliseconds.
	Limits func(maxInvalid int, deadlineMs int64) json.RawMessage
	// Idle is a valid action that neither ends an episode nor fails (a read): the suite
	// repeats it to reach the step limit and the deadline.
	Idle env.Action
	// IdleAt, when set, is the idle action of an episode's step n (from 0), for envs
	// whose agents take turns: each step's idle action is then that of the agent whose
	// turn it is. Idle is still needed (its tool is the one invalid arguments go to).
	IdleAt func(step int) env.Action
	// Agent returns the agent whose episodes the suite records and replays; nil uses the
	// env's Oracle. Its episodes end within MaxAgentSteps, the first seed's by a verdict.
	Agent func(seed uint64) env.Agent
	// ErrNotReset, when set, is the error Step before Reset wraps.
	ErrNotReset error
	// Seeds are the seeds the replay and determinism checks play (the first also the
	// verdict's place among the end rules); nil plays 1, 2 and 3.
	Seeds []uint64
}

// MaxAgentSteps bounds the episodes the suite plays with the Subject's agent.
const MaxAgentSteps = 200

// Run runs the suite against s, each check a subtest.
func Run(t *testing.T, s Subject) {
	t.Helper()
	if s.Env == nil || s.Config == nil || s.Limits == nil || s.Idle.Tool == "" {
		t.Fatal("envtest: Subject needs Env, Config, Limits and Idle")
	}
	if len(s.Seeds) == 0 {
		s.Seeds = []uint64{1, 2, 3}
	}
	if s.Agent == nil {
		o, ok := s.Env.(env.Oracle)
		if !ok {
			t.Fatal("envtest: Subject needs an Agent: the env has no Oracle")
		}
		s.Agent = o.Oracle
	}
	t.Run("Replay", func(t *testing.T) { testReplay(t, s) })
	t.Run("Determinism", func(t *testing.T) { testDeterminism(t, s) })
	t.Run("StepBeforeReset", func(t *testing.T) { testStepBeforeReset(t, s) })
	t.Run("InvalidAction", func(t *testing.T) { testInvalidAction(t, s) })
	t.Run("EndRules", func(t *testing.T) { testEndRules(t, s) })
	t.Run("SpecIsACopy", func(t *testing.T) { testSpecIsACopy(t, s) })
}

// episode makes an episode of cfg, closed when the test ends.
func episode(t *testing.T, s Subject, cfg env.Config) env.Episode {
	t.Helper()
	ep, err := s.Env.NewEpisode(cfg)
	if err != nil {
		t.Fatalf("NewEpisode: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Close(ep); err != nil {
			t.Errorf("close episode: %v", err)
		}
	})
	return ep
}

// reset resets ep and returns its first observation.
func reset(t *testing.T, ep env.Episode) json.RawMessage {
	t.Helper()
	obs, err := ep.Reset()
	if err != nil {
		t.Fatalf("Reset: %v", err)
	}
	if !isObject(obs) {
		t.Fatalf("Reset: observation is not a JSON object: %.300s", obs)
	}
	return obs
}

// isObject reports whether b is one JSON object, the shape of every observation.
func isObject(b []byte) bool {
	return json.Valid(b) && bytes.HasPrefix(bytes.TrimLeft(b, " \t\r\n"), []byte("{"))
}

// step runs a on ep, failing the test on a Go error or a panic.
func step(t *testing.T, ep env.Episode, a env.Action) env.StepResult {
	t.Helper()
	res, err := safeStep(ep, a)
	if err != nil {
		t.Fatalf("Step(%s %.100s): %v", a.Tool, a.Args, err)
	}
	if !isObject(res.Observation) {
		t.Fatalf("Step(%s %.100s): observation is not a JSON object: %.300s", a.Tool, a.Args, res.Observation)
	}
	return res
}

// safeStep runs a on ep and turns a panic into an error naming it.
func safeStep(ep env.Episode, a env.Action) (res env.StepResult, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v", errPanic, p)
		}
	}()
	return ep.Step(a)
}

var errPanic = errors.New("the episode panicked in Step")

// transcript is an episode as recorded: its first observation, then each step's action
// and everything of its result that the env decides. Metering's measurements of the
// host (CPU time, memory, processes, bytes read and written) are left out: they are the
// machine's, not the episode's.
type transcript struct {
	actions []env.Action
	buf     bytes.Buffer
	last    env.StepResult
	// steps holds each recorded field as text, by step (the first observation is
	// step 0's), so a mismatch can say where two transcripts part.
	steps [][]string
}

// hostFree returns s without the limits that measure the host rather than the episode:
// whether the CPU quota throttled a command in some 100 ms period depends on how the
// host scheduled it next to everything else it runs, as its CPU time does. The other
// limits (timeout, oom_kill, pids_limit, disk_full, output_capped) follow from what the
// commands do and stay.
func hostFree(s *gauntletv1.Signals) *gauntletv1.Signals {
	throttled := string(sandbox.EventCPUThrottled) + ":"
	if s == nil || !slices.ContainsFunc(s.Limits, func(l string) bool { return strings.HasPrefix(l, throttled) }) {
		return s
	}
	s = proto.CloneOf(s)
	s.Limits = slices.DeleteFunc(s.Limits, func(l string) bool { return strings.HasPrefix(l, throttled) })
	return s
}

// note keeps a readable copy of a field for the mismatch report.
func (r *transcript) note(name string, v any) {
	if len(r.steps) == 0 {
		r.steps = append(r.steps, nil)
	}
	last := &r.steps[len(r.steps)-1]
	*last = append(*last, fmt.Sprintf("%s: %v", name, v))
}

// differ says where r and o first part: the step, the field and both values.
func (r *transcript) differ(o *transcript) string {
	for i := range max(len(r.steps), len(o.steps)) {
		if i >= len(r.steps) || i >= len(o.steps) {
			return fmt.Sprintf("one has %d steps, the other %d", len(r.steps)-1, len(o.steps)-1)
		}
		a, b := r.steps[i], o.steps[i]
		for j := range min(len(a), len(b)) {
			if a[j] != b[j] {
				return fmt.Sprintf("step %d:\n  %s\nagainst\n  %s", i, clip(a[j]), clip(b[j]))
			}
		}
		if len(a) != len(b) {
			return fmt.Sprintf("step %d records %d fields against %d", i, len(a), len(b))
		}
	}
	return "the readable copies agree; the bytes do not"
}

// prototext renders m for a mismatch report (one process renders a message one way).
func prototext(m proto.Message) string {
	return prototextpkg.MarshalOptions{}.Format(m)
}

func clip(s string) string {
	const most = 2000
	if len(s) > most {
		return s[:most] + "…"
	}
	return s
}

func (r *transcript) field(b []byte) {
	r.buf.Write(binary.AppendUvarint(nil, uint64(len(b))))
	r.buf.Write(b)
}

func (r *transcript) msg(t *testing.T, m proto.Message) {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatalf("marshal %T: %v", m, err)
	}
	r.field(b)
}

func (r *transcript) record(t *testing.T, ep env.Episode, a env.Action, res env.StepResult) {
	t.Helper()
	r.actions = append(r.actions, a)
	r.last = res
	r.steps = append(r.steps, nil)
	r.note("action", a.Tool+" "+string(a.Args))
	r.note("observation", string(res.Observation))
	r.note("diff", string(res.Diff))
	signals := hostFree(res.Signals)
	r.note("signals", prototext(signals))
	for i, f := range res.Faults {
		r.note(fmt.Sprintf("fault %d", i), prototext(f))
	}
	r.field([]byte(a.Tool))
	r.field(a.Args)
	r.field(res.Observation)
	r.field(res.Diff)
	r.msg(t, signals)
	r.field(binary.AppendUvarint(nil, uint64(len(res.Faults))))
	for _, f := range res.Faults {
		r.msg(t, f)
	}
	if m := res.Metering; m != nil {
		m = proto.CloneOf(m)
		m.CpuNs, m.PeakMemoryBytes, m.Processes, m.ReadBytes, m.WrittenBytes = 0, 0, 0, 0, 0
		r.msg(t, m)
		r.note("metering", prototext(m))
	}
	end := fmt.Appendf(nil, "%v %v %v %d", res.Terminated, res.Truncated, res.Reason, ep.Now())
	r.note("end", string(end))
	r.field(end)
}

// play runs agent on a new episode of cfg to its end and records it.
func play(t *testing.T, s Subject, cfg env.Config, agent env.Agent) *transcript {
	t.Helper()
	ep := episode(t, s, cfg)
	rec := &transcript{}
	obs := reset(t, ep)
	rec.field(obs)
	rec.note("observation", string(obs))
	turn := env.Turn{Observation: obs}
	for i := range MaxAgentSteps {
		a, err := agent.Act(turn)
		if err != nil {
			t.Fatalf("agent at step %d: %v", i, err)
		}
		res := step(t, ep, a)
		rec.record(t, ep, a, res)
		if res.Done() {
			return rec
		}
		turn = env.Turn{Step: uint32(i + 1), Observation: res.Observation}
	}
	t.Fatalf("the agent's episode did not end in %d steps", MaxAgentSteps)
	return nil
}

// replay runs recorded actions on a new episode of cfg and records it.
func replay(t *testing.T, s Subject, cfg env.Config, actions []env.Action) *transcript {
	t.Helper()
	ep := episode(t, s, cfg)
	rec := &transcript{}
	obs := reset(t, ep)
	rec.field(obs)
	rec.note("observation", string(obs))
	for _, a := range actions {
		rec.record(t, ep, a, step(t, ep, a))
	}
	return rec
}

func testReplay(t *testing.T, s Subject) {
	for _, seed := range s.Seeds {
		played := play(t, s, s.Config(t, seed), s.Agent(seed))
		again := replay(t, s, s.Config(t, seed), played.actions)
		if !bytes.Equal(played.buf.Bytes(), again.buf.Bytes()) {
			t.Errorf("seed %d: the replay of %d recorded actions differs from the episode at %s", seed, len(played.actions), played.differ(again))
		}
	}
}

func testDeterminism(t *testing.T, s Subject) {
	firsts := map[string]bool{}
	for _, seed := range s.Seeds {
		a := play(t, s, s.Config(t, seed), s.Agent(seed))
		b := play(t, s, s.Config(t, seed), s.Agent(seed))
		if !bytes.Equal(a.buf.Bytes(), b.buf.Bytes()) {
			t.Errorf("seed %d: two episodes of the same seed and agent differ at %s", seed, a.differ(b))
		}
	}
	for seed := range uint64(8) {
		firsts[string(reset(t, episode(t, s, s.Config(t, seed))))] = true
	}
	if len(firsts) < 2 {
		t.Errorf("eight seeds made one world: the seed does not reach the episode")
	}
}

func testStepBeforeReset(t *testing.T, s Subject) {
	ep := episode(t, s, s.Config(t, 1))
	_, err := safeStep(ep, s.idle(0))
	switch {
	case errors.Is(err, errPanic):
		t.Fatal(err)
	case err == nil:
		t.Fatal("Step before Reset succeeded")
	case s.ErrNotReset != nil && !errors.Is(err, s.ErrNotReset):
		t.Errorf("Step before Reset: %v, want %v", err, s.ErrNotReset)
	}
}

func testInvalidAction(t *testing.T, s Subject) {
	spec := s.Env.Spec()
	cfg := s.Config(t, 4)
	cfg.Params = s.Limits(100, 86_400_000)
	ep := episode(t, s, cfg)
	reset(t, ep)
	bad := []env.Action{
		{Tool: "envtest.no-such-tool", Args: json.RawMessage(`{}`)},
		{Tool: s.Idle.Tool, Args: json.RawMessage(`{"unterminated":`)},
		{Tool: s.Idle.Tool, Args: json.RawMessage(`[1,2]`)},
		{Tool: s.Idle.Tool, Args: json.RawMessage(`{"envtest_unknown_argument":1}`)},
	}
	for _, tool := range spec.Tools {
		bad = append(bad, env.Action{Tool: tool.Name, Args: json.RawMessage(`"not an object"`)})
	}
	for _, a := range bad {
		before := ep.Now()
		r, err := safeStep(ep, a)
		if err != nil {
			t.Fatalf("%s %s: a Go error for an invalid action: %v", a.Tool, a.Args, err)
		}
		if !json.Valid(r.Observation) || !r.Signals.GetInvalidAction() || r.Metering.GetToolCalls() != 0 ||
			r.Metering.GetErrors() != 1 || r.Done() || string(r.Diff) != "[]" || ep.Now() != before {
			t.Errorf("%s %s: observation %.200s, invalid %v, metering %v, done %v, diff %s, clock %v -> %v", a.Tool, a.Args,
				r.Observation, r.Signals.GetInvalidAction(), r.Metering, r.Done(), r.Diff, before, ep.Now())
		}
	}
	if r := step(t, ep, s.idle(len(bad))); r.Signals.GetInvalidAction() || r.Done() {
		t.Errorf("the idle action after invalid ones: invalid %v, done %v: %.200s", r.Signals.GetInvalidAction(), r.Done(), r.Observation)
	}
}

// until steps a on ep until the episode ends, at most max times, and returns the last
// result and how many steps it took.
func until(t *testing.T, ep env.Episode, a env.Action, max int) (env.StepResult, int) {
	t.Helper()
	return untilEach(t, ep, func(int) env.Action { return a }, max)
}

// untilEach is until with the action of each step (from 0) given by next.
func untilEach(t *testing.T, ep env.Episode, next func(step int) env.Action, max int) (env.StepResult, int) {
	t.Helper()
	for i := 1; i <= max; i++ {
		if r := step(t, ep, next(i-1)); r.Done() {
			return r, i
		}
	}
	a := next(0)
	t.Fatalf("%s %s %d times did not end the episode", a.Tool, a.Args, max)
	return env.StepResult{}, 0
}

// idle is the idle action of an episode's step n.
func (s Subject) idle(n int) env.Action {
	if s.IdleAt != nil {
		return s.IdleAt(n)
	}
	return s.Idle
}

// wantEnd fails unless r ended the episode by reason, terminated or truncated as the
// reason says, and a further Step is an error (never a panic).
func wantEnd(t *testing.T, what string, ep env.Episode, r env.StepResult, reason gauntletv1.TerminationReason, s Subject) {
	t.Helper()
	truncated := reason == gauntletv1.TerminationReason_TERMINATION_REASON_TIMEOUT ||
		reason == gauntletv1.TerminationReason_TERMINATION_REASON_MAX_STEPS
	if r.Reason != reason || r.Truncated != truncated || r.Terminated == truncated {
		t.Errorf("%s: ended %v (terminated %v, truncated %v), want %v", what, r.Reason, r.Terminated, r.Truncated, reason)
	}
	if _, err := safeStep(ep, s.Idle); err == nil || errors.Is(err, errPanic) {
		t.Errorf("%s: Step after the end: %v, want an error", what, err)
	}
}

func testEndRules(t *testing.T, s Subject) {
	const (
		deadlineMs = 1000
		noDeadline = 86_400_000
		many       = 5000
	)
	invalid := env.Action{Tool: "envtest.no-such-tool", Args: json.RawMessage(`{}`)}
	newEp := func(maxInvalid int, deadlineMs int64, maxSteps uint32) env.Episode {
		cfg := s.Config(t, 5)
		cfg.Params, cfg.MaxSteps = s.Limits(maxInvalid, deadlineMs), maxSteps
		ep := episode(t, s, cfg)
		reset(t, ep)
		return ep
	}

	// Each rule alone.
	ep := newEp(3, noDeadline, many)
	r, n := until(t, ep, invalid, many)
	wantEnd(t, "invalid actions", ep, r, gauntletv1.TerminationReason_TERMINATION_REASON_INVALID_ACTION_LIMIT, s)
	if n != 3 {
		t.Errorf("the invalid-action limit of 3 ended the episode after %d", n)
	}
	ep = newEp(100, noDeadline, 4)
	r, n = untilEach(t, ep, s.idle, many)
	wantEnd(t, "step limit", ep, r, gauntletv1.TerminationReason_TERMINATION_REASON_MAX_STEPS, s)
	if n != 4 {
		t.Errorf("the step limit of 4 ended the episode after %d", n)
	}
	ep = newEp(100, deadlineMs, many)
	r, deadlineSteps := untilEach(t, ep, s.idle, many)
	wantEnd(t, "deadline", ep, r, gauntletv1.TerminationReason_TERMINATION_REASON_TIMEOUT, s)
	if ep.Now() <= deadlineMs*time.Millisecond {
		t.Errorf("the deadline ended the episode at %v, before %dms", ep.Now(), deadlineMs)
	}

	// Where two rules hold at once, the earlier in env.End's order decides.
	ep = newEp(100, deadlineMs, uint32(deadlineSteps))
	r, _ = untilEach(t, ep, s.idle, many)
	wantEnd(t, "deadline and step limit", ep, r, gauntletv1.TerminationReason_TERMINATION_REASON_TIMEOUT, s)
	ep = newEp(3, noDeadline, 3)
	r, _ = until(t, ep, invalid, many)
	wantEnd(t, "invalid-action and step limit", ep, r, gauntletv1.TerminationReason_TERMINATION_REASON_INVALID_ACTION_LIMIT, s)

	// The agent's verdict comes before the step limit: an episode the agent ends on its
	// last allowed step ends by the verdict.
	seed := s.Seeds[0]
	full := play(t, s, s.Config(t, seed), s.Agent(seed))
	if full.last.Reason != gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS &&
		full.last.Reason != gauntletv1.TerminationReason_TERMINATION_REASON_FAILURE {
		t.Fatalf("the agent's episode of seed %d ended by %v, not a verdict: give the Subject a first seed where it does", seed, full.last.Reason)
	}
	cfg := s.Config(t, seed)
	cfg.MaxSteps = uint32(len(full.actions))
	cut := replay(t, s, cfg, full.actions)
	if cut.last.Reason != full.last.Reason || !cut.last.Terminated || cut.last.Truncated {
		t.Errorf("a verdict on the last allowed step: ended %v, want %v", cut.last.Reason, full.last.Reason)
	}
}

func testSpecIsACopy(t *testing.T, s Subject) {
	want := s.Env.Spec()
	keep, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	got := s.Env.Spec()
	if !reflect.DeepEqual(got, want) {
		t.Fatal("two calls of Spec differ")
	}
	if len(got.Tools) == 0 {
		t.Fatal("the spec lists no tools")
	}
	got.Name += "-mutated"
	for i := range got.Tools {
		got.Tools[i].Name += "-mutated"
		for j := range got.Tools[i].Schema {
			got.Tools[i].Schema[j] = ' '
		}
	}
	for i := range got.Params {
		got.Params[i].Name += "-mutated"
	}
	for i := range got.Services {
		got.Services[i] += "-mutated"
	}
	// A shared schema no longer encodes once blanked: that is a change too.
	if after, err := json.Marshal(s.Env.Spec()); err != nil || !bytes.Equal(after, keep) {
		t.Errorf("mutating the Spec a caller got changed the env's (%v)", err)
	}
	if e, err := env.Lookup(want.Name); err != nil || !reflect.DeepEqual(e.Spec(), want) {
		t.Errorf("the env is not registered under its spec's name %q: %v", want.Name, err)
	}
}
