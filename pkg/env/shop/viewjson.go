package shop

import "strings"

// decodeView is json.Unmarshal(obs, v) for the observations the shop emits, without
// encoding/json's reflection: the oracle reads one per step, and that decode was a visible
// share of a loadtest's CPU (see docs/benchmarks.md, Costs the code cites, Shop env). It
// covers the shop's shapes (flat objects of booleans,
// integers and plain strings, plus search results) and reports false, leaving v as it
// was, on anything else: invalid JSON, a string it keeps that has escapes or non-ASCII
// bytes, a kept number that is not a plain integer in range, a null or a value of the
// wrong type where it keeps one, a key that matches a field only case-insensitively. The
// caller then falls back to encoding/json; FuzzDecodeView checks that the two agree
// whenever decodeView answers.
func decodeView(obs []byte, v *view) bool {
	s := scanner{b: obs}
	var out view
	ok := s.object(func(key string) bool {
		switch key {
		case "ok":
			return s.boolean(&out.OK)
		case "truncated":
			return s.boolean(&out.Truncated)
		case "status":
			n, ok := s.integer()
			if !ok || n < 0 || n > 1<<32-1 {
				return false
			}
			out.Status = uint32(n)
			return true
		case "retry_after_ms":
			n, ok := s.integer()
			out.RetryAfterMs = n
			return ok
		case "stock":
			n, ok := s.integer()
			out.Stock = n
			return ok
		case "rule":
			return s.plainString(&out.Rule)
		case "order_id":
			return s.plainString(&out.OrderID)
		case "order_status":
			return s.plainString(&out.OrderStatus)
		case "results":
			return s.hits(&out.Results)
		}
		return !foldsTo(key, viewKeys) && s.skipValue(0)
	})
	if !ok || !s.end() {
		return false
	}
	*v = out
	return true
}

// decodeTask is decodeView for the first observation of an episode (resetObs), read into
// the oracle's taskView, on the same terms: false, leaving v as it was, on anything
// encoding/json might read differently. Decoding it with encoding/json, once per episode,
// showed in a worker's profile (docs/benchmarks.md, Costs the code cites, Shop env).
// FuzzDecodeTask checks the two agree.
func decodeTask(obs []byte, v *taskView) bool {
	s := scanner{b: obs}
	var out taskView
	ok := s.object(func(key string) bool {
		var n *int64
		switch key {
		case "item":
			return s.plainString(&out.Item)
		case "qty":
			n = &out.Qty
		case "budget":
			n = &out.Budget
		case "balance":
			n = &out.Balance
		default:
			return !foldsTo(key, taskKeys) && s.skipValue(0)
		}
		var ok bool
		*n, ok = s.integer()
		return ok
	})
	if !ok || !s.end() {
		return false
	}
	*v = out
	return true
}

// viewKeys, taskKeys and hitKeys are the JSON names of view's, taskView's and hit's
// fields.
var (
	viewKeys = []string{"ok", "truncated", "status", "retry_after_ms", "rule", "results", "stock", "order_id", "order_status"}
	taskKeys = []string{"item", "qty", "budget", "balance"}
	hitKeys  = []string{"sku", "name", "price"}
)

// foldsTo reports whether key matches one of names case-insensitively (but not exactly):
// encoding/json would decode such a key into that field.
func foldsTo(key string, names []string) bool {
	for _, n := range names {
		if strings.EqualFold(key, n) {
			return true
		}
	}
	return false
}

// scanner walks one JSON document, for the shop's two reflection-free fast paths
// (decodeView for the oracle's observations, scanFlat for actions' arguments); every
// method reports false on input it does not accept, and the walk is then abandoned.
type scanner struct {
	b []byte
	i int
}

// maxDepth bounds the nesting skipValue follows (encoding/json allows 10,000).
const maxDepth = 64

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// end reports whether only white space is left.
func (s *scanner) end() bool {
	s.ws()
	return s.i == len(s.b)
}

func (s *scanner) next() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// object walks an object whose keys are plain strings, calling member with each key
// positioned at its value; member must consume the value.
func (s *scanner) object(member func(key string) bool) bool {
	if s.next() != '{' {
		return false
	}
	s.i++
	return s.items('}', func() bool {
		start, end, ok := s.plain()
		if !ok || s.next() != ':' {
			return false
		}
		s.i++
		return member(string(s.b[start:end]))
	})
}

