package trajectory

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
)

// MarshalStepJSON encodes a step row as one JSON object keyed by the steps table's column
// names, in column order: the record `episode export --format jsonl` writes, which
// UnmarshalStepJSON reads back into the same row.
func MarshalStepJSON(r StepRow) ([]byte, error) { return marshalRow(stepColumns, &r) }

// UnmarshalStepJSON decodes what MarshalStepJSON wrote. Every column must be there and
// nothing else: a record of another schema is refused, not half read.
func UnmarshalStepJSON(data []byte) (StepRow, error) {
	var r StepRow
	err := unmarshalRow(stepColumns, &r, data)
	return r, err
}

// MarshalEpisodeJSON encodes an episode row as MarshalStepJSON does a step row.
func MarshalEpisodeJSON(r EpisodeRow) ([]byte, error) { return marshalRow(episodeColumns, &r) }

// UnmarshalEpisodeJSON decodes what MarshalEpisodeJSON wrote, as strictly.
func UnmarshalEpisodeJSON(data []byte) (EpisodeRow, error) {
	var r EpisodeRow
	err := unmarshalRow(episodeColumns, &r, data)
	return r, err
}

func marshalRow[R any](cols []column[R], r *R) ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, c := range cols {
		if i > 0 {
			b.WriteByte(',')
		}
		v := c.field(r)
		if f, ok := v.(*float64); ok && (math.IsNaN(*f) || math.IsInf(*f, 0)) {
			return nil, fmt.Errorf("encode column %s: %v has no JSON form", c.name, *f)
		}
		val, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("encode column %s: %w", c.name, err)
		}
		name, _ := json.Marshal(c.name)
		b.Write(name)
		b.WriteByte(':')
		b.Write(val)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func unmarshalRow[R any](cols []column[R], r *R, data []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("decode row: %w", err)
	}
	var missing []string
	for _, c := range cols {
		v, ok := raw[c.name]
		if !ok {
			missing = append(missing, c.name)
			continue
		}
		delete(raw, c.name)
		dec := json.NewDecoder(bytes.NewReader(v))
		dec.DisallowUnknownFields()
		if err := dec.Decode(c.field(r)); err != nil {
			return fmt.Errorf("decode column %s: %w", c.name, err)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("decode row: columns missing: %s", strings.Join(missing, ", "))
	}
	if len(raw) > 0 {
		extra := make([]string, 0, len(raw))
		for k := range raw {
			extra = append(extra, k)
		}
		sort.Strings(extra)
		return fmt.Errorf("decode row: unknown columns: %s", strings.Join(extra, ", "))
	}
	return nil
}
