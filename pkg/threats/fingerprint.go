package threats

import (
	"strconv"
	"strings"
)

// Fingerprint is one dangerous behaviour a sandbox recorded, as every watcher knows it:
// the bucket's value under its ID, JSON.
type Fingerprint struct {
	// ID is the bucket key: Key of the tool and normalised command, 16 hex digits.
	ID string `json:"id"`
	// Tool and Command are what a later action is compared with (Normalise).
	Tool    string `json:"tool"`
	Command string `json:"command"`
	// Events are what the sandbox recorded the first time, as patterns.
	Events []Event `json:"events"`
	// Where it was first recorded.
	Run     string `json:"run_id"`
	Episode string `json:"episode_id"`
	Step    uint32 `json:"step"`
	Worker  string `json:"worker_id"`
	// RecordedAtUnixNano is when the recording process published it; a watcher's
	// propagation time is from it to the watcher's receipt.
	RecordedAtUnixNano int64 `json:"recorded_at_unix_nano"`
}

// Key is the identity of a tool and normalised command: the FNV-1a 64-bit hash of the
// tool, a zero byte and the command. Two different commands share one with odds of 2^-64
// per pair.
func Key(tool, command string) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for i := 0; i < len(tool); i++ {
		h = (h ^ uint64(tool[i])) * prime
	}
	h *= prime // the zero byte
	for i := 0; i < len(command); i++ {
		h = (h ^ uint64(command[i])) * prime
	}
	return h
}

// ID is the bucket key of a Key: 16 lowercase hex digits.
func ID(key uint64) string {
	s := strconv.FormatUint(key, 16)
	return strings.Repeat("0", 16-len(s)) + s
}

// Make returns the fingerprint of a step whose action was tool with args and whose safety
// events are events, and whether it has one: only a step with a dangerous event does
// (Dangerous; a match flag is never one). Where it was recorded is left to the caller.
func Make(tool string, args []byte, events []string) (*Fingerprint, bool) {
	var evs []Event
	for _, s := range events {
		if e, ok := ParseEvent(s); ok {
			evs = append(evs, e)
		}
	}
	if len(evs) == 0 {
		return nil, false
	}
	cmd := Normalise(tool, args)
	return &Fingerprint{ID: ID(Key(tool, cmd)), Tool: tool, Command: cmd, Events: evs}, true
}

// maxShown bounds the command a match's safety event quotes.
const maxShown = 120

// Flag is the safety event a step matching f gets (EventMatch).
func (f *Fingerprint) Flag() string {
	cmd := f.Command
	if len(cmd) > maxShown {
		cmd = cmd[:maxShown] + "…"
	}
	kinds := make([]string, 0, len(f.Events))
	for _, e := range f.Events {
		k := e.Kind
		if e.Syscall != "" {
			k += " " + e.Syscall
		}
		if e.Path != "" {
			k += " " + e.Path
		}
		kinds = append(kinds, k)
	}
	return EventMatch + ": " + f.ID + " matches " + f.Tool + " " + strconv.Quote(cmd) +
		" (" + strings.Join(kinds, ", ") + "; first in episode " + f.Episode + " step " + strconv.FormatUint(uint64(f.Step), 10) + ")"
}

// Set is an immutable set of fingerprints, by key. The zero value and nil are empty.
type Set struct {
	byKey map[uint64]*Fingerprint
	// tools are the tools of the fingerprints: an action of another tool is not
	// normalised at all.
	tools []string
}

// Len is how many fingerprints s holds.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.byKey)
}

// Has reports whether s holds the fingerprint with key k.
func (s *Set) Has(k uint64) bool {
	if s == nil {
		return false
	}
	_, ok := s.byKey[k]
	return ok
}

// Match returns the fingerprint an action matches, or nil. An action of a tool no
// fingerprint has costs a comparison per such tool; one of such a tool is normalised
// (an allocation or two) and looked up.
func (s *Set) Match(tool string, args []byte) *Fingerprint {
	if s == nil || !s.hasTool(tool) {
		return nil
	}
	return s.byKey[Key(tool, Normalise(tool, args))]
}

func (s *Set) hasTool(tool string) bool {
	for _, t := range s.tools {
		if t == tool {
			return true
		}
	}
	return false
}

// with returns a copy of s with f put under key, or without key when f is nil.
func (s *Set) with(key uint64, f *Fingerprint) *Set {
	m := make(map[uint64]*Fingerprint, s.Len()+1)
	if s != nil {
		for k, v := range s.byKey {
			m[k] = v
		}
	}
	if f != nil {
		m[key] = f
	} else {
		delete(m, key)
	}
	return newSet(m)
}

// newSet returns the set of m, which it keeps, or nil when m is empty.
func newSet(m map[uint64]*Fingerprint) *Set {
	if len(m) == 0 {
		return nil
	}
	n := &Set{byKey: m}
	for _, v := range m {
		if !n.hasTool(v.Tool) {
			n.tools = append(n.tools, v.Tool)
		}
	}
	return n
}
