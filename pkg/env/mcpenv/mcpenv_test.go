package mcpenv_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/mcpenv"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
)

func newEpisode(t *testing.T, e env.Env, cfg env.Config) (env.Episode, json.RawMessage) {
	t.Helper()
	ep, err := e.NewEpisode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Close(ep); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	obs, err := ep.Reset()
	if err != nil {
		t.Fatal(err)
	}
	return ep, obs
}

func mustStep(t *testing.T, ep env.Episode, tool, args string) env.StepResult {
	t.Helper()
	r, err := ep.Step(env.Action{Tool: tool, Args: json.RawMessage(args)})
	if err != nil {
		t.Fatalf("%s %s: %v", tool, args, err)
	}
	return r
}

// TestFaultsAtTheMCPBoundary: an injected error answers the call without reaching the
// server (the note it would have written is not there), latency moves the virtual clock,
// a truncation cuts what the agent sees of the server's answer; the server's own tool
// errors are observations; and without faults the verifier's condition ends the episode.
func TestFaultsAtTheMCPBoundary(t *testing.T) {
	onEveryRuntime(t, testFaultsAtTheMCPBoundary)
}

// onEveryRuntime runs test in a subtest per sandbox runtime that runs command servers
// (sandbox.Streamer, and sandbox.Dialer for HTTP ones).
func onEveryRuntime(t *testing.T, test func(t *testing.T, sb env.Sandboxes)) {
	for _, name := range []string{runtimes.Process, runtimes.Containerd} {
		t.Run(name, func(t *testing.T) { test(t, runtimestest.Open(t, name, 0)) })
	}
}

func testFaultsAtTheMCPBoundary(t *testing.T, sb env.Sandboxes) {
	e := mcpenv.New(notes(t))
	ep, first := newEpisode(t, e, env.Config{Seed: 7, Sandboxes: sb, Faults: injectorOf(t,
		httpErr("down", "notes.put", 1, 503, 250), latency("slow", "notes.list", 300), cut("cut", "notes.get", 0.5))})
	if !bytes.Contains(first, []byte(`"task":"Save a note named \"n7\"`)) || !bytes.Contains(first, []byte(`"name":"notes.put","description":"Create or replace a note.","input_schema":{`)) {
		t.Fatalf("first observation %s", first)
	}
	r := mustStep(t, ep, "notes.put", `{"name":"n7","text":"remember the milk"}`)
	if string(r.Observation) != `{"ok":false,"error":"notes.put failed: injected status 503","status":503,"retry_after_ms":250,"suggestion":"the call had no effect; try it again"}` ||
		len(r.Faults) != 1 || r.Faults[0].GetFaultId() != "down" || r.Metering.GetErrors() != 1 ||
		!bytes.HasPrefix(r.Diff, []byte(`[{"tools":[{"name":"notes.put",`)) || bytes.Contains(r.Diff, []byte(`"answer"`)) {
		t.Fatalf("aborted put: %s faults %v metering %v diff %s", r.Observation, r.Faults, r.Metering, r.Diff)
	}
	before := ep.Now()
	r = mustStep(t, ep, "notes.list", `{}`)
	if string(r.Observation) != `{"is_error":false,"content":[{"type":"text","text":"{\"names\":[]}"}],"structured":{"names":[]}}` || ep.Now()-before != 400*time.Millisecond {
		t.Fatalf("list after the aborted put: %s, took %v", r.Observation, ep.Now()-before)
	}
	r = mustStep(t, ep, "notes.get", `{"name":"n7"}`)
	if !bytes.HasPrefix(r.Observation, []byte(`{"truncated":true,"body":"{\"is_error\":true,`)) || r.Done() {
		t.Fatalf("get of a missing note, cut: %s", r.Observation)
	}
	if !bytes.Contains(r.Diff, []byte(`no note named \"n7\"`)) {
		t.Fatalf("the diff keeps the server's whole answer: %s", r.Diff)
	}
	// Without faults the same server, in the same kind of sandbox, writes and reads back:
	// the episode ends by the verifier's condition, and the server's process is metered.
	ep, _ = newEpisode(t, e, env.Config{Seed: 7, Sandboxes: sb})
	mustStep(t, ep, "notes.put", `{"name":"n7","text":"remember the milk"}`)
	r = mustStep(t, ep, "notes.get", `{"name":"n7"}`)
	if !r.Done() || !r.Signals.GetSuccess() || r.Metering.GetCpuNs() == 0 {
		t.Fatalf("the read back: %s done %v success %v metering %v", r.Observation, r.Done(), r.Signals.GetSuccess(), r.Metering)
	}
}

