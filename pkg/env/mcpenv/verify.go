package mcpenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// verdict is a command verifier's judgement: it passed when the command exited 0.
type verdict struct {
	Pass     bool   `json:"pass"`
	ExitCode int    `json:"exit_code"`
	Output   string `json:"output,omitempty"`
}

// maxVerdictOutput caps what a verdict keeps of the command's output.
const maxVerdictOutput = 2 << 10

// verify stops the server and runs the verifier command in its sandbox, the recorded
// calls as JSON on its stdin (a cassette plays the recorded verdict instead).
func (e *episode) verify() (*verdict, error) {
	if e.cassette != nil {
		if len(e.cassette.Verdicts) == 0 {
			return nil, fmt.Errorf("mcp %s: %w: it holds no verdict", e.d.Name, ErrCassette)
		}
		v := e.cassette.Verdicts[0]
		return &v, nil
	}
	if e.srv == nil || e.srv.sb == "" {
		return nil, fmt.Errorf("mcp %s: verifier: %w: no sandbox", e.d.Name, ErrServer)
	}
	e.srv.stop()
	calls, err := json.Marshal(e.calls)
	if err != nil {
		return nil, fmt.Errorf("mcp %s: verifier: encode calls: %w", e.d.Name, err)
	}
	timeout := msDuration(e.d.Verifier.TimeoutMs)
	ctx, cancel := context.WithTimeout(context.Background(), timeout+opTimeout)
	defer cancel()
	r, err := e.cfg.Sandboxes.Runtime().Exec(ctx, e.srv.sb, sandbox.ExecRequest{
		Argv: e.d.Verifier.Command, Stdin: calls, Timeout: timeout, OutputLimit: 64 << 10,
		Env: []string{fmt.Sprintf("GAUNTLET_SEED=%d", e.cfg.Seed)},
	})
	if err != nil {
		return nil, fmt.Errorf("mcp %s: verifier: %w", e.d.Name, err)
	}
	out := strings.TrimSpace(strings.ToValidUTF8(string(r.Stdout), ""))
	if len(out) > maxVerdictOutput {
		out = strings.ToValidUTF8(out[len(out)-maxVerdictOutput:], "")
	}
	return &verdict{Pass: r.ExitCode == 0 && !r.TimedOut, ExitCode: r.ExitCode, Output: out}, nil
}

// ErrCassette is wrapped by the errors of a replay whose cassette does not hold what the
// episode asks of it: the actions are not the recorded ones.
var ErrCassette = errors.New("cassette")

// Cassette is a recorded episode's server side, as its steps' diffs hold it: the tools
// its server listed, every answer in call order, and the command verifier's verdict. Given as the `cassette` parameter, the episode plays them
// back instead of reaching a server: a replay needs neither the server nor a sandbox, and
// the fault plan and the actions decide the rest, as they did when it was recorded.
type Cassette struct {
	Tools    []cassetteTool `json:"tools"`
	Answers  []answer       `json:"answers"`
	Verdicts []verdict      `json:"verdicts,omitempty"`
}

type cassetteTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// ErrNoListing is returned by CassetteFrom for a recording none of whose steps reached
// the server's tools (every action was invalid): it holds nothing to replay.
var ErrNoListing = errors.New("cassette: no step of the recording holds the server's tools")

// CassetteFrom builds the cassette of a recorded episode from its steps' diffs, in step
// order (the steps table's state_diff column).
func CassetteFrom(diffs [][]byte) (*Cassette, error) {
	var c Cassette
	listed := false
	for i, d := range diffs {
		var es []struct {
			Tools []cassetteTool `json:"tools"`
			diffEntry
		}
		if err := json.Unmarshal(d, &es); err != nil {
			return nil, fmt.Errorf("cassette: step %d's diff: %w", i, err)
		}
		for _, e := range es {
			if e.Tools != nil && !listed {
				listed = true
				for _, t := range e.Tools {
					if t.Name != ToolSubmit {
						c.Tools = append(c.Tools, t)
					}
				}
			}
			if e.Answer != nil {
				c.Answers = append(c.Answers, *e.Answer)
			}
			if e.Verdict != nil {
				c.Verdicts = append(c.Verdicts, *e.Verdict)
			}
		}
	}
	if !listed {
		return nil, ErrNoListing
	}
	return &c, nil
}

var _ env.Episode = (*episode)(nil)

// Is reports whether e is an MCP env (its recorded episodes replay from a cassette).
func Is(e env.Env) bool {
	_, ok := e.(*mcpEnv)
	return ok
}

// ReplayParams returns a recorded episode's params with the cassette its steps' diffs
// hold added, so the episode replays without its server (see Cassette).
func ReplayParams(params []byte, diffs [][]byte) (json.RawMessage, error) {
	c, err := CassetteFrom(diffs)
	if err != nil {
		return nil, err
	}
	m := map[string]json.RawMessage{}
	if p := strings.TrimSpace(string(params)); p != "" && p != "null" {
		if err := json.Unmarshal([]byte(p), &m); err != nil {
			return nil, fmt.Errorf("cassette: the episode's params: %w", err)
		}
	}
	raw, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("cassette: %w", err)
	}
	m["cassette"] = raw
	return json.Marshal(m)
}
