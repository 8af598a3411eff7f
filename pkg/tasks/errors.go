package tasks

import (
	"errors"
	"fmt"
	"strings"
)

// FieldError is one problem with one task: the task's id, the file or task.toml key at
// fault, and why. Loading joins one per problem (errors.Join), so errors.As finds the first
// and Problems lists them all.
type FieldError struct {
	// Task is the task's id in its dataset (its folder, relative to the dataset root).
	Task string
	// Field is a task.toml key ("verifier.timeout_sec") or a path in the task's folder
	// ("tests/test.sh"); empty when the whole file is at fault.
	Field string
	// Line is the task.toml line, when known.
	Line int
	Err  error
}

func (e *FieldError) Error() string {
	var b strings.Builder
	if e.Task != "" {
		fmt.Fprintf(&b, "task %s: ", e.Task)
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		if e.Line > 0 {
			fmt.Fprintf(&b, " (task.toml line %d)", e.Line)
		}
		b.WriteString(": ")
	} else if e.Line > 0 {
		fmt.Fprintf(&b, "task.toml line %d: ", e.Line)
	}
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *FieldError) Unwrap() error { return e.Err }

// Problems flattens an error from Load, LoadDataset or ParseConfig into its problems, in
// the order found: every *FieldError, and any other error as it is.
func Problems(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, Problems(e)...)
		}
		return out
	}
	return []error{err}
}

// Sentinel reasons a *FieldError wraps, for errors.Is.
var (
	// ErrMissing: a file or folder the format requires is not there.
	ErrMissing = errors.New("missing")
	// ErrNotRegular: a required file is a folder, a symlink or a device.
	ErrNotRegular = errors.New("not a regular file")
	// ErrUnsupported: the task uses a part of the format gauntlet does not run.
	ErrUnsupported = errors.New("not supported by gauntlet")
)
