package mcpenv

import (
	"fmt"

	"cel.dev/cel-go/cel"
)

// celEnv declares what a verifier's condition sees: calls (every call the agent made to
// the server, in order, each a map: tool, args, answered, ok, is_error, status,
// truncated, text, structured), seed (the episode's) and steps (played so far).
var celEnv = func() *cel.Env {
	e, err := cel.NewEnv(
		cel.Variable("calls", cel.ListType(cel.MapType(cel.StringType, cel.DynType))),
		cel.Variable("seed", cel.UintType),
		cel.Variable("steps", cel.IntType),
	)
	if err != nil {
		panic(fmt.Sprintf("mcpenv: CEL environment: %v", err)) // static declarations: a programming error
	}
	return e
}()

// compile type-checks a condition, which must be a bool.
func compile(expr string) (cel.Program, error) {
	ast, iss := celEnv.Compile(expr)
	if iss.Err() != nil {
		return nil, iss.Err()
	}
	if ast.OutputType() != cel.BoolType {
		return nil, fmt.Errorf("%q is of type %s, not bool", expr, ast.OutputType())
	}
	return celEnv.Program(ast, cel.CostLimit(1_000_000))
}

// eval evaluates a compiled condition; an evaluation error is false, with the error.
func eval(p cel.Program, calls []any, seed uint64, steps int) (bool, error) {
	out, _, err := p.Eval(map[string]any{"calls": calls, "seed": seed, "steps": steps})
	if err != nil {
		return false, err
	}
	b, ok := out.Value().(bool)
	return b && ok, nil
}
