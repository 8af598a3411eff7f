package catalogue

import (
	"regexp"
	"strconv"
)

// LogPattern is how a fault kind shows in logs, for `gauntlet faults from-log`
// (pkg/faults/fromlog): the text that recognises it and the parameters that text reveals.
type LogPattern struct {
	// Rank orders the patterns: an entry is the kind of the lowest-ranked pattern that
	// matches it, so the specific ("server misbehaving") rank before the general
	// ("timeout", "HTTP 5xx").
	Rank int
	// Match recognises the kind in an entry's text.
	Match *regexp.Regexp
	// Params, when set, estimates the kind's parameters from an entry's text into samples
	// (parameter name → value; http_error also reports "status"). It runs on every entry
	// classified as the kind, however it was recognised.
	Params func(text string, samples map[string]float64)
}

// Evidence the patterns' Params read.
var (
	httpRE  = regexp.MustCompile(`\bHTTP (\d{3})\b`)
	retryRE = regexp.MustCompile(`Retry-After:\s*(\d+)`)
	afterRE = regexp.MustCompile(`(?i)(?:after|timeout=)\s*(\d+(?:\.\d+)?)\s*(ms|s)\b`)
	slowRE  = regexp.MustCompile(`(?i)slow response:\s*(\d+(?:\.\d+)?)\s*ms`)
	skewRE  = regexp.MustCompile(`(?i)clock skew.*?(\d+(?:\.\d+)?)s (ahead|behind)`)
)

// atof parses a number the patterns matched (digits and a dot only).
func atof(s string) float64 {
	v, _ := strconv.ParseFloat(s, 64)
	return v
}
