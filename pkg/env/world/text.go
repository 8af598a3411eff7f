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
