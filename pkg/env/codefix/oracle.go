package codefix

import (
	"encoding/json"
	"strings"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

// oracle is codefix's scripted good agent. It knows the kinds of bug there are, not the
// episode's task: it reads the guide of the docs service when the episode has one (once,
// whatever it meets), reads the library, recognises the broken function, patches it, runs
// the tests once, and submits. A call aborted by an injected fault is repeated (a few
// times at most); when it recognises no bug it submits the library as it is.
type oracle struct {
	phase   int // what the previous action was: phaseStart, phaseRead, ...
	retries int
	patch   env.Action
}

const (
	phaseStart = iota
	phaseDocs
	phaseRead
	phasePatch
	phaseTest
)

// maxRetries bounds the repeats of one call hit by faults.
const maxRetries = 3

// Act chooses the next action from the previous one's observation.
func (o *oracle) Act(t env.Turn) (env.Action, error) {
	var last struct {
		OK      bool   `json:"ok"`
		Content string `json:"content"`
		DocsURL string `json:"docs_url"`
	}
	_ = json.Unmarshal(t.Observation, &last) // a truncated or foreign observation leaves zeros
	again := !last.OK && o.retries < maxRetries
	switch o.phase {
	case phaseStart:
		if last.DocsURL != "" {
			return o.next(phaseDocs, action(tools.ShellExec, map[string]string{"command": DocsCommand})), nil
		}
		return o.next(phaseRead, action(tools.FSRead, map[string]string{"path": LibPath})), nil
	case phaseDocs:
		return o.next(phaseRead, action(tools.FSRead, map[string]string{"path": LibPath})), nil
	case phaseRead:
		if again {
			return o.retry(action(tools.FSRead, map[string]string{"path": LibPath})), nil
		}
		for _, v := range variants {
			if strings.Contains(last.Content, v.broken) {
				o.patch = action(tools.FSPatch, v.fix())
				return o.next(phasePatch, o.patch), nil
			}
		}
	case phasePatch:
		if again {
			return o.retry(o.patch), nil
		}
		return o.next(phaseTest, action(tools.ShellExec, map[string]string{"command": TestCommand})), nil
	}
	return action(ToolSubmit, struct{}{}), nil
}

func (o *oracle) next(phase int, a env.Action) env.Action {
	o.phase, o.retries = phase, 0
	return a
}

func (o *oracle) retry(a env.Action) env.Action {
	o.retries++
	return a
}

func action(tool string, args any) env.Action {
	b, _ := json.Marshal(args) // strings and the package's own structs
	return env.Action{Tool: tool, Args: b}
}
