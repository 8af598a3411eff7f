package world

import (
	"strconv"
	"strings"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
)

// textFunctions are the functions gauntlet adds to CEL for the text of answers, both
// written as Go envs write them (docs/worlds.md, Expressions):
//
//   - quote(s): s as a quoted string, Go's %q (strconv.Quote) of s cut to 48 bytes
//     with "..." after (echo): how an agent's own text is echoed in an error, bounded.
//   - words(s): the words of s lower-cased (strings.Fields of strings.ToLower): any
//     run of white space separates two words, none is empty.
var textFunctions = cel.Lib(textLib{})

type textLib struct{}

func (textLib) CompileOptions() []cel.EnvOption {
	return []cel.EnvOption{
		cel.Function("quote", cel.Overload("quote_string", []*cel.Type{cel.StringType}, cel.StringType,
			cel.UnaryBinding(func(v ref.Val) ref.Val {
				s, ok := v.(types.String)
				if !ok {
					return types.MaybeNoSuchOverloadErr(v)
				}
				return types.String(strconv.Quote(echo(string(s))))
			}))),
		cel.Function("words", cel.Overload("words_string", []*cel.Type{cel.StringType}, cel.ListType(cel.StringType),
			cel.UnaryBinding(func(v ref.Val) ref.Val {
				s, ok := v.(types.String)
				if !ok {
					return types.MaybeNoSuchOverloadErr(v)
				}
				return types.NewStringList(types.DefaultTypeAdapter, strings.Fields(strings.ToLower(string(s))))
			}))),
	}
}

func (textLib) ProgramOptions() []cel.ProgramOption { return nil }

// echo bounds an agent's text echoed in an answer: 48 bytes, then "...", as the Go envs
// cut it (a cut may split a character; quote then escapes its bytes, as %q does).
func echo(s string) string {
	const n = 48
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// goStrings rewrites the strings of a JSON document written by canonjson as Go's
// encoding/json writes them (json_strings: go): \b \f \n \r \t in their short forms,
// <, > and & as \u003c, \u003e and \u0026, U+2028 and U+2029 as \u2028 and \u2029;
// every other byte, and every escape the two write alike, unchanged. A document already
// in that form comes back the same, so an answer that wraps another may be rewritten
// again.
func goStrings(b []byte) []byte {
	if goAlready(b) {
		return b
	}
	const hex = "0123456789abcdef"
	out := make([]byte, 0, len(b)+16)
	in := false
	for i := 0; i < len(b); {
		c := b[i]
		if !in {
			in = c == '"'
			out = append(out, c)
			i++
			continue
		}
		switch {
		case c == '"':
			in = false
			out = append(out, c)
			i++
		case c == '\\' && i+5 < len(b) && b[i+1] == 'u':
			esc := b[i : i+6]
			if esc[2] == '0' && esc[3] == '0' {
				switch short := map[string]byte{"08": 'b', "0c": 'f', "0a": 'n', "0d": 'r', "09": 't'}[string(esc[4:6])]; {
				case short != 0:
					out = append(out, '\\', short)
				default:
					out = append(out, esc...)
				}
			} else {
				out = append(out, esc...)
			}
			i += 6
		case c == '\\' && i+1 < len(b):
			out = append(out, c, b[i+1])
			i += 2
		case c == '<' || c == '>' || c == '&':
			out = append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			i++
		case c == 0xe2 && i+2 < len(b) && b[i+1] == 0x80 && (b[i+2] == 0xa8 || b[i+2] == 0xa9):
			out = append(out, '\\', 'u', '2', '0', '2', hex[b[i+2]&0xf])
			i += 3
		default:
			out = append(out, c)
			i++
		}
	}
	return out
}

// goSuspect marks the bytes that may start what goStrings rewrites: <, >, &, a
// backslash (\u00XX) and the first byte of U+2028 and U+2029.
var goSuspect = [256]bool{'<': true, '>': true, '&': true, '\\': true, 0xe2: true}

// goAlready reports whether goStrings leaves b as it is: no <, > or &, no \u00 and no
// U+2028 or U+2029 in it: one pass over b (answers are mostly plain) instead of four
// searches.
func goAlready(b []byte) bool {
	for i, c := range b {
		if !goSuspect[c] {
			continue
		}
		switch c {
		case '\\':
			if i+3 < len(b) && b[i+1] == 'u' && b[i+2] == '0' && b[i+3] == '0' {
				return false
			}
		case 0xe2:
			if i+2 < len(b) && b[i+1] == 0x80 && (b[i+2] == 0xa8 || b[i+2] == 0xa9) {
				return false
			}
		default:
			return false
		}
	}
	return true
}
