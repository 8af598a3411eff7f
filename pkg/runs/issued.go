package runs

import (
	"encoding/hex"
	"strconv"
	"strings"
)

// Episodes that no scheduler planned (the env API's sessions) have ids issued one at a
// time rather than derived from an index. Such an id is "<run>-v", the time it was
// issued as 16 hex digits (nanoseconds since 1970), then whatever the issuer adds to
// make it unique and unforgeable. Hex of a fixed width sorts as the number it spells, so
// these ids sort in issue order, and the episodes table, ordered by (run_id,
// episode_id), holds a run's episodes in that order: a page of them is a range of its
// key. The letter v sorts after every hex digit and decimal digit, so a run's ids of any
// older form (random hex, or a planned run's "%07d") all sort before its issued ones.

// IssuedTimeDigits is the number of hex digits of an issued id's time.
const IssuedTimeDigits = 16

// issuedMark follows "<run>-" in an issued id; the letter after it bounds them.
const issuedMark, afterIssued = "v", "w"

// IssuedIDPrefix is the start of the id of an episode of run runID issued at unixNano:
// "<run>-v" and the time in 16 hex digits. It is also the least id issued at or after
// unixNano, so a range of times is a range of ids.
func IssuedIDPrefix(runID string, unixNano uint64) string {
	var b strings.Builder
	b.Grow(len(runID) + 2 + IssuedTimeDigits)
	b.WriteString(runID)
	b.WriteString("-" + issuedMark)
	s := strconv.FormatUint(unixNano, 16)
	b.WriteString(strings.Repeat("0", IssuedTimeDigits-len(s)))
	b.WriteString(s)
	return b.String()
}

// IssuedIDRange returns the bounds of run runID's issued ids: each is at least from and
// below to.
func IssuedIDRange(runID string) (from, to string) {
	return runID + "-" + issuedMark, runID + "-" + afterIssued
}

// IssuedAt returns the time an issued id of run runID was issued at, and false for an id
// that is not one (another run's, or of another form).
func IssuedAt(runID, id string) (uint64, bool) {
	from, _ := IssuedIDRange(runID)
	if !strings.HasPrefix(id, from) || len(id) < len(from)+IssuedTimeDigits {
		return 0, false
	}
	digits := id[len(from) : len(from)+IssuedTimeDigits]
	if _, err := hex.DecodeString(digits); err != nil || strings.ToLower(digits) != digits {
		return 0, false
	}
	t, err := strconv.ParseUint(digits, 16, 64)
	return t, err == nil
}