// TestInvalidActionsNeverReachTheServer: arguments the server's input schema refuses are
// the env's invalid-action observation; no call is made.
func TestInvalidActionsNeverReachTheServer(t *testing.T) {
	sb := runtimestest.Open(t, runtimes.Process, 0)
	ep, _ := newEpisode(t, mcpenv.New(notes(t)), env.Config{Seed: 3, Sandboxes: sb})
	for _, args := range []string{`{"name":1,"text":"x"}`, `{"text":"x"}`, `{"name":"a","text":"x","extra":true}`} {
		r := mustStep(t, ep, "notes.put", args)
		if !r.Signals.GetInvalidAction() || r.Metering.GetToolCalls() != 0 || !strings.Contains(string(r.Observation), "input schema") {
			t.Errorf("put %s: %s", args, r.Observation)
		}
	}
	r := mustStep(t, ep, "notes.list", `{}`)
	if !strings.Contains(string(r.Observation), `"names":[]`) {
		t.Fatalf("a refused put wrote a note: %s", r.Observation)
	}
}

// TestCassetteReplaysWithoutTheServer records an episode against the sandboxed server
// with faults firing, then replays it from its first observation and diffs alone: no
// sandbox, no server (the declaration's command is made to point nowhere), the same
// observations, faults, signals and ends.
func TestCassetteReplaysWithoutTheServer(t *testing.T) {
	sb := runtimestest.Open(t, runtimes.Process, 0)
	e := mcpenv.New(notes(t))
	for _, seed := range []uint64{1, 2, 3, 4} {
		ep, first := newEpisode(t, e, env.Config{Seed: seed, Sandboxes: sb, Faults: faulty(t, seed)})
		agent := e.(env.Oracle).Oracle(seed)
		turn := env.Turn{Observation: first}
		var (
			actions []env.Action
			results []env.StepResult
			diffs   [][]byte
			fired   int
		)
		for !done(results) {
			a, err := agent.Act(turn)
			if err != nil {
				t.Fatal(err)
			}
			r, err := ep.Step(a)
			if err != nil {
				t.Fatal(err)
			}
			actions, results, diffs = append(actions, a), append(results, r), append(diffs, r.Diff)
			fired += len(r.Faults)
			turn = env.Turn{Step: uint32(len(results)), Observation: r.Observation}
		}
		if fired == 0 {
			t.Fatalf("seed %d: no fault fired on %d calls: the test proves nothing", seed, len(actions))
		}
		cas, err := mcpenv.CassetteFrom(diffs)
		if err != nil {
			t.Fatal(err)
		}
		params, _ := json.Marshal(map[string]any{"cassette": cas})
		d := notes(t)
		d.Server.Command = []string{"/nonexistent/server"}
		rep, again := newEpisode(t, mcpenv.New(d), env.Config{Seed: seed, Faults: faulty(t, seed), Params: params})
		if !bytes.Equal(first, again) {
			t.Fatalf("seed %d: first observation\n%s\nreplayed\n%s", seed, first, again)
		}
		for i, a := range actions {
			r, err := rep.Step(a)
			if err != nil {
				t.Fatalf("seed %d step %d: %v", seed, i, err)
			}
			w := results[i]
			if !bytes.Equal(r.Observation, w.Observation) || !bytes.Equal(r.Diff, w.Diff) || !proto.Equal(r.Signals, w.Signals) ||
				len(r.Faults) != len(w.Faults) || r.Reason != w.Reason || r.Metering.GetVirtualNs() != w.Metering.GetVirtualNs() {
				t.Fatalf("seed %d step %d: replayed %s %v, recorded %s %v", seed, i, r.Observation, r.Reason, w.Observation, w.Reason)
			}
		}
		// Actions the recording does not hold ask the cassette for what it lacks.
		rep2, _ := newEpisode(t, mcpenv.New(d), env.Config{Seed: seed, Params: params})
		var err2 error
		for i := 0; i < 50 && err2 == nil; i++ {
			var r env.StepResult
			r, err2 = rep2.Step(env.Action{Tool: "notes.list", Args: json.RawMessage(`{}`)})
			if err2 == nil && r.Done() {
				break
			}
		}
		if !errors.Is(err2, mcpenv.ErrCassette) {
			t.Fatalf("seed %d: stepping past the cassette: %v, want ErrCassette", seed, err2)
		}
	}
}

