package shop

import (
	"strconv"
	"unicode/utf8"
)

// diff accumulates one step's world-state changes as a canonical JSON array, in the order
// they happened: {"op":"set","path":...,"from":...,"to":...} for a changed value and
// {"op":"add","path":...,"to":{...}} for a new entity.
type diff struct {
	b []byte
}

func (d *diff) open(op, path string) {
	if len(d.b) == 0 {
		d.b = append(d.b, '[')
	} else {
		d.b = append(d.b, ',')
	}
	d.b = append(d.b, `{"op":`...)
	d.b = appendString(d.b, op)
	d.b = append(d.b, `,"path":`...)
	d.b = appendString(d.b, path)
}

func (d *diff) setInt(path string, from, to int64) {
	d.open("set", path)
	d.b = append(d.b, `,"from":`...)
	d.b = strconv.AppendInt(d.b, from, 10)
	d.b = append(d.b, `,"to":`...)
	d.b = strconv.AppendInt(d.b, to, 10)
	d.b = append(d.b, '}')
}

func (d *diff) setString(path, from, to string) {
	d.open("set", path)
	d.b = append(d.b, `,"from":`...)
	d.b = appendString(d.b, from)
	d.b = append(d.b, `,"to":`...)
	d.b = appendString(d.b, to)
	d.b = append(d.b, '}')
}

func (d *diff) addOrder(path, sku string, qty, amount int64, status string) {
	d.open("add", path)
	d.b = append(d.b, `,"to":{"sku":`...)
	d.b = appendString(d.b, sku)
	d.b = append(d.b, `,"qty":`...)
	d.b = strconv.AppendInt(d.b, qty, 10)
	d.b = append(d.b, `,"amount":`...)
	d.b = strconv.AppendInt(d.b, amount, 10)
	d.b = append(d.b, `,"status":`...)
	d.b = appendString(d.b, status)
	d.b = append(d.b, "}}"...)
}

// bytes returns the finished array ("[]" when nothing changed) in a fresh slice.
func (d *diff) bytes() []byte {
	if len(d.b) == 0 {
		return []byte("[]")
	}
	out := make([]byte, len(d.b)+1)
	copy(out, d.b)
	out[len(d.b)] = ']'
	return out
}

// appendString appends s as a JSON string. Paths and values in diffs are the env's own
// ASCII identifiers; anything else is escaped, invalid UTF-8 becoming U+FFFD as
// encoding/json does.
func appendString(b []byte, s string) []byte {
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
