package play

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// Limits on what one step records. A step's values go into one event on GAUNTLET_EVENTS,
// whose messages NATS caps (8 MiB on the embedded server): a value larger than that would
// make the event unpublishable and lose the whole episode, so an agent's output of any size
// must be cut before it is recorded. The env and the agent still see the whole value; only
// the recording is cut.
const (
	// MaxFieldBytes is the most bytes each recorded value of a step takes: the action's
	// arguments, the observation and the state diff (and the reset's observation on the
	// episode's start). A larger value is recorded as its marked prefix (see Cut). Three
	// of them with trainer data at MaxTrainerTokens stay well under one message.
	MaxFieldBytes = 1 << 20
	// MaxTrainerTokens is the most token ids (prompt and completion together) trainer
	// data may carry on one step; the env API refuses more.
	MaxTrainerTokens = 1 << 18
	// cutPrefix is how many bytes of a cut value its marker keeps: escaped as a JSON
	// string (at most 6 bytes a byte) it stays under MaxFieldBytes.
	cutPrefix = MaxFieldBytes / 8
)

// Cut is how a value over MaxFieldBytes is recorded: a JSON object (for a state diff, the
// only element of a JSON array, so it stays an array of changes) that says it was cut,
// how long the value was, how many bytes were left out, and the value's first bytes as a
// JSON string, so readers of the JSON columns still read JSON. In ClickHouse, such values
// start with `{"gauntlet_truncated"` (or `[{"gauntlet_truncated"`).
type Cut struct {
	Truncated struct {
		// OriginalBytes is the value's length.
		OriginalBytes int `json:"original_bytes"`
		// CutBytes is how many of its bytes are not recorded.
		CutBytes int `json:"cut_bytes"`
		// Prefix is the value's first bytes (up to a character boundary; bytes that are
		// not UTF-8 become U+FFFD).
		Prefix string `json:"prefix"`
	} `json:"gauntlet_truncated"`
}

// cutValue returns the marker recording v in place of v, which is over MaxFieldBytes,
// and how many of v's bytes it leaves out; inArray wraps the marker in a JSON array.
func cutValue(v []byte, inArray bool) ([]byte, int) {
	n := cutPrefix
	for n > 0 && !utf8.RuneStart(v[n]) {
		n-- // keep whole characters
	}
	var c Cut
	c.Truncated.OriginalBytes, c.Truncated.CutBytes, c.Truncated.Prefix = len(v), len(v)-n, string(v[:n])
	var buf bytes.Buffer
	if inArray {
		buf.WriteByte('[')
	}
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(&c)          // a struct of ints and a string: cannot fail
	buf.Truncate(buf.Len() - 1) // Encode's newline
	if inArray {
		buf.WriteByte(']')
	}
	return buf.Bytes(), len(v) - n
}

// boundStep returns the step's action arguments, observation and diff as they are to be
// recorded, each cut to MaxFieldBytes, and how many bytes were cut.
func boundStep(args, obs, diff []byte) ([]byte, []byte, []byte, int) {
	cut := 0
	if len(args) > MaxFieldBytes {
		var n int
		args, n = cutValue(args, false)
		cut += n
	}
	if len(obs) > MaxFieldBytes {
		var n int
		obs, n = cutValue(obs, false)
		cut += n
	}
	if len(diff) > MaxFieldBytes {
		var n int
		diff, n = cutValue(diff, true)
		cut += n
	}
	return args, obs, diff, cut
}
