package export

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
)

// maxLine bounds one JSONL line: a step's observation is capped far below this by the
// envs, so a longer line is not a recording.
const maxLine = 64 << 20

// WriteJSONL writes the episode and its steps, one JSON object per line.
func WriteJSONL(w io.Writer, ep trajectory.EpisodeRow, steps []trajectory.StepRow) error {
	bw := bufio.NewWriter(w)
	line := func(key string, obj []byte) {
		bw.WriteString(`{"` + key + `":`)
		bw.Write(obj)
		bw.WriteString("}\n")
	}
	obj, err := trajectory.MarshalEpisodeJSON(ep)
	if err != nil {
		return fmt.Errorf("export episode %s: %w", ep.EpisodeID, err)
	}
	line("episode", obj)
	for _, s := range steps {
		obj, err := trajectory.MarshalStepJSON(s)
		if err != nil {
			return fmt.Errorf("export episode %s step %d: %w", ep.EpisodeID, s.Step, err)
		}
		line("step", obj)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("export episode %s: %w", ep.EpisodeID, err)
	}
	return nil
}

// ReadJSONL reads what WriteJSONL wrote: the episode line first, then its steps in
// order, each belonging to that episode.
func ReadJSONL(r io.Reader) (trajectory.EpisodeRow, []trajectory.StepRow, error) {
	var ep trajectory.EpisodeRow
	var steps []trajectory.StepRow
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	n := 0
	for sc.Scan() {
		n++
		var rec map[string]json.RawMessage
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return ep, nil, fmt.Errorf("read jsonl line %d: %w", n, err)
		}
		if len(rec) != 1 {
			return ep, nil, fmt.Errorf("read jsonl line %d: want one key, episode or step", n)
		}
		switch {
		case n == 1:
			raw, ok := rec["episode"]
			if !ok {
				return ep, nil, fmt.Errorf("read jsonl line 1: the first line must be the episode")
			}
			e, err := trajectory.UnmarshalEpisodeJSON(raw)
			if err != nil {
				return ep, nil, fmt.Errorf("read jsonl line 1: %w", err)
			}
			ep = e
		default:
			raw, ok := rec["step"]
			if !ok {
				return ep, nil, fmt.Errorf("read jsonl line %d: want a step", n)
			}
			s, err := trajectory.UnmarshalStepJSON(raw)
			if err != nil {
				return ep, nil, fmt.Errorf("read jsonl line %d: %w", n, err)
			}
			if s.EpisodeID != ep.EpisodeID {
				return ep, nil, fmt.Errorf("read jsonl line %d: step of episode %s in the export of %s", n, s.EpisodeID, ep.EpisodeID)
			}
			steps = append(steps, s)
		}
	}
	if err := sc.Err(); err != nil {
		return ep, nil, fmt.Errorf("read jsonl: %w", err)
	}
	if n == 0 {
		return ep, nil, errors.New("read jsonl: empty")
	}
	return ep, steps, nil
}