// items walks the comma-separated items of an array or object whose opening bracket
// has been read, through the closing one; item must consume one item.
func (s *scanner) items(closing byte, item func() bool) bool {
	if s.next() == closing {
		s.i++
		return true
	}
	for {
		if !item() {
			return false
		}
		switch s.next() {
		case ',':
			s.i++
		case closing:
			s.i++
			return true
		default:
			return false
		}
	}
}

// plain reads a string of printable ASCII without escapes and returns its contents' span.
func (s *scanner) plain() (start, end int, ok bool) {
	if s.next() != '"' {
		return 0, 0, false
	}
	s.i++
	start = s.i
	for ; s.i < len(s.b); s.i++ {
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			return start, s.i - 1, true
		case c < 0x20 || c >= 0x7f || c == '\\':
			return 0, 0, false
		}
	}
	return 0, 0, false
}

func (s *scanner) plainString(dst *string) bool {
	start, end, ok := s.plain()
	if ok {
		*dst = string(s.b[start:end])
	}
	return ok
}

func (s *scanner) boolean(dst *bool) bool {
	switch {
	case s.literal("true"):
		*dst = true
	case s.literal("false"):
		*dst = false
	default:
		return false
	}
	return true
}

func (s *scanner) literal(word string) bool {
	if s.next() == word[0] && len(s.b)-s.i >= len(word) && string(s.b[s.i:s.i+len(word)]) == word {
		s.i += len(word)
		return true
	}
	return false
}

// integer reads a JSON number that is a plain integer fitting an int64.
func (s *scanner) integer() (int64, bool) {
	start, ok := s.number()
	if !ok {
		return 0, false
	}
	digits := s.b[start:s.i]
	neg := digits[0] == '-'
	if neg {
		digits = digits[1:]
	}
	var n uint64
	for _, c := range digits {
		if c < '0' || c > '9' || n > (1<<63)/10 { // a fraction or an exponent, or too long
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	switch {
	case neg && n <= 1<<63:
		return -int64(n), true // -(1<<63) wraps to itself, which is right
	case !neg && n < 1<<63:
		return int64(n), true
	}
	return 0, false
}

// number reads any JSON number and returns where it started.
func (s *scanner) number() (int, bool) {
	s.ws()
	start := s.i
	digits := func() int {
		n := 0
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
			n++
		}
		return n
	}
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	if s.i < len(s.b) && s.b[s.i] == '0' {
		s.i++
	} else if digits() == 0 {
		return 0, false
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if digits() == 0 {
			return 0, false
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if digits() == 0 {
			return 0, false
		}
	}
	return start, true
}

// hits reads search results: an array of objects.
func (s *scanner) hits(dst *[]hit) bool {
	if s.next() != '[' {
		return false
	}
	s.i++
	out := []hit{}
	ok := s.items(']', func() bool {
		var h hit
		ok := s.object(func(key string) bool {
			switch key {
			case "sku":
				return s.plainString(&h.SKU)
			case "name":
				return s.plainString(&h.Name)
			case "price":
				n, ok := s.integer()
				h.Price = n
				return ok
			}
			return !foldsTo(key, hitKeys) && s.skipValue(1)
		})
		out = append(out, h)
		return ok
	})
	if ok {
		*dst = out
	}
	return ok
}

// skipValue checks and skips any JSON value.
func (s *scanner) skipValue(depth int) bool {
	if depth > maxDepth {
		return false
	}
	switch c := s.next(); {
	case c == '"':
		return s.skipString()
	case c == '-' || c >= '0' && c <= '9':
		_, ok := s.number()
		return ok
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '[':
		s.i++
		return s.items(']', func() bool { return s.skipValue(depth + 1) })
	case c == '{':
		s.i++
		return s.items('}', func() bool {
			if !s.skipString() || s.next() != ':' {
				return false
			}
			s.i++
			return s.skipValue(depth + 1)
		})
	}
	return false
}

// skipString checks and skips a string, escapes included. Invalid UTF-8 passes, as in
// encoding/json (which replaces it when decoding).
func (s *scanner) skipString() bool {
	if s.next() != '"' {
		return false
	}
	for s.i++; s.i < len(s.b); s.i++ {
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			return true
		case c < 0x20:
			return false
		case c == '\\':
			s.i++
			if s.i >= len(s.b) {
				return false
			}
			switch s.b[s.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if len(s.b)-s.i < 5 {
					return false
				}
				for _, h := range s.b[s.i+1 : s.i+5] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return false
					}
				}
				s.i += 4
			default:
				return false
			}
		}
	}
	return false
}
