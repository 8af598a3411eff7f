// Package canonjson appends JSON values in one canonical form, without reflection, for the
// hot paths whose output must be identical byte for byte wherever it is produced (env
// observations and diffs, stored fault plans). Strings escape only what JSON requires
// ('"', '\\' and control characters as \u00XX) and turn invalid UTF-8 into U+FFFD, as
// encoding/json does; floats use the shortest round-trip digits, in exponent form only
// below 1e-6 or from 1e21 on, as protojson and JavaScript write them.
//
// The functions are pure and safe for concurrent use.
package canonjson

import (
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"
)

// AppendString appends s as a JSON string.
func AppendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

// AppendFloat appends f as a JSON number. NaN and infinities have no JSON form and are
// errors.
func AppendFloat(b []byte, f float64) ([]byte, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return b, fmt.Errorf("%v cannot be written as JSON", f)
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	start := len(b)
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' { // "1e-07" -> "1e-7"
		if n := len(b); n-start >= 4 && b[n-2] == '0' && (b[n-3] == '-' || b[n-3] == '+') {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, nil
}