func done(rs []env.StepResult) bool { return len(rs) > 0 && rs[len(rs)-1].Done() }

// TestCommandVerifier: with a command verifier the agent submits, the server stops, and
// the command judges in the server's sandbox from the calls on its stdin; running out of
// steps asks it too.
func TestCommandVerifier(t *testing.T) {
	sb := runtimestest.Open(t, runtimes.Process, 0)
	notes(t) // builds the server
	dir := t.TempDir()
	if err := os.Symlink(filepath.Join(notesDir, "bin"), filepath.Join(dir, "bin")); err != nil {
		t.Fatal(err)
	}
	decl := strings.Replace(readFile(t, filepath.Join(notesDir, "notes.yaml")),
		"  success: 'calls.exists", "  command: [sh, -c, 'grep -q \"\\\"name\\\":\\\"n$GAUNTLET_SEED\\\"\" && echo found']\n  # success: 'calls.exists", 1)
	decl = strings.Replace(decl, "oracle:\n", "oracle:\n  - tool: submit\n    args: {}\n", 1)
	path := filepath.Join(dir, "notes.yaml")
	if err := os.WriteFile(path, []byte(decl), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := mcpenv.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	e := mcpenv.New(d)
	ep, first := newEpisode(t, e, env.Config{Seed: 9, Sandboxes: sb})
	if !bytes.Contains(first, []byte(`"name":"submit"`)) {
		t.Fatalf("no submit tool: %s", first)
	}
	mustStep(t, ep, "notes.put", `{"name":"n9","text":"x"}`)
	r := mustStep(t, ep, "submit", `{}`)
	if string(r.Observation) != `{"verdict":{"pass":true,"exit_code":0,"output":"found"}}` || !r.Signals.GetSuccess() || !r.Terminated {
		t.Fatalf("submit: %s %v", r.Observation, r.Reason)
	}
	ep, _ = newEpisode(t, e, env.Config{Seed: 9, Sandboxes: sb, MaxSteps: 2})
	mustStep(t, ep, "notes.put", `{"name":"other","text":"x"}`)
	r = mustStep(t, ep, "notes.list", `{}`)
	if !bytes.Contains(r.Observation, []byte(`"verdict":{"pass":false,"exit_code":1}`)) || r.Signals.GetSuccess() || !r.Truncated {
		t.Fatalf("out of steps: %s %v", r.Observation, r.Reason)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestURLServer plays the notes server over streamable HTTP (started on the host here: a
// URL server is outside the product, wherever it runs).
func TestURLServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	notes(t) // builds the server
	cmd := exec.Command(filepath.Join(notesDir, "bin", "mcp-notes-server"), "--http", addr)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for i := 0; ; i++ {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		} else if i == 100 {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	dir := t.TempDir()
	decl := strings.Replace(readFile(t, filepath.Join(notesDir, "notes.yaml")),
		"  command: [/workspace/mcp-notes-server]\n  workspace: bin\n", "  url: http://"+addr+"/mcp\n", 1)
	if err := os.WriteFile(filepath.Join(dir, "notes.yaml"), []byte(decl), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := mcpenv.Load(filepath.Join(dir, "notes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ep, _ := newEpisode(t, mcpenv.New(d), env.Config{Seed: 4})
	mustStep(t, ep, "notes.put", `{"name":"n4","text":"remember the milk"}`)
	if r := mustStep(t, ep, "notes.get", `{"name":"n4"}`); !r.Signals.GetSuccess() || r.Metering.GetRuntime() != "url" {
		t.Fatalf("get: %s %v", r.Observation, r.Metering)
	}
}

// TestDeclarationErrorsNameTheField: a declaration is refused whole, every problem at
// once, each naming its field (and its line, for YAML's own).
func TestDeclarationErrorsNameTheField(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		yaml string
		want []string
	}{
		{"env: mcp\nname: x\nserver: {command: [a]}\ntools: [{name: t}]\ntask: t\nverifier: {success: 'true'}\nsurprise: 1\n",
			[]string{"line 7: field surprise not found"}},
		{"env: world\nname: X\nserver: {command: [a], url: 'http://h/mcp'}\ntools: [{name: t}, {name: t}, {name: submit}]\ntask: ''\nverifier: {success: 'calls.size()', command: [x]}\nmax_invalid: 5000\noracle: [{tool: nope}]\n",
			[]string{`env: "world": must be "mcp"`, `name: "X"`, "server: give command or url, not both", `tools[1].name: "t" appears twice`,
				`tools[2].name: "submit" is gauntlet's own tool`, "task: required", "verifier: give success (and failure) or command, not both",
				"max_invalid: 5000 is outside 1..1000", `oracle[0].tool: "nope" is not one of tools`}},
		{"env: mcp\nname: x\nserver: {url: 'ftp://h'}\ntools: [{name: t, service: 'Bad'}]\ntask: t\nverifier: {success: 'calls.size()', failure: 'nope > 1'}\n",
			[]string{`server.url: "ftp://h": must be an http or https URL`, `tools[0].service: "Bad"`, "verifier.success:", "not bool", "verifier.failure:", "undeclared reference to 'nope'"}},
		{"env: mcp\nname: x\nserver: {url: 'http://h/mcp'}\ntools: [{name: t}]\ntask: t\nverifier: {command: [x]}\n",
			[]string{"verifier.command: a command verifier runs in the server's sandbox"}},
	} {
		p := filepath.Join(dir, "x.yaml")
		if err := os.WriteFile(p, []byte(c.yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := mcpenv.Load(p)
		if !errors.Is(err, mcpenv.ErrInvalid) {
			t.Fatalf("%s: %v, want ErrInvalid", c.yaml, err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) || !strings.Contains(err.Error(), p) {
				t.Errorf("%s:\n%v\nlacks %q or the file", c.yaml, err, w)
			}
		}
	}
	if _, err := mcpenv.New(notes(t)).NewEpisode(env.Config{Params: json.RawMessage(`{"max_invalid":0,"what":1}`)}); err == nil || !strings.Contains(err.Error(), `unknown field "what"`) {
		t.Fatalf("unknown param: %v", err)
	}
	if _, err := mcpenv.New(notes(t)).NewEpisode(env.Config{Params: json.RawMessage(`{"max_invalid":0}`)}); err == nil || !strings.Contains(err.Error(), "params.max_invalid: 0") {
		t.Fatalf("bad param: %v", err)
	}
	ep, err := mcpenv.New(notes(t)).NewEpisode(env.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ep.Reset(); !errors.Is(err, env.ErrNoSandbox) {
		t.Fatalf("reset without sandboxes: %v", err)
	}
}

// TestExampleFolder: examples/mcp-notes-server works as an --env.mcp folder as the docs
// say: its one declaration loads, and nothing else there is read as one (bin/, absent
// until the server is built, is the only problem allowed).
func TestExampleFolder(t *testing.T) {
	ds, err := mcpenv.LoadDir("../../../examples/mcp-notes-server")
	if err != nil {
		if strings.Count(err.Error(), mcpenv.ErrInvalid.Error()) != 1 || !strings.Contains(err.Error(), `notes.yaml: invalid MCP env declaration: server.workspace: "bin" is not a directory`) {
			t.Fatal(err)
		}
		return
	}
	if len(ds) != 1 || ds[0].Name != "notes" {
		t.Fatalf("%d declarations", len(ds))
	}
}

// TestVerifierEvaluationError: a condition that fails on real calls (a key of a null
// structured answer) is an infra error naming the file and the condition, never a panic
// nor a silent false. The server is a cassette: no server is needed to play answers.
func TestVerifierEvaluationError(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.yaml")
	decl := "env: mcp\nname: x\nserver: {url: 'http://127.0.0.1:1/mcp'}\ntools: [{name: t}]\ntask: t\nverifier: {success: 'calls.exists(c, c.structured.name == \"x\")'}\n"
	if err := os.WriteFile(p, []byte(decl), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := mcpenv.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	params := `{"cassette":{"tools":[{"name":"t","input_schema":{"type":"object"}}],"answers":[{"result":{"content":[],"isError":false}}]}}`
	ep, _ := newEpisode(t, mcpenv.New(d), env.Config{Seed: 1, Params: json.RawMessage(params)})
	_, err = ep.Step(env.Action{Tool: "t", Args: json.RawMessage(`{}`)})
	if err == nil || !strings.Contains(err.Error(), p+": verifier.success: no such key") {
		t.Fatalf("step: %v", err)
	}
}

// TestHTTPServerInSandbox: a command server that speaks streamable HTTP instead of stdio
// listens on its sandbox's own loopback network; the harness dials into it, faults and
// verifier as over stdio, and the server stops, measured, when the episode ends. A
// server that exits without listening fails the reset at once, with what it said.
func TestHTTPServerInSandbox(t *testing.T) {
	onEveryRuntime(t, testHTTPServerInSandbox)
}

func testHTTPServerInSandbox(t *testing.T, sb env.Sandboxes) {
	notes(t) // builds the server
	dir := t.TempDir()
	if err := os.Symlink(filepath.Join(notesDir, "bin"), filepath.Join(dir, "bin")); err != nil {
		t.Fatal(err)
	}
	load := func(command string) env.Env {
		decl := strings.Replace(readFile(t, filepath.Join(notesDir, "notes.yaml")),
			"  command: [/workspace/mcp-notes-server]\n", "  command: "+command+"\n  http: {port: 8931}\n", 1)
		if err := os.WriteFile(filepath.Join(dir, "notes.yaml"), []byte(decl), 0o644); err != nil {
			t.Fatal(err)
		}
		d, err := mcpenv.Load(filepath.Join(dir, "notes.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		return mcpenv.New(d)
	}
	e := load("[/workspace/mcp-notes-server, --http, '127.0.0.1:8931']")
	ep, first := newEpisode(t, e, env.Config{Seed: 5, Sandboxes: sb, Faults: injectorOf(t, latency("slow", "*", 50))})
	if !bytes.Contains(first, []byte(`"name":"notes.get","description":"Read one note."`)) {
		t.Fatalf("first observation %s", first)
	}
	mustStep(t, ep, "notes.put", `{"name":"n5","text":"remember the milk"}`)
	r := mustStep(t, ep, "notes.get", `{"name":"n5"}`)
	if !r.Signals.GetSuccess() || len(r.Faults) != 1 || r.Metering.GetRuntime() != sb.Runtime().Name() || r.Metering.GetCpuNs() == 0 {
		t.Fatalf("get: %s faults %v metering %v", r.Observation, r.Faults, r.Metering)
	}
	bad := load(`[sh, -c, 'echo no port for you >&2; exit 3']`)
	ep2, err := bad.NewEpisode(env.Config{Seed: 5, Sandboxes: sb})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := ep2.Reset(); !errors.Is(err, mcpenv.ErrServer) || !strings.Contains(err.Error(), "no port for you") || time.Since(start) > 20*time.Second {
		t.Fatalf("reset of a server that exits: %v after %v", err, time.Since(start))
	}
}
